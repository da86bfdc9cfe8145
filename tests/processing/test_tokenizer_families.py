"""WordPiece (BERT, ELECTRA, DistilBERT), byte-level BPE (RoBERTa) and Unigram (XLM-R) through
processing/tokenizer.py: the special-token layout read from each tokenizer, offsets on tricky text
(leading spaces, accents, emoji, Chinese, words in several pieces), the NER word rules and QA windows.
The tokenizers are built here (model/tiny.py trains them on a few sentences with `tokenizers`)."""

from __future__ import annotations

import numpy as np
import pytest

from model.tiny import write_tokenizer
from processing import ner, qa
from processing.tokenizer import TextTokenizer
from processing.words import WORD_SPLITS, split_words

KINDS = ("wordpiece", "bpe", "unigram")
TRICKY = [
    "  John Smith lives in São Paulo.",
    "Mary moved to 北京 in 1999 🙂 and loved it!",
    "unbelievable internationalization, naïve café résumé",
    "\tTabs\tand\u3000ideographic spaces  end  ",
    "Zürich-based Acme Corp. hired O'Neil (the CEO).",
]


@pytest.fixture(scope="module", params=KINDS)
def tokenizer(request, tmp_path_factory) -> TextTokenizer:
    directory = tmp_path_factory.mktemp(request.param)
    write_tokenizer(directory, request.param)
    return TextTokenizer.from_dir(directory)


def test_layouts_are_the_tokenizers_own(tokenizer):
    """One text and a pair assembled from slices equal what the tokenizer itself (and transformers'
    fast tokenizer on the same file) produces: <s> A </s></s> B </s> for RoBERTa and XLM-R, one type."""
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.tokenizer)
    for text, pair in [(TRICKY[0], None), (TRICKY[1], TRICKY[2]), ("who?", TRICKY[3])]:
        ours = tokenizer.encode(text, pair, max_length=512)
        theirs = tokenizer.tokenizer.encode(text, pair) if pair else tokenizer.tokenizer.encode(text)
        assert ours.input_ids.tolist() == theirs.ids
        assert ours.token_type_ids.tolist() == theirs.type_ids
        assert ours.input_ids.tolist() == fast(text, pair)["input_ids"]
        assert len(ours) == len(tokenizer.tokenize(text)) + (
            len(tokenizer.tokenize(pair)) if pair else 0
        ) + tokenizer.n_special(pair is not None)
    expected_pair = {"WordPiece": 3, "BPE": 4, "Unigram": 4}[tokenizer.model_kind]
    assert tokenizer.n_special() == 2 and tokenizer.n_special(pair=True) == expected_pair


@pytest.mark.parametrize("text", TRICKY)
def test_offsets_cover_every_character_and_no_whitespace(tokenizer, text):
    tokens = tokenizer.tokenize(text)
    starts, ends = tokens.offsets[:, 0], tokens.offsets[:, 1]
    assert (starts <= ends).all() and (np.diff(starts) >= 0).all()
    for start, end in tokens.offsets:
        piece = text[start:end]
        assert piece == piece.strip(), (text, piece)
    covered = np.zeros(len(text), dtype=bool)
    for start, end in tokens.offsets:
        covered[start:end] = True
    missing = [text[i] for i in range(len(text)) if not covered[i] and not text[i].isspace()]
    assert not missing, missing


@pytest.mark.parametrize("rule", WORD_SPLITS)
@pytest.mark.parametrize("text", TRICKY)
def test_ner_words_are_the_rules_words_whatever_the_tokenizer_marks(tokenizer, rule, text):
    """Each word of the rule maps to its tokens: the first token opens the word at its first
    character (a lone Ġ or ▁ included), the last one closes it."""
    tokens = ner.tokenize_text(tokenizer, text, rule)
    if rule == "bert" and tokenizer.model_kind == "WordPiece":
        words = sorted({int(w) for w in tokens.word_ids if w >= 0})
    else:
        words = list(range(len(split_words(text, rule))))
        assert sorted(set(tokens.word_ids.tolist())) == words
    spans = []
    for w in words:
        idx = np.nonzero(tokens.word_ids == w)[0]
        spans.append((int(tokens.offsets[idx[0], 0]), int(tokens.offsets[idx[-1], 1])))
    if not (rule == "bert" and tokenizer.model_kind == "WordPiece"):
        assert spans == split_words(text, rule)
    for s, e in spans:
        assert text[s:e] and not text[s:e].isspace()


@pytest.mark.parametrize("word, kind", [("São", "LOC"), ("北京", "LOC"), ("Mary", "PER")])
def test_ner_entities_come_back_exactly_across_windows(tokenizer, word, kind):
    """B- on the first piece of a word, I- on the rest, windows of 8 tokens: the entity's text and
    offsets are the word's, for every tokenizer."""
    text = " ".join(["the cat sat on the mat"] * 3 + TRICKY[:2])
    start = text.index(word)
    tokens = ner.tokenize_text(tokenizer, text, "conll")
    windows = ner.make_windows(tokenizer, tokens, max_seq_len=8, overlap=2)
    assert len(windows) > 3
    labels = ["O", f"B-{kind}", f"I-{kind}"]
    index = next(w for w, (s, _) in enumerate(split_words(text, "conll")) if s == start)
    pieces = np.nonzero(tokens.word_ids == index)[0]  # the first may be a lone Ġ / ▁ piece
    logits = []
    for window in windows:
        assert window.encoding.sequence_ids[window.offset] == 0 and window.encoding.sequence_ids[0] == -1
        row = np.zeros((len(window.encoding), 3))
        row[:, 0] = 5.0
        for i in range(window.n_tokens):
            token = window.token_start + i
            if token in pieces:
                first = token == pieces[0]
                row[window.offset + i] = [0, 9.0 if first else 0, 0 if first else 9.0]
        logits.append(row)
    merged = ner.merge_window_logits(len(tokens), windows, logits)
    entities = ner.aggregate_entities(text, tokens, merged, dict(enumerate(labels)), "first")
    assert [(e.entity, e.text, e.start, e.end) for e in entities] == [(kind, word, start, start + len(word))]


@pytest.mark.parametrize("answer", ["São Paulo", "北京", "internationalization", "O'Neil"])
def test_qa_windows_and_answers_map_back_to_the_context(tokenizer, answer):
    context = " ".join(TRICKY * 3)
    question = "  Where does John live?"
    windows = qa.make_windows(tokenizer, question, context, max_seq_len=48, doc_stride=22, max_query_len=8)
    assert len(windows.windows) > 2
    char_start = context.index(answer)
    span = qa.char_to_token_span(windows.context_tokens, char_start, char_start + len(answer))
    starts, ends = [], []
    for window in windows.windows:
        enc = window.encoding
        n, at = window.n_context, window.context_offset
        assert enc.sequence_ids[at] == 1 and enc.sequence_ids[at - 1] == -1 and enc.sequence_ids[at + n] == -1
        assert (enc.offsets[at : at + n] == windows.context_tokens.offsets[window.token_start :][:n]).all()
        assert len(enc) <= 48
        s_logits, e_logits = np.zeros(len(enc)), np.zeros(len(enc))
        for position, token in ((0, span[0]), (1, span[1])):
            if window.token_start <= token < window.token_start + n:
                (s_logits, e_logits)[position][at + token - window.token_start] = 20.0
        starts.append(s_logits)
        ends.append(e_logits)
    best = qa.best_answers(windows, starts, ends, top_k=1, max_answer_len=30)[0]
    assert (best.text, best.start) == (answer, char_start)


def test_pad_unk_and_specials_by_either_spelling(tokenizer):
    vocab = tokenizer.tokenizer.get_vocab()
    bert = tokenizer.model_kind == "WordPiece"
    assert tokenizer.pad_id == vocab["[PAD]" if bert else "<pad>"]
    assert tokenizer.cls_id == vocab["[CLS]" if bert else "<s>"]
    assert tokenizer.sep_id == vocab["[SEP]" if bert else "</s>"]
    spans = tokenizer.token_spans("  hi")
    assert spans[0].special and spans[-1].special and spans[0].text == ("[CLS]" if bert else "<s>")
