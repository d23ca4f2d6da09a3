"""Compact SentenceIndex variants at 100k vectors: search latency, memory and recall@10 against the exact float
index, beside sentence-transformers' semantic_search (float, exact) on the same vectors, in one run (issue 34:
search latency at 100k vectors for each index type, with its memory; binary + rescore keeps >= 95% of recall@10).

Vectors are drawn at random (seed 0: 384-wide unit vectors around 256 centres, queries near stored ones); latency is
per query, one query at a time (as a server answers), the median over --queries queries, k = 10:

    float exact        SentenceIndex(exact=True), one matrix product; peer: semantic_search on the same vectors
    dimensions 256/128 SentenceIndex.from_vectors(dimensions=N) (truncate, renormalise); peer: semantic_search on
                       the same truncated vectors; recall against the full-width exact hits
    binary + int8      SentenceIndex(binary=Binary(Rescore.INT8)), saved and loaded (the int8 rescoring vectors memory-mapped):
                       Hamming candidates (k x --rescore-multiplier) rescored; peer: semantic_search on the floats
    binary + float32   the same, rescored by the float32 vectors

Random vectors are not text: the recall column says what each variant loses on this data, not on a real corpus
(benchmarks/retrieval.py measures that on STS-B pairs). MiB: the arrays each index holds in memory (for binary +
int8, the codes in memory plus the int8 vectors read from disk per query's candidates).

Full run (n = 100,000): about 1 minute on 2 cores:
    python benchmarks/index_compact.py
Smoke test:  python benchmarks/index_compact.py --n 3000 --queries 5
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from _common import per_query

from ctxrep.util.arrays import normalize_rows as unit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="vectors in each index")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--rescore-multiplier", type=int, default=4, help="binary: candidates per hit, rescored")
    args = parser.parse_args()

    from sentence_transformers.util import dot_score, semantic_search

    from ctxrep.vectors.index import SentenceIndex
    from ctxrep.vectors.quantize import Binary, Rescore

    rng = np.random.default_rng(0)
    n, k, dim = args.n, 10, 384
    centers = rng.normal(size=(256, dim))
    vectors = unit(centers[rng.integers(0, 256, n)] + 0.5 * rng.normal(size=(n, dim)))
    queries = unit(vectors[rng.integers(0, n, args.queries)] + 0.3 * rng.normal(size=(args.queries, dim)))
    exact = SentenceIndex.from_vectors(vectors, exact_below=n)
    truth = [set(exact.search(q, k=k, exact=True).ids) for q in queries]

    print(f"SentenceIndex search at {n:,} vectors ({dim} wide), k = {k}, one query at a time (median ms); ")
    print(f"torch threads {torch.get_num_threads()}; peer: sentence_transformers.util.semantic_search (float, exact)")
    print(f"{'index':<18}{'ctxrep ms':>10}{'peer ms':>10}{'peer/us':>8}{'MiB':>9}{'recall@10':>11}  notes")

    def row(name: str, index: SentenceIndex, peer_vectors: np.ndarray, memory: int, note: str = "") -> None:
        ours = per_query(lambda q: index.search(q[: index.dim], k=k), queries)
        corpus = torch.from_numpy(peer_vectors)
        peer = per_query(
            lambda q: semantic_search(
                torch.from_numpy(unit(q[: peer_vectors.shape[1]])[None]), corpus, top_k=k, score_function=dot_score
            ),
            queries,
        )
        recall = np.mean([len(set(index.search(q[: index.dim], k=k).ids) & t) / k for q, t in zip(queries, truth)])
        print(
            f"{name:<18}{ours * 1e3:>10.2f}{peer * 1e3:>10.2f}{peer / ours:>8.2f}{memory / 2**20:>9.1f}"
            f"{recall:>11.3f}  {note}"
        )

    row("float exact", SentenceIndex.from_vectors(vectors, exact_below=n), vectors, vectors.nbytes)
    for d in (256, 128):
        small = SentenceIndex.from_vectors(vectors, dimensions=d, exact_below=n)
        row(f"dimensions {d}", small, small.vectors, small.vectors.nbytes, "peer on the same truncated vectors")
    with tempfile.TemporaryDirectory() as tmp:
        for rescore in ("int8", "float32"):
            binary = Binary(Rescore(rescore), args.rescore_multiplier)
            built = SentenceIndex.from_vectors(vectors, binary=binary)
            built.save(f"{tmp}/{rescore}")
            index = SentenceIndex.load(f"{tmp}/{rescore}")
            coded = index.binary_index
            codes, rescoring = coded.codes.nbytes, coded.rescore.nbytes
            memory = codes + (0 if rescore == "int8" else rescoring)
            note = (
                f"{args.rescore_multiplier} x k candidates; codes {codes / 2**20:.1f} MiB in memory, "
                f"{rescore} rescoring vectors {rescoring / 2**20:.1f} MiB"
                + (" memory-mapped" if rescore == "int8" else "")
                + f"; peer on the floats ({vectors.nbytes / codes:.0f}x the codes' bytes)"
            )
            row(f"binary + {rescore}", index, vectors, memory, note)


if __name__ == "__main__":
    main()
