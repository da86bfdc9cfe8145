"""export_bundle: checkpoint -> verified ONNX variants + tokenizer + bundle.json.

Everything is built in a staging directory next to `out_dir` and moved into place only
after every check passed, so a failed export never leaves a half-written bundle behind.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from model.checkpoint import CheckpointError, resolve_checkpoint

from . import calibration, int8_precision, optimize, quantize, quantize_rowwise
from .bundle import FORMAT_VERSION, BundleManifest, VariantInfo, file_info, task_io, write_manifest
from .checkpoint_fields import (
    check_tokenizer,
    copy_tokenizer,
    do_lower_case,
    is_reranker,
    labels_and_problem,
    preprocessing_rules,
    qa_defaults_for,
    tool_versions,
)
from .invariance import batch_invariance
from .onnx_export import DEFAULT_OPSET, ExportError, OnnxHead, export_onnx, graph_inputs, load_head
from .sentence_encoder import SentenceEncoderError, is_sentence_transformers, read_pooling
from .verify import (
    FP32_TOLERANCE,
    VerificationError,
    compare_variant,
    fp16_check,
    make_session,
    random_eval_batches,
    require_passed,
    run_session,
    run_torch,
    verification_cases,
)

VARIANTS = ("fp32", "fused", "int8", "int8-rowwise", "int8-rowwise-avx2", "fp16")
FILES = {
    "fp32": "model.onnx",
    "fused": "model_fused.onnx",
    "int8": "model_int8.onnx",
    "int8-rowwise": "model_int8_rowwise.onnx",
    "int8-rowwise-avx2": "model_int8_rowwise_avx2.onnx",
    "fp16": "model_fp16.onnx",
}
INT8_VARIANTS = ("int8-rowwise", "int8-rowwise-avx2", "int8")
PRECISION = {"fp32": "fp32", "fused": "fp32", "fp16": "fp16"} | dict.fromkeys(INT8_VARIANTS, "int8")
DEVICE = {"fp32": "any", "fused": "any", "fp16": "cuda"} | dict.fromkeys(INT8_VARIANTS, "cpu")
# The per-token variants' int8 weights: within a pair budget where the kernel adds pairs in 16 bits,
# and then rounded with error feedback on calibration text (export/calibration.py) to win back the
# precision the budget costs (docs/decisions.md, int8_avx2); the 8-bit ones to nearest.
PAIR_BUDGET = {"int8-rowwise": None, "int8-rowwise-avx2": int8_precision.PAIR_BUDGET}
# int8-rowwise recipes beyond the plain one, by task. Sentence embeddings are read as they are and
# compared by cosine: plain per-token INT8 left MiniLM's at 0.974 of sentence-transformers' at
# worst on 200 texts; 16 fp32 outlier channels per input and fp32 FFN outputs keep them >= 0.999
# (benchmarks/results/embed_quality.md).
ROWWISE_RECIPES: dict[str, dict[str, Any]] = {"embed": {"outlier_channels": 16, "float_after_gelu": True}}
# The fused kernels reorder float sums (Attention, SkipLayerNorm) but stay fp32.
FUSED_TOLERANCE = 1e-4

__all__ = ["export_bundle", "ExportError", "VerificationError", "VARIANTS"]


def export_bundle(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    task: str | None = None,
    revision: str | None = None,
    variants: Sequence[str] = VARIANTS,
    max_seq_len: int | None = None,
    eval_batches: list[dict[str, np.ndarray]] | None = None,
    metric_fn: Callable[[list[dict[str, np.ndarray]]], dict] | None = None,
    qa_defaults: dict[str, int] | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
    name: str | None = None,
    reranker: bool | None = None,
    avx2_rounding: str = "feedback",
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> Path:
    """Export `checkpoint` (a directory, or a hub id fetched at `revision`) into the bundle `out_dir`.

    The head is `task`, else config.task, else what config.json `architectures` names
    (onnx_export.checkpoint_task); a sentence-transformers folder is an embed model. `pooling` /
    `normalize` replace what a sentence encoder's folder says. `avx2_rounding` ("feedback" or
    "nearest") rounds int8-rowwise-avx2's codes (calibration.round_with_feedback). Raises ExportError /
    VerificationError (naming the offending case) and leaves `out_dir` untouched when any check
    fails. Returns `out_dir`.
    """
    out_dir = Path(out_dir)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ExportError(f"unknown variant(s) {unknown or '(none given)'}; choose from {VARIANTS}")
    if avx2_rounding not in calibration.AVX2_ROUNDINGS:
        raise ExportError(f"avx2_rounding is 'feedback' or 'nearest', not {avx2_rounding!r}")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ExportError(
            f"{out_dir} exists and is not empty; pass overwrite=True (--overwrite) to replace it"
        )
    started = time.perf_counter()
    try:
        checkpoint_dir = resolve_checkpoint(checkpoint, revision)
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    from_hub = not Path(checkpoint).is_dir()
    source_dir = checkpoint_dir
    log(f"loading {checkpoint_dir}")
    encoder = None  # how a sentence encoder pools (export.sentence_encoder)
    try:
        if is_sentence_transformers(checkpoint_dir):
            if task not in (None, "embed"):
                raise ExportError(
                    f"{checkpoint_dir} is a sentence-transformers folder: it exports as embed, not {task}"
                )
            task = "embed"
        if task == "embed":
            encoder = read_pooling(checkpoint_dir, pooling, normalize)
            checkpoint_dir = encoder.checkpoint
        model, config = load_head(checkpoint_dir, task, pooling)
        task = config.task
        if task == "embed" and encoder is None:  # a BertModel, found by its `architectures`
            encoder = read_pooling(checkpoint_dir, pooling, normalize)
    except SentenceEncoderError as e:
        raise ExportError(str(e)) from e
    if encoder is None and (pooling is not None or normalize is not None):
        raise ExportError(f"pooling / normalize apply to sentence encoders (embed), not to a {task} head")
    max_seq_len = max_seq_len or (encoder.max_seq_length if encoder else None) or config.max_tokens
    if not 2 <= max_seq_len <= config.max_tokens:
        skipped = config.max_position_embeddings - config.max_tokens  # RoBERTa's padding positions
        skips = f", less the {skipped} positions RoBERTa skips" if skipped else ""
        raise ExportError(
            f"max_seq_len {max_seq_len} must be in [2, {config.max_tokens}]: max_position_embeddings "
            f"{config.max_position_embeddings}{skips}"
        )
    labels, problem_type = labels_and_problem(config, task)
    tokenizer = check_tokenizer(checkpoint_dir, config)
    qa = qa_defaults_for(qa_defaults, max_seq_len, tokenizer.n_special(pair=True)) if task == "qa" else None
    if eval_batches is not None:
        eval_batches = quantize.check_eval_batches(task, eval_batches, max_seq_len)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        run = _Run(task, config, tokenizer, avx2_rounding, stage, set(variants), log)
        run.fp32(model, opset, max_seq_len)
        if run.wanted & {"fused", "fp16", *INT8_VARIANTS}:
            run.fused()
        for variant in INT8_VARIANTS:
            if variant in run.wanted:
                run.int8(variant, eval_batches, metric_fn, max_seq_len)
        run.drop_cpu_source()
        if "fp16" in run.wanted:
            run.fp16()
        run.drop_unwanted()
        manifest = BundleManifest(
            format_version=FORMAT_VERSION,
            task=task,
            name=name or (str(checkpoint).rsplit("/", 1)[-1] if from_hub else source_dir.resolve().name),
            labels=labels,
            problem_type=problem_type,
            max_seq_len=max_seq_len,
            do_lower_case=do_lower_case(checkpoint_dir),
            inputs=run.inputs,
            outputs=task_io(task, config.num_labels, config.hidden_size)[1],
            variants={
                v: VariantInfo(
                    FILES[v],
                    *astuple(file_info(run.paths[v])),  # sha256, bytes
                    PRECISION[v],
                    DEVICE[v],
                    run.disabled_optimizers.get(v, []),
                )
                for v in VARIANTS
                if v in run.wanted
            },
            tokenizer_files=copy_tokenizer(checkpoint_dir, stage),
            qa_defaults=qa,
            pooling=encoder.manifest(config.hidden_size, stage) if encoder else None,
            preprocessing={
                **preprocessing_rules(config, task),
                **(encoder.prompt_rules() if encoder else {}),
            },
            reranker=is_reranker(config, task, reranker),
            verification=run.verification,
            optimization=run.optimization,
            quantization=run.quantization,
            versions=tool_versions(),
            model={
                "model_type": config.model_type,
                "hidden_size": config.hidden_size,
                "num_hidden_layers": config.num_hidden_layers,
                "num_attention_heads": config.num_attention_heads,
                "vocab_size": config.vocab_size,
                "hidden_act": config.hidden_act,
                "opset": opset,
                "source_checkpoint": str(checkpoint_dir.resolve()),
                **({"source_hub_id": str(checkpoint), "source_revision": revision} if from_hub else {}),
            },
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        write_manifest(stage, manifest)
        _move_into_place(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    log(f"bundle written to {out_dir} in {time.perf_counter() - started:.1f}s")
    return out_dir


class _Run:
    """The graphs of one export and their reports, built stage by stage in `stage`."""

    def __init__(
        self,
        task: str,
        config,
        tokenizer,
        avx2_rounding: str,
        stage: Path,
        wanted: set[str],
        log: Callable[[str], None],
    ):
        self.task, self.config, self.wanted, self.log = task, config, wanted, log
        self.tokenizer, self.avx2_rounding = tokenizer, avx2_rounding  # for feedback rounding
        self.paths = {v: stage / FILES[v] for v in VARIANTS}
        self.verification: dict[str, Any] = {}
        self.optimization: dict[str, Any] = {}
        self.quantization: dict[str, Any] = {}
        self.base = "fp32"  # the graph int8 / fp16 start from
        self.disabled_optimizers: dict[str, list[str]] = {}  # per variant, for its sessions
        self.cpu_source_report: dict[str, Any] = {}
        self.outliers: dict[tuple, dict] = {}  # (k, batches' source) -> channels, for every rowwise variant

    def fp32(self, model, opset: int, max_seq_len: int) -> None:
        self.log(f"exporting {self.task} head to ONNX (opset {opset}, TorchScript exporter)")
        export_onnx(model, self.config, self.paths["fp32"], opset)
        self.inputs = graph_inputs(self.task, self.config, self.paths["fp32"])
        self.cases = verification_cases(
            self.task, self.config.vocab_size, max_seq_len, pad_id=self.config.pad_token_id
        )
        wrapper = OnnxHead(model, self.task).eval()
        names = [o["name"] for o in task_io(self.task)[1]]
        self.references = [run_torch(wrapper, names, case.feeds) for case in self.cases]
        self.verification["fp32"] = self._compare("fp32", FP32_TOLERANCE)
        require_passed("fp32", self.verification["fp32"])
        self._check_invariance("fp32", required=False)
        worst = self.verification["fp32"]["max_abs_diff"]
        self.log(f"fp32 parity ok: max abs diff {worst:.2e} over {len(self.cases)} shapes")

    def _compare(self, variant: str, tolerance: float | None) -> dict[str, Any]:
        disabled = self.disabled_optimizers.get(variant, [])
        return compare_variant(
            self.task, self.paths[variant], self.cases, self.references, tolerance, disabled
        )

    def fused(self) -> None:
        self.log("fusing transformer subgraphs (onnxruntime.transformers.optimizer)")
        try:
            self.optimization = optimize.fuse(self.paths["fp32"], self.paths["fused"], self.config)
            self.verification["fused"] = self._compare("fused", FUSED_TOLERANCE)
            require_passed("fused", self.verification["fused"])
            self._check_invariance("fused", required=False)
        except Exception as e:
            if "fused" in self.wanted:
                raise
            # Only int8 / fp16 were asked for: build them from the plain graph instead.
            self.optimization = {"error": f"{type(e).__name__}: {e}", "fallback": "int8/fp16 built from fp32"}
            self.verification.pop("fused", None)
            self.log(f"fusion failed, using the fp32 graph for int8/fp16: {e}")
            return
        self.base = "fused"
        self.log(
            f"fused: {self.optimization['fused_operator_counts']}; max abs diff "
            f"{self.verification['fused']['max_abs_diff']:.2e}"
        )

    def cpu_source(self) -> Path:
        """The graph the int8 variants start from, built once: the fused graph as usual but for
        SkipLayerNormalization, since they run on CPU only (SKIP_LAYER_NORM_NOTE)."""
        if self.base != "fused":
            return self.paths[self.base]
        graph = self.paths["int8"].with_name("int8_source.onnx")
        if not graph.exists():
            report = optimize.fuse(self.paths["fp32"], graph, self.config, skip_layer_norm=False)
            self.cpu_source_report = {
                "fused_operator_counts": report["fused_operator_counts"],
                "note": optimize.SKIP_LAYER_NORM_NOTE,
                "disabled_optimizers": list(optimize.CPU_DISABLED_OPTIMIZERS),
            }
        return graph

    def drop_cpu_source(self) -> None:
        self.paths["int8"].with_name("int8_source.onnx").unlink(missing_ok=True)

    def int8(self, variant: str, eval_batches, metric_fn, max_seq_len: int) -> None:
        """Quantize `variant` ("int8": ORT dynamic; "int8-rowwise[-avx2]": per-token scales), check its
        shapes, batch invariance and weight range, and measure what it costs against fp32."""
        graph = self.cpu_source()
        if self.base == "fused":
            self.disabled_optimizers[variant] = list(optimize.CPU_DISABLED_OPTIMIZERS)
        self.log(f"{variant} quantization of the {self.base} graph")
        if eval_batches is not None:
            source, batches = "caller eval_batches", eval_batches
        else:
            source = "random tokens (no eval_batches given)"
            batches = random_eval_batches(
                self.task, self.config.vocab_size, max_seq_len, pad_id=self.config.pad_token_id
            )
        if variant == "int8":
            report = quantize.quantize_int8(graph, self.paths[variant])
        else:
            recipe = dict(ROWWISE_RECIPES.get(self.task, {}))
            disabled = self.disabled_optimizers.get(variant, ())
            if recipe.get("outlier_channels"):
                key = (recipe.pop("outlier_channels"), source)
                if key not in self.outliers:
                    self.outliers[key] = calibration.outlier_channels(graph, batches, key[0], disabled)
                recipe["outliers"] = self.outliers[key]
            recipe["pair_budget"] = PAIR_BUDGET[variant]
            if recipe["pair_budget"] is not None and self.avx2_rounding == "feedback":
                text = calibration.text_batches(self.task, self.tokenizer, max_seq_len)
                recipe["products"] = calibration.input_products(graph, text, disabled)  # X^T X
            report = quantize_rowwise.quantize_rowwise(graph, self.paths[variant], **recipe)
            report["int8_pair_peak"] = int8_precision.require_pair_safe(variant, self.paths[variant])
            if recipe.get("outliers"):
                report["outlier_channels"]["chosen_on"] = source
            if recipe.get("products"):
                report["weight_rounding"] += f" on {calibration.CALIBRATION_TEXT.name}"
        if self.base == "fused":
            report["source"] = f"{FILES['fused']} without SkipLayerNormalization"
            report["source_graph"] = self.cpu_source_report
        # Shape coverage for int8 too; its accuracy is judged on eval features below.
        self.verification[variant] = self._compare(variant, None)
        self.verification[variant]["note"] = "informational: int8 accuracy is in the quantization report"
        self._check_invariance(variant, required=variant != "int8")
        graphs = (self.paths["fp32"], self.paths[variant])
        acc = quantize.measure(
            self.task, *graphs, batches, source, metric_fn, self.disabled_optimizers.get(variant)
        )
        report["accuracy_vs_fp32"] = acc
        # "int8" keeps the report's original place; the other variants get a key of their own.
        if variant == "int8":
            self.quantization.update(report)
        else:
            self.quantization[variant] = report
        rate = "n/a" if acc["argmax_agreement"] is None else f"{acc['argmax_agreement']:.1%}"
        self.log(
            f"{variant} vs fp32 on {source}: argmax agreement {rate} of {acc['decisions_compared']} "
            f"decisions, max |diff| {acc['max_abs_diff']:.3g}, mean {acc['mean_abs_diff']:.3g}"
        )

    def _check_invariance(self, variant: str, required: bool) -> None:
        """Each right-padded verification row alone against inside its batch."""
        disabled = self.disabled_optimizers.get(variant, ())
        session = make_session(self.paths[variant], disabled_optimizers=disabled, variant=variant)
        padded = [case.feeds for case in self.cases if "left_padded" not in case.name]
        report = batch_invariance(self.task, lambda feeds: run_session(session, feeds), padded)
        self.verification[variant]["batch_invariance"] = report
        self.log(f"{variant}: row alone vs in its batch, max |diff| {report['max_abs_diff']:.3g}")
        if required and not report["invariant"]:
            raise VerificationError(
                f"{variant} is meant to be batch-invariant, but a row alone and the same row in a padded "
                f"batch differ by {report['max_abs_diff']:.3g} > {report['tolerance']:g}"
            )

    def fp16(self) -> None:
        self.log(f"fp16 conversion of the {self.base} graph")
        self.optimization["fp16"] = optimize.to_fp16(self.paths[self.base], self.paths["fp16"])
        report = fp16_check(self.task, self.paths["fp16"], self.cases, self.references)
        self.verification["fp16"] = report
        if report["passed"] is False:
            raise VerificationError(
                f"fp16 graph differs from PyTorch by {report['max_abs_diff']:.3g} > {report['tolerance']:.3g}"
            )
        self.log(f"fp16: {report['status']}")

    def drop_unwanted(self) -> None:
        for v in VARIANTS:
            if v not in self.wanted:
                self.paths[v].unlink(missing_ok=True)
                self.verification.pop(v, None)


def _move_into_place(stage: Path, out_dir: Path) -> None:
    stage.chmod(0o755)  # mkdtemp makes it 0700
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{time.time_ns()}")
        out_dir.rename(old)
        stage.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        stage.rename(out_dir)
