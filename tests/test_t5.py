"""T5's encoder (models/t5.py) against transformers' T5EncoderModel: every hidden state and attention map with
padding in the batch, T5 v1.0 (relu) and v1.1 / flan (gated-gelu); the encoder half of a whole T5 checkpoint;
saving back."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import transformers
from _parity import assert_featurizer_matches_transformers, assert_matches, padded_batch
from safetensors.torch import load_file, save_file

import ctxrep
from ctxrep.models.folders import CheckpointError
from ctxrep.models.t5 import T5EncoderModel


def _hf_config(**kw) -> transformers.T5Config:
    base = dict(
        vocab_size=90,
        d_model=32,
        d_kv=6,
        d_ff=40,
        num_layers=3,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=40,
    )
    return transformers.T5Config(**(base | kw))


def _reference(path, cls=transformers.T5EncoderModel):
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def _run(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)


@pytest.mark.parametrize("proj", ["relu", "gated-gelu"], ids=["t5-v1.0", "t5-v1.1"])
def test_matches_transformers_with_padding(tmp_path, proj):
    torch.manual_seed(0)
    transformers.T5EncoderModel(_hf_config(feed_forward_proj=proj)).save_pretrained(tmp_path)
    theirs = _reference(tmp_path)
    ours = ctxrep.load_model(tmp_path)
    assert type(ours) is T5EncoderModel and ours.family == "t5" and not ours.reads_segments
    assert ours.max_tokens == 512
    ids, mask = padded_batch(90, [7, 60, 3], pad_id=0, low=2)  # 60 tokens: distances past max_distance
    want, got = _run(theirs, ids, mask), _run(ours, ids, mask)
    assert_matches(got, want, mask)
    with torch.no_grad():
        fast = ours(ids, attention_mask=mask).last_hidden_state  # scaled_dot_product_attention path
    assert (fast - want.last_hidden_state).abs()[mask.bool()].max() < 1e-5
    with torch.no_grad():  # stopping early: a prefix of the hidden states, without the final norm
        early = ours(ids, attention_mask=mask, output_hidden_states=True, num_layers=2).hidden_states
        full = ours(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(early) == 3 and all(torch.equal(a, b) for a, b in zip(early, full[:3]))


def test_encoder_half_of_a_whole_t5_checkpoint(tmp_path, caplog):
    torch.manual_seed(1)
    transformers.T5ForConditionalGeneration(_hf_config(feed_forward_proj="gated-gelu")).save_pretrained(
        tmp_path / "full"
    )
    with caplog.at_level(logging.INFO, logger="ctxrep.models.t5"):
        ours = ctxrep.load_model(tmp_path / "full")
    assert "decoder and LM-head weights are not part of the encoder" in caplog.text
    ids, mask = padded_batch(90, [9, 4], pad_id=0, seed=3, low=2)
    want = _run(_reference(tmp_path / "full"), ids, mask)  # T5EncoderModel from the whole checkpoint
    got = _run(ours, ids, mask)
    assert_matches(got, want, mask)
    ours.save_pretrained(tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["architectures"] == ["T5EncoderModel"] and config["feed_forward_proj"] == "gated-gelu"
    assert not any(k.startswith("decoder.") for k in load_file(tmp_path / "back" / "model.safetensors"))
    assert_matches(got, _run(_reference(tmp_path / "back"), ids, mask), mask)
    assert_matches(got, _run(ctxrep.load_model(tmp_path / "back"), ids, mask), mask, tol=1e-6)


def test_weights_outside_encoder_and_decoder_are_refused(tmp_path):
    transformers.T5EncoderModel(_hf_config()).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["classification_head.dense.weight"] = torch.zeros(3, 3)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="unknown weights: classification_head.dense.weight"):
        ctxrep.load_model(tmp_path)


def test_every_parameter_has_a_depth(tmp_path):
    transformers.T5EncoderModel(_hf_config(feed_forward_proj="gated-gelu")).save_pretrained(tmp_path)
    model = ctxrep.load_model(tmp_path)
    depths = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert depths["embed_tokens.weight"] == 0 and depths["layers.2.ffn.wi_gate.weight"] == 3
    assert depths["layers.0.attention.relative_attention_bias.weight"] == 3 and depths["final_norm.weight"] == 3
    assert depths["layers.0.attention.query.weight"] == 1
    with pytest.raises(ValueError, match="not a parameter"):
        model.layer_of("layers.1.attention.relative_attention_bias.weight")


def test_sentence_t5_layout_loads_and_info_names_its_pooling(tmp_path, monkeypatch):
    """sentence-t5's folder: T5EncoderModel at the top, then Pooling (mean), Dense and Normalize modules. The
    encoder loads; `ctxrep info` says which pooling the folder declares and that ctxrep does not apply its Dense."""
    from click.testing import CliRunner

    from ctxrep.cli import main

    transformers.T5EncoderModel(_hf_config(feed_forward_proj="gated-gelu")).save_pretrained(tmp_path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        '{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}'
    )
    from ctxrep.models.sentence_transformers import describe_sentence_pooling

    assert ctxrep.load_model(tmp_path).family == "t5"
    line = describe_sentence_pooling(tmp_path)
    assert line.startswith("declared in modules.json but not applicable by ctxrep") and "Dense (2_Dense)" in line
    (tmp_path / "modules.json").write_text(json.dumps([modules[0], modules[1], modules[3]]))
    assert describe_sentence_pooling(tmp_path).startswith("mean, then L2-normalised, from modules.json")
    # the CLI needs a tokenizer: T5's, trained here as the Hub ships it (spiece.model only; converted into the cache)
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path / "cache"))
    from conftest import sentencepiece_tokenizer

    config = (tmp_path / "config.json").read_text()
    sentencepiece_tokenizer(tmp_path / "tok", "t5", "spiece.model", vocab_size=60)
    (tmp_path / "spiece.model").write_bytes((tmp_path / "tok" / "spiece.model").read_bytes())
    (tmp_path / "config.json").write_text(config)
    result = CliRunner().invoke(main, ["info", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "sentence vector  mean, then L2-normalised, from modules.json" in result.output


def test_float16_residuals_stay_finite():
    """T5 v1.1's residual stream can pass float16's range: clamped as in transformers' T5Block, not inf or NaN."""
    from ctxrep.models.t5 import T5Config, _clamp_fp16

    x = torch.tensor([[70000.0, -1.0]]).half()  # 70000 overflows float16 to inf
    assert torch.isfinite(_clamp_fp16(x)).all() and _clamp_fp16(x)[0, 0] == torch.finfo(torch.float16).max - 1000
    y = torch.tensor([1e30, -2.0])
    assert torch.equal(_clamp_fp16(y), y)  # float32 untouched
    torch.manual_seed(0)
    model = T5EncoderModel(T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=4))
    with torch.no_grad():
        model.embed_tokens.weight[4] = 65000.0  # a residual stream at the edge of float16's range ...
        model.layers[0].ffn.wi.weight.fill_(0.1)  # ... that the first FFN pushes past it (inf, then NaN unclamped)
        model.layers[0].ffn.wo.weight.fill_(100.0)
        out = model.half().eval()(torch.tensor([[3, 4, 5]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
    assert torch.isfinite(out.last_hidden_state).all()


def test_featurizer_matches_transformers(t5_dir):
    assert_featurizer_matches_transformers(t5_dir, transformers.T5EncoderModel)
