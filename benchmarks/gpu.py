#!/usr/bin/env python
"""ctxrep on a GPU against transformers and sentence-transformers, on the same work, at each precision, in one run.

Two pieces of work over the same real sentences (SST train leaves, the corpus repeated up to --sentences):

  words      one vector per word = the mean of its pieces in MiniLM's last layer
               ctxrep        Featurizer(model, device=, precision=).embed_words(word lists)
               transformers  AutoTokenizer (fast, is_split_into_words) + AutoModel (sdpa attention) in the same
                             dtype, batches of --ref-batch sentences sorted by length, pooled on the GPU with
                             index_add_ (word_ids), vectors copied back per batch
  sentences  one vector per sentence, as the sentence-transformers folder defines it (mean over all tokens, then
             L2 normalisation for all-MiniLM-L6-v2)
               ctxrep                 Featurizer(model, sentence_pooling="model", device=, precision=).embed_sentences
               sentence-transformers  SentenceTransformer(folder, device=).to(dtype).encode(texts, batch_size=
                                      --ref-batch), numpy out (it sorts by length itself)
               transformers           AutoModel, mean over the attention mask, normalised, sorted batches

precisions: fp32, bf16, fp16 (the peers cast their models with .to(dtype); ctxrep's precision= does the same to an
inference copy). Every system's output is compared with ctxrep float32: max |difference| for float32 rows (must be
< 1e-4 for ctxrep vs transformers, else exit 1), mean cosine for the half-precision rows.

Timing: text in, numpy vectors out, model loading excluded; torch.cuda.synchronize around each run; one warm-up
run per system on --warmup sentences; the best of --repeats round-robin runs.

Run on a GPU:   python benchmarks/gpu.py --device cuda --model DIR --data DIR
Smoke on CPU:   .venv/bin/python benchmarks/gpu.py --device cpu --sentences 64 --precisions fp32 bf16
"""

from __future__ import annotations

import argparse
import gc
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import transformers

from ctxrep import Featurizer
from ctxrep.runtime.hardware import cpu_description

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = 1e-4
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
_SST_LEAF = re.compile(r"\(\d+ ([^()]+)\)")


def read_sst(path: Path, n: int) -> list[list[str]]:
    """The leaves of the PTB trees in `path`, one word list per tree, the file repeated until there are n."""
    trees = [_SST_LEAF.findall(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not trees:
        sys.exit(f"error: {path} holds no trees")
    return [trees[i % len(trees)] for i in range(n)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the peers --------------------------------------------------------------------------------------------------


class TransformersWords:
    """AutoTokenizer + AutoModel on `device` in `dtype`; words = mean of their pieces, pooled on the device."""

    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype, batch: int) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(device).eval()
        self.device, self.batch = device, batch

    def _batches(self, word_lists: Sequence[list[str]]):
        lengths = [len(ids) for ids in self.tokenizer(list(word_lists), is_split_into_words=True)["input_ids"]]
        order = sorted(range(len(word_lists)), key=lengths.__getitem__)
        for start in range(0, len(order), self.batch):
            idx = order[start : start + self.batch]
            enc = self.tokenizer(
                [word_lists[i] for i in idx], is_split_into_words=True, padding=True, return_tensors="pt"
            )
            yield idx, enc

    def embed_words(self, word_lists: Sequence[list[str]]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(word_lists)
        with torch.inference_mode():
            for idx, enc in self._batches(word_lists):
                hidden = self.model(**{k: v.to(self.device) for k, v in enc.items()}).last_hidden_state
                b, t, h = hidden.shape
                rows, slots, offsets = [], [], [0]
                for r in range(b):
                    for pos, w in enumerate(enc.word_ids(r)):
                        if w is not None:
                            rows.append(r * t + pos)
                            slots.append(offsets[-1] + w)
                    offsets.append(offsets[-1] + len(word_lists[idx[r]]))
                slot = torch.tensor(slots, device=self.device)
                flat = hidden.reshape(b * t, h)[torch.tensor(rows, device=self.device)].float()
                sums = torch.zeros(offsets[-1], h, device=self.device).index_add_(0, slot, flat)
                counts = torch.zeros(offsets[-1], device=self.device).index_add_(
                    0, slot, torch.ones_like(slot, dtype=torch.float)
                )
                vectors = (sums / counts[:, None]).cpu().numpy()
                for r, i in enumerate(idx):
                    out[i] = vectors[offsets[r] : offsets[r + 1]]
        return out  # type: ignore[return-value]

    def embed_sentences(self, texts: Sequence[list[str]]) -> np.ndarray:
        """Mean over the attention mask, L2-normalised (all-MiniLM-L6-v2's Pooling + Normalize)."""
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for idx, enc in self._batches(texts):
                enc = {k: v.to(self.device) for k, v in enc.items()}
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).float()
                mean = (hidden * mask).sum(1) / mask.sum(1)
                out[idx] = torch.nn.functional.normalize(mean, dim=-1).cpu().numpy()
        return out


class SentenceTransformersSentences:
    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype, batch: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(folder), device=str(device)).to(dtype).eval()
        self.batch = batch

    def embed_sentences(self, texts: Sequence[list[str]]) -> np.ndarray:
        joined = [" ".join(t) for t in texts]
        return self.model.encode(joined, batch_size=self.batch, convert_to_numpy=True, show_progress_bar=False).astype(
            np.float32
        )


# ---- measuring ---------------------------------------------------------------------------------------------------


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)))


def compare(ours, reference) -> tuple[float, float]:
    """(max |difference|, mean cosine) of two outputs (lists of per-sentence arrays, or one array)."""
    a = np.concatenate(ours) if isinstance(ours, list) else ours
    b = np.concatenate(reference) if isinstance(reference, list) else reference
    if a.shape != b.shape:
        return float("inf"), 0.0
    return float(np.abs(a - b).max()), mean_cosine(a, b)


def fmt_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in [header[c]] + [r[c] for r in rows]) for c in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "| " + " | ".join("-" * w for w in widths) + " |"] + [line(r) for r in rows])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="minilm", help="ctxrep model name or folder (a sentence-transformers folder)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/train.txt)")
    p.add_argument("--sentences", type=int, default=34176, help="SST train repeated to this many (default: 4x)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"], choices=list(DTYPES))
    p.add_argument("--ref-batch", type=int, default=256, help="sentences per batch of the peers (default: 256)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=512)
    p.add_argument("--skip", nargs="*", default=[], choices=["transformers", "sentence-transformers", "sentences"])
    p.add_argument("--markdown-out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    transformers.utils.logging.disable_progress_bar()
    sentences = read_sst(args.data / "sst" / "train.txt", args.sentences)
    base = Featurizer(args.model, layers=-1, pooling="mean")
    folder = base.source.folder
    tokens = sum(len(a.tokens) + 2 for a in base.tokenize(sentences))
    warm = sentences[: args.warmup]

    # (task, system, precision) -> run; every run returns numpy vectors
    systems: dict[tuple[str, str, str], Callable] = {}
    for p in args.precisions:
        fz = Featurizer(args.model, layers=-1, pooling="mean", device=device, precision=p, compile=False)
        systems["words", "ctxrep", p] = fz.embed_words
        if "transformers" not in args.skip:
            systems["words", "transformers", p] = TransformersWords(
                folder, device, DTYPES[p], args.ref_batch
            ).embed_words
        if "sentences" in args.skip:
            continue
        fs = Featurizer(args.model, layers=-1, sentence_pooling="model", device=device, precision=p, compile=False)
        systems["sentences", "ctxrep", p] = fs.embed_sentences
        if "sentence-transformers" not in args.skip:
            try:
                st = SentenceTransformersSentences(folder, device, DTYPES[p], args.ref_batch)
                systems["sentences", "sentence-transformers", p] = st.embed_sentences
            except ImportError:
                print("note: sentence-transformers is not installed; its rows are left out", file=sys.stderr)
        if "transformers" not in args.skip:
            hf = TransformersWords(folder, device, DTYPES[p], args.ref_batch)
            systems["sentences", "transformers", p] = hf.embed_sentences

    for run in systems.values():
        run(warm)
    sync(device)
    best = {k: float("inf") for k in systems}
    outputs = {}
    for _ in range(args.repeats):
        for key, run in systems.items():
            gc.collect()
            sync(device)
            t0 = time.perf_counter()
            out = run(sentences)
            sync(device)
            best[key] = min(best[key], time.perf_counter() - t0)
            outputs.setdefault(key, out)

    failed = []
    rows = []
    for key in systems:
        task, system, p = key
        reference = outputs.get((task, "ctxrep", "fp32"))
        diff, cosine = compare(outputs[key], reference) if reference is not None else (float("nan"), float("nan"))
        if p == "fp32" and system == "transformers" and task == "words" and not diff < TOLERANCE:
            failed.append(f"{task} {system} fp32: max abs diff {diff:.3g} >= {TOLERANCE:g}")
        speed = tokens / best[key]
        peers = [best[(task, s, p)] for (t, s, q) in systems if t == task and q == p and s != "ctxrep"]
        ours = best.get((task, "ctxrep", p))
        ratio = (
            f"{min(peers) / ours:.2f}x"
            if system == "ctxrep" and peers and ours
            else f"{ours / best[key]:.2f}x"
            if ours
            else "-"
        )
        rows.append([task, system, p, f"{best[key]:.2f}", f"{speed:,.0f}", ratio, f"{diff:.1e}", f"{cosine:.5f}"])
    header = [
        "work",
        "system",
        "precision",
        "wall (s)",
        "tokens/s",
        "ctxrep vs fastest peer / peer vs ctxrep",
        "max abs diff vs ctxrep fp32",
        "mean cosine",
    ]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU run)"
    notes = [
        f"device: {device} ({gpu}); CPU: {cpu_description()}; torch {torch.__version__}; python {platform.python_version()}",
        f"{len(sentences):,} sentences (SST train repeated), {tokens:,} tokens with [CLS]/[SEP]; model {args.model} "
        f"({base.model.num_layers} layers x {base.model.hidden_size}); peers' batches: {args.ref_batch} sentences; "
        f"ctxrep's token budget: {Featurizer(args.model, device=device).batch_tokens:,}; best of {args.repeats}.",
    ]
    text = fmt_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    print(text)
    if args.markdown_out:
        args.markdown_out.write_text(text + "\n")
    for f in failed:
        print(f"error: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
