"""What this machine offers, read from its description (never from a timing), and the choices made from it.

Every choice here changes either the numbers a featurizer returns or only its speed, and both must be the same
from run to run on the same machine: so they follow the CPU's flags in /proc/cpuinfo (or the GPU's properties),
which do not change while a job runs, never a measurement of how fast something ran a moment ago.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # native bfloat16 dot products (Cooper Lake / Zen 4 and later; AMX)
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


@functools.cache
def _cpuinfo() -> tuple[str, str, frozenset[str]]:
    """(vendor_id, model name, flags) of the first processor in /proc/cpuinfo; empty where there is none."""
    vendor, model, flags = "", "", frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return vendor, platform.processor() or "", flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return vendor, model, flags


def cpu_flags() -> frozenset[str]:
    return _cpuinfo()[2]


def cpu_vendor() -> str:
    """ "GenuineIntel", "AuthenticAMD", ... ("" where /proc/cpuinfo is missing)."""
    return _cpuinfo()[0]


def cpu_description() -> str:
    """The CPU's model name and the flags that decide ctxrep's fast paths, e.g. for a benchmark table."""
    vendor, model, flags = _cpuinfo()
    present = [f for f in REPORTED_FLAGS if f in flags]
    return f"{model or vendor or 'unknown CPU'} (flags: {', '.join(present) or 'none of ' + '/'.join(REPORTED_FLAGS)})"


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (avx512_bf16 or AMX); without, bfloat16 is emulated and slower."""
    return any(f in cpu_flags() for f in BF16_CPU_FLAGS)


def prepack_pays() -> bool:
    """Whether oneDNN pre-packed float32 linear layers (`featurize`'s torch runtime) are used on this CPU.

    A fixed rule by vendor, from measurements of MiniLM's shapes on 2 threads: 1.4-2x the default BLAS path on
    AMD EPYC (Zen 3 / Zen 4), 0.8x on an Ice Lake Xeon and 0.9x on a Sapphire Rapids Xeon. Results differ by
    ~1e-6 either way; the rule only keeps the choice the same on every run of one machine."""
    return cpu_vendor() == "AuthenticAMD"


def device_has_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_bf16()
    return False


def auto_precision(device: torch.device, backends_precisions: tuple[str, ...]) -> str:
    """precision="auto": the fastest precision on this hardware whose word vectors keep a mean cosine >= 0.999 to
    float32, among those the backend runs. bfloat16 measured 0.9999 (MiniLM, SST) and runs natively on GPUs with
    bf16 and on CPUs with avx512_bf16 or AMX; int8 measured 0.993-0.997, below the bar, so it is never automatic.
    Elsewhere float32."""
    if "bf16" in backends_precisions and device_has_bf16(device):
        return "bf16"
    return "fp32"


# The CPU budget of a narrow model (under 384 wide) grows to keep tokens x width near 2,048 x 512, up to this: the
# per-batch work of the host (collation, module calls, pooling) is then spread over more tokens. Measured with
# benchmarks/host_overhead.py's 32-wide encoder on the shared 2-core machine (load 7-11): 4,000 sentences under the
# model's pooling in 8.2 s at 2,048 tokens, 3.0 s at 8,192, 2.8 s at 32,768.
CPU_MAX_BATCH_TOKENS = 16384


def default_batch_tokens(device: torch.device, hidden_size: int, num_layers: int) -> int:
    """The token budget of one batch when none is given. On a CPU: 2,048 tokens for a model 384 to 512 wide (MiniLM),
    more for a narrower one (tokens x width near 2,048 x 512, a power of two up to CPU_MAX_BATCH_TOKENS),
    1,024 for a wider one (base and large shapes: their 4x-wide feed-forward activations of a batch then stay in
    cache; DistilBERT- and DeBERTa-v3-base ran 9% faster at 1,024 than at 2,048, MiniLM the same, RESULTS.md). On a GPU as many tokens as keep every layer's activations (about 64 x 4 bytes x
    hidden per token per layer, attention and the feed-forward's 4x width included) within its memory, as a power
    of two between 4,096 and 131,072. Only the speed depends on it: batches never change a vector."""
    if device.type != "cuda":
        if hidden_size > 512:
            return 1024
        budget = 2048  # narrower than MiniLM: as many more tokens as keep the batch's activations the same size
        while budget * 2 <= min(CPU_MAX_BATCH_TOKENS, 2048 * 512 // hidden_size):
            budget *= 2
        return budget
    total = torch.cuda.get_device_properties(device).total_memory
    fit = total // (64 * 4 * hidden_size * (num_layers + 1))
    budget = 4096
    while budget * 2 <= min(fit, 131072):
        budget *= 2
    return budget


FP16_CPU_FLAGS = ("avx512_fp16", "amx_fp16")  # native float16 arithmetic (Sapphire Rapids and later)


def slower_than_fp32(device: torch.device, backend: str, precision: str) -> str | None:
    """Why `precision` runs slower than float32 on `device` with `backend`, from the CPU's flags (never a timing), or
    None. torch on a CPU without native bfloat16 / float16 arithmetic converts every product (fp16 ran 2x slower than
    fp32 on an AMD EPYC with AVX-512 but no avx512_fp16); OpenVINO and ONNX Runtime pick their own kernels."""
    if device.type != "cpu" or backend != "torch":
        return None
    if precision == "bf16" and not cpu_has_bf16():
        return "bf16 on this CPU is emulated (no avx512_bf16 or AMX): it runs slower than fp32"
    if precision == "fp16" and not any(f in cpu_flags() for f in FP16_CPU_FLAGS):
        return "fp16 on this CPU is emulated (no avx512_fp16 or AMX-FP16): it runs slower than fp32 (2x measured)"
    return None
