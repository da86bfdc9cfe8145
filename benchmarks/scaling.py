"""Latency vs sequence length and vs batch size for a MiniLM ORT bundle, against a FLOP floor.

    .venv/bin/python -m benchmarks.scaling                 # full sweep on .cache/bundles/sst2-minilm
    .venv/bin/python -m benchmarks.scaling --quick         # smoke run (~1 min)
    .venv/bin/python -m benchmarks.scaling --quick --dev-models   # before the defaults exist

The floor is the time the encoder's matrix multiplications need at this CPU's measured peak:
FLOPs are counted analytically (`bert_flops`: projections, attention scores and context, FFN,
pooler and head; one multiply-add = 2 FLOPs; embeddings, LayerNorm, softmax and GELU ignored),
and the peak is the best of numpy fp32 matmul and ONNX Runtime MatMul (fp32) / MatMulInteger
(int8) on large BERT-shaped products with the same thread count. The fused variant is compared
to the fp32 floor; the int8 floor charges the weight matmuls at the int8 peak and the attention
score/context products (which dynamic quantization leaves in fp32) at the fp32 peak.
Writes benchmarks/results/scaling{,_quick}.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_common as common
from export.int8_precision import exact_int8

SEQ_LENS = (16, 32, 64, 128, 256, 384, 512)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
QUICK_SEQ_LENS, QUICK_BATCHES = (16, 64, 128), (1, 4)
VARIANTS = ("fused", "int8")
FLOOR_PRECISION = {"fused": "fp32", "fp32": "fp32", "int8": "int8"}


def bert_flops(
    seq_len: int, hidden: int, layers: int, intermediate: int, num_labels: int = 2, batch: int = 1
) -> dict[str, float]:
    """Matmul FLOPs of one BERT forward pass with a [CLS] classification head (multiply-add = 2)."""
    if min(seq_len, hidden, layers, intermediate, batch) < 1:
        raise ValueError("sizes must be positive")
    projections = 4 * 2 * seq_len * hidden * hidden  # Q, K, V and the attention output dense
    attention = 2 * 2 * seq_len * seq_len * hidden  # QK^T scores, then scores x V (all heads together)
    ffn = 2 * 2 * seq_len * hidden * intermediate  # up and down projections
    head = 2 * hidden * hidden + 2 * hidden * num_labels  # pooler and classifier, on [CLS] only
    per_sequence = layers * (projections + attention + ffn) + head
    return {
        "total": float(batch * per_sequence),
        "projections": float(batch * layers * projections),
        "attention": float(batch * layers * attention),
        "ffn": float(batch * layers * ffn),
        "head": float(batch * head),
    }


def sig(value: float, digits: int = 4) -> float:
    """Round to significant digits: tiny test models have microsecond floors."""
    return float(f"{value:.{digits}g}")


def floor_seconds(flops: dict[str, float], precision: str, peak_gflops: dict[str, float]) -> float:
    """Matmul time at peak. int8 dynamic quantization only covers the weight matmuls: the attention
    score and context products stay fp32, so they are charged at the fp32 peak."""
    if precision == "fp32":
        return flops["total"] / (peak_gflops["fp32"] * 1e9)
    weights = flops["total"] - flops["attention"]
    return weights / (peak_gflops["int8"] * 1e9) + flops["attention"] / (peak_gflops["fp32"] * 1e9)


def _median_seconds(fn: Callable[[], object], runs: int, budget_s: float) -> float:
    fn()  # warm-up
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < runs and (len(times) < 2 or time.perf_counter() < deadline):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _matmul_session(m: int, k: int, n: int, threads: int, int8: bool):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if int8:
        weight = numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w")
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
        x_type, y_type = TensorProto.UINT8, TensorProto.INT32
    else:
        weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        x_type, y_type = TensorProto.FLOAT, TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "matmul",
        [helper.make_tensor_value_info("x", x_type, [m, k])],
        [helper.make_tensor_value_info("y", y_type, [m, n])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    exact_int8(options)  # the int8 kernel the service runs on this CPU
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = (
        rng.integers(0, 256, (m, k), dtype=np.uint8)
        if int8
        else rng.standard_normal((m, k), dtype=np.float32)
    )
    return lambda: session.run(None, {"x": x})


def measure_peak(
    threads: int, shapes: list[tuple[int, int, int]], runs: int, budget_s: float
) -> dict[str, Any]:
    """Achievable GFLOP/s (fp32) and GOP/s (int8) on BERT-shaped matmuls: the floor's denominator."""
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in shapes:
        flops = 2.0 * m * k * n
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        candidates = {
            ("numpy", "fp32"): lambda a=a, b=b: a @ b,
            ("ort-MatMul", "fp32"): _matmul_session(m, k, n, threads, int8=False),
            ("ort-MatMulInteger", "int8"): _matmul_session(m, k, n, threads, int8=True),
        }
        for (engine, precision), fn in candidates.items():
            seconds = _median_seconds(fn, runs, budget_s)
            rows.append(
                {
                    "engine": engine,
                    "precision": precision,
                    "shape": [m, k, n],
                    "gflops": sig(flops / seconds / 1e9),
                }
            )
    best = {p: max(r["gflops"] for r in rows if r["precision"] == p) for p in ("fp32", "int8")}
    return {"measurements": rows, "peak_gflops": best}


def feeds(batch: int, seq: int, vocab: int = 30522, seed: int = 0) -> dict[str, np.ndarray]:
    """Random full-length rows (no padding); ids skip the low range where special tokens live."""
    low = min(1000, vocab // 4)
    ids = np.random.default_rng(seed).integers(low, vocab, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def model_sizes(bundle: Path) -> dict[str, Any]:
    """Encoder sizes from the manifest; intermediate from the source config, else BERT's 4 x hidden."""
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    model = manifest.model
    sizes = {
        "hidden": int(model["hidden_size"]),
        "layers": int(model["num_hidden_layers"]),
        "heads": int(model["num_attention_heads"]),
        "num_labels": len(manifest.labels or [1, 1]),
    }
    source = Path(str(model.get("source_checkpoint", ""))) / "config.json"
    if str(model.get("source_checkpoint", "")) and source.is_file():
        sizes["intermediate"] = int(json.loads(source.read_text())["intermediate_size"])
        sizes["intermediate_from"] = str(source)
    else:
        sizes["intermediate"] = 4 * sizes["hidden"]
        sizes["intermediate_from"] = "assumed 4 x hidden (source config not found)"
    return sizes


def sweep(
    bundle: Path, variant: str, points: list[tuple[int, int]], sizes, peak, args
) -> list[dict[str, Any]]:
    from app.backend.runtime import create_runtime
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    disabled = manifest.variants[variant].disabled_optimizers
    runtime = create_runtime(
        manifest.variant_path(bundle, variant), "cpu", args.threads, disabled_optimizers=disabled
    )
    vocab = int(manifest.model.get("vocab_size", 30522))
    rows = []
    for batch, seq in points:
        flops = bert_flops(
            seq, sizes["hidden"], sizes["layers"], sizes["intermediate"], sizes["num_labels"], batch
        )
        row: dict[str, Any] = {
            "variant": variant,
            "batch": batch,
            "seq": seq,
            "gflop": sig(flops["total"] / 1e9),
        }
        inputs = feeds(batch, seq, vocab)
        try:
            seconds = _median_seconds(lambda inputs=inputs: runtime.run(inputs), args.runs, args.budget_s)
        except Exception as e:  # e.g. longer than the position table: record, keep sweeping
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            continue
        floor_s = floor_seconds(flops, FLOOR_PRECISION[variant], peak)
        row.update(
            median_ms=sig(seconds * 1e3),
            floor_ms=sig(floor_s * 1e3),
            achieved_gflops=sig(flops["total"] / seconds / 1e9),
            efficiency=sig(floor_s / seconds),
            sequences_per_s=sig(batch / seconds),
        )
        rows.append(row)
        print(
            f"  {variant:5} batch {batch:3d} seq {seq:4d}: {row['median_ms']:9.2f} ms "
            f"(floor {row['floor_ms']:.2f} ms, {row['efficiency']:.0%} of peak)",
            flush=True,
        )
    return rows


def markdown(report: dict[str, Any]) -> str:
    s, peak = report["settings"], report["peak"]["peak_gflops"]
    lines = [
        "# Latency scaling (CPU)",
        "",
        f"Generated {report['created_at']} by `{s['command']}`.",
        "",
        f"- Machine: {common.machine_line(report['machine'])}; threads {s['threads']}",
        f"- Bundle `{s['bundle']}`: {report['model']}",
        f"- Measured peak: fp32 {peak['fp32']} GFLOP/s, int8 {peak['int8']} GOP/s "
        "(best of numpy and ORT matmuls); floor = analytic matmul FLOPs / peak.",
        "",
        "| sweep | variant | batch | seq | median ms | floor ms | of peak | seq/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("seq_len", "batch"):
        for r in report["results"][name]:
            if "error" in r:
                lines.append(f"| {name} | {r['variant']} | {r['batch']} | {r['seq']} | {r['error']} | | | |")
                continue
            lines.append(
                f"| {name} | {r['variant']} | {r['batch']} | {r['seq']} | {r['median_ms']} | "
                f"{r['floor_ms']} | {r['efficiency']:.0%} | {r['sequences_per_s']} |"
            )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, name, key, label in (
        (axes[0], "seq_len", "seq", "sequence length (batch 1)"),
        (axes[1], "batch", "batch", f"batch size (seq {report['settings']['batch_seq']})"),
    ):
        for variant in report["settings"]["variants"]:
            rows = [r for r in report["results"][name] if r["variant"] == variant and "error" not in r]
            x = [r[key] for r in rows]
            line = ax.plot(x, [r["median_ms"] for r in rows], "o-", label=f"{variant} measured")[0]
            ax.plot(
                x,
                [r["floor_ms"] for r in rows],
                "--",
                color=line.get_color(),
                label=f"{variant} FLOP floor ({FLOOR_PRECISION[variant]} peak)",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("latency, ms (log)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    peak = report["peak"]["peak_gflops"]
    fig.suptitle(
        f"{report['machine']['cpu']}, {report['settings']['threads']} threads; "
        f"peak fp32 {peak['fp32']} GFLOP/s, int8 {peak['int8']} GOP/s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: few points, 3 runs each")
    p.add_argument("--bundle", type=Path, default=common.default_bundle("classify"))
    p.add_argument("--dev-models", action="store_true", help="MiniLM with a random classify head")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of fused,int8,fp32")
    p.add_argument("--seq-lens", help=f"comma list (default {','.join(map(str, SEQ_LENS))})")
    p.add_argument("--batches", help=f"comma list (default {','.join(map(str, BATCHES))})")
    p.add_argument("--batch-seq", type=int, default=128, help="sequence length of the batch sweep")
    p.add_argument("--threads", type=int, default=0, help="ORT threads (0 = available cores)")
    p.add_argument("--runs", type=int, help="timed runs per point (default 20; quick 3)")
    p.add_argument(
        "--budget-s", type=float, help="seconds per point once 2 runs are done (default 10; quick 1)"
    )
    p.add_argument("--work-dir", type=Path, default=common.WORK)
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    try:
        args.seq_lens = [
            int(x)
            for x in (args.seq_lens or ",".join(map(str, QUICK_SEQ_LENS if args.quick else SEQ_LENS))).split(
                ","
            )
        ]
        args.batches = [
            int(x)
            for x in (args.batches or ",".join(map(str, QUICK_BATCHES if args.quick else BATCHES))).split(",")
        ]
    except ValueError:
        p.error("--seq-lens and --batches take comma lists of integers")
    if min(args.seq_lens + args.batches) < 1:
        p.error("sequence lengths and batch sizes must be >= 1")
    args.variants = [v for v in args.variants.split(",") if v]
    if set(args.variants) - set(FLOOR_PRECISION):
        p.error(f"--variants must name some of {sorted(FLOOR_PRECISION)}")
    args.runs = args.runs or (3 if args.quick else 20)
    args.budget_s = args.budget_s or (1.0 if args.quick else 10.0)
    return args


def main(argv: list[str] | None = None) -> int:
    from app.settings import available_cores

    args = parse_args(argv)
    args.threads = args.threads or available_cores()
    bundle = (
        common.build_dev_models(["classify"], args.work_dir)["classify"][1]
        if args.dev_models
        else args.bundle
    )
    common.require_bundle(bundle, "classify")
    sizes = model_sizes(bundle)
    h, i = sizes["hidden"], sizes["intermediate"]
    shapes = [(512 if args.quick else 4096, h, i), (1024, 1024, 1024)]
    print(f"measuring matmul peak on {shapes}", flush=True)
    peak = measure_peak(args.threads, shapes, args.runs, args.budget_s)
    print(f"  peak {peak['peak_gflops']}", flush=True)
    results: dict[str, list] = {"seq_len": [], "batch": []}
    for variant in args.variants:
        results["seq_len"] += sweep(
            bundle, variant, [(1, s) for s in args.seq_lens], sizes, peak["peak_gflops"], args
        )
        results["batch"] += sweep(
            bundle, variant, [(b, args.batch_seq) for b in args.batches], sizes, peak["peak_gflops"], args
        )
    report = {
        "created_at": common.now(),
        "machine": common.machine_info(args.threads),
        "settings": {
            "command": "python -m benchmarks.scaling " + " ".join(argv if argv is not None else sys.argv[1:]),
            "quick": args.quick,
            "bundle": str(bundle),
            "variants": args.variants,
            "threads": args.threads,
            "runs": args.runs,
            "budget_s": args.budget_s,
            "batch_seq": args.batch_seq,
            "flops": "analytic matmul FLOPs (multiply-add = 2); see bert_flops",
        },
        "model": sizes,
        "peak": peak,
        "results": results,
    }
    stem = "scaling_quick" if args.quick else "scaling"
    common.write_results(args.out, stem, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
