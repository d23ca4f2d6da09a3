"""What every store answers: the writer / reader protocol the embedding jobs and the search handle use, the rows they
exchange and the record each table keeps of what it holds.

A table (collection) holds one row per vector: `id` (derived from the input: file, line, field and the word or
chunk number, so a rerun writes the same ids), `source` (the input file), `line`, `field` (the text column),
`position` (the word or chunk number in the text; -1 for one vector per text), `word` (word rows: the word),
`text` (optional) and the vector. Beside the rows it keeps one record (`StoreRecord`, JSON): the FeaturizerSpec of
its vectors, their kind (`VectorKind`) and level, and for each input an embedding job wrote from, the resume point
(shards and texts written, the next input line) and whether that input is complete. Each store keeps the record
where its engine keeps metadata (LanceDB: the vector field's metadata; PostgreSQL: a row of ctxrep_stores, written
in the transaction of the rows it counts; Qdrant: the collection's metadata; Chroma: the collection's metadata).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from ctxrep.featurize.spec import FeaturizerSpec, SpecMismatch
from ctxrep.stores.uri import StoreError, StoreURI

RECORD_FORMAT = "ctxrep-store"
RECORD_VERSION = 1

EF_SEARCH = (
    200  # HNSW candidates per query (pgvector's default is 40): recall@10 >= 0.95 on STS-B (benchmarks/stores.py)
)

# what a stored vector is: `form` dense, sparse or multi (one vector per token: late interaction, MaxSim); a dense
# vector's `precision`: float32, float16 (half), bit
FORMS = ("dense", "sparse", "multi")
PRECISIONS = ("float32", "float16", "bit")


@dataclass(frozen=True)
class VectorKind:
    """What one row's vector is: `form` (dense: `dim` numbers; sparse: indices and values over `dim` = the
    vocabulary; multi: a (tokens, dim) matrix, scored by MaxSim), the dense `precision` stored (float32, float16,
    or bit: the signs, packed; searched by Hamming distance), and the `metric` it is searched by."""

    form: str = "dense"
    dim: int = 0
    precision: str = "float32"

    @property
    def metric(self) -> str:
        return "hamming" if self.precision == "bit" else "dot" if self.form == "sparse" else "cosine"

    @property
    def name(self) -> str:
        """What a store must hold for it (a row of a store's `holds`): sparse, multi, or the dense precision."""
        return self.precision if self.form == "dense" else self.form

    def describe(self) -> str:
        if self.form == "sparse":
            return f"sparse vectors over {self.dim} dimensions"
        if self.form == "multi":
            return f"multi-vector rows of {self.dim}-wide token vectors"
        return f"{self.dim}-wide {self.precision} vectors"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Rows:
    """A batch of rows to write (one list or array entry per row). `vectors`: (rows, dim) float32, (rows, dim / 8)
    uint8 packed bits, a scipy.sparse csr_matrix (rows, vocabulary), or a list of (tokens, dim) arrays (multi)."""

    ids: list[str]
    sources: list[str]
    lines: np.ndarray
    fields: list[str]
    positions: np.ndarray
    words: list[str]
    texts: list[str | None]
    vectors: Any

    def __len__(self) -> int:
        return len(self.ids)

    def columns(self) -> dict:
        """The scalar columns by name, as the stores name them."""
        return {"id": self.ids, "source": self.sources, "line": self.lines, "field": self.fields,
                "position": self.positions, "word": self.words, "text": self.texts}  # fmt: skip


def row_id(source: str, line: int, field_name: str, position: int) -> str:
    """The id of a row: its input file, line, field and the word or chunk number (-1: one vector per text, left
    out). A rerun of the same input derives the same ids."""
    base = f"{source}:{line}:{field_name}"
    return base if position < 0 else f"{base}:{position}"


def uuid_of(text_id: str) -> str:
    """A UUID derived from a row id, for stores whose point ids are integers or UUIDs (Qdrant)."""
    digest = bytearray(hashlib.sha256(text_id.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5-style, variant RFC 4122
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class StoreRecord:
    """What a table holds, kept beside its rows: the spec of its vectors, their kind and level ("sentence": one
    per text or chunk, "word": one per word occurrence), and `runs`: each input's resume point (key: the input
    file and field, "|sparse" added for a hybrid table's sparse vectors; value: settings, shards, texts, rows,
    next_line, complete). `sparse`: in a store that holds dense and sparse vectors on one row (Qdrant), the
    FeaturizerSpec of the sparse vectors added beside the dense ones (hybrid search), else None."""

    spec: FeaturizerSpec
    kind: VectorKind
    level: str = "sentence"
    runs: dict = field(default_factory=dict)
    sparse: FeaturizerSpec | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": RECORD_FORMAT,
                "version": RECORD_VERSION,
                "spec": self.spec.to_dict(),
                "kind": self.kind.to_dict(),
                "level": self.level,
                "runs": self.runs,
                "sparse": None if self.sparse is None else self.sparse.to_dict(),
            }  # fmt: skip
        )

    @classmethod
    def from_json(cls, text: str | bytes | dict, where: str) -> StoreRecord:
        try:
            data = text if isinstance(text, dict) else json.loads(text)
            if data.get("format") != RECORD_FORMAT:
                raise KeyError("format")
            if data.get("version", 0) > RECORD_VERSION:
                raise StoreError(
                    f"{where}: written by a newer ctxrep (record version {data['version']}); upgrade ctxrep"
                )
            return cls(
                FeaturizerSpec.from_dict(data["spec"], where),
                VectorKind(**data["kind"]),
                data.get("level", "sentence"),
                dict(data.get("runs") or {}),
                FeaturizerSpec.from_dict(data["sparse"], where) if data.get("sparse") else None,
            )
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise StoreError(
                f"{where}: a table ctxrep did not write, or a damaged record ({type(e).__name__}: {e}); use another table"
            ) from None

    def check(
        self, spec: FeaturizerSpec, kind: VectorKind, level: str, where: str, ignore: tuple[str, ...] = ()
    ) -> None:
        """SpecMismatch / StoreError in one line unless `spec`, `kind` and `level` give the vectors this table holds:
        the fields that differ are named, as load_vectors names them."""
        differences = self.spec.differences(spec, ignore)
        if differences:
            raise SpecMismatch(
                f"{where} holds other vectors (differs in: {', '.join(d.split()[0] for d in differences)}): "
                f"written != asked: {'; '.join(differences)}; embed with the recorded settings, or use another table"
            )
        if kind != self.kind or level != self.level:
            raise StoreError(
                f"{where} holds {self.level}-level {self.kind.describe()}, not {level}-level {kind.describe()}; "
                "use another table"
            )


@dataclass(frozen=True)
class Found:
    """One query's hits as a store answers them: ids, texts (None where not stored), scores best first, lines."""

    ids: list
    texts: list
    scores: np.ndarray
    lines: np.ndarray


class Store:
    """The protocol every store implements over its own client (one module each); see the module docstring.

    Class attributes, read before anything connects: `scheme`, `extra` (the pip extra of its client), `options`
    (the URI options it reads), `holds` (what it stores natively: VectorKind.name's), `hybrid` (dense and
    sparse vectors on one row, searched together)."""

    scheme: ClassVar[str]
    extra: ClassVar[str]
    client: ClassVar[str]  # the module the extra installs
    options: ClassVar[tuple[str, ...]] = ()
    holds: ClassVar[tuple[str, ...]] = ("float32",)
    hybrid: ClassVar[bool] = False

    def __init__(self, uri: StoreURI) -> None:
        self.uri = uri
        uri.check_options(self.options)
        self.half = "vector" in self.options and uri.option("vector", "float32", ("float32", "half")) == "half"

    def stored(self, kind: VectorKind) -> VectorKind:
        """The kind this store keeps for `kind`: float32 vectors as float16 with `?vector=half`."""
        if self.half and kind.form == "dense" and kind.precision == "float32":
            return replace(kind, precision="float16")
        return kind

    # ---- what it can hold ----------------------------------------------------------------------------------

    @classmethod
    def refuse(cls, kind: VectorKind, uri: StoreURI) -> None:
        """A one-line StoreError unless this store holds `kind` natively (before anything is embedded)."""
        what = kind.name
        if what not in cls.holds:
            raise StoreError(
                f"{uri.shown}: a {cls.scheme} store holds no {what} vectors (it holds {', '.join(cls.holds)}); "
                "embed what it holds, or use a store that holds these"
            )

    @classmethod
    def import_client(cls):
        """The store's client module, or a one-line StoreError naming the pip command."""
        try:
            return importlib.import_module(cls.client)
        except ImportError:
            raise StoreError(
                f"a {cls.scheme} store needs {cls.client.split('.')[0]}: pip install 'ctxrep[{cls.extra}]'"
            ) from None

    @property
    def where(self) -> str:
        return self.uri.shown

    def fail(self, what: str, error: BaseException) -> StoreError:
        """A StoreError naming the store (credentials scrubbed) for a client error `error` while doing `what`."""
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return StoreError(f"{self.where}: {what}: {self.uri.scrub(first)}")

    # ---- the protocol ---------------------------------------------------------------------------------------

    def read_record(self) -> StoreRecord | None:
        """The table's record, or None when the table does not exist."""
        raise NotImplementedError

    def create(self, record: StoreRecord) -> None:
        """Create the table for `record.kind` (no index yet: the index is built after the load) and keep `record`."""
        raise NotImplementedError

    def write_record(self, record: StoreRecord) -> None:
        raise NotImplementedError

    def write(self, rows: Rows, record: StoreRecord | None = None) -> None:
        """Append `rows` through the store's bulk path; then keep `record` (the resume point they complete),
        atomically with the rows where the engine allows."""
        raise NotImplementedError

    def discard(self, source: str, field_name: str, from_line: int) -> None:
        """Delete the rows of (`source`, `field_name`) from input line `from_line` on: what a killed run wrote past
        its recorded resume point."""
        raise NotImplementedError

    def delete_ids(self, ids: list[str]) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """After a load: build the ANN index / compact (each store's documented order: index after the data)."""

    def count(self) -> int:
        raise NotImplementedError

    def search(self, queries, k: int, exact: bool) -> list[Found]:
        """The k best rows for each query vector (a (n, dim) array; sparse: a csr_matrix; multi: a list of (tokens,
        dim) arrays, scored by MaxSim of cosine similarities), best first."""
        raise NotImplementedError

    def scan(self, batch_size: int = 10_000) -> Iterator[Rows]:
        """Every row, in batches (ctxrep index build --vectors)."""
        raise NotImplementedError

    # ---- hybrid tables (stores with `hybrid`: dense and sparse vectors on one row) ------------------------------

    def write_sparse(self, rows: Rows, record: StoreRecord) -> None:
        """Put the sparse vectors `rows.vectors` beside the dense vectors of the rows `rows.ids` (which exist)."""
        raise StoreError(f"{self.where}: a {self.scheme} store keeps one vector a row; hybrid search: use Qdrant")

    def search_hybrid(self, dense, sparse, k: int) -> list[Found]:
        """The k best rows for each (dense, sparse) query pair, the two rankings fused by the engine (RRF)."""
        raise StoreError(f"{self.where}: a {self.scheme} store has no hybrid search; use Qdrant")

    def close(self) -> None:
        pass


def dense_scores(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Cosine similarities (queries, rows) of float vectors: the exact mode of stores without one."""
    from ctxrep.util.arrays import normalize_rows

    return normalize_rows(np.asarray(queries, np.float32)) @ normalize_rows(np.asarray(vectors, np.float32)).T


def ef_search(k: int) -> int:
    """The HNSW search breadth for k hits: EF_SEARCH, or more for a large k."""
    return max(EF_SEARCH, 2 * k)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Row numbers of the k best scores, best first (ties by row number)."""
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    return top[np.lexsort((top, -scores[top]))]
