"""What INT8 costs on task data: each default bundle's variants scored on its validation split.

    python benchmarks/int8_accuracy.py [--bundles .cache/bundles] [--variants fused,int8]

The validation data, features and metrics are exactly those of `benchmarks/finetune.py`
(train.train's data preparation and train.features' metrics); only the forward pass is
ONNX Runtime on the bundle's variant instead of PyTorch. Results go to
benchmarks/results/int8_accuracy.{json,md}; `python -m export.defaults` copies each bundle's
line into its manifest (quantization.task_data).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from finetune import recipes  # noqa: E402

from train.evaluate import evaluate_bundle, select_examples  # noqa: E402


def evaluate_variant(bundle: Path, variant: str, recipe: dict, threads: int) -> dict:
    task, examples = select_examples(recipe["data"])
    return evaluate_bundle(
        bundle,
        variant,
        task,
        examples,
        recipe["data"],
        label_names=recipe.get("label_names"),
        threads=threads,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundles", type=Path, default=REPO / ".cache" / "bundles")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--variants", default="fused,int8")
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
        scores = {v: evaluate_variant(bundle, v, recipe, args.threads) for v in args.variants.split(",")}
        metric = recipe["metric"]
        results[recipe["bundle"]] = {
            "metric": metric,
            "validation": " ".join(recipe["data"]),
            "variants": scores,
            "int8_cost": scores["fused"][metric] - scores["int8"][metric]
            if {"fused", "int8"} <= set(scores)
            else None,
        }
        print(recipe["bundle"], json.dumps(results[recipe["bundle"]]["variants"]), flush=True)
    print(write_results(results, args.out))


def write_results(results: dict, path: Path) -> str:
    """Merge into earlier results (a `--tasks` subset keeps the other bundles' lines); returns the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {**(json.loads(path.read_text()) if path.exists() else {}), **results}
    path.write_text(json.dumps(merged, indent=2) + "\n")
    lines = ["| bundle | metric | fused (fp32) | int8 | int8 cost |", "|---|---|---|---|---|"]
    for bundle, r in merged.items():
        m, v = r["metric"], r["variants"]
        lines.append(f"| {bundle} | {m} | {v['fused'][m]:.4f} | {v['int8'][m]:.4f} | {r['int8_cost']:+.4f} |")
    table = "\n".join(lines)
    path.with_suffix(".md").write_text(table + "\n")
    return table


if __name__ == "__main__":
    main()
