"""Our QA (processing.qa over ORT) vs the `transformers` QA baseline on the same model; what it measures:
benchmarks/README.md. Skips (exit 0) without the SQuAD file.

    .venv/bin/python -m benchmarks.qa_vs_pipeline            # held-out SQuAD articles, 1k/10k/50k contexts
    .venv/bin/python -m benchmarks.qa_vs_pipeline --quick    # smoke run (30 questions, 1 latency question)
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
from processing.metrics import normalize_answer, squad_scores, token_f1

DATA = common.ROOT.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-part-b.json"
SIZES = (1_000, 10_000, 50_000)
NO_ANSWER = {"text": "", "start": 0, "end": 0}
Reader = Callable[[str, str], dict[str, Any]]  # (question, context) -> {"text", "start", "end"}


def select_articles(examples: list, spec: str) -> tuple[list, str]:
    """The examples of the articles `spec` names (`all`, or `trainer[:FRACTION[:SEED]]`: the articles
    `python -m train --validation-fraction FRACTION --seed SEED` holds out), and a description."""
    from train.splits import split_by_group

    titles = list(dict.fromkeys(e.group for e in examples))
    kind, _, rest = spec.partition(":")
    fraction, _, seed = rest.partition(":")
    if spec == "all":
        held = examples
    elif kind == "trainer":
        held = split_by_group(examples, float(fraction or 0.15), int(seed or 42))[1]
    else:
        raise SystemExit(f"--articles: {spec!r} is neither `all` nor `trainer[:FRACTION[:SEED]]`")
    chosen = list(dict.fromkeys(e.group for e in held))
    described = f"{spec}: {len(chosen)} of {len(titles)} articles {chosen}"
    return [e for e in examples if e.group in chosen], described


def agreement(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How often two systems give the same answer to the same questions."""
    if set(ours) != set(theirs):
        raise ValueError(f"answer sets differ: {len(set(ours) ^ set(theirs))} question ids in only one")
    n = len(ours)
    spans = sum((ours[q]["start"], ours[q]["end"]) == (theirs[q]["start"], theirs[q]["end"]) for q in ours)
    differing = [q for q in ours if normalize_answer(ours[q]["text"]) != normalize_answer(theirs[q]["text"])]
    overlap = [token_f1(ours[q]["text"], theirs[q]["text"]) for q in ours]
    examples = [{"id": q, "ours": ours[q]["text"], "theirs": theirs[q]["text"]} for q in differing[:10]]
    return {
        "questions": n,
        "same_span": spans,
        "same_normalized_text": n - len(differing),
        "same_span_rate": round(spans / n, 4) if n else None,
        "same_text_rate": round((n - len(differing)) / n, 4) if n else None,
        "mean_token_f1_between": round(statistics.fmean(overlap), 4) if n else None,
        "examples_of_differences": examples,
    }


def build_long_context(paragraph: str, fillers: list[str], target: int, rng: random.Random):
    """About `target` characters: other paragraphs around `paragraph` (at a random slot). Returns the
    context and where `paragraph` starts in it; exactly `target` long unless the paragraph is longer."""
    budget = target - len(paragraph)
    if budget <= 1:
        return paragraph, 0
    pool = [f for f in fillers if f != paragraph]
    if not pool:
        raise ValueError("need other paragraphs to build a long context")
    rng.shuffle(pool)
    chosen, used = [], 0
    while used < budget:
        chosen.append(pool[len(chosen) % len(pool)][: budget - used - 1])  # one space joins each filler
        used += len(chosen[-1]) + 1
    slot = rng.randint(0, len(chosen))
    return " ".join([*chosen[:slot], paragraph, *chosen[slot:]]), sum(len(p) + 1 for p in chosen[:slot])


def make_readers(args: argparse.Namespace, bundle: Path, checkpoint: Path) -> tuple[dict[str, Reader], str]:
    """name -> reader (ours in-process per variant, then transformers), and the baseline's kind."""
    from benchmarks.model_only import BundleModel
    from benchmarks.pipeline_server import HFQuestionAnswering, qa_settings_from_bundle

    readers: dict[str, Reader] = {}
    for variant in args.variants:
        model = BundleModel(bundle, variant, args.threads)

        def ours(question: str, context: str, model=model) -> dict[str, Any]:
            answers = model.answer(question, context)[0]
            best = answers[0] if answers else None
            return {"text": best.text, "start": best.start, "end": best.end} if best else NO_ANSWER

        readers[f"ours-{variant}"] = ours
    baseline = HFQuestionAnswering(checkpoint, qa_settings_from_bundle(bundle))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    readers["transformers"] = lambda question, context: (baseline(question, context)[0] or [NO_ANSWER])[0]
    print(f"baseline: {baseline.kind}", flush=True)
    return readers, baseline.kind


def timed(reader: Reader, question: str, context: str, repeats: int) -> tuple[dict[str, Any], float]:
    answer, times = common.timed(lambda: reader(question, context), repeats)
    return answer, statistics.median(times)


def answer_all(readers: dict[str, Reader], examples: list) -> tuple[dict[str, dict], dict[str, float]]:
    """Every question through each reader in turn (one reader at a time: no thread-pool interference)."""
    predictions: dict[str, dict[str, dict]] = {name: {} for name in readers}
    mean_ms: dict[str, float] = {}
    for name, reader in readers.items():
        seconds = []
        for n, example in enumerate(examples, 1):
            predictions[name][example.id], took = timed(reader, example.question, example.context, 1)
            seconds.append(took)
            if n % 200 == 0:
                print(f"  {name}: {n}/{len(examples)} questions", flush=True)
        mean_ms[name] = round(statistics.fmean(seconds) * 1e3, 3)
    return predictions, mean_ms


def fit_growth(rows: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Linear fit of ms over characters, and the log-log exponent of the per-size means."""
    at = {s: [r for r in rows if r["target_chars"] == s] for s in sizes}
    per_size = {s: statistics.fmean(r["ms"] for r in at[s]) for s in sizes}
    chars = {s: statistics.fmean(r["chars"] for r in at[s]) for s in sizes}
    out: dict[str, Any] = {
        "mean_ms_by_size": {str(s): round(v, 3) for s, v in per_size.items()},
        "exact_match_by_size": {
            str(s): round(statistics.fmean(r["exact_match"] for r in at[s]), 3) for s in sizes
        },
    }
    if len(set(chars.values())) < 2:
        return {**out, "ms_per_1k_chars": None, "intercept_ms": None, "r2": None, "loglog_exponent": None}
    fit = common.linear_fit([r["chars"] for r in rows], [r["ms"] for r in rows])
    exponent = common.power_law_exponent(list(chars.values()), list(per_size.values()))
    out["ms_per_1k_chars"], out["intercept_ms"] = round(fit["slope"] * 1e3, 3), round(fit["intercept"], 3)
    return {**out, "r2": round(fit["r2"], 4), "loglog_exponent": round(exponent, 3)}


def latency_scaling(readers: dict[str, Reader], examples: list, args: argparse.Namespace) -> dict[str, Any]:
    """Median latency per (reader, size, question) on built contexts, plus a fit per reader."""
    fillers = list(dict.fromkeys(e.context for e in examples))
    picked = random.Random(args.seed).sample(examples, min(args.latency_questions, len(examples)))
    cases = [
        (size, e, build_long_context(e.context, fillers, size, random.Random(f"{size}-{e.id}"))[0])
        for size in args.sizes
        for e in picked
    ]
    rows, fits = [], {}
    for name, reader in readers.items():
        reader(picked[0].question, cases[-1][2])  # warm-up at the longest size
        mine = []
        for size, example, context in cases:
            answer, seconds = timed(reader, example.question, context, args.repeats)
            said = normalize_answer(answer["text"])
            em = max(float(said == normalize_answer(g)) for g, _ in example.answers)
            mine.append({"reader": name, "target_chars": size, "chars": len(context), "id": example.id,
                         "ms": round(seconds * 1e3, 3), "exact_match": em})  # fmt: skip
            print(f"  {name:14} {len(context):6d} chars: {seconds * 1e3:9.1f} ms", flush=True)
        rows += mine
        fits[name] = fit_growth(mine, args.sizes)
    return {"rows": rows, "fits": fits, "questions": [e.id for e in picked]}


def markdown(report: dict[str, Any]) -> str:
    s, lat = report["settings"], report["latency"]
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
        *(f"| {name} | {v['exact_match']:.2f} | {v['f1']:.2f} | {report['mean_ms'][name]} |"
          for name, v in report["scores"].items()),
        "",
        "| ours vs transformers | same span | same text | token F1 between |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {a['same_span_rate']:.2%} | {a['same_text_rate']:.2%} "
          f"| {a['mean_token_f1_between']:.3f} |" for name, a in report["agreement"].items()),
        "",
        f"Latency vs context length ({len(lat['questions'])} questions x {s['repeats']} repeats, median):",
        "",
        "| reader | " + " | ".join(f"{k} chars ms" for k in s["sizes"])
        + " | ms per 1k chars | intercept ms | R² | log-log exponent | EM by size |",
        "|---|" + "---:|" * (len(s["sizes"]) + 5),
    ]  # fmt: skip
    for name, fit in lat["fits"].items():
        lines.append(
            f"| {name} | " + " | ".join(str(v) for v in fit["mean_ms_by_size"].values())
            + f" | {fit['ms_per_1k_chars']} | {fit['intercept_ms']} | {fit['r2']} "
            f"| {fit['loglog_exponent']} | {' / '.join(map(str, fit['exact_match_by_size'].values()))} |"
        )  # fmt: skip
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    fig, ax = common.pyplot().subplots(figsize=(7, 4.8))
    for name, fit in report["latency"]["fits"].items():
        rows = [r for r in report["latency"]["rows"] if r["reader"] == name]
        dots = ax.plot([r["chars"] for r in rows], [r["ms"] for r in rows], "o", alpha=0.5, label=name)[0]
        if fit["ms_per_1k_chars"] is not None:
            xs = sorted({r["chars"] for r in rows})
            dots.set_label(f"{name}: {fit['ms_per_1k_chars']} ms/1k chars, exponent {fit['loglog_exponent']}")
            line = [fit["intercept_ms"] + fit["ms_per_1k_chars"] * c / 1e3 for c in xs]
            ax.plot(xs, line, "-", color=dots.get_color())
    ax.set(xscale="log", yscale="log", xlabel="context length, characters", ylabel="latency, ms",
              title="latency vs context length (line = linear fit)")  # fmt: skip
    ax.legend(fontsize=8)
    common.save_figure(fig, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--articles", default="trainer:0.15:42", help="trainer[:FRACTION[:SEED]] or all")
    p.add_argument("--limit", type=int, help="at most this many questions (default all; quick 30)")
    p.add_argument("--bundle", type=Path, default=common.default_bundle("qa"))
    p.add_argument("--checkpoint", default="auto", help="baseline checkpoint (auto: the bundle's source)")
    p.add_argument("--variants", default="fused,int8", help="our bundle variants to run in-process")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="context lengths, characters")
    p.add_argument("--latency-questions", type=int, help="questions per size (default 5; quick 1)")
    p.add_argument("--repeats", type=int, help="timed runs per point (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=0, help="ORT and torch threads (0 = defaults)")
    p.add_argument("--seed", type=int, default=0)
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

    bundle = common.require_bundle(args.bundle, "qa")
    checkpoint, how = common.resolve_checkpoint(bundle, args.checkpoint, "qa", args.work_dir)
    examples, described = select_articles(list(read_squad(args.data)), args.articles)
    examples = [e for e in examples if e.answers]  # SQuAD v2 unanswerable questions are out of scope
    print(f"articles {described}; {len(examples)} questions", flush=True)
    if args.limit:
        examples = random.Random(args.seed).sample(examples, min(args.limit, len(examples)))
    readers, baseline_kind = make_readers(args, bundle, checkpoint)
    predictions, mean_ms = answer_all(readers, examples)
    gold = {e.id: [a for a, _ in e.answers] for e in examples}
    scores = {n: squad_scores({q: a["text"] for q, a in p.items()}, gold) for n, p in predictions.items()}
    print(f"scores {scores}", flush=True)
    theirs = predictions["transformers"]
    settings = {"command": common.command("qa_vs_pipeline", argv), "quick": args.quick,
                "data": str(args.data), "articles": described, "bundle": str(bundle),
                "checkpoint": str(checkpoint), "checkpoint_source": how}  # fmt: skip
    settings |= {k: getattr(args, k) for k in ("variants", "sizes", "repeats")}
    settings |= {"baseline": baseline_kind, "threads": args.threads, "seed": args.seed}
    report = {
        "created_at": common.now(),
        "machine": common.machine_info(args.threads or None),
        "settings": settings,
        "questions": len(examples),
        "scores": scores,
        "mean_ms": mean_ms,
        "agreement": {n: agreement(p, theirs) for n, p in predictions.items() if n != "transformers"},
        "latency": latency_scaling(readers, examples, args),
    }
    stem = "qa_vs_pipeline_quick" if args.quick else "qa_vs_pipeline"
    common.write_results(args.out, stem, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
