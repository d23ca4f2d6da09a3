"""The Featurizer over the other model families: ELMo (word level), XLNet (specials at the end), GPT-2 (causal)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from conftest import first_pieces

from ctxrep import Featurizer
from ctxrep.models.elmo import ElmoBiLM
from ctxrep.text.char_ids import batch_to_ids

TEXTS = ["the crane lifted the dog", "a brown fox", "word vectors depend on context and on the sentence"]


def test_elmo_word_vectors_equal_a_direct_run(elmo_dir):
    fz = Featurizer(f"elmo:{elmo_dir}", layers="all")
    vecs = fz.embed_words(TEXTS)
    model = ElmoBiLM.from_pretrained(elmo_dir).eval()
    assert [v.shape for v in vecs] == [(len(t.split()), 3, 16) for t in TEXTS]
    for text, v in zip(TEXTS, vecs):
        with torch.no_grad():
            out = model(batch_to_ids([text.split()]))
        direct = torch.stack(out.hidden_states, dim=2)[0].numpy()  # (words, layers, dim)
        np.testing.assert_allclose(v, direct, atol=1e-5)
    # layer 0 is the context-free token vector, duplicated for both directions
    np.testing.assert_allclose(vecs[0][:, 0, :8], vecs[0][:, 0, 8:])
    np.testing.assert_allclose(vecs[0][1, 0], vecs[1][0, 0] * 0 + vecs[0][1, 0])
    assert not np.allclose(vecs[0][0, 2], vecs[0][3, 2], atol=1e-4), "'the' differs by context at layer 2"
    np.testing.assert_allclose(vecs[0][0, 0], vecs[0][3, 0], atol=1e-6)  # ...but not at layer 0


def test_elmo_sentence_vectors_and_cls_refused(elmo_dir):
    fz = Featurizer(f"elmo:{elmo_dir}", layers=-1)
    assert fz.embed_sentences(TEXTS).shape == (3, 16)
    with pytest.raises(ValueError, match="elmo has no classification token"):
        Featurizer(f"elmo:{elmo_dir}", sentence_pooling="cls")


def test_xlnet_word_vectors_match_transformers(xlnet_dir):
    fz = Featurizer(str(xlnet_dir), layers=-1, pooling="last")
    assert fz.tokenizer.template.cls_index == -1 and fz.tokenizer.template.prefix == []
    vecs = fz.embed_words(TEXTS)
    ref = transformers.XLNetModel.from_pretrained(xlnet_dir).eval()
    for text, v in zip(TEXTS, vecs):
        enc = fz.tokenizer.backend.encode(text.split(), is_pretokenized=True)
        with torch.no_grad():
            h = ref(torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids])).last_hidden_state[0]
        last = [max(i for i, w in enumerate(enc.word_ids) if w == k) for k in range(len(text.split()))]
        np.testing.assert_allclose(v, h[last].numpy(), atol=1e-5)
    # "first" skips a word's bare "▁" piece (the same piece for every word this small vocabulary splits)
    first = Featurizer(str(xlnet_dir), layers=-1, pooling="first").embed_words(TEXTS[:1])[0]
    enc = fz.tokenizer.backend.encode(TEXTS[0].split(), is_pretokenized=True)
    with torch.no_grad():
        h = ref(torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids])).last_hidden_state[0]
    starts = first_pieces(enc, len(TEXTS[0].split()))
    assert starts != [enc.word_ids.index(k) for k in range(len(starts))], "the test needs a word split as '▁' + pieces"
    np.testing.assert_allclose(first, h[starts].numpy(), atol=1e-5)
    cls = Featurizer(str(xlnet_dir), layers=-1, sentence_pooling="cls").embed_sentences(TEXTS[:1])[0]
    enc = fz.tokenizer.backend.encode(TEXTS[0].split(), is_pretokenized=True)
    with torch.no_grad():
        h = ref(torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids])).last_hidden_state[0]
    np.testing.assert_allclose(cls, h[-1].numpy(), atol=1e-5)  # XLNet's <cls> is the last token


def test_gpt2_word_vectors_match_transformers_and_see_only_the_left(gpt2_dir):
    fz = Featurizer(str(gpt2_dir), layers="all", pooling="first")
    vecs = fz.embed_words(TEXTS)
    ref = transformers.GPT2Model.from_pretrained(gpt2_dir).eval()
    for text, v in zip(TEXTS, vecs):
        enc = fz.tokenizer.backend.encode(text.split(), is_pretokenized=True)
        with torch.no_grad():
            hs = ref(torch.tensor([enc.ids]), output_hidden_states=True).hidden_states
        first = first_pieces(enc, len(text.split()))
        np.testing.assert_allclose(v, torch.stack(hs, 2)[0, first].numpy(), atol=1e-5)
    # causal: a word's vector does not change when words are added after it
    longer = fz.embed_words([TEXTS[1] + " jumps over"])[0]
    np.testing.assert_allclose(longer[:3], vecs[1], atol=1e-5)


@pytest.mark.parametrize("family", ["elmo", "xlnet", "gpt2"])
def test_batch_and_alone_agree(family, elmo_dir, xlnet_dir, gpt2_dir):
    name = {"elmo": f"elmo:{elmo_dir}", "xlnet": str(xlnet_dir), "gpt2": str(gpt2_dir)}[family]
    fz = Featurizer(name, layers="all")
    together = fz.embed_words(TEXTS)
    for text, v in zip(TEXTS, together):
        np.testing.assert_allclose(fz.embed_words([text])[0], v, atol=1e-5)


def test_xlnet_long_text_is_windowed(xlnet_dir):
    """A text longer than a window: each word's vector is the one its owning window gives, i.e. that window's words
    embedded alone (windows start and end on word boundaries; XLNet's relative positions restart in each)."""
    from ctxrep.text.inputs import split_windows

    fz = Featurizer(str(xlnet_dir), layers=-1, max_length=16, stride=6)
    words = " ".join(TEXTS * 4).split()
    vectors = fz.embed_words([words])[0]
    assert vectors.shape == (len(words), 32)
    spans = fz.tokenizer.encode_words([words])[0].spans()
    windows = split_windows(spans, fz.plan.window_size, fz.plan.stride)
    assert len(windows) > 3
    owners = set()
    for p0, p1, owned in windows:
        w0 = next(w for w, (s, _) in enumerate(spans) if s >= p0)
        w1 = max(w for w, (_, e) in enumerate(spans) if e <= p1) + 1
        alone = fz.embed_words([words[w0:w1]])[0]
        np.testing.assert_allclose(vectors[owned], alone[[w - w0 for w in owned]], rtol=1e-5, atol=1e-5)
        owners.update(owned)
    assert owners == set(range(len(words)))  # every word owned by one window


def test_xlnet_texts_are_windowed_at_512_pieces(xlnet_dir):
    """XLNet's relative positions have no table to run out of: texts are cut at its pretraining length, 512 pieces
    with the special tokens (they were once cut at 4,096, the limit meant for ELMo's words)."""
    fz = Featurizer(str(xlnet_dir), layers=-1)
    assert fz.model.max_tokens == 512 and fz.plan.max_length == 512
    words = " ".join(TEXTS * 60).split()
    pieces = fz.tokenizer.encode_words([words])[0]
    assert len(pieces.ids) > 2 * 512
    windows = fz.plan.single(0, pieces)
    assert len(windows) >= 3 and 480 <= max(len(w) for w in windows) <= 512
    assert sorted(word for w in windows for word, _, _ in w.words) == list(range(len(words)))
    assert fz.embed_words([words])[0].shape == (len(words), 32)
