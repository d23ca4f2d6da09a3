"""One result type (issue 40, item 2): every index's `search` answers with `ctxrep.vectors.hits.Hits`, one Hits for
one query and a list of Hits for a list (or a 2-D batch) of queries, whatever the index; ids count from 0."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

from ctxrep.vectors.hits import Hits
from ctxrep.vectors.index import Hits as IndexHits
from ctxrep.vectors.index import SentenceIndex
from ctxrep.vectors.late_interaction import LateInteractionIndex
from ctxrep.vectors.quantize import Binary, BinaryIndex, Rescore
from ctxrep.vectors.sparse import SparseIndex, SparseVector

RNG = np.random.default_rng(0)
DENSE = RNG.normal(size=(30, 16)).astype(np.float32)
TEXTS = [f"text {i}" for i in range(30)]


def _dense():
    return SentenceIndex.from_vectors(DENSE, texts=TEXTS), DENSE[0], DENSE[:3]


def _binary_sentence_index():
    return SentenceIndex.from_vectors(DENSE, texts=TEXTS, binary=Binary(Rescore.FLOAT32, 30)), DENSE[0], DENSE[:3]


def _binary():
    return BinaryIndex.build(DENSE, Rescore.FLOAT32), DENSE[0], DENSE[:3]


def _sparse():
    docs = scipy.sparse.random(30, 50, density=0.2, random_state=1, format="csr", dtype=np.float32)
    index = SparseIndex(50).add_vectors(docs, texts=TEXTS)
    vectors = [SparseVector(docs[i].indices.tolist(), docs[i].data.tolist()) for i in range(3)]
    return index, vectors[0], vectors


def _late():
    documents = [RNG.normal(size=(n, 8)).astype(np.float32) for n in RNG.integers(1, 6, 30)]
    queries = [RNG.normal(size=(3, 8)).astype(np.float32) for _ in range(3)]
    return LateInteractionIndex(8).add_vectors(documents, texts=TEXTS), queries[0], queries


@pytest.mark.parametrize("make", [_dense, _binary_sentence_index, _binary, _sparse, _late])
def test_every_index_answers_with_hits(make):
    index, one, several = make()
    hits = index.search(one, k=4)
    assert type(hits) is Hits and len(hits) == 4
    assert isinstance(hits.ids, list) and isinstance(hits.texts, list)
    assert hits.scores.shape == hits.rows.shape == (4,)
    assert hits.scores.dtype == np.float32 and hits.rows.dtype == np.int64
    assert (np.diff(hits.scores) <= 0).all()  # best first
    if isinstance(index, BinaryIndex):  # no ids or texts of its own: ids are the rows
        assert hits.ids == hits.rows.tolist() and hits.texts == [None] * 4
    else:  # ids default to the 0-based row numbers
        assert hits.ids == hits.rows.tolist() and hits.texts == [TEXTS[r] for r in hits.rows]
    batch = index.search(several, k=4)
    assert isinstance(batch, list) and len(batch) == 3 and all(type(h) is Hits for h in batch)
    assert batch[0].ids == hits.ids
    assert [(i, t, s) for i, t, s in hits] == list(zip(hits.ids, hits.texts, hits.scores.tolist()))


def test_a_batch_of_one_is_a_list_of_one():
    index, one, _ = _dense()
    assert isinstance(index.search(one[None, :], k=2), list)
    assert isinstance(BinaryIndex.build(DENSE, Rescore.INT8).search(one[None, :], k=2), list)


def test_hits_is_one_type_wherever_it_is_imported_from():
    assert IndexHits is Hits
    assert len(Hits.empty()) == 0 and Hits.empty().scores.dtype == np.float32
    empty = SentenceIndex(16).search(DENSE[0], k=3)  # an empty index: one empty Hits
    assert type(empty) is Hits and len(empty) == 0
