#!/usr/bin/env python
"""Vectors into the stores users search (issue 45): ingest, end to end, search and faults, per store.

Stores: LanceDB (embedded), PostgreSQL 16 + pgvector (a throwaway server on 127.0.0.1, ctxrep.stores.local_postgres),
Qdrant through qdrant-client's local mode (the client's own Python engine: brute-force search, no HNSW, no
quantization; a Qdrant server is what users deploy, and is not measured here), Chroma (embedded).

1. Ingest: --rows MiniLM sentence vectors, precomputed (the STS-B train sentences embedded once by ctxrep, repeated
   with a seeded jitter of 1e-3 to reach --rows distinct rows), written with the same columns (id, source, line,
   field, position, word, text, vector) by ctxrep's writer (ctxrep.stores: Store.write in commits of 20,000 rows,
   what `ctxrep embed --store` runs) and by the store's documented fastest bulk path written here by hand:
   LanceDB one create_table of one Arrow table; PostgreSQL binary COPY with pgvector's dumpers in one transaction;
   Qdrant upload_collection of one numpy array; Chroma add in batches of get_max_batch_size(). Connecting and
   creating the table are not timed; index builds are timed apart (after the load). Best of --repeat runs, the
   two paths alternating. Target: ctxrep >= 0.9x the hand path's rows/s.
2. End to end: `ctxrep embed --store URI` (embed + write, overlapped) against `ctxrep embed --out DIR` on the same
   --texts STS-B sentences (after one warm-up run of each on 8 texts: imports, the model's first call and the
   clients' first connection are not timed). Target: at most 1.15x the folder's time.
3. Search: STS-B train's first sentences as documents (--docs), the second sentence of their pairs as queries
   (--queries), written into each store with its index built after the load (LanceDB ?index=hnsw). Each store's
   exact top-10 against ctxrep's exact SentenceIndex (same ids, as sets; target >= 99% of queries), and its ANN
   recall@10 against that exact top-10 (target >= 0.95).
4. Faults: per store, --faults runs of `ctxrep embed --store` (a subprocess) killed with SIGKILL at a random moment,
   then rerun to the end: rows = texts, duplicate ids = 0, every vector equal (1e-6) to an uninterrupted run's.

Run:  .venv/bin/python benchmarks/stores.py                      # the issue's sizes (100,000 rows, 10 faults)
      .venv/bin/python benchmarks/stores.py --quick              # a smoke test at reduced sizes (not a result)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import DEFAULT_DATA, cpu_model, fmt_table, mark, report

from ctxrep.embed.corpus import EmbedJob, SentenceVectors, ShardFolder, StoreTable, embed_corpus
from ctxrep.featurize.spec import FeaturizerSpec
from ctxrep.stores import connect, parse
from ctxrep.stores.base import Rows, StoreRecord, VectorKind, row_id
from ctxrep.stores.local_postgres import PostgresServer

STORES = ("lancedb", "pgvector", "qdrant", "chroma")
COMMIT = 20_000


def stsb(data: Path) -> tuple[list[str], list[str]]:
    """(first sentences, second sentences) of STS-B train's pairs, in file order (TSV: genre file year id score s1
    s2), each first sentence once (a repeated document would tie with itself at the top-10's edge)."""
    first, second, seen = [], [], set()
    with open(data / "stsb" / "sts-train.csv", encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 7 and fields[5].strip() and fields[6].strip() and fields[5].strip() not in seen:
                seen.add(fields[5].strip())
                first.append(fields[5].strip())
                second.append(fields[6].strip())
    return first, second


class Places:
    """A fresh table's address in each store (PostgreSQL: one server for the whole run)."""

    def __init__(self, work: Path) -> None:
        self.work, self.pg, self.n = work, None, 0

    def uri(self, store: str, option: str = "") -> str:
        self.n += 1
        name = f"t{self.n}"
        if store == "pgvector":
            if self.pg is None:
                self.pg = PostgresServer()
            return self.pg.uri(name) + option.replace("?", "&")
        return f"{store}:{self.work / store}/{name}coll{option}"

    def stop(self) -> None:
        if self.pg is not None:
            self.pg.stop()


def rows_of(vectors: np.ndarray, texts: list[str], start: int = 0) -> Rows:
    n = len(vectors)
    lines = np.arange(start + 1, start + n + 1)
    ids = [row_id("/bench/stsb.txt", int(i), "text", -1) for i in lines]
    return Rows(ids, ["/bench/stsb.txt"] * n, lines, ["text"] * n, np.full(n, -1), [""] * n, texts, vectors)


# ---- 1. ingest ------------------------------------------------------------------------------------------------


def ctxrep_ingest(uri: str, vectors: np.ndarray, texts: list[str], spec) -> tuple[float, float]:
    store = connect(uri)
    record = StoreRecord(spec, store.stored(VectorKind("dense", vectors.shape[1])))
    store.create(record)
    start = time.perf_counter()
    for a in range(0, len(vectors), COMMIT):
        store.write(rows_of(vectors[a : a + COMMIT], texts[a : a + COMMIT], a), record)
    load = time.perf_counter() - start
    start = time.perf_counter()
    store.finish()
    index = time.perf_counter() - start
    assert store.count() == len(vectors)
    store.close()
    return load, index


def hand_ingest(store: str, uri: str, vectors: np.ndarray, texts: list[str]) -> float:
    """The store's documented fastest bulk path, written directly against its client: connecting and creating the
    table are left out of the time, as for ctxrep's writer; no index."""
    u = parse(uri)
    rows = rows_of(vectors, texts)
    n, dim = vectors.shape
    lines = rows.lines.tolist()
    if store == "lancedb":
        import lancedb
        import pyarrow as pa

        db = lancedb.connect(u.location)
        start = time.perf_counter()
        table = pa.table(
            {
                "id": rows.ids,
                "source": rows.sources,
                "line": rows.lines,
                "field": rows.fields,
                "position": rows.positions,
                "word": rows.words,
                "text": rows.texts,
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
            }  # fmt: skip
        )
        db.create_table(u.table, data=table)
        return time.perf_counter() - start
    if store == "pgvector":
        import psycopg
        from pgvector.psycopg import register_vector

        with psycopg.connect(host=u.host, port=u.port, dbname=u.location, user=u.user, password=u.password,
                             autocommit=True) as conn:  # fmt: skip
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(conn)
            conn.execute(
                f"CREATE TABLE {u.table} (id text PRIMARY KEY, source text, line bigint, field text, position bigint, "
                f"word text, text text, embedding vector({dim}))"
            )
            start = time.perf_counter()
            with conn.transaction(), conn.cursor() as cur:
                with cur.copy(f"COPY {u.table} FROM STDIN WITH (FORMAT BINARY)") as copy:
                    copy.set_types(["text", "text", "int8", "text", "int8", "text", "text", "vector"])
                    for i in range(n):
                        copy.write_row((rows.ids[i], rows.sources[i], lines[i], "text", -1, "", texts[i], vectors[i]))
            return time.perf_counter() - start
    if store == "qdrant":
        from qdrant_client import QdrantClient, models

        client = QdrantClient(path=u.location)
        client.create_collection(u.table, vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE))
        start = time.perf_counter()
        payload = [{"id": rows.ids[i], "source": rows.sources[i], "line": lines[i], "field": "text",
                    "position": -1, "word": "", "text": texts[i]} for i in range(n)]  # fmt: skip
        client.upload_collection(u.table, vectors=vectors, payload=payload, wait=True)  # ids: the client's UUIDs
        elapsed = time.perf_counter() - start
        client.close()
        return elapsed
    import chromadb

    client = chromadb.PersistentClient(path=u.location, settings=chromadb.Settings(anonymized_telemetry=False))
    collection = client.create_collection(u.table, configuration={"hnsw": {"space": "cosine"}})
    start = time.perf_counter()
    step = client.get_max_batch_size()
    metadatas = [{"source": rows.sources[i], "line": lines[i], "field": "text", "position": -1, "word": ""}
                 for i in range(n)]  # fmt: skip
    for a in range(0, n, step):
        collection.add(ids=rows.ids[a : a + step], embeddings=vectors[a : a + step],
                       metadatas=metadatas[a : a + step], documents=texts[a : a + step])  # fmt: skip
    return time.perf_counter() - start


# ---- 2. end to end ---------------------------------------------------------------------------------------------


def end_to_end(places: Places, store: str, corpus: Path, work: Path) -> tuple[float, float]:
    folder = work / "e2e-folder"
    shutil.rmtree(folder, ignore_errors=True)
    quiet = {"show_progress": False, "log": lambda _: None}
    start = time.perf_counter()
    embed_corpus(EmbedJob(corpus, ShardFolder(folder, 500), vectors=SentenceVectors()), **quiet)
    t_folder = time.perf_counter() - start
    start = time.perf_counter()
    embed_corpus(EmbedJob(corpus, StoreTable(places.uri(store), 500), vectors=SentenceVectors()), **quiet)
    return t_folder, time.perf_counter() - start


# ---- 3. search -------------------------------------------------------------------------------------------------


def search_quality(uri: str, docs: np.ndarray, doc_texts: list[str], queries: np.ndarray, spec, exact):
    store = connect(uri)
    record = StoreRecord(spec, store.stored(VectorKind("dense", docs.shape[1])))
    store.create(record)
    for a in range(0, len(docs), COMMIT):
        store.write(rows_of(docs[a : a + COMMIT], doc_texts[a : a + COMMIT], a), record)
    store.finish()
    ids = rows_of(docs, doc_texts).ids
    wanted = [{ids[r] for r in h.rows} for h in exact]
    found = store.search(queries, 10, exact=True)
    # equal: the same ids, or the same scores where ids differ (rows of equal score swap places at the edge)
    equal = np.mean([set(f.ids) == w or np.allclose(np.sort(f.scores), np.sort(h.scores), atol=1e-5)
                     for f, w, h in zip(found, wanted, exact)])  # fmt: skip
    start = time.perf_counter()
    ann = store.search(queries, 10, exact=False)
    per_query = (time.perf_counter() - start) / len(queries)
    recall = np.mean([len(set(f.ids) & w) / 10 for f, w in zip(ann, wanted)])
    store.close()
    return float(equal), float(recall), per_query


# ---- 4. faults -------------------------------------------------------------------------------------------------


def faults(places: Places, store: str, corpus: Path, texts: int, trials: int, seed: int) -> tuple[int, int, bool]:
    """(runs killed mid-job, runs checked, every check held): SIGKILL at a random moment, then a rerun."""
    from ctxrep.stores import open_store

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")])}

    def command(uri: str) -> list[str]:
        return [sys.executable, "-c", "from ctxrep.cli import main; main()", "embed", "--input", str(corpus),
                "--store", uri, "--level", "sentence", "--shard-size", "50"]  # fmt: skip

    def rows_back(uri: str):
        with open_store(uri) as s:
            parts = list(s.store.scan())
        ids = [i for p in parts for i in p.ids]
        lines = np.concatenate([p.lines for p in parts])
        vectors = np.concatenate([p.vectors for p in parts])[np.argsort(lines)]
        return ids, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    reference = places.uri(store)
    start = time.perf_counter()
    subprocess.run(command(reference), env=env, check=True, capture_output=True)
    full = time.perf_counter() - start
    _, expected = rows_back(reference)
    rng = random.Random(seed)
    killed, ok = 0, True
    for _ in range(trials):
        uri = places.uri(store)
        proc = subprocess.Popen(command(uri), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.1, 0.9) * full)
        proc.send_signal(signal.SIGKILL)
        killed += proc.wait() == -signal.SIGKILL
        subprocess.run(command(uri), env=env, check=True, capture_output=True)
        ids, vectors = rows_back(uri)
        ok &= len(ids) == texts and len(set(ids)) == texts and np.allclose(vectors, expected, atol=1e-6)
    return killed, trials, ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="precomputed vectors to ingest")
    p.add_argument("--texts", type=int, default=5_000, help="texts for the end-to-end runs")
    p.add_argument("--docs", type=int, default=None, help="STS-B train documents (default: all distinct ones)")
    p.add_argument("--queries", type=int, default=1_000)
    p.add_argument("--faults", type=int, default=10, help="kills per store")
    p.add_argument("--fault-texts", type=int, default=400)
    p.add_argument("--stores", default=",".join(STORES))
    p.add_argument("--repeat", type=int, default=3, help="ingest runs per path (the best one counts)")
    p.add_argument("--quick", action="store_true", help="reduced sizes: a smoke test, not a result")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--markdown-out", type=Path, default=None)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` still stops the PostgreSQL server it started
    if args.quick:
        args.rows, args.texts, args.docs, args.queries, args.faults, args.fault_texts = 10_000, 300, 1_500, 200, 2, 150
    stores = args.stores.split(",")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)

    from ctxrep.featurize import Featurizer
    from ctxrep.vectors.index import SentenceIndex

    first, second = stsb(args.data)
    docs_n = len(first) if args.docs is None else min(args.docs, len(first))
    fz = Featurizer("minilm", sentence_pooling="auto")
    spec = FeaturizerSpec.of(fz)
    doc_vectors = fz.embed_sentences(first[:docs_n])
    query_vectors = fz.embed_sentences(second[: min(args.queries, docs_n)])
    rng = np.random.default_rng(0)
    reps = -(-args.rows // docs_n)
    base = np.tile(doc_vectors, (reps, 1))[: args.rows]
    ingest_vectors = (base + rng.normal(0, 1e-3, base.shape)).astype(np.float32)
    ingest_texts = [first[i % docs_n] for i in range(args.rows)]

    work = Path(tempfile.mkdtemp(prefix="ctxrep-stores-"))
    places = Places(work)
    failed: list[str] = []
    out = []
    try:
        table = []
        for store in stores:  # best of --repeat, the two paths alternating (a shared machine's load varies)
            t_hand, t_ctxrep, t_index = np.inf, np.inf, np.inf
            for _ in range(args.repeat):
                t_hand = min(t_hand, hand_ingest(store, places.uri(store), ingest_vectors, ingest_texts))
                load, index = ctxrep_ingest(places.uri(store), ingest_vectors, ingest_texts, spec)
                t_ctxrep, t_index = min(t_ctxrep, load), min(t_index, index)
            ratio = t_hand / t_ctxrep
            ok = ratio >= 0.9
            failed += [] if ok else [f"ingest {store}: {ratio:.2f}x the hand-written path"]
            table.append([store, f"{args.rows / t_hand:,.0f}", f"{args.rows / t_ctxrep:,.0f}", f"{ratio:.2f}x",
                          f"{t_index:.1f}", mark(ok)])  # fmt: skip
            print(table[-1], flush=True)
        out.append(f"Ingest of {args.rows:,} precomputed MiniLM vectors (rows/s; index built after, seconds):")
        out.append(fmt_table(["store", "hand", "ctxrep", "ctxrep/hand", "index s", ">= 0.9x"], table, False))

        corpus, warm = work / "corpus.txt", work / "warm.txt"
        corpus.write_text("\n".join(first[i % docs_n] for i in range(args.texts)) + "\n")
        warm.write_text("\n".join(first[:8]) + "\n")
        for store in stores:  # imports, the model's first call, each client's first connection: not timed
            end_to_end(places, store, warm, work)
        table = []
        for store in stores:
            t_folder, t_store = end_to_end(places, store, corpus, work)
            ok = t_store <= 1.15 * t_folder
            failed += [] if ok else [f"end to end {store}: {t_store / t_folder:.2f}x the folder's time"]
            table.append([store, f"{t_folder:.1f}", f"{t_store:.1f}", f"{t_store / t_folder:.2f}x", mark(ok)])
            print(table[-1], flush=True)
        out.append(f"\nEnd to end, {args.texts:,} STS-B sentences (seconds):")
        out.append(fmt_table(["store", "embed --out", "embed --store", "ratio", "<= 1.15x"], table, False))

        reference = SentenceIndex.from_vectors(doc_vectors)
        exact = reference.search(query_vectors, k=10, exact=True)
        table = []
        for store in stores:
            option = "?index=hnsw" if store == "lancedb" else ""
            equal, recall, per_query = search_quality(places.uri(store, option), doc_vectors, first[:docs_n],
                                                      query_vectors, spec, exact)  # fmt: skip
            ok = equal >= 0.99 and recall >= 0.95
            failed += [] if ok else [f"search {store}: exact equal {equal:.3f}, recall@10 {recall:.3f}"]
            table.append([store, f"{equal:.3f}", f"{recall:.3f}", f"{per_query * 1000:.1f}", mark(ok)])
            print(table[-1], flush=True)
        out.append(f"\nSearch: {docs_n:,} STS-B documents, {len(query_vectors):,} queries:")
        out.append(
            fmt_table(["store", "exact top-10 = ctxrep", "ANN recall@10", "ANN ms/query", "check"], table, False)
        )

        fault_corpus = work / "faults.txt"
        fault_corpus.write_text("\n".join(first[: args.fault_texts]) + "\n")
        table = []
        for n, store in enumerate(stores):
            killed, trials, ok = faults(places, store, fault_corpus, args.fault_texts, args.faults, seed=n)
            failed += [] if ok else [f"faults {store}: rows, duplicates or vectors differ after a kill"]
            table.append([store, str(trials), str(killed), mark(ok)])
            print(table[-1], flush=True)
        out.append(f"\nFaults: kill -9 at random moments of `ctxrep embed --store` ({args.fault_texts} texts), rerun:")
        out.append(fmt_table(["store", "runs", "killed mid-job", "rows = texts, 0 duplicates, same vectors"], table,
                             False))  # fmt: skip
    finally:
        places.stop()
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(report("\n".join(out), args.markdown_out, failed))


if __name__ == "__main__":
    main()
