#!/usr/bin/env python
"""Decoder LLMs on the CPU (issue 35): a Qwen3-0.6B-shaped model with random weights, made here (no download).

Part 1, speed and memory. The model (28 layers, 1,024 wide, 16 query / 8 key-value heads of 128, vocabulary 151,669,
tied embeddings: Qwen3-Embedding-0.6B's config) is saved in bfloat16 as the Hub ships it, with a byte-level BPE
tokenizer trained on the corpus in Qwen's layout (<|endoftext|> appended). UD English EWT sentences, split into words:

  ctxrep        load_encoder(folder, dtype) + Featurizer(layers=-1, pooling="mean").embed_words(word lists): the
                whole job (tokenizing, batching, the decoder, pooling words to float32 numpy)
  transformers  AutoModel.from_pretrained(folder, dtype) and its forward (sdpa) on the same padded batches ctxrep
                makes (ctxrep's pieces and special tokens, sorted by length, the Featurizer's 1,024-token budget):
                the decoder alone

at bf16 and at fp32, each in a fresh process whose peak memory is its own (VmHWM of /proc/self/status: it restarts
at exec, where ru_maxrss keeps the parent's resident size at fork, 2.06 GiB here); the ratio is
ctxrep's seconds / transformers' (target: <= 1.2 at bf16, issue 35), peak memory / the weights' size in that dtype
(target: < 1.3), both as the whole process and above the process's memory before loading (torch's own libraries).
ctxrep's last-layer states agree with transformers' (max |diff| at fp32, mean cosine at bf16, printed).

Part 2, the probe command on 28-layer decoders: `ctxrep probe` (UPOS on UD EWT, NER on CoNLL-2003) over every layer
of a Qwen3-shaped and a Llama-shaped model with random weights (the floor a trained model's curve is read against);
--probe-width (default 128) keeps it inside the time budget: 28 layers, as the real models, narrower.

Run:  .venv/bin/python benchmarks/decoders.py                       # ~4-5 minutes on 2 quiet cores (estimated)
      .venv/bin/python benchmarks/decoders.py --tiny                # smoke test: tiny shapes (not a result)
Options: --data (default ../shared/data), --sentences 96, --probe-sentences 200, --probe-width 128, --threads 2,
--skip-probe.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import QWEN3_06B, random_decoder_folder

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TINY = dict(
    QWEN3_06B,
    vocab_size=4000,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
BATCH_TOKENS = 1024  # the Featurizer's CPU budget for models wider than 512 (runtime/hardware.py)
TARGET_SPEED, TARGET_MEMORY = 1.2, 1.3


def read_ud(path: Path, n: int) -> list[list[str]]:
    """The words (FORM column) of the first n sentences of a CoNLL-U file."""
    sentences, words = [], []
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if words:
                    sentences.append(words)
                    words = []
                    if len(sentences) == n:
                        break
            elif not line.startswith("#"):
                cols = line.split("\t")
                if cols[0].isdigit():
                    words.append(cols[1])
    return sentences


def batches_of(folder: Path, sentences: list[list[str]]) -> list[list[list[int]]]:
    """The padded batches ctxrep's Featurizer makes: its pieces + special tokens, sorted by length, token budget."""
    from ctxrep.text.inputs import token_budget_batches
    from ctxrep.text.tokenizer import Tokenizer

    tok = Tokenizer.from_model_dir(folder)
    rows = sorted((tok.build_inputs(p.ids)[0] for p in tok.encode_words(sentences)), key=len)
    out, start = [], 0
    for size in token_budget_batches([len(r) for r in rows], BATCH_TOKENS):
        out.append(rows[start : start + size])
        start += size
    return out


# ---- one system in a fresh process ----------------------------------------------------------------------------


def status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (VmHWM: this process image's peak resident size) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    job = json.loads(Path(args.job).read_text())
    if args.child == "ctxrep":
        from ctxrep.featurize import Featurizer
        from ctxrep.models.loading import load_encoder
    else:
        import transformers
    before = status_bytes("VmHWM")  # libraries imported, nothing loaded
    if args.child == "ctxrep":
        t0 = time.perf_counter()
        loaded = load_encoder(args.folder, dtype=args.dtype)
        load_s = time.perf_counter() - t0
        fz = Featurizer(loaded, layers=-1, pooling="mean", batch_tokens=BATCH_TOKENS, compile=False)
        fz.embed_words(job["sentences"][:4])  # warm-up
        t0 = time.perf_counter()
        words = fz.embed_words(job["sentences"])
        seconds = time.perf_counter() - t0
        with torch.inference_mode():  # the last layer at the first batch's first row, to compare systems
            first = torch.tensor([job["batches"][0][0]])
            probe = loaded.model(first).last_hidden_state[0].float().numpy()
        weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
        extra = {"words": int(sum(len(w) for w in words))}
    else:
        t0 = time.perf_counter()
        model = transformers.AutoModel.from_pretrained(args.folder, dtype=dtype).eval()
        load_s = time.perf_counter() - t0
        batches = []
        for rows in job["batches"]:
            t = max(map(len, rows))
            ids = torch.tensor([r + [0] * (t - len(r)) for r in rows])
            mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in rows])
            batches.append((ids, mask))
        with torch.inference_mode():
            model(*batches[0])  # warm-up
            t0 = time.perf_counter()
            for ids, mask in batches:
                model(input_ids=ids, attention_mask=mask).last_hidden_state.float().numpy()
            seconds = time.perf_counter() - t0
            probe = model(torch.tensor([job["batches"][0][0]])).last_hidden_state[0].float().numpy()
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        extra = {}
    np.save(args.out + ".npy", probe)
    peak = status_bytes("VmHWM")
    result = {"seconds": seconds, "load_s": load_s, "peak": peak, "before": before, "weights": weights, **extra}
    Path(args.out).write_text(json.dumps(result))


def run_child(system: str, dtype: str, folder: Path, job: Path, work: Path, threads: int) -> dict:
    out = work / f"{system}-{dtype}.json"
    cmd = [
        sys.executable,
        __file__,
        "--child",
        system,
        "--dtype",
        dtype,
        "--folder",
        str(folder),
        "--job",
        str(job),
        "--out",
        str(out),
        "--threads",
        str(threads),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run(cmd, check=True, env=env)
    result = json.loads(out.read_text())
    result["probe"] = str(out) + ".npy"
    return result


def speed_and_memory(args: argparse.Namespace, work: Path) -> None:
    import numpy as np

    sentences = read_ud(args.data / "ud_english_ewt" / "en_ewt-ud-train.conllu", args.sentences)
    folder = work / "qwen3"
    t0 = time.perf_counter()
    random_decoder_folder(folder, TINY if args.tiny else QWEN3_06B, "qwen3", [" ".join(s) for s in sentences] * 3)
    print(f"made a random Qwen3{'-tiny' if args.tiny else '-0.6B'}-shaped folder in {time.perf_counter() - t0:.0f} s")
    batches = batches_of(folder, sentences)
    tokens = sum(len(r) for b in batches for r in b)
    job = work / "job.json"
    job.write_text(json.dumps({"sentences": sentences, "batches": batches}))
    print(
        f"{len(sentences)} sentences, {tokens} tokens in {len(batches)} batches of <= {BATCH_TOKENS} tokens, "
        f"{args.threads} threads"
    )
    print(
        "| dtype | system | load s | run s | tokens/s | ratio (ctxrep / transformers) | weights GiB | peak GiB "
        "(x weights) | above start GiB (x weights) | agreement |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    gib = 2**30
    for dtype in ("bf16", "fp32"):
        got = {s: run_child(s, dtype, folder, job, work, args.threads) for s in ("transformers", "ctxrep")}
        a, b = np.load(got["ctxrep"]["probe"]), np.load(got["transformers"]["probe"])
        if dtype == "fp32":
            agreement = f"max diff {np.abs(a - b).max():.1e}"
        else:
            cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
            agreement = f"mean cosine {cos.mean():.4f}"
        for system in ("transformers", "ctxrep"):
            r = got[system]
            ratio = r["seconds"] / got["transformers"]["seconds"]
            above = r["peak"] - r["before"]
            print(
                f"| {dtype} | {system} | {r['load_s']:.1f} | {r['seconds']:.1f} | {tokens / r['seconds']:.0f} | "
                f"{ratio:.2f} | {r['weights'] / gib:.2f} | {r['peak'] / gib:.2f} ({r['peak'] / r['weights']:.2f}) | "
                f"{above / gib:.2f} ({above / r['weights']:.2f}) | {agreement if system == 'ctxrep' else ''} |"
            )
    print(f"targets: ctxrep / transformers <= {TARGET_SPEED} at bf16; peak < {TARGET_MEMORY} x the weights")


def probes(args: argparse.Namespace, work: Path) -> None:
    shape = (
        TINY
        if args.tiny
        else dict(
            QWEN3_06B,
            hidden_size=args.probe_width,
            intermediate_size=3 * args.probe_width,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=args.probe_width // 4,
            vocab_size=8000,
        )
    )
    ud = read_ud(args.data / "ud_english_ewt" / "en_ewt-ud-train.conllu", 2000)
    tasks = {
        "upos": args.data / "ud_english_ewt" / "en_ewt-ud-train.conllu",
        "ner": args.data / "conll2003" / "eng.train",
    }
    print(
        f"\nprobe: {shape['num_hidden_layers']} layers, {shape['hidden_size']} wide, random weights, "
        f"{args.probe_sentences} sentences (last 20% held out), no control"
    )
    print("| model | task | best layer | best accuracy | layer 0 | top layer | seconds |")
    print("|---|---|---|---|---|---|---|")
    for model_type in ("qwen3", "llama"):
        folder = work / f"probe-{model_type}"
        random_decoder_folder(folder, shape, model_type, [" ".join(s) for s in ud])
        for task, train in tasks.items():
            out = work / f"probe-{model_type}-{task}"
            t0 = time.perf_counter()
            subprocess.run(
                [
                    Path(sys.executable).parent / "ctxrep",
                    "probe",
                    "--model",
                    str(folder),
                    "--task",
                    task,
                    "--train",
                    str(train),
                    "--max-sentences",
                    str(args.probe_sentences),
                    "--no-control",
                    "--no-progress",
                    "--out-dir",
                    str(out),
                ],
                check=True,
                env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)),
                stdout=subprocess.DEVNULL,
            )
            seconds = time.perf_counter() - t0
            row = json.loads((out / "probe.json").read_text())["rows"][0]
            acc = row["layer_accuracy"]
            best = max(range(len(acc)), key=acc.__getitem__)
            print(
                f"| {model_type}-shaped | {task} | {best} | {acc[best]:.3f} | {acc[0]:.3f} | {acc[-1]:.3f} | "
                f"{seconds:.0f} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--sentences", type=int, default=96)
    p.add_argument("--probe-sentences", type=int, default=200)
    p.add_argument("--probe-width", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke test, not a result")
    p.add_argument("--skip-probe", action="store_true")
    p.add_argument("--child", choices=["ctxrep", "transformers"], help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    if args.tiny:
        args.sentences, args.probe_sentences = min(args.sentences, 24), min(args.probe_sentences, 40)
    with tempfile.TemporaryDirectory() as tmp:
        speed_and_memory(args, Path(tmp))
        if not args.skip_probe:
            probes(args, Path(tmp))


if __name__ == "__main__":
    main()
