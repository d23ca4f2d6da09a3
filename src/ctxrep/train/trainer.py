"""The pretraining loop: AdamW, warm-up + decay, accumulation, clipping, evaluation, logs, exact resume.

    trainer = Trainer(objective, TrainerConfig(lr=5e-4, max_steps=10_000), packer, "runs/bert-small",
                      eval_data=held_out_packer, save_model=lambda d: model.save_pretrained(d / "model"))
    metrics = trainer.train()              # Ctrl-C: finishes the step, saves a checkpoint, returns
    TrainerConfig(max_minutes=10, max_steps=10**9)  # a run bounded by the clock: the bar shows minutes, not steps
    metrics = trainer.train(resume=True)   # continues from runs/bert-small/checkpoint/ exactly

The objective is an nn.Module whose forward(batch) returns an `ObjectiveOutput`; it does its own masking
with the global torch RNG. The batch source is any object with next_batch(n) -> dict of numpy arrays,
state_dict() (JSON-serialisable) and load_state_dict(state), such as the packers in ctxrep.data.packing.

One optimizer step sees `batch_size` rows in `accumulation_steps` micro-batches of
batch_size / accumulation_steps rows each (shared out between processes under torchrun, see
ctxrep.train.distributed). Each micro-batch's loss is divided by accumulation_steps, so the summed gradient
is the gradient of the mean over micro-batches: equal to one big batch when the objective's loss is a mean
over rows of equal weight (fixed-length rows, or a fixed number of predicted tokens per row).

Exact resume: the checkpoint holds the model, AdamW moments, scheduler, the data source's position and
every RNG state, and evaluation runs on a forked RNG with the same held-out batches each time, so a run
interrupted at any step and resumed ends with the same parameters as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm  # tqdm.write: a line that does not break a bar on a terminal

from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.train import distributed
from ctxrep.train.allocator import tune_malloc
from ctxrep.train.checkpoint import check_fingerprint, fingerprint, load_checkpoint, read_state, save_checkpoint
from ctxrep.train.optim import adamw, param_groups  # noqa: F401  (param_groups: its old home, still imported)
from ctxrep.train.schedules import SCHEDULES, warmup_decay
from ctxrep.util.progress import progress

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
)


class TrainerError(ValueError):
    """A trainer setting or input that cannot work, with what to change."""


class BatchSource(Protocol):
    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


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
    seed: int = 0
    device: str = "cpu"  # under torchrun, "cuda" means each process's own cuda:LOCAL_RANK

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
        if self.schedule not in SCHEDULES:
            raise TrainerError(
                f"TrainerConfig.schedule={self.schedule!r} is unknown; use one of {', '.join(SCHEDULES)}"
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
        out_dir: str | Path,
        eval_data: BatchSource | None = None,
        save_model: Callable[[Path], None] | None = None,
        schedule: Callable[[int], float] | None = None,
        evaluate: Callable[[], dict[str, float]] | None = None,
        progress: bool = True,
    ) -> None:
        """`schedule(steps_done)`: the learning-rate multiplier of config.lr, instead of warm-up + decay.
        `evaluate()`: more held-out metrics (e.g. BLEU), run with the objective in eval mode under no_grad on a
        forked RNG at every evaluation; its metrics join the evaluation's log record (eval_data may be None).
        `progress`: show the progress bar (on the main process)."""
        self.ctx = distributed.current()
        config.validate(self.ctx.world_size)
        self.config = config
        self.train_data = train_data
        self.eval_data = eval_data
        self.out_dir = Path(out_dir)
        self.save_model = save_model
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and self.ctx.enabled:
            self.device = torch.device("cuda", self.ctx.local_rank)
        self.objective = objective.to(self.device)
        self.optimizer = adamw(objective, config.lr, config.weight_decay, betas=config.betas, eps=config.eps)
        self._warmup_decay = schedule is None  # the schedule is warm-up + decay over config.max_steps
        schedule = schedule or functools.partial(
            warmup_decay, warmup_steps=config.warmup_steps, max_steps=config.max_steps, kind=config.schedule
        )
        self.extra_evaluate = evaluate
        self.progress = progress
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.model = distributed.wrap(objective, self.ctx)  # what the loop calls (DDP under torchrun)
        self.step = 0  # optimizer steps done
        self._stop_requested = False
        self._eval_start: dict | None = None  # the held-out source's state before the first evaluation

    # -- the loop

    def train(self, resume: bool = False) -> dict:
        """Train to config.max_steps (or until Ctrl-C); returns the last logged and evaluated metrics."""
        cfg, ctx = self.config, self.ctx
        tune_malloc()
        checkpoint_dir = self.out_dir / CHECKPOINT_DIR
        self._begin(resume, checkpoint_dir)

        result: dict = {"step": self.step, "interrupted": False}
        window = _Window()
        saved_at = self.step if resume else -1  # a resumed run that had already finished saves nothing new
        evaluated_at = -1
        previous_handler = self._install_sigint_handler()
        started = _now()
        deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else math.inf
        bar = self._progress_bar()
        try:
            while self.step < cfg.max_steps:
                lr = self.optimizer.param_groups[0]["lr"]
                out = self._train_step()
                self.step += 1
                window.add(out)
                self._advance_bar(bar, started)
                stop = self._should_stop()
                out_of_time = self._out_of_time(deadline)
                last = stop or out_of_time or self.step == cfg.max_steps
                if self.step % cfg.log_every == 0 or last or self.step == 1:  # every run logs its first and last step
                    record = {"step": self.step, **window.summary(ctx), "lr": lr}
                    result.update(record)
                    self._log(record)
                    if cfg.max_minutes:
                        bar.postfix_loss = f"loss={record['loss']:.4f}, lr={lr:.2e}"
                    else:
                        bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}")
                    window = _Window()
                paused = time.perf_counter()  # evaluation and checkpoints do not count against tokens/s
                if self._evaluates and cfg.eval_every and self.step % cfg.eval_every == 0:
                    result.update(self._evaluate_and_log())
                    evaluated_at = self.step
                if stop or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0):
                    self._checkpoint(checkpoint_dir)
                    saved_at = self.step
                window.start += time.perf_counter() - paused
                if stop:
                    result.update(interrupted=True, checkpoint=str(checkpoint_dir))
                    if ctx.is_main:
                        tqdm.write(f"stopped at step {self.step}; checkpoint saved in {checkpoint_dir}")
                    return result
                if out_of_time:  # a finished run: evaluated and saved below
                    if ctx.is_main and self.progress:
                        tqdm.write(f"max_minutes={cfg.max_minutes:g} reached at step {self.step:,}")
                    break
        finally:
            bar.close()
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
        if self._evaluates and evaluated_at != self.step:
            result.update(self._evaluate_and_log())
        if saved_at != self.step:
            self._checkpoint(checkpoint_dir)
        result["step"] = self.step
        return result

    def _begin(self, resume: bool, checkpoint_dir: Path) -> None:
        """Resume from `checkpoint_dir`, or seed a fresh run and start its log; note the held-out source's state."""
        cfg, ctx = self.config, self.ctx
        if resume:
            self._resume(checkpoint_dir)
        else:
            if (checkpoint_dir / "trainer_state.json").exists():
                raise TrainerError(
                    f"{checkpoint_dir} already holds a checkpoint; pass resume=True (--resume) to continue that "
                    "run, or choose another out_dir"
                )
            torch.manual_seed(cfg.seed + ctx.rank)  # ranks draw different masks and dropout
            np.random.seed(cfg.seed + ctx.rank)
            random.seed(cfg.seed + ctx.rank)
            if ctx.is_main:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                (self.out_dir / LOG_FILE).write_text("")
        if self.eval_data is not None and self._eval_start is None:
            self._eval_start = self.eval_data.state_dict()
        advice = self._warmup_advice()
        if advice is not None and ctx.is_main:
            warnings.warn(advice, stacklevel=3)  # points at the caller of train()

    def _advance_bar(self, bar, started: float) -> None:
        """Move the bar one step on, or to the seconds elapsed when the run is limited by max_minutes."""
        if self.config.max_minutes:  # the bar counts seconds: n = seconds elapsed
            bar.update(min(_now() - started, bar.total) - bar.n)
            bar.set_postfix_str(f"step {self.step:,}" + (f", {bar.postfix_loss}" if bar.postfix_loss else ""))
        else:
            bar.update(1)

    def _train_step(self) -> _StepOutput:
        cfg, ctx = self.config, self.ctx
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        tokens, metrics = 0, {}
        for i in range(cfg.accumulation_steps):
            batch = self._to_device(ctx.shard(self.train_data.next_batch(cfg.micro_batch_size)))
            sync = i == cfg.accumulation_steps - 1 or not ctx.enabled  # DDP all-reduces on the last one only
            with nullcontext() if sync else self.model.no_sync():
                with self._autocast():
                    out: ObjectiveOutput = self.model(batch)
                (out.loss / cfg.accumulation_steps).backward()
            loss_sum += out.loss.detach().float()
            tokens += int(out.num_tokens)
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + float(v) / cfg.accumulation_steps
        loss = loss_sum.item() / cfg.accumulation_steps
        if not math.isfinite(loss):
            raise TrainerError(
                f"the training loss is {loss} at step {self.step + 1}; lower lr, add warmup_steps or set grad_clip"
            )
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.objective.parameters(), max_norm).item()
        self.optimizer.step()
        self.scheduler.step()
        return _StepOutput(loss, tokens, grad_norm, metrics)

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
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.config.seed)
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

    def _extra_metrics(self) -> dict[str, float]:
        if self.extra_evaluate is None:
            return {}
        self.objective.eval()
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(self.config.seed)
            metrics = self.extra_evaluate()
        self.objective.train()
        return metrics

    # -- pieces

    def _evaluate_and_log(self) -> dict:
        if not self.ctx.is_main:  # rank 0 evaluates alone; the others wait at the next collective
            return {}
        record = self.evaluate()
        self._log({"step": self.step, **record})
        tqdm.write(f"step {self.step}: " + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in record.items()))
        return record

    def _checkpoint(self, directory: Path) -> None:
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
        save_checkpoint(directory, self.objective, self.optimizer, self.scheduler, state, self.ctx)
        if self.save_model is not None and self.ctx.is_main:
            self.save_model(self.out_dir)

    def _resume(self, directory: Path) -> None:
        saved = read_state(directory)
        check_fingerprint(saved["fingerprint"], fingerprint(self.objective), directory)
        old, new = saved["config"], _jsonable(dataclasses.asdict(self.config))
        changed = [k for k in new if k not in RESUMABLE_CHANGES and old.get(k) != new[k]]
        if changed:
            diff = ", ".join(f"{k}={old.get(k)!r} there, {new[k]!r} here" for k in changed)
            raise TrainerError(
                f"{directory} was saved with other training settings ({diff}); resume with the same settings "
                f"(only {', '.join(RESUMABLE_CHANGES)} may change), or start a new run in another out_dir"
            )
        state = load_checkpoint(directory, self.objective, self.optimizer, self.scheduler, self.ctx)
        self.train_data.load_state_dict(state["data"])
        self._eval_start = state.get("eval_data")
        self.step = int(state["step"])
        if old.get("max_steps") != new["max_steps"]:
            cfg = self.config
            if self._warmup_decay:  # the first resumed step already trains at the rate of the new schedule
                now = warmup_decay(self.step, cfg.warmup_steps, cfg.max_steps, cfg.schedule)
                for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                    group["lr"] = base * now
            if self.ctx.is_main:
                tqdm.write(self._new_length_note(int(old["max_steps"])))
        # Drop log records written after the checkpoint: those steps are about to run again.
        log = self.out_dir / LOG_FILE
        if self.ctx.is_main and log.is_file():
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            log.write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] <= self.step))

    def _warmup_advice(self) -> str | None:
        """What to say when the warm-up is as long as the run or longer: the learning rate only rises, to a
        fraction of lr (the README's `pretrain --config small --max-steps 30` with warmup_steps 1000 ran at <3%)."""
        cfg = self.config
        if not self._warmup_decay or cfg.warmup_steps < cfg.max_steps or cfg.warmup_steps == 0:
            return None
        peak = (cfg.max_steps - 1) / cfg.warmup_steps  # the multiplier of the last step
        return (
            f"warmup_steps={cfg.warmup_steps} is as long as the run or longer (max_steps={cfg.max_steps}): the "
            f"learning rate never gets above {peak:.1%} of lr={cfg.lr:g} and the model learns little; lower the "
            f"warm-up (--trainer.warmup_steps on `ctxrep pretrain`, TrainerConfig.warmup_steps), e.g. "
            f"--trainer.warmup_steps {max(1, cfg.max_steps // 10)}"
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
        before = warmup_decay(step, cfg.warmup_steps, old_max_steps, cfg.schedule)
        now = warmup_decay(step, cfg.warmup_steps, cfg.max_steps, cfg.schedule)
        return (
            f"{head}: the {cfg.schedule} decay now ends at step {cfg.max_steps} instead of {old_max_steps} "
            f"(warm-up unchanged, {cfg.warmup_steps} steps); the learning rate at step {step} is {now:.3g} x lr "
            f"(it was {before:.3g} x lr)"
        )

    def _log(self, record: dict) -> None:
        if self.ctx.is_main:
            with open(self.out_dir / LOG_FILE, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _to_device(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in batch.items()}

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16)

    def _install_sigint_handler(self):
        """Ctrl-C sets a flag that the loop reads after each step; a second Ctrl-C stops at once."""
        if threading.current_thread() is not threading.main_thread():
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
        cfg, enabled = self.config, self.ctx.is_main and self.progress
        if not cfg.max_minutes:
            return progress(
                total=cfg.max_steps, initial=self.step, enabled=enabled, desc="train", unit="steps", dynamic_ncols=True
            )
        total = 60 * cfg.max_minutes
        bar = progress(
            total=total,
            enabled=enabled,
            desc="train",
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
        loss, tokens, *metrics = ctx.all_sum([self.loss, self.tokens, *(self.metrics[k] for k in names)])
        n = self.steps * ctx.world_size
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return {
            "loss": loss / n,
            "tokens_per_s": tokens / elapsed,
            "grad_norm": self.grad_norm / self.steps,
            **{k: v / n for k, v in zip(names, metrics)},
        }


def _now() -> float:
    """The clock of max_minutes (a function, so that tests can run a fake one)."""
    return time.monotonic()


def _clock(seconds: float) -> str:
    """600 -> "10:00", 3900 -> "1:05:00" (tqdm's own format for elapsed and remaining)."""
    return tqdm.format_interval(seconds)


def _jsonable(value):
    return json.loads(json.dumps(value))
