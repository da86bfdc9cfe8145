"""CPU latency of one classify model across runtimes, in one run on this machine.

    .venv/bin/python -m benchmarks.export_latency            # full: MiniLM + BERT-base, ~15-20 min on 2 cores
    .venv/bin/python -m benchmarks.export_latency --quick    # smoke run, ~2-3 min

Models: MiniLM-L6 (real encoder weights, random classify head) and a BERT-base-sized
encoder with random weights (768 hidden, 12 layers, 12 heads). Engines: our PyTorch
eager model, `transformers` BertForSequenceClassification on the same weights (SDPA
and eager attention), and ONNX Runtime fp32 / fused / int8 from our export bundle.
Writes benchmarks/results/export_latency{,_quick}.{json,md,png} with a machine description.
Inputs are full-length (no padding); each cell reports the median of timed runs after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.bench_common import machine_info, repo_relative

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
SHAPES = [(1, 128), (1, 384), (32, 128)]
QUICK_SHAPES = [(1, 128), (1, 384), (4, 128)]
ENGINES = ("ours-torch", "hf-torch-sdpa", "hf-torch-eager", "ort-fp32", "ort-fused", "ort-int8")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def bert_base_random(out: Path, layers: int = 12) -> Path:
    """A classify checkpoint of BERT-base shape with random (seeded) weights and MiniLM's vocab."""
    import torch

    from model.bert import BertForSequenceClassification
    from model.checkpoint import copy_tokenizer_files, minilm_package_dir
    from model.config import BertConfig

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=3072,
        task="classify",
        id2label={0: "negative", 1: "positive"},
    )
    BertForSequenceClassification(config).save_pretrained(out)
    copy_tokenizer_files(minilm_package_dir(), out)  # same 30522-token uncased vocab
    return out


def build_checkpoints(work: Path, quick: bool) -> dict[str, Path]:
    import torch

    from model.bert import BertForSequenceClassification
    from model.checkpoint import minilm_package_dir

    torch.manual_seed(0)
    minilm = BertForSequenceClassification.from_pretrained(minilm_package_dir(), task="classify")
    minilm.save_pretrained(work / "minilm-l6")
    layers = 2 if quick else 12  # the smoke run keeps BERT-base width but only 2 layers
    base_name = "bert-base-random" if not quick else "bert-base-width-2-layers-random"
    bert_base_random(work / base_name, layers)
    return {"minilm-l6": work / "minilm-l6", base_name: work / base_name}


def time_call(fn: Callable[[], object], runs: int, budget_s: float, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < runs and (len(times) < 3 or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))],
        "mean_ms": statistics.fmean(times),
        "runs": len(times),
    }


def engines_for(checkpoint: Path, bundle: Path, threads: int) -> dict[str, Callable[[dict], Callable]]:
    """Each engine maps numpy features to a zero-argument callable running one batch."""
    import torch
    import transformers

    from export.bundle import load_bundle_manifest
    from export.verify import make_session
    from model.bert import BertForSequenceClassification

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    ours = BertForSequenceClassification.from_pretrained(checkpoint).eval()
    hf_class = transformers.BertForSequenceClassification
    hf = {}
    for impl in ("sdpa", "eager"):
        hf[impl] = hf_class.from_pretrained(checkpoint, attn_implementation=impl).eval()

    def torch_engine(model, hf_style: bool):
        def bind(feeds):
            tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}

            def call():
                with torch.inference_mode():
                    return model(**tensors) if hf_style else model(*(tensors[k] for k in INPUTS))

            return call

        return bind

    manifest = load_bundle_manifest(bundle)

    def ort_engine(variant: str):
        info = manifest.variants[variant]  # with the bundle's own session settings, as the service
        session = make_session(bundle / info.file, threads, info.disabled_optimizers)
        return lambda feeds: lambda: session.run(["logits"], feeds)

    return {
        "ours-torch": torch_engine(ours, False),
        "hf-torch-sdpa": torch_engine(hf["sdpa"], True),
        "hf-torch-eager": torch_engine(hf["eager"], True),
        "ort-fp32": ort_engine("fp32"),
        "ort-fused": ort_engine("fused"),
        "ort-int8": ort_engine("int8"),
    }


def features(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, size=(batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def logits_of(output) -> np.ndarray:
    if isinstance(output, list):
        return output[0]
    return output.logits.float().numpy()


def benchmark_model(name: str, checkpoint: Path, work: Path, shapes, args) -> tuple[dict, list[dict]]:
    from export import export_bundle, load_bundle_manifest

    started = time.perf_counter()
    bundle = export_bundle(
        checkpoint,
        work / f"{name}-bundle",
        variants=("fp32", "fused", "int8"),
        max_seq_len=max(s for _, s in shapes),
        overwrite=True,
        log=lambda m: print(f"  [{name}] {m}", flush=True),
    )
    manifest = load_bundle_manifest(bundle)
    summary = {
        "export_seconds": round(time.perf_counter() - started, 1),
        "layers": manifest.model["num_hidden_layers"],
        "hidden_size": manifest.model["hidden_size"],
        "bundle_mb": {v: round(i.bytes / 1e6, 1) for v, i in manifest.variants.items()},
        "fused_operator_counts": manifest.optimization["fused_operator_counts"],
        "int8_vs_fp32": manifest.quantization["accuracy_vs_fp32"],
        "parity_vs_ours_torch": {},
    }
    engines = engines_for(checkpoint, bundle, args.threads)
    rows = []
    for batch, seq in shapes:
        feeds = features(batch, seq)
        reference = None
        for engine in ENGINES:
            call = engines[engine](feeds)
            out = logits_of(call())
            reference = out if reference is None else reference
            parity = summary["parity_vs_ours_torch"]  # max |logit diff| over all shapes
            parity[engine] = max(parity.get(engine, 0.0), float(np.abs(out - reference).max()))
            stats = time_call(call, args.runs, args.budget_s, args.warmup)
            stats.update(
                model=name,
                engine=engine,
                batch=batch,
                seq=seq,
                sequences_per_s=batch / (stats["median_ms"] / 1e3),
            )
            rows.append(stats)
            print(
                f"  {name:32s} {engine:15s} {batch:3d}x{seq:<4d} {stats['median_ms']:9.2f} ms "
                f"(p90 {stats['p90_ms']:.2f}, {stats['runs']} runs)",
                flush=True,
            )
    return summary, rows


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# Export latency (CPU)",
        "",
        f"Generated {report['created_at']} by `benchmarks/export_latency.py"
        f"{' --quick' if report['settings']['quick'] else ''}`.",
        "",
        f"- CPU: {m['cpu']}, {m['logical_cores']} logical cores"
        f"{', ' + str(m.get('physical_cores')) + ' physical' if m.get('physical_cores') else ''}, "
        f"{m.get('memory_gib', '?')} GiB RAM; threads used: {m['threads_used']}; "
        f"load average at start: {m['load_average_at_start']}",
        f"- {m['os']}, Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"- Median of up to {report['settings']['runs']} runs per cell after {report['settings']['warmup']} "
        f"warm-up, at most ~{report['settings']['budget_s']} s per cell; full-length inputs, no padding.",
        "",
    ]
    for model, summary in report["models"].items():
        rows = [r for r in report["results"] if r["model"] == model]
        lines += [
            f"## {model} ({summary['layers']} layers, hidden {summary['hidden_size']})",
            "",
            "median ms (speed-up vs ours-torch)",
            "",
            "| batch x seq | " + " | ".join(ENGINES) + " |",
            "|---|" + "---:|" * len(ENGINES),
        ]
        for batch, seq in report["settings"]["shapes"]:
            cells = {r["engine"]: r["median_ms"] for r in rows if (r["batch"], r["seq"]) == (batch, seq)}
            base = cells["ours-torch"]
            lines.append(
                f"| {batch} x {seq} | "
                + " | ".join(f"{cells[e]:.1f} ({base / cells[e]:.2f}x)" for e in ENGINES)
                + " |"
            )
        agreement = summary["int8_vs_fp32"]
        lines += [
            "",
            f"Fusions: {summary['fused_operator_counts']}. Bundle MB: {summary['bundle_mb']}. "
            f"int8 vs fp32 (random tokens, random head): argmax agreement "
            f"{agreement['argmax_agreement']}, max |diff| {agreement['max_abs_diff']:.3g}. "
            f"Export took {summary['export_seconds']} s.",
            "",
        ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report["models"])
    shapes = report["settings"]["shapes"]
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4.5), squeeze=False)
    width = 0.8 / len(ENGINES)
    for ax, model in zip(axes[0], models, strict=True):
        for i, engine in enumerate(ENGINES):
            cells = {
                (r["batch"], r["seq"]): r["median_ms"]
                for r in report["results"]
                if r["model"] == model and r["engine"] == engine
            }
            values = [cells[tuple(s)] for s in shapes]
            ax.bar(np.arange(len(shapes)) + i * width, values, width, label=engine)
        ax.set_xticks(np.arange(len(shapes)) + width * (len(ENGINES) - 1) / 2)
        ax.set_xticklabels([f"{b}x{s}" for b, s in shapes])
        ax.set_yscale("log")
        ax.set_ylabel("median latency, ms (log)")
        ax.set_title(model)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(ENGINES), fontsize=9)
    fig.suptitle(f"CPU latency: {report['machine']['cpu']}, {report['machine']['threads_used']} threads")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: BERT-base width with 2 layers, batch 4 not 32, 3 runs per cell",
    )
    parser.add_argument("--runs", type=int, default=None, help="timed runs per cell (default 20; quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up runs per cell (default 3; quick 1)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop a cell after this many seconds once 3 runs are done (default 20; quick 2)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="intra-op threads for torch and ORT (default: all logical cores)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=ROOT / ".cache" / "bench-export",
        help="checkpoints and bundles are written here",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    args.runs = args.runs or (3 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.budget_s = args.budget_s or (2.0 if args.quick else 20.0)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    args.work_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(args.threads),
        "settings": {
            "quick": args.quick,
            "shapes": shapes,
            "runs": args.runs,
            "warmup": args.warmup,
            "budget_s": args.budget_s,
            "engines": list(ENGINES),
            "note": "hf-torch-* = transformers.BertForSequenceClassification on the same weights",
        },
        "models": {},
        "results": [],
    }
    for name, checkpoint in build_checkpoints(args.work_dir, args.quick).items():
        summary, rows = benchmark_model(name, checkpoint, args.work_dir, shapes, args)
        report["models"][name] = summary
        report["results"] += rows
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "export_latency_quick" if args.quick else "export_latency"
    (args.out / f"{stem}.json").write_text(repo_relative(json.dumps(report, indent=2)) + "\n")
    (args.out / f"{stem}.md").write_text(repo_relative(markdown(report)) + "\n")
    plot(report, args.out / f"{stem}.png")
    print(f"wrote {args.out / stem}.json / .md / .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
