"""OpenVINO (CPU): ctxrep's exported graph as OpenVINO IR, run at float32, bfloat16 or float16 (the plugin's
inference-precision hint), or NNCF's post-training int8 quantization of it. A large call runs OpenVINO's streams:
several batches at once through asynchronous infer requests, while the host collates and pools."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ctxrep.models.encoder import Encoder
from ctxrep.runtime import fast, graphs
from ctxrep.runtime.hardware import cpu_has_bf16

HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
THROUGHPUT_MIN_TOKENS = 4096  # a call of two default CPU batches (hardware.default_batch_tokens) or more runs streams
_SS_DISABLE = 2  # sigaltstack: the thread has no alternate signal stack


def ir_file(model: Encoder, layers: tuple[int, ...]) -> Path:
    """KEY/openvino.xml (+ .bin): fp32.onnx read by OpenVINO and saved as IR, checked against the torch forward."""
    fp32 = graphs.fp32_onnx(model, layers)
    path = fp32.parent / "openvino.xml"
    if path.is_file():
        return path
    import openvino as ov

    core = ov.Core()
    with tempfile.TemporaryDirectory(dir=fp32.parent) as tmp:
        candidate = Path(tmp) / path.name
        ov.save_model(core.read_model(str(fp32)), str(candidate), compress_to_fp16=False)
        compiled = compile_ir(core, candidate, "f32", 1)
        encoder = graphs.float_copy(model)
        reference = graphs.HiddenStates(encoder, layers)
        diff, cosine = graphs.compare(
            lambda feed: run_compiled(compiled, feed), reference, graphs.check_batches(encoder)
        )
        if not diff <= graphs.FP32_TOLERANCE:
            raise graphs.GraphError(
                f"{model.family}: OpenVINO's float32 graph differs from the torch forward by {diff:.3g} (relative) > "
                f"{graphs.FP32_TOLERANCE:g}: use backend='onnxruntime' or 'torch' for this model"
            )
        os.replace(candidate.with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(candidate, path)
    graphs.record_check(path.parent, path.name, {"max_relative_diff": diff, "cosine": cosine})
    return path


def int8_ir_file(model: Encoder, tokenizer, layers: tuple[int, ...], max_length: int) -> Path:
    """KEY/openvino-int8.xml: NNCF post-training quantization (model_type TRANSFORMER: SmoothQuant, int8 matrix
    products, the rest as the plugin runs it) calibrated on `fast.CALIBRATION_TEXTS`, one sentence per sample."""
    fp32 = ir_file(model, layers)
    path = fp32.parent / "openvino-int8.xml"
    if path.is_file():
        return path
    try:
        import nncf
    except ImportError as e:
        raise ValueError(
            f"backend='openvino' with precision='int8' needs nncf ({e}): pip install 'ctxrep[openvino]'"
        ) from e
    import openvino as ov

    core = ov.Core()
    names = input_names(core.read_model(str(fp32)))
    samples = [
        {k: v.numpy() for k, v in b.items() if k in names}
        for b in fast.calibration_batches(tokenizer, max_length, batch_size=1)
    ]
    with keeping_signal_stack():  # NNCF compiles models of its own (engines, cached functions)
        quantized = nncf.quantize(
            core.read_model(str(fp32)),
            nncf.Dataset(samples),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(samples),
        )
    with tempfile.TemporaryDirectory(dir=fp32.parent) as tmp:
        candidate = Path(tmp) / path.name
        ov.save_model(quantized, str(candidate), compress_to_fp16=False)
        compiled = compile_ir(core, candidate, int8_hint(), 1)
        encoder = graphs.float_copy(model)
        reference = graphs.HiddenStates(encoder, layers)
        diff, cosine = graphs.compare(
            lambda feed: run_compiled(compiled, feed), reference, graphs.check_batches(encoder)
        )
        graphs.check_quantized(model, "OpenVINO int8", cosine)
        os.replace(candidate.with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(candidate, path)
    graphs.record_check(path.parent, path.name, {"max_relative_diff": diff, "cosine": cosine})
    return path


def int8_hint() -> str:
    """The precision of the operations NNCF left unquantized: bfloat16 where the CPU has it natively, else float32."""
    return "bf16" if cpu_has_bf16() else "f32"


def compile_ir(core, path: Path, hint: str, threads: int, streams: int = 1):
    """One stream (PERFORMANCE_HINT LATENCY: every thread on one batch) or `streams` of threads / streams each."""
    config = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": max(1, threads)}
    if streams == 1:
        config["PERFORMANCE_HINT"] = "LATENCY"
    else:
        config.update(PERFORMANCE_HINT="THROUGHPUT", NUM_STREAMS=streams)
    with keeping_signal_stack():
        return core.compile_model(str(path), "CPU", config)


class _SignalStack(ctypes.Structure):  # Linux's stack_t
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


@contextlib.contextmanager
def keeping_signal_stack() -> Iterator[None]:
    """The calling thread keeps the alternate signal stack it had, whatever OpenVINO does inside (Linux).

    OpenVINO's CPU plugin (one per ov.Core, made on its first use of the CPU) installs a signal stack of its own on the
    thread that makes it (sigaltstack; room for AMX's larger signal frames) and, when it ends, unmaps it after
    putting back the one it found, if its own is still the thread's. Two plugins that end in the order they were
    made (two Featurizers dropped first-made first) leave the thread on the first one's unmapped stack; the next
    signal with a Python handler (those run on the signal stack: Ctrl-C's SIGINT) then kills the process with
    SIGSEGV and no Python frame. Put back here, no plugin finds its stack current when it ends: it only unmaps it."""
    if sys.platform != "linux":
        yield
        return
    sigaltstack = ctypes.CDLL(None, use_errno=True).sigaltstack
    before, now = _SignalStack(), _SignalStack()
    sigaltstack(None, ctypes.byref(before))
    try:
        yield
    finally:
        sigaltstack(None, ctypes.byref(now))
        if (now.ss_sp, now.ss_size, now.ss_flags) != (before.ss_sp, before.ss_size, before.ss_flags):
            before.ss_flags &= _SS_DISABLE  # SS_ONSTACK is a state the kernel reports, not one to set
            # refused only where the old stack is too small for the signal frames the CPU now needs (AMX in use):
            # signals could not be delivered on it either, and OpenVINO's stays
            sigaltstack(ctypes.byref(before), None)


def input_names(model) -> list[str]:
    """The graph's input names in order, as ctxrep names them (an input may carry other names beside its own, e.g.
    a dynamo-exported XLNet's 'pad_2'; get_any_name may pick one of those)."""
    known = ("input_ids", "attention_mask", "token_type_ids")
    return [next((n for n in known if n in i.get_names()), i.get_any_name()) for i in model.inputs]


def run_compiled(compiled, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    names = input_names(compiled)
    result = compiled({k: feed[k] for k in names})
    return [np.asarray(result[o]) for o in compiled.outputs]


class OpenVinoRuntime:
    """Batch in, hidden states out, through an OpenVINO compiled model over the cached IR (exported on first use)."""

    backend = "openvino"
    precisions = ("fp32", "bf16", "fp16", "int8")

    @staticmethod
    def require() -> None:
        """A one-line error when OpenVINO is not installed."""
        try:
            import openvino  # noqa: F401
        except ImportError as e:
            raise ValueError(f"backend='openvino' needs openvino and nncf ({e}): pip install 'ctxrep[openvino]'") from e

    def __init__(self, model: Encoder, tokenizer, precision: str, compile: bool | str, max_length: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.precision = precision
        self.max_length = max_length
        self.device = torch.device("cpu")
        # (layers, streams) -> (its infer requests, their input names, how many batches have started on them)
        self._compiled: dict[tuple[tuple[int, ...], int], list] = {}

    def streams(self, call_tokens: int) -> int:
        """OpenVINO streams for a call of `call_tokens`: one (all threads on each batch, the least latency) for a
        call of less than two default batches, else one per thread up to four (THROUGHPUT: several batches run at
        once, each on fewer threads, and the host collates and pools meanwhile). A fixed rule: the results are the
        same either way (tests/test_runtime.py)."""
        return 1 if call_tokens < THROUGHPUT_MIN_TOKENS else max(1, min(torch.get_num_threads(), 4))

    def in_flight(self, call_tokens: int) -> int:
        """One more batch than streams: while the host pools the oldest, every stream has a batch."""
        streams = self.streams(call_tokens)
        return 1 if streams == 1 else streams + 1

    def _requests(self, layers: tuple[int, ...], streams: int) -> list:
        key = (layers, streams)
        if key not in self._compiled:
            import openvino as ov

            if self.precision == "int8":
                path, hint = int8_ir_file(self.model, self.tokenizer, layers, self.max_length), int8_hint()
            else:
                path, hint = ir_file(self.model, layers), HINTS[self.precision]
            compiled = compile_ir(ov.Core(), path, hint, torch.get_num_threads(), streams)
            requests = [compiled.create_infer_request() for _ in range(1 if streams == 1 else streams + 1)]
            self._compiled[key] = [requests, input_names(compiled), 0]
        return self._compiled[key]

    def start(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0, padded: bool = False
    ) -> Callable[[], torch.Tensor]:
        """Start `batch` on the next infer request (round robin: the Featurizer has pooled that request's previous
        batch by then, see in_flight); wait() returns (len(layers), batch, seq, hidden) float32, copied out of the
        request's buffers."""
        wanted = tuple(sorted(set(layers)))  # the graph's outputs, in this order
        entry = self._requests(wanted, self.streams(call_tokens))
        requests, names, started = entry
        request = requests[started % len(requests)]
        entry[2] = started + 1
        request.start_async({k: batch[k].numpy() for k in names})

        def wait() -> torch.Tensor:
            request.wait()
            out = [request.get_output_tensor(wanted.index(i)).data for i in layers]  # views of the request's buffers
            return torch.from_numpy(np.stack(out).astype(np.float32, copy=False))  # one copy, out of those buffers

        return wait

    def hidden_states(
        self, batch: Mapping[str, torch.Tensor], layers: Sequence[int], call_tokens: int = 0
    ) -> torch.Tensor:
        """(len(layers), batch, seq, hidden) float32 on the CPU."""
        return self.start(batch, layers, call_tokens)()
