"""Learning-rate schedules for fine-tuning and pretraining.

Every schedule is a pure function `step -> multiplier`; `get_schedule` wraps it in a
`torch.optim.lr_scheduler.LambdaLR`, which sets each parameter group's lr to
`group_initial_lr * multiplier(step)`. Call `scheduler.step()` once after every
`optimizer.step()`; the step counter starts at 0.

Warmup (where a schedule has one) ramps the multiplier linearly from 0 at step 0 to 1 at
`num_warmup_steps`. The decaying schedules follow the Hugging Face `transformers`
formulas, so `linear`, `cosine`, ... give identical learning rates step for step.

The "noam" schedule (Vaswani et al., "Attention Is All You Need", section 5.3) is absolute
rather than relative: its multiplier is

    scale * d_model ** -0.5 * min(step ** -0.5, step * num_warmup_steps ** -1.5)

which already *is* a learning rate (peak ~7e-4 for d_model=512, warmup=4000). LambdaLR still
multiplies it by the optimizer's lr, so build the optimizer with `lr=1.0` to get the paper's
numbers, or treat the optimizer's lr as an extra factor (effective lr = optimizer lr * scale *
d_model^-0.5 * ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = (
    "constant",
    "constant_with_warmup",
    "linear",
    "polynomial",
    "cosine",
    "cosine_with_restarts",
    "noam",
)
# Schedules that decay towards the end of training and so need its length.
NEEDS_TRAINING_STEPS = {"linear", "polynomial", "cosine", "cosine_with_restarts"}


def _warmup(step: int, num_warmup_steps: int) -> float:
    return step / max(1, num_warmup_steps)


def _progress(step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    """Fraction of the post-warmup phase done: 0 at the end of warmup, 1 at the last step."""
    return (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)


def constant(step: int) -> float:
    return 1.0


def constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return 1.0


def linear(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return max(0.0, 1.0 - _progress(step, num_warmup_steps, num_training_steps))


def polynomial(
    step: int, *, num_warmup_steps: int, num_training_steps: int, lr_init: float, lr_end: float, power: float
) -> float:
    """Decay from lr_init to lr_end as (1 - progress) ** power; stays at lr_end afterwards."""
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init
    remaining = 1.0 - _progress(step, num_warmup_steps, num_training_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def cosine(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    """num_cycles=0.5 is half a cosine wave: 1 at the end of warmup down to 0 at the last step."""
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = _progress(step, num_warmup_steps, num_training_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress)))


def cosine_with_restarts(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int
) -> float:
    """num_cycles half-cosine decays from 1 to 0, each restarting (hard) at 1."""
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = _progress(step, num_warmup_steps, num_training_steps)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((num_cycles * progress) % 1.0))))


def noam(step: int, *, num_warmup_steps: int, d_model: int, scale: float) -> float:
    # Step 0 would divide by zero; like the reference implementation, treat it as step 1.
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * num_warmup_steps**-1.5)


def _lambda_for(
    name: str, optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int | None, kwargs: dict
) -> Callable[[int], float] | list[Callable[[int], float]]:
    allowed: dict[str, dict[str, Any]] = {
        "constant": {},
        "constant_with_warmup": {},
        "linear": {},
        "polynomial": {"lr_end": 1e-7, "power": 1.0},
        "cosine": {"num_cycles": 0.5},
        "cosine_with_restarts": {"num_cycles": 1},
        "noam": {"d_model": None, "scale": 1.0},
    }[name]
    if name == "noam" and "factor" in kwargs:  # the Annotated Transformer's name for scale
        kwargs = dict(kwargs)
        kwargs["scale"] = kwargs.pop("factor")
    unknown = set(kwargs) - set(allowed)
    if unknown:
        raise ValueError(
            f"schedule {name!r} does not take {sorted(unknown)}; "
            f"it accepts {sorted(allowed) or 'no extra options'}"
        )
    options = {**allowed, **kwargs}

    if name == "constant":
        return constant
    if name == "constant_with_warmup":
        return partial(constant_with_warmup, num_warmup_steps=num_warmup_steps)
    if name == "noam":
        if options["d_model"] is None or options["d_model"] <= 0:
            raise ValueError("schedule 'noam' needs d_model=<hidden size> (a positive int)")
        if num_warmup_steps <= 0:
            raise ValueError("schedule 'noam' needs num_warmup_steps > 0")
        return partial(
            noam, num_warmup_steps=num_warmup_steps, d_model=options["d_model"], scale=options["scale"]
        )

    assert num_training_steps is not None  # checked by get_schedule
    steps = {"num_warmup_steps": num_warmup_steps, "num_training_steps": num_training_steps}
    if name == "linear":
        return partial(linear, **steps)
    if name == "cosine":
        return partial(cosine, **steps, num_cycles=options["num_cycles"])
    if name == "cosine_with_restarts":
        return partial(cosine_with_restarts, **steps, num_cycles=options["num_cycles"])

    # polynomial: lr_end is absolute, so the multiplier depends on each group's starting lr.
    lambdas = []
    for group in optimizer.param_groups:
        lr_init = group.get("initial_lr", group["lr"])
        if not lr_init > options["lr_end"]:
            raise ValueError(
                f"polynomial schedule: lr_end ({options['lr_end']}) must be below the lr ({lr_init})"
            )
        lambdas.append(
            partial(polynomial, **steps, lr_init=lr_init, lr_end=options["lr_end"], power=options["power"])
        )
    return lambdas


def get_schedule(
    name: str,
    optimizer: Optimizer,
    num_warmup_steps: int = 0,
    num_training_steps: int | None = None,
    **kwargs: Any,
) -> LambdaLR:
    """A LambdaLR for schedule `name` (one of SCHEDULES).

    Extra options: polynomial(lr_end=1e-7, power=1.0), cosine(num_cycles=0.5),
    cosine_with_restarts(num_cycles=1), noam(d_model=..., scale=1.0; `factor` is an alias).
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}")
    if name in NEEDS_TRAINING_STEPS:
        if num_training_steps is None:
            raise ValueError(
                f"schedule {name!r} needs num_training_steps (the total number of optimizer steps)"
            )
        if num_training_steps <= 0:
            raise ValueError(f"num_training_steps must be > 0, got {num_training_steps}")
        if num_warmup_steps > num_training_steps:
            raise ValueError(
                f"num_warmup_steps ({num_warmup_steps}) is larger than "
                f"num_training_steps ({num_training_steps})"
            )
    return LambdaLR(
        optimizer, _lambda_for(name, optimizer, num_warmup_steps, num_training_steps, dict(kwargs))
    )
