"""A whole T5 (T5ForConditionalGeneration; mT5, flan-t5): parity with transformers (every encoder and decoder state,
attention and the LM logits, padded on either side; T5 v1.0's tied, scaled head and v1.1's own head), the label
shift, incremental decoding, round trips, which folders load as what, and the T5 variants ctxrep does not run."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _parity import padded_batch

import ctxrep
from ctxrep.models.folders import CheckpointError
from ctxrep.models.t5 import T5EncoderModel, T5ForConditionalGeneration

VOCAB, TOL = 60, 1e-5


def hf_model(version: str, model_class=transformers.T5ForConditionalGeneration):
    """T5 v1.0 (relu, tied and scaled head), v1.1 (gated-gelu, its own head) or mT5 (v1.1's network, model_type mt5)."""
    gated = version in ("v1.1", "mt5")
    if version == "mt5":
        model_class, config_class = transformers.MT5ForConditionalGeneration, transformers.MT5Config
    else:
        config_class = transformers.T5Config
    config = config_class(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=6,
        d_ff=24,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=3,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=not gated,
        decoder_start_token_id=0,  # as the published T5 configs have it
        dropout_rate=0.0,
    )
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():  # large relative biases, so that a wrong bucket shows
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.normal_(std=1.0)
    return model


@pytest.fixture(scope="module", params=["v1.0", "v1.1", "mt5"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"t5-{request.param}")
    hf_model(request.param).save_pretrained(path)
    return path


def sources(side: str):
    ids, mask = padded_batch(VOCAB, [9, 3, 14], pad_id=0, low=2)
    for i, n in enumerate(mask.sum(1).tolist()):
        ids[i, n - 1] = 1  # </s>
    if side == "left":
        ids = torch.stack([row.roll(int((m == 0).sum())) for row, m in zip(ids, mask)])
        mask = torch.stack([m.roll(int((m == 0).sum())) for m in mask])
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
def test_every_state_attention_and_logit_matches_transformers(folder, side):
    ours = T5ForConditionalGeneration.from_pretrained(folder)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids, mask = sources(side)
    dec, dec_mask = padded_batch(VOCAB, [4, 7, 2], pad_id=0, seed=3, low=2)
    if side == "left":
        dec_mask = dec_mask.flip(1)
    kwargs = dict(attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    with torch.no_grad():
        a = ours(ids, **kwargs, output_hidden_states=True, output_attentions=True)
        b = ref(input_ids=ids, **kwargs, output_hidden_states=True, output_attentions=True)
    src, tgt = mask.bool(), dec_mask.bool()
    for ours_states, their_states, real in (
        (a.encoder_hidden_states, b.encoder_hidden_states, src),
        (a.decoder_hidden_states, b.decoder_hidden_states, tgt),
    ):
        assert len(ours_states) == len(their_states)
        for i, (x, y) in enumerate(zip(ours_states, their_states)):
            assert (x - y)[real].abs().max() < TOL, f"hidden state {i}"
    for ours_maps, their_maps, real in (
        (a.encoder_attentions, b.encoder_attentions, src),
        (a.decoder_attentions, b.decoder_attentions, tgt),
        (a.cross_attentions, b.cross_attentions, tgt),
    ):
        for x, y in zip(ours_maps, their_maps, strict=True):
            assert (x - y).abs().masked_select(real[:, None, :, None]).max() < TOL
    assert (a.logits - b.logits)[tgt].abs().max() < TOL


def test_loss_and_label_shift_equal_transformers(folder):
    ours = T5ForConditionalGeneration.from_pretrained(folder)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    ids, mask = sources("right")
    labels, label_mask = padded_batch(VOCAB, [5, 3, 6], pad_id=0, seed=4, low=2)
    labels = labels.masked_fill(label_mask == 0, -100)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, labels=labels)
        b = ref(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.allclose(a.logits, b.logits, atol=TOL) and abs(float(a.loss) - float(b.loss)) < TOL
    assert torch.equal(ours.shift_right(labels), ref._shift_right(labels))


def test_incremental_decoding_equals_full_decoding(folder):
    ours = T5ForConditionalGeneration.from_pretrained(folder)
    ids, mask = sources("right")
    dec, _ = padded_batch(VOCAB, [7, 7, 7], pad_id=0, seed=5, low=2)
    with torch.no_grad():
        full = ours(ids, attention_mask=mask, decoder_input_ids=dec).logits
        cache = ours.init_cache(ours.encode_source(ids, mask).last_hidden_state, mask)
        steps = [ours.decode(dec[:, :3], cache).logits]
        steps += [ours.decode(dec[:, i : i + 1], cache).logits for i in range(3, 7)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=TOL)


def test_round_trip_saves_what_transformers_loads(folder, tmp_path):
    ours = T5ForConditionalGeneration.from_pretrained(folder)
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"][0].endswith("ForConditionalGeneration") and saved["is_encoder_decoder"]
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    again = T5ForConditionalGeneration.from_pretrained(tmp_path)
    ids, mask = sources("right")
    dec, _ = padded_batch(VOCAB, [3, 3, 3], pad_id=0, seed=6, low=2)
    with torch.no_grad():
        want = ours(ids, attention_mask=mask, decoder_input_ids=dec).logits
        assert torch.equal(again(ids, attention_mask=mask, decoder_input_ids=dec).logits, want)
        assert torch.allclose(ref(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits, want, atol=TOL)


def test_which_folders_load_as_what(tmp_path):
    """A whole T5 / mT5 (T5ForConditionalGeneration, T5Model, MT5ForConditionalGeneration: flan-t5, mt5) loads with
    its decoder; T5EncoderModel folders (sentence-t5) keep loading as the encoder alone."""
    hf_model("v1.1").save_pretrained(tmp_path / "whole")
    hf_model("v1.0", transformers.T5Model).save_pretrained(tmp_path / "bare")
    hf_model("v1.0", transformers.T5EncoderModel).save_pretrained(tmp_path / "encoder")
    mt5 = transformers.MT5ForConditionalGeneration(transformers.MT5Config(**hf_model("v1.1").config.to_dict()))
    mt5.save_pretrained(tmp_path / "mt5")
    for name, cls, family in (
        ("whole", T5ForConditionalGeneration, "t5"),
        ("bare", T5ForConditionalGeneration, "t5"),
        ("encoder", T5EncoderModel, "t5"),
        ("mt5", T5ForConditionalGeneration, "mt5"),
    ):
        model = ctxrep.load_model(tmp_path / name)
        assert type(model) is cls and model.family == family, name
    whole = ctxrep.load_model(tmp_path / "whole")
    assert whole.num_layers == 2 + 3 and whole.decoder_from == 3


def test_every_parameter_has_a_depth_on_its_side(folder):
    m = T5ForConditionalGeneration.from_pretrained(folder)
    depth = {name: m.layer_of(name) for name, _ in m.named_parameters()}
    assert set(depth.values()) == set(range(m.num_layers + 1))
    assert depth["encoder.final_norm.weight"] == 2 and depth["decoder.layers.0.ffn.wo.weight"] == 3
    assert depth["decoder.layers.0.self_attn.relative_attention_bias.weight"] == 5


@pytest.mark.parametrize(
    "model_type, what",
    [("longt5", "LongT5"), ("umt5", "UMT5"), ("switch_transformers", "Switch Transformers")],
)
def test_t5_variants_ctxrep_does_not_run_are_refused_in_one_line(tmp_path, model_type, what):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "d_model": 16}))
    with pytest.raises(CheckpointError, match=f"config.json: model_type {model_type!r} is {what}") as e:
        ctxrep.load_model(tmp_path)
    assert "\n" not in str(e.value) and "t5, mt5" in str(e.value)


def test_a_whole_t5_with_pruned_heads_is_refused(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text()) | {"pruned_heads": {"0": [1]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="head pruning is for T5 encoders"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)
