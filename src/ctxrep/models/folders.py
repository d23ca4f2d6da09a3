"""Reading and writing checkpoint folders safely: the bottom of models/, imported by every family file.

Weights are read from safetensors, or from pytorch_model.bin with `torch.load(weights_only=True)`: nothing here
unpickles arbitrary objects. Folders are written as config.json + model.safetensors (Hugging Face's layout).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ctxrep.util.files import apply_umask


class CheckpointError(ValueError):
    """A model folder or weight file that cannot be used, with what is wrong and what to do."""


@dataclass(frozen=True)
class CheckpointLayout:
    """How a family's model sits in a transformers folder: the declarations that Encoder's from_pretrained,
    load_hf_state_dict and save_pretrained (models/encoder.py) read, so a family file states them instead of
    writing the loading code again. The weight names themselves come from the family's `checkpoint_names()`."""

    model_types: tuple[str, ...]  # config.json model_type values this family reads
    what: str | None = None  # how errors name the model ("an MPNet encoder"); None: "a {family} encoder"
    prefix: str = ""  # task / pre-training checkpoints store the model under it ("bert."); "" for none
    prefix_marker: str | None = None  # the prefix is removed when a name starts with this (None: the prefix)
    head_prefixes: tuple[str, ...] = ()  # heads on top of the model: named in one log line and not loaded
    head_noun: str = "task-head weights"  # what that log line calls them
    buffers: tuple[str, ...] | frozenset[str] = ()  # names some files carry that are not weights (position ids)
    transposed: tuple[str, ...] = ()  # names ending so are stored (in, out), as transformers' Conv1D keeps them
    hint: str = ""  # added to the error for weights that do not fit


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """model.safetensors if present, else pytorch_model.bin (tensors only: weights_only=True)."""
    st, pt = path / "model.safetensors", path / "pytorch_model.bin"
    if st.is_file():
        try:
            return load_file(st)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(
                f"{st}: corrupt or unreadable safetensors file ({e}); re-download or re-save it"
            ) from e
    if pt.is_file():
        try:
            state = torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types for a truncated or foreign pickle
            raise CheckpointError(
                f"{pt}: cannot read it as a tensors-only PyTorch checkpoint ({type(e).__name__}: {e}); "
                "ctxrep never unpickles arbitrary objects: convert it to model.safetensors"
            ) from e
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{pt}: expected a dict of tensors")
        return state
    raise CheckpointError(f"{path}: no weights found: expected model.safetensors or pytorch_model.bin")


def check_weights(
    found: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    source: str,
    what: str,
    hint: str = "",
    noun: str = "weights",
) -> None:
    """Refuse a checkpoint that does not fit the model: one error naming every missing, unknown and mis-shaped
    entry. `found` and `expected` map checkpoint names to shapes (in the checkpoint's own layout)."""
    missing = [k for k in expected if k not in found]
    unknown = [k for k in found if k not in expected]
    mis_shaped = [
        f"{k} {tuple(found[k])} (expected {tuple(expected[k])})"
        for k in expected
        if k in found and tuple(found[k]) != tuple(expected[k])
    ]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} {noun}: {', '.join(missing)}")
    if unknown:
        problems.append(f"{len(unknown)} unknown {noun}: {', '.join(unknown)}")
    if mis_shaped:
        problems.append(f"{len(mis_shaped)} {noun} with the wrong shape: {', '.join(mis_shaped)}")
    if problems:
        raise CheckpointError(
            f"{source}: cannot load as {what}: " + "; ".join(problems) + (f". {hint}" if hint else "")
        )


def load_named_weights(
    module: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    names: Mapping[str, str],
    source: str,
    what: str,
    *,
    outside: tuple[str, ...] = (),
    outside_noun: str = "task-head weights",
    not_weights: tuple[str, ...] | frozenset[str] = (),
    transposed: tuple[str, ...] = (),
    hint: str = "",
) -> None:
    """The loading loop of every family: copy state[ckpt] into the module's tensor names[ckpt] for every entry of
    `names` (checkpoint name -> module name), cast to the module's dtype.

    A checkpoint name outside `names` that starts with one of `outside` (a task or pre-training head on top of the
    model) is named in one log line and not loaded; names in `not_weights` (buffers some files carry, such as
    precomputed position ids) are passed over; a name ending with one of `transposed` is stored (in, out), as
    transformers' Conv1D keeps it, and is loaded transposed. Anything else missing, unknown or mis-shaped is
    refused in one CheckpointError naming every one (`check_weights`)."""
    ours = module.state_dict()
    skipped = [k for k in state if k not in names and k.startswith(outside)]
    found = {k: tuple(v.shape) for k, v in state.items() if k not in not_weights and k not in skipped}
    expected = {}
    for ckpt, our in names.items():
        shape = tuple(ours[our].shape)
        expected[ckpt] = shape[::-1] if ckpt.endswith(transposed) else shape
    check_weights(found, expected, source, what, hint=hint)
    if skipped:
        shown = ", ".join(skipped[:20]) + (f" and {len(skipped) - 20} more" if len(skipped) > 20 else "")
        # under the family's own logger, where users of that family look for it
        logging.getLogger(type(module).__module__).info(
            "%s: not loading %d %s: %s", source, len(skipped), outside_noun, shown
        )
    with torch.no_grad():
        for ckpt, our in names.items():
            w = state[ckpt]
            ours[our].copy_((w.t() if ckpt.endswith(transposed) else w).to(ours[our].dtype))


def named_tensors(
    module: torch.nn.Module, names: Mapping[str, str], transposed: tuple[str, ...] = ()
) -> dict[str, torch.Tensor]:
    """The module's tensors under their checkpoint names (`names`: checkpoint name -> module name), the names
    ending with one of `transposed` back to (in, out): what `load_named_weights` reads, for saving."""
    ours = module.state_dict()
    return {ckpt: ours[our].t() if ckpt.endswith(transposed) else ours[our] for ckpt, our in names.items()}


def layer_names(
    num_layers: int, hf_stack: str, per_layer: Mapping[str, str], params: tuple[str, ...] = ("weight", "bias")
) -> dict[str, str]:
    """The per-layer part of a family's weight-name map: "{hf_stack}.{i}.{hf}.{p}" -> "layers.{i}.{our}.{p}" for
    every layer i, every (hf, our) module pair of `per_layer` and every parameter p."""
    return {
        f"{hf_stack}.{i}.{hf}.{p}": f"layers.{i}.{our}.{p}"
        for i in range(num_layers)
        for hf, our in per_layer.items()
        for p in params
    }


def without_prefix(state: dict[str, torch.Tensor], prefix: str, marker: str | None = None) -> dict[str, torch.Tensor]:
    """A task or pre-training checkpoint stores the model under `prefix` (e.g. "bert."): its names without it when
    any name starts with `marker` (default: the prefix itself), else the state as it is."""
    if not any(k.startswith(marker or prefix) for k in state):
        return state
    return {k.removeprefix(prefix): v for k, v in state.items()}


@contextmanager
def config_errors(path: Path) -> Iterator[None]:
    """Around building a family's config from config.json: a TypeError / ValueError becomes a CheckpointError that
    names the file (a CheckpointError passes as it is)."""
    try:
        yield
    except CheckpointError:
        raise
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{Path(path) / 'config.json'}: {e}") from e


def write_safetensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """safetensors refuses shared or non-contiguous storage: give it a contiguous CPU copy of each tensor."""
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, file, metadata={"format": "pt"})
    apply_umask(file)  # safetensors writes 0600 whatever the umask


def read_config(path: Path, model_types: tuple[str, ...] | None = None) -> dict:
    """config.json of a model folder as a dict; with `model_types`, refuse another model_type in one line."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: not a model folder: config.json is missing")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON (line {e.lineno}): {e.msg}") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    if model_types is not None and config.get("model_type") not in model_types:
        raise CheckpointError(
            f"{file}: model_type is {config.get('model_type')!r}, expected {' or '.join(map(repr, model_types))}; "
            "ctxrep.load_model picks the right model family for any folder"
        )
    return config


def write_folder(path: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """Write config.json + model.safetensors (Hugging Face's layout) into `path`, creating it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path
