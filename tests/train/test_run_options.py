"""The training command line maps onto typed configs by field name; evaluation reads those."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from train.features import FeatureOptions
from train.splits import DataOptions
from train.train import build_parser, run_options
from train.trainer import TrainConfig


@pytest.mark.parametrize("config", [TrainConfig, FeatureOptions, DataOptions])
def test_every_config_field_is_a_command_line_option(config) -> None:
    dests = {action.dest for action in build_parser()._actions}
    missing = {f.name for f in fields(config)} - dests
    assert not missing, f"{config.__name__} fields without an option: {missing}"


def test_run_options_are_typed_from_a_training_command_line() -> None:
    options = run_options(
        ["--task", "classify", "--train", "sst2/train.tsv", "--validation-fraction", "0.12"]
        + ["--holdout", "whole-texts", "--max-seq-len", "64", "--window-overlap", "8", "--num-threads", "1"]
    )
    assert options.data == DataOptions(
        task="classify", train=Path("sst2/train.tsv"), validation_fraction=0.12, holdout="whole-texts"
    )
    assert options.features == FeatureOptions(max_seq_len=64, window_overlap=8)
    assert options.num_threads == 1
