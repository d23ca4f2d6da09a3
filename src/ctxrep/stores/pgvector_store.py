"""PostgreSQL with pgvector (`postgresql://USER:PW@HOST:PORT/DB?table=T`, `pip install 'ctxrep[pgvector]'`): psycopg 3
with pgvector's Python package.

Bulk path (pgvector's documented one): rows go in by binary COPY (`COPY ... FROM STDIN WITH (FORMAT BINARY)`), one
transaction per write that also updates the table's record in `ctxrep_stores`, so the rows and the resume point
that counts them commit together; the HNSW index is built once, after the load (`finish`; `?index=none` leaves it
out). Column types: vector (float32), halfvec (`?vector=half`), bit (`--output-precision binary / ubinary`,
Hamming distance), sparsevec (`--output sparse`, inner product). Exact search: the same query with index scans off.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ctxrep.stores.base import Found, Rows, Store, StoreRecord, ef_search
from ctxrep.stores.uri import StoreError

RECORDS = "ctxrep_stores"  # one row per ctxrep table: its name and record (JSON)

# VectorKind (form or precision) -> (column type, distance operator, HNSW operator class)
COLUMNS = {
    "float32": ("vector", "<=>", "vector_cosine_ops"),
    "float16": ("halfvec", "<=>", "halfvec_cosine_ops"),
    "bit": ("bit", "<~>", "bit_hamming_ops"),
    "sparse": ("sparsevec", "<#>", None),  # exact inner product (HNSW takes sparse vectors of at most 1,000 entries)
}
CONNECT_TIMEOUT_S = 5


class PgvectorStore(Store):
    scheme = "postgresql"
    extra = "pgvector"
    client = "psycopg"
    options = ("index", "vector", "sslmode", "password")
    holds = ("float32", "float16", "bit", "sparse")

    def __init__(self, uri) -> None:
        super().__init__(uri)
        psycopg = self.import_client()
        try:
            from pgvector.psycopg import register_vector
        except ImportError:
            raise StoreError(f"a {self.scheme} store needs pgvector: pip install 'ctxrep[{self.extra}]'") from None
        self.index = uri.option("index", "hnsw", ("hnsw", "none"))
        params = {"host": uri.host, "port": uri.port or 5432, "dbname": uri.location, "user": uri.user,
                  "password": uri.password or uri.options.get("password"), "sslmode": uri.options.get("sslmode"),
                  "connect_timeout": CONNECT_TIMEOUT_S}  # fmt: skip
        try:
            self.conn = psycopg.connect(**{k: v for k, v in params.items() if v is not None}, autocommit=True)
        except psycopg.Error as e:
            raise self.fail("cannot connect", e) from None
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(self.conn)
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {RECORDS} (name text PRIMARY KEY, record jsonb NOT NULL)")
        except psycopg.Error as e:
            raise self.fail("cannot use pgvector (CREATE EXTENSION vector)", e) from None
        from psycopg import sql

        self.sql = sql
        self.name = sql.Identifier(uri.table)

    def _record_row(self):
        return self.conn.execute(f"SELECT record FROM {RECORDS} WHERE name = %s", (self.uri.table,)).fetchone()

    def read_record(self) -> StoreRecord | None:
        row = self._record_row()
        exists = self.conn.execute("SELECT to_regclass(%s)", (self.uri.table,)).fetchone()[0] is not None
        if row is None:
            if exists:
                raise StoreError(
                    f"{self.where}: table {self.uri.table} exists and ctxrep did not write it; use another"
                )
            return None
        if not exists:  # the table was dropped by hand: its record goes with it
            self.conn.execute(f"DELETE FROM {RECORDS} WHERE name = %s", (self.uri.table,))
            return None
        return StoreRecord.from_json(row[0], self.where)

    def _column(self, kind) -> tuple[str, str, str | None]:
        return COLUMNS["sparse" if kind.form == "sparse" else kind.precision]

    def create(self, record: StoreRecord) -> None:
        column = self._column(record.kind)[0]
        statement = self.sql.SQL(
            "CREATE TABLE {} (id text PRIMARY KEY, source text, line bigint, field text, position bigint, word text, "
            "text text, embedding {}({}))"
        ).format(self.name, self.sql.SQL(column), self.sql.Literal(record.kind.dim))
        with self.conn.transaction():
            self.conn.execute(statement)
            self._save(record)

    def _save(self, record: StoreRecord) -> None:
        self.conn.execute(
            f"INSERT INTO {RECORDS} (name, record) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET record = "
            "excluded.record",
            (self.uri.table, record.to_json()),
        )

    def write_record(self, record: StoreRecord) -> None:
        self._save(record)

    def _values(self, rows: Rows, kind) -> list:
        from pgvector import Bit, HalfVector, SparseVector

        if kind.form == "sparse":
            csr = rows.vectors.tocsr()
            return [SparseVector(csr[i]) for i in range(csr.shape[0])]
        if kind.precision == "bit":
            bits = np.unpackbits(np.asarray(rows.vectors, np.uint8), axis=1)[:, : kind.dim].astype(bool)
            return [Bit(b) for b in bits]
        vectors = np.asarray(rows.vectors, np.float32)
        return [HalfVector(v) for v in vectors] if kind.precision == "float16" else list(vectors)

    def write(self, rows: Rows, record: StoreRecord | None = None) -> None:
        import psycopg

        kind = (record or self.read_record()).kind
        column = self._column(kind)[0]
        values = self._values(rows, kind)
        copy_sql = self.sql.SQL(
            "COPY {} (id, source, line, field, position, word, text, embedding) FROM STDIN WITH (FORMAT BINARY)"
        ).format(self.name)
        lines, positions = rows.lines.tolist(), rows.positions.tolist()
        try:
            with self.conn.transaction(), self.conn.cursor() as cursor:
                with cursor.copy(copy_sql) as copy:
                    copy.set_types(["text", "text", "int8", "text", "int8", "text", "text", column])
                    for i, vector in enumerate(values):
                        copy.write_row((rows.ids[i], rows.sources[i], lines[i], rows.fields[i], positions[i],
                                        rows.words[i], rows.texts[i], vector))  # fmt: skip
                if record is not None:
                    self._save(record)
        except psycopg.Error as e:
            raise self.fail("cannot write", e) from None

    def discard(self, source: str, field_name: str, from_line: int) -> None:
        self.conn.execute(
            self.sql.SQL("DELETE FROM {} WHERE source = %s AND field = %s AND line >= %s").format(self.name),
            (source, field_name, int(from_line)),
        )

    def delete_ids(self, ids: list[str]) -> None:
        self.conn.execute(self.sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(self.name), (list(ids),))

    def finish(self) -> None:
        record = self.read_record()
        ops = self._column(record.kind)[2] if record is not None else None
        if self.index == "none" or ops is None:
            return
        index = self.sql.Identifier(f"{self.uri.table}_embedding_hnsw")
        self.conn.execute("SET maintenance_work_mem = '512MB'")
        self.conn.execute(
            self.sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding {})").format(
                index, self.name, self.sql.SQL(ops)
            )
        )

    def count(self) -> int:
        return self.conn.execute(self.sql.SQL("SELECT count(*) FROM {}").format(self.name)).fetchone()[0]

    def search(self, queries, k: int, exact: bool) -> list[Found]:
        from pgvector import Bit, HalfVector, SparseVector

        kind = self.read_record().kind
        operator = self.sql.SQL(self._column(kind)[1])
        query = self.sql.SQL("SELECT id, text, line, embedding {} %s AS d FROM {} ORDER BY d LIMIT %s").format(
            operator, self.name
        )
        found = []
        with self.conn.transaction():
            if exact:
                self.conn.execute("SET LOCAL enable_indexscan = off")
            else:
                self.conn.execute(self.sql.SQL("SET LOCAL hnsw.ef_search = {}").format(self.sql.Literal(ef_search(k))))
            count = queries.shape[0]
            for i in range(count):
                if kind.form == "sparse":
                    q = SparseVector(queries[i])
                elif kind.precision == "bit":
                    q = Bit(np.unpackbits(np.asarray(queries[i], np.uint8))[: kind.dim].astype(bool))
                elif kind.precision == "float16":
                    q = HalfVector(np.asarray(queries[i], np.float32))
                else:
                    q = np.asarray(queries[i], np.float32)
                rows = self.conn.execute(query, (q, k)).fetchall()
                d = np.array([r[3] for r in rows], np.float32)
                scores = -d if kind.form == "sparse" else 1.0 - (d / kind.dim if kind.precision == "bit" else d)
                found.append(Found([r[0] for r in rows], [r[1] for r in rows], scores, np.array([r[2] for r in rows])))
        return found

    def scan(self, batch_size: int = 10_000) -> Iterator[Rows]:
        kind = self.read_record().kind
        query = self.sql.SQL(
            "SELECT id, source, line, field, position, word, text, embedding FROM {} ORDER BY source, field, line, "
            "position"
        ).format(self.name)
        with self.conn.transaction(), self.conn.cursor(name="ctxrep_scan") as cursor:
            cursor.execute(query)
            while True:
                batch = cursor.fetchmany(batch_size)
                if not batch:
                    return
                vectors = [r[7] for r in batch]
                if kind.form == "sparse":
                    import scipy.sparse

                    array = scipy.sparse.vstack([scipy.sparse.csr_matrix(v.to_numpy()) for v in vectors])
                elif kind.precision == "bit":
                    bits = [np.frombuffer(v.encode(), np.uint8) == ord("1") if isinstance(v, str) else v.to_numpy()
                            for v in vectors]  # fmt: skip
                    array = np.packbits(np.stack(bits), axis=1)
                else:
                    array = np.stack([np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, np.float32)
                                      for v in vectors])  # fmt: skip
                yield Rows([r[0] for r in batch], [r[1] for r in batch], np.array([r[2] for r in batch]),
                           [r[3] for r in batch], np.array([r[4] for r in batch]), [r[5] for r in batch],
                           [r[6] for r in batch], array)  # fmt: skip

    def close(self) -> None:
        self.conn.close()
