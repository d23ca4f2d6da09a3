"""The shard folder of `ctxrep embed`, both halves: `write_arrays` / `write_manifest` write it (the embedding jobs
call them), `load_vectors(DIR)` reads it, memory-mapped, one array per input text.

    vectors = load_vectors("out/")
    len(vectors)            # texts
    vectors[0]              # (words, dim) or (words, layers, dim) for word level; (dim,) or (layers, dim) for sentences
                            # (chunks, dim) for `ctxrep embed --chunks` (vectors.chunked; index().word: chunk number)
    vectors.row_shape       # the shape of one row: (dim,) or (layers, dim)
    vectors.words(0)        # the words of text 0, as embedded (word level)
    vectors.line(0)         # the 1-based input line where text 0 starts
    vectors.index()         # every row: text, line, word, token (numpy arrays)
    vectors.array           # every row in one in-memory array (reads all shards)
    vectors.spec            # the FeaturizerSpec that made them (ctxrep.featurize.spec)
    vectors.precision       # "float32", or "int8" / "uint8" / "binary" / "ubinary" (`ctxrep embed --output-precision`):
                            # then the rows are sentence-transformers' codes, `vectors.ranges` the int8 / uint8 grid
    vectors.quantized()     # QuantizedVectors(codes, precision, dim, ranges); quantize.dequantize(it) -> float32
    (`ctxrep embed --output sparse`: each text's row is a scipy.sparse (1, vocabulary) row, `array` a csr_matrix)
    for array in vectors: ...
    load_vectors("out/", expect=featurizer)   # SpecMismatch unless `featurizer` makes the same vectors

Each shard is mapped, not read: .npy shards with np.load(mmap_mode="r"); .safetensors shards by mapping the
tensor's bytes at the offset its header gives (safetensors' own layout: an 8-byte little-endian header length, a
JSON header, then the raw data), so that both storages give the same np.memmap and a text costs only its rows.
A folder of Parquet files written by `ctxrep embed --engine ray --storage parquet` is read too (`ctxrep.embed.ray_engine`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctxrep.featurize.spec import FeaturizerSpec, SpecMismatch

MANIFEST = "manifest.json"
INDEX_HEADER = "row\ttext\tline\tword\ttoken\n"


class VectorsError(ValueError):
    """A folder that is not (complete, readable) `ctxrep embed` output."""


@dataclass(frozen=True)
class VectorIndex:
    """One entry per vector row: its text (0-based), input line (1-based), word position (-1 for sentences)
    and word."""

    text: np.ndarray
    line: np.ndarray
    word: np.ndarray
    token: list[str]

    def __len__(self) -> int:
        return len(self.text)


@dataclass
class _Shard:
    file: Path
    index_file: Path
    first_text: int
    texts: int
    rows: int
    _vectors: np.ndarray | None = None
    _index: VectorIndex | None = None
    _starts: np.ndarray | None = None  # row where each of the shard's texts starts, plus the end


class Vectors:
    """The vectors of one `ctxrep embed` output folder; see the module docstring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest_file = self.path / MANIFEST
        if not self.path.is_dir():
            raise VectorsError(f"{self.path}: no such folder; pass the --out folder of a `ctxrep embed` run")
        manifest = read_manifest(self.path)
        if manifest is None:
            raise VectorsError(
                f"{self.path}: not the output of `ctxrep embed` (no manifest.json); pass the --out folder of an embed run"
            )
        try:
            settings, shards, self.dim = manifest["settings"], manifest["shards"], int(manifest["dim"])
        except (KeyError, TypeError, ValueError) as e:
            raise VectorsError(
                f"{manifest_file}: not a manifest written by `ctxrep embed` ({type(e).__name__}: {e}); "
                "run ctxrep embed again into an empty folder"
            ) from None
        self.manifest = manifest
        self.settings: dict = settings
        self.level: str = settings.get("level", "word")
        head = manifest.get("spec", {}).get("head") if isinstance(manifest.get("spec"), dict) else None
        # rows are scipy.sparse (1, vocabulary) rows: the spec's head says so (an older manifest's settings "output")
        self.sparse = head == "sparse" or settings.get("output") == "sparse"
        # `ctxrep embed --output-precision`: the rows are quantize_embeddings' codes; their precision and ranges
        quantization = manifest.get("quantization")
        self.quantization: dict | None = quantization if isinstance(quantization, dict) else None
        self.precision: str = self.quantization["precision"] if self.quantization else "float32"
        # `ctxrep embed --chunks`: sentence vectors, one row per chunk of a text (index: the chunk's number as `word`)
        self.chunked = settings.get("chunks") is not None
        self.complete = bool(manifest.get("complete"))
        if not self.complete:
            warnings.warn(
                f"{self.path}: an unfinished `ctxrep embed` run ({sum(s['texts'] for s in shards)} texts in "
                f"{len(shards)} complete shards); run the same command again to finish it",
                stacklevel=3,
            )
        self.row_shape: tuple[int, ...] = tuple(manifest.get("row_shape") or [self.dim])
        self._shards: list[_Shard] = []
        first = 0
        for s in shards:
            if int(s.get("first_text", first)) != first:  # an unfinished run of several workers: a shard missing
                break  # before this one; only the texts before the gap are readable
            shard = _Shard(self.path / s["file"], self.path / s["index"], first, int(s["texts"]), int(s["rows"]))
            for f in (shard.file, shard.index_file):
                if not f.is_file():
                    raise VectorsError(
                        f"{f}: listed in {manifest_file} but missing; run ctxrep embed again into an empty folder"
                    )
            self._shards.append(shard)
            first += shard.texts
        self._firsts = [s.first_text for s in self._shards]
        self.num_texts = first

    @property
    def spec(self) -> FeaturizerSpec | None:
        """The settings that made these vectors (the manifest's `spec`; for a folder written before manifests kept
        one, read from the vector settings its `settings` then repeated); None when the folder does not say which
        model made them."""
        if "spec" in self.manifest:
            return FeaturizerSpec.from_dict(self.manifest["spec"], f"{self.path / MANIFEST}")
        if "model" in self.settings:
            return FeaturizerSpec.from_embed_settings(self.settings)
        return None

    @property
    def ranges(self) -> np.ndarray | None:
        """(2, dim) float32: the per-dimension minimum and maximum int8 / uint8 codes are on (None otherwise)."""
        if self.quantization is None or self.quantization.get("ranges") is None:
            return None
        return np.asarray(self.quantization["ranges"], dtype=np.float32)

    def quantized(self):
        """Every row as a ctxrep.vectors.quantize.QuantizedVectors: the codes (float32 vectors for a float32 folder),
        their precision, width and ranges; `ctxrep.vectors.quantize.dequantize(it)` maps int8 / uint8 codes back to
        float32 vectors on their grid. Reads every shard."""
        from ctxrep.vectors.quantize import QuantizedVectors

        if self.sparse:
            raise VectorsError(f"{self.path}: holds sparse vectors, which have no quantized form")
        return QuantizedVectors(self.array, self.precision, self.dim, self.ranges)

    def check(self, expect) -> None:
        """SpecMismatch unless `expect` (a FeaturizerSpec or a ctxrep.Featurizer) gives the vectors stored here."""
        asked = expect if isinstance(expect, FeaturizerSpec) else FeaturizerSpec.of(expect)
        written = self.spec
        if written is None:
            raise SpecMismatch(f"{self.path / MANIFEST}: records no featurizer, so it cannot be checked against one")
        written.check(asked, str(self.path), "embed again with the featurizer you want, into another --out folder")

    # ---- shape ------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.num_texts

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self._shards)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.row_shape))
        spec = self.spec
        model = spec.model if spec is not None else None
        return (
            f"Vectors({str(self.path)!r}, model={model!r}, texts={len(self)}, rows={self.num_rows}, "
            f"level={self.level!r}, row_shape={shape}"
            + (f", precision={self.precision!r})" if self.precision != "float32" else ")")
        )

    # ---- access -----------------------------------------------------------------------------------------

    def __getitem__(self, i: int) -> np.ndarray:
        """Text i's vectors: a read-only view into the mapped shard."""
        shard, t = self._locate(i)
        if self.level == "sentence" and not self.chunked:
            return self._vectors(shard)[t]
        starts = self._starts(shard)
        return self._vectors(shard)[starts[t] : starts[t + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]

    def words(self, i: int) -> list[str]:
        """The words of text i (word-level output), in the order of its vector rows."""
        if self.level != "word":
            raise VectorsError(f"{self.path}: holds sentence vectors, which keep no words; embed with --level word")
        shard, t = self._locate(i)
        starts = self._starts(shard)
        return self._index(shard).token[starts[t] : starts[t + 1]]

    def line(self, i: int) -> int:
        """The 1-based input line where text i starts."""
        shard, t = self._locate(i)
        return int(self._index(shard).line[self._starts(shard)[t]])

    def index(self) -> VectorIndex:
        """Every row of every shard (read from the index files; the vectors stay mapped)."""
        parts = [self._index(s) for s in self._shards]
        if not parts:
            empty = np.zeros(0, np.int64)
            return VectorIndex(empty, empty, empty, [])
        return VectorIndex(
            np.concatenate([p.text for p in parts]),
            np.concatenate([p.line for p in parts]),
            np.concatenate([p.word for p in parts]),
            [t for p in parts for t in p.token],
        )

    @property
    def array(self) -> np.ndarray:
        """Every row in one in-memory array, (rows, *row_shape), in index order. Reads every shard on each access:
        keep the result (`a = vectors.array`) rather than reading it in a loop."""
        if self.sparse:
            import scipy.sparse

            parts = [self._vectors(s) for s in self._shards]
            return scipy.sparse.vstack(parts, format="csr") if parts else scipy.sparse.csr_matrix((0, self.dim))
        if not self._shards:
            return np.zeros((0, *self.row_shape), np.float32)
        return np.concatenate([np.asarray(self._vectors(s)) for s in self._shards])

    # ---- internals --------------------------------------------------------------------------------------

    def _locate(self, i: int) -> tuple[_Shard, int]:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"Vectors index must be an integer text number, got {type(i).__name__}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"text {i} out of range: {self.path} holds {n} texts")
        i = int(i) % n
        k = bisect.bisect_right(self._firsts, i) - 1
        return self._shards[k], i - self._shards[k].first_text

    def _vectors(self, shard: _Shard) -> np.ndarray:
        if shard._vectors is None:
            if self.sparse:
                array = _read_sparse(shard.file)
            else:
                array = _map_npy(shard.file) if shard.file.suffix == ".npy" else _map_safetensors(shard.file)
            if "row_shape" not in self.manifest and array.shape[0]:  # written before manifests kept the row shape
                self.row_shape = tuple(array.shape[1:])
            if array.shape[0] != shard.rows or tuple(array.shape[1:]) != self.row_shape:
                raise VectorsError(
                    f"{shard.file}: {array.shape} does not match the manifest ({shard.rows} rows of {self.row_shape}); "
                    "the folder was changed after ctxrep embed wrote it: run it again into an empty folder"
                )
            shard._vectors = array
        return shard._vectors

    def _index(self, shard: _Shard) -> VectorIndex:
        if shard._index is None:
            shard._index = _read_index(shard.index_file, shard.rows)
        return shard._index

    def _starts(self, shard: _Shard) -> np.ndarray:
        if shard._starts is None:
            local = self._index(shard).text - shard.first_text
            # rows are grouped by text in order: text t's rows are [starts[t], starts[t + 1])
            shard._starts = np.searchsorted(local, np.arange(shard.texts + 1), side="left")
        return shard._starts


def _map_npy(file: Path) -> np.ndarray:
    try:
        return np.load(file, mmap_mode="r")
    except (ValueError, OSError) as e:
        raise VectorsError(
            f"{file}: not a readable .npy shard ({e}); run ctxrep embed again into an empty folder"
        ) from None


_SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "i1", "U8": "u1"}


def _map_safetensors(file: Path) -> np.ndarray:
    """The `vectors` tensor of a safetensors file as a read-only np.memmap (no copy)."""
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        entry = header["vectors"]
        dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
        raise VectorsError(
            f"{file}: not a safetensors shard with a float or int8 `vectors` tensor ({type(e).__name__}: {e}); "
            "run ctxrep embed again into an empty folder"
        ) from None
    if end - begin != int(np.prod(shape)) * np.dtype(dtype).itemsize:
        raise VectorsError(f"{file}: header says {shape} but holds {end - begin} bytes; the file is damaged")
    if begin == end:
        return np.zeros(shape, dtype)
    return np.memmap(file, dtype=dtype, mode="r", offset=8 + n + begin, shape=shape)


def _read_index(file: Path, rows: int) -> VectorIndex:
    text, line, word, token = [], [], [], []
    with open(file, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:5] != ["row", "text", "line", "word", "token"]:
            raise VectorsError(f"{file}: not an index written by ctxrep embed (header {header[:5]})")
        for n, raw in enumerate(f, start=2):
            values = raw.rstrip("\n").split("\t", 4)
            try:
                text.append(int(values[1]))
                line.append(int(values[2]))
                word.append(int(values[3]))
                token.append(values[4])
            except (IndexError, ValueError):
                raise VectorsError(
                    f"{file}:{n}: malformed index line; run ctxrep embed again into an empty folder"
                ) from None
    if len(text) != rows:
        raise VectorsError(f"{file}: {len(text)} index lines but the manifest lists {rows} rows; the folder is damaged")
    return VectorIndex(np.array(text, np.int64), np.array(line, np.int64), np.array(word, np.int64), token)


def load_vectors(path: str | Path, expect=None) -> Vectors:
    """Open the output folder of `ctxrep embed` (its --out): a `Vectors` with one array per input text, mapped from
    the shards (nothing is read until used).

        vectors = ctxrep.load_vectors("out/")
        len(vectors)         # number of texts
        vectors[i]           # text i: (words, dim) or (words, layers, dim) at word level;
                             #         (dim,) or (layers, dim) at sentence level; a read-only np.memmap view
        vectors.row_shape    # one row's shape: (dim,) or (layers, dim) with --layers all / a list
        vectors.words(i)     # text i's words (word level), one per row of vectors[i]
        vectors.line(i)      # the 1-based input line (or Parquet row) of text i
        vectors.index()      # every row's text, line, word position and word, as arrays
        vectors.array        # every row in one in-memory array (reads all shards)
        vectors.settings     # what the run read and how it laid out the shards (input, format, level, shard size)
        vectors.spec         # what made the vectors (FeaturizerSpec: model, revision, layers, pooling, precision, ...)
        vectors.precision    # float32, or the codes of `ctxrep embed --output-precision` (int8, uint8, binary, ubinary)
        vectors.quantized()  # QuantizedVectors: codes, precision, dim, ranges (dequantize() maps int8 back)

    expect: a ctxrep.Featurizer (or FeaturizerSpec) the caller means to compare these vectors with; a folder
    written with other settings raises SpecMismatch naming each field that differs.
    Raises VectorsError (a ValueError) for a folder that is not `ctxrep embed` output; warns for an unfinished run
    (run the same command again to finish it).
    """
    vectors = Vectors(path)
    if expect is not None:
        vectors.check(expect)
    return vectors


# ---- writing (the embedding jobs: ctxrep.embed.corpus, ctxrep.embed.ray_engine) ---------------------------------


def write_arrays(vectors: np.ndarray, index: list[tuple], k: int, texts: int, storage: str, out: Path) -> dict:
    """Write shard `k` (its vectors and one index entry (text, line, word, word) per row) under temporary names
    unique to this process, renamed when complete; returns its manifest entry. The index file is renamed last: its
    final name means the shard is whole."""
    name = f"shard-{k:05d}.{storage}"
    index_name = f"index-{k:05d}.tsv"
    tag = f".{os.getpid()}.tmp"
    tmp, index_tmp = out / (name + tag), out / (index_name + tag)
    if _is_sparse(vectors):  # `ctxrep embed --output sparse`: the CSR arrays of (texts, vocabulary)
        from safetensors.numpy import save_file

        from ctxrep.util.files import apply_umask

        csr = vectors.tocsr()
        arrays = {"indptr": csr.indptr.astype(np.int64), "indices": csr.indices.astype(np.int64)}
        arrays["values"] = csr.data.astype(np.float32)
        save_file(arrays, str(tmp), metadata={"shape": json.dumps(list(csr.shape))})
        apply_umask(tmp)
    elif storage == "safetensors":
        from safetensors.numpy import save_file

        from ctxrep.util.files import apply_umask

        save_file({"vectors": np.ascontiguousarray(vectors, dtype=_stored_dtype(vectors))}, str(tmp))
        apply_umask(tmp)  # safetensors writes 0600 whatever the umask
    else:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(vectors, dtype=_stored_dtype(vectors)))
    with open(index_tmp, "w", encoding="utf-8") as f:
        f.write(INDEX_HEADER)
        for row, (text, line, w, word) in enumerate(index):
            f.write(f"{row}\t{text}\t{line}\t{w}\t{word}\n")
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:16]
    os.replace(tmp, out / name)
    os.replace(index_tmp, out / index_name)
    return {
        "file": name,
        "index": index_name,
        "first_text": int(index[0][0]) if index else 0,
        "texts": texts,
        "rows": len(index),
        "first_line": int(index[0][1]) if index else 0,
        "sha256_16": digest,
    }


def _stored_dtype(vectors) -> np.dtype:
    """int8 / uint8 codes (`ctxrep embed --output-precision`) as they are; any float as float32."""
    dtype = np.asarray(vectors).dtype
    return dtype if dtype in (np.int8, np.uint8) else np.dtype(np.float32)


def _is_sparse(vectors) -> bool:
    return hasattr(vectors, "tocsr")  # a scipy.sparse matrix (SparseEncoder's output)


def _read_sparse(file: Path):
    """A sparse shard (indptr, indices, values; shape in the metadata) as a scipy.sparse.csr_matrix."""
    import scipy.sparse
    from safetensors import safe_open

    try:
        with safe_open(str(file), "np") as f:
            shape = tuple(json.loads(f.metadata()["shape"]))
            arrays = [f.get_tensor(k) for k in ("values", "indices", "indptr")]
        return scipy.sparse.csr_matrix(tuple(arrays), shape=shape, dtype=np.float32)
    except Exception as e:  # safetensors raises its own errors
        raise VectorsError(
            f"{file}: not a sparse shard ({type(e).__name__}: {e}); run ctxrep embed again into an empty folder"
        ) from None


def read_manifest(out: str | Path) -> dict | None:
    """OUT/manifest.json as `write_manifest` wrote it (settings, spec, shards, ...), or None when there is none;
    VectorsError for one that is not JSON with settings and shards."""
    file = Path(out) / MANIFEST
    if not file.is_file():
        return None
    try:
        manifest = json.loads(file.read_text())
        missing = [k for k in ("settings", "shards") if k not in manifest]  # what every manifest has
        if missing:
            raise KeyError(", ".join(missing))
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise VectorsError(
            f"{file}: not a manifest written by `ctxrep embed` ({type(e).__name__}: {e}); "
            "run ctxrep embed again into an empty folder"
        ) from None
    return manifest


def write_manifest(
    out: Path,
    settings: dict,
    shards: list[dict],
    row_shape: tuple[int, ...] | None,
    complete: bool,
    spec: FeaturizerSpec | None = None,
    extra: dict | None = None,
    dim: int | None = None,
) -> None:
    """Write OUT/manifest.json atomically: the run's settings (what it read and how it lays out the shards: input,
    format, level, shard size, storage), the spec of its vectors (model, layers, pooling, precision, ...: kept only
    there), the finished shards (in order) and, when complete, the totals. `extra`: further top-level entries a job
    records (`quantization`: the --output-precision codes' precision and ranges). `dim`: the vectors' width where a
    row is stored narrower (binary codes: dim / 8 bytes); default the row's last axis."""
    manifest: dict = {
        "settings": settings,
        "dim": dim if dim is not None else row_shape[-1] if row_shape else None,
        "row_shape": list(row_shape) if row_shape else None,
        "shards": shards,
        "complete": complete,
    }
    if spec is not None:
        manifest["spec"] = spec.to_dict()
    if extra:
        manifest.update(extra)
    if complete:
        manifest.update(texts=sum(s["texts"] for s in shards), rows=sum(s["rows"] for s in shards))
    file = Path(out) / MANIFEST
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, file)
