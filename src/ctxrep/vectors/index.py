"""THE nearest-neighbour index of ctxrep (sentence vectors, and word occurrences through
`ctxrep.analysis.neighbors.OccurrenceIndex`): build, add, search the k nearest, save, load.

    index = ctxrep.SentenceIndex.build(texts, model="minilm")           # embeds the texts (ctxrep.Featurizer)
    index.add(more_texts)
    hits = index.search("How do I reset my password?", k=5)          # one Hits: ids, texts, scores, best first
    index.save("ix/");  index = ctxrep.SentenceIndex.load("ix/")
    index = ctxrep.SentenceIndex.from_vectors("vecs/")                # `ctxrep embed --level sentence` output
    index = ctxrep.SentenceIndex.build(texts, model=folder, dimensions=128, binary=Binary(Rescore.INT8),
                                       document_prompt_name="document")
    hits = index.search("reset password", prompt_name="query")

Results are Hits (ctxrep.vectors.hits), as every index's and reranker's: one Hits for one query (a text or a
vector (dim,)), a list of Hits for a list of texts or (n, dim) vectors.

Compact vectors: `dimensions` keeps the first N coordinates of every vector, L2-normalised again (Matryoshka; the
Featurizer's `embed_sentences(dimensions=)`), for the stored vectors and every text query alike. `binary`
(ctxrep.vectors.quantize.Binary(rescore, rescore_multiplier)) stores ubinary codes (dim / 8 bytes a row) searched by
Hamming distance, the best `rescore_multiplier` x k candidates rescored by the float query's dot product with their
int8 or float32 vectors (Rescore.INT8 / Rescore.FLOAT32; ctxrep.vectors.quantize.BinaryIndex). The int8 ranges are
those of the vectors present when the codes are first made (at the first search or save); rows added later are coded
on the same grid.

Prompts: `document_prompt` / `document_prompt_name` (text, or a prompt the model folder declares by name) go before
every text `build` and `add` embed, and are recorded in index.json, so rows added after `load` are embedded the
same way; `search(..., prompt=, prompt_name=)` puts a query prompt before text queries (none given: the folder's
default prompt, as sentence-transformers' encode).

Ids default to 0-based row numbers everywhere: `build`, `add`, `from_vectors` (the embed run's text numbers, as
`load_vectors` counts them) and `ctxrep index build` (the text's position in the input file).

Scores are cosine similarities (metric="cosine": vectors are stored L2-normalised and compared by dot product) or
raw dot products (metric="dot"). Up to `exact_below` items the search is exact: one matrix product over all stored
vectors. Above it, an HNSW graph (hnswlib, Malkov & Yashunin 2018) answers in about log(n) distance computations,
approximately; `exact=True` on `search` asks for the exact answer at any size.

On disk (no pickle: every file is plain numpy, JSON or hnswlib's own format):
    index.json     metric, dim, count, the FeaturizerSpec of the vectors (`ctxrep.featurize.spec`: model, revision,
                   layers, pooling, sentence_pooling, precision, ...; text queries are embedded with it and a
                   featurizer handed to `load` is checked against it), hnswlib's parameters, and the index's
                   embedding settings: dimensions, document_prompt {prompt, prompt_name}, binary {rescore,
                   rescore_multiplier}
    vectors.npy    (count, dim) float32, as searched (normalised for cosine); not in a binary index
    binary/, rescore/  a binary index's codes and rescoring vectors (BinaryIndex.save)
    items.jsonl    one {"id": ..., "text": ...} per line, in row order (text null when unknown)
    hnsw.bin       hnswlib's graph (only above exact_below)
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctxrep.featurize.spec import FeaturizerSpec
from ctxrep.util.arrays import normalize_rows
from ctxrep.vectors.hits import Hits
from ctxrep.vectors.quantize import Binary, BinaryIndex, QuantizedVectors, Rescore, dequantize, quantize, truncate
from ctxrep.vectors.similarity import METRICS

__all__ = ["SentenceIndex", "Hits", "SentenceIndexError", "Binary", "Rescore"]

FORMAT_VERSION = 1
EXACT_BELOW = 20_000  # items up to which search is one exact matrix product (about 30 MB of float32 at 384 wide)


class SentenceIndexError(ValueError):
    """A folder that is not a readable sentence index, or a request it cannot answer (one line, says what to do)."""


def _binary_option(binary, rescore_multiplier) -> Binary | None:
    """SentenceIndex's `binary`: a Binary or None; until 0.3 also the old string ("int8" / "float32") and the old
    `rescore_multiplier` keyword, with a DeprecationWarning."""
    if isinstance(binary, Binary) and rescore_multiplier is not None:
        raise ValueError(
            "rescore_multiplier goes inside the Binary option: binary=Binary(rescore, rescore_multiplier=N)"
        )
    if binary is None and rescore_multiplier is not None:
        raise ValueError("rescore_multiplier applies to a binary index: give binary=Binary(...) or leave it out")
    if binary is None or isinstance(binary, Binary):
        return binary
    if not (isinstance(binary, str) and binary in Rescore._value2member_map_):
        raise ValueError(
            f"binary must be None or a Binary(rescore, rescore_multiplier) (ctxrep.vectors.quantize.Binary), got "
            f"{binary!r}"
        )
    old = f"binary={binary!r}" + ("" if rescore_multiplier is None else ", rescore_multiplier=N")
    new = f"Rescore.{Rescore(binary).name}" + ("" if rescore_multiplier is None else ", rescore_multiplier=N")
    warnings.warn(
        f"SentenceIndex({old}) is now binary=Binary({new}) (ctxrep.vectors.quantize.Binary); the old form goes in 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    return Binary(Rescore(binary), 4 if rescore_multiplier is None else rescore_multiplier)


class SentenceIndex:
    """Sentence vectors with their ids and texts, searchable by cosine or dot product; see the module docstring.

    dim: vector width. metric: "cosine" or "dot". spec: the FeaturizerSpec (or its dict) of the stored vectors,
    with which queries given as text are embedded; None for an index of bare vectors, which then takes only vector
    queries. runtime: further Featurizer keyword arguments for text queries that do not change the vectors
    (device, batch_tokens, num_threads). exact_below: the size up to which search is exact.
    hnsw_m / hnsw_ef_construction / hnsw_ef: hnswlib's M, ef_construction and the search-time ef (at least k).
    dimensions: text is embedded with `embed_sentences(dimensions=)` (dim must equal it). binary: None, or a
    Binary(rescore, rescore_multiplier): binary codes, `rescore_multiplier` x k candidates per query rescored with
    `rescore` vectors (Rescore.INT8 / Rescore.FLOAT32). The strings "int8" / "float32" and the rescore_multiplier
    keyword are accepted until 0.3 with a DeprecationWarning.
    document_prompt / document_prompt_name: the prompt before every text `add` embeds (see the module docstring).
    """

    def __init__(
        self,
        dim: int,
        metric: str = "cosine",
        spec: FeaturizerSpec | dict | None = None,
        exact_below: int = EXACT_BELOW,
        hnsw_m: int = 32,
        hnsw_ef_construction: int = 200,
        hnsw_ef: int = 100,
        runtime: dict | None = None,
        dimensions: int | None = None,
        binary: Binary | None = None,
        rescore_multiplier: int | None = None,
        document_prompt: str | None = None,
        document_prompt_name: str | None = None,
    ) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
        if dimensions is not None and dimensions != dim:
            raise ValueError(f"dimensions={dimensions!r} but dim={dim}: an index of truncated vectors is that wide")
        binary = _binary_option(binary, rescore_multiplier)
        if document_prompt is not None and document_prompt_name is not None:
            raise ValueError("give document_prompt or document_prompt_name, not both")
        self.dimensions = None if dimensions is None else int(dimensions)
        self.binary = binary
        self.document_prompt, self.document_prompt_name = document_prompt, document_prompt_name
        self._binary: BinaryIndex | None = None  # the codes of every row not in _chunks (binary indexes only)
        self.dim = int(dim)
        self.metric = metric
        self.spec = FeaturizerSpec.from_dict(spec, "spec") if isinstance(spec, dict) else spec
        self.runtime = dict(runtime or {})
        self.exact_below = exact_below
        self.hnsw_m, self.hnsw_ef_construction, self.hnsw_ef = hnsw_m, hnsw_ef_construction, hnsw_ef
        self._chunks: list[np.ndarray] = []  # float32 (rows, dim) blocks, concatenated on demand
        self._vectors = np.zeros((0, self.dim), np.float32)
        self.ids: list = []
        self.texts: list[str | None] = []
        self._id_set: set = set()
        self._hnsw = None  # hnswlib.Index over the first `_hnsw_rows` rows
        self._hnsw_rows = 0
        self._featurizer = None

    # ---- building ------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        ids: Sequence | None = None,
        featurizer=None,
        model: str = "minilm",
        metric: str = "cosine",
        **kwargs,
    ) -> SentenceIndex:
        """Embed `texts` with `featurizer` (a ctxrep.Featurizer) or Featurizer(model) and index them; ids default to
        0, 1, 2, ... (row numbers)."""
        from ctxrep.featurize import Featurizer

        fz = featurizer if featurizer is not None else Featurizer(model)
        dim = kwargs.get("dimensions") or fz.sentence_dim
        index = cls(dim, metric, spec=FeaturizerSpec.of(fz), **kwargs)
        index._featurizer = fz
        index.add(texts, ids=ids)
        return index

    @classmethod
    def from_vectors(
        cls,
        vectors,
        ids: Sequence | None = None,
        texts: Sequence[str | None] | None = None,
        metric: str = "cosine",
        spec: FeaturizerSpec | dict | None = None,
        **kwargs,
    ) -> SentenceIndex:
        """An index over given vectors: an (n, dim) array (`spec`: what made them, for text queries), or the folder
        of a `ctxrep embed --level sentence` run (read memory-mapped; ids default to its 0-based text numbers, and
        queries are embedded with its recorded spec). dimensions: keep the first N coordinates, L2-normalised."""
        if isinstance(vectors, (str, os.PathLike)):
            from ctxrep.vectors.store import load_vectors

            stored = load_vectors(vectors)
            if stored.level != "sentence":
                raise SentenceIndexError(
                    f"{vectors}: holds word vectors; a sentence index needs `ctxrep embed --level sentence` output"
                )
            if stored.sparse:
                raise SentenceIndexError(
                    f"{vectors}: holds sparse vectors (`ctxrep embed --output sparse`); index them with "
                    "ctxrep.vectors.sparse.SparseIndex.from_vectors (ctxrep index build --sparse --vectors)"
                )
            if stored.precision in ("binary", "ubinary"):
                raise SentenceIndexError(
                    f"{vectors}: holds {stored.precision} codes (embed --output-precision {stored.precision}), signs "
                    "only, with nothing to score the candidates by; embed with --output-precision float32 or int8 and "
                    "build a binary index from those (binary=Binary(), ctxrep index build --binary)"
                )
            if ids is None:
                ids = stored.index().text.tolist()
            if spec is None:
                spec = stored.spec
            recorded = spec.get("dimensions") if isinstance(spec, dict) else getattr(spec, "dimensions", None)
            if kwargs.get("dimensions") is None and recorded is not None:
                kwargs["dimensions"] = recorded  # queries truncated as the run truncated its vectors
            if stored.precision != "float32":  # int8 / uint8 codes: their float vectors on the recorded grid
                vectors = dequantize(stored.quantized())
            else:
                vectors = stored.array  # every row, in one array (a method in older ctxrep versions)
                vectors = vectors() if callable(vectors) else vectors
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim != 2:
            raise SentenceIndexError(
                f"vectors must be (n, dim), got shape {array.shape}; give one layer's sentence vectors"
            )
        if kwargs.get("dimensions") is not None:
            array = truncate(array, kwargs["dimensions"])  # as embed_sentences(dimensions=) makes text queries
        index = cls(array.shape[1], metric, spec=spec, **kwargs)
        index.add_vectors(array, ids=ids, texts=texts)
        return index

    def add(self, texts: Sequence[str], ids: Sequence | None = None) -> SentenceIndex:
        """Embed `texts` with the index's featurizer and document prompt and add them (ids: default the next row
        numbers)."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        empty = np.zeros((0, self.dim), np.float32)
        vectors = self._embed(texts, self.document_prompt, self.document_prompt_name) if texts else empty
        return self.add_vectors(vectors, ids=ids, texts=texts)

    def add_vectors(self, vectors, ids: Sequence | None = None, texts: Sequence[str | None] | None = None):
        """Add (n, dim) vectors with their ids (default: the next row numbers) and texts (default: none)."""
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim == 1:
            array = array[None, :]
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise SentenceIndexError(f"vectors of shape {array.shape} do not fit this index of {self.dim}-wide vectors")
        n = len(array)
        start = len(self)
        ids = list(range(start, start + n)) if ids is None else list(ids)
        texts = [None] * n if texts is None else list(texts)
        if len(ids) != n or len(texts) != n:
            raise SentenceIndexError(
                f"{n} vectors but {len(ids)} ids and {len(texts)} texts; give one of each per vector"
            )
        for i in ids:
            if not isinstance(i, (str, int, np.integer)) or isinstance(i, bool):
                raise SentenceIndexError(
                    f"id {i!r} is a {type(i).__name__}; ids are strings or integers (saved as JSON)"
                )
        ids = [int(i) if isinstance(i, np.integer) else i for i in ids]
        seen = set()
        for i in ids:
            if i in self._id_set or i in seen:
                raise SentenceIndexError(f"id {i!r} is already in the index; ids must be unique")
            seen.add(i)
        if not np.isfinite(array).all():
            row = int(np.argwhere(~np.isfinite(array))[0, 0])
            raise SentenceIndexError(f"vector {row} (id {ids[row]!r}) holds NaN or infinity")
        if self.metric == "cosine":
            array = normalize_rows(array)
        self._chunks.append(np.ascontiguousarray(array))
        self.ids.extend(ids)
        self.texts.extend(texts)
        self._id_set.update(ids)
        return self

    # ---- search ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def vectors(self) -> np.ndarray:
        """(count, dim) float32: the stored vectors (unit length for cosine); a binary index's rescoring vectors
        (the int8 ones on their grid)."""
        if self.binary is not None:
            coded = self._codes()
            return np.zeros((0, self.dim), np.float32) if coded is None else dequantize(coded.rescore)
        if self._chunks:  # rows added since the last search: one concatenation, not one per add
            self._vectors = np.concatenate([self._vectors, *self._chunks])
            self._chunks = []
        return self._vectors

    @property
    def rescore_multiplier(self) -> int | None:
        """Deprecated (goes in 0.3): binary.rescore_multiplier."""
        warnings.warn(
            "SentenceIndex.rescore_multiplier is now binary.rescore_multiplier (the Binary option); the attribute "
            "goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        return None if self.binary is None else self.binary.rescore_multiplier

    @property
    def binary_index(self) -> BinaryIndex | None:
        """A binary index's codes and rescoring vectors (ctxrep.vectors.quantize.BinaryIndex); None otherwise."""
        return self._codes() if self.binary is not None else None

    def _codes(self) -> BinaryIndex | None:
        """A binary index's codes of every row (rows added since the last call coded now, on the same grid)."""
        if self._chunks:
            new = np.concatenate(self._chunks)
            if self._binary is None:
                coded = BinaryIndex.build(new, rescore=self.binary.rescore)
            else:
                old = self._binary.rescore
                rescore = quantize(new, old.precision, ranges=old.ranges)
                coded = BinaryIndex(
                    np.concatenate([self._binary.codes, quantize(new, "ubinary").codes]),
                    QuantizedVectors(np.concatenate([old.codes, rescore.codes]), old.precision, old.dim, old.ranges),
                )
            self._binary, self._chunks = coded, []
        return self._binary

    def search(
        self,
        queries,
        k: int = 10,
        exact: bool | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> Hits | list[Hits]:
        """The k nearest items of each query (a text, a list of texts, a vector (dim,) or rows (n, dim)), best first:
        one Hits for a single query, a list of Hits for several. exact: None = exact up to exact_below items (a
        binary index: True scores every row's rescoring vector). prompt / prompt_name: the query prompt before text
        queries (a prompt the model folder declares, by name; none given: the folder's default prompt)."""
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        single = isinstance(queries, str) or (isinstance(queries, np.ndarray) and queries.ndim == 1)
        if isinstance(queries, str) or (isinstance(queries, Sequence) and queries and isinstance(queries[0], str)):
            q = self._embed([queries] if single else list(queries), prompt, prompt_name)
        elif prompt is not None or prompt_name is not None:
            raise SentenceIndexError("prompt / prompt_name apply to text queries; these queries are vectors")
        else:
            q = np.asarray(queries, dtype=np.float32)
            q = q[None, :] if q.ndim == 1 else q
            if q.ndim != 2 or q.shape[1] != self.dim:
                raise SentenceIndexError(
                    f"query vectors of shape {q.shape} do not fit this index of {self.dim}-wide vectors"
                )
        if self.metric == "cosine":
            q = normalize_rows(q)
        k = min(int(k), len(self))
        if k == 0:
            return Hits.empty() if single else [Hits.empty() for _ in range(len(q))]
        use_exact = exact if exact is not None else len(self) <= self.exact_below
        if self.binary is not None and exact is not True:  # the codes' rows, then this index's ids and texts
            found = self._codes().search(q, int(k), self.binary.rescore_multiplier)
            rows, scores = [h.rows for h in found], [h.scores for h in found]
        else:
            rows, scores = self._exact(q, k) if use_exact else self._approximate(q, k)
        hits = [Hits.from_rows(rr, ss, self.ids, self.texts) for rr, ss in zip(rows, scores)]
        return hits[0] if single else hits

    def _exact(self, q: np.ndarray, k: int, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """Exact top k by one matrix product per block of queries: (queries, k) rows and scores, best first."""
        vectors = self.vectors
        rows_out, scores_out = [], []
        for start in range(0, len(q), block):
            s = q[start : start + block] @ vectors.T  # (block, count)
            top = (
                np.argpartition(-s, k - 1, axis=1)[:, :k]
                if k < s.shape[1]
                else np.tile(np.arange(s.shape[1]), (len(s), 1))
            )
            top_scores = np.take_along_axis(s, top, axis=1)
            order = np.lexsort((top, -top_scores), axis=1)  # best score first; ties by row number
            rows_out.append(np.take_along_axis(top, order, axis=1))
            scores_out.append(np.take_along_axis(top_scores, order, axis=1))
        return np.concatenate(rows_out), np.concatenate(scores_out)

    def _approximate(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """HNSW search (hnswlib, inner-product space: score = dot product of the stored and query vectors)."""
        graph = self._graph()
        graph.set_ef(max(self.hnsw_ef, k))
        labels, distances = graph.knn_query(q, k=k)  # hnswlib's "ip" distance is 1 - dot
        return labels.astype(np.int64), (1.0 - distances).astype(np.float32)

    def _graph(self):
        """hnswlib's index over every stored row (rows added since it was built are inserted now)."""
        try:
            import hnswlib
        except ImportError as e:
            raise SentenceIndexError(
                f"searching more than {self.exact_below} items approximately needs hnswlib: pip install hnswlib "
                "(or ctxrep[analysis]), or search with exact=True"
            ) from e
        vectors = self.vectors
        if self._hnsw is None:
            self._hnsw = hnswlib.Index(space="ip", dim=self.dim)
            self._hnsw.init_index(
                max_elements=max(len(vectors), 1),
                ef_construction=self.hnsw_ef_construction,
                M=self.hnsw_m,
                random_seed=100,
            )
            self._hnsw_rows = 0
        if self._hnsw_rows < len(vectors):
            self._hnsw.resize_index(max(len(vectors), self._hnsw.get_max_elements()))
            new = np.arange(self._hnsw_rows, len(vectors))
            self._hnsw.add_items(vectors[new], new)
            self._hnsw_rows = len(vectors)
        return self._hnsw

    # ---- queries as text ----------------------------------------------------------------------------

    def featurizer(self):
        """The Featurizer that embeds text queries (built from the spec, with `runtime`, on first use)."""
        if self._featurizer is None:
            if self.spec is None:
                raise SentenceIndexError(
                    "this index was built from bare vectors and does not know which model made them: search it with "
                    "vectors, or pass spec={'model': ...} (a FeaturizerSpec) when you build it"
                )
            from ctxrep.featurize import Featurizer

            self._featurizer = Featurizer(**self.spec.featurizer_kwargs(), **self.runtime)
        return self._featurizer

    def use_featurizer(self, featurizer) -> SentenceIndex:
        """Embed text queries with `featurizer` (a ready ctxrep.Featurizer), after checking that it makes the
        stored vectors (SpecMismatch names each setting that differs)."""
        asked = FeaturizerSpec.of(featurizer)
        if self.spec is not None:
            self.spec.check(asked, "this index", "load it without a featurizer to embed queries as it was built")
        if featurizer.sentence_dim != self.dim and (self.dimensions is None or featurizer.sentence_dim < self.dim):
            raise SentenceIndexError(
                f"the featurizer gives {featurizer.sentence_dim}-wide vectors but the index holds {self.dim}-wide ones"
            )
        self._featurizer = featurizer
        return self

    def _embed(self, texts: list[str], prompt: str | None = None, prompt_name: str | None = None) -> np.ndarray:
        out = self.featurizer().embed_sentences(
            texts, prompt=prompt, prompt_name=prompt_name, dimensions=self.dimensions
        )
        if out.ndim != 2:
            raise SentenceIndexError(f"the featurizer gives {out.shape[1:]} per text; a sentence index needs one layer")
        if out.shape[1] != self.dim:
            raise SentenceIndexError(
                f"the featurizer gives {out.shape[1]}-wide vectors but the index holds {self.dim}-wide ones"
            )
        return out

    # ---- save / load --------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write index.json, vectors.npy (binary/ and rescore/ for a binary index), items.jsonl (and hnsw.bin above
        exact_below) into the folder `path`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.binary is not None:
            if len(self) < 2 and self.binary.rescore is Rescore.INT8:
                raise SentenceIndexError(
                    f"a binary index rescored by int8 needs at least 2 rows for its int8 ranges, it has {len(self)}"
                )
            self._codes().save(path)
            (path / "vectors.npy").unlink(missing_ok=True)  # from an earlier save as a float index
        else:
            np.save(path / "vectors.npy", self.vectors)
        with open(path / "items.jsonl", "w", encoding="utf-8") as f:
            for i, t in zip(self.ids, self.texts):
                f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
        graph = None
        if len(self) > self.exact_below and self.binary is None:
            self._graph().save_index(str(path / "hnsw.bin"))
            graph = "hnsw.bin"
        elif (path / "hnsw.bin").exists():
            (path / "hnsw.bin").unlink()  # a stale graph from an earlier, larger save
        meta = {
            "format": "ctxrep-sentence-index",
            "version": FORMAT_VERSION,
            "metric": self.metric,
            "dim": self.dim,
            "count": len(self),
            "spec": None if self.spec is None else self.spec.to_dict(),
            "exact_below": self.exact_below,
            "hnsw": {"M": self.hnsw_m, "ef_construction": self.hnsw_ef_construction, "ef": self.hnsw_ef, "file": graph},
            "dimensions": self.dimensions,
            "document_prompt": {"prompt": self.document_prompt, "prompt_name": self.document_prompt_name},
            "binary": None if self.binary is None else self.binary.to_json(),
        }
        (path / "index.json").write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, featurizer=None, runtime: dict | None = None) -> SentenceIndex:
        """Read a folder written by `save`. `featurizer`: a ready ctxrep.Featurizer for text queries, checked against
        the saved spec (SpecMismatch when it would make other vectors); else one is built from the spec on the first
        text query, with `runtime` (e.g. {"device": "cuda"})."""
        path = Path(path)
        meta_file = path / "index.json"
        if not meta_file.is_file():
            raise SentenceIndexError(
                f"{path}: not a sentence index (no index.json); build one with `ctxrep index build`"
            )
        try:
            meta = json.loads(meta_file.read_text())
            if meta.get("format") != "ctxrep-sentence-index":
                raise KeyError("format")
            hnsw = meta["hnsw"]
            binary = meta.get("binary")  # absent in indexes written before compact vectors and prompts
            document = meta.get("document_prompt") or {}
            spec = meta.get("spec", meta.get("featurizer"))  # "featurizer": the Featurizer kwargs older ctxrep saved
            index = cls(
                meta["dim"],
                meta["metric"],
                spec=FeaturizerSpec.from_dict(spec, str(meta_file)) if spec else None,
                runtime=runtime,
                exact_below=meta["exact_below"],
                hnsw_m=hnsw["M"],
                hnsw_ef_construction=hnsw["ef_construction"],
                hnsw_ef=hnsw["ef"],
                dimensions=meta.get("dimensions"),
                binary=Binary.from_json(binary) if binary else None,
                document_prompt=document.get("prompt"),
                document_prompt_name=document.get("prompt_name"),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SentenceIndexError(
                f"{meta_file}: not written by SentenceIndex.save ({type(e).__name__}: {e})"
            ) from None
        try:
            if index.binary is not None:
                index._binary = BinaryIndex.load(path)
                shape = (len(index._binary), index._binary.dim)
            else:
                vectors = np.load(path / "vectors.npy", allow_pickle=False)
                shape = vectors.shape
        except (OSError, ValueError) as e:
            what = "binary/ or rescore/" if index.binary is not None else "vectors.npy"
            raise SentenceIndexError(f"{path}: {what} missing or unreadable ({e}); build the index again") from None
        ids, texts = [], []
        items = path / "items.jsonl"
        if not items.is_file():
            raise SentenceIndexError(f"{items}: missing; build the index again")
        with open(items, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                try:
                    item = json.loads(line)
                    ids.append(item["id"])
                    texts.append(item["text"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise SentenceIndexError(
                        f'{items}:{n}: not an {{"id", "text"}} line; build the index again'
                    ) from None
        if shape != (meta["count"], meta["dim"]) or len(ids) != meta["count"]:
            raise SentenceIndexError(
                f"{path}: index.json says {meta['count']} x {meta['dim']} but the vectors are {shape} and "
                f"items.jsonl has {len(ids)} lines; the folder was changed: build the index again"
            )
        if index.binary is None:
            index._vectors = vectors.astype(np.float32, copy=False)
        index.ids, index.texts, index._id_set = ids, texts, set(ids)
        graph_file = hnsw.get("file")
        if graph_file and (path / graph_file).is_file():
            import hnswlib

            graph = hnswlib.Index(space="ip", dim=index.dim)
            graph.load_index(str(path / graph_file), max_elements=len(vectors))
            index._hnsw, index._hnsw_rows = graph, len(vectors)
        if featurizer is not None:
            index.use_featurizer(featurizer)
        return index


@dataclass
class Texts:
    """Texts read from a file, with their ids (the id column, or the 0-based text number) and 1-based lines."""

    texts: list[str]
    ids: list
    lines: list[int]


def read_texts(
    path: str | os.PathLike,
    format: str | None,
    text_column: str | int = "text",
    id_column: str | int | None = None,
    header: bool | None = None,
) -> Texts:
    """Texts to index or queries: a plain text file (one text per line) or a CSV / TSV / JSONL file with a text
    column and optionally an id column; without one, ids are the texts' 0-based positions, as `SentenceIndex.build`
    numbers them. CSV / TSV / JSONL are read by ctxrep.data.table: a column is a header name or a number counted
    from 1 (-1: the last), and `header` says whether the first row names the columns (None: yes when a column is
    given by name; with every column a number, refused). A missing column, an empty text or a repeated id stops
    with `FILE:LINE: what is wrong`."""
    from ctxrep.data.table import detect_format, field_of, numbered_lines, table_rows, text_of

    path = Path(path)
    if format is None:
        name = path.name.lower().removesuffix(".gz")
        known = (".csv", ".tsv", ".tab", ".jsonl", ".ndjson")
        format = detect_format(path, None) if Path(name).suffix in known else "text"
    out = Texts([], [], [])
    if format == "text" and header is not None:
        raise ValueError(f"{path}: --header / --no-header apply to CSV and TSV files; a text file has no header")
    if format == "text":
        for line, raw in numbered_lines(path):
            text = raw.rstrip("\r\n")
            if not text.strip():
                raise ValueError(f"{path}:{line}: empty line; give one text per line (remove the blank line)")
            out.ids.append(len(out.texts))
            out.texts.append(text)
            out.lines.append(line)
    else:
        columns, rows = table_rows(path, format, header, {"--text-column": text_column, "--id-column": id_column})
        first_line: dict = {}
        for line, row in rows:
            value = field_of(path, line, row, columns, text_column, "--text-column")
            text = text_of(path, line, value, "--text-column", text_column)
            if id_column is not None:
                value = field_of(path, line, row, columns, id_column, "--id-column")
                if isinstance(value, str):
                    value = value.strip()
                if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
                    raise ValueError(
                        f"{path}:{line}: the id column {id_column!r} (--id-column) holds {value!r}; ids are "
                        "non-empty strings or integers"
                    )
                if value in first_line:
                    raise ValueError(
                        f"{path}:{line}: id {value!r} was already used on line {first_line[value]}; ids must be unique"
                    )
                first_line[value] = line
            else:
                value = len(out.texts)
            out.texts.append(text)
            out.ids.append(value)
            out.lines.append(line)
    if not out.texts:
        raise ValueError(f"{path}: no texts in the file; is it the right file (and --format)?")
    return out
