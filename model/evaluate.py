"""Evaluate a checkpoint on the validation data a training run used.

    python -m model.evaluate CHECKPOINT -- <the same data options as model.train>

The data options (task, --train, --validation / --validation-fraction, --seed,
--max-seq-len, ...) go through model.train's own parser and data preparation, so a
held-out split is exactly the one the training run held out.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch

from processing.tokenizer import TextTokenizer

from .bert import TASK_HEADS
from .train import build_parser, make_task, prepare_data
from .trainer import TrainConfig, Trainer


def evaluate_checkpoint(checkpoint: Path, train_argv: list[str], eval_batch_size: int = 64) -> dict:
    args = build_parser().parse_args([*train_argv, "--base", str(checkpoint), "--out", "unused"])
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    tokenizer = TextTokenizer.from_dir(checkpoint)
    task = make_task(args, tokenizer)
    train, valid = prepare_data(args, task, checkpoint, None)
    if valid is None:
        raise SystemExit("no validation data: pass --validation or --validation-fraction")
    model = TASK_HEADS[args.task].from_pretrained(checkpoint)
    config = TrainConfig(batch_size=1, eval_batch_size=eval_batch_size, precision="fp32", progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, task, train, valid, config, tmp, log_dir=Path(tmp) / "runs")
        return trainer.evaluate()


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m model.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    split = argv.index("--") if "--" in argv else len(argv)
    args, train_argv = parser.parse_args(argv[:split]), argv[split + 1 :]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = evaluate_checkpoint(args.checkpoint, train_argv, args.eval_batch_size)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
