"""--device, --precision and --backend: the runtime options of every command that runs an encoder
(`ctxrep.Featurizer(device=, precision=, backend=)`, `ctxrep.runtime`)."""

from __future__ import annotations

import click

# The same values as ctxrep.runtime.PRECISIONS / BACKENDS (tests/test_runtime.py checks), written out here so that
# `ctxrep --help` starts without importing torch.
PRECISIONS = ("fp32", "bf16", "fp16", "int8", "auto")
BACKENDS = ("torch", "onnxruntime", "openvino")

DEVICE_HELP = "Where the encoder runs: cpu, cuda, cuda:1 (default: cpu)."
PRECISION_HELP = (
    "Default: the model's own dtype (float32 for encoders; a bf16 decoder checkpoint stays bf16 where the CPU has "
    "native bf16). fp32 (exact), bf16, fp16, int8 (CPU), or auto: the fastest precision on this hardware whose vectors keep a mean "
    "cosine >= 0.999 to fp32 (bf16 on GPUs and on CPUs with avx512_bf16 or AMX, else fp32)."
)
BACKEND_HELP = (
    "torch; onnxruntime (fp32, int8) or openvino (fp32, bf16, fp16, int8; pip install 'ctxrep[openvino]'): the "
    "encoder exported once into $CTXREP_CACHE/graphs and checked against torch. ELMo: torch only."
)


def runtime_options(command=None, *, precisions: tuple[str, ...] = PRECISIONS, backends: tuple[str, ...] = BACKENDS):
    """Add --device, --precision and --backend to a click command (parameters device, precision, backend)."""

    def decorate(f):
        f = click.option(
            "--backend", type=click.Choice(backends), default="torch", show_default=True, help=BACKEND_HELP
        )(f)
        f = click.option("--precision", type=click.Choice(precisions), default=None, help=PRECISION_HELP)(f)
        return click.option("--device", default=None, help=DEVICE_HELP)(f)

    return decorate(command) if command is not None else decorate


def runtime_kwargs(device: str | None, precision: str | None, backend: str) -> dict:
    """The Featurizer keyword arguments of the three options, only those given (a given --precision fp32 is passed:
    it loads a bf16 checkpoint as float32)."""
    kwargs: dict = {}
    if device is not None:
        kwargs["device"] = device
    if precision is not None:
        kwargs["precision"] = precision
    if backend != "torch":
        kwargs["backend"] = backend
    return kwargs
