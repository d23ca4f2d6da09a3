"""Row-wise vector helpers shared by the featurizer, the vector store, the indexes and the server."""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def unit_rows(x: np.ndarray) -> np.ndarray:
    """x / max(||x||, eps) along the last axis (L2), in float64; zero rows stay zero."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), EPS)


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """x / max(||x||, eps) along the last axis (L2) as float32; zero rows stay zero."""
    return unit_rows(np.asarray(x, dtype=np.float32)).astype(np.float32)
