"""The precision a training run computes in: "fp32", or "bf16" (bfloat16 autocast for the forward passes and the
loss; weights, gradients and AdamW's moments stay float32), or "auto": bf16 where the hardware multiplies bfloat16
natively, float32 elsewhere.

    resolve_precision("auto", "cpu")    # "bf16" on a CPU with avx512_bf16 or AMX, else "fp32"
    resolve_precision("auto", "cuda")   # "bf16" on a GPU with bf16 (torch.cuda.is_bf16_supported)

"auto" reads the hardware's description (ctxrep.runtime.hardware.device_has_bf16, the rule the Featurizer's
precision="auto" follows), never a timing, so the same machine makes the same choice on every run. The estimators
take `bf16: bool` (float32 by default: scikit-learn's fits repeat exactly); `ctxrep finetune --precision` and
`ctxrep pretrain --precision` take these names, DEFAULT_PRECISION when not given.

Why "auto" is the commands' default: benchmarks/training_precision.py fine-tunes MiniLM on 4,000 SST-2 sentences at
float32 and with bf16 autocast (same seed, same batches) and requires the bf16-trained model's dev accuracy within
0.5 points of float32's: 87.16 against 87.04 on a Sapphire Rapids Xeon with AMX (2 cores), where bf16 autocast
trained MiniLM at 1.5x float32's tokens/s (and the small MLM step at 1.5x).
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "auto")  # the choices of `--precision` on the training commands
DEFAULT_PRECISION = "auto"


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(
            f"training precision {precision!r} is unknown; use fp32 (float32), bf16 (bfloat16 autocast) or auto "
            "(bf16 where the CPU has avx512_bf16 or AMX, or on a GPU with bf16; else fp32)"
        )


def resolve_precision(precision: str, device) -> str:
    """ "fp32" or "bf16" for `precision` ("fp32", "bf16" or "auto") on `device` (a torch.device or its name)."""
    check_precision(precision)
    if precision != "auto":
        return precision
    import torch

    from ctxrep.runtime import hardware

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), got {device!r}") from e
    return "bf16" if hardware.device_has_bf16(device) else "fp32"


def describe(precision: str, asked: str) -> str:
    """One line for the commands to print: what the run computes in, and why when "auto" chose it."""
    shown = "bf16 autocast (float32 weights and optimizer)" if precision == "bf16" else "float32"
    if asked != "auto":
        return f"precision: {shown}"
    why = "this device multiplies bfloat16 natively" if precision == "bf16" else "no native bfloat16 on this device"
    return f"precision: {shown} (auto: {why})"


def bf16_autocast(device_type: str, enabled: bool):
    """bfloat16 autocast on `device_type` when enabled, else nothing (torch.autocast refuses some device types,
    such as "meta", even when disabled). The Trainer's forward passes and the estimators' encoders run under it."""
    import contextlib

    import torch

    return torch.autocast(device_type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()
