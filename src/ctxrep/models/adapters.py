"""LoRA adapters on any encoder family, through peft itself, saved in the ecosystem's format.

    add_lora(encoder, LoRA(rank=16, alpha=32, dropout=0.05))   # peft.inject_adapter_in_model: only the adapters train
    save_adapter(encoder, "out/", base="BAAI/bge-small-en-v1.5")  # adapter_config.json + adapter_model.safetensors
    load_adapter(encoder, "out/")                               # an adapter peft / sentence-transformers / ctxrep wrote
    merge_adapter(encoder)                                      # W + (alpha / r) B A in place: a plain encoder again

LoRA (Hu et al. 2021): a frozen projection W (out x in) runs as W x + (alpha / r) B A dropout(x), with A (r x in) and
B (out x r) the only weights that train (B starts at 0, so training starts at the model itself). Which modules take
adapters is the encoder's answer (`Encoder.adapter_targets`: its attention and MLP projections, named relative to a
block), never a name sniffed here; `LoRA.targets` narrows them by suffix (e.g. ("query", "value")).

The adapter is injected into the encoder itself (the encoder stays an Encoder: every tool and trainer sees the same
interface), so the weights are named as ctxrep names its modules. Saved, they are renamed to transformers' modules
(`Encoder.hf_module_names`, read off the family's checkpoint_names) and written as peft's PeftModel writes them:
keys "base_model.model.<module>.lora_A.weight", adapter_config.json with peft_type LORA and the adapted modules by
their full transformers names, so that peft's PeftModel.from_pretrained, transformers' load_adapter and
sentence-transformers' SentenceTransformer.load_adapter load it over the transformers model. Loading reads the
adapted modules off the weights' names (the rank of each off its A), so adapters trained elsewhere with any
target_modules spelling, rank_pattern or alpha_pattern load too. peft's other adapter kinds (IA3, LoHa, prompt
tuning, ...) are refused in one line.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ctxrep.models.encoder import Encoder
from ctxrep.models.folders import CheckpointError, write_safetensors

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "AdapterError",
    "LoRA",
    "add_lora",
    "adapter_modules",
    "has_adapter",
    "is_adapter_folder",
    "load_adapter",
    "merge_adapter",
    "merged_copy",
    "locate_keys",
    "read_adapter_config",
    "read_adapter_weights",
    "save_adapter",
    "transposed_names",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."  # what PeftModel.save_pretrained puts before the model's own names
ADAPTER_KINDS = ("LORA",)  # peft_type values ctxrep trains and loads


class AdapterError(CheckpointError):
    """An adapter that cannot go on this encoder, or settings that cannot make one, with what to do."""


@dataclass(frozen=True)
class LoRA:
    """LoRA's settings (peft's LoraConfig: r, lora_alpha, lora_dropout, target_modules).

    rank: r, the inner width of each adapter. alpha: the scale is alpha / rank. dropout: on the adapter's input.
    targets: module-name suffixes of the projections to adapt (ctxrep's names, e.g. ("query", "value") or
        ("self_attn.q_proj",)); None: the family's attention and MLP projections (Encoder.adapter_targets).
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    targets: tuple[str, ...] | None = None

    def check(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise AdapterError(f"LoRA rank must be a positive integer (e.g. 16), got {self.rank!r}")
        if not self.alpha > 0:
            raise AdapterError(f"LoRA alpha must be positive (e.g. 32: a scale of alpha / rank), got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise AdapterError(f"LoRA dropout must be in [0, 1) (e.g. 0.05), got {self.dropout!r}")
        if self.targets is not None and (isinstance(self.targets, str) or not all(self.targets)):
            raise AdapterError(
                f"LoRA targets must be a tuple of module-name suffixes (e.g. ('query', 'value')), got {self.targets!r}"
            )


def _peft():
    try:
        import peft
    except ImportError:  # pragma: no cover - an extra
        raise AdapterError("LoRA adapters need peft: pip install 'ctxrep[peft]' (or pip install peft)") from None
    return peft


def _block_linears(encoder: Encoder) -> dict[str, str]:
    """Every nn.Linear inside the encoder's blocks: its full module name -> its name relative to its block."""
    names = {id(m): n for n, m in encoder.named_modules()}
    found = {}
    for block in encoder.blocks():
        prefix = names[id(block)]
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear) and name:
                found[f"{prefix}.{name}"] = name
    return found


def adapter_modules(encoder: Encoder, targets: Iterable[str] | None = None) -> list[str]:
    """Full names of the projections that take adapters: the block's nn.Linear modules whose name (relative to the
    block) is one of `targets` or ends with "." + one of them; `targets` None: the family's adapter_targets, those
    the model has. A target that names none of them is an AdapterError naming the family's projections."""
    declared = tuple(encoder.adapter_targets)
    if not declared:
        raise AdapterError(encoder.no_adapters_reason())
    linears = _block_linears(encoder)

    def matches(relative: str, target: str) -> bool:
        return relative == target or relative.endswith("." + target)

    if targets is None:
        chosen = [n for n, rel in linears.items() if any(matches(rel, t) for t in declared)]
    else:
        targets = list(targets)
        missing = [t for t in targets if not any(matches(rel, t) for rel in linears.values())]
        if missing:
            raise AdapterError(
                f"LoRA target {', '.join(map(repr, missing))} is not a projection of this {encoder.family} model; "
                f"its attention and MLP projections are {', '.join(declared)} (ctxrep's module names, relative to a "
                "layer): give some of those, or none for all of them"
            )
        chosen = [n for n, rel in linears.items() if any(matches(rel, t) for t in targets)]
    if not chosen:
        raise AdapterError(f"this {encoder.family} model has none of the projections {', '.join(declared)} to adapt")
    return chosen


def has_adapter(module: nn.Module) -> bool:
    """Whether peft adapter layers sit anywhere in `module`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in module.modules())


def add_lora(encoder: Encoder, lora: LoRA) -> Encoder:
    """LoRA adapters on the encoder's projections (peft.inject_adapter_in_model, in place): every other weight of the
    encoder is frozen, the adapters train. Returns the encoder."""
    lora.check()
    if has_adapter(encoder):
        raise AdapterError(f"this {encoder.family} encoder already has adapters; merge them first (merge_adapter)")
    names = adapter_modules(encoder, lora.targets)
    config = _peft().LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=names, bias="none"
    )
    return _inject(encoder, config)


def _inject(encoder: Encoder, config) -> Encoder:
    training = encoder.training
    with torch.random.fork_rng(devices=[]):  # A's initialisation: the caller's seeded RNG, then left as it was
        _peft().inject_adapter_in_model(config, encoder)
    encoder.train(training)
    for name, p in encoder.named_parameters():
        p.requires_grad_(".lora_" in name)
    return encoder


def _adapter_tensors(encoder: Encoder) -> dict[str, torch.Tensor]:
    """The adapter's weights by ctxrep's names, without peft's adapter name ("layers.0.attention.query.lora_A.weight")."""
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(encoder)


def _split_key(key: str, modules: Iterable[str]) -> tuple[str, str] | None:
    """(module, rest) for the longest dotted prefix of `key` in `modules`, else None."""
    parts = key.split(".")
    known = set(modules)
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head in known:
            return head, ".".join(parts[cut:])
    return None


def save_adapter(encoder: Encoder, path: str | os.PathLike, base: str, prefix: str = "") -> Path:
    """adapter_config.json + adapter_model.safetensors under transformers' module names (see the module
    docstring). `base`: the base model's name or folder (base_model_name_or_path: what peft and
    sentence-transformers load under it). `prefix`: before every module name, for a transformers class that holds
    the bare model under one (e.g. "bert." for BertForMaskedLM)."""
    if not has_adapter(encoder):
        raise AdapterError(f"this {encoder.family} encoder has no adapters to save")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    to_hf = encoder.hf_module_names()
    tensors = {}
    for key, value in _adapter_tensors(encoder).items():
        module, rest = _split_key(key, to_hf)
        tensors[f"{KEY_PREFIX}{prefix}{to_hf[module]}.{rest}"] = value.detach().float().cpu().contiguous()
    config = copy.deepcopy(encoder.peft_config["default"])
    adapted = sorted({_split_key(k, to_hf)[0] for k in _adapter_tensors(encoder)})
    config.target_modules = [prefix + to_hf[m] for m in adapted]
    config.fan_in_fan_out = any((to_hf[m] + ".weight").endswith(transposed_names(encoder)) for m in adapted)
    config.base_model_name_or_path = base
    config.task_type = "FEATURE_EXTRACTION"
    config.inference_mode = True
    config.save_pretrained(str(path))
    write_safetensors(tensors, path / ADAPTER_WEIGHTS)
    return path


def transposed_names(encoder: Encoder) -> tuple[str, ...]:
    """Endings of the transformers weight names stored (in, out), as transformers' Conv1D keeps them (GPT-2's)."""
    layout = encoder.checkpoint_layout()
    return tuple(layout.transposed) if layout is not None else ()


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """A folder of adapter files (adapter_config.json) without a model of its own (no config.json)."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def read_adapter_config(path: str | os.PathLike) -> dict:
    """adapter_config.json of an adapter folder, as a dict; one-line errors for a missing or unreadable file."""
    file = Path(path) / ADAPTER_CONFIG
    if not file.is_file():
        raise AdapterError(f"{path}: no {ADAPTER_CONFIG}; an adapter folder holds it beside {ADAPTER_WEIGHTS}")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{file}: not valid JSON ({e})") from None
    kind = config.get("peft_type")
    if kind not in ADAPTER_KINDS:
        raise AdapterError(
            f"{file}: a {kind or 'untyped'} adapter (peft_type); ctxrep loads {' and '.join(ADAPTER_KINDS)} adapters "
            "(peft's LoraConfig)"
        )
    return config


def read_adapter_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """An adapter folder's tensors, PeftModel's "base_model.model." taken off their names (safetensors, or an
    adapter_model.bin read with weights_only=True)."""
    from safetensors.torch import load_file

    path = Path(path)
    if (path / ADAPTER_WEIGHTS).is_file():
        weights = load_file(path / ADAPTER_WEIGHTS)
    elif (path / "adapter_model.bin").is_file():
        weights = torch.load(path / "adapter_model.bin", map_location="cpu", weights_only=True)
    else:
        raise AdapterError(f"{path}: no {ADAPTER_WEIGHTS} (or adapter_model.bin) beside {ADAPTER_CONFIG}")
    return {k.removeprefix(KEY_PREFIX): v for k, v in weights.items()}


def locate_keys(
    encoder: Encoder, weights: dict[str, torch.Tensor], path: Path, base: str
) -> dict[str, tuple[str, str, str]]:
    """Each adapter key as (prefix, transformers module, rest): "bert.encoder.layer.0.attention.self.query.lora_A.weight"
    -> ("bert.", "encoder.layer.0.attention.self.query", "lora_A.weight"). The prefix is what a task class puts
    before the bare model's names; a module this encoder does not have is an AdapterError (another base model)."""
    modules = set(encoder.hf_module_names().values())
    found = {}
    for key in weights:
        parts = key.split(".")
        for start in range(len(parts)):
            split = _split_key(".".join(parts[start:]), modules)
            if split is not None:
                found[key] = (".".join(parts[:start]) + "." if start else "", *split)
                break
        else:
            raise AdapterError(
                f"{path}: the adapter adapts {key.split('.lora_')[0]}, which this {encoder.family} model does not have: "
                f"it was trained over another kind of model ({base}); load it over that model"
            )
    return found


def load_adapter(encoder: Encoder, path: str | os.PathLike) -> Encoder:
    """The adapter in folder `path` (peft's format, whoever wrote it) on this encoder, in place and unmerged (it
    trains further if the caller lets it). Every adapted module must exist here with the adapter's shapes: an
    adapter of another base model is refused in one line."""
    path = Path(path)
    config = read_adapter_config(path)
    if config.get("modules_to_save"):
        raise AdapterError(
            f"{path / ADAPTER_CONFIG}: the adapter also saves whole modules ({', '.join(config['modules_to_save'])}); "
            "ctxrep loads adapters of the encoder's projections alone"
        )
    if has_adapter(encoder):
        raise AdapterError(f"this {encoder.family} encoder already has adapters; merge them first (merge_adapter)")
    base = config.get("base_model_name_or_path") or "its base model"
    weights = read_adapter_weights(path)
    to_ours = {theirs: ours for ours, theirs in encoder.hf_module_names().items()}
    tails = {key: (module, rest) for key, (_, module, rest) in locate_keys(encoder, weights, path, base).items()}
    ours_key = {key: f"{to_ours[module]}.{rest}" for key, (module, rest) in tails.items()}
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for key, (module, rest) in tails.items():
        by_module.setdefault(module, {})[rest] = weights[key]
    ranks = {}
    for module, parts in by_module.items():
        layer = encoder.get_submodule(to_ours[module])
        a, b = parts.get("lora_A.weight"), parts.get("lora_B.weight")
        if a is None or b is None:
            raise AdapterError(
                f"{path}: the adapter of {module} lacks its lora_A or lora_B weight; the file is damaged"
            )
        if (a.shape[1], b.shape[0]) != (layer.in_features, layer.out_features):
            raise AdapterError(
                f"{path}: the adapter of {module} maps {a.shape[1]} -> {b.shape[0]} features, but that projection is "
                f"{layer.in_features} -> {layer.out_features} here: it was trained over another model ({base}, "
                "another hidden size); load it over that model"
            )
        ranks[to_ours[module]] = int(a.shape[0])
    adapted = sorted(ranks)
    rank, alpha = int(config.get("r", 8)), config.get("lora_alpha", 8)
    alpha_of = _alpha_of(config)
    to_hf = encoder.hf_module_names()
    peft = _peft()
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    settings = {k: v for k, v in config.items() if k in known and k != "peft_type"}
    settings |= {
        "target_modules": adapted,
        "rank_pattern": {m: r for m, r in ranks.items() if r != rank},
        "alpha_pattern": {m: a for m in adapted if (a := alpha_of(to_hf[m])) != alpha},
        "layers_to_transform": None,
        "layers_pattern": None,
        "exclude_modules": None,
        "fan_in_fan_out": False,  # ctxrep's projections are nn.Linear (GPT-2's too)
        "inference_mode": False,
    }
    _inject(encoder, peft.LoraConfig(**settings))
    from peft.utils import set_peft_model_state_dict

    result = set_peft_model_state_dict(encoder, {ours_key[k]: v for k, v in weights.items()})
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise AdapterError(
            f"{path}: the adapter's weights do not fit its modules here (missing {missing[:3]}, unexpected "
            f"{list(result.unexpected_keys)[:3]}); it was written for another model ({base})"
        )
    return encoder


def _alpha_of(config: dict):
    """lora_alpha of a module by its transformers name, as peft reads alpha_pattern (a key matches a name's tail)."""
    import re

    patterns = config.get("alpha_pattern") or {}
    default = config.get("lora_alpha", 8)

    def alpha(name: str):
        for key, value in patterns.items():
            if re.match(rf"(.*\.)?({key})$", name):
                return value
        return default

    return alpha


def merge_adapter(module: nn.Module) -> nn.Module:
    """Fold every adapter inside `module` into its projection's weight (W + (alpha / r) B A) and put the plain
    projection back in its place (peft's merge): the module is adapter-free, its forward unchanged up to rounding.
    Returns the module."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [(name, m) for name, m in module.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, layer in layers:
        layer.merge()
        owner, _, leaf = name.rpartition(".")
        base = layer.get_base_layer()
        setattr(module.get_submodule(owner) if owner else module, leaf, base)
    for m in module.modules():
        vars(m).pop("peft_config", None)
    return module


def merged_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` with its adapters merged (merge_adapter); the module itself is left as it was."""
    return merge_adapter(copy.deepcopy(module))
