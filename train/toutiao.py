"""Package the Chinese news classifier as a default: `python -m train.toutiao CHECKPOINT`.

The checkpoint is the recipe's best (docs/pretraining.md: pieces vocabulary, MLM + NSP
pretraining, fine-tuning, all here). Its labels are the data's codes 0-14; the default answers
with the categories' names (train.zh_baseline.CATEGORIES, where the mapping comes from). Every
weight is stored in fp16 (model.compact.store_fp16), and `python -m export.defaults` rebuilds the
served bundle from exactly those values, so the accuracy measured on it is the one served.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .zh_baseline import CATEGORIES

REPO = Path(__file__).resolve().parent.parent
NAME = "toutiao-zh"
LABEL_NAMES = {str(code): name for code, name in enumerate(CATEGORIES)}


def package(checkpoint: Path, out: Path) -> dict:
    from model.compact import store_fp16
    from model.config import BertConfig

    from .recipes import rename_labels

    config = BertConfig.from_pretrained(checkpoint)
    codes = sorted(config.id2label.values())
    if codes != sorted(LABEL_NAMES):
        raise ValueError(f"{checkpoint}: labels {codes}, expected the codes 0-14 of the Toutiao data")
    report = store_fp16(checkpoint, out)
    rename_labels(out, LABEL_NAMES)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="the fine-tuned checkpoint (its best/ directory)")
    p.add_argument("--out", type=Path, default=REPO / "defaults" / NAME)
    args = p.parse_args(argv)
    print(json.dumps(package(args.checkpoint, args.out), indent=2))


if __name__ == "__main__":
    main()
