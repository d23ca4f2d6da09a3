"""Where the Trainer's micro-batches come from: any object with `next_batch(n)`, `state_dict()` and
`load_state_dict(state)` (`BatchSource`).

Two kinds of source:
- an endless stream (the pretraining packers of ctxrep.data.packing, translation's token batches): `next_batch(n)`
  always returns the next n rows;
- examples in epochs (`EpochBatches`, the estimators and sentence encoders): each epoch is cut into batches by a
  plan drawn from a numpy Generator at the epoch's start; `next_batch` returns None once when an epoch is over (the
  Trainer then ends the epoch: its record, evaluation and early stopping), and the next call starts the next epoch.

Plans (functions of the Generator, giving each batch's example indices):
  length_bucketed  shuffle, sort each pool of 50 batches by length, cut it into batches, shuffle the batches: far
                   less padding than plain random batches, still a random order (the estimators)
  shuffled         a permutation cut into consecutive batches; a batch smaller than `min_rows` is left out (the
                   sentence encoders: an in-batch loss learns nothing from a batch of one)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

Plan = Callable[[np.random.Generator], list[list[int]]]


class BatchSource(Protocol):
    def next_batch(self, batch_size: int) -> Any: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


def length_bucketed(lengths: Sequence[int], batch_size: int, pool_batches: int = 50) -> Plan:
    """The estimators' epochs: random batches of similar length (see the module docstring)."""

    def plan(rng: np.random.Generator) -> list[list[int]]:
        order = rng.permutation(len(lengths))
        pool = batch_size * pool_batches
        batches = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool].tolist(), key=lambda i: lengths[i])
            batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
        return [batches[k] for k in rng.permutation(len(batches))]

    return plan


def shuffled(n: int, batch_size: int, min_rows: int = 1) -> Plan:
    """A permutation of n examples cut into batches of batch_size; a batch of fewer than min_rows is left out."""

    def plan(rng: np.random.Generator) -> list[list[int]]:
        order = rng.permutation(n).tolist()
        batches = [order[k : k + batch_size] for k in range(0, n, batch_size)]
        return [b for b in batches if len(b) >= min_rows]

    return plan


def batches_per_epoch(n: int, batch_size: int, min_rows: int = 1) -> int:
    """How many batches `length_bucketed` / `shuffled` cut n examples into (a last one under min_rows left out)."""
    full, rest = divmod(n, batch_size)
    return full + (rest >= min_rows and rest > 0)


def epochs_and_steps(per_epoch: int, max_epochs: int, max_steps: int | None) -> tuple[int, int]:
    """(epochs begun, optimizer steps in all): max_epochs full epochs, or max_steps when given (the last epoch may
    be partial), as transformers' max_steps."""
    if max_steps is not None:
        return math.ceil(max_steps / per_epoch), max_steps
    return max_epochs, per_epoch * max_epochs


class EpochBatches:
    """Examples in epochs: `plan(rng)` cuts each epoch into lists of example indices at the epoch's start, and
    `collate(indices)` makes each batch. `next_batch` ignores its size: the plan decides (cut it at the batch size
    the run steps with). The state (for checkpoints) is the Generator's state before the current epoch's plan and
    the batches already taken from it."""

    def __init__(self, plan: Plan, collate: Callable[[list[int]], Any], rng: np.random.Generator) -> None:
        self.plan, self.collate, self.rng = plan, collate, rng
        self._epoch: Iterator[list[int]] | None = None
        self._rng_before = rng.bit_generator.state
        self._taken = 0

    def next_batch(self, batch_size: int | None = None) -> Any:
        if self._epoch is None:
            self._rng_before = self.rng.bit_generator.state
            self._epoch, self._taken = iter(self.plan(self.rng)), 0
        rows = next(self._epoch, None)
        if rows is None:
            self._epoch = None
            return None
        self._taken += 1
        return self.collate(rows)

    def state_dict(self) -> dict:
        return {"rng": self._rng_before, "taken": self._taken if self._epoch is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self._epoch = None
        if state["taken"] is not None:  # in the middle of an epoch: draw its plan again and skip what was taken
            self._epoch = iter(self.plan(self.rng))
            for _ in range(state["taken"]):
                next(self._epoch)
            self._taken = state["taken"]
