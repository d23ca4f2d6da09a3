"""MPNet (models/mpnet.py) against transformers' MPNetModel: every hidden state and attention map with padding
in the batch (the relative position bias shared by every layer), task checkpoints, saving back."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _parity import assert_featurizer_matches_transformers, assert_matches, padded_batch

import ctxrep
from ctxrep.models.folders import CheckpointError
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


# ---- head pruning (modules/heads.py): the shared relative position bias is sliced per layer, never pruned ----------


def _model(tmp_path, seed: int = 0):
    torch.manual_seed(seed)
    hf = transformers.MPNetModel(_hf_config())
    _random_bias(hf)  # large and different per head, so that a wrong slice of the bias shows
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


def test_pruned_heads_equal_masked_heads_and_read_their_own_slice_of_the_shared_bias(tmp_path):
    model = _model(tmp_path)
    table = model.relative_attention_bias.weight.detach().clone()
    ids, mask = padded_batch(100, [11, 4, 8], pad_id=1, seed=5, low=4)
    removed = {0: [0, 2], 2: [1]}  # layer 0 keeps heads 1 and 3: not a prefix of the bias's heads
    masked_eager, masked_fast = _run_both(model, ids, mask, _mask(removed))
    model.prune_heads(removed)
    assert model.heads_per_layer() == [2, 4, 3] and model.num_heads == 4
    assert model.kept_heads() == [[1, 3], [0, 1, 2, 3], [0, 2, 3]]
    assert model.config.pruned_heads == {0: [0, 2], 2: [1]}
    attention = model.layers[0].attention  # 2 heads of 8 dims: rows of q/k/v, columns of the output projection
    assert attention.query.weight.shape == (16, 32) and attention.output.weight.shape == (32, 16)
    assert torch.equal(model.relative_attention_bias.weight, table)  # the shared table keeps every head
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
    ids, mask = padded_batch(100, [9, 6], pad_id=1, seed=2, low=4)
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
    _assert_hidden_close(_run_both(model, ids, mask, torch.ones(4))[0], reference, mask, tol=1e-6)  # (heads,) rows


def test_pruned_folder_saves_reloads_and_gives_students_its_heads(tmp_path):
    model = _model(tmp_path, seed=2)
    model.save_pretrained(tmp_path / "unpruned")
    assert "pruned_heads" not in json.loads((tmp_path / "unpruned" / "config.json").read_text())
    model.prune_heads({1: [0, 1, 2], 2: [3]})
    ids, mask = padded_batch(100, [7, 12], pad_id=1, seed=3, low=4)
    before, _ = _run_both(model, ids, mask)
    model.save_pretrained(tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert config["pruned_heads"] == {"1": [0, 1, 2], "2": [3]}
    again = ctxrep.load_model(tmp_path / "pruned")
    assert again.heads_per_layer() == [4, 1, 3] and again.kept_heads()[1] == [3]
    _assert_hidden_close(_run_both(again, ids, mask)[0], before, mask, tol=1e-6)
    student = again.init_student([0, 2])  # layers keep the heads they had in the teacher
    assert student.heads_per_layer() == [4, 3] and student.config.pruned_heads == {1: [3]}
    assert torch.equal(student.layers[1].attention.query.weight, again.layers[2].attention.query.weight)
    assert student.init_student([0], hidden_size=16).heads_per_layer() == [4]  # narrower: fresh, every head


def test_quantized_int8_runs_on_a_pruned_model_and_pruning_it_is_refused(tmp_path):
    from ctxrep.runtime import fast

    model = _model(tmp_path, seed=3)
    model.prune_heads({0: [1, 2], 2: [0]})
    ids, mask = padded_batch(100, [10, 6], pad_id=1, seed=4, low=4)
    q = fast.quantize_int8(model, [{"input_ids": ids, "attention_mask": mask}])
    assert q.layers[0].attention.query_key_value is not None  # the fused q/k/v product of the kept heads
    with torch.no_grad():
        want = model(ids, attention_mask=mask).last_hidden_state
        got = q(ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    cos = torch.nn.functional.cosine_similarity(got[keep], want[keep], dim=-1)
    assert got.shape == want.shape and cos.min() > 0.95
    with pytest.raises(ValueError, match="prune the float model, then quantize it") as e:
        q.prune_heads({1: [0]})
    assert "\n" not in str(e.value)


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
    with pytest.raises(ValueError, match=r"head_mask has shape \(2, 4\)"):
        model(torch.tensor([[5, 6, 7]]), head_mask=torch.ones(2, 4))
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    (tmp_path / "full" / "config.json").write_text(json.dumps(config | {"pruned_heads": {"5": [0]}}))
    with pytest.raises(CheckpointError, match=r"config\.json: pruned_heads names layer 5") as e:
        ctxrep.load_model(tmp_path / "full")
    assert "\n" not in str(e.value)


# ---- unpadded batches (modules/unpadding.py): positions and the shared bias come from the padded grid -------------


def test_unpadded_batches_give_the_padded_run_with_pruned_heads_and_left_padding(tmp_path):
    """Pruned layers (each adds its own slice of the shared bias), a head mask, num_layers and a left-padded row
    (its positions count from its first real token on the padded grid): the padded run at real tokens, 0 at padding."""
    model = _model(tmp_path, seed=6)
    model.prune_heads({0: [0, 2], 2: [1]})
    ids, mask = padded_batch(100, [12, 3, 7, 1], pad_id=1, seed=7, low=4)  # 52% padding
    ids[1], mask[1] = ids[1].roll(9), mask[1].roll(9)  # row 1 left-padded: 9 pads, then 3 tokens
    real = mask.bool()
    xi = torch.ones(3, 4)
    xi[1, 3] = 0.0
    for kwargs in [dict(head_mask=xi, output_attentions=True), dict(num_layers=2)]:
        out = {}
        for path, share in (("padded", None), ("unpadded", 0.0)):
            model.unpad_from = share
            with torch.no_grad():
                out[path] = model(ids, attention_mask=mask, output_hidden_states=True, **kwargs)
        padded, unpadded = out["padded"], out["unpadded"]
        assert model.unpadding(mask) is not None and len(unpadded.hidden_states) == kwargs.get("num_layers", 3) + 1
        for layer, (a, b) in enumerate(zip(padded.hidden_states, unpadded.hidden_states)):
            assert (b - a).abs()[real].max() < 1e-5, f"hidden state {layer} differs ({kwargs})"
            assert (b[~real] == 0).all()
        for layer, (a, b) in enumerate(zip(padded.attentions or (), unpadded.attentions or ())):
            rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
            assert (b - a).abs()[rows].max() < 1e-5, f"attention {layer} differs"
        if padded.pooler_output is not None:
            assert (unpadded.pooler_output - padded.pooler_output)[[0, 2, 3]].abs().max() < 1e-5
