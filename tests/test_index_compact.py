"""SentenceIndex with compact vectors (dimensions, binary codes rescored by int8 / float32 vectors) and query /
document prompts, against sentence-transformers' encode(prompt_name=..., truncate_dim=...) on a tiny random folder
that declares prompts; save / load round trips; `ctxrep index build` / `ctxrep search` with the same options."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _st_helpers import prompted_st_folder
from click.testing import CliRunner

from ctxrep import Featurizer
from ctxrep.cli import main
from ctxrep.vectors.index import SentenceIndex, SentenceIndexError
from ctxrep.vectors.quantize import Binary, BinaryIndex, Rescore, quantize

st = pytest.importorskip("sentence_transformers")

DOCS = [
    "A crane caught a fish .",
    "Unbelievably , the newscaster broke into the broadcast !",
    "Dawn broke .",
    "the quick brown fox jumps over the lazy dog",
    "the crane lifted the steel beam onto the roof",
    "stocks fell sharply after the announcement",
]
QUERIES = ["a bird catching fish", "news on television", "construction site"]
PROMPTS = {"query": "query : ", "document": "passage : "}


@pytest.fixture(scope="module")
def prompted(tmp_path_factory, minilm_path) -> Path:
    """A tiny random BERT saved by sentence-transformers with mean pooling, Normalize and two prompts."""
    return prompted_st_folder(tmp_path_factory.mktemp("prompted"), minilm_path, PROMPTS)


@pytest.fixture(scope="module")
def theirs(prompted):
    return st.SentenceTransformer(str(prompted))


def _featurizer(folder: Path) -> Featurizer:
    return Featurizer(folder, sentence_pooling="model")


# ---- prompts --------------------------------------------------------------------------------------------------


def test_document_and_query_prompts_match_sentence_transformers(prompted, theirs, tmp_path):
    ix = SentenceIndex.build(DOCS, featurizer=_featurizer(prompted), document_prompt_name="document")
    docs = theirs.encode(DOCS, prompt_name="document")
    np.testing.assert_allclose(ix.vectors, docs, atol=1e-5)
    queries = theirs.encode(QUERIES, prompt_name="query")
    expected = queries @ docs.T
    for hits, row in zip(ix.search(QUERIES, k=3, prompt_name="query"), expected):
        assert hits.rows.tolist() == np.argsort(-row, kind="stable")[:3].tolist()
        np.testing.assert_allclose(hits.scores, np.sort(row)[::-1][:3], atol=1e-5)
    plain = ix.search(QUERIES[0], k=len(DOCS))  # no query prompt: another query vector, other scores
    assert not np.allclose(np.sort(plain.scores), np.sort(expected[0]), atol=1e-4)

    # recorded in index.json: rows added after load get the same document prompt
    ix.save(tmp_path / "ix")
    meta = json.loads((tmp_path / "ix" / "index.json").read_text())
    assert meta["document_prompt"] == {"prompt": None, "prompt_name": "document"}
    back = SentenceIndex.load(tmp_path / "ix")
    back.add(["a heron stood in the river"], ids=["new"])
    np.testing.assert_allclose(
        back.vectors[-1], theirs.encode(["a heron stood in the river"], prompt_name="document")[0], atol=1e-5
    )


def test_prompt_given_as_text_equals_prompt_by_name(prompted):
    fz = _featurizer(prompted)
    by_name = SentenceIndex.build(DOCS, featurizer=fz, document_prompt_name="document")
    by_text = SentenceIndex.build(DOCS, featurizer=fz, document_prompt="passage : ")
    np.testing.assert_allclose(by_name.vectors, by_text.vectors, atol=1e-6)
    a = by_name.search(QUERIES, k=2, prompt_name="query")
    b = by_name.search(QUERIES, k=2, prompt="query : ")
    assert [h.ids for h in a] == [h.ids for h in b]


def test_unknown_prompt_names_and_bad_prompt_arguments(prompted):
    fz = _featurizer(prompted)
    with pytest.raises(ValueError, match=r"unknown prompt name 'passage': .* declares the prompts 'document', 'query'"):
        SentenceIndex.build(DOCS, featurizer=fz, document_prompt_name="passage")
    ix = SentenceIndex.build(DOCS, featurizer=fz)
    with pytest.raises(
        ValueError, match=r"unknown prompt name 'question': .* declares the prompts 'document', 'query'"
    ):
        ix.search("a fish", prompt_name="question")
    with pytest.raises(SentenceIndexError, match="apply to text queries; these queries are vectors"):
        ix.search(ix.vectors[0], prompt_name="query")
    with pytest.raises(ValueError, match="document_prompt or document_prompt_name, not both"):
        SentenceIndex(32, document_prompt="a", document_prompt_name="query")


# ---- dimensions -----------------------------------------------------------------------------------------------


def test_dimensions_match_truncate_dim_and_survive_a_round_trip(prompted, tmp_path):
    fz = _featurizer(prompted)
    ix = SentenceIndex.build(DOCS, featurizer=fz, dimensions=16, document_prompt_name="document")
    truncated = st.SentenceTransformer(str(prompted), truncate_dim=16)
    docs = truncated.encode(DOCS, prompt_name="document", normalize_embeddings=True)
    assert ix.dim == 16 and ix.vectors.shape == (len(DOCS), 16)
    np.testing.assert_allclose(ix.vectors, docs, atol=1e-5)
    query = truncated.encode([QUERIES[1]], prompt_name="query", normalize_embeddings=True)[0]
    hits = ix.search(QUERIES[1], k=len(DOCS), prompt_name="query")  # the query truncated the same way
    np.testing.assert_allclose(hits.scores, np.sort(docs @ query)[::-1], atol=1e-5)

    ix.save(tmp_path / "ix")
    assert json.loads((tmp_path / "ix" / "index.json").read_text())["dimensions"] == 16
    for back in (SentenceIndex.load(tmp_path / "ix"), SentenceIndex.load(tmp_path / "ix", featurizer=fz)):
        assert back.dimensions == 16
        again = back.search(QUERIES[1], k=len(DOCS), prompt_name="query")
        assert again.ids == hits.ids
        np.testing.assert_allclose(again.scores, hits.scores, atol=1e-6)


def test_dimensions_on_given_vectors_and_too_many_dimensions(prompted):
    rng = np.random.default_rng(0)
    v = rng.normal(size=(10, 24)).astype(np.float32)
    ix = SentenceIndex.from_vectors(v, dimensions=8)
    expected = v[:, :8] / np.linalg.norm(v[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(ix.vectors, expected, atol=1e-6)
    with pytest.raises(ValueError, match="dimensions=25 is more than the vectors' 24; give at most 24"):
        SentenceIndex.from_vectors(v, dimensions=25)
    with pytest.raises(ValueError, match="more than this model's 32-wide sentence vectors; give at most 32"):
        SentenceIndex.build(DOCS, featurizer=_featurizer(prompted), dimensions=33)


# ---- binary codes rescored ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rescore", [Rescore.FLOAT32, Rescore.INT8])
def test_binary_top_hits_equal_exact_when_rescoring_covers_every_row(rescore, tmp_path):
    rng = np.random.default_rng(1)
    v = rng.normal(size=(40, 64)).astype(np.float32)
    q = rng.normal(size=(6, 64)).astype(np.float32)
    exact = SentenceIndex.from_vectors(v).search(q, k=5)
    binary = SentenceIndex.from_vectors(v, binary=Binary(rescore, 8))  # 5 x 8 = 40 candidates: every row
    hits = binary.search(q, k=5)
    assert binary.binary_index.codes.nbytes == 40 * 64 // 8
    if rescore is Rescore.FLOAT32:
        assert [h.ids for h in hits] == [h.ids for h in exact]
        for a, b in zip(hits, exact):
            np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)
    else:  # int8 rescoring: the exact order of the int8 vectors, scores within the int8 grid's error
        on_grid = binary.search(q, k=5, exact=True)
        assert [h.ids for h in hits] == [h.ids for h in on_grid]
        assert [h.ids[0] for h in hits] == [h.ids[0] for h in exact]
        for a, b in zip(hits, exact):
            np.testing.assert_allclose(a.scores, b.scores, atol=0.02)

    binary.save(tmp_path / "bx")
    assert {"binary", "rescore", "index.json", "items.jsonl"} <= {p.name for p in (tmp_path / "bx").iterdir()}
    assert not (tmp_path / "bx" / "vectors.npy").exists()
    back = SentenceIndex.load(tmp_path / "bx")
    assert back.binary == Binary(rescore, 8)
    meta = json.loads((tmp_path / "bx" / "index.json").read_text())
    assert meta["binary"] == {"rescore": rescore.value, "rescore_multiplier": 8}  # the strings of older ctxrep
    for a, b in zip(back.search(q, k=5), hits):
        assert a.ids == b.ids
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)


def test_rows_added_to_a_loaded_binary_index_are_coded_on_the_same_grid(tmp_path):
    rng = np.random.default_rng(2)
    v = rng.normal(size=(30, 32)).astype(np.float32)
    SentenceIndex.from_vectors(v[:20], binary=Binary(Rescore.INT8, 30)).save(tmp_path / "bx")
    back = SentenceIndex.load(tmp_path / "bx")
    ranges = back.binary_index.rescore.ranges.copy()
    back.add_vectors(v[20:], ids=[f"n{i}" for i in range(10)])
    coded = back.binary_index
    assert len(back) == len(coded) == 30
    unit = v[20:] / np.linalg.norm(v[20:], axis=1, keepdims=True)
    np.testing.assert_array_equal(coded.rescore.codes[20:], quantize(unit, "int8", ranges=ranges).codes)
    np.testing.assert_array_equal(coded.codes[20:], quantize(unit, "ubinary").codes)
    assert [h.ids[0] for h in back.search(v[20:], k=1)] == [f"n{i}" for i in range(10)]


def test_binary_bad_arguments():
    with pytest.raises(
        ValueError, match=r"binary must be None or a Binary\(rescore, rescore_multiplier\).* got 'int4'"
    ):
        SentenceIndex(8, binary="int4")
    with pytest.raises(ValueError, match="Binary.rescore must be Rescore.INT8 or Rescore.FLOAT32.* got 'int8'"):
        Binary("int8")
    with pytest.raises(ValueError, match="rescore_multiplier must be a positive integer, got 0"):
        Binary(Rescore.INT8, 0)
    with pytest.raises(ValueError, match=r"rescore_multiplier goes inside the Binary option"):
        SentenceIndex(8, binary=Binary(), rescore_multiplier=3)
    with pytest.raises(ValueError, match="rescore_multiplier applies to a binary index"):
        SentenceIndex(8, rescore_multiplier=3)
    with pytest.raises(ValueError, match=r"rescore must be Rescore.INT8 or Rescore.FLOAT32 .* got 'int4'"):
        BinaryIndex.build(np.ones((2, 8), np.float32), rescore="int4")
    one = SentenceIndex.from_vectors(np.ones((1, 8), np.float32), binary=Binary())
    with pytest.raises(SentenceIndexError, match="needs at least 2 rows for its int8 ranges, it has 1"):
        one.save("unused")


def test_old_binary_strings_work_for_a_release_with_a_deprecation_warning(tmp_path):
    """SentenceIndex(binary="int8" | "float32", rescore_multiplier=N), BinaryIndex.build(rescore="int8") and the
    rescore_multiplier attribute: the same index as the typed option, each with a DeprecationWarning; an index.json
    that older ctxrep wrote ({"rescore": "int8", ...}) loads as Binary."""
    v = np.random.default_rng(4).normal(size=(12, 16)).astype(np.float32)
    with pytest.warns(DeprecationWarning, match=r"binary='float32'\) is now binary=Binary\(Rescore.FLOAT32\)"):
        old = SentenceIndex.from_vectors(v, binary="float32")
    assert old.binary == Binary(Rescore.FLOAT32, 4)
    with pytest.warns(
        DeprecationWarning, match=r"'int8', rescore_multiplier=N\) is now binary=Binary\(Rescore.INT8, re"
    ):
        old = SentenceIndex.from_vectors(v, binary="int8", rescore_multiplier=6)
    assert old.binary == Binary(Rescore.INT8, 6)
    with pytest.warns(DeprecationWarning, match="binary.rescore_multiplier"):
        assert old.rescore_multiplier == 6
    new = SentenceIndex.from_vectors(v, binary=Binary(Rescore.INT8, 6))
    assert [h.ids for h in old.search(v[:3], k=4)] == [h.ids for h in new.search(v[:3], k=4)]
    with pytest.warns(DeprecationWarning, match=r"rescore='int8' is now rescore=Rescore.INT8"):
        built = BinaryIndex.build(v, rescore="int8")
    np.testing.assert_array_equal(built.rescore.codes, BinaryIndex.build(v, Rescore.INT8).rescore.codes)
    new.save(tmp_path / "bx")  # what older ctxrep wrote: the same strings, so either version reads the other's
    meta = json.loads((tmp_path / "bx" / "index.json").read_text())
    assert meta["binary"] == {"rescore": "int8", "rescore_multiplier": 6}
    del meta["binary"]["rescore_multiplier"]  # the first binary indexes' index.json may lack it: 4
    (tmp_path / "bx" / "index.json").write_text(json.dumps(meta))
    assert SentenceIndex.load(tmp_path / "bx").binary == Binary(Rescore.INT8, 4)
    meta["binary"] = {"rescore": "int4"}
    (tmp_path / "bx" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(SentenceIndexError, match=r"index.json: not written by SentenceIndex.save \(ValueError"):
        SentenceIndex.load(tmp_path / "bx")


# ---- the command line -----------------------------------------------------------------------------------------


def test_cli_dimensions_binary_and_prompts(prompted, tmp_path):
    (tmp_path / "docs.txt").write_text("\n".join(DOCS) + "\n")
    runner = CliRunner()
    args = ["index", "build", "--input", str(tmp_path / "docs.txt"), "--model", str(prompted)]
    args += ["--sentence-pooling", "model", "--dimensions", "16", "--binary", "--rescore", "float32"]
    args += ["--rescore-multiplier", "8", "--document-prompt-name", "document", "--out", str(tmp_path / "bx")]
    out = runner.invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "16 wide, cosine, binary codes rescored by float32" in out.output
    meta = json.loads((tmp_path / "bx" / "index.json").read_text())
    assert meta["dimensions"] == 16 and meta["binary"] == {"rescore": "float32", "rescore_multiplier": 8}

    query = ["search", "--index", str(tmp_path / "bx"), "--query", QUERIES[0], "-k", "3"]
    out = runner.invoke(main, query + ["--query-prompt-name", "query"])
    assert out.exit_code == 0, out.output
    rows = [r.split("\t") for r in out.output.splitlines()[1:]]
    # 3 hits x 8 candidates covers the 6 texts: the exact truncated vectors' order and scores
    truncated = st.SentenceTransformer(str(prompted), truncate_dim=16)
    docs = truncated.encode(DOCS, prompt_name="document", normalize_embeddings=True)
    q = truncated.encode([QUERIES[0]], prompt_name="query", normalize_embeddings=True)[0]
    best = np.argsort(-(docs @ q), kind="stable")[:3]
    assert [int(r[3]) for r in rows] == best.tolist()
    np.testing.assert_allclose([float(r[2]) for r in rows], (docs @ q)[best], atol=1e-4)

    out = runner.invoke(main, query + ["--query-prompt-name", "question"])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [
        f"error: unknown prompt name 'question': {prompted} declares the prompts 'document', 'query'"
    ]
    out = runner.invoke(
        main,
        [
            "index",
            "build",
            "--input",
            str(tmp_path / "docs.txt"),
            "--sparse",
            "--binary",
            "--out",
            str(tmp_path / "sx"),
        ],
    )
    assert out.exit_code != 0 and "--binary: dense sentence indexes only" in out.output


def test_an_index_saved_before_these_settings_loads_as_a_float_index(tmp_path):
    v = np.random.default_rng(3).normal(size=(8, 16)).astype(np.float32)
    SentenceIndex.from_vectors(v).save(tmp_path / "ix")
    meta_file = tmp_path / "ix" / "index.json"
    meta = json.loads(meta_file.read_text())
    for key in ("dimensions", "document_prompt", "binary"):
        del meta[key]
    meta_file.write_text(json.dumps(meta))
    back = SentenceIndex.load(tmp_path / "ix")
    assert (back.dimensions, back.binary, back.document_prompt, back.document_prompt_name) == (None, None, None, None)
    assert back.search(v[3], k=1).ids == [3]


def test_cli_refuses_options_that_do_not_apply(tmp_path):
    (tmp_path / "docs.txt").write_text("\n".join(DOCS) + "\n")
    runner = CliRunner()
    build = ["index", "build", "--input", str(tmp_path / "docs.txt"), "--out", str(tmp_path / "ix")]
    out = runner.invoke(main, build + ["--rescore", "float32"])
    assert out.exit_code == 1 and "--rescore and --rescore-multiplier apply to a binary index" in out.output
    out = runner.invoke(main, build + ["--binary", "--rescore-multiplier", "0"])
    assert out.exit_code == 1 and "rescore_multiplier must be a positive integer, got 0" in out.output
    out = runner.invoke(main, build + ["--late-interaction", "--dimensions", "8", "--document-prompt", "a: "])
    assert out.exit_code == 1
    assert "--dimensions, --document-prompt: dense sentence indexes only" in out.output
    assert not (tmp_path / "ix").exists()


@pytest.mark.parametrize("dimensions", [0, -3, 2.5, True])
def test_dimensions_must_be_a_positive_integer(dimensions):
    with pytest.raises(ValueError, match="dimensions must be a positive integer"):
        SentenceIndex.from_vectors(np.ones((3, 8), np.float32), dimensions=dimensions)
