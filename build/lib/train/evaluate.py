"""Evaluate a model the way training does: a checkpoint, an exported bundle, or a live service.

    python -m train.evaluate CHECKPOINT            DATA   # PyTorch
    python -m train.evaluate --bundle DIR [--variant int8] DATA   # ONNX Runtime on a bundle
    python -m train.evaluate --url http://host:8000 [--model NAME] DATA   # the service, over HTTP

DATA is either every example of one file,

    --task ner --data ../shared/data/conll2003/dev.txt

or, after `--`, the data options of the `python -m train` run, so that the validation slice
is exactly the one that run held out:

    -- --task classify --train ../shared/data/sst2/train.tsv --validation-fraction 0.12 --holdout whole-texts

Examples are read by the trainer's readers and scored by its metrics (accuracy/F1, seqeval
entity F1, SQuAD EM/F1), in every mode; only where the predictions come from differs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .readers import FORMATS
from .splits import DataOptions, read_file, split_examples, subsample


def parse_label_names(spec: str | None) -> dict[str, str]:
    """'0=negative,1=positive' -> {'0': 'negative', '1': 'positive'} (data label -> model label)."""
    if not spec:
        return {}
    pairs = [item.split("=", 1) for item in spec.split(",") if item.strip()]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--label-names takes DATA=MODEL pairs separated by commas, got {spec!r}")
    return {k.strip(): v.strip() for k, v in pairs}


def select_examples(
    train_argv: Sequence[str] = (),
    task: str | None = None,
    data: Path | None = None,
    fmt: str = "auto",
    limit: int | None = None,
    seed: int = 42,
) -> tuple[str, list]:
    """(task, examples): the held-out slice of a training run's data, or every example of `data`."""
    if train_argv:
        from .train import run_options

        options = run_options(train_argv).data
        return options.task, split_examples(options)[1]
    if not (task and data):
        raise SystemExit("give --task and --data, or the training run's data options after --")
    options = DataOptions(task=task, train=data, format=fmt)
    return task, subsample(read_file(options, data), limit, seed)


def feature_task(task_name: str, tokenizer, train_argv: Sequence[str], recorded: dict):
    """The task's feature builder: the training run's options, else what the model recorded."""
    from .features import TASK_FEATURES, FeatureOptions
    from .train import run_options

    if train_argv:
        return TASK_FEATURES[task_name](tokenizer, run_options(train_argv).features)
    options = FeatureOptions(**{k: v for k, v in recorded.items() if v is not None})
    return TASK_FEATURES[task_name](tokenizer, options)


def run_evaluation(
    model,
    task,
    examples: list,
    labels: list[str] | None,
    eval_batch_size: int,
    base_labels: list[str] | None = None,
) -> dict:
    """The trainer's own evaluation loop over `examples`."""
    from .trainer import TrainConfig, Trainer

    task.fit_labels(examples, labels, base_labels)
    valid = task.features(examples, train=False)
    config = TrainConfig(batch_size=1, eval_batch_size=eval_batch_size, precision="fp32", progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, task, valid, valid, config, tmp, log_dir=Path(tmp) / "runs")
        metrics = trainer.evaluate()
    metrics.pop("loss", None)
    return metrics


def evaluate_checkpoint(
    checkpoint: Path,
    task_name: str,
    examples: list,
    train_argv: Sequence[str] = (),
    eval_batch_size: int = 64,
) -> dict:
    """A checkpoint in PyTorch; features as the training run made them (or as the model recorded)."""
    import torch

    from model.bert import TASK_HEADS
    from model.config import BertConfig
    from processing.tokenizer import TextTokenizer

    from .train import run_options

    threads = run_options(train_argv).num_threads if train_argv else 0
    if threads:
        torch.set_num_threads(threads)
    config = BertConfig.from_pretrained(checkpoint)
    keys = ("max_seq_len", "long_text", "window_overlap", "doc_stride", "max_query_len", "max_answer_len")
    recorded = {k: config.extra.get(k) for k in keys}
    task = feature_task(task_name, TextTokenizer.from_dir(checkpoint), train_argv, recorded)
    # The checkpoint's labels where they cover the data; otherwise the data's own codes in sorted
    # order (a default whose ids were renamed keeps them: SST-2's "0"/"1" are negative/positive).
    base = [config.id2label[i] for i in range(len(config.id2label))] if config.id2label else None
    given = ["regression"] if task_name == "classify" and config.problem_type == "regression" else None
    model = TASK_HEADS[task_name].from_pretrained(checkpoint)
    return run_evaluation(model, task, examples, given, eval_batch_size, base)


def evaluate_bundle(
    bundle: Path,
    variant: str,
    task_name: str,
    examples: list,
    train_argv: Sequence[str] = (),
    *,
    label_names: dict[str, str] | None = None,
    threads: int = 2,
    eval_batch_size: int = 32,
    onnx_file: Path | None = None,
    disabled_optimizers: list[str] | None = None,
) -> dict:
    """A bundle's variant on ONNX Runtime, through the trainer's evaluation loop. Features follow the
    training run's options, else the manifest (what the service uses). `onnx_file` (and its
    `disabled_optimizers`) scores another graph of the same model, e.g. a quantization candidate,
    with the bundle's tokenizer and settings."""
    from export.bundle import DEFAULT_QA, load_bundle_manifest
    from processing.tokenizer import TextTokenizer

    from .ort_head import OrtHead

    manifest = load_bundle_manifest(bundle)
    if task_name != manifest.task:
        raise SystemExit(f"{bundle} is a {manifest.task} bundle; the data is for {task_name}")
    recorded = {
        "max_seq_len": manifest.max_seq_len,
        "window_overlap": manifest.preprocessing.get("window_overlap"),
    }
    if manifest.task == "qa":
        recorded.update({**DEFAULT_QA, **(manifest.qa_defaults or {})})
    task = feature_task(task_name, TextTokenizer.from_dir(bundle), train_argv, recorded)
    to_data = {name: code for code, name in (label_names or {}).items()}
    labels = [to_data.get(label, label) for label in manifest.labels] if manifest.labels else None
    if manifest.problem_type == "regression":
        labels = ["regression"]
    info = manifest.variants[variant]
    if onnx_file is None:
        onnx_file, disabled_optimizers = bundle / info.file, info.disabled_optimizers
    head = OrtHead(onnx_file, threads, disabled_optimizers or [])
    started = time.perf_counter()
    metrics = run_evaluation(head, task, examples, labels, eval_batch_size)
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m train.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_argument_group("what to evaluate (one of)")
    where.add_argument("checkpoint", nargs="?", type=Path, help="a checkpoint directory (PyTorch)")
    where.add_argument("--bundle", type=Path, help="a bundle directory (ONNX Runtime)")
    where.add_argument("--url", help="a running service, e.g. http://127.0.0.1:8000")
    data = parser.add_argument_group("data (or the training run's data options after --)")
    data.add_argument("--task", choices=sorted(FORMATS))
    data.add_argument("--data", type=Path, help="evaluate every example of this file")
    data.add_argument("--format", default="auto", help="input format; auto-detected")
    data.add_argument("--limit", type=int, help="a random subset of this many examples")
    data.add_argument("--seed", type=int, default=42, help="seed of --limit")
    data.add_argument(
        "--label-names", help="data label -> model label, e.g. 0=negative,1=positive (SST-2's 0/1)"
    )
    options = parser.add_argument_group("options")
    options.add_argument("--variant", default="int8", help="--bundle: which variant")
    options.add_argument("--threads", type=int, default=2, help="--bundle: ONNX Runtime threads")
    options.add_argument("--eval-batch-size", type=int, default=64, help="checkpoint and --bundle")
    options.add_argument("--model", help="--url: the model name to ask for (default: the task's default)")
    options.add_argument("--concurrency", type=int, default=16, help="--url: requests in flight")
    options.add_argument("--api-key", help="--url: the service's API_KEY, if it has one")
    options.add_argument("--no-progress", dest="progress", action="store_false")
    return parser


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = build_parser()
    args, train_argv = parser.parse_args(argv[:split]), argv[split + 1 :]
    chosen = [x for x in (args.checkpoint, args.bundle, args.url) if x]
    if len(chosen) != 1:
        parser.error("give exactly one of CHECKPOINT, --bundle or --url")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    label_names = parse_label_names(args.label_names)
    task, examples = select_examples(train_argv, args.task, args.data, args.format, args.limit, args.seed)
    if args.url:
        from .live_eval import evaluate_live

        metrics = evaluate_live(
            args.url,
            task,
            examples,
            model=args.model,
            label_names=label_names,
            concurrency=args.concurrency,
            progress=args.progress,
            api_key=args.api_key,
        )
    elif args.bundle:
        metrics = evaluate_bundle(
            args.bundle,
            args.variant,
            task,
            examples,
            train_argv,
            label_names=label_names,
            threads=args.threads,
            eval_batch_size=args.eval_batch_size,
        )
    else:
        metrics = evaluate_checkpoint(args.checkpoint, task, examples, train_argv, args.eval_batch_size)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
