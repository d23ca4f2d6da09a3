"""Sparse (SPLADE) and multi-vector (ColBERT) outputs: throughput beside dense featurization and beside
sentence-transformers' SparseEncoder / MultiVectorEncoder on the same folders and texts, in one run (issue 34's
speed target: each new output costs only its own head and pooling on top of dense featurization).

The folders are made here from the packaged MiniLM (all-MiniLM-L6-v2), offline: a SparseEncoder folder (MiniLM's
encoder under a masked-LM head drawn at random with seed 0: the speed of a SPLADE head of BERT's vocabulary, not a
trained SPLADE model) and a MultiVectorEncoder folder (MiniLM, a random 384 -> 128 Dense, ColBERT's punctuation
skiplist, Normalize), both written by sentence-transformers itself. The texts: SST train sentences. Each row times
one pass over every text (the best of --repeats, the rows taken in turn each round), after a warm-up; the head's
share of the FLOPs per token is read off the parameter counts (2 multiply-adds per weight; attention's seq x seq
products left out, as they are small at these lengths). The outputs are compared too (max |ctxrep - sentence-transformers|).

Full run (2,000 sentences, about 3 minutes on 2 cores):
    python benchmarks/token_heads.py --data ../shared/data
Smoke test:  python benchmarks/token_heads.py --texts 40 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import string
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def make_folders(work: Path) -> tuple[Path, Path, Path]:
    """(MiniLM's folder, a SparseEncoder folder over it, a MultiVectorEncoder folder over it)."""
    import transformers
    from sentence_transformers import MultiVectorEncoder, SparseEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    from ctxrep.models.loading import resolve_model_path

    minilm = resolve_model_path("minilm")
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM.from_pretrained(minilm)  # the encoder's weights, a head drawn at random
    mlm.save_pretrained(work / "mlm")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (minilm / name).is_file():
            shutil.copy(minilm / name, work / "mlm" / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        SparseEncoder(modules=[MLMTransformer(str(work / "mlm")), SpladePooling("max")], device="cpu").save(
            str(work / "splade")
        )
        torch.manual_seed(0)
        dense = Dense(
            384, 128, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"
        )
        modules = [
            Transformer(str(minilm)),
            dense,
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ]
        MultiVectorEncoder(modules=modules, device="cpu").save(str(work / "colbert"))
    return minilm, work / "splade", work / "colbert"


def interleaved_best(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Best time and last output of each named run, the runs taken in turn `repeats` times (dense, sparse, ST's
    sparse, ..., then again), so that on a shared machine each meets the same load rather than one its own spell."""
    best, out = {name: float("inf") for name in runs}, {}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            out[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch size")
    args = parser.parse_args()

    from sentence_transformers import MultiVectorEncoder as STMultiVector
    from sentence_transformers import SparseEncoder as STSparse

    from ctxrep.data.sst import read_sst
    from ctxrep.featurize import Featurizer
    from ctxrep.vectors.late_interaction import MultiVectorEncoder
    from ctxrep.vectors.sparse import SparseEncoder

    texts = read_sst(args.data / "sst" / "train.txt").texts[: args.texts]
    load_start = tuple(round(x, 1) for x in os.getloadavg())  # the machine may be shared: timings move with it
    with tempfile.TemporaryDirectory() as tmp:
        minilm, splade, colbert = make_folders(Path(tmp))
        dense = Featurizer(minilm, sentence_pooling="model")
        sparse = SparseEncoder(splade)
        multi = MultiVectorEncoder(colbert)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st_sparse = STSparse(str(splade), device="cpu")
            st_multi = STMultiVector(str(colbert), device="cpu")
        for warm in (
            lambda: dense.embed_sentences(texts[:32]),
            lambda: sparse.embed_sentences(texts[:32]),
            lambda: multi.embed_documents(texts[:32]),
            lambda: st_sparse.encode(texts[:32], batch_size=args.batch_size),
            lambda: st_multi.encode_document(texts[:32], batch_size=args.batch_size),
        ):
            warm()
        runs = {
            "dense": lambda: dense.embed_sentences(texts),
            "sparse": lambda: sparse.embed_sentences(texts),
            "st_sparse": lambda: st_sparse.encode(texts, batch_size=args.batch_size, convert_to_tensor=True),
            "multi": lambda: multi.embed_documents(texts),
            "st_multi": lambda: st_multi.encode_document(texts, batch_size=args.batch_size, convert_to_numpy=False),
        }
        times, outs = interleaved_best(runs, args.repeats)
    t_dense, t_sparse, t_st_sparse, t_multi, t_st_multi = (times[k] for k in runs)
    ours_sparse, st_sparse_out, ours_multi, st_multi_out = (
        outs[k] for k in ("sparse", "st_sparse", "multi", "st_multi")
    )
    sparse_diff = float(np.abs(ours_sparse.toarray() - st_sparse_out.to_dense().numpy()).max())
    multi_diff = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(ours_multi, st_multi_out))

    h, vocab = dense.model.hidden_size, sparse.vocab_size
    encoder_params = sum(p.numel() for n, p in dense.model.named_parameters() if "embeddings" not in n)
    splade_head = h * h + h * vocab  # dense transform, then the decoder over the vocabulary
    colbert_head = h * 128
    n = len(texts)
    print(f"token heads on {n} SST sentences (MiniLM; torch threads {torch.get_num_threads()}; best of {args.repeats})")
    print(f"load average (1, 5, 15 min) at start {load_start}, at end {tuple(round(x, 1) for x in os.getloadavg())}")
    print(f"{'output':<28}{'texts/s':>10}{'vs dense':>10}{'vs ST':>8}{'head FLOPs share':>18}{'max diff':>10}")
    print(f"{'dense (model pooling)':<28}{n / t_dense:>10.1f}{1.0:>10.2f}{'':>8}{'':>18}{'':>10}")
    share = splade_head / (encoder_params + splade_head)
    print(
        f"{'sparse (SPLADE, ctxrep)':<28}{n / t_sparse:>10.1f}{t_dense / t_sparse:>10.2f}"
        f"{t_st_sparse / t_sparse:>8.2f}{share:>18.1%}{sparse_diff:>10.1e}"
    )
    print(f"{'sparse (sentence-transf.)':<28}{n / t_st_sparse:>10.1f}{t_dense / t_st_sparse:>10.2f}")
    share = colbert_head / (encoder_params + colbert_head)
    print(
        f"{'multi-vector (ctxrep)':<28}{n / t_multi:>10.1f}{t_dense / t_multi:>10.2f}"
        f"{t_st_multi / t_multi:>8.2f}{share:>18.1%}{multi_diff:>10.1e}"
    )
    print(f"{'multi-vector (sentence-tr.)':<28}{n / t_st_multi:>10.1f}{t_dense / t_st_multi:>10.2f}")
    print("vs ST: sentence-transformers' time / ctxrep's (> 1: ctxrep faster); vs dense: dense time / this time")


if __name__ == "__main__":
    main()
