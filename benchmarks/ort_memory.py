"""ONNX Runtime CPU memory under variable sequence lengths, for each session memory setting.

    .venv/bin/python -m benchmarks.ort_memory                 # MiniLM-L6 int8, ~2-3 min on 2 cores
    .venv/bin/python -m benchmarks.ort_memory --runs 20       # shorter
    .venv/bin/python -m benchmarks.ort_memory --bundle DIR    # any bundle made by export/

A served model sees a new (batch, sequence length) shape almost every batch. Each setting runs
in a fresh process over the same random shapes (batch 1-16, length 8-256, fixed seed), through
app.runtime (SessionTuning, session_options, run_options): exactly what the service builds.
RSS is sampled after every run. Growth is final RSS minus RSS after the warm-up runs.
Writes benchmarks/results/ort_memory.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.bench_common import repo_relative

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / ".cache" / "ort-memory"
WARMUP_RUNS = 10
# glibc raises its mmap threshold after the first large free, so later big buffers (ORT's arena
# chunks, activations, numpy arrays) come from the heap, which fragments and is rarely given back.
# "+mmap" fixes the threshold with app.runtime.fix_malloc_mmap_threshold, as the service does.
MMAP = 131072
# name -> (SessionTuning fields, malloc mmap threshold or 0). SessionTuning() is onnxruntime's default.
CONFIGS: dict[str, tuple[dict[str, bool | int], int]] = {
    "ort-defaults": ({}, 0),
    "no-mem-pattern": ({"mem_pattern": False}, 0),
    "no-mem-pattern+shrinkage": ({"mem_pattern": False, "arena_shrinkage": True}, 0),
    "no-mem-pattern+no-arena": ({"mem_pattern": False, "cpu_arena": False}, 0),
    "ort-defaults+mmap": ({}, MMAP),
    "no-mem-pattern+mmap": ({"mem_pattern": False}, MMAP),
    "no-mem-pattern+shrinkage+mmap": ({"mem_pattern": False, "arena_shrinkage": True}, MMAP),
    # Shrink only after batches of more than 1024 padded tokens: small batches reuse the arena.
    "no-mem-pattern+shrinkage>1024+mmap": (
        {"mem_pattern": False, "arena_shrinkage": True, "shrink_above_tokens": 1024},
        MMAP,
    ),
    "no-mem-pattern+no-arena+mmap": ({"mem_pattern": False, "cpu_arena": False}, MMAP),
}


def service_default() -> str:
    """The CONFIGS entry that app.settings.Settings' defaults select."""
    from app.backend.runtime import SessionTuning
    from app.settings import Settings

    field = {name: info.default for name, info in Settings.model_fields.items()}
    wanted = SessionTuning(
        mem_pattern=field["ort_mem_pattern"],
        cpu_arena=field["ort_cpu_arena"],
        arena_shrinkage=field["ort_arena_shrinkage"],
        shrink_above_tokens=field["ort_shrink_above_tokens"],
    )
    for name, (tuning, mmap) in CONFIGS.items():
        if SessionTuning(**tuning) == wanted and mmap == field["malloc_mmap_threshold"]:
            return name
    return "(not benchmarked)"


def build_minilm_bundle(out: Path) -> Path:
    """MiniLM-L6 (real encoder weights, random classify head) exported as a bundle, once."""
    if (out / "bundle.json").exists():
        return out
    import torch

    from export import export_bundle
    from model.bert import BertForSequenceClassification
    from model.checkpoint import minilm_package_dir

    torch.manual_seed(0)
    checkpoint = out.parent / "minilm-l6-classify"
    model = BertForSequenceClassification.from_pretrained(minilm_package_dir(), task="classify")
    model.save_pretrained(checkpoint)
    return export_bundle(checkpoint, out, variants=("fp32", "int8"), max_seq_len=256, overwrite=True)


def worker(model: Path, config: str, runs: int, seed: int, threads: int) -> dict:
    """Run in a fresh process: one session with `config`, `runs` random shapes, RSS after each."""
    import numpy as np
    import psutil

    from app.backend.runtime import SessionTuning, create_runtime, fix_malloc_mmap_threshold

    tuning, mmap_threshold = SessionTuning(**CONFIGS[config][0]), CONFIGS[config][1]
    if mmap_threshold:
        assert fix_malloc_mmap_threshold(mmap_threshold), "mallopt failed (not glibc?)"
    process = psutil.Process()
    rss_start = process.memory_info().rss
    runtime = create_runtime(model, "cpu", threads, tuning)
    rss_loaded = process.memory_info().rss
    rng = np.random.default_rng(seed)
    rss, times, shapes = [], [], []
    for _ in range(runs):
        batch, length = int(rng.integers(1, 17)), int(rng.integers(8, 257))
        ids = rng.integers(1000, 30000, size=(batch, length), dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        started = time.perf_counter()
        runtime.run(inputs)
        times.append((time.perf_counter() - started) * 1000)
        rss.append(process.memory_info().rss / 2**20)
        shapes.append((batch, length))
    warm = rss[min(WARMUP_RUNS, runs) - 1]
    return {
        "config": config,
        "tuning": asdict(tuning),
        "malloc_mmap_threshold": mmap_threshold,
        "rss_before_session_mb": round(rss_start / 2**20, 1),
        "rss_after_load_mb": round(rss_loaded / 2**20, 1),
        "rss_after_warmup_mb": round(warm, 1),
        "rss_final_mb": round(rss[-1], 1),
        "rss_peak_mb": round(max(rss), 1),
        "growth_after_warmup_mb": round(rss[-1] - warm, 1),
        "median_run_ms": round(statistics.median(times), 1),
        "mean_run_ms": round(statistics.fmean(times), 1),
        "rss_mb": [round(r, 1) for r in rss],
        "shapes": shapes,
    }


def run_config(model: Path, config: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable, "-m", "benchmarks.ort_memory", "--worker", config, "--model", str(model),
        "--runs", str(args.runs), "--seed", str(args.seed), "--threads", str(args.threads),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_report(report: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ort_memory.json").write_text(
        repo_relative(json.dumps(report, indent=2)) + "\n", encoding="utf-8"
    )
    lines = [
        "# ONNX Runtime memory under variable sequence lengths",
        "",
        f"Generated {report['generated']} by `benchmarks/ort_memory.py` "
        f"({report['runs']} runs per setting, seed {report['seed']}).",
        "",
        f"- Model: {report['model']}",
        f"- Shapes: batch 1-16 x length 8-256, random, the same sequence for every setting; "
        f"{report['threads']} intra-op threads; RSS of a fresh process per setting.",
        f"- Machine: {report['machine']}",
        "",
        "| setting | RSS after load | after warm-up | final | peak | growth after warm-up | median run |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        name = (
            f"**{r['config']}** (service default)"
            if r["config"] == report["service_default"]
            else r["config"]
        )
        lines.append(
            f"| {name} | {r['rss_after_load_mb']} MB | {r['rss_after_warmup_mb']} MB | "
            f"{r['rss_final_mb']} MB | {r['rss_peak_mb']} MB | {r['growth_after_warmup_mb']:+} MB | "
            f"{r['median_run_ms']} ms |"
        )
    lines += ["", report["conclusion"], ""]
    (out_dir / "ort_memory.md").write_text(repo_relative("\n".join(lines)), encoding="utf-8")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in report["results"]:
        ax.plot(range(1, len(r["rss_mb"]) + 1), r["rss_mb"], label=r["config"])
    ax.set_xlabel("run (random batch x length)")
    ax.set_ylabel("process RSS (MB)")
    ax.set_title("ONNX Runtime CPU memory per session setting")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "ort_memory.png", dpi=120)


def conclusion(results: list[dict], chosen: str) -> str:
    by_name = {r["config"]: r for r in results}
    lowest = min(results, key=lambda r: r["rss_final_mb"])
    parts = [f"Lowest final RSS: {lowest['config']} ({lowest['rss_final_mb']} MB, median run "
             f"{lowest['median_run_ms']} ms)."]  # fmt: skip
    if chosen in by_name and "ort-defaults" in by_name:
        ours, default = by_name[chosen], by_name["ort-defaults"]
        parts.append(
            f"The service's defaults ({chosen}): final RSS {ours['rss_final_mb']} MB, "
            f"{ours['growth_after_warmup_mb']:+} MB after warm-up, median run {ours['median_run_ms']} ms; "
            f"onnxruntime's defaults: {default['rss_final_mb']} MB, "
            f"{default['growth_after_warmup_mb']:+} MB, {default['median_run_ms']} ms."
        )
    return " ".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, help="a bundle directory (default: MiniLM-L6, built once)")
    p.add_argument("--variant", default="int8", help="bundle variant to load (the CPU default: int8)")
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of the settings")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.runs <= WARMUP_RUNS:
        p.error(f"--runs must be more than the {WARMUP_RUNS} warm-up runs")
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        p.error(f"unknown settings {sorted(unknown)}; choose from {list(CONFIGS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.model, args.worker, args.runs, args.seed, args.threads)))
        return 0
    from benchmarks.bench_common import machine_info
    from export.bundle import load_bundle_manifest

    started = time.perf_counter()
    bundle = args.bundle or build_minilm_bundle(CACHE / "minilm-l6-bundle")
    model = load_bundle_manifest(bundle).variant_path(bundle, args.variant)
    results = []
    for config in args.configs.split(","):
        result = run_config(model, config, args)
        r = result
        print(
            f"{config:32} load {r['rss_after_load_mb']:6.1f}  warm {r['rss_after_warmup_mb']:6.1f}  "
            f"final {r['rss_final_mb']:6.1f}  peak {r['rss_peak_mb']:6.1f} MB  "
            f"growth {r['growth_after_warmup_mb']:+6.1f} MB  median {r['median_run_ms']} ms",
            flush=True,
        )
        results.append(result)
    info = machine_info(args.threads)
    report = {
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": f"{bundle.name} ({args.variant}: {model.name})",
        "runs": args.runs,
        "warmup_runs": WARMUP_RUNS,
        "seed": args.seed,
        "threads": args.threads,
        "machine": f"{info['cpu']}, {info['logical_cores']} logical cores, load average at start "
        f"{[round(x, 1) for x in info['load_average_at_start'] or []]}",
        "elapsed_s": round(time.perf_counter() - started, 1),
        "results": results,
    }
    report["service_default"] = service_default()
    report["conclusion"] = conclusion(results, report["service_default"])
    write_report(report, args.out)
    print(report["conclusion"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
