"""DeBERTa-v2 / v3: parity with transformers' DebertaV2Model on tiny random configs (every hidden state and attention
map, padding in the batch), log buckets, round trips both ways, checkpoint layouts, the interface members, and head
pruning (pruned == masked, the original numbering, pruned folders, students, int8 on a pruned model)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

import ctxrep
from ctxrep.models.deberta_v2 import DebertaV2Config, DebertaV2Model, log_bucket_position
from ctxrep.models.loading import CheckpointError
from ctxrep.runtime import fast

COMMON = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    pad_token_id=0,
)
# v3's shape: log buckets, shared attention keys, LayerNorm-ed relative table, no absolute positions, no segments
V3 = dict(
    relative_attention=True,
    position_buckets=8,
    max_relative_positions=-1,
    pos_att_type="p2c|c2p",
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
    layer_norm_eps=1e-7,
)
CONFIGS = {
    "v3": V3,
    # v2-xlarge's: the convolution beside layer 1, separate position projections; plus segments, absolute
    # positions and narrower embeddings projected up
    "v2-conv": dict(
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=32,
        pos_att_type=["c2p", "p2c"],
        share_att_key=False,
        norm_rel_ebd="layer_norm",
        conv_kernel_size=3,
        conv_act="gelu",
        position_biased_input=True,
        type_vocab_size=2,
        embedding_size=16,
    ),
    # unbucketed relative positions clipped at k = 6, c2p only, no relative LayerNorm
    "c2p-only": dict(relative_attention=True, max_relative_positions=6, pos_att_type=["c2p"], type_vocab_size=2),
    "p2c-only": dict(relative_attention=True, max_relative_positions=6, pos_att_type="p2c", share_att_key=True),
    "absolute": dict(relative_attention=False, position_biased_input=True, type_vocab_size=2),
}


def padded_batch(vocab: int, pad: int, lengths=(14, 9, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = pad
    return ids, mask


def reference(kind: str, path) -> transformers.DebertaV2Model:
    torch.manual_seed(0)
    ref = transformers.DebertaV2Model(transformers.DebertaV2Config(**COMMON, **CONFIGS[kind])).eval()
    with torch.no_grad():  # LayerNorms and biases away from their 1 / 0 init, so that a swapped name shows
        for name, p in ref.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    ref.save_pretrained(path)
    return ref


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_parity_with_transformers(kind, tmp_path):
    ref = reference(kind, tmp_path)
    ours = ctxrep.load_model(tmp_path)
    assert type(ours) is DebertaV2Model and ours.family == "deberta-v2"
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    types = torch.zeros_like(ids)
    types[0, 7:] = 1
    types = types if ours.reads_segments else None
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True, output_attentions=True)
        b = ref(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)  # SDPA path
    real = mask.bool()
    assert len(a.hidden_states) == len(b.hidden_states) == 3
    for layer, (x, y, z) in enumerate(zip(a.hidden_states, b.hidden_states, fast.hidden_states)):
        assert torch.allclose(x[real], y[real], atol=1e-5), f"hidden state {layer} differs"
        assert torch.allclose(z[real], y[real], atol=1e-5), f"hidden state {layer} differs (SDPA)"
    for layer, (x, y) in enumerate(zip(a.attentions, b.attentions)):
        q = real[:, None, :, None].expand_as(x)  # rows of real query tokens
        assert torch.allclose(x[q], y[q], atol=1e-5), f"attention {layer} differs"
    assert torch.allclose(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5)


def test_log_buckets_match_transformers_and_the_paper():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    rel = torch.arange(-600, 601)[None, :]
    ours = log_bucket_position(rel, 256, 512)
    assert torch.equal(ours, make_log_bucket_position(rel, 256, 512))
    assert torch.equal(ours[0, 600 - 128 : 600 + 129], rel[0, 600 - 128 : 600 + 129].float())  # exact near 0
    assert torch.equal(ours, -ours.flip(-1))  # odd: delta(j, i) = -delta(i, j)
    assert ours[0, 600 - 511 : 600 + 512].abs().max() == 255  # up to max_position: 2 x 256 rows (clamped beyond)


def test_v3_checkpoint_layout_loads(tmp_path):
    """DeBERTa-v3's published pytorch_model.bin: DebertaV2ForMaskedLM-style keys under "deberta.", the MLM head
    (lm_predictions.*), and an absolute position table its config switches off."""
    torch.manual_seed(0)
    cfg = transformers.DebertaV2Config(**COMMON, **V3, legacy=False)
    mlm = transformers.DebertaV2ForMaskedLM(cfg).eval()
    state = {k: v.clone() for k, v in mlm.state_dict().items()}
    state["deberta.embeddings.position_embeddings.weight"] = torch.randn(64, 32)
    assert any(k.startswith("lm_predictions.") for k in state)
    cfg.save_pretrained(tmp_path)
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).last_hidden_state
        b = mlm.deberta(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)


@pytest.mark.parametrize("kind", ["v3", "v2-conv"])
def test_save_round_trip_loads_in_transformers(kind, tmp_path):
    reference(kind, tmp_path / "src")
    ours = ctxrep.load_model(tmp_path / "src")
    ours.save_pretrained(tmp_path / "out")
    ref = transformers.AutoModel.from_pretrained(tmp_path / "out").eval()
    assert type(ref) is transformers.DebertaV2Model
    again = ctxrep.load_model(tmp_path / "out")
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).last_hidden_state
        b = ref(ids, attention_mask=mask).last_hidden_state
        c = again(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)
    assert torch.equal(a, c)
    assert (
        load_file(tmp_path / "out" / "model.safetensors").keys()
        == load_file(tmp_path / "src" / "model.safetensors").keys()
    )


def test_unknown_missing_and_misshaped_weights_are_all_named(tmp_path):
    reference("v3", tmp_path / "src")
    shutil.copy(tmp_path / "src" / "config.json", tmp_path / "config.json")
    state = load_file(tmp_path / "src" / "model.safetensors")
    state["encoder.layer.0.attention.self.extra.weight"] = torch.zeros(2)
    del state["encoder.rel_embeddings.weight"]
    state["encoder.LayerNorm.weight"] = torch.ones(5)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        ctxrep.load_model(tmp_path)
    msg = str(e.value)
    assert "encoder.layer.0.attention.self.extra.weight" in msg
    assert "missing 1 weights: encoder.rel_embeddings.weight" in msg
    assert "encoder.LayerNorm.weight (5,) (expected (32,))" in msg


def test_bad_config_is_one_line(tmp_path):
    reference("v3", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"pos_att_type": ["c2p", "p2p"]}))
    with pytest.raises(CheckpointError, match=r"config.json: pos_att_type may hold 'c2p' and 'p2c', not \['p2p'\]"):
        ctxrep.load_model(tmp_path)


def test_interface_members(tmp_path):
    reference("v2-conv", tmp_path)
    m = ctxrep.load_model(tmp_path)
    assert (m.num_layers, m.num_heads, m.hidden_size, m.max_tokens) == (2, 4, 32, 64)
    assert m.reads_segments and m.input_embeddings().shape == (120, 16)
    depth = {n: m.layer_of(n) for n, _ in m.named_parameters()}
    assert depth["embeddings.word_embeddings.weight"] == 0 and depth["layers.1.output.bias"] == 2
    assert depth["conv.conv.weight"] == 1 and depth["rel_embeddings.weight"] == 2 == depth["rel_norm.weight"]
    with pytest.raises(ValueError, match="not a parameter"):
        m.layer_of("pooler.weight")
    assert m.can_prune_heads and m.can_distill
    # head_mask: a silenced head equals zeroing its slice of the context
    ids, mask = padded_batch(120, 0)
    xi = torch.ones(2, 4)
    xi[1, 2] = 0
    with torch.no_grad():
        masked = m(ids, attention_mask=mask, head_mask=xi).last_hidden_state
        m.layers[1].attention.output.weight[:, 16:24] = 0
        zeroed = m(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(masked, zeroed, atol=1e-6)


def test_student_copies_its_layers(tmp_path):
    reference("v3", tmp_path)
    teacher = ctxrep.load_model(tmp_path)
    student = teacher.init_student([1])
    assert student.num_layers == 1 and isinstance(student, DebertaV2Model)
    for ours, theirs in [(student.layers[0], teacher.layers[1]), (student.rel_norm, teacher.rel_norm)]:
        for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
            assert torch.equal(a, b)
    narrow = teacher.init_student([0, 1], hidden_size=16)
    assert narrow.hidden_size == 16 and narrow.config.intermediate_size == 24
    student.save_pretrained(tmp_path / "student")
    assert transformers.AutoModel.from_pretrained(tmp_path / "student").config.num_hidden_layers == 1


def test_too_long_input_is_refused_with_advice():
    model = DebertaV2Model(DebertaV2Config(**COMMON | {"max_position_embeddings": 16}, **V3))
    with pytest.raises(ValueError, match="longer than the model's 16 positions; ctxrep.Featurizer splits"):
        model(torch.ones(1, 17, dtype=torch.long))


# ---- head pruning ----------------------------------------------------------------------------------------------


def head_mask_of(heads: dict[int, list[int]], layers: int = 2, num_heads: int = 4) -> torch.Tensor:
    xi = torch.ones(layers, num_heads)
    for layer, hs in heads.items():
        xi[layer, hs] = 0.0
    return xi


def run(model, ids, mask, head_mask=None, output_attentions=False):
    with torch.no_grad():
        return model(
            ids,
            attention_mask=mask,
            output_hidden_states=True,
            output_attentions=output_attentions,
            head_mask=head_mask,
        )


def assert_same_states(a, b, mask, atol=1e-5) -> None:
    real = mask.bool()
    for layer, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        assert torch.allclose(x[real], y[real], atol=atol), f"hidden state {layer} differs"


@pytest.mark.parametrize("kind", ["v3", "v2-conv", "c2p-only", "p2c-only", "absolute"])
def test_pruned_model_equals_the_masked_one(kind, tmp_path):
    """Removing heads = running the whole model with those heads' xi = 0, on both attention paths; the relative
    table P is kept whole and read by the remaining heads through their own rows of the (position) projections."""
    reference(kind, tmp_path)
    model = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    gone = {0: [1, 2], 1: [0]}
    plain = run(model, ids, mask)
    masked = run(model, ids, mask, head_mask_of(gone), output_attentions=True)
    assert not torch.allclose(masked.last_hidden_state, plain.last_hidden_state, atol=1e-3)  # the heads mattered
    table = None if model.rel_embeddings is None else model.rel_embeddings.weight.clone()
    model.prune_heads(gone)
    assert model.heads_per_layer() == [2, 3] and model.kept_heads() == [[0, 3], [1, 2, 3]]
    assert model.config.pruned_heads == gone
    attention = model.layers[0].attention
    d = COMMON["hidden_size"] // COMMON["num_attention_heads"]
    assert attention.query.weight.shape == attention.value.weight.shape == (2 * d, 32)
    assert attention.output.weight.shape == (32, 2 * d)
    for projection in (attention.pos_key, attention.pos_query):  # v2's own W_{k,r}, W_{q,r} lose the rows too
        assert projection is None or projection.weight.shape == (2 * d, 32)
    assert (attention.pos_key is not None) == (kind in ("v2-conv", "c2p-only"))
    if table is not None:
        assert torch.equal(model.rel_embeddings.weight, table)  # shared by every layer: not pruned
    pruned = run(model, ids, mask, output_attentions=True)
    assert_same_states(pruned, masked, mask)
    assert_same_states(run(model, ids, mask), masked, mask)  # the SDPA path
    real = mask.bool()[:, None, :, None]
    for layer, kept in enumerate(model.kept_heads()):
        probs = pruned.attentions[layer]  # (batch, heads_per_layer()[layer], seq, seq)
        assert probs.shape[1] == model.heads_per_layer()[layer]
        q = real.expand_as(probs)
        assert torch.allclose(probs[q], masked.attentions[layer][:, kept][q], atol=1e-5)


def test_pruning_in_two_steps_uses_the_original_numbering(tmp_path):
    reference("v2-conv", tmp_path)
    model = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    expected = run(model, ids, mask, head_mask_of({0: [1, 2], 1: [3]}))
    model.prune_heads({0: [1]})
    model.prune_heads({0: [2, 1], 1: [3]})  # head 2 is still called 2; naming head 1 again is allowed
    assert model.kept_heads() == [[0, 3], [0, 1, 2]] and model.config.pruned_heads == {0: [1, 2], 1: [3]}
    assert_same_states(run(model, ids, mask), expected, mask)
    # head_mask stays (layers, num_heads) in the original numbering; entries of removed heads are not read
    xi = torch.ones(2, 4)
    xi[0, 1], xi[1, 3] = 123.0, 0.0
    xi[0, 3] = 0.0
    assert_same_states(run(model, ids, mask, xi), run(model, ids, mask, head_mask_of({0: [3]})), mask)
    both = run(model, ids, mask, head_mask_of({0: [3]}))
    assert not torch.allclose(both.last_hidden_state, run(model, ids, mask).last_hidden_state, atol=1e-3)


def test_pruned_folder_reloads_in_ctxrep(tmp_path):
    reference("v3", tmp_path / "src")
    model = ctxrep.load_model(tmp_path / "src")
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    model.prune_heads({1: [0, 1, 2]})
    model.save_pretrained(tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert config["pruned_heads"] == {"1": [0, 1, 2]}  # transformers 4.x's field: string keys in JSON
    assert load_file(tmp_path / "pruned" / "model.safetensors")[
        "encoder.layer.1.attention.output.dense.weight"
    ].shape == (
        32,
        8,
    )
    again = ctxrep.load_model(tmp_path / "pruned")
    assert again.heads_per_layer() == [4, 1] and again.config.pruned_heads == {1: [0, 1, 2]}
    a, b = run(model, ids, mask, output_attentions=True), run(again, ids, mask, output_attentions=True)
    assert_same_states(a, b, mask, atol=0)
    assert b.attentions[1].shape[1] == 1
    # An unpruned model writes no pruned_heads, so transformers 5 reads its folder as before.
    ctxrep.load_model(tmp_path / "src").save_pretrained(tmp_path / "plain")
    assert "pruned_heads" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_bad_pruning_requests_are_refused_in_one_line(tmp_path):
    reference("v3", tmp_path / "src")
    model = ctxrep.load_model(tmp_path / "src")
    with pytest.raises(ValueError, match=r"layer 0 has heads 0\.\.3 \(original numbering\), not \[4\]"):
        model.prune_heads({0: [0, 4]})
    with pytest.raises(ValueError, match="would remove all 4 heads of layer 1; keep at least one head per layer"):
        model.prune_heads({0: [0], 1: [0, 1, 2, 3]})
    with pytest.raises(ValueError, match=r"no layer 2; this model has layers 0\.\.1"):
        model.prune_heads({2: [0]})
    assert model.heads_per_layer() == [4, 4] and model.config.pruned_heads == {}  # nothing half-done
    model.prune_heads({0: [0, 1, 2]})
    with pytest.raises(ValueError, match="would remove all 4 heads of layer 0"):
        model.prune_heads({0: [3]})
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    with pytest.raises(ValueError, match=r"head_mask has shape \(2, 1\); expected \(num_layers, num_heads\)"):
        model(ids, attention_mask=mask, head_mask=torch.ones(2, 1))  # the pruned layer 0's count is not the width
    model.save_pretrained(tmp_path / "bad")
    file = tmp_path / "bad" / "config.json"
    config = json.loads(file.read_text())
    file.write_text(json.dumps(config | {"pruned_heads": {"5": [0]}}))
    with pytest.raises(CheckpointError, match=r"config\.json: pruned_heads names layer 5, but the model has layers"):
        ctxrep.load_model(tmp_path / "bad")
    file.write_text(json.dumps(config | {"pruned_heads": {"0": [0, 1, 2, 3]}}))
    with pytest.raises(CheckpointError, match="removes all 4 heads of layer 0; keep at least one head per layer"):
        ctxrep.load_model(tmp_path / "bad")
    quantized = fast.quantize_int8(model, [{"input_ids": ids, "attention_mask": mask}])
    with pytest.raises(ValueError, match=r"attention is quantized \(fast.quantize_int8\); prune the float model") as e:
        quantized.prune_heads({1: [0]})
    assert "\n" not in str(e.value) and quantized.heads_per_layer() == [1, 4]


def test_student_keeps_the_pruned_heads_of_its_layers(tmp_path):
    reference("v2-conv", tmp_path)
    teacher = ctxrep.load_model(tmp_path)
    teacher.prune_heads({0: [3], 1: [0, 2]})
    student = teacher.init_student([1])
    assert student.config.pruned_heads == {0: [0, 2]} and student.kept_heads() == [[1, 3]]
    for a, b in zip(student.layers[0].state_dict().values(), teacher.layers[1].state_dict().values()):
        assert torch.equal(a, b)
    narrow = teacher.init_student([0, 1], hidden_size=16)
    assert narrow.config.pruned_heads == {} and narrow.heads_per_layer() == [4, 4]


@pytest.mark.parametrize("kind", ["v3", "v2-conv"])
def test_int8_runs_on_a_pruned_model(kind, tmp_path):
    """quantize_int8 on a pruned model: v2's fused query / key / value hold the kept heads' rows only; v3 (shared
    attention keys, nothing fused) quantizes each projection. Close to the float model, heads unchanged."""
    reference(kind, tmp_path)
    model = ctxrep.load_model(tmp_path)
    model.prune_heads({0: [1, 2], 1: [0]})
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    quantized = fast.quantize_int8(model, [batch])
    assert quantized.heads_per_layer() == [2, 3]
    fused = [quantized.get_submodule(n).query_key_value for n in quantized.fusable_qkv_modules()]
    assert len(fused) == (2 if kind == "v2-conv" else 0)
    assert all(isinstance(f, fast.Int8Linear) and f.out_features == 3 * 2 * 8 for f in fused[:1])
    with torch.no_grad():
        a = quantized.encode(batch, output_attentions=True)
        b = model.encode(batch)
    assert [p.shape[1] for p in a.attentions] == [2, 3]
    real = mask.bool()
    cos = F.cosine_similarity(a.last_hidden_state[real], b.last_hidden_state[real], dim=-1)
    assert cos.min() > 0.99, cos.min()


# ---- unpadded batches (modules/unpadding.py) ----------------------------------------------------------------------


def padded_and_unpadded(model, ids, mask, **kw) -> dict:
    """{None: the padded run, 0.0: the unpadded one} of model(ids, ...), with every hidden state and map."""
    out = {}
    for share in (None, 0.0):  # None: never unpads; 0: always
        model.unpad_from = share
        out[share] = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, **kw)
    return out


def assert_unpadded_equals_padded(out: dict, mask: torch.Tensor) -> None:
    real = mask.bool()
    for layer, (a, b) in enumerate(zip(out[None].hidden_states, out[0.0].hidden_states, strict=True)):
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4, msg=f"hidden state {layer} differs")
        assert (b[~real] == 0).all(), f"hidden state {layer}: padding is not 0"
    for layer, (a, b) in enumerate(zip(out[None].attentions, out[0.0].attentions, strict=True)):
        rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
        torch.testing.assert_close(b[rows], a[rows], atol=1e-5, rtol=1e-4, msg=f"attention {layer} differs")


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_unpadded_batch_equals_the_padded_run(kind, tmp_path):
    """Unpadded, delta(i, j) of c2p / p2c, the absolute positions and the convolution's neighbours (v2-conv) are
    still those of the padded grid: with a left-padded row, segments and a head mask, the states, maps and gradients
    (xi's too) are the padded run's at real tokens; the int8 path's fused query / key / value too (per-row scales,
    so padding rows do not change a real row's)."""
    reference(kind, tmp_path)
    model = ctxrep.load_model(tmp_path).eval()
    ids, mask = padded_batch(COMMON["vocab_size"], 0)
    ids[1], mask[1] = ids[1].roll(5), mask[1].roll(5)  # row 1 padded on the left: its 9 tokens in columns 5..13
    types = (torch.arange(ids.shape[1]) >= 6).long() * mask if model.reads_segments else None  # (batch, seq)
    xi = head_mask_of({0: [1], 1: [0, 3]}).requires_grad_()
    out, grads = {}, {}
    for share in (None, 0.0):  # None: never unpads; 0: always
        model.unpad_from = share
        model.zero_grad()
        xi.grad = None
        kw = dict(token_type_ids=types, head_mask=xi, output_hidden_states=True, output_attentions=True)
        out[share] = model(ids, attention_mask=mask, **kw)
        out[share].last_hidden_state[mask.bool()].square().sum().backward()
        grads[share] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None} | {"xi": xi.grad}
    assert_unpadded_equals_padded(out, mask)
    assert grads[None].keys() == grads[0.0].keys()
    for name, g in grads[None].items():
        torch.testing.assert_close(grads[0.0][name], g, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
    if model.fusable_qkv_modules():
        batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        quantized = fast.quantize_int8(model, [batch], per_row=True)
        assert quantized.layers[0].attention.query_key_value is not None
        with torch.no_grad():
            assert_unpadded_equals_padded(padded_and_unpadded(quantized, ids, mask, token_type_ids=types), mask)
