#!/usr/bin/env python
"""Fine-tuning a big model on the CPU (issue 43, "Targets"): one bi-encoder training step of a Qwen3-0.6B-shaped
model (random weights, made here: no download) at batch 8 pairs x 256 tokens under bf16 autocast.

The model: Qwen3-Embedding-0.6B's config (28 layers, 1,024 wide, 16 query / 8 key-value heads of 128, vocabulary
151,669, tied embeddings), saved in float32 with a byte-level BPE tokenizer trained on STS-B sentences in Qwen's
layout; every text is STS-B sentences joined to 256 tokens or more and cut at 256 (no padding), mean pooling,
in-batch negatives (mnrl, scale 20), AdamW at lr 1e-5. Each run is a fresh process; its peak is the resident set's
high-water mark from after the model is loaded (ctxrep.util.memory.PeakMemory: the weights in memory count, loading
does not), its speed the steps after the first (--steps, default 3: 1 warm-up + 2 timed):

  ctxrep  full                        SentenceEncoder(bf16=True): every weight, AdamW states for all
  ctxrep  LoRA r=16                   lora=LoRA() (peft, the family's attention + MLP projections)
  ctxrep  LoRA + checkpointing        gradient_checkpointing=True
  ctxrep  LoRA + ckpt + cached        mini_batch_size=4 (GradCache)
  st      LoRA + checkpointing        sentence-transformers 6: model.add_adapter(peft LoraConfig, the same modules),
                                      auto_model.gradient_checkpointing_enable(use_reentrant=False),
                                      MultipleNegativesRankingLoss, torch AdamW, the same autocast
  st      LoRA + ckpt + cached        CachedMultipleNegativesRankingLoss(mini_batch_size=4)

Targets: ctxrep's LoRA + ckpt + cached peak <= 0.35x its full; against sentence-transformers with the same
settings, ctxrep's peak <= 0.9x and its steps/s >= 1.1x.

    python benchmarks/big_models.py                   # the full shapes: ~15 GB of memory, long on 2 cores
    python benchmarks/big_models.py --layers 2 --seq 64 --vocab 8000    # a smoke run (not a result)
Options: --data (default ../shared/data), --threads 2, --steps 3, --skip-full, --markdown-out FILE. A run the kernel's
OOM killer ends is a row "killed: out of memory" (it needs more than the machine has) and a missed target.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import DEFAULT_DATA, QWEN3_06B, cpu_model, fmt_table, random_decoder_folder, report

PAIRS, MINI = 8, 4
TARGET_SHARE, TARGET_PEAK, TARGET_SPEED = 0.35, 0.9, 1.1

# One run in a fresh process: argv = folder, pairs.json, library, lora, checkpointing, mini (0: none), steps, threads
RUN = r"""
import json, sys, time, torch
folder, data, library, lora, ckpt, mini, steps, threads = sys.argv[1:9]
lora, ckpt, mini, steps = lora == "1", ckpt == "1", int(mini) or None, int(steps)
torch.set_num_threads(int(threads))
from ctxrep.util.memory import PeakMemory
pairs = json.load(open(data))
seq = pairs.pop()
times = []
if library == "ctxrep":
    from ctxrep.models.adapters import LoRA
    from ctxrep.tasks.sentence_encoder import SentenceEncoder
    import ctxrep.train.trainer as T
    original, started = T.Trainer._train_step, {}
    def step(self):
        if "peak" not in started:
            started["peak"] = PeakMemory("cpu")  # the model is loaded and adapted: from here on
        t = time.perf_counter()
        out = original(self)
        times.append(time.perf_counter() - t)
        return out
    T.Trainer._train_step = step
    enc = SentenceEncoder(folder, loss="mnrl", pooling="mean", normalize=False, batch_size=len(pairs),
                          max_length=seq, lr=1e-5, bf16=True, max_steps=steps, random_state=0,
                          lora=LoRA() if lora else None, gradient_checkpointing=ckpt, mini_batch_size=mini)
    enc.fit(pairs)
    peak = started["peak"].read()
else:
    from sentence_transformers import SentenceTransformer, models
    from sentence_transformers.sentence_transformer import losses
    transformer = models.Transformer(folder, max_seq_length=seq)
    model = SentenceTransformer(modules=[transformer, models.Pooling(transformer.get_word_embedding_dimension(), "mean")], device="cpu")
    if lora:
        from peft import LoraConfig
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model.add_adapter(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=targets))
    if ckpt:
        transformer.auto_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss_fn = (losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini) if mini
               else losses.MultipleNegativesRankingLoss(model))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    model.train()
    peak = PeakMemory("cpu")
    for _ in range(steps):
        t = time.perf_counter()
        features = [model.tokenize([p[0] for p in pairs]), model.tokenize([p[1] for p in pairs])]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(features, None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    peak = peak.read()
timed = times[1:] or times
print(json.dumps({"peak_bytes": peak, "steps_per_s": len(timed) / sum(timed)}))
"""

RUNS = [  # (library, name, lora, checkpointing, mini)
    ("ctxrep", "full", False, False, 0),
    ("ctxrep", "LoRA r=16", True, False, 0),
    ("ctxrep", "LoRA + checkpointing", True, True, 0),
    ("ctxrep", "LoRA + ckpt + cached", True, True, MINI),
    ("st", "LoRA + checkpointing", True, True, 0),
    ("st", "LoRA + ckpt + cached", True, True, MINI),
]


def texts_of(stsb: Path, n: int) -> list[str]:
    """STS-B training sentences, joined so that each text runs past 256 tokens (about 400 words)."""
    sentences = [r.split("\t")[5] for r in stsb.read_text(encoding="utf-8").splitlines() if len(r.split("\t")) > 6]
    out, words = [], []
    for s in sentences:
        words += s.split()
        if len(words) >= 400:
            out.append(" ".join(words))
            words = []
            if len(out) == n:
                return out
    raise SystemExit(f"{stsb}: too few sentences for {n} texts")


def tokenizer_config(folder: Path) -> None:
    """tokenizer_config.json for transformers' AutoTokenizer (sentence-transformers): the fast tokenizer of
    tokenizer.json, <|endoftext|> as padding."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _memory_gib() -> float:
    """This machine's memory (MemTotal), GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def measure(folder: Path, data: Path, run: tuple, steps: int, threads: int) -> dict:
    library, _, lora, ckpt, mini = run
    args = [str(folder), str(data), library, str(int(lora)), str(int(ckpt)), str(mini), str(steps), str(threads)]
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True)
    if done.returncode == -signal.SIGKILL:  # the kernel's OOM killer: the run needs more than this machine has
        return {"killed": True}
    if done.returncode:
        raise SystemExit(f"{library} {run[1]}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seq", type=int, default=256, help="tokens per text")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (a smoke run)")
    parser.add_argument("--vocab", type=int, default=None, help="a smaller vocabulary (a smoke run)")
    parser.add_argument("--skip-full", action="store_true", help="leave out the full fine-tune (no share target)")
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args()
    shape = dict(QWEN3_06B)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    if args.vocab:
        shape["vocab_size"] = args.vocab
    texts = texts_of(args.data / "stsb" / "sts-train.csv", 2 * PAIRS)
    runs = [r for r in RUNS if not (args.skip_full and r[1] == "full")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3"
        random_decoder_folder(folder, shape, "qwen3", texts * 3)
        tokenizer_config(folder)
        import torch
        import transformers

        model = transformers.Qwen3Model.from_pretrained(folder).to(torch.float32)  # float32 master weights
        model.save_pretrained(folder)
        del model  # the runs are child processes: this one keeps no weights while they run
        gc.collect()
        data = Path(tmp) / "pairs.json"
        data.write_text(json.dumps([[texts[2 * i], texts[2 * i + 1]] for i in range(PAIRS)] + [args.seq]))
        for run in runs:
            results[run[:2]] = measure(folder, data, run, args.steps, args.threads)
    rows, failed = [], []
    killed = [key for key, r in results.items() if r.get("killed")]
    for library, name in killed:  # a run the OOM killer ended: no peak, no speed, and no ratio against it
        rows.append([library, name, f"> {_memory_gib():.1f} (killed: out of memory)", "-", "-", "-"])
        results.pop((library, name))
        failed.append(f"{library} {name}: killed for lack of memory")
    full = results.get(("ctxrep", "full"))
    for (library, name), r in results.items():
        share = f"{r['peak_bytes'] / full['peak_bytes']:.2f}x" if full else "-"
        against = results.get(("st", name)) if library == "ctxrep" else None
        vs = (
            f"{r['peak_bytes'] / against['peak_bytes']:.2f}x / {r['steps_per_s'] / against['steps_per_s']:.2f}x"
            if against
            else "-"
        )
        rows.append([library, name, f"{r['peak_bytes'] / 2**30:.2f}", f"{r['steps_per_s']:.3f}", share, vs])
    last = results.get(("ctxrep", "LoRA + ckpt + cached"))
    if full and last and last["peak_bytes"] > TARGET_SHARE * full["peak_bytes"]:
        failed.append(f"LoRA + ckpt + cached peak {last['peak_bytes'] / full['peak_bytes']:.2f}x full > {TARGET_SHARE}")
    for name in ("LoRA + checkpointing", "LoRA + ckpt + cached"):
        ours, theirs = results.get(("ctxrep", name)), results.get(("st", name))
        if ours is None or theirs is None:
            continue
        if ours["peak_bytes"] > TARGET_PEAK * theirs["peak_bytes"]:
            failed.append(f"{name}: peak {ours['peak_bytes'] / theirs['peak_bytes']:.2f}x sentence-transformers'")
        if ours["steps_per_s"] < TARGET_SPEED * theirs["steps_per_s"]:
            failed.append(f"{name}: {ours['steps_per_s'] / theirs['steps_per_s']:.2f}x sentence-transformers' steps/s")
    layers = shape["num_hidden_layers"]
    header = ["library", "training", "peak GiB", "steps/s", "x full", "vs st: peak / speed"]
    text = (
        f"CPU: {cpu_model()}, {args.threads} threads; Qwen3-0.6B-shaped ({layers} layers, vocabulary "
        f"{shape['vocab_size']:,}), random weights; bi-encoder step, {PAIRS} pairs x {args.seq} tokens, bf16 "
        f"autocast; {args.steps - 1} timed steps\n" + fmt_table(header, rows, markdown=True, text_columns=2)
    )
    return report(text, args.markdown_out, failed)


if __name__ == "__main__":
    sys.exit(main())
