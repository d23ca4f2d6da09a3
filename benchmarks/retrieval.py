"""Retrieval quality of compact vectors, reranking and late interaction (issue 34's Targets), and rerank throughput
beside sentence-transformers' CrossEncoder.predict, in one run.

The set: STS-B train pairs scored >= 4; query = the first sentence, its one relevant document = the second; the
corpus = the second sentence of every train pair (deduplicated) plus SST train sentences as distractors. Vectors:
the packaged MiniLM (all-MiniLM-L6-v2) with its own pooling (mean, Normalize). Rows, each with recall@10, MRR@10
and the memory its corpus vectors take:

    dense            float32 vectors, exact dot product
    int8             int8 codes (ranges from the corpus), the float query against the dequantized codes
    binary+rescore   ubinary codes by Hamming distance, the best 4 x 10 rescored with the int8 codes
                     (memory: the codes searched in RAM; the int8 rescoring codes can stay on disk)
    dims 256 / 128   truncated, then renormalised (MiniLM is not Matryoshka-trained: this is what truncation costs)
    dense+rerank     dense top 30 reranked by a cross-encoder: MiniLM fine-tuned for one epoch as a
                     BertForSequenceClassification on STS-B *dev* pairs (score / 5, binary cross-entropy) with
                     transformers, so that no query of the set was seen in training
    multi-vector     ctxrep.vectors.late_interaction's MultiVectorEncoder over MiniLM's token vectors (no trained
                     projection; ColBERT's punctuation skiplist on documents), exact MaxSim over every document

Throughput: the same (query, candidate) pairs through ctxrep's CrossEncoderReranker.predict and
sentence-transformers' CrossEncoder.predict (batch_size 32) on the same folder, pairs per second and the ratio.

Full run (500 of the 1,378 queries against all 13,953 documents; a few minutes on 2 cores; the cross-encoder is
trained once into --work and reused):
    python benchmarks/retrieval.py --data ../shared/data
Smoke test:  python benchmarks/retrieval.py --queries 20 --documents 100 --distractors 100 --ce-steps 3 \
                 --throughput-pairs 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def retrieval_set(data: Path, queries: int | None, documents: int | None, distractors: int | None):
    """(queries, corpus texts, the corpus index of each query's relevant document). `queries` keeps the first N
    queries, `documents` the first N second sentences beside their relevant ones, `distractors` N SST sentences."""
    from ctxrep.data.sst import read_sst
    from ctxrep.data.sts import read_sts

    pairs = read_sts(data / "stsb" / "sts-train.csv")
    seen, chosen = set(), []
    for p in pairs:
        if p.score >= 4 and p.text_a not in seen:
            seen.add(p.text_a)
            chosen.append(p)
    chosen = chosen[:queries] if queries is not None else chosen
    others = [p.text_b for p in pairs]
    texts = [p.text_b for p in chosen] + (others[:documents] if documents is not None else others)
    sst = read_sst(data / "sst" / "train.txt").texts
    texts += sst[:distractors] if distractors is not None else sst
    corpus = list(dict.fromkeys(texts))  # deduplicated, first occurrence kept
    where = {t: i for i, t in enumerate(corpus)}
    return [p.text_a for p in chosen], corpus, np.asarray([where[p.text_b] for p in chosen])


def maxsim_all(query_tokens: list[np.ndarray], doc_tokens: list[np.ndarray], k: int) -> np.ndarray:
    """(queries, k) documents with the best exact MaxSim (sum over query tokens of the best document-token dot
    product) over the whole corpus, best first."""
    flat = np.concatenate(doc_tokens)  # (all document tokens, dim)
    starts = np.cumsum([0] + [len(d) for d in doc_tokens[:-1]])
    out = np.empty((len(query_tokens), k), dtype=np.int64)
    for i, q in enumerate(query_tokens):
        best = np.maximum.reduceat(q @ flat.T, starts, axis=1)  # (query tokens, documents)
        out[i] = top(best.sum(axis=0)[None, :], k)[0]
    return out


def metrics(ranked: np.ndarray, relevant: np.ndarray, k: int = 10) -> tuple[float, float]:
    """recall@k and MRR@k of (queries, >= k) ranked corpus indices, one relevant document per query."""
    hits = ranked[:, :k] == relevant[:, None]
    found = hits.any(axis=1)
    rank = hits.argmax(axis=1) + 1
    return float(found.mean()), float(np.where(found, 1.0 / rank, 0.0).mean())


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """(queries, k) indices of the highest scores, best first."""
    part = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
    order = np.take_along_axis(scores, part, 1).argsort(axis=1)[:, ::-1]
    return np.take_along_axis(part, order, 1)


def train_cross_encoder(data: Path, out: Path, steps: int | None, seed: int = 0) -> Path:
    """MiniLM + a one-logit head fine-tuned on STS-B dev pairs (label = score / 5) for one epoch (or `steps`)."""
    import torch
    import transformers

    from ctxrep.data.sts import read_sts
    from ctxrep.models.loading import resolve_model_path

    if (out / "config.json").is_file():
        return out
    base = resolve_model_path("minilm")
    tok = transformers.AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    pairs = read_sts(data / "stsb" / "sts-dev.csv")
    order = np.random.default_rng(seed).permutation(len(pairs))
    batches = [order[i : i + 16] for i in range(0, len(order), 16)][:steps]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (0.1 * len(batches) + 1)))
    model.train()
    for b in batches:
        enc = tok(
            [pairs[i].text_a for i in b], [pairs[i].text_b for i in b], padding=True, truncation=True,
            return_tensors="pt",
        )  # fmt: skip
        labels = torch.tensor([pairs[i].score / 5.0 for i in b])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(**enc).logits[:, 0], labels)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="Holds stsb/ and sst/.")
    parser.add_argument("--queries", type=int, default=500, help="Use the first N queries (of 1,378).")
    parser.add_argument("--documents", type=int, default=None, help="STS-B second sentences beside the relevant ones.")
    parser.add_argument("--distractors", type=int, default=None, help="SST sentences added [default: all].")
    parser.add_argument("--rerank-depth", type=int, default=30, help="Dense candidates the cross-encoder reranks.")
    parser.add_argument("--rescore-multiplier", type=int, default=4, help="Binary candidates per result, rescored.")
    parser.add_argument("--ce-steps", type=int, default=None, help="Cross-encoder training steps [default: 1 epoch].")
    parser.add_argument("--work", default=os.path.join("/tmp", "ctxrep-retrieval-bench"), help="Cross-encoder folder.")
    parser.add_argument("--throughput-pairs", type=int, default=3000, help="Pairs timed in the throughput row.")
    parser.add_argument("--no-multi-vector", action="store_true", help="Skip the late-interaction row.")
    args = parser.parse_args(argv)

    import torch

    from ctxrep.featurize import Featurizer
    from ctxrep.rerank import CrossEncoderReranker
    from ctxrep.vectors.quantize import BinaryIndex, Rescore, dequantize, quantize, truncate

    data = Path(args.data)
    queries, corpus, relevant = retrieval_set(data, args.queries, args.documents, args.distractors)
    print(f"# retrieval set: {len(queries)} queries, {len(corpus)} documents; torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    fz = Featurizer("minilm", sentence_pooling="model")
    C = fz.embed_sentences(corpus)
    Q = fz.embed_sentences(queries)
    print(f"# embedded in {time.perf_counter() - t0:.1f} s")
    rows = []

    def row(name: str, ranked: np.ndarray, nbytes: int, note: str = "") -> None:
        r, m = metrics(ranked, relevant)
        rows.append({"method": name, "recall@10": r, "mrr@10": m, "bytes": nbytes, "note": note})

    dense_scores = Q @ C.T
    dense = top(dense_scores, max(10, args.rerank_depth))
    row("dense", dense, C.nbytes)
    q8 = quantize(C, "int8")
    row("int8", top(Q @ dequantize(q8).T, 10), q8.nbytes, "ranges from the corpus")
    index = BinaryIndex.build(C, rescore=Rescore.INT8, calibration=C)
    binary = np.stack([h.rows for h in index.search(Q, k=10, rescore_multiplier=args.rescore_multiplier)])
    row(
        "binary+rescore",
        binary,
        index.codes.nbytes,
        f"{args.rescore_multiplier} x 10 Hamming candidates rescored with int8 ({index.rescore.nbytes} bytes, on disk)",
    )
    for d in (256, 128):
        row(f"dims {d}", top(truncate(Q, d) @ truncate(C, d).T, 10), truncate(C, d).nbytes, "truncate + renormalise")

    t0 = time.perf_counter()
    folder = train_cross_encoder(data, Path(args.work) / "cross-encoder", args.ce_steps)
    print(f"# cross-encoder ready in {time.perf_counter() - t0:.1f} s: {folder}")
    reranker = CrossEncoderReranker(folder)
    depth = args.rerank_depth
    pairs = [(q, corpus[j]) for q, cand in zip(queries, dense[:, :depth]) for j in cand]
    t0 = time.perf_counter()
    ce_scores = reranker.predict(pairs).reshape(len(queries), depth)
    reranked = np.take_along_axis(dense[:, :depth], np.argsort(-ce_scores, axis=1, kind="stable"), 1)
    row("dense+rerank", reranked, C.nbytes, f"top {depth} reranked ({time.perf_counter() - t0:.1f} s)")

    if args.no_multi_vector:
        rows.append({"method": "multi-vector", "note": "not measured (--no-multi-vector)"})
    else:
        try:
            from ctxrep.vectors.late_interaction import MultiVectorEncoder
        except ImportError as e:
            rows.append({"method": "multi-vector", "note": f"not measured: {e}"})
        else:
            t0 = time.perf_counter()
            encoder = MultiVectorEncoder(fz)
            docs = encoder.embed_documents(corpus)
            ranked = maxsim_all(encoder.embed_queries(queries), docs, 10)
            nbytes = sum(d.nbytes for d in docs)
            row("multi-vector", ranked, nbytes, f"exact MaxSim over all documents ({time.perf_counter() - t0:.1f} s)")

    print(
        "\n| method | recall@10 | MRR@10 | corpus memory | recall vs dense | note |\n| --- | --- | --- | --- | --- | --- |"
    )
    base = rows[0]
    for r in rows:
        if "recall@10" not in r:
            print(f"| {r['method']} | | | | | {r['note']} |")
            continue
        keep = r["recall@10"] / base["recall@10"] if base["recall@10"] else float("nan")
        print(
            f"| {r['method']} | {r['recall@10']:.4f} | {r['mrr@10']:.4f} | {r['bytes'] / 2**20:.2f} MiB "
            f"({r['bytes'] / base['bytes']:.3g}x dense) | recall {keep:.1%} | {r['note']} |"
        )

    # ---- rerank throughput beside sentence-transformers ----
    from sentence_transformers import CrossEncoder

    timed = (pairs * (args.throughput_pairs // max(1, len(pairs)) + 1))[: args.throughput_pairs]
    theirs_model = CrossEncoder(str(folder))
    reranker.predict(timed[:64]), theirs_model.predict(timed[:64], batch_size=32)  # warm-up
    t0 = time.perf_counter()
    ours = reranker.predict(timed)
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = theirs_model.predict(timed, batch_size=32, show_progress_bar=False)
    theirs_s = time.perf_counter() - t0
    print(
        f"\nrerank throughput, {len(timed)} pairs: ctxrep {len(timed) / ours_s:.0f} pairs/s, sentence-transformers "
        f"{len(timed) / theirs_s:.0f} pairs/s, ratio {theirs_s / ours_s:.2f}x; max |score difference| "
        f"{np.abs(ours - theirs).max():.2e}"
    )
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
