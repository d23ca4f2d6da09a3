"""sentence_pooling="model": a sentence-transformers folder's own Pooling + Normalize, checked against transformers.

References are computed by hand from transformers' AutoModel (sentence-transformers is not installed): the last
layer's token vectors, pooled as the folder's 1_Pooling/config.json says over the attention-masked tokens (special
tokens included), then L2-normalised when modules.json lists Normalize.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from test_cli import run

from ctxrep import Featurizer
from ctxrep.models.loading import CheckpointError
from ctxrep.models.sentence_transformers import read_sentence_pooling
from ctxrep.text.inputs import split_windows

SHORT = [
    "A crane caught a fish .",
    "Unbelievably, the newscaster broke into the broadcast!",
    "Dawn broke .",
    ["Pre", "tokenized", "words"],
]
ALL_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
)


def _model(path: Path):
    return transformers.AutoModel.from_pretrained(path).eval()


def reference(path: Path, texts: list, modes: tuple[str, ...] = ("mean",), normalize: bool = True) -> np.ndarray:
    """sentence-transformers' Transformer -> Pooling -> [Normalize], by hand, one text at a time (no truncation)."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = _model(path)
    out = []
    for t in texts:
        words = t.split() if isinstance(t, str) else t
        enc = tok(words, is_split_into_words=True, return_tensors="pt", truncation=False)
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0]  # (seq, hidden); one text: every position is attended to
        parts = {"cls": h[0], "max": h.max(0).values, "mean": h.mean(0), "mean_sqrt_len": h.sum(0) / len(h) ** 0.5}
        v = torch.cat([parts[m] for m in modes])
        out.append(torch.nn.functional.normalize(v, dim=0) if normalize else v)
    return torch.stack(out).numpy()


def reference_windowed(path: Path, words: list[str], max_length: int) -> np.ndarray:
    """The documented rule for a text longer than one window, by hand: windows cut as the featurizer cuts them
    (split_windows, default stride), each piece from the window that owns its word, each window's [CLS] and [SEP]
    weighted 1 / (number of windows); mean over pieces + 2, then L2-normalised."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = _model(path)
    enc = tok(words, is_split_into_words=True, add_special_tokens=False, truncation=False)
    ids, word_ids = enc["input_ids"], enc.word_ids()
    spans = [(word_ids.index(w), len(word_ids) - word_ids[::-1].index(w)) for w in range(len(words))]
    size = max_length - 2
    cuts = split_windows(spans, size, size // 2)
    assert len(cuts) > 2, "the test text must need several windows"
    total = torch.zeros(model.config.hidden_size, dtype=torch.float64)
    for p0, p1, owned in cuts:
        row = torch.tensor([[tok.cls_token_id, *ids[p0:p1], tok.sep_token_id]])
        with torch.no_grad():
            h = model(input_ids=row).last_hidden_state[0].double()  # (seq, hidden)
        total += (h[0] + h[-1]) / len(cuts)
        for w in owned:
            total += h[1 + spans[w][0] - p0 : 1 + spans[w][1] - p0].sum(0)
    mean = total / (len(ids) + 2)
    return torch.nn.functional.normalize(mean, dim=0).float().numpy()


@pytest.fixture(scope="module")
def fz_model():
    return Featurizer("minilm", sentence_pooling="model")


def test_minilm_folder_says_mean_then_normalize(minilm_path):
    pooling = read_sentence_pooling(minilm_path)
    assert pooling.modes == ("mean",) and pooling.normalize and pooling.width == 384


def test_minilm_matches_sentence_transformers_by_hand(fz_model, minilm_path):
    got = fz_model.embed_sentences(SHORT)
    assert got.shape == (len(SHORT), 384) and fz_model.sentence_dim == 384
    np.testing.assert_allclose(got, reference(minilm_path, SHORT), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    # the default ("auto") is the folder's own pooling; the mean over words (no special tokens, no normalisation) is
    # another vector
    np.testing.assert_array_equal(Featurizer("minilm").embed_sentences(SHORT), got)
    assert np.abs(Featurizer("minilm", sentence_pooling="mean").embed_sentences(SHORT) - got).max() > 1e-2


def test_batching_does_not_change_model_pooling(fz_model):
    one_by_one = np.concatenate([fz_model.embed_sentences([t]) for t in SHORT])
    np.testing.assert_allclose(fz_model.embed_sentences(SHORT), one_by_one, atol=1e-6)


def test_no_truncation_at_max_seq_length(fz_model, minilm_path):
    """The folder's sentence_bert_config.json says max_seq_length 256; ctxrep reads the whole text (one window up to
    the model's 512 positions), so a 300-piece text is pooled over all of its tokens."""
    assert json.loads((minilm_path / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    words = ("the crane lifted a heavy steel beam onto the roof while workers watched from below ." * 20).split()
    assert 256 < len(fz_model.tokenize([words])[0].tokens) + 2 <= 512
    got = fz_model.embed_sentences([words])
    np.testing.assert_allclose(got, reference(minilm_path, [words]), atol=1e-5)
    head = reference(minilm_path, [words[:120]])  # roughly what truncation would give: another vector
    assert np.abs(got - head).max() > 1e-3


def test_long_text_windows_are_weighted_as_documented(minilm_path):
    words = [
        "Unbelievably",
        ",",
        "the",
        "newscaster",
        "broke",
        "into",
        "the",
        "broadcast",
        "with",
        "news",
        "of",
        "a",
        "crane",
        "that",
        "fell",
        ".",
    ] * 2
    fz = Featurizer("minilm", sentence_pooling="model", max_length=12)
    got = fz.embed_sentences([words, "Dawn broke ."])
    np.testing.assert_allclose(got[0], reference_windowed(minilm_path, words, 12), atol=1e-5)
    np.testing.assert_allclose(got[1], reference(minilm_path, ["Dawn broke ."])[0], atol=1e-5)


def test_model_pooling_applies_to_each_chosen_layer(fz_model):
    every = Featurizer("minilm", layers="all", sentence_pooling="model").embed_sentences(SHORT[:2])
    assert every.shape == (2, 7, 384)
    np.testing.assert_allclose(every[:, -1], fz_model.embed_sentences(SHORT[:2]), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(every, axis=-1), 1.0, atol=1e-5)


# ---- other sentence-transformers layouts, on a tiny random BERT ------------------------------------------------


def _st_folder(tmp_path: Path, bert: Path, modules: list[str], pooling: dict) -> Path:
    folder = tmp_path / "st"
    shutil.copytree(bert, folder)
    paths = {
        "Transformer": "",
        "Pooling": "1_Pooling",
        "Normalize": "2_Normalize",
        "Dense": "2_Dense",
        "LayerNorm": "2_Ln",
    }
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {"idx": i, "name": str(i), "path": paths[m], "type": f"sentence_transformers.models.{m}"}
                for i, m in enumerate(modules)
            ]
        )
    )
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    return folder


def test_every_pooling_mode_concatenated_without_normalize(tmp_path, tiny_models):
    folder = _st_folder(tmp_path, tiny_models["bert"], ["Transformer", "Pooling"], dict.fromkeys(ALL_MODES, True))
    fz = Featurizer(folder, sentence_pooling="model")
    got = fz.embed_sentences(SHORT)
    assert got.shape == (len(SHORT), 4 * 32) and fz.sentence_dim == 4 * 32
    want = reference(folder, SHORT, modes=("cls", "max", "mean", "mean_sqrt_len"), normalize=False)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_not_a_sentence_transformers_folder_is_one_line(tiny_models):
    with pytest.raises(CheckpointError, match="no modules.json; use sentence_pooling='mean' or 'cls'") as e:
        Featurizer(tiny_models["bert"], sentence_pooling="model")
    assert "\n" not in str(e.value) and str(tiny_models["bert"]) in str(e.value)


def test_auto_is_the_folders_pooling_where_it_declares_one_else_the_mean(fz_model, tiny_models):
    auto = Featurizer("minilm", sentence_pooling="auto")
    assert auto.sentence_pooling == "model" and auto.model_pooling == fz_model.model_pooling
    np.testing.assert_array_equal(auto.embed_sentences(SHORT[:2]), fz_model.embed_sentences(SHORT[:2]))
    plain = Featurizer(tiny_models["bert"], sentence_pooling="auto")
    assert plain.sentence_pooling == "mean" and plain.model_pooling is None


@pytest.mark.parametrize(
    "modules, pooling, message",
    [
        (["Transformer", "Pooling", "LayerNorm"], {"pooling_mode_mean_tokens": True}, r"lists LayerNorm \(2_Ln\), wh"),
        (["Transformer", "Pooling", "Dense"], {"pooling_mode_mean_tokens": True}, r"2_Dense/config.json: missing"),
        (["Transformer", "Pooling"], {"pooling_mode_weightedmean_tokens": True}, "weightedmean_tokens is not impl"),
        (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": False}, "no pooling mode is switched on"),
        (["Pooling", "Transformer"], {"pooling_mode_mean_tokens": True}, "expected Transformer, then one Pooling"),
    ],
)
def test_layouts_ctxrep_does_not_apply_are_refused(tmp_path, tiny_models, modules, pooling, message):
    folder = _st_folder(tmp_path, tiny_models["bert"], modules, pooling)
    with pytest.raises(CheckpointError, match=message) as e:
        Featurizer(folder, sentence_pooling="model")
    assert "\n" not in str(e.value)


def test_pooling_dimension_must_fit_the_model(tmp_path, tiny_models):
    folder = _st_folder(tmp_path, tiny_models["bert"], ["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True})
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True})
    )
    with pytest.raises(CheckpointError, match="embedding_dimension=384 but the model's hidden size is 32"):
        Featurizer(folder, sentence_pooling="model").embed_sentences(["Dawn broke ."])


def test_embed_cli_sentence_pooling_model(tmp_path, fz_model):
    src = tmp_path / "texts.txt"
    src.write_text("A crane caught a fish .\nDawn broke .\n")
    out = tmp_path / "vecs"
    r = run(["embed", "--input", str(src), "--out", str(out), "--level", "sentence", "--sentence-pooling", "model"])
    assert r.exit_code == 0, r.output
    from ctxrep import load_vectors

    vectors = load_vectors(out)
    got = np.stack([np.asarray(v) for v in vectors])  # (texts, dim)
    np.testing.assert_allclose(got, fz_model.embed_sentences(["A crane caught a fish .", "Dawn broke ."]), atol=1e-6)
    assert json.loads((out / "manifest.json").read_text())["dim"] == 384
