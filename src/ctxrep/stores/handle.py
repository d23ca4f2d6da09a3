"""`VectorStore`: a store's table searched and grown by text, what `ctxrep.open_store(URI)` returns.

    store = ctxrep.open_store("qdrant:vectors.qdrant/corpus")
    len(store)                                        # rows
    store.search("a man plays a guitar", k=10)        # Hits (ids, texts, scores best first, rows: input lines)
    store.search(["q1", "q2"], k=5, exact=True)       # a list of Hits; exact: every row scored
    store.add(["a new text"], ids=["doc-7"])          # embedded as the table's rows were; same id: replaced

Queries are embedded with the FeaturizerSpec the table records (a `featurizer` given is checked against it: one
SpecMismatch line naming the fields that differ), cut to its dimensions, coded as its vectors are (bits); the
store's own ANN index answers, or with `exact=True` its exact mode. A sparse table embeds queries with the
SparseEncoder of its spec; a multi-vector table (late interaction: LanceDB's multivector, Qdrant's MaxSim), made
by `add` through a ctxrep.vectors.late_interaction.MultiVectorEncoder, its queries with that encoder.
`search(..., hybrid=True)`: a Qdrant table whose rows hold sparse vectors beside their
dense ones (`ctxrep embed --output sparse` on the same input) fuses both rankings in the engine (RRF).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ctxrep.featurize.spec import FeaturizerSpec
from ctxrep.stores.base import Rows, Store, StoreRecord, VectorKind
from ctxrep.stores.uri import StoreError
from ctxrep.vectors.hits import Hits

ADDED = "<add>"  # the source of rows VectorStore.add writes


class VectorStore:
    """See the module docstring. `featurizer`: a ready ctxrep.Featurizer for text (checked against the table's
    spec; it also makes the table when `add` writes to one that does not exist yet); `runtime`: Featurizer keyword
    arguments that do not change the vectors (device, num_threads) for the one built from the spec."""

    def __init__(self, store: Store, featurizer=None, runtime: dict | None = None) -> None:
        self.store = store
        self.runtime = dict(runtime or {})
        self.record: StoreRecord | None = store.read_record()
        self._featurizer = None
        self._sparse = None  # a hybrid table's SparseEncoder for queries
        if featurizer is not None:
            self.use_featurizer(featurizer)

    @property
    def spec(self) -> FeaturizerSpec | None:
        return None if self.record is None else self.record.spec

    @property
    def kind(self) -> VectorKind | None:
        return None if self.record is None else self.record.kind

    def __len__(self) -> int:
        return 0 if self.record is None else self.store.count()

    def __repr__(self) -> str:
        what = "empty" if self.record is None else f"{self.record.kind.describe()} of {self.record.spec.model}"
        return f"VectorStore({self.store.where!r}, {what})"

    def _table(self) -> StoreRecord:
        if self.record is None:
            raise StoreError(
                f"{self.store.where}: no such table; write one with `ctxrep embed --store URI`, or open it with a "
                "featurizer and add texts"
            )
        return self.record

    def use_featurizer(self, featurizer) -> VectorStore:
        """Embed text with `featurizer`, after checking that it makes the table's vectors."""
        if self.record is not None:
            self.record.spec.check(
                FeaturizerSpec.of(featurizer), self.store.where, "open the store without one to embed as it was written"
            )
        self._featurizer = featurizer
        return self

    def featurizer(self):
        """What embeds text: the given featurizer, or one built from the recorded spec (a SparseEncoder for a sparse
        table) on first use."""
        if self._featurizer is None:
            record = self._table()
            kwargs = {**record.spec.featurizer_kwargs(), **self.runtime}
            if record.kind.form == "sparse":
                from ctxrep.vectors.sparse import SparseEncoder

                self._featurizer = SparseEncoder(**kwargs)
            elif record.kind.form == "multi":
                from ctxrep.vectors.late_interaction import MultiVectorEncoder

                self._featurizer = MultiVectorEncoder(**kwargs)
            else:
                from ctxrep.featurize import Featurizer

                self._featurizer = Featurizer(**kwargs)
        return self._featurizer

    def embed(self, texts: list[str], prompt: str | None = None, prompt_name: str | None = None, query: bool = True):
        """Vectors of `texts` as the table holds them: float32 (n, dim), packed bits, a csr_matrix, or a (tokens,
        dim) array per text (multi-vector: as queries, or as documents with `query=False`)."""
        record = self._table()
        fz = self.featurizer()
        if record.kind.form == "multi":
            return (fz.embed_queries if query else fz.embed_documents)(texts, prompt=prompt, prompt_name=prompt_name)
        if record.kind.form == "sparse":
            if prompt is not None or prompt_name is not None:
                raise StoreError(
                    "prompt / prompt_name apply to dense tables; a sparse table embeds queries as they are"
                )
            return fz.embed_sentences(texts)
        vectors = fz.embed_sentences(texts, prompt=prompt, prompt_name=prompt_name, dimensions=record.spec.dimensions)
        if vectors.ndim != 2 or vectors.shape[1] != record.kind.dim:
            raise StoreError(
                f"{self.store.where}: the featurizer gives {vectors.shape[1:]} per text; the table holds "
                f"{record.kind.dim}-wide vectors"
            )
        if record.kind.precision == "bit":
            from ctxrep.vectors.quantize import quantize

            return quantize(vectors, "ubinary").codes
        return vectors

    def search(
        self,
        queries,
        k: int = 10,
        exact: bool = False,
        prompt: str | None = None,
        prompt_name: str | None = None,
        hybrid: bool = False,
    ) -> Hits | list[Hits]:
        """The k best rows of each query (a text or a list of texts; or vectors as the table holds them), best first:
        one Hits for one query, a list for several. Hits.rows are the rows' input lines. hybrid: text queries
        embedded both ways in a table that holds sparse vectors beside its dense ones (Qdrant), the two rankings
        fused by the engine (Reciprocal Rank Fusion: scores are RRF's)."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        record = self._table()
        multi = record.kind.form == "multi"
        single = isinstance(queries, str) or (isinstance(queries, np.ndarray) and queries.ndim == (2 if multi else 1))
        texts = isinstance(queries, str) or (isinstance(queries, Sequence) and queries and isinstance(queries[0], str))
        if hybrid:
            if not texts or exact:
                raise StoreError("hybrid search takes text queries and the store's ANN search (leave out exact)")
            return self._hybrid([queries] if single else list(queries), int(k), prompt, prompt_name, single)
        if texts:
            q = self.embed([queries] if single else list(queries), prompt, prompt_name)
        elif multi:  # a (tokens, dim) matrix a query
            q = [queries] if single else list(queries)
        else:
            q = queries
            if isinstance(q, np.ndarray) and q.ndim == 1:
                q = q[None, :]
            if record.kind.form == "dense" and (q.ndim != 2 or q.shape[1] != _width(record.kind)):
                raise StoreError(f"query vectors of shape {q.shape} do not fit {record.kind.describe()}")
        found = self.store.search(q, int(k), exact)
        hits = [Hits(f.ids, f.texts, np.asarray(f.scores, np.float32), np.asarray(f.lines, np.int64)) for f in found]
        return hits[0] if single else hits

    def _hybrid(self, texts: list[str], k: int, prompt, prompt_name, single: bool):
        record = self._table()
        if not self.store.hybrid or record.sparse is None:
            raise StoreError(
                f"{self.store.where}: no sparse vectors beside the dense ones for hybrid search; add them with "
                "`ctxrep embed --output sparse --model SPLADE --store URI` on the same input (Qdrant)"
            )
        if self._sparse is None:
            from ctxrep.vectors.sparse import SparseEncoder

            self._sparse = SparseEncoder(**record.sparse.featurizer_kwargs(), **self.runtime)
        found = self.store.search_hybrid(self.embed(texts, prompt, prompt_name), self._sparse.embed_sentences(texts), k)
        hits = [Hits(f.ids, f.texts, np.asarray(f.scores, np.float32), np.asarray(f.lines, np.int64)) for f in found]
        return hits[0] if single else hits

    def add(self, texts: Sequence[str], ids: Sequence[str] | None = None, with_text: bool = True) -> VectorStore:
        """Embed `texts` as the table's rows were and write them; `ids` (default: derived from each text) replace
        rows of the same id. Into a table that does not exist yet (opened with a featurizer), the first add makes
        it, recording the featurizer's spec."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if ids is None:
            ids = ["text:" + hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts]
        ids = [str(i) for i in ids]
        if len(ids) != len(texts) or len(set(ids)) != len(ids):
            raise StoreError(f"{len(texts)} texts but {len(set(ids))} distinct ids; give one unique id per text")
        if not texts:
            return self
        if self.record is None:
            if self._featurizer is None:
                self._table()  # the one-line error
            self._make_table()
        vectors = self.embed(texts, query=False)
        n = len(texts)
        rows = Rows(ids, [ADDED] * n, np.full(n, -1, np.int64), ["text"] * n, np.full(n, -1, np.int64),
                    [""] * n, list(texts) if with_text else [None] * n, vectors)  # fmt: skip
        self.store.delete_ids(ids)
        self.store.write(rows, self.record)
        return self

    def _make_table(self) -> None:
        fz = self._featurizer
        if not getattr(fz, "single_layer", True):
            raise StoreError(f"{self.store.where}: a store row holds one vector: give the featurizer one layer or mix")
        spec = FeaturizerSpec.of(fz)
        form = {"sparse": "sparse", "multi-vector": "multi"}.get(spec.head, "dense")  # what the encoder makes
        kind = VectorKind(form, int(fz.dim if form == "multi" else fz.sentence_dim))
        kind = self.store.stored(kind)
        self.store.refuse(kind, self.store.uri)
        self.record = StoreRecord(spec, kind)
        self.store.create(self.record)

    def vectors(self) -> tuple[list, list, np.ndarray]:
        """(ids, texts, (rows, dim) float32 vectors) of every row (a dense float table), read through the store."""
        record = self._table()
        if record.kind.form != "dense" or record.kind.precision == "bit":
            raise StoreError(
                f"{self.store.where}: holds {record.kind.describe()}; a sentence index reads float vectors (embed "
                "float32, or build a binary index from them: ctxrep index build --binary)"
            )
        ids, texts, parts = [], [], []
        for rows in self.store.scan():
            ids += rows.ids
            texts += rows.texts
            parts.append(np.asarray(rows.vectors, np.float32))
        vectors = np.concatenate(parts) if parts else np.zeros((0, record.kind.dim), np.float32)
        return ids, texts, vectors

    def sentence_index(self, metric: str = "cosine", **kwargs):
        """A ctxrep.SentenceIndex of every row with its id and text (`ctxrep index build --vectors URI`), queries
        embedded with the table's spec (and its dimensions); `kwargs`: SentenceIndex's (binary, ...)."""
        from ctxrep.vectors.index import SentenceIndex

        if self._table().level != "sentence":
            raise StoreError(f"{self.store.where}: holds word vectors; a sentence index needs sentence vectors")
        ids, texts, vectors = self.vectors()
        if kwargs.get("dimensions") is None and self.record.spec.dimensions is not None:
            kwargs["dimensions"] = self.record.spec.dimensions  # queries cut as the rows were
        return SentenceIndex.from_vectors(vectors, ids=ids, texts=texts, metric=metric, spec=self.record.spec, **kwargs)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _width(kind: VectorKind) -> int:
    return (kind.dim + 7) // 8 if kind.precision == "bit" else kind.dim
