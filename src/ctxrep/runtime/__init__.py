"""Runtimes: what runs the encoder for a Featurizer. One small object per backend, chosen once at construction,
behind two methods:

    runtime.start(batch, layers, call_tokens, padded=False) -> wait: starts the encoder on one batch; wait() returns
        its hidden states (len(layers), batch, seq, hidden) as float32 on the CPU, once they are there; `padded`: the
        batch runs on the padded grid (`Encoder.encode(padded=True)`; exported graphs always do)
    runtime.in_flight(call_tokens) -> how many started batches the Featurizer keeps pending before it waits for the
        oldest and pools it: 1 where start() computes at once; more where the device or OpenVINO's streams run
        batches while the host pools earlier ones (pooling and collating overlapped with inference)
    runtime.hidden_states(batch, layers, call_tokens) = start(...)(), for one batch

Batches overlap by a fixed rule (the device, the number of threads and the size of the call), never a timing, and
overlapping never changes a vector.

  backend       precisions              where
  torch         fp32, bf16, fp16, int8  the model's device (int8: CPU); every family, ELMo included
  onnxruntime   fp32, int8              CPU; ctxrep's ONNX export (runtime/graphs.py), int8 by dynamic quantization
  openvino      fp32, bf16, fp16, int8  CPU; the same graph as OpenVINO IR, int8 by NNCF post-training quantization

Everything else the Featurizer does (words, windows, batches, pooling, mixes) is the same on every backend. ELMo
runs on backend='torch' only. precision='auto' follows the hardware's description (`hardware.auto_precision`),
never a timing.
"""

from __future__ import annotations

import torch

from ctxrep.models.encoder import Encoder
from ctxrep.runtime import hardware

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "auto")
BACKENDS = ("torch", "onnxruntime", "openvino")


def runtime_class(backend: str):
    """The runtime class of `backend` (imported here, so that only the chosen backend's module loads)."""
    if backend == "torch":
        from ctxrep.runtime.torch_backend import TorchRuntime

        return TorchRuntime
    if backend == "onnxruntime":
        from ctxrep.runtime.onnxruntime_backend import OnnxRuntime

        return OnnxRuntime
    if backend == "openvino":
        from ctxrep.runtime.openvino_backend import OpenVinoRuntime

        return OpenVinoRuntime
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def resolve(model: Encoder, backend: str, precision: str) -> tuple[type, str]:
    """(the runtime class, the concrete precision) for `model` where it is now; one-line errors for what cannot run."""
    check_precision(precision)
    cls = runtime_class(backend)
    device = next(model.parameters()).device
    if backend != "torch":
        if model.word_level:
            raise ValueError(
                f"{model.family} runs on backend='torch' only (a biLSTM over characters, which an exported graph "
                "would fix to one sentence length): leave backend at 'torch'"
            )
        if device.type != "cpu":
            raise ValueError(f"backend={backend!r} runs on the CPU; the model is on {device}: use backend='torch'")
    cls.require()  # after the checks above: what cannot run here is said before what is not installed
    if precision == "auto":
        precision = hardware.auto_precision(device, cls.precisions)
    if precision not in cls.precisions:
        raise ValueError(
            f"backend={backend!r} runs precision {' / '.join(cls.precisions)}, not {precision!r}: "
            "choose one of those, or backend='torch'"
        )
    if precision == "int8" and model.word_level:
        raise ValueError(
            f"precision='int8': {model.family} is a biLSTM over characters; int8 applies to Transformer linear "
            "layers: use precision='fp32' or 'bf16'"
        )
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"precision='int8' runs on the CPU only (the model is on {device}): use 'bf16' on a GPU")
    return cls, precision


def parse_device(device: str | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), got {device!r}") from e
