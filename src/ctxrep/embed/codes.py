"""The precision `ctxrep embed` writes sentence vectors in (`--output-precision`): float32, or the codes of
sentence-transformers' quantize_embeddings (ctxrep.vectors.quantize.quantize, bit for bit).

    int8 / uint8     one byte a dimension on per-dimension ranges (2, dim) = (min_j, max_j)
    binary / ubinary the signs, packed 8 to a byte (no ranges)

A streaming run writes shards before it has seen every text, so it cannot take its ranges from all the vectors as
quantize_embeddings does on one array. Its ranges are fixed before the first code is written and recorded in the
manifest's `quantization` (with where they came from), so every shard, a resumed run and a later query use one grid:
  - `--calibration FILE`: a .npy of float vectors (their per-dimension minimum and maximum; a (2, dim) array of
    ranges gives itself back), or the ranges an earlier int8 / uint8 run recorded (its folder or manifest.json, or a
    QuantizedVectors.save folder or its quantization.json);
  - else the vectors of the first shard (its `--shard-size` texts), embedded before it is written: shard 0's codes are
    then exactly quantize_embeddings(shard 0's vectors); later vectors outside its ranges are clipped to 0 / 255.
Worker processes start with the ranges fixed: several workers need `--calibration` or a resumed folder's ranges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctxrep.vectors.quantize import PRECISIONS, QUANTIZATION_FILE, calibration_ranges, quantize
from ctxrep.vectors.store import MANIFEST

RANGED = ("int8", "uint8")  # the precisions that need calibration ranges


@dataclass
class OutputCodes:
    """What turns a shard's float vectors into what is written: the precision and, for int8 / uint8, the ranges
    (None until calibrated on the first shard) and where they came from (`calibration`, recorded in the manifest)."""

    precision: str = "float32"
    ranges: np.ndarray | None = None
    calibration: dict | None = None

    @property
    def quantized(self) -> bool:
        return self.precision != "float32"

    def encode(self, vectors: np.ndarray, shard: int) -> np.ndarray:
        """The codes of shard `shard`'s (texts, dim) float vectors; shard 0 calibrates the ranges where none are
        fixed yet."""
        if not self.quantized:
            return vectors
        if self.precision in RANGED and self.ranges is None:
            if shard != 0:  # the run fixes the ranges before it hands out any other shard
                raise RuntimeError(f"shard {shard} reached without {self.precision} ranges; the run fixes them first")
            if len(vectors) < 2:
                raise ValueError(
                    f"--output-precision {self.precision} takes its ranges from the first shard, which holds "
                    f"{len(vectors)} text; give --calibration FILE (a .npy of sample vectors) or a larger input"
                )
            self.ranges = calibration_ranges(vectors)
            self.calibration = {"source": "shard 0", "texts": len(vectors)}
        if self.ranges is not None and self.ranges.shape[1] != vectors.shape[1]:
            raise ValueError(
                f"--calibration: its ranges are {self.ranges.shape[1]} wide but the vectors are {vectors.shape[1]} "
                "wide (after --dimensions); give calibration vectors of the output's width"
            )
        return quantize(vectors, self.precision, ranges=self.ranges).codes

    def row_shape(self, float_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one stored row for float rows of `float_shape` ((dim,): sentence vectors of one layer)."""
        if self.precision in ("binary", "ubinary"):
            return ((float_shape[-1] + 7) // 8,)
        return tuple(float_shape)

    def record(self, dim: int | None) -> dict | None:
        """The manifest's `quantization` (None for float32): precision, float width, ranges and their source."""
        if not self.quantized:
            return None
        record: dict = {"precision": self.precision, "dim": dim}
        if self.ranges is not None:
            record["ranges"] = self.ranges.tolist()  # float32 values, exact as JSON floats
            record["calibration"] = self.calibration
        return record


def output_codes(precision: str, calibration: str | None, recorded: dict | None, where: str) -> OutputCodes:
    """The codes of a run at `precision`: the ranges `recorded` in its folder's manifest (a resumed run), else those
    of the `calibration` file, else none yet (int8 / uint8: the first shard's). A `calibration` whose ranges differ
    from the recorded ones is refused in one line (`where`: the folder)."""
    if precision not in PRECISIONS:
        raise ValueError(f"--output-precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if calibration is not None and precision not in RANGED:
        raise ValueError(f"--calibration gives int8 / uint8 ranges; --output-precision {precision} takes none")
    codes = OutputCodes(precision)
    if precision not in RANGED:
        return codes
    if calibration is not None:
        codes.ranges, codes.calibration = read_calibration(calibration)
    if recorded is not None and recorded.get("ranges") is not None:
        ranges = np.asarray(recorded["ranges"], dtype=np.float32)
        if codes.ranges is not None and not np.array_equal(codes.ranges, ranges):
            raise ValueError(
                f"--calibration {calibration}: other ranges than the ones {where}'s shards were written with "
                f"(its manifest's quantization, from {recorded.get('calibration')}); leave --calibration out to "
                "resume with those, or use another --out"
            )
        codes.ranges, codes.calibration = ranges, recorded.get("calibration")
    return codes


def read_calibration(path: str) -> tuple[np.ndarray, dict]:
    """(ranges (2, dim) float32, where they came from) of a --calibration FILE; see the module docstring."""
    file = Path(path)
    if file.is_dir():
        file = file / MANIFEST if (file / MANIFEST).is_file() else file / QUANTIZATION_FILE
    if file.suffix == ".npy":
        try:
            vectors = np.load(file)
        except (OSError, ValueError) as e:
            raise ValueError(f"--calibration {path}: not a readable .npy file ({e})") from None
        if vectors.ndim != 2 or not np.issubdtype(vectors.dtype, np.floating):
            raise ValueError(
                f"--calibration {path}: a (vectors, dim) float array is needed, got {vectors.dtype} {vectors.shape}"
            )
        source = {"file": str(file.resolve()), "vectors": len(vectors)}
        return calibration_ranges(vectors), source  # a (2, dim) ranges array: min / max of its rows are itself
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"--calibration {path}: give a .npy of vectors or an int8 / uint8 embed folder ({type(e).__name__}: {e})"
        ) from None
    record = data.get("quantization", data) if isinstance(data, dict) else None  # a manifest, or quantization.json
    if not isinstance(record, dict) or record.get("ranges") is None:
        raise ValueError(f"--calibration {path}: {file} records no int8 / uint8 ranges")
    ranges = np.asarray(record["ranges"], dtype=np.float32)
    if ranges.ndim != 2 or ranges.shape[0] != 2:
        raise ValueError(f"--calibration {path}: ranges must be (2, dim), got {ranges.shape}")
    return ranges, {"file": str(file.resolve()), "ranges_of": record.get("precision")}
