"""Fine-tune (or pretrain) a BERT checkpoint: `python -m train --task classify --train ...`.

The output directory is a checkpoint in the Hugging Face layout (config with `task` and
`id2label`, weights, tokenizer files), with `best/` (best validation score), `train_state.pt`
(resume) and `metrics.json` (final validation metrics, wall time, command line).
"""

from __future__ import annotations

import logging
import random
import shlex
import sys
import time
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist

from model.bert import TASK_HEADS, BertModel
from model.checkpoint import CheckpointError, resolve_base
from model.config import BertConfig
from processing.tokenizer import TextTokenizer
from processing.words import split_words

from .cli import build_parser, data_options, feature_options, train_config
from .examples import DataError
from .features import DEFAULT_METRIC, TASKS, Task, check_metric
from .splits import read_file, split_examples, subsample
from .trainer import Trainer

T = TypeVar("T")

log = logging.getLogger("train.train")


def make_task(args, tokenizer: TextTokenizer) -> Task:
    """The task's feature builder with this run's preprocessing options."""
    return TASKS[args.task](tokenizer, feature_options(args))


def prepare_data(args, task, base_dir: Path, given_labels: list[str] | None):
    """Train and validation sets: datasets for pretraining, feature sets otherwise."""
    if args.task == "pretrain":
        from .pretrain_data import PretrainDataset

        if args.validation_fraction or args.limit_train or args.limit_eval or args.extra_train:
            raise ValueError(
                "pretraining takes --validation; --validation-fraction, --extra-train and --limit-* are "
                "for the fine-tuning tasks"
            )

        train = PretrainDataset(task.tokenizer, args.train, args.max_seq_len, args.seed)
        valid = (
            PretrainDataset(task.tokenizer, args.validation, args.max_seq_len, args.seed)
            if args.validation
            else None
        )
        return train, valid
    started = time.time()
    options = data_options(args)
    train_examples, valid_examples = split_examples(options)
    for path in args.extra_train:
        train_examples += subsample(read_file(options, path, "auto"), args.limit_extra, args.seed)
    if args.task == "ner":
        check_word_split(train_examples, args.word_split)
    task.fit_labels(train_examples, given_labels, base_labels(args.task, base_dir))
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
    task: Task, base_dir: Path, extra: dict | None = None, scratch_config: Path | None = None
) -> torch.nn.Module:
    """The task head on the base encoder. A base head of another label set is replaced by a new one.
    With `scratch_config`, every weight is random and the base gives only the tokenizer."""
    overrides: dict = {"task": task.name}
    if task.id2label is not None:
        overrides["id2label"] = task.id2label
    if task.problem_type is not None:
        overrides["problem_type"] = task.problem_type
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
    base_dir = resolve_base(args.base)
    tokenizer = TextTokenizer.from_dir(base_dir)
    if tokenizer.vocab_size < 1:
        raise SystemExit(f"{base_dir}: empty tokenizer")
    task = make_task(args, tokenizer)
    given = [s.strip() for s in args.labels.split(",")] if args.labels else None
    train, valid = prepare_data(args, task, base_dir, given)

    torch.manual_seed(args.seed)  # head initialisation does not depend on how the data was read
    model = build_model(task, base_dir, model_extra(args, task), args.scratch_config)
    metric = args.metric_for_best or DEFAULT_METRIC[args.task]
    if args.task == "classify" and task.problem_type == "regression" and not args.metric_for_best:
        metric = "pearson"
    config = train_config(args, metric)
    # "python", not this interpreter's path: the command is recorded in results files for others to run.
    command = shlex.join(["python", "-m", "train", *(argv if argv is not None else sys.argv[1:])])
    trainer = Trainer(
        model,
        task,
        train,
        valid,
        config,
        args.out,
        log_dir=args.log_dir or args.out / "runs",
        command=command,
    )
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
