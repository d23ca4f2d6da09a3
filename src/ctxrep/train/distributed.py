"""Data-parallel training with torch.distributed, launched by torchrun: DDP, or FSDP2's sharding (`fully_shard`).

    torchrun --nproc_per_node 2 my_pretrain.py     # my_pretrain.py calls init_distributed() first

Every rank builds the same objective and the same batch source (same seed). For each micro-batch all
ranks draw the same global batch and rank r keeps rows r::world_size (`Distributed.shard`), so the
average of the ranks' gradients (what DistributedDataParallel all-reduces) equals the gradient of the
global batch whenever the objective's loss is a mean over rows of equal weight. Only rank 0 logs,
evaluates and writes files. gloo on CPU, nccl on GPU (one GPU per rank, cuda:LOCAL_RANK).

FSDP (`shard`): each block of every encoder in the objective (`Encoder.blocks()`) and then the objective itself
become `fully_shard` units: each rank holds 1/N of every parameter, gradient and optimizer state, and all-gathers a
unit's parameters only while it runs (again in backward). The gradients are averaged as DDP's are, so the same
global batches give the same steps. Every rank evaluates (each forward is a collective); `gather_full` ends a
sharded run by putting the full weights back into plain modules on every rank, so saving and predicting after
training read ordinary tensors.

A batch that is not a mapping of arrays (the sentence encoders' lists of texts) is not cut by the loop; its
objective embeds its own share of the texts and `gather_rows` puts the rows of every rank together, with a gradient
that flows back to the rank that computed each row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def no_sync(model: nn.Module, sync: bool):
    """The context of one micro-batch's forward and backward: gradients are averaged between the processes only
    when `sync` (the last micro-batch of a step); DDP's no_sync, FSDP's set_requires_gradient_sync."""
    from contextlib import nullcontext

    if isinstance(model, DistributedDataParallel):
        return nullcontext() if sync else model.no_sync()
    if is_sharded(model):
        model.set_requires_gradient_sync(sync)
    return nullcontext()


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP's fully_shard has been applied to `module`."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6
        return False
    return isinstance(module, FSDPModule)


def shard(objective: nn.Module, encoders: list[nn.Module]) -> nn.Module:
    """FSDP2 in place: `fully_shard` each encoder's blocks (Encoder.blocks()), then each encoder (its embeddings and
    what sits above its blocks; unless it shares a weight with a head, `_ties_outside`), then the objective (the
    heads). Parameters become DTensors: build or remap the
    optimizer after this (the Trainer does). An encoder runs as a unit of its own, so a caller may run it (or its
    blocks) outside the objective's forward, as the estimators' evaluation does; the objective's own parameters are
    gathered for that by `unsharded_root`."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        raise ValueError(
            f"fsdp needs torch 2.6 or later (torch.distributed.fsdp.fully_shard); this is torch {torch.__version__}"
        ) from None
    for encoder in encoders:
        for block in encoder.blocks():
            fully_shard(block)
        if encoder is not objective and not _ties_outside(encoder, objective):
            # kept whole from its forward to its backward, as the root is: an encoder's output (hidden states padded
            # back from an unpadded run, on some ranks only) need not carry FSDP's pre-backward all-gather
            fully_shard(encoder, reshard_after_forward=False)
    fully_shard(objective)
    return objective


def _ties_outside(inner: nn.Module, outer: nn.Module) -> bool:
    """Whether a parameter of `inner` is also held by a module of `outer` outside it (an LM head tied to the word
    embeddings, two encoders sharing them): FSDP keeps a tied parameter in one unit, so `inner` is not one then."""
    own = {id(p) for p in inner.parameters()}
    inside = {id(m) for m in inner.modules()}
    return any(
        id(p) in own for m in outer.modules() if id(m) not in inside for p in m._parameters.values() if p is not None
    )


@contextmanager
def unsharded_root(objective: nn.Module) -> Iterator[None]:
    """The objective's own parameters (the heads; not its encoders', which gather themselves as they run) whole
    inside the block, for code that calls parts of the objective outside its forward (evaluation hooks)."""
    if not is_sharded(objective):
        yield
        return
    objective.unshard()
    try:
        yield
    finally:
        objective.reshard()


def gather_full(objective: nn.Module) -> None:
    """End FSDP on `objective` (every rank must call it): each sharded parameter is all-gathered into an ordinary
    parameter on every rank (in place, ties kept), and fully_shard's hooks and classes are taken off, so the
    modules are plain again: state_dict() holds whole tensors and forward runs without collectives."""
    from torch.distributed._composable_state import _module_state_mapping
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    sharded = [m for m in objective.modules() if isinstance(m, FSDPModule)]
    for module in sharded:
        module.reshard()  # the registered parameters are the sharded DTensors
    full: dict[int, nn.Parameter] = {}
    for module in objective.modules():  # the same order on every rank: one all-gather per parameter
        for leaf, p in list(module._parameters.items()):
            if isinstance(p, DTensor):
                if id(p) not in full:
                    full[id(p)] = nn.Parameter(p.full_tensor().detach().clone(), requires_grad=p.requires_grad)
                module._parameters[leaf] = full[id(p)]
    for module in sharded:
        state = module._get_fsdp_state()
        for handle in (state._pre_forward_hook_handle, state._post_forward_hook_handle):
            if handle is not None:
                handle.remove()
        for group in state._fsdp_param_groups:
            for handles in (
                group._module_to_pre_save_state_dict_hook_handle,
                group._module_to_pre_load_state_dict_hook_handle,
            ):
                for handle in handles.values():
                    handle.remove()
        _module_state_mapping.pop(module, None)
        module.__class__ = type(module).__mro__[FSDPModule._orig_cls_mro_index]
        for key in [k for k in vars(module) if k.startswith("__composable_api_state_key")]:
            del vars(module)[key]
    for module in objective.modules():
        for name in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            vars(module).pop(name, None)


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """The rows of `x` from every rank, rank 0's first (ranks may hold different numbers of rows). Backward: the
    gradient of every rank's copy is summed (all-reduce) and each rank keeps its own rows', so that the averaged
    parameter gradient of a loss every rank computes alike is that loss's gradient."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    return _GatherRows.apply(x)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        world = dist.get_world_size()
        count = torch.tensor([x.shape[0]], device=x.device)
        counts = [torch.zeros_like(count) for _ in range(world)]
        dist.all_gather(counts, count)
        counts = [int(c) for c in counts]
        longest = max(counts)
        padded = torch.zeros((longest, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[: x.shape[0]] = x
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded.contiguous())
        ctx.counts, ctx.rank = counts, dist.get_rank()
        return torch.cat([p[:n] for p, n in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        start = sum(ctx.counts[: ctx.rank])
        return grad[start : start + ctx.counts[ctx.rank]]


def shutdown() -> None:
    """Leave the process group (call once at the end of a torchrun script).

    All ranks meet at a barrier first: a rank that tears down gloo while another still works (rank 0 saving)
    can abort at exit ("terminate called without an active exception")."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
