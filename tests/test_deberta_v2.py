"""DeBERTa-v2 / v3: parity with transformers' DebertaV2Model on tiny random configs (every hidden state and attention
map, padding in the batch), log buckets, round trips both ways, checkpoint layouts, the interface members."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import ctxrep
from ctxrep.models.deberta_v2 import DebertaV2Config, DebertaV2Model, log_bucket_position
from ctxrep.models.loading import CheckpointError

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
    assert not m.can_prune_heads and m.can_distill
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
