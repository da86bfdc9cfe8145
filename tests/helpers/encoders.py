"""Tiny random checkpoints of the other encoder architectures, saved by `transformers` itself
(so they have its layout), with tokenizers built here. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.tiny import tiny_vocab

MPNET_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0-3, as microsoft/mpnet-base has them


def mpnet_vocab() -> list[str]:
    return [*MPNET_SPECIALS, *(w for w in tiny_vocab() if not w.startswith("[")), "<mask>"]


def save_mpnet_tokenizer(directory: Path) -> None:
    import transformers

    vocab = {w: i for i, w in enumerate(mpnet_vocab())}
    transformers.MPNetTokenizerFast(vocab=vocab, unk_token="<unk>").save_pretrained(directory)


def hf_mpnet(head: str = "MPNetModel", seed: int = 0, **config):
    """A transformers MPNet `head` of tiny size, weights widened so wrong wiring shows."""
    import torch
    import transformers

    sizes = dict(
        vocab_size=len(mpnet_vocab()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=130,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, head)(transformers.MPNetConfig(**{**sizes, **config}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 and "embeddings" not in name else 0.1)
    return model.eval()


def save_mpnet(model, directory: Path) -> Path:
    model.save_pretrained(directory)
    save_mpnet_tokenizer(directory)
    return directory


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")


def hf_modernbert(head: str = "ModernBertModel", seed: int = 0, **config):
    """A transformers ModernBERT `head` of tiny size (4 layers: global, local, local, global; a local
    window of 16), on the tiny WordPiece vocabulary (the tokenizer does not change the graph)."""
    import torch
    import transformers

    sizes = dict(
        vocab_size=len(tiny_vocab()), hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, max_position_embeddings=256, pad_token_id=0, bos_token_id=2,
        eos_token_id=3, cls_token_id=2, sep_token_id=3, local_attention=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = getattr(transformers, head)(transformers.ModernBertConfig(**{**sizes, **config}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 and "embeddings" not in name else 0.1)
    return model.eval()


def save_with_wordpiece(model, directory: Path) -> Path:
    from tests.helpers.tiny import write_tokenizer_files

    model.save_pretrained(directory)
    write_tokenizer_files(directory)
    return directory
