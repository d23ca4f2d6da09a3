"""DistilBERT (models/distilbert.py) against transformers' DistilBertModel: every hidden state and attention map,
padding in the batch, learned and sinusoidal positions; loading task checkpoints, saving back, pruning."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _parity import assert_featurizer_matches_transformers, assert_matches, padded_batch
from safetensors.torch import load_file, save_file

import ctxrep
from ctxrep.models.distilbert import DistilBertModel, sinusoidal_table
from ctxrep.models.folders import CheckpointError


def _hf_config(**kw) -> transformers.DistilBertConfig:
    base = dict(
        vocab_size=120,
        max_position_embeddings=40,
        n_layers=2,
        n_heads=4,
        dim=32,
        hidden_dim=48,
        dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=0,
    )
    return transformers.DistilBertConfig(**(base | kw))


def _reference(path, **kw):
    return transformers.AutoModel.from_pretrained(path, attn_implementation="eager", **kw).eval()


@pytest.mark.parametrize(
    "kw", [{}, {"sinusoidal_pos_embds": True}, {"activation": "relu"}], ids=["learned", "sinusoidal", "relu"]
)
def test_matches_transformers_with_padding(tmp_path, kw):
    torch.manual_seed(0)
    transformers.DistilBertModel(_hf_config(**kw)).save_pretrained(tmp_path)
    theirs = _reference(tmp_path)
    ours = ctxrep.load_model(tmp_path)
    assert type(ours) is DistilBertModel and ours.family == "distilbert" and not ours.reads_segments
    ids, mask = padded_batch(120, [7, 12, 3], pad_id=0)
    with torch.no_grad():
        want = theirs(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert_matches(got, want, mask)
    if kw.get("sinusoidal_pos_embds"):
        table = ours.embeddings.position_embeddings.weight
        assert not table.requires_grad and torch.allclose(table, sinusoidal_table(40, 32), atol=1e-6)


def test_task_checkpoint_loads_the_encoder_and_saves_back(tmp_path):
    torch.manual_seed(1)
    mlm = transformers.DistilBertForMaskedLM(_hf_config())
    mlm.save_pretrained(tmp_path / "mlm")
    ours = ctxrep.load_model(tmp_path / "mlm")
    ids, mask = padded_batch(120, [9, 5], pad_id=0, seed=3)
    with torch.no_grad():
        want = _reference(tmp_path / "mlm")(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert_matches(got, want, mask)
    ours.save_pretrained(tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "distilbert" and config["architectures"] == ["DistilBertModel"]
    again = _reference(tmp_path / "back")
    with torch.no_grad():
        assert_matches(got, again(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True), mask)
    reloaded = ctxrep.load_model(tmp_path / "back")(ids, attention_mask=mask, output_attentions=True)
    assert torch.equal(reloaded.last_hidden_state, got.last_hidden_state)


def test_unknown_or_missing_weights_are_refused_by_name(tmp_path):
    transformers.DistilBertModel(_hf_config()).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["transformer.layer.0.attention.extra.weight"] = torch.zeros(2)
    del state["transformer.layer.1.ffn.lin2.bias"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        ctxrep.load_model(tmp_path)
    assert "transformer.layer.1.ffn.lin2.bias" in str(e.value) and "attention.extra.weight" in str(e.value)


def test_segments_are_refused_and_depths_cover_every_parameter(tmp_path):
    transformers.DistilBertModel(_hf_config()).save_pretrained(tmp_path)
    model = ctxrep.load_model(tmp_path)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="no token-type"):
        model(ids, token_type_ids=torch.ones_like(ids))
    depths = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert depths["embeddings.word_embeddings.weight"] == 0 and depths["layers.1.output.bias"] == 2
    assert set(depths.values()) == {0, 1, 2}
    with pytest.raises(ValueError, match="not a parameter"):
        model.layer_of("pooler.weight")


def test_pruned_heads_equal_masked_heads_and_round_trip(tmp_path):
    torch.manual_seed(2)
    transformers.DistilBertModel(_hf_config()).save_pretrained(tmp_path / "full")
    model = ctxrep.load_model(tmp_path / "full")
    ids, mask = padded_batch(120, [8, 6], pad_id=0, seed=4)
    head_mask = torch.ones(2, 4)
    head_mask[0, [1, 2]] = 0
    head_mask[1, 3] = 0
    with torch.no_grad():
        masked = model(ids, attention_mask=mask, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [1, 2], 1: [3]})
        pruned = model(ids, attention_mask=mask).last_hidden_state
    assert model.heads_per_layer() == [2, 3] and model.kept_heads() == [[0, 3], [0, 1, 2]]
    assert torch.allclose(pruned, masked, atol=1e-6)
    model.save_pretrained(tmp_path / "pruned")
    again = ctxrep.load_model(tmp_path / "pruned")
    assert again.heads_per_layer() == [2, 3]
    assert torch.allclose(again(ids, attention_mask=mask).last_hidden_state, pruned, atol=1e-6)


def test_student_copies_the_chosen_layers(tmp_path):
    transformers.DistilBertModel(_hf_config()).save_pretrained(tmp_path)
    teacher = ctxrep.load_model(tmp_path)
    student = teacher.init_student([1])
    assert student.num_layers == 1
    assert torch.equal(student.layers[0].output.weight, teacher.layers[1].output.weight)
    narrow = teacher.init_student([0], hidden_size=16)
    assert narrow.hidden_size == 16 and narrow.num_heads == 4 and narrow.config.hidden_dim == 24
    ids, mask = padded_batch(120, [5, 3], pad_id=0)
    assert narrow(ids, attention_mask=mask).last_hidden_state.shape == (2, 5, 16)


def test_featurizer_matches_transformers(distilbert_dir):
    assert_featurizer_matches_transformers(distilbert_dir)


def test_unpadded_batches_give_the_padded_run_with_pruned_heads_and_left_padding(tmp_path):
    """A pruned model, a head mask that requires grad (head importance) and a left-padded row (positions 0..seq-1
    on the padded grid): the padded run's hidden states at real tokens and its head-mask gradient, 0 at padding."""
    torch.manual_seed(3)
    transformers.DistilBertModel(_hf_config()).save_pretrained(tmp_path)
    model = ctxrep.load_model(tmp_path)
    model.prune_heads({1: [0]})
    ids, mask = padded_batch(120, [12, 3, 7, 1], pad_id=0, seed=5)  # 52% padding
    ids[1], mask[1] = ids[1].roll(9), mask[1].roll(9)  # row 1 left-padded: 9 pads, then 3 tokens
    real = mask.bool()
    out, grads = {}, {}
    for path, share in (("padded", None), ("unpadded", 0.0)):
        model.unpad_from = share
        xi = torch.full((2, 4), 0.5, requires_grad=True)
        out[path] = model(ids, attention_mask=mask, head_mask=xi, output_hidden_states=True)
        out[path].last_hidden_state[real].square().sum().backward()
        grads[path] = xi.grad
    assert model.unpadding(mask) is not None
    for layer, (a, b) in enumerate(zip(out["padded"].hidden_states, out["unpadded"].hidden_states)):
        assert (b - a).abs()[real].max() < 1e-5, f"hidden state {layer} differs"
        assert (b[~real] == 0).all()
    assert torch.allclose(grads["unpadded"], grads["padded"], atol=1e-4, rtol=1e-4)
    assert grads["padded"][1, 0] == 0  # a pruned head's entry is not read
