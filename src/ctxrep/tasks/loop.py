"""The estimators' training loop: length-bucketed batches, AdamW (ctxrep.train.optim), a schedule, clipping,
gradual unfreezing, per-epoch scores and early stopping.

Schedules (ctxrep.train.schedules):
  linear     lr_t = lr * t / w for t < w (warm-up), then lr * (T - t) / (T - w)
  slanted    ULMFiT (Howard & Ruder 2018, eq. 3): cut = floor(T * cut_frac),
             p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1)),
             lr_t = lr * (1 + p * (ratio - 1)) / ratio, with cut_frac = 0.1 and ratio = 32.
Discriminative fine-tuning: encoder layer l (0 = embeddings, L = top) gets lr / factor^(L - l); the head gets lr.
Gradual unfreezing: epoch 0 trains the head only; each later epoch unfreezes the next encoder layer down.
max_steps: when set, training stops after that many optimizer steps (the last epoch may be partial) and the
schedule is laid out over max_steps instead of max_epochs x batches per epoch (as transformers' max_steps).

Speed (benchmarks/finetune_vs_trainer.py, benchmarks/notes_finetune_speed.md): AdamW runs as torch's fused kernel
(settings.fused_adamw; False gives the for-loop reference, equal up to float rounding), and glibc malloc keeps freed
activation memory for the next step (ctxrep.train.allocator.tune_malloc, as the pretraining Trainer does).

Randomness comes from the caller: a numpy Generator for the batch order, and `seeded_torch(seed)` around the
loop for dropout, which leaves the global torch RNG as it found it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ctxrep.tasks.network import TaskNetwork, network_depths, unfreeze_from_top
from ctxrep.train.allocator import tune_malloc
from ctxrep.train.optim import adamw, discriminative, param_groups
from ctxrep.train.schedules import slanted_triangular, warmup_decay

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """Run the block on torch's CPU RNG seeded with `seed`; the global RNG state is restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@dataclass
class LoopSettings:
    """What the loop needs from an estimator's parameters (already validated)."""

    max_epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    slanted_triangular: bool
    max_grad_norm: float
    discriminative_lr_factor: float | None  # None: one learning rate
    gradual_unfreezing: bool
    early_stopping: bool
    n_iter_no_change: int
    tol: float
    progress: bool | str = False  # see progress_display
    desc: str = "fit"
    max_steps: int | None = None  # optimizer steps; None: max_epochs full epochs
    own_lr: tuple[str, float] | None = None  # (parameter-name prefix, its learning rate), e.g. the CRF's
    fused_adamw: bool = True  # torch's fused AdamW kernel where it applies; False: the for-loop reference
    bf16: bool = False  # bfloat16 autocast for the forward pass and the loss (weights and optimizer stay float32)


def progress_display(setting: bool | str, *, total: int | None, desc: str, unit: str):
    """The estimators' `progress` parameter as a display: False, nothing; True, a bar on a terminal and plain lines
    otherwise (ctxrep.util.progress.progress); "lines", plain lines at most every 10 s even on a terminal (what
    `ctxrep finetune --no-progress` asks for: a log that still says how far along the work is)."""
    from ctxrep.util.progress import LineProgress, progress

    if setting == "lines":
        return LineProgress(total=total, desc=desc, unit=unit)
    return progress(total=total, desc=desc, unit=unit, enabled=bool(setting))


def _shown(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def plan_steps(n_examples: int, settings: LoopSettings) -> tuple[int, int, int]:
    """(epochs to run, optimizer steps in all, warm-up steps) for `n_examples` training records."""
    steps_per_epoch = math.ceil(n_examples / settings.batch_size)
    if settings.max_steps is not None:
        total = settings.max_steps
        epochs = math.ceil(total / steps_per_epoch)
    else:
        epochs, total = settings.max_epochs, steps_per_epoch * settings.max_epochs
    return epochs, total, int(settings.warmup_fraction * total)


def warmup_warning(total: int, warmup: int, settings: LoopSettings) -> str | None:
    """What to say when the warm-up is as long as the run or longer (the learning rate never reaches lr)."""
    if settings.slanted_triangular or warmup == 0 or warmup < total:
        return None
    peak = (total - 1) / warmup  # the last step's multiplier of lr
    return (
        f"the warm-up ({warmup} steps = warmup_fraction {settings.warmup_fraction:g} x {total}) is as long as the "
        f"run ({total} optimizer steps) or longer: the learning rate never gets above {peak:.0%} of lr and never "
        "decays; lower warmup_fraction (e.g. 0.1; --warmup-fraction on `ctxrep finetune`)"
    )


def make_optimizer(network: TaskNetwork, settings: LoopSettings) -> torch.optim.AdamW:
    """AdamW with the one no-decay rule; with a discriminative factor, encoder layer l gets lr / factor^(L - l).
    With settings.own_lr = (prefix, lr), the parameters whose names start with prefix form their own groups (at
    depth L + 1) at that learning rate."""
    depth, top = network_depths(network)
    lr_at_depth = (
        discriminative(settings.lr, settings.discriminative_lr_factor, top)
        if settings.discriminative_lr_factor is not None
        else None
    )
    if settings.own_lr is not None:
        prefix, own = settings.own_lr
        depth = depth | {name: top + 1 for name, _ in network.named_parameters() if name.startswith(prefix)}
        below = lr_at_depth or (lambda d: settings.lr)

        def lr_at_depth(d):
            return own if d == top + 1 else below(d)

    return adamw(
        network,
        settings.lr,
        settings.weight_decay,
        depth=depth,
        default_depth=top,
        lr_at_depth=lr_at_depth,
        fused=settings.fused_adamw,
    )


def length_bucketed_batches(lengths: list[int], batch_size: int, rng: np.random.Generator, pool_batches: int = 50):
    """Random batches of similar length: shuffle, sort each pool of `pool_batches` batches by length, cut it into
    batches, shuffle the batches. Far less padding than plain random batches, and still a random order."""
    order = rng.permutation(len(lengths))
    pool = batch_size * pool_batches
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool].tolist(), key=lambda i: lengths[i])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    return [batches[k] for k in rng.permutation(len(batches))]


def bf16_autocast(device_type: str, enabled: bool):
    """bfloat16 autocast on `device_type` when enabled, else nothing (torch.autocast refuses some device types,
    such as "meta", even when disabled)."""
    return torch.autocast(device_type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def _optimizer(network: TaskNetwork, extra: nn.Module | None, settings: LoopSettings) -> torch.optim.Optimizer:
    """The network's optimizer, with `extra`'s parameters as further groups."""
    optimizer = make_optimizer(network, settings)
    if extra is not None:
        for group in param_groups(extra, settings.weight_decay):
            optimizer.add_param_group(group)  # lr: the optimizer's default, settings.lr
    return optimizer


def _scheduler(optimizer: torch.optim.Optimizer, settings: LoopSettings, total: int, warmup: int):
    """The learning-rate schedule: slanted triangular, or warm-up then linear decay."""

    def factor(step: int) -> float:
        return slanted_triangular(step, total) if settings.slanted_triangular else warmup_decay(step, warmup, total)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _step(network, batch, loss_of, optimizer, scheduler, settings: LoopSettings, device_type: str) -> torch.Tensor:
    """One optimizer step on `batch`; returns its loss."""
    with bf16_autocast(device_type, settings.bf16):
        loss = loss_of(network(batch), batch)
    optimizer.zero_grad()
    loss.backward()
    if settings.max_grad_norm:
        nn.utils.clip_grad_norm_(network.parameters(), settings.max_grad_norm)
    optimizer.step()
    scheduler.step()
    return loss


def train(
    network: TaskNetwork,
    examples: list,
    lengths: list[int],
    batch_of: Callable[[list], dict[str, torch.Tensor]],
    loss_of: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor],
    evaluate: Callable[[], dict[str, float]],
    settings: LoopSettings,
    rng: np.random.Generator,
    history: list[dict],
    first_epoch: int = 0,
    extra: nn.Module | None = None,
) -> float | None:
    """Train for settings.max_epochs epochs, or settings.max_steps optimizer steps when set (fewer with early
    stopping), appending one record per epoch to
    `history` ({"epoch", "train_loss"} plus what `evaluate()` returns; early stopping reads its
    "validation_score"). Returns the best validation score when early stopping kept the best epoch's weights.
    `extra`: a module outside the network whose parameters train too, at lr (e.g. a distillation loss's
    projection); it is not part of the network's weights or of early stopping's best state."""
    tune_malloc()  # a no-op off glibc or when the user set malloc's thresholds
    optimizer = _optimizer(network, extra, settings)
    epochs, total, warmup = plan_steps(len(examples), settings)
    advice = warmup_warning(total, warmup, settings)
    if advice is not None:
        warnings.warn(advice, stacklevel=3)  # at the caller of fit
    scheduler = _scheduler(optimizer, settings, total, warmup)
    device_type = next(network.parameters()).device.type
    best_score, best_state, since_best, steps = -math.inf, None, 0, 0
    bar = progress_display(settings.progress, total=total, desc=settings.desc, unit="batches")
    try:
        for epoch in range(epochs):
            if settings.gradual_unfreezing:
                unfreeze_from_top(network, epoch)
            network.train()
            epoch_loss, n = 0.0, 0
            for rows in length_bucketed_batches(lengths, settings.batch_size, rng):
                if steps == total:  # max_steps reached inside this epoch
                    break
                batch = batch_of([examples[i] for i in rows])
                loss = _step(network, batch, loss_of, optimizer, scheduler, settings, device_type)
                steps += 1
                epoch_loss += float(loss.detach())
                n += 1
                bar.set_postfix_str(f"epoch {first_epoch + epoch + 1}, loss {epoch_loss / n:.4f}", refresh=False)
                bar.update(1)
            network.eval()
            record = {"epoch": first_epoch + epoch + 1, "steps": steps, "train_loss": epoch_loss / max(1, n)}
            record |= evaluate()
            history.append(record)
            if settings.progress:
                bar.write(f"{settings.desc}: " + ", ".join(f"{k} {_shown(v)}" for k, v in record.items()))
            logger.info("epoch %s", record)
            if settings.early_stopping:
                score = record["validation_score"]
                if score > best_score + settings.tol:
                    best_score, since_best = score, 0
                    best_state = copy.deepcopy(network.state_dict())
                else:
                    since_best += 1
                    if since_best >= settings.n_iter_no_change:
                        logger.info("early stopping after epoch %d", record["epoch"])
                        break
    finally:
        bar.close()
        for p in network.parameters():
            p.requires_grad_(True)
        network.eval()
    if best_state is None:
        return None
    network.load_state_dict(best_state)
    return best_score
