"""Data-parallel training with torch.distributed, launched by torchrun.

    torchrun --nproc_per_node 2 my_pretrain.py     # my_pretrain.py calls init_distributed() first

Every rank builds the same objective and the same batch source (same seed). For each micro-batch all
ranks draw the same global batch and rank r keeps rows r::world_size (`Distributed.shard`), so the
average of the ranks' gradients (what DistributedDataParallel all-reduces) equals the gradient of the
global batch whenever the objective's loss is a mean over rows of equal weight. Only rank 0 logs,
evaluates and writes files. gloo on CPU, nccl on GPU (one GPU per rank, cuda:LOCAL_RANK).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

T = TypeVar("T")


@dataclass
class Distributed:
    """Where this process sits among the training processes; the defaults are a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This rank's rows (r::world_size) of a global batch; every array's first axis is the batch."""
        if not self.enabled:
            return batch
        for name, array in batch.items():
            if len(array) % self.world_size:
                raise ValueError(
                    f"batch field {name!r} has {len(array)} rows, which {self.world_size} processes cannot share "
                    "evenly; make batch_size / accumulation_steps a multiple of the number of processes"
                )
        return {name: array[self.rank :: self.world_size] for name, array in batch.items()}

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def main_first(self, prepare: Callable[[], T], load: Callable[[], T]) -> T:
        """Rank 0 runs `prepare` (e.g. trains a tokenizer and packs a corpus into a shared folder); the other
        ranks wait, then run `load` to read what it wrote. When rank 0 fails, every rank stops with its error
        instead of waiting forever."""
        if not self.enabled:
            return prepare()
        result, status = None, [None]
        if self.is_main:
            try:
                result = prepare()
            except BaseException as err:
                status = [f"{type(err).__name__}: {err}"]
                dist.broadcast_object_list(status, src=0)
                raise
        dist.broadcast_object_list(status, src=0)
        if status[0] is not None:
            raise RuntimeError(f"rank 0 failed while preparing the data, so rank {self.rank} stops too: {status[0]}")
        return result if self.is_main else load()

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of `values` over all ranks (every rank must call it)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return t.cpu().tolist()


def init_distributed() -> Distributed:
    """Join the process group that torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

    Without torchrun's variables (or with WORLD_SIZE=1) this is a single process and nothing happens.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed()
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ValueError(
                f"WORLD_SIZE={world_size} is set but {name} is not; launch multi-process training with torchrun"
            )
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return current()


def current() -> Distributed:
    """The process group this process has joined, or a single process if none."""
    if not (dist.is_available() and dist.is_initialized()):
        return Distributed()
    return Distributed(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def wrap(objective: nn.Module, ctx: Distributed) -> nn.Module:
    """DistributedDataParallel around the objective (the objective itself for a single process).

    find_unused_parameters=True: an objective may leave parts of its model out of the loss (a BERT pooler
    without NSP); DDP then still finishes its gradient all-reduce, at the cost of one walk over the graph.
    """
    if not ctx.enabled:
        return objective
    device = next(objective.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(objective, device_ids=device_ids, find_unused_parameters=True)


def shutdown() -> None:
    """Leave the process group (call once at the end of a torchrun script).

    All ranks meet at a barrier first: a rank that tears down gloo while another still works (rank 0 saving)
    can abort at exit ("terminate called without an active exception")."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
