"""BART and mBART: parity with transformers (every encoder and decoder state, attention and the LM logits, padded on
either side), incremental decoding, round trips, the encoder interface's teacher-forced layers, and bad folders."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from _parity import padded_batch

from ctxrep.models.bart import BartConfig, BartForConditionalGeneration
from ctxrep.models.folders import CheckpointError

VOCAB, TOL = 50, 1e-5


def hf_model(model_type: str = "bart", **overrides):
    kwargs = dict(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=2,
        encoder_ffn_dim=24,
        decoder_ffn_dim=20,
        max_position_embeddings=32,
        dropout=0.0,
        scale_embedding=model_type == "mbart",
    )
    config_class, model_class = {
        "bart": (transformers.BartConfig, transformers.BartForConditionalGeneration),
        "mbart": (transformers.MBartConfig, transformers.MBartForConditionalGeneration),
    }[model_type]
    torch.manual_seed(0)
    model = model_class(config_class(**(kwargs | overrides))).eval()
    with torch.no_grad():  # random, not zero, so that a left-out bias or norm would show
        model.final_logits_bias.normal_()
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.1)
    return model


@pytest.fixture(scope="module", params=["bart", "mbart"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf_model(request.param).save_pretrained(path)
    return path


def batch(side: str):
    ids, mask = padded_batch(VOCAB, [7, 3, 5], pad_id=1, low=3)
    ids[:, 0] = 0  # <s>
    for i, n in enumerate(mask.sum(1).tolist()):
        ids[i, n - 1] = 2  # </s>
    if side == "left":
        ids = torch.stack([row.roll(int((m == 0).sum())) for row, m in zip(ids, mask)])
        mask = torch.stack([m.roll(int((m == 0).sum())) for m in mask])
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
def test_every_state_attention_and_logit_matches_transformers(folder, side):
    ours = BartForConditionalGeneration.from_pretrained(folder)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids, mask = batch(side)
    dec, dec_mask = padded_batch(VOCAB, [4, 6, 2], pad_id=1, seed=3, low=3)
    if side == "left":
        dec_mask = dec_mask.flip(1)
    kwargs = dict(attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    with torch.no_grad():
        a = ours(ids, **kwargs, output_hidden_states=True, output_attentions=True)
        b = ref(input_ids=ids, **kwargs, output_hidden_states=True, output_attentions=True)
    src, tgt = mask.bool(), dec_mask.bool()
    pairs = [
        (a.encoder_hidden_states, b.encoder_hidden_states, src),
        (a.decoder_hidden_states, b.decoder_hidden_states, tgt),
    ]
    for ours_states, their_states, real in pairs:
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
    """The decoder input derived from labels (BART: </s> first; mBART: the row's last real token first) and the loss."""
    ours = BartForConditionalGeneration.from_pretrained(folder)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids, mask = batch("right")
    labels, label_mask = padded_batch(VOCAB, [5, 3, 6], pad_id=1, seed=4, low=3)
    labels = labels.masked_fill(label_mask == 0, -100)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, labels=labels)
        b = ref(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.allclose(a.logits, b.logits, atol=TOL) and abs(float(a.loss) - float(b.loss)) < TOL
    module = (
        transformers.models.mbart.modeling_mbart if ours.family == "mbart" else transformers.models.bart.modeling_bart
    )
    args = (labels, 1) if ours.family == "mbart" else (labels, 1, 2)
    assert torch.equal(ours.shift_right(labels), module.shift_tokens_right(*args))


def test_incremental_decoding_equals_full_decoding(folder):
    ours = BartForConditionalGeneration.from_pretrained(folder)
    ids, mask = batch("right")
    dec, _ = padded_batch(VOCAB, [6, 6, 6], pad_id=1, seed=5, low=3)
    with torch.no_grad():
        full = ours(ids, attention_mask=mask, decoder_input_ids=dec).logits
        cache = ours.init_cache(ours.encode_source(ids, mask).last_hidden_state, mask)
        steps = [ours.decode(dec[:, :2], cache).logits] + [
            ours.decode(dec[:, i : i + 1], cache).logits for i in range(2, 6)
        ]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=TOL)


def test_round_trip_saves_what_transformers_loads(folder, tmp_path):
    ours = BartForConditionalGeneration.from_pretrained(folder)
    ours.save_pretrained(tmp_path)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    again = BartForConditionalGeneration.from_pretrained(tmp_path)
    ids, mask = batch("right")
    dec, _ = padded_batch(VOCAB, [3, 3, 3], pad_id=1, seed=6, low=3)
    with torch.no_grad():
        want = ours(ids, attention_mask=mask, decoder_input_ids=dec).logits
        assert torch.equal(again(ids, attention_mask=mask, decoder_input_ids=dec).logits, want)
        assert torch.allclose(ref(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits, want, atol=TOL)


def test_a_fresh_model_trains_and_transformers_agrees(tmp_path):
    torch.manual_seed(0)
    model = BartForConditionalGeneration(
        BartConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            max_position_embeddings=16,
        )
    )
    ids, mask = batch("right")
    loss = model(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.shared.weight.grad is not None
    model.eval().save_pretrained(tmp_path)
    ref = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(
            model(ids, attention_mask=mask, labels=ids).logits,
            ref(input_ids=ids, attention_mask=mask, labels=ids).logits,
            atol=TOL,
        )


def test_bare_model_and_classification_folders_load(tmp_path):
    """BartModel's names (no "model." prefix, no LM bias) and BartForSequenceClassification's (its head logged)."""
    ref = hf_model()
    transformers.BartModel(ref.config).save_pretrained(tmp_path / "bare")
    assert BartForConditionalGeneration.from_pretrained(tmp_path / "bare").final_logits_bias.abs().sum() == 0
    torch.manual_seed(0)
    transformers.BartForSequenceClassification(ref.config).save_pretrained(tmp_path / "cls")
    BartForConditionalGeneration.from_pretrained(tmp_path / "cls")


def test_every_parameter_has_a_depth_on_its_side(folder):
    m = BartForConditionalGeneration.from_pretrained(folder)
    e, d = m.encoder_depth, m.decoder_depth
    assert m.num_layers == e + d and m.decoder_from == e + 1
    depth = {name: m.layer_of(name) for name, _ in m.named_parameters()}
    assert depth["shared.weight"] == 0 and depth["encoder.layers.1.fc1.weight"] == 2
    assert depth["decoder.embed_positions.weight"] == e + 1 and depth["decoder.layers.1.fc2.bias"] == e + 2
    with pytest.raises(ValueError, match="not a parameter"):
        m.layer_of("decoder.layers.9.fc1.weight")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("activation_function", "mish", "activation_function 'mish' is not supported"),
        ("static_position_embeddings", True, "static_position_embeddings=True: a bart model with another position"),
        ("extra_pos_embeddings", 0, "extra_pos_embeddings=0"),
        ("normalize_before", True, "a pre-LN BART is an mBART"),
    ],
)
def test_a_folder_the_network_cannot_run_is_refused_before_its_weights(tmp_path, key, value, message):
    hf_model().save_pretrained(tmp_path / "bart")
    config = json.loads((tmp_path / "bart" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {key: value}))
    (tmp_path / "model.safetensors").write_bytes(b"not read")  # refused before any weight is read
    with pytest.raises((CheckpointError, ValueError), match=message) as e:
        BartForConditionalGeneration.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)


# ---- the encoder interface: encoder layers, then decoder layers teacher-forced; classification at the final </s> ----


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory):
    """A tiny BartForSequenceClassification (3 labels) with a BPE tokenizer.json in BART's template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("bart-cls")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    text = ["the dog runs today .", "a cat sleeps often .", "contextual word vectors depend on the sentence"]
    tok.train_from_iterator(
        text * 5, trainers.BpeTrainer(vocab_size=100, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.save(str(path / "tokenizer.json"))
    config = hf_model(vocab_size=tok.get_vocab_size()).config
    config.num_labels = 3
    torch.manual_seed(1)
    transformers.BartForSequenceClassification(config).eval().save_pretrained(path)
    return path


def test_teacher_forced_layers_are_the_encoders_then_the_decoders(classifier_folder):
    """encode(batch): the encoder's E + 1 states, then the decoder's D layers with the text shifted right into it:
    transformers' decoder states of BartModel(input_ids) (decoder_input_ids = shift_tokens_right(input_ids))."""
    import ctxrep

    loaded = ctxrep.load_encoder(classifier_folder)
    m = loaded.model
    ids, mask = batch("right")
    with torch.no_grad():
        ours = m.encode({"input_ids": ids, "attention_mask": mask}, output_attentions=True)
        ref = transformers.BartModel.from_pretrained(classifier_folder, attn_implementation="eager").eval()
        theirs = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    want = [*theirs.encoder_hidden_states, *theirs.decoder_hidden_states[1:]]
    assert len(ours.hidden_states) == len(want) == m.num_layers + 1 == 2 + 2 + 1
    for i, (x, y) in enumerate(zip(ours.hidden_states, want)):
        assert (x - y)[mask.bool()].abs().max() < TOL, f"hidden state {i}"
    assert len(ours.attentions) == 4 and len(ours.cross_attentions) == 2
    assert ours.attentions[2].shape == (3, 2, ids.shape[1], ids.shape[1])  # the decoder's heads, causal
    assert torch.allclose(ours.cross_attentions[1], theirs.cross_attentions[1], atol=TOL)
    assert m.layer_sides() == ["encoder"] * 3 + ["decoder"] * 2
    assert loaded.tokenizer.template.cls_index == -1  # the classification token: the final </s>


def test_classification_pools_the_decoders_final_eos_as_transformers(classifier_folder):
    """ctxrep.rerank's cross-encoder over a BartForSequenceClassification folder: the same logits; the Featurizer's
    cls sentence vector is the decoder's last state at the final </s>."""
    import numpy as np

    import ctxrep
    from ctxrep.rerank import CrossEncoderReranker

    pairs = [("the dog runs", "a cat sleeps often ."), ("contextual vectors", "the sentence")]
    ours = CrossEncoderReranker(str(classifier_folder), activation="identity").predict(pairs)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(classifier_folder / "tokenizer.json"), pad_token="<pad>", eos_token="</s>"
    )
    ref = transformers.BartForSequenceClassification.from_pretrained(classifier_folder).eval()
    with torch.no_grad():
        enc = tok([a for a, _ in pairs], [b for _, b in pairs], return_tensors="pt", padding=True)
        logits = ref(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    np.testing.assert_allclose(ours, logits.numpy(), atol=TOL)
    fz = ctxrep.Featurizer(str(classifier_folder), sentence_pooling="cls")
    text = "the dog runs today ."
    vector = fz.embed_sentences([text])[0]
    with torch.no_grad():
        one = tok([text], return_tensors="pt")
        states = ref.model(input_ids=one["input_ids"]).last_hidden_state  # the decoder's last layer
    np.testing.assert_allclose(vector, states[0, -1].numpy(), atol=TOL)
