"""Learning-rate schedules as multipliers of the peak rate: `lr(step) = peak_lr * multiplier(step)`.

Each is a plain function of the step (the number of optimizer steps already taken), so it can drive
`torch.optim.lr_scheduler.LambdaLR` through `functools.partial`:

    LambdaLR(optimizer, functools.partial(warmup_decay, warmup_steps=100, max_steps=1000, kind="cosine"))

`SCHEDULES` is the table of the schedules a run may name (TrainerConfig.schedule, `--trainer.schedule`), each a
function of (step, warmup_steps, max_steps).

warmup_decay (BERT, RoBERTa; cosine as in GPT-3 / nanoGPT, decaying to zero):
    step < W:   step / W
    step >= W:  linear  1 - p          with p = (step - W) / (T - W), clipped to [0, 1]
                cosine  (1 + cos(pi p)) / 2

slanted_triangular (ULMFiT, Howard & Ruder 2018, eq. 3), T steps, cut = floor(T * cut_frac):
    p = t / cut                                      if t < cut
        1 - (t - cut) / (cut * (1 / cut_frac - 1))   otherwise
    multiplier = (1 + p * (ratio - 1)) / ratio
so it rises from 1/ratio to 1 over the first cut_frac of the steps, then falls back to 1/ratio at t = T.
"""

from __future__ import annotations

import math
from collections.abc import Callable

DECAYS = ("linear", "cosine")


def warmup_decay(step: int, warmup_steps: int, max_steps: int, kind: str = "linear") -> float:
    """Linear warm-up from 0 to 1 over `warmup_steps`, then linear or cosine decay to 0 at `max_steps`."""
    if kind not in DECAYS:
        raise ValueError(f"unknown schedule {kind!r}; use one of {', '.join(DECAYS)}")
    if step < warmup_steps:
        return step / warmup_steps
    if max_steps <= warmup_steps:
        return 1.0 if step < max_steps else 0.0
    p = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
    if kind == "linear":
        return 1.0 - p
    return 0.5 * (1.0 + math.cos(math.pi * p))


def slanted_triangular(step: int, total_steps: int, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """ULMFiT's slanted triangular rate (eq. 3) as a multiplier of eta_max; defaults are the paper's."""
    if not 0.0 < cut_frac < 1.0:
        raise ValueError(f"cut_frac={cut_frac} must be between 0 and 1 (exclusive); ULMFiT uses 0.1")
    if ratio < 1.0:
        raise ValueError(f"ratio={ratio} must be at least 1; ULMFiT uses 32")
    cut = max(1, math.floor(total_steps * cut_frac))
    if step < cut:
        p = step / cut
    else:
        p = max(0.0, 1.0 - (step - cut) / (cut * (1.0 / cut_frac - 1.0)))
    return (1.0 + p * (ratio - 1.0)) / ratio


# name -> multiplier of (step, warmup_steps, max_steps); the slanted triangle has its own rise (cut_frac), no warm-up
SCHEDULES: dict[str, Callable[[int, int, int], float]] = {
    "linear": lambda step, warmup, total: warmup_decay(step, warmup, total, "linear"),
    "cosine": lambda step, warmup, total: warmup_decay(step, warmup, total, "cosine"),
    "slanted_triangular": lambda step, warmup, total: slanted_triangular(step, total),
}
WARMS_UP = ("linear", "cosine")  # the schedules that read warmup_steps
