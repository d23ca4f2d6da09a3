"""The decoder LLM families (qwen3, qwen2, llama / mistral, gemma3_text): parity with transformers 5 on tiny random
configs made here (every hidden state and attention map, padding on either side, every rope scaling), causal and
bidirectional attention, the LM head, saving (one file or shards) that transformers loads, lazy loading and its
dtype, and the one-line refusals before any weight is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from _decoders import FAMILIES, TEXT, hf_model, tiny_folder

from ctxrep.models import shards
from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import load_encoder, load_model

TOL = 1e-5
VOCAB = 400


def batch(side: str, lengths=(9, 6, 3), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) padded on `side` with id 0."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.zeros(len(lengths), t, dtype=torch.long)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        where = slice(0, n) if side == "right" else slice(t - n, t)
        ids[i, where] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[i, where] = 1
    return ids, mask


def assert_parity(ours, theirs, mask: torch.Tensor, attentions: bool = True) -> None:
    keep = mask.bool()
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
        diff = (a - b).abs()[keep].max().item()
        assert diff < TOL, f"hidden state {i}: max |diff| {diff:.2e}"
    if attentions:
        assert len(ours.attentions) == len(theirs.attentions)
        for i, (a, b) in enumerate(zip(ours.attentions, theirs.attentions)):
            rows = keep[:, None, :, None] & keep[:, None, None, :]  # real queries x real keys
            diff = (a - b).abs().masked_select(rows.expand_as(a)).max().item()
            assert diff < TOL, f"attention {i}: max |diff| {diff:.2e}"


def saved(tmp_path: Path, model_type: str, **extra) -> tuple[torch.nn.Module, Path]:
    hf = hf_model(model_type, VOCAB, **extra)
    hf.save_pretrained(tmp_path)
    return hf, tmp_path


CASES = [
    *[(t, {}) for t in FAMILIES],
    ("gemma3_text", {"use_bidirectional_attention": True}),  # EmbeddingGemma
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}),
    ("llama", {"attention_bias": True, "mlp_bias": True, "head_dim": 16}),
]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(("model_type", "extra"), CASES, ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_every_hidden_state_and_attention_matches_transformers(tmp_path, model_type, extra, side):
    hf, folder = saved(tmp_path, model_type, **extra)
    ours = load_model(folder)
    assert ours.family == model_type and type(ours).__module__.startswith("ctxrep.models.")
    ids, mask = batch(side)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    # padded, and unpadded (modules/unpadding.py: positions, rotary tables, causal / sliding / bidirectional masks on
    # the padded grid, every per-token layer on the real tokens), either side padded
    for unpad_from in (None, 0.0):
        ours.unpad_from = unpad_from
        assert (ours.unpadding(mask) is None) == (ours.unpad_from is None)
        with torch.no_grad():
            mine = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
            fast = ours(ids, attention_mask=mask, output_hidden_states=True)  # scaled_dot_product_attention
        assert_parity(mine, theirs, mask)
        assert_parity(fast, theirs, mask, attentions=False)
        assert ours.unpad_from is None or all((h[mask == 0] == 0).all() for h in mine.hidden_states)


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
}


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_rope_scalings_match_transformers(tmp_path, model_type, rope):
    # 16 positions and texts of up to 24 tokens: dynamic scaling only changes anything past the model's positions
    scaling = dict(ROPES[rope], rope_theta=500.0)
    hf, folder = saved(tmp_path, model_type, max_position_embeddings=16, rope_scaling=scaling)
    ours = load_model(folder)
    lengths = (24, 10) if rope in ("linear", "dynamic") else (16, 10)
    assert ours.max_tokens == (32 if rope in ("linear", "dynamic") else 16)
    ids, mask = batch("right", lengths)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        assert_parity(ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True), theirs, mask)


def test_gemma3_local_and_global_rotary_bases_and_scaling_match_transformers(tmp_path):
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    }
    hf, folder = saved(tmp_path, "gemma3_text", rope_parameters=rope)
    ids, mask = batch("left")
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        assert_parity(
            load_model(folder)(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True),
            theirs,
            mask,
        )


@pytest.mark.parametrize(("model_type", "extra"), CASES[:6], ids=lambda v: v if isinstance(v, str) else "bidi")
def test_causal_decoders_ignore_later_tokens_and_left_padding_changes_nothing(tmp_path, model_type, extra):
    _, folder = saved(tmp_path, model_type, **extra)
    model = load_model(folder)
    ids = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], 1)
    with torch.no_grad():
        a = model(ids, output_hidden_states=True).hidden_states
        b = model(changed, output_hidden_states=True).hidden_states
        c = model(padded, attention_mask=mask, output_hidden_states=True).hidden_states
    earlier_same = all(torch.equal(x[:, :-1], y[:, :-1]) for x, y in zip(a, b))
    assert earlier_same == model.causal == (not extra.get("use_bidirectional_attention", False))
    for x, y in zip(a, c):  # positions count real tokens: the left-padded text is the text
        torch.testing.assert_close(y[:, 3:], x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("qwen3", {}),
        ("llama", {}),
        ("mistral", {}),
        ("gemma3_text", {"use_bidirectional_attention": True}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_saved_folder_one_file_or_shards_loads_in_transformers_and_back(tmp_path, model_type, extra):
    hf, folder = saved(tmp_path / "src", model_type, **extra)
    ours = load_model(folder)
    ids, mask = batch("right")
    with torch.no_grad():
        want = ours(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for out, shard_bytes in ((tmp_path / "one", None), (tmp_path / "sharded", 20_000)):
        ours.save_pretrained(out, max_shard_bytes=shard_bytes)
        sharded = (out / shards.INDEX_FILE).is_file()
        assert sharded == (shard_bytes is not None)
        if sharded:
            assert len(list(out.glob("model-*-of-*.safetensors"))) > 2
        again = transformers.AutoModel.from_pretrained(out).eval()
        back = load_model(out)
        with torch.no_grad():
            theirs = again(ids, attention_mask=mask, output_hidden_states=True).hidden_states
            mine = back(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for w, t, m in zip(want, theirs, mine):
            keep = mask.bool()
            assert (w - t).abs()[keep].max() < TOL and torch.equal(w, m)


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("qwen3", {"tie_word_embeddings": False}),
        ("qwen3", {"tie_word_embeddings": True}),
        ("llama", {}),
        ("gemma3_text", {"final_logit_softcapping": 3.0}),
    ],
)
def test_lm_logits_of_a_causal_lm_folder_match_transformers(tmp_path, model_type, extra):
    hf = hf_model(model_type, VOCAB, causal_lm=True, **extra)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    ids, mask = batch("left")
    with torch.no_grad():
        want = hf(ids, attention_mask=mask).logits
        hidden = ours(ids, attention_mask=mask).last_hidden_state
        got = ours.lm_logits(hidden)
        yes_no = ours.lm_logits(hidden[:, -1], token_ids=[7, 11])  # a reranker's two tokens at the last position
    keep = mask.bool()
    assert (got - want).abs()[keep].max() < 1e-4
    torch.testing.assert_close(yes_no, want[:, -1, [7, 11]], rtol=1e-4, atol=1e-4)
    assert ours.layer_of("norm.weight") == ours.num_layers
    if ours.lm_head is not None:
        assert ours.layer_of("lm_head.weight") == ours.num_layers


def test_lm_logits_without_a_head_is_one_line(tmp_path):
    _, folder = saved(tmp_path, "llama", tie_word_embeddings=False)
    model = load_model(folder)
    with pytest.raises(ValueError, match="no LM head") as e:
        model.lm_logits(torch.zeros(1, model.hidden_size))
    assert "\n" not in str(e.value)


def test_interface_answers(tmp_path):
    _, folder = saved(tmp_path, "qwen3")
    m = load_model(folder)
    assert (m.num_layers, m.num_heads, m.hidden_size, m.max_tokens, m.reads_segments) == (3, 4, 32, 128, False)
    assert m.input_embeddings().shape == (VOCAB, 32)
    depths = {name: m.layer_of(name) for name, _ in m.named_parameters()}
    assert depths["embed_tokens.weight"] == 0 and depths["layers.2.self_attn.q_norm.weight"] == 3
    with pytest.raises(ValueError, match="not a parameter"):
        m.layer_of("layers.9.mlp.up_proj.weight")


# ---- weights: lazy, dtype, memory ---------------------------------------------------------------------------


def test_loading_builds_on_the_meta_device_and_initialises_nothing(tmp_path, monkeypatch):
    _, folder = saved(tmp_path, "qwen3")

    def meta_only(init):
        def wrapped(tensor, *args, **kwargs):
            assert tensor.is_meta, "a weight was initialised in memory before being loaded"
            return init(tensor, *args, **kwargs)

        return wrapped

    for name in ("normal_", "kaiming_uniform_", "uniform_"):
        monkeypatch.setattr(torch.nn.init, name, meta_only(getattr(torch.nn.init, name)))
    model = load_model(folder)
    assert not any(p.is_meta for p in model.parameters()) and not any(b.is_meta for b in model.buffers())


def test_auto_dtype_keeps_a_bf16_checkpoint_in_bf16_only_where_the_cpu_has_it(tmp_path, monkeypatch):
    hf = hf_model("qwen3", VOCAB)
    hf.to(torch.bfloat16).save_pretrained(tmp_path)
    monkeypatch.setattr(shards, "cpu_has_bf16", lambda: True)
    assert next(load_model(tmp_path).parameters()).dtype == torch.bfloat16
    assert next(load_model(tmp_path, dtype="fp32").parameters()).dtype == torch.float32
    monkeypatch.setattr(shards, "cpu_has_bf16", lambda: False)
    assert next(load_model(tmp_path).parameters()).dtype == torch.float32
    assert next(load_model(tmp_path, dtype="bf16").parameters()).dtype == torch.bfloat16


def test_weights_that_cannot_fit_are_refused_before_reading_them(tmp_path, monkeypatch):
    _, folder = saved(tmp_path, "qwen3")
    monkeypatch.setattr(shards, "available_memory", lambda: 1000)
    monkeypatch.setattr(shards, "read_tensor", lambda *a: pytest.fail("a weight was read"))
    with pytest.raises(CheckpointError, match=r"weights take .* GiB in float32 .* 0\.0 GiB of memory available") as e:
        load_model(folder, dtype="fp32")
    assert "\n" not in str(e.value) and "bf16" in str(e.value)


def test_weights_are_read_into_memory_of_their_own(tmp_path):
    """No memory map: the loaded model survives its files being overwritten (a folder saved over itself)."""
    _, folder = saved(tmp_path, "qwen3")
    model = load_model(folder)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        before = model(ids).last_hidden_state
        (folder / "model.safetensors").write_bytes(b"\0" * 16)
        assert torch.equal(model(ids).last_hidden_state, before)


def test_truncated_weights_are_one_line(tmp_path):
    _, folder = saved(tmp_path, "qwen3")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="truncated") as e:
        load_model(folder)
    assert "\n" not in str(e.value)


# ---- bad input: one line, before the weights -------------------------------------------------------------------


def _corrupt_weights(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"not read")


def test_unknown_rope_scaling_is_one_line_before_the_weights(tmp_path):
    _, folder = saved(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    _corrupt_weights(folder)
    with pytest.raises(CheckpointError, match="rope scaling type 'longrope' is not implemented") as e:
        load_model(folder)
    assert "\n" not in str(e.value) and "config.json" in str(e.value)


def test_missing_shard_is_one_line(tmp_path):
    _, folder = saved(tmp_path / "src", "qwen3")
    load_model(folder).save_pretrained(tmp_path / "sharded", max_shard_bytes=20_000)
    shard = sorted((tmp_path / "sharded").glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shards are missing \\({shard.name}\\)") as e:
        load_model(tmp_path / "sharded")
    assert "\n" not in str(e.value)


def test_config_family_whose_weights_do_not_match_is_one_line(tmp_path):
    _, folder = saved(tmp_path, "qwen3")  # q/k norms, no biases
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "qwen2"}))
    with pytest.raises(
        CheckpointError, match="cannot load as a qwen2 model: missing .*q_proj.bias.*unknown .*q_norm"
    ) as e:
        load_model(folder)
    assert "\n" not in str(e.value)


# ---- words from byte-level BPE without a word-start marker ---------------------------------------------------------


def test_byte_level_words_get_the_pieces_of_running_text(tmp_path):
    tiny_folder(tmp_path, "qwen3")
    tok = load_encoder(tmp_path).tokenizer
    texts = [TEXT[3].split(), ["café", "東京", "🙂", "naïve", "dog", "."], ["🙂"], ["東京", "タワー"]]
    for words, enc in zip(texts, tok.encode_words(texts)):
        running = tok.backend.encode(" ".join(words), add_special_tokens=False)
        assert enc.ids == running.ids  # the same pieces as the text read whole
        for w, word in enumerate(words):  # and each word's pieces spell that word (with its space)
            pieces = [i for i, owner in zip(enc.ids, enc.word_ids) if owner == w]
            assert tok.backend.decode(pieces) == (word if w == 0 else " " + word)


def test_lm_logits_of_an_encoder_without_a_head_is_one_line(tiny_models):
    bert = load_model(tiny_models["bert"])
    with pytest.raises(ValueError, match="bert encoder has no causal language-model head") as e:
        bert.lm_logits(torch.zeros(1, bert.hidden_size))
    assert "\n" not in str(e.value)


def test_a_text_runs_whole_up_to_the_positions_and_in_windows_beyond(tmp_path):
    import ctxrep

    tiny_folder(tmp_path, "qwen3")  # 128 positions
    fz = ctxrep.Featurizer(str(tmp_path), layers=-1, pooling="mean")
    assert fz.plan.max_length == fz.model.max_tokens == 128
    short, long = ("dog runs " * 30).split(), ("dog runs " * 150).split()  # about 60 and 300 pieces
    whole = fz.embed_words([short])[0]
    pieces = fz.tokenizer.encode_words([short])[0]
    ids, _, offset = fz.tokenizer.build_inputs(pieces.ids)
    with torch.no_grad():
        states = fz.model(torch.tensor([ids])).last_hidden_state[0]
    last = [offset + i for i, w in enumerate(pieces.word_ids) if w == len(short) - 1]
    # the last word read every word before it: the whole text ran as one window
    assert abs(whole[-1] - states[last].mean(0).numpy()).max() < 1e-5
    windowed = fz.embed_words([long, "  café 東京 🙂"])
    assert windowed[0].shape == (300, 32) and torch.isfinite(torch.from_numpy(windowed[0])).all()
    assert windowed[1].shape == (3, 32)  # leading spaces: three words
    pieces = fz.tokenizer.encode_words([["café", "東京", "🙂"]])[0]
    ids, _, offset = fz.tokenizer.build_inputs(pieces.ids)
    with torch.no_grad():
        states = fz.model(torch.tensor([ids])).last_hidden_state[0]
    for w, word in enumerate(["café", "東京", "🙂"]):  # each word's pieces spell it, and its vector is theirs
        mine = [k for k, owner in enumerate(pieces.word_ids) if owner == w]
        assert fz.tokenizer.backend.decode([pieces.ids[k] for k in mine]) == (word if w == 0 else " " + word)
        assert abs(windowed[1][w] - states[[offset + k for k in mine]].mean(0).numpy()).max() < 1e-5


def test_a_bf16_loaded_decoder_featurizes_close_to_fp32(tmp_path):
    import numpy as np

    import ctxrep

    tiny_folder(tmp_path, "gemma3_text")
    words = [TEXT[0].split(), TEXT[3].split()]
    exact = ctxrep.Featurizer(load_encoder(tmp_path, dtype="fp32"), layers="all").embed_words(words)
    half = ctxrep.Featurizer(load_encoder(tmp_path, dtype="bf16"), layers="all").embed_words(words)
    for a, b in zip(half, exact):
        assert a.dtype == np.float32 and a.shape == b.shape
        cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cosine.mean() > 0.99
