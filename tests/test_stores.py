"""The vector stores (ctxrep.stores) on their real engines: LanceDB and Chroma embedded, Qdrant through
qdrant-client's local mode (the client's own engine, in Python), and a real PostgreSQL 16 with pgvector started on
127.0.0.1 by these tests (ctxrep.stores.local_postgres; it fails, never skips, when it cannot start).

Round trips of every vector kind each store holds, `ctxrep embed --store` against the same job into a folder,
kill -9 in the middle of a write and a rerun (rows = texts, no duplicate, the vectors of an uninterrupted run),
search through the store (CLI and `ctxrep.open_store`), and the bad input of issue 45: unknown scheme, unreachable
server, a table of other vectors, a kind the store cannot hold, credentials never printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.embed.corpus import EmbedJob, SentenceVectors, SparseVectors, StoreTable, WordVectors, embed_corpus
from ctxrep.featurize.spec import FeaturizerSpec, SpecMismatch
from ctxrep.stores import StoreError, connect, open_store, parse
from ctxrep.stores.base import Rows, StoreRecord, VectorKind, row_id
from ctxrep.stores.local_postgres import PASSWORD, PostgresServer
from ctxrep.vectors.store import load_vectors

ROOT = Path(__file__).resolve().parents[1]
STORES = ["lancedb", "pgvector", "qdrant", "chroma"]
TEXTS = [
    "A man plays a guitar .",
    "Stocks fell sharply on Monday .",
    "The cat sleeps on the sofa .",
    "A woman slices an onion .",
    "The market rallied after the news .",
    "Two dogs run through a field .",
    "A child reads a book in the park .",
    "The band played until midnight .",
    "Rain is expected tomorrow .",
    "He fixed the bike with a wrench .",
    "The chef tasted the soup .",
]


@pytest.fixture(scope="module")
def pg():
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def make_uri(tmp_path, request):
    """uri(store) -> a fresh table's address in that store."""

    def uri(store: str) -> str:
        name = f"t{uuid.uuid4().hex[:8]}"
        if store == "pgvector":
            return request.getfixturevalue("pg").uri(name)
        folder = {"lancedb": "db.lancedb", "qdrant": "db.qdrant", "chroma": "db.chroma"}[store]
        return f"{store}:{tmp_path / folder}/{name}"

    return uri


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


@pytest.fixture(scope="module")
def folder_run(corpus, tiny_models, tmp_path_factory) -> np.ndarray:
    """The same job into a shard folder: the vectors every store run must hold."""
    out = tmp_path_factory.mktemp("folder")
    job = EmbedJob(corpus, out, vectors=SentenceVectors(), model=str(tiny_models["bert"]))
    embed_corpus(job, show_progress=False, log=lambda _: None)
    return load_vectors(out).array


def _rows(n: int, dim: int, seed: int = 0, source: str = "/data/in.txt") -> Rows:
    rng = np.random.default_rng(seed)
    lines = np.arange(1, n + 1)
    ids = [row_id(source, int(line), "text", -1) for line in lines]
    return Rows(ids, [source] * n, lines, ["text"] * n, np.full(n, -1), [""] * n, [f"text {i}" for i in lines],
                rng.standard_normal((n, dim)).astype(np.float32))  # fmt: skip


def _same(name: str, got, expected, atol: float = 1e-6) -> None:
    """The vectors a store gives back equal those written (Qdrant keeps cosine vectors at unit length)."""
    got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
    if name == "qdrant":
        got, expected = (a / np.linalg.norm(a, axis=1, keepdims=True) for a in (got, expected))
    np.testing.assert_allclose(got, expected, atol=atol)


def _all(store) -> Rows:
    parts = list(store.scan())
    return Rows(
        [i for p in parts for i in p.ids], [s for p in parts for s in p.sources],
        np.concatenate([p.lines for p in parts]), [f for p in parts for f in p.fields],
        np.concatenate([p.positions for p in parts]), [w for p in parts for w in p.words],
        [t for p in parts for t in p.texts],
        scipy.sparse.vstack([p.vectors for p in parts]) if scipy.sparse.issparse(parts[0].vectors)
        else np.concatenate([p.vectors for p in parts]),
    )  # fmt: skip


# ---- the protocol on each engine -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", STORES)
def test_protocol_round_trip_search_discard_and_record(name, make_uri):
    uri = make_uri(name)
    store = connect(uri)
    assert store.read_record() is None
    rows = _rows(40, 8)
    record = StoreRecord(FeaturizerSpec(model="m"), VectorKind("dense", 8), runs={"k": {"shards": 1}})
    store.create(record)
    store.write(Rows(*(c[:25] for c in vars(rows).values())), record)
    store.write(Rows(*(c[25:] for c in vars(rows).values())), record)
    assert store.count() == 40
    store.finish()
    store.close()

    store = connect(uri)  # what the engine kept
    assert store.read_record() == record
    back = _all(store)
    order = np.argsort(back.lines)
    assert [back.ids[i] for i in order] == rows.ids and [back.texts[i] for i in order] == rows.texts
    _same(name, back.vectors[order], rows.vectors)
    for exact in (True, False):
        found = store.search(rows.vectors[[3, 17]], k=3, exact=exact)
        assert [f.ids[0] for f in found] == [rows.ids[3], rows.ids[17]]
        assert found[0].scores[0] == pytest.approx(1.0, abs=1e-5) and list(found[0].lines[:1]) == [4]
        assert np.all(np.diff(found[0].scores) <= 1e-6)  # best first
    store.discard("/data/in.txt", "text", 31)  # lines 31..40 go
    assert store.count() == 30
    store.delete_ids(rows.ids[:2])
    assert store.count() == 28
    store.close()


KINDS = [
    ("lancedb", "?vector=half", "float16"),
    ("lancedb", "", "bit"),
    ("pgvector", "&vector=half", "float16"),
    ("pgvector", "", "bit"),
    ("pgvector", "", "sparse"),
    ("qdrant", "?vector=half", "float16"),
    ("qdrant", "?quantization=scalar", "float32"),  # Qdrant's own int8 beside the float vectors (a server's)
    ("qdrant", "", "sparse"),
]


@pytest.mark.parametrize("name, option, what", KINDS)
def test_every_kind_a_store_holds_natively(name, option, what, make_uri):
    store = connect(make_uri(name) + option)
    rows = _rows(30, 64, seed=1)
    if what == "sparse":
        dense = np.where(rows.vectors > 1.0, rows.vectors, 0.0).astype(np.float32)  # a few entries per row
        dense[np.arange(30), np.arange(30)] = 5.0  # each row's own strong entry
        rows.vectors, kind = scipy.sparse.csr_matrix(dense), VectorKind("sparse", 64)
    elif what == "bit":
        rows.vectors, kind = np.packbits(rows.vectors > 0, axis=1), VectorKind("dense", 64, "bit")
    else:
        kind = store.stored(VectorKind("dense", 64))
        assert kind.precision == what
    record = StoreRecord(FeaturizerSpec(model="m"), kind)
    store.create(record)
    store.write(rows, record)
    found = store.search(rows.vectors[[5]] if what != "sparse" else rows.vectors[5], k=2, exact=True)[0]
    assert found.ids[0] == rows.ids[5]
    back = _all(store)
    order = np.argsort(back.lines)
    if what == "sparse":
        assert (back.vectors[order] != rows.vectors).nnz == 0
    else:
        _same(name, back.vectors[order], rows.vectors, atol={"float16": 1e-2, "bit": 0}.get(what, 1e-6))
    store.close()


@pytest.mark.parametrize("name, kind", [("chroma", VectorKind("sparse", 9)), ("qdrant", VectorKind("dense", 8, "bit")),
                                        ("lancedb", VectorKind("sparse", 9))])  # fmt: skip
def test_a_kind_the_store_cannot_hold_is_one_line(name, kind, make_uri):
    uri = parse(make_uri(name))
    with pytest.raises(StoreError, match=r"holds no .*\(it holds") as e:
        connect(uri).refuse(kind, uri)
    assert "\n" not in str(e.value)


# ---- embedding jobs into stores ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STORES)
def test_kill_mid_write_then_rerun_leaves_each_text_once_as_the_folder_run(
    name, make_uri, corpus, tiny_models, folder_run
):
    uri = make_uri(name)
    model = str(tiny_models["bert"])
    at = 1 + (sum(map(ord, name)) % 2)  # the first or the second write, by store
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_store_kill.py"), uri, str(corpus), model, str(at)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr[-2000:]
    with open_store(uri) as store:
        written = len(store)
    assert 0 < written < len(TEXTS) or name == "postgresql"  # half a write landed (PostgreSQL rolls it back)
    job = EmbedJob(corpus, StoreTable(uri, shard_size=4, commit_rows=5), vectors=SentenceVectors(), model=model,
                   threads=1)  # fmt: skip
    workers = 2 if name == "lancedb" else 1  # worker processes send their rows to the one writer, in order
    summary = embed_corpus(job, workers=workers, show_progress=False, log=lambda _: None)
    assert (summary.texts, summary.rows) == (len(TEXTS), len(TEXTS)) and PASSWORD not in summary.describe()
    assert embed_corpus(job, show_progress=False, log=lambda _: None).already_complete
    with open_store(uri) as store:
        back = _all(store.store)
        assert len(store) == len(TEXTS) and store.spec.model == str(Path(model).resolve())
        hits = store.search(TEXTS[6], k=3, exact=True)  # a text finds itself, embedded with the recorded spec
        assert hits.texts[0] == TEXTS[6] and hits.rows[0] == 7 and hits.scores[0] == pytest.approx(1.0, abs=1e-5)
        assert [h.texts[0] for h in store.search(TEXTS[:2], k=1)] == TEXTS[:2]  # the ANN index
    assert len(back) == len(TEXTS) and len(set(back.ids)) == len(TEXTS)  # rows = texts, no duplicate
    order = np.argsort(back.lines)
    assert [back.texts[i] for i in order] == TEXTS
    _same(name, back.vectors[order], folder_run)  # the vectors of an uninterrupted run, into a folder


def test_word_vectors_are_one_row_per_word_occurrence(make_uri, corpus, tiny_models):
    uri = make_uri("lancedb")
    job = EmbedJob(corpus, StoreTable(uri, shard_size=4), vectors=WordVectors(), model=str(tiny_models["bert"]))
    embed_corpus(job, show_progress=False, log=lambda _: None)
    with open_store(uri) as store:
        back = _all(store.store)
    words = [(n + 1, p, w) for n, t in enumerate(TEXTS) for p, w in enumerate(t.split())]
    got = sorted(zip(back.lines.tolist(), back.positions.tolist(), back.words))
    assert got == words and len(set(back.ids)) == len(words)
    assert back.ids[0].endswith(":0") and back.texts[0] in TEXTS  # id: file:line:field:word; the text it occurs in


def _mlm_folder(path: Path) -> Path:
    """A tiny BERT with its masked-LM head (random): SPLADE vectors over MiniLM's vocabulary."""
    import torch
    import transformers

    from ctxrep.models.loading import resolve_model_path

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64)  # fmt: skip
    model = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(-4.0, 1.0)  # most ids at zero: sparse as SPLADE is (sparsevec <= 16,000)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(resolve_model_path("minilm") / name, path / name)
    return path


@pytest.mark.parametrize("name", ["pgvector", "qdrant"])
def test_sparse_vectors_into_sparsevec_and_qdrant_sparse(name, make_uri, corpus, tmp_path):
    model = str(_mlm_folder(tmp_path / "mlm"))
    uri = make_uri(name)
    job = EmbedJob(corpus, StoreTable(uri, with_text=False), vectors=SparseVectors(), model=model)  # --no-store-text
    embed_corpus(job, show_progress=False, log=lambda _: None)
    with open_store(uri) as store:
        assert store.kind.form == "sparse" and len(store) == len(TEXTS)
        hits = store.search(TEXTS[2], k=2, exact=True)
    assert hits.ids[0].endswith(":3:text") and hits.texts == [None, None] and hits.rows[0] == 3


def test_hybrid_dense_and_sparse_rows_in_qdrant_fused_by_rrf(make_uri, corpus, tiny_models, tmp_path):
    uri = make_uri("qdrant")
    quiet = {"show_progress": False, "log": lambda _: None}
    embed_corpus(EmbedJob(corpus, StoreTable(uri), vectors=SentenceVectors(), model=str(tiny_models["bert"])), **quiet)
    mlm = str(_mlm_folder(tmp_path / "mlm"))
    sparse = EmbedJob(corpus, StoreTable(uri), vectors=SparseVectors(), model=mlm)
    assert embed_corpus(sparse, **quiet).rows == len(TEXTS)  # beside the dense vectors, on the same rows
    assert embed_corpus(sparse, **quiet).already_complete
    with open_store(uri) as store:
        assert len(store) == len(TEXTS) and store.record.sparse.model == str(Path(mlm).resolve())
        hits = store.search(TEXTS[3], k=3, hybrid=True)
        assert hits.texts[0] == TEXTS[3] and np.all(np.diff(hits.scores) <= 0)  # RRF's scores, best first
        dense_only = store.search(TEXTS[3], k=3)
        assert dense_only.texts[0] == TEXTS[3]
    r = _cli("search", "--store", uri, "--query", TEXTS[5], "--hybrid", "-k", "1")
    assert r.exit_code == 0 and r.output.splitlines()[1].endswith(TEXTS[5]), r.output
    r = _cli("search", "--store", make_uri("lancedb"), "--query", "x", "--hybrid")
    assert r.exit_code == 1 and "no such table" in r.output
    dense_only = make_uri("qdrant")
    made = connect(dense_only)
    made.create(StoreRecord(FeaturizerSpec(model="m"), VectorKind("dense", 32)))
    made.close()
    with pytest.raises(StoreError, match="no sparse vectors beside the dense ones"), open_store(dense_only) as other:
        other.search("x", hybrid=True)


@pytest.mark.parametrize("name", ["lancedb", "qdrant"])
def test_multi_vector_rows_scored_by_maxsim(name, make_uri, tiny_models):
    from ctxrep.vectors.late_interaction import MultiVectorEncoder, maxsim_scores

    encoder = MultiVectorEncoder(str(tiny_models["bert"]))
    uri = make_uri(name)
    with open_store(uri, featurizer=encoder) as store:
        store.add(TEXTS[:6], ids=[f"doc{i}" for i in range(6)])
        assert store.kind == VectorKind("multi", 32) and len(store) == 6
        hits = store.search(TEXTS[2], k=6, exact=True)
    unit = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in encoder.embed_documents(TEXTS[:6])]
    query = encoder.embed_queries([TEXTS[2]])[0]
    expected = maxsim_scores([query / np.linalg.norm(query, axis=1, keepdims=True)], unit)[0]  # MaxSim of cosines
    assert hits.ids[0] == "doc2" and hits.texts[0] == TEXTS[2]
    np.testing.assert_allclose(hits.scores, np.sort(expected)[::-1], atol=1e-4)
    with open_store(uri) as again:  # queries embedded by the MultiVectorEncoder of the recorded spec
        assert again.search(TEXTS[4], k=1).ids == ["doc4"]
    with (
        pytest.raises(StoreError, match="holds no multi vectors"),
        open_store(make_uri("chroma"), featurizer=encoder) as c,
    ):
        c.add(["x"])


# ---- the command line --------------------------------------------------------------------------------------


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_cli_embed_search_and_index_build_through_postgresql(pg, corpus, tiny_models, tmp_path):
    uri = pg.uri("cli_table")
    model = str(tiny_models["bert"])
    r = _cli("embed", "--input", str(corpus), "--store", uri, "--level", "sentence", "--model", model)
    assert r.exit_code == 0, r.output
    assert PASSWORD not in r.output and "ctxrep:***@127.0.0.1" in r.output
    r = _cli("search", "--store", uri, "--query", TEXTS[4], "-k", "2", "--exact")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[1].endswith(TEXTS[4])
    r = _cli("index", "build", "--vectors", uri, "--input", str(corpus), "--out", str(tmp_path / "ix"))
    assert r.exit_code == 1 and "a store's rows carry their ids and texts; leave out --input" in r.output
    r = _cli("index", "build", "--vectors", uri, "--out", str(tmp_path / "ix"))
    assert r.exit_code == 0, r.output
    from ctxrep.vectors.index import SentenceIndex

    ix = SentenceIndex.load(tmp_path / "ix")
    assert len(ix) == len(TEXTS) and ix.search(TEXTS[4], k=1).texts[0] == TEXTS[4]


def test_cli_refusals_are_one_line_before_any_embedding(tmp_path, corpus):
    cases = [
        (["--store", "mongo:db/t"], "unknown store (scheme 'mongo')"),
        (["--store", f"lancedb:{tmp_path}/db/t", "--out", str(tmp_path / "o")], "give --out DIR"),
        ([], "give --out DIR"),
        (["--store", f"chroma:{tmp_path}/ch/coll", "--level", "sentence", "--output", "sparse"], "holds no sparse"),
        (["--store", f"lancedb:{tmp_path}/db/t", "--level", "sentence", "--output-precision", "int8"], "grid"),
        (["--store", f"lancedb:{tmp_path}/db/t", "--layers", "all"], "one vector"),
        (["--store", f"lancedb:{tmp_path}/db/t?indx=none"], "unknown option 'indx'"),
        (["--store", f"lancedb:{tmp_path}/db/t", "--shard-format", "npy"], "a --store keeps its own"),
    ]
    for args, message in cases:
        r = _cli("embed", "--input", str(corpus), *args)
        assert r.exit_code == 1 and message in r.output, (args, r.output)
        assert r.output.count("\n") == 1, r.output  # one line, no traceback


@pytest.mark.parametrize(
    "uri", ["postgresql://me:topsecret@127.0.0.1:1/db?table=t", "qdrant://127.0.0.1:1/c?api_key=topsecret"]
)
def test_an_unreachable_server_is_one_line_within_seconds_without_credentials(uri, corpus):
    start = time.monotonic()
    r = _cli("embed", "--input", str(corpus), "--store", uri)
    assert time.monotonic() - start < 15
    assert r.exit_code == 1 and "127.0.0.1" in r.output and "***" in r.output, r.output
    assert "topsecret" not in r.output and r.output.count("\n") == 1


def test_a_wrong_password_is_refused_without_printing_it(pg):
    with pytest.raises(StoreError) as e:
        connect(pg.uri("t", password="not-the-pw-42"))
    assert "password authentication failed" in str(e.value) and "not-the-pw-42" not in str(e.value)
    job = EmbedJob("in.txt", StoreTable(pg.uri("t")))  # a job's repr (logs, tracebacks) hides the password too
    assert PASSWORD not in repr(job.out) and PASSWORD not in job.out.path and "***" in repr(job.out)


def test_a_table_of_other_vectors_is_refused_naming_the_fields(make_uri, corpus, tiny_models):
    uri = make_uri("lancedb")
    model = str(tiny_models["bert"])
    embed_corpus(EmbedJob(corpus, StoreTable(uri), vectors=SentenceVectors(), model=model), show_progress=False,
                 log=lambda _: None)  # fmt: skip
    other = EmbedJob(corpus, StoreTable(uri), vectors=SentenceVectors(layers=1), model=model)
    with pytest.raises(SpecMismatch, match=r"differs in: layers\)") as e:
        embed_corpus(other, show_progress=False, log=lambda _: None)
    assert "\n" not in str(e.value)
    with pytest.raises(StoreError, match="holds sentence-level 32-wide float32 vectors, not word-level"):
        embed_corpus(EmbedJob(corpus, StoreTable(uri), vectors=WordVectors(), model=model), show_progress=False)
    record = connect(uri).read_record()
    with pytest.raises(StoreError, match="not sentence-level 16-wide"):  # another width
        record.check(record.spec, VectorKind("dense", 16), "sentence", uri)


def test_uris_their_shown_form_and_a_missing_extra(monkeypatch):
    u = parse("postgres://al:pa%3Ass@db.example:5433/vectors?table=docs&sslmode=require")
    assert (u.scheme, u.host, u.port, u.location, u.table, u.user, u.password) == (
        "postgresql", "db.example", 5433, "vectors", "docs", "al", "pa:ss")  # fmt: skip
    assert "pa%3Ass" not in u.shown and u.shown.startswith("postgres://al:***@db.example")
    q = parse("qdrant://h:6333/c?api_key=K3Y")
    assert (q.table, q.port) == ("c", 6333) and "K3Y" not in q.shown and "api_key=***" in q.shown
    assert parse("qdrant:some/dir/coll").location == "some/dir"
    for bad, message in [("lancedb:nofolder", "give the folder and the table"), ("x", "unknown store"),
                         ("postgresql://h/db", "give the database and the table")]:  # fmt: skip
        with pytest.raises(StoreError, match=message):
            parse(bad)
    monkeypatch.setitem(sys.modules, "chromadb", None)  # not installed
    with pytest.raises(StoreError, match=r"needs chromadb: pip install 'ctxrep\[chroma\]'"):
        connect("chroma:dir/coll")


def test_storage_is_the_old_name_of_shard_format(tmp_path, corpus, tiny_models):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = _cli("embed", "--input", str(corpus), "--out", str(tmp_path / "o"), "--storage", "npy",
                 "--model", str(tiny_models["bert"]))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "--storage is deprecated: it is now --shard-format" in r.output
    assert any(issubclass(w.category, DeprecationWarning) and "--shard-format" in str(w.message) for w in caught)
    assert (tmp_path / "o" / "shard-00000.npy").is_file()
