"""The Chinese default's packaging: the data's codes become the categories' names, and the stored
fp16 weights rebuild into a checkpoint that answers with them."""

from __future__ import annotations

import pytest
import torch

from model import bert
from model.compact import rebuild_fp16
from tests.helpers.tiny import tiny_config, write_tokenizer_files
from train.toutiao import LABEL_NAMES, package
from train.zh_baseline import CATEGORIES


def test_package_names_the_categories_and_rebuilds(tmp_path):
    write_tokenizer_files(tmp_path / "ckpt")
    codes = [str(i) for i in range(15)]
    config = tiny_config("classify")
    config.id2label = dict(enumerate(sorted(codes)))  # as the trainer sorts the data's labels
    torch.manual_seed(0)
    bert.BertForSequenceClassification(config).save_pretrained(
        tmp_path / "ckpt", tokenizer_from=tmp_path / "ckpt"
    )
    package(tmp_path / "ckpt", tmp_path / "default")
    rebuilt = bert.BertForSequenceClassification.from_pretrained(
        rebuild_fp16(tmp_path / "default", tmp_path / "r")
    )
    assert {rebuilt.config.id2label[i] for i in range(15)} == set(CATEGORIES)
    for i, code in config.id2label.items():  # the same output index keeps its meaning
        assert rebuilt.config.id2label[i] == LABEL_NAMES[code]
    assert LABEL_NAMES["3"] == "体育" and LABEL_NAMES["14"] == "电竞"


def test_package_refuses_other_labels(tmp_path):
    write_tokenizer_files(tmp_path / "ckpt")
    bert.BertForSequenceClassification(tiny_config("classify")).save_pretrained(
        tmp_path / "ckpt", tokenizer_from=tmp_path / "ckpt"
    )
    with pytest.raises(ValueError, match="codes 0-14"):
        package(tmp_path / "ckpt", tmp_path / "default")
