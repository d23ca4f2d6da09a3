#!/usr/bin/env python
"""ctxrep on a GPU against transformers and sentence-transformers, with the device's ceiling, in one run.

The same real sentences (SST train leaves, the corpus repeated up to --sentences), text in, numpy vectors out, at
each precision (fp32, bf16, fp16; the peers cast their models with .to(dtype), ctxrep's precision= casts a copy).

Models (--models):
  minilm     the packaged all-MiniLM-L6-v2 (6 x 384), a sentence-transformers folder
  bert-base  a BERT-base-size encoder (--base-shape, default 12 x 768, 12 heads, 3,072 intermediate), random weights
             (seed 0), with MiniLM's tokenizer, written as a sentence-transformers folder (mean pooling, Normalize)

Rows per model and precision:
  ceiling    the forward pass alone (transformers' AutoModel, sdpa) on inputs already tokenized and on the device, in
             length-sorted batches of --ceiling-batch sentences: what the device does with no host work at all
  sentences  one vector per sentence as the folder defines it (mean over the tokens, normalised):
               ctxrep                 Featurizer(folder, sentence_pooling="model", device=, precision=).embed_sentences
               sentence-transformers  SentenceTransformer(folder).to(dtype).encode(texts, batch_size=--ref-batch)
               transformers           AutoModel, mean over the attention mask, normalised, sorted batches
  words      (minilm) one vector per word = the mean of its pieces in the last layer:
               ctxrep        Featurizer(folder, device=, precision=).embed_words(word lists)
               transformers  AutoTokenizer (is_split_into_words) + AutoModel, sorted batches, pooled on the device
Once per run: the bare fast tokenizer (tokenizers' encode_batch over the raw sentences, batches of 1,024, on all the
host's threads): the host's ceiling.

Columns: tokens/s (tokens = the tokenizer's ids with [CLS]/[SEP], the same for every row); "vs fastest peer" (ctxrep's
rows: ctxrep / the fastest peer of the same work and precision); MFU = tokens/s x FLOPs per token (2 x the weights of
every linear layer + attention's 4 x hidden x mean length per layer) / the card's dense peak at that precision
(--peak-tflops, or a table of known cards; "-" where unknown, e.g. on a CPU); device share = the ceiling row's time
for the same model and precision / the row's time (the part of the wall time the device needs at least; the rest is
the host and idle device). float32 rows are checked against ctxrep's float32 output (max |difference| < 1e-4 for
ctxrep vs transformers words and ctxrep vs sentence-transformers sentences, else exit 1); the others report their
mean cosine to it.

Timing: model loading, tokenization of the ceiling's inputs and the folder writing excluded; torch.cuda.synchronize
around each run; one warm-up run per system on --warmup sentences; the best of --repeats round-robin runs.
Full size (34,176 sentences, both models, 3 precisions, best of 2) runs in about 4-6 minutes on an H100/H200.

Run on a GPU:   python benchmarks/gpu.py --markdown-out gpu.md                     # --device cuda by default there
Smoke on CPU:   .venv/bin/python benchmarks/gpu.py --device cpu --sentences 64 --warmup 8 --repeats 1 \\
                    --precisions fp32 bf16 --base-shape 2x64 --ceiling-batch 16
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import transformers
from _common import DEFAULT_DATA, flops_per_token, read_sst, report

from ctxrep import Featurizer
from ctxrep.models.loading import resolve
from ctxrep.runtime.hardware import cpu_description

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = 1e-4
# Dense peak TFLOP/s by card and precision (fp32 without TF32: torch's default for matmuls), from the vendors' sheets.
PEAK_TFLOPS = {
    "H200": {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0},
    "H100": {"fp32": 67.0, "bf16": 989.0, "fp16": 989.0},
    "A100": {"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "bf16": 362.0, "fp16": 362.0},
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bert_base_folder(out: Path, shape: str) -> Path:
    """A random BERT of `shape` ("LAYERSxHIDDEN", heads = hidden / 64, intermediate = 4 x hidden) with MiniLM's
    tokenizer, as a sentence-transformers folder (mean pooling, Normalize)."""
    layers, hidden = (int(x) for x in shape.lower().split("x"))
    minilm = resolve("minilm").folder
    config = transformers.BertConfig.from_pretrained(minilm)
    heads = max(1, hidden // 64)
    config.update(
        {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "intermediate_size": 4 * hidden,
        }
    )
    torch.manual_seed(0)
    transformers.BertModel(config, add_pooling_layer=False).eval().save_pretrained(out)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "modules.json"):
        shutil.copy(minilm / name, out / name)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    (out / "1_Pooling").mkdir()
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    (out / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": hidden}))
    return out


# ---- the peers and the ceilings -----------------------------------------------------------------------------------


class TransformersReference:
    """AutoTokenizer + AutoModel (sdpa) on `device` in `dtype`, batches of `batch` sentences sorted by length."""

    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype, batch: int) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = (
            transformers.AutoModel.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(device).eval()
        )
        self.device, self.batch = device, batch

    def _batches(self, texts, split: bool):
        lengths = [len(ids) for ids in self.tokenizer(list(texts), is_split_into_words=split)["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        for start in range(0, len(order), self.batch):
            idx = order[start : start + self.batch]
            yield (
                idx,
                self.tokenizer([texts[i] for i in idx], is_split_into_words=split, padding=True, return_tensors="pt"),
            )

    def words(self, word_lists: Sequence[list[str]]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(word_lists)
        with torch.inference_mode():
            for idx, enc in self._batches(word_lists, split=True):
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
                counts = torch.zeros(offsets[-1], device=self.device).index_add_(0, slot, torch.ones_like(flat[:, 0]))
                vectors = (sums / counts[:, None]).cpu().numpy()
                for r, i in enumerate(idx):
                    out[i] = vectors[offsets[r] : offsets[r + 1]]
        return out  # type: ignore[return-value]

    def sentences(self, texts: Sequence[str]) -> np.ndarray:
        """Mean over the attention mask, L2-normalised (the folders' Pooling + Normalize)."""
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for idx, enc in self._batches(texts, split=False):
                enc = {k: v.to(self.device) for k, v in enc.items()}
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).float()
                mean = (hidden * mask).sum(1) / mask.sum(1)
                out[idx] = torch.nn.functional.normalize(mean, dim=-1).cpu().numpy()
        return out


class Ceiling:
    """The forward pass alone: every sentence tokenized once, length-sorted batches padded and moved to the device
    before timing; run() is only the model on them."""

    def __init__(self, reference: TransformersReference, texts: Sequence[str], batch: int) -> None:
        self.model, device = reference.model, reference.device
        ids = reference.tokenizer(list(texts))["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        self.batches = []
        for start in range(0, len(order), batch):
            rows = [ids[i] for i in order[start : start + batch]]
            enc = reference.tokenizer.pad({"input_ids": rows}, return_tensors="pt")
            self.batches.append({k: v.to(device) for k, v in enc.items()})

    def run(self, _texts=None) -> None:
        with torch.inference_mode():
            for batch in self.batches:
                self.model(**batch)


def bare_tokenizer(folder: Path) -> Callable[[Sequence[str]], int]:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()

    def run(texts: Sequence[str]) -> int:
        return sum(sum(len(e) for e in tok.encode_batch(texts[k : k + 1024])) for k in range(0, len(texts), 1024))

    return run


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


def peak_tflops(device: torch.device, precision: str, given: float | None) -> float | None:
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peaks[precision] for card, peaks in PEAK_TFLOPS.items() if card in name), None)


def fmt_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in [header[c]] + [r[c] for r in rows]) for c in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "| " + " | ".join("-" * w for w in widths) + " |"] + [line(r) for r in rows])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/train.txt)")
    p.add_argument("--sentences", type=int, default=34176, help="SST train repeated to this many (default: 4x)")
    p.add_argument("--models", nargs="+", default=["minilm", "bert-base"], choices=["minilm", "bert-base"])
    p.add_argument("--base-shape", default="12x768", help="layers x hidden of the bert-base model (default 12x768)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"], choices=list(DTYPES))
    p.add_argument("--ref-batch", type=int, default=256, help="sentences per batch of the peers (default: 256)")
    p.add_argument("--ceiling-batch", type=int, default=4096, help="sentences per batch of the ceiling (4,096)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=512)
    p.add_argument("--peak-tflops", type=float, help="the device's dense peak at every precision (default: a table)")
    p.add_argument("--skip", nargs="*", default=[], choices=["transformers", "sentence-transformers", "words"])
    p.add_argument("--markdown-out", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()  # the random model has no pooler: its load report is expected
    word_lists = read_sst(args.data / "sst" / "train.txt", args.sentences)
    texts = [" ".join(w) for w in word_lists]
    tmp = Path(tempfile.mkdtemp(prefix="ctxrep-gpu-"))
    folders = {"minilm": resolve("minilm").folder}
    if "bert-base" in args.models:
        folders["bert-base"] = bert_base_folder(tmp / "bert-base", args.base_shape)
    tokens = bare_tokenizer(folders["minilm"])(texts) + 2 * len(texts)
    mean_length = tokens / len(texts)

    # (model, work, system, precision) -> (run, its input); every run returns its output
    systems: dict[tuple[str, str, str, str], tuple[Callable, Sequence]] = {}
    flops: dict[str, float] = {}
    os.environ.setdefault("RAYON_NUM_THREADS", str(os.cpu_count() or 1))
    systems["minilm", "tokenize", "bare tokenizer", "-"] = (bare_tokenizer(folders["minilm"]), texts)
    for name in args.models:
        folder = folders[name]
        for p in args.precisions:
            hf = TransformersReference(folder, device, DTYPES[p], args.ref_batch)
            flops[name] = flops_per_token(Featurizer(folder, compile=False).model, mean_length)
            systems[name, "ceiling", "forward pass alone", p] = (Ceiling(hf, texts, args.ceiling_batch).run, texts)
            fs = Featurizer(folder, sentence_pooling="model", device=device, precision=p, compile=False)
            systems[name, "sentences", "ctxrep", p] = (fs.embed_sentences, texts)
            if "sentence-transformers" not in args.skip:
                from sentence_transformers import SentenceTransformer

                st = SentenceTransformer(str(folder), device=str(device)).to(DTYPES[p]).eval()
                systems[name, "sentences", "sentence-transformers", p] = (
                    lambda t, st=st: st.encode(t, batch_size=args.ref_batch, show_progress_bar=False).astype(
                        np.float32
                    ),
                    texts,
                )
            if "transformers" not in args.skip:
                systems[name, "sentences", "transformers", p] = (hf.sentences, texts)
            if name == "minilm" and "words" not in args.skip:
                fw = Featurizer(folder, pooling="mean", device=device, precision=p, compile=False)
                systems[name, "words", "ctxrep", p] = (fw.embed_words, word_lists)
                if "transformers" not in args.skip:
                    systems[name, "words", "transformers", p] = (hf.words, word_lists)

    for run, data in systems.values():
        run(data[: args.warmup])
    sync(device)
    best = dict.fromkeys(systems, float("inf"))
    outputs = {}
    for _ in range(args.repeats):
        for key, (run, data) in systems.items():
            gc.collect()
            sync(device)
            t0 = time.perf_counter()
            out = run(data)
            sync(device)
            best[key] = min(best[key], time.perf_counter() - t0)
            outputs.setdefault(key, out)
    shutil.rmtree(tmp, ignore_errors=True)

    failed, rows = [], []
    for key in systems:
        name, work, system, p = key
        speed = tokens / best[key]
        reference = outputs.get((name, work, "ctxrep", "fp32"))
        diff, cosine = (float("nan"), float("nan"))
        if reference is not None and work in ("sentences", "words"):
            diff, cosine = compare(outputs[key], reference)
            must_match = (work, system) in (("words", "transformers"), ("sentences", "sentence-transformers"))
            if p == "fp32" and must_match and not diff < TOLERANCE:
                failed.append(f"{name} {work} {system} fp32: max abs diff {diff:.3g} >= {TOLERANCE:g}")
        peers = [best[k] for k in systems if k[:2] == (name, work) and k[3] == p and k[2] not in ("ctxrep",)]
        ours = best.get((name, work, "ctxrep", p))
        ratio = f"{min(peers) / ours:.2f}x" if system == "ctxrep" and peers and ours else "-"
        peak = peak_tflops(device, p, args.peak_tflops) if p != "-" else None
        mfu = f"{speed * flops[name] / (peak * 1e12):.1%}" if peak and name in flops else "-"
        ceiling = best.get((name, "ceiling", "forward pass alone", p))
        share = f"{ceiling / best[key]:.0%}" if ceiling and work != "tokenize" else "-"
        rows.append(
            [
                name,
                work,
                system,
                p,
                f"{best[key]:.2f}",
                f"{speed:,.0f}",
                ratio,
                mfu,
                share,
                f"{diff:.1e}",
                f"{cosine:.5f}",
            ]
        )
    header = [
        "model",
        "work",
        "system",
        "precision",
        "wall (s)",
        "tokens/s",
        "ctxrep vs fastest peer",
        "MFU",
        "device share",
        "max abs diff vs ctxrep fp32",
        "mean cosine",
    ]
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU run)"
    notes = [
        f"device: {device} ({card}); CPU: {cpu_description()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; python {platform.python_version()}",
        f"{len(texts):,} sentences (SST train repeated), {tokens:,} tokens with [CLS]/[SEP]; models: "
        + ", ".join(f"{n} ({flops[n] / 1e6:,.1f} MFLOP/token)" for n in args.models if n in flops)
        + f"; peers' batches: {args.ref_batch} sentences; ceiling batches: {args.ceiling_batch}; best of {args.repeats}.",
    ]
    text = fmt_table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    return report(text, args.markdown_out, failed)


if __name__ == "__main__":
    sys.exit(main())
