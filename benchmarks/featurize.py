#!/usr/bin/env python
"""Word vectors from real sentences: ctxrep's Featurizer against plain transformers, in one run.

The work: N real English sentences (SST train leaves, or UD EWT `# text` lines), already split into words;
one vector per word = the mean of the word's subword pieces in the last layer of MiniLM-L6 (384 wide).

  ctxrep   Featurizer("minilm", layers=-1, pooling="mean").embed_words(word_lists)
  A        transformers AutoTokenizer (fast, is_split_into_words=True, padding=True, truncation=False) +
           BertModel (eval, inference_mode), batches of 32 in corpus order, then each word's pieces
           mean-pooled from last_hidden_state with the tokenizer's word_ids()
  B        the same as A, but batches of 32 over the sentences sorted by subword length (one extra
           tokenizer pass finds the lengths; it is timed), results put back in corpus order

Everything after model loading is timed: tokenization, padding, the encoder, pooling, numpy output.
The reference pooling is vectorised (one index_add_ per batch), not a Python loop per word, so the
comparison is with a careful user, not a slow one. Each system is warmed up once on a few batches;
the timed runs go round-robin (ctxrep, A, B, ctxrep, A, B, ...) and the best of --repeats is kept.

tokens = non-pad subword tokens including [CLS]/[SEP]; the count is checked to be the same for all three.
The word vectors must agree: max |ctxrep - reference| over all words < 1e-4, or the script exits with 1.

Run:  .venv/bin/python benchmarks/featurize.py                 # 4,000 SST sentences, 2 threads
      .venv/bin/python benchmarks/featurize.py --limit 300     # quick trial (not a benchmark result)
      .venv/bin/python benchmarks/featurize.py --repeats 3 --markdown-out bench.md
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, BertModel

from ctxrep.featurize import Featurizer

MODEL = "minilm"
MIN_SENTENCES = 2000
TOLERANCE = 1e-4
REF_BATCH = 32
TARGET_VS_A = 2.5
TARGET_VS_B = 1.1
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
_SST_LEAF = re.compile(r"\(\d+ ([^()]+)\)")  # a leaf node "(label word)"; words never hold parentheses (-LRB-)


# ---- corpus ---------------------------------------------------------------------------------------


def read_sst(path: Path, n: int) -> list[list[str]]:
    """The leaves, in order, of the first n PTB trees (one tree per line), kept as written (-LRB-, \\/).
    A few leaves hold a no-break space (U+00A0, as in "8 1/2"); such a leaf stays one word."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(_SST_LEAF.findall(line))
            if len(out) == n:
                break
    return out


def read_ud(path: Path, n: int) -> list[list[str]]:
    """The first n `# text = ...` lines, split on whitespace."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("# text = "):
                out.append(line[len("# text = ") :].split())
            if len(out) == n:
                break
    return out


CORPORA = {  # name: (file under the data dir, reader)
    "sst": ("sst/train.txt", read_sst),
    "ud": ("ud_english_ewt/en_ewt-ud-train.conllu", read_ud),
}


def load_corpus(data_dir: Path, corpus: str, n: int) -> list[list[str]]:
    if not data_dir.is_dir():
        sys.exit(
            f"error: the data directory {data_dir} does not exist. The benchmark reads real sentences from the shared "
            "data folder that sits beside the checkout (../shared/data); pass its location with --data DIR."
        )
    rel, reader = CORPORA[corpus]
    path = data_dir / rel
    if not path.is_file():
        sys.exit(f"error: {path} is missing: --data {data_dir} does not look like the shared data folder")
    sentences = reader(path, n)
    if len(sentences) < n:
        sys.exit(f"error: asked for {n:,} sentences but {path} has only {len(sentences):,}")
    empty = [i for i, s in enumerate(sentences) if not s]
    if empty:
        sys.exit(f"error: {path}: sentences {empty[:5]} have no words")
    return sentences


# ---- the reference: plain transformers ------------------------------------------------------------


class Reference:
    """AutoTokenizer + BertModel, fed batches of `batch_size`, each word mean-pooled from its pieces."""

    def __init__(self, path: Path, batch_size: int = REF_BATCH) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not self.tokenizer.is_fast:
            sys.exit(f"error: AutoTokenizer gave a slow tokenizer for {path}; the reference needs the fast one")
        self.model = BertModel.from_pretrained(path).eval()
        self.batch_size = batch_size

    def embed_words(self, word_lists: Sequence[list[str]], sort: bool) -> tuple[list[np.ndarray], int, int]:
        """One (n_words, hidden) float32 array per sentence, in corpus order; plus (real tokens, padded tokens)."""
        n = len(word_lists)
        if sort:
            lengths = [len(ids) for ids in self.tokenizer(list(word_lists), is_split_into_words=True)["input_ids"]]
            order = sorted(range(n), key=lengths.__getitem__)
        else:
            order = list(range(n))
        out: list[np.ndarray | None] = [None] * n
        real = padded = 0
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = [word_lists[i] for i in idx]
                enc = self.tokenizer(
                    batch, is_split_into_words=True, padding=True, truncation=False, return_tensors="pt"
                )
                hidden = self.model(**enc).last_hidden_state  # (b, t, h)
                b, t, h = hidden.shape
                real += int(enc["attention_mask"].sum())
                padded += b * t
                # Mean of each word's pieces: row r*t+pos of the flattened batch goes to word slot offset(r)+word.
                rows, slots, offsets = [], [], [0]
                for r in range(b):
                    for pos, w in enumerate(enc.word_ids(r)):
                        if w is not None:
                            rows.append(r * t + pos)
                            slots.append(offsets[-1] + w)
                    offsets.append(offsets[-1] + len(batch[r]))
                slot_index = torch.tensor(slots)
                sums = torch.zeros(offsets[-1], h).index_add_(0, slot_index, hidden.reshape(b * t, h)[rows])
                counts = torch.zeros(offsets[-1]).index_add_(0, slot_index, torch.ones(len(slots)))
                vectors = (sums / counts[:, None]).numpy()
                for r, i in enumerate(idx):
                    out[i] = vectors[offsets[r] : offsets[r + 1]]
        return out, real, padded  # type: ignore[return-value]


# ---- measuring ------------------------------------------------------------------------------------


def max_abs_diff(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """Largest |difference| over all word vectors; inf if a shape differs, nan if any value is nan."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            return float("inf")
        if np.isnan(a).any() or np.isnan(b).any():
            return float("nan")
        worst = max(worst, float(np.abs(a - b).max(initial=0.0)))
    return worst


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt_table(header: list[str], rows: list[list[str]], markdown: bool, text_columns: int = 1) -> str:
    """Plain text or Markdown; the first `text_columns` columns are left-aligned, the others right-aligned."""
    right = [c >= text_columns for c in range(len(header))]
    widths = [max(len(x) for x in [header[c]] + [r[c] for r in rows]) for c in range(len(header))]

    def line(cells: list[str]) -> str:
        cells = [c.rjust(w) if rj else c.ljust(w) for c, w, rj in zip(cells, widths, right)]
        return "| " + " | ".join(cells) + " |" if markdown else "  ".join(cells)

    if markdown:
        rule = "| " + " | ".join("-" * (w - 1) + ":" if rj else "-" * w for w, rj in zip(widths, right)) + " |"
    else:
        rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule] + [line(r) for r in rows])


def mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def logical_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ---- main -----------------------------------------------------------------------------------------

System = Callable[[Sequence[list[str]]], tuple[list[np.ndarray], int, int]]  # -> vectors, real tokens, padded


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"the shared data folder (default: {DEFAULT_DATA})")
    p.add_argument("--corpus", choices=sorted(CORPORA), default="sst", help="SST train or UD EWT train (default: sst)")
    p.add_argument("--sentences", type=int, default=4000, help=f"corpus size, >= {MIN_SENTENCES:,} (default: 4000)")
    p.add_argument("--limit", type=int, help="quick trial on this many sentences (any number; not a benchmark result)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for all systems (default: 2)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per system; the best is reported (default: 1)")
    p.add_argument("--warmup", type=int, default=64, help="sentences in each system's untimed warm-up (default: 64)")
    p.add_argument("--markdown-out", type=Path, metavar="FILE", help="also write the Markdown table to FILE")
    args = p.parse_args(argv)
    if args.limit is None and args.sentences < MIN_SENTENCES:
        p.error(f"--sentences must be at least {MIN_SENTENCES:,}; use --limit for a quick trial")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    if args.threads < 1 or args.repeats < 1 or args.warmup < 1:
        p.error("--threads, --repeats and --warmup must be at least 1")
    return args


def ctxrep_system(featurizer: Featurizer) -> System:
    """embed_words, with the encoder's real and padded input sizes counted by a forward pre-hook."""
    seen = {"real": 0, "padded": 0}

    def count_inputs(_module, inputs, kwargs) -> None:
        seen["padded"] += inputs[0].numel()
        seen["real"] += int(kwargs["attention_mask"].sum())

    featurizer._encoder.register_forward_pre_hook(count_inputs, with_kwargs=True)

    def run(sentences: Sequence[list[str]]) -> tuple[list[np.ndarray], int, int]:
        seen["real"] = seen["padded"] = 0
        vectors = featurizer.embed_words(sentences)
        return vectors, seen["real"], seen["padded"]

    return run


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    n = args.limit if args.limit is not None else args.sentences
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()

    sentences = load_corpus(args.data, args.corpus, n)
    featurizer = Featurizer(MODEL, layers=-1, pooling="mean", num_threads=args.threads)
    reference = Reference(featurizer.source.folder)  # the folder the featurizer resolved MODEL to

    # Token count from the tokenizer (untimed); each system's attention masks must add up to the same.
    special = featurizer.tokenizer.template.num_special(pair=False)
    lengths = [len(a.tokens) + special for a in featurizer.tokenize(sentences)]
    tokens = sum(lengths)
    if max(lengths) > featurizer.max_length:
        sys.exit(
            f"error: a sentence has {max(lengths)} tokens, more than the model's {featurizer.max_length}: ctxrep "
            "would window it and the reference cannot run it; choose other sentences"
        )

    systems: dict[str, System] = {
        "ctxrep": ctxrep_system(featurizer),
        "A": lambda s: reference.embed_words(s, sort=False),
        "B": lambda s: reference.embed_words(s, sort=True),
    }
    warm = sentences[: args.warmup]
    for run in systems.values():
        run(warm)

    # Round-robin timed runs; the first run's vectors are kept for the check.
    best = {name: float("inf") for name in systems}
    outputs: dict[str, list[np.ndarray]] = {}
    padded: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, run in systems.items():
            gc.collect()
            t0 = time.perf_counter()
            vectors, real, pad = run(sentences)
            best[name] = min(best[name], time.perf_counter() - t0)
            if real != tokens:
                sys.exit(f"error: {name} ran {real:,} real tokens but the corpus has {tokens:,}")
            outputs.setdefault(name, vectors)
            padded[name] = pad
            del vectors

    diffs = {name: max_abs_diff(outputs["ctxrep"], outputs[name]) for name in ("A", "B")}
    worst = max(diffs.values(), key=lambda d: float("inf") if np.isnan(d) else d)
    outputs.clear()
    speed = {name: tokens / best[name] for name in systems}
    ratio_a, ratio_b = speed["ctxrep"] / speed["A"], speed["ctxrep"] / speed["B"]

    def row(name: str, label: str, batching: str, diff: str) -> list[str]:
        pad_share = f"{1 - tokens / padded[name]:.0%}"
        return [label, batching, f"{best[name]:.2f}", f"{speed[name]:,.0f}", pad_share, diff]

    header = ["system", "batching", "wall time (s)", "tokens/s", "padding", "max abs diff vs ctxrep"]
    rows = [
        row("ctxrep", "ctxrep Featurizer", f"length-sorted, {featurizer.batch_tokens:,}-token budget", "-"),
        row("A", "A: transformers", f"corpus order, {REF_BATCH} sentences", f"{diffs['A']:.1e}"),
        row("B", "B: transformers", f"length-sorted, {REF_BATCH} sentences", f"{diffs['B']:.1e}"),
    ]
    ratio_header = ["check", "measured", "target", "result"]
    ratio_rows = [
        ["ctxrep / A", f"{ratio_a:.2f}x", f">= {TARGET_VS_A}x", mark(ratio_a >= TARGET_VS_A)],
        ["ctxrep / B", f"{ratio_b:.2f}x", f">= {TARGET_VS_B}x", mark(ratio_b >= TARGET_VS_B)],
        ["outputs equal", f"{worst:.1e}", f"< {TOLERANCE:g}", mark(worst < TOLERANCE)],
    ]
    trial = f" QUICK TRIAL (--limit {n}): not a benchmark result." if n < MIN_SENTENCES else ""
    notes = [
        f"corpus: {args.corpus} ({CORPORA[args.corpus][0]}), first {n:,} sentences, "
        f"{sum(len(s) for s in sentences):,} words, {tokens:,} tokens (non-pad, with [CLS]/[SEP]).{trial}",
        f"model: {MODEL} ({featurizer.num_layers} layers, {featurizer.dim} wide), last layer, mean of each word's "
        f"pieces; transformers attention: {reference.model.config._attn_implementation}.",
        "timing: tokenization through to numpy word vectors (model loading excluded); padding = share of the "
        f"encoder's input positions that are pad; warm-up {len(warm)} sentences per system; best of {args.repeats} "
        "round-robin run(s).",
        f"torch threads: {torch.get_num_threads()}; torch {torch.__version__}; "
        f"transformers {transformers.__version__}; python {platform.python_version()}; "
        f"CPU: {cpu_model()} ({logical_cpus()} logical CPUs).",
    ]

    print(fmt_table(header, rows, markdown=False, text_columns=2))
    print()
    print(fmt_table(ratio_header, ratio_rows, markdown=False))
    print()
    print("\n".join(notes))
    markdown = "\n".join(
        [fmt_table(header, rows, markdown=True, text_columns=2), ""]
        + [fmt_table(ratio_header, ratio_rows, markdown=True), ""]
        + [f"- {note}" for note in notes]
    )
    print("\n--- Markdown ---\n")
    print(markdown)
    if args.markdown_out is not None:
        args.markdown_out.write_text(markdown + "\n", encoding="utf-8")
        print(f"\n(written to {args.markdown_out})")

    if not worst < TOLERANCE:  # also true for nan
        print(f"\nerror: outputs differ: max abs diff {worst:.3g} is not < {TOLERANCE:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
