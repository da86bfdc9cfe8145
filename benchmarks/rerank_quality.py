"""Sentence ranking on held-out SQuAD articles: the reranker default (`/rerank`) against a bi-encoder
(`/similarity`) and BM25 (Okapi, k1 1.2, b 0.75, Lucene's idf), on the same questions.

    python -m benchmarks.rerank_quality [--url URL] [--bundles .cache/bundles]
"""

from __future__ import annotations

import math
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks import bench_common as common
from benchmarks.live_quality import parser, served_variants, service, validation
from processing.metrics import ranking_scores
from train.readers import read_squad
from train.recipes import recipes
from train.splits import DataOptions, split_by_group
from train.squad_sentences import RankingQuestion, ranking_questions, sentence_pairs

WORD = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    return WORD.findall(text.lower())


class BM25:
    """Okapi BM25 over a fixed corpus of documents (here: sentences)."""

    def __init__(self, corpus: list[str], k1: float = 1.2, b: float = 0.75):
        docs = [tokens(d) for d in corpus]
        self.k1, self.b, self.n = k1, b, len(docs)
        self.avgdl = sum(map(len, docs)) / max(1, self.n)
        self.df = Counter(t for d in docs for t in set(d))

    def idf(self, term: str) -> float:
        df = self.df.get(term, 0)
        return math.log(1 + (self.n - df + 0.5) / (df + 0.5))

    def score(self, query: str, document: str) -> float:
        tf, length = Counter(tokens(document)), len(tokens(document))
        norm = self.k1 * (1 - self.b + self.b * length / self.avgdl)
        terms = [t for t in set(tokens(query)) if t in tf]
        return sum(self.idf(t) * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms)


def held_out_questions(recipe_data: list[str]) -> list[RankingQuestion]:
    """The questions of the articles the reranker recipe holds out (the same split as training)."""
    opt = dict(zip(recipe_data[::2], recipe_data[1::2], strict=True))
    path = Path(opt["--train"])
    questions = list(ranking_questions(read_squad(path)))
    seed = int(opt.get("--seed", DataOptions.seed))
    _, held = split_by_group(sentence_pairs(questions), float(opt["--validation-fraction"]), seed)
    titles = {e.group for e in held}
    return [q for q in questions if q.group in titles]


def rerank_scores(client: httpx.Client, model: str, q: RankingQuestion) -> list[float]:
    body = {"query": q.question, "texts": q.sentences, "model": model}
    scores = [0.0] * len(q.sentences)
    for item in client.post("/rerank", json=body).raise_for_status().json():
        scores[item["index"]] = item["score"]
    return scores


def similarity_scores(client: httpx.Client, model: str, q: RankingQuestion) -> list[float]:
    body = {"inputs": {"source_sentence": q.question, "sentences": q.sentences}, "model": model}
    return client.post("/similarity", json=body).raise_for_status().json()


def live_scores(url: str, args, questions: list[RankingQuestion]) -> dict[str, list[list[float]]]:
    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(args.concurrency) as pool:
        reranker = list(pool.map(lambda q: rerank_scores(client, args.reranker, q), questions))
        encoder = list(pool.map(lambda q: similarity_scores(client, args.embedder, q), questions))
    args.variants = {name: served_variants(url)[name] for name in (args.reranker, args.embedder)}
    return {"reranker": reranker, "bi-encoder": encoder}


def paired(a: list[list[float]], b: list[list[float]], relevant: list[int]) -> dict:
    """Question by question, where method a's top-1 (expected, under ties) beats b's and where it
    loses, with a two-sided sign test over the questions that differ."""
    diffs = [
        ranking_scores([(x, r)])["p@1"] - ranking_scores([(y, r)])["p@1"]
        for x, y, r in zip(a, b, relevant, strict=True)
    ]
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    n, k = wins + losses, min(wins, losses)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return {"wins": wins, "losses": losses, "same": len(diffs) - n, "sign_test_p": p}


# The record behind the reranker default (train/recipes.py, recipe "rerank"): this selection
# was made after seeing held-out numbers, which a reader of the table must know.
HISTORY = (
    "This is the reranker's second training run. The first (100 steps, a time budget on a shared "
    "CPU) scored P@1 0.8550 / MRR 0.9132 on these questions and lost to BM25; the recipe was then "
    "changed to one full epoch (267 steps). That change was a selection made after seeing held-out "
    "numbers, so these questions are no longer untouched, and the margin over BM25 is small: see "
    "the paired count above."
)


def main() -> None:
    p = parser(__doc__, concurrency=8)
    p.add_argument("--url", help="a running service (default: start one on --bundles)")
    p.add_argument("--reranker", default="rerank-minilm")
    p.add_argument("--embedder", default="all-minilm-l6-v2")
    args = p.parse_args()
    if not args.data.exists():
        print(f"{args.data} is absent: no SQuAD data to rank; skipping")
        return
    recipe = recipes(args.data)["rerank"]
    questions = held_out_questions(recipe["data"])
    bm25 = BM25(sorted({s for q in questions for s in q.sentences}))
    scores = {"bm25": [[bm25.score(q.question, s) for s in q.sentences] for q in questions]}
    with service(args.bundles, "rerank_quality", args.url) as url:
        scores |= live_scores(url, args, questions)
    relevant = [q.relevant for q in questions]
    results = {name: ranking_scores(zip(s, relevant, strict=True)) for name, s in scores.items()}
    best = {m: max(results[b][m] for b in ("bi-encoder", "bm25")) for m in ("p@1", "mrr")}
    beats = all(results["reranker"][m] > best[m] for m in best)
    versus = {b: paired(scores["reranker"], scores[b], relevant) for b in ("bm25", "bi-encoder")}
    articles = sorted({q.group for q in questions})
    report = {
        "command": common.command("rerank_quality"),
        "machine": common.machine_info(),
        "route": "rerank",
        "models": {"reranker": args.reranker, "bi-encoder": args.embedder},
        "variants": args.variants,
        "validation": {
            "articles": articles,
            "questions": len(questions),
            "sentences_per_question": sum(len(q.sentences) for q in questions) / len(questions),
            "split": validation(recipe),
        },
        "results": results,
        "reranker_beats_both_baselines": beats,
        "paired_top1": versus,
    }
    how = {
        "reranker": (f"reranker `{args.reranker}`", "/rerank"),
        "bi-encoder": (f"bi-encoder `{args.embedder}`", "/similarity"),
        "bm25": ("BM25 (k1 1.2, b 0.75)", "idf over the held-out sentences"),
    }
    per_question = report["validation"]["sentences_per_question"]
    lines = [
        f"Measured by `{report['command']}`: {len(questions)} questions of {len(articles)} held-out SQuAD "
        f"articles ({', '.join(articles)}), each ranking the {per_question:.2f} sentences of its paragraph "
        "on average (one relevant: the sentence holding the answer).\n",
        "| method | how | P@1 | MRR |",
        "|---|---|---:|---:|",
        *(f"| {a} | {b} | {results[n]['p@1']:.4f} | {results[n]['mrr']:.4f} |" for n, (a, b) in how.items()),
        f"\nThe reranker {'beats' if beats else 'does not beat'} both baselines on both metrics. Ties "
        "count as a random order (expected P@1 and reciprocal rank).",
        "\nPaired, question by question (top-1, expected under ties): "
        + "; ".join(
            f"against {b}, the reranker is better on {v['wins']}, worse on {v['losses']} and the same on "
            f"{v['same']} (sign test p = {v['sign_test_p']:.3g})"
            for b, v in versus.items()
        )
        + ".",
        *([f"\n{HISTORY}"] if args.reranker == "rerank-minilm" else []),
    ]
    common.write_results(args.out, "rerank_quality", report, "\n".join(lines), None)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
