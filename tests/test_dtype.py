"""The dtype a model's weights load in: the Featurizer's precision decides it for every family (no cast copy beside
the loaded weights), the FeaturizerSpec records the precision that ran, and every training path loads float32
master weights whatever the checkpoint's dtype. A tiny Qwen3 saved in bfloat16 (tests/_decoders.py) stands for a
bf16 LLM checkpoint; the CPU's bfloat16 support is set by the tests, so they answer alike on every machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _decoders import TEXT, hf_model, qwen_tokenizer

import ctxrep
from ctxrep.featurize import load_dtype, precision_of
from ctxrep.featurize.spec import FeaturizerSpec
from ctxrep.models import shards
from ctxrep.models.loading import load_encoder
from ctxrep.runtime import hardware

WORDS = [t.split() for t in TEXT[:3]]


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory):
    """A tiny random Qwen3 folder whose safetensors hold bfloat16 weights."""
    path = tmp_path_factory.mktemp("qwen3_bf16")
    vocab = qwen_tokenizer(path)
    hf_model("qwen3", vocab).to(torch.bfloat16).save_pretrained(path)
    assert shards.WeightIndex.of(path).stored_dtype() == torch.bfloat16
    return path


def cpu_bf16(monkeypatch, native: bool) -> None:
    """Both of ctxrep's readings of the CPU (the loader's `auto` dtype and precision='auto') answer `native`."""
    monkeypatch.setattr(shards, "cpu_has_bf16", lambda: native)
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: native)


def dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


@pytest.mark.parametrize(
    "native, precision, weights, ran",
    [
        (True, "fp32", torch.float32, "fp32"),  # float32 on request, where bf16 would be the default
        (True, "bf16", torch.bfloat16, "bf16"),
        (False, "bf16", torch.bfloat16, "bf16"),  # asked for: bf16 even without native support
        (True, None, torch.bfloat16, "bf16"),  # the default: a bf16 checkpoint stays bf16 where the CPU has it
        (False, None, torch.float32, "fp32"),
        (True, "auto", torch.bfloat16, "bf16"),
        (False, "auto", torch.float32, "fp32"),
        (True, "int8", torch.float32, "int8"),  # quantized from float32 weights
        (True, "fp16", torch.float16, "fp16"),
    ],
)
def test_the_featurizer_precision_decides_the_load_dtype(bf16_folder, monkeypatch, native, precision, weights, ran):
    cpu_bf16(monkeypatch, native)
    fz = ctxrep.Featurizer(bf16_folder, precision=precision)
    assert dtypes(fz.model) == {weights}
    assert fz.precision == ran
    assert FeaturizerSpec.of(fz).precision == ran
    if ran in ("fp32", "bf16", "fp16"):
        assert fz.runtime.encoder is fz.model or ran == "fp32"  # no cast copy beside the loaded weights
        assert dtypes(fz.runtime.encoder) == {weights}


def test_fp32_on_a_bf16_checkpoint_gives_the_float32_models_vectors(bf16_folder, monkeypatch):
    cpu_bf16(monkeypatch, True)
    fp32 = ctxrep.Featurizer(bf16_folder, precision="fp32", layers="all").embed_words(WORDS)
    ref = ctxrep.Featurizer(load_encoder(bf16_folder, dtype="fp32"), layers="all").embed_words(WORDS)
    half = ctxrep.Featurizer(bf16_folder, layers="all").embed_words(WORDS)
    for a, b, c in zip(fp32, ref, half):
        np.testing.assert_array_equal(a, b)
        assert np.abs(a - c).max() > 1e-4  # the default ran in bfloat16: its vectors differ from float32's


def test_a_loaded_bf16_model_records_the_precision_that_ran(bf16_folder, monkeypatch):
    """A LoadedEncoder runs as it is at "fp32" / None: the spec names its dtype, and rebuilding from the spec loads
    the weights in that dtype again."""
    cpu_bf16(monkeypatch, False)
    fz = ctxrep.Featurizer(load_encoder(bf16_folder, dtype="bf16"), precision="fp32")
    assert fz.precision == "bf16" and fz.runtime.encoder is fz.model
    spec = FeaturizerSpec.of(fz)
    assert spec.precision == "bf16"
    again = ctxrep.Featurizer(**spec.featurizer_kwargs())
    assert dtypes(again.model) == {torch.bfloat16} and FeaturizerSpec.of(again) == spec


def test_a_bf16_precision_on_a_float32_family_loads_bf16_without_a_copy(tmp_path):
    """Every family: a tiny BERT saved in float32 loads in bfloat16 at precision="bf16", the runtime runs it."""
    transformers = pytest.importorskip("transformers")
    from _decoders import qwen_tokenizer as tokenizer_into

    vocab = tokenizer_into(tmp_path)
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48
    )
    transformers.BertModel(config).save_pretrained(tmp_path)
    fz = ctxrep.Featurizer(tmp_path, precision="bf16")
    assert dtypes(fz.model) == {torch.bfloat16} and fz.runtime.encoder is fz.model
    assert ctxrep.Featurizer(tmp_path).precision == "fp32"


def test_exporting_backends_get_float32_weights(bf16_folder, monkeypatch):
    """ONNX Runtime and OpenVINO export their graphs from a float32 model: whatever the precision, the weights
    load in float32 (no bf16 copy to widen first); the runtime is not built here (no export)."""
    cpu_bf16(monkeypatch, True)
    for backend, precision in [("onnxruntime", None), ("onnxruntime", "auto"), ("openvino", "bf16")]:
        fz = ctxrep.Featurizer(bf16_folder, backend=backend, precision=precision)
        assert dtypes(fz.model) == {torch.float32}, backend
    assert load_dtype("openvino", "bf16") == "fp32" and load_dtype("torch", "int8") == "fp32"
    assert load_dtype("torch", None) == "auto" and load_dtype("torch", "bf16") == "bf16"


def test_precision_of_names_the_dtype_or_refuses():
    assert precision_of(torch.nn.Linear(2, 2).to(torch.bfloat16)) == "bf16"
    with pytest.raises(ValueError, match="float64") as e:
        precision_of(torch.nn.Linear(2, 2).double())
    assert "\n" not in str(e.value)


X_CLS = TEXT[:8]
Y_CLS = ["pos", "neg"] * 4


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_an_estimator_fit_on_a_bf16_checkpoint_trains_float32_weights(bf16_folder, monkeypatch, tmp_path, mode):
    from ctxrep.tasks import SequenceClassifier

    cpu_bf16(monkeypatch, True)  # where "auto" would keep the checkpoint in bfloat16
    clf = SequenceClassifier(
        model=str(bf16_folder), mode=mode, max_epochs=1, batch_size=4, lr=1e-3, random_state=0, progress=False
    )
    clf.fit(X_CLS, Y_CLS)
    assert dtypes(clf.model_) == {torch.float32}
    assert dtypes(clf.backbone_.model) == {torch.float32}
    clf.save(tmp_path / "clf")
    loaded = SequenceClassifier.load(tmp_path / "clf")
    assert dtypes(loaded.backbone_.model) == {torch.float32}
    np.testing.assert_allclose(loaded.predict_proba(X_CLS), clf.predict_proba(X_CLS), atol=1e-5)


def test_a_sentence_encoder_fit_on_a_bf16_checkpoint_trains_float32_weights(bf16_folder, monkeypatch, tmp_path):
    from ctxrep.tasks import SentenceEncoder

    cpu_bf16(monkeypatch, True)
    texts = list(X_CLS)
    enc = SentenceEncoder(model=str(bf16_folder), max_steps=1, batch_size=4, lr=1e-3, random_state=0, progress=False)
    enc.fit(list(zip(texts, texts[1:] + texts[:1])))
    assert dtypes(enc.backbone_.model) == {torch.float32}
    enc.save(tmp_path / "enc")
    assert dtypes(SentenceEncoder.load(tmp_path / "enc").backbone_.model) == {torch.float32}
