#!/usr/bin/env python
"""Featurization speed of issue 25's families beside transformers: DistilBERT-, ModernBERT- and DeBERTa-v3-base
shapes with random weights (speed does not depend on the weights), in one run.

The work: N SST training sentences, already split into words; one vector per word = the mean of its pieces in the
last layer.

  ctxrep        Featurizer(folder, layers=-1, pooling="mean", compile=False).embed_words(word_lists)
  transformers  AutoTokenizer (fast, is_split_into_words=True, padding=True) + AutoModel (eval, inference_mode,
                its default attention: SDPA for DistilBERT and ModernBERT, DeBERTa's own), batches of 32 over the
                sentences sorted by piece count (the careful user of benchmarks/featurize.py's B), each word's
                pieces mean-pooled with one index_add_ per batch, results back in corpus order

Both read the same tokenizer (MiniLM's WordPiece, 30,522 pieces, for every shape: the vocabulary size changes only
an embedding lookup), so both see the same tokens; their word vectors must agree within 1e-4 or the script exits 1.
Shapes: distilbert-base-uncased (6 x 768, 12 heads, FFN 3,072), answerdotai/ModernBERT-base (22 x 768, 12 heads,
GeGLU 1,152, global attention every 3rd layer, local windows of 128), microsoft/deberta-v3-base (12 x 768, 12 heads,
FFN 3,072, 256 log buckets, shared keys). Timed: everything after loading (tokenization, batching, the encoder,
pooling). Warm-up once; then round-robin runs, the best of --repeats kept. The load average is printed before and
after: the machine is shared.

Run:  .venv/bin/python benchmarks/families_speed.py                       # 400 sentences, 2 repeats, 2 threads
      .venv/bin/python benchmarks/families_speed.py --shapes modernbert --limit 100
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from ctxrep.featurize import Featurizer
from ctxrep.models.loading import resolve_model_path
from ctxrep.runtime.hardware import cpu_description

COMMON = dict(vocab_size=30522, pad_token_id=0)
SHAPES = {
    "distilbert": lambda: transformers.DistilBertConfig(
        **COMMON, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512
    ),
    "modernbert": lambda: transformers.ModernBertConfig(
        **COMMON,
        hidden_size=768,
        intermediate_size=1152,
        num_hidden_layers=22,
        num_attention_heads=12,
        local_attention=128,
        global_attn_every_n_layers=3,
        bos_token_id=101,
        cls_token_id=101,
        eos_token_id=102,
        sep_token_id=102,
    ),
    "deberta-v3": lambda: transformers.DebertaV2Config(
        **COMMON,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        relative_attention=True,
        position_buckets=256,
        pos_att_type="p2c|c2p",
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        type_vocab_size=0,
        max_relative_positions=-1,
    ),
}
TOLERANCE = 1e-4
BATCH = 32
SST = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst" / "train.txt"
_LEAF = re.compile(r"\(\d+ ([^()]+)\)")  # a leaf "(label word)" of a PTB tree


def read_sst(path: Path, n: int) -> list[list[str]]:
    """The leaves of the first n trees (one per line): SST sentences split into words."""
    if not path.is_file():
        sys.exit(f"error: {path} is missing; pass the shared data folder's sst/train.txt with --sst FILE")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    return [_LEAF.findall(line) for line in lines]


def build(shape: str, folder: Path) -> Path:
    torch.manual_seed(0)
    transformers.AutoModel.from_config(SHAPES[shape]()).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(resolve_model_path("minilm") / name, folder / name)
    return folder


def reference(folder: Path, word_lists: list[list[str]], tok, model) -> tuple[list[np.ndarray], int]:
    lengths = [len(ids) for ids in tok(word_lists, is_split_into_words=True)["input_ids"]]
    order = sorted(range(len(word_lists)), key=lengths.__getitem__)
    out: list = [None] * len(word_lists)
    tokens = 0
    with torch.inference_mode():
        for start in range(0, len(order), BATCH):
            idx = order[start : start + BATCH]
            batch = [word_lists[i] for i in idx]
            enc = tok(batch, is_split_into_words=True, padding=True, return_tensors="pt")
            hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
            b, t, h = hidden.shape
            tokens += int(enc["attention_mask"].sum())
            rows, slots, offsets = [], [], [0]
            for r in range(b):
                for pos, w in enumerate(enc.word_ids(r)):
                    if w is not None:
                        rows.append(r * t + pos)
                        slots.append(offsets[-1] + w)
                offsets.append(offsets[-1] + len(batch[r]))
            slot = torch.tensor(slots)
            sums = torch.zeros(offsets[-1], h).index_add_(0, slot, hidden.reshape(b * t, h)[rows])
            vectors = (sums / torch.zeros(offsets[-1]).index_add_(0, slot, torch.ones(len(slots)))[:, None]).numpy()
            for r, i in enumerate(idx):
                out[i] = vectors[offsets[r] : offsets[r + 1]]
    return out, tokens


def max_abs_diff(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    if any(a.shape != b.shape for a, b in zip(ours, theirs, strict=True)):
        return float("inf")
    return max(float(np.abs(a - b).max(initial=0.0)) for a, b in zip(ours, theirs))


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--limit", type=int, default=400, help="SST sentences (default 400)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sst", type=Path, default=SST, help="SST's train.txt (PTB trees)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    words = read_sst(args.sst, args.limit)
    print(
        f"CPU: {cpu_description()}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{args.threads} threads; load average before: {loadavg()}"
    )
    rows, failed = [], False
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = build(shape, Path(tmp))
            ours = Featurizer(str(folder), layers=-1, pooling="mean", compile=False, num_threads=args.threads)
            tok = transformers.AutoTokenizer.from_pretrained(folder)
            model = transformers.AutoModel.from_pretrained(folder).eval()
            ours.embed_words(words[:64]), reference(folder, words[:64], tok, model)  # warm-up
            best = {"ctxrep": float("inf"), "transformers": float("inf")}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                a = ours.embed_words(words)
                best["ctxrep"] = min(best["ctxrep"], time.perf_counter() - t0)
                t0 = time.perf_counter()
                b, tokens = reference(folder, words, tok, model)
                best["transformers"] = min(best["transformers"], time.perf_counter() - t0)
            diff = max_abs_diff(a, b)
            failed |= not diff < TOLERANCE
            ratio = best["transformers"] / best["ctxrep"]
            rows.append(
                [
                    shape,
                    f"{tokens:,}",
                    f"{tokens / best['ctxrep']:,.0f}",
                    f"{tokens / best['transformers']:,.0f}",
                    f"{ratio:.2f}x",
                    f"{diff:.1e}",
                ]
            )
            print(
                f"{shape}: ctxrep {tokens / best['ctxrep']:,.0f} tokens/s, transformers "
                f"{tokens / best['transformers']:,.0f} tokens/s ({ratio:.2f}x), max |diff| {diff:.1e}",
                flush=True,
            )
    print("\n| shape | tokens | ctxrep tokens/s | transformers tokens/s | ratio | max abs diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nload average after: {loadavg()}")
    if failed:
        sys.exit(f"error: word vectors differ by more than {TOLERANCE:g}")


if __name__ == "__main__":
    main()
