"""ONNX Runtime (CPU): ctxrep's exported graph (`graphs.fp32_onnx`), or its dynamic int8 quantization."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ctxrep.models.encoder import Encoder
from ctxrep.runtime import graphs


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
        self.precision = precision
        self.device = torch.device("cpu")
        self._sessions: dict[tuple[int, ...], object] = {}  # layers -> session

    def _session(self, layers: tuple[int, ...]):
        if layers not in self._sessions:
            path = (
                graphs.fp32_onnx(self.model, layers)
                if self.precision == "fp32"
                else graphs.ort_int8_onnx(self.model, layers)
            )
            self._sessions[layers] = graphs.ort_session(path, torch.get_num_threads())
        return self._sessions[layers]

    def hidden_states(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0
    ) -> torch.Tensor:
        """(len(layers), batch, seq, hidden) float32 on the CPU."""
        session = self._session(tuple(sorted(set(layers))))
        names = {i.name for i in session.get_inputs()}
        wanted = [f"hidden_state_{i}" for i in sorted(set(layers))]
        outputs = session.run(wanted, {k: v.numpy() for k, v in batch.items() if k in names})
        by_name = dict(zip(wanted, outputs))
        return torch.stack([torch.from_numpy(by_name[f"hidden_state_{i}"]) for i in layers])
