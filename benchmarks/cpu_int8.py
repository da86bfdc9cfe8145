"""CPU inference candidates side by side, in one run: speed, batch invariance, accuracy, profile.

    python -m benchmarks.cpu_int8                 # .cache/bundles/sst2-minilm, full run
    python -m benchmarks.cpu_int8 --quick         # smoke run

Candidates, all on the classify default's weights:
- `fused`: fp32 ONNX Runtime with the transformer fusions (the fp32 reference);
- `int8`: ORT dynamic quantization, one activation scale per tensor over the whole batch (what
  the service served before `int8-rowwise`; now the opt-in `CPU_VARIANT=int8`);
- `int8-rowwise`: per-token activation scales (export/quantize_rowwise.py), the default, and its
  rewrite with each of quantize_rowwise.STAGES alone (`rowwise stages: ...`; `none` is the first
  rewrite), so each change is timed by itself against dynamic INT8 in the same rounds;
- `qdq-static-u8`: ORT static quantization, QDQ MatMuls with u8 activations and per-channel s8
  weights, MinMax-calibrated on SST-2 training sentences (none from the validation slice);
- the OpenVINO execution provider on the fp32 graph (f32 and bf16 precision hints) and the QDQ
  graph, with `--openvino-python` (an interpreter with `onnxruntime-openvino`, which cannot share
  a venv with the service's onnxruntime; benchmarks/openvino_worker.py, run in the same
  benchmark after the others); a session that fell back to the CPU EP, or whose decisions
  disagree with fp32 on the probe sentences, is reported instead of timed.

Latency: median ms over full-length random rows at (1, 128), (1, 384) and (32, 128), 1 and 2
threads, candidates timed in rounds of blocks (8 consecutive runs of one candidate after an
untimed one, so no other session's spinning threads share the cores) so that a busy machine
slows them alike (compare ratios); at one thread also the calling thread's CPU time (ORT runs a
one-thread session on it), which time slices lost to other processes do not inflate;
BERT-base shape with random weights at (1, 128). Invariance: SST-2 validation sentences of
different lengths, each alone against inside one padded batch. Accuracy: SST-2 validation
accuracy batched (32) and one sentence at a time (benchmarks/int8_accuracy.py has all four tasks
for the bundle variants). Profile: ONNX Runtime's per-operator profile (each node's fastest run,
summed by operator) of `int8` and `int8-rowwise` at (1, 128) and (32, 128), one thread: where the
rowwise path spends what dynamic INT8 does not; the FLOP floor is benchmarks/scaling.py's.
Writes benchmarks/results/cpu_int8{,_quick}.{json,md,png}.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_common as common
from benchmarks import scaling
from benchmarks.cpu_candidates import Candidate, bert_base, candidates, openvino, probe
from export.int8_precision import exact_int8
from export.invariance import batch_invariance
from export.verify import run_session

SHAPES = ((1, 128), (1, 384), (32, 128))
TARGET_RATIO = 1.05  # issue 30: int8-rowwise <= 1.05x dynamic INT8 at (1,128) and (32,128)
RATIO_SHAPES = ((1, 128), (32, 128))
QUICK_SHAPES = ((1, 128), (4, 64))
THREADS = (1, 2)


def stage_candidates(bundle: Path, work: Path) -> tuple[list[Candidate], dict[str, Any]]:
    """The classify default's int8-rowwise rewrite with each of quantize_rowwise.STAGES alone and with
    none (the first rewrite), from the graph the bundle's int8 variants start from."""
    from types import SimpleNamespace

    from export import optimize, quantize_rowwise
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    source = work / "rowwise_source.onnx"
    if not source.exists():
        fp32 = bundle / manifest.variants["fp32"].file
        optimize.fuse(fp32, source, SimpleNamespace(**manifest.model), skip_layer_norm=False)
    served = manifest.quantization.get("int8-rowwise", {}).get("stages")
    notes = {"served_stages": served, "all_stages": sorted(quantize_rowwise.STAGES)}
    if served != sorted(quantize_rowwise.STAGES):
        notes["warning"] = "the bundle's int8-rowwise predates these stages: rebuild it (make models)"
    out = []
    for stages in [frozenset(), *(frozenset({s}) for s in sorted(quantize_rowwise.STAGES))]:
        name = "rowwise stages: " + (", ".join(sorted(stages)) or "none")
        path = work / f"rowwise_{'_'.join(sorted(stages)) or 'none'}.onnx"
        quantize_rowwise.quantize_rowwise(source, path, stages=stages)
        out.append(Candidate(name, path, list(optimize.CPU_DISABLED_OPTIMIZERS)))
    return out, notes


def checked_sessions(cands: list[Candidate], threads: int, reference: dict) -> dict[str, Any]:
    """Sessions whose logits agree with fp32 on a probe (a silent fallback or a broken provider
    path must not be timed as if it worked)."""
    sessions, errors = {}, {}
    for c in cands:
        try:
            session = c.session(threads)
            got = run_session(session, reference["feeds"])["logits"]
            agree = float((got.argmax(-1) == reference["logits"].argmax(-1)).mean())
            if agree < 0.9 or not np.isfinite(got).all():
                raise RuntimeError(f"only {agree:.0%} of fp32's decisions on the probe sentences")
            sessions[c.name] = session
        except Exception as e:  # noqa: BLE001 - a failing candidate is reported, not fatal
            errors[c.name] = f"{type(e).__name__}: {str(e)[:300]}"
    return {"sessions": sessions, "errors": errors}


BLOCK = 8  # consecutive runs of one candidate per round
BIG_BLOCK = 2  # the same for shapes past BIG_TOKENS tokens, whose runs are long enough alone
BIG_TOKENS = 512


def timed_block(session, feeds: dict[str, np.ndarray], runs: int) -> list[tuple[float, float]]:
    """(wall, calling thread's CPU) seconds of `runs` consecutive runs, after one untimed run. One
    candidate at a time: the threads of the session that ran before (ORT's intra-op threads spin
    after a run) have gone idle by the time the timed runs start, and this session's own pool is
    hot, as in a server."""
    session.run(None, feeds)
    seconds = []
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.thread_time()
        session.run(None, feeds)
        seconds.append((time.perf_counter() - started, time.thread_time() - cpu))
    return seconds


def latency(
    cands: list[Candidate], shapes, threads_list, runs: int, budget_s: float, reference, vocab: int = 30522
) -> list[dict]:
    rows = []
    for threads in threads_list:
        checked = checked_sessions(cands, threads, reference)
        for name, error in checked["errors"].items():
            rows.append({"candidate": name, "threads": threads, "error": error})
        sessions = checked["sessions"]
        for batch, seq in shapes if sessions else ():
            feeds = scaling.feeds(batch, seq, vocab)
            for session in sessions.values():
                session.run(None, feeds)  # warm-up
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in sessions}
            deadline = time.perf_counter() + budget_s
            while min(len(t) for t in times.values()) < runs and (
                min(len(t) for t in times.values()) < 3 or time.perf_counter() < deadline
            ):
                for name, session in sessions.items():  # rounds of blocks: load changes hit all alike
                    times[name] += timed_block(
                        session, feeds, BLOCK if batch * seq <= BIG_TOKENS else BIG_BLOCK
                    )
            for name, t in times.items():
                rows.append(
                    {
                        "candidate": name,
                        "threads": threads,
                        "batch": batch,
                        "seq": seq,
                        "median_ms": round(statistics.median(w for w, _ in t) * 1e3, 3),
                        "runs": len(t),
                    }
                )
                if threads == 1:  # the session computes on the calling thread: its CPU time is the work
                    rows[-1]["cpu_median_ms"] = round(statistics.median(c for _, c in t) * 1e3, 3)
                print(
                    f"  {name:16s} threads {threads} ({batch},{seq}): {rows[-1]['median_ms']} ms", flush=True
                )
    return rows


def invariance_and_accuracy(cands: list[Candidate], bundle: Path, data: Path, quick: bool) -> dict[str, Any]:
    from benchmarks.finetune import recipes
    from processing.padding import pad_batch
    from processing.tokenizer import TextTokenizer
    from train.evaluate import evaluate_bundle, select_examples

    out: dict[str, Any] = {}
    if not data.exists():
        return {"skipped": f"{data} is absent"}
    recipe = recipes(data)["sst2"]
    task, examples = select_examples(recipe["data"])
    tokenizer = TextTokenizer.from_dir(bundle)
    by_length = sorted(examples[:400], key=lambda e: len(e.text))
    mixed = [by_length[i] for i in np.linspace(0, len(by_length) - 1, 12).astype(int)]
    batch = pad_batch([tokenizer.encode(e.text, max_length=64) for e in mixed])
    if quick:
        examples = examples[:64]
    for c in cands:
        try:
            session = c.session(2)
        except Exception as e:  # noqa: BLE001
            out[c.name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        line = {"invariance": batch_invariance("classify", lambda f, s=session: run_session(s, f), [batch])}
        # A row of an invariant graph answers alike alone and batched: one pass scores both.
        modes = (("batched", 32),) if line["invariance"]["invariant"] else (("batched", 32), ("single", 1))
        for mode, size in modes:
            metrics = evaluate_bundle(
                bundle,
                "fp32",
                task,
                examples,
                recipe["data"],
                label_names=recipe.get("label_names"),
                eval_batch_size=size,
                onnx_file=c.path,
                disabled_optimizers=c.disabled,
            )
            line[mode] = metrics["accuracy"]
        line.setdefault("single", line["batched"])
        out[c.name] = line
        print(f"  {c.name}: {json.dumps(line)}", flush=True)
    out["examples"] = len(examples)
    out["invariance_batch_lengths"] = batch["attention_mask"].sum(1).tolist()
    return out


def profile(c: Candidate, batch: int, seq: int, runs: int, vocab: int = 30522) -> dict[str, Any]:
    """ONNX Runtime's per-node profile, one thread: each node's fastest of `runs` runs, summed by
    operator type (us per run; the fastest run is the one other processes disturbed least)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    exact_int8(options)  # the kernels the service runs
    options.log_severity_level = 3
    extra = {"disabled_optimizers": c.disabled} if c.disabled else {}
    session = ort.InferenceSession(str(c.path), options, providers=["CPUExecutionProvider"], **extra)
    feeds = scaling.feeds(batch, seq, vocab)
    for _ in range(runs):
        session.run(None, feeds)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    fastest: dict[str, float] = {}
    op_of: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            fastest[e["name"]] = min(fastest.get(e["name"], float("inf")), e["dur"])
            op_of[e["name"]] = e["args"]["op_name"]
    per_op: dict[str, float] = collections.defaultdict(float)
    nodes: collections.Counter = collections.Counter()
    for name, us in fastest.items():
        per_op[op_of[name]] += us
        nodes[op_of[name]] += 1
    total = sum(per_op.values())
    return {
        "candidate": c.name,
        "shape": [batch, seq],
        "threads": 1,
        "runs": runs,
        "total_node_us": round(total, 1),
        "by_op": {
            op: {"us": round(us, 1), "share": round(us / total, 4), "nodes": nodes[op]}
            for op, us in sorted(per_op.items(), key=lambda kv: -kv[1])
        },
    }


def floor_ms(flops_args: dict[str, int], peak: dict[str, float], batch: int, seq: int) -> dict[str, float]:
    flops = scaling.bert_flops(seq, batch=batch, **flops_args)
    return {
        "fp32_ms": round(scaling.floor_seconds(flops, "fp32", peak) * 1e3, 3),
        "int8_ms": round(scaling.floor_seconds(flops, "int8", peak) * 1e3, 3),
    }


TARGET_MS = {1: 4.5, 2: 2.5}  # MiniLM (1,128): issue 20's single-thread and two-thread targets


def targets(report: dict[str, Any], chosen: str, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Each (1,128) target against what was measured and what this CPU allows: the weight matmuls at
    the int8 peak ORT's MatMulInteger reaches on their shapes, and the chosen path's other operators
    alone (their share of the one-thread profile times the measured latency at that thread count;
    the profile's own timings carry profiling overhead, its shares much less)."""
    by_op = report["profile"]["by_op"]
    other_share = 1.0 - sum(r["share"] for op, r in by_op.items() if op.startswith("MatMulInteger"))
    rows = []
    for threads, target in TARGET_MS.items():
        timed = {
            r["candidate"]: r["median_ms"]
            for r in report["latency"]
            if r.get("threads") == threads
            and (r.get("batch"), r.get("seq")) == (1, 128)
            and not r["candidate"].startswith("bert-base")
        }
        floor = floor_ms(sizes, report["peaks"][str(threads)]["peak_gflops"], 1, 128)["int8_ms"]
        best = min(timed, key=timed.__getitem__) if timed else None
        chosen_ms = timed.get(chosen)
        rows.append(
            {
                "threads": threads,
                "target_ms": target,
                "chosen": chosen,
                "chosen_ms": chosen_ms,
                "fastest": best,
                "fastest_ms": timed.get(best) if best else None,
                "matmul_floor_ms": floor,
                "other_ops_share": round(other_share, 3),
                "other_ops_ms": None if chosen_ms is None else round(chosen_ms * other_share, 3),
                "met": chosen_ms is not None and chosen_ms <= target,
            }
        )
    return rows


def ratio_targets(report: dict[str, Any], chosen: str = "int8-rowwise") -> list[dict[str, Any]]:
    """`chosen` against dynamic INT8 at RATIO_SHAPES for each thread count: wall-clock medians, and
    at one thread the calling thread's CPU time too, which decides `met` there."""
    by = {
        (r["candidate"], r["threads"], r["batch"], r["seq"]): r for r in report["latency"] if "median_ms" in r
    }
    rows = []
    for threads in sorted({key[1] for key in by}):
        for batch, seq in RATIO_SHAPES:
            base, got = by.get(("int8", threads, batch, seq)), by.get((chosen, threads, batch, seq))
            if base is None or got is None:
                continue
            row = {"threads": threads, "shape": [batch, seq], "int8_ms": base["median_ms"]}
            row |= {"chosen_ms": got["median_ms"], "ratio": round(got["median_ms"] / base["median_ms"], 3)}
            if "cpu_median_ms" in got and "cpu_median_ms" in base:
                row["cpu_ratio"] = round(got["cpu_median_ms"] / base["cpu_median_ms"], 3)
            # Judged on CPU time where there is one: other processes' time slices are not the kernel's.
            row["met"] = row.get("cpu_ratio", row["ratio"]) <= TARGET_RATIO
            rows.append(row)
    return rows


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        "# CPU inference candidates (MiniLM classify default)",
        "",
        f"Generated {report['created_at']} by `{s['command']}`.",
        "",
        f"- Machine: {common.machine_line(report['machine'])}",
        f"- Load average at start / end: {report['load_average']['start']} / {report['load_average']['end']} "
        "(a load above 0 is other work sharing the cores: compare ratios within this run)",
        f"- Candidates timed in rounds of blocks of {BLOCK} consecutive runs ({BIG_BLOCK} past {BIG_TOKENS} "
        "tokens; after an untimed one), "
        "medians of full-length random rows.",
        "",
        "## Latency (median ms) and ratio to `int8` (ORT dynamic)",
        "",
    ]
    rows = [r for r in report["latency"] if "median_ms" in r]
    shapes = sorted({(r["batch"], r["seq"]) for r in rows})
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    header = "| candidate | threads | " + " | ".join(f"({b},{q})" for b, q in shapes) + " |"
    lines += [header, "|---|---:|" + "---:|" * len(shapes)]
    for threads in sorted({r["threads"] for r in rows}):
        by = {(r["candidate"], r["batch"], r["seq"]): r["median_ms"] for r in rows if r["threads"] == threads}
        for name in names:
            cells = []
            for b, q in shapes:
                ms, base = by.get((name, b, q)), by.get(("int8", b, q)) or by.get(("bert-base int8", b, q))
                ref = by.get(("bert-base int8", b, q)) if name.startswith("bert-base") else base
                cells.append("—" if ms is None else f"{ms:.2f}" + (f" ({ms / ref:.2f}×)" if ref else ""))
            if any(c != "—" for c in cells):
                lines.append(f"| {name} | {threads} | " + " | ".join(cells) + " |")
    for r in report["latency"]:
        if "error" in r:
            lines.append(f"\n- {r['candidate']} ({r['threads']} threads) not timed: {r['error']}")
    cpu = {(r["candidate"], r["batch"], r["seq"]): r["cpu_median_ms"] for r in rows if "cpu_median_ms" in r}
    if cpu:
        lines += [
            "",
            "## One thread: the calling thread's CPU time (median ms) and ratio to `int8`",
            "",
            "ORT computes a one-thread session on the calling thread, so this leaves out the time"
            " slices other processes took (the wall-clock medians above include them).",
            "",
            "| candidate | " + " | ".join(f"({b},{q})" for b, q in shapes) + " |",
            "|---|" + "---:|" * len(shapes),
        ]
        for name in names:
            cells = []
            for b, q in shapes:
                ms, base = cpu.get((name, b, q)), cpu.get(("int8", b, q))
                if name.startswith("bert-base"):
                    base = cpu.get(("bert-base int8", b, q))
                cells.append("—" if ms is None else f"{ms:.2f}" + (f" ({ms / base:.2f}×)" if base else ""))
            if any(c != "—" for c in cells):
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## Target: `int8-rowwise` ≤ {TARGET_RATIO}× dynamic INT8",
        "",
        "| threads | shape | int8 ms | int8-rowwise ms | ratio (wall) | ratio (CPU time) "
        "| met (CPU time, else wall) |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for t in report.get("ratio_targets", []):
        shape = f"({t['shape'][0]},{t['shape'][1]})"
        lines.append(
            f"| {t['threads']} | {shape} | {t['int8_ms']:.2f} | {t['chosen_ms']:.2f} | {t['ratio']:.3f}× | "
            f"{t.get('cpu_ratio', '—')} | {'yes' if t['met'] else 'no'} |"
        )
    acc = report["invariance_and_accuracy"]
    lines += ["", "## Batch invariance and SST-2 validation accuracy", ""]
    if "skipped" in acc:
        lines.append(f"Skipped: {acc['skipped']}")
    else:
        lines += [
            f"Invariance: {len(acc['invariance_batch_lengths'])} validation sentences of lengths "
            f"{acc['invariance_batch_lengths']}, each alone vs inside one padded batch. Accuracy over "
            f"{acc['examples']} validation sentences; one at a time is scored where the invariance check"
            " found rows moving with their batch, and equals batched elsewhere.",
            "",
            "| candidate | row alone vs in batch, max abs diff | accuracy batched (32) | one at a time |",
            "|---|---:|---:|---:|",
        ]
        for name, line in acc.items():
            if not isinstance(line, dict):
                continue
            if "error" in line:
                lines.append(f"| {name} | error: {line['error']} | | |")
                continue
            inv = line["invariance"]["max_abs_diff"]
            cells = ["—" if line.get(m) is None else f"{line[m]:.4f}" for m in ("batched", "single")]
            lines.append(f"| {name} | {inv:.3g} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "## The (1,128) targets against this CPU's limits",
        "",
        "Matmul floor: the weight matmuls at the int8 peak ORT's MatMulInteger reaches on their shapes"
        " here at that thread count (benchmarks/scaling.py). Other ops: the chosen path's non-matmul"
        " operators alone (their share of the one-thread profile below times the measured latency): a"
        " target below them cannot be met by faster matmuls.",
        "",
        "| threads | target | chosen (ms) | fastest (ms) | matmul floor | other ops alone | met |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in report["targets"]:
        lines.append(
            f"| {t['threads']} | ≤ {t['target_ms']} ms | {t['chosen']} {t['chosen_ms']} | "
            f"{t['fastest']} {t['fastest_ms']} | {t['matmul_floor_ms']} ms | "
            f"{t['other_ops_ms']} ms ({t['other_ops_share']:.0%}) | {'yes' if t['met'] else 'no'} |"
        )
    p = report["profile"]
    lines += [
        "",
        f"## Where `{p['candidate']}` spends its time: ({p['shape'][0]},{p['shape'][1]}), one thread",
        "",
        f"ONNX Runtime profile, {p['runs']} runs: {p['total_node_us'] / 1e3:.2f} ms of operator time "
        "per run. "
        f"FLOP floor at this CPU's measured peak (1 thread; {report['peaks']['1']['peak_gflops']}): "
        f"{p['floor']['int8_ms']} ms with the weight matmuls at the int8 peak "
        f"(fp32: {p['floor']['fp32_ms']} ms).",
        "",
        "| operator | µs / run | share | nodes |",
        "|---|---:|---:|---:|",
    ]
    for op, r in p["by_op"].items():
        lines.append(f"| {op} | {r['us']:.0f} | {r['share']:.1%} | {r['nodes']} |")
    profiles = report.get("profiles", {})
    if profiles:
        keys = list(profiles)
        ops = list(dict.fromkeys(op for k in keys for op in profiles[k]["by_op"]))
        lines += [
            "",
            "## Side by side: what each path's operators take, one thread (µs per run, each node's fastest)",
            "",
            "| operator | " + " | ".join(keys) + " |",
            "|---|" + "---:|" * len(keys),
            "| **all nodes** | " + " | ".join(f"**{profiles[k]['total_node_us']:.0f}**" for k in keys) + " |",
        ]
        for op in ops:
            cells = []
            for k in keys:
                r = profiles[k]["by_op"].get(op)
                cells.append("—" if r is None else f"{r['us']:.0f} ({r['nodes']})")
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    ov = report["notes"].get("openvino")
    if isinstance(ov, dict) and "rows" in ov:
        lines += [
            "",
            f"## OpenVINO execution provider (onnxruntime-openvino {ov['onnxruntime']}, own interpreter, "
            "timed after the others: compare its ratios with care)",
            "",
            "| candidate | threads | decisions as fp32 | row alone vs in batch | latency ms by shape |",
            "|---|---:|---:|---:|---|",
        ]
        for r in ov["rows"]:
            if "error" in r:
                lines.append(f"| {r['candidate']} | {r['threads']} | not timed: {r['error']} | | |")
                continue
            ms = ", ".join(f"{k[:-3]}: {v}" for k, v in r.items() if k.endswith("_ms"))
            lines.append(
                f"| {r['candidate']} | {r['threads']} | {r['argmax_agreement']:.1%} | "
                f"{r['invariance_max_abs_diff']:.3g} | {ms} |"
            )
    notes = {k: v for k, v in report["notes"].items() if not (k == "openvino" and isinstance(v, dict))}
    lines += ["", "Notes: " + json.dumps(notes)]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    rows = [r for r in report["latency"] if "median_ms" in r and not r["candidate"].startswith("bert-base")]
    shapes = sorted({(r["batch"], r["seq"]) for r in rows})
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    threads_list = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 4), squeeze=False)
    for ax, (b, q) in zip(axes[0], shapes, strict=True):
        width = 0.8 / max(1, len(threads_list))
        for k, threads in enumerate(threads_list):
            values = [
                next(
                    (
                        r["median_ms"]
                        for r in rows
                        if (r["candidate"], r["threads"], r["batch"], r["seq"]) == (n, threads, b, q)
                    ),
                    np.nan,
                )
                for n in names
            ]
            ax.bar(np.arange(len(names)) + k * width, values, width, label=f"{threads} thread(s)")
        ax.set_xticks(np.arange(len(names)) + width * (len(threads_list) - 1) / 2)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"batch {b} x seq {q}")
        ax.set_ylabel("median ms")
        ax.legend(fontsize=8)
    fig.suptitle("CPU candidates (timed in rounds of blocks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import os

    from export.bundle import load_bundle_manifest

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--bundle", type=Path, default=common.default_bundle("classify"))
    p.add_argument("--data", type=Path, default=common.ROOT.parent / "shared" / "data")
    p.add_argument("--calibration", type=int, default=256, help="SST-2 training sentences to calibrate on")
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--budget-s", type=float, default=25.0, help="time per shape and thread count")
    p.add_argument("--no-bert-base", action="store_true")
    p.add_argument(
        "--openvino-python", help="interpreter with onnxruntime-openvino for the OpenVINO EP candidates"
    )
    p.add_argument("--work-dir", type=Path, default=common.WORK / "cpu_int8")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.budget_s, args.calibration = 5, 2.0, 16
    bundle = common.require_bundle(args.bundle, "classify")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    load_start = [round(x, 2) for x in os.getloadavg()]
    cands, notes = candidates(bundle, args.work_dir, args.data, args.calibration)
    stages, notes["rowwise_stages"] = stage_candidates(bundle, args.work_dir)
    reference = probe(bundle, args.data, cands[0])
    shapes = args.shapes = QUICK_SHAPES if args.quick else SHAPES
    print("latency", flush=True)
    rows = latency(cands + stages, shapes, THREADS, args.runs, args.budget_s, reference)
    if not args.no_bert_base:
        base = bert_base(args.work_dir, args.quick)
        base_reference = {
            "feeds": scaling.feeds(2, 32),
            "logits": run_session(base["fused"].session(1), scaling.feeds(2, 32))["logits"],
        }
        rows += latency(list(base.values()), shapes[:1], THREADS, args.runs, args.budget_s, base_reference)
    print("invariance and accuracy", flush=True)
    quality = invariance_and_accuracy(cands + stages, bundle, args.data, args.quick)
    if args.openvino_python:
        print("OpenVINO execution provider (benchmarks/openvino_worker.py)", flush=True)
        qdq = next((c.path for c in cands if c.name == "qdq-static-u8"), None)
        fp32 = bundle / load_bundle_manifest(bundle).variants["fp32"].file
        notes["openvino"] = openvino(args.openvino_python, fp32, qdq, reference, args.work_dir, args)
    else:
        notes["openvino"] = "not measured: give --openvino-python (an interpreter with onnxruntime-openvino)"
    chosen = next(c for c in cands if c.name == "int8-rowwise")
    matmuls = [(128, 384, 1536), (128, 1536, 384)]
    peaks = {t: scaling.measure_peak(t, matmuls, args.runs, args.budget_s / 4) for t in THREADS}
    prof = profile(chosen, 1, 128, args.runs)
    by_name = {c.name: c for c in cands}
    profiles = {
        f"{name} ({b},{q})": profile(by_name[name], b, q, args.runs if b == 1 else max(3, args.runs // 8))
        for b, q in (RATIO_SHAPES[:1] if args.quick else RATIO_SHAPES)
        for name in ("int8", "int8-rowwise")
    }
    sizes = {"hidden": 384, "layers": 6, "intermediate": 1536}
    prof["floor"] = floor_ms(sizes, peaks[1]["peak_gflops"], 1, 128)
    report = {
        "created_at": common.now(),
        "machine": common.machine_info(),
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "settings": {
            "command": "python -m benchmarks.cpu_int8 "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "bundle": str(bundle.relative_to(common.ROOT))
            if bundle.is_relative_to(common.ROOT)
            else bundle.name,
            "runs": args.runs,
            "budget_s": args.budget_s,
        },
        "notes": notes,
        "latency": rows,
        "invariance_and_accuracy": quality,
        "peaks": {str(t): peak for t, peak in peaks.items()},
        "profile": prof,
        "profiles": profiles,
    }
    report["targets"] = targets(report, chosen.name, sizes)
    report["ratio_targets"] = ratio_targets(report, chosen.name)
    stem = "cpu_int8_quick" if args.quick else "cpu_int8"
    common.write_results(args.out, stem, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
