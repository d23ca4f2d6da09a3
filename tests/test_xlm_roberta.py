"""XLM-RoBERTa and CamemBERT: RoBERTa's network (models/bert.py) under their own model types. Every hidden state
and attention map against transformers with padding in the batch; the family name users see; task checkpoints
(encoder under 'roberta.'); saving back as the same model type."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _parity import assert_featurizer_matches_transformers, assert_matches, padded_batch

import ctxrep
from ctxrep.models.bert import BertModel

FAMILIES = {
    "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel, transformers.XLMRobertaForMaskedLM),
    "camembert": (transformers.CamembertConfig, transformers.CamembertModel, transformers.CamembertForMaskedLM),
}


def _config(model_type: str):
    return FAMILIES[model_type][0](
        vocab_size=150,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        type_vocab_size=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _run(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_matches_transformers_and_saves_back(tmp_path, model_type):
    torch.manual_seed(0)
    FAMILIES[model_type][1](_config(model_type)).save_pretrained(tmp_path / "hf")
    theirs = transformers.AutoModel.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ours = ctxrep.load_model(tmp_path / "hf")
    assert type(ours) is BertModel and ours.family == model_type
    assert ours.max_tokens == 40 - 2  # RoBERTa's positions start at padding_idx + 1
    ids, mask = padded_batch(150, [7, 12, 3], pad_id=1, low=3)
    got = _run(ours, ids, mask)
    assert_matches(got, _run(theirs, ids, mask), mask)
    assert torch.allclose(got.pooler_output, theirs(ids, attention_mask=mask).pooler_output, atol=1e-5)
    ours.save_pretrained(tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == model_type
    again = transformers.AutoModel.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    assert type(again) is type(theirs)
    assert_matches(got, _run(again, ids, mask), mask)
    assert ctxrep.load_model(tmp_path / "back").family == model_type


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_masked_lm_checkpoint_loads_the_encoder(tmp_path, model_type):
    torch.manual_seed(1)
    FAMILIES[model_type][2](_config(model_type)).save_pretrained(tmp_path)
    assert any(k.startswith("roberta.") for k in json.dumps(list(_keys(tmp_path))).split('"'))
    theirs = transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch(150, [9, 4], pad_id=1, seed=2, low=3)
    assert_matches(_run(ours, ids, mask), _run(theirs, ids, mask), mask)


def _keys(folder):
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        return list(f.keys())


@pytest.mark.parametrize("fixture", ["xlmr_dir", "camembert_dir"])
def test_featurizer_matches_transformers(request, fixture):
    assert_featurizer_matches_transformers(request.getfixturevalue(fixture))
