"""SQuAD paragraphs as sentence ranking (QNLI-style): the splitter, the relevant sentence by the
answer's offsets, the pairs the classify reader yields, and a by-article split without overlap."""

from __future__ import annotations

import json
from pathlib import Path

from train.readers import detect_format, read_examples, read_squad
from train.splits import split_by_group
from train.squad_sentences import ranking_questions, split_sentences

PARAGRAPH = (
    "Dr. Smith moved to the U.S. in 1990. He taught at J. R. Jones College for 10 years! "
    'Did he like it? "Yes," he said. He retired in 2000.'
)


def sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in split_sentences(text)]


def test_splitter_keeps_abbreviations_and_initials_inside_sentences():
    assert sentences(PARAGRAPH) == [
        "Dr. Smith moved to the U.S. in 1990.",
        "He taught at J. R. Jones College for 10 years!",
        "Did he like it?",
        '"Yes," he said.',
        "He retired in 2000.",
    ]
    assert sentences("  One.  Two and three.\n") == ["One.", "Two and three."]
    assert sentences("no stop at the end") == ["no stop at the end"]
    assert sentences("3.5 million people. version 2.0 is out.") == ["3.5 million people. version 2.0 is out."]


def squad_file(tmp_path: Path) -> Path:
    def qa(qid: str, question: str, *answers: str, context: str = PARAGRAPH) -> dict:
        return {
            "id": qid,
            "question": question,
            "answers": [{"text": a, "answer_start": context.index(a)} for a in answers],
        }

    articles = [
        {
            "title": "Smith",
            "paragraphs": [
                {
                    "context": PARAGRAPH,
                    "qas": [
                        qa("q1", "When did Smith retire?", "2000"),
                        qa("q2", "Where did he teach?", "J. R. Jones College", "Jones College"),
                        qa("q3", "How long?", "10 years! Did he"),  # crosses a sentence boundary: dropped
                        qa("q4", "What did he say?", "Yes", "1990"),  # annotators disagree: dropped
                    ],
                }
            ],
        },
        {
            "title": "Short",
            "paragraphs": [
                {
                    "context": "Only one sentence here.",
                    "qas": [
                        qa("q5", "How many?", "one", context="Only one sentence here."),  # nothing to rank
                    ],
                }
            ],
        },
        {
            "title": "Rome",
            "paragraphs": [
                {
                    "context": "Rome is old. It has seven hills.",
                    "qas": [
                        qa("q6", "How many hills?", "seven", context="Rome is old. It has seven hills."),
                    ],
                }
            ],
        },
    ]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": articles}))
    return path


def test_the_relevant_sentence_holds_the_answer_and_unclear_questions_are_dropped(tmp_path):
    stats: dict = {}
    questions = list(ranking_questions(read_squad(squad_file(tmp_path)), stats))
    assert [(q.id, q.relevant, q.group) for q in questions] == [
        ("q1", 4, "Smith"),
        ("q2", 1, "Smith"),
        ("q6", 1, "Rome"),
    ]
    assert stats == {"kept": 3, "crosses_sentences": 1, "answers_disagree": 1, "one_sentence": 1}
    assert questions[0].sentences[questions[0].relevant] == "He retired in 2000."


def test_the_classify_reader_pairs_each_question_with_every_sentence(tmp_path):
    path = squad_file(tmp_path)
    assert detect_format("classify", path) == "squad-sentences"
    assert detect_format("qa", path) == "squad"
    pairs = read_examples("classify", path)
    assert len(pairs) == 5 + 5 + 2
    q1 = [(p.text_pair, p.label) for p in pairs if p.text == "When did Smith retire?"]
    assert q1[4] == ("He retired in 2000.", "relevant")
    assert [label for _, label in q1] == ["not_relevant"] * 4 + ["relevant"]
    assert {p.group for p in pairs} == {"Smith", "Rome"}


def test_the_split_holds_out_whole_articles(tmp_path):
    pairs = read_examples("classify", squad_file(tmp_path))
    train, held = split_by_group(pairs, 0.3, seed=0)
    assert train and held
    assert not {p.group for p in train} & {p.group for p in held}
    assert not {p.text for p in train} & {p.text for p in held}


def test_negatives_are_sampled_per_question_in_training_only(tmp_path):
    from train.splits import DataOptions, split_examples
    from train.squad_sentences import sample_negatives

    pairs = read_examples("classify", squad_file(tmp_path))
    kept = sample_negatives(pairs, 1, seed=0)
    assert [p for p in kept if p.label == "relevant"] == [p for p in pairs if p.label == "relevant"]
    per_question = {}
    for p in kept:
        per_question[p.text] = per_question.get(p.text, 0) + (p.label == "not_relevant")
    assert per_question == {"When did Smith retire?": 1, "Where did he teach?": 1, "How many hills?": 1}
    assert sample_negatives(pairs, 1, seed=0) == kept  # seeded
    options = DataOptions("classify", squad_file(tmp_path), validation_fraction=0.3, seed=0, negatives=0)
    train, valid = split_examples(options)
    assert {p.label for p in train} == {"relevant"}
    assert "not_relevant" in {p.label for p in valid}


def test_training_on_sentence_pairs_records_a_reranker(tmp_path):
    """config.json's `reranker` (export copies it into bundle.json, where serving reads it), for
    the format named or detected."""
    from types import SimpleNamespace

    from train.train import model_extra

    squad = squad_file(tmp_path)
    tsv = tmp_path / "sst.tsv"
    tsv.write_text("sentence\tlabel\ngood\t1\n")
    task = SimpleNamespace(options=SimpleNamespace(window_overlap=31))
    run = SimpleNamespace(task="classify", max_seq_len=128, long_text="truncate", format="auto", train=squad)
    assert model_extra(run, task)["reranker"] is True
    assert model_extra(SimpleNamespace(**{**vars(run), "format": "squad-sentences"}), task)["reranker"]
    assert "reranker" not in model_extra(SimpleNamespace(**{**vars(run), "train": tsv}), task)
