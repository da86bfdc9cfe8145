"""Learning-rate schedules: closed-form values at key steps, and step-by-step agreement with
the reference implementations in `transformers.optimization`."""

from __future__ import annotations

import math

import pytest
import torch

from train.schedules import SCHEDULES, get_schedule

BASE_LR = 1e-3
WARMUP = 10
TOTAL = 100


def _optimizer(lr: float = BASE_LR) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _lrs(scheduler: torch.optim.lr_scheduler.LambdaLR, steps: int) -> list[float]:
    """The learning rate in force at steps 0..steps-1 (what each optimizer.step() would use)."""
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return lrs


def _schedule_lrs(name: str, steps: int = TOTAL + 5, **kwargs) -> list[float]:
    kwargs.setdefault("num_warmup_steps", WARMUP)
    if name in {"linear", "polynomial", "cosine", "cosine_with_restarts"}:
        kwargs.setdefault("num_training_steps", TOTAL)
    return _lrs(get_schedule(name, _optimizer(), **kwargs), steps)


def test_schedule_names_listed() -> None:
    assert set(SCHEDULES) == {
        "constant",
        "constant_with_warmup",
        "linear",
        "polynomial",
        "cosine",
        "cosine_with_restarts",
        "noam",
    }


def test_constant() -> None:
    lrs = _schedule_lrs("constant")
    assert lrs == pytest.approx([BASE_LR] * len(lrs))


def test_constant_with_warmup() -> None:
    lrs = _schedule_lrs("constant_with_warmup")
    assert lrs[0] == 0.0
    assert lrs[WARMUP // 2] == pytest.approx(BASE_LR / 2)
    assert lrs[WARMUP:] == pytest.approx([BASE_LR] * (len(lrs) - WARMUP))


def test_linear() -> None:
    lrs = _schedule_lrs("linear")
    assert lrs[0] == 0.0
    assert lrs[3] == pytest.approx(BASE_LR * 3 / WARMUP)
    assert lrs[WARMUP] == pytest.approx(BASE_LR)
    middle = (WARMUP + TOTAL) // 2
    assert lrs[middle] == pytest.approx(BASE_LR * 0.5)
    assert lrs[TOTAL - 1] == pytest.approx(BASE_LR / (TOTAL - WARMUP))
    assert lrs[TOTAL:] == [0.0] * (len(lrs) - TOTAL)  # never negative after the end


def test_polynomial() -> None:
    lr_end, power = 1e-5, 2.0
    lrs = _schedule_lrs("polynomial", lr_end=lr_end, power=power)
    assert lrs[WARMUP // 2] == pytest.approx(BASE_LR / 2)
    assert lrs[WARMUP] == pytest.approx(BASE_LR)
    middle = (WARMUP + TOTAL) // 2
    assert lrs[middle] == pytest.approx((BASE_LR - lr_end) * 0.5**power + lr_end)
    assert lrs[TOTAL] == pytest.approx(lr_end)
    assert lrs[TOTAL + 3] == pytest.approx(lr_end)  # stays at lr_end afterwards


def test_polynomial_uses_each_groups_own_lr() -> None:
    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1e-3},
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1e-4},
    ]
    scheduler = get_schedule(
        "polynomial", torch.optim.SGD(groups), num_warmup_steps=0, num_training_steps=10, lr_end=1e-6
    )
    for _ in range(10):
        scheduler.optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([1e-6, 1e-6])


def test_cosine() -> None:
    lrs = _schedule_lrs("cosine")
    assert lrs[WARMUP // 2] == pytest.approx(BASE_LR / 2)
    assert lrs[WARMUP] == pytest.approx(BASE_LR)
    middle = (WARMUP + TOTAL) // 2
    assert lrs[middle] == pytest.approx(BASE_LR * 0.5)
    quarter = WARMUP + (TOTAL - WARMUP) // 4
    progress = (quarter - WARMUP) / (TOTAL - WARMUP)
    assert lrs[quarter] == pytest.approx(BASE_LR * 0.5 * (1 + math.cos(math.pi * progress)))
    assert lrs[TOTAL] == pytest.approx(0.0, abs=1e-12)


def test_cosine_with_restarts() -> None:
    lrs = _schedule_lrs("cosine_with_restarts", num_warmup_steps=0, num_cycles=2)
    half = TOTAL // 2
    assert lrs[0] == pytest.approx(BASE_LR)
    assert lrs[half // 2] == pytest.approx(BASE_LR * 0.5)  # middle of the first cycle
    assert lrs[half - 1] < 0.01 * BASE_LR  # bottom of the first cycle...
    assert lrs[half] == pytest.approx(BASE_LR)  # ...hard restart
    assert lrs[half + half // 2] == pytest.approx(BASE_LR * 0.5)
    assert lrs[TOTAL:] == [0.0] * (len(lrs) - TOTAL)


def test_noam_formula_and_peak() -> None:
    d_model, warmup, scale = 512, 40, 2.0
    # lr=1.0 makes the multiplier the learning rate itself, as in the paper.
    scheduler = get_schedule(
        "noam", _optimizer(lr=1.0), num_warmup_steps=warmup, d_model=d_model, scale=scale
    )
    lrs = _lrs(scheduler, 4 * warmup)

    def expected(step: int) -> float:
        step = max(step, 1)
        return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    for step in (0, 1, warmup // 2, warmup, 2 * warmup, 4 * warmup - 1):
        assert lrs[step] == pytest.approx(expected(step))
    assert max(range(len(lrs)), key=lrs.__getitem__) == warmup  # rises until warmup, then decays
    assert lrs[warmup] == pytest.approx(scale * (d_model * warmup) ** -0.5)
    assert lrs[4 * warmup - 1] < lrs[2 * warmup] < lrs[warmup]


def test_noam_base_lr_multiplies_and_factor_alias() -> None:
    with_factor = get_schedule("noam", _optimizer(lr=0.5), num_warmup_steps=8, d_model=64, factor=3.0)
    with_scale = get_schedule("noam", _optimizer(lr=1.0), num_warmup_steps=8, d_model=64, scale=1.5)
    assert _lrs(with_factor, 20) == pytest.approx(_lrs(with_scale, 20))


transformers_optimization = pytest.importorskip("transformers.optimization")


@pytest.mark.parametrize(
    ("name", "kwargs", "reference"),
    [
        ("constant", {}, lambda opt: transformers_optimization.get_constant_schedule(opt)),
        (
            "constant_with_warmup",
            {"num_warmup_steps": 7},
            lambda opt: transformers_optimization.get_constant_schedule_with_warmup(opt, 7),
        ),
        (
            "linear",
            {"num_warmup_steps": 7, "num_training_steps": 50},
            lambda opt: transformers_optimization.get_linear_schedule_with_warmup(opt, 7, 50),
        ),
        (
            "polynomial",
            {"num_warmup_steps": 7, "num_training_steps": 50, "lr_end": 1e-6, "power": 3.0},
            lambda opt: transformers_optimization.get_polynomial_decay_schedule_with_warmup(
                opt, 7, 50, lr_end=1e-6, power=3.0
            ),
        ),
        (
            "cosine",
            {"num_warmup_steps": 7, "num_training_steps": 50},
            lambda opt: transformers_optimization.get_cosine_schedule_with_warmup(opt, 7, 50),
        ),
        (
            "cosine_with_restarts",
            {"num_warmup_steps": 7, "num_training_steps": 50, "num_cycles": 3},
            lambda opt: transformers_optimization.get_cosine_with_hard_restarts_schedule_with_warmup(
                opt, 7, 50, num_cycles=3
            ),
        ),
    ],
)
def test_matches_transformers(name: str, kwargs: dict, reference) -> None:
    ours = _lrs(get_schedule(name, _optimizer(), **kwargs), 60)
    theirs = _lrs(reference(_optimizer()), 60)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15)


def test_unknown_schedule_name() -> None:
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'cosinus'.*linear"):
        get_schedule("cosinus", _optimizer())


@pytest.mark.parametrize("name", ["linear", "polynomial", "cosine", "cosine_with_restarts"])
def test_decaying_schedules_need_training_steps(name: str) -> None:
    with pytest.raises(ValueError, match="needs num_training_steps"):
        get_schedule(name, _optimizer(), num_warmup_steps=5)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="does not take"):
        get_schedule("linear", _optimizer(), num_training_steps=10, power=2.0)
    with pytest.raises(ValueError, match="larger than num_training_steps"):
        get_schedule("linear", _optimizer(), num_warmup_steps=20, num_training_steps=10)
    with pytest.raises(ValueError, match="needs d_model"):
        get_schedule("noam", _optimizer(), num_warmup_steps=10)
    with pytest.raises(ValueError, match="num_warmup_steps > 0"):
        get_schedule("noam", _optimizer(), d_model=64)
    with pytest.raises(ValueError, match="lr_end"):
        get_schedule("polynomial", _optimizer(lr=1e-8), num_training_steps=10)
