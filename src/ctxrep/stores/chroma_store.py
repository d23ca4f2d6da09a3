"""Chroma (`chroma:DIR/COLLECTION` embedded; `chroma://HOST:PORT/COLLECTION` a server; `pip install
'ctxrep[chroma]'`).

Bulk path: `add` in batches of at most `client.get_max_batch_size()` rows (the limit of Chroma's SQLite
statements), embeddings as numpy arrays (a rerun first deletes what a killed write left, so no id is added twice). Chroma holds float32 vectors
only, in an HNSW index of cosine space that it builds as rows arrive; it has no exact search of its own, so the
exact mode scores every stored vector here. The record: the collection's metadata (`ctxrep`, a JSON string).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ctxrep.stores.base import EF_SEARCH, Found, Rows, Store, StoreRecord, dense_scores, top_k
from ctxrep.stores.uri import StoreError


class ChromaStore(Store):
    scheme = "chroma"
    extra = "chroma"
    client = "chromadb"
    options = ()
    holds = ("float32",)

    def __init__(self, uri) -> None:
        super().__init__(uri)
        chromadb = self.import_client()
        settings = chromadb.Settings(anonymized_telemetry=False)
        try:
            if uri.host is None:
                folder = Path(uri.location).expanduser()
                if folder.exists() and not folder.is_dir():
                    raise StoreError(f"{self.where}: {folder} is a file; Chroma keeps a folder")
                self.client = chromadb.PersistentClient(path=str(folder), settings=settings)
            else:
                self.client = chromadb.HttpClient(host=uri.host, port=uri.port or 8000, settings=settings)
        except StoreError:
            raise
        except Exception as e:  # chromadb raises its own errors
            raise self.fail("cannot open", e) from None
        self.collection = None

    def _open(self):
        if self.collection is None:
            try:
                self.collection = self.client.get_collection(self.uri.table)
            except Exception:  # chromadb's NotFoundError, or a name it refuses
                return None
        return self.collection

    def read_record(self) -> StoreRecord | None:
        collection = self._open()
        if collection is None:
            return None
        raw = (collection.metadata or {}).get("ctxrep")
        if raw is None:
            raise StoreError(f"{self.where}: a collection ctxrep did not write (no ctxrep metadata); use another")
        return StoreRecord.from_json(raw, self.where)

    def create(self, record: StoreRecord) -> None:
        try:
            self.collection = self.client.create_collection(
                self.uri.table,
                metadata={"ctxrep": record.to_json()},
                configuration={"hnsw": {"space": "cosine", "ef_search": EF_SEARCH}},
            )
        except Exception as e:
            raise self.fail("cannot create the collection", e) from None

    def write_record(self, record: StoreRecord) -> None:
        self._open().modify(metadata={"ctxrep": record.to_json()})

    def write(self, rows: Rows, record: StoreRecord | None = None) -> None:
        collection = self._open()
        vectors = np.ascontiguousarray(rows.vectors, dtype=np.float32)
        lines, positions = rows.lines.tolist(), rows.positions.tolist()
        metadatas = [
            {
                "source": rows.sources[i],
                "line": lines[i],
                "field": rows.fields[i],
                "position": positions[i],
                "word": rows.words[i],
            }  # fmt: skip
            for i in range(len(rows))
        ]
        with_text = any(t is not None for t in rows.texts)
        step = self.client.get_max_batch_size()
        try:
            for a in range(0, len(rows), step):
                collection.add(
                    ids=rows.ids[a : a + step],
                    embeddings=vectors[a : a + step],
                    metadatas=metadatas[a : a + step],
                    documents=[t or "" for t in rows.texts[a : a + step]] if with_text else None,
                )
            if record is not None:
                self.write_record(record)
        except Exception as e:
            raise self.fail("cannot write", e) from None

    def discard(self, source: str, field_name: str, from_line: int) -> None:
        where = {"$and": [{"source": source}, {"field": field_name}, {"line": {"$gte": int(from_line)}}]}
        self._open().delete(where=where)

    def delete_ids(self, ids: list[str]) -> None:
        self._open().delete(ids=list(ids))

    def count(self) -> int:
        collection = self._open()
        return 0 if collection is None else collection.count()

    def search(self, queries, k: int, exact: bool) -> list[Found]:
        collection = self._open()
        queries = np.asarray(queries, np.float32)
        if exact:  # no exact search in Chroma: every stored vector scored here
            rows = list(self.scan())
            if not rows:
                return [Found([], [], np.zeros(0, np.float32), np.zeros(0, np.int64)) for _ in queries]
            vectors = np.concatenate([r.vectors for r in rows])
            ids = [i for r in rows for i in r.ids]
            texts = [t for r in rows for t in r.texts]
            lines = np.concatenate([r.lines for r in rows])
            found = []
            for scores in dense_scores(vectors, queries):
                best = top_k(scores, k)
                found.append(Found([ids[i] for i in best], [texts[i] for i in best], scores[best], lines[best]))
            return found
        result = collection.query(
            query_embeddings=queries,
            n_results=min(k, collection.count()),
            include=["documents", "metadatas", "distances"],
        )
        found = []
        for n in range(len(queries)):
            documents = result["documents"][n] if result.get("documents") else [None] * len(result["ids"][n])
            found.append(
                Found(
                    list(result["ids"][n]),
                    [d or None for d in documents],
                    1.0 - np.asarray(result["distances"][n], np.float32),
                    np.array([m["line"] for m in result["metadatas"][n]]),
                )
            )
        return found

    def scan(self, batch_size: int = 5_000) -> Iterator[Rows]:
        collection = self._open()
        total = collection.count()
        for offset in range(0, total, batch_size):
            got = collection.get(limit=batch_size, offset=offset, include=["embeddings", "documents", "metadatas"])
            meta = got["metadatas"]
            documents = got["documents"] or [None] * len(got["ids"])
            yield Rows(list(got["ids"]), [m["source"] for m in meta], np.array([m["line"] for m in meta]),
                       [m["field"] for m in meta], np.array([m["position"] for m in meta]),
                       [m["word"] for m in meta], [d or None for d in documents],
                       np.asarray(got["embeddings"], np.float32))  # fmt: skip
