"""Qdrant (`qdrant://HOST:PORT/COLLECTION` a server; `qdrant:DIR/COLLECTION` qdrant-client's local mode;
`pip install 'ctxrep[qdrant]'`).

The local mode is qdrant-client's own engine, in Python: it keeps the points in DIR and answers every search by
scoring all of them (no HNSW, no quantization, one process at a time); it is what the tests run. A Qdrant server
is the engine users deploy, with the same calls.

Bulk path (qdrant-client's documented one): `upload_collection` with numpy arrays (never lists of Python floats),
in batches, `UPLOAD_PARALLEL` streams, with indexing deferred during the load (`indexing_threshold` 0 at creation,
restored by `finish`). Points: a UUID derived from the row id (uploads of the same row overwrite it), the row's
columns as payload, the vector named "dense" (float32, or float16 with `?vector=half`; multi-vector rows of late
interaction with Qdrant's MaxSim comparator; `?quantization=scalar` or
`binary` adds Qdrant's own int8 / binary quantization, rescored) or "sparse" (`--output sparse`). Exact search:
`SearchParams(exact=True)`. The record: the collection's metadata (`ctxrep`).

Hybrid: every dense collection keeps a "sparse" slot; `ctxrep embed --output sparse` into it (the same input)
puts each row's sparse vector beside its dense one (`update_vectors`), and `search_hybrid` fuses the two rankings
in the engine (two prefetches, Reciprocal Rank Fusion).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ctxrep.stores.base import Found, Rows, Store, StoreRecord, ef_search, uuid_of
from ctxrep.stores.uri import StoreError
from ctxrep.util.network import why_unreachable

UPLOAD_BATCH = 256
UPLOAD_PARALLEL = 2  # server uploads: parallel streams (the local mode takes one)
INDEXING_THRESHOLD = 20_000  # Qdrant's default, restored after the load
TIMEOUT_S = 5
PAYLOAD = ("id", "source", "line", "field", "position", "word", "text")


class QdrantStore(Store):
    scheme = "qdrant"
    extra = "qdrant"
    client = "qdrant_client"
    options = ("api_key", "https", "vector", "quantization")
    holds = ("float32", "float16", "sparse", "multi")
    hybrid = True

    def __init__(self, uri) -> None:
        super().__init__(uri)
        qdrant_client = self.import_client()
        from qdrant_client import models

        self.models = models
        self.quantization = uri.option("quantization", "none", ("none", "scalar", "binary"))
        self.local = uri.host is None
        try:
            if self.local:
                folder = Path(uri.location).expanduser()
                if folder.exists() and not folder.is_dir():
                    raise StoreError(f"{self.where}: {folder} is a file; qdrant's local mode keeps a folder")
                self.client = qdrant_client.QdrantClient(path=str(folder))
            else:
                port = uri.port or 6333
                _reachable(uri, port)
                https = uri.option("https", "false", ("true", "false")) == "true"
                self.client = qdrant_client.QdrantClient(
                    host=uri.host, port=port, api_key=uri.options.get("api_key"), https=https, timeout=TIMEOUT_S
                )
                self.client.get_collections()  # fails now, in one line, rather than at the first write
        except StoreError:
            raise
        except Exception as e:  # qdrant-client raises its own errors (and RuntimeError for a locked folder)
            raise self.fail("cannot open", e) from None
        self.name = uri.table

    def read_record(self) -> StoreRecord | None:
        if not self.client.collection_exists(self.name):
            return None
        metadata = self.client.get_collection(self.name).config.metadata or {}
        if "ctxrep" not in metadata:
            raise StoreError(f"{self.where}: a collection ctxrep did not write (no ctxrep metadata); use another")
        return StoreRecord.from_json(metadata["ctxrep"], self.where)

    def create(self, record: StoreRecord) -> None:
        m, kind = self.models, record.kind
        dense, sparse = None, None
        sparse = {"sparse": m.SparseVectorParams()}  # a dense table keeps the slot: sparse vectors may join (hybrid)
        if kind.form != "sparse":
            datatype = m.Datatype.FLOAT16 if kind.precision == "float16" else m.Datatype.FLOAT32
            multi = None
            if kind.form == "multi":  # late interaction: a matrix a point, scored by MaxSim in the engine
                multi = m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM)
            dense = {"dense": m.VectorParams(size=kind.dim, distance=m.Distance.COSINE, datatype=datatype,
                                             multivector_config=multi)}  # fmt: skip
        quantization = None
        if self.quantization == "scalar":
            quantization = m.ScalarQuantization(
                scalar=m.ScalarQuantizationConfig(type=m.ScalarType.INT8, always_ram=True)
            )
        elif self.quantization == "binary":
            quantization = m.BinaryQuantization(binary=m.BinaryQuantizationConfig(always_ram=True))
        try:
            self.client.create_collection(
                self.name,
                vectors_config=dense or {},
                sparse_vectors_config=sparse,
                optimizers_config=m.OptimizersConfigDiff(indexing_threshold=0),  # no index while loading
                quantization_config=quantization,
                metadata={"ctxrep": record.to_json()},
            )
            if not self.local:  # what discard filters by (the local mode scans; it keeps no payload index)
                for key in ("source", "field"):
                    self.client.create_payload_index(self.name, key, m.PayloadSchemaType.KEYWORD)
                self.client.create_payload_index(self.name, "line", m.PayloadSchemaType.INTEGER)
        except Exception as e:
            raise self.fail("cannot create the collection", e) from None

    def write_record(self, record: StoreRecord) -> None:
        self.client.update_collection(self.name, metadata={"ctxrep": record.to_json()})

    def write(self, rows: Rows, record: StoreRecord | None = None) -> None:
        kind = (record or self.read_record()).kind
        columns = rows.columns()
        lines, positions = rows.lines.tolist(), rows.positions.tolist()
        payload = [
            {
                "id": rows.ids[i],
                "source": rows.sources[i],
                "line": lines[i],
                "field": rows.fields[i],
                "position": positions[i],
                "word": rows.words[i],
                "text": columns["text"][i],
            }  # fmt: skip
            for i in range(len(rows))
        ]
        if kind.form == "sparse":
            csr = rows.vectors.tocsr()
            vectors = [
                {"sparse": self.models.SparseVector(indices=csr.indices[a:b].tolist(), values=csr.data[a:b].tolist())}
                for a, b in zip(csr.indptr[:-1], csr.indptr[1:])
            ]
        elif kind.form == "multi":
            vectors = [{"dense": np.asarray(v, np.float32).tolist()} for v in rows.vectors]
        else:
            vectors = {"dense": np.ascontiguousarray(rows.vectors, dtype=np.float32)}
        try:
            self.client.upload_collection(
                self.name,
                vectors=vectors,
                payload=payload,
                ids=[uuid_of(i) for i in rows.ids],
                batch_size=UPLOAD_BATCH,
                parallel=1 if self.local else UPLOAD_PARALLEL,
                wait=True,
            )
            if record is not None:
                self.write_record(record)
        except Exception as e:
            raise self.fail("cannot write", e) from None

    def write_sparse(self, rows: Rows, record: StoreRecord) -> None:
        m = self.models
        csr = rows.vectors.tocsr()
        points = [
            m.PointVectors(
                id=uuid_of(rows.ids[i]),
                vector={"sparse": m.SparseVector(indices=csr.indices[a:b].tolist(), values=csr.data[a:b].tolist())},
            )
            for i, (a, b) in enumerate(zip(csr.indptr[:-1], csr.indptr[1:]))
        ]
        try:
            for a in range(0, len(points), UPLOAD_BATCH):
                self.client.update_vectors(self.name, points=points[a : a + UPLOAD_BATCH], wait=True)
            self.write_record(record)
        except Exception as e:  # a point that is not there: KeyError in the local mode, an HTTP 404 from a server
            raise self.fail(
                "cannot add sparse vectors beside the dense ones (embed the dense vectors of this input first)", e
            ) from None

    def search_hybrid(self, dense, sparse, k: int) -> list[Found]:
        m = self.models
        found = []
        for i in range(len(dense)):
            row = sparse[i].tocsr()
            prefetch = [
                m.Prefetch(query=np.asarray(dense[i], np.float32), using="dense", limit=max(50, 4 * k)),
                m.Prefetch(
                    query=m.SparseVector(indices=row.indices.tolist(), values=row.data.tolist()),
                    using="sparse",
                    limit=max(50, 4 * k),
                ),  # fmt: skip
            ]
            points = self.client.query_points(
                self.name, prefetch=prefetch, query=m.FusionQuery(fusion=m.Fusion.RRF), limit=k,
                with_payload=list(PAYLOAD),
            ).points  # fmt: skip
            found.append(_found(points))
        return found

    def discard(self, source: str, field_name: str, from_line: int) -> None:
        m = self.models
        where = m.Filter(
            must=[
                m.FieldCondition(key="source", match=m.MatchValue(value=source)),
                m.FieldCondition(key="field", match=m.MatchValue(value=field_name)),
                m.FieldCondition(key="line", range=m.Range(gte=int(from_line))),
            ]
        )
        self.client.delete(self.name, points_selector=m.FilterSelector(filter=where), wait=True)

    def delete_ids(self, ids: list[str]) -> None:
        self.client.delete(self.name, points_selector=self.models.PointIdsList(points=[uuid_of(i) for i in ids]))

    def finish(self) -> None:
        if self.client.collection_exists(self.name) and not self.local:
            self.client.update_collection(
                self.name, optimizers_config=self.models.OptimizersConfigDiff(indexing_threshold=INDEXING_THRESHOLD)
            )

    def count(self) -> int:
        return self.client.count(self.name, exact=True).count

    def search(self, queries, k: int, exact: bool) -> list[Found]:
        m = self.models
        kind = self.read_record().kind
        params = None  # the local mode scores every point whatever it is asked
        if not self.local:
            params = m.SearchParams(
                exact=exact,
                hnsw_ef=None if exact else ef_search(k),
                quantization=m.QuantizationSearchParams(rescore=True) if self.quantization != "none" else None,
            )
        found = []
        for i in range(len(queries) if kind.form == "multi" else queries.shape[0]):
            if kind.form == "sparse":
                row = queries[i].tocsr()
                query = m.SparseVector(indices=row.indices.tolist(), values=row.data.tolist())
                using = "sparse"
            elif kind.form == "multi":
                query, using = np.asarray(queries[i], np.float32).tolist(), "dense"
            else:
                query, using = np.asarray(queries[i], np.float32), "dense"
            points = self.client.query_points(
                self.name, query=query, using=using, limit=k, search_params=params, with_payload=list(PAYLOAD)
            ).points
            found.append(_found(points))
        return found

    def scan(self, batch_size: int = 10_000) -> Iterator[Rows]:
        kind = self.read_record().kind
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.name, limit=batch_size, offset=offset, with_payload=True, with_vectors=True
            )
            if points:
                payload = [p.payload for p in points]
                if kind.form == "sparse":
                    import scipy.sparse

                    vs = [p.vector["sparse"] for p in points]
                    data = [np.asarray(v.values, np.float32) for v in vs]
                    indices = [np.asarray(v.indices, np.int64) for v in vs]
                    indptr = np.concatenate([[0], np.cumsum([len(d) for d in data])])
                    array = scipy.sparse.csr_matrix(
                        (np.concatenate(data), np.concatenate(indices), indptr), shape=(len(vs), kind.dim)
                    )
                elif kind.form == "multi":
                    array = [np.array(p.vector["dense"], np.float32) for p in points]
                else:
                    array = np.array([p.vector["dense"] for p in points], np.float32)
                yield Rows([p["id"] for p in payload], [p["source"] for p in payload],
                           np.array([p["line"] for p in payload]), [p["field"] for p in payload],
                           np.array([p["position"] for p in payload]), [p["word"] for p in payload],
                           [p.get("text") for p in payload], array)  # fmt: skip
            if offset is None:
                return

    def close(self) -> None:
        self.client.close()


def _found(points) -> Found:
    return Found(
        [p.payload["id"] for p in points],
        [p.payload.get("text") for p in points],
        np.array([p.score for p in points], np.float32),
        np.array([p.payload["line"] for p in points]),
    )


def _reachable(uri, port: int) -> None:
    """A one-line StoreError within TIMEOUT_S seconds when no TCP connection opens to the server."""
    why = why_unreachable(uri.host, port, TIMEOUT_S)
    if why:
        raise StoreError(f"{uri.shown}: cannot reach the server: {why}; start it or check the address")
