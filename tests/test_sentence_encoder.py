"""SentenceEncoder: the four losses train, the saved folder loads in sentence-transformers with the same vectors,
STS evaluation against scipy, the mteb adapter on a task defined here (no network), bad input in one line."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import sentence_transformers
import torch
from click.testing import CliRunner
from conftest import save_tiny_bert

import ctxrep
from ctxrep.cli import main
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.vectors.similarity import pearson, spearman, sts_evaluate

PAIRS = [
    ("A man is playing a guitar .", "Someone plays the guitar ."),
    ("A woman slices an onion .", "An onion is being cut by a woman ."),
    ("Stocks fell sharply on Monday .", "Markets dropped at the start of the week ."),
    ("The cat sleeps on the sofa .", "A cat is asleep on a couch ."),
    ("Two dogs run in a field .", "Dogs are running across the grass ."),
    ("The train left the station late .", "The train departed behind schedule ."),
]
SCORES = [4.8, 4.2, 3.9, 4.5, 4.0, 4.6]
NEGATIVE_PAIRS = [(a, PAIRS[(i + 3) % 6][1]) for i, (a, _) in enumerate(PAIRS)]


@pytest.fixture(scope="module")
def dropout_bert(tmp_path_factory):
    """A tiny random BERT with dropout (SimCSE needs it) and MiniLM's tokenizer, saved by transformers."""
    path = tmp_path_factory.mktemp("dropout-bert")
    return save_tiny_bert(path, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def _weights(enc: SentenceEncoder) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in enc.backbone_.model.parameters()])


@pytest.mark.parametrize("loss", ["mnrl", "simcse", "cosine", "cosent"])
def test_each_loss_trains(dropout_bert, loss):
    if loss == "simcse":
        X, y = [t for p in PAIRS for t in p], None
    elif loss == "mnrl":
        X, y = PAIRS, None
    else:
        X, y = PAIRS + NEGATIVE_PAIRS, SCORES + [0.5, 1.0, 0.2, 0.8, 0.3, 0.0]
    enc = SentenceEncoder(dropout_bert, loss=loss, batch_size=6, max_epochs=6, lr=1e-3, random_state=0)
    enc.fit(X, y)
    first, last = enc.history_[0]["train_loss"], enc.history_[-1]["train_loss"]
    assert last < first, (loss, [h["train_loss"] for h in enc.history_])
    assert enc.n_epochs_ == 6 and enc.history_[-1]["steps"] == 6 * (len(X) // 6)
    if loss == "mnrl":
        again = SentenceEncoder(dropout_bert, loss=loss, batch_size=6, max_epochs=6, lr=1e-3, random_state=0).fit(X)
        assert torch.equal(_weights(enc), _weights(again))  # random_state makes a fit repeatable


def test_mnrl_with_hard_negatives_and_a_known_loss(dropout_bert):
    triplets = [(a, p, NEGATIVE_PAIRS[i][1]) for i, (a, p) in enumerate(PAIRS)]
    enc = SentenceEncoder(dropout_bert, loss="mnrl", batch_size=3, max_steps=1, lr=1e-9, random_state=0)
    enc.fit(triplets)
    # the loss of a batch is the cross-entropy of s * cos(anchor, [positives; negatives]) with the diagonal as targets
    enc.backbone_.model.eval()
    inputs = dict(zip(sum(map(list, triplets[:3]), []), enc._inputs(sum(map(list, triplets[:3]), []))))
    with torch.no_grad():
        got = float(enc._batch_loss(triplets[:3], None, inputs))
    u = enc.encode([t[0] for t in triplets[:3]])
    v = enc.encode([t[1] for t in triplets[:3]] + [t[2] for t in triplets[:3]])
    logits = 20 * ctxrep.similarity(u, v)  # (3, 6)
    expected = np.mean([np.log(np.exp(row).sum()) - row[i] for i, row in enumerate(logits)])
    assert got == pytest.approx(expected, rel=1e-4)


def test_losses_equal_sentence_transformers_losses():
    """The same numbers as sentence-transformers' own losses on the same embeddings."""
    try:
        from sentence_transformers.sentence_transformer import losses  # sentence-transformers >= 6
    except ImportError:
        from sentence_transformers import losses

    g = torch.Generator().manual_seed(0)
    u, v, w = (torch.randn(8, 16, generator=g) for _ in range(3))
    scores = torch.rand(8, generator=g)
    cases = [
        ("mnrl", losses.MultipleNegativesRankingLoss(None, scale=20.0), [u, v], None),
        ("mnrl", losses.MultipleNegativesRankingLoss(None, scale=20.0), [u, v, w], None),
        ("simcse", losses.MultipleNegativesRankingLoss(None, scale=20.0), [u, v], None),
        ("cosent", losses.CoSENTLoss(None, scale=20.0), [u, v], scores),
        ("cosine", losses.CosineSimilarityLoss(None), [u, v], scores),
    ]
    for name, reference, vectors, y in cases:
        ours = SentenceEncoder(loss=name)._loss_from_vectors(vectors, None if y is None else y.numpy())
        theirs = reference.compute_loss_from_embeddings(vectors, torch.arange(8) if y is None else y)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-5), name


def test_cosent_is_zero_for_perfect_order_at_a_large_scale(dropout_bert):
    enc = SentenceEncoder(dropout_bert, loss="cosent", scale=1e4, max_steps=1, batch_size=2, lr=1e-9, random_state=0)
    enc.fit(PAIRS[:2], [1.0, 2.0])
    enc.backbone_.model.eval()
    texts = [t for p in PAIRS[:3] for t in p]
    inputs = dict(zip(texts, enc._inputs(texts)))
    cos = enc.predict(PAIRS[:3])
    with torch.no_grad():
        ordered = float(enc._batch_loss(PAIRS[:3], cos, inputs))  # scores in the order of the cosines: no loss
        reversed_ = float(enc._batch_loss(PAIRS[:3], -cos, inputs))
    assert ordered == pytest.approx(0.0, abs=1e-6)
    assert reversed_ > 1.0


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", True), ("cls", False)])
def test_saved_folder_loads_in_sentence_transformers_with_the_same_vectors(dropout_bert, tmp_path, pooling, normalize):
    enc = SentenceEncoder(dropout_bert, loss="cosent", pooling=pooling, normalize=normalize, batch_size=4)
    enc.set_params(max_steps=2, random_state=0, lr=1e-3).fit(PAIRS + NEGATIVE_PAIRS, SCORES + [1.0] * 6)
    out = enc.save(tmp_path / "st")
    texts = [t for p in PAIRS for t in p] + ["a much longer text " * 5]
    ours = enc.encode(texts)
    st = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    theirs = st.encode(texts, convert_to_numpy=True, batch_size=4)
    np.testing.assert_allclose(ours, theirs, atol=2e-5)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    # the same folder through ctxrep's featurizer (its own reading of modules.json) and SentenceEncoder.load
    fz = ctxrep.Featurizer(out, sentence_pooling="model")
    np.testing.assert_allclose(fz.embed_sentences(texts), ours, atol=2e-5)
    np.testing.assert_allclose(SentenceEncoder.load(out).encode(texts), ours, atol=1e-6)
    assert SentenceEncoder.load(out).get_params()["loss"] == "cosent"


def test_minilm_keeps_its_pooling_and_matches_sentence_transformers(tmp_path):
    enc = SentenceEncoder.load(ctxrep.models.loading.resolve_model_path("minilm"))
    assert (enc.pooling_, enc.normalize_) == ("mean", True)
    texts = [p[0] for p in PAIRS]
    out = enc.save(tmp_path / "minilm")
    reference = sentence_transformers.SentenceTransformer(str(out), device="cpu").encode(texts)
    np.testing.assert_allclose(enc.encode(texts), reference, atol=2e-5)


def test_correlations_of_constant_or_mismatched_inputs():
    x = np.array([1.0, 2.0, 2.0, 4.0])
    assert spearman(x, x**3) == pytest.approx(1.0) and pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert np.isnan(pearson(x, np.ones(4))) and np.isnan(spearman(np.ones(4), x))  # undefined, not 0
    with pytest.raises(ValueError, match="pearson needs two sequences of the same length >= 2, got 4 and 3"):
        pearson(x, x[:3])
    with pytest.raises(ValueError, match="spearman needs .* got 1 and 1"):
        spearman(x[:1], x[:1])


def test_sts_evaluate_is_cosine_against_gold(tiny_models):
    fz = ctxrep.Featurizer(tiny_models["bert"])
    a, b = [p[0] for p in PAIRS], [p[1] for p in NEGATIVE_PAIRS]
    result = sts_evaluate(fz, a, b, SCORES)
    cos = [ctxrep.similarity(fz.embed_sentences([s])[0], fz.embed_sentences([t])[0]) for s, t in zip(a, b)]
    assert result["spearman"] == pytest.approx(100 * scipy.stats.spearmanr(cos, SCORES).statistic, rel=1e-6)
    assert result["pearson"] == pytest.approx(100 * scipy.stats.pearsonr(cos, SCORES).statistic, rel=1e-5)
    assert result["pairs"] == 6


def test_scikit_learn_contract(dropout_bert):
    from sklearn.base import clone

    enc = SentenceEncoder(dropout_bert, loss="cosine", max_epochs=2)
    copy = clone(enc)
    assert copy.get_params() == enc.get_params() and not hasattr(copy, "backbone_")
    with pytest.raises(ValueError, match="not fitted yet"):
        enc.encode(["a text"])
    X, y = PAIRS + NEGATIVE_PAIRS, SCORES + [0.0] * 6
    fitted = enc.set_params(batch_size=4, random_state=1, lr=1e-3, max_epochs=6).fit(X, y)
    assert fitted is enc
    untrained = clone(enc).set_params(max_steps=1, lr=1e-12).fit(X, y)
    assert enc.score(X, y) > max(untrained.score(X, y) + 0.3, 0.5)  # Spearman on the pairs it learned (0.67)
    assert enc.evaluate(PAIRS, SCORES)["spearman"] == pytest.approx(100 * enc.score(PAIRS, SCORES))


def test_bad_input_is_one_clear_line(dropout_bert):
    with pytest.raises(ValueError, match="loss='cosent' trains on scored pairs: give fit"):
        SentenceEncoder(dropout_bert, loss="cosent").fit(PAIRS)
    with pytest.raises(ValueError, match="6 pairs but scores of shape"):
        SentenceEncoder(dropout_bert, loss="cosine").fit(PAIRS, SCORES[:3])
    with pytest.raises(ValueError, match="score 1 is not a finite number"):
        SentenceEncoder(dropout_bert, loss="cosine").fit(PAIRS[:2], [1.0, float("nan")])
    with pytest.raises(ValueError, match=r"example 0: loss='mnrl' takes \(anchor, positive\)"):
        SentenceEncoder(dropout_bert).fit(["just one text"])
    with pytest.raises(ValueError, match="example 1: loss='simcse' trains on plain texts"):
        SentenceEncoder(dropout_bert, loss="simcse").fit(["a text", ("a", "pair")])
    with pytest.raises(ValueError, match="text 0 is empty"):
        SentenceEncoder(dropout_bert, loss="simcse").fit(["  ", "a text"])
    with pytest.raises(ValueError, match="give at least two"):
        SentenceEncoder(dropout_bert).fit(PAIRS[:1])
    # a last batch of one cannot be compared with anything: it is skipped, and the epochs are still max_epochs
    enc = SentenceEncoder(dropout_bert, loss="mnrl", batch_size=5, max_epochs=2, random_state=0).fit(PAIRS)
    assert [h["steps"] for h in enc.history_] == [1, 2]
    with pytest.raises(ValueError, match="loss must be one of"):
        SentenceEncoder(dropout_bert, loss="triplet").fit(PAIRS)


def test_cli_trains_on_a_scored_file_and_names_bad_lines(dropout_bert, tmp_path):
    rows = "".join(f"{a}\t{b}\t{s}\n" for (a, b), s in zip(PAIRS + NEGATIVE_PAIRS, SCORES + [0.5] * 6))
    (tmp_path / "train.tsv").write_text("s1\ts2\tscore\n" + rows)
    runner = CliRunner()
    args = ["train-sentence-encoder", "--model", str(dropout_bert), "--loss", "cosent", "--batch-size", "4"]
    args += ["--text-column", "s1", "--text-pair-column", "s2", "--score-column", "score", "--max-steps", "2"]
    out = runner.invoke(main, args + ["--train", str(tmp_path / "train.tsv"), "--out", str(tmp_path / "m")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "m" / "modules.json").is_file() and (tmp_path / "m" / "1_Pooling" / "config.json").is_file()
    (tmp_path / "bad.tsv").write_text("s1\ts2\tscore\na b\tc d\t4.0\ne f\tg h\tvery\n")
    out = runner.invoke(main, args + ["--train", str(tmp_path / "bad.tsv"), "--out", str(tmp_path / "m2")])
    assert out.exit_code == 1
    assert out.output.startswith(f"error: {tmp_path / 'bad.tsv'}:3: the score column 'score'")
    assert len(out.output.strip().splitlines()) == 1
    no_text = args[:7] + ["--text-pair-column", "s2", "--score-column", "score"]  # --text-column left at "text"
    out = runner.invoke(main, no_text + ["--train", str(tmp_path / "train.tsv"), "--out", str(tmp_path / "m3")])
    assert out.exit_code == 1
    assert "no column 'text' in the header (columns: s1, s2, score)" in out.output


def test_mteb_runs_a_ctxrep_model_on_a_local_sts_task(dropout_bert):
    import mteb
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata

    from ctxrep.vectors.mteb import MTEBEncoder

    a, b = [p[0] for p in PAIRS], [p[1] for p in NEGATIVE_PAIRS]

    class LocalSTS(AbsTaskSTS):
        metadata = TaskMetadata(
            type="STS",
            name="CtxrepLocalSTS",
            main_score="cosine_spearman",
            description="Six sentence pairs defined in tests/test_sentence_encoder.py.",
            reference=None,
            dataset={"path": "NA", "revision": "NA"},
            category="t2t",
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            modalities=["text"],
            bibtex_citation="",
        )
        min_score, max_score = 0, 5

        def load_data(self, **kwargs):
            self.dataset = DatasetDict({"test": Dataset.from_dict({"sentence1": a, "sentence2": b, "score": SCORES})})
            self.data_loaded = True

    enc = SentenceEncoder(dropout_bert, loss="cosine", max_steps=2, batch_size=4, random_state=0)
    enc.fit(PAIRS + NEGATIVE_PAIRS, SCORES + [0.0] * 6)
    model = MTEBEncoder(enc, name="ctxrep/tiny-test")
    assert model.encode(a).shape == (6, 32)  # the plain protocol: a list of sentences in, an array out
    result = mteb.evaluate(model, LocalSTS(), cache=None, show_progress_bar=False)
    scores = result.task_results[0].scores["test"][0]
    assert scores["cosine_spearman"] == pytest.approx(enc.evaluate(list(zip(a, b)), SCORES)["spearman"] / 100)
    fz_model = MTEBEncoder(ctxrep.Featurizer(dropout_bert))  # a plain featurizer works the same way
    result = mteb.evaluate(fz_model, LocalSTS(), cache=None, show_progress_bar=False)
    expected = sts_evaluate(ctxrep.Featurizer(dropout_bert), a, b, SCORES)["spearman"] / 100
    assert result.task_results[0].scores["test"][0]["cosine_spearman"] == pytest.approx(expected)
