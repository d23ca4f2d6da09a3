"""An adapter folder merged into a plain model folder: what `ctxrep merge` writes, and every tool and `serve` read.

    merge_folder("runs/sts-lora", "runs/sts-merged")

The adapter (peft's format, trained by ctxrep, peft or sentence-transformers) goes onto its base model
(adapter_config.json's base_model_name_or_path) through models/adapters.py, peft folds it into the projections
(W + (alpha / r) B A), and the folder is written as the base folder with those weights replaced: every other tensor
(a masked-LM or causal-LM head, a pooler), its config, dtype and sharding as the base has them. The adapter folder's
own files (a sentence-transformers folder's modules.json, Pooling, tokenizer) come along, so a sentence encoder
trained with LoRA merges into the folder it would have been trained without it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ctxrep.models.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterError,
    load_adapter,
    locate_keys,
    merge_adapter,
    read_adapter_config,
    read_adapter_weights,
    transposed_names,
)
from ctxrep.models.folders import read_state_dict
from ctxrep.models.loading import load_model, resolve
from ctxrep.models.shards import INDEX_FILE, WeightIndex, read_tensor, write_sharded

__all__ = ["merge_folder"]

ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, "adapter_model.bin", "README.md")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", INDEX_FILE)


def merge_folder(adapter: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write `out`: the base model of the adapter folder `adapter` with the adapter merged in (see the module
    docstring). Returns `out`."""
    adapter, out = Path(adapter), Path(out)
    config = read_adapter_config(adapter)
    base_name = config.get("base_model_name_or_path")
    if not base_name:
        raise AdapterError(f"{adapter}: the adapter names no base model (base_model_name_or_path in {ADAPTER_CONFIG})")
    if out.resolve() == adapter.resolve():
        raise AdapterError(f"{out}: write the merged model to a new folder, not over its adapter")
    base = resolve(base_name).folder
    encoder = load_model(base, dtype="fp32")
    weights = read_adapter_weights(adapter)
    located = locate_keys(encoder, weights, adapter, base_name)
    load_adapter(encoder, adapter)
    merge_adapter(encoder)
    tensors = _read_all(base)
    to_ours = {theirs: ours for ours, theirs in encoder.hf_module_names().items()}
    transposed = transposed_names(encoder)
    for prefix, module, _ in located.values():
        name = f"{prefix}{module}.weight"
        if name not in tensors:
            raise AdapterError(f"{base}: holds no {name}, the weight the adapter changes; is it the adapter's base?")
        weight = encoder.get_submodule(to_ours[module]).weight.detach()
        if f"{module}.weight".endswith(transposed):  # GPT-2's Conv1D stores (in, out)
            weight = weight.T
        tensors[name] = weight.to(tensors[name].dtype).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    for source in (base, adapter):  # the base's files, then the adapter folder's (its modules, tokenizer) over them
        for item in source.iterdir():
            if item.name in ADAPTER_FILES or item.name in WEIGHT_FILES or item.name.startswith("model-"):
                continue
            if item.is_dir():
                shutil.copytree(item, out / item.name, dirs_exist_ok=True)
            elif item.is_file():
                shutil.copyfile(item, out / item.name)
    write_sharded(out, tensors, _shard_bytes(base))
    return out


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model folder (one safetensors file, shards with their index, or pytorch_model.bin)."""
    if not (folder / INDEX_FILE).is_file():
        return read_state_dict(folder)
    index = WeightIndex.of(folder)
    tensors = {}
    for name, entry in index.entries.items():
        with entry.file.open("rb") as f:
            tensors[name] = read_tensor(f, entry)
    return tensors


def _shard_bytes(folder: Path) -> int | None:
    """The base's largest shard, so that the merged folder is sharded as the base is (None: one file)."""
    if not (folder / INDEX_FILE).is_file():
        return None
    files = set(json.loads((folder / INDEX_FILE).read_text())["weight_map"].values())
    return max((folder / f).stat().st_size for f in files)
