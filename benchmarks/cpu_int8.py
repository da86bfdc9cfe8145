"""The batch-invariant INT8 path against ORT's dynamic INT8, side by side in one run
(`python -m benchmarks.cpu_int8 [--quick]`, on .cache/bundles/sst2-minilm): the bundle's `int8`
(dynamic, not batch-invariant), `int8-rowwise` (served) and `static per-tensor`, rewritten here from
the graph the int8 variants start from: one calibrated activation scale per quantized input (its
largest |value| over SST-2 training sentences), so MatMulIntegerToFloat takes a scalar scale and the
bias (no row statistics, no rescale or bias pass), Q, K and V as one matmul.

Speed at (1,128) and (32,128), 1 and 2 threads, in rounds of blocks (an untimed run, then timed ones)
alternating candidates; headline: CPU time per run (one thread: the calling thread's, where ORT
computes; two: the process's), which other processes' time slices do not inflate, then wall medians.
Invariance: SST-2 validation sentences alone against inside padded batches of 1..33 rows, bit for
bit. Accuracy: SST-2 validation, and logits against fp32. Profile: ORT's per-operator time, one
thread. Writes benchmarks/results/cpu_int8{,_quick}.*. Retired candidates: docs/decisions.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_common as common
from export import quantize_rowwise as qr
from export.verify import make_session

TARGET = 1.05  # issue 30: the invariant path <= 1.05x dynamic INT8 at (1,128) and (32,128)
SHAPES, THREADS = ((1, 128), (32, 128)), (1, 2)
INT8 = "int8"


class Candidate:
    def __init__(self, name: str, path: Path, disabled: list[str] | None = None):
        self.name, self.path, self.disabled = name, path, list(disabled or [])

    def session(self, threads: int):
        return make_session(self.path, threads, self.disabled)


class StaticScales(qr._Rewriter):
    """One calibrated activation scale per quantized input (GELU's zero point as in int8-rowwise);
    Q, K and V as one matmul of the shared input (with its bias), split before MultiHeadAttention."""

    def __init__(self, graph, peaks: dict[str, float]):
        super().__init__(graph)
        self.peaks = peaks

    def quantize_rows_of(self, x: str, producer: str | None, width: int) -> tuple[str, str, int]:
        peak = max(self.peaks[x], qr.TINY)
        if producer in qr.GELU_OPS:
            zero_point = qr.GELU_ZERO_POINT
            step = max(peak / (255 - zero_point), -qr.GELU_MIN / zero_point)
        else:
            zero_point, step = qr.ZERO_POINT, peak / qr.QMAX
        scale = self.const("static_step", np.float32(step))
        zp = self.const(f"zp{zero_point}", np.uint8(zero_point), True)
        return self.node("QuantizeLinear", [x, scale, zp], "codes"), scale, zero_point

    def attention(self, node) -> bool:
        from onnx import helper

        x, weight_name, bias, mask = (list(node.input) + [""] * 4)[:4]
        weight = self.constant_matrix(weight_name)
        if weight is None or len(node.input) > 4 or not bias:
            return False
        qkv = [self.name(part) for part in "qkv"]
        sizes = self.const("qkv_sizes", np.array([weight.shape[1] // 3] * 3, np.int64), True)
        packed = self.node("Add", [self.matmul(x, weight), bias], "qkv_bias")  # into the matmul: fold_bias
        self.nodes.append(helper.make_node("Split", [packed, sizes], qkv, name=self.name("split"), axis=-1))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute} | {"domain": qr.MS_DOMAIN}
        inputs, attrs["name"] = [*qkv, ""] + ([mask] if mask else []), self.name("mha")
        self.nodes.append(helper.make_node("MultiHeadAttention", inputs, node.output, **attrs))
        return True


def fold_bias(graph) -> int:
    """MatMulIntegerToFloat with a scalar activation scale, then Add(constant [N]): the bias moves into
    the matmul's output pass. (Per-row scales cannot take it: the kernel would scale the bias too.)"""
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    drop = []
    for node in graph.node:
        users = consumers[node.output[0]]
        scalar = node.op_type == "MatMulIntegerToFloat" and consts.get(node.input[2], np.ones(2)).size == 1
        if not (scalar and len(users) == 1 and users[0].op_type == "Add"):
            continue
        bias = [name for name in users[0].input if name != node.output[0]]
        if len(bias) == 1 and bias[0] in consts and consts[bias[0]].ndim == 1:
            del node.input[5:]
            node.input.extend(["", bias[0]])
            node.output[0] = users[0].output[0]
            drop.append(users[0])
    for node in drop:
        graph.node.remove(node)
    return len(drop)


def rewrite(source: Path, out: Path, peaks: dict[str, float]) -> Path:
    import onnx

    model = onnx.load(str(source))
    qr.upgrade_opset(model)
    StaticScales(model.graph, peaks).rewrite()
    fold_bias(model.graph)
    if not any(op.domain == qr.MS_DOMAIN for op in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(qr.MS_DOMAIN, 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


def calibration_batches(bundle: Path, data: Path, count: int) -> list[dict[str, np.ndarray]]:
    """SST-2 training sentences (the recipe's training side, never its validation slice), one per batch."""
    from benchmarks.finetune import recipes
    from processing.padding import pad_batch
    from processing.tokenizer import TextTokenizer
    from train.splits import split_examples
    from train.train import run_options

    train, _ = split_examples(run_options(recipes(data)["sst2"]["data"]).data)
    tokenizer = TextTokenizer.from_dir(bundle)
    picked = np.random.default_rng(0).choice(len(train), size=min(count, len(train)), replace=False)
    return [pad_batch([tokenizer.encode(train[i].text, max_length=128)]) for i in picked]


def candidates(bundle: Path, work: Path, calibration: list[dict[str, np.ndarray]]) -> tuple[list, dict]:
    """The bundle's fused (accuracy reference), int8 and int8-rowwise, and `static per-tensor`."""
    from types import SimpleNamespace

    from export import optimize
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    out = [
        Candidate(v, bundle / manifest.variants[v].file, manifest.variants[v].disabled_optimizers)
        for v in ("fused", "int8", "int8-rowwise")
    ]
    work.mkdir(parents=True, exist_ok=True)
    source = work / "int8_source.onnx"
    if not source.exists():
        fp32 = bundle / manifest.variants["fp32"].file
        optimize.fuse(fp32, source, SimpleNamespace(**manifest.model), skip_layer_norm=False)
    disabled = list(optimize.CPU_DISABLED_OPTIMIZERS)
    peaks = {k: float(v.max()) for k, v in qr.channel_peaks(source, calibration, disabled).items()}
    out.append(Candidate("static per-tensor", rewrite(source, work / "static.onnx", peaks), disabled))
    return out, {"static per-tensor": {"calibration_sentences": len(calibration)}}


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1000, 30000, (batch, seq))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def run(session, batch: dict[str, np.ndarray]) -> np.ndarray:
    return session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})[0]


def latency(cands, shapes, threads: int, rounds: int, block: int) -> list[dict[str, Any]]:
    clock = time.thread_time if threads == 1 else time.process_time
    sessions = {c.name: c.session(threads) for c in cands}
    rows = []
    for batch, seq in shapes:
        x = feeds(batch, seq)
        wall: dict[str, list[float]] = collections.defaultdict(list)
        cpu: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(rounds if batch == 1 else max(3, rounds // 3)):
            for name, session in sessions.items():
                run(session, x)  # untimed: the previous candidate's threads are asleep again
                for _ in range(block if batch == 1 else max(1, block // 4)):
                    c0, w0 = clock(), time.perf_counter()
                    run(session, x)
                    wall[name].append(time.perf_counter() - w0)
                    cpu[name].append(clock() - c0)
        for name in sessions:
            ms = {"wall_ms": statistics.median(wall[name]), "cpu_ms": statistics.median(cpu[name])}
            ms = {k: 1e3 * v for k, v in ms.items()} | {"runs": len(cpu[name])}
            rows.append({"candidate": name, "threads": threads, "shape": [batch, seq], **ms})
            print(f"  {threads}t ({batch},{seq}) {name}: {json.dumps(rows[-1])}", flush=True)
    return rows


def invariance(session, encoded: list, sizes=range(1, 34)) -> dict[str, Any]:
    """Worst |difference| of each row alone against the same row inside right-padded batches of
    `sizes` rows (odd sizes padded 16 tokens past their longest row)."""
    from processing.padding import pad_batch

    alone = [run(session, pad_batch([e]))[0] for e in encoded]
    worst, rows = 0.0, 0
    for size in sizes:
        batch = pad_batch(encoded[:size])
        if size % 2:
            batch = {k: np.pad(v, ((0, 0), (0, 16))) for k, v in batch.items()}
        out = run(session, batch)
        worst = max(worst, max(float(np.abs(out[i] - alone[i]).max()) for i in range(size)))
        rows += size
    return {"max_abs_diff": worst, "rows": rows, "sizes": [min(sizes), max(sizes)], "invariant": not worst}


def logits(session, encoded: list, size: int) -> np.ndarray:
    from processing.padding import pad_batch

    return np.concatenate([run(session, pad_batch(encoded[i:][:size])) for i in range(0, len(encoded), size)])


def quality(cands, bundle: Path, data: Path, quick: bool) -> dict[str, Any]:
    from benchmarks.finetune import recipes
    from processing.tokenizer import TextTokenizer
    from train.evaluate import select_examples

    _, examples = select_examples(recipes(data)["sst2"]["data"])
    examples = examples[:64] if quick else examples
    tokenizer = TextTokenizer.from_dir(bundle)
    encoded = [tokenizer.encode(e.text, max_length=128) for e in examples]
    labels = np.array([int(e.label) for e in examples])
    out: dict[str, Any] = {"examples": len(examples)}
    reference = None
    for c in cands:
        session = c.session(1)
        line: dict[str, Any] = {"invariance": invariance(session, encoded[:33])}
        batched = logits(session, encoded, 32)
        reference = batched if reference is None else reference  # the first candidate: fused fp32
        line["accuracy_batched"] = float((batched.argmax(1) == labels).mean())
        single = batched if line["invariance"]["invariant"] else logits(session, encoded, 1)
        line["accuracy_single"] = float((single.argmax(1) == labels).mean())
        agree = float((batched.argmax(1) == reference.argmax(1)).mean())
        diff = np.abs(batched - reference).astype(float)  # float64: JSON takes it
        line["logits_vs_fp32"] = {"max_abs": diff.max(), "mean_abs": diff.mean(), "decisions_agree": agree}
        out[c.name] = line
        print(f"  {c.name}: {json.dumps(line)}", flush=True)
    return out


def profile(c, batch: int, seq: int, runs: int) -> dict[str, float]:
    """us per run by operator type, one thread: each node's fastest run, summed."""
    import onnxruntime as ort

    from export.int8_precision import exact_int8

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.enable_profiling = 1, True
    options.profile_file_prefix = str(common.WORK / "cpu_int8_profile")
    exact_int8(options)
    cpu = ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(c.path), options, cpu, disabled_optimizers=c.disabled)
    x = feeds(batch, seq)
    for _ in range(runs):
        run(session, x)
    path = session.end_profiling()
    best: dict[str, tuple[str, float]] = {}
    for e in json.loads(Path(path).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            best[e["name"]] = (op, min(best.get(e["name"], (op, float("inf")))[1], e["dur"]))
    os.remove(path)
    by_op: collections.Counter = collections.Counter()
    for op, us in best.values():
        by_op[op] += us
    return dict(by_op.most_common())


def ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    base = {(r["threads"], tuple(r["shape"])): r for r in report["latency"] if r["candidate"] == "int8"}
    out = []
    for r in report["latency"]:
        b = base.get((r["threads"], tuple(r["shape"])))
        if b and r["candidate"] not in ("int8", "fused"):
            cpu, wall = r["cpu_ms"] / b["cpu_ms"], r["wall_ms"] / b["wall_ms"]
            out.append({**r, "cpu_ratio": round(cpu, 3), "wall_ratio": round(wall, 3), "met": cpu <= TARGET})
    return out


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def markdown(report: dict[str, Any]) -> str:
    q, load, latency = report["quality"], report["load_average"], report["latency"]
    base = {(r["threads"], tuple(r["shape"])): r["cpu_ms"] for r in latency if r["candidate"] == INT8}
    speed = [
        [r["candidate"], r["threads"], tuple(r["shape"]), f"{base[(r['threads'], tuple(r['shape']))]:.2f}"]
        + [f"{r['cpu_ms']:.2f}", f"{r['cpu_ratio']:.3f}×", f"{r['wall_ms']:.2f}", f"{r['wall_ratio']:.3f}×"]
        + ["yes" if r["met"] else "no"]
        for r in report["ratios"]
    ]
    quality = [
        [name, f"{v['invariance']['max_abs_diff']:.3g}", f"{v['accuracy_batched']:.4f}"]
        + [f"{v['accuracy_single']:.4f}", f"{v['logits_vs_fp32']['max_abs']:.3f}"]
        + [f"{v['logits_vs_fp32']['mean_abs']:.4f}", f"{v['logits_vs_fp32']['decisions_agree']:.4f}"]
        for name, v in q.items()
        if isinstance(v, dict)
    ]
    lines = [
        "# The batch-invariant INT8 path against dynamic INT8 (MiniLM classify default)",
        f"\nGenerated {report['created_at']} by `{report['command']}`.\n",
        f"- Machine: {common.machine_line(report['machine'])}",
        f"- Load average at start / end: {load['start']} / {load['end']} (other work shares these cores)",
        f"\n## Ratio to `int8` (ORT dynamic): target ≤ {TARGET}× in CPU time\n",
        "CPU time per run: one thread, the calling thread's (ORT computes there); two threads, the "
        "process's. Wall: medians of the same alternating blocks.\n",
        *table("candidate,threads,shape,int8 CPU ms,CPU ms,ratio,wall ms,wall ratio,met".split(","), speed),
        "\n## Batch invariance and SST-2 validation accuracy\n",
        f"Invariance: the first 33 of {q['examples']} validation sentences, each alone against inside "
        "right-padded batches of 1..33 rows (odd sizes 16 tokens past their longest row). Logits: "
        "against `fused` fp32, batched by 32.\n",
        *table(
            "candidate,alone vs batched max diff,accuracy (32),one at a time,logits vs fp32 max,mean,"
            "decisions as fp32".split(","),
            quality,
        ),
    ]
    for shape, prof in report["profiles"].items():
        ops = sorted(set().union(*prof.values()), key=lambda o: -max(p.get(o, 0) for p in prof.values()))
        rows = [["**all**", *(f"{sum(p.values()):.0f}" for p in prof.values())]]
        rows += [[op, *(f"{p.get(op, 0):.0f}" for p in prof.values())] for op in ops]
        lines += [f"\n## Operator time, one thread, {shape} (µs per run, each node's fastest run)\n"]
        lines += table(["operator", *prof], rows)
    return "\n".join([*lines, "", f"Notes: {json.dumps(report['notes'])}"])


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    rows = report["ratios"]
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    groups = [(t, s) for t in THREADS for s in SHAPES]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        v = {(r["threads"], tuple(r["shape"])): r["cpu_ratio"] for r in rows if r["candidate"] == name}
        ax.bar([g + i * width for g in range(len(groups))], [v.get(g, 0) for g in groups], width, label=name)
    ax.axhline(TARGET, color="red", linestyle="--", linewidth=0.8, label=f"target {TARGET}×")
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{t}t {s}" for t, s in groups])
    ax.set(ylabel="CPU time / dynamic INT8", title=common.cpu_label(report["machine"]))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=common.default_bundle("classify"))
    parser.add_argument("--data", type=Path, default=common.ROOT.parent / "shared" / "data")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.block = 2, 2
    work = common.WORK / "cpu_int8"
    start = list(os.getloadavg())
    calibration = calibration_batches(args.bundle, args.data, 16 if args.quick else 256)
    cands, notes = candidates(args.bundle, work, calibration)
    timed = [c for c in cands if c.name != "fused"]
    command = " ".join(["python -m benchmarks.cpu_int8", *argv])
    report: dict[str, Any] = {"created_at": common.now(), "command": command}
    report["machine"] = common.machine_info()
    report["notes"] = notes
    print("quality", flush=True)
    report["quality"] = quality(cands, args.bundle, args.data, args.quick)
    report["latency"] = [r for t in THREADS for r in latency(timed, SHAPES, t, args.rounds, args.block)]
    report["ratios"] = ratios(report)
    runs = {(1, 128): 3 if args.quick else 30, (32, 128): 1 if args.quick else 3}
    report["profiles"] = {
        f"({b},{s})": {c.name: profile(c, b, s, runs[(b, s)]) for c in timed[:3]} for b, s in SHAPES
    }
    report["load_average"] = {"start": start, "end": list(os.getloadavg())}
    stem = "cpu_int8_quick" if args.quick else "cpu_int8"
    common.write_results(common.RESULTS, stem, report, markdown(report), lambda p: plot(report, p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
