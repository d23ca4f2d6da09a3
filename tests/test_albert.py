"""ALBERT: parity with transformers' AlbertModel, round trips both ways, sharing variants, loader errors."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from ctxrep.models.albert import AlbertConfig, AlbertForPreTraining, AlbertModel
from ctxrep.models.encoder import Encoder
from ctxrep.models.folders import CheckpointError

TINY = dict(
    vocab_size=99,
    embedding_size=8,
    hidden_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=24,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def padded_batch(vocab: int = 99, lengths=(11, 6, 2)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[0, 6:] = 1
    return ids, mask, types


def hf_saved(tmp_path, cls=transformers.AlbertModel, **overrides):
    torch.manual_seed(0)
    ref = cls(transformers.AlbertConfig(**(TINY | overrides))).eval()
    with torch.no_grad():  # LayerNorms away from (1, 0) and non-zero biases, so that a swapped name shows
        for name, p in ref.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    ref.save_pretrained(tmp_path)
    return transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()


def assert_parity(ours, ref, ids, mask, types) -> None:
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True, output_attentions=True)
        b = ref(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    real = mask.bool()
    assert len(a.hidden_states) == len(b.hidden_states) == ours.num_layers + 1
    for layer, (x, y, z) in enumerate(zip(a.hidden_states, b.hidden_states, fast.hidden_states)):
        assert torch.allclose(x[real], y[real], atol=1e-5), f"hidden state {layer} differs"
        assert torch.allclose(z[real], y[real], atol=1e-5), f"hidden state {layer} (sdpa path) differs"
    assert len(a.attentions) == len(b.attentions) == ours.num_layers
    for layer, (x, y) in enumerate(zip(a.attentions, b.attentions)):
        q = real[:, None, :, None].expand_as(x)
        assert torch.allclose(x[q], y[q], atol=1e-5), f"attention {layer} differs"
    assert torch.allclose(a.pooler_output, b.pooler_output, atol=1e-5)


@pytest.mark.parametrize(
    "layout",
    [
        dict(),
        dict(num_hidden_groups=3),
        dict(inner_group_num=2),
        dict(num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2),
    ],
    ids=["one-group", "group-per-layer", "inner-2", "groups-2-inner-2"],
)
def test_transformers_checkpoint_loads_with_parity(tmp_path, layout):
    ref = hf_saved(tmp_path, **layout)
    ours = AlbertModel.from_pretrained(tmp_path)
    assert ours.num_layers == ref.config.num_hidden_layers * ref.config.inner_group_num
    assert_parity(ours, ref, *padded_batch())


def test_pretraining_checkpoint_loads_encoder_and_names_the_heads(tmp_path, caplog):
    hf_saved(tmp_path, transformers.AlbertForPreTraining)
    ref = transformers.AlbertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with caplog.at_level(logging.INFO, logger="ctxrep.models.albert"):
        ours = AlbertModel.from_pretrained(tmp_path)
    assert "predictions.dense.weight" in caplog.text and "sop_classifier.classifier.weight" in caplog.text
    assert_parity(ours, ref.albert, *padded_batch())
    # The pretraining wrapper loads the heads too: same MLM and SOP logits as transformers.
    full = AlbertForPreTraining.from_pretrained(tmp_path)
    ids, mask, types = padded_batch()
    with torch.no_grad():
        a = full(ids, attention_mask=mask, token_type_ids=types)
        b = ref(ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()
    assert torch.allclose(a.prediction_logits[real], b.prediction_logits[real], atol=1e-4)
    assert torch.allclose(a.sop_logits, b.sop_logits, atol=1e-5)


@pytest.mark.parametrize("share", ["all", "none"])
def test_ours_saved_loads_in_transformers_automodel(tmp_path, share):
    torch.manual_seed(1)
    ours = AlbertModel(AlbertConfig(**TINY, inner_group_num=2, share=share)).eval()
    ours.save_pretrained(tmp_path, transformers_compatible=True)
    ref = transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(ref) is transformers.AlbertModel
    assert_parity(ours, ref, *padded_batch())
    again = AlbertModel.from_pretrained(tmp_path)
    ids, mask, types = padded_batch()
    with torch.no_grad():
        assert torch.equal(
            again(ids, attention_mask=mask).last_hidden_state, ours(ids, attention_mask=mask).last_hidden_state
        )


def test_pretraining_wrapper_saves_albert_for_pretraining_layout(tmp_path):
    torch.manual_seed(2)
    ours = AlbertForPreTraining(AlbertConfig(**TINY)).eval()
    assert ours.predictions.decoder.weight is ours.albert.embeddings.word_embeddings.weight
    ours.save_pretrained(tmp_path)
    ref = transformers.AlbertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, mask, types = padded_batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types)
        b = ref(ids, attention_mask=mask, token_type_ids=types)
    real = mask.bool()
    assert torch.allclose(a.prediction_logits[real], b.prediction_logits[real], atol=1e-4)
    assert torch.allclose(a.sop_logits, b.sop_logits, atol=1e-5)
    assert type(transformers.AutoModel.from_pretrained(tmp_path)) is transformers.AlbertModel


def _count(model: AlbertModel) -> dict[str, int]:
    def n(prefix):
        return sum(p.numel() for name, p in model.named_parameters() if name.startswith(prefix))

    return {"attention": n("attention_blocks."), "ffn": n("ffn_blocks."), "total": n("")}


def test_sharing_variants_have_the_right_parameter_counts():
    h, i, e, v, p, t = 16, 24, 8, 99, 32, 2
    attention = 4 * (h * h + h) + 2 * h  # q, k, v, output dense + LayerNorm
    ffn = (h * i + i) + (i * h + h) + 2 * h  # ffn, ffn_output + LayerNorm
    rest = (v + p + t) * e + 2 * e + (e * h + h) + (h * h + h)  # embeddings, LayerNorm, E->H, pooler
    layers = TINY["num_hidden_layers"]
    want = {"all": (1, 1), "attention": (1, layers), "ffn": (layers, 1), "none": (layers, layers)}
    for share, (n_att, n_ffn) in want.items():
        counts = _count(AlbertModel(AlbertConfig(**TINY, share=share)))
        assert counts == {
            "attention": n_att * attention,
            "ffn": n_ffn * ffn,
            "total": rest + n_att * attention + n_ffn * ffn,
        }, share
    # "all" matches transformers' own count for the same shape.
    ref = transformers.AlbertModel(transformers.AlbertConfig(**TINY))
    assert _count(AlbertModel(AlbertConfig(**TINY)))["total"] == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("share", ["attention", "ffn"])
def test_partial_sharing_round_trips_in_ctxrep_format_and_refuses_transformers_format(tmp_path, share):
    torch.manual_seed(4)
    ours = AlbertModel(AlbertConfig(**TINY, share=share)).eval()
    with pytest.raises(CheckpointError, match=f"share='{share}' cannot be saved in transformers' ALBERT format"):
        ours.save_pretrained(tmp_path / "hf", transformers_compatible=True)
    ours.save_pretrained(tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["model_type"] == "ctxrep-albert" and config["ctxrep_share"] == share
    again = AlbertModel.from_pretrained(tmp_path / "ours")
    assert again.config.share == share
    ids, mask, types = padded_batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        b = again(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert torch.equal(x, y)
    # The shared component is one module applied at every layer; the other is one per layer.
    shared = again.attention_slots if share == "attention" else again.ffn_slots
    assert shared == [0, 0, 0]


def test_encoder_interface():
    model = AlbertModel(AlbertConfig(**TINY, inner_group_num=2))
    assert isinstance(model, Encoder)
    assert (model.family, model.num_layers, model.num_heads, model.hidden_size, model.max_tokens) == (
        "albert",
        6,
        4,
        16,
        32,
    )
    assert model.reads_segments and not model.word_level
    assert model.input_embeddings().shape == (99, 8)
    ids, mask, types = padded_batch()
    out = model.eval().encode({"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, num_layers=2)
    assert len(out.hidden_states) == 3 and out.pooler_output is None
    full = model.encode({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    assert torch.equal(full.hidden_states[2], out.hidden_states[2])


def test_bad_checkpoints_give_one_line_errors(tmp_path):
    hf_saved(tmp_path / "good")
    state = load_file(tmp_path / "good" / "model.safetensors")
    del state["encoder.albert_layer_groups.0.albert_layers.0.ffn.bias"]
    state["encoder.albert_layer_groups.0.albert_layers.0.extra.weight"] = torch.zeros(2)
    state["embeddings.LayerNorm.weight"] = torch.ones(5)
    (tmp_path / "bad").mkdir()
    save_file(state, tmp_path / "bad" / "model.safetensors")
    (tmp_path / "bad" / "config.json").write_text((tmp_path / "good" / "config.json").read_text())
    with pytest.raises(CheckpointError) as e:
        AlbertModel.from_pretrained(tmp_path / "bad")
    msg = str(e.value)
    assert "\n" not in msg
    assert "missing 1 weights: encoder.albert_layer_groups.0.albert_layers.0.ffn.bias" in msg
    assert "1 unknown weights: encoder.albert_layer_groups.0.albert_layers.0.extra.weight" in msg
    assert "embeddings.LayerNorm.weight (5,) (expected (8,))" in msg

    # A config that does not belong to the weights (two groups, weights of one).
    config = json.loads((tmp_path / "good" / "config.json").read_text())
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config | {"num_hidden_groups": 3}))
    save_file(load_file(tmp_path / "good" / "model.safetensors"), tmp_path / "bad" / "model.safetensors")
    with pytest.raises(
        CheckpointError, match="missing .* encoder.albert_layer_groups.1.albert_layers.0.*check that config.json"
    ):
        AlbertModel.from_pretrained(tmp_path / "bad")

    (tmp_path / "bad" / "config.json").write_text(json.dumps(config | {"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="model_type is 'bert', expected 'albert' or 'ctxrep-albert'"):
        AlbertModel.from_pretrained(tmp_path / "bad")
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config | {"ctxrep_share": "ffn"}))
    with pytest.raises(CheckpointError, match="ctxrep_share='ffn', which only model_type 'ctxrep-albert' can hold"):
        AlbertModel.from_pretrained(tmp_path / "bad")


def test_bad_configs_and_inputs_are_refused_with_advice():
    with pytest.raises(ValueError, match="share must be one of"):
        AlbertConfig(**TINY, share="layers")
    with pytest.raises(ValueError, match="num_hidden_groups \\(4\\) exceeds num_hidden_layers \\(3\\)"):
        AlbertConfig(**TINY, num_hidden_groups=4)
    model = AlbertModel(AlbertConfig(**TINY))
    with pytest.raises(ValueError, match="longer than the model's 32 positions; ctxrep.Featurizer splits"):
        model(torch.ones(1, 33, dtype=torch.long))


def test_ctxrep_load_model_reads_a_transformers_albert_folder(tmp_path):
    import ctxrep

    ref = hf_saved(tmp_path)
    ours = ctxrep.load_model(tmp_path)
    assert isinstance(ours, AlbertModel) and not ours.training
    ids, mask, _ = padded_batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        b = ref(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    real = mask.bool()
    assert all(torch.allclose(x[real], y[real], atol=1e-5) for x, y in zip(a, b))


@pytest.mark.parametrize(
    "layout",
    [dict(share="attention"), dict(share="ffn", inner_group_num=2), dict(share="none", num_hidden_groups=3)],
    ids=["attention", "ffn-inner-2", "none"],
)
def test_unpadded_batches_give_the_padded_run_for_every_sharing(layout):
    """ctxrep-albert's partial sharing (no transformers reference): a shared block applied to (tokens, hidden) rows
    at every layer gives the padded run's hidden states, attentions, pooler and gradients at real tokens."""
    torch.manual_seed(5)
    model = AlbertModel(AlbertConfig(**(TINY | layout))).eval()
    ids, mask, types = padded_batch(lengths=(11, 1, 4, 2))  # 59% padding; segment 1 in the first row
    real = mask.bool()
    out, grads = {}, {}
    for path, share in (("padded", None), ("unpadded", 0.0)):
        model.unpad_from = share
        model.zero_grad()
        kw = dict(attention_mask=mask, token_type_ids=types, output_hidden_states=True, output_attentions=True)
        out[path] = model(ids, **kw)
        (out[path].hidden_states[-1][real].square().sum() + out[path].pooler_output.sum()).backward()
        grads[path] = {name: p.grad for name, p in model.named_parameters()}
    padded, unpadded = out["padded"], out["unpadded"]
    assert len(unpadded.hidden_states) == model.num_layers + 1
    for layer, (a, b) in enumerate(zip(padded.hidden_states, unpadded.hidden_states)):
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4, msg=f"hidden state {layer}")
        assert (b[~real] == 0).all()
    for a, b in zip(padded.attentions, unpadded.attentions):
        rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
        torch.testing.assert_close(b[rows], a[rows], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(unpadded.pooler_output, padded.pooler_output, atol=1e-5, rtol=1e-4)
    for name, g in grads["padded"].items():
        torch.testing.assert_close(grads["unpadded"][name], g, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
