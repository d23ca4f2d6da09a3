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
from ctxrep.models.t5 import T5EncoderModel, T5ForConditionalGeneration


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
    with caplog.at_level(logging.INFO, logger="ctxrep.models.t5"):  # the encoder half (load_model: the whole T5)
        ours = T5EncoderModel.from_pretrained(tmp_path / "full")
    assert "not loading" in caplog.text and "decoder and LM-head weights (a whole T5 checkpoint" in caplog.text
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
    encoder loads; `ctxrep info` says which pooling the folder declares, with its Dense (refused when its files are missing)."""
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
    line = describe_sentence_pooling(tmp_path)  # modules.json names a Dense whose folder is missing
    assert line.startswith("declared in modules.json but not applicable by ctxrep") and "2_Dense" in line
    assert "missing" in line
    from sentence_transformers.models import Dense

    (tmp_path / "2_Dense").mkdir()
    Dense(32, 16, bias=True).save(str(tmp_path / "2_Dense"))  # sentence-t5's projection: ctxrep applies it
    line = describe_sentence_pooling(tmp_path)
    assert "Dense" in line and not line.startswith("declared in modules.json but not applicable"), line
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


def test_mt5_loads_matches_transformers_and_saves_back(t5_dir, tmp_path):
    """mT5 (model_type "mt5", MT5EncoderModel) is T5 v1.1's network: same file, family "mt5"; google/mt5-*'s layout
    (a whole MT5ForConditionalGeneration and spiece.model only) loads whole (tests/test_t5_seq2seq.py) and featurizes
    end to end; its encoder equals MT5EncoderModel's."""
    config = transformers.MT5Config(**(_hf_config(feed_forward_proj="gated-gelu").to_dict() | {"vocab_size": 120}))
    torch.manual_seed(5)
    transformers.MT5ForConditionalGeneration(config).save_pretrained(tmp_path / "mt5")
    (tmp_path / "mt5" / "spiece.model").write_bytes((t5_dir / "spiece.model").read_bytes())
    whole = ctxrep.load_model(tmp_path / "mt5")
    assert type(whole) is T5ForConditionalGeneration and whole.family == "mt5"
    ours = whole.encoder
    assert type(ours) is T5EncoderModel and ours.family == "mt5"
    theirs = _reference(tmp_path / "mt5", transformers.MT5EncoderModel)
    ids, mask = padded_batch(120, [7, 50, 3], pad_id=0, low=2)
    assert_matches(_run(ours, ids, mask), _run(theirs, ids, mask), mask)
    ours.save_pretrained(tmp_path / "back")
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    assert saved["model_type"] == "mt5" and saved["architectures"] == ["MT5EncoderModel"]
    again = _reference(tmp_path / "back", transformers.MT5EncoderModel)
    assert_matches(_run(ours, ids, mask), _run(again, ids, mask), mask)
    whole.save_pretrained(tmp_path / "whole-back")
    saved = json.loads((tmp_path / "whole-back" / "config.json").read_text())
    assert saved["model_type"] == "mt5" and saved["architectures"] == ["MT5ForConditionalGeneration"]
    vectors = ctxrep.Featurizer(str(tmp_path / "mt5")).embed_words([["Ein", "kleiner", "Test", "."]])
    assert vectors[0].shape == (4, 32)


# ---- head pruning (modules/heads.py): layer 0's relative position table is read by every layer, never pruned -------


def _model(tmp_path, seed: int = 0, proj: str = "gated-gelu"):
    torch.manual_seed(seed)
    hf = transformers.T5EncoderModel(_hf_config(feed_forward_proj=proj))
    with torch.no_grad():  # large and different per head, so that a wrong slice of the bias shows
        hf.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(std=1.0)
    hf.save_pretrained(tmp_path / "full")
    return ctxrep.load_model(tmp_path / "full")


def _mask(removed: dict[int, list[int]]) -> torch.Tensor:
    xi = torch.ones(3, 4)
    for layer, heads in removed.items():
        xi[layer, heads] = 0.0
    return xi


def _run_both(model, ids, mask, head_mask=None):
    """The eager path (attention maps) and the scaled_dot_product_attention path."""
    with torch.no_grad():
        eager = model(ids, attention_mask=mask, head_mask=head_mask, output_hidden_states=True, output_attentions=True)
        fast = model(ids, attention_mask=mask, head_mask=head_mask, output_hidden_states=True)
    return eager, fast


def _assert_hidden_close(a, b, mask, tol=1e-5):
    keep = mask.bool()
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        assert (x - y).abs()[keep].max() < tol, f"hidden state {i}"


@pytest.mark.parametrize("proj", ["relu", "gated-gelu"], ids=["t5-v1.0", "t5-v1.1"])
def test_pruned_heads_equal_masked_heads_and_read_their_own_slice_of_the_shared_bias(tmp_path, proj):
    model = _model(tmp_path, proj=proj)
    table = model.layers[0].attention.relative_attention_bias.weight.detach().clone()
    ids, mask = padded_batch(90, [11, 4, 50], pad_id=0, seed=5, low=2)  # 50 tokens: the far buckets too
    removed = {0: [0, 2], 2: [1]}  # layer 0 (the table's owner) keeps heads 1 and 3: not a prefix of the bias
    masked_eager, masked_fast = _run_both(model, ids, mask, _mask(removed))
    model.prune_heads(removed)
    assert model.heads_per_layer() == [2, 4, 3] and model.num_heads == 4
    assert model.kept_heads() == [[1, 3], [0, 1, 2, 3], [0, 2, 3]]
    assert model.config.pruned_heads == {0: [0, 2], 2: [1]}
    attention = model.layers[0].attention  # 2 heads of d_kv 6: rows of q/k/v, columns of the output projection
    assert attention.query.weight.shape == (12, 32) and attention.output.weight.shape == (32, 12)
    assert attention.query.bias is None and attention.output.bias is None  # T5's linears stay bias-free
    assert torch.equal(attention.relative_attention_bias.weight, table)  # every head's column: all layers read it
    eager, fast = _run_both(model, ids, mask)
    _assert_hidden_close(eager, masked_eager, mask)
    _assert_hidden_close(fast, masked_fast, mask)
    # Each layer's maps: its remaining heads, equal to those heads' maps in the masked run (same bias rows).
    q = mask.bool()[:, None, :, None]
    for layer, (got, want) in enumerate(zip(eager.attentions, masked_eager.attentions)):
        assert got.shape[1] == model.heads_per_layer()[layer]
        kept = want[:, model.kept_heads()[layer]]
        assert (got - kept).abs().masked_select(q).max() < 1e-5, f"layer {layer}"


def test_pruning_in_steps_uses_the_original_numbering(tmp_path):
    model = _model(tmp_path, seed=1)
    ids, mask = padded_batch(90, [9, 6], pad_id=0, seed=2, low=2)
    reference, _ = _run_both(model, ids, mask, _mask({0: [1, 3], 1: [0]}))
    both, _ = _run_both(model, ids, mask, _mask({0: [1, 3, 2], 1: [0]}))
    model.prune_heads({0: [1]})
    model.prune_heads({0: [3], 1: [0]})
    model.prune_heads({0: [1]})  # already gone: nothing changes
    assert model.config.pruned_heads == {0: [1, 3], 1: [0]} and model.kept_heads()[0] == [0, 2]
    _assert_hidden_close(_run_both(model, ids, mask)[0], reference, mask)
    xi = torch.ones(3, 4)
    xi[0, 2] = 0.0
    xi[0, 1] = 123.0  # a removed head's entry is not read
    _assert_hidden_close(_run_both(model, ids, mask, xi)[0], both, mask)
    # (heads,) rows; 2e-6: a few float32 ulps at |x| ~ 7, the pruned and the masked product summing in other orders
    _assert_hidden_close(_run_both(model, ids, mask, torch.ones(4))[0], reference, mask, tol=2e-6)


def test_pruned_folder_saves_reloads_and_gives_students_its_heads(tmp_path):
    model = _model(tmp_path, seed=2)
    model.save_pretrained(tmp_path / "unpruned")
    assert "pruned_heads" not in json.loads((tmp_path / "unpruned" / "config.json").read_text())
    model.prune_heads({0: [2], 1: [0, 1, 2], 2: [3]})
    ids, mask = padded_batch(90, [7, 12], pad_id=0, seed=3, low=2)
    before, _ = _run_both(model, ids, mask)
    model.save_pretrained(tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert config["pruned_heads"] == {"0": [2], "1": [0, 1, 2], "2": [3]}
    again = ctxrep.load_model(tmp_path / "pruned")
    assert again.heads_per_layer() == [3, 1, 3] and again.kept_heads()[1] == [3]
    _assert_hidden_close(_run_both(again, ids, mask)[0], before, mask, tol=1e-6)
    # A student's layers keep the heads they had in the teacher; its first layer gets the whole table, whichever
    # teacher layer it copies.
    student = again.init_student([1, 2])
    assert student.heads_per_layer() == [1, 3] and student.config.pruned_heads == {0: [0, 1, 2], 1: [3]}
    table = again.layers[0].attention.relative_attention_bias.weight
    assert torch.equal(student.layers[0].attention.relative_attention_bias.weight, table)
    assert torch.equal(student.layers[0].attention.query.weight, again.layers[1].attention.query.weight)
    with torch.no_grad():
        out = student(ids, attention_mask=mask, output_attentions=True)
    assert [a.shape[1] for a in out.attentions] == [1, 3]
    assert student.init_student([0], hidden_size=16).heads_per_layer() == [4]  # narrower: fresh, every head


def test_bad_pruning_requests_are_refused_in_one_line(tmp_path):
    model = _model(tmp_path, seed=4)
    model.prune_heads({0: [0]})
    for request, message in [
        ({3: [0]}, r"no layer 3; this model has layers 0\.\.2"),
        ({0: [4]}, r"layer 0 has heads 0\.\.3 \(original numbering\), not \[4\]"),
        ({1: [1], 0: [1, 2, 3]}, "would remove all 4 heads of layer 0"),
    ]:
        with pytest.raises(ValueError, match=message) as e:
            model.prune_heads(request)
        assert "\n" not in str(e.value)
    assert model.heads_per_layer() == [3, 4, 4]  # a refused request changes nothing
    with pytest.raises(ValueError, match=r"head_mask has shape \(3, 5\)"):
        model(torch.tensor([[5, 6, 7]]), head_mask=torch.ones(3, 5))
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    (tmp_path / "full" / "config.json").write_text(json.dumps(config | {"pruned_heads": {"1": [0, 1, 2, 3]}}))
    with pytest.raises(CheckpointError, match=r"config\.json: pruned_heads removes all 4 heads of layer 1") as e:
        ctxrep.load_model(tmp_path / "full")
    assert "\n" not in str(e.value)


# ---- unpadded batches (modules/unpadding.py) ----------------------------------------------------------------------


def test_unpadded_batch_reads_the_padded_grids_bias(tmp_path):
    """Unpadded, the relative position bias (layer 0's table, read by every layer) and its padding mask stay on the
    padded grid: on a pruned model (each layer its kept heads' slice of the bias) with a left-padded row and a head
    mask, the states, maps and gradients (the bias table's and xi's too) are the padded run's at real tokens; a run
    stopped early (no final norm) too."""
    model = _model(tmp_path, seed=4)
    model.prune_heads({0: [2], 2: [0, 3]})
    ids, mask = padded_batch(90, [30, 9, 2], pad_id=0, seed=6, low=2)  # distances in the log buckets too
    ids[1], mask[1] = ids[1].roll(21), mask[1].roll(21)  # row 1 padded on the left: its 9 tokens in columns 21..29
    real = mask.bool()
    xi = _mask({1: [1]}).requires_grad_()
    runs, grads = {}, {}
    for share in (None, 0.0):  # None: never unpads; 0: always
        model.unpad_from = share
        model.zero_grad()
        xi.grad = None
        full = model(ids, attention_mask=mask, head_mask=xi, output_hidden_states=True, output_attentions=True)
        full.last_hidden_state[real].square().sum().backward()
        grads[share] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None} | {"xi": xi.grad}
        with torch.no_grad():
            runs[share] = full, model(ids, attention_mask=mask, num_layers=2, output_hidden_states=True)
    for padded, unpadded in zip(runs[None], runs[0.0], strict=True):  # all layers, then 2 without the final norm
        for layer, (a, b) in enumerate(zip(padded.hidden_states, unpadded.hidden_states, strict=True)):
            torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4, msg=f"hidden state {layer} differs")
            assert (b[~real] == 0).all(), f"hidden state {layer}: padding is not 0"
        assert torch.equal(unpadded.last_hidden_state, unpadded.hidden_states[-1])
    for layer, (a, b) in enumerate(zip(runs[None][0].attentions, runs[0.0][0].attentions, strict=True)):
        rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
        torch.testing.assert_close(b[rows], a[rows], atol=1e-5, rtol=1e-4, msg=f"attention {layer} differs")
    assert "layers.0.attention.relative_attention_bias.weight" in grads[None]
    assert grads[None].keys() == grads[0.0].keys()
    for name, g in grads[None].items():
        torch.testing.assert_close(grads[0.0][name], g, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
