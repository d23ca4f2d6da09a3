#!/usr/bin/env python
"""Word vectors from real sentences: ctxrep's Featurizer against plain transformers and ONNX Runtime, in one run.

The work: N real English sentences (SST train leaves, or UD EWT `# text` lines), already split into words;
one vector per word = the mean of the word's subword pieces in the last layer of MiniLM-L6 (384 wide).

  ctxrep   Featurizer("minilm", layers=-1, pooling="mean").embed_words(word_lists)
  A        transformers AutoTokenizer (fast, is_split_into_words=True, padding=True, truncation=False) +
           BertModel (eval, inference_mode), batches of 32 in corpus order, then each word's pieces
           mean-pooled from last_hidden_state with the tokenizer's word_ids()
  B        the same as A, but batches of 32 over the sentences sorted by subword length (one extra
           tokenizer pass finds the lengths; it is timed), results put back in corpus order
  ctxrep compiled   Featurizer(..., compile=True): the encoder under torch.compile (compiled in the warm-up)
  ctxrep int8       Featurizer(..., quantize="int8"): SmoothQuant-calibrated int8 linear layers (ctxrep.fast)
  ORT f32  ONNX Runtime (graph optimisations ORT_ENABLE_ALL, the same threads) running ctxrep's ONNX export of
           the same weights (ctxrep.export, checked against PyTorch), fed by ctxrep's own tokenization, windows,
           length-sorted batches under the same token budget and pooling: only the encoder differs
  ORT int8 the same graph after onnxruntime.quantization.quantize_dynamic (its defaults: int8 weights per tensor,
           dynamic uint8 activations), as its documentation shows for Transformer models

GFLOP/s = tokens/s x the encoder's FLOPs per real token (2 x every linear layer's weights, plus attention's
4 x hidden x mean sequence length per layer): useful work, padding not counted.

Everything after model loading is timed: tokenization, padding, the encoder, pooling, numpy output.
The reference pooling is vectorised (one index_add_ per batch), not a Python loop per word, so the
comparison is with a careful user, not a slow one. Each system is warmed up once on a few batches;
the timed runs go round-robin (ctxrep, A, B, ctxrep, A, B, ...) and the best of --repeats is kept.

tokens = non-pad subword tokens including [CLS]/[SEP]; the count is checked to be the same for all three.
The word vectors must agree: max |ctxrep - reference| over all words < 1e-4 (float32 systems, ORT f32 and ctxrep
compiled included), or the script exits with 1; the int8 systems report their mean word-vector cosine to ctxrep's
float32 vectors (target for ctxrep int8: >= 0.99).

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
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, BertModel

from ctxrep.featurize import Featurizer
from ctxrep.models.outputs import EncoderOutput

MODEL = "minilm"
MIN_SENTENCES = 2000
TOLERANCE = 1e-4
REF_BATCH = 32
TARGET_VS_A = 2.5
TARGET_VS_B = 1.1
TARGET_VS_ORT = 1.1  # ctxrep compiled / ORT float32
TARGET_VS_ORT_INT8 = 1.0  # ctxrep int8 / ORT int8
TARGET_INT8_COSINE = 0.99
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


# ---- ONNX Runtime: the same pipeline, another encoder ------------------------------------------------


class OrtEncoder:
    """An InferenceSession behind the Encoder's `encode`: the last hidden state (only) as hidden_states[-1]."""

    def __init__(self, onnx_file: Path, num_layers: int, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.num_layers = num_layers

    def encode(self, batch, output_attentions: bool = False, num_layers: int | None = None) -> EncoderOutput:
        if num_layers is not None:
            sys.exit("error: the ONNX graph returns the last layer only; the benchmark asks for layers=-1")
        (last,) = self.session.run(None, {name: batch[name].numpy() for name in self.input_names})
        last = torch.from_numpy(last)  # (batch, seq, hidden)
        return EncoderOutput(last_hidden_state=last, hidden_states=(None,) * self.num_layers + (last,))


class OrtFeaturizer(Featurizer):
    """ctxrep's Featurizer (tokenization, windows, batches, pooling) with ONNX Runtime as the encoder."""

    def __init__(self, ort_encoder: OrtEncoder, **kwargs) -> None:
        super().__init__(MODEL, compile=False, **kwargs)
        self.ort_encoder = ort_encoder

    def _encoder_for(self, num_tokens: int) -> OrtEncoder:
        return self.ort_encoder


def ort_files(featurizer: Featurizer, folder: Path) -> tuple[Path, Path]:
    """ctxrep's ONNX export of the featurizer's model (parity-checked), and its int8 dynamic quantisation."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from ctxrep.export import export_onnx

    f32, int8 = folder / "model.onnx", folder / "model.int8.onnx"
    export_onnx(featurizer.model, f32)
    quantize_dynamic(str(f32), str(int8), weight_type=QuantType.QInt8)
    return f32, int8


def flops_per_token(model, mean_length: float) -> float:
    """2 x the weights of every linear layer (multiply + add) + attention's QK^T and PV: 4 x hidden x length each."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    pooler = getattr(model, "pooler", None)
    if isinstance(pooler, torch.nn.Linear):  # not run when only hidden states are asked for
        linear -= pooler.weight.numel()
    return 2 * linear + 4 * model.hidden_size * mean_length * model.num_layers


def mean_cosine(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """Mean over all words of cos(ours, theirs)."""
    a, b = np.concatenate(ours), np.concatenate(theirs)
    return float(np.mean((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))))


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

SKIPPABLE = ["A", "B", "compiled", "int8", "ort", "ort-int8"]
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
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=SKIPPABLE,
        help="leave these systems out (quick trials only; the full table has them all)",
    )
    args = p.parse_args(argv)
    if args.limit is None and args.sentences < MIN_SENTENCES:
        p.error(f"--sentences must be at least {MIN_SENTENCES:,}; use --limit for a quick trial")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    if args.threads < 1 or args.repeats < 1 or args.warmup < 1:
        p.error("--threads, --repeats and --warmup must be at least 1")
    return args


def ctxrep_system(featurizer: Featurizer) -> System:
    """embed_words, with the real and padded sizes of the batches the encoder is given counted on the way in.
    Works for every encoder the featurizer picks (eager, compiled, int8, ONNX Runtime)."""
    seen = {"real": 0, "padded": 0}
    pick = featurizer._encoder_for

    class Counted:
        def __init__(self, encoder) -> None:
            self.encoder = encoder

        def encode(self, batch, **kwargs):
            seen["padded"] += batch["attention_mask"].numel()
            seen["real"] += int(batch["attention_mask"].sum())
            return self.encoder.encode(batch, **kwargs)

    featurizer._encoder_for = lambda num_tokens: Counted(pick(num_tokens))

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
    skip = set(args.skip)

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

    # name: (label, batching, system); the float32 systems are checked against ctxrep's vectors.
    budget = f"length-sorted, {featurizer.batch_tokens:,}-token budget"
    systems: dict[str, tuple[str, str, System]] = {
        "ctxrep": ("ctxrep Featurizer (default: compile='auto')", budget, ctxrep_system(featurizer)),
        "A": (
            "A: transformers",
            f"corpus order, {REF_BATCH} sentences",
            lambda s: reference.embed_words(s, sort=False),
        ),
        "B": (
            "B: transformers",
            f"length-sorted, {REF_BATCH} sentences",
            lambda s: reference.embed_words(s, sort=True),
        ),
    }
    if "compiled" not in skip:
        compiled = Featurizer(MODEL, layers=-1, pooling="mean", compile=True)
        systems["compiled"] = ("ctxrep compiled (compile=True)", budget, ctxrep_system(compiled))
    if "int8" not in skip:
        int8 = Featurizer(MODEL, layers=-1, pooling="mean", quantize="int8")
        systems["int8"] = ("ctxrep int8 (quantize='int8')", budget, ctxrep_system(int8))
    tmp = tempfile.TemporaryDirectory()
    if not {"ort", "ort-int8"} <= skip:
        onnx_f32, onnx_int8 = ort_files(featurizer, Path(tmp.name))
        if "ort" not in skip:
            ort = OrtFeaturizer(OrtEncoder(onnx_f32, featurizer.num_layers, args.threads), layers=-1, pooling="mean")
            systems["ort"] = ("ONNX Runtime f32 (ctxrep's pipeline)", budget, ctxrep_system(ort))
        if "ort-int8" not in skip:
            ort8 = OrtFeaturizer(OrtEncoder(onnx_int8, featurizer.num_layers, args.threads), layers=-1, pooling="mean")
            systems["ort-int8"] = ("ONNX Runtime int8 dynamic", budget, ctxrep_system(ort8))
    for name in ("A", "B"):
        if name in skip:
            del systems[name]
    warm = sentences[: args.warmup]
    compile_seconds = None
    for name, (_, _, run) in systems.items():
        t0 = time.perf_counter()
        run(warm)
        if name == "compiled":
            compile_seconds = time.perf_counter() - t0

    # Round-robin timed runs; the first run's vectors are kept for the check.
    best = {name: float("inf") for name in systems}
    outputs: dict[str, list[np.ndarray]] = {}
    padded: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, (_, _, run) in systems.items():
            gc.collect()
            t0 = time.perf_counter()
            vectors, real, pad = run(sentences)
            best[name] = min(best[name], time.perf_counter() - t0)
            if real != tokens:
                sys.exit(f"error: {name} ran {real:,} real tokens but the corpus has {tokens:,}")
            outputs.setdefault(name, vectors)
            padded[name] = pad
            del vectors
    tmp.cleanup()

    exact = [name for name in systems if name not in ("ctxrep", "int8", "ort-int8")]
    diffs = {name: max_abs_diff(outputs["ctxrep"], outputs[name]) for name in exact}
    worst = max(diffs.values(), key=lambda d: float("inf") if np.isnan(d) else d) if diffs else 0.0
    cosines = {name: mean_cosine(outputs[name], outputs["ctxrep"]) for name in ("int8", "ort-int8") if name in systems}
    outputs.clear()
    speed = {name: tokens / best[name] for name in systems}
    flops = flops_per_token(featurizer.model, tokens / len(sentences))

    def vs(name: str, base: str) -> str:
        return f"{speed[name] / speed[base]:.2f}x" if base in speed else "-"

    def row(name: str) -> list[str]:
        label, batching, _ = systems[name]
        agree = f"{diffs[name]:.1e}" if name in diffs else f"cos {cosines[name]:.4f}" if name in cosines else "-"
        return [
            label,
            batching,
            f"{best[name]:.2f}",
            f"{speed[name]:,.0f}",
            f"{speed[name] * flops / 1e9:.0f}",
            f"{1 - tokens / padded[name]:.0%}",
            vs(name, "ort"),
            vs(name, "ort-int8"),
            agree,
        ]

    header = [
        "system",
        "batching",
        "wall time (s)",
        "tokens/s",
        "GFLOP/s",
        "padding",
        "vs ORT f32",
        "vs ORT int8",
        "vs ctxrep: max abs diff / mean cosine",
    ]
    rows = [row(name) for name in systems]
    ratio_header = ["check", "measured", "target", "result"]
    ratio_rows = []

    def check(label: str, value: float, target: float, shown: str, at_least: bool = True) -> None:
        ok = value >= target if at_least else value < target
        ratio_rows.append([label, shown, f"{'>=' if at_least else '<'} {target:g}", mark(ok)])

    for name, target in (("A", TARGET_VS_A), ("B", TARGET_VS_B)):
        if name in speed:
            r = speed["ctxrep"] / speed[name]
            check(f"ctxrep / {name}", r, target, f"{r:.2f}x")
    if "compiled" in speed and "ort" in speed:
        r = speed["compiled"] / speed["ort"]
        check("ctxrep compiled / ORT f32", r, TARGET_VS_ORT, f"{r:.2f}x")
    if "int8" in speed and "ort-int8" in speed:
        r = speed["int8"] / speed["ort-int8"]
        check("ctxrep int8 / ORT int8", r, TARGET_VS_ORT_INT8, f"{r:.2f}x")
    if "int8" in cosines:
        check("ctxrep int8 word-vector cosine", cosines["int8"], TARGET_INT8_COSINE, f"{cosines['int8']:.4f}")
    check("float32 outputs equal", worst, TOLERANCE, f"{worst:.1e}", at_least=False)
    trial = f" QUICK TRIAL (--limit {n}): not a benchmark result." if n < MIN_SENTENCES else ""
    skipped = f" Left out: {', '.join(sorted(skip))}." if skip else ""
    notes = [
        (
            f"corpus: {args.corpus} ({CORPORA[args.corpus][0]}), first {n:,} sentences, "
            f"{sum(len(s) for s in sentences):,} words, {tokens:,} tokens (non-pad, with [CLS]/[SEP]).{trial}{skipped}"
        ),
        (
            f"model: {MODEL} ({featurizer.num_layers} layers, {featurizer.dim} wide), last layer, mean of each word's "
            f"pieces; transformers attention: {reference.model.config._attn_implementation}; "
            f"{flops / 1e6:.1f} MFLOP per token."
        ),
        (
            "timing: tokenization through to numpy word vectors (model loading excluded); padding = share of the "
            f"encoder's input positions that are pad; warm-up {len(warm)} sentences per system"
            + (f" (the compiled system's, compilation included: {compile_seconds:.1f} s)" if compile_seconds else "")
            + f"; best of {args.repeats} round-robin run(s)."
        ),
        (
            f"torch threads: {torch.get_num_threads()}; torch {torch.__version__}; "
            f"transformers {transformers.__version__}; onnxruntime {_version('onnxruntime')}; "
            f"python {platform.python_version()}; CPU: {cpu_model()} ({logical_cpus()} logical CPUs)."
        ),
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


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
