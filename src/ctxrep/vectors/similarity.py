"""Similarity of sentence vectors (or of texts, through a Featurizer): cosine or dot product.

    ctxrep.similarity(u, v)                          # two vectors -> a float
    ctxrep.similarity(U, V)                          # (n, d) and (m, d) -> (n, m), every row of U against every row of V
    ctxrep.similarity(U, V, pairwise=True)           # (n, d) and (n, d) -> (n,), row i against row i
    ctxrep.similarity("A cat sat .", ["A cat sat down .", "Stocks fell ."])   # texts: through Featurizer("minilm")
    ctxrep.similarity(texts_a, texts_b, featurizer=fz, pairwise=True)          # any featurizer's sentence vectors

cosine(u, v) = u . v / (max(||u||, eps) max(||v||, eps)), eps = 1e-12 (torch.nn.functional.normalize's); dot(u, v) = u . v.
A zero vector has cosine 0 with everything. Computed in float64, returned as float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ctxrep.util.arrays import unit_rows

METRICS = ("cosine", "dot")

__all__ = ["similarity", "sts_evaluate", "spearman", "pearson", "METRICS"]


def _is_texts(x) -> bool:
    if isinstance(x, str):
        return True
    return isinstance(x, Sequence) and not isinstance(x, np.ndarray) and len(x) > 0 and isinstance(x[0], str)


_FEATURIZERS: dict[str, object] = {}  # model name -> Featurizer: similarity(texts) loads a model once per process


def _featurizer(model):
    from ctxrep.featurize import Featurizer

    if isinstance(model, Featurizer):
        return model
    key = str(model)
    if key not in _FEATURIZERS:
        _FEATURIZERS.clear()  # keep one model in memory, not one per name ever asked
        _FEATURIZERS[key] = Featurizer(model)
    return _FEATURIZERS[key]


def _vectors(x, featurizer, side: str) -> tuple[np.ndarray, bool]:
    """(2-D float64 array, whether x was one item) from a vector, an array of rows, a text or a list of texts."""
    if _is_texts(x):
        single = isinstance(x, str)
        out = featurizer().embed_sentences([x] if single else list(x))
        if out.ndim != 2:
            raise ValueError(
                f"similarity needs one vector per text, but the featurizer returns {out.shape[1:]} per text (several "
                "layers); give it one layer or a ScalarMix"
            )
        return out.astype(np.float64), single
    array = np.asarray(x, dtype=np.float64) if not isinstance(x, np.ndarray) else x.astype(np.float64, copy=False)
    if array.ndim == 1:
        return array[None, :], True
    if array.ndim != 2:
        raise ValueError(
            f"similarity: {side} is a {array.ndim}-D array {array.shape}; give one vector (d,), rows of vectors (n, d), "
            "a text or a list of texts"
        )
    return array, False


def similarity(
    a,
    b,
    metric: str = "cosine",
    pairwise: bool = False,
    featurizer=None,
    model: str = "minilm",
) -> float | np.ndarray:
    """Cosine (or dot-product) similarity of `a` and `b`, each a vector (d,), rows (n, d), a text or a list of texts.

    Texts become sentence vectors through `featurizer` (a ctxrep.Featurizer: its layers, pooling and normalisation)
    or, without one, `Featurizer(model)` (loaded once per process and model; its sentence pooling is the one default,
    "auto": the folder's own pooling where it declares one). Two single items give a float; otherwise
    an (n, m) matrix of every row of a against every row of b, or with pairwise=True an (n,) array of a[i] against
    b[i]. A single item against rows gives (m,).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    fz_cache: list = []

    def get_featurizer():
        if not fz_cache:
            fz_cache.append(_featurizer(featurizer if featurizer is not None else model))
        return fz_cache[0]

    u, single_a = _vectors(a, get_featurizer, "a")
    v, single_b = _vectors(b, get_featurizer, "b")
    if u.shape[1] != v.shape[1]:
        raise ValueError(f"similarity: a's vectors are {u.shape[1]} wide but b's are {v.shape[1]}; use the same model")
    if metric == "cosine":
        u, v = unit_rows(u), unit_rows(v)
    if pairwise:
        if len(u) != len(v):
            raise ValueError(f"similarity(pairwise=True): a has {len(u)} rows but b has {len(v)}; give equal numbers")
        out = np.einsum("nd,nd->n", u, v)  # (n,)
        return float(out[0]) if single_a and single_b else out
    out = u @ v.T  # (n, m)
    if single_a and single_b:
        return float(out[0, 0])
    if single_a:
        return out[0]
    if single_b:
        return out[:, 0]
    return out


# ---- STS evaluation (SentEval, MTEB) ----------------------------------------------------------------------------


def pearson(x, y) -> float:
    """Pearson's r (scipy.stats.pearsonr); NaN when either sequence is constant (no correlation is defined)."""
    x, y = _paired(x, y, "pearson")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    from scipy import stats  # here: scipy.stats takes seconds to import, and searching an index needs none of it

    return float(stats.pearsonr(x, y).statistic)


def spearman(x, y) -> float:
    """Spearman's rho, Pearson's r of the average ranks (scipy.stats.spearmanr); NaN when either is constant."""
    x, y = _paired(x, y, "spearman")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    from scipy import stats

    return float(stats.spearmanr(x, y).statistic)


def _paired(x, y, what: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"{what} needs two sequences of the same length >= 2, got {len(x)} and {len(y)}")
    return x, y


def sts_evaluate(embed, texts_a: Sequence[str], texts_b: Sequence[str], scores) -> dict[str, float]:
    """STS evaluation as SentEval and MTEB do it: the cosine of each pair's two sentence vectors against the gold
    score, Spearman's rho and Pearson's r, both x 100.

    embed: a callable texts -> (n, dim) vectors, or anything with `encode(texts)` (ctxrep.tasks.SentenceEncoder) or
    `embed_sentences(texts)` (ctxrep.Featurizer of one layer). Each distinct text is embedded once.
    """
    texts_a, texts_b = list(texts_a), list(texts_b)
    scores = np.asarray(scores, dtype=np.float64)
    if not len(texts_a) == len(texts_b) == len(scores):
        raise ValueError(
            f"{len(texts_a)} first texts, {len(texts_b)} second texts and {len(scores)} scores; give one each"
        )
    if hasattr(embed, "embed_sentences"):
        embed = embed.embed_sentences
    elif hasattr(embed, "encode"):
        embed = embed.encode
    unique = list(dict.fromkeys(texts_a + texts_b))
    vectors = np.asarray(embed(unique))
    if vectors.ndim != 2 or len(vectors) != len(unique):
        raise ValueError(f"embed returned shape {vectors.shape} for {len(unique)} texts; expected one vector per text")
    row = {t: i for i, t in enumerate(unique)}
    cos = similarity(vectors[[row[t] for t in texts_a]], vectors[[row[t] for t in texts_b]], pairwise=True)
    return {"spearman": 100 * spearman(cos, scores), "pearson": 100 * pearson(cos, scores), "pairs": len(scores)}
