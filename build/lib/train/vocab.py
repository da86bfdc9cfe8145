"""Build a BERT WordPiece vocabulary from text files: `python -m train.vocab --corpus F --out DIR`.

The `tokenizers` library's WordPiece trainer behind BERT's normalizer and pre-tokenizer: text is
cleaned, optionally lower-cased with accents stripped, split on whitespace and punctuation, and
every CJK character becomes a word of its own (as BERT's basic tokenizer does), so Chinese is
one token per character. The output directory is a tokenizer as every other part of the project
reads it (`processing.tokenizer.TextTokenizer.from_dir`): `vocab.txt`, `tokenizer.json`,
`tokenizer_config.json`, `special_tokens_map.json`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers.implementations import BertWordPieceTokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_vocab(
    corpus: Sequence[str | Path],
    out: str | Path,
    vocab_size: int = 8000,
    min_frequency: int = 2,
    lowercase: bool = True,
    limit_alphabet: int | None = None,
) -> Path:
    """Train a WordPiece vocabulary on `corpus` files and write the tokenizer files into `out`.

    `limit_alphabet` caps the distinct characters kept; by default up to half the vocabulary, so
    Chinese keeps its thousands of characters (the library's default of 1,000 would map the rest
    to [UNK]).
    """
    files = [str(Path(f)) for f in corpus]
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"vocabulary corpus {f} does not exist or is not a file")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    tokenizer = BertWordPieceTokenizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tokenizer.train(
        files,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet or vocab_size // 2,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError(f"{', '.join(files)}: no text to build a vocabulary from")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_model(str(out))  # vocab.txt, one token per line in id order
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"do_lower_case": lowercase, "tokenizer_class": "BertTokenizer", "tokenize_chinese_chars": True}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]"}
    specials["mask_token"] = "[MASK]"
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")
    return out


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
    args = parser.parse_args(argv)
    out = build_vocab(
        args.corpus, args.out, args.vocab_size, args.min_frequency, not args.cased, args.limit_alphabet
    )
    size = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    print(f"{size} tokens -> {out}")
    return out


if __name__ == "__main__":
    main()
