"""MLM + NSP pretraining data: masking statistics, pair construction, errors, and a tiny run."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from processing.tokenizer import TextTokenizer
from tests.helpers.tiny import WORDS, tiny_config, write_tokenizer_files
from train.pretrain_data import (
    IGNORE_INDEX,
    IS_NEXT,
    NOT_NEXT,
    PretrainDataset,
    collate_pretrain,
    mlm_nsp_accuracy,
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    directory = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer_files(directory)
    return TextTokenizer.from_dir(directory)


def random_corpus(n_docs: int, seed: int = 0, max_sentences: int = 12) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
            for _ in range(rng.randint(1, max_sentences))
        ]
        for _ in range(n_docs)
    ]


def write_corpus(path: Path, documents: list[list[str]]) -> Path:
    path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    documents = random_corpus(400)
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", documents), documents


@pytest.fixture(scope="module")
def dataset(tokenizer: TextTokenizer, corpus) -> PretrainDataset:
    return PretrainDataset(tokenizer, corpus[0], max_seq_len=64, seed=3)


def unmasked_ids(dataset: PretrainDataset, index: int) -> np.ndarray:
    pair, tok = dataset.pairs[index], dataset.tokenizer
    return np.concatenate([[tok.cls_id], pair.a_ids, [tok.sep_id], pair.b_ids, [tok.sep_id]])


def test_masking_statistics(dataset: PretrainDataset) -> None:
    tok = dataset.tokenizer
    candidates = selected = to_mask = to_random = unchanged = 0
    for index in range(len(dataset)):
        item, original = dataset[index], unmasked_ids(dataset, index)
        chosen = item["labels"] != IGNORE_INDEX
        candidates += int(np.isin(original, [tok.cls_id, tok.sep_id], invert=True).sum())
        selected += int(chosen.sum())
        np.testing.assert_array_equal(item["labels"][chosen], original[chosen])
        to_mask += int((item["input_ids"][chosen] == tok.mask_id).sum())
        unchanged += int((item["input_ids"][chosen] == original[chosen]).sum())
        replaced = chosen & (item["input_ids"] != original) & (item["input_ids"] != tok.mask_id)
        to_random += int(replaced.sum())
        assert np.isin(item["input_ids"][replaced], dataset.special_ids).sum() == 0
    assert selected > 4000, "corpus too small for the statistics below"
    assert selected / candidates == pytest.approx(0.15, abs=0.01)
    assert to_mask / selected == pytest.approx(0.8, abs=0.03)
    # A random replacement can hit the original token (1 in ~170 here): count it as unchanged.
    assert to_random / selected == pytest.approx(0.1, abs=0.025)
    assert unchanged / selected == pytest.approx(0.1, abs=0.025)


def test_specials_never_masked_and_labels_only_where_selected(dataset: PretrainDataset) -> None:
    tok = dataset.tokenizer
    for index in range(len(dataset)):
        item, original = dataset[index], unmasked_ids(dataset, index)
        special = np.isin(original, [tok.cls_id, tok.sep_id])
        assert special.sum() == 3
        assert (item["labels"][special] == IGNORE_INDEX).all()
        assert (item["input_ids"][special] == original[special]).all()
        not_chosen = item["labels"] == IGNORE_INDEX
        np.testing.assert_array_equal(item["input_ids"][not_chosen], original[not_chosen])
        assert (item["labels"] != IGNORE_INDEX).sum() >= 1


def test_item_layout(dataset: PretrainDataset) -> None:
    for index in range(len(dataset)):
        item, pair = dataset[index], dataset.pairs[index]
        assert all(v.dtype == np.int64 for v in item.values())
        n = len(item["input_ids"])
        assert n <= dataset.max_seq_len
        assert len(pair.a_ids) >= 1 and len(pair.b_ids) >= 1
        for key in ("token_type_ids", "attention_mask", "labels"):
            assert item[key].shape == (n,)
        n_first = len(pair.a_ids) + 2
        assert (item["token_type_ids"][:n_first] == 0).all() and (item["token_type_ids"][n_first:] == 1).all()
        assert (item["attention_mask"] == 1).all()


def test_masks_redrawn_each_epoch_but_reproducible(tokenizer: TextTokenizer, corpus, dataset) -> None:
    def labels(ds: PretrainDataset, epoch: int) -> list[np.ndarray]:
        ds.set_epoch(epoch)
        return [ds[i]["labels"] for i in range(len(ds))]

    epoch0, epoch1 = labels(dataset, 0), labels(dataset, 1)
    changed = sum(not np.array_equal(a, b) for a, b in zip(epoch0, epoch1, strict=True))
    assert changed > 0.9 * len(dataset)

    again = PretrainDataset(tokenizer, corpus[0], max_seq_len=64, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(labels(again, 1), epoch1, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(labels(again, 0), epoch0, strict=True))
    # Reading an item twice in the same epoch gives the same masks.
    np.testing.assert_array_equal(again[5]["input_ids"], again[5]["input_ids"])


def test_nsp_balanced_and_is_next_pairs_are_consecutive(tokenizer: TextTokenizer, dataset, corpus) -> None:
    documents = corpus[1]
    labels = np.array([int(dataset[i]["next_sentence_label"]) for i in range(len(dataset))])
    assert set(labels) == {IS_NEXT, NOT_NEXT}
    assert labels.mean() == pytest.approx(0.5, abs=0.08)

    def text_ids(doc: int, start: int, end: int) -> np.ndarray:
        # Tokenize the raw lines independently of the dataset.
        return np.concatenate([tokenizer.tokenize(s).ids for s in documents[doc][start:end]])

    for index, pair in enumerate(dataset.pairs):
        a_text = text_ids(pair.a_doc, *pair.a_sentences)
        b_text = text_ids(pair.b_doc, *pair.b_sentences)
        # A may lose its start and B its end to truncation, never the tokens around the seam.
        np.testing.assert_array_equal(pair.a_ids, a_text[len(a_text) - len(pair.a_ids) :])
        np.testing.assert_array_equal(pair.b_ids, b_text[: len(pair.b_ids)])
        if labels[index] == IS_NEXT:
            assert pair.is_next and pair.b_doc == pair.a_doc
            assert pair.b_sentences[0] == pair.a_sentences[1]
        else:
            assert not pair.is_next and pair.b_doc != pair.a_doc


def test_short_seq_prob_gives_shorter_inputs(tokenizer: TextTokenizer, corpus) -> None:
    def mean_length(short_seq_prob: float) -> float:
        ds = PretrainDataset(tokenizer, corpus[0], max_seq_len=64, short_seq_prob=short_seq_prob)
        return float(np.mean([len(p.a_ids) + len(p.b_ids) for p in ds.pairs]))

    assert mean_length(1.0) < 0.8 * mean_length(0.0)


def test_single_document_corpus(tokenizer: TextTokenizer, tmp_path: Path) -> None:
    sentences = [s for doc in random_corpus(20) for s in doc]
    path = write_corpus(tmp_path / "one.txt", [sentences])
    with pytest.warns(UserWarning, match="single document"):
        ds = PretrainDataset(tokenizer, path, max_seq_len=32)
    labels = [p.is_next for p in ds.pairs]
    assert 0.3 < np.mean(labels) < 0.7
    for pair in ds.pairs:
        assert pair.b_doc == pair.a_doc == 0
        true_next = pair.a_sentences[1]
        if not pair.is_next:
            assert pair.b_sentences[0] != true_next
            # B never overlaps A.
            a_range, b_range = range(*pair.a_sentences), range(*pair.b_sentences)
            assert not set(a_range) & set(b_range)


@pytest.mark.filterwarnings("ignore:.*single document")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"empty\.txt: no sentences found"),
        (b"\n  \n\n", r"empty\.txt: no sentences found"),
        (b"the cat\nsat on\n\x89PNG\x00\x01\n", r"empty\.txt:3: contains a NUL byte"),
        (b"the cat\n\nthe dog\n\xff\xfe bad\n", r"empty\.txt:4: not valid UTF-8"),
        (b"only one sentence here\n", r"at least two sentences"),
    ],
)
def test_malformed_corpus(tokenizer: TextTokenizer, tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        PretrainDataset(tokenizer, path)


def test_bad_arguments(tokenizer: TextTokenizer, corpus, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        PretrainDataset(tokenizer, tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="max_seq_len"):
        PretrainDataset(tokenizer, corpus[0], max_seq_len=4)
    with pytest.raises(ValueError, match="mlm_probability"):
        PretrainDataset(tokenizer, corpus[0], mlm_probability=0.0)


def test_collate_pads(dataset: PretrainDataset) -> None:
    items = [dataset[i] for i in range(6)]
    batch = collate_pretrain(items, pad_id=dataset.tokenizer.pad_id)
    longest = max(len(i["input_ids"]) for i in items)
    assert batch["input_ids"].shape == (6, longest) and batch["next_sentence_label"].shape == (6,)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
            assert batch[key].dtype == torch.int64
            np.testing.assert_array_equal(batch[key][row, :n].numpy(), item[key])
        assert (batch["input_ids"][row, n:] == dataset.tokenizer.pad_id).all()
        assert (batch["attention_mask"][row, n:] == 0).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
        assert int(batch["next_sentence_label"][row]) == int(item["next_sentence_label"])
    with pytest.raises(ValueError, match="empty batch"):
        collate_pretrain([], pad_id=0)


def test_mlm_nsp_accuracy() -> None:
    labels = torch.tensor([[IGNORE_INDEX, 2, IGNORE_INDEX, 1], [0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    predicted = torch.tensor([[2, 2, 0, 0], [0, 1, 1, 1]])  # right at (0,1) and (1,0), wrong at (0,3)
    logits = torch.nn.functional.one_hot(predicted, 3).float()
    nsp_logits = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    result = mlm_nsp_accuracy(logits, labels, nsp_logits, torch.tensor([0, 0]))
    assert result["mlm_accuracy"] == pytest.approx(2 / 3)
    assert result["mlm_total"] == 3 and result["mlm_correct"] == 2
    assert result["nsp_accuracy"] == pytest.approx(0.5)
    assert "nsp_accuracy" not in mlm_nsp_accuracy(logits, labels)


@pytest.fixture
def one_thread():
    """Two threads on a shared 2-core machine thrash (13 s vs 0.7 s here); one is plenty for a tiny model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_pretraining_run_learns(tokenizer: TextTokenizer, tmp_path: Path, one_thread) -> None:
    from model.bert import BertForPreTraining
    from train.schedules import get_schedule

    # A small, repetitive corpus: 6 "stories" of 5 fixed sentences, each repeated 4 times. Each story
    # draws on its own 15 words (a topic), which is what makes NSP learnable this quickly.
    rng = random.Random(1)
    topics = [WORDS[15 * k : 15 * (k + 1)] for k in range(6)]
    stories = [[" ".join(rng.choice(topic) for _ in range(6)) for _ in range(5)] for topic in topics]
    path = write_corpus(tmp_path / "tiny.txt", stories * 4)
    dataset = PretrainDataset(tokenizer, path, max_seq_len=32, seed=0)

    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config("pretrain"))
    steps, batch_size = 250, 16
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)
    scheduler = get_schedule("linear", optimizer, num_warmup_steps=10, num_training_steps=steps)

    dataset.set_epoch(1000)  # a masking of the whole corpus that training never sees
    eval_batch = collate_pretrain([dataset[i] for i in range(len(dataset))], tokenizer.pad_id)

    def evaluate():
        model.eval()
        with torch.no_grad():
            out = model(**eval_batch)
        model.train()
        accuracy = mlm_nsp_accuracy(
            out.prediction_logits,
            eval_batch["labels"],
            out.seq_relationship_logits,
            eval_batch["next_sentence_label"],
        )
        return out, accuracy

    before, accuracy_before = evaluate()
    generator = torch.Generator().manual_seed(0)
    step, epoch = 0, 0
    while step < steps:
        dataset.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=True,
            generator=generator,
            collate_fn=lambda items: collate_pretrain(items, tokenizer.pad_id),
        )
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step == steps:
                break
        epoch += 1
    after, accuracy_after = evaluate()

    # Before: ~ln(vocab) + ln(2) = 6.0. Measured after, over 8 seeds: loss 2.1-2.6 (MLM 0.39-0.49 of
    # its start, NSP 0.005-0.15), MLM accuracy 0.26-0.42, NSP accuracy >= 0.97.
    assert float(after.loss) < 0.6 * float(before.loss), (float(before.loss), float(after.loss))
    assert float(after.mlm_loss) < 0.65 * float(before.mlm_loss)
    assert float(after.nsp_loss) < 0.5 * float(before.nsp_loss)
    assert accuracy_after["mlm_accuracy"] > accuracy_before["mlm_accuracy"] + 0.15
    assert accuracy_after["nsp_accuracy"] > 0.85


def test_masked_only_scores_the_masked_positions_as_the_full_head_does() -> None:
    from model.bert import BertForPreTraining
    from train.pretrain_data import masked_hits

    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config("pretrain")).eval()
    ids = torch.randint(5, model.config.vocab_size, (3, 12))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, [1, 4]], labels[2, 7] = ids[0, [1, 4]], ids[2, 7]  # row 1 has no masked position
    nsp = torch.tensor([0, 1, 0])
    with torch.no_grad():
        full = model(ids, labels=labels, next_sentence_label=nsp)
        model.masked_only = True
        masked = model(ids, labels=labels, next_sentence_label=nsp)
    assert masked.prediction_logits.shape == (3, model.config.vocab_size)
    torch.testing.assert_close(masked.prediction_logits, full.prediction_logits[labels != IGNORE_INDEX])
    torch.testing.assert_close(masked.loss, full.loss)
    ours, theirs = masked_hits(masked.prediction_logits, labels), masked_hits(full.prediction_logits, labels)
    assert [t.tolist() for t in ours] == [t.tolist() for t in theirs]
    assert masked_hits(full.prediction_logits, labels)[1].tolist() == [2, 0, 1]
