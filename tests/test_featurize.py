"""Featurizer: word alignment, pooling, layer choice, long inputs, batching invariance, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from conftest import first_pieces

import ctxrep
from ctxrep import Featurizer, ScalarMix
from ctxrep.models.loading import CheckpointError
from ctxrep.text.inputs import WindowPlan, collate, split_windows, token_budget_batches, window_words
from ctxrep.text.tokenizer import WordPieces

TEXTS = ["The vase broke .", "Unbelievably, the newscaster broke into the broadcast!", ["Pre", "tokenized", "words"]]


@pytest.fixture(scope="module")
def fz_all():
    return Featurizer("minilm", layers="all", pooling="mean")


def reference_word_vectors(path, words: list[str], pooling: str) -> np.ndarray:
    """Word vectors computed independently with transformers' tokenizer and BertModel: (n_words, layers, hidden)."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    enc = tok(words, is_split_into_words=True, return_tensors="pt", truncation=False)
    with torch.no_grad():
        hs = torch.stack(model(**enc, output_hidden_states=True).hidden_states)[:, 0]  # (layers, seq, hidden)
    word_ids = enc.word_ids()
    out = []
    for w in range(len(words)):
        pos = [i for i, x in enumerate(word_ids) if x == w]
        pieces = hs[:, pos]
        out.append(
            {
                "mean": pieces.mean(1),
                "first": pieces[:, 0],
                "last": pieces[:, -1],
                "first_last": torch.cat([pieces[:, 0], pieces[:, -1]], -1),
            }[pooling]
        )
    return torch.stack(out).numpy()


@pytest.mark.parametrize("pooling", ["first", "last", "mean", "first_last"])
def test_word_vectors_match_transformers_for_every_pooling(minilm_path, pooling):
    fz = Featurizer("minilm", layers="all", pooling=pooling)
    words = "Unbelievably , the newscaster broke into the broadcast !".split()
    ours = fz.embed_words([words])[0]
    ref = reference_word_vectors(minilm_path, words, pooling)
    assert ours.shape == (len(words), 7, 384 * (2 if pooling == "first_last" else 1))
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_roberta_word_vectors_match_transformers(tiny_models):
    path = tiny_models["roberta"]
    fz = Featurizer(path, layers=-1, pooling="first")
    words = "The quick brown fox jumps".split()
    tok = fz.tokenizer.backend
    enc = tok.encode(words, is_pretokenized=True)
    ref = transformers.RobertaModel.from_pretrained(path).eval()
    with torch.no_grad():
        h = ref(torch.tensor([enc.ids])).last_hidden_state[0]
    first = first_pieces(enc, len(words))  # this small vocabulary has no "ĠThe": "Ġ" "T" "he", pooled from "T"
    assert enc.tokens[1] == "\u0120" and first[0] == 2
    np.testing.assert_allclose(fz.embed_words([words])[0], h[first].numpy(), atol=1e-5)
    assert enc.ids[0] == 0 and enc.ids[-1] == 2  # <s> ... </s>


def test_shapes_for_each_layer_choice(fz_all):
    n = [4, 7, 3]
    assert [v.shape for v in fz_all.embed_words(TEXTS)] == [(k, 7, 384) for k in n]
    one = Featurizer("minilm", layers=2).embed_words(TEXTS)
    assert [v.shape for v in one] == [(k, 384) for k in n]
    few = Featurizer("minilm", layers=[0, -1]).embed_words(TEXTS)
    assert [v.shape for v in few] == [(k, 2, 384) for k in n]
    full = fz_all.embed_words(TEXTS)
    np.testing.assert_allclose(one[1], full[1][:, 2], atol=1e-6)
    np.testing.assert_allclose(few[1][:, 1], full[1][:, 6], atol=1e-6)


def test_fixed_scalar_mix_is_gamma_times_softmax_weighted_sum(fz_all):
    weights = [1, 2, 3, 4, 5, 6, 7]
    mix = ScalarMix.from_weights(weights, gamma=0.5)
    mixed = Featurizer("minilm", layers=mix).embed_words(TEXTS[:1])[0]
    full = fz_all.embed_words(TEXTS[:1])[0]
    w = np.array(weights, dtype=np.float32) / sum(weights)
    np.testing.assert_allclose(mixed, 0.5 * np.einsum("l,nlh->nh", w, full), atol=1e-5)
    average = Featurizer("minilm", layers="mix").embed_words(TEXTS[:1])[0]
    np.testing.assert_allclose(average, full.mean(axis=1), atol=1e-5)


def test_word_ids_are_exposed(fz_all):
    a = fz_all.tokenize(["Unbelievably, it broke"])[0]
    assert a.words == ["Unbelievably,", "it", "broke"]
    assert a.tokens == ["un", "##bel", "##ie", "##va", "##bly", ",", "it", "broke"]
    assert a.word_ids == [0, 0, 0, 0, 0, 0, 1, 2]


def test_batch_and_alone_give_the_same_vectors(fz_all):
    texts = TEXTS + ["word " * 40, "short"]
    together = fz_all.embed_words(texts)
    for text, vec in zip(texts, together):
        np.testing.assert_allclose(fz_all.embed_words([text])[0], vec, atol=1e-5)
    small_batches = Featurizer("minilm", layers="all", batch_tokens=64).embed_words(texts)
    for a, b in zip(together, small_batches):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_sentence_vectors(fz_all):
    fz = Featurizer("minilm", layers=-1, sentence_pooling="mean")
    words = fz.embed_words(TEXTS)
    np.testing.assert_allclose(fz.embed_sentences(TEXTS), np.stack([w.mean(0) for w in words]), atol=1e-6)
    cls = Featurizer("minilm", layers=-1, sentence_pooling="cls").embed_sentences(TEXTS[:1])
    ref = transformers.AutoModel.from_pretrained(fz.source.folder).eval()  # the folder "minilm" resolved to
    tok = transformers.AutoTokenizer.from_pretrained(fz.source.folder)
    with torch.no_grad():
        h = ref(**tok(TEXTS[:1], return_tensors="pt")).last_hidden_state[:, 0]
    np.testing.assert_allclose(cls, h.numpy(), atol=1e-5)
    assert fz_all.embed_sentences(TEXTS).shape == (3, 7, 384)


def test_sentence_pairs_are_one_input_with_segment_ids(minilm_path):
    fz = Featurizer("minilm", layers=-1, pooling="first")
    vecs = fz.embed_words(["A man plays guitar ."], text_pairs=["Someone makes music"])[0]
    assert vecs.shape == (8, 384)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = transformers.AutoModel.from_pretrained(minilm_path).eval()
    enc = tok("A man plays guitar .", "Someone makes music", return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state[0]
    assert enc["token_type_ids"][0].tolist().count(1) == 4  # "someone makes music [SEP]"
    firsts = [1, 2, 3, 4, 5, 7, 8, 9]  # after [CLS], and after the middle [SEP]
    np.testing.assert_allclose(vecs, h[firsts].numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="got 1 texts but 2 text_pairs"):
        fz.embed_words(["a"], text_pairs=["b", "c"])


def test_a_2000_word_document_gets_2000_vectors():
    fz = Featurizer("minilm", layers=-1)
    words = [f"w{i % 97}" for i in range(2000)]
    vecs = fz.embed_words([words])[0]
    assert vecs.shape == (2000, 384)
    assert np.isfinite(vecs).all() and not (np.abs(vecs).sum(1) == 0).any()


def test_long_text_words_take_the_window_with_most_context():
    """With 30-piece windows every word's vector equals encoding its best window directly."""
    fz = Featurizer("minilm", layers=-1, pooling="mean", max_length=32, stride=10)
    words = ("the crane lifted unbelievably heavy steel beams onto the roof while birds watched " * 6).split()
    vecs = fz.embed_words([words])[0]
    pieces = fz.tokenizer.encode_words([words])[0]
    spans = pieces.spans()
    windows = window_words(spans, fz.plan.window_size, fz.plan.stride)
    assert len(windows) > 3 and windows[0][0] == 0 and windows[-1][1] == len(words)
    for (_a0, a1), (b0, _) in zip(windows, windows[1:]):
        assert b0 <= a1, "consecutive windows leave no word uncovered"
    direct = fz.embed_words([words[w0:w1] for w0, w1 in windows])  # each window encoded on its own
    for w in range(len(words)):
        candidates = [
            (min(spans[w][0] - spans[w0][0], spans[w1 - 1][1] - spans[w][1]), k)
            for k, (w0, w1) in enumerate(windows)
            if w0 <= w < w1
        ]
        _, k = max(candidates, key=lambda c: (c[0], -c[1]))
        np.testing.assert_allclose(vecs[w], direct[k][w - windows[k][0]], atol=1e-5, err_msg=f"word {w}")


def test_window_words_never_skip_a_word():
    spans, pos = [], 0
    for n in [1, 3, 2, 7, 1, 1, 4, 2, 2, 5, 1, 3]:
        spans.append((pos, pos + n))
        pos += n
    for window in (7, 8, 12):
        for stride in range(1, window + 1):
            windows = window_words(spans, window, stride)
            covered = sorted({w for w0, w1 in windows for w in range(w0, w1)})
            assert covered == list(range(len(spans)))
            assert all(spans[w1 - 1][1] - spans[w0][0] <= window for w0, w1 in windows)


def test_split_windows_gives_every_word_to_exactly_one_window():
    spans, pos = [], 0
    for n in [1, 3, 2, 7, 1, 1, 4, 2, 2, 5, 1, 3]:
        spans.append((pos, pos + n))
        pos += n
    windows = split_windows(spans, 8, 4)
    owned = [w for _, _, words in windows for w in words]
    assert sorted(owned) == list(range(len(spans)))
    assert all(
        p1 - p0 <= 8 and all(p0 <= spans[w][0] and spans[w][1] <= p1 for w in words) for p0, p1, words in windows
    )


def test_pooling_spans_skip_a_bare_word_start_marker():
    pieces = WordPieces(
        [7, 40, 10, 8, 9, 7], [0, 0, 0, 1, 2, 3], ["\u2581", "j", "o", "\u2581in", "\u0120", "\u2581"], 4
    )
    assert pieces.spans() == [(0, 3), (3, 4), (4, 5), (5, 6)]
    # "▁" + "j" + "o": pool from "j"; a word that is only a marker keeps it
    assert pieces.pooling_spans() == [(1, 3), (3, 4), (4, 5), (5, 6)]


def testtoken_budget_batches():
    assert token_budget_batches([2, 2, 3, 3, 8], budget=8) == [2, 2, 1]
    assert sum(token_budget_batches(list(range(1, 100)), budget=500)) == 99


def test_word_without_pieces_keeps_its_slot():
    fz = Featurizer("minilm", layers=-1)
    with pytest.warns(UserWarning, match="give no subword pieces"):
        vecs = fz.embed_words([["a", "\u200b", "b"]])[0]
    assert vecs.shape == (3, 384)


@pytest.mark.parametrize(
    "texts, error, message",
    [
        (["fine", ""], ValueError, "text 1 is empty"),
        (["fine", "   \t "], ValueError, "text 1 is empty"),
        ([["ok", ""]], ValueError, "text 0: word 1 is empty"),
        ("a single string", TypeError, "wrap it in a list"),
        ([3], TypeError, "text 0: expected a string or a list of word strings, got int"),
    ],
)
def test_bad_texts(texts, error, message):
    fz = Featurizer("minilm", layers=-1)
    with pytest.raises(error, match=message):
        fz.embed_words(texts)


@pytest.mark.parametrize("sentence_pooling", ["mean", "cls", "model"])
def test_tokenizing_in_chunks_ahead_of_the_device_changes_no_vector(sentence_pooling, monkeypatch):
    """On CUDA a large call is tokenized in chunks, the next one on a thread while the device runs this one; the
    chunks are forced here on the CPU. Word and sentence vectors, pairs and errors are those of one call."""
    from ctxrep.featurize import pipeline

    texts = [
        f"text {i} : " + " ".join(["the", "unbelievable", "crane", "lifted", "beams"][: 1 + i % 5]) for i in range(11)
    ]
    pairs = [f"pair {i}" for i in range(11)]
    fz = Featurizer("minilm", layers=[0, -1], sentence_pooling=sentence_pooling)
    whole = fz.embed_words(texts), fz.embed_sentences(texts), fz.embed_words(texts, pairs)
    assert not fz._overlaps_tokenization(10**6)  # the CPU: never
    monkeypatch.setattr(pipeline, "OVERLAP_CHUNK_TEXTS", 4)
    monkeypatch.setattr(Featurizer, "_overlaps_tokenization", lambda self, n: n > pipeline.OVERLAP_CHUNK_TEXTS)
    chunked = fz.embed_words(texts), fz.embed_sentences(texts), fz.embed_words(texts, pairs)
    for a, b in zip(chunked[0] + chunked[2], whole[0] + whole[2], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(chunked[1], whole[1], atol=1e-5)
    with pytest.raises(ValueError, match="text 9 is empty"):  # the index in the call, not in its chunk
        fz.embed_words(texts[:9] + [""] + texts[10:])
    monkeypatch.undo()  # the real rule again; it reads the runtime's device
    fz.runtime.device = torch.device("cuda")
    try:
        assert fz._overlaps_tokenization(pipeline.OVERLAP_CHUNK_TEXTS + 1) and not fz._overlaps_tokenization(10)
    finally:
        fz.runtime.device = torch.device("cpu")


def test_bad_arguments():
    with pytest.raises(ValueError, match="layer 7 is out of range: the model has layers 0..6"):
        Featurizer("minilm", layers=7)
    with pytest.raises(ValueError, match="pooling must be one of"):
        Featurizer("minilm", pooling="max")
    with pytest.raises(ValueError, match="the ScalarMix mixes 3 layers but the model has 7"):
        Featurizer("minilm", layers=ScalarMix(3))


def test_model_names(tmp_path):
    with pytest.raises(CheckpointError, match="unknown model './nonsense'"):
        Featurizer("./nonsense")
    with pytest.raises(CheckpointError, match="not a model folder: no config.json .* and no options.json"):
        Featurizer(str(tmp_path))


def test_hub_cache_is_used_when_present(tiny_models, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(tiny_models["bert"], snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")  # huggingface_hub's cache: branch -> commit
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache alone must do
    cached = Featurizer("org/tiny", layers=-1).embed_words(["hello world"])[0]
    assert cached.shape == (2, 32)
    np.testing.assert_array_equal(
        cached, Featurizer(str(tiny_models["bert"]), layers=-1).embed_words(["hello world"])[0]
    )


def test_views_share_one_runtime_and_with_model_builds_its_own(tiny_models, monkeypatch):
    from ctxrep.runtime.torch_backend import TorchRuntime

    built = []
    real = TorchRuntime._build
    monkeypatch.setattr(TorchRuntime, "_build", lambda self: built.append(self.model) or real(self))
    fz = Featurizer(str(tiny_models["bert"]), layers="all")
    words = [["the", "dog", "runs"]]
    for layers in (-1, 0, [1, 2], "mix"):
        fz.with_layers(layers).embed_words(words)
    expected = fz.embed_words(words)[0]
    assert built == [fz.model]  # built once, whatever the views
    other = type(fz.model)(fz.model.config).eval()
    control = fz.with_model(other)
    assert control.embed_words(words)[0].shape == expected.shape and built == [fz.model, other]
    np.testing.assert_allclose(fz.embed_words(words)[0], expected)  # the original keeps its model and runtime
    assert built == [fz.model, other]
    with pytest.raises(ValueError, match="with_model needs a model of the same shape: 6 layers x 384"):
        fz.with_model(ctxrep.load_model("minilm"))


def test_prepacked_copy_matches_the_model_and_is_chosen_by_the_cpu_vendor_not_a_timing(tiny_models, monkeypatch):
    from ctxrep.runtime import hardware, torch_backend

    fz = Featurizer(str(tiny_models["bert"]), layers="all", compile=False)
    pieces = fz.tokenizer.encode_words([["the", "dog", "runs", "home"], ["a", "cat"]])
    records = [w for i, p in enumerate(pieces) for w in WindowPlan(fz.tokenizer, 64).single(i, p)]
    batch = collate(records, fz.tokenizer)
    packed = torch_backend.prepack_for_inference(fz.model)
    assert packed is not fz.model
    with torch.inference_mode():
        expected = fz.model.encode(batch).hidden_states
        got = packed.encode(batch).hidden_states
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    for vendor, pays in (("AuthenticAMD", True), ("GenuineIntel", False), ("", False)):
        monkeypatch.setattr(hardware, "cpu_vendor", lambda v=vendor: v)
        fresh = Featurizer(str(tiny_models["bert"]), compile=False)
        assert (fresh.runtime.encoder is not fresh.model) is pays  # the same answer on every run of one machine


@pytest.mark.parametrize("which", ["minilm", "elmo"])
def test_a_call_with_no_text_returns_nothing_in_the_shape_of_one_text(which, elmo_dir):
    """No text in, no row out, in the shape every other call has (an IndexError before; ELMo gave a row of NaN)."""
    model = "minilm" if which == "minilm" else f"elmo:{elmo_dir}"
    for layers, pooling in ((-1, "mean"), ("all", "cls" if which == "minilm" else "mean")):
        fz = Featurizer(model, layers=layers, sentence_pooling=pooling)
        one = fz.embed_sentences(["a small dog"])
        none = fz.embed_sentences([])
        assert none.shape == (0, *one.shape[1:]) and none.dtype == one.dtype
        assert fz.embed_words([]) == [] and fz.embed_tokens([]) == []
        if which == "minilm":
            assert fz.embed_sentences([], chunks="sentences") == []
        if which == "minilm" and pooling == "cls":
            assert fz.embed_ids([]).shape == (0, *one.shape[1:])


def test_chunks_on_a_word_level_model_say_what_to_do(elmo_dir):
    fz = Featurizer(f"elmo:{elmo_dir}", layers=-1)
    with pytest.raises(ValueError, match=r"chunks= needs a subword tokenizer.*embed each chunk as a text of its own"):
        fz.embed_sentences(["One sentence. Another one."], chunks="sentences")
