"""One rerank API (issue 40, item 2): a pair model `ctxrep finetune` trained is a reranker. Its folder loads with
`ctxrep.rerank.load_reranker`, `ctxrep rerank --model`, `ctxrep search --rerank` and `ctxrep serve --reranker` /
`--model`, scoring with the estimator's own predictions; every pair scorer answers `rerank` with Hits; the old
`rank` / `Ranking` and the old (index, score) pairs keep working until 0.3 with a DeprecationWarning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
from _serve_helpers import ServerThread
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.models.folders import CheckpointError
from ctxrep.rerank import (
    RERANKERS,
    CrossEncoderReranker,
    PairModelReranker,
    load_reranker,
    ranked_hits,
    reranker_kind,
    top_scores,
)
from ctxrep.tasks import SequenceClassifier, SequenceRegressor
from ctxrep.vectors.hits import Hits

PAIRS = [("good great", "fine nice"), ("bad awful", "good great"), ("poor sad", "sad poor"), ("nice", "awful")] * 3
SCORES = [4.5, 1.0, 4.8, 0.5] * 3
QUERY = "good great"
DOCS = ["fine nice", "awful", "sad poor", "nice good"]
LONG = " ".join(["good great fine nice"] * 30)  # past the tiny BERT's 64 positions


def _finetune(tmp_path: Path, model: Path, task: str, labels: list, extra: tuple = ()) -> Path:
    """`ctxrep finetune --task TASK` on a table of pairs, long enough that documents get distinct scores; its
    OUT/model folder."""
    train = tmp_path / "train.tsv"
    train.write_text("a\tb\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for (a, b), y in zip(PAIRS, labels)))
    out = tmp_path / "run"
    args = ["finetune", "--task", task, "--train", train, "--dev", train, "--text-column", "a"]
    args += ["--label-column", "label", "--model", model, "--out", out, "--max-epochs", "6", "--batch-size", "4"]
    args += ["--lr", "3e-3", "--seed", "0"]
    result = CliRunner().invoke(main, [str(a) for a in [*args, "--no-progress", *extra]])
    assert result.exit_code == 0, result.output
    return out / "model"


@pytest.fixture(scope="module")
def regressor(tmp_path_factory, tiny_models) -> Path:
    path = tmp_path_factory.mktemp("regress")
    return _finetune(path, tiny_models["bert"], "regress", SCORES, ("--text-pair-column", "b"))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_models) -> Path:
    path = tmp_path_factory.mktemp("pair")
    return _finetune(path, tiny_models["bert"], "pair", [1, 0, 1, 0] * 3, ("--text-pair-column", "b"))


def test_a_finetuned_regressor_folder_is_a_reranker(regressor):
    assert json.loads((regressor / "task.json").read_text())["task"] == "regress"
    assert len(set(SequenceRegressor.load(regressor).predict([(QUERY, d) for d in DOCS]).round(4))) == len(DOCS)
    assert reranker_kind(regressor) is RERANKERS[0] and RERANKERS[0].name == "a fine-tuned ctxrep pair model"
    reranker = load_reranker(regressor)
    assert isinstance(reranker, PairModelReranker)
    estimator = SequenceRegressor.load(regressor)
    pairs = [(QUERY, d) for d in DOCS]
    expected = estimator.predict(pairs)
    np.testing.assert_allclose(reranker.predict(pairs), expected, rtol=1e-6)  # the estimator's own scores
    hits = reranker.rerank(QUERY, DOCS, top_n=3)
    assert isinstance(hits, Hits) and hits.ids == np.argsort(-expected, kind="stable")[:3].tolist()
    assert hits.texts == [DOCS[i] for i in hits.ids] and hits.rows.tolist() == hits.ids
    np.testing.assert_allclose(hits.scores, expected[hits.ids], rtol=1e-6)
    same = estimator.rerank(QUERY, DOCS, top_n=3)  # the estimator answers rerank itself, with the same Hits
    assert same.ids == hits.ids and np.allclose(same.scores, hits.scores)
    assert reranker.cut_texts == [] and reranker.max_length == 64


def test_a_finetuned_classifier_folder_ranks_by_its_last_class(classifier):
    reranker = load_reranker(classifier)
    estimator = SequenceClassifier.load(classifier)
    pairs = [(QUERY, d) for d in DOCS]
    np.testing.assert_allclose(reranker.predict(pairs), estimator.predict_proba(pairs)[:, -1], rtol=1e-6)
    assert reranker.rerank(QUERY, DOCS).ids == estimator.rerank(QUERY, DOCS).ids


def test_prompts_and_cuts_of_a_pair_model(regressor):
    reranker = load_reranker(regressor)
    estimator = SequenceRegressor.load(regressor)
    prompted = reranker.rerank(QUERY, DOCS, prompt="query : ")
    expected = estimator.predict([("query : " + QUERY, d) for d in DOCS])
    np.testing.assert_allclose(prompted.scores, np.sort(expected)[::-1], rtol=1e-6)
    with pytest.raises(ValueError, match=rf"unknown prompt name 'query': {regressor} declares the prompts none"):
        reranker.rerank(QUERY, DOCS, prompt_name="query")
    with pytest.raises(ValueError, match="unknown prompt name 'query': this SequenceRegressor declares the prompts"):
        estimator.rerank(QUERY, DOCS, prompt_name="query")
    reranker.rerank(QUERY, [DOCS[0], LONG, DOCS[1]])  # the pair in one window of 64 pieces, as in training
    query, long = reranker.tokenizer.encode_words([QUERY.split(), LONG.split()])
    pieces = len(query.ids) + len(long.ids) + 3  # [CLS] a [SEP] b [SEP]
    assert reranker.cut_texts == [1] and reranker.cut_pieces == [pieces - 64]


def test_pair_model_bad_input_is_refused_in_one_line(regressor, tiny_models, tmp_path):
    reranker = load_reranker(regressor)
    for call, error, message in [
        (lambda: reranker.rerank(QUERY, []), ValueError, "documents is empty"),
        (lambda: reranker.rerank(QUERY, DOCS, top_n=0), ValueError, "top_n must be a positive integer"),
        (lambda: reranker.rerank(QUERY, "a dog"), TypeError, "got a single string"),
        (lambda: reranker.rerank(" ", DOCS), ValueError, "query must be a non-empty string"),
        (lambda: reranker.predict([("a", 3)]), TypeError, r"pair 0: expected a \(query, document\) pair of strings"),
    ]:
        with pytest.raises(error, match=message):
            call()
    single = SequenceRegressor(str(tiny_models["bert"]), max_epochs=1, batch_size=4, cache_dir=str(tmp_path / "c")).fit(
        ["a b", "c d"], [1.0, 2.0]
    )
    single.save(tmp_path / "single")
    with pytest.raises(CheckpointError, match="single: rerank scores .* was trained on single texts"):
        load_reranker(tmp_path / "single")
    with pytest.raises(CheckpointError, match="holds a object, which does not score"):
        PairModelReranker(object())
    with pytest.raises(CheckpointError, match="not a saved ctxrep estimator"):
        PairModelReranker(tiny_models["bert"])


def test_a_word_in_context_model_is_no_reranker(tiny_models, tmp_path):
    from ctxrep.tasks import WordInContextClassifier

    wic = WordInContextClassifier(str(tiny_models["bert"]), max_epochs=1, batch_size=4).fit(
        [("a [[crane]] flew", "the [[crane]] lifted")] * 4, ["T", "F"] * 2
    )
    with pytest.raises(ValueError, match="compares a target word across two texts"):
        wic.rerank("a", ["b"])
    with pytest.raises(CheckpointError, match="compares a target word across two texts"):
        PairModelReranker(wic)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="compares a target word"):
        wic.rank("a", ["b"])


def test_cli_rerank_and_search_take_a_pair_model(regressor, tiny_models, tmp_path):
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DOCS) + "\n")
    result = CliRunner().invoke(
        main, ["rerank", "--model", str(regressor), "--query", QUERY, "--documents", str(docs), "--top-n", "2"]
    )
    assert result.exit_code == 0, result.output
    expected = load_reranker(regressor).rerank(QUERY, DOCS, top_n=2)
    rows = [line.split("\t") for line in result.output.strip().splitlines()[1:]]
    assert [int(r[4]) - 1 for r in rows] == [int(r[3]) for r in rows] == expected.ids  # lines from 1, ids from 0
    np.testing.assert_allclose([float(r[2]) for r in rows], expected.scores, atol=1e-5)

    build = ["index", "build", "--input", str(docs), "--out", str(tmp_path / "ix"), "--model", str(tiny_models["bert"])]
    assert CliRunner().invoke(main, build).exit_code == 0
    search = ["search", "--index", str(tmp_path / "ix"), "--query", QUERY, "-k", "2", "--rerank", str(regressor)]
    result = CliRunner().invoke(main, [*search, "--rerank-depth", "4"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.strip().splitlines()[1:]]
    assert [int(r[3]) for r in rows] == expected.ids and [r[4] for r in rows] == expected.texts


def test_serve_a_pair_model_beside_a_model_and_as_the_model(regressor, tiny_models):
    """`ctxrep serve --reranker FOLDER` and `ctxrep serve --model FOLDER`: /rerank and /v1/rerank answer with the
    estimator's scores; with the pair model as --model, the embedding routes say what the server holds."""
    from ctxrep.serve.app import build_app
    from ctxrep.serve.service import ServeConfig, make_service

    expected = load_reranker(regressor).rerank(QUERY, DOCS)
    beside = make_service(str(tiny_models["bert"]), reranker=str(regressor), config=ServeConfig(max_texts=8))
    alone = make_service(str(regressor), config=ServeConfig(max_texts=8))
    assert alone.fz is None and isinstance(alone.reranker, PairModelReranker)
    for service in (beside, alone):
        with ServerThread(build_app(service)) as s:
            tei = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=60)
            cohere = httpx.post(f"{s.url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2}, timeout=60)
            embed = httpx.post(f"{s.url}/v1/embeddings", json={"input": "a"}, timeout=60)
        assert tei.status_code == cohere.status_code == 200, (tei.text, cohere.text)
        assert [x["index"] for x in tei.json()] == expected.ids
        assert [x["score"] for x in tei.json()] == pytest.approx(expected.scores.tolist(), abs=1e-5)
        assert [x["index"] for x in cohere.json()["results"]] == expected.ids[:2]
        assert cohere.json()["model"] == str(regressor)
        if service is alone:
            assert embed.status_code == 404
            assert embed.json()["error"]["message"] == (
                f"this server holds a reranker ({regressor}); embeddings need a sentence-embedding folder: start "
                "ctxrep serve with --model MODEL"
            )
        else:
            assert embed.status_code == 200


# ---- the old names, until 0.3 ---------------------------------------------------------------------------------


def test_the_old_rank_and_ranking_warn_and_still_work(regressor):
    estimator = SequenceRegressor.load(regressor)
    with pytest.warns(DeprecationWarning, match="SequenceRegressor.rank.* goes in 0.3: rerank"):
        ranking = estimator.rank(QUERY, DOCS, top_k=2)
    assert ranking.order.tolist() == estimator.rerank(QUERY, DOCS, top_n=2).ids
    np.testing.assert_allclose(ranking.scores, estimator.predict([(QUERY, d) for d in DOCS]))
    with pytest.warns(DeprecationWarning, match="Ranking goes in 0.3 with rank"):
        from ctxrep.tasks.classifier import Ranking
    assert isinstance(ranking, Ranking) and Ranking.__name__ == "Ranking"


def test_the_old_pairs_of_rerank_warn_and_still_work():
    """rerank answered with [(index, score), ...] before; until 0.3 its Hits also read that way, with a warning."""
    hits = ranked_hits(np.array([0.2, 0.9, 0.5], np.float32), ["a", "b", "c"], top_n=2)
    assert (hits.ids, hits.texts, hits.rows.tolist()) == ([1, 2], ["b", "c"], [1, 2])
    old = [(1, pytest.approx(0.9)), (2, pytest.approx(0.5))]
    with pytest.warns(DeprecationWarning, match=r"reading it as a list of \(index, score\) pairs goes in 0.3"):
        assert [(i, s) for i, s in hits] == old
    with pytest.warns(DeprecationWarning):
        assert hits[0] == old[0] and hits[:1] == old[:1]
    with pytest.warns(DeprecationWarning):
        assert hits == [(1, float(np.float32(0.9))), (2, float(np.float32(0.5)))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what the library itself reads never warns
        assert len(hits) == 2 and hits.scores.tolist() == pytest.approx([0.9, 0.5])
    with pytest.warns(DeprecationWarning, match="top_scores goes in 0.3"):
        assert top_scores(np.array([0.2, 0.9]), None) == [(1, pytest.approx(0.9)), (0, pytest.approx(0.2))]


def test_every_pair_scorer_answers_the_same_rerank(regressor, tiny_models, tmp_path, minilm_path):
    """A cross-encoder folder and a fine-tuned pair model: the same signature, the same answer type."""
    import inspect

    from _serve_helpers import tiny_cross_encoder

    from ctxrep.rerank import LLMReranker

    signature = inspect.signature(CrossEncoderReranker.rerank)
    for scorer in (LLMReranker, PairModelReranker, SequenceRegressor, SequenceClassifier):
        assert inspect.signature(scorer.rerank).parameters.keys() == signature.parameters.keys(), scorer
    ce = load_reranker(tiny_cross_encoder(tmp_path / "ce", minilm_path))
    for reranker in (ce, load_reranker(regressor)):
        hits = reranker.rerank(QUERY, DOCS, top_n=2)
        assert isinstance(hits, Hits) and len(hits) == 2 and hits.scores.dtype == np.float32
