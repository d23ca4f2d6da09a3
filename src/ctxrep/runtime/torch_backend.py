"""The PyTorch runtime: the encoder's own forward, on its device, at the chosen precision.

  fp32        the model itself; on CPUs where the rule in `hardware.prepack_pays` says so, a copy whose linear layers
              are oneDNN pre-packed (the same results to ~1e-6); torch.compile for large calls (`compile`)
  bf16, fp16  a copy of the model cast to that dtype (the model stays as it was); compiled like fp32
  int8        `fast.quantize_int8`'s copy: SmoothQuant-calibrated int8 linear layers, CPU only

Every family runs here, ELMo included (its biLSTM runs in float32 or a cast copy; compile and int8 refuse it).
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Mapping, Sequence

import torch

from ctxrep.models.encoder import Encoder
from ctxrep.runtime import fast
from ctxrep.runtime.hardware import prepack_pays

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Pinned input buffers on CUDA, used in turn: one more than the batches in flight (in_flight) keeps a slot free.
PINNED_SLOTS = 3

# oneDNN keeps a compiled kernel per input shape of a pre-packed linear layer, 1,024 by default, each with buffers
# that grow with the shape; length-sorted batches give nearly every batch new shapes, so a corpus job's memory grew
# with it (a million sentences: 1,120 MiB against 616 MiB with 8). A batch uses ~4 shapes (Q/K/V/O, the two
# feed-forward layers, the pooler), so 16 still reuses the last few batches' kernels. Read by oneDNN once, when its
# first kernel is made: a value the user set first wins.
ONEDNN_CACHE_CAPACITY = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")


class TorchRuntime:
    """Batch in, hidden states out, through the encoder's PyTorch forward. The inference copy (pre-packed, cast or
    int8) is built on first use and kept; `model` is never changed."""

    backend = "torch"
    precisions = ("fp32", "bf16", "fp16", "int8")

    @staticmethod
    def require() -> None:
        """Nothing to check: torch is always there."""

    def __init__(self, model: Encoder, tokenizer, precision: str, compile: bool | str, max_length: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.precision = precision
        self.compile = compile
        self.max_length = max_length
        self.device = next(model.parameters()).device
        self._inference: torch.nn.Module | None = None
        self._compiled: fast.CompiledEncoder | None = None
        self._pinned: list[dict[str, torch.Tensor]] = [{} for _ in range(PINNED_SLOTS)]  # CUDA input buffers
        self._next_slot = 0

    @property
    def encoder(self) -> torch.nn.Module:
        """The inference copy this runtime runs (built on first use)."""
        if self._inference is None:
            self._inference = self._build()
        return self._inference

    def _build(self) -> torch.nn.Module:
        if self.precision == "int8":
            return fast.quantize_int8(self.model, fast.calibration_batches(self.tokenizer, self.max_length))
        dtype = DTYPES[self.precision]
        if self.precision != "fp32" and any(p.dtype != dtype for p in self.model.parameters()):
            return copy.deepcopy(self.model).to(dtype).eval()
        return prepack_for_inference(self.model) if prepack_pays() else self.model

    def _encoder_for(self, call_tokens: int) -> torch.nn.Module:
        """The compiled copy when `compile` asks for it (True; or "auto" and a call of `call_tokens` that pays for
        compiling, or one compiled earlier), else `encoder`. int8 runs uncompiled."""
        if self._compiled is not None:
            return self._compiled
        if self.precision != "int8" and (
            self.compile is True or (self.compile == "auto" and fast.worth_compiling(call_tokens, self.model))
        ):
            base = self.model if self.precision == "fp32" else self.encoder  # compiled code folds the weights in
            self._compiled = fast.compile_encoder(base, fallback=self.compile == "auto")  # "auto" never fails a call
            return self._compiled
        if self.precision == "fp32" and self.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            return self.model  # the caller's autocast: oneDNN's pre-packed copy has no bf16 path without AVX-512 BW
        return self.encoder

    def in_flight(self, call_tokens: int) -> int:
        """On CUDA the host pools one batch while the device runs the next; on the CPU one at a time."""
        return 2 if self.device.type == "cuda" else 1

    def start(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0, padded: bool = False
    ) -> Callable[[], torch.Tensor]:
        """Run the encoder on `batch` (CPU tensors; stopping after the highest layer asked for). On CUDA the inputs
        go through reused pinned host buffers with non-blocking copies, the hidden states come back into pinned
        memory in their own dtype, asynchronously, and wait() synchronizes on that copy and widens them to float32;
        on the CPU they are ready at once (float32: no copy)."""
        if self.device.type == "cuda":
            batch = self._to_device(batch)
        elif self.device.type != "cpu":
            batch = {k: v.to(self.device) for k, v in batch.items()}
        top = max(layers)
        num_layers = top if top < self.model.num_layers else None
        out = self._encoder_for(call_tokens).encode(batch, num_layers=num_layers, padded=padded)
        selected = torch.stack([out.hidden_states[i] for i in layers])  # (layers, batch, seq, hidden)
        if self.device.type != "cuda":
            host = selected.float().cpu()
            return lambda: host
        host = torch.empty(selected.shape, dtype=selected.dtype, pin_memory=True)
        host.copy_(selected, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def wait() -> torch.Tensor:
            done.synchronize()  # its copy into host memory has landed
            return host.float()

        return wait

    def _to_device(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`batch` on the device through pinned host buffers reused across batches: PINNED_SLOTS sets, taken in
        turn, each grown (never shrunk) to the largest batch it has held. A slot is written again only after the
        batches started since have been waited for (the Featurizer keeps at most `in_flight` pending), and the
        copy out of it was queued before that batch's compute, so it has landed."""
        slot = self._pinned[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._pinned)
        out = {}
        for k, v in batch.items():
            buffer = slot.get(k)
            if buffer is None or buffer.numel() < v.numel() or buffer.dtype != v.dtype:
                buffer = slot[k] = torch.empty(max(v.numel(), 1), dtype=v.dtype, pin_memory=True)
            staged = buffer[: v.numel()].view(v.shape)
            staged.copy_(v)
            out[k] = staged.to(self.device, non_blocking=True)
        return out

    def hidden_states(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0
    ) -> torch.Tensor:
        """(len(layers), batch, seq, hidden) float32 on the CPU."""
        return self.start(batch, layers, call_tokens)()


def prepack_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose linear layers run through oneDNN with pre-packed weights (the same results to ~1e-6);
    the model itself where that path does not apply (off the CPU, not float32, a family that has not asked for it
    with `prepack_for_inference`, or a torch build without oneDNN). Inference only."""
    if not torch.backends.mkldnn.is_available() or any(p.device.type != "cpu" for p in model.parameters()):
        return model
    if any(p.dtype != torch.float32 for p in model.parameters()):  # to_mkldnn would turn a bfloat16 model float32
        return model
    if not getattr(model, "prepack_for_inference", False):  # measured faster for the BERT family only
        return model
    os.environ.setdefault(*ONEDNN_CACHE_CAPACITY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.utils.mkldnn builds TorchScript modules
        try:
            from torch.utils import mkldnn

            return mkldnn.to_mkldnn(copy.deepcopy(model))
        except (RuntimeError, AttributeError):  # a torch build without a usable oneDNN path
            return model
