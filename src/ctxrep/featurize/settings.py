"""The featurizer's settings: checked before anything loads, the model loaded in the dtype that runs, the layers chosen.

check_settings(...)          every argument that can be refused without a model, refused here
load(model, device, ...)     the LoadedEncoder, and precision="auto" decided before its weights load
load_dtype / precision_of    the dtype a model is loaded in for a precision, and back
auto_sentence_pooling(folder)  sentence_pooling="auto": the folder's own pooling where ctxrep applies it
layer_choice(layers, n)      layers= (an index, a list, "all", "mix", a ScalarMix) as indices and a mix
"""

from __future__ import annotations

import warnings

import torch

from ctxrep import runtime
from ctxrep.featurize.pooling import POOLINGS
from ctxrep.featurize.spec import SENTENCE_POOLINGS
from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import LoadedEncoder, load_encoder
from ctxrep.models.sentence_transformers import is_sentence_transformers_folder, read_sentence_pooling
from ctxrep.models.shards import DTYPES
from ctxrep.modules.scalar_mix import ScalarMix


def auto_sentence_pooling(folder) -> str:
    """sentence_pooling="auto" for a model folder: "model" where the folder declares its own pooling (a
    sentence-transformers modules.json) that ctxrep applies; "mean" without one, or, with a warning naming why,
    where ctxrep cannot apply the declared one."""
    if folder is None or not is_sentence_transformers_folder(folder):
        return "mean"
    try:
        read_sentence_pooling(folder)
    except CheckpointError as e:
        warnings.warn(f"sentence_pooling='auto' uses the mean of the words: {e}", stacklevel=3)
        return "mean"
    return "model"


def load_dtype(backend: str, precision: str | None) -> str:
    """The dtype (load_encoder's `dtype`) in which the Featurizer loads a model given by name, for a concrete
    precision: on backend="torch" the precision's own, so that the runtime runs the loaded weights (no cast copy);
    float32 for int8 (quantized from float32) and for ONNX Runtime and OpenVINO (graphs exported from float32);
    None: "auto", the model's own default (models/shards.resolve_dtype)."""
    if backend != "torch" or precision == "int8":
        return "fp32"
    return "auto" if precision is None else precision


def precision_of(model: torch.nn.Module) -> str:
    """The precision name of the dtype `model`'s parameters are in ("fp32", "bf16", "fp16")."""
    dtype = next(model.parameters()).dtype
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"the model's parameters are {dtype}: ctxrep runs float32, bfloat16 or float16 models")
    return names[dtype]


def check_settings(pooling, sentence_pooling, compile, quantize, precision, backend) -> str | None:
    """Featurizer's settings checked before anything loads; returns the precision asked for (quantize="int8": "int8")."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if sentence_pooling not in SENTENCE_POOLINGS:
        raise ValueError(f"sentence_pooling must be one of {SENTENCE_POOLINGS}, got {sentence_pooling!r}")
    if compile not in (True, False, "auto"):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    if quantize is not None:  # stacklevel 3: the line that built the Featurizer
        warnings.warn("quantize='int8' is now precision='int8'", DeprecationWarning, stacklevel=3)
        precision = "int8"
    if precision is not None:
        runtime.check_precision(precision)
    runtime.runtime_class(backend).require()  # an unknown backend, or a missing package, is said here
    return precision


def load(model, device, backend: str, precision: str | None) -> tuple[LoadedEncoder, str | None]:
    """The encoder (a LoadedEncoder as it is, else loaded by name or folder) and the precision, "auto" decided
    before loading so that the weights load in the dtype that runs (a LoadedEncoder's "auto" is decided later)."""
    if isinstance(model, LoadedEncoder):
        return model, precision
    if precision == "auto":
        where = device or torch.device("cpu")
        precision = runtime.hardware.auto_precision(where, runtime.runtime_class(backend).precisions)
    return load_encoder(model, dtype=load_dtype(backend, precision)), precision


def layer_choice(layers, num_layers: int) -> tuple[list[int], ScalarMix | None, bool]:
    """(layer indices, the ScalarMix over them or None, whether one array per word comes back: no layer axis) of
    the Featurizer's `layers` argument on a model of `num_layers` layers (+ the embedding output, layer 0)."""
    n = num_layers + 1  # embedding output + every layer
    if isinstance(layers, ScalarMix):
        if layers.num_layers != n:
            raise ValueError(f"the ScalarMix mixes {layers.num_layers} layers but the model has {n} (with layer 0)")
        return list(range(n)), layers, True
    if isinstance(layers, str):
        if layers == "all":
            return list(range(n)), None, False
        if layers == "mix":
            return list(range(n)), ScalarMix(n, trainable=False), True
        raise ValueError(f"layers must be an int, a list of ints, 'all', 'mix' or a ScalarMix, got {layers!r}")
    indices = [layers] if isinstance(layers, int) else list(layers)
    if not indices:
        raise ValueError("layers is an empty list")
    out = []
    for i in indices:
        if not isinstance(i, int) or not -n <= i < n:
            raise ValueError(f"layer {i!r} is out of range: the model has layers 0..{n - 1} (0 = embeddings)")
        out.append(i % n)
    return out, None, isinstance(layers, int)
