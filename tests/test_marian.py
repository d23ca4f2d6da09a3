"""The Transformer encoder-decoder in Marian's layout: parity with transformers' MarianMTModel, incremental decoding,
round trips, loader errors, and the MT tokenizer (tokenizer.json, or an OPUS-MT folder through sentencepiece)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from ctxrep.models.folders import CheckpointError
from ctxrep.models.marian import (
    MarianConfig,
    MarianMTModel,
    projected_smoothed_loss,
    sinusoidal_positions,
)
from ctxrep.text.tokenizer import TokenizerError
from ctxrep.translate.tokenizer import MTTokenizer

PAD, EOS, VOCAB = 59, 0, 60


def hf_config(**overrides) -> transformers.MarianConfig:
    kwargs = dict(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=40,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        forced_eos_token_id=EOS,
        scale_embedding=True,
        activation_function="swish",
        dropout=0.0,
    )
    return transformers.MarianConfig(**(kwargs | overrides))


def save_reference(path, **overrides) -> transformers.MarianMTModel:
    torch.manual_seed(0)
    ref = transformers.MarianMTModel(hf_config(**overrides)).eval()
    with torch.no_grad():  # random, not zero, so that a bias left out would show
        ref.final_logits_bias.normal_()
    ref.save_pretrained(path)
    return ref


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("marian")
    save_reference(path)
    return path


def source_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, PAD, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = PAD
    ids[0, -1], ids[1, 5], ids[2, 2] = EOS, EOS, EOS
    return ids, mask


def target_batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    dec = torch.randint(1, PAD, (3, 7), generator=g)
    dec[:, 0] = PAD  # Marian starts every target with the pad token
    return dec


def test_parity_with_transformers(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ref = transformers.MarianMTModel.from_pretrained(marian_dir, attn_implementation="eager").eval()
    ids, mask = source_batch()
    dec = target_batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, decoder_input_ids=dec, output_hidden_states=True, output_attentions=True)
        b = ref(ids, attention_mask=mask, decoder_input_ids=dec, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, attention_mask=mask, decoder_input_ids=dec)  # scaled_dot_product_attention everywhere
    real = mask.bool()
    assert a.logits.shape == (3, 7, VOCAB)
    assert len(a.encoder_hidden_states) == len(b.encoder_hidden_states) == 3
    for layer, (x, y) in enumerate(zip(a.encoder_hidden_states, b.encoder_hidden_states)):
        assert torch.allclose(x[real], y[real], atol=1e-5), f"encoder hidden state {layer} differs"
    for layer, (x, y) in enumerate(zip(a.decoder_hidden_states, b.decoder_hidden_states)):
        assert torch.allclose(x, y, atol=1e-5), f"decoder hidden state {layer} differs"
    assert torch.allclose(a.logits, b.logits, atol=1e-5)
    assert torch.allclose(fast.logits, b.logits, atol=1e-5)
    for x, y in zip(a.encoder_attentions, b.encoder_attentions):
        q = real[:, None, :, None].expand_as(x)
        assert torch.allclose(x[q], y[q], atol=1e-5)
    for x, y in zip(a.decoder_attentions, b.decoder_attentions):
        assert torch.allclose(x, y, atol=1e-5)
    for x, y in zip(a.cross_attentions, b.cross_attentions):
        assert x.shape == (3, 4, 7, 9)
        assert torch.allclose(x, y, atol=1e-5)
        assert torch.all(x[~real[:, None, None, :].expand_as(x)] == 0)  # no attention on source padding


def test_loss_matches_transformers_and_ignores_padding(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ref = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    ids, mask = source_batch()
    labels = target_batch()[:, 1:]
    labels[:, -1] = EOS
    hf_labels = labels.clone()
    labels[2, 4:] = PAD  # ours: pad labels do not count
    hf_labels[2, 4:] = -100
    hf_labels[2, 4] = PAD  # transformers shifts -100 to pad too; only the loss mask differs
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, labels=labels)
        b = ref(ids, attention_mask=mask, labels=hf_labels.masked_fill(hf_labels == PAD, -100))
        smoothed = ours(ids, attention_mask=mask, labels=labels, label_smoothing=0.1)
    assert a.num_tokens == 3 * 6 - 2
    assert torch.allclose(a.loss, b.loss, atol=1e-5)
    assert not torch.allclose(smoothed.loss, a.loss)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_projected_smoothed_loss_equals_cross_entropy_of_the_full_logits(epsilon):
    # Chunks of 2 tokens (chunk_elements = 2 x vocab) over 7 tokens: three full chunks and a remainder.
    g = torch.Generator().manual_seed(3)
    states = torch.randn(7, 16, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 16, generator=g, requires_grad=True)
    bias = torch.randn(VOCAB, generator=g)
    targets = torch.randint(0, VOCAB, (7,), generator=g)
    loss, nll = projected_smoothed_loss(states, weight, bias, targets, epsilon, chunk_elements=2 * VOCAB)
    (2.0 * loss).backward()  # the incoming gradient scales the stored ones
    logits = states @ weight.t() + bias
    ref = torch.nn.functional.cross_entropy(logits, targets, label_smoothing=epsilon, reduction="sum")
    ref_nll = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    ref_states, ref_weight = torch.autograd.grad(2.0 * ref, [states, weight])
    assert torch.allclose(loss, ref, atol=1e-4) and torch.allclose(nll, ref_nll, atol=1e-4)
    assert not nll.requires_grad
    assert torch.allclose(states.grad, ref_states, atol=1e-5)
    assert torch.allclose(weight.grad, ref_weight, atol=1e-5)
    with torch.no_grad():  # evaluation: the same numbers, no gradients computed
        same, _ = projected_smoothed_loss(states, weight, bias, targets, epsilon, chunk_elements=2 * VOCAB)
    assert torch.allclose(same, ref, atol=1e-4)


def test_training_loss_fast_path_equals_the_full_logits_reference(marian_dir):
    from ctxrep.translate.train import TranslationObjective

    ids, mask = source_batch()
    dec = target_batch()
    labels = torch.cat([dec[:, 1:], torch.full((3, 1), EOS)], dim=1)
    labels[1, 5:] = -100  # padding positions: left out by both paths
    labels[2, 3:] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec, "labels": labels}
    outputs, grads = [], []
    for fast in (True, False):
        model = MarianMTModel.from_pretrained(marian_dir).train()  # dropout 0: both paths see the same network
        objective = TranslationObjective(model, label_smoothing=0.1, fast_loss=fast)
        out = objective(batch)
        out.loss.backward()
        outputs.append(out)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    fast, reference = outputs
    assert fast.num_tokens == reference.num_tokens == int(mask.sum()) + int((labels != -100).sum())
    assert torch.allclose(fast.loss, reference.loss, atol=1e-5)
    assert fast.metrics["nll"] == pytest.approx(reference.metrics["nll"], abs=1e-5)
    assert grads[0].keys() == grads[1].keys() and "shared.weight" in grads[0]
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5), f"gradient of {name} differs"


def test_translation_loss_is_a_deprecated_name_of_seq2seq_loss(marian_dir):
    model = MarianMTModel.from_pretrained(marian_dir)
    ids, mask = source_batch()
    dec = target_batch()
    labels = torch.cat([dec[:, 1:], torch.full((3, 1), EOS)], dim=1)
    with pytest.warns(DeprecationWarning, match="translation_loss is deprecated .* use seq2seq_loss"):
        old = model.translation_loss(ids, mask, dec, labels)
    new = model.seq2seq_loss(ids, mask, dec, labels)
    assert torch.equal(old[0], new[0]) and old[2] == new[2]


def test_incremental_decoding_equals_full_decoding(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ids, mask = source_batch()
    dec = target_batch()
    with torch.no_grad():
        full = ours(ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
        memory = ours.encode_source(ids, mask).last_hidden_state
        cache = ours.init_cache(memory, mask)
        steps = [ours.decode(dec[:, :3], cache)]  # a prefix of three, then one token at a time
        steps += [ours.decode(dec[:, i : i + 1], cache, output_attentions=True) for i in range(3, 7)]
    assert cache.length == 7
    logits = torch.cat([s.logits for s in steps], dim=1)
    assert torch.allclose(logits, full.logits, atol=1e-5)
    for layer in range(2):
        step_probs = torch.cat([s.cross_attentions[layer] for s in steps[1:]], dim=2)
        assert torch.allclose(step_probs, full.cross_attentions[layer][:, :, 3:], atol=1e-5)


def test_incremental_decoding_equals_transformers_with_its_cache(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ref = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    ids, mask = source_batch()
    dec = target_batch()
    with torch.no_grad():
        cache = ours.init_cache(ours.encode_source(ids, mask).last_hidden_state, mask)
        enc = ref.get_encoder()(ids, attention_mask=mask)
        past = None
        for i in range(dec.shape[1]):
            a = ours.decode(dec[:, i : i + 1], cache).logits
            b = ref(
                encoder_outputs=enc,
                attention_mask=mask,
                decoder_input_ids=dec[:, i : i + 1],
                past_key_values=past,
                use_cache=True,
            )
            past = b.past_key_values
            assert torch.allclose(a, b.logits, atol=1e-5), f"step {i}"


def test_cache_reorder_and_keep_follow_the_rows(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ids, mask = source_batch()
    dec = target_batch()
    beams = 2
    with torch.no_grad():
        memory = ours.encode_source(ids, mask).last_hidden_state
        cache = ours.init_cache(memory, mask, group=beams)
        rows = dec.repeat_interleave(beams, dim=0)  # (6, 7): two beams per sentence
        rows[1::2, 1:] = torch.randint(1, PAD, (3, 6), generator=torch.Generator().manual_seed(3))
        ours.decode(rows[:, :4], cache)
        # Swap the two beams of sentence 0 and copy beam 0 of sentence 2 to both its rows; drop sentence 1.
        cache.reorder(torch.tensor([1, 0, 2, 3, 4, 4]))
        cache.keep(torch.tensor([0, 2]))
        step = ours.decode(rows[[1, 0, 4, 4], 4:5], cache).logits
        keep = torch.tensor([0, 2])
        full = ours(
            ids[keep].repeat_interleave(2, 0),
            attention_mask=mask[keep].repeat_interleave(2, 0),
            decoder_input_ids=rows[[1, 0, 4, 4], :5],
        ).logits
    assert torch.allclose(step[:, 0], full[:, 4], atol=1e-5)


def test_encoder_interface(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ids, mask = source_batch()
    assert (ours.family, ours.word_level, ours.reads_segments) == ("marian", False, False)
    assert (ours.num_layers, ours.num_heads, ours.hidden_size, ours.max_tokens) == (2, 4, 16, 40)
    assert ours.input_embeddings() is ours.shared.weight
    with torch.no_grad():
        out = ours.encode(
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}, output_attentions=True
        )
        first = ours.encode({"input_ids": ids, "attention_mask": mask}, num_layers=1)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])
    assert torch.allclose(first.hidden_states[1], out.hidden_states[1])


def test_positions_are_marian_not_interleaved():
    pe = sinusoidal_positions(50, 8)
    pos = torch.arange(50.0)
    for i in range(4):  # sin(pos / 10000^(2i/d)) in column i, its cosine in column 4 + i
        assert torch.allclose(pe[:, i], torch.sin(pos / 10000 ** (2 * i / 8)), atol=1e-6)
        assert torch.allclose(pe[:, 4 + i], torch.cos(pos / 10000 ** (2 * i / 8)), atol=1e-6)
    ref = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(50, 8).create_weight()
    assert torch.equal(pe, ref)
    assert torch.allclose(
        sinusoidal_positions(7, 5),
        transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(7, 5).create_weight(),
    )


def test_save_round_trip_loads_in_transformers(marian_dir, tmp_path):
    ours = MarianMTModel.from_pretrained(marian_dir)
    ours.save_pretrained(tmp_path)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(ref) is transformers.MarianMTModel
    again = MarianMTModel.from_pretrained(tmp_path)
    ids, mask = source_batch()
    dec = target_batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = ref(ids, attention_mask=mask, decoder_input_ids=dec).logits
        c = again(ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert torch.equal(a, c)
    assert json.loads((tmp_path / "generation_config.json").read_text())["bad_words_ids"] == [[PAD]]


def test_fresh_model_saves_and_transformers_agrees(tmp_path):
    torch.manual_seed(0)
    ours = MarianMTModel(
        MarianConfig(
            vocab_size=30,
            d_model=8,
            encoder_layers=1,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            max_position_embeddings=16,
            dropout=0.0,
        )
    ).eval()
    ours.save_pretrained(tmp_path)
    ref = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 30, (2, 5))
    dec = torch.randint(3, 30, (2, 4))
    with torch.no_grad():
        assert torch.allclose(
            ours(ids, decoder_input_ids=dec).logits, ref(ids, decoder_input_ids=dec).logits, atol=1e-5
        )


def test_separate_vocabularies_round_trip(tmp_path):
    ref = save_reference(tmp_path / "hf", share_encoder_decoder_embeddings=False, decoder_vocab_size=70)
    ours = MarianMTModel.from_pretrained(tmp_path / "hf")
    assert ours.decoder_embed_tokens is not None
    ids, mask = source_batch()
    dec = target_batch()
    with torch.no_grad():
        assert torch.allclose(
            ours(ids, attention_mask=mask, decoder_input_ids=dec).logits,
            ref(ids, attention_mask=mask, decoder_input_ids=dec).logits,
            atol=1e-5,
        )
        ours.save_pretrained(tmp_path / "ours")
        again = transformers.MarianMTModel.from_pretrained(tmp_path / "ours").eval()
        assert torch.allclose(
            again(ids, attention_mask=mask, decoder_input_ids=dec).logits,
            ref(ids, attention_mask=mask, decoder_input_ids=dec).logits,
            atol=1e-5,
        )


def test_pre_ln_saves_only_in_ctxrep_format(tmp_path):
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=30,
        d_model=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_position_embeddings=16,
        normalize_before=True,
        dropout=0.0,
    )
    ours = MarianMTModel(config).eval()
    with pytest.raises(ValueError, match="cannot save a pre-LayerNorm model .* save with format='ctxrep'"):
        ours.save_pretrained(tmp_path / "m", format="marian")
    ours.save_pretrained(tmp_path / "own")  # "auto" picks ctxrep's format
    saved = json.loads((tmp_path / "own" / "config.json").read_text())
    assert saved["model_type"] == "ctxrep_mt" and saved["normalize_before"] is True
    assert "model.encoder.layer_norm.weight" in load_file(tmp_path / "own" / "model.safetensors")
    again = MarianMTModel.from_pretrained(tmp_path / "own")
    assert again.config.normalize_before
    ids, dec = torch.randint(3, 30, (2, 5)), torch.randint(3, 30, (2, 4))
    with torch.no_grad():
        assert torch.equal(ours(ids, decoder_input_ids=dec).logits, again(ids, decoder_input_ids=dec).logits)


def test_older_checkpoint_with_tied_copies_and_pytorch_bin_loads(marian_dir, tmp_path):
    # transformers 4.x saved every tied copy and the sinusoidal tables; OPUS-MT ships pytorch_model.bin.
    state = load_file(marian_dir / "model.safetensors")
    state["model.encoder.embed_tokens.weight"] = state["model.shared.weight"]
    state["model.decoder.embed_tokens.weight"] = state["model.shared.weight"]
    state["lm_head.weight"] = state["model.shared.weight"]
    state["model.encoder.embed_positions.weight"] = sinusoidal_positions(40, 16)
    state["model.decoder.embed_positions.weight"] = sinusoidal_positions(40, 16)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((marian_dir / "config.json").read_text())
    a, b = MarianMTModel.from_pretrained(marian_dir), MarianMTModel.from_pretrained(tmp_path)
    ids, mask = source_batch()
    with torch.no_grad():
        assert torch.equal(
            a(ids, attention_mask=mask, decoder_input_ids=target_batch()).logits,
            b(ids, attention_mask=mask, decoder_input_ids=target_batch()).logits,
        )
    state["model.decoder.embed_positions.weight"] = torch.zeros(40, 16)  # learned positions: not a Marian model
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(
        CheckpointError, match="model.decoder.embed_positions.weight differs from the sinusoidal position table"
    ):
        MarianMTModel.from_pretrained(tmp_path)


def test_unknown_missing_and_misshaped_weights_are_all_named(marian_dir, tmp_path):
    state = load_file(marian_dir / "model.safetensors")
    state["model.encoder.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    del state["model.decoder.layers.1.encoder_attn.k_proj.bias"]
    state["model.encoder.layers.1.fc1.weight"] = torch.zeros(5, 16)
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((marian_dir / "config.json").read_text())
    with pytest.raises(CheckpointError) as e:
        MarianMTModel.from_pretrained(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert "missing 1 weights: model.decoder.layers.1.encoder_attn.k_proj.bias" in msg
    assert "1 unknown weights: model.encoder.layers.0.self_attn.extra.weight" in msg
    assert "model.encoder.layers.1.fc1.weight (5, 16) (expected (32, 16))" in msg


def test_checkpoint_of_another_model_type_is_refused(tmp_path):
    transformers.BertModel(
        transformers.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
    ).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"model_type is 'bert', expected 'marian' or 'ctxrep_mt'") as e:
        MarianMTModel.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)


def test_marian_config_switch_that_changes_the_network_is_refused(marian_dir, tmp_path):
    config = json.loads((marian_dir / "config.json").read_text()) | {"normalize_embedding": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="normalize_embedding=True, which a Marian model does not support"):
        MarianMTModel.from_pretrained(tmp_path)


def test_too_long_source_is_refused(marian_dir):
    ours = MarianMTModel.from_pretrained(marian_dir)
    with pytest.raises(ValueError, match="sequence of 41 tokens is longer than the model's 40 positions"):
        ours.encode_source(torch.ones(1, 41, dtype=torch.long))


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="d_model 10 is not a multiple of encoder_attention_heads 4"):
        MarianConfig(d_model=10, encoder_attention_heads=4)
    with pytest.raises(ValueError, match="activation_function 'mish' is not supported"):
        MarianConfig(activation_function="mish")


# ---- unpadded source batches (modules/unpadding.py) -----------------------------------------------------------


@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-LN", "pre-LN"])
def test_unpadded_encoder_equals_padded_and_translates_the_same(pre_ln):
    """A source batch with much padding runs the encoder unpadded: the padded run's encoder states (pre-LN: the
    stack's final LayerNorm, which a num_layers cut leaves out), attentions, the decoder's cross-attention keys and
    values at real tokens (projected unpadded too), training loss and gradients, and the same greedy and beam
    translations."""
    from _mt_reverser import sources

    from ctxrep.translate.search import beam_search, greedy_search

    torch.manual_seed(0)
    config = hf_config(normalize_before=pre_ln).to_dict()
    model = MarianMTModel(MarianConfig.from_hf_dict(config | {"model_type": "ctxrep_mt"})).eval()
    ids, mask = sources(8)  # 3 to 13 tokens
    real = mask.bool()
    assert model.unpadding(mask) is not None and 1 - real.float().mean() > 0.3
    labels = ids.clone()  # copy the source: any target does for the loss
    out, grads, searches = {}, {}, {}
    for path, share in (("padded", None), ("unpadded", 0.0)):
        model.unpad_from = share
        model.zero_grad()
        full = model.encode_source(ids, mask, output_hidden_states=True, output_attentions=True)
        cut = model.encode_source(ids, mask, output_hidden_states=True, num_layers=1)
        loss, _, _ = model.seq2seq_loss(ids, mask, model.shift_right(labels), labels.masked_fill(~real, -100))
        loss.backward()
        with torch.no_grad():
            cross = model.init_cache(full.last_hidden_state, mask).cross  # per layer (batch, heads, src, head_dim)
        out[path] = full, cut, loss.detach(), [kv for layer in cross for kv in layer]
        grads[path] = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        searches[path] = greedy_search(model, ids, mask), beam_search(model, ids, mask, beam=3, n_best=2)
    (full_a, cut_a, loss_a, cross_a), (full_b, cut_b, loss_b, cross_b) = out["padded"], out["unpadded"]
    for a, b in zip(full_a.hidden_states + cut_a.hidden_states, full_b.hidden_states + cut_b.hidden_states):
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-4)
        assert (b[~real] == 0).all()
    assert torch.equal(full_b.last_hidden_state, full_b.hidden_states[-1])
    for a, b in zip(full_a.attentions, full_b.attentions):
        rows = real[:, None, :, None].expand_as(a)
        torch.testing.assert_close(b[rows], a[rows], atol=1e-5, rtol=1e-4)
    for a, b in zip(cross_a, cross_b):
        torch.testing.assert_close(b.transpose(1, 2)[real], a.transpose(1, 2)[real], atol=1e-5, rtol=1e-4)
        assert (b.transpose(1, 2)[~real] == 0).all()
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=1e-5)
    assert grads["padded"].keys() == grads["unpadded"].keys()
    for name, g in grads["padded"].items():
        torch.testing.assert_close(grads["unpadded"][name], g, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")
    greedy, beams = searches["unpadded"]
    assert greedy == searches["padded"][0]
    assert [[h.tokens for h in n] for n in beams] == [[h.tokens for h in n] for n in searches["padded"][1]]
    assert [h.score for n in beams for h in n] == pytest.approx([h.score for n in searches["padded"][1] for h in n])


# ---- the MT tokenizer -------------------------------------------------------------------------------------------

LINES = [
    "A man in a blue shirt is standing on a ladder.",
    "Two dogs play in the snow.",
    "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    "Zwei Hunde spielen im Schnee.",
    "A little girl climbs into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "People are walking down the street near a market.",
    "Leute gehen die Straße entlang nahe einem Markt.",
]


@pytest.fixture(scope="module")
def opus_dir(tmp_path_factory):
    """An OPUS-MT-style folder: source.spm, target.spm (tiny SentencePiece models trained here), vocab.json."""
    import sentencepiece as spm

    path = tmp_path_factory.mktemp("opus")
    for side, lines in (("source", LINES[0::2] * 6), ("target", LINES[1::2] * 6)):
        (path / f"{side}.txt").write_text("\n".join(lines) + "\n")
        spm.SentencePieceTrainer.train(
            input=str(path / f"{side}.txt"),
            model_prefix=str(path / side),
            vocab_size=45,
            model_type="unigram",
            character_coverage=1.0,
            hard_vocab_limit=False,
            minloglevel=2,
        )
        (path / f"{side}.model").rename(path / f"{side}.spm")
    pieces = []
    for side in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(path / f"{side}.spm"))
        pieces += [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]  # after <unk> <s> </s>
    vocab = {"</s>": 0, "<unk>": 1, ">>de<<": 2}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)  # OPUS-MT: pad is the last id
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (path / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    return path


def test_opus_mt_tokenizer_agrees_with_marian_tokenizer(opus_dir):
    ours = MTTokenizer.from_model_dir(opus_dir)
    ref = transformers.MarianTokenizer.from_pretrained(opus_dir)
    texts = ["A man in a blue shirt.", ">>de<< Two dogs play.", "Zebras quietly jump!", "Ein Mädchen spielt.", ""]
    assert ours.encode_source(texts) == [ref(t)["input_ids"] for t in texts]
    assert ours.encode_source(texts)[0][-1] == ours.eos_id == 0
    assert (ours.pad_id, ours.unk_id, ours.vocab_size) == (ref.pad_token_id, ref.unk_token_id, len(ref))
    targets = ["Zwei Hunde spielen im Schnee.", "Ein kleines Mädchen."]
    target_ids = ours.encode_target(targets)
    assert target_ids == [ref(text_target=t)["input_ids"] for t in targets]
    assert ours.decode_batch(target_ids) == targets
    assert ours.decode_batch(target_ids) == [ref.decode(ids, skip_special_tokens=True) for ids in target_ids]
    assert ours.decode([ours.pad_id] + target_ids[0]) == targets[0]


def test_tokenizer_json_tokenizer(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(LINES * 5, trainers.BpeTrainer(vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    ours = MTTokenizer.from_model_dir(tmp_path)
    assert (ours.pad_id, ours.eos_id, ours.unk_id) == (0, 1, 2)
    ids = ours.encode_source(["Two dogs play in the snow.", "Zwei Hunde"])
    assert ids[0][:-1] == tok.encode("Two dogs play in the snow.", add_special_tokens=False).ids
    assert ids[0][-1] == 1 and ids[1][-1] == 1
    assert ours.decode_batch(ids) == ["Two dogs play in the snow.", "Zwei Hunde"]


def test_folder_without_tokenizer_is_a_one_line_error(marian_dir):
    with pytest.raises(TokenizerError, match=r"no MT tokenizer: expected tokenizer\.json, or source\.spm") as e:
        MTTokenizer.from_model_dir(marian_dir)
    assert "\n" not in str(e.value)


def test_opus_folder_missing_a_file_names_it(opus_dir, tmp_path):
    for name in ("source.spm", "target.spm"):
        (tmp_path / name).write_bytes((opus_dir / name).read_bytes())
    with pytest.raises(TokenizerError, match="vocab.json is missing"):
        MTTokenizer.from_model_dir(tmp_path)
