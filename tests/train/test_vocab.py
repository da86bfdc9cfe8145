"""The vocabulary builder: WordPiece with Chinese one character per token, or Unigram pieces with
multi-character Chinese words; offsets that round-trip for mixed Chinese, English and digits, and
a vocabulary that trains, exports and serves."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from processing.tokenizer import TextTokenizer
from train.vocab import SPECIAL_TOKENS, build_vocab, main

CORPUS = [
    "我在2024年去了New York看NBA比赛，花了300元！",
    "故宫如何修文物？文物医院下月向公众开放。",
    "深圳房价是沈阳6倍就是因为经济？错！",
    "张艺兴黄金瞳片场，导演能给个合适的帽子不？",
    "The film was released in 1999 and earned 42 million dollars in New York.",
    "Café owners in Zürich sold 12 coffees to NBA players.",
]
MIXED = [
    "我在2024年去了New York看NBA比赛，花了300元！",
    "iPhone 15发布会在9月12日举行，售价5999元起",
    "  张艺兴 Zhang Yixing  主演《黄金瞳》2019\t年上映 ",
    "Café 在Zürich，价格3.50瑞郎",
    # The edges of Chinese headlines: full-width Latin and digits, emoji, traditional characters
    # (unknown to a vocabulary of simplified text; an unknown run is one [UNK] spanning it).
    "全角ＡＢＣ１２３！？「引号」《书名》——破折号……",
    "今天天气真好😀🏀，👨‍👩‍👧一家人",
    "臺灣電影金馬獎頒獎典禮 於臺北舉行",
]


def is_cjk(char: str) -> bool:
    return "CJK" in unicodedata.name(char, "")


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vocab")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n", encoding="utf-8")
    return build_vocab([corpus], root / "tokenizer", vocab_size=400, min_frequency=1)


@pytest.fixture(scope="module")
def pieces_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pieces")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n", encoding="utf-8")
    return build_vocab([corpus], root / "tokenizer", vocab_size=300, pieces=True)


BOTH = ["vocab_dir", "pieces_dir"]


def test_pieces_hold_chinese_words_in_bert_layout(pieces_dir: Path) -> None:
    vocab = (pieces_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
    assert [t for t in vocab if len(t) > 1 and all(is_cjk(c) for c in t)], "no multi-character Chinese piece"
    tokenizer = TextTokenizer.from_dir(pieces_dir)
    assert tokenizer.model_kind == "Unigram" and tokenizer.mask_id == vocab.index("[MASK]")
    assert json.loads((pieces_dir / "tokenizer_config.json").read_text())["tokenize_chinese_chars"] is False
    encoding = tokenizer.encode("故宫文物医院", "导演", max_length=32)  # [CLS] a [SEP] b [SEP], as BERT
    assert encoding.input_ids[0] == vocab.index("[CLS]") and encoding.input_ids[-1] == vocab.index("[SEP]")
    assert 2 < len(encoding.input_ids) < 2 + 6 + 1 + 2 and tokenizer.unk_id not in encoding.input_ids


def test_files_and_special_tokens(vocab_dir: Path) -> None:
    vocab = (vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
    tokenizer = TextTokenizer.from_dir(vocab_dir)
    assert tokenizer.vocab_size == len(vocab) and tokenizer.pad_id == 0
    assert tokenizer.mask_id == vocab.index("[MASK]")
    config = json.loads((vocab_dir / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True
    # The vocab.txt alone (as a BERT checkpoint ships it) gives the same tokens as tokenizer.json.
    (only_vocab := vocab_dir.parent / "only-vocab").mkdir()
    (only_vocab / "vocab.txt").write_bytes((vocab_dir / "vocab.txt").read_bytes())
    from_vocab = TextTokenizer.from_dir(only_vocab)
    for text in MIXED:
        a, b = tokenizer.tokenize(text), from_vocab.tokenize(text)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.offsets, b.offsets)


def test_every_chinese_character_is_one_token(vocab_dir: Path) -> None:
    vocab = set((vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    characters = {c for line in CORPUS for c in line if is_cjk(c)}
    assert characters <= vocab, sorted(characters - vocab)
    assert not [t for t in vocab if len(t) > 1 and any(is_cjk(c) for c in t)], "multi-character CJK token"
    tokenizer = TextTokenizer.from_dir(vocab_dir)
    tokens = tokenizer.tokenize("故宫文物医院")
    assert len(tokens) == 6 and tokenizer.unk_id not in tokens.ids


@pytest.mark.parametrize("kind", BOTH)
@pytest.mark.parametrize("text", MIXED)
def test_offsets_round_trip_mixed_chinese_english_digits(kind: str, text: str, request) -> None:
    tokenizer = TextTokenizer.from_dir(request.getfixturevalue(kind))
    id_to_token = {i: t for t, i in tokenizer.tokenizer.get_vocab().items()}
    tokens = tokenizer.tokenize(text)
    assert len(tokens) > 0
    covered = np.zeros(len(text), dtype=bool)
    for token_id, (start, end) in zip(tokens.ids, tokens.offsets, strict=True):
        piece = text[start:end]
        assert 0 <= start < end <= len(text) and piece.strip() == piece
        covered[start:end] = True
        if token_id != tokenizer.unk_id:
            # Lower-cased with accents stripped, the span is the token (less its ## prefix).
            normal = "".join(
                c for c in unicodedata.normalize("NFD", piece.lower()) if unicodedata.category(c) != "Mn"
            )
            assert normal == id_to_token[int(token_id)].removeprefix("##"), (
                piece,
                id_to_token[int(token_id)],
            )
        if any(is_cjk(c) for c in piece) and kind == "vocab_dir":
            assert len(piece) == 1
    # Every non-space character is inside some token: nothing is dropped.
    assert all(covered[i] or text[i].isspace() for i in range(len(text)))
    encoding = tokenizer.encode(text, max_length=128)
    spans = [text[s:e] for s, e in encoding.offsets[1:-1]]
    assert "".join(spans) == "".join(text.split())


def test_cli_and_bad_input(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    main(
        ["--corpus", str(corpus), "--out", str(tmp_path / "v"), "--vocab-size", "300", "--min-frequency", "1"]
    )
    assert "tokens ->" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        build_vocab([tmp_path / "missing.txt"], tmp_path / "w")
    with pytest.raises(ValueError, match="vocab_size"):
        build_vocab([corpus], tmp_path / "w", vocab_size=3)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no text"):
        build_vocab([empty], tmp_path / "w")


@pytest.mark.parametrize("kind", BOTH)
def test_vocabulary_trains_exports_and_serves_offsets(kind: str, tmp_path: Path, request) -> None:
    """From scratch on the built vocabulary (--scratch-config), exported to a bundle, whose tokenizer
    (what the service loads) gives the same ids and offsets, and whose ONNX model answers."""
    vocab_dir = request.getfixturevalue(kind)
    from export import export_bundle
    from export.bundle import load_bundle_manifest
    from tests.helpers.tiny import tiny_sizes
    from train.train import main as train_main

    data = tmp_path / "headlines.txt"
    data.write_text(
        "\n".join(f"{line}_!_{i % 2}" for i, line in enumerate(CORPUS * 4)) + "\n", encoding="utf-8"
    )
    config = tmp_path / "shape.json"
    config.write_text(json.dumps({**tiny_sizes(), "vocab_size": 1}), encoding="utf-8")
    summary = train_main(
        [
            *("--task", "classify", "--base", str(vocab_dir), "--scratch-config", str(config)),
            *("--train", str(data), "--validation", str(data), "--max-seq-len", "48"),
            *("--max-steps", "2", "--batch-size", "8", "--no-progress", "--out", str(tmp_path / "ckpt")),
        ]
    )
    assert summary["finished"] and summary["stopped_by"] == "steps"
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["vocab_size"] == TextTokenizer.from_dir(vocab_dir).vocab_size
    bundle = export_bundle(tmp_path / "ckpt", tmp_path / "bundle", variants=("fp32",), max_seq_len=48)
    assert load_bundle_manifest(bundle).task == "classify"
    served, built = TextTokenizer.from_dir(bundle), TextTokenizer.from_dir(vocab_dir)
    for text in MIXED:
        a, b = served.encode(text, max_length=48), built.encode(text, max_length=48)
        np.testing.assert_array_equal(a.input_ids, b.input_ids)
        np.testing.assert_array_equal(a.offsets, b.offsets)
