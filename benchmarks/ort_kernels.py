"""Why the int8 variant keeps residual Add + LayerNormalization unfused: a measurement.

    .venv/bin/python -m benchmarks.ort_kernels            # kernels, then the real int8 bundle

Part 1 times onnxruntime's SkipLayerNormalization against Add + LayerNormalization on the
hidden-state shapes BERT feeds them. Part 2 loads the int8 MiniLM bundle twice, once as the
service does (the manifest's disabled_optimizers keep the pair unfused) and once with
onnxruntime's defaults (which fuse them back into SkipLayerNormalization), and times both.
Writes benchmarks/results/ort_kernels.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.settings import available_cores
from benchmarks import bench_common as common
from export.verify import make_session

SHAPES = ((1, 128, 384), (8, 40, 384), (1, 384, 384), (1, 128, 768))


def median_us(fn: Callable[[], object], seconds: float) -> float:
    for _ in range(10):
        fn()
    times, deadline = [], time.perf_counter() + seconds
    while len(times) < 20 or time.perf_counter() < deadline:
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e6, 1)


def run_us(sess: Any, feeds: dict[str, np.ndarray], seconds: float) -> float:
    return median_us(lambda: sess.run(None, feeds), seconds)


def kernel_graphs(hidden: int) -> dict[str, Any]:
    from onnx import TensorProto, helper, numpy_helper

    params = [
        numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "beta"),
    ]
    io = (
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", hidden]) for n in ("x", "skip")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden])],
    )
    skip = helper.make_node(
        "SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain="com.microsoft", epsilon=1e-12
    )
    split = [
        helper.make_node("Add", ["x", "skip"], ["sum"]),
        helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12),
    ]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return {
        name: helper.make_model(
            helper.make_graph(nodes, name, *io, params), opset_imports=opsets, ir_version=8
        )
        for name, nodes in (("SkipLayerNormalization", [skip]), ("Add+LayerNormalization", split))
    }


def kernels(threads: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        graphs = kernel_graphs(shape[-1])
        feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x", "skip")}
        # The split graph must stay split: keep onnxruntime from fusing it back.
        times = {
            name: run_us(
                make_session(g.SerializeToString(), threads, ["SkipLayerNormFusion"]), feeds, seconds
            )
            for name, g in graphs.items()
        }
        rows.append({"shape": list(shape), "threads": threads, "us": times})
        print(f"  {shape} threads {threads}: {times}", flush=True)
    return rows


def bundle_ab(bundle: Path, threads: int, seconds: float) -> list[dict[str, Any]]:
    from export.bundle import load_bundle_manifest

    info = load_bundle_manifest(bundle).variants["int8"]
    path = str(bundle / info.file)
    rows = []
    for batch, seq in ((1, 128), (8, 40), (32, 128)):
        feeds = {
            "input_ids": np.full((batch, seq), 1000, np.int64),
            "attention_mask": np.ones((batch, seq), np.int64),
            "token_type_ids": np.zeros((batch, seq), np.int64),
        }
        served = make_session(path, threads, info.disabled_optimizers)
        refused = make_session(path, threads)
        row = {
            "batch": batch,
            "seq": seq,
            "as_served_ms": run_us(served, feeds, seconds) / 1000,
            "ort_default_fusion_ms": run_us(refused, feeds, seconds) / 1000,
        }
        rows.append(row)
        print(f"  int8 ({batch},{seq}): {row}", flush=True)
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# SkipLayerNormalization vs Add + LayerNormalization on this CPU",
        "",
        f"Generated {report['created_at']} by `{report['command']}`.",
        "",
        f"- Machine: {common.machine_line(report['machine'])}",
        "",
        "| shape | threads | SkipLayerNormalization µs | Add + LayerNormalization µs | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in report["kernels"]:
        skip, split = r["us"]["SkipLayerNormalization"], r["us"]["Add+LayerNormalization"]
        lines.append(f"| {tuple(r['shape'])} | {r['threads']} | {skip} | {split} | {skip / split:.1f}x |")
    lines += [
        "",
        f"Int8 bundle `{report['bundle']}`: as served (disabled_optimizers "
        f"{report['disabled_optimizers']}) vs onnxruntime's default load, which fuses SkipLayerNormalization "
        f"back ({report['threads']} threads, median ms):",
        "",
        "| batch x seq | as served | ORT default fusion | saved |",
        "|---|---:|---:|---:|",
    ]
    for r in report["bundle_ab"]:
        saved = 1 - r["as_served_ms"] / r["ort_default_fusion_ms"]
        lines.append(
            f"| {r['batch']} x {r['seq']} | {r['as_served_ms']:.2f} | {r['ort_default_fusion_ms']:.2f} | "
            f"{saved:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, default=common.default_bundle("classify"))
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    p.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    threads = args.threads or available_cores()
    from export.bundle import load_bundle_manifest

    common.require_bundle(args.bundle, "classify")
    report = {
        "created_at": common.now(),
        "command": "python -m benchmarks.ort_kernels " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": common.machine_info(threads),
        "threads": threads,
        "bundle": str(args.bundle),
        "disabled_optimizers": load_bundle_manifest(args.bundle).variants["int8"].disabled_optimizers,
        "kernels": kernels(1, args.seconds) + kernels(threads, args.seconds),
        "bundle_ab": bundle_ab(args.bundle, threads, args.seconds),
    }
    common.write_results(args.out, "ort_kernels", report, markdown(report), None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
