"""Our QA (processing.qa over ORT) vs the `transformers` QA baseline on the same model.

    .venv/bin/python -m benchmarks.qa_vs_pipeline            # held-out SQuAD articles, 1k/10k/50k contexts
    .venv/bin/python -m benchmarks.qa_vs_pipeline --quick    # smoke run (30 questions, 1 latency question)
    .venv/bin/python -m benchmarks.qa_vs_pipeline --quick --dev-models   # before the defaults exist

1. Answers: every question of the selected SQuAD articles goes through both; we report how often
   they agree (same character span, same normalised text, token F1 between the two) and the EM/F1 of
   each against the gold answers (processing.metrics, the official SQuAD definitions).
2. Latency vs context length: contexts of about 1k, 10k and 50k characters are built by
   concatenating other paragraphs around the question's own paragraph; both sides answer them and
   a line (latency = a + b * chars) and a log-log exponent are fitted: 1 means linear growth.

Articles (`--articles`): the default `trainer:0.15:42` is exactly the validation split that
`python -m train --validation-fraction 0.15` (seed 42) held out of this file, i.e. articles
the QA default never trained on. The last 15% of the file by order (`last:0.15`) would mostly be
training articles under that split, so it is available but not the default. Also accepted: a
comma list of article indices or titles, or `all`.
Ours runs in-process (variants `--variants`, default fused (fp32: isolates pre/post-processing)
and int8 (what the service serves)), or through a running service with `--service-url`.
The baseline is benchmarks/pipeline_server.make_qa_baseline on the bundle's checkpoint.
Skips (exit 0) when the SQuAD file is absent. Writes benchmarks/results/qa_vs_pipeline{,_quick}.*.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import bench_common as common
from benchmarks.qa_data import agreement, build_long_context, select_articles
from processing.metrics import normalize_answer, squad_scores

DATA = common.ROOT.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-part-b.json"
SIZES = (1_000, 10_000, 50_000)
Reader = Callable[[str, str], dict[str, Any]]  # (question, context) -> {"text", "start", "end"}


def timed(reader: Reader, question: str, context: str, repeats: int) -> tuple[dict[str, Any], float]:
    answer, times = common.timed(lambda: reader(question, context), repeats)
    return answer, statistics.median(times)


NO_ANSWER = {"text": "", "start": 0, "end": 0}


def make_readers(args: argparse.Namespace, bundle: Path, checkpoint: Path) -> tuple[dict[str, Reader], str]:
    """name -> reader (ours in-process per variant, or the service; then transformers), baseline kind."""
    from benchmarks.pipeline_server import make_qa_baseline, qa_settings_from_bundle

    readers: dict[str, Reader] = {}
    if args.service_url:
        import httpx

        client = httpx.Client(base_url=args.service_url, timeout=300)

        def service(question: str, context: str) -> dict[str, Any]:
            response = client.post("/qa", json={"question": question, "context": context})
            response.raise_for_status()
            answers = response.json()["answers"]
            return answers[0] if answers else NO_ANSWER

        readers["service"] = service
    else:
        from benchmarks.model_only import BundleModel

        for variant in args.variants:
            model = BundleModel(bundle, variant, args.threads)

            def ours(question: str, context: str, model=model) -> dict[str, Any]:
                answers, _ = model.answer(question, context)
                if not answers:
                    return NO_ANSWER
                return {"text": answers[0].text, "start": answers[0].start, "end": answers[0].end}

            readers[f"ours-{variant}"] = ours
    baseline = make_qa_baseline(checkpoint, qa_settings_from_bundle(bundle))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    def transformers(question: str, context: str) -> dict[str, Any]:
        answers = baseline(question, context)[0]
        return answers[0] if answers else NO_ANSWER

    readers["transformers"] = transformers
    print(f"baseline: {baseline.kind}", flush=True)
    return readers, baseline.kind


def answer_all(readers: dict[str, Reader], examples: list) -> tuple[dict[str, dict], dict[str, float]]:
    """Every question through each reader in turn (one reader at a time: no thread-pool interference)."""
    predictions: dict[str, dict[str, dict]] = {name: {} for name in readers}
    mean_ms: dict[str, float] = {}
    for name, reader in readers.items():
        seconds = []
        for n, example in enumerate(examples, 1):
            answer, took = timed(reader, example.question, example.context, 1)
            predictions[name][example.id] = answer
            seconds.append(took)
            if n % 200 == 0:
                print(f"  {name}: {n}/{len(examples)} questions", flush=True)
        mean_ms[name] = round(statistics.fmean(seconds) * 1e3, 3)
    return predictions, mean_ms


def exact(answer: dict[str, Any], golds: list[str]) -> float:
    return max(float(normalize_answer(answer["text"]) == normalize_answer(g)) for g in golds)


def fit_growth(rows: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Linear fit of ms over characters, and the log-log exponent of the per-size means."""
    per_size = {s: statistics.fmean(r["ms"] for r in rows if r["target_chars"] == s) for s in sizes}
    chars = {s: statistics.fmean(r["chars"] for r in rows if r["target_chars"] == s) for s in sizes}
    out: dict[str, Any] = {
        "mean_ms_by_size": {str(s): round(v, 3) for s, v in per_size.items()},
        "exact_match_by_size": {
            str(s): round(statistics.fmean(r["exact_match"] for r in rows if r["target_chars"] == s), 3)
            for s in sizes
        },
    }
    if len(set(chars.values())) < 2:
        return {**out, "ms_per_1k_chars": None, "intercept_ms": None, "r2": None, "loglog_exponent": None}
    fit = common.linear_fit([r["chars"] for r in rows], [r["ms"] for r in rows])
    exponent = common.power_law_exponent(list(chars.values()), list(per_size.values()))
    return {
        **out,
        "ms_per_1k_chars": round(fit["slope"] * 1e3, 3),
        "intercept_ms": round(fit["intercept"], 3),
        "r2": round(fit["r2"], 4),
        "loglog_exponent": round(exponent, 3),
    }


def latency_scaling(readers: dict[str, Reader], examples: list, args: argparse.Namespace) -> dict[str, Any]:
    """Median latency per (reader, size, question) on built contexts, plus a fit per reader."""
    rng = random.Random(args.seed)
    fillers = list(dict.fromkeys(e.context for e in examples))
    picked = rng.sample(examples, min(args.latency_questions, len(examples)))
    cases = [
        (
            size,
            example,
            build_long_context(example.context, fillers, size, random.Random(f"{size}-{example.id}"))[0],
        )
        for size in args.sizes
        for example in picked
    ]
    rows, fits = [], {}
    for name, reader in readers.items():
        reader(picked[0].question, cases[-1][2])  # warm-up at the longest size
        mine = []
        for size, example, context in cases:
            answer, seconds = timed(reader, example.question, context, args.repeats)
            golds = [a for a, _ in example.answers]
            mine.append(
                {
                    "reader": name,
                    "target_chars": size,
                    "chars": len(context),
                    "id": example.id,
                    "ms": round(seconds * 1e3, 3),
                    "exact_match": exact(answer, golds),
                }
            )
            print(f"  {name:14} {len(context):6d} chars: {seconds * 1e3:9.1f} ms", flush=True)
        rows += mine
        fits[name] = fit_growth(mine, args.sizes)
    return {"rows": rows, "fits": fits, "questions": [e.id for e in picked]}


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        "# QA: ours vs transformers",
        "",
        f"Generated {report['created_at']} by `{s['command']}`.",
        "",
        f"- Machine: {common.machine_line(report['machine'])}",
        f"- Data: `{s['data']}`, articles {s['articles']}; {report['questions']} questions.",
        f"- Bundle `{s['bundle']}`; baseline `{s['checkpoint']}` ({s['checkpoint_source']}): "
        f"{s['baseline']}.",
        "",
        "| reader | EM | F1 | mean ms / question |",
        "|---|---:|---:|---:|",
    ]
    for name, scores in report["scores"].items():
        lines.append(
            f"| {name} | {scores['exact_match']:.2f} | {scores['f1']:.2f} | {report['mean_ms'][name]} |"
        )
    lines += [
        "",
        "| ours vs transformers | same span | same text | token F1 between |",
        "|---|---:|---:|---:|",
    ]
    for name, a in report["agreement"].items():
        lines.append(
            f"| {name} | {a['same_span_rate']:.2%} | {a['same_text_rate']:.2%} | "
            f"{a['mean_token_f1_between']:.3f} |"
        )
    lat = report["latency"]
    lines += [
        "",
        f"Latency vs context length ({len(lat['questions'])} questions x {s['repeats']} repeats, median):",
        "",
        "| reader | "
        + " | ".join(f"{k} chars ms" for k in s["sizes"])
        + " | ms per 1k chars | intercept ms | R² | log-log exponent | EM by size |",
        "|---|" + "---:|" * (len(s["sizes"]) + 5),
    ]
    for name, fit in lat["fits"].items():
        lines.append(
            f"| {name} | "
            + " | ".join(str(v) for v in fit["mean_ms_by_size"].values())
            + f" | {fit['ms_per_1k_chars']} | {fit['intercept_ms']} | {fit['r2']} "
            f"| {fit['loglog_exponent']} | {' / '.join(map(str, fit['exact_match_by_size'].values()))} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = list(report["scores"])
    em = [report["scores"][n]["exact_match"] for n in names]
    f1 = [report["scores"][n]["f1"] for n in names]
    x = range(len(names))
    left.bar([i - 0.2 for i in x], em, 0.4, label="EM")
    left.bar([i + 0.2 for i in x], f1, 0.4, label="F1")
    left.set_xticks(list(x), names)
    left.set_ylabel("SQuAD score (%)")
    left.set_title(f"{report['questions']} held-out questions")
    left.legend()
    for name, fit in report["latency"]["fits"].items():
        rows = [r for r in report["latency"]["rows"] if r["reader"] == name]
        dots = right.plot([r["chars"] for r in rows], [r["ms"] for r in rows], "o", alpha=0.5)[0]
        xs = sorted({r["chars"] for r in rows})
        if fit["ms_per_1k_chars"] is None:
            dots.set_label(name)
            continue
        right.plot(
            xs,
            [fit["intercept_ms"] + fit["ms_per_1k_chars"] * c / 1e3 for c in xs],
            "-",
            color=dots.get_color(),
            label=f"{name}: {fit['ms_per_1k_chars']} ms/1k chars, exponent {fit['loglog_exponent']}",
        )
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("context length, characters")
    right.set_ylabel("latency, ms")
    right.legend(fontsize=8)
    right.set_title("latency vs context length (line = linear fit)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument(
        "--articles",
        default="trainer:0.15:42",
        help="trainer[:FRACTION[:SEED]], last[:FRACTION], all, or a comma list of article indices/titles",
    )
    p.add_argument("--limit", type=int, help="at most this many questions (default all; quick 30)")
    p.add_argument("--bundle", type=Path, default=common.default_bundle("qa"))
    p.add_argument("--checkpoint", default="auto", help="baseline checkpoint (auto: the bundle's source)")
    p.add_argument("--variants", default="fused,int8", help="our bundle variants to run in-process")
    p.add_argument("--service-url", help="ask a running service instead of running ours in-process")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="context lengths, characters")
    p.add_argument("--latency-questions", type=int, help="questions per size (default 5; quick 1)")
    p.add_argument("--repeats", type=int, help="timed runs per point (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=0, help="ORT and torch threads (0 = defaults)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dev-models", action="store_true", help="MiniLM with a random QA head")
    p.add_argument("--work-dir", type=Path, default=common.WORK)
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        p.error("--sizes takes a comma list of integers")
    if not args.sizes or min(args.sizes) < 1:
        p.error("--sizes must be positive")
    args.variants = [v for v in args.variants.split(",") if v]
    args.limit = args.limit or (30 if args.quick else None)
    args.latency_questions = args.latency_questions or (1 if args.quick else 5)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.is_file():
        print(f"skipping qa_vs_pipeline: SQuAD data not found at {args.data} (expected ../shared/data)")
        return 0
    from train.readers import read_squad

    if args.dev_models:
        checkpoint_dir, bundle = common.build_dev_models(["qa"], args.work_dir)["qa"]
        requested: str | None = str(checkpoint_dir)
    else:
        bundle, requested = args.bundle, args.checkpoint
    common.require_bundle(bundle, "qa")
    checkpoint, how = common.resolve_checkpoint(bundle, requested, "qa", args.work_dir)
    examples, described = select_articles(list(read_squad(args.data)), args.articles)
    examples = [e for e in examples if e.answers]  # SQuAD v2 unanswerable questions are out of scope
    print(f"articles {described}; {len(examples)} questions", flush=True)
    if args.limit:
        examples = random.Random(args.seed).sample(examples, min(args.limit, len(examples)))
    readers, baseline_kind = make_readers(args, bundle, checkpoint)
    predictions, mean_ms = answer_all(readers, examples)
    gold = {e.id: [a for a, _ in e.answers] for e in examples}
    scores = {
        name: squad_scores({q: a["text"] for q, a in answers.items()}, gold)
        for name, answers in predictions.items()
    }
    agree = {
        name: agreement(predictions[name], predictions["transformers"])
        for name in readers
        if name != "transformers"
    }
    print(f"scores {scores}", flush=True)
    latency = latency_scaling(readers, examples, args)
    report = {
        "created_at": common.now(),
        "machine": common.machine_info(args.threads or None),
        "settings": {
            "command": "python -m benchmarks.qa_vs_pipeline "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "quick": args.quick,
            "data": str(args.data),
            "articles": described,
            "bundle": str(bundle),
            "checkpoint": str(checkpoint),
            "checkpoint_source": how,
            "variants": args.variants,
            "service_url": args.service_url,
            "sizes": args.sizes,
            "repeats": args.repeats,
            "baseline": baseline_kind,
            "threads": args.threads,
            "seed": args.seed,
        },
        "questions": len(examples),
        "scores": scores,
        "mean_ms": mean_ms,
        "agreement": agree,
        "latency": latency,
    }
    stem = "qa_vs_pipeline_quick" if args.quick else "qa_vs_pipeline"
    common.write_results(args.out, stem, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
