"""Readers: real-file quirks (BOM, blank lines, -DOCSTART-), format detection, and errors that
name the file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from train.readers import DataError, detect_format, read_examples
from train.splits import split_by_group

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def write(path: Path, text: str, bom: bool = False) -> Path:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


# ----------------------------------------------------------------------------- classify


def test_sst2_tsv_with_bom_blank_lines_and_trailing_space(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "sentence\tlabel\ngood fun \t1\n\n\nbad film \t0\n", bom=True)
    examples = read_examples("classify", path)
    assert [(e.text, e.text_pair, e.label) for e in examples] == [
        ("good fun", None, "1"),
        ("bad film", None, "0"),
    ]


def test_glue_pair_layouts(tmp_path: Path) -> None:
    rte = write(tmp_path / "rte.tsv", 'index\tsentence1\tsentence2\tlabel\n0\tA " quote\tB\tentailment\n')
    assert read_examples("classify", rte)[0].__dict__ | {"group": ""} == {
        "text": 'A " quote',
        "text_pair": "B",
        "label": "entailment",
        "group": "",
    }
    mrpc = write(
        tmp_path / "mrpc.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tx y\tz\n", bom=True
    )
    e = read_examples("classify", mrpc)[0]
    assert (e.text, e.text_pair, e.label) == ("x y", "z", "1")
    sick = write(
        tmp_path / "SICK_train.txt",
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n1\ta\tb\t4.5\tNEUTRAL\n",
    )
    assert read_examples("classify", sick)[0].label == "NEUTRAL"
    assert read_examples("classify", sick, label_column="relatedness_score")[0].label == "4.5"
    cola = write(tmp_path / "cola.tsv", "gj04\t1\t\tOur friends won't buy this.\n")
    assert read_examples("classify", cola)[0].label == "1"


def test_book_csv_and_jsonl_formats(tmp_path: Path) -> None:
    book = write(tmp_path / "toutiao.txt", "标题一_!_2\n\nA_!_B_!_1\n")
    assert detect_format("classify", book) == "book"
    assert [(e.text, e.text_pair, e.label) for e in read_examples("classify", book)] == [
        ("标题一", None, "2"),
        ("A", "B", "1"),
    ]
    csv_path = write(tmp_path / "data.csv", 'text,text_pair,label\n"a, b",c,pos\n')
    assert read_examples("classify", csv_path)[0].__dict__["text"] == "a, b"
    jsonl = write(tmp_path / "data.jsonl", '{"text": "x", "label": 1}\n\n{"text": "y", "label": 0}\n')
    assert [e.label for e in read_examples("classify", jsonl)] == ["1", "0"]


@pytest.mark.parametrize(
    "name, text, line",
    [
        ("bad.tsv", "sentence\tlabel\ngood\t1\nonly-one-column\n", 3),
        ("empty_label.tsv", "sentence\tlabel\ngood\t1\nbad\t\n", 3),
        ("bad.txt", "ok_!_1\nno separator here\n", 2),
        ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": \n', 2),
    ],
)
def test_malformed_classify_names_file_and_line(tmp_path: Path, name: str, text: str, line: int) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(DataError, match=f"{name}:{line}:"):
        read_examples("classify", path)


def test_unrecognised_header_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no recognised header"):
        read_examples("classify", write(tmp_path / "x.tsv", "foo\tbar\n1\t2\n"))


# ----------------------------------------------------------------------------- NER


def test_conll_docstart_blank_lines_and_bom(tmp_path: Path) -> None:
    text = (
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
        "-DOCSTART- -X- -X- O\n\nPeter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n"
    )
    examples = read_examples("ner", write(tmp_path / "train.txt", text, bom=True))
    assert [(e.words, e.tags) for e in examples] == [
        (["EU", "rejects"], ["B-ORG", "O"]),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"]),
    ]
    assert examples[0].group != examples[1].group  # documents, for a by-document split


def test_conll_iob1_tags_are_kept(tmp_path: Path) -> None:
    examples = read_examples(
        "ner", write(tmp_path / "eng.train", "U.N. NNP I-NP I-ORG\nofficial NN I-NP O\n")
    )
    assert examples[0].tags == ["I-ORG", "O"]


@pytest.mark.parametrize(
    "text, line, problem",
    [
        ("EU NNP B-NP B-ORG\nrejects\n", 2, "token and a tag"),
        ("EU NNP B-NP B-ORG\nrejects VBZ O\n", 2, "columns"),
        ("EU NNP B-NP ORG\n", 1, "not O or B-/I-"),
    ],
)
def test_malformed_conll(tmp_path: Path, text: str, line: int, problem: str) -> None:
    with pytest.raises(DataError, match=f"train.txt:{line}: .*{problem}"):
        read_examples("ner", write(tmp_path / "train.txt", text))


# ----------------------------------------------------------------------------- multiple choice


def test_swag_csv(tmp_path: Path) -> None:
    text = (
        ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
        '0,vid1,1,A man sits. He,A man sits.,He,gold,"stands, then",runs,eats,sleeps,2\n'
    )
    e = read_examples("multiple-choice", write(tmp_path / "train.csv", text))[0]
    assert (e.context, e.question, e.choices, e.label, e.group) == (
        "A man sits.",
        "He",
        ["stands, then", "runs", "eats", "sleeps"],
        2,
        "vid1",
    )


def test_codah_tsv_and_bad_label(tmp_path: Path) -> None:
    good = write(tmp_path / "train.tsv", "n\tThe cat. It\ta\tb\tc\td\t3\n\n")
    assert read_examples("multiple-choice", good)[0].label == 3
    bad = write(tmp_path / "dev.tsv", "n\tThe cat. It\ta\tb\tc\td\t3\nn\tp\ta\tb\tc\td\t7\n")
    with pytest.raises(DataError, match="dev.tsv:2: .*out of range"):
        read_examples("multiple-choice", bad)


def test_race_jsonl_gz(tmp_path: Path) -> None:
    row = {
        "id": "high1.txt",
        "article": "Text.",
        "questions": ["Q1?", "It is _ ."],
        "options": [["a", "b", "c", "d"], ["e", "f", "g", "h"]],
        "answers": ["B", "D"],
    }
    path = tmp_path / "train.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    assert detect_format("multiple-choice", path) == "race"
    examples = read_examples("multiple-choice", path)
    assert [(e.question, e.label, e.group) for e in examples] == [
        ("Q1?", 1, "high1.txt"),
        ("It is _ .", 3, "high1.txt"),
    ]


def test_race_missing_field(tmp_path: Path) -> None:
    path = write(
        tmp_path / "dev.jsonl",
        '{"article": "x", "questions": [], "options": [], "answers": []}\n'
        '{"article": "x", "questions": ["q"], "answers": ["A"]}\n',
    )
    with pytest.raises(DataError, match="dev.jsonl:2: missing field 'options'"):
        read_examples("multiple-choice", path, fmt="race")


# ----------------------------------------------------------------------------- QA

RACE_PASSAGE = (
    "Tom lives in Leeds. He has a red bike. Every morning he rides it to school. "
    "His sister Ann walks. She likes the park near the river."
)


def race_row(questions: list[str], options: list[list[str]], answers: list[str]) -> dict:
    return {
        "id": "middle7.txt",
        "article": RACE_PASSAGE,
        "questions": questions,
        "options": options,
        "answers": answers,
    }


def test_race_as_qa_spans_keeps_only_answerable_questions(tmp_path: Path) -> None:
    row = race_row(
        [
            "Where does Tom live?",  # kept: one option in the passage
            "Tom rides _ to school.",  # kept, cloze; the passage's case wins
            "How does Ann go to school?",  # dropped: the answer is not in the passage
            "Which of the following is true?",  # dropped: needs its options
            "What colour is the bike?",  # kept: a distractor in the passage is a hard negative
            "What does Tom do?",  # kept: the right option is nearly a span (token F1 0.92)
            "What does Ann like?",  # dropped: two options nearly match, equally well
            "What is not red?",  # dropped: negated, with a distractor in the passage
        ],
        [
            ["London", "Leeds.", "York", "Hull"],
            ["A bus", "it", "A car", "A boat"],
            ["by bus", "on foot", "by car", "by bike"],
            ["Tom lives in Leeds", "x", "y", "z"],
            ["red", "blue", "green", "morning"],
            ["He sleeps all day", "Every morning he rides to school", "He cooks", "He reads books"],
            ["the park near the big river", "the park near the old river", "a cat", "a dog"],
            ["bike", "park", "cat", "dog"],
        ],
        ["B", "B", "B", "A", "A", "B", "B", "B"],
    )
    path = write(tmp_path / "race.jsonl", json.dumps(row) + "\n")
    assert detect_format("qa", path) == "race"
    examples = read_examples("qa", path)
    assert [(e.id, e.question, e.answers[0][0]) for e in examples] == [
        ("middle7.txt-0", "Where does Tom live?", "Leeds"),
        ("middle7.txt-1", "Tom rides _ to school.", "it"),
        ("middle7.txt-4", "What colour is the bike?", "red"),
        ("middle7.txt-5", "What does Tom do?", "Every morning he rides it to school"),
    ]
    for e in examples:
        text, start = e.answers[0]
        assert e.context[start : start + len(text)] == text and e.group == "middle7.txt"
        assert e.context in RACE_PASSAGE and e.context.endswith((".", "river"))


def test_race_spans_answer_from_the_sentence_that_matches_the_question(tmp_path: Path) -> None:
    article = "The park is near the river. Tom swims in the river every day. Ann never swims."
    row = {
        "article": article,
        "questions": ["Where does Tom swim every day?"],
        "options": [["the sea", "the river"]],
    }
    path = write(tmp_path / "race.jsonl", json.dumps({**row, "answers": ["B"]}) + "\n")
    [example] = read_examples("qa", path, fmt="race")
    text, start = example.answers[0]
    assert text == "the river" and example.context[: start + len(text)].endswith("swims in the river")


def test_race_spans_trim_long_passages_to_whole_sentences() -> None:
    from train.race_spans import Passage, option_matches

    article = " ".join(f"Sentence number {i} is here." for i in range(60))
    [span] = option_matches(article, "number 30")
    passage = Passage(article)
    lengths = []
    for seed in range(5):
        context, start = passage.sentences_around(span, words=25, seed=seed)
        assert context[start : start + 9] == "number 30"
        assert context.startswith("Sentence") and context.endswith("here.")
        lengths.append(len(context.split()))
        assert 25 <= lengths[-1] < 25 + 5
    starts = {passage.sentences_around(span, 25, seed)[1] for seed in range(5)}
    assert len(starts) > 2, "the answer should not always sit at the same place"


def test_race_spans_missing_answers_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", '{"article": "a", "questions": ["q"], "options": [["a", "b"]]}\n')
    with pytest.raises(DataError, match="r.jsonl:1: missing field 'answers'"):
        read_examples("qa", path, fmt="race")


def squad(answers: list[dict], impossible: bool | None = None) -> dict:
    qa = {"id": "q1", "question": "Where?", "answers": answers}
    if impossible is not None:
        qa["is_impossible"] = impossible
    return {
        "version": "2.0",
        "data": [{"title": "T", "paragraphs": [{"context": "It is in Paris.", "qas": [qa]}]}],
    }


def test_squad_v2_and_repaired_answer_start(tmp_path: Path) -> None:
    path = write(tmp_path / "a.json", json.dumps(squad([{"text": "Paris", "answer_start": 3}])))
    assert read_examples("qa", path)[0].answers == [("Paris", 9)]
    path = write(tmp_path / "b.json", json.dumps(squad([], impossible=True)))
    e = read_examples("qa", path)[0]
    assert e.is_impossible and e.answers == [] and e.group == "T"


def test_squad_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="bad.json:1: invalid JSON"):
        read_examples("qa", write(tmp_path / "bad.json", '{"data": [}'))
    with pytest.raises(DataError, match="not found in the context"):
        read_examples(
            "qa", write(tmp_path / "c.json", json.dumps(squad([{"text": "Rome", "answer_start": 0}])))
        )
    with pytest.raises(DataError, match="no answers and not marked is_impossible"):
        read_examples("qa", write(tmp_path / "d.json", json.dumps(squad([]))))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_examples("classify", tmp_path / "nope.tsv")


def test_split_by_group_keeps_articles_whole(tmp_path: Path) -> None:
    data = {
        "version": "1.1",
        "data": [
            {
                "title": f"A{a}",
                "paragraphs": [
                    {
                        "context": "x y z",
                        "qas": [
                            {"id": f"{a}-{q}", "question": "?", "answers": [{"text": "y", "answer_start": 2}]}
                            for q in range(5)
                        ],
                    }
                ],
            }
            for a in range(10)
        ],
    }
    examples = read_examples("qa", write(tmp_path / "s.json", json.dumps(data)))
    train, valid = split_by_group(examples, 0.2, seed=0)
    assert len(valid) == 10 and len(train) == 40
    assert not {e.group for e in train} & {e.group for e in valid}


# ----------------------------------------------------------------------------- the real files


@pytest.mark.data
@pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not here")
@pytest.mark.parametrize(
    "task, path, fmt, count",
    [
        ("classify", "glue/RTE/dev.tsv", "tsv", 277),
        ("classify", "glue/MRPC/dev.tsv", "tsv", 408),
        ("classify", "glue/STS-B/dev.tsv", "tsv", 1500),
        ("classify", "sick2014/SICK_trial.txt", "tsv", 500),
        ("ner", "conll2003/dev.txt", "conll", 3250),
        ("multiple-choice", "codah/cv_split/fold_0/dev.tsv", "codah", 556),
        ("multiple-choice", "bertwithpretrained/MultipleChoice/train.csv", "swag", 91),
        ("multiple-choice", "race/dev.jsonl", "race", 4887),
        ("qa", "squad/squad-v1.1-dev-part-b.json", "squad", 5609),
        # 5,134 questions with a clear relevant sentence, 25,290 question-sentence pairs
        ("classify", "squad/squad-v1.1-dev-part-b.json", "squad-sentences", 25290),
    ],
)
def test_real_files(task: str, path: str, fmt: str, count: int) -> None:
    assert detect_format(task, DATA / path) == fmt
    assert len(read_examples(task, DATA / path)) == count
