"""The batch-invariant INT8 variants against ORT's dynamic INT8 and fp32, side by side in one run
(`python -m benchmarks.cpu_int8 [--quick]`, on .cache/bundles/sst2-minilm); what it measures:
benchmarks/README.md. Every variant opens as the service opens it on this CPU (the exact widening
kernel where it needs one), and the report names the CPU, its INT8 kernel class and the variant the
service's rule serves on it. Writes benchmarks/results/cpu_int8{,_quick}.* (`--name` changes the stem:
`--name cpu_int8_avx2` on an AVX2-only host).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.registry import session_tuning
from app.engine.runtime import create_runtime
from app.settings import Settings
from benchmarks import bench_common as common
from benchmarks.cpu_mask import MASKED_MARK
from export.int8_precision import cpu_flags

TARGET = 1.05  # issue 30: the invariant path <= 1.05x dynamic INT8 at (1,128) and (32,128)
# Issue 44, for an AVX2-only CPU: the served variant at (32, L) >= 1.2x fp32's throughput and >= dynamic
# INT8's (exact flag included), at (1, L) <= 0.85x fp32's latency (wall time, two threads).
BATCH_VS_FP32, BATCH_VS_INT8, SINGLE_VS_FP32 = 1.2, 1.0, 0.85
LENGTHS, THREADS = (43, 128), (1, 2)  # 43: the issue's SST-2 text; 128: issue 30's shapes
INT8, FP32 = "int8", "fused"
VARIANTS = (FP32, INT8, "int8-rowwise", "int8-rowwise-avx2")


class Candidate:
    """A variant of the bundle, opened as the service opens it."""

    def __init__(self, bundle: Path, name: str):
        from export.bundle import load_bundle_manifest

        variant = load_bundle_manifest(bundle).variants[name]
        self.name, self.path = name, bundle / variant.file
        self.disabled = list(variant.disabled_optimizers or [])

    def session(self, threads: int):
        """As the service opens its solo session (app/engine/runtime.py): its threads spin inside a
        run, never after it. Left spinning, one candidate's threads held the cores through the next
        one's first 4-5 runs and doubled their time (docs/performance.md, section 7)."""
        tuning = session_tuning(Settings(), 1).solo()  # the server's ORT_* settings, as its solo session
        return create_runtime(
            self.path, "cpu", threads, tuning, disabled_optimizers=self.disabled, variant=self.name
        ).session


def candidates(bundle: Path) -> list[Candidate]:
    """`fused` (fp32, the accuracy reference), `int8` and the per-token variants the bundle has."""
    from export.bundle import load_bundle_manifest

    present = load_bundle_manifest(bundle).variants
    return [Candidate(bundle, name) for name in VARIANTS if name in present]


def cpu_class() -> dict[str, Any]:
    """This CPU's INT8 kernel class and what the service serves on it (export/int8_precision.py)."""
    from export.int8_precision import cpu_int8_variant, needs_exact_int8

    served, reason = cpu_int8_variant()
    pairs = needs_exact_int8()
    kernel = (
        "16-bit pair sums (no VNNI/AMX: the AVX2-only class)" if pairs else "32-bit dot products (VNNI/AMX)"
    )
    return {"int8_kernel": kernel, "avx2_class": pairs, "served": served, "reason": reason}


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
                run(session, x)  # untimed: warms this candidate (the last one's threads stopped spinning)
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
    from processing.tokenizer import TextTokenizer
    from train.evaluate import select_examples
    from train.recipes import recipes

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
    common.WORK.mkdir(parents=True, exist_ok=True)  # onnxruntime writes its profile there
    options.profile_file_prefix = str(common.WORK / "cpu_int8_profile")
    exact_int8(options, variant=c.name)
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
    base = {(r["threads"], tuple(r["shape"])): r for r in report["latency"] if r["candidate"] == INT8}
    out = []
    for r in report["latency"]:
        b = base.get((r["threads"], tuple(r["shape"])))
        if b and r["candidate"] not in (INT8, FP32):
            cpu, wall = r["cpu_ms"] / b["cpu_ms"], r["wall_ms"] / b["wall_ms"]
            out.append({**r, "cpu_ratio": round(cpu, 3), "wall_ratio": round(wall, 3), "met": cpu <= TARGET})
    return out


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 44's targets for every per-token variant, two threads, wall time: throughput at (32, L)
    against fp32 and dynamic INT8, latency at (1, L) against fp32. Binding on an AVX2-only CPU only."""
    wall = {(r["candidate"], r["threads"], tuple(r["shape"])): r["wall_ms"] for r in report["latency"]}
    out = []
    for (name, threads, (batch, seq)), ms in sorted(wall.items()):
        fp32, int8 = wall.get((FP32, threads, (batch, seq))), wall.get((INT8, threads, (batch, seq)))
        if threads != 2 or name in (FP32, INT8) or fp32 is None or int8 is None:
            continue
        line = {"candidate": name, "shape": [batch, seq], "vs_fp32": round(fp32 / ms, 3)}
        line["vs_int8"] = round(int8 / ms, 3)
        if batch == 1:
            line["met"] = ms / fp32 <= SINGLE_VS_FP32
        else:
            line["met"] = fp32 / ms >= BATCH_VS_FP32 and int8 / ms >= BATCH_VS_INT8
        out.append(line)
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
    cls = report["cpu_class"]
    fp32 = {(r["threads"], tuple(r["shape"])): r for r in latency if r["candidate"] == FP32}
    goals = [
        [t["candidate"], tuple(t["shape"]), f"{t['vs_fp32']:.3f}×", f"{t['vs_int8']:.3f}×"]
        + ["yes" if t["met"] else "no"]
        for t in report["targets"]
    ]
    binding = (
        "This CPU's CPUID was masked (`benchmarks.cpu_mask`, the model name says to what): onnxruntime "
        "ran that CPU's kernels natively, on another CPU's cores and caches. Not an AVX2-only host's rows."
        if MASKED_MARK in report["machine"].get("cpu", "")
        else "This CPU is of the AVX2-only class: these rows are the issue's AVX2 rows."
        if cls["avx2_class"]
        else "This CPU has 32-bit INT8 dot products, **not** the AVX2-only class: these rows are this CPU's, "
        "not AVX2 rows (on it both per-token variants run the same fast kernel)."
    )
    lines = [
        "# The batch-invariant INT8 variants against dynamic INT8 and fp32 (MiniLM classify default)",
        f"\nGenerated {report['created_at']} by `{report['command']}`.\n",
        f"- Machine: {common.machine_line(report['machine'])}",
        f"- CPU flags (lscpu): {' '.join(report['machine'].get('flags', [])) or 'unknown'}",
        f"- INT8 kernel: {cls['int8_kernel']}; the service serves `{cls['served']}` here ({cls['reason']})",
        f"- Load average at start / end: {load['start']} / {load['end']} (other work shares these cores)",
        "\n## Issue 44's targets: the per-token variants against fp32 and dynamic INT8, two threads, wall\n",
        f"{binding} Targets: at (32, L) ≥ {BATCH_VS_FP32}× fp32's throughput and ≥ {BATCH_VS_INT8}× dynamic "
        f"INT8's; at (1, L) ≤ {SINGLE_VS_FP32}× fp32's latency (\"vs\": the other's time / this one's).\n",
        *table("candidate,shape,vs fp32,vs dynamic INT8,met".split(","), goals),
        "\nfp32 (`fused`) wall ms, two threads: "
        + ", ".join(f"{k[1]} {v['wall_ms']:.2f}" for k, v in sorted(fp32.items()) if k[0] == 2),
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
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    rows = report["ratios"]
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    groups = sorted({(r["threads"], tuple(r["shape"])) for r in rows})
    fig, ax = common.pyplot().subplots(figsize=(9, 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        v = {(r["threads"], tuple(r["shape"])): r["cpu_ratio"] for r in rows if r["candidate"] == name}
        ax.bar([g + i * width for g in range(len(groups))], [v.get(g, 0) for g in groups], width, label=name)
    ax.axhline(TARGET, color="red", linestyle="--", linewidth=0.8, label=f"target {TARGET}×")
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{t}t {s}" for t, s in groups])
    ax.set(ylabel="CPU time / dynamic INT8", title=common.cpu_label(report["machine"]))
    ax.legend(fontsize=7)
    common.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=common.default_bundle("classify"))
    parser.add_argument("--data", type=Path, default=common.ROOT.parent / "shared" / "data")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="sequence lengths L")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default=None, help="results stem (default cpu_int8, cpu_int8_quick)")
    parser.add_argument("--out", type=Path, default=common.RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.block = 2, 2
    lengths = [int(n) for n in args.lengths.split(",")]
    shapes = [(batch, seq) for seq in lengths for batch in (1, 32)]
    start = list(os.getloadavg())
    cands = candidates(args.bundle)
    report: dict[str, Any] = {"created_at": common.now(), "command": common.command("cpu_int8", argv)}
    report["machine"] = common.machine_info() | {"flags": sorted(cpu_flags())}
    report["cpu_class"] = cpu_class()
    print(json.dumps(report["cpu_class"]), flush=True)
    print("quality", flush=True)
    report["quality"] = quality(cands, args.bundle, args.data, args.quick)
    report["latency"] = [r for t in THREADS for r in latency(cands, shapes, t, args.rounds, args.block)]
    report["ratios"], report["targets"] = ratios(report), targets(report)
    runs = {1: 3 if args.quick else 30, 32: 1 if args.quick else 3}
    timed = [c for c in cands if c.name != FP32]
    report["profiles"] = {
        f"({b},{s})": {c.name: profile(c, b, s, runs[b]) for c in timed}
        for b, s in shapes
        if s == max(lengths)
    }
    report["load_average"] = {"start": start, "end": list(os.getloadavg())}
    stem = args.name or ("cpu_int8_quick" if args.quick else "cpu_int8")
    common.write_results(args.out, stem, report, markdown(report), lambda p: plot(report, p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
