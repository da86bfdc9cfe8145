"""Where the embed task pools: inside the ONNX graph, or in processing/ with numpy. A measurement.

    python -m benchmarks.embed_pooling [--bundle .cache/bundles/all-minilm-l6-v2] [--seconds 2]

Both sides run the same INT8 (int8-rowwise) MiniLM graph, one thread, as the service does: "numpy"
is the bundle's file, which returns last_hidden_state, pooled row by row over each row's real
tokens (processing.embed.pool_tokens); "graph" is the same file with the pooling appended as
tracing model.bert.pool emits it (mean: Cast, Unsqueeze, Mul by the mask, ReduceSum, Max, Div). Timed:
session.run plus the pooling, from features to one vector per row, on batches of real sentence
lengths; the two sides alternate so that a busy machine slows both alike. Also measured: whether a
row gives bit-identical vectors alone and inside a padded batch. Writes
benchmarks/results/embed_pooling.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_common as common
from export.bundle import load_bundle_manifest
from export.verify import make_session
from processing.embed import pool_tokens
from processing.padding import pad_batch
from processing.tokenizer import TextTokenizer

STEM = "embed_pooling"
SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome and the actors were brilliant in every scene of it.",
    "Three people are sitting at a table outside a cafe, drinking coffee and talking about the weather.",
    "Stocks fell sharply on Monday as investors worried that the central bank would raise interest "
    "rates again before the end of the year, and oil prices climbed for a third day.",
    "ok",
    "The committee approved the proposal after a long debate, although several members voted "
    "against it, arguing that the costs had been underestimated and that the timeline was too tight "
    "for a project of this size, which would need years of planning and careful review.",
]
# (rows, which sentences): a lone short and long request, and batches of mixed lengths.
SHAPES = {
    "1 short": [0],
    "1 long": [5],
    "8 mixed": [0, 1, 2, 3, 4, 5, 1, 2],
    "32 mixed": list(range(6)) * 5 + [0, 3],
}


def pooling_nodes(hidden: str, mode: str) -> tuple[list, list]:
    """ONNX nodes (and constants) pooling `hidden` [batch, seq, C] into `embeddings` [batch, C] over
    attention_mask, as tracing model.bert.pool emits them."""
    from onnx import TensorProto, helper, numpy_helper

    constants = {
        "pool/axis1": np.array([1], np.int64),
        "pool/axis2": np.array([2], np.int64),
        "pool/tiny": np.array(1e-9, np.float32),
        "pool/lowest": np.array(np.finfo(np.float32).min, np.float32),
        "pool/zero": np.array(0, np.int64),
    }
    node = helper.make_node
    nodes = [
        node("Cast", ["attention_mask"], ["pool/mask"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["pool/mask", "pool/axis2"], ["pool/mask3"]),
    ]
    if mode == "mean":
        nodes += [
            node("Mul", [hidden, "pool/mask3"], ["pool/masked"]),
            node("ReduceSum", ["pool/masked", "pool/axis1"], ["pool/sum"], keepdims=0),
            node("ReduceSum", ["pool/mask3", "pool/axis1"], ["pool/count"], keepdims=0),
            node("Max", ["pool/count", "pool/tiny"], ["pool/count_safe"]),
            node("Div", ["pool/sum", "pool/count_safe"], ["embeddings"]),
        ]
    elif mode == "max":
        nodes += [
            node("Cast", ["pool/mask3"], ["pool/keep"], to=TensorProto.BOOL),
            node("Where", ["pool/keep", hidden, "pool/lowest"], ["pool/filled"]),
            node("ReduceMax", ["pool/filled"], ["embeddings"], axes=[1], keepdims=0),
        ]
    else:  # cls
        nodes = [node("Gather", [hidden, "pool/zero"], ["embeddings"], axis=1)]
    return nodes, [numpy_helper.from_array(v, k) for k, v in constants.items()]


def add_pooling(model_path: Path, mode: str, out: Path) -> Path:
    """The bundle's graph with the pooling appended: one output, `embeddings` [batch, C]."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path))
    nodes, constants = pooling_nodes(model.graph.output[0].name, mode)
    model.graph.initializer.extend(constants)
    model.graph.node.extend(nodes)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", None]))
    onnx.save(model, str(out))
    return out


def pooling_only(mode: str, opset: int) -> bytes:
    """A graph of the pooling nodes alone, on given token states: the pooling's own cost in ORT."""
    from onnx import TensorProto, helper

    nodes, constants = pooling_nodes("hidden", mode)
    graph = helper.make_graph(
        nodes,
        "pooling",
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", None]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", None])],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def median_ms(fn, seconds: float) -> float:
    times = []
    for _ in range(3):
        fn()
    deadline = time.perf_counter() + seconds
    while len(times) < 10 or time.perf_counter() < deadline:
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bundle", type=Path, default=common.ROOT / ".cache" / "bundles" / "all-minilm-l6-v2"
    )
    parser.add_argument("--variant", default="int8-rowwise")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per side per shape and round")
    parser.add_argument("--rounds", type=int, default=3, help="graph/numpy alternations per shape")
    parser.add_argument("--out", type=Path, default=common.RESULTS)
    args = parser.parse_args(argv)
    manifest = load_bundle_manifest(args.bundle)
    mode = manifest.pooling["mode"]
    path = manifest.variant_path(args.bundle, args.variant)
    disabled = manifest.variants[args.variant].disabled_optimizers
    work = common.WORK / STEM
    work.mkdir(parents=True, exist_ok=True)
    pooled = add_pooling(path, mode, work / "pooled_in_graph.onnx")
    graph = make_session(pooled, threads=1, disabled_optimizers=disabled)
    hidden = make_session(path, threads=1, disabled_optimizers=disabled)
    pool_graph = make_session(pooling_only(mode, manifest.model.get("opset", 17)), threads=1)
    tokenizer = TextTokenizer.from_dir(args.bundle)
    encodings = [tokenizer.encode(s, max_length=manifest.max_seq_len) for s in SENTENCES]

    def run_graph(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return graph.run(None, feeds)[0]

    def run_numpy(feeds: dict[str, np.ndarray]) -> np.ndarray:
        states = hidden.run(None, feeds)[0]
        lengths = feeds["attention_mask"].sum(axis=1)
        return np.stack([pool_tokens(states[i, :n], mode) for i, n in enumerate(lengths)])

    sides = {"graph": run_graph, "numpy": run_numpy}
    rows: list[dict[str, Any]] = []
    machine = common.machine_info(threads=1)
    for shape, picks in SHAPES.items():
        feeds = pad_batch([encodings[i] for i in picks], tokenizer.pad_id)
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, fn in sides.items():
                times[side].append(median_ms(lambda fn=fn, feeds=feeds: fn(feeds), args.seconds))
        # The pooling alone, on this batch's token states: ORT's nodes against numpy's loop.
        states = hidden.run(None, feeds)[0]
        only_feeds = {"hidden": states, "attention_mask": feeds["attention_mask"]}
        lengths = feeds["attention_mask"].sum(axis=1)
        pooling_us = {
            "graph": median_ms(lambda f=only_feeds: pool_graph.run(None, f), args.seconds / 4) * 1e3,
            "numpy": median_ms(
                lambda s=states, n=lengths: [pool_tokens(s[i, :k], mode) for i, k in enumerate(n)],
                args.seconds / 4,
            )
            * 1e3,
        }
        got = {side: fn(feeds) for side, fn in sides.items()}
        # Each row alone (cut to its own length) against the same row inside this padded batch.
        invariance = {}
        for side, fn in sides.items():
            worst = 0.0
            for i, n in enumerate(feeds["attention_mask"].sum(axis=1)):
                alone = fn({k: np.ascontiguousarray(v[i : i + 1, :n]) for k, v in feeds.items()})
                worst = max(worst, float(np.abs(alone[0] - got[side][i]).max()))
            invariance[side] = worst
        row = {
            "shape": shape,
            "rows": len(picks),
            "padded_tokens": int(feeds["input_ids"].size),
            "graph_ms": round(statistics.median(times["graph"]), 3),
            "numpy_ms": round(statistics.median(times["numpy"]), 3),
            "rounds_ms": times,
            "pooling_alone_us": {k: round(v, 1) for k, v in pooling_us.items()},
            "max_abs_diff_graph_vs_numpy": float(np.abs(got["graph"] - got["numpy"]).max()),
            "alone_vs_batch_max_abs_diff": invariance,
        }
        row["numpy_over_graph"] = round(row["numpy_ms"] / row["graph_ms"], 3)
        rows.append(row)
        print(
            f"{shape:9s} graph {row['graph_ms']:.3f} ms  numpy {row['numpy_ms']:.3f} ms  "
            f"({row['numpy_over_graph']:.2f}x)  pooling alone (us) {row['pooling_alone_us']}  "
            f"alone vs batch: {invariance}",
            flush=True,
        )
    report = {
        "command": common.repo_relative(" ".join(["python -m benchmarks.embed_pooling", *sys.argv[1:]])),
        "bundle": common.repo_relative(str(args.bundle)),
        "variant": args.variant,
        "pooling": mode,
        "machine": machine,
        "rows": rows,
    }
    common.write_results(args.out, STEM, report, markdown(report), None)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Embeddings: pooling inside the ONNX graph vs in processing/ (numpy)",
        "",
        f"`{report['command']}`; {report['variant']} MiniLM, {report['pooling']} pooling, one thread; median "
        "ms from features to one vector per row (session.run + pooling). **The machine was shared with "
        "other engineers' jobs** (2 cores): read the ratios, the sides alternate.",
        "",
        "| batch | padded tokens | graph (ms) | numpy (ms) | numpy / graph "
        "| pooling alone, graph / numpy (µs) "
        "| row alone vs in batch: graph | numpy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        inv = r["alone_vs_batch_max_abs_diff"]
        lines.append(
            f"| {r['shape']} | {r['padded_tokens']} | {r['graph_ms']:.3f} | {r['numpy_ms']:.3f} | "
            f"{r['numpy_over_graph']:.2f} | {r['pooling_alone_us']['graph']:.0f} / "
            f"{r['pooling_alone_us']['numpy']:.0f} | {inv['graph']:.2g} | {inv['numpy']:.2g} |"
        )
    lines += ["", f"Machine: {common.machine_line(report['machine'])}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
