"""XLNet: parity with transformers on random weights that transformers saved, mems, padding, round trips, errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ctxrep.models.folders import CheckpointError, write_safetensors
from ctxrep.models.xlnet import XLNetConfig, XLNetLMHeadModel, XLNetModel

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 50, 7
TINY = dict(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0, mem_len=None, attn_type="bi")


def make_hf(path, cls_name="XLNetLMHeadModel", seed=0, **overrides):
    """A tiny transformers XLNet with every weight random (LayerNorms and the LM bias too), saved to `path`."""
    torch.manual_seed(seed)
    config = transformers.XLNetConfig(**(TINY | overrides))
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    model.save_pretrained(path)
    return model


def inputs(batch=2, seq=SEQ, num_predict=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    token_types = torch.randint(0, 2, (batch, seq), generator=g)
    perm_mask = (torch.rand(batch, seq, seq, generator=g) > 0.5).float()
    target_mapping = torch.zeros(batch, num_predict, seq)
    for b in range(batch):
        positions = torch.randperm(seq, generator=g)[:num_predict]
        target_mapping[b, torch.arange(num_predict), positions] = 1.0
    return ids, token_types, perm_mask, target_mapping


def close(a, b, atol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


# ---- parity -------------------------------------------------------------------------------------


def test_content_stream_matches_transformers(tmp_path):
    hf = make_hf(tmp_path, "XLNetModel")
    ours = XLNetModel.from_pretrained(tmp_path)
    ids, token_types, _, _ = inputs()
    with torch.no_grad():
        ref = hf(ids, token_type_ids=token_types, output_hidden_states=True, output_attentions=True)
        out = ours(ids, token_type_ids=token_types, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == ours.num_layers + 1 == 3 and ours.hidden_size == 32
    for a, b in zip(ref.hidden_states, out.hidden_states, strict=True):
        close(b, a)
    for a, b in zip(ref.attentions, out.attentions, strict=True):
        close(b, a)
    close(out.last_hidden_state, ref.last_hidden_state)
    assert out.query_last_hidden_state is None and out.query_hidden_states is None


@pytest.mark.parametrize("with_types", [True, False])
def test_two_streams_and_logits_match_transformers(tmp_path, with_types):
    hf = make_hf(tmp_path)
    ours = XLNetLMHeadModel.from_pretrained(tmp_path)
    ids, token_types, perm_mask, target_mapping = inputs()
    token_types = token_types if with_types else None
    labels = torch.randint(0, VOCAB, target_mapping.shape[:2])
    kw = dict(token_type_ids=token_types, perm_mask=perm_mask, target_mapping=target_mapping, labels=labels)
    with torch.no_grad():
        ref = hf(ids, **kw, output_hidden_states=True, output_attentions=True)
        out = ours(ids, **kw, output_hidden_states=True, output_attentions=True)
    # transformers interleaves the streams: (h0, g0, h1, g1, h2, g2); ctxrep keeps them apart.
    assert len(ref.hidden_states) == 2 * len(out.hidden_states) == 2 * len(out.query_hidden_states) == 6
    for i in range(3):
        close(out.hidden_states[i], ref.hidden_states[2 * i])
        close(out.query_hidden_states[i], ref.hidden_states[2 * i + 1])
    assert out.query_hidden_states[-1].shape == (2, 3, 32)
    close(out.logits, ref.logits)
    assert out.logits.shape == (2, 3, VOCAB)
    close(out.loss, ref.loss)
    for (ref_h, ref_g), h, g in zip(ref.attentions, out.attentions, out.query_attentions, strict=True):
        close(h, ref_h)
        # transformers reports the query stream's attention at every position; ctxrep per prediction.
        close(g, torch.einsum("bnij,bmi->bnmj", ref_g, target_mapping))


def test_left_padding_matches_transformers_and_the_unpadded_run(tmp_path):
    hf = make_hf(tmp_path)
    ours = XLNetLMHeadModel.from_pretrained(tmp_path)
    ids, token_types, perm_mask, target_mapping = inputs()
    attention_mask = torch.ones(2, SEQ)
    attention_mask[1, :3] = 0  # XLNet pads on the left
    kw = dict(
        attention_mask=attention_mask,
        token_type_ids=token_types,
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        output_hidden_states=True,
    )
    with torch.no_grad():
        ref = hf(ids, **kw)
        out = ours(ids, **kw)
        close(out.logits, ref.logits)
        for i in range(3):
            close(out.hidden_states[i], ref.hidden_states[2 * i])
            close(out.query_hidden_states[i], ref.hidden_states[2 * i + 1])
        # Relative positions only: the real tokens' states do not depend on how much padding precedes them.
        enc = ours.transformer
        padded = enc(ids[1:], attention_mask=attention_mask[1:], token_type_ids=token_types[1:])
        alone = enc(ids[1:, 3:], token_type_ids=token_types[1:, 3:])
    close(padded.last_hidden_state[:, 3:], alone.last_hidden_state)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(mem_len=None),
        dict(mem_len=4),
        dict(mem_len=5, reuse_len=3),
        dict(mem_len=6, attn_type="uni"),
        dict(mem_len=6, attn_type="uni", same_length=True),
        dict(mem_len=4, clamp_len=3),
        dict(mem_len=4, bi_data=True),
    ],
    ids=["all", "mem4", "reuse", "uni", "uni-same-length", "clamp", "bi-data"],
)
def test_two_segments_with_mems_match_transformers(tmp_path, overrides):
    hf = make_hf(tmp_path, **overrides)
    ours = XLNetLMHeadModel.from_pretrained(tmp_path)
    ids, token_types, perm_mask, target_mapping = inputs(seq=2 * SEQ)
    uni = overrides.get("attn_type") == "uni"  # Transformer-XL's causal order; transformers fails on uni + perm_mask
    ref_mems, our_mems = None, None
    with torch.no_grad():
        for s in (slice(0, SEQ), slice(SEQ, 2 * SEQ)):
            kw = dict(
                token_type_ids=token_types[:, s],
                perm_mask=None if uni else perm_mask[:, s, s],
                target_mapping=target_mapping[:, :, s],
                output_hidden_states=True,
            )
            ref = hf(ids[:, s], **kw, mems=ref_mems, use_mems=True)
            out = ours(ids[:, s], **kw, mems=our_mems)
            close(out.logits, ref.logits)
            for i in range(3):
                close(out.hidden_states[i], ref.hidden_states[2 * i])
                close(out.query_hidden_states[i], ref.hidden_states[2 * i + 1])
            for a, b in zip(ref.mems, out.mems, strict=True):
                close(b, a.transpose(0, 1))  # transformers' mems are (mem, batch, d_model)
            ref_mems, our_mems = ref.mems, out.mems
        # The memory matters: the second segment without it gives other states.
        alone = ours(ids[:, s], **kw)
    assert (alone.logits - out.logits).abs().max() > 1e-3
    expected_mem = {None: 2 * SEQ, 4: 4, 5: 5, 6: 6}[overrides["mem_len"]]
    assert out.mems[0].shape == (2, expected_mem, 32)


def test_mems_are_the_inputs_of_each_layer(tmp_path):
    make_hf(tmp_path, "XLNetModel", mem_len=3)
    ours = XLNetModel.from_pretrained(tmp_path)
    ids = inputs()[0]
    with torch.no_grad():
        out = ours(ids, output_hidden_states=True)
    for layer in range(2):
        close(out.mems[layer], out.hidden_states[layer][:, -3:])
    assert not out.mems[0].requires_grad


def test_num_layers_stops_early_and_bfloat16_runs(tmp_path):
    make_hf(tmp_path, "XLNetModel")
    ours = XLNetModel.from_pretrained(tmp_path)
    ids, token_types, perm_mask, target_mapping = inputs()
    with torch.no_grad():
        full = ours(ids, output_hidden_states=True)
        first = ours(ids, num_layers=1)
        close(first.last_hidden_state, full.hidden_states[1], atol=0)
        assert len(first.mems) == 1
        half = ours.to(torch.bfloat16)(ids, perm_mask=perm_mask, target_mapping=target_mapping)
    assert torch.isfinite(half.query_last_hidden_state).all()


# ---- loading and saving ------------------------------------------------------------------------


def test_saved_folders_load_in_transformers_with_identical_outputs(tmp_path):
    make_hf(tmp_path / "hf")
    ours = XLNetLMHeadModel.from_pretrained(tmp_path / "hf")
    ours.save_pretrained(tmp_path / "lm")
    ours.transformer.save_pretrained(tmp_path / "enc")
    ids, token_types, perm_mask, target_mapping = inputs()
    kw = dict(token_type_ids=token_types, perm_mask=perm_mask, target_mapping=target_mapping)
    with torch.no_grad():
        expected = ours(ids, **kw)
        hf_lm = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "lm").eval()
        close(hf_lm(ids, **kw).logits, expected.logits)
        hf_enc = transformers.XLNetModel.from_pretrained(tmp_path / "enc").eval()
        close(
            hf_enc(ids, token_type_ids=token_types).last_hidden_state,
            ours.transformer(ids, token_type_ids=token_types).last_hidden_state,
        )
        # and back into ctxrep, both ways round
        again = XLNetLMHeadModel.from_pretrained(tmp_path / "lm")
        close(again(ids, **kw).logits, expected.logits, atol=0)
        enc = XLNetModel.from_pretrained(tmp_path / "lm")  # 'transformer.' prefix stripped, head skipped
        close(enc(ids).last_hidden_state, ours.transformer(ids).last_hidden_state, atol=0)
    assert json.loads((tmp_path / "lm" / "config.json").read_text())["architectures"] == ["XLNetLMHeadModel"]


def test_lm_head_is_tied_to_the_word_embedding(tmp_path):
    make_hf(tmp_path)
    ours = XLNetLMHeadModel.from_pretrained(tmp_path)
    with torch.no_grad():
        ours.transformer.word_embedding.weight[7].zero_()
        logits = ours(inputs()[0]).logits
    close(logits[..., 7], ours.lm_bias[7].expand(logits.shape[:2]))


def test_lm_head_refuses_an_encoder_only_checkpoint(tmp_path):
    make_hf(tmp_path, "XLNetModel")
    with pytest.raises(CheckpointError, match=r"no LM head \(lm_loss.bias\).*XLNetModel.from_pretrained"):
        XLNetLMHeadModel.from_pretrained(tmp_path)


def test_loader_names_every_missing_unknown_and_misshaped_weight(tmp_path):
    make_hf(tmp_path, "XLNetModel")
    ours = XLNetModel.from_pretrained(tmp_path)
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    hf_state = {}
    from ctxrep.models.xlnet import hf_parameter_names

    for hf, our in hf_parameter_names(ours.config).items():
        hf_state[hf] = state[our]
    del hf_state["mask_emb"], hf_state["layer.1.rel_attn.r_s_bias"]
    hf_state["layer.0.rel_attn.extra"] = torch.zeros(3)
    hf_state["layer.0.ff.layer_1.weight"] = torch.zeros(10, 32)
    (tmp_path / "model.safetensors").unlink()
    write_safetensors(hf_state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        XLNetModel.from_pretrained(tmp_path)
    msg = str(e.value)
    assert "missing 2 weights: mask_emb, layer.1.rel_attn.r_s_bias" in msg
    assert "1 unknown weights: layer.0.rel_attn.extra" in msg
    assert "layer.0.ff.layer_1.weight (10, 32) (expected (64, 32))" in msg


def test_loader_refuses_an_untied_lm_head(tmp_path):
    make_hf(tmp_path)
    from safetensors.torch import load_file

    state = load_file(tmp_path / "model.safetensors")
    state["lm_loss.weight"] = torch.randn(VOCAB, 32)
    write_safetensors(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="lm_loss.weight differs from word_embedding.weight"):
        XLNetLMHeadModel.from_pretrained(tmp_path)
    state["lm_loss.weight"] = state["transformer.word_embedding.weight"]  # a stored copy of the tied weight is fine
    write_safetensors(state, tmp_path / "model.safetensors")
    XLNetLMHeadModel.from_pretrained(tmp_path)


def test_config_from_hf_dict_reads_the_original_names():
    config = XLNetConfig.from_hf_dict(
        {"n_token": 99, "d_model": 64, "n_head": 4, "n_layer": 1, "untie_r": True, "pad_token_id": None}
    )
    assert (config.vocab_size, config.d_head, config.pad_token_id) == (99, 16, 5)


def test_wrong_model_type_is_refused(tmp_path):
    make_hf(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="model_type is 'bert', expected 'xlnet'"):
        XLNetModel.from_pretrained(tmp_path)


# ---- bad input ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return XLNetLMHeadModel(XLNetConfig(**TINY)).eval()


def test_bad_shapes_are_named(tiny):
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"input_ids must be \(batch, seq\)"):
        tiny(ids[0])
    with pytest.raises(ValueError, match=r"perm_mask must have shape \(2, 5, 5\)"):
        tiny(ids, perm_mask=torch.zeros(2, 5, 4))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(2, 5\)"):
        tiny(ids, attention_mask=torch.ones(5, 2))
    with pytest.raises(ValueError, match=r"target_mapping must have shape \(batch=2, num_predict, seq=5\)"):
        tiny(ids, target_mapping=torch.zeros(2, 1, 6))
    with pytest.raises(ValueError, match=r"labels must have shape \(2, 1\)"):
        tiny(ids, target_mapping=torch.zeros(2, 1, 5), labels=torch.zeros(2, 5, dtype=torch.long))


def test_bad_mems_are_named(tiny):
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"one tensor per layer \(2\), got 1"):
        tiny(ids, mems=[torch.zeros(2, 3, 32)])
    mems = tiny(ids).mems
    with pytest.raises(ValueError, match=r"mems\[0\] .* batch-first .* transpose\(0, 1\)"):
        tiny(ids, mems=[m.transpose(0, 1) for m in mems])


def test_bi_data_needs_an_even_batch():
    model = XLNetModel(XLNetConfig(**TINY | {"bi_data": True}))
    with pytest.raises(ValueError, match="batch has 3 sequences; pass an even batch or set bi_data=False"):
        model(torch.zeros(3, 4, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=30, n_head=4), "d_model 30 is not a multiple of n_head 4"),
        (dict(attn_type="causal"), r"attn_type must be one of \('bi', 'uni'\)"),
        (dict(ff_activation="mish"), "ff_activation 'mish' is not supported"),
        (dict(d_model=32, n_head=4, d_head=16), "d_head 16 must equal d_model // n_head = 8"),
    ],
)
def test_bad_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        XLNetConfig(**kwargs)


def test_training_mode_applies_dropout(tmp_path):
    model = XLNetModel(XLNetConfig(**TINY | {"dropout": 0.5})).train()
    ids = inputs()[0]
    assert not torch.equal(model(ids).last_hidden_state, model(ids).last_hidden_state)
    model.eval()
    assert torch.equal(model(ids).last_hidden_state, model(ids).last_hidden_state)
    assert math.isfinite(model(ids).last_hidden_state.sum().item())


# ---- unpadded batches (modules/unpadding.py) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(attn_type="uni"), dict(bi_data=True, clamp_len=3)],
    ids=["bi", "uni", "bi-data-clamp"],
)
def test_unpadded_content_stream_equals_the_padded_run(overrides):
    """Unpadded, the relative positions, segment terms and masks stay on the padded grid: with rows padded on the
    left (XLNet's tokenizer) and on the right (ctxrep's collate), states, maps, the returned mems and gradients are
    the padded run's at real tokens (0 at padding). Two streams (pretraining) and a memory run padded, unchanged."""
    torch.manual_seed(0)
    model = XLNetModel(XLNetConfig(**TINY | overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():  # large enough that every term moves the states
            p.normal_(std=0.3)
    ids, token_types, perm_mask, target_mapping = inputs(batch=4, seq=12)
    mask = torch.zeros(4, 12, dtype=torch.long)
    for row, (first, end) in enumerate([(0, 12), (7, 12), (0, 4), (10, 12)]):  # rows 1 and 3 padded on the left
        mask[row, first:end] = 1
    real = mask.bool()
    runs, grads = {}, {}
    for share in (None, 0.0):  # None: never unpads; 0: always
        model.unpad_from = share
        model.zero_grad()
        kw = dict(attention_mask=mask, token_type_ids=token_types, output_hidden_states=True, output_attentions=True)
        runs[share] = model(ids, **kw)
        runs[share].last_hidden_state[real].square().sum().backward()
        grads[share] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    padded, unpadded = runs[None], runs[0.0]
    for layer, (a, b) in enumerate(zip(padded.hidden_states, unpadded.hidden_states, strict=True)):
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4, msg=f"hidden state {layer} differs")
        assert (b[~real] == 0).all(), f"hidden state {layer}: padding is not 0"
    assert torch.equal(unpadded.last_hidden_state, unpadded.hidden_states[-1])
    for layer, (a, b) in enumerate(zip(padded.mems, unpadded.mems, strict=True)):  # each layer's input
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4, msg=f"mems {layer} differ")
        assert (b[~real] == 0).all()
    for layer, (a, b) in enumerate(zip(padded.attentions, unpadded.attentions, strict=True)):
        rows = real[:, None, :, None].expand_as(a)  # rows of real query tokens
        torch.testing.assert_close(b[rows], a[rows], atol=1e-5, rtol=1e-4, msg=f"attention {layer} differs")
    assert grads[None].keys() == grads[0.0].keys()
    for name, g in grads[None].items():
        torch.testing.assert_close(grads[0.0][name], g, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
    with torch.no_grad():
        for kw in (
            dict(perm_mask=perm_mask, target_mapping=target_mapping),
            dict(mems=padded.mems),
        ):
            out = []
            for share in (None, 0.0):
                model.unpad_from = share
                out.append(model(ids, attention_mask=mask, token_type_ids=token_types, **kw).last_hidden_state)
            assert torch.equal(out[0], out[1]), f"{list(kw)} must run padded"
