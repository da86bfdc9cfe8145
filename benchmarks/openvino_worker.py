"""The OpenVINO execution provider's side of benchmarks/cpu_int8.py, in its own interpreter.

`onnxruntime-openvino` installs its own `onnxruntime` package (an older ORT built with the
OpenVINO EP), so it cannot share a virtual environment with the service's `onnxruntime`.
cpu_int8.py runs this file with `--openvino-python` (e.g. a venv with only
onnxruntime-openvino and numpy) and reads one JSON line back. Needs numpy and onnxruntime only.

    python -m benchmarks.openvino_worker --model NAME=PATH ... --probe probe.npz --threads 1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

OPENVINO_EP = "OpenVINOExecutionProvider"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def session(path: str, threads: int, precision: str | None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    provider_options = {"device_type": "CPU", "num_of_threads": str(threads)}
    if precision:
        provider_options["precision"] = precision
    s = ort.InferenceSession(
        path, options, providers=[(OPENVINO_EP, provider_options), "CPUExecutionProvider"]
    )
    if s.get_providers()[0] != OPENVINO_EP:  # ORT falls back to its CPU EP without failing
        raise RuntimeError(f"fell back to {s.get_providers()}")
    return s


def run(s, feeds: dict[str, np.ndarray]) -> np.ndarray:
    names = [i.name for i in s.get_inputs()]
    return s.run(None, {n: feeds[n] for n in names})[0]


def full_rows(batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(1000, 30000, (batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def invariance(s, feeds: dict[str, np.ndarray]) -> float:
    together, worst = run(s, feeds), 0.0
    for i in range(feeds["input_ids"].shape[0]):
        length = int(feeds["attention_mask"][i].sum())
        alone = run(s, {n: np.ascontiguousarray(feeds[n][i : i + 1, :length]) for n in INPUTS})
        worst = max(worst, float(np.abs(alone - together[i : i + 1]).max()))
    return worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="NAME=PATH[:PRECISION]")
    p.add_argument("--probe", required=True, help=".npz with the probe feeds and fp32 logits")
    p.add_argument("--shapes", default="1x128,1x384,32x128")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--budget-s", type=float, default=25.0)
    args = p.parse_args()
    probe = dict(np.load(args.probe))
    reference = probe.pop("logits")
    import onnxruntime as ort

    out = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "rows": []}
    for item in args.model:
        name, spec = item.split("=", 1)
        path, _, precision = spec.partition(":")
        for threads in (int(t) for t in args.threads.split(",")):
            row = {"candidate": name, "threads": threads}
            try:
                s = session(path, threads, precision or None)
                got = run(s, probe)
                agree = float((got.argmax(-1) == reference.argmax(-1)).mean())
                row.update(argmax_agreement=agree, max_abs_diff=float(np.abs(got - reference).max()))
                if agree < 0.9 or not np.isfinite(got).all():
                    raise RuntimeError(f"only {agree:.0%} of fp32's decisions on the probe")
                row["invariance_max_abs_diff"] = invariance(s, probe)
                for shape in args.shapes.split(","):
                    batch, seq = (int(x) for x in shape.split("x"))
                    feeds = full_rows(batch, seq)
                    run(s, feeds)
                    times, deadline = [], time.perf_counter() + args.budget_s
                    while len(times) < args.runs and (len(times) < 3 or time.perf_counter() < deadline):
                        started = time.perf_counter()
                        run(s, feeds)
                        times.append(time.perf_counter() - started)
                    row[f"{batch}x{seq}_ms"] = round(statistics.median(times) * 1e3, 3)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            out["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
