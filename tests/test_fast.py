"""The inference fast paths (ctxrep.runtime.fast) against the encoders' own forward, and the Featurizer's hooks to them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from test_matrix import albert_dir  # noqa: F401  (a fixture: the tiny ALBERT)

from ctxrep.featurize import Featurizer
from ctxrep.models.loading import load_encoder
from ctxrep.runtime import fast
from ctxrep.text.inputs import WindowPlan, collate

WORDS = [
    ["The", "bank", "raised", "its", "rates", "."],
    ["We", "sat", "on", "the", "river", "bank", "all", "day"],
    ["A", "short", "one"],
    ["Unbelievably", "tedious", ",", "overlong", "and", "self-indulgent", "."],
]
TRANSFORMERS = [
    ("bert", "tiny_models"),
    ("roberta", "tiny_models"),
    ("electra", "tiny_models"),
    ("gpt2", "gpt2_dir"),
    ("xlnet", "xlnet_dir"),
    ("albert", "albert_dir"),
]


def _folder(request, family: str, fixture: str) -> str:
    built = request.getfixturevalue(fixture)
    return str(built[family] if isinstance(built, dict) else built)


def _word_cosines(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    x, y = np.concatenate(a), np.concatenate(b)
    return (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))


# ---- compiled float32 ---------------------------------------------------------------------------------------


def test_compiled_encoder_matches_the_forward_on_padded_and_unpadded_batches(tiny_models):
    loaded = load_encoder(str(tiny_models["bert"]))
    model = loaded.model.eval()
    compiled = fast.compile_encoder(model)
    pieces = loaded.tokenizer.encode_words(WORDS)
    records = [w for i, p in enumerate(pieces) for w in WindowPlan(loaded.tokenizer, 64).single(i, p)]
    batches = [
        collate(records, loaded.tokenizer),
        collate(records[2:3], loaded.tokenizer),
        collate(records[:2], loaded.tokenizer),
    ]
    with torch.inference_mode():
        for batch in batches:  # new shapes reuse the dynamic-shape code
            for num_layers in (None, 1):
                ours = compiled.encode(batch, num_layers=num_layers).hidden_states
                reference = model.encode(batch, num_layers=num_layers).hidden_states
                assert len(ours) == len(reference)
                real = batch["attention_mask"].bool()  # compiled graphs run padded, the forward may unpad
                for a, b in zip(ours, reference):
                    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
    with torch.inference_mode():  # attention probabilities come from the encoder itself
        assert compiled.encode(batches[0], output_attentions=True).attentions is not None


def test_compile_auto_stays_eager_for_small_calls_and_compiles_for_large_ones(tiny_models, monkeypatch):
    eager = Featurizer(str(tiny_models["bert"]), layers="all", compile=False)
    auto = Featurizer(str(tiny_models["bert"]), layers="all")  # compile="auto" is the default
    assert auto.compile == "auto"
    small, large = WORDS[2:3], WORDS * 3
    tokens_small = sum(len(w) + 2 for w in small)
    flops = fast.flops_per_token(auto.model)
    monkeypatch.setattr(fast, "compile_min_flops", lambda device: (tokens_small + 1) * flops)
    np.testing.assert_allclose(auto.embed_words(small)[0], eager.embed_words(small)[0], atol=1e-6)
    assert auto.runtime._compiled is None  # too small to pay for compiling
    for ours, reference in zip(auto.embed_words(large), eager.embed_words(large)):
        np.testing.assert_allclose(ours, reference, atol=1e-4)
    assert isinstance(auto.runtime._compiled, fast.CompiledEncoder)
    auto.embed_words(small)  # once compiled, small calls use it too
    assert auto.runtime._encoder_for(1) is auto.runtime._compiled
    assert auto.with_layers(-1).runtime._encoder_for(1) is auto.runtime._compiled  # views share it


def test_a_failed_compile_falls_back_under_auto_and_is_one_line_under_true(tiny_models, monkeypatch):
    def no_compiler(*args, **kwargs):
        raise torch._dynamo.exc.TorchDynamoException("InvalidCxxCompiler: No working C++ compiler found\nmore")

    words = WORDS[:2]
    reference = Featurizer(str(tiny_models["bert"]), compile=False).embed_words(words)
    monkeypatch.setattr(fast, "compile_min_flops", lambda device: 1.0)
    auto = Featurizer(str(tiny_models["bert"]))
    auto.runtime._compiled = fast.compile_encoder(auto.model, fallback=True)
    monkeypatch.setattr(auto.runtime._compiled, "_compiled", no_compiler)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*No working C.. compiler found\\); running the"):
        out = auto.embed_words(words)
    for a, b in zip(out, reference):
        np.testing.assert_allclose(a, b, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second attempt, no second warning
        auto.embed_words(words)

    forced = fast.compile_encoder(auto.model)
    monkeypatch.setattr(forced, "_compiled", no_compiler)
    ids = torch.tensor([[101, 2023, 102]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with (
        torch.inference_mode(),
        pytest.raises(RuntimeError, match="pass compile=False, or install a C.. compiler") as e,
    ):
        forced.encode(batch)
    assert "\n" not in str(e.value)


def test_worth_compiling_is_a_rule_from_the_work_and_never_compiles_elmo(tiny_models, elmo_dir, monkeypatch):
    """compile="auto" compiles where tokens x FLOPs per token repay the compile cost on the fastest eager machine of
    the device's kind: never a user's one-off call of 17,088 SST sentences (427,882 tokens; issue 32 measured 1.17x
    slower with MiniLM, 4.3x with a 1-layer 32-wide encoder), a corpus-sized one; a bigger model sooner."""
    monkeypatch.setattr(fast, "cpu_vector_isa", lambda: "avx512")  # the rule from the work, on any CPU
    minilm, tiny = load_encoder("minilm").model, load_encoder(str(tiny_models["bert"])).model
    assert not fast.worth_compiling(427_882, minilm) and not fast.worth_compiling(427_882, tiny)
    assert not fast.worth_compiling(0, minilm)
    assert fast.worth_compiling(50_000_000, minilm) and not fast.worth_compiling(50_000_000, tiny)
    assert fast.flops_per_token(tiny) < fast.flops_per_token(minilm)
    need = fast.compile_min_flops("cpu") / fast.flops_per_token(minilm)  # tokens from which MiniLM compiles
    assert fast.worth_compiling(int(need) + 1, minilm) and not fast.worth_compiling(int(need) - 1, minilm)
    assert fast.compile_min_flops("cuda") > fast.compile_min_flops("cpu")  # a faster eager device: later
    elmo = load_encoder(f"elmo:{elmo_dir}").model
    assert not fast.worth_compiling(10**12, elmo)


def test_a_call_too_small_to_compile_never_asks_for_the_cpus_vector_code(tiny_models, monkeypatch):
    """Asking the CPU's vector code imports Inductor (about 3 s on this project's 2-core CPU): a call too small to
    repay compiling (every first request of a server, every one-query `ctxrep search`) decides without it."""

    def asked():
        raise AssertionError("cpu_vector_isa was asked for a call that cannot repay compiling")

    monkeypatch.setattr(fast, "cpu_vector_isa", asked)
    assert not fast.worth_compiling(10_000, load_encoder(str(tiny_models["bert"])).model)


def test_compile_follows_the_cpus_vector_code(tiny_models, monkeypatch):
    """AVX-512: frozen weights; AVX2: not frozen (torch 2.13 computes NaN there with dynamic shapes + freezing);
    no vector code: compile="auto" stays eager and compile=True is refused in one line."""
    tiny = load_encoder(str(tiny_models["bert"])).model
    for isa, frozen in [("avx512", True), ("avx2", False)]:
        monkeypatch.setattr(fast, "cpu_vector_isa", lambda isa=isa: isa)
        assert fast.inductor_options("cpu") == {"freezing": frozen} and fast.inductor_options("cuda")["freezing"]
    monkeypatch.setattr(fast, "cpu_vector_isa", lambda: "")
    assert not fast.worth_compiling(10**12, tiny)
    with pytest.raises(ValueError, match="neither AVX2 nor AVX-512.*pass compile=False") as e:
        fast.compile_encoder(tiny)
    assert "\n" not in str(e.value)


# ---- int8 ---------------------------------------------------------------------------------------------------


def test_int8_word_vectors_of_minilm_stay_within_cosine_0_99_of_float32():
    words = [
        s.split()
        for s in [
            "The new museum opened its doors to the public on Saturday after years of delays .",
            "I could n't put this book down : the characters feel alive and the ending surprised me .",
            "Heavy rain flooded several roads near the airport , and flights were delayed for hours .",
            "The algorithm sorts the list in place and returns the number of swaps it made .",
        ]
    ]
    float32 = Featurizer("minilm", compile=False).embed_words(words)
    quantized = Featurizer("minilm", precision="int8")
    int8 = quantized.embed_words(words)
    cosines = _word_cosines(int8, float32)
    assert cosines.mean() >= 0.99 and cosines.min() > 0.95
    linears = [m for m in quantized.model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) >= 6 * 6  # q, k, v, attention output, intermediate, output per layer (and a pooler)
    layers = quantized.model.num_layers  # query, key and value run as one int8 product per layer
    assert sum(isinstance(m, fast.Int8Linear) for m in quantized.runtime.encoder.modules()) == len(linears) - 2 * layers
    assert all(
        isinstance(layer.attention.query_key_value, fast.Int8Linear) for layer in quantized.runtime.encoder.layers
    )
    assert not any(
        isinstance(m, torch.nn.Linear) for m in quantized.runtime.encoder.modules()
    )  # the copy, not the model


@pytest.mark.parametrize("family, fixture", TRANSFORMERS, ids=[f for f, _ in TRANSFORMERS])
def test_every_transformer_family_accepts_precision_int8(family, fixture, request):
    folder = _folder(request, family, fixture)
    int8 = Featurizer(folder, precision="int8")
    assert int8.model.family == family
    float32 = Featurizer(folder, compile=False).embed_words(WORDS)
    ours = int8.embed_words(WORDS)
    assert [a.shape for a in ours] == [a.shape for a in float32]
    assert any(isinstance(m, fast.Int8Linear) for m in int8.runtime.encoder.modules())
    assert _word_cosines(ours, float32).mean() > 0.97  # random tiny models: a loose check that it computes the same


def test_elmo_refuses_int8_and_compile_in_one_line(elmo_dir):
    for kwargs in ({"precision": "int8"}, {"compile": True}):
        with pytest.raises(ValueError, match="ELMo|elmo|biLSTM") as e:
            Featurizer(f"elmo:{elmo_dir}", **kwargs)
        assert "\n" not in str(e.value) and "Transformer" in str(e.value)
    model = load_encoder(f"elmo:{elmo_dir}").model
    with pytest.raises(ValueError, match="biLSTM over characters: int8") as e:
        fast.quantize_int8(model, [])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="biLSTM over characters: compile"):
        fast.compile_encoder(model)
    Featurizer(f"elmo:{elmo_dir}").embed_words(WORDS[:1])  # the default compile="auto" is fine for ELMo


def test_int8_linear_matches_a_float_linear_and_smoothing_tames_an_outlier_channel():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(200, 64)
    x[:, 5] *= 60  # one outlier input channel, as in Transformer LayerNorm outputs
    absmax = x.abs().amax(0)
    expected = linear(x).detach()

    def error(layer: fast.Int8Linear) -> float:
        return float((layer(x) - expected).norm() / expected.norm())

    smoothed, plain = fast.Int8Linear(linear, absmax, alpha=0.7), fast.Int8Linear(linear, None)
    assert error(smoothed) < 0.02
    assert error(smoothed) < error(plain) / 2
    assert smoothed(x.to(torch.bfloat16)).dtype == torch.bfloat16  # returns the input's dtype


def test_int8_linear_stays_exact_where_int16_pair_sums_would_saturate():
    """Inputs at the top of their range times large weights of one sign: on a CPU without VNNI the full 8-bit
    range overflows the kernels' int16 pair sums (2 * 255 * 127 > 32767); Int8Linear must not be off there."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 32)
    with torch.no_grad():
        linear.weight.copy_(torch.rand(32, 16) * 0.05)  # one sign: the pair sums add up instead of cancelling
    x = torch.rand(64, 16) * 3
    expected = linear(x).detach()
    error = float((fast.Int8Linear(linear, None)(x) - expected).norm() / expected.norm())
    assert error < 0.02
    assert isinstance(fast.full_range_is_exact(), bool)


def test_quantize_int8_checks_its_arguments_and_keeps_named_layers_float(tiny_models):
    loaded = load_encoder(str(tiny_models["bert"]))
    batches = fast.calibration_batches(loaded.tokenizer, loaded.model.max_tokens)
    assert batches and all(b["input_ids"].shape[0] <= 8 for b in batches)
    q = fast.quantize_int8(loaded.model, batches, keep_float=["layers.0.intermediate"])
    assert isinstance(q.get_submodule("layers.0.intermediate"), torch.nn.Linear)
    assert isinstance(q.get_submodule("layers.0.output"), fast.Int8Linear)
    assert isinstance(loaded.model.get_submodule("layers.0.output"), torch.nn.Linear)  # the original is untouched
    with pytest.raises(ValueError, match="keep_float names no nn.Linear of this model: \\['layers.9.output'\\]"):
        fast.quantize_int8(loaded.model, batches, keep_float=["layers.9.output"])
    with pytest.raises(ValueError, match="alpha is the SmoothQuant migration strength"):
        fast.quantize_int8(loaded.model, batches, alpha=2.0)


def test_featurizer_refuses_unknown_compile_and_quantize_values(tiny_models):
    with pytest.raises(ValueError, match="compile must be True, False or 'auto', got 'yes'"):
        Featurizer(str(tiny_models["bert"]), compile="yes")
    with pytest.raises(ValueError, match="quantize must be None or 'int8', got 'int4'"):
        Featurizer(str(tiny_models["bert"]), quantize="int4")
    with pytest.raises(ValueError, match="precision must be one of .*'auto'.*, got 'int4'"):
        Featurizer(str(tiny_models["bert"]), precision="int4")
    with pytest.raises(ValueError, match="backend must be one of .*'openvino'.*, got 'tensorrt'"):
        Featurizer(str(tiny_models["bert"]), backend="tensorrt")
    with pytest.raises(ValueError, match="backend='onnxruntime' runs precision fp32 / int8, not 'bf16'"):
        Featurizer(str(tiny_models["bert"]), backend="onnxruntime", precision="bf16")
    with pytest.raises(ValueError, match="device must name a torch device"):
        Featurizer(str(tiny_models["bert"]), device="gpu0")
    with pytest.warns(DeprecationWarning, match="quantize='int8' is now precision='int8'"):
        old = Featurizer(str(tiny_models["bert"]), quantize="int8")
    assert old.precision == "int8" and old.quantize == "int8"


# ---- device and dtype flow through ----------------------------------------------------------------------------


def test_the_featurizer_sends_inputs_to_the_models_device(tiny_models):
    fz = Featurizer(str(tiny_models["bert"]), compile=False)
    fz.model.to("meta")
    seen = []

    class Stop(Exception):
        pass

    def record(_module, args, kwargs):
        seen.append((args[0].device.type, kwargs["attention_mask"].device.type))
        raise Stop

    fz.model.register_forward_pre_hook(record, with_kwargs=True)
    with pytest.raises(Stop):
        fz.embed_words(WORDS[:1])
    assert seen == [("meta", "meta")]  # no oneDNN copy of a model off the CPU; inputs moved to its device
    assert fz.runtime.encoder is fz.model


def test_bfloat16_models_and_autocast_give_float32_vectors_close_to_float32(tiny_models):
    folder = str(tiny_models["bert"])
    reference = Featurizer(folder, compile=False).embed_words(WORDS)
    bf16 = Featurizer(folder, compile=False)
    bf16.model.to(torch.bfloat16)
    assert bf16.runtime.encoder is bf16.model  # not pre-packed into float32 by oneDNN
    out = bf16.embed_words(WORDS)
    assert all(a.dtype == np.float32 for a in out)
    assert _word_cosines(out, reference).mean() > 0.99
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = Featurizer(folder, compile=False).embed_words(WORDS)
    assert all(a.dtype == np.float32 for a in mixed)
    assert _word_cosines(mixed, reference).mean() > 0.99


def test_the_compiled_encoder_keeps_the_models_dtype(tiny_models):
    model = load_encoder(str(tiny_models["bert"])).model.to(torch.bfloat16).eval()
    ids = torch.tensor([[101, 2023, 2003, 102]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with torch.inference_mode():
        out = fast.compile_encoder(model).encode(batch)
        reference = model.encode(batch)
    assert out.last_hidden_state.dtype == torch.bfloat16
    torch.testing.assert_close(out.last_hidden_state, reference.last_hidden_state, atol=2e-2, rtol=2e-2)


# ---- int8 in the estimators' predict --------------------------------------------------------------------------


def test_estimator_int8_predict_uses_one_int8_copy_until_the_next_fit(tiny_models):
    from ctxrep.tasks import SequenceClassifier

    X, y = ["good great fine", "bad awful poor"] * 4, ["pos", "neg"] * 4
    clf = SequenceClassifier(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, lr=1e-3, random_state=0)
    clf.fit(X, y)
    expected = clf.predict_proba(X)
    assert "_int8_network" not in vars(clf)  # float32 predict builds nothing
    clf.set_params(quantize="int8")
    np.testing.assert_allclose(clf.predict_proba(X), expected, atol=0.05)
    first = clf._int8_network[1]
    encoder = first.representation.encoder
    assert any(isinstance(m, fast.Int8Linear) for m in encoder.modules())
    assert not any(isinstance(m, fast.Int8Linear) for m in clf.model_.modules())  # the fitted model stays float32
    clf.predict(X)
    assert clf._int8_network[1] is first  # built once
    clf.set_params(warm_start=True).fit(X, y)  # new weights: the int8 copy is rebuilt from them
    clf.predict(X)
    assert clf._int8_network[1] is not first


def test_estimator_quantize_is_checked_before_training(tiny_models):
    from ctxrep.tasks import SequenceClassifier

    with pytest.raises(ValueError, match="quantize must be None or 'int8', got 'int4'"):
        SequenceClassifier(model=str(tiny_models["bert"]), quantize="int4").fit(["a b"], ["x"])
    with pytest.raises(ValueError, match="in mode='frozen' the features come from the featurizer"):
        SequenceClassifier(model=str(tiny_models["bert"]), mode="frozen", quantize="int8").fit(["a b"], ["x"])


# ---- device and dtype flow through the estimators (no GPU here: "meta" stands in for another device) --------


def test_estimator_batches_and_network_follow_device(tiny_models):
    from ctxrep.tasks import SequenceClassifier, TokenTagger

    X, y = ["good great fine", "bad awful poor"] * 2, ["pos", "neg"] * 2
    clf = SequenceClassifier(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, random_state=0).fit(X, y)
    seen = []
    clf.model_.register_forward_pre_hook(lambda _m, args: seen.append(args[0]["input_ids"].device.type))
    clf.set_params(device="meta")  # predict moves the network and sends its batches there
    with pytest.raises((RuntimeError, NotImplementedError)):  # meta tensors hold no values to read back
        clf.predict(X)
    assert seen == ["meta"] and {p.device.type for p in clf.model_.parameters()} == {"meta"}
    tagger = TokenTagger(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):  # fit: the network and batches on "meta" too
        tagger.fit([["john", "runs"]], [["B-PER", "O"]])
    assert {p.device.type for p in tagger.model_.parameters()} == {"meta"}
    with pytest.raises(ValueError, match="device must name a torch device"):
        SequenceClassifier(model=str(tiny_models["bert"]), device="gpu7").fit(X, y)


def test_estimator_bf16_autocast_trains_and_predicts_with_float32_weights(tiny_models):
    from ctxrep.tasks import SequenceClassifier

    X, y = ["good great fine", "bad awful poor"] * 4, ["pos", "neg"] * 4
    clf = SequenceClassifier(
        model=str(tiny_models["bert"]), max_epochs=2, batch_size=4, lr=1e-3, random_state=0, bf16=True
    ).fit(X, y)
    assert all(np.isfinite(r["train_loss"]) for r in clf.history_)
    assert {p.dtype for p in clf.model_.parameters()} == {torch.float32}
    dtypes = []
    clf.model_.head.linear.register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))  # a matmul: bf16
    proba = clf.predict_proba(X)
    assert dtypes and set(dtypes) == {torch.bfloat16} and proba.dtype == np.float32
    np.testing.assert_allclose(proba, clf.set_params(bf16=False).predict_proba(X), atol=0.05)


def test_estimator_predict_takes_device_and_precision_for_one_call(tiny_models, monkeypatch):
    from ctxrep.runtime import hardware
    from ctxrep.tasks import SequenceClassifier, TokenTagger

    X, y = ["good great fine", "bad awful poor"] * 4, ["pos", "neg"] * 4
    clf = SequenceClassifier(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, lr=1e-3, random_state=0)
    clf.fit(X, y)
    expected = clf.predict_proba(X)
    dtypes = []
    clf.model_.head.linear.register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))  # a matmul
    for precision, dtype, atol in (("bf16", torch.bfloat16, 0.05), ("fp16", torch.float16, 0.01), ("fp32", None, 0)):
        dtypes.clear()
        np.testing.assert_allclose(clf.predict_proba(X, precision=precision), expected, atol=atol)
        assert set(dtypes) == ({dtype} if dtype else {torch.float32})
    np.testing.assert_allclose(clf.predict_proba(X, precision="int8"), expected, atol=0.05)
    assert "_int8_network" in vars(clf) and clf.quantize is None and clf.bf16 is False  # no parameter changed
    for flags, dtype in (({"amx_bf16"}, torch.bfloat16), (set(), torch.float32)):  # "auto" reads the CPU's flags
        monkeypatch.setattr(hardware, "cpu_flags", lambda f=frozenset(flags): f)
        dtypes.clear()
        clf.score(X, y, precision="auto")
        assert set(dtypes) == {dtype}
    with clf.using(device="meta", precision="bf16"):  # "meta" stands in for a GPU: batches and network go there
        call = clf._call()
        batch = clf._batch(clf._examples(clf._check_X(X[:2]), None, call), call)
        assert {v.device.type for v in batch.values()} == {"meta"} and clf._predict_precision() == "bf16"
    assert clf._predict_device().type == "cpu" and clf.device == "cpu"  # only for the block
    with pytest.raises(ValueError, match="precision must be one of"):
        clf.predict(X, precision="int4")
    with pytest.raises(ValueError, match="precision='int8' runs on the CPU only, not meta"):
        clf.predict(X, device="meta", precision="int8")
    tagger = TokenTagger(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, random_state=0)
    tagger.fit([["john", "runs"], ["mary", "sleeps"]], [["B-PER", "O"], ["B-PER", "O"]])
    assert tagger.predict([["john", "runs"]], precision="bf16") == tagger.predict([["john", "runs"]])


def test_fused_query_key_value_path_equals_the_three_projections(tiny_models):
    """The BERT-family attention's fast path (one product for q, k, v, set by quantize_int8) against its reference
    forward, in float32 so that only the fusing is compared."""
    loaded = load_encoder(str(tiny_models["bert"]))
    model = loaded.model.eval()
    pieces = loaded.tokenizer.encode_words(WORDS)
    batch = collate(
        [w for i, p in enumerate(pieces) for w in WindowPlan(loaded.tokenizer, 64).single(i, p)], loaded.tokenizer
    )
    with torch.inference_mode():
        expected = model.encode(batch).hidden_states
    for layer in model.layers:
        a = layer.attention
        fused = torch.nn.Linear(a.query.in_features, 3 * a.query.out_features)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([a.query.weight, a.key.weight, a.value.weight]))
            fused.bias.copy_(torch.cat([a.query.bias, a.key.bias, a.value.bias]))
        a.query_key_value = fused
    with torch.inference_mode():
        got = model.encode(batch).hidden_states
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_smooth_linears_computes_the_same_function_with_smoothed_weights(tiny_models):
    """The ONNX Runtime int8 route quantizes a SmoothQuant-smoothed float copy: same outputs, other weights."""
    loaded = load_encoder(str(tiny_models["bert"]))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    batches = fast.calibration_batches(tokenizer, model.max_tokens)
    smoothed = fast.smooth_linears(model, batches)
    linears = [m for m in smoothed.modules() if isinstance(m, fast.SmoothedLinear)]
    assert len(linears) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert any(not torch.allclose(m.inv_smooth, torch.ones_like(m.inv_smooth)) for m in linears)
    with torch.inference_mode():
        for batch in batches[:2]:
            want, got = model.encode(batch).hidden_states, smoothed.encode(batch).hidden_states
            for w, g in zip(want, got):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_onnxruntime_int8_word_vectors_of_minilm_stay_within_cosine_0_99_of_float32(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path))  # a fresh graph cache: export, smooth and quantize here
    words = [
        s.split()
        for s in [
            "The new museum opened its doors to the public on Saturday after years of delays .",
            "I could n't put this book down : the characters feel alive and the ending surprised me .",
            "Heavy rain flooded several roads near the airport , and flights were delayed for hours .",
            "The algorithm sorts the list in place and returns the number of swaps it made .",
        ]
    ]
    float32 = Featurizer("minilm", compile=False).embed_words(words)
    int8 = Featurizer("minilm", backend="onnxruntime", precision="int8").embed_words(words)
    cosines = _word_cosines(int8, float32)
    assert cosines.mean() >= 0.99 and cosines.min() > 0.95
