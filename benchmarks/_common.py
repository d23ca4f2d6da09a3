"""What several benchmarks share (a benchmark imports the library and this module, never another benchmark).

The shared data folder and its two corpora (SST train leaves, UD EWT `# text` lines), the results table, the CPU's
name and logical CPUs, FLOPs per token of an encoder's forward pass, the MLM pretraining benchmark's model shape
with its useful FLOPs per step, the tiny encoder folder of the host-side benchmarks, and the Qwen tokenizer layout of
the decoder benchmarks (random_decoder_folder: a random Qwen3- or Llama-shaped model with a Qwen-layout tokenizer).
"""

from __future__ import annotations

import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
_SST_LEAF = re.compile(r"\(\d+ ([^()]+)\)")  # a leaf node "(label word)"; words never hold parentheses (-LRB-)


# ---- corpora ---------------------------------------------------------------------------------------


def read_sst(path: Path, n: int | None = None, seed: int = 0) -> list[list[str]]:
    """The leaves of n PTB trees (one tree per line), kept as written (-LRB-, \\/). sst/train.txt is ordered by
    label, so fewer trees than the file holds are a seeded sample (in file order), never the first n; more than it
    holds repeat the whole file; None: every tree once. A few leaves hold a no-break space (U+00A0, as in "8 1/2"); such a leaf stays one
    word."""
    with path.open(encoding="utf-8") as f:
        trees = [_SST_LEAF.findall(line) for line in f if line.strip()]
    if n is None:
        return trees
    if n >= len(trees):
        return [trees[i % len(trees)] for i in range(n)] if trees else []
    return [trees[i] for i in sorted(random.Random(seed).sample(range(len(trees)), n))]


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


# ---- reporting ------------------------------------------------------------------------------------


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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# ---- work counted ---------------------------------------------------------------------------------


def flops_per_token(model, mean_length: float) -> float:
    """2 x the weights of every linear layer (multiply + add) + attention's QK^T and PV: 4 x hidden x length each.
    Unlike ctxrep.runtime.fast.flops_per_token, the pooler is left out: it does not run for hidden states."""
    import torch

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    pooler = getattr(model, "pooler", None)
    if isinstance(pooler, torch.nn.Linear):  # not run when only hidden states are asked for
        linear -= pooler.weight.numel()
    return 2 * linear + 4 * model.hidden_size * mean_length * model.num_layers


# The MLM pretraining benchmarks' model (benchmarks/pretrain_throughput.py, training_precision.py): the `small` shape.
HIDDEN, LAYERS, HEADS, INTERMEDIATE, VOCAB = 256, 4, 4, 1024, 30522


def model_flops_per_step(batch: int, seq: int, masked: float) -> float:
    per_layer = 4 * HIDDEN * HIDDEN + 2 * HIDDEN * INTERMEDIATE  # weight multiply-adds per token
    tokens = batch * seq
    encoder = 6 * LAYERS * per_layer * tokens
    attention = 12 * LAYERS * seq * HIDDEN * tokens  # QK^T and AV, forward + backward
    head = 6 * (HIDDEN * HIDDEN + HIDDEN * VOCAB) * masked
    return float(encoder + attention + head)


# ---- models ---------------------------------------------------------------------------------------

# Qwen2 / Qwen3's tokenizer.json pre-tokenizer pattern (GPT-4's, with single digits) and end-of-text token: the
# byte-level BPE layout of benchmarks/decoders.py's random folders (tests/_decoders.py builds the tests' alike).
# Qwen3-Embedding-0.6B's config.json (the keys transformers' Qwen3Config reads): the decoder benchmarks' model shape
QWEN3_06B = dict(
    vocab_size=151_669,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS = "<|endoftext|>"


def random_decoder_folder(folder: Path, shape: dict, model_type: str, corpus: list[str]) -> None:
    """A random model of `shape` saved by transformers in bfloat16, with a Qwen-layout tokenizer."""
    import torch
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    size = min(8000, shape["vocab_size"])
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS}:0", pair=f"$A:0 $B:1 {EOS}:1", special_tokens=[(EOS, tok.token_to_id(EOS))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config_class = {"qwen3": transformers.Qwen3Config, "llama": transformers.LlamaConfig}[model_type]
    model_class = {"qwen3": transformers.Qwen3Model, "llama": transformers.LlamaModel}[model_type]
    keys = dict(shape) if model_type == "qwen3" else {k: v for k, v in shape.items() if k != "head_dim"}
    torch.manual_seed(0)
    with torch.device("meta"):
        model = model_class(config_class(**keys))
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)


def tiny_folder(out: Path, seed: int = 0) -> Path:
    """A 1-layer, 32-wide BERT (2 heads, 64 intermediate, random weights from `seed`) with MiniLM's vocabulary and
    tokenizer, saved as a sentence-transformers folder (mean Pooling, Normalize): an encoder whose compute is ~0, so
    that what is timed or measured is the host's work."""
    import json
    import shutil

    import torch
    import transformers

    from ctxrep.models.loading import resolve

    minilm = resolve("minilm").folder
    config = transformers.BertConfig.from_pretrained(minilm)
    config.update({"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64})
    torch.manual_seed(seed)
    transformers.BertModel(config, add_pooling_layer=False).eval().save_pretrained(out)  # no progress bar: 1 shard
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "modules.json"):
        shutil.copy(minilm / name, out / name)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    (out / "1_Pooling").mkdir()
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    (out / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    return out


def per_query(fn, queries) -> float:
    """Median seconds of fn(q) over the queries (after one warm-up call)."""
    fn(queries[0])
    times = []
    for q in queries:
        start = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def report(text: str, markdown_out: Path | None, failed: list[str]) -> int:
    """Print a benchmark's result, write it to --markdown-out if given, print each failed check: the exit status."""
    print(text)
    if markdown_out:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(text + "\n")
    for f in failed:
        print(f"error: {f}", file=sys.stderr)
    return 1 if failed else 0


# ---- a server the benchmarks start (serve.py, startup.py) ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], url: str, timeout: float = 300) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: the server exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"error: the server did not answer {url} within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def cross_encoder_folder(model: str, out: Path) -> Path:
    """A cross-encoder folder (BertForSequenceClassification-style) of `model`'s encoder weights under a random
    one-label head: a reranker of that model's cost, whose scores mean nothing."""
    import transformers

    from ctxrep.models.loading import resolve_model_path

    source = resolve_model_path(model)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    transformers.AutoModelForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    return out
