"""ONNX Runtime (CPU): ctxrep's exported graph (`graphs.fp32_onnx`), or its dynamic int8 quantization."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from ctxrep.models.encoder import Encoder
from ctxrep.runtime import fast, graphs


class OnnxRuntime:
    """Batch in, hidden states out, through an ONNX Runtime session over the cached graph (exported on first use)."""

    backend = "onnxruntime"
    precisions = ("fp32", "int8")

    @staticmethod
    def require() -> None:
        """A one-line error when ONNX Runtime is not installed."""
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            raise ValueError(
                f"backend='onnxruntime' needs onnxruntime, onnx and onnxscript ({e}): pip install 'ctxrep[onnx]'"
            ) from e

    def __init__(self, model: Encoder, tokenizer, precision: str, compile: bool | str, max_length: int) -> None:
        self.model = model
        self.tokenizer, self.max_length = tokenizer, max_length
        self.precision = precision
        self.device = torch.device("cpu")
        self._sessions: dict[tuple[int, ...], tuple[object, set[str]]] = {}  # layers -> (session, its input names)

    def _session(self, layers: tuple[int, ...]) -> tuple[object, set[str]]:
        if layers not in self._sessions:
            path = (
                graphs.fp32_onnx(self.model, layers)
                if self.precision == "fp32"
                else graphs.ort_int8_onnx(self.model, layers, fast.calibration_batches(self.tokenizer, self.max_length))
            )
            session = graphs.ort_session(path, torch.get_num_threads())
            self._sessions[layers] = (session, {i.name for i in session.get_inputs()})
        return self._sessions[layers]

    def in_flight(self, call_tokens: int) -> int:
        return 1  # session.run computes at once

    def start(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0, padded: bool = False
    ) -> Callable[[], torch.Tensor]:
        hidden = self.hidden_states(batch, layers, call_tokens)
        return lambda: hidden

    def hidden_states(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0
    ) -> torch.Tensor:
        """(len(layers), batch, seq, hidden) float32 on the CPU."""
        unique = tuple(sorted(set(layers)))  # the graph's outputs, in this order
        session, names = self._session(unique)
        outputs = session.run(graphs.output_names(unique), {k: v.numpy() for k, v in batch.items() if k in names})
        return torch.stack([torch.from_numpy(outputs[unique.index(i)]) for i in layers])
