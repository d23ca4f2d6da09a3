"""Search latency and memory of ctxrep's indexes at 100k vectors, beside sentence-transformers' search functions on
the same vectors, in one run (issue 34's target: search latency at 100k vectors for each index type, with its
memory).

Vectors are drawn at random (seed 0: dense ones around 256 centres; token vectors without structure, a hard case
for HNSW); latency is per query, one query at a time (as a server answers), the median over --queries queries,
k = 10:

    dense exact      SentenceIndex, one matrix product (the default up to 20,000 rows; forced with exact=True),
                     beside sentence_transformers.util.semantic_search on the same unit vectors (384 wide)
    dense HNSW       SentenceIndex above exact_below (hnswlib, M 32, ef 100); its recall@10 against exact, and the
                     build time
    sparse           SparseIndex (postings per vocabulary id), documents with --sparse-nnz non-zeros over BERT's
                     30,522 ids (SPLADE documents hold a few hundred), queries with 30; beside semantic_search on
                     torch sparse COO tensors (dot product)
    late interaction LateInteractionIndex over --n token vectors (128 wide, 32 tokens a document), queries of
                     16 tokens, candidates 64 (found by HNSW above 20,000 tokens) then exact MaxSim; beside
                     sentence_transformers.util.maxsim over every document (brute force), with recall@10 against it

Memory: the arrays each index holds (vectors, postings, the HNSW graph file's size).

Full run (n = 100,000; about 5 minutes on 2 cores, most of it the two HNSW builds (384 and 128 wide)):
    python benchmarks/index_latency.py
Smoke test:  python benchmarks/index_latency.py --n 3000 --queries 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import per_query

from ctxrep.util.arrays import normalize_rows as unit


def row(name: str, ours: float, peer: float | None, memory: float, note: str = "") -> None:
    ratio = f"{peer / ours:>8.2f}" if peer is not None else f"{'':>8}"
    peer_ms = f"{peer * 1e3:>10.2f}" if peer is not None else f"{'':>10}"
    print(f"{name:<18}{ours * 1e3:>10.2f}{peer_ms}{ratio}{memory / 2**20:>10.1f}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="vectors in each index")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--sparse-nnz", type=int, default=200)
    args = parser.parse_args()

    import scipy.sparse
    from sentence_transformers.util import dot_score, maxsim, semantic_search

    from ctxrep.vectors.index import SentenceIndex
    from ctxrep.vectors.late_interaction import LateInteractionIndex
    from ctxrep.vectors.sparse import SparseIndex

    rng = np.random.default_rng(0)
    n, k = args.n, 10
    print(
        f"index search at {n:,} vectors, k = {k}, one query at a time (median ms); torch threads {torch.get_num_threads()}"
    )
    print(f"{'index':<18}{'ctxrep ms':>10}{'peer ms':>10}{'peer/us':>8}{'MiB':>10}  notes")

    # dense: clustered unit vectors, queries near stored ones
    centers = rng.normal(size=(256, 384))
    dense = unit(centers[rng.integers(0, 256, n)] + 0.5 * rng.normal(size=(n, 384)))
    queries = unit(dense[rng.integers(0, n, args.queries)] + 0.3 * rng.normal(size=(args.queries, 384)))
    exact = SentenceIndex.from_vectors(dense, metric="dot", exact_below=n)
    corpus_t = torch.from_numpy(dense)
    t_ours = per_query(lambda q: exact.search(q, k=k, exact=True), queries)
    t_peer = per_query(
        lambda q: semantic_search(torch.from_numpy(q[None]), corpus_t, top_k=k, score_function=dot_score), queries
    )
    row("dense exact", t_ours, t_peer, dense.nbytes, "peer: sentence_transformers.util.semantic_search")
    approx = SentenceIndex.from_vectors(dense, metric="dot", exact_below=0)
    start = time.perf_counter()
    approx.search(queries[0], k=k)  # builds the graph
    build = time.perf_counter() - start
    t_hnsw = per_query(lambda q: approx.search(q, k=k), queries)
    recall = np.mean(
        [len(set(approx.search(q, k=k).ids) & set(exact.search(q, k=k, exact=True).ids)) / k for q in queries]
    )
    with tempfile.TemporaryDirectory() as tmp:
        approx.save(tmp)
        graph = (Path(tmp) / "hnsw.bin").stat().st_size
    row("dense HNSW", t_hnsw, None, graph, f"recall@10 {recall:.3f} vs exact; graph built in {build:.0f} s")

    # sparse: SPLADE-like documents over BERT's vocabulary
    vocab = 30522
    popular = rng.zipf(1.3, size=n * args.sparse_nnz) % vocab  # a few ids in many documents, most in few
    cols = popular.reshape(n, args.sparse_nnz)
    rows_ = np.repeat(np.arange(n), args.sparse_nnz)
    docs = scipy.sparse.csr_matrix(
        (rng.random(n * args.sparse_nnz).astype(np.float32), (rows_, cols.ravel())), shape=(n, vocab)
    )
    qcols = rng.zipf(1.3, size=(args.queries, 30)) % vocab
    qs = [
        scipy.sparse.csr_matrix((rng.random(30).astype(np.float32), (np.zeros(30, int), c)), shape=(1, vocab))
        for c in qcols
    ]
    sparse = SparseIndex(vocab).add_vectors(docs)
    coo = docs.tocoo()
    docs_t = torch.sparse_coo_tensor(np.vstack([coo.row, coo.col]), coo.data, (n, vocab)).coalesce()

    def st_sparse(q):
        qc = q.tocoo()
        q_t = torch.sparse_coo_tensor(np.vstack([qc.row, qc.col]), qc.data, (1, vocab)).coalesce()
        return semantic_search(q_t, docs_t, top_k=k, score_function=dot_score)

    t_ours = per_query(lambda q: sparse.search(q, k=k), qs)
    t_peer = per_query(st_sparse, qs)
    memory = docs.data.nbytes + docs.indices.nbytes + docs.indptr.nbytes
    row("sparse", t_ours, t_peer, 2 * memory, f"{docs.nnz:,} non-zeros; memory: documents + postings")

    # late interaction: n token vectors, 32 a document
    docs_n, dim = n // 32, 128
    token_docs = [unit(rng.normal(size=(32, dim))) for _ in range(docs_n)]
    late = LateInteractionIndex(dim).add_vectors(token_docs)
    q_tokens = [
        unit(token_docs[i][:16] + 0.3 * rng.normal(size=(16, dim))) for i in rng.integers(0, docs_n, args.queries)
    ]
    stacked = torch.from_numpy(np.stack(token_docs))
    t_ours = per_query(lambda q: late.search(q, k=k, candidates=64), q_tokens)
    t_peer = per_query(lambda q: torch.topk(maxsim(torch.from_numpy(q), stacked)[0], k), q_tokens)
    hits = np.mean(
        [
            len(
                set(late.search(q, k=k, candidates=64).rows.tolist())
                & set(torch.topk(maxsim(torch.from_numpy(q), stacked)[0], k).indices.tolist())
            )
            / k
            for q in q_tokens
        ]
    )
    row(
        "late interaction",
        t_ours,
        t_peer,
        late.tokens.vectors.nbytes,
        f"{docs_n:,} documents; recall@10 {hits:.3f} vs brute-force MaxSim (peer: util.maxsim over all)",
    )
    print("peer/us: the peer's time / ctxrep's (> 1: ctxrep faster)")


if __name__ == "__main__":
    main()
