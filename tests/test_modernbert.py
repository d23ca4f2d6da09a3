"""ModernBERT: parity with transformers' ModernBertModel on tiny random configs (every hidden state and attention
map, padding in the batch, local windows shorter than the batch), both config.json formats, round trips both ways,
the MLM checkpoint layout, the interface members, head pruning, the packed (unpadded) path against the padded one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import ctxrep
from ctxrep.models.loading import CheckpointError
from ctxrep.models.modernbert import GLOBAL, LOCAL, ModernBertConfig, ModernBertModel

COMMON = dict(
    vocab_size=120,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
)
CONFIGS = {
    # the published shape: bias-free, global every 3rd layer, a window of +-2 (shorter than the batch)
    "base": dict(local_attention=4, global_attn_every_n_layers=3),
    # biases everywhere, global every 2nd layer, other rope bases, a window of +-3
    "biases": dict(
        local_attention=6,
        global_attn_every_n_layers=2,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        global_rope_theta=5000.0,
        local_rope_theta=500.0,
    ),
    # a window wider than every sequence: local layers attend like global ones (but with their own rope base)
    "wide-window": dict(local_attention=64, global_attn_every_n_layers=2, hidden_activation="gelu_pytorch_tanh"),
}


def padded_batch(vocab: int = 120, pad: int = 0, lengths=(14, 9, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = pad
    return ids, mask


def reference(kind: str, path) -> transformers.ModernBertModel:
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(**COMMON, **CONFIGS[kind])
    ref = transformers.ModernBertModel(cfg).eval()
    with torch.no_grad():  # norms and biases away from their 1 / 0 init, so that a swapped name shows
        for name, p in ref.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    ref.save_pretrained(path)
    return transformers.ModernBertModel.from_pretrained(path, attn_implementation="eager").eval()  # attention maps


def assert_parity(ours, ref, ids, mask) -> None:
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        b = ref(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask, output_hidden_states=True)  # SDPA path
    real = mask.bool()
    L = ours.num_layers
    assert len(a.hidden_states) == len(b.hidden_states) == L + 1
    # entry L: the final norm (transformers >= 5's hidden_states[L]; 4.x gave the pre-norm stream there)
    want = list(b.hidden_states[:L]) + [b.last_hidden_state]
    for layer, (x, y, z) in enumerate(zip(a.hidden_states, want, fast.hidden_states)):
        assert torch.allclose(x[real], y[real], atol=1e-5), f"hidden state {layer} differs"
        assert torch.allclose(z[real], y[real], atol=1e-5), f"hidden state {layer} differs (SDPA)"
    assert len(a.attentions) == len(b.attentions) == L
    for layer, (x, y) in enumerate(zip(a.attentions, b.attentions)):
        q = real[:, None, :, None].expand_as(x)  # rows of real query tokens
        assert torch.allclose(x[q], y[q], atol=1e-5), f"attention {layer} differs"
    assert torch.allclose(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5)


# ModernBertModel.unpad_from for each path: above 1 never packs, 0 always does
PATHS = {"padded": 2.0, "packed": 0.0}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_parity_with_transformers(kind, path, tmp_path):
    ref = reference(kind, tmp_path)
    ours = ctxrep.load_model(tmp_path)
    ours.unpad_from = PATHS[path]
    assert type(ours) is ModernBertModel and ours.family == "modernbert"
    assert_parity(ours, ref, *padded_batch())
    assert_parity(ours, ref, *padded_batch(lengths=(5, 5)))  # no padding


def test_local_layers_see_only_their_window(tmp_path):
    reference("base", tmp_path)
    ours = ctxrep.load_model(tmp_path)
    assert ours.config.layer_types == [GLOBAL, LOCAL, LOCAL, GLOBAL]
    ids, mask = padded_batch()
    with torch.no_grad():
        att = ours(ids, attention_mask=mask, output_attentions=True).attentions
    i, j = torch.meshgrid(torch.arange(14), torch.arange(14), indexing="ij")
    outside = (i - j).abs() > 2
    assert (att[1][0][:, outside] == 0).all() and (att[0][0][:, outside] > 0).all()
    assert (att[3][1][:, :9, 9:] == 0).all()  # padding keys get nothing in a global layer either


def test_published_config_format_loads(tmp_path):
    """ModernBERT-base's config.json as published (transformers 4.48): global_attn_every_n_layers and the two rope
    thetas instead of layer_types / rope_parameters; the MLM checkpoint (model. prefix, head, decoder)."""
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(**COMMON, **CONFIGS["biases"])
    mlm = transformers.ModernBertForMaskedLM(cfg).eval()
    mlm.save_pretrained(tmp_path)
    published = {k: v for k, v in json.loads((tmp_path / "config.json").read_text()).items()}
    published.pop("layer_types", None)  # transformers >= 5 writes these two
    published.pop("rope_parameters", None)
    published |= dict(global_rope_theta=5000.0, local_rope_theta=500.0, global_attn_every_n_layers=2)
    published |= dict(architectures=["ModernBertForMaskedLM"], position_embedding_type="absolute", layer_norm_eps=1e-5)
    (tmp_path / "config.json").write_text(json.dumps(published))
    assert any(k.startswith("model.") for k in load_file(tmp_path / "model.safetensors"))
    ours = ctxrep.load_model(tmp_path)
    assert ours.config.layer_types == [GLOBAL, LOCAL, GLOBAL, LOCAL]
    assert (ours.config.global_rope_theta, ours.config.local_rope_theta) == (5000.0, 500.0)
    ref = transformers.ModernBertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()  # read alike
    assert_parity(ours, ref, *padded_batch())


@pytest.mark.parametrize("kind", ["base", "biases"])
def test_save_round_trip_loads_in_transformers(kind, tmp_path):
    reference(kind, tmp_path / "src")
    ours = ctxrep.load_model(tmp_path / "src")
    ours.save_pretrained(tmp_path / "out")
    ref = transformers.AutoModel.from_pretrained(tmp_path / "out").eval()
    assert type(ref) is transformers.ModernBertModel
    # transformers >= 5 reads layer_types; 4.x builds the same pattern from global_attn_every_n_layers
    assert getattr(ref.config, "layer_types", ours.config.layer_types) == ours.config.layer_types
    again = ctxrep.load_model(tmp_path / "out")
    ids, mask = padded_batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).last_hidden_state
        b = ref(ids, attention_mask=mask).last_hidden_state
        c = again(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)
    assert torch.equal(a, c)
    saved = load_file(tmp_path / "out" / "model.safetensors").keys()
    assert saved == load_file(tmp_path / "src" / "model.safetensors").keys()


def test_unknown_missing_and_misshaped_weights_are_all_named(tmp_path):
    reference("base", tmp_path / "src")
    shutil.copy(tmp_path / "src" / "config.json", tmp_path / "config.json")
    state = load_file(tmp_path / "src" / "model.safetensors")
    state["layers.0.attn_norm.weight"] = torch.ones(32)  # layer 0 has none
    del state["final_norm.weight"]
    state["layers.2.mlp.Wi.weight"] = torch.ones(40, 32)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        ctxrep.load_model(tmp_path)
    msg = str(e.value)
    assert "1 unknown weights: layers.0.attn_norm.weight" in msg
    assert "missing 1 weights: final_norm.weight" in msg
    assert "layers.2.mlp.Wi.weight (40, 32) (expected (80, 32))" in msg


def test_bad_config_is_one_line(tmp_path):
    reference("base", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="rope_type 'yarn': ctxrep implements plain RoPE"):
        ctxrep.load_model(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rope_parameters"]
    cfg["layer_types"] = ["full_attention", "chunked_attention", "full_attention", "full_attention"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json: layer_types must name"):
        ctxrep.load_model(tmp_path)


def test_interface_members(tmp_path):
    reference("base", tmp_path)
    m = ctxrep.load_model(tmp_path)
    assert (m.num_layers, m.num_heads, m.hidden_size, m.max_tokens) == (4, 4, 32, 64)
    assert not m.reads_segments and m.input_embeddings().shape == (120, 32)
    assert ModernBertConfig().max_position_embeddings == 8192  # the published models' max_tokens
    depth = {n: m.layer_of(n) for n, _ in m.named_parameters()}
    assert depth["embeddings.norm.weight"] == 0 and depth["layers.0.attn.Wqkv.weight"] == 1
    assert depth["layers.3.mlp.Wo.weight"] == 4 == depth["final_norm.weight"]
    assert sorted(set(depth.values())) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="not a parameter"):
        m.layer_of("layers.4.attn.Wo.weight")
    assert m.can_prune_heads and m.can_distill
    ids, mask = padded_batch()
    xi = torch.ones(4, 4)
    xi[2, 1] = 0
    with torch.no_grad():
        masked = m(ids, attention_mask=mask, head_mask=xi).last_hidden_state
        m.layers[2].attn.Wo.weight[:, 8:16] = 0
        zeroed = m(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(masked, zeroed, atol=1e-6)


def test_student_keeps_layer_kinds_and_starts_at_layer_0(tmp_path):
    reference("base", tmp_path)
    teacher = ctxrep.load_model(tmp_path)
    student = teacher.init_student([0, 2])
    assert student.config.layer_types == [GLOBAL, LOCAL] and student.layers[0].attn_norm is None
    for a, b in zip(student.layers[1].state_dict().values(), teacher.layers[2].state_dict().values()):
        assert torch.equal(a, b)
    student.save_pretrained(tmp_path / "student")
    ref = transformers.AutoModel.from_pretrained(tmp_path / "student").eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        a, b = student(ids, attention_mask=mask).last_hidden_state, ref(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)
    with pytest.raises(ValueError, match="starts at the teacher's layer 0, not 1"):
        teacher.init_student([1, 3])
    assert teacher.init_student([0, 3], hidden_size=16).config.intermediate_size == 20


def test_pre_split_words_get_the_pieces_of_running_text(tmp_path):
    """ModernBERT's tokenizer.json is byte-level BPE without a prefix space: in running text every word but the
    first carries its space ("Ġdog"); ctxrep, which encodes pre-split words, gives them the same pieces."""
    from _families2 import CORPUS, modernbert_dir

    from ctxrep.models.loading import load_encoder

    folder = modernbert_dir(tmp_path / "m")
    tok = load_encoder(folder).tokenizer
    assert tok.space_before_words
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    for text in CORPUS + ["Héllo wörld, ça va? 東京 🙂 x"]:
        pieces = tok.encode_words([text.split()])[0]
        assert tok.build_inputs(pieces.ids)[0] == ref(text)["input_ids"], text
        assert sorted(set(pieces.word_ids)) == list(range(len(text.split())))
    pair = tok.build_inputs(tok.encode_words([["a", "cat"]])[0].ids, tok.encode_words([["the", "dog"]])[0].ids)[0]
    assert pair == ref("a cat", "the dog")["input_ids"]


def test_too_long_input_is_refused_with_advice():
    model = ModernBertModel(ModernBertConfig(**COMMON | {"max_position_embeddings": 16}))
    with pytest.raises(ValueError, match="longer than the model's 16 positions; ctxrep.Featurizer splits"):
        model(torch.ones(1, 17, dtype=torch.long))


# ---- head pruning ----------------------------------------------------------------------------------------------


def test_pruned_heads_equal_masked_heads(tmp_path):
    """Pruning removes Wqkv rows in each third and Wo columns: the same as the unpruned model with those heads' mask
    at 0, in global (0, 3) and local (1, 2) layers, with padding; a second request uses the original numbering."""
    reference("biases", tmp_path)  # attention biases: the rows of the bias follow the weight's
    model = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch()
    xi = torch.ones(4, 4)
    xi[0, [1, 2]] = xi[1, 3] = xi[2, [0, 1, 3]] = xi[3, 1] = 0
    with torch.no_grad():
        masked = model(ids, attention_mask=mask, head_mask=xi, output_hidden_states=True).hidden_states
        model.prune_heads({0: [1], 2: [1, 3]})
        assert model.kept_heads() == [[0, 2, 3], [0, 1, 2, 3], [0, 2], [0, 1, 2, 3]]
        model.prune_heads({0: [2, 1], 1: [3], 2: [0], 3: [1]})  # head 1 of layer 0 again: ignored
        out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        # the full head mask still works on a pruned model: rows of pruned heads are not read
        again = model(ids, attention_mask=mask, head_mask=xi, output_hidden_states=True).hidden_states
    assert model.heads_per_layer() == [2, 3, 1, 3] and model.kept_heads() == [[0, 3], [0, 1, 2], [2], [0, 2, 3]]
    assert model.config.pruned_heads == {0: [1, 2], 1: [3], 2: [0, 1, 3], 3: [1]}
    assert model.num_heads == 4  # the original numbering's width
    assert model.layers[2].attn.Wqkv.weight.shape == (3 * 8, 32) and model.layers[2].attn.Wo.weight.shape == (32, 8)
    assert model.layers[2].attn.Wqkv.bias.shape == (3 * 8,)
    for layer, (a, b, c) in enumerate(zip(out.hidden_states, masked, again)):
        assert torch.allclose(a, b, atol=1e-5), f"hidden state {layer} differs"
        assert torch.allclose(c, b, atol=1e-5), f"hidden state {layer} differs (head_mask on the pruned model)"
    assert [a.shape[1] for a in out.attentions] == model.heads_per_layer()


def test_pruned_folder_round_trip(tmp_path):
    reference("base", tmp_path / "src")
    model = ctxrep.load_model(tmp_path / "src")
    model.prune_heads({1: [0, 2], 3: [3]})
    model.save_pretrained(tmp_path / "pruned")
    saved = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert saved["pruned_heads"] == {"1": [0, 2], "3": [3]}
    again = ctxrep.load_model(tmp_path / "pruned")
    assert again.heads_per_layer() == [4, 2, 4, 3] and again.kept_heads()[1] == [1, 3]
    ids, mask = padded_batch()
    with torch.no_grad():
        a, b = again(ids, attention_mask=mask).last_hidden_state, model(ids, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b)
    ModernBertModel(ModernBertConfig(**COMMON)).save_pretrained(tmp_path / "fresh")  # nothing pruned: no field
    assert "pruned_heads" not in json.loads((tmp_path / "fresh" / "config.json").read_text())


def test_student_keeps_the_pruned_heads_of_its_layers(tmp_path):
    reference("base", tmp_path)
    teacher = ctxrep.load_model(tmp_path)
    teacher.prune_heads({0: [3], 2: [0, 1]})
    student = teacher.init_student([0, 2])
    assert student.config.pruned_heads == {0: [3], 1: [0, 1]} and student.heads_per_layer() == [3, 2]
    assert torch.equal(student.layers[1].attn.Wqkv.weight, teacher.layers[2].attn.Wqkv.weight)
    narrow = teacher.init_student([0, 2], hidden_size=16)
    assert narrow.config.pruned_heads == {} and narrow.heads_per_layer() == [4, 4]


def test_bad_pruning_requests_are_refused_in_one_line(tmp_path):
    reference("base", tmp_path)
    model = ctxrep.load_model(tmp_path)
    model.prune_heads({1: [0, 1]})
    for request, message in [
        ({4: [0]}, r"prune_heads: no layer 4; this model has layers 0..3"),
        ({0: [4]}, r"prune_heads: layer 0 has heads 0..3 \(original numbering\), not \[4\]"),
        ({1: [2, 3]}, r"prune_heads: that would remove all 4 heads of layer 1; keep at least one head per layer"),
    ]:
        with pytest.raises(ValueError, match=message) as e:
            model.prune_heads(request)
        assert "\n" not in str(e.value)
    assert model.heads_per_layer() == [4, 2, 4, 4]  # nothing changed by a refused request
    with pytest.raises(ValueError, match=r"head_mask has shape \(4, 2\); expected \(num_layers, num_heads\)"):
        model(torch.tensor([[3, 4]]), head_mask=torch.ones(4, 2))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["pruned_heads"] = {"2": [0, 1, 2, 3]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json: pruned_heads removes all 4 heads of layer 2") as e:
        ctxrep.load_model(tmp_path)
    assert "\n" not in str(e.value)


# ---- packed (unpadded) batches ---------------------------------------------------------------------------------


def run_both(model, ids, mask, **kwargs):
    out = {}
    with torch.no_grad():
        for path, share in PATHS.items():
            model.unpad_from = share
            out[path] = model(ids, attention_mask=mask, **kwargs)
    return out["padded"], out["packed"]


def test_packed_batches_give_the_padded_hidden_states(tmp_path):
    """Much padding, local windows (+-2) and global layers: every hidden state and attention row of a real token
    as the padded path gives it (with output_attentions, a head mask and num_layers too); 0 at padding."""
    reference("biases", tmp_path)
    model = ctxrep.load_model(tmp_path)
    ids, mask = padded_batch(lengths=(14, 2, 9, 1, 3))  # 63% padding, one sequence shorter than the window
    real = mask.bool()
    xi = torch.ones(4, 4)
    xi[1, 2] = xi[2, [0, 3]] = 0
    for kwargs in [{}, dict(output_attentions=True, head_mask=xi), dict(num_layers=3)]:
        padded, packed = run_both(model, ids, mask, output_hidden_states=True, **kwargs)
        assert len(packed.hidden_states) == len(padded.hidden_states) == kwargs.get("num_layers", 4) + 1
        for layer, (a, b) in enumerate(zip(padded.hidden_states, packed.hidden_states)):
            assert b.shape == a.shape == (5, 14, 32)
            assert torch.allclose(a[real], b[real], atol=1e-5), f"hidden state {layer} differs ({kwargs})"
            assert (b[~real] == 0).all()
        assert torch.equal(packed.last_hidden_state, packed.hidden_states[-1])
        if kwargs.get("output_attentions"):
            for layer, (a, b) in enumerate(zip(padded.attentions, packed.attentions)):
                rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
                assert torch.allclose(a[rows], b[rows], atol=1e-5), f"attention {layer} differs"
    model.prune_heads({0: [1], 3: [0, 2]})  # pruned layers pack alike
    padded, packed = run_both(model, ids, mask)
    assert torch.allclose(padded.last_hidden_state[real], packed.last_hidden_state[real], atol=1e-5)


def test_the_padding_share_chooses_the_path(tmp_path):
    reference("base", tmp_path)
    model = ctxrep.load_model(tmp_path)
    share = model.unpad_from
    assert 0 < share < 1
    ids, mask = padded_batch(lengths=(10, 10, 10, 10))
    assert model.unpadding(mask) is None and model.unpadding(None) is None  # no padding
    _, few = padded_batch(lengths=(10, 10, 10, 9))
    assert model.unpadding(few) is None  # 2.5% padding
    _, much = padded_batch(lengths=(10, 2, 3, 10))
    unpadding = model.unpadding(much)  # 37.5%
    assert unpadding is not None and unpadding.index.tolist() == list(range(12)) + [20, 21, 22] + list(range(30, 40))
    assert model.unpadding(torch.zeros_like(much)) is None  # nothing to pack
    model.unpad_from = 0.4
    assert model.unpadding(much) is None


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")  # export.py's exporter still traces
def test_traced_graphs_run_padded(tmp_path):
    """A graph traced on a batch with much padding serves other shapes and other padding: tracing takes the padded
    path (whether to pack is data, which a trace would freeze)."""
    reference("base", tmp_path)
    model = ctxrep.load_model(tmp_path)
    model.unpad_from = 0.0

    class Last(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(ids, attention_mask=mask).last_hidden_state

    last = Last()
    ids, mask = padded_batch(lengths=(12, 3, 2))
    with torch.no_grad(), pytest.warns(torch.jit.TracerWarning):  # the sequence-length check is Python
        traced = torch.jit.trace(last, (ids, mask))
        other_ids, other_mask = padded_batch(lengths=(9, 9, 4, 1))
        a, b = traced(other_ids, other_mask), last(other_ids, other_mask)
    real = other_mask.bool()
    assert torch.allclose(a[real], b[real], atol=1e-5)
    assert "nonzero" not in str(traced.inlined_graph)  # no packing frozen into the graph


@pytest.mark.parametrize("mode", ["is_compiling", "is_exporting"])
def test_compiled_and_exported_graphs_run_padded(mode, monkeypatch):
    model = ModernBertModel(ModernBertConfig(**COMMON))
    _, mask = padded_batch()
    assert model.unpadding(mask) is not None
    monkeypatch.setattr(torch.compiler, mode, lambda: True)
    assert model.unpadding(mask) is None


def test_packed_training_gives_the_padded_gradients(tmp_path):
    reference("base", tmp_path)
    model = ctxrep.load_model(tmp_path).train()  # dropout 0 in this config: both paths are deterministic
    ids, mask = padded_batch()
    grads = {}
    for path, share in PATHS.items():
        model.unpad_from = share
        model.zero_grad()
        xi = torch.ones(4, 4, requires_grad=True)
        model(ids, attention_mask=mask, head_mask=xi).last_hidden_state[mask.bool()].square().sum().backward()
        grads[path] = [xi.grad] + [p.grad for p in model.parameters()]
    for a, b in zip(grads["padded"], grads["packed"]):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
