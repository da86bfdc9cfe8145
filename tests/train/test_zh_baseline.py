"""The Chinese baselines on a made-here copy of the Toutiao file: each learns what it should, the
results files hold a runnable command, and the category names follow the book's codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train import zh_baseline
from train.corpus import TOUTIAO

# Two topics a character model separates at once, and a third, rarer one.
TOPICS = {"3": "篮球比赛球员得分", "6": "汽车新车销量上市", "11": "美国总统外交访问"}


def fake_toutiao(root: Path, n: int = 90) -> Path:
    lines = []
    for i in range(n):
        label = "3" if i % 3 == 0 else "6" if i % 3 == 1 else ("11" if i % 2 else "3")
        words = TOPICS[label]
        lines.append(f"{words[i % 4 :]}{words[: i % 4]}第{i}号_!_{label}")
    path = root / TOUTIAO
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_baselines_learn_the_toy_topics(tmp_path: Path) -> None:
    out = tmp_path / "results" / "zh_baseline.json"
    report = zh_baseline.main(["--data", str(fake_toutiao(tmp_path)), "--out", str(out)])
    scores = report["baselines"]
    assert set(scores) == set(zh_baseline.BASELINES)
    assert scores["TF-IDF char 1-3-grams + LinearSVC"]["test"] == 1.0
    # The majority class ("3": half the headlines) is no better than its share; the bag of
    # characters learns the topics' characters (the shared 第/号 and digits blur a few).
    assert scores["majority class"]["valid"] < 0.6
    assert scores["fastText-style bag of characters"]["valid"] > scores["majority class"]["valid"] + 0.15
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["command"] == "python -m train.zh_baseline --data ../shared/data"
    assert sum(saved["split"].values()) == 90
    table = out.with_suffix(".md").read_text(encoding="utf-8")
    assert "| TF-IDF char 1-3-grams + LinearSVC | 1.0000 | 1.0000 |" in table
    assert str(tmp_path) not in table


def test_absent_data_skips_without_writing(tmp_path: Path) -> None:
    out = tmp_path / "zh_baseline.json"
    assert zh_baseline.main(["--data", str(tmp_path / "nowhere"), "--out", str(out)]) is None
    assert not out.exists()


def test_category_names_follow_the_codes() -> None:
    # The dataset's codes 100-116 without 105 and 111, in order, are the book's labels 0-14.
    assert len(zh_baseline.CATEGORIES) == len(set(zh_baseline.CATEGORIES)) == 15
    names = dict(
        zip([c for c in range(100, 117) if c not in (105, 111)], zh_baseline.CATEGORIES, strict=True)
    )
    assert (names[103], names[104], names[113], names[116]) == ("体育", "财经", "国际", "电竞")


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.mark.skipif(not (DATA / TOUTIAO).exists(), reason="../shared/data is not here")
def test_the_books_examples_carry_the_mapped_names() -> None:
    # Headlines of the book's own data, their labels read through CATEGORIES.
    rows = dict(zh_baseline.read_toutiao(DATA / TOUTIAO))
    sports = [t for t, y in rows.items() if "NBA" in t]
    assert sports and sum(zh_baseline.CATEGORIES[int(rows[t])] == "体育" for t in sports) > len(sports) / 2
    games = [t for t in rows if "王者荣耀" in t]
    assert sum(zh_baseline.CATEGORIES[int(rows[t])] == "电竞" for t in games) > len(games) / 2
