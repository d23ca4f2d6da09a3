"""The encoder as an ONNX graph (and OpenVINO IR), exported once per model, depth and precision into ctxrep's cache.

`$CTXREP_CACHE/graphs/KEY/` (~/.cache/ctxrep/graphs), KEY a hash of the model's class, config and every weight and
of the layers asked for, holds:
  fp32.onnx           inputs input_ids, attention_mask[, token_type_ids] (batch, sequence); outputs hidden_state_I for
                      each layer I asked for (batch, sequence, hidden): ctxrep.runtime.export's exporters on a float32 CPU copy,
                      checked against the torch forward when written (max |difference| at real tokens)
  ort-int8.onnx       onnxruntime.quantization.quantize_dynamic of a SmoothQuant-smoothed export (int8 weights per
                      channel), calibrated on `fast.CALIBRATION_TEXTS`
  openvino.xml/.bin   fp32.onnx as OpenVINO IR (fp32, bf16 and fp16 are compile-time hints over it)
  openvino-int8.xml   NNCF post-training quantization of it, calibrated on `fast.CALIBRATION_TEXTS`
  check.json          what each file's check measured against the torch forward
A graph whose weights exceed export.EXTERNAL_DATA_LIMIT (2.4 GB for a 0.6B decoder at float32) keeps them beside it
in NAME.onnx.data (fp32.onnx.data, ort-int8.onnx.data), which ONNX Runtime and OpenVINO read from there.
Files are written in a temporary folder and renamed (a data file before its graph), so a killed export leaves
nothing half-written; a second process finding them reuses them (a graph whose data file is gone is made again).
Reused files are not re-checked: the key changes with any weight.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.models.encoder import Encoder

GRAPH_VERSION = 2  # bump when the exported graph's inputs or outputs change: old cache entries are then not read
FP32_TOLERANCE = 1e-4  # x max(1, largest |hidden state|): float32 graphs compute the same function
QUANTIZED_MIN_COSINE = 0.95  # a quantized graph's mean cosine to the torch forward at real tokens, top layer


class GraphError(ValueError):
    """An encoder that cannot be exported, or a graph whose output differs from the torch forward."""


def graphs_dir() -> Path:
    from ctxrep.models.hub import ctxrep_cache

    return ctxrep_cache() / "graphs"


def output_names(layers: tuple[int, ...]) -> list[str]:
    return [f"hidden_state_{i}" for i in layers]


def model_key(model: Encoder, layers: tuple[int, ...]) -> str:
    """A hash of what the graph computes: the class, its config, every parameter and buffer (names, shapes, dtypes,
    bytes), the layers output, and GRAPH_VERSION."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{GRAPH_VERSION}|{type(model).__module__}.{type(model).__qualname__}|{layers}|".encode())
    h.update(repr(getattr(model, "config", None)).encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"|{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class HiddenStates(nn.Module):
    """The encoder as a function of tensors: (input_ids, attention_mask[, token_type_ids]) -> the hidden states of
    `layers` (only those: a graph with fewer outputs converts and copies less, e.g. at bf16)."""

    def __init__(self, encoder: Encoder, layers: tuple[int, ...]) -> None:
        super().__init__()
        self.encoder = encoder
        self.layers = layers

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        top = max(self.layers)
        hidden = self.encoder.encode(batch, num_layers=top if top < self.encoder.num_layers else None).hidden_states
        return tuple(hidden[i] for i in self.layers)


def check_batches(model: Encoder) -> list[dict[str, torch.Tensor]]:
    """Batches unlike the export example (2 x 8): padded rows and an unpadded one."""
    from ctxrep.runtime import export

    return export.check_batches(model)


def compare(
    run: Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]],
    reference: HiddenStates,
    batches: Sequence[Mapping[str, torch.Tensor]],
) -> tuple[float, float]:
    """(largest |graph - torch| relative to max(1, largest |torch|) over every output, mean cosine of the top layer's
    vectors) at real tokens, over `batches`."""
    worst, cosines = 0.0, []
    for batch in batches:
        got = run({k: v.numpy() for k, v in batch.items()})
        with torch.inference_mode():
            want = [w.float().numpy() for w in reference(**batch)]
        real = batch["attention_mask"].bool().numpy()
        if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
            return float("inf"), 0.0
        for g, w in zip(got, want):
            scale = max(1.0, float(np.abs(w[real]).max()))
            worst = max(worst, float(np.abs(g[real] - w[real]).max()) / scale)
        g, w = got[-1][real], want[-1][real]  # (tokens, hidden)
        cosines.append((g * w).sum(-1) / (np.linalg.norm(g, axis=-1) * np.linalg.norm(w, axis=-1) + 1e-12))
    return worst, float(np.concatenate(cosines).mean())


def record_check(folder: Path, name: str, result: dict) -> None:
    """Add `name`'s check to folder/check.json (written whole under a temporary name, then renamed)."""
    path = folder / "check.json"
    checks = json.loads(path.read_text()) if path.is_file() else {}
    checks[name] = result
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
        json.dump(checks, f, indent=2)
    os.replace(f.name, path)


def float_copy(model: Encoder) -> Encoder:
    """`model` as float32 on the CPU, in eval mode (the model itself when it already is)."""
    if all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters()):
        return model.eval()
    return copy.deepcopy(model).float().cpu().eval()


def fp32_onnx(model: Encoder, layers: tuple[int, ...]) -> Path:
    """KEY/fp32.onnx for `model`'s `layers`, exported and checked on first use."""
    folder = graphs_dir() / model_key(model, layers)
    path = folder / "fp32.onnx"
    from ctxrep.runtime.export import graph_complete

    if not graph_complete(path):
        folder.mkdir(parents=True, exist_ok=True)
        record_check(folder, path.name, export_checked(model, layers, path))
    return path


def export_checked(model: Encoder, layers: tuple[int, ...], path: Path) -> dict:
    """Export a float32 copy of `model` to `path` (the first of ctxrep.runtime.export's exporters whose graph matches the
    torch forward within FP32_TOLERANCE) and return what the check measured; GraphError when none matches."""
    if model.word_level:
        raise GraphError(
            f"{model.family} runs on backend='torch' only: its LSTMs step through the sentence in a Python loop, "
            "which an exported graph would fix to one length"
        )
    from ctxrep.runtime.export import EXPORTERS, example_batch, first_line, install, run_exporter

    encoder = float_copy(model)
    wrapper = HiddenStates(encoder, layers).eval()
    example = example_batch(encoder, [min(8, encoder.max_tokens), min(5, encoder.max_tokens - 1)], seed=0)
    tried = []
    for exporter in EXPORTERS:
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            candidate = Path(tmp) / path.name
            try:
                run_exporter(wrapper, example, candidate, 17, exporter, tuple(output_names(layers)))
                session = ort_session(candidate, 1)
                diff, cosine = compare(functools.partial(ort_run, session), wrapper, check_batches(encoder))
            except Exception as e:  # exporters and ONNX Runtime raise many types; the next exporter may work
                tried.append(f"{exporter}: {type(e).__name__}: {first_line(e)}")
                continue
            if not diff <= FP32_TOLERANCE:
                tried.append(f"{exporter}: relative difference {diff:.3g} > {FP32_TOLERANCE:g}")
                continue
            install(candidate, path)
        return {"exporter": exporter, "max_relative_diff": diff, "cosine": cosine}
    raise GraphError(f"{model.family}: no ONNX export matched the torch forward ({'; '.join(tried)})")


def ort_session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: ORT warns about unused initializers of the exported graphs
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_run(session, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feed.items() if k in names})


def ort_int8_onnx(model: Encoder, layers: tuple[int, ...], calibration: Sequence[Mapping[str, torch.Tensor]]) -> Path:
    """KEY/ort-int8.onnx: ONNX Runtime's dynamic quantization of the matrix products (int8 weights per output
    channel, uint8 activations quantized per call; the embedding tables stay float32) of a SmoothQuant-smoothed
    export (`fast.smooth_linears` calibrated on `calibration`): the activations' outlier channels move into the
    weights first (MiniLM, 300 SST sentences: word vectors at mean cosine 0.994 to float32 instead of 0.989)."""
    from ctxrep.runtime import fast

    folder = graphs_dir() / model_key(model, layers)
    from ctxrep.runtime.export import data_file, graph_complete, install

    path = folder / "ort-int8.onnx"
    if graph_complete(path):
        return path
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        smoothed = Path(tmp) / "smoothed.onnx"
        export_checked(fast.smooth_linears(float_copy(model), calibration), layers, smoothed)
        candidate = Path(tmp) / path.name
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic advises its pre-processing on the root logger
        try:
            quantize_dynamic(
                str(smoothed),
                str(candidate),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                use_external_data_format=data_file(smoothed).exists(),  # then writes data_file(candidate)
            )
        finally:
            logging.getLogger().setLevel(quiet)
        encoder = float_copy(model)
        session = ort_session(candidate, 1)
        diff, cosine = compare(
            lambda feed: ort_run(session, feed), HiddenStates(encoder, layers), check_batches(encoder)
        )
        check_quantized(model, "ONNX Runtime int8", cosine)
        install(candidate, path)
    record_check(path.parent, path.name, {"max_relative_diff": diff, "cosine": cosine})
    return path


def check_quantized(model: Encoder, what: str, cosine: float) -> None:
    if not cosine >= QUANTIZED_MIN_COSINE:
        raise GraphError(
            f"{model.family}: the {what} graph's vectors have a mean cosine of {cosine:.3f} to the torch forward "
            f"(< {QUANTIZED_MIN_COSINE}): use precision='fp32' or backend='torch' for this model"
        )
