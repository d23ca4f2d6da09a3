"""Runtimes (ctxrep.runtime): every backend x precision against the torch float32 forward, the graph cache, and
the choices that follow the hardware's description (never a timing). Devices: the CPU, and CUDA where present."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
import torch

from ctxrep import Featurizer
from ctxrep.runtime import graphs, hardware

WORDS = [
    ["The", "bank", "raised", "its", "rates", "."],
    ["We", "sat", "on", "the", "river", "bank", "all", "day"],
    ["A", "short", "one"],
    ["Unbelievably", "tedious", ",", "overlong", "and", "self-indulgent", "."],
]
# (backend, precision) -> the bar its vectors meet against float32 on a tiny random model: a max |difference| for
# float32 (the same function), a mean word-vector cosine for the others
COMBINATIONS = {
    ("torch", "fp32"): ("max_abs", 1e-4),
    ("torch", "bf16"): ("cosine", 0.99),
    ("torch", "fp16"): ("cosine", 0.999),
    ("torch", "int8"): ("cosine", 0.97),
    ("onnxruntime", "fp32"): ("max_abs", 1e-4),
    ("onnxruntime", "int8"): ("cosine", 0.97),
    ("openvino", "fp32"): ("max_abs", 1e-4),
    ("openvino", "bf16"): ("cosine", 0.99),
    ("openvino", "fp16"): ("cosine", 0.99),
    ("openvino", "int8"): ("cosine", 0.97),
}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True, scope="module")
def _graph_cache(tmp_path_factory):
    """Exported graphs go to a fresh cache for this module, shared by its tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXREP_CACHE", str(tmp_path_factory.mktemp("ctxrep-cache")))
        yield


def word_cosines(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    x = np.concatenate([v.reshape(len(v), -1, v.shape[-1]) for v in a]).reshape(-1, a[0].shape[-1])
    y = np.concatenate([v.reshape(len(v), -1, v.shape[-1]) for v in b]).reshape(-1, b[0].shape[-1])
    return (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))


def check(ours: list[np.ndarray], reference: list[np.ndarray], bar: tuple[str, float]) -> None:
    assert [a.shape for a in ours] == [a.shape for a in reference]
    assert all(a.dtype == np.float32 for a in ours)
    kind, value = bar
    if kind == "max_abs":
        assert max(float(np.abs(a - b).max()) for a, b in zip(ours, reference)) <= value
    else:
        assert word_cosines(ours, reference).mean() >= value


@pytest.mark.parametrize("backend, precision", list(COMBINATIONS), ids=[f"{b}-{p}" for b, p in COMBINATIONS])
def test_every_backend_and_precision_against_the_float32_forward(backend, precision, tiny_models):
    folder = str(tiny_models["bert"])
    layers = [0, 1, -1]  # the embedding output, a middle layer and the top: all outputs of the graphs are checked
    reference = Featurizer(folder, layers=layers, compile=False).embed_words(WORDS)
    fz = Featurizer(folder, layers=layers, compile=False, backend=backend, precision=precision)
    assert (fz.backend, fz.precision) == (backend, precision)
    check(fz.embed_words(WORDS), reference, COMBINATIONS[backend, precision])
    # ctxrep's own work is the backend-independent part: sentence vectors, mixes, pairs and windows go through it
    sentences = fz.with_layers("mix").embed_sentences(WORDS)
    expected = Featurizer(folder, layers="mix", compile=False).embed_sentences(WORDS)
    assert sentences.shape == expected.shape
    assert word_cosines([sentences], [expected]).mean() >= min(COMBINATIONS[backend, precision][1], 0.97)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime", "openvino"])
def test_float32_is_identical_run_to_run_and_across_featurizers(backend, tiny_models):
    folder = str(tiny_models["roberta"])
    first = Featurizer(folder, layers="all", compile=False, backend=backend).embed_words(WORDS)
    again = Featurizer(folder, layers="all", compile=False, backend=backend).embed_words(WORDS)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_long_texts_are_windowed_the_same_on_every_backend(tiny_models):
    folder = str(tiny_models["bert"])
    long_text = [" ".join(WORDS[i % 4][j % 3] for j in range(40)) for i in range(2)]  # longer than the window
    kwargs = dict(layers=-1, max_length=16, stride=6, compile=False)
    reference = Featurizer(folder, **kwargs).embed_words(long_text)
    for backend in ("onnxruntime", "openvino"):
        check(Featurizer(folder, backend=backend, **kwargs).embed_words(long_text), reference, ("max_abs", 1e-4))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_openvino_streams_overlap_batches_without_changing_a_vector(precision, tiny_models, monkeypatch):
    """A call of two default batches or more runs OpenVINO's streams (several batches in flight, pooled oldest first
    while later ones run); a small one runs one batch at a time. Both give the same vectors."""
    from ctxrep.runtime import openvino_backend

    folder = str(tiny_models["bert"])
    texts = [[WORDS[i % 4][j % 3] + str(i % 7) for j in range(5 + i % 9)] for i in range(150)]
    fz = Featurizer(folder, layers=[1, -1], compile=False, backend="openvino", precision=precision, batch_tokens=64)
    run = fz.runtime
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert run.in_flight(openvino_backend.THROUGHPUT_MIN_TOKENS - 1) == 1
        assert run.streams(openvino_backend.THROUGHPUT_MIN_TOKENS) == 2
        assert run.in_flight(openvino_backend.THROUGHPUT_MIN_TOKENS) == 3
        monkeypatch.setattr(openvino_backend, "THROUGHPUT_MIN_TOKENS", 10**9)  # every call: one batch at a time
        one_at_a_time = fz.embed_words(texts)
        assert {streams for _, streams in run._compiled} == {1}
        monkeypatch.setattr(openvino_backend, "THROUGHPUT_MIN_TOKENS", 1)  # every call: streams
        overlapped = fz.embed_words(texts)
        assert {streams for _, streams in run._compiled} == {1, 2}
    finally:
        torch.set_num_threads(torch_threads)
    for a, b in zip(overlapped, one_at_a_time, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_graphs_are_exported_once_checked_and_reused(tiny_models, monkeypatch):
    folder = str(tiny_models["electra"])
    Featurizer(folder, backend="onnxruntime", compile=False).embed_words(WORDS[:1])
    model = Featurizer(folder).model
    path = graphs.fp32_onnx(model, (model.num_layers,))
    checks = (path.parent / "check.json").read_text()
    assert '"fp32.onnx"' in checks and '"max_relative_diff"' in checks
    exported = []
    monkeypatch.setattr("ctxrep.runtime.export.run_exporter", lambda *a, **k: exported.append(a))
    again = Featurizer(folder, backend="onnxruntime", compile=False)  # a new process would find the same file
    again.embed_words(WORDS[:1])
    assert exported == []
    other = Featurizer(folder, backend="onnxruntime", compile=False, layers=1)  # another depth: its own graph
    with pytest.raises(graphs.GraphError):  # the patched exporter writes nothing: no graph passes the check
        other.embed_words(WORDS[:1])


def test_a_graph_that_differs_from_the_torch_forward_is_refused_in_one_line(tiny_models, monkeypatch):
    monkeypatch.setattr(graphs, "FP32_TOLERANCE", -1.0)  # nothing can pass
    fz = Featurizer(str(tiny_models["bert"]), backend="onnxruntime", layers=1, compile=False)
    with pytest.raises(graphs.GraphError, match="bert: no ONNX export matched the torch forward") as e:
        fz.embed_words(WORDS[:1])
    assert "\n" not in str(e.value)


def test_auto_precision_follows_the_hardware_description(tiny_models, monkeypatch):
    folder = str(tiny_models["bert"])
    for flags, expected in (({"avx512_bf16", "avx512f"}, "bf16"), ({"amx_bf16"}, "bf16"), ({"avx2"}, "fp32")):
        monkeypatch.setattr(hardware, "cpu_flags", lambda f=frozenset(flags): f)
        assert Featurizer(folder, precision="auto").precision == expected
        assert Featurizer(folder, precision="auto", backend="openvino").precision == expected
        assert Featurizer(folder, precision="auto", backend="onnxruntime").precision == "fp32"  # ORT: no bf16 path
    assert "flags:" in hardware.cpu_description()


def test_elmo_stays_on_torch_and_says_so_in_one_line(elmo_dir):
    for backend in ("onnxruntime", "openvino"):
        with pytest.raises(ValueError, match="ELMo runs on backend='torch' only|runs on backend='torch' only") as e:
            Featurizer(f"elmo:{elmo_dir}", backend=backend)
        assert "\n" not in str(e.value)
    out = Featurizer(f"elmo:{elmo_dir}", precision="bf16").embed_words(WORDS[:2])  # a cast copy of the biLM runs
    assert all(a.dtype == np.float32 for a in out)


# ---- devices --------------------------------------------------------------------------------------------------


def test_device_and_precision_flow_through_to_the_runtime(tiny_models):
    """The model goes to `device`, loaded in the precision's dtype (the runtime runs it, no cast copy), and batches
    follow ("meta" stands in for a GPU: nothing may hard-code the CPU or float32)."""
    fz = Featurizer(str(tiny_models["bert"]), device="meta", precision="bf16", compile=False)
    assert next(fz.model.parameters()).device.type == "meta"
    run = fz.runtime
    assert run.device.type == "meta"
    params = list(run.encoder.parameters())
    assert {p.device.type for p in params} == {"meta"} and {p.dtype for p in params} == {torch.bfloat16}
    assert run.encoder is fz.model  # a named model loads in bf16 (tests/test_dtype.py): no second copy
    seen = []

    class Stop(Exception):
        pass

    def record(_module, args, kwargs):
        seen.append((args[0].device.type, kwargs["attention_mask"].device.type))
        raise Stop

    run.encoder.register_forward_pre_hook(record, with_kwargs=True)
    with pytest.raises(Stop):
        fz.embed_words(WORDS[:1])
    assert seen == [("meta", "meta")]
    with pytest.raises(ValueError, match="precision='int8' runs on the CPU only .*meta.*use 'bf16' on a GPU"):
        Featurizer(str(tiny_models["bert"]), device="meta", precision="int8")
    with pytest.raises(ValueError, match="backend='openvino' runs on the CPU; the model is on meta"):
        Featurizer(str(tiny_models["bert"]), device="meta", backend="openvino")


def test_the_token_budget_is_sized_for_the_device(tiny_models, monkeypatch):
    assert Featurizer(str(tiny_models["bert"])).batch_tokens == 16384  # a CPU, a 32-wide model: the most
    cpu = torch.device("cpu")
    assert [hardware.default_batch_tokens(cpu, h, 6) for h in (64, 128, 256, 512)] == [16384, 8192, 4096, 2048]
    assert hardware.default_batch_tokens(cpu, 384, 6) == 2048 and hardware.default_batch_tokens(cpu, 768, 12) == 1024
    assert Featurizer(str(tiny_models["bert"]), batch_tokens=512).batch_tokens == 512  # given: kept
    memory = types.SimpleNamespace(total_memory=80 * 2**30)  # an 80 GiB GPU
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: memory)
    assert hardware.default_batch_tokens(torch.device("cuda"), 384, 6) == 65536  # MiniLM
    assert hardware.default_batch_tokens(torch.device("cuda"), 1024, 24) == 8192  # BERT-large
    assert hardware.default_batch_tokens(torch.device("cuda"), 32, 2) == 131072  # capped


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "auto"])
def test_torch_precisions_on_each_device(device, precision, tiny_models):
    """On CUDA (where present) as on the CPU: float32 within 1e-4 of the CPU's float32, the half types close."""
    folder = str(tiny_models["bert"])
    reference = Featurizer(folder, layers="all", compile=False).embed_words(WORDS)
    fz = Featurizer(folder, layers="all", compile=False, device=device, precision=precision)
    bar = ("max_abs", 1e-4) if fz.precision == "fp32" else ("cosine", 0.99)
    check(fz.embed_words(WORDS), reference, bar)


# ---- the command line -----------------------------------------------------------------------------------------


def test_the_cli_offers_the_runtimes_values():
    from ctxrep import runtime
    from ctxrep.cli import runtime_options

    assert runtime_options.PRECISIONS == runtime.PRECISIONS and runtime_options.BACKENDS == runtime.BACKENDS


def test_embed_and_neighbors_pass_device_precision_and_backend_through(tiny_models, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import ctxrep.featurize
    from ctxrep.cli import main
    from ctxrep.vectors.store import load_vectors

    folder = str(tiny_models["bert"])
    text = tmp_path / "in.txt"
    text.write_text("\n".join(" ".join(w) for w in WORDS) + "\n")
    runner = CliRunner()
    for name, extra in (("fp32", []), ("ov", ["--precision", "bf16", "--backend", "openvino", "--device", "cpu"])):
        args = ["embed", "--model", folder, "--input", str(text), "--out", str(tmp_path / name), *extra]
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
    reference, ours = load_vectors(tmp_path / "fp32"), load_vectors(tmp_path / "ov")
    assert ours.spec.precision == "bf16" and ours.spec.backend == "openvino"
    assert word_cosines([np.asarray(ours.array)], [np.asarray(reference.array)]).mean() >= 0.99
    seen = []
    real = ctxrep.featurize.Featurizer

    class Recording(real):
        def __init__(self, *args, **kwargs):
            seen.append({k: kwargs.get(k) for k in ("device", "precision", "backend")})
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ctxrep.featurize, "Featurizer", Recording)
    args = ["neighbors", "index", "--model", folder, "--corpus", str(text), "--out", str(tmp_path / "index")]
    result = runner.invoke(main, [*args, "--precision", "fp16", "--backend", "torch", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert seen == [{"device": "cpu", "precision": "fp16", "backend": None}]  # defaults are not passed
    result = runner.invoke(main, [*args, "--precision", "int4"])
    assert result.exit_code != 0 and "int4" in result.output


def test_mt_translate_places_and_casts_the_model(monkeypatch):
    from ctxrep.cli.mt import _placed

    assert next(_placed(torch.nn.Linear(2, 2), None, "bf16").parameters()).dtype == torch.bfloat16
    assert next(_placed(torch.nn.Linear(2, 2), "meta", "fp32").parameters()).device.type == "meta"
    for flags, dtype in (({"avx512_bf16"}, torch.bfloat16), (set(), torch.float32)):
        monkeypatch.setattr(hardware, "cpu_flags", lambda f=frozenset(flags): f)
        assert next(_placed(torch.nn.Linear(2, 2), "cpu", "auto").parameters()).dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_estimator_predict_on_each_device(device, tiny_models):
    from ctxrep.tasks import SequenceClassifier

    X, y = ["good great fine", "bad awful poor"] * 4, ["pos", "neg"] * 4
    clf = SequenceClassifier(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, lr=1e-3, random_state=0)
    expected = clf.fit(X, y).predict_proba(X)
    np.testing.assert_allclose(clf.predict_proba(X, device=device), expected, atol=1e-4)
    np.testing.assert_allclose(clf.predict_proba(X, device=device, precision="bf16"), expected, atol=0.05)
    assert {p.device.type for p in clf.model_.parameters()} == {"cpu"}  # back where the estimator keeps it


@pytest.mark.parametrize("user_value", [None, "64"])
def test_prepacking_bounds_onednns_kernel_cache_unless_the_user_did(tiny_models, monkeypatch, user_value):
    """A pre-packed model asks oneDNN to keep 16 shapes' kernels, not 1,024 (a million-sentence `ctxrep embed` held
    1,120 MiB with the default, 667 MiB with 16: benchmarks/embed_memory.py); a capacity the user set stays."""
    from ctxrep.models.loading import load_encoder
    from ctxrep.runtime.torch_backend import ONEDNN_CACHE_CAPACITY, prepack_for_inference

    name, default = ONEDNN_CACHE_CAPACITY
    if user_value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, user_value)
    model = load_encoder(str(tiny_models["bert"])).model.eval()
    packed = prepack_for_inference(model)
    assert packed is not model  # the BERT family is pre-packed in float32 on a CPU (torch built with oneDNN)
    assert os.environ[name] == (user_value or default)
