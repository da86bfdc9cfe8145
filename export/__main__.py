"""`python -m export CHECKPOINT OUT_DIR [options]`: build a verified model bundle."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from processing.embed import POOLING_MODES

from .bundle import DEFAULT_QA, TASKS, BundleError, load_bundle_manifest
from .calibration import AVX2_ROUNDINGS

ALL_VARIANTS = ("fp32", "fused", "int8", "int8-rowwise", "int8-rowwise-avx2", "fp16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m export",
        description=(
            "Export a fine-tuned BERT, MPNet or ModernBERT checkpoint (config.json model_type), as "
            "`transformers` save_pretrained or this project's "
            "trainer writes it, to a self-describing bundle: ONNX variants, tokenizer files and "
            "bundle.json with hashes and verification / fusion / quantization reports. The head comes "
            "from config.json `architectures` (BertForSequenceClassification, BertForTokenClassification, "
            "BertForMultipleChoice, BertForQuestionAnswering; BertModel or a sentence-transformers folder: "
            "embed; MPNet... and ModernBert... alike) or --task (sparse: a masked-LM checkpoint as SPLADE), "
            "the labels from `id2label`, regression from `problem_type` or a single "
            "label. Fails (exit 1, nothing written) when the ONNX graph disagrees with PyTorch."
        ),
    )
    parser.add_argument(
        "checkpoint",
        help="fine-tuned checkpoint: a directory, or a Hugging Face hub id such as org/name "
        "(fetched into the hub cache; HF_HUB_OFFLINE=1 uses the cache only)",
    )
    parser.add_argument("out_dir", type=Path, help="bundle directory to create")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default=None,
        help="the fine-tuned head, when config.json `architectures` does not name it",
    )
    parser.add_argument("--revision", default=None, help="hub revision (branch, tag or commit) of a hub id")
    parser.add_argument(
        "--variants",
        default=",".join(ALL_VARIANTS),
        help="comma-separated subset of fp32 (plain graph), fused (ORT transformer fusions), "
        "int8-rowwise (INT8 with per-token scales, batch-invariant, CPU), int8-rowwise-avx2 (the same "
        "with weights whose pairs fit 16-bit sums: exact at INT8 speed on CPUs without VNNI), int8 (ORT "
        "dynamic quantization: faster, but a row's outputs move with its batch, CPU), fp16 (CUDA); default: "
        "all six",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="longest sequence the bundle accepts; verified at this length "
        "(default: config max_position_embeddings, less the padding positions RoBERTa skips)",
    )
    parser.add_argument("--name", default=None, help="bundle name in bundle.json (default: checkpoint dir)")
    parser.add_argument(
        "--reranker",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mark a classify model as a (query, passage) scorer: the default for /rerank, not for "
        "/classify (default: what training recorded in config.json)",
    )
    parser.add_argument(
        "--avx2-rounding",
        choices=AVX2_ROUNDINGS,
        default="feedback",
        help="int8-rowwise-avx2's weight codes: rounded with error feedback on export/calibration.txt "
        "(closer to fp32 for most models) or to nearest (default: feedback)",
    )
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset, >= 17 (default: 17)")
    qa = parser.add_argument_group("question answering defaults (qa checkpoints only)")
    qa.add_argument(
        "--doc-stride",
        type=int,
        default=None,
        help=f"overlap between context windows (default {DEFAULT_QA['doc_stride']}, "
        "shrunk to fit short max-seq-len)",
    )
    qa.add_argument(
        "--max-query-len",
        type=int,
        default=None,
        help=f"question tokens kept (default {DEFAULT_QA['max_query_len']}, shrunk to fit)",
    )
    qa.add_argument(
        "--max-answer-len",
        type=int,
        default=None,
        help=f"longest answer span in tokens (default {DEFAULT_QA['max_answer_len']})",
    )
    embed = parser.add_argument_group("sentence encoders (embed)")
    embed.add_argument(
        "--pooling",
        choices=POOLING_MODES,
        default=None,
        help="how token states pool into one vector; default: the sentence-transformers folder's "
        "1_Pooling/config.json, else mean (a plain BertModel)",
    )
    embed.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the model's own vectors are L2-normalized; default: the folder has a Normalize module",
    )
    parser.add_argument(
        "--eval-features",
        type=Path,
        default=None,
        help=".npz with input_ids, attention_mask, token_type_ids ([N, seq] or [N, choices, seq]) used to "
        "measure the int8 accuracy cost; default: random-token inputs",
    )
    parser.add_argument("--eval-batch-size", type=int, default=32, help="batch size for --eval-features")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser.parse_args(argv)


def load_eval_features(path: Path, batch_size: int) -> list[dict[str, np.ndarray]]:
    if not path.is_file():
        raise ValueError(f"--eval-features {path} does not exist")
    with np.load(path) as data:
        missing = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k not in data]
        if missing:
            raise ValueError(f"--eval-features {path} lacks array(s) {', '.join(missing)}")
        arrays = {k: data[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    n = len(arrays["input_ids"])
    if batch_size < 1:
        raise ValueError(f"--eval-batch-size must be >= 1, got {batch_size}")
    return [{k: v[i : i + batch_size] for k, v in arrays.items()} for i in range(0, n, batch_size)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    qa = {
        k: v
        for k, v in (
            ("doc_stride", args.doc_stride),
            ("max_query_len", args.max_query_len),
            ("max_answer_len", args.max_answer_len),
        )
        if v is not None
    }

    def log(message: str) -> None:
        if not args.quiet:
            print(f"[export] {message}", file=sys.stderr, flush=True)

    from .pipeline import ExportError, VerificationError, export_bundle

    try:
        batches = load_eval_features(args.eval_features, args.eval_batch_size) if args.eval_features else None
        out = export_bundle(
            args.checkpoint,
            args.out_dir,
            task=args.task,
            revision=args.revision,
            variants=variants,
            max_seq_len=args.max_seq_len,
            eval_batches=batches,
            qa_defaults=qa or None,
            pooling=args.pooling,
            normalize=args.normalize,
            name=args.name,
            reranker=args.reranker,
            avx2_rounding=args.avx2_rounding,
            opset=args.opset,
            overwrite=args.overwrite,
            log=log,
        )
    except (ExportError, VerificationError, BundleError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    manifest = load_bundle_manifest(out)
    print(f"{out}: task={manifest.task} name={manifest.name} max_seq_len={manifest.max_seq_len}")
    for name, info in manifest.variants.items():
        check = manifest.verification.get(name, {})
        print(
            f"  {name:6s} {info.file:20s} {info.bytes / 1e6:8.1f} MB  "
            f"{info.precision}/{info.intended_device:5s} max|diff| vs torch "
            f"{check.get('max_abs_diff', float('nan')):.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
