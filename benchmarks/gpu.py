"""The GPU checklist on an NVIDIA machine: CUDA really active, fp16 verified, IO binding, latency, service.

    python -m benchmarks.gpu --minilm DIR        # DIR: sentence-transformers/all-MiniLM-L6-v2 files

MiniLM (the embedding default's weights) and a random bert-base classifier, fp32 and fp16, bare and
behind our server (`DEVICE=cuda`); what each row means: benchmarks/README.md. Writes results/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.runtime import create_runtime, providers_for, session_options
from benchmarks import bench_common as common
from benchmarks import loadgen
from benchmarks.loadgen_payloads import SENTENCES, make_payload
from benchmarks.model_only import BundleModel, batched_reference, single_request_reference
from processing.padding import pad_batch
from processing.tokenizer import TextTokenizer

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
LOADS = [(e, c) for e in ("embed", "classify-25w") for c in (1, 32, 128)]
LOADS += [("embed-32", 4), ("embed-32", 16)]


def bert_base_checkpoint(tokenizer_dir: Path, out: Path) -> Path:
    """bert-base (12 x 768) with a two-label head, initialised as in pretraining (std 0.02)."""
    import torch

    from model.bert import TASK_HEADS
    from model.config import BertConfig

    torch.manual_seed(0)
    config = BertConfig(task="classify", id2label={0: "NEGATIVE", 1: "POSITIVE"})
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    TASK_HEADS["classify"](config).eval().save_pretrained(out, tokenizer_from=out)
    return out


def cuda_share(path: Path) -> dict[str, Any]:
    """Run once with ORT's profiler; node time per execution provider."""
    import onnxruntime as ort

    options = session_options(1)
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "profile")
    session = ort.InferenceSession(str(path), sess_options=options, providers=providers_for("cuda"))
    feed = {i.name: np.ones((8, 128), dtype=np.int64) for i in session.get_inputs()}
    for _ in range(3):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    by_provider: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            provider = event.get("args", {}).get("provider", "?")
            by_provider[provider] = by_provider.get(provider, 0.0) + event["dur"]
    total = sum(by_provider.values()) or 1.0
    return {
        "session_providers": session.get_providers(),
        "node_time_share": {k: round(v / total, 4) for k, v in sorted(by_provider.items())},
    }


def batch(tokenizer: TextTokenizer, texts: list[str], length: int) -> dict[str, np.ndarray]:
    """Real sentences, padded (or cut) to exactly `length` tokens."""
    encodings = [tokenizer.encode(t, max_length=length) for t in texts]
    return pad_batch(encodings, tokenizer.pad_id, length=length)


def p50_ms(run, inputs, seconds: float) -> float:
    run(inputs)  # warm-up
    return round(float(np.median(common.timed(lambda: run(inputs), 10**6, seconds, 5)[1])) * 1e3, 3)


def check_model(bundle: Path, seconds: float) -> dict[str, Any]:
    model = BundleModel(bundle, "fp32", threads=1)  # fp32 on CPU: the reference
    manifest, tokenizer = model.manifest, model.tokenizer
    cuda = {v: create_runtime(manifest.variant_path(bundle, v), "cuda", 1) for v in ("fp32", "fp16")}
    report: dict[str, Any] = {"provider": {v: cuda_share(manifest.variant_path(bundle, v)) for v in cuda}}
    real = batch(tokenizer, (SENTENCES * 4)[:32], 64)
    reference = model.runtime.run(real)
    outputs = {v: rt.run(real) for v, rt in cuda.items()}
    name = next(iter(reference))
    ref = reference[name]
    checks = {}
    for variant, out in outputs.items():
        got = out[name]
        row = {"max_abs_diff": float(np.abs(got - ref).max()), "max_abs_reference": float(np.abs(ref).max())}
        if manifest.task == "embed":  # mean-pooled over real tokens, as the service pools
            mask = real["attention_mask"][..., None]
            a, b = ((x * mask).sum(1) / mask.sum(1) for x in (got, ref))
            cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
            row["cosine_min"] = float(cos.min())
        else:
            row["argmax_agree"] = float((got.argmax(-1) == ref.argmax(-1)).mean())
        checks[f"{variant} cuda vs fp32 cpu"] = row
    report["fp16"] = {"output": name, **checks}
    shapes = {f"({n},128)": batch(tokenizer, (SENTENCES * 4)[:n], 128) for n in (1, 32)}
    report["latency_p50_ms"] = {
        f"{v} {s}": p50_ms(rt.run, x, seconds) for v, rt in cuda.items() for s, x in shapes.items()
    }
    fp16, x = cuda["fp16"], shapes["(32,128)"]
    outputs, times = {}, {True: [], False: []}
    for bound in (True, False, True, False):  # alternating rounds
        fp16.io_binding = bound
        outputs[bound] = fp16.run(x)
        times[bound].append(p50_ms(fp16.run, x, seconds))
    report["io_binding"] = {
        "p50_ms_on": times[True],
        "p50_ms_off": times[False],
        "outputs_equal": all(np.array_equal(outputs[True][k], outputs[False][k]) for k in outputs[True]),
    }
    return report


def stage_medians(url: str, path: str, body: dict[str, Any], n: int = 300) -> dict[str, float]:
    """One request at a time: client wall time and the service's own Server-Timing stages, medians."""
    import httpx

    rows = []
    with httpx.Client(base_url=url) as client:
        for _ in range(n):
            started = time.perf_counter()
            response = client.post(path, json=body)
            row = {"client (httpx)": (time.perf_counter() - started) * 1e3}
            for part in response.headers.get("server-timing", "").split(","):
                if "dur=" in part:
                    row[part.split(";")[0].strip()] = float(part.split("dur=")[1])
            rows.append(row)
    return {k: round(float(np.median([r.get(k, 0.0) for r in rows[n // 5 :]])), 3) for k in rows[-1]}


def service(bundles: dict[str, Path], work: Path, seconds: float) -> dict[str, Any]:
    """Our server on both bundles, one uvicorn worker and four (each worker its own sessions)."""
    models_dir = work / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    for name, path in bundles.items():
        (models_dir / name).symlink_to(path.resolve(), target_is_directory=True)
    rows: dict[str, Any] = {}
    for workers in (1, 4):
        log = work / f"server-{workers}.log"
        url, running = common.serve_ours(models_dir, log, workers=workers, DEVICE="cuda")
        with running:
            time.sleep(2 * (workers - 1))  # the other workers finish loading
            if workers == 1:
                rows["c=1 stages, ms"] = {
                    "embed": stage_medians(url, "/embed", {"inputs": SENTENCES[0]}),
                    "classify": stage_medians(url, "/classify", {"text": f"{SENTENCES[1]} {SENTENCES[6]}"}),
                }
            for endpoint, concurrency in LOADS:
                config = loadgen.LoadConfig(
                    url=url, duration_s=seconds, concurrency=concurrency, endpoints={endpoint: 1.0}
                )
                loadgen.run(config)  # warm-up
                report = loadgen.run(config)
                rows[f"workers={workers} {endpoint} c={concurrency}"] = {
                    "req_per_s": report["throughput_rps"],
                    "p50_ms": report["latency_ms"]["p50"],
                    "errors": report["errors"],
                }
    rng = random.Random(0)
    for endpoint, name in (("embed", "minilm"), ("classify-25w", "bert-base")):
        model = BundleModel(bundles[name], "fp16", threads=1, device="cuda")
        payloads = [make_payload(endpoint, rng) for _ in range(64)]
        rows[f"bare {name} fp16"] = {
            "single_p50_ms": single_request_reference(model, payloads, seconds)["p50_ms"],
            "batched": batched_reference(model, payloads, seconds, sizes=(1, 8, 32, 128)),
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--minilm", type=Path, required=True, help="all-MiniLM-L6-v2 checkpoint directory")
    parser.add_argument("--work", type=Path, default=common.WORK / "gpu")
    parser.add_argument("--seconds", type=float, default=3.0, help="per timing")
    parser.add_argument("--out", type=Path, default=common.RESULTS, help="results directory")
    args = parser.parse_args(argv)
    from export.pipeline import export_bundle

    shutil.rmtree(args.work, ignore_errors=True)
    checkpoint = bert_base_checkpoint(args.minilm, args.work / "bert-base-checkpoint")
    bundles = {
        name: export_bundle(source, args.work / name, variants=("fp32", "fp16"), name=name, overwrite=True)
        for name, source in (("minilm", args.minilm), ("bert-base", checkpoint))
    }
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    gpu = shutil.which(smi[0]) and subprocess.run(smi, capture_output=True, text=True).stdout.strip()
    results: dict[str, Any] = {"gpu": gpu, "machine": common.machine_info()}
    out = args.out / "gpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, path in bundles.items():
        results[name] = check_model(path, args.seconds)
        out.write_text(json.dumps(results, indent=1, default=str))  # each stage kept if a later one fails
    results["service"] = service(bundles, args.work, args.seconds * 2)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
