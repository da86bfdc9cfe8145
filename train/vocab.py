"""Build a vocabulary from text files: `python -m train.vocab --corpus F --out DIR [--pieces]`.

Both kinds sit behind BERT's normalizer and pre-tokenizer: text is cleaned, optionally
lower-cased with accents stripped, and split on whitespace and punctuation.
- Default, BERT's: the `tokenizers` WordPiece trainer, and every CJK character is a word of its
  own (as BERT's basic tokenizer does), so Chinese is one token per character.
- `--pieces`: a Unigram model (SentencePiece's, as XLM-R and ALBERT ship) learns multi-character
  Chinese pieces, words mostly (张艺兴 / 黄金 / 导演 / 合适), from the corpus; Chinese clauses reach
  it whole. A piece carries much more of a headline's meaning than a character: on Toutiao, a
  linear model over single tokens scores 0.81 valid with 20,000 pieces, against 0.75 over
  characters (docs/pretraining.md).
The output directory is a tokenizer as every other part of the project reads it
(`processing.tokenizer.TextTokenizer.from_dir`): `vocab.txt`, `tokenizer.json`,
`tokenizer_config.json`, `special_tokens_map.json`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers.implementations import BertWordPieceTokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_vocab(
    corpus: Sequence[str | Path],
    out: str | Path,
    vocab_size: int = 8000,
    min_frequency: int = 2,
    lowercase: bool = True,
    limit_alphabet: int | None = None,
    pieces: bool = False,
) -> Path:
    """Train a WordPiece vocabulary on `corpus` files and write the tokenizer files into `out`.

    `limit_alphabet` caps the distinct characters kept; by default up to half the vocabulary, so
    Chinese keeps its thousands of characters (the library's default of 1,000 would map the rest
    to [UNK]). `pieces`: a Unigram model over whole Chinese clauses (the module's docstring).
    """
    files = [str(Path(f)) for f in corpus]
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"vocabulary corpus {f} does not exist or is not a file")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if pieces:
        tokenizer = _unigram(files, vocab_size, lowercase)
    else:
        wordpiece = BertWordPieceTokenizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
        )
        wordpiece.train(
            files,
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            limit_alphabet=limit_alphabet or vocab_size // 2,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
        )
        tokenizer = wordpiece._tokenizer
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError(f"{', '.join(files)}: no text to build a vocabulary from")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    (out / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in by_id), encoding="utf-8")
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"do_lower_case": lowercase, "tokenize_chinese_chars": not pieces}
    # A Unigram model is no BertTokenizer: transformers reads it from tokenizer.json alone.
    config["tokenizer_class"] = "PreTrainedTokenizerFast" if pieces else "BertTokenizer"
    specials = {f"{role}_token": f"[{role.upper()}]" for role in ("pad", "unk", "cls", "sep", "mask")}
    config |= specials
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")
    return out


def _unigram(files: list[str], vocab_size: int, lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=False, strip_accents=lowercase, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token="[UNK]", show_progress=False
    )
    tokenizer.train(files, trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(  # BERT's layout
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tokenizer


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m train.vocab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--corpus", type=Path, nargs="+", required=True, help="UTF-8 text files")
    parser.add_argument("--out", type=Path, required=True, help="tokenizer directory to write")
    parser.add_argument("--vocab-size", type=int, default=8000, help="tokens, specials included")
    parser.add_argument("--min-frequency", type=int, default=2, help="rarer pieces are left out")
    parser.add_argument("--limit-alphabet", type=int, help="distinct characters kept (default: vocab/2)")
    parser.add_argument("--cased", action="store_true", help="keep case and accents")
    parser.add_argument("--pieces", action="store_true", help="Unigram, multi-character Chinese pieces")
    args = parser.parse_args(argv)
    out = build_vocab(
        args.corpus,
        args.out,
        args.vocab_size,
        args.min_frequency,
        not args.cased,
        args.limit_alphabet,
        args.pieces,
    )
    size = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    print(f"{size} tokens -> {out}")
    return out


if __name__ == "__main__":
    main()
