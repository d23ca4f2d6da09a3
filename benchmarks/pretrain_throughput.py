"""MLM pretraining throughput: ctxrep's MaskedLMObjective vs transformers' BertForMaskedLM, in one run.

    python benchmarks/pretrain_throughput.py --steps 20 --markdown-out benchmarks/results/pretrain_throughput.md

Both train the `small` shape (hidden 256, 4 layers, 4 heads, intermediate 1024, vocab 30522, 128-token rows,
batch 32, fp32, dropout 0.1) on the same random token ids with the same masks (15% of the positions, 80/10/10
corruption drawn once per step from a seeded generator), with AdamW (ctxrep's decay / no-decay groups) and
gradient clipping at 1.0: forward, backward, clip, optimizer step. Each configuration runs in its own
subprocess so that the malloc setting applies to that process alone:
  tuned   ctxrep.train.allocator.tune_malloc() (what ctxrep's Trainer calls), in the reference's process too;
  default glibc's defaults (no mallopt call, MALLOC_* variables removed from the environment).

Model FLOPs utilisation counts the same useful work for both systems: 6 x (encoder weights) per token, the
attention products (12 x layers x seq x hidden per token, forward + backward) and the MLM head on the masked
positions only (transformers computes the vocabulary projection at every position: that extra work is not
counted as useful). The peak is the rate of a large fp32 matmul timed in a subprocess with the same threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from _common import HEADS, HIDDEN, INTERMEDIATE, LAYERS, VOCAB, model_flops_per_step  # the `small` shape


def make_batches(steps: int, batch: int, seq: int, seed: int = 0):
    """Per step: (masked_input_ids, labels, attention_mask); labels -100 where not predicted."""
    import torch

    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(seed * 100003 + step)
        ids = torch.randint(5, VOCAB, (batch, seq), generator=g)
        ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
        selected = torch.rand(batch, seq, generator=g) < 0.15
        selected[:, 0] = selected[:, -1] = False
        action = torch.rand(batch, seq, generator=g)
        masked = torch.where(selected & (action < 0.8), torch.full_like(ids, 4), ids)
        randoms = torch.randint(5, VOCAB, (batch, seq), generator=g)
        masked = torch.where(selected & (action >= 0.8) & (action < 0.9), randoms, masked)
        labels = ids.masked_fill(~selected, -100)
        out.append((masked, labels, torch.ones_like(ids)))
    return out


def build(system: str):
    import torch

    torch.manual_seed(0)
    if system == "ctxrep":
        from ctxrep.models.bert import BertConfig
        from ctxrep.objectives.masked_lm import MaskedLMConfig, MaskedLMObjective

        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE,
        )
        model = MaskedLMObjective(config, MaskedLMConfig(mask_token_id=4, special_token_ids=(0, 1, 2, 3, 4)))

        def loss(masked, labels, mask):
            return model.loss(masked, labels, mask).loss
    else:
        import transformers

        config = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE,
        )
        model = transformers.BertForMaskedLM(config)

        def loss(masked, labels, mask):
            return model(input_ids=masked, attention_mask=mask, labels=labels).loss

    return model, loss


def worker(args) -> dict:
    import torch

    from ctxrep.train.allocator import tune_malloc
    from ctxrep.train.trainer import param_groups

    torch.set_num_threads(args.threads)
    tuned = tune_malloc() if args.malloc == "tuned" else False
    if args.system == "peak":
        n = 2048
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(10):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        return {"gflops": 2 * n**3 / best / 1e9}
    model, loss_fn = build(args.system)
    model.train()
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, eps=1e-6)
    batches = make_batches(args.warmup + args.steps, args.batch_size, args.seq)
    times = []
    for i, (masked, labels, mask) in enumerate(batches):
        t = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(masked, labels, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    masked_per_step = sum(int((lab != -100).sum()) for _, lab, _ in batches) / len(batches)
    step_s = sum(times) / len(times)
    return {
        "step_s": step_s,
        "tokens_per_s": args.batch_size * args.seq / step_s,
        "flops_per_step": model_flops_per_step(args.batch_size, args.seq, masked_per_step),
        "malloc_tuned": tuned,
        "final_loss": float(loss),
    }


def run_worker(system: str, malloc: str, args) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    }
    env["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        system,
        "--malloc",
        malloc,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--batch-size",
        str(args.batch_size),
        "--seq",
        str(args.seq),
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{system} ({malloc}) failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed training steps per system")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--markdown-out", default=None)
    p.add_argument("--worker", choices=["ctxrep", "transformers", "peak"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--malloc", choices=["tuned", "default"], default="tuned", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.system = args.worker
        print(json.dumps(worker(args)))
        return

    peak = run_worker("peak", "tuned", args)["gflops"]
    rows = []
    for system, malloc in (
        ("ctxrep", "tuned"),
        ("transformers", "tuned"),
        ("transformers", "default"),
        ("ctxrep", "default"),
    ):
        r = run_worker(system, malloc, args)
        r.update(system=system, malloc=malloc, mfu=r["flops_per_step"] / r["step_s"] / (peak * 1e9))
        rows.append(r)
        print(
            f"{system:12s} malloc={malloc:7s} {r['tokens_per_s']:9.0f} tokens/s  step {r['step_s'] * 1e3:7.1f} ms  "
            f"MFU {r['mfu']:.1%}",
            flush=True,
        )
    ours = rows[0]["tokens_per_s"]
    lines = [
        f"MLM pretraining throughput, `small` shape (hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads, intermediate "
        f"{INTERMEDIATE}, vocab {VOCAB}), batch {args.batch_size} x {args.seq} tokens, fp32, {args.threads} threads, "
        f"{args.steps} timed steps after {args.warmup}; torch {_version('torch')}, transformers "
        f"{_version('transformers')}, {platform.processor() or platform.machine()}.",
        "",
        f"Matmul peak (2048^3 fp32, same threads): {peak:.1f} GFLOP/s.",
        "",
        "| system | malloc | tokens/s | ms/step | MFU | ctxrep (tuned) / this |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['system']} | {r['malloc']} | {r['tokens_per_s']:.0f} | {r['step_s'] * 1e3:.1f} | "
            f"{r['mfu']:.1%} | {ours / r['tokens_per_s']:.2f}x |"
        )
    lines += ["", "Command: `python benchmarks/pretrain_throughput.py " + " ".join(sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(text)


def _version(name: str) -> str:
    try:
        return __import__(name).__version__
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    main()
