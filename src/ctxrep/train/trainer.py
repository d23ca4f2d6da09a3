"""The one training loop: pretraining, translation, every task estimator and the sentence / sparse encoders.

    trainer = Trainer(objective, TrainerConfig(lr=5e-4, max_steps=10_000), packer, "runs/bert-small",
                      eval_data=held_out_packer, save_model=lambda d: model.save_pretrained(d / "model"))
    metrics = trainer.train()              # Ctrl-C: finishes the step, saves a checkpoint, returns
    TrainerConfig(max_minutes=10, max_steps=10**9)  # a run bounded by the clock: the bar shows minutes, not steps
    metrics = trainer.train(resume=True)   # continues from runs/bert-small/checkpoint/ exactly

    # a task estimator's fit: examples in epochs (train/batches.py), no files; one record per epoch
    trainer = Trainer(objective, TrainerConfig(lr=1e-4, max_steps=steps, seed=None), EpochBatches(plan, collate, rng),
                      evaluate=dev_scores, optimizer=groups_by_depth, early_stopping=EarlyStopping("validation_score"))
    trainer.train(); trainer.epochs

The objective is an nn.Module whose forward(batch) returns an `ObjectiveOutput` (a task's network and loss wrapped
as one, `ObjectiveOf`); it does its own masking with the global torch RNG. The batch source is any object with
next_batch(n), state_dict() (JSON-serialisable) and load_state_dict(state) (train/batches.py): an endless stream
(the packers in ctxrep.data.packing) or examples in epochs, whose next_batch returns None when an epoch ends.

Written once here, for every trainer: AdamW (train/optim.py's builder, or an optimizer the caller built over its own
groups: discriminative learning rates), the schedule (train/schedules.py's table, or a function), accumulation,
bf16 autocast, clipping, DDP or FSDP2 under torchrun (train/distributed.py: sharded checkpoints, a final model of
whole tensors), activation checkpointing of every encoder in the objective (Encoder.gradient_checkpointing_enable),
a memory estimate before the first step that stops a run that cannot fit (train/memory.py), a non-finite loss
stopped with advice, evaluation (the held-out loss and
the caller's metrics: every eval_every steps, after every epoch and at the end), per-epoch hooks (gradual
unfreezing), early stopping with the best epoch's weights put back, progress (ctxrep.util.progress) with the peak
memory measured (util/memory.py; `peak_memory_bytes` in every step's log record and the result; epoch records,
an estimator's history_, hold only what the same seed repeats), and with an out_dir:
log.jsonl, checkpoints, exact resume and Ctrl-C.

One optimizer step sees `batch_size` rows in `accumulation_steps` micro-batches of
batch_size / accumulation_steps rows each (shared out between processes under torchrun, see
ctxrep.train.distributed). Each micro-batch's loss is divided by accumulation_steps, so the summed gradient
is the gradient of the mean over micro-batches: equal to one big batch when the objective's loss is a mean
over rows of equal weight (fixed-length rows, or a fixed number of predicted tokens per row). A step cut short by
the end of an epoch is the mean over the micro-batches it had.

Exact resume: the checkpoint holds the model, AdamW moments, scheduler, the data source's position and
every RNG state, and evaluation runs on a forked RNG with the same held-out batches each time, so a run
interrupted at any step and resumed ends with the same parameters as one that never stopped.

Randomness: `seed` seeds torch, numpy and random for the run (+ the rank under torchrun); seed=None leaves the RNGs
as the caller set them (the estimators run the loop inside `seeded_torch(seed)`, which restores torch's RNG after).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm  # tqdm.write: a line that does not break a bar on a terminal

from ctxrep.models.encoder import Encoder
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.train import distributed
from ctxrep.train.allocator import tune_malloc
from ctxrep.train.batches import BatchSource, EpochBatches
from ctxrep.train.checkpoint import check_fingerprint, fingerprint, load_checkpoint, read_state, save_checkpoint
from ctxrep.train.memory import MemoryEstimate, available, encoders_of
from ctxrep.train.optim import adamw, param_groups  # noqa: F401  (param_groups: its old home, still imported)
from ctxrep.train.precision import bf16_autocast
from ctxrep.train.schedules import SCHEDULES, WARMS_UP
from ctxrep.util.memory import PeakMemory, format_bytes
from ctxrep.util.progress import progress_from

logger = logging.getLogger(__name__)

LOG_FILE = "log.jsonl"
CHECKPOINT_DIR = "checkpoint"
# Settings that may change when a run is resumed; any other change would make it a different run.
RESUMABLE_CHANGES = (
    "max_steps",
    "max_minutes",
    "eval_every",
    "eval_batches",
    "checkpoint_every",
    "log_every",
    "device",
    "gradient_checkpointing",
)


class TrainerError(ValueError):
    """A trainer setting or input that cannot work, with what to change."""


@contextlib.contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """Run the block on torch's CPU RNG seeded with `seed`; the global RNG state is restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class ObjectiveOf(nn.Module):
    """A network and its loss as one objective: forward(batch) -> ObjectiveOutput(loss(network(batch), batch)).
    `loss` may be an nn.Module with parameters of its own (they train too, and are saved with the objective);
    `rows(batch)` counts what tokens/s counts (default: the batch's rows)."""

    def __init__(self, network: nn.Module, loss: Callable, rows: Callable[[Any], int] | None = None) -> None:
        super().__init__()
        self.network = network
        self.loss = loss
        self.rows = rows or _rows

    def forward(self, batch) -> ObjectiveOutput:
        return ObjectiveOutput(self.loss(self.network(batch), batch), self.rows(batch))


@dataclass
class EarlyStopping:
    """Stop when the epoch metric `metric` (higher is better) has not improved by more than `tol` for `patience`
    epochs; the weights of `module` (default: the objective) from the best epoch are put back at the end."""

    metric: str
    patience: int = 2
    tol: float = 1e-4
    module: nn.Module | None = None


@dataclass
class TrainerConfig:
    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 0.01  # AdamW, on matrices only (not biases or LayerNorm weights): train/optim.py
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    warmup_steps: int = 0
    max_steps: int = 1000  # optimizer steps
    # Wall-clock minutes of one train() call (evaluations and checkpoints included; a resumed run gets them afresh);
    # the run ends at max_steps or at the clock, whichever comes first, as a finished run (evaluated, saved).
    # 0 = no clock. The warm-up + decay schedule is laid out over max_steps whatever the clock says.
    max_minutes: float = 0.0
    schedule: str = "linear"  # decay after the warm-up: "linear" or "cosine", to zero at max_steps
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    batch_size: int = 32  # rows per optimizer step, over all micro-batches and processes
    accumulation_steps: int = 1  # micro-batches per optimizer step
    bf16: bool = False  # bfloat16 autocast for forward and loss
    eval_every: int = 0  # steps between held-out evaluations; 0 = only at the end
    eval_batches: int = 10  # held-out micro-batches per evaluation
    checkpoint_every: int = 1000  # steps between checkpoints; 0 = only at the end and on Ctrl-C
    log_every: int = 10  # steps between log records
    seed: int | None = 0  # None: the RNGs as the caller set them (see the module docstring)
    device: str = "cpu"  # under torchrun, "cuda" means each process's own cuda:LOCAL_RANK
    fused: bool | None = None  # AdamW: True, torch's fused kernel where it applies; False, the for-loop; None, torch's
    # every encoder in the objective keeps only each block's input and recomputes the block in backward
    gradient_checkpointing: bool = False
    fsdp: bool = False  # under torchrun: FSDP2 shards parameters, gradients and AdamW states (else DDP replicates)

    def validate(self, world_size: int = 1) -> None:
        positive = ("lr", "max_steps", "batch_size", "accumulation_steps", "eval_batches", "log_every")
        for name in positive:
            if not getattr(self, name) > 0:
                raise TrainerError(f"TrainerConfig.{name}={getattr(self, name)} must be greater than 0")
        for name in (
            "weight_decay",
            "eps",
            "warmup_steps",
            "grad_clip",
            "eval_every",
            "checkpoint_every",
            "max_minutes",
        ):
            if getattr(self, name) < 0:
                raise TrainerError(f"TrainerConfig.{name}={getattr(self, name)} must be 0 or more")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise TrainerError(f"TrainerConfig.betas={self.betas} must be two numbers in [0, 1)")
        if self.schedule not in SCHEDULES:  # a dict: its names
            raise TrainerError(
                f"TrainerConfig.schedule={self.schedule!r} is unknown; use one of {', '.join(SCHEDULES)}"
            )
        if self.fsdp and world_size == 1:
            raise TrainerError(
                "TrainerConfig.fsdp=True shards training between the processes torchrun starts, but this is one "
                "process: launch with torchrun --nproc_per_node N (N > 1), or leave fsdp off"
            )
        if self.batch_size % (self.accumulation_steps * world_size):
            raise TrainerError(
                f"TrainerConfig.batch_size={self.batch_size} does not split into accumulation_steps="
                f"{self.accumulation_steps} micro-batches x {world_size} process(es); make batch_size a multiple "
                f"of {self.accumulation_steps * world_size}"
            )

    @property
    def micro_batch_size(self) -> int:
        """Rows per micro-batch over all processes."""
        return self.batch_size // self.accumulation_steps


class Trainer:
    def __init__(
        self,
        objective: nn.Module,
        config: TrainerConfig,
        train_data: BatchSource,
        out_dir: str | Path | None = None,
        eval_data: BatchSource | None = None,
        save_model: Callable[[Path], None] | None = None,
        schedule: Callable[[int], float] | None = None,
        evaluate: Callable[[], dict[str, float]] | None = None,
        progress: bool | str = True,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        early_stopping: EarlyStopping | None = None,
        epoch_start: Callable[[int], None] | None = None,
        first_epoch: int = 0,
        desc: str = "train",
        warmup_option: str = "--trainer.warmup_steps {steps} on `ctxrep pretrain` (TrainerConfig.warmup_steps)",
    ) -> None:
        """`out_dir`: where log.jsonl, checkpoint/ and the model go; None writes nothing (no checkpoints, and a
        Ctrl-C stops the run with KeyboardInterrupt as any Python call).
        `schedule(steps_done)`: the learning-rate multiplier of config.lr, instead of config.schedule's.
        `evaluate()`: more held-out metrics (e.g. BLEU, a dev score), run with the objective in eval mode under
        no_grad on a forked RNG at every evaluation; its metrics join the evaluation's log record (eval_data may be
        None). `progress`: True (a bar on a terminal, plain lines in a log), False, or "lines" (plain lines even on
        a terminal), on the main process. `optimizer`: built by the caller over the objective's parameters (its
        own groups and learning rates); default AdamW from config (train/optim.py). `early_stopping`: see
        EarlyStopping (epoch sources). `epoch_start(e)`: called before the e-th epoch of this run (0 first), e.g.
        gradual unfreezing. `first_epoch`: epochs trained before this run (a warm start), for the epoch numbers.
        `warmup_option`: how the user lowers the warm-up when it is as long as the run, with {steps} (a tenth of
        the run) or {fraction} (0.1) in it."""
        self.ctx = distributed.current()
        config.validate(self.ctx.world_size)
        self.config = config
        self.train_data = train_data
        self.eval_data = eval_data
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.save_model = save_model
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and self.ctx.enabled:
            self.device = torch.device("cuda", self.ctx.local_rank)
        self.objective = objective.to(self.device)
        self.encoders = encoders_of(objective)  # what checkpointing and FSDP's units read (the encoder interface)
        if config.gradient_checkpointing and not self.encoders:
            raise TrainerError(
                "gradient_checkpointing recomputes an encoder's blocks, but this objective holds no encoder "
                "(ctxrep.models.encoder.Encoder); leave it off"
            )
        if optimizer is None:
            optimizer = adamw(
                objective, config.lr, config.weight_decay, betas=config.betas, eps=config.eps, fused=config.fused
            )
        self.optimizer = optimizer
        self._warmup_decay = schedule is None and config.schedule in WARMS_UP  # warm-up + decay over max_steps
        if schedule is None:

            def schedule(step: int) -> float:
                return SCHEDULES[config.schedule](step, config.warmup_steps, config.max_steps)

        self.extra_evaluate = evaluate
        self.progress = progress
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        # what the loop calls: DDP under torchrun, the objective itself sharded in place with fsdp
        self.model = self._shard(objective) if config.fsdp else distributed.wrap(objective, self.ctx)
        self.early_stopping = early_stopping
        self.epoch_start = epoch_start
        self.first_epoch = first_epoch
        self.desc = desc
        self.warmup_option = warmup_option
        self.step = 0  # optimizer steps done
        self.epochs: list[dict] = []  # one record per epoch of this run (epoch sources)
        self._stop_requested = False
        self._eval_start: dict | None = None  # the held-out source's state before the first evaluation
        self._memory_checked = False

    def _shard(self, objective: nn.Module) -> nn.Module:
        """FSDP2 over each encoder block and the objective (train/distributed.py); the optimizer's groups are
        pointed at the sharded parameters, by name."""
        names = {id(p): n for n, p in objective.named_parameters()}
        groups = [[names[id(p)] for p in g["params"]] for g in self.optimizer.param_groups]
        distributed.shard(objective, self.encoders)
        params = dict(objective.named_parameters())
        for group, members in zip(self.optimizer.param_groups, groups):
            group["params"] = [params[n] for n in members]
            if group.get("fused"):  # the fused kernel takes no DTensor
                group["fused"] = False
        return objective

    # -- the loop

    def train(self, resume: bool = False) -> dict:
        """Train to config.max_steps (or until Ctrl-C, the clock or early stopping); returns the last logged and
        evaluated metrics ("best_score" when early stopping put the best epoch's weights back)."""
        cfg, ctx = self.config, self.ctx
        tune_malloc()
        if resume and self.out_dir is None:
            raise TrainerError("resume=True needs the out_dir whose checkpoint/ to continue from")
        self._begin(resume)
        result: dict = {"step": self.step, "interrupted": False}
        window, epoch = _Window(), _Epoch(self.first_epoch + len(self.epochs))
        saved_at = self.step if resume else -1  # a resumed run that had already finished saves nothing new
        evaluated_at = -1
        stopping = _BestEpoch(self.early_stopping, self.objective)
        previous_handler = self._install_sigint_handler()
        started = _now()
        deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else math.inf
        bar = self._progress_bar()
        self._peak = PeakMemory(self.device)
        switched = self._checkpointing_on()
        try:
            while self.step < cfg.max_steps:
                if epoch.fresh and self.epoch_start is not None:
                    self.epoch_start(len(self.epochs))
                lr = self.optimizer.param_groups[0]["lr"]
                out = self._train_step()
                if out is None:  # the epoch is over
                    result.update(self._end_epoch(epoch, bar, stopping))
                    evaluated_at = self.step
                    if stopping.stop:
                        break
                    epoch = _Epoch(epoch.number + 1)
                    continue
                self.step += 1
                window.add(out)
                epoch.add(out)
                self._advance_bar(bar, started, epoch)
                stop = self._should_stop()
                out_of_time = self._out_of_time(deadline)
                last = stop or out_of_time or self.step == cfg.max_steps
                if self.step % cfg.log_every == 0 or last or self.step == 1:  # every run logs its first and last step
                    record = {"step": self.step, **window.summary(ctx), "lr": lr, **self._memory()}
                    result.update(record)
                    self._log(record)
                    self._show_loss(bar, record, epoch)
                    window = _Window()
                paused = time.perf_counter()  # evaluation and checkpoints do not count against tokens/s
                if self._evaluates and cfg.eval_every and self.step % cfg.eval_every == 0:
                    result.update(self._evaluate_and_log())
                    evaluated_at = self.step
                if self.out_dir is not None and (
                    stop or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)
                ):
                    self._checkpoint()
                    saved_at = self.step
                window.start += time.perf_counter() - paused
                if stop:
                    result.update(interrupted=True, checkpoint=str(self._checkpoint_dir))
                    if ctx.is_main:
                        tqdm.write(f"stopped at step {self.step}; checkpoint saved in {self._checkpoint_dir}")
                    self._end_sharding()
                    return result
                if out_of_time:  # a finished run: evaluated and saved below
                    if ctx.is_main and self.progress:
                        tqdm.write(f"max_minutes={cfg.max_minutes:g} reached at step {self.step:,}")
                    break
            if self._in_epochs and epoch.steps and not stopping.stop:  # max_steps or the clock ended an epoch
                result.update(self._end_epoch(epoch, bar, stopping))
                evaluated_at = self.step
        finally:
            bar.close()
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
            self.objective.eval()
            for encoder in switched:
                encoder.gradient_checkpointing_disable()
        if self._evaluates and evaluated_at != self.step:
            result.update(self._evaluate_and_log())
        if stopping.restore():
            result["best_score"] = stopping.best
        if self.out_dir is not None and saved_at != self.step:
            self._checkpoint()
        self._end_sharding()
        result["step"] = self.step
        return result

    def _checkpointing_on(self) -> list[Encoder]:
        """Activation checkpointing on for every encoder of the objective (config.gradient_checkpointing); the ones
        switched on here, which train() switches off again at its end."""
        if not self.config.gradient_checkpointing:
            return []
        switched = [e for e in self.encoders if not e.is_gradient_checkpointing]
        for encoder in switched:
            encoder.gradient_checkpointing_enable()
        return switched

    def _end_sharding(self) -> None:
        """A sharded run's end: the full weights back into plain modules on every rank (train/distributed.py's
        gather_full), then the model saved once, from them."""
        if not self.config.fsdp or not distributed.is_sharded(self.objective):
            return
        distributed.gather_full(self.objective)
        if self.out_dir is not None and self.save_model is not None and self.ctx.is_main:
            self.save_model(self.out_dir)
        self.ctx.barrier()

    @property
    def _in_epochs(self) -> bool:
        """The source hands out examples in epochs (it ends them with None), not an endless stream."""
        return isinstance(self.train_data, EpochBatches) or bool(self.epochs)

    @property
    def _checkpoint_dir(self) -> Path:
        return self.out_dir / CHECKPOINT_DIR

    def _begin(self, resume: bool) -> None:
        """Resume from the checkpoint, or seed a fresh run and start its log; note the held-out source's state."""
        cfg, ctx = self.config, self.ctx
        if resume:
            self._resume(self._checkpoint_dir)
        else:
            if self.out_dir is not None and (self._checkpoint_dir / "trainer_state.json").exists():
                raise TrainerError(
                    f"{self._checkpoint_dir} already holds a checkpoint; pass resume=True (--resume) to continue "
                    "that run, or choose another out_dir"
                )
            if cfg.seed is not None:
                torch.manual_seed(cfg.seed + ctx.rank)  # ranks draw different masks and dropout
                np.random.seed(cfg.seed + ctx.rank)
                random.seed(cfg.seed + ctx.rank)
            if ctx.is_main and self.out_dir is not None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                (self.out_dir / LOG_FILE).write_text("")
        if self.eval_data is not None and self._eval_start is None:
            self._eval_start = self.eval_data.state_dict()
        advice = self._warmup_advice()
        if advice is not None and ctx.is_main:
            warnings.warn(advice, stacklevel=_outside_ctxrep())  # points at the user's call (train(), fit, ...)

    def _advance_bar(self, bar, started: float, epoch: _Epoch) -> None:
        """Move the bar one step on, or to the seconds elapsed when the run is limited by max_minutes."""
        if self.config.max_minutes:  # the bar counts seconds: n = seconds elapsed
            bar.update(min(_now() - started, bar.total) - bar.n)
            bar.set_postfix_str(f"step {self.step:,}" + (f", {bar.postfix_loss}" if bar.postfix_loss else ""))
        else:
            bar.update(1)

    def _show_loss(self, bar, record: dict, epoch: _Epoch) -> None:
        loss, lr, mem = f"{record['loss']:.4f}", f"{record['lr']:.2e}", format_bytes(record["peak_memory_bytes"])
        if self.config.max_minutes:
            bar.postfix_loss = f"loss={loss}, lr={lr}, peak memory={mem}"
        elif self._in_epochs:
            bar.set_postfix({"epoch": epoch.number + 1, "loss": loss, "lr": lr, "peak memory": mem})
        else:
            bar.set_postfix({"loss": loss, "lr": lr, "peak memory": mem})

    def _memory(self) -> dict[str, int]:
        """The run's peak memory so far (util/memory.py: the resident set on a CPU, allocated memory on a GPU)."""
        return {"peak_memory_bytes": self._peak.read()}

    def _micro_batches(self) -> list:
        """This step's micro-batches: accumulation_steps of them, fewer (or none) when the source's epoch ends."""
        cfg = self.config
        batches = []
        for _ in range(cfg.accumulation_steps):
            batch = self.train_data.next_batch(cfg.micro_batch_size)
            if batch is None:
                break
            batches.append(batch)
        return batches

    def _train_step(self) -> _StepOutput | None:
        """One optimizer step; None when the source's epoch was already over (no step taken)."""
        cfg, ctx = self.config, self.ctx
        batches = self._micro_batches()
        if not batches:
            return None
        if not self._memory_checked:
            self._check_memory(batches[0])
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        tokens, metrics = 0, {}
        for i, batch in enumerate(batches):
            # a mapping of arrays is cut between the processes here; another batch is its objective's to share out
            batch = self._to_device(ctx.shard(batch) if ctx.enabled and isinstance(batch, Mapping) else batch)
            sync = i == len(batches) - 1 or not ctx.enabled  # DDP / FSDP average gradients on the last one only
            with distributed.no_sync(self.model, sync):
                with self._autocast():
                    out: ObjectiveOutput = self.model(batch)
                (out.loss / cfg.accumulation_steps).backward()
            loss_sum += out.loss.detach().float()
            tokens += int(out.num_tokens)
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + float(v) / len(batches)
        if len(batches) < cfg.accumulation_steps:  # the mean over the micro-batches this step had
            for p in self.objective.parameters():
                if p.grad is not None:
                    p.grad.mul_(cfg.accumulation_steps / len(batches))
        loss = loss_sum.item() / len(batches)
        if ctx.enabled:  # the global batch's loss: what one process would report (logs, epoch records)
            loss = ctx.all_sum([loss])[0] / ctx.world_size
        if not math.isfinite(loss):
            raise TrainerError(
                f"the training loss is {loss} at step {self.step + 1}; lower lr, add warmup_steps or set grad_clip"
            )
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.objective.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: the norm of the sharded gradients, a DTensor
            grad_norm = grad_norm.full_tensor()
        grad_norm = grad_norm.item()
        self.optimizer.step()
        self.scheduler.step()
        return _StepOutput(loss, tokens, grad_norm, metrics)

    def _check_memory(self, batch) -> None:
        """Before the first step: the run's estimated memory (train/memory.py) against what the device has free,
        with the weights already in place counted as had; a run that cannot fit stops here with what to change."""
        self._memory_checked = True
        cfg, ctx = self.config, self.ctx
        share = ctx.world_size if ctx.enabled else 1
        rows_tokens = _batch_tokens(self.objective, batch)
        need = MemoryEstimate.of(self.objective, rows_tokens // share, cfg.bf16, ctx.world_size, cfg.fsdp)
        have = available(self.device)
        fits = have is None or need.total - need.weights <= have
        if ctx.enabled:  # every rank stops, or none does
            fits = ctx.all_sum([float(not fits)])[0] == 0
            have = have if have is not None else 0
        if fits:
            return
        raise TrainerError(
            f"this run needs about {need.describe()} per process on {self.device}, more than the "
            f"{format_bytes(have + need.weights)} there (weights in place + {format_bytes(have)} free), before its "
            "first step; lower the batch (batch_size, or more accumulation_steps), turn on gradient checkpointing, "
            "train LoRA adapters instead of every weight, use cached negatives (mini_batch_size) for a sentence "
            "encoder, or shard with fsdp over more GPUs"
        )

    def _end_epoch(self, epoch: _Epoch, bar, stopping: _BestEpoch) -> dict:
        """The epoch's record (number, steps so far, its mean training loss, the evaluation's metrics), logged,
        shown, kept in `epochs`, and given to early stopping."""
        if not epoch.steps:
            raise TrainerError(
                f"epoch {epoch.number + 1} gave no batch to train on; the batch source's plan is empty (too few "
                "examples for the batch size?)"
            )
        record = {"epoch": epoch.number + 1, "steps": self.step, "train_loss": epoch.mean_loss}
        if self._evaluates and self._evaluates_here:
            record |= self.evaluate()
        self.epochs.append(record)
        self._log(record)
        if self.progress and self.ctx.is_main:
            bar.write(f"{self.desc}: " + ", ".join(f"{k} {_shown(v)}" for k, v in record.items()))
        logger.info("epoch %s", record)
        stopping.after(record)
        if stopping.stop:
            logger.info("early stopping after epoch %d", record["epoch"])
        return record

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean objective loss over the same eval_batches held-out micro-batches every time, and perplexity
        exp(mean nll) for objectives that report a token NLL (ObjectiveOutput.nll).

        Runs on a forked RNG seeded with config.seed: the same masks each time, and the training RNG (hence
        exact resume) is left untouched.
        """
        if not self._evaluates:
            raise TrainerError("evaluate() needs eval_data or evaluate=; pass a held-out batch source to the Trainer")
        if self.eval_data is None:
            return self._extra_metrics()
        if self._eval_start is None:
            self._eval_start = self.eval_data.state_dict()
        self.eval_data.load_state_dict(self._eval_start)
        self.objective.eval()
        losses, nlls = [], []
        with self._forked_rng():
            for _ in range(self.config.eval_batches):
                batch = self._to_device(self.eval_data.next_batch(self.config.micro_batch_size))
                with self._autocast():
                    out: ObjectiveOutput = self.objective(batch)
                losses.append(out.loss.float().item())
                if out.nll is not None:
                    nlls.append(out.nll)
        self.objective.train()
        metrics = {"eval_loss": sum(losses) / len(losses)}
        if nlls:
            nll = sum(nlls) / len(nlls)
            metrics["eval_perplexity"] = math.exp(nll) if nll < 700 else float("inf")
        return metrics | self._extra_metrics()

    @property
    def _evaluates(self) -> bool:
        return self.eval_data is not None or self.extra_evaluate is not None

    @contextlib.contextmanager
    def _forked_rng(self) -> Iterator[None]:
        """Evaluation's RNG: forked (training's state untouched), seeded with config.seed when it has one."""
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if self.config.seed is not None:
                torch.manual_seed(self.config.seed)
            yield

    def _extra_metrics(self) -> dict[str, float]:
        if self.extra_evaluate is None:
            return {}
        self.objective.eval()
        with self._forked_rng(), torch.no_grad(), distributed.unsharded_root(self.objective):
            metrics = self.extra_evaluate()
        self.objective.train()
        return metrics

    # -- pieces

    @property
    def _evaluates_here(self) -> bool:
        """Rank 0 evaluates alone (the others wait at the next collective); under FSDP every rank runs the forward
        passes (each is a collective), and with early stopping every rank needs the score to stop with the others;
        rank 0 writes the record."""
        return self.ctx.is_main or self.config.fsdp or self.early_stopping is not None

    def _evaluate_and_log(self) -> dict:
        if not self._evaluates_here:
            return {}
        record = self.evaluate()
        if not self.ctx.is_main:
            return record
        self._log({"step": self.step, **record})
        tqdm.write(f"step {self.step}: " + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in record.items()))
        return record

    def _checkpoint(self) -> None:
        state = {
            "step": self.step,
            "config": _jsonable(dataclasses.asdict(self.config)),
            "fingerprint": fingerprint(self.objective),
            "data": self.train_data.state_dict(),
            "eval_data": self._eval_start,
        }
        try:
            json.dumps(state)
        except TypeError as e:
            raise TrainerError(
                f"the batch source's state_dict() must be JSON-serialisable for checkpoints ({e})"
            ) from None
        sharded = self.config.fsdp
        save_checkpoint(self._checkpoint_dir, self.objective, self.optimizer, self.scheduler, state, self.ctx, sharded)
        if self.save_model is not None and self.ctx.is_main and not sharded:  # sharded: once, at the end
            self.save_model(self.out_dir)

    def _resume(self, directory: Path) -> None:
        saved = read_state(directory)
        check_fingerprint(saved["fingerprint"], fingerprint(self.objective), directory)
        old, new = saved["config"], _jsonable(dataclasses.asdict(self.config))
        defaults = _jsonable(dataclasses.asdict(TrainerConfig()))  # a setting added since the checkpoint was written
        old = {k: old.get(k, defaults.get(k)) for k in new}
        changed = [k for k in new if k not in RESUMABLE_CHANGES and old.get(k) != new[k]]
        if changed:
            diff = ", ".join(f"{k}={old.get(k)!r} there, {new[k]!r} here" for k in changed)
            raise TrainerError(
                f"{directory} was saved with other training settings ({diff}); resume with the same settings "
                f"(only {', '.join(RESUMABLE_CHANGES)} may change), or start a new run in another out_dir"
            )
        state = load_checkpoint(directory, self.objective, self.optimizer, self.scheduler, self.ctx, self.config.fsdp)
        self.train_data.load_state_dict(state["data"])
        self._eval_start = state.get("eval_data")
        self.step = int(state["step"])
        if old.get("max_steps") != new["max_steps"]:
            cfg = self.config
            if self._warmup_decay:  # the first resumed step already trains at the rate of the new schedule
                now = SCHEDULES[cfg.schedule](self.step, cfg.warmup_steps, cfg.max_steps)
                for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                    group["lr"] = base * now
            if self.ctx.is_main:
                tqdm.write(self._new_length_note(int(old["max_steps"])))
        # Drop log records written after the checkpoint: those steps are about to run again.
        log = self.out_dir / LOG_FILE
        if self.ctx.is_main and log.is_file():
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            log.write_text("".join(line + "\n" for line in lines if json.loads(line).get("step", 0) <= self.step))

    def _warmup_advice(self) -> str | None:
        """What to say when the warm-up is as long as the run or longer: the learning rate only rises, to a
        fraction of lr (the README's `pretrain --config small --max-steps 30` with warmup_steps 1000 ran at <3%)."""
        cfg = self.config
        if not self._warmup_decay or cfg.warmup_steps < cfg.max_steps or cfg.warmup_steps == 0:
            return None
        peak = (cfg.max_steps - 1) / cfg.warmup_steps  # the multiplier of the last step
        option = self.warmup_option.format(steps=max(1, cfg.max_steps // 10), fraction=0.1)
        return (
            f"the warm-up ({cfg.warmup_steps} steps) is as long as the run ({cfg.max_steps} optimizer steps) or "
            f"longer: the learning rate never gets above {peak:.1%} of lr={cfg.lr:g} and never decays, so the model "
            f"learns little; lower the warm-up, e.g. {option}"
        )

    def _new_length_note(self, old_max_steps: int) -> str:
        """One line on what a resume with another max_steps does to the schedule. With the built-in warm-up + decay,
        the learning rate follows the schedule laid out over the new max_steps from the checkpoint's step on
        (`_resume` sets it, so that the first resumed step already does)."""
        cfg, step = self.config, self.step
        head = f"resuming at step {step} with max_steps={cfg.max_steps} (was {old_max_steps})"
        if cfg.max_steps <= step:
            return f"{head}: the run is already at step {step}, so nothing is trained; raise --max-steps to continue"
        if not self._warmup_decay:
            return f"{head}: training continues to step {cfg.max_steps}; the learning rate follows the schedule= given"
        before = SCHEDULES[cfg.schedule](step, cfg.warmup_steps, old_max_steps)
        now = SCHEDULES[cfg.schedule](step, cfg.warmup_steps, cfg.max_steps)
        return (
            f"{head}: the {cfg.schedule} decay now ends at step {cfg.max_steps} instead of {old_max_steps} "
            f"(warm-up unchanged, {cfg.warmup_steps} steps); the learning rate at step {step} is {now:.3g} x lr "
            f"(it was {before:.3g} x lr)"
        )

    def _log(self, record: dict) -> None:
        if self.ctx.is_main and self.out_dir is not None:
            with open(self.out_dir / LOG_FILE, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _to_device(self, batch):
        """A mapping of arrays or tensors moved to the device; any other batch is the objective's to place."""
        if not isinstance(batch, Mapping):
            return batch
        return {
            k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))).to(self.device)
            for k, v in batch.items()
        }

    def _autocast(self):
        return bf16_autocast(self.device.type, self.config.bf16)

    def _install_sigint_handler(self):
        """Ctrl-C sets a flag that the loop reads after each step; a second Ctrl-C stops at once. Only for a run
        with an out_dir (a checkpoint to save); otherwise Ctrl-C is Python's KeyboardInterrupt."""
        if self.out_dir is None or threading.current_thread() is not threading.main_thread():
            return None  # signal handlers can only be set from the main thread
        self._stop_requested = False
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum, frame):
            if self._stop_requested:
                signal.signal(signal.SIGINT, previous)
                raise KeyboardInterrupt
            self._stop_requested = True
            if self.ctx.is_main:
                tqdm.write("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to quit without saving)")

        signal.signal(signal.SIGINT, handler)
        return previous

    def _progress_bar(self) -> Any:
        """The training progress (ctxrep.util.progress: a bar on a terminal, a plain line every 10 s in a log): over
        steps, or over the seconds of the clock when max_minutes is set (elapsed and remaining time; a
        clock-bounded run's max_steps is only a cap, often 10**9, and a count against it says nothing)."""
        cfg = self.config
        shown = self.progress if self.ctx.is_main else False
        if not cfg.max_minutes:
            return progress_from(
                shown, total=cfg.max_steps, initial=self.step, desc=self.desc, unit="steps", dynamic_ncols=True
            )
        total = 60 * cfg.max_minutes
        bar = progress_from(
            shown,
            total=total,
            desc=self.desc,
            unit="s",
            rate=False,  # seconds per second
            dynamic_ncols=True,
            smoothing=0,  # rate = seconds / seconds = 1: "left" is the clock's remaining time
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} of "
            + _clock(total)
            + ", {remaining} left{postfix}",
        )
        bar.postfix_loss = ""
        return bar

    def _out_of_time(self, deadline: float) -> bool:
        """max_minutes has run out (on any rank: all ranks stop after the same step)."""
        if deadline == math.inf:
            return False
        late = _now() >= deadline
        if not self.ctx.enabled:
            return late
        return self.ctx.all_sum([float(late)])[0] > 0

    def _should_stop(self) -> bool:
        if not self.ctx.enabled:
            return self._stop_requested
        return self.ctx.all_sum([float(self._stop_requested)])[0] > 0  # all ranks stop after the same step


@dataclass
class _StepOutput:
    loss: float
    tokens: int
    grad_norm: float
    metrics: dict[str, float]


class _Window:
    """Sums over the steps since the last log record (over all processes at summary time)."""

    def __init__(self) -> None:
        self.steps, self.loss, self.tokens, self.grad_norm = 0, 0.0, 0, 0.0
        self.metrics: dict[str, float] = {}
        self.start = time.perf_counter()

    def add(self, out: _StepOutput) -> None:
        self.steps += 1
        self.loss += out.loss
        self.tokens += out.tokens
        self.grad_norm += out.grad_norm
        for k, v in out.metrics.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v

    def summary(self, ctx: distributed.Distributed) -> dict[str, float]:
        names = sorted(self.metrics)
        tokens, *metrics = ctx.all_sum([self.tokens, *(self.metrics[k] for k in names)])
        n = self.steps * ctx.world_size
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return {
            "loss": self.loss / self.steps,  # each step's loss is already the global batch's
            "tokens_per_s": tokens / elapsed,
            "grad_norm": self.grad_norm / self.steps,
            **{k: v / n for k, v in zip(names, metrics)},
        }


class _Epoch:
    """The steps of one epoch (number counts from 0, warm-started epochs included)."""

    def __init__(self, number: int) -> None:
        self.number, self.steps, self.loss = number, 0, 0.0

    @property
    def fresh(self) -> bool:
        return self.steps == 0

    def add(self, out: _StepOutput) -> None:
        self.steps += 1
        self.loss += out.loss

    @property
    def mean_loss(self) -> float:
        return self.loss / max(1, self.steps)


class _BestEpoch:
    """Early stopping's bookkeeping: the best score, its weights, the epochs since."""

    def __init__(self, settings: EarlyStopping | None, objective: nn.Module) -> None:
        self.settings = settings
        self.module = (settings.module or objective) if settings is not None else None
        self.best, self.state, self.since, self.stop = -math.inf, None, 0, False

    def after(self, record: dict) -> None:
        if self.settings is None:
            return
        if self.settings.metric not in record:
            raise TrainerError(
                f"early stopping reads {self.settings.metric!r} from each epoch's record, which holds only "
                f"{', '.join(record)}: return it from evaluate="
            )
        score = record[self.settings.metric]
        if score > self.best + self.settings.tol:
            self.best, self.since = score, 0
            self.state = copy.deepcopy(self.module.state_dict())
        else:
            self.since += 1
            self.stop = self.since >= self.settings.patience

    def restore(self) -> bool:
        """Put the best epoch's weights back; False when there were none to keep."""
        if self.state is None:
            return False
        self.module.load_state_dict(self.state)
        return True


def _outside_ctxrep() -> int:
    """warnings.warn's stacklevel of the innermost caller outside the ctxrep package, from the function calling
    this one (the user's `fit` or `train()`, however deep ctxrep's own calls go)."""
    package = str(Path(__file__).resolve().parents[1])
    frame, level = sys._getframe(2), 2  # level 1 is the caller of this function, 2 its caller
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _batch_tokens(objective: nn.Module, batch) -> int:
    """Tokens of a micro-batch's padded grid, for the memory estimate: the objective's `batch_tokens(batch)` when it
    says (the sentence encoders' batches of texts), else the largest 2-D integer array of a mapping (input ids); 0
    when neither tells."""
    tell = getattr(objective, "batch_tokens", None)
    if tell is not None:
        return int(tell(batch))
    if not isinstance(batch, Mapping):
        return 0
    sizes = [
        int(np.prod(v.shape))
        for v in batch.values()
        if getattr(v, "ndim", 0) == 2
        and str(getattr(v, "dtype", "")).removeprefix("torch.").startswith(("int", "uint"))
    ]
    return max(sizes, default=0)


def _rows(batch) -> int:
    """How many rows a batch has: its first tensor's first dimension, or its length."""
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values())))
    return len(batch)


def _shown(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _now() -> float:
    """The clock of max_minutes (a function, so that tests can run a fake one)."""
    return time.monotonic()


def _clock(seconds: float) -> str:
    """600 -> "10:00", 3900 -> "1:05:00" (tqdm's own format for elapsed and remaining)."""
    return tqdm.format_interval(seconds)


def _jsonable(value):
    return json.loads(json.dumps(value))
