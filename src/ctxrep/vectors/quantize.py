"""Compact sentence vectors: fewer dimensions (Matryoshka truncation) and fewer bits per dimension.

    truncate(v, dimensions)          the first `dimensions` coordinates, then L2-normalised (OpenAI's `dimensions`)
    quantize(v, precision, ...)      sentence-transformers' quantize_embeddings, bit for bit:
        int8 / uint8   per dimension j, with ranges (2, dim) = (min_j, max_j) over calibration vectors:
                       step_j = (max_j - min_j) / 255 (1 where 0), q = clip(floor((v - min_j) / step_j), 0, 255),
                       uint8 = q, int8 = q - 128
        ubinary        np.packbits(v > 0) per row: ceil(dim / 8) bytes, first dimension in the high bit
        binary         ubinary - 128 as int8
    The ranges are part of the result (QuantizedVectors.ranges) and saved beside the codes, so a query or a later
    batch is quantized on the same grid; `dequantize` maps int8 / uint8 codes back to the grid point
    min_j + q * step_j (sentence-transformers' `_dequantize_embeddings`, in float64, then float32), for rescoring in the float query's space.

BinaryIndex: ubinary codes searched by Hamming distance, the best `rescore_multiplier` x k candidates rescored
exactly by the float query's dot product with the candidates' int8 (dequantized) or float vectors (`Rescore`);
its `search` answers with Hits (ctxrep.vectors.hits), as every index. `Binary` is SentenceIndex's option for such an
index: what rescores the candidates and how many.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from ctxrep.util.arrays import normalize_rows
from ctxrep.vectors.hits import Hits

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
QUANTIZATION_FILE = "quantization.json"
CODES_FILE = "codes.npy"


def _as_matrix(vectors, what: str = "vectors") -> np.ndarray:
    v = np.asarray(vectors)
    if v.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (texts, dim), got shape {v.shape}")
    if not np.issubdtype(v.dtype, np.floating):
        raise ValueError(f"{what} must be float vectors to quantize, got dtype {v.dtype}")
    return v


def truncate(vectors, dimensions: int | None, normalize: bool = True) -> np.ndarray:
    """The first `dimensions` coordinates of each row (all when None), L2-normalised when `normalize` (a zero row
    stays zero). More dimensions than the vectors have is a one-line ValueError."""
    v = _as_matrix(vectors)
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) or dimensions < 1:
            raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
        if dimensions > v.shape[1]:
            raise ValueError(
                f"dimensions={dimensions} is more than the vectors' {v.shape[1]}; give at most {v.shape[1]}"
            )
        v = v[:, :dimensions]
    return normalize_rows(v) if normalize else np.ascontiguousarray(v, dtype=np.float32)


def calibration_ranges(vectors) -> np.ndarray:
    """(2, dim) float32: each dimension's minimum and maximum over `vectors` (at least two rows)."""
    v = _as_matrix(vectors, "calibration vectors")
    if len(v) < 2:
        raise ValueError(
            f"int8 / uint8 ranges need at least 2 calibration vectors, got {len(v)}; give ranges= from an earlier "
            "quantization or more vectors"
        )
    return np.vstack((v.min(axis=0), v.max(axis=0))).astype(np.float32)


@dataclass
class QuantizedVectors:
    """Codes and what is needed to read them: the precision, the float width and, for int8 / uint8, the ranges."""

    codes: np.ndarray  # (texts, dim) int8/uint8; (texts, ceil(dim / 8)) binary/ubinary; float32 for "float32"
    precision: str
    dim: int
    ranges: np.ndarray | None = None  # (2, dim) float32 for int8 / uint8

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes)

    def save(self, folder: str | Path) -> Path:
        """codes.npy + quantization.json (precision, dim, ranges) in `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / CODES_FILE, self.codes)
        meta = {"precision": self.precision, "dim": self.dim}
        if self.ranges is not None:
            meta["ranges"] = self.ranges.tolist()
        (folder / QUANTIZATION_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> QuantizedVectors:
        folder = Path(folder)
        meta_file = folder / QUANTIZATION_FILE
        if not meta_file.is_file():
            raise FileNotFoundError(f"{meta_file}: missing; {folder} was not written by QuantizedVectors.save")
        meta = json.loads(meta_file.read_text())
        if meta.get("precision") not in PRECISIONS:
            raise ValueError(f"{meta_file}: precision {meta.get('precision')!r} is not one of {', '.join(PRECISIONS)}")
        codes = np.load(folder / CODES_FILE, mmap_mode="r" if mmap else None)
        ranges = np.asarray(meta["ranges"], dtype=np.float32) if "ranges" in meta else None
        return cls(codes, meta["precision"], int(meta["dim"]), ranges)


def quantize(
    vectors, precision: str, ranges: np.ndarray | None = None, calibration: np.ndarray | None = None
) -> QuantizedVectors:
    """Codes of float `vectors` at `precision` (see the module docstring). int8 / uint8 take their ranges from
    `ranges`, else from `calibration` vectors, else from `vectors` themselves."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    v = _as_matrix(vectors)
    dim = v.shape[1]
    if precision == "float32":
        return QuantizedVectors(v.astype(np.float32), precision, dim)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(v > 0, axis=-1)
        return QuantizedVectors(packed if precision == "ubinary" else (packed - 128).astype(np.int8), precision, dim)
    if ranges is None:
        ranges = calibration_ranges(calibration if calibration is not None else v)
    ranges = np.asarray(ranges, dtype=np.float32)
    if ranges.shape != (2, dim):
        raise ValueError(f"ranges must have shape (2, {dim}) (minimum and maximum per dimension), got {ranges.shape}")
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    q = np.clip(np.floor((v - starts) / steps), 0, 255)
    codes = q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)
    return QuantizedVectors(codes, precision, dim, ranges)


def dequantize(quantized: QuantizedVectors) -> np.ndarray:
    """Float32 vectors on the int8 / uint8 grid (min_j + q * step_j), or the float32 codes themselves."""
    if quantized.precision == "float32":
        return np.asarray(quantized.codes, dtype=np.float32)
    if quantized.ranges is None:
        raise ValueError(f"{quantized.precision} codes have no ranges to map back; only int8 / uint8 dequantize")
    q = quantized.codes.astype(np.float64) + (128 if quantized.precision == "int8" else 0)
    starts = quantized.ranges[0]
    steps = (quantized.ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    return (q * steps + starts).astype(np.float32)


def hamming(query_codes: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """(queries, rows) Hamming distances between packed ubinary codes (queries, bytes) and (rows, bytes)."""
    query_words, words = _as_words(query_codes), _as_words(codes)
    out = np.empty((len(query_codes), len(codes)), dtype=np.uint32)
    for i, q in enumerate(query_words):
        out[i] = np.bitwise_count(np.bitwise_xor(words, q)).sum(axis=1, dtype=np.uint32)
    return out


def _as_words(codes: np.ndarray) -> np.ndarray:
    """Packed codes as 64-bit words where the row length allows (popcount per word: 4x faster than per byte)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    return codes.view(np.uint64) if codes.shape[1] % 8 == 0 else codes


class Rescore(StrEnum):
    """The vectors a binary index keeps to rescore its Hamming candidates: int8 codes (dim bytes a row, on the
    ranges' grid) or the float32 vectors themselves (exact, 4 x dim bytes a row). The values are index.json's."""

    INT8 = "int8"
    FLOAT32 = "float32"

    @classmethod
    def of(cls, value: Rescore | str, where: str = "rescore") -> Rescore:
        """`value` as a Rescore; the old strings "int8" / "float32" are accepted until 0.3 with a
        DeprecationWarning, anything else is a one-line ValueError."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in cls._value2member_map_:
            warnings.warn(
                f"{where}={value!r} is now {where}=Rescore.{cls(value).name} (ctxrep.vectors.quantize.Rescore); "
                "the string goes in 0.3",
                DeprecationWarning,
                stacklevel=3,
            )
            return cls(value)
        raise ValueError(
            f"{where} must be Rescore.INT8 or Rescore.FLOAT32 (ctxrep.vectors.quantize.Rescore), got {value!r}"
        )


@dataclass(frozen=True)
class Binary:
    """SentenceIndex's binary codes: ubinary codes (dim / 8 bytes a row) searched by Hamming distance, the best
    `rescore_multiplier` x k candidates rescored with `rescore` vectors. Saved in index.json as
    {"rescore": "int8" | "float32", "rescore_multiplier": N}."""

    rescore: Rescore = Rescore.INT8
    rescore_multiplier: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.rescore, Rescore):
            raise ValueError(
                f"Binary.rescore must be Rescore.INT8 or Rescore.FLOAT32 (ctxrep.vectors.quantize.Rescore), got "
                f"{self.rescore!r}"
            )
        m = self.rescore_multiplier
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"rescore_multiplier must be a positive integer, got {m!r}")

    def to_json(self) -> dict:
        return {"rescore": self.rescore.value, "rescore_multiplier": int(self.rescore_multiplier)}

    @classmethod
    def from_json(cls, meta: dict) -> Binary:
        """index.json's "binary" entry (rescore_multiplier 4 where an older index left it out)."""
        return cls(Rescore(meta["rescore"]), meta.get("rescore_multiplier", 4))


class BinaryIndex:
    """Search by the Hamming distance of ubinary codes, then rescore the best candidates exactly.

    vectors: (rows, dim) float sentence vectors (normalised: scores are dot products = cosines). What stays in
    memory: the codes (dim / 8 bytes a row) and the rescoring vectors, int8 (dim bytes a row, Rescore.INT8) or
    the float32 vectors (Rescore.FLOAT32).
    """

    def __init__(self, codes: np.ndarray, rescore: QuantizedVectors) -> None:
        """codes: (rows, ceil(dim / 8)) ubinary codes; rescore: the same rows' int8 or float32 vectors."""
        if len(codes) != len(rescore.codes) or codes.shape[1] != (rescore.dim + 7) // 8:
            raise ValueError(f"{codes.shape} binary codes do not fit {rescore.codes.shape} rescoring vectors")
        self.dim, self.codes, self.rescore = rescore.dim, codes, rescore

    @classmethod
    def build(cls, vectors, rescore: Rescore = Rescore.INT8, calibration: np.ndarray | None = None) -> BinaryIndex:
        """The index of float `vectors`; int8 rescoring ranges from `calibration` (default: the vectors)."""
        rescore = Rescore.of(rescore)
        v = _as_matrix(vectors)
        return cls(quantize(v, "ubinary").codes, quantize(v, rescore.value, calibration=calibration))

    def __len__(self) -> int:
        return len(self.codes)

    def save(self, folder: str | Path) -> Path:
        """binary/ (the ubinary codes) and rescore/ (the rescoring vectors and their ranges) in `folder`."""
        folder = Path(folder)
        QuantizedVectors(self.codes, "ubinary", self.dim).save(folder / "binary")
        self.rescore.save(folder / "rescore")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> BinaryIndex:
        """An index written by `save`: the codes read into memory, the rescoring vectors memory-mapped (only the
        candidates' rows are read from disk)."""
        folder = Path(folder)
        codes = QuantizedVectors.load(folder / "binary", mmap=False)
        if codes.precision != "ubinary":
            raise ValueError(f"{folder / 'binary'}: expected ubinary codes, found {codes.precision}")
        return cls(np.asarray(codes.codes), QuantizedVectors.load(folder / "rescore", mmap=True))

    @property
    def nbytes(self) -> int:
        """Bytes of the codes plus the rescoring vectors."""
        return int(self.codes.nbytes + self.rescore.nbytes)

    def search(self, queries, k: int = 10, rescore_multiplier: int = 4) -> Hits | list[Hits]:
        """The k best rows of each query, best first: the k x rescore_multiplier nearest codes by Hamming distance,
        rescored by the float query's dot product with their int8 (dequantized) or float vectors. One Hits for one
        query vector (dim,), a list of Hits for (n, dim) queries; ids are the rows (0-based), texts None."""
        q = np.asarray(queries)
        scores, rows = self._top(q[None, :] if q.ndim == 1 else q, k, rescore_multiplier)
        hits = [Hits(r.tolist(), [None] * len(r), s, r) for s, r in zip(scores, rows)]
        return hits[0] if q.ndim == 1 else hits

    def search_arrays(self, queries, k: int = 10, rescore_multiplier: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """Deprecated: the (scores, rows) arrays (queries, k) that `search` returned before it answered with Hits,
        as every index does; goes in 0.3."""
        warnings.warn(
            "BinaryIndex.search answers with Hits (ids, texts, scores, rows), as every index; search_arrays, which "
            "gives the old (scores, rows) arrays, goes in 0.3: use np.stack([h.rows for h in hits]) and h.scores",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._top(queries, k, rescore_multiplier)

    def _top(self, queries, k: int, rescore_multiplier: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of each query's k best rows, (queries, k) each, best first."""
        q = _as_matrix(queries, "queries")
        if q.shape[1] != self.dim:
            raise ValueError(f"queries are {q.shape[1]} wide but the index holds {self.dim}-wide vectors")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if isinstance(rescore_multiplier, bool) or not isinstance(rescore_multiplier, (int, np.integer)):
            raise ValueError(f"rescore_multiplier must be a positive integer, got {rescore_multiplier!r}")
        if rescore_multiplier < 1:
            raise ValueError(f"rescore_multiplier must be at least 1, got {rescore_multiplier}")
        k = min(int(k), len(self))
        if k == 0:
            return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
        n_candidates = min(len(self), k * rescore_multiplier)
        distances = hamming(np.packbits(q > 0, axis=-1), self.codes)
        if n_candidates < len(self):
            candidates = np.argpartition(distances, n_candidates - 1, axis=1)[:, :n_candidates]
        else:
            candidates = np.broadcast_to(np.arange(len(self)), (len(q), len(self)))
        scores = np.empty((len(q), k), dtype=np.float32)
        rows = np.empty((len(q), k), dtype=np.int64)
        for i, cand in enumerate(candidates):
            part = QuantizedVectors(self.rescore.codes[cand], self.rescore.precision, self.dim, self.rescore.ranges)
            s = dequantize(part) @ q[i].astype(np.float32)
            best = np.argsort(-s, kind="stable")[:k]
            scores[i], rows[i] = s[best], cand[best]
        return scores, rows
