"""LoRA adapters through peft (models/adapters.py, issue 43): an adapter trained in ctxrep loads into peft and
sentence-transformers over the transformers model with the same vectors, one trained with peft loads into ctxrep,
`ctxrep merge` writes a plain folder every tool reads, the trainers save adapters, and bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from conftest import save_tiny_bert

import ctxrep
from ctxrep.cli import main
from ctxrep.models.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterError,
    LoRA,
    add_lora,
    has_adapter,
    load_adapter,
    merge_adapter,
    save_adapter,
)
from ctxrep.models.loading import load_encoder
from ctxrep.tasks import SentenceEncoder, SequenceClassifier

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [
    ("A man is playing a guitar .", "Someone plays the guitar ."),
    ("A woman slices an onion .", "An onion is being cut by a woman ."),
    ("Stocks fell sharply on Monday .", "Markets dropped at the start of the week ."),
    ("The cat sleeps on the sofa .", "A cat is asleep on a couch ."),
]
TEXTS = [a for a, _ in PAIRS]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny random BERT without dropout and MiniLM's tokenizer, saved by transformers."""
    return save_tiny_bert(tmp_path_factory.mktemp("bert"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, fragment: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0], lines[0]


def randomize_b(module: torch.nn.Module, std: float = 0.05) -> None:
    """LoRA's B starts at 0 (the adapter adds nothing): give it values so that a wrong load would show."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def ids_batch(folder, texts=TEXTS[:2]) -> dict[str, torch.Tensor]:
    """Token ids of `texts` cut to one length (no padding, so every library computes every position)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    rows = [tok(t)["input_ids"] for t in texts]
    n = min(map(len, rows))
    ids = torch.tensor([r[:n] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def test_defaults_are_the_family_projections_and_only_the_adapters_train(bert):
    from ctxrep.cli.big_models import LORA_ALPHA, LORA_DROPOUT, LORA_RANK

    assert (LoRA().rank, LoRA().alpha, LoRA().dropout) == (LORA_RANK, LORA_ALPHA, LORA_DROPOUT) == (16, 32.0, 0.05)
    encoder = load_encoder(bert).model
    add_lora(encoder, LoRA())
    config = encoder.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout) == (16, 32.0, 0.05)
    expected = {  # attention's query, key, value and output; the feed-forward's intermediate and output
        f"layers.{i}.{t}"
        for i in range(2)
        for t in ("attention.query", "attention.key", "attention.value", "attention.output", "intermediate", "output")
    }
    assert set(config.target_modules) == expected and len(expected) == 12
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    assert trainable == {f"{m}.lora_{ab}.default.weight" for m in expected for ab in "AB"}
    narrowed = load_encoder(bert).model
    add_lora(narrowed, LoRA(rank=4, targets=("query", "value")))
    assert sorted(narrowed.peft_config["default"].target_modules) == [
        f"layers.{i}.attention.{p}" for i in range(2) for p in ("query", "value")
    ]


@pytest.mark.parametrize("family", ["bert", "gpt2", "qwen3"])
def test_a_ctxrep_adapter_loads_into_peft_over_the_transformers_model(family, bert, gpt2_dir, tmp_path):
    """Saved under transformers' module names (GPT-2's Conv1D with fan_in_fan_out), an adapter gives peft's model
    ctxrep's hidden states within 1e-5."""
    from peft import PeftModel

    if family == "qwen3":
        from _decoders import tiny_folder

        folder = tiny_folder(tmp_path / "qwen3", "qwen3")
    else:
        folder = {"bert": bert, "gpt2": gpt2_dir}[family]
    encoder = load_encoder(folder, dtype="fp32").model.eval()
    add_lora(encoder, LoRA(rank=4))
    randomize_b(encoder)
    save_adapter(encoder, tmp_path / "adapter", base=str(folder))
    config = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(folder)
    assert config["fan_in_fan_out"] == (family == "gpt2")
    batch = ids_batch(folder)
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    peft_model = PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    with torch.no_grad():
        ours = encoder.encode(batch).last_hidden_state
        plain = load_encoder(folder, dtype="fp32").model.eval().encode(batch).last_hidden_state
        kwargs = {k: v for k, v in batch.items() if k != "token_type_ids" or family == "bert"}
        theirs = peft_model(**kwargs).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert (ours - plain).abs().max() > 1e-3  # the adapter is there
    # `ctxrep merge`: the base's folder with the adapted weights (GPT-2's stored (in, out) as Conv1D keeps them)
    result = run("merge", tmp_path / "adapter", "--out", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        merged = transformers.AutoModel.from_pretrained(tmp_path / "merged").eval()(**kwargs).last_hidden_state
    torch.testing.assert_close(merged, theirs, atol=1e-4, rtol=1e-4)


def test_a_sentence_encoder_trained_with_lora_loads_in_sentence_transformers(bert, tmp_path):
    """SentenceEncoder(lora=...) saves the adapter over the base (no model weights of its own), which
    sentence-transformers loads as a folder and through load_adapter, with the same vectors (1e-5); ctxrep reads it
    back merged (Featurizer, SentenceEncoder.load), and `ctxrep merge` writes a plain folder with them too."""
    import sentence_transformers as st

    enc = SentenceEncoder(bert, lora=LoRA(rank=4), max_steps=3, batch_size=4, lr=1e-2, random_state=0)
    enc.fit(PAIRS)
    base_weights = load_encoder(bert).model.state_dict()
    frozen = {n: p for n, p in enc.backbone_.model.named_parameters() if "base_layer" in n}
    assert frozen and all(not p.requires_grad for p in frozen.values())
    out = enc.save(tmp_path / "enc")
    names = {p.name for p in out.iterdir()}
    assert {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "modules.json", "1_Pooling"} <= names
    assert "model.safetensors" not in names and "config.json" not in names
    ours = enc.encode(TEXTS)
    np.testing.assert_allclose(st.SentenceTransformer(str(out), device="cpu").encode(TEXTS), ours, atol=1e-5)
    over_base = st.SentenceTransformer(str(bert), device="cpu")
    over_base.load_adapter(str(out))
    np.testing.assert_allclose(over_base.encode(TEXTS), ours, atol=1e-5)
    np.testing.assert_allclose(ctxrep.Featurizer(out, sentence_pooling="model").embed_sentences(TEXTS), ours, atol=1e-5)
    np.testing.assert_allclose(SentenceEncoder.load(out).encode(TEXTS), ours, atol=1e-5)

    result = run("merge", out, "--out", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    merged = tmp_path / "merged"
    assert (merged / "model.safetensors").is_file() and not (merged / ADAPTER_CONFIG).exists()
    np.testing.assert_allclose(st.SentenceTransformer(str(merged), device="cpu").encode(TEXTS), ours, atol=1e-5)
    np.testing.assert_allclose(
        ctxrep.Featurizer(merged, sentence_pooling="model").embed_sentences(TEXTS), ours, atol=1e-5
    )
    merged_weights = load_encoder(merged).model.state_dict()
    untouched = [k for k in merged_weights if "embeddings" in k or "norm" in k or k.endswith(".bias")]
    assert untouched and all(torch.equal(merged_weights[k], base_weights[k]) for k in untouched)
    assert not torch.equal(
        merged_weights["layers.0.attention.query.weight"], base_weights["layers.0.attention.query.weight"]
    )


def test_a_peft_adapter_loads_into_ctxrep(bert, tmp_path):
    """An adapter trained with peft over transformers' BertModel (suffix targets, its own rank and alpha patterns)
    loads into ctxrep with the same hidden states: unmerged onto an encoder, and merged as a model folder."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value"], rank_pattern={"value": 2}, alpha_pattern={"query": 16}
    )
    peft_model = get_peft_model(transformers.AutoModel.from_pretrained(bert), config)
    randomize_b(peft_model)
    peft_model.save_pretrained(tmp_path / "peft")
    batch = ids_batch(bert)
    with torch.no_grad():
        theirs = peft_model.eval()(**batch).last_hidden_state
        encoder = load_adapter(load_encoder(bert).model, tmp_path / "peft").eval()
        assert has_adapter(encoder)
        torch.testing.assert_close(encoder.encode(batch).last_hidden_state, theirs, atol=1e-5, rtol=1e-5)
        merged = load_encoder(tmp_path / "peft").model  # base_model_name_or_path: the tiny BERT's folder
        assert not has_adapter(merged)
        torch.testing.assert_close(merged.encode(batch).last_hidden_state, theirs, atol=1e-5, rtol=1e-5)


def test_an_estimator_trained_with_lora_saves_its_adapter_beside_the_head(bert, tmp_path):
    X, y = ["good great fine nice", "bad awful poor sad"] * 4, ["pos", "neg"] * 4
    params = dict(max_epochs=2, batch_size=4, lr=1e-2, random_state=0, dropout=0.0)
    clf = SequenceClassifier(bert, lora=LoRA(rank=4), gradual_unfreezing=True, **params).fit(X, y)
    encoder = clf.model_.representation.encoder
    base = load_encoder(bert).model.state_dict()
    weights = {n.replace(".base_layer", ""): p for n, p in encoder.state_dict().items() if ".lora_" not in n}
    assert all(torch.equal(weights[k], v) for k, v in base.items())  # the base stayed as it was
    assert all(p.requires_grad == (".lora_" in n) for n, p in encoder.named_parameters())
    out = clf.save(tmp_path / "clf")
    assert (out / "adapter" / ADAPTER_WEIGHTS).is_file()
    from safetensors.torch import load_file

    assert all(k.startswith("head.") for k in load_file(out / "model.safetensors"))
    again = SequenceClassifier.load(out)
    assert again.lora == LoRA(rank=4)
    np.testing.assert_allclose(again.predict_proba(X), clf.predict_proba(X), atol=1e-6)
    again.set_params(quantize="int8")  # the int8 copy is made of the merged encoder
    np.testing.assert_allclose(again.predict_proba(X), clf.predict_proba(X), atol=0.05)
    assert has_adapter(again.model_.representation.encoder)  # the fitted network keeps its adapters


def test_gradient_checkpointing_under_bf16_autocast(bert):
    """The same loss and gradients with the blocks recomputed, under bfloat16 autocast too."""
    encoder = load_encoder(bert).model.train()
    add_lora(encoder, LoRA(rank=2, dropout=0.0))
    randomize_b(encoder)
    batch = ids_batch(bert, TEXTS)
    weights = torch.randn((*batch["input_ids"].shape, 32), generator=torch.Generator().manual_seed(1))

    def loss_and_grads():
        encoder.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (encoder.encode(batch).last_hidden_state.float() * weights).sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in encoder.parameters() if p.grad is not None]

    loss, grads = loss_and_grads()
    encoder.gradient_checkpointing_enable()
    loss2, grads2 = loss_and_grads()
    assert torch.equal(loss, loss2) and len(grads) == len(grads2) == 24
    for a, b in zip(grads, grads2):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_merge_adapter_folds_the_adapters_into_plain_projections(bert):
    encoder = load_encoder(bert).model.eval()
    add_lora(encoder, LoRA(rank=4))
    randomize_b(encoder)
    batch = ids_batch(bert)
    with torch.no_grad():
        before = encoder.encode(batch).last_hidden_state
        merge_adapter(encoder)
        after = encoder.encode(batch).last_hidden_state
    assert not has_adapter(encoder) and type(encoder.layers[0].attention.query) is torch.nn.Linear
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


# ---- bad input: one line each -------------------------------------------------------------------------------------


def test_a_target_the_family_does_not_have(bert):
    with pytest.raises(AdapterError) as e:
        add_lora(load_encoder(bert).model, LoRA(targets=("q_proj",)))
    message = str(e.value)
    assert "\n" not in message and "'q_proj' is not a projection of this bert model" in message
    assert "query, key, value, intermediate, output" in message  # the family's own projections are named
    with pytest.raises(AdapterError, match="rank must be a positive integer"):
        add_lora(load_encoder(bert).model, LoRA(rank=0))


def test_an_adapter_of_another_base_model_is_refused(bert, gpt2_dir, tmp_path):
    encoder = load_encoder(bert).model
    add_lora(encoder, LoRA(rank=4))
    save_adapter(encoder, tmp_path / "bert-adapter", base=str(bert))
    wider = save_tiny_bert(tmp_path / "wider", hidden_size=48, intermediate_size=96)
    with pytest.raises(AdapterError) as e:
        load_adapter(load_encoder(wider).model, tmp_path / "bert-adapter")
    assert "\n" not in str(e.value) and "maps 32 -> 32 features, but that projection is 48 -> 48 here" in str(e.value)
    gpt2 = load_encoder(gpt2_dir).model
    add_lora(gpt2, LoRA(rank=4))
    save_adapter(gpt2, tmp_path / "gpt2-adapter", base=str(gpt2_dir))
    with pytest.raises(AdapterError) as e:
        load_adapter(load_encoder(bert).model, tmp_path / "gpt2-adapter")
    assert "\n" not in str(e.value) and "h.0.attn.c_attn, which this bert model does not have" in str(e.value)


def test_other_peft_types_and_saved_modules_are_refused(bert, tmp_path):
    from peft import IA3Config, LoraConfig, get_peft_model

    ia3 = get_peft_model(transformers.AutoModel.from_pretrained(bert), IA3Config(target_modules=["query", "value"]))
    ia3.save_pretrained(tmp_path / "ia3")
    with pytest.raises(AdapterError) as e:
        load_adapter(load_encoder(bert).model, tmp_path / "ia3")
    assert "\n" not in str(e.value) and "a IA3 adapter (peft_type); ctxrep loads LORA adapters" in str(e.value)
    one_line_error(run("merge", tmp_path / "ia3", "--out", tmp_path / "m"), "IA3 adapter")
    saving = LoraConfig(r=2, target_modules=["query"], modules_to_save=["pooler"])
    get_peft_model(transformers.AutoModel.from_pretrained(bert), saving).save_pretrained(tmp_path / "saves")
    with pytest.raises(AdapterError, match="also saves whole modules"):
        load_adapter(load_encoder(bert).model, tmp_path / "saves")


def test_lora_in_frozen_mode_and_elmo_are_refused(bert, elmo_dir):
    with pytest.raises(ValueError, match="in mode='frozen' the encoder is not trained"):
        SequenceClassifier(bert, mode="frozen", lora=LoRA()).fit(["a b", "c d"], ["x", "y"])
    with pytest.raises(ValueError, match="lora must be None or ctxrep.models.adapters.LoRA"):
        SequenceClassifier(bert, lora=16).fit(["a b", "c d"], ["x", "y"])
    with pytest.raises(AdapterError, match="ELMo is a biLSTM: it has no attention or MLP projections"):
        add_lora(load_encoder(elmo_dir).model, LoRA())


def test_a_splade_encoder_trained_with_lora_loads_in_sentence_transformers(tmp_path):
    """SparseSentenceEncoder(lora=...) adapts the encoder of a *ForMaskedLM folder (its MLM head stays the base's) and
    saves the adapter under BertForMaskedLM's names ("bert."): sentence-transformers' SparseEncoder and ctxrep's give
    its vectors."""
    import sentence_transformers as st

    from ctxrep.tasks import SparseSentenceEncoder
    from ctxrep.vectors.sparse import SparseEncoder

    base = save_tiny_bert(
        tmp_path / "mlm",
        model_class=transformers.BertForMaskedLM,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    enc = SparseSentenceEncoder(base, lora=LoRA(rank=4), max_steps=2, batch_size=4, lr=1e-2, random_state=0)
    enc.fit(PAIRS)
    assert not any(p.requires_grad for p in enc.head_.parameters())
    out = enc.save(tmp_path / "splade")
    assert json.loads((out / ADAPTER_CONFIG).read_text())["target_modules"][0].startswith("bert.encoder.layer.")
    ours = enc.encode(TEXTS).toarray()
    theirs = st.SparseEncoder(str(out), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    np.testing.assert_allclose(SparseEncoder(out).embed_sentences(TEXTS).toarray(), ours, atol=1e-5)
