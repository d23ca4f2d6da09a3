"""GPT-2: parity with transformers on tiny random models that transformers saved, KV cache, generation,
round trips through the Hugging Face folder format, and the errors users see."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from ctxrep.models.folders import CheckpointError, read_state_dict, write_safetensors  # noqa: E402
from ctxrep.models.gpt2 import (  # noqa: E402
    TRANSPOSED,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    filter_logits,
    hf_parameter_names,
)

VOCAB, POSITIONS, EOS = 97, 24, 96
TOL = 1e-5


def hf_config(**overrides) -> transformers.GPT2Config:
    kwargs = dict(
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=48,
        bos_token_id=EOS,
        eos_token_id=EOS,
        initializer_range=0.2,  # wide weights: logits far apart
    )
    return transformers.GPT2Config(**(kwargs | overrides))


@pytest.fixture(scope="module")
def hf_lm(tmp_path_factory) -> tuple[transformers.GPT2LMHeadModel, object]:
    """A random transformers GPT2LMHeadModel and the folder it saved itself into."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(hf_config()).eval()
    path = tmp_path_factory.mktemp("hf_gpt2_lm")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def ours(hf_lm) -> GPT2LMHeadModel:
    return GPT2LMHeadModel.from_pretrained(hf_lm[1])


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows, right-padded to 9 tokens (lengths 9, 5, 1)."""
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB - 1, (3, 9), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    attention_mask[2, 1:] = 0
    input_ids[attention_mask == 0] = EOS  # GPT-2 has no pad token: pad with EOS as people do
    return input_ids, attention_mask


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str, real: torch.Tensor | None = None) -> None:
    """Within TOL everywhere, or at the `real` (batch, seq) tokens only: a batch with much padding runs unpadded
    (modules/unpadding.py), 0 at padding where transformers computes the padding tokens too."""
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if real is not None:
        a, b = a[real.bool()], b[real.bool()]
    err = (a - b).abs().max().item()
    assert err < TOL, f"{what}: max abs difference {err}"


# ---- parity with transformers ---------------------------------------------------------------------


@pytest.mark.parametrize("unpad_from", [None, 0.0], ids=["padded", "unpadded"])
def test_lm_logits_and_every_hidden_state_match_transformers(hf_lm, ours, monkeypatch, unpad_from):
    hf, _ = hf_lm
    input_ids, attention_mask = batch()
    monkeypatch.setattr(ours.transformer, "unpad_from", unpad_from)
    # padded: every position, padding included, is transformers'; unpadded: real tokens, 0 hidden states at padding
    real = None if unpad_from is None else attention_mask
    with torch.no_grad():
        ref = hf(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        out = ours(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_close(a, b, f"hidden_states[{i}]", real)
        assert unpad_from is None or (a[attention_mask == 0] == 0).all()
    assert_close(out.logits, ref.logits, "logits", real)
    # The padding mask matters: row 1 without it sees its padding and differs from transformers' row 1.
    unmasked = ours(input_ids).logits
    assert (unmasked[1, 5:] - ref.logits[1, 5:]).abs().max() > 1e-3


def test_decoder_matches_transformers_gpt2model_from_both_folder_layouts(hf_lm, tmp_path):
    hf, lm_path = hf_lm
    # GPT2Model.save_pretrained writes keys without the "transformer." prefix and no lm_head.
    hf.transformer.save_pretrained(tmp_path)
    assert not any(k.startswith("transformer.") for k in read_state_dict(tmp_path))
    input_ids, attention_mask = batch()
    with torch.no_grad():
        ref = hf.transformer(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    for path in (lm_path, tmp_path):
        model = GPT2Model.from_pretrained(path)
        assert (model.num_layers, model.hidden_size) == (2, 32)
        with torch.no_grad():
            out = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        assert_close(out.last_hidden_state, ref.last_hidden_state, f"{path.name}: last_hidden_state", attention_mask)
        for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
            assert_close(a, b, f"{path.name}: hidden_states[{i}]", attention_mask)
    lm = GPT2LMHeadModel.from_pretrained(tmp_path)  # a GPT2Model folder serves as an LM: the head is tied
    assert_close(lm(input_ids).logits, hf(input_ids).logits, "logits from a GPT2Model folder")


def test_attentions_match_transformers_eager(hf_lm):
    _, path = hf_lm
    eager = transformers.GPT2Model.from_pretrained(path, attn_implementation="eager").eval()
    model = GPT2Model.from_pretrained(path)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        ref = eager(input_ids, attention_mask=attention_mask, output_attentions=True)
        out = model(input_ids, attention_mask=attention_mask, output_attentions=True)
        plain = model(input_ids, attention_mask=attention_mask)
    assert len(out.attentions) == 2
    for i, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        real = attention_mask.bool()[:, None, :, None]  # rows of padding queries are not compared
        assert_close(a * real, b * real, f"attentions[{i}]")
    assert_close(out.last_hidden_state, plain.last_hidden_state, "explicit softmax vs scaled_dot_product_attention")
    assert torch.all(torch.triu(out.attentions[0], diagonal=1) == 0), "a token attended to a later token"


def test_loss_matches_transformers_and_ignores_minus_100(hf_lm, ours):
    hf, _ = hf_lm
    input_ids, attention_mask = batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    with torch.no_grad():
        ref = hf(input_ids, attention_mask=attention_mask, labels=labels)
        out = ours(input_ids, attention_mask=attention_mask, labels=labels)
    assert_close(out.loss, ref.loss, "loss")
    # Changing an ignored label changes nothing; changing a used one does.
    other = labels.clone()
    other[0, 0] = 5  # position 0 is never a target after the shift
    assert out.loss.item() == ours(input_ids, attention_mask=attention_mask, labels=other).loss.item()
    other[0, 3] = (labels[0, 3] + 1) % (VOCAB - 1)
    assert out.loss.item() != ours(input_ids, attention_mask=attention_mask, labels=other).loss.item()


@pytest.mark.parametrize(
    "overrides",
    [{"scale_attn_by_inverse_layer_idx": True}, {"activation_function": "relu", "n_inner": None}],
    ids=["inverse_layer_scaling", "relu_default_inner"],
)
def test_config_variants_match_transformers(tmp_path, overrides):
    torch.manual_seed(3)
    hf = transformers.GPT2LMHeadModel(hf_config(**overrides)).eval()
    hf.save_pretrained(tmp_path)
    model = GPT2LMHeadModel.from_pretrained(tmp_path)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        assert_close(
            model(input_ids, attention_mask=attention_mask).logits,
            hf(input_ids, attention_mask=attention_mask).logits,
            f"logits with {overrides}",
            attention_mask,
        )


def test_unpadded_left_padding_with_positions_segments_and_cache_equals_padded(ours, monkeypatch):
    """Left padding with position ids counting real tokens (as people batch GPT-2 for generation), token type ids,
    a key/value cache from an unpadded call and a continuation on it: the unpadded run is the padded run's at real
    tokens, attentions included."""
    input_ids, right = batch()
    attention_mask = right.flip(1)  # (batch, seq) left-padded: lengths 9, 5, 1
    input_ids = torch.where(attention_mask.bool(), input_ids.flip(1), EOS)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (batch, seq)
    token_type_ids = torch.arange(9).repeat(3, 1) % 2  # (batch, seq)
    more = torch.randint(0, VOCAB - 1, (3, 2), generator=torch.Generator().manual_seed(2))
    out = {}
    for unpad_from in (None, 0.0):
        monkeypatch.setattr(ours.transformer, "unpad_from", unpad_from)
        with torch.no_grad():
            first = ours.transformer(
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=True,
                output_attentions=True,
            )
            nxt = ours.transformer(
                more,
                attention_mask=torch.cat([attention_mask, torch.ones(3, 2, dtype=torch.long)], 1),
                position_ids=position_ids[:, -1:] + torch.arange(1, 3),
                past_key_values=first.past_key_values,
            )
        out[unpad_from] = first, nxt
    assert ours.transformer.unpadding(attention_mask) is not None
    (padded, padded_next), (unpadded, unpadded_next) = out[None], out[0.0]
    for i, (a, b) in enumerate(zip(unpadded.hidden_states, padded.hidden_states)):
        assert_close(a, b, f"hidden_states[{i}]", attention_mask)
    for i, (a, b) in enumerate(zip(unpadded.attentions, padded.attentions)):
        rows = attention_mask.bool()[:, None, :, None].expand_as(a)  # rows of real query tokens
        assert_close(a[rows], b[rows], f"attentions[{i}]")
    assert_close(unpadded_next.last_hidden_state, padded_next.last_hidden_state, "continuation on the cache")


# ---- key/value cache and generation ---------------------------------------------------------------


def test_cached_forward_equals_full_forward(ours):
    input_ids, attention_mask = batch()
    with torch.no_grad():
        full = ours(input_ids, attention_mask=attention_mask)
        first = ours(input_ids[:, :4], attention_mask=attention_mask[:, :4], use_cache=True)
        assert len(first.past_key_values) == 2
        k, v = first.past_key_values[0]
        assert k.shape == v.shape == (3, 4, 4, 8)  # (batch, heads, past, head_dim)
        second = ours(input_ids[:, 4:], attention_mask=attention_mask, past_key_values=first.past_key_values)
    cached = torch.cat([first.logits, second.logits], dim=1)
    assert_close(cached, full.logits, "prefix + cached continuation", attention_mask)


def naive_generate(model, input_ids, steps, do_sample=False, top_k=None, top_p=None, temperature=1.0, generator=None):
    """Recompute the whole sequence at every step, without the cache."""
    tokens = input_ids
    for _ in range(steps):
        logits = model(tokens).logits[:, -1].float()
        if do_sample:
            probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        else:
            nxt = logits.argmax(-1)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
    return tokens


def test_cached_generation_equals_uncached_recomputation(ours):
    prompt = batch()[0][:, :3]
    greedy = ours.generate(prompt, 12)
    assert greedy.shape == (3, 15)
    assert torch.equal(greedy, naive_generate(ours, prompt, 12))
    sampled = ours.generate(
        prompt, 12, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(7)
    )
    expected = naive_generate(ours, prompt, 12, True, 20, 0.9, 0.8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(sampled, expected)
    assert not torch.equal(sampled, greedy)


def test_greedy_generation_matches_transformers(hf_lm, ours):
    hf, _ = hf_lm
    prompt = batch()[0][:, :4]
    ref = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=15, do_sample=False, pad_token_id=EOS
    )
    assert torch.equal(ours.generate(prompt, 15, eos_token_id=EOS), ref)
    # Without an end-of-sequence token every row runs to the full length.
    ref = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=15,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=EOS,
    )
    assert torch.equal(ours.generate(prompt, 15), ref)


def test_sampling_matches_transformers_with_the_same_seed(hf_lm, ours):
    hf, _ = hf_lm
    prompt = batch()[0][:, :4]
    kwargs = dict(do_sample=True, temperature=0.7, top_k=30, top_p=0.8)
    torch.manual_seed(11)
    ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, pad_token_id=EOS, **kwargs)
    torch.manual_seed(11)
    assert torch.equal(ours.generate(prompt, 10, eos_token_id=EOS, **kwargs), ref)


def test_eos_stops_a_row_and_pads_it_with_eos(ours):
    prompt = batch()[0][:, :3]
    free = ours.generate(prompt, 10)
    eos = int(free[0, 5])  # pretend the token row 0 generated third is the end of sequence
    out = ours.generate(prompt, 10, eos_token_id=eos)
    for row, generated in zip(out, free):
        hits = (generated[3:] == eos).nonzero()
        if len(hits):
            stop = 3 + int(hits[0])
            assert torch.equal(row[: stop + 1], generated[: stop + 1])
            assert torch.all(row[stop:] == eos)
        else:
            assert torch.equal(row, generated)


def test_filter_logits_known_answers():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()  # probabilities 0.5, 0.3, 0.15, 0.05
    kept = lambda **kw: torch.isfinite(filter_logits(logits, **kw))[0].tolist()  # noqa: E731
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.75) == [True, True, False, False]
    assert kept(top_p=0.85) == [True, True, True, False]
    assert kept(top_p=0.3) == [True, False, False, False]  # the best token always stays
    assert kept(top_k=1, top_p=0.99) == [True, False, False, False]
    assert kept() == [True] * 4
    shuffled = logits[:, [2, 0, 3, 1]]  # nucleus is computed on sorted probabilities, returned in vocab order
    assert torch.isfinite(filter_logits(shuffled, top_p=0.75))[0].tolist() == [False, True, False, True]


def test_top_k_one_sampling_is_greedy(ours):
    prompt = batch()[0][:, :3]
    sampled = ours.generate(prompt, 8, do_sample=True, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, ours.generate(prompt, 8))


def test_generate_refuses_bad_arguments(ours):
    prompt = batch()[0][:, :3]
    with pytest.raises(ValueError, match="exceeds the model's 24 positions"):
        ours.generate(prompt, POSITIONS)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ours.generate(prompt, 2, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        ours.generate(prompt, 2, do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        ours.generate(prompt, 2, do_sample=True, top_k=0)


# ---- known answers, truncation, training -----------------------------------------------------------


def test_loss_of_an_all_zero_model_is_log_vocab():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # every logit is 0: a uniform distribution over the vocabulary
    ids = torch.randint(0, VOCAB, (2, 6))
    loss = model(ids, labels=ids).loss
    assert abs(loss.item() - torch.log(torch.tensor(float(VOCAB))).item()) < 1e-6


def test_head_is_tied_and_training_step_runs():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4))
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, VOCAB, (2, 8))
    optim = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    losses = []
    for _ in range(5):
        optim.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        optim.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_num_layers_returns_a_prefix_of_the_hidden_states(ours):
    input_ids, attention_mask = batch()
    full = ours.transformer(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    one = ours.transformer(input_ids, attention_mask=attention_mask, output_hidden_states=True, num_layers=1)
    assert len(one.hidden_states) == 2
    for a, b in zip(one.hidden_states, full.hidden_states):
        assert_close(a, b, "truncated run")
    assert_close(one.last_hidden_state, full.hidden_states[1], "last_hidden_state without the final LayerNorm")


def test_sequence_longer_than_positions_is_refused(ours):
    with pytest.raises(ValueError, match=r"25 tokens \(0 cached \+ 25 new\) is longer than the model's 24 positions"):
        ours(torch.zeros(1, POSITIONS + 1, dtype=torch.long))
    first = ours(torch.zeros(1, 20, dtype=torch.long), use_cache=True)
    with pytest.raises(ValueError, match=r"\(20 cached \+ 5 new\)"):
        ours(torch.zeros(1, 5, dtype=torch.long), past_key_values=first.past_key_values)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        ours(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 4))


# ---- folder format: round trips and bad checkpoints -------------------------------------------------


def test_save_pretrained_loads_in_transformers_with_identical_logits(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        expected = ours(input_ids, attention_mask=attention_mask).logits
        for cls in (transformers.GPT2LMHeadModel, transformers.AutoModelForCausalLM):
            hf = cls.from_pretrained(tmp_path).eval()
            assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
            logits = hf(input_ids, attention_mask=attention_mask).logits
            assert_close(logits, expected, f"{cls.__name__} logits", attention_mask)
        back = GPT2LMHeadModel.from_pretrained(tmp_path)
        assert_close(back(input_ids, attention_mask=attention_mask).logits, expected, "ctxrep round trip")


def test_decoder_save_pretrained_loads_in_transformers_automodel(ours, tmp_path):
    ours.transformer.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["GPT2Model"]
    hf = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "GPT2Model"
    input_ids, attention_mask = batch()
    with torch.no_grad():
        ref = hf(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        out = ours.transformer(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_close(a, b, f"hidden_states[{i}]", attention_mask)


def test_config_round_trip(hf_lm):
    _, path = hf_lm
    d = json.loads((path / "config.json").read_text())
    config = GPT2Config.from_hf_dict(d)
    assert (config.n_embd, config.n_layer, config.n_head, config.n_inner, config.eos_token_id) == (32, 2, 4, 48, EOS)
    again = GPT2Config.from_hf_dict(config.to_hf_dict())
    assert again == config
    assert transformers.GPT2Config(**config.to_hf_dict()).n_inner == 48
    with pytest.raises(CheckpointError, match="add_cross_attention=true is not supported"):
        GPT2Config.from_hf_dict(d | {"add_cross_attention": True})
    with pytest.raises(ValueError, match="activation_function 'mish' is not supported"):
        GPT2Config.from_hf_dict(d | {"activation_function": "mish"})


def test_old_checkpoint_with_mask_buffers_in_pytorch_model_bin(hf_lm, ours, tmp_path):
    """The original openai-community/gpt2 layout: no prefix, attn.bias / attn.masked_bias buffers, .bin file."""
    _, path = hf_lm
    state = {k.removeprefix("transformer."): v for k, v in read_state_dict(path).items()}
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(POSITIONS, POSITIONS, dtype=torch.bool))[None, None]
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    state["lm_head.weight"] = state["wte.weight"].clone()
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    model = GPT2LMHeadModel.from_pretrained(tmp_path)
    ids = batch()[0]
    assert_close(model(ids).logits, ours(ids).logits, "logits from the old layout")


def corrupt(src, dst, edit) -> None:
    state = read_state_dict(src)
    edit(state)
    write_safetensors(state, dst / "model.safetensors")
    (dst / "config.json").write_text((src / "config.json").read_text())


def test_unknown_missing_and_mis_shaped_keys_are_all_named(hf_lm, tmp_path):
    _, path = hf_lm

    def edit(state):
        state["transformer.h.0.attn.rotary.weight"] = torch.zeros(3)
        state["transformer.h.7.attn.bias"] = torch.zeros(3)  # a buffer name, but for a layer that does not exist
        del state["transformer.ln_f.bias"]
        state["transformer.h.1.mlp.c_fc.weight"] = state["transformer.h.1.mlp.c_fc.weight"].t()

    corrupt(path, tmp_path, edit)
    for cls in (GPT2Model, GPT2LMHeadModel):
        with pytest.raises(CheckpointError) as e:
            cls.from_pretrained(tmp_path)
        msg = str(e.value)
        assert str(tmp_path) in msg and "cannot load as a GPT-2 model" in msg
        assert "missing 1 weights: ln_f.bias" in msg
        assert "2 unknown weights: h.0.attn.rotary.weight, h.7.attn.bias" in msg
        assert "h.1.mlp.c_fc.weight (48, 32) (expected (32, 48))" in msg


def test_untied_lm_head_is_refused(hf_lm, tmp_path):
    _, path = hf_lm

    def edit(state):
        state["lm_head.weight"] = torch.randn(VOCAB, 32)

    corrupt(path, tmp_path, edit)
    with pytest.raises(CheckpointError, match="lm_head.weight differs from the token embeddings wte.weight"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    GPT2Model.from_pretrained(tmp_path)  # the decoder alone does not use the head


def test_wrong_model_type_is_refused(hf_lm, tmp_path):
    _, path = hf_lm
    corrupt(path, tmp_path, lambda state: None)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="model_type is 'bert', expected 'gpt2'"):
        GPT2Model.from_pretrained(tmp_path)


def test_name_map_transposes_exactly_the_conv1d_weights():
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=48)
    hf = transformers.GPT2Model(hf_config(n_positions=16))
    names = hf_parameter_names(config)
    assert set(names) == set(hf.state_dict())
    conv1d = {f"{name}.weight" for name, m in hf.named_modules() if type(m).__name__ == "Conv1D"}
    assert len(conv1d) == 8
    assert {k for k in names if k.endswith(TRANSPOSED)} == conv1d
