"""MPNet (models/mpnet.py) against transformers' MPNetModel: every hidden state and attention map with padding
in the batch (the relative position bias shared by every layer), task checkpoints, saving back."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _parity import assert_featurizer_matches_transformers, assert_matches, padded_batch

import ctxrep
from ctxrep.models.mpnet import MPNetModel


def _hf_config(**kw) -> transformers.MPNetConfig:
    base = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=200,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.MPNetConfig(**(base | kw))


def _reference(path):
    return transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()


def _random_bias(model) -> None:
    """transformers initialises the bias table like any embedding; make it large so that it matters."""
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.normal_(std=1.0)


@pytest.mark.parametrize("lengths", [[7, 12, 3], [150, 20]], ids=["short", "far-buckets"])
def test_matches_transformers_with_padding(tmp_path, lengths):
    torch.manual_seed(0)
    hf = transformers.MPNetModel(_hf_config())
    _random_bias(hf)
    hf.save_pretrained(tmp_path)
    theirs = _reference(tmp_path)
    ours = ctxrep.load_model(tmp_path)
    assert type(ours) is MPNetModel and ours.family == "mpnet" and not ours.reads_segments
    assert ours.max_tokens == 198
    ids, mask = padded_batch(100, lengths, pad_id=1, low=4)
    with torch.no_grad():
        want = theirs(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask)  # the scaled_dot_product_attention path
    assert_matches(got, want, mask)
    assert torch.allclose(got.pooler_output, want.pooler_output, atol=1e-5)
    keep = mask.bool()
    assert (fast.last_hidden_state - want.last_hidden_state).abs()[keep].max() < 1e-5


def test_masked_lm_checkpoint_loads_the_encoder_and_saves_back(tmp_path):
    torch.manual_seed(1)
    mlm = transformers.MPNetForMaskedLM(_hf_config())
    _random_bias(mlm.mpnet)
    mlm.save_pretrained(tmp_path / "mlm")
    ours = ctxrep.load_model(tmp_path / "mlm")
    assert ours.pooler is None  # MPNetForMaskedLM has no pooler
    ids, mask = padded_batch(100, [9, 5], pad_id=1, seed=3, low=4)
    with torch.no_grad():
        want = _reference(tmp_path / "mlm")(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert_matches(got, want, mask)
    ours.save_pretrained(tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["MPNetModel"]
    with torch.no_grad():
        again = _reference(tmp_path / "back")(
            ids, attention_mask=mask, output_hidden_states=True, output_attentions=True
        )
    assert_matches(got, again, mask)


def test_every_parameter_has_a_depth(tmp_path):
    transformers.MPNetModel(_hf_config()).save_pretrained(tmp_path)
    model = ctxrep.load_model(tmp_path)
    depths = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert depths["embeddings.position_embeddings.weight"] == 0 and depths["layers.0.attention.query.weight"] == 1
    assert depths["relative_attention_bias.weight"] == 3 and depths["pooler.weight"] == 3
    with pytest.raises(ValueError, match="not a parameter"):
        model.layer_of("layers.7.output.bias")


def test_featurizer_matches_transformers(mpnet_dir):
    assert_featurizer_matches_transformers(mpnet_dir)
