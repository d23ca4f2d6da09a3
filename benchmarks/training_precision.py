#!/usr/bin/env python
"""Training at float32 and bf16 autocast (issue 23 section 5): each training step's MFU against a measured peak, and
what bf16 training and int8 prediction cost in SST-2 dev accuracy, in one run.

  peak          the rate of a large torch.mm (--peak-size^3, best of --peak-repeats after a warm-up) at float32 and
                at bfloat16 with the same threads: the denominator of the MFU of each precision
  fine-tune     SequenceClassifier("minilm", pooling=mean) fine-tuned on a random sample of --sst-train SST-2
                training sentences (sst/train.txt is ordered by label: never its first N), --epochs epochs, once in
                float32 and once with bf16 autocast (the estimators' bf16=True: weights and AdamW stay float32),
                same seed, same batches; dev accuracy on the 872 SST-2 dev sentences (neutral dropped, as GLUE)
  int8          the float32-trained classifier predicting at precision="int8" (`estimator.using(precision=...)`:
                its encoder's linear layers in int8, SmoothQuant-calibrated)
  fine-tune     the same step in turns: the Trainer's training step on two copies of the fitted network, fp32 and
  step (paired) bf16 autocast taking turns on the same --paired-steps batches of the sample (median step time). Two
                whole fits one after the other see whatever load the machine has at the time; steps in turns see
                the same, so their ratio is the one to read on a shared machine
  MLM step      one masked-LM pretraining step of the `small` shape (hidden 256, 4 layers, 4 heads, intermediate
  (paired)      1024, vocab 30522, 32 x 128 tokens; benchmarks/pretrain_throughput.py's) through ctxrep's Trainer
                (its `_train_step`: forward under the trainer's autocast, backward, clipping, AdamW), a float32 and
                a TrainerConfig(bf16=True) trainer taking turns; random token ids, the objective's own masking

Useful work, padding not counted:
  fine-tune  3 x forward FLOPs per real token (forward + backward: 2 x every linear layer's weights, plus attention's
             4 x hidden x mean length per layer, as benchmarks/featurize.py counts a forward), x every real token of
             every epoch (of every timed batch, paired); the time of a fit is its training loop's
             (Trainer.train), without model loading and tokenization
  MLM step   benchmarks/pretrain_throughput.py's count: 6 x encoder weights per token, attention, and the MLM head
             on the masked positions only
MFU = achieved FLOP/s / the measured peak of the precision the matmuls ran at (bf16 autocast: the bfloat16 peak),
measured under the same load as the row: right before and after a fit (their mean), after every step of the steps
taken in turns (their median). A peak measured once at the start put a quiet machine's steps at 160% of a loaded
machine's peak.

Checks: |bf16-trained accuracy - float32-trained accuracy| <= 0.5 points (the condition for `ctxrep finetune
--precision auto` choosing bf16 autocast where the CPU has it), and |int8 accuracy - float32 accuracy| <= 0.5 points.
One fine-tuning run per precision: seed-to-seed noise on 872 sentences is of the same size as the bound.

Run:  .venv/bin/python benchmarks/training_precision.py        # 3 min on 2 quiet cores (30 min at load 5)
      .venv/bin/python benchmarks/training_precision.py --sst-train 64 --limit 64 --epochs 1 --paired-steps 2 \
          --pretrain-steps 2 --peak-size 512       # dry run: not a result
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import (
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    LAYERS,
    VOCAB,
    flops_per_token,
    fmt_table,
    logical_cpus,
    mark,
    model_flops_per_step,
)

from ctxrep.runtime.hardware import cpu_description, cpu_has_bf16
from ctxrep.tasks import SequenceClassifier
from ctxrep.tasks.experiment import read_task
from ctxrep.tasks.network import make_optimizer
from ctxrep.train.batches import length_bucketed
from ctxrep.train.precision import bf16_autocast
from ctxrep.train.trainer import Trainer

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGET_POINTS = 0.5  # bf16-trained and int8-predicting accuracy within this many points of float32
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    p.add_argument("--sst-train", type=int, default=4000, help="SST-2 training sentences (random sample of 6,920)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (MiniLM fine-tunes best near 1e-4)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="cap the dev set at N sentences (a dry run)")
    p.add_argument("--paired-steps", type=int, default=20, help="fine-tuning steps per precision taken in turns")
    p.add_argument("--pretrain-steps", type=int, default=10, help="timed MLM steps per precision, taken in turns")
    p.add_argument("--pretrain-warmup", type=int, default=2, help="untimed MLM steps first")
    p.add_argument("--pretrain-batch", type=int, default=32)
    p.add_argument("--pretrain-seq", type=int, default=128)
    p.add_argument("--peak-size", type=int, default=2048, help="n of the n x n x n matmul timed for the peak")
    p.add_argument("--peak-repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every number here")
    p.add_argument("--markdown-out", type=Path, default=None, help="write the Markdown tables and notes here")
    args = p.parse_args(argv)
    positive = ("sst_train", "epochs", "batch_size", "paired_steps", "pretrain_steps", "pretrain_batch", "peak_size")
    for name in (*positive, "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.limit is not None and args.limit < 2:
        p.error("--limit must be at least 2")
    return args


# ---- peak -------------------------------------------------------------------------------------------


def matmul_peak(dtype: torch.dtype, n: int, repeats: int) -> float:
    """GFLOP/s of the fastest of `repeats` (n x n) @ (n x n) products at `dtype` (2 n^3 FLOPs each)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


# ---- fine-tuning ------------------------------------------------------------------------------------


def sample(data, n: int | None, rng: np.random.Generator):
    """n examples drawn at random (all when n is None or larger), in file order."""
    if n is None or n >= len(data.X):
        return data
    keep = np.sort(rng.permutation(len(data.X))[:n])
    return type(data)([data.X[i] for i in keep], [data.y[i] for i in keep])


@contextlib.contextmanager
def timed_training_loop():
    """Time the one training loop's `Trainer.train` (the steps of a fit, without loading the encoder and
    tokenizing): yields a list that receives the seconds of each call."""
    original, spent = Trainer.train, []

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    Trainer.train = timed
    try:
        yield spent
    finally:
        Trainer.train = original


def real_tokens(estimator: SequenceClassifier, X: list[str]) -> list[int]:
    """Non-pad pieces (with [CLS]/[SEP], truncated to max_length) of each training record, as fit encodes them."""
    records = estimator._examples(estimator._check_X(X), None, estimator._call())
    return [len(r.input) for r in records]


def finetune(train, dev, bf16: bool, args) -> tuple[SequenceClassifier, dict]:
    estimator = SequenceClassifier(
        "minilm",
        pooling="mean",
        max_epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_length=args.max_length,
        random_state=args.seed,
        bf16=bf16,
    )
    with timed_training_loop() as spent:
        estimator.fit(train.X, train.y)
    seconds = sum(spent)
    lengths = real_tokens(estimator, train.X)
    tokens = sum(lengths) * args.epochs
    forward = flops_per_token(estimator.backbone_.model, float(np.mean(lengths)))  # per real token
    result = {
        "train_seconds": seconds,
        "steps": estimator.history_[-1]["steps"],
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "forward_flops_per_token": forward,
        "gflops": 3 * forward * tokens / seconds / 1e9,
        "train_loss": estimator.history_[-1]["train_loss"],
        "dev_accuracy": estimator.score(dev.X, dev.y),  # as it predicts: bf16 autocast for the bf16-trained one
    }
    if bf16:
        result["dev_accuracy_fp32_predict"] = estimator.score(dev.X, dev.y, precision="fp32")
    return estimator, result


def paired_finetune_steps(estimator: SequenceClassifier, train, args) -> dict[str, dict]:
    """Seconds per fine-tuning step at fp32 and under bf16 autocast, taken in turns on the same batches, so that a
    load that changes during the run falls on both alike: the Trainer's step (forward and loss under the autocast,
    backward, clipping, AdamW) on two copies of the fitted network, --paired-steps batches of the training sample
    (length-bucketed as fit draws them) after one untimed batch."""
    X, y = estimator._check_X_y(train.X, train.y, fitting=False)
    call = estimator._call()
    records = estimator._examples(X, y, call)
    lengths = [len(r.input) for r in records]
    rng = np.random.default_rng(args.seed)
    batches = length_bucketed(lengths, args.batch_size)(rng)[: args.paired_steps + 1]
    networks = {name: copy.deepcopy(estimator.model_).train() for name in DTYPES}
    optimizers = {name: make_optimizer(network, args.lr, estimator.weight_decay) for name, network in networks.items()}
    times: dict[str, list[float]] = {name: [] for name in DTYPES}
    peaks: dict[str, list[float]] = {name: [] for name in DTYPES}
    tokens = 0
    for i, rows in enumerate(batches):
        batch = estimator._batch([records[j] for j in rows], call)
        for name in DTYPES if i % 2 == 0 else reversed(DTYPES):
            network, optimizer = networks[name], optimizers[name]
            t0 = time.perf_counter()
            with bf16_autocast("cpu", name == "bf16"):
                loss = estimator._head_loss(network(batch), batch)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), estimator.max_grad_norm)
            optimizer.step()
            if i:
                times[name].append(time.perf_counter() - t0)
                peaks[name].append(matmul_peak(DTYPES[name], args.peak_size, 1))  # the peak under the same load
        tokens += sum(lengths[j] for j in rows) if i else 0
    forward = flops_per_token(estimator.backbone_.model, float(np.mean(lengths)))
    results = {}
    for name, spent in times.items():
        seconds = float(np.median(spent)) * len(spent)  # median step time x steps: robust to a burst of load
        results[name] = {
            "step_seconds": float(np.median(spent)),
            "steps": len(spent),
            "tokens_per_s": tokens / seconds,
            "gflops": 3 * forward * tokens / seconds / 1e9,
            "peak_gflops": float(np.median(peaks[name])),
        }
    return results


# ---- the MLM pretraining step -----------------------------------------------------------------------


class RandomRows:
    """A Trainer batch source: rows of random token ids ([CLS] ... [SEP]), a fresh seeded draw per batch."""

    def __init__(self, seq: int, seed: int) -> None:
        self.seq, self.seed, self.drawn = seq, seed, 0

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed * 100003 + self.drawn)
        self.drawn += 1
        ids = rng.integers(5, VOCAB, (batch_size, self.seq), dtype=np.int64)
        ids[:, 0], ids[:, -1] = 2, 3
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = state["drawn"]


def mlm_trainer(bf16: bool, args, out: Path):
    """ctxrep's Trainer over MaskedLMObjective of the `small` shape, at float32 or with TrainerConfig(bf16=True)."""
    from ctxrep.models.bert import BertConfig
    from ctxrep.objectives.masked_lm import MaskedLMConfig, MaskedLMObjective
    from ctxrep.train.trainer import Trainer, TrainerConfig

    torch.manual_seed(args.seed)
    shape = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
    )
    objective = MaskedLMObjective(shape, MaskedLMConfig(mask_token_id=4, special_token_ids=(0, 1, 2, 3, 4)))
    config = TrainerConfig(
        lr=1e-4,
        max_steps=args.pretrain_warmup + args.pretrain_steps,
        batch_size=args.pretrain_batch,
        bf16=bf16,
        checkpoint_every=0,
        seed=args.seed,
    )
    return Trainer(objective, config, RandomRows(args.pretrain_seq, args.seed), out, progress=False)


def mlm_steps(args, out: Path) -> dict[str, dict]:
    """Seconds per MLM training step of ctxrep's Trainer at fp32 and bf16 autocast (its `_train_step`, the step
    `Trainer.train` runs without its logging and checkpoints), the two trainers taking turns: the median of
    --pretrain-steps steps after --pretrain-warmup."""
    trainers = {name: mlm_trainer(name == "bf16", args, out / name) for name in DTYPES}
    times: dict[str, list[float]] = {name: [] for name in DTYPES}
    masked: dict[str, list[float]] = {name: [] for name in DTYPES}
    peaks: dict[str, list[float]] = {name: [] for name in DTYPES}
    last = {}
    for i in range(args.pretrain_warmup + args.pretrain_steps):
        for name in DTYPES if i % 2 == 0 else reversed(DTYPES):
            t0 = time.perf_counter()
            last[name] = trainers[name]._train_step()
            if i >= args.pretrain_warmup:
                times[name].append(time.perf_counter() - t0)
                masked[name].append(last[name].metrics["masked_tokens"])
                peaks[name].append(matmul_peak(DTYPES[name], args.peak_size, 1))
    results = {}
    for name in DTYPES:
        step_s = float(np.median(times[name]))
        flops = model_flops_per_step(args.pretrain_batch, args.pretrain_seq, float(np.mean(masked[name])))
        results[name] = {
            "step_seconds": step_s,
            "steps": len(times[name]),
            "tokens_per_s": args.pretrain_batch * args.pretrain_seq / step_s,
            "flops_per_step": flops,
            "gflops": flops / step_s / 1e9,
            "final_loss": last[name].loss,
            "peak_gflops": float(np.median(peaks[name])),
        }
    return results


# ---- main -------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    load_before = os.getloadavg()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    train = sample(read_task("sst2", args.data / "sst" / "train.txt"), args.sst_train, rng)
    dev = sample(read_task("sst2", args.data / "sst" / "dev.txt"), args.limit, rng)
    print(
        f"SST-2: {len(train.X):,} training sentences (random sample, seed {args.seed}), {len(dev.X):,} dev sentences; "
        f"{args.epochs} epochs, batch {args.batch_size}, lr {args.lr:g}, max_length {args.max_length}; MLM: "
        f"{args.pretrain_warmup} + {args.pretrain_steps} steps of {args.pretrain_batch} x {args.pretrain_seq}; "
        f"{args.threads} threads",
        flush=True,
    )

    peak = {name: matmul_peak(dtype, args.peak_size, args.peak_repeats) for name, dtype in DTYPES.items()}
    print("peak GFLOP/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in peak.items()), flush=True)

    runs: dict[str, dict] = {}
    fp32_estimator = None
    for name, bf16 in (("fp32", False), ("bf16", True)):
        before = matmul_peak(DTYPES[name], args.peak_size, args.peak_repeats)
        estimator, runs[f"finetune {name}"] = finetune(train, dev, bf16, args)
        r = runs[f"finetune {name}"]
        r["peak_gflops"] = (before + matmul_peak(DTYPES[name], args.peak_size, args.peak_repeats)) / 2
        print(
            f"fine-tune {name}: {r['train_seconds']:.0f} s, {r['tokens_per_s']:,.0f} tokens/s, "
            f"{r['gflops']:.1f} GFLOP/s, dev accuracy {r['dev_accuracy']:.4f}",
            flush=True,
        )
        if not bf16:
            fp32_estimator = estimator
    int8_accuracy = fp32_estimator.score(dev.X, dev.y, precision="int8")
    print(f"int8 prediction of the float32-trained classifier: dev accuracy {int8_accuracy:.4f}", flush=True)
    for name, r in paired_finetune_steps(fp32_estimator, train, args).items():
        runs[f"finetune step (paired) {name}"] = r
        print(f"fine-tune step (paired) {name}: {r['step_seconds'] * 1e3:.0f} ms, {r['gflops']:.1f} GFLOP/s")
    del fp32_estimator, estimator

    with tempfile.TemporaryDirectory(prefix="ctxrep-training-precision-") as tmp:
        for name, r in mlm_steps(args, Path(tmp)).items():
            runs[f"MLM step (paired) {name}"] = r
            print(f"MLM step (paired) {name}: {r['step_seconds'] * 1e3:.0f} ms, {r['gflops']:.1f} GFLOP/s", flush=True)
    load_after = os.getloadavg()
    for name, r in runs.items():
        r["precision"] = name.split()[-1]
        r["mfu"] = r["gflops"] / r["peak_gflops"]

    def row(name: str) -> list[str]:
        r = runs[name]
        base = runs[name.replace("bf16", "fp32")]
        seconds = r["train_seconds"] if "train_seconds" in r else r["step_seconds"]
        accuracy = f"{100 * r['dev_accuracy']:.2f}" if "dev_accuracy" in r else "-"
        return [
            name.replace("bf16", "bf16 autocast"),
            f"{seconds:.1f}" if "train_seconds" in r else f"{seconds * 1e3:.0f} ms",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x",
            f"{r['gflops']:.1f}",
            f"{r['peak_gflops']:,.0f}",
            f"{r['mfu']:.1%}",
            accuracy,
        ]

    header = ["training", "time (s / step)", "tokens/s", "vs fp32", "GFLOP/s", "peak GFLOP/s", "MFU", "dev acc"]
    rows = [row(name) for name in runs]
    fp32_acc, bf16_acc = runs["finetune fp32"]["dev_accuracy"], runs["finetune bf16"]["dev_accuracy"]
    rows.append(["finetune fp32, predicting int8", "-", "-", "-", "-", "-", "-", f"{100 * int8_accuracy:.2f}"])
    bf16_gap, int8_gap = 100 * (bf16_acc - fp32_acc), 100 * (int8_accuracy - fp32_acc)
    checks = [
        ["bf16-trained dev accuracy - fp32-trained", f"{bf16_gap:+.2f} points", f"|x| <= {TARGET_POINTS}"],
        ["int8-predicting dev accuracy - fp32", f"{int8_gap:+.2f} points", f"|x| <= {TARGET_POINTS}"],
    ]
    for check, gap in zip(checks, (bf16_gap, int8_gap)):
        check.append(mark(abs(gap) <= TARGET_POINTS + 1e-9))
    check_header = ["check", "measured", "target", "result"]
    dry = " DRY RUN (--limit): not a result." if args.limit else ""
    predicted_fp32 = runs["finetune bf16"].get("dev_accuracy_fp32_predict")
    notes = [
        f"command: `{command}`",
        (
            f"fine-tune: minilm (6 layers, 384 wide), SequenceClassifier(pooling='mean', lr={args.lr:g}, "
            f"batch_size={args.batch_size}, max_length={args.max_length}, max_epochs={args.epochs}, "
            f"random_state={args.seed}); {len(train.X):,} SST-2 training sentences (random sample of sst/train.txt), "
            f"{runs['finetune fp32']['tokens']:,} real tokens over the epochs, "
            f"{runs['finetune fp32']['forward_flops_per_token'] / 1e6:.1f} MFLOP per token forward (x3 a training "
            f"step); dev: {len(dev.X):,} sentences.{dry} The bf16-trained model predicts under bf16 autocast "
            f"(bf16=True); predicting in float32 it scores {100 * predicted_fp32:.2f}."
        ),
        (
            f"MLM step: `small` shape (hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads, intermediate {INTERMEDIATE}, "
            f"vocab {VOCAB}), {args.pretrain_batch} x {args.pretrain_seq} tokens, Trainer._train_step, median of "
            f"{args.pretrain_steps} steps after {args.pretrain_warmup}, the fp32 and bf16 trainers in turns; "
            f"{runs['MLM step (paired) fp32']['flops_per_step'] / 1e9:.1f} GFLOP of useful work per step. Fine-tune "
            f"step (paired): the median of {args.paired_steps} steps of the Trainer's step per precision on the "
            "same training batches, the two in turns (a load that changes falls on both alike)."
        ),
        (
            f"peak: torch.mm of {args.peak_size}^3 at the row's dtype under the same load as the row: for a fit the "
            f"mean of the fastest of {args.peak_repeats} right before and right after it, for steps in turns the "
            f"median of one product timed after each step; at the start: fp32 {peak['fp32']:,.0f}, bf16 "
            f"{peak['bf16']:,.0f} GFLOP/s."
        ),
        (
            f"torch {torch.__version__} ({args.threads} threads); python {platform.python_version()}; CPU: "
            f"{cpu_description()}, {logical_cpus()} logical CPUs; native bf16: {'yes' if cpu_has_bf16() else 'no'}; "
            f"load average (1/5/15 min) {' / '.join(f'{x:.2f}' for x in load_before)} before, "
            f"{' / '.join(f'{x:.2f}' for x in load_after)} after; {time.perf_counter() - started:.0f} s in all."
        ),
    ]

    print()
    print(fmt_table(header, rows, markdown=False))
    print()
    print(fmt_table(check_header, checks, markdown=False))
    print()
    print("\n".join(notes))
    markdown = "\n".join(
        [fmt_table(header, rows, markdown=True), "", fmt_table(check_header, checks, markdown=True), ""]
        + [f"- {note}" for note in notes]
    )
    print("\n--- Markdown ---\n")
    print(markdown)
    if args.markdown_out is not None:
        args.markdown_out.write_text(markdown + "\n", encoding="utf-8")
        print(f"\n(written to {args.markdown_out})")
    if args.json is not None:
        record = {
            "command": command,
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "train_sentences": len(train.X),
            "dev_sentences": len(dev.X),
            "peak_gflops": peak,
            "runs": runs,
            "int8_dev_accuracy": int8_accuracy,
            "bf16_gap_points": bf16_gap,
            "int8_gap_points": int8_gap,
            "cpu": cpu_description(),
            "cpu_has_bf16": cpu_has_bf16(),
            "torch": torch.__version__,
            "load_before": load_before,
            "load_after": load_after,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"(numbers written to {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
