"""What a "word" is for token classification: one rule, saved with the model, read back by serving.

A NER model learns a label on the first sub-token of each word of its training data. Serving
must cut raw text into the same kind of words, or the model is asked about sub-tokens it was
never trained on (`P.` read as `P` + `.` gets two predictions). The rule a model was trained
with is stored as `word_split` in its config and bundle manifest:

- `conll`: the words of CoNLL-2003 and Penn-Treebank-style data. Whitespace-separated, with
  commas, brackets, quotes, `!`/`?`/`;`/`:` and clitics (`'s`, `n't`) split off, and a
  sentence's final period split off unless the word is an initial (`P.`), holds another
  period (`U.S.`, `a.m.`), is a number (`3.`) or a known abbreviation (`Corp.`). Text that is
  already tokenized (words joined by single spaces) gives back exactly its words.
- `whitespace`: maximal runs of non-space characters, nothing else.
- `bert`: BERT's pre-tokenizer (every punctuation mark and every CJK character a word). This was
  the serving rule before rules were recorded; a CoNLL-trained model scores about 8 F1 lower under it.

Every rule names words by character spans, whatever the tokenizer: a WordPiece tokenizer marks
the pieces that continue a word (##), byte-level BPE and SentencePiece the piece that starts one
(Ġ, ▁). The words are tokenized as given (TextTokenizer.tokenize_words), each as if it followed a
space, and a word's label sits on its first piece in all three.
"""

from __future__ import annotations

import re

from tokenizers.pre_tokenizers import BertPreTokenizer

WORD_SPLITS = ("conll", "whitespace", "bert")
# Bundles exported before `word_split` was recorded: this project's NER training has always
# labelled the words of CoNLL-style files.
LEGACY_WORD_SPLIT = "conll"

_NON_SPACE = re.compile(r"\S+")
_OPENING = '([{"«“‘'  # split off the front of a word (never ', which opens 's and 're)
_CLOSING = ',;:!?)]}"»”’…'  # split off the back of a word
_CLITICS = ("n't", "N'T", "'s", "'S", "'re", "'RE", "'m", "'M", "'ve", "'VE", "'ll", "'LL", "'d", "'D")
# Words whose final period belongs to them (case-insensitive, without the period).
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof st mt ft jr sr sen rep gov gen col lt sgt capt cmdr adm rev hon pres
    inc corp co ltd plc bros cie ag nv bv sa spa dept univ assn no nos vol vs etc al approx est
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thur thurs fri sat sun
    ala ariz ark calif colo conn del fla ga ill ind kan kans ky la md mass mich minn miss mo mont
    neb nev okla ore pa penn tenn tex va vt wash wis wisc wyo""".split()
)


def split_words(text: str, rule: str) -> list[tuple[int, int]]:
    """[start, end) character spans of the words of `text` under `rule` (not for `bert`, whose
    words come from the tokenizer itself)."""
    if rule == "whitespace":
        return [m.span() for m in _NON_SPACE.finditer(text)]
    if rule == "conll":
        return [span for m in _NON_SPACE.finditer(text) for span in _conll_pieces(m.group(), m.start())]
    if rule == "bert":
        return [span for _, (s, e) in _BERT_WORDS.pre_tokenize_str(text) for span in _cjk_apart(text, s, e)]
    raise ValueError(f"word_split must be one of {WORD_SPLITS} here, got {rule!r}")


_BERT_WORDS = BertPreTokenizer()
# The CJK ideographs BERT's normalizer spaces apart (its _is_chinese_char ranges).
CJK = re.compile(
    "[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002ceaf\U0002f800-\U0002fa1f]"
)


def _cjk_apart(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) with each CJK character its own word, as BERT's normalizer spaces them."""
    spans, s = [], start
    for m in CJK.finditer(text, start, end):
        if m.start() > s:
            spans.append((s, m.start()))
        spans.append(m.span())
        s = m.end()
    return spans + ([(s, end)] if s < end else [])


def _conll_pieces(word: str, offset: int) -> list[tuple[int, int]]:
    """One whitespace word cut into CoNLL/PTB tokens, as spans shifted by `offset`."""
    start, end = 0, len(word)
    front: list[tuple[int, int]] = []
    back: list[tuple[int, int]] = []
    while end - start > 1 and word[start] in _OPENING:
        front.append((start, start + 1))
        start += 1
    while end - start > 1:
        core = word[start:end]
        if core[-1] in _CLOSING:
            back.append((end - 1, end))
            end -= 1
        elif core[-1] == "." and _sentence_period(core):
            back.append((end - 1, end))
            end -= 1
        else:
            clitic = next((c for c in _CLITICS if core.endswith(c) and len(core) > len(c)), None)
            if clitic is None:
                break
            back.append((end - len(clitic), end))
            end -= len(clitic)
    pieces = [*front, (start, end), *reversed(back)]
    return [(offset + s, offset + e) for s, e in pieces]


def _sentence_period(core: str) -> bool:
    """Whether the final `.` of `core` ends a sentence rather than belonging to the word."""
    stem = core[:-1]
    if not stem or not any(ch.isalnum() for ch in stem):
        return False  # "..." and other runs of punctuation stay whole
    if "." in stem or stem.isdigit():
        return False  # U.S., a.m., 3.
    if len(stem) == 1 and stem.isalpha():
        return False  # an initial: P.
    return stem.lower() not in ABBREVIATIONS
