"""The default models' quality as a user meets it: scored through the live HTTP service, beside the
same variant scored offline. Also what embed_quality.py and rerank_quality.py share.

    python -m benchmarks.live_quality [--tasks sst2,conll03,codah,squad] [--bundles .cache/bundles]

Under `python -m benchmarks.cpu_mask --` the service serves what an AVX2-only CPU gets
(`int8-rowwise-avx2`, on the AVX2 kernels): give it its own `--name`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks import bench_common as common
from train.recipes import recipes

DATA = common.ROOT.parent / "shared" / "data"


def parser(doc: str, concurrency: int = 16) -> argparse.ArgumentParser:
    """The options every quality run shares: where the bundles, the data and the results are."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundles", type=Path, default=common.ROOT / ".cache" / "bundles")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=common.RESULTS)
    p.add_argument("--concurrency", type=int, default=concurrency)
    return p


@contextmanager
def service(bundles: Path, log_name: str, url: str | None = None, **env: str) -> Iterator[str]:
    """The URL of a running service: `url` as given, else ours started on `bundles` (stopped after)."""
    if url:
        yield url
        return
    url, running = common.serve_ours(bundles, common.WORK / f"{log_name}.log", **env)
    with running:
        yield url


def served_variants(url: str) -> dict[str, str]:
    return {m["name"]: m["variant"] for m in httpx.get(f"{url}/models", timeout=30).json()["models"]}


def validation(recipe: dict) -> str:
    """A recipe's data options as results record them."""
    return common.repo_relative(" ".join(recipe["data"]))


def main() -> None:
    from train.evaluate import evaluate_bundle, select_examples
    from train.live_eval import evaluate_live

    p = parser(__doc__)
    p.add_argument("--tasks", default="sst2,conll03,codah,squad")
    p.add_argument("--name", default="live_quality", help="results file stem")
    args = p.parse_args()
    if not args.data.exists():
        print(f"{args.data} is absent: no task data to measure on; skipping")
        return
    all_recipes, results = recipes(args.data), {}
    with service(args.bundles, "live_quality") as url:
        variants = served_variants(url)
        for name in args.tasks.split(","):
            recipe = all_recipes[name]
            task, examples = select_examples(recipe["data"])
            started = time.perf_counter()
            names, bundle = recipe.get("label_names"), recipe["bundle"]
            live = evaluate_live(url, task, examples, label_names=names, concurrency=args.concurrency)
            results[name] = {"bundle": bundle, "metric": recipe["metric"], "variant": variants[bundle],
                             "examples": len(examples), "validation": validation(recipe),
                             "live": live, "live_seconds": time.perf_counter() - started}  # fmt: skip
            print(name, json.dumps(live), flush=True)
    for name, r in results.items():  # offline once the service is down: nothing competes for the cores
        recipe = all_recipes[name]
        task, examples = select_examples(recipe["data"])
        bundle = args.bundles / r["bundle"]
        r["offline"] = evaluate_bundle(bundle, r["variant"], task, examples, recipe["data"],
                                       label_names=recipe.get("label_names"))  # fmt: skip
    print(merge_results(results, args.out / f"{args.name}.json"))


def merge_results(results: dict, path: Path) -> str:
    """Merge into earlier results (a `--tasks` subset keeps the others); returns the table."""
    merged = {**(json.loads(path.read_text())["tasks"] if path.exists() else {}), **results}
    lines = [
        "| default | metric | offline (bundle, batched) | through the service | service − offline | examples "
        "| variant | validation data |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for name, r in merged.items():
        offline, live = r["offline"][r["metric"]], r["live"][r["metric"]]
        lines.append(f"| {name} ({r['bundle']}) | {r['metric']} | {offline:.4f} | {live:.4f} "
                     f"| {live - offline:+.4f} | {r['examples']} | {r['variant']} "
                     f"| `{r['validation']}` |")  # fmt: skip
    command = common.command("live_quality")
    intro = (
        f"Measured by `{command}`: one HTTP request per example to the live service "
        "on the default bundles with default settings, scored by `python -m train.evaluate --url`.\n\n"
    )
    report = {"command": command, "machine": common.machine_info()}
    report["tasks"] = merged
    common.write_results(path.parent, path.stem, report, intro + "\n".join(lines), None)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
