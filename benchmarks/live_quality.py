"""The default models' quality as a user meets it: scored through the live HTTP service.

    python -m benchmarks.live_quality [--tasks sst2,conll03,codah,squad] [--bundles .cache/bundles]

Starts `uvicorn app.main:app` on the default bundles with the service's default settings (what
`make serve` runs: the int8 variant on a CPU), sends every held-out example of each default's
validation data (the recipe's own slice, `benchmarks/finetune.py`) as one request, and scores
the answers with `python -m train.evaluate --url`'s code. Beside it, the same bundle variant is
scored offline (ONNX Runtime in the trainer's evaluation loop, batched). Results:
benchmarks/results/live_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from benchmarks import bench_common as common
from benchmarks.finetune import recipes
from train.evaluate import evaluate_bundle, select_examples
from train.live_eval import evaluate_live

REPO = Path(__file__).resolve().parent.parent

COMMAND = "python -m benchmarks.live_quality"


def served_variants(url: str) -> dict[str, str]:
    return {m["name"]: m["variant"] for m in httpx.get(f"{url}/models", timeout=30).json()["models"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="sst2,conll03,codah,squad")
    parser.add_argument("--bundles", type=Path, default=REPO / ".cache" / "bundles")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "live_quality.json")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"{args.data} is absent: no task data to measure on; skipping")
        return
    all_recipes = recipes(args.data)
    names = args.tasks.split(",")
    url, running = common.serve_ours(args.bundles, common.WORK / "live_quality.log")
    results = {}
    with running:
        variants = served_variants(url)
        for name in names:
            recipe = all_recipes[name]
            task, examples = select_examples(recipe["data"])
            started = time.perf_counter()
            live = evaluate_live(
                url, task, examples, label_names=recipe.get("label_names"), concurrency=args.concurrency
            )
            results[name] = {
                "bundle": recipe["bundle"],
                "metric": recipe["metric"],
                "variant": variants[recipe["bundle"]],
                "examples": len(examples),
                "validation": common.repo_relative(" ".join(recipe["data"])),
                "live": live,
                "live_seconds": time.perf_counter() - started,
            }
            print(name, json.dumps(live), flush=True)
    for name in names:
        recipe, r = all_recipes[name], results[name]
        task, examples = select_examples(recipe["data"])
        r["offline"] = evaluate_bundle(
            args.bundles / recipe["bundle"],
            r["variant"],
            task,
            examples,
            recipe["data"],
            label_names=recipe.get("label_names"),
        )
    print(merge_results(results, args.out))


def merge_results(results: dict, path: Path) -> str:
    """Merge into earlier results (a `--tasks` subset keeps the others); returns the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text())["tasks"] if path.exists() else {}
    merged = {**old, **results}
    machine = common.machine_info()
    report = {"command": COMMAND, "machine": machine, "tasks": merged}
    lines = [
        "| default | metric | offline (bundle, batched) | through the service | service − offline | examples "
        "| variant | validation data |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for name, r in merged.items():
        m = r["metric"]
        offline, live = r["offline"][m], r["live"][m]
        lines.append(
            f"| {name} ({r['bundle']}) | {m} | {offline:.4f} | {live:.4f} | {live - offline:+.4f} "
            f"| {r['examples']} | {r['variant']} | `{r['validation']}` |"
        )
    table = "\n".join(lines)
    intro = (
        f"Measured by `{COMMAND}`: one HTTP request per example to the live service on the default "
        "bundles with default settings, scored by `python -m train.evaluate --url`.\n\n"
    )
    common.write_results(path.parent, path.stem, report, intro + table, None)
    return table


if __name__ == "__main__":
    main()
