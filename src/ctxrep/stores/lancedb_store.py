"""LanceDB, embedded (`lancedb:DIR/TABLE`, `pip install 'ctxrep[lancedb]'`): no server, the database is the folder.

Bulk path (LanceDB's documented one): each write is one `Table.add` of an Arrow table (a commit, never a row at a
time: every add is a new version and its own fragments), and `finish` compacts them (`Table.optimize`) and builds
the ANN index after the load (IVF_HNSW_SQ on float vectors, from INDEX_FROM rows; `?index=hnsw` at any size,
`?index=none` never).
Dense float32 and float16 (`?vector=half`) vectors are fixed-size lists searched by cosine distance; bit vectors
(`--output-precision binary / ubinary`) fixed-size lists of packed uint8, searched by Hamming distance;
multi-vector rows (late interaction) LanceDB's multivector lists, scored by MaxSim (a flat scan). Exact search:
`bypass_vector_index()` (a flat scan). The record: the `vector` field's metadata (`ctxrep`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ctxrep.stores.base import Found, Rows, Store, StoreRecord, VectorKind, ef_search
from ctxrep.stores.uri import StoreError

INDEX_FROM = 10_000  # rows from which `finish` builds the ANN index (below, a flat scan is as fast)
RECORD_KEY = "ctxrep"


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class LanceDBStore(Store):
    scheme = "lancedb"
    extra = "lancedb"
    client = "lancedb"
    options = ("index", "vector")
    holds = ("float32", "float16", "bit", "multi")

    def __init__(self, uri) -> None:
        super().__init__(uri)
        os.environ.setdefault("LANCE_LOG", "error")  # lance's notes ("no existing dataset, it will be created")
        lancedb = self.import_client()
        self.index = uri.option("index", "auto", ("auto", "hnsw", "none"))
        folder = Path(uri.location).expanduser()
        if folder.exists() and not folder.is_dir():
            raise StoreError(f"{self.where}: {folder} is a file; a LanceDB database is a folder")
        try:
            self.db = lancedb.connect(str(folder))
        except Exception as e:  # lancedb raises its own errors
            raise self.fail("cannot open the database", e) from None
        self.table = None

    def _open(self):
        if self.table is None:
            try:
                self.table = self.db.open_table(self.uri.table)
            except (ValueError, FileNotFoundError):
                return None
        return self.table

    def read_record(self) -> StoreRecord | None:
        table = self._open()
        if table is None:
            return None
        metadata = table.schema.field("vector").metadata or {} if "vector" in table.schema.names else {}
        raw = metadata.get(RECORD_KEY.encode())
        if raw is None:
            raise StoreError(
                f"{self.where}: a LanceDB table ctxrep did not write (no {RECORD_KEY} record); use another"
            )
        return StoreRecord.from_json(raw, self.where)

    def _schema(self, kind: VectorKind, record: StoreRecord):
        import pyarrow as pa

        value, width = pa.float32(), kind.dim
        if kind.precision == "float16":
            value = pa.float16()
        elif kind.precision == "bit":
            value, width = pa.uint8(), (kind.dim + 7) // 8
        vector_type = pa.list_(value, width)
        if kind.form == "multi":  # LanceDB's multivector: a list of token vectors a row
            vector_type = pa.list_(vector_type)
        vector = pa.field("vector", vector_type, metadata={RECORD_KEY: record.to_json()})
        return pa.schema(
            [
                pa.field("id", pa.string()),
                pa.field("source", pa.string()),
                pa.field("line", pa.int64()),
                pa.field("field", pa.string()),
                pa.field("position", pa.int64()),
                pa.field("word", pa.string()),
                pa.field("text", pa.string()),
                vector,
            ]  # fmt: skip
        )

    def create(self, record: StoreRecord) -> None:
        try:
            self.table = self.db.create_table(self.uri.table, schema=self._schema(record.kind, record))
        except Exception as e:
            raise self.fail("cannot create the table", e) from None

    def write_record(self, record: StoreRecord) -> None:
        self._open().update_field_metadata({"path": "vector", "metadata": {RECORD_KEY: record.to_json()}})

    def write(self, rows: Rows, record: StoreRecord | None = None) -> None:
        import pyarrow as pa

        table = self._open()
        schema = table.schema
        vector_type = schema.field("vector").type
        columns = rows.columns()
        arrays = [pa.array(columns[name], type=schema.field(name).type) for name in schema.names[:-1]]
        if pa.types.is_fixed_size_list(vector_type):
            vectors = np.ascontiguousarray(rows.vectors, dtype=vector_type.value_type.to_pandas_dtype())
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vector_type.list_size))
        else:  # multi: each row's (tokens, dim) matrix
            tokens = vector_type.value_type
            flat = np.concatenate([np.asarray(m, np.float32) for m in rows.vectors]).reshape(-1)
            offsets = np.concatenate([[0], np.cumsum([len(m) for m in rows.vectors])]).astype(np.int32)
            inner = pa.FixedSizeListArray.from_arrays(pa.array(flat), tokens.list_size)
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets), inner))
        try:
            table.add(pa.Table.from_arrays(arrays, schema=schema.remove_metadata()))
            if record is not None:
                self.write_record(record)
        except Exception as e:
            raise self.fail("cannot write", e) from None

    def discard(self, source: str, field_name: str, from_line: int) -> None:
        table = self._open()
        table.delete(f"source = {_quote(source)} AND field = {_quote(field_name)} AND line >= {int(from_line)}")

    def delete_ids(self, ids: list[str]) -> None:
        for start in range(0, len(ids), 1000):
            self._open().delete(f"id IN ({', '.join(_quote(i) for i in ids[start : start + 1000])})")

    def finish(self) -> None:
        table = self._open()
        if table is None:
            return
        table.optimize()  # compacts the fragments of every add, prunes old versions
        kind = self.read_record().kind
        big = self.index == "hnsw" or (self.index == "auto" and table.count_rows() >= INDEX_FROM)
        if big and kind.form == "dense" and kind.precision != "bit":  # multi-vector rows: a flat MaxSim scan
            table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ", replace=True)

    def count(self) -> int:
        table = self._open()
        return 0 if table is None else table.count_rows()

    def search(self, queries, k: int, exact: bool) -> list[Found]:
        table = self._open()
        kind = self.read_record().kind
        found = []
        for q in queries if kind.form == "multi" else np.asarray(queries):
            query = table.search(np.asarray(q), vector_column_name="vector").distance_type(kind.metric).limit(k)
            query = query.select(["id", "text", "line", "_distance"])
            query = query.bypass_vector_index() if exact else query.nprobes(20).ef(ef_search(k))
            result = query.to_arrow()
            distance = result.column("_distance").to_numpy().astype(np.float32)
            if kind.form == "multi":  # the distance is the sum over query tokens of 1 - the best cosine: MaxSim back
                scores = len(q) - distance
            else:
                scores = 1.0 - (distance / kind.dim if kind.metric == "hamming" else distance)
            order = np.lexsort((np.arange(len(scores)), -scores))  # best first, as returned
            ids, texts = result.column("id").to_pylist(), result.column("text").to_pylist()
            lines = result.column("line").to_numpy()
            found.append(Found([ids[i] for i in order], [texts[i] for i in order], scores[order], lines[order]))
        return found

    def scan(self, batch_size: int = 10_000) -> Iterator[Rows]:
        import pyarrow as pa

        table = self._open().to_arrow()
        for batch in table.to_batches(max_chunksize=batch_size):
            vectors = batch.column("vector")
            if pa.types.is_fixed_size_list(vectors.type):
                width = vectors.type.list_size
                array = vectors.flatten().to_numpy(zero_copy_only=False).reshape(len(batch), width)
            else:  # multi: a (tokens, dim) array a row
                width = vectors.type.value_type.list_size
                flat = vectors.flatten().flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
                offsets = vectors.offsets.to_numpy()
                offsets = offsets - offsets[0]  # a slice of the table keeps its parent's offsets
                array = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
            yield Rows(
                batch.column("id").to_pylist(), batch.column("source").to_pylist(), batch.column("line").to_numpy(),
                batch.column("field").to_pylist(), batch.column("position").to_numpy(),
                batch.column("word").to_pylist(), batch.column("text").to_pylist(), array,
            )  # fmt: skip
