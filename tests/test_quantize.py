"""Compact vectors: truncation + renormalisation, and codes bit-exact with sentence-transformers'
quantize_embeddings; saved ranges; the binary index with rescoring."""

from __future__ import annotations

import numpy as np
import pytest

from ctxrep.vectors.hits import Hits
from ctxrep.vectors.quantize import (
    PRECISIONS,
    BinaryIndex,
    QuantizedVectors,
    Rescore,
    dequantize,
    hamming,
    quantize,
    truncate,
)

st_quant = pytest.importorskip("sentence_transformers.util.quantization")


def _vectors(n: int = 300, dim: int = 45, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    v[:, 3] = 0.25  # a constant dimension: step 0 becomes 1, as sentence-transformers does
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_codes_are_bit_exact_with_sentence_transformers(precision):
    v = _vectors()
    ours = quantize(v, precision)
    theirs = st_quant.quantize_embeddings(v, precision=precision)
    assert ours.codes.dtype == theirs.dtype and ours.codes.shape == theirs.shape
    np.testing.assert_array_equal(ours.codes, theirs)
    if precision in ("binary", "ubinary"):
        assert ours.codes.shape == (300, 6)  # ceil(45 / 8) bytes


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_calibration_and_given_ranges_are_bit_exact(precision):
    v, calibration = _vectors(seed=1), _vectors(seed=2)
    ours = quantize(v[:5], precision, calibration=calibration)
    theirs = st_quant.quantize_embeddings(v[:5], precision=precision, calibration_embeddings=calibration)
    np.testing.assert_array_equal(ours.codes, theirs)
    np.testing.assert_array_equal(ours.ranges, np.vstack((calibration.min(0), calibration.max(0))))
    again = quantize(v[5:9], precision, ranges=ours.ranges)  # a later batch on the saved grid
    np.testing.assert_array_equal(
        again.codes, st_quant.quantize_embeddings(v[5:9], precision=precision, ranges=ours.ranges)
    )
    theirs_back = st_quant._dequantize_embeddings(ours.codes, precision, ours.ranges)  # float64
    np.testing.assert_array_equal(dequantize(ours), theirs_back.astype(np.float32))


def test_truncate_then_renormalise_matches_sentence_transformers():
    from sentence_transformers.util import truncate_embeddings

    v = _vectors() * 3.0
    ours = truncate(v, 16)
    theirs = truncate_embeddings(v, 16)
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(truncate(v, 16, normalize=False), v[:, :16])
    with pytest.raises(ValueError, match="dimensions=46 is more than the vectors' 45; give at most 45"):
        truncate(v, 46)
    with pytest.raises(ValueError, match="dimensions must be a positive integer"):
        truncate(v, 0)


def test_saved_codes_and_ranges_round_trip(tmp_path):
    v = _vectors()
    for precision in ("int8", "ubinary"):
        q = quantize(v, precision)
        back = QuantizedVectors.load(q.save(tmp_path / precision))
        np.testing.assert_array_equal(back.codes, q.codes)
        assert (back.precision, back.dim) == (precision, 45)
        if precision == "int8":
            np.testing.assert_array_equal(back.ranges, q.ranges)
        else:
            assert back.ranges is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="precision must be one of float32, int8, uint8, binary, ubinary"):
        quantize(_vectors(), "int4")
    with pytest.raises(ValueError, match="need at least 2 calibration vectors"):
        quantize(_vectors()[:1], "int8")
    with pytest.raises(ValueError, match="must be float vectors"):
        quantize(np.ones((3, 4), dtype=np.int8), "binary")
    with pytest.raises(ValueError, match=r"ranges must have shape \(2, 45\)"):
        quantize(_vectors(), "int8", ranges=np.zeros((2, 3)))


def test_hamming_counts_differing_bits():
    a = np.packbits(np.array([[1, 0, 1, 1, 0, 0, 0, 0, 1]], dtype=bool), axis=-1)
    b = np.packbits(np.array([[1, 1, 0, 1, 0, 0, 0, 0, 0], [1, 0, 1, 1, 0, 0, 0, 0, 1]], dtype=bool), axis=-1)
    np.testing.assert_array_equal(hamming(a, b), [[3, 0]])


@pytest.mark.parametrize("row_bytes", [3, 8, 48])
def test_hamming_equals_counting_unpacked_bits_at_every_row_width(row_bytes):
    rng = np.random.default_rng(row_bytes)
    queries = rng.integers(0, 256, (4, row_bytes), dtype=np.uint8)
    codes = rng.integers(0, 256, (50, row_bytes), dtype=np.uint8)
    bits = np.unpackbits(queries[:, None, :] ^ codes[None, :, :], axis=2).sum(axis=2)
    np.testing.assert_array_equal(hamming(queries, codes), bits)
    np.testing.assert_array_equal(hamming(queries, codes[::2]), bits[:, ::2])  # a strided view


@pytest.mark.parametrize("rescore", [Rescore.INT8, Rescore.FLOAT32])
def test_binary_index_with_rescoring_finds_the_exact_neighbours(rescore):
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(40, 64))
    corpus = centres[rng.integers(0, 40, 2000)] + 0.3 * rng.normal(size=(2000, 64))
    corpus = (corpus / np.linalg.norm(corpus, axis=1, keepdims=True)).astype(np.float32)
    queries = corpus[:50] + 0.05 * rng.normal(size=(50, 64)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    index = BinaryIndex.build(corpus, rescore=rescore)
    hits = index.search(queries, k=10, rescore_multiplier=8)  # (n, dim) queries: a list of Hits, one per query
    assert isinstance(hits, list) and all(isinstance(h, Hits) for h in hits)
    rows, scores = np.stack([h.rows for h in hits]), np.stack([h.scores for h in hits])
    assert rows.shape == scores.shape == (50, 10) and scores.dtype == np.float32
    assert [h.ids for h in hits] == rows.tolist() and hits[0].texts == [None] * 10  # ids: the rows
    one = index.search(queries[3], k=10, rescore_multiplier=8)  # one vector (dim,): one Hits
    assert isinstance(one, Hits) and one.ids == hits[3].ids
    assert (np.diff(scores, axis=1) <= 0).all()
    recall = np.mean([len(set(r) & set(e)) / 10 for r, e in zip(rows, exact)])
    assert recall >= 0.9, recall
    assert (rows[:, 0] == np.arange(50)).mean() >= 0.95  # a query's own document comes first
    assert index.nbytes == 2000 * 8 + 2000 * 64 * (1 if rescore == "int8" else 4)
    if rescore == "float32":  # float rescoring gives the exact scores of its candidates
        np.testing.assert_allclose(scores[:, 0], np.sum(queries * corpus[rows[:, 0]], axis=1), atol=1e-5)
    with pytest.raises(ValueError, match="queries are 3 wide but the index holds 64-wide vectors"):
        index.search(np.ones((1, 3), np.float32))


def test_binary_index_saved_and_loaded_searches_the_same(tmp_path):
    v = _vectors(500, 64, seed=7)
    index = BinaryIndex.build(v, rescore=Rescore.INT8)
    loaded = BinaryIndex.load(index.save(tmp_path / "ix"))
    assert isinstance(loaded.rescore.codes, np.memmap)  # the rescoring codes stay on disk
    for a, b in zip(index.search(v[:20], k=5), loaded.search(v[:20], k=5)):
        assert a.ids == b.ids
        np.testing.assert_array_equal(a.scores, b.scores)
    with pytest.raises(ValueError, match="binary codes do not fit"):
        BinaryIndex(loaded.codes[:3], loaded.rescore)


def test_binary_index_old_arrays_work_for_a_release_with_a_deprecation_warning():
    """BinaryIndex.search answers with Hits now; the (scores, rows) arrays it gave before stay reachable until 0.3
    as search_arrays, with a DeprecationWarning, and equal the Hits' rows and scores."""
    v = _vectors(100, 32, seed=8)
    index = BinaryIndex.build(v, rescore=Rescore.INT8)
    with pytest.warns(DeprecationWarning, match=r"search_arrays, which gives the old \(scores, rows\) arrays"):
        scores, rows = index.search_arrays(v[:4], k=3, rescore_multiplier=4)
    hits = index.search(v[:4], k=3, rescore_multiplier=4)
    np.testing.assert_array_equal(rows, np.stack([h.rows for h in hits]))
    np.testing.assert_array_equal(scores, np.stack([h.scores for h in hits]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, "k must be a positive integer, got 0"),
        ({"k": True}, "k must be a positive integer, got True"),
        ({"rescore_multiplier": 0}, "rescore_multiplier must be at least 1, got 0"),
        ({"rescore_multiplier": 2.5}, "rescore_multiplier must be a positive integer, got 2.5"),
    ],
)
def test_binary_index_search_bad_arguments(kwargs, message):
    index = BinaryIndex.build(_vectors(10, 16, seed=9), rescore=Rescore.FLOAT32)
    with pytest.raises(ValueError, match=message):
        index.search(_vectors(2, 16, seed=10), **kwargs)
