"""ctxrep.similarity, Featurizer(normalize=True), SentenceIndex (exact and HNSW, save/load, embed output) and the
`ctxrep index build` / `ctxrep search` commands, on a tiny random BERT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ctxrep
from ctxrep.cli import main
from ctxrep.featurize import Featurizer
from ctxrep.vectors.index import SentenceIndex, SentenceIndexError, read_texts

TEXTS = [
    "A man is playing a guitar .",
    "A woman slices an onion .",
    "Stocks fell sharply on Monday .",
    "The cat sleeps on the sofa .",
    "Someone plays the guitar .",
    "The market rallied late in the day .",
]


@pytest.fixture(scope="module")
def fz(tiny_models):
    return Featurizer(tiny_models["bert"])


def test_similarity_vectors_known_answers():
    u, v = np.array([1.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0])
    assert ctxrep.similarity(u, v) == pytest.approx(1 / np.sqrt(2))
    assert ctxrep.similarity(u, v, metric="dot") == pytest.approx(1.0)
    assert ctxrep.similarity(u, np.zeros(3)) == 0.0  # a zero vector is dissimilar to everything
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 8)), rng.normal(size=(3, 8))
    full = ctxrep.similarity(a, b)
    expected = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    np.testing.assert_allclose(full, expected, rtol=1e-12)
    assert ctxrep.similarity(a[0], b).shape == (3,)
    np.testing.assert_allclose(ctxrep.similarity(a[:3], b, pairwise=True), np.diag(expected[:3]), rtol=1e-12)
    with pytest.raises(ValueError, match="a has 4 rows but b has 3"):
        ctxrep.similarity(a, b, pairwise=True)
    with pytest.raises(ValueError, match="8 wide but b's are 5"):
        ctxrep.similarity(a, rng.normal(size=(2, 5)))
    with pytest.raises(ValueError, match="metric must be one of"):
        ctxrep.similarity(u, v, metric="l2")


def test_similarity_texts_go_through_the_featurizer(fz):
    vectors = fz.embed_sentences(TEXTS[:3])
    by_text = ctxrep.similarity(TEXTS[0], TEXTS[1:3], featurizer=fz)
    np.testing.assert_allclose(by_text, ctxrep.similarity(vectors[0], vectors[1:3]), rtol=1e-6)
    assert ctxrep.similarity(TEXTS[0], TEXTS[0], featurizer=fz) == pytest.approx(1.0, abs=1e-6)
    mixed = ctxrep.similarity(TEXTS[:2], vectors[1:3], featurizer=fz, pairwise=True)  # texts against vectors
    np.testing.assert_allclose(mixed, [ctxrep.similarity(vectors[i], vectors[i + 1]) for i in range(2)], rtol=1e-6)


def test_featurizer_normalize(tiny_models):
    plain = Featurizer(tiny_models["bert"]).embed_sentences(TEXTS[:3])
    unit = Featurizer(tiny_models["bert"], normalize=True).embed_sentences(TEXTS[:3])
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(unit, plain / np.linalg.norm(plain, axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    layers = Featurizer(tiny_models["bert"], layers=[0, 2], normalize=True).embed_sentences(TEXTS[:2])
    np.testing.assert_allclose(np.linalg.norm(layers, axis=-1), 1.0, rtol=1e-6)  # each layer's vector


def test_index_search_matches_brute_force_and_round_trips(fz, tmp_path):
    ix = SentenceIndex.build(TEXTS[:4], featurizer=fz)
    ix.add(TEXTS[4:], ids=["x", "y"])
    assert len(ix) == 6 and ix.ids == [0, 1, 2, 3, "x", "y"]
    hits = ix.search(TEXTS[0], k=3)
    scores = ctxrep.similarity(TEXTS[0], TEXTS, featurizer=fz)
    order = np.argsort(-scores)[:3]
    assert hits.texts == [TEXTS[i] for i in order]
    np.testing.assert_allclose(hits.scores, scores[order], rtol=1e-5)
    assert hits.ids[0] == 0 and hits.scores[0] == pytest.approx(1.0, abs=1e-5)
    ix.save(tmp_path / "ix")
    assert sorted(p.name for p in (tmp_path / "ix").iterdir()) == ["index.json", "items.jsonl", "vectors.npy"]
    back = SentenceIndex.load(tmp_path / "ix")  # rebuilds the featurizer from the saved settings
    again = back.search([TEXTS[0], TEXTS[5]], k=3)
    assert again[0].ids == hits.ids and again[1].ids[0] == "y"
    np.testing.assert_allclose(again[0].scores, hits.scores, rtol=1e-5)
    with pytest.raises(SentenceIndexError, match="id 'x' is already in the index"):
        back.add_vectors(np.ones((1, ix.dim)), ids=["x"])


def test_hnsw_for_large_sets_agrees_with_exact_and_saves_its_graph(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3000, 16)).astype(np.float32)
    ix = SentenceIndex.from_vectors(vectors, exact_below=1000, metric="dot")
    queries = vectors[:40] + 0.01 * rng.normal(size=(40, 16)).astype(np.float32)
    approx, exact = ix.search(queries, k=5), ix.search(queries, k=5, exact=True)
    recall = np.mean([len(set(a.ids) & set(e.ids)) / 5 for a, e in zip(approx, exact)])
    assert recall >= 0.95
    np.testing.assert_allclose(exact[0].scores, np.sort(vectors @ queries[0])[::-1][:5], rtol=1e-5)
    ix.save(tmp_path / "big")
    assert (tmp_path / "big" / "hnsw.bin").is_file()
    back = SentenceIndex.load(tmp_path / "big")
    assert [h.ids for h in back.search(queries[:5], k=5)] == [h.ids for h in approx[:5]]
    with pytest.raises(SentenceIndexError, match="does not know which model"):
        back.search("a text query", k=1)


def test_cli_build_search_and_embed_output(tiny_models, tmp_path):
    model = str(tiny_models["bert"])
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    runner = CliRunner()
    out = runner.invoke(
        main,
        ["index", "build", "--input", str(tmp_path / "texts.txt"), "--model", model, "--out", str(tmp_path / "ix")],
    )
    assert out.exit_code == 0, out.output
    out = runner.invoke(main, ["search", "--index", str(tmp_path / "ix"), "--query", TEXTS[2], "-k", "2"])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert lines[0] == "query\trank\tscore\tid\ttext"
    assert lines[1].split("\t")[3:] == ["2", TEXTS[2]]  # ids are 0-based text numbers, as SentenceIndex.build
    assert lines[1].split("\t")[:2] == ["0", "0"]  # query numbers and ranks count from 0 too (one rule)

    # embed once, index the vectors without embedding again: the same hits
    out = runner.invoke(
        main,
        ["embed", "--input", str(tmp_path / "texts.txt"), "--model", model, "--level", "sentence"]
        + ["--out", str(tmp_path / "vecs")],
    )
    assert out.exit_code == 0, out.output
    args = ["index", "build", "--vectors", str(tmp_path / "vecs"), "--input", str(tmp_path / "texts.txt")]
    out = runner.invoke(main, args + ["--out", str(tmp_path / "ix2")])
    assert out.exit_code == 0, out.output
    (tmp_path / "q.txt").write_text(f"{TEXTS[2]}\n{TEXTS[4]}\n")
    a = runner.invoke(main, ["search", "--index", str(tmp_path / "ix"), "--queries", str(tmp_path / "q.txt")])
    b = runner.invoke(main, ["search", "--index", str(tmp_path / "ix2"), "--queries", str(tmp_path / "q.txt")])
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    rows_a = [r.split("\t") for r in a.output.splitlines()[1:]]
    rows_b = [r.split("\t") for r in b.output.splitlines()[1:]]
    assert [r[3:] for r in rows_a] == [r[3:] for r in rows_b]
    np.testing.assert_allclose([float(r[2]) for r in rows_a], [float(r[2]) for r in rows_b], atol=2e-4)
    meta = json.loads((tmp_path / "ix2" / "index.json").read_text())
    assert meta["spec"]["model"] == str(Path(model).resolve()) and meta["count"] == len(TEXTS)
    bare = SentenceIndex.from_vectors(tmp_path / "vecs")  # no texts given: ids are the text numbers, texts unknown
    hit = bare.search(TEXTS[4], k=1)  # the query embedded with the embed run's own settings
    assert hit.ids == [4] and hit.texts == [None] and hit.scores[0] == pytest.approx(1.0, abs=1e-5)


def test_bad_input_names_file_and_line(tmp_path):
    (tmp_path / "t.csv").write_text("qid,question\n1,How are you?\n2,\n")
    with pytest.raises(ValueError, match=r"t\.csv:3: the 'question' column \(--text-column\) is empty"):
        read_texts(tmp_path / "t.csv", None, text_column="question", id_column="qid")
    (tmp_path / "u.csv").write_text("qid,question\n1,How are you?\n")
    runner = CliRunner()
    out = runner.invoke(main, ["index", "build", "--input", str(tmp_path / "u.csv"), "--out", str(tmp_path / "o")])
    assert out.exit_code == 1
    assert out.output.strip() == (
        f"error: {tmp_path / 'u.csv'}:1: no column 'text' in the header (columns: qid, question); "
        "name the column with --text-column"
    )
    (tmp_path / "d.tsv").write_text("id\ttext\na\tone\na\ttwo\n")
    with pytest.raises(ValueError, match=r"d\.tsv:3: id 'a' was already used on line 2"):
        read_texts(tmp_path / "d.tsv", None, id_column="id")
    (tmp_path / "e.txt").write_text("one\n\nthree\n")
    with pytest.raises(ValueError, match=r"e\.txt:2: empty line"):
        read_texts(tmp_path / "e.txt", None)
    out = runner.invoke(main, ["search", "--index", str(tmp_path), "--query", "x"])
    assert out.exit_code == 1 and "not a sentence index (no index.json)" in out.output
