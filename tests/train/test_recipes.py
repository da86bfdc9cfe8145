"""train/recipes.py: a recipe's stages train in order, each from the one before, and all are reported."""

from __future__ import annotations

import json


def option(cmd: list[str], name: str) -> str:
    return cmd[len(cmd) - 1 - cmd[::-1].index(name) + 1]  # the last occurrence wins, as in argparse


def test_stages_chain_into_the_task(tmp_path):
    from train.recipes import BASE, recipes, train_commands

    recipe = recipes(tmp_path)["squad"]
    assert recipe["stages"], "the squad recipe starts with an intermediate stage"
    commands = train_commands("squad", recipe, threads=2)
    assert len(commands) == len(recipe["stages"]) + 1
    assert option(commands[0][1], "--base") == BASE
    for (previous_out, _), (_, cmd) in zip(commands, commands[1:], strict=False):
        assert option(cmd, "--base") == str(previous_out)
    final_out, final_cmd = commands[-1]
    assert final_out.name == "squad" and option(final_cmd, "--out") == str(final_out)
    assert option(final_cmd, "--train").endswith("squad-v1.1-dev-part-b.json")
    assert len({out for out, _ in commands}) == len(commands), "each stage writes its own directory"


def test_a_recipe_without_stages_is_one_command(tmp_path):
    from train.recipes import BASE, recipes, train_commands

    [(out, cmd)] = train_commands("sst2", recipes(tmp_path)["sst2"], threads=1, precision="fp32")
    assert out.name == "sst2" and option(cmd, "--base") == BASE and option(cmd, "--num-threads") == "1"
    assert option(cmd, "--precision") == "fp32"


def result(metric_value: float, **commands) -> dict:
    return {
        "task": "qa",
        "metric": "f1",
        "full_finetune": {"f1": metric_value},
        "compact": {"f1": metric_value - 0.5},
        "compact_cost": 0.5,
        "compact_bytes": 5_500_000,
        "train_wall_time_s": 600.0,
        "train_steps": 100,
        **commands,
    }


def test_results_list_every_stage_command(tmp_path):
    from train.recipes import merge_results

    path = tmp_path / "finetune.json"
    merge_results({"sst2": result(90.0, train_commands=["train sst2"])}, path)
    merge_results({"squad": result(70.0, train_commands=["train race", "train squad"])}, path)
    assert set(json.loads(path.read_text())["tasks"]) == {"sst2", "squad"}
    table = path.with_suffix(".md").read_text()
    assert "- sst2: `train sst2`" in table
    assert "- squad: `train race`, then `train squad`" in table


def test_results_hold_no_machine_paths_and_say_what_trained(tmp_path):
    from train.recipes import REPO, merge_results

    path = tmp_path / "finetune.json"
    merge_results({"sst2": result(90.0, train_commands=[f"python -m train --out {REPO}/runs/sst2"])}, path, 2)
    report = json.loads(path.read_text())
    assert report["tasks"]["sst2"]["train_commands"] == ["python -m train --out runs/sst2"]
    assert str(REPO) not in path.with_suffix(".md").read_text()
    assert report["machine"]["threads_used"] == 2 and "torch" in report["machine"]["versions"]
