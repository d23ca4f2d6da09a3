"""Weights read one tensor at a time, from one model.safetensors or from shards listed in
model.safetensors.index.json (Hugging Face's layout for models of billions of parameters).

A model is built on the "meta" device (no memory), then each parameter is read from its shard straight into a
tensor of its own (a plain read at the offset the safetensors header gives, not a memory map: mapped file pages
would count against the process beside the copy) and put in place, cast to the chosen dtype: no second copy of
the weights is ever held, so loading peaks at the weights' size plus one tensor. Before anything is read, the
tensors' sizes (from the files' headers) are checked against the memory this machine has available, and the
loading refuses in one line if they cannot fit.

    WeightIndex.of(folder)      every tensor's name -> its file, shape and dtype (headers only)
    resolve_dtype(...)          "auto" -> bfloat16 for a bfloat16 / float16 checkpoint where the CPU has native
                                bfloat16 (avx512_bf16 or AMX), else float32; "fp32" / "bf16" as asked
    check_fits(...)             the one-line error when the weights exceed the available memory
    load_into(module, ...)      the loop: missing, unknown, mis-shaped names refused first (folders.check_weights)
    write_sharded(folder, ...)  model.safetensors, or shards + index above `max_shard_bytes`
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ctxrep.models.folders import CheckpointError, check_weights, write_safetensors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
_ALL_DTYPES = _SAFETENSORS_DTYPES | {
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: "BF16", "F32", ...
    start: int  # byte offsets of the data in the file
    end: int


def read_header(file: Path) -> dict[str, TensorEntry]:
    """The tensors of a safetensors file from its header: 8 bytes (little-endian length N), N bytes of JSON
    {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": ...}, then the data."""
    try:
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError(f"a header of {n} bytes")
            header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = TensorEntry(file, tuple(info["shape"]), info["dtype"], base + begin, base + end)
        return out
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise CheckpointError(f"{file}: corrupt or unreadable safetensors file ({e}); download it again") from e


def read_tensor(handle, entry: TensorEntry) -> torch.Tensor:
    """One tensor read from the open file `handle` into memory of its own (no memory map)."""
    if entry.dtype not in _ALL_DTYPES:
        raise CheckpointError(f"{entry.file}: tensor dtype {entry.dtype} is not supported")
    buf = torch.empty(entry.end - entry.start, dtype=torch.uint8)
    handle.seek(entry.start)
    if handle.readinto(memoryview(buf.numpy())) != buf.numel():
        raise CheckpointError(f"{entry.file}: the file ends inside a tensor (truncated); download it again")
    return buf.view(_ALL_DTYPES[entry.dtype]).reshape(entry.shape)


@dataclass(frozen=True)
class WeightIndex:
    """Where each tensor of a folder lives, read from the safetensors headers (no tensor data is read)."""

    folder: Path
    entries: dict[str, TensorEntry]

    @classmethod
    def of(cls, folder: str | Path) -> WeightIndex:
        folder = Path(folder)
        index, single = folder / INDEX_FILE, folder / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a safetensors index (expected a 'weight_map' object): {e}") from e
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (folder / f).is_file()]
            if missing:
                raise CheckpointError(
                    f"{index}: {len(missing)} of its {len(files)} shards are missing ({', '.join(missing)}); "
                    "download the folder again (an interrupted download leaves shards out)"
                )
        elif single.is_file():
            weight_map, files = None, [SINGLE_FILE]
        else:
            raise CheckpointError(f"{folder}: no weights found: expected {SINGLE_FILE} or {INDEX_FILE} with its shards")
        entries: dict[str, TensorEntry] = {}
        for name in files:
            entries |= read_header(folder / name)
        if weight_map is not None:
            listed = {k for k, f in weight_map.items() if entries.get(k) is not None and entries[k].file.name == f}
            absent = sorted(set(weight_map) - listed)
            if absent:
                raise CheckpointError(
                    f"{index}: {len(absent)} tensors it lists are not in their shards ({', '.join(absent[:5])}); "
                    "download the folder again"
                )
        return cls(folder, entries)

    def stored_dtype(self) -> torch.dtype:
        """The floating dtype most of the weights are stored in (by element count)."""
        counts: dict[str, int] = {}
        for e in self.entries.values():
            counts[e.dtype] = counts.get(e.dtype, 0) + _numel(e.shape)
        floating = {k: v for k, v in counts.items() if k in _SAFETENSORS_DTYPES}
        return _SAFETENSORS_DTYPES[max(floating, key=floating.get)] if floating else torch.float32


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def cpu_has_bf16() -> bool:
    """Native bfloat16 dot products on this CPU (avx512_bf16 or AMX), as torch's CPU capability reports them."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(dtype: str | torch.dtype, stored: torch.dtype) -> torch.dtype:
    """The dtype to load weights stored as `stored` in: "auto" keeps a bfloat16 / float16 checkpoint in bfloat16
    where the CPU has native bfloat16 and takes float32 otherwise (and for a float32 checkpoint); "fp32", "bf16",
    "fp16" or a torch dtype as given."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if stored in (torch.bfloat16, torch.float16) and cpu_has_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes of memory available to a new allocation, None where unknown: MemAvailable of /proc/meminfo, or less
    where this process's cgroup (v2 memory.max, v1 memory.limit_in_bytes, at its level or any above) leaves less -
    a container's limit is where an oversized load would be killed."""
    have = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                have.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    have += _cgroup_headroom(root)
    return min(have) if have else None


NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def _cgroup_headroom(root: Path) -> list[int]:
    """limit - usage of each memory cgroup level this process is under (cgroup v2 and v1 layouts)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mount, limit_file, usage_file = root / "sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            mount, limit_file, usage_file = (
                root / "sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        level = mount / path.lstrip("/")
        while True:
            try:
                limit = (level / limit_file).read_text().strip()
                if limit != "max" and int(limit) < NO_LIMIT:
                    found.append(max(int(limit) - int((level / usage_file).read_text()), 0))
            except (OSError, ValueError):
                pass
            if level == mount or mount not in level.parents:
                break
            level = level.parent
    return found


def check_fits(shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype, source: str) -> int:
    """The weights' size in `dtype` (bytes); a CheckpointError before any is read when it exceeds the available
    memory."""
    need = sum(_numel(s) for s in shapes.values()) * torch.tensor([], dtype=dtype).element_size()
    have = available_memory()
    if have is not None and need > have:
        gib = 2**30
        hint = " or load it in bfloat16 (dtype='bf16')" if dtype == torch.float32 else ""
        raise CheckpointError(
            f"{source}: its weights take {need / gib:.1f} GiB in {str(dtype).removeprefix('torch.')} but this machine "
            f"has {have / gib:.1f} GiB of memory available; nothing was loaded: free memory, use a larger machine{hint}"
        )
    return need


def load_into(
    module: torch.nn.Module,
    index: WeightIndex,
    names: Mapping[str, str],
    dtype: torch.dtype,
    what: str,
    skip: tuple[str, ...] = (),
) -> None:
    """Fill `module` (built on the meta device, or anywhere) with the checkpoint tensors `names` (checkpoint name
    -> parameter name), each read from its shard and cast to `dtype`; checkpoint names starting with one of `skip`
    (an LM head the module does not hold, ...) are passed over. Every missing, unknown or mis-shaped name is refused
    first, in one CheckpointError, and nothing is read then."""
    params = dict(module.named_parameters())
    found = {k: e.shape for k, e in index.entries.items() if not k.startswith(skip) or k in names}
    check_weights(found, {k: tuple(params[v].shape) for k, v in names.items()}, str(index.folder), what)
    check_fits({k: index.entries[k].shape for k in names}, dtype, str(index.folder))
    by_file: dict[Path, list[str]] = {}
    for k in names:
        by_file.setdefault(index.entries[k].file, []).append(k)
    for file, keys in by_file.items():  # each shard opened once
        with file.open("rb") as f:
            for k in keys:
                owner, _, leaf = names[k].rpartition(".")
                holder = module.get_submodule(owner)
                old = holder._parameters[leaf]
                holder._parameters[leaf] = torch.nn.Parameter(
                    read_tensor(f, index.entries[k]).to(dtype), old.requires_grad
                )
    left = [n for n, p in module.named_parameters() if p.is_meta]
    if left:
        raise CheckpointError(f"{index.folder}: no weights for {', '.join(left)} (a bug in the family's name map)")


def write_sharded(folder: Path, tensors: Mapping[str, torch.Tensor], max_shard_bytes: int | None = None) -> None:
    """model.safetensors, or (above `max_shard_bytes`) model-0000i-of-0000n.safetensors files and the index that
    transformers writes, tensors kept in the given order."""
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    if max_shard_bytes is None or sum(sizes.values()) <= max_shard_bytes:
        write_safetensors(dict(tensors), folder / SINGLE_FILE)
        return
    shards: list[list[str]] = [[]]
    used = 0
    for k in tensors:
        if shards[-1] and used + sizes[k] > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(k)
        used += sizes[k]
    weight_map = {}
    for i, keys in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors({k: tensors[k] for k in keys}, folder / name)
        weight_map |= {k: name for k in keys}
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
