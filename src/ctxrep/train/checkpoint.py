"""The trainer's checkpoint folder: everything needed to continue a run exactly where it stopped.

    checkpoint/
      model.safetensors     the objective's state_dict (tied weights stored once)
      optimizer.pt          optimizer and LR-scheduler state_dicts (plain tensors and numbers)
      rng-rank{r}.pt        torch (CPU and CUDA), numpy and python RNG states of rank r
      trainer_state.json    step, trainer config, data-source state, fingerprint of the objective, world size

A run sharded with FSDP (TrainerConfig.fsdp) writes the model and AdamW states as torch.distributed.checkpoint's
sharded folder instead, each rank its own shards, read back by the same number of processes:

      sharded/              model and optimizer state dicts (torch.distributed.checkpoint: .metadata, *.distcp)
      optimizer.pt          the LR scheduler's state_dict alone

The .pt files are read back with torch.load(weights_only=True): nothing is unpickled but tensors,
lists, dicts and numbers. A checkpoint is written to checkpoint.tmp/ and then renamed, so an
interruption while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from ctxrep.models.loading import CheckpointError
from ctxrep.train.distributed import Distributed
from ctxrep.util.files import apply_umask

STATE_FILE = "trainer_state.json"
SHARDED_DIR = "sharded"


def fingerprint(objective: nn.Module) -> dict:
    """What must match for a checkpoint to fit: the objective's class, its config, every tensor's shape."""
    cls = type(objective)
    config = getattr(objective, "config", None)
    return {
        "objective": f"{cls.__module__}.{cls.__qualname__}",
        "objective_config": _jsonable(dataclasses.asdict(config)) if dataclasses.is_dataclass(config) else None,
        "shapes": {name: list(t.shape) for name, t in objective.state_dict().items()},
    }


def check_fingerprint(saved: dict, current: dict, where: Path) -> None:
    """A CheckpointError naming both sides when the checkpoint was written by another objective or model."""
    if saved["objective"] != current["objective"]:
        raise CheckpointError(
            f"{where} was written while training objective {saved['objective']}, but this run trains "
            f"{current['objective']}; resume with the objective the run started with, or use a new out_dir"
        )
    if saved["objective_config"] != current["objective_config"]:
        a, b = saved["objective_config"] or {}, current["objective_config"] or {}
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        diff = ", ".join(f"{k}={a.get(k)!r} there, {b.get(k)!r} here" for k in keys)
        raise CheckpointError(
            f"{where} was written with another {current['objective']} config ({diff}); resume with the same "
            "config, or use a new out_dir"
        )
    old, new = saved["shapes"], current["shapes"]
    problems = [f"{k} is missing here" for k in old if k not in new]
    problems += [f"{k} is not in the checkpoint" for k in new if k not in old]
    problems += [f"{k} is {tuple(old[k])} there, {tuple(new[k])} here" for k in old if k in new and old[k] != new[k]]
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise CheckpointError(
            f"{where} holds another model shape than this {current['objective']}: {shown}; resume with the "
            "model configuration the run started with, or use a new out_dir"
        )


def rng_state() -> dict:
    """This process's torch, CUDA, numpy (legacy global) and python RNG states, as plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "python": {"version": version, "state": list(mt), "gauss_next": gauss_next},
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def save_checkpoint(
    directory: Path,
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict,
    ctx: Distributed,
    sharded: bool = False,
) -> None:
    """Write the checkpoint (every rank must call it: each saves its own RNG state, and its shards when `sharded`;
    rank 0 the rest)."""
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if ctx.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    ctx.barrier()
    torch.save(rng_state(), tmp / f"rng-rank{ctx.rank}.pt")
    if sharded:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(objective, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(tmp / SHARDED_DIR))
    ctx.barrier()
    if ctx.is_main:
        if sharded:
            torch.save({"scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
        else:
            save_model(objective, str(tmp / "model.safetensors"))
            apply_umask(tmp / "model.safetensors")  # safetensors writes owner-only (0o600)
            saved = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            torch.save(saved, tmp / "optimizer.pt")
        record = {**state, "world_size": ctx.world_size, "sharded": sharded}
        (tmp / STATE_FILE).write_text(json.dumps(record, indent=1) + "\n")
        old = directory.with_name(directory.name + ".old")
        if directory.exists():
            if old.exists():
                shutil.rmtree(old)
            directory.rename(old)
        tmp.rename(directory)
        if old.exists():
            shutil.rmtree(old)
    ctx.barrier()


def read_state(directory: Path) -> dict:
    """trainer_state.json of a checkpoint folder, with a clear error when it is missing or unreadable."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory}: no checkpoint to resume from ({STATE_FILE} is missing); start the run without resume"
        )
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a valid trainer state ({e}); the checkpoint is damaged") from None


def load_checkpoint(
    directory: Path,
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ctx: Distributed,
    sharded: bool = False,
) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG; returns trainer_state.json's content. `sharded`: the
    run is sharded with FSDP (every rank reads its shards).

    The fingerprint is checked first, so a checkpoint of another objective or model shape fails with a
    message naming both instead of a size-mismatch trace.
    """
    directory = Path(directory)
    state = read_state(directory)
    check_fingerprint(state["fingerprint"], fingerprint(objective), directory)
    if state["world_size"] != ctx.world_size:
        raise CheckpointError(
            f"{directory} was written by {state['world_size']} processes, this run has {ctx.world_size}; "
            "resume with the same number of processes (each one's random state is in the checkpoint)"
        )
    if bool(state.get("sharded", False)) != sharded:
        how = ("sharded with fsdp", "without fsdp")
        raise CheckpointError(
            f"{directory} was written by a run {how[0] if state.get('sharded') else how[1]}, but this run is "
            f"{how[0] if sharded else how[1]}; resume it as it was started"
        )
    if sharded:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(objective, optimizer)
        loaded = {"model": model_state, "optimizer": optimizer_state}
        # a parameter that never had a gradient (a pooler an objective leaves out) has no AdamW state saved; the fresh
        # one get_state_dict made for it (zeros, never read: AdamW steps only parameters with gradients) stays
        planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
        dcp.load(loaded, checkpoint_id=str(directory / SHARDED_DIR), planner=planner)
        set_state_dict(objective, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
        scheduler.load_state_dict(
            torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)["scheduler"]
        )
        set_rng_state(torch.load(directory / f"rng-rank{ctx.rank}.pt", weights_only=True))
        return state
    try:
        missing, unexpected = load_model(objective, str(directory / "model.safetensors"), strict=False)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{directory / 'model.safetensors'}: cannot be read ({e})") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{directory / 'model.safetensors'} does not fit the model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    saved = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    set_rng_state(torch.load(directory / f"rng-rank{ctx.rank}.pt", weights_only=True))
    return state


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))
