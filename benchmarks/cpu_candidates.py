"""The CPU candidates benchmarks/cpu_int8.py compares: the bundle's variants, static QDQ INT8
calibrated on SST-2 training sentences, the OpenVINO EP (in its own interpreter) and BERT-base
shapes; and the fp32 probe each is checked against before it is timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_common as common
from benchmarks import scaling
from export.optimize import CPU_DISABLED_OPTIMIZERS
from export.verify import run_session

BUNDLE_VARIANTS = ("fused", "int8", "int8-rowwise")


class Candidate:
    def __init__(self, name: str, path: Path, disabled: list[str] | None = None):
        self.name, self.path, self.disabled = name, path, disabled or []

    def session(self, threads: int):
        from export.verify import make_session

        return make_session(self.path, threads, self.disabled)


def calibration_batches(bundle: Path, data: Path, count: int) -> list[dict[str, np.ndarray]]:
    """SST-2 training sentences (the recipe's training side, never its validation slice), one per batch."""
    from benchmarks.finetune import recipes
    from processing.padding import pad_batch
    from processing.tokenizer import TextTokenizer
    from train.cli import run_options
    from train.splits import split_examples

    argv = recipes(data)["sst2"]["data"]
    train, _ = split_examples(run_options(argv).data)
    tokenizer = TextTokenizer.from_dir(bundle)
    rng = np.random.default_rng(0)
    picked = rng.choice(len(train), size=min(count, len(train)), replace=False)
    return [pad_batch([tokenizer.encode(train[i].text, max_length=128)]) for i in picked]


def quantize_static_qdq(fp32: Path, out: Path, batches: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(batches)

        def get_next(self):
            return next(self.items, None)

    prepared = out.with_name("qdq_prepared.onnx")
    # Symbolic shape inference fails on this graph ("Incomplete symbolic shape inference").
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_static(
        str(prepared),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        calibrate_method=CalibrationMethod.MinMax,
    )
    prepared.unlink()
    return {"calibration_sentences": len(batches), "method": "MinMax", "ops": "MatMul", "format": "QDQ"}


def candidates(bundle: Path, work: Path, data: Path, calibration: int) -> tuple[list[Candidate], dict]:
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    out = [
        Candidate(v, bundle / manifest.variants[v].file, manifest.variants[v].disabled_optimizers)
        for v in BUNDLE_VARIANTS
        if v in manifest.variants
    ]
    notes: dict[str, Any] = {}
    if data.exists():
        qdq = work / "model_qdq_static_u8.onnx"
        notes["qdq-static-u8"] = quantize_static_qdq(
            bundle / manifest.variants["fp32"].file, qdq, calibration_batches(bundle, data, calibration)
        )
        # Like the int8 variants, without ORT's slow CPU SkipLayerNormalization (export/optimize.py).
        out.append(Candidate("qdq-static-u8", qdq, list(CPU_DISABLED_OPTIMIZERS)))
    else:
        notes["qdq-static-u8"] = f"skipped: {data} (calibration data) is absent"
    return out, notes


def openvino(python: str, fp32: Path, qdq: Path | None, reference: dict, work: Path, args) -> dict[str, Any]:
    """benchmarks/openvino_worker.py in `python`: the OpenVINO EP on the fp32 and QDQ graphs."""
    import subprocess

    probe = work / "probe.npz"
    np.savez(probe, **reference["feeds"], logits=reference["logits"])
    models = [f"openvino-fp32={fp32}", f"openvino-bf16-hint={fp32}:BF16"]
    models += [f"openvino-qdq-u8={qdq}"] if qdq is not None else []
    command = [python, str(common.ROOT / "benchmarks" / "openvino_worker.py"), "--probe", str(probe)]
    for spec in models:
        command += ["--model", spec]
    command += ["--shapes", ",".join(f"{b}x{q}" for b, q in args.shapes)]
    command += ["--runs", str(args.runs), "--budget-s", str(args.budget_s)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def bert_base(work: Path, quick: bool) -> dict[str, Candidate]:
    """BERT-base shape (random weights) exported with the bundle variants."""
    from export import export_bundle

    layers = 2 if quick else 12
    checkpoint, bundle = work / f"bert-base-{layers}l", work / f"bert-base-{layers}l-bundle"
    if not (bundle / "bundle.json").exists():
        bert_base_random(checkpoint, layers)
        export_bundle(
            checkpoint, bundle, variants=("fp32", *BUNDLE_VARIANTS), max_seq_len=128, overwrite=True
        )
    from export.bundle import load_bundle_manifest

    manifest = load_bundle_manifest(bundle)
    return {
        v: Candidate(
            f"bert-base {v}", bundle / manifest.variants[v].file, manifest.variants[v].disabled_optimizers
        )
        for v in BUNDLE_VARIANTS
    }


def probe(bundle: Path, data: Path, fused: Candidate) -> dict[str, Any]:
    """Sentences and fp32 logits every candidate is checked against before it is timed."""
    if data.exists():
        rows = calibration_batches(bundle, data, 32)
        longest = max(r["input_ids"].shape[1] for r in rows)
        feeds = {
            name: np.concatenate([np.pad(r[name], ((0, 0), (0, longest - r[name].shape[1]))) for r in rows])
            for name in rows[0]
        }
    else:
        feeds = scaling.feeds(8, 32)
    return {"feeds": feeds, "logits": run_session(fused.session(1), feeds)["logits"]}
