#!/usr/bin/env python
"""The host's share of embedding: every pipeline on an encoder so small that its compute is ~0, in one run.

The encoder: a BERT of 1 layer, 32 wide (2 heads, 64 intermediate), random weights (seed 0), with MiniLM's vocabulary
and tokenizer, saved once into a temporary sentence-transformers folder (Transformer -> mean Pooling -> Normalize), so
that every system below reads the same folder. What is left to time is the host: tokenization, batching, padding,
copies, pooling, numpy output.

  bare tokenizer          tokenizers.Tokenizer.encode_batch over the raw sentences, batches of 1,024 (the floor)
  tokenizer, word_ids     encode_batch over the word lists (is_pretokenized), each encoding's word_ids read
  tokenizer, no offsets   encode_batch_fast over the raw sentences, batches of 1,024: the same ids without character
                          offsets (what ctxrep's sentence path calls; shown, not a target's reference)
  sentence-transformers   SentenceTransformer(folder).encode(sentences, batch_size=256), numpy out
  transformers, mask mean AutoTokenizer + AutoModel, batches of 256 sorted by length, mean over the attention mask,
                          normalised (what sentence-transformers computes)
  ctxrep embed_sentences  Featurizer(folder, sentence_pooling="model", compile=False).embed_sentences(sentences)
  transformers, words     AutoTokenizer (is_split_into_words) + AutoModel, sorted batches of 256, each word the mean
                          of its pieces (word_ids)
  ctxrep embed_words      Featurizer(folder, pooling="mean", compile=False).embed_words(word lists)

Targets (issue 32, ratios within this one run): ctxrep's sentences >= 1.5x sentence-transformers and >= 0.6x the bare
tokenizer; ctxrep's words >= 1.5x the transformers word reference. ctxrep's vectors must equal the references' to
max |difference| < 1e-4 (else exit 1). tokens = the bare tokenizer's ids with [CLS]/[SEP], counted once.
Each system is warmed up on 256 sentences; the timed runs go round-robin and the best of --repeats is kept.
The CPU's model and flags, the thread count and the load average before and after are printed: on a shared machine
compare the ratios of one run, not absolute numbers.

Run:  .venv/bin/python benchmarks/host_overhead.py                       # 17,088 SST sentences (SST train x2), ~1 min
      .venv/bin/python benchmarks/host_overhead.py --sentences 2000      # quick trial (not a benchmark result)
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from _common import DEFAULT_DATA, read_sst, report, tiny_folder

TOLERANCE = 1e-4
TARGET_VS_ST = 1.5
TARGET_VS_TOKENIZER = 0.6
TARGET_WORDS_VS_HF = 1.5
REF_BATCH = 256
TOKENIZER_BATCH = 1024
# the rows the targets and the checks read
TOKENIZER = "the bare fast tokenizer, batches of 1,024"
ST = "sentence-transformers encode (batch 256)"
HF_SENTENCES = "transformers, sorted batches of 256, mean over the mask"
CTXREP_SENTENCES = "ctxrep embed_sentences (model pooling)"
HF_WORDS = "transformers, word lists, mean of each word's pieces"
CTXREP_WORDS = "ctxrep embed_words"


# ---- the references ----------------------------------------------------------------------------------------------


class BareTokenizer:
    def __init__(self, folder: Path) -> None:
        import tokenizers

        self.tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tok.no_truncation()
        self.tok.no_padding()

    def sentences(self, texts: Sequence[str]) -> int:
        """Token count; the encodings themselves are the output."""
        n = 0
        for k in range(0, len(texts), TOKENIZER_BATCH):
            n += sum(len(e) for e in self.tok.encode_batch(texts[k : k + TOKENIZER_BATCH]))
        return n

    def sentences_fast(self, texts: Sequence[str]) -> int:
        """encode_batch_fast: the same ids without character offsets (what ctxrep's sentence path calls)."""
        n = 0
        for k in range(0, len(texts), TOKENIZER_BATCH):
            n += sum(len(e) for e in self.tok.encode_batch_fast(texts[k : k + TOKENIZER_BATCH]))
        return n

    def words(self, word_lists: Sequence[list[str]]) -> int:
        n = 0
        for k in range(0, len(word_lists), TOKENIZER_BATCH):
            encs = self.tok.encode_batch(word_lists[k : k + TOKENIZER_BATCH], is_pretokenized=True)
            n += sum(len(e.word_ids) for e in encs)
        return n


class TransformersReference:
    """AutoTokenizer + AutoModel, batches of REF_BATCH texts sorted by length."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()

    def _batches(self, texts, split: bool):
        lengths = [len(ids) for ids in self.tokenizer(list(texts), is_split_into_words=split)["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        for start in range(0, len(order), REF_BATCH):
            idx = order[start : start + REF_BATCH]
            yield (
                idx,
                self.tokenizer([texts[i] for i in idx], is_split_into_words=split, padding=True, return_tensors="pt"),
            )

    def sentences(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for idx, enc in self._batches(texts, split=False):
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1)
                out[idx] = torch.nn.functional.normalize(mean, dim=-1).numpy()
        return out

    def words(self, word_lists: Sequence[list[str]]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(word_lists)
        with torch.inference_mode():
            for idx, enc in self._batches(word_lists, split=True):
                hidden = self.model(**enc).last_hidden_state
                b, t, h = hidden.shape
                rows, slots, offsets = [], [], [0]
                for r in range(b):
                    for pos, w in enumerate(enc.word_ids(r)):
                        if w is not None:
                            rows.append(r * t + pos)
                            slots.append(offsets[-1] + w)
                    offsets.append(offsets[-1] + len(word_lists[idx[r]]))
                slot = torch.tensor(slots)
                sums = torch.zeros(offsets[-1], h).index_add_(0, slot, hidden.reshape(b * t, h)[torch.tensor(rows)])
                counts = torch.zeros(offsets[-1]).index_add_(0, slot, torch.ones(len(slots)))
                vectors = (sums / counts[:, None]).numpy()
                for r, i in enumerate(idx):
                    out[i] = vectors[offsets[r] : offsets[r + 1]]
        return out  # type: ignore[return-value]


def max_diff(a, b) -> float:
    a = np.concatenate(a) if isinstance(a, list) else a
    b = np.concatenate(b) if isinstance(b, list) else b
    return float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/train.txt)")
    p.add_argument("--sentences", type=int, default=17088, help="SST train repeated to this many (default: 2x)")
    p.add_argument("--threads", type=int, default=2, help="torch and tokenizer threads (default: 2)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--markdown-out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # the tokenizers' thread pool, read when it first runs
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    torch.set_num_threads(args.threads)
    import transformers
    from sentence_transformers import SentenceTransformer

    from ctxrep import Featurizer
    from ctxrep.runtime.hardware import cpu_description

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()  # the tiny model has no pooler: its load report is expected
    word_lists = read_sst(args.data / "sst" / "train.txt", args.sentences)
    texts = [" ".join(w) for w in word_lists]
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_folder(Path(tmp) / "tiny")
        bare = BareTokenizer(folder)
        hf = TransformersReference(folder)
        st = SentenceTransformer(str(folder), device="cpu").eval()
        fz_sentences = Featurizer(folder, sentence_pooling="model", compile=False)
        fz_words = Featurizer(folder, pooling="mean", compile=False)
        systems: dict[str, Callable] = {
            TOKENIZER: lambda: bare.sentences(texts),
            "tokenizer on word lists, with word_ids": lambda: bare.words(word_lists),
            "the bare tokenizer without offsets (encode_batch_fast)": lambda: bare.sentences_fast(texts),
            ST: lambda: st.encode(texts, batch_size=REF_BATCH, convert_to_numpy=True, show_progress_bar=False),
            HF_SENTENCES: lambda: hf.sentences(texts),
            CTXREP_SENTENCES: lambda: fz_sentences.embed_sentences(texts),
            HF_WORDS: lambda: hf.words(word_lists),
            CTXREP_WORDS: lambda: fz_words.embed_words(word_lists),
        }
        tokens = bare.sentences(texts) + 2 * len(texts)  # with [CLS] and [SEP]
        warm_texts, warm_words = texts[:256], word_lists[:256]
        fz_sentences.embed_sentences(warm_texts)
        fz_words.embed_words(warm_words)
        st.encode(warm_texts, batch_size=REF_BATCH, show_progress_bar=False)
        hf.sentences(warm_texts)
        hf.words(warm_words)
        bare.sentences(warm_texts)
        load_before = load_average()
        best = dict.fromkeys(systems, float("inf"))
        outputs = {}
        for _ in range(args.repeats):
            for name, run in systems.items():
                gc.collect()
                t0 = time.perf_counter()
                out = run()
                best[name] = min(best[name], time.perf_counter() - t0)
                outputs.setdefault(name, out)
        load_after = load_average()

    names = list(systems)
    speed = {name: tokens / best[name] for name in names}
    tokenizer_speed = speed[TOKENIZER]
    checks = [  # (what, ours, reference, target)
        ("ctxrep sentences / sentence-transformers", CTXREP_SENTENCES, ST, TARGET_VS_ST),
        ("ctxrep sentences / bare tokenizer", CTXREP_SENTENCES, TOKENIZER, TARGET_VS_TOKENIZER),
        ("ctxrep words / transformers words", CTXREP_WORDS, HF_WORDS, TARGET_WORDS_VS_HF),
    ]
    rows = [f"| {n} | {speed[n]:,.0f} | {speed[n] / tokenizer_speed:.2f}x |" for n in names]
    lines = [
        f"| pipeline (tiny encoder, {len(texts):,} SST sentences, {tokens:,} tokens, {args.threads} threads) "
        "| tok/s | vs bare tokenizer |",
        "| --- | ---: | ---: |",
        *rows,
        "",
        "| ratio | measured | target | met |",
        "| --- | ---: | ---: | --- |",
    ]
    for what, ours, ref, target in checks:
        ratio = speed[ours] / speed[ref]
        lines.append(f"| {what} | {ratio:.2f}x | >= {target}x | {'yes' if ratio >= target else 'no'} |")
    failed = []
    for ours, ref in ((CTXREP_SENTENCES, ST), (CTXREP_SENTENCES, HF_SENTENCES), (CTXREP_WORDS, HF_WORDS)):
        diff = max_diff(outputs[ours], outputs[ref])
        lines.append(f"- max |difference| {ours} vs {ref}: {diff:.1e}")
        if not diff < TOLERANCE:
            failed.append(f"{ours} vs {ref}: max |difference| {diff:.3g} >= {TOLERANCE:g}")
    lines += [
        f"- CPU: {cpu_description()}; {args.threads} threads; torch {torch.__version__}, transformers "
        f"{transformers.__version__}; python {platform.python_version()}",
        f"- load average before {load_before}, after {load_after}; best of {args.repeats}",
    ]
    text = "\n".join(lines)
    return report(text, args.markdown_out, failed)


if __name__ == "__main__":
    sys.exit(main())
