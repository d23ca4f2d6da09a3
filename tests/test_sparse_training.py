"""SPLADE training (issue 34, item 1): SparseSentenceEncoder's FLOPS term and loss equal sentence-transformers'
FlopsLoss and SpladeLoss; a few steps on a tiny random MLM folder raise recall and lower the active dimensions; the
saved folder loads in sentence-transformers' SparseEncoder and ctxrep's with the same vectors."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import save_tiny_bert
from sklearn.base import clone

from ctxrep.tasks.sparse_encoder import SparseSentenceEncoder, flops
from ctxrep.vectors.sparse import SparseEncoder

WORDS = "apple river guitar planet winter doctor castle engine forest violin ocean pencil garden rocket silver tiger"
FILL = "the a of on and near with some".split()


def _pairs() -> list[tuple[str, str]]:
    """16 (query, document) pairs: the query's two words appear in its document among filler words."""
    rng = np.random.default_rng(0)
    words = WORDS.split()
    pairs = []
    for i, w in enumerate(words):
        v = words[(i + 5) % len(words)]
        pairs.append((f"{w} {v}", f"{' '.join(rng.choice(FILL, 3))} {w} {' '.join(rng.choice(FILL, 2))} {v} ."))
    return pairs


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory) -> Path:
    """A random BertForMaskedLM (hidden 32, MiniLM's tokenizer), without dropout."""
    path = tmp_path_factory.mktemp("mlm")
    return save_tiny_bert(path, transformers.BertForMaskedLM, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _st_sparse(folder):
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if (Path(folder) / "modules.json").is_file():
            return STSparseEncoder(str(folder), device="cpu")
        return STSparseEncoder(modules=[MLMTransformer(str(folder)), SpladePooling("max")], device="cpu")


def _recall_at_1(est: SparseSentenceEncoder, pairs) -> float:
    q, d = est.encode([p[0] for p in pairs]), est.encode([p[1] for p in pairs])
    return float(((q @ d.T).toarray().argmax(axis=1) == np.arange(len(pairs))).mean())


def test_flops_known_answer_and_sentence_transformers():
    from sentence_transformers.sparse_encoder.losses import FlopsLoss

    w = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert float(flops(w)) == pytest.approx(2.0**2 + 0.0 + 1.0**2)  # column means 2, 0, 1
    w = torch.relu(torch.randn(7, 50, generator=torch.Generator().manual_seed(0)))
    expected = sum(float(w[:, j].mean()) ** 2 for j in range(50))
    assert float(flops(w)) == pytest.approx(expected, rel=1e-6)
    assert float(flops(w)) == pytest.approx(float(FlopsLoss(None).compute_loss_from_embeddings(w)), rel=1e-6)


@pytest.mark.parametrize("triplets", [False, True])
def test_loss_equals_sentence_transformers_splade_loss(mlm_folder, triplets):
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss

    pairs = _pairs()[:4]
    batch = [(q, d, _pairs()[-1 - i][1]) for i, (q, d) in enumerate(pairs)] if triplets else pairs
    # a random model's vectors have ~30,000 small weights: a scale and FLOPS weights that keep every term near 1
    weights = {"query_regularizer_weight": 0.002, "document_regularizer_weight": 0.0013}
    ours = SparseSentenceEncoder.load(mlm_folder, scale=0.01, **weights)
    assert ours.query_regularizer_weight == 0.002 and ours.scale == 0.01
    texts = sorted({t for e in batch for t in e})
    with torch.no_grad():
        loss = ours._batch_loss(batch, None, dict(zip(texts, ours._inputs(texts))))
    st = _st_sparse(mlm_folder).eval()
    reference = SpladeLoss(st, SparseMultipleNegativesRankingLoss(st, scale=0.01), **weights)
    features = [st.tokenize(list(column)) for column in zip(*batch)]
    with torch.no_grad():
        parts = reference(features, None)
    assert set(parts) == {"base_loss", "document_regularizer_loss", "query_regularizer_loss"}
    assert min(float(v) for v in parts.values()) > 0.5  # the FLOPS terms are part of what is compared
    assert float(loss) == pytest.approx(float(sum(parts.values())), abs=1e-5)


def test_training_raises_recall_and_flops_lowers_active_dims(mlm_folder):
    pairs = _pairs()
    documents = [p[1] for p in pairs]
    untrained = SparseSentenceEncoder.load(mlm_folder)
    settings = dict(batch_size=8, max_steps=8, lr=2e-3, warmup_fraction=0.0, random_state=0)
    plain = SparseSentenceEncoder(
        str(mlm_folder), query_regularizer_weight=0, document_regularizer_weight=0, **settings
    ).fit(pairs)
    splade = SparseSentenceEncoder(
        str(mlm_folder), query_regularizer_weight=0.1, document_regularizer_weight=0.1, **settings
    ).fit(pairs)
    assert splade.n_epochs_ == 4 and len(splade.history_) == 4
    assert _recall_at_1(splade, pairs) >= _recall_at_1(untrained, pairs) + 0.5
    dims = {name: est.active_dims(documents) for name, est in [("none", untrained), ("0", plain), ("0.1", splade)]}
    assert dims["0.1"] < 0.5 * dims["none"] and dims["0.1"] < 0.5 * dims["0"], dims


def test_saved_folder_round_trips(mlm_folder, tmp_path):
    pairs = _pairs()
    est = SparseSentenceEncoder(str(mlm_folder), batch_size=8, max_steps=2, lr=1e-3, random_state=0).fit(pairs)
    texts = [p[1] for p in pairs[:5]] + ["guitar"]
    vectors = est.encode(texts)
    assert vectors.shape == (len(texts), 30522) and vectors.dtype == np.float32
    folder = est.save(tmp_path / "splade")
    expected = vectors.toarray()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = _st_sparse(folder).encode(texts, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(st, expected, atol=1e-5)
    np.testing.assert_allclose(SparseEncoder(folder).embed_sentences(texts).toarray(), expected, atol=1e-5)
    again = SparseSentenceEncoder.load(folder)
    assert again.query_regularizer_weight == est.query_regularizer_weight and again.max_steps == 2
    np.testing.assert_allclose(again.encode(texts).toarray(), expected, atol=1e-6)
    np.testing.assert_allclose(
        est.predict([(texts[0], texts[1])]), [float(expected[0] @ expected[1])], rtol=1e-5
    )  # dot product, as sentence-transformers' SparseEncoder
    assert clone(est).get_params() == est.get_params()


def test_bad_input_is_refused_in_one_line(mlm_folder, tiny_models):
    with pytest.raises(ValueError, match="loss must be 'mnrl'"):
        SparseSentenceEncoder(str(mlm_folder), loss="cosent").fit(_pairs(), np.arange(16.0))
    with pytest.raises(ValueError, match="document_regularizer_weight must be a number >= 0"):
        SparseSentenceEncoder(str(mlm_folder), document_regularizer_weight=-1.0).fit(_pairs())
    with pytest.raises(ValueError, match="no masked-LM head .* start from a \\*ForMaskedLM folder"):
        SparseSentenceEncoder(str(tiny_models["bert"]), max_steps=1).fit(_pairs())
    with pytest.raises(ValueError, match="SPLADE training reads and writes the MLM head of bert or roberta"):
        SparseSentenceEncoder(str(tiny_models["electra"]), max_steps=1).fit(_pairs())
    with pytest.raises(ValueError, match="takes \\(anchor, positive\\)"):
        SparseSentenceEncoder(str(mlm_folder)).fit(["a lone text", "another"])


def test_cli_train_sentence_encoder_sparse(mlm_folder, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main

    train = tmp_path / "pairs.tsv"
    train.write_text("".join(f"{q}\t{d}\n" for q, d in _pairs()))
    args = ["train-sentence-encoder", "--sparse", "--model", str(mlm_folder), "--train", str(train), "--no-header"]
    args += ["--text-column", "1", "--text-pair-column", "2", "--max-steps", "2", "--batch-size", "8"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out"), "--lr", "1e-3"])
    assert result.exit_code == 0, result.output
    assert "(mnrl, 2 steps)" in result.output and "sentence_transformers.SparseEncoder(" in result.output
    saved = SparseSentenceEncoder.load(tmp_path / "out")
    assert saved.scale == 1.0 and saved.query_regularizer_weight == 5e-5 and saved.lr == 1e-3
    texts = [p[1] for p in _pairs()[:3]]
    np.testing.assert_allclose(
        SparseEncoder(tmp_path / "out").embed_sentences(texts).toarray(), saved.encode(texts).toarray(), atol=1e-5
    )
    refused = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "x"), "--pooling", "cls"])
    assert refused.exit_code == 2 and "--sparse pools SPLADE's max over tokens" in refused.output
    refused = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "x"), "--loss", "simcse"])
    assert refused.exit_code != 0 and "simcse" in refused.output


def test_a_sparse_folder_is_not_loaded_as_a_dense_sentence_encoder(mlm_folder, tmp_path):
    from ctxrep.tasks import SentenceEncoder

    folder = SparseSentenceEncoder(str(mlm_folder), batch_size=8, max_steps=1).fit(_pairs()).save(tmp_path / "s")
    with pytest.raises(ValueError, match="saved by ctxrep's SparseSentenceEncoder; load it with SparseSentenceEncoder"):
        SentenceEncoder.load(folder)
