"""Readers for the real dataset files, one per task, with format auto-detection.

Every reader copes with a UTF-8 BOM and blank lines, and raises `DataError` naming the file
and line of malformed input. Examples carry a `group` (article, passage, document) so a
validation slice can be held out by group rather than by row.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from processing.tasks import TRAINED_TASKS

from .examples import (
    ChoiceExample,
    ClassifyExample,
    DataError,
    NERExample,
    QAExample,
    base_suffix,
    first_line,
    json_lines,
    open_text,
    parse_label,
)
from .race_spans import race_span_examples
from .squad_sentences import ranking_questions, sentence_pairs

FORMATS = {
    "classify": ("tsv", "csv", "jsonl", "book", "squad-sentences"),
    "ner": ("conll", "jsonl"),
    "multiple-choice": ("swag", "codah", "race", "jsonl"),
    "qa": ("squad", "race"),
}
TEXT_COLUMNS = ("text", "sentence1", "question", "sentence_A", "#1 String", "premise", "text_a", "sentence")
PAIR_COLUMNS = ("text_pair", "sentence2", "sentence", "sentence_B", "#2 String", "hypothesis", "text_b")
LABEL_COLUMNS = ("label", "score", "entailment_judgment", "Quality", "gold_label")
BOOK_SEPARATOR = "_!_"


def detect_format(task: str, path: str | Path) -> str:
    if task not in TRAINED_TASKS:  # an untrained task (embed) has no reader
        raise ValueError(f"no reader for task {task!r}; expected one of {TRAINED_TASKS}")
    suffix, head = base_suffix(path), first_line(path)
    if task == "qa":
        return "race" if '"article"' in head and '"questions"' in head else "squad"
    if task == "ner":
        return "jsonl" if suffix in (".jsonl", ".json") else "conll"
    if task == "multiple-choice":
        if suffix in (".jsonl", ".json"):
            return "race" if '"article"' in head and '"questions"' in head else "jsonl"
        if suffix == ".csv" or "ending0" in head:
            return "swag"
        return "codah"
    if suffix in (".jsonl", ".json"):  # SQuAD JSON as classify: question-sentence pairs (QNLI)
        return "squad-sentences" if '"paragraphs"' in head else "jsonl"
    if suffix == ".csv":
        return "csv"
    return "book" if BOOK_SEPARATOR in head else "tsv"


def read_examples(task: str, path: str | Path, fmt: str = "auto", **options) -> list:
    fmt = detect_format(task, path) if fmt in ("auto", None) else fmt
    if fmt not in FORMATS[task]:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS[task]} for task {task}")
    reader = READERS[(task, fmt)]
    examples = list(reader(path, **options) if task == "classify" else reader(path))
    if not examples:
        raise DataError(path, None, f"no {task} examples found (format {fmt})")
    return examples


def pick(columns: list[str], candidates: tuple[str, ...], exclude: tuple[str | None, ...] = ()) -> str | None:
    for name in candidates:
        if name in columns and name not in exclude:
            return name
    return None


# ----------------------------------------------------------------------------- classify


def read_classify_table(
    path: str | Path,
    delimiter: str,
    text_column: str | None = None,
    pair_column: str | None = None,
    label_column: str | None = None,
) -> Iterator[ClassifyExample]:
    """GLUE-style TSV (SST-2, RTE, MRPC, STS-B, WNLI, QNLI, SICK; header-less CoLA) or a CSV."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    with open_text(path) as f:
        rows = csv.reader(f, delimiter=delimiter, quoting=quoting)
        header = None
        for row in rows:
            if any(cell.strip() for cell in row):
                header = [c.strip() for c in row]
                break
        if header is None:
            raise DataError(path, None, "file is empty")
        columns = header
        if not pick(header, TEXT_COLUMNS + LABEL_COLUMNS) and not text_column:
            if len(header) == 4 and header[1].strip() in ("0", "1") and not header[2].strip():
                # CoLA has no header: source, label, original label, sentence
                columns, header = ["source", "label", "orig_label", "text"], None
            else:
                raise DataError(path, 1, f"no recognised header (want a text and a label column): {header}")
        text_col = text_column or pick(columns, TEXT_COLUMNS)
        pair_col = pair_column or pick(columns, PAIR_COLUMNS, exclude=(text_col,))
        label_col = label_column or pick(columns, LABEL_COLUMNS)
        for name in (text_col, pair_col, label_col):
            if name is not None and name not in columns:
                raise DataError(path, 1, f"column {name!r} not in header {columns}")
        if text_col is None:
            raise DataError(path, 1, f"no text column in header {columns}")
        index = {name: i for i, name in enumerate(columns)}

        def build(row: list[str], line: int) -> ClassifyExample:
            if len(row) != len(columns):
                raise DataError(path, line, f"expected {len(columns)} columns, found {len(row)}")
            text = row[index[text_col]].strip()
            pair = row[index[pair_col]].strip() if pair_col else None
            label = row[index[label_col]].strip() if label_col else None
            if not text:
                raise DataError(path, line, "empty text")
            if label_col and not label:
                raise DataError(path, line, f"empty label in column {label_col!r}")
            return ClassifyExample(text, pair, label, group=str(line))

        if header is None:
            yield build(row, rows.line_num)
        for row in rows:
            if any(cell.strip() for cell in row):
                yield build(row, rows.line_num)


def read_classify_tsv(path: str | Path, **options) -> Iterator[ClassifyExample]:
    return read_classify_table(path, "\t", **options)


def read_classify_csv(path: str | Path, **options) -> Iterator[ClassifyExample]:
    return read_classify_table(path, ",", **options)


def read_classify_jsonl(
    path: str | Path, text_column: str | None = None, pair_column: str | None = None, label_column=None
) -> Iterator[ClassifyExample]:
    for n, row in json_lines(path):
        keys = list(row)
        text_col = text_column or pick(keys, TEXT_COLUMNS)
        pair_col = pair_column or pick(keys, PAIR_COLUMNS, exclude=(text_col,))
        label_col = label_column or pick(keys, LABEL_COLUMNS)
        if text_col is None or not isinstance(row.get(text_col), str) or not row[text_col].strip():
            raise DataError(path, n, f"no text field (one of {TEXT_COLUMNS}) in {keys}")
        label = row.get(label_col) if label_col else None
        pair = row.get(pair_col) if pair_col else None
        yield ClassifyExample(row[text_col].strip(), pair, None if label is None else str(label), str(n))


def read_classify_book(path: str | Path, **_) -> Iterator[ClassifyExample]:
    """The BertWithPretrained book's `text_!_label` or `text_!_pair_!_label` lines."""
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split(BOOK_SEPARATOR)
            if len(parts) not in (2, 3) or not parts[0].strip() or not parts[-1].strip():
                raise DataError(
                    path, n, f"expected text{BOOK_SEPARATOR}label or a pair; got {len(parts)} fields"
                )
            pair = parts[1].strip() if len(parts) == 3 else None
            yield ClassifyExample(parts[0].strip(), pair, parts[-1].strip(), str(n))


# ----------------------------------------------------------------------------- NER


def read_conll(path: str | Path) -> Iterator[NERExample]:
    """CoNLL columns (`token POS chunk NER` or `token tag`): the tag is the last column.
    `-DOCSTART-` lines start a new document; blank lines end sentences."""
    words: list[str] = []
    tags: list[str] = []
    document, width = 0, None
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts or parts[0] == "-DOCSTART-":
                if words:
                    yield NERExample(words, tags, group=f"doc{document}")
                    words, tags = [], []
                if parts:
                    document += 1
                continue
            if len(parts) < 2:
                raise DataError(path, n, f"expected a token and a tag, got {line.strip()!r}")
            if width is not None and len(parts) != width:
                raise DataError(
                    path, n, f"expected {width} columns like the lines before, found {len(parts)}"
                )
            width = len(parts)
            tag = parts[-1]
            if tag != "O" and (len(tag) < 3 or tag[0] not in "BIES" or tag[1] != "-"):
                raise DataError(path, n, f"tag {tag!r} is not O or B-/I-/E-/S-TYPE")
            words.append(parts[0])
            tags.append(tag)
    if words:
        yield NERExample(words, tags, group=f"doc{document}")


def read_ner_jsonl(path: str | Path) -> Iterator[NERExample]:
    """{"tokens": [...], "tags": [...]} per line (also "words" / "ner_tags" as names)."""
    for n, row in json_lines(path):
        words = row.get("tokens", row.get("words"))
        tags = row.get("tags", row.get("ner_tags", row.get("labels")))
        if not isinstance(words, list) or not isinstance(tags, list) or len(words) != len(tags) or not words:
            raise DataError(path, n, "need equal-length, non-empty 'tokens' and 'tags' lists")
        yield NERExample([str(w) for w in words], [str(t) for t in tags], group=str(row.get("document", n)))


# ----------------------------------------------------------------------------- multiple choice


def read_swag(path: str | Path) -> Iterator[ChoiceExample]:
    """SWAG CSV: sent1 is the context, sent2 starts every ending (or startphrase alone)."""
    with open_text(path) as f:
        rows = csv.DictReader(f)
        fields = rows.fieldnames or []
        endings = sorted((c for c in fields if c.startswith("ending")), key=lambda c: int(c[6:] or 0))
        if not endings or not ({"sent1", "startphrase"} & set(fields)):
            raise DataError(path, 1, f"not a SWAG header (want sent1/startphrase and ending0..): {fields}")
        for row in rows:
            line = rows.line_num
            if None in row or any(row.get(c) is None for c in endings):
                raise DataError(path, line, f"expected {len(fields)} columns")
            if row.get("sent1") is not None and "sent2" in row:
                context, question = row["sent1"], row["sent2"]
            else:
                context, question = row["startphrase"], None
            label = row.get("label", "")
            label = parse_label(label, len(endings), path, line) if label.strip() else None
            group = row.get("video-id") or str(line)
            yield ChoiceExample(context.strip(), question, [row[c].strip() for c in endings], label, group)


def read_codah(path: str | Path) -> Iterator[ChoiceExample]:
    """CODAH TSV, no header: category, prompt, four endings, answer index."""
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 7:
                raise DataError(path, n, f"expected 7 tab-separated columns (CODAH), found {len(parts)}")
            yield ChoiceExample(
                parts[1].strip(),
                None,
                [p.strip() for p in parts[2:6]],
                parse_label(parts[6], 4, path, n),
                group=str(n),
            )


def read_race(path: str | Path) -> Iterator[ChoiceExample]:
    """RACE: one passage per line with parallel `questions`, `options` and letter `answers`."""
    for n, row in json_lines(path):
        try:
            article, questions, options = row["article"], row["questions"], row["options"]
        except KeyError as e:
            raise DataError(
                path, n, f"missing field {e.args[0]!r} (RACE needs article/questions/options)"
            ) from None
        answers = row.get("answers", [None] * len(questions))
        if not len(questions) == len(options) == len(answers):
            raise DataError(path, n, "questions, options and answers differ in length")
        for question, choices, answer in zip(questions, options, answers, strict=True):
            label = parse_label(answer, len(choices), path, n) if answer is not None else None
            yield ChoiceExample(article, question, list(choices), label, group=str(row.get("id", n)))


def read_choice_jsonl(path: str | Path) -> Iterator[ChoiceExample]:
    """Flat JSONL: context (or article), question (optional), choices (or options/endings), label."""
    for n, row in json_lines(path):
        context = row.get("context", row.get("article"))
        choices = row.get("choices", row.get("options", row.get("endings")))
        if not isinstance(context, str) or not isinstance(choices, list) or len(choices) < 2:
            raise DataError(path, n, "need a 'context' string and a 'choices' list of 2 or more")
        label = row.get("label", row.get("answer"))
        label = parse_label(label, len(choices), path, n) if label is not None else None
        yield ChoiceExample(
            context, row.get("question"), [str(c) for c in choices], label, group=str(row.get("id", n))
        )


# ----------------------------------------------------------------------------- QA


def read_squad(path: str | Path) -> Iterator[QAExample]:
    """SQuAD v1.1/v2.0 JSON. A wrong `answer_start` is repaired by locating the answer text."""
    with open_text(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(path, e.lineno, f"invalid JSON: {e.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(path, None, "not SQuAD JSON: no top-level 'data' list")
    for a, article in enumerate(data["data"]):
        title = article.get("title", f"article{a}")
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            context = paragraph.get("context")
            if not isinstance(context, str):
                raise DataError(path, None, f"article {title!r} paragraph {p}: no context")
            for qa in paragraph.get("qas", []):
                where = f"question {qa.get('id')!r} in {title!r}"
                if "question" not in qa or "id" not in qa:
                    raise DataError(path, None, f"{where}: needs 'id' and 'question'")
                impossible = bool(qa.get("is_impossible", False))
                answers = []
                for answer in qa.get("answers", []):
                    text, start = answer.get("text", ""), answer.get("answer_start", -1)
                    if context[start : start + len(text)] != text:
                        start = context.find(text)
                    if text and start < 0:
                        raise DataError(path, None, f"{where}: answer {text!r} not found in the context")
                    answers.append((text, start))
                if not answers and not impossible:
                    raise DataError(path, None, f"{where}: no answers and not marked is_impossible")
                yield QAExample(str(qa["id"]), qa["question"], context, answers, impossible, title)


def read_squad_sentences(path: str | Path, **_) -> Iterator[ClassifyExample]:
    """SQuAD as classify (`--format squad-sentences`): every question-sentence pair, QNLI-style."""
    return iter(sentence_pairs(list(ranking_questions(read_squad(path)))))


def read_race_spans(path: str | Path) -> Iterator[QAExample]:
    """RACE questions whose right option is a span of the passage, as extractive QA."""
    return race_span_examples(path)


READERS = {
    ("classify", "tsv"): read_classify_tsv,
    ("classify", "csv"): read_classify_csv,
    ("classify", "jsonl"): read_classify_jsonl,
    ("classify", "book"): read_classify_book,
    ("classify", "squad-sentences"): read_squad_sentences,
    ("ner", "conll"): read_conll,
    ("ner", "jsonl"): read_ner_jsonl,
    ("multiple-choice", "swag"): read_swag,
    ("multiple-choice", "codah"): read_codah,
    ("multiple-choice", "race"): read_race,
    ("multiple-choice", "jsonl"): read_choice_jsonl,
    ("qa", "squad"): read_squad,
    ("qa", "race"): read_race_spans,
}
