"""What INT8 costs on task data: each default bundle's variants scored on its validation split,
in batches and one feature (sequence, window or choice group) at a time.

    python -m benchmarks.int8_accuracy [--bundles .cache/bundles] [--variants fused,int8,int8-rowwise]

The validation data, features and metrics are exactly those of `benchmarks/finetune.py`
(train.train's data preparation and train.features' metrics); only the forward pass is
ONNX Runtime on the bundle's variant instead of PyTorch. "batched" runs the evaluation's
batches of 32 features (padded to the longest); "single" runs every feature alone, as a lone
request meets the service. A batch-invariant variant scores the same both ways. Results go to
benchmarks/results/int8_accuracy.{json,md}. Copied by hand into defaults/int8_task_data.json (it
travels with the defaults' recipe), from which `python -m export.defaults` records each bundle's
line in its manifest (quantization.task_data).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.bench_common import write_results
from benchmarks.finetune import recipes
from train.evaluate import evaluate_bundle, select_examples

REPO = Path(__file__).resolve().parent.parent
MODES = {"batched": 32, "single": 1}  # evaluation batch size
REFERENCE = "fused"  # fp32, batch-invariant


def evaluate_variant(bundle: Path, variant: str, recipe: dict, threads: int, batch_size: int) -> dict:
    task, examples = select_examples(recipe["data"])
    return evaluate_bundle(
        bundle,
        variant,
        task,
        examples,
        recipe["data"],
        label_names=recipe.get("label_names"),
        threads=threads,
        eval_batch_size=batch_size,
    )


def summarize(metric: str, scores: dict[str, dict[str, dict]]) -> dict:
    """INT8 cost (reference minus variant) per variant and mode, and the batched - single gap."""
    reference = scores.get(REFERENCE, {}).get("batched")
    out = {}
    for variant, modes in scores.items():
        line: dict = {mode: modes[mode][metric] for mode in modes}
        if reference is not None and variant != REFERENCE:
            line["cost"] = {mode: reference[metric] - modes[mode][metric] for mode in modes}
        if {"batched", "single"} <= set(modes):
            line["batched_minus_single"] = modes["batched"][metric] - modes["single"][metric]
        out[variant] = line
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundles", type=Path, default=REPO / ".cache" / "bundles")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--variants", default="fused,int8,int8-rowwise")
    parser.add_argument("--modes", default="batched,single")
    parser.add_argument("--tasks", default="sst2,conll03,codah,squad")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "int8_accuracy.json")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"{args.data} is absent: no task data to measure on; skipping")
        return
    all_recipes = recipes(args.data)
    results = {}
    for name in args.tasks.split(","):
        recipe = all_recipes[name]
        bundle = args.bundles / recipe["bundle"]
        scores = {
            v: {m: evaluate_variant(bundle, v, recipe, args.threads, MODES[m]) for m in args.modes.split(",")}
            for v in args.variants.split(",")
        }
        metric = recipe["metric"]
        results[recipe["bundle"]] = {
            "metric": metric,
            "validation": " ".join(recipe["data"]).replace(str(args.data), "../shared/data"),
            "bundle_created_at": json.loads((bundle / "bundle.json").read_text())["created_at"],
            "scores": scores,
            "summary": summarize(metric, scores),
        }
        print(recipe["bundle"], json.dumps(results[recipe["bundle"]]["summary"]), flush=True)
    print(merge_results(results, args.out))


def merge_results(results: dict, path: Path) -> str:
    """Merge into earlier results (a `--tasks` or `--variants` subset keeps the other bundles' and
    variants' scores); returns the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = json.loads(path.read_text()) if path.exists() else {}
    for bundle, line in results.items():
        scores = {**merged.get(bundle, {}).get("scores", {}), **line["scores"]}
        merged[bundle] = {**line, "scores": scores, "summary": summarize(line["metric"], scores)}
    lines = [
        "| bundle | metric | variant | batched | one at a time | cost vs fp32 (batched / one at a time) |",
        "|---|---|---|---|---|---|",
    ]
    for bundle, r in merged.items():
        for variant, line in r["summary"].items():
            cost = line.get("cost", {})
            cells = [f"{line[m]:.4f}" if m in line else "—" for m in ("batched", "single")]
            costs = " / ".join(f"{cost[m]:+.4f}" for m in ("batched", "single") if m in cost) or "reference"
            lines.append(f"| {bundle} | {r['metric']} | {variant} | {cells[0]} | {cells[1]} | {costs} |")
    table = "\n".join(lines)
    write_results(path.parent, path.stem, merged, table, None)
    return table


if __name__ == "__main__":
    main()
