"""Equal-compute comparison of pretraining objectives: MLM, ELECTRA, CLM, PLM on the same text and clock.

    python benchmarks/objectives.py --minutes 30 --parallel 2 --threads 1 --markdown-out benchmarks/results/objectives.md
    python benchmarks/objectives.py --device cuda --minutes 1   # one GPU: 4 x 1 minute of training plus preparation


Each objective trains a model of the same (discriminator) shape, the `small` config's unless --config says
otherwise, on gutenberg/train of the shared data folder (--data, default ../shared/data beside the checkout) for
the same compute budget (--minutes; tokenizer training and corpus packing come first and are not counted), in its
own subprocess: the budget ends with SIGINT, which makes the Trainer finish its step and save the model. On the CPU
the budget is the worker's CPU time divided by its threads (on Linux; wall-clock elsewhere): on an idle machine that
is the wall-clock time, and when something else takes a core for a while, every objective still gets the same
compute. With --device cuda each objective trains on the GPU, one at a time (--parallel 1), for --minutes of
wall-clock time, and the SST-2 features are computed there too.
Then, in the same process:
- held-out loss: the objective's own loss on gutenberg/valid (--eval-batches batches with a fixed seed);
  losses of different objectives measure different tasks and are not comparable with each other;
- SST-2: frozen sentence features (mean over the words of the last layer, ctxrep.Featurizer) and a
  scikit-learn logistic regression trained on the SST-2 train sentences, accuracy on SST-2 dev.
The results are a Markdown table with the exact command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common import DEFAULT_DATA

OBJECTIVES = ("mlm", "electra", "clm", "plm")
# Encoder-decoders (issue 44), run by name (--objectives mlm,denoising): their SST-2 features are the last layer's,
# the decoder's with the text teacher-forced (models/seq2seq.py)
SEQ2SEQ = ("denoising", "span-corruption")
CONTROL = "random"  # the MLM model and tokenizer, saved untrained: what the features give with no pretraining


def worker(args) -> dict:
    """Prepare, print READY, train until SIGINT, evaluate; return the results."""
    import torch

    from ctxrep.data.corpus import pack_corpus
    from ctxrep.objectives.recipes import recipe
    from ctxrep.train.pretrain import (
        CORPUS_DIR,
        build_run,
        corpus_config_of,
        make_packer,
        prepare_tokenizer,
    )
    from ctxrep.train.pretrain_config import load_config
    from ctxrep.train.trainer import Trainer

    torch.set_num_threads(args.threads)
    out = Path(args.out_root) / args.worker
    objective = "mlm" if args.worker == CONTROL else args.worker
    overrides = [
        ("trainer.max_steps", "10000000"),
        ("trainer.eval_every", "0"),
        ("data.eval_fraction", "0"),
        ("trainer.checkpoint_every", "0"),
        ("tokenizer.vocab_size", str(args.vocab_size)),
        ("trainer.warmup_steps", str(args.lr_warmup)),
        ("trainer.device", args.device),
    ]
    config = load_config(args.config, overrides)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)  # a fresh run; the tokenizer and packed text are reused
    tok = prepare_tokenizer(objective, config, args.train, out)
    packed = pack_corpus(args.train, out, out / CORPUS_DIR, corpus_config_of(config.data), progress=False)
    torch.manual_seed(config.trainer.seed)
    run = build_run(objective, config, packed, tok)
    trainer = Trainer(run.objective, config.trainer, run.train_data, out, None, run.save_model)
    print("READY", flush=True)
    sys.stdin.readline()  # "GO": objectives run side by side start their clocks together
    started = time.perf_counter()
    if args.worker == CONTROL:
        run.save_model(out)
        metrics = {"step": 0, "tokens_per_s": 0.0}
    else:
        metrics = trainer.train(resume=False)
    train_s = time.perf_counter() - started

    valid = pack_corpus(args.valid, out, out / "valid", corpus_config_of(config.data), progress=False)
    r = recipe(objective)
    source = make_packer(r, valid, config, tok, config.settings(r), None, warmup=False)
    losses = []
    model = run.objective.eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for _ in range(args.eval_batches):
            batch = {
                k: torch.from_numpy(v).to(args.device) for k, v in source.next_batch(config.trainer.batch_size).items()
            }
            losses.append(float(model(batch).loss))

    return {
        "objective": args.worker,
        "steps": metrics["step"],
        "train_minutes": train_s / 60,
        "tokens_per_s": metrics.get("tokens_per_s", float("nan")),
        "train_loss": metrics.get("loss", float("nan")),
        "valid_loss": sum(losses) / len(losses),
        **sst2_probe(out, args.limit_sst, args.data, args.device),
    }


def sst2_probe(model_dir: Path, limit_sst: int | None, data: Path, device: str = "cpu") -> dict:
    """SST-2 dev accuracy of logistic regressions on frozen mean-pooled last-layer sentence features: on the raw
    features, and on standardized ones (zero mean, unit variance per dimension, fitted on train). Pretrained
    features are anisotropic (a few large shared directions), which the raw probe's L2 penalty handles badly."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from ctxrep.data.sst import read_sst
    from ctxrep.featurize import Featurizer

    train_sst = read_sst(data / "sst" / "train.txt", classes=2)
    dev_sst = read_sst(data / "sst" / "dev.txt", classes=2)
    if limit_sst:  # a seeded random sample: the files are ordered by label
        for data in (train_sst, dev_sst):
            keep = np.random.default_rng(0).permutation(len(data.texts))[:limit_sst]
            data.texts, data.labels = [data.texts[i] for i in keep], [data.labels[i] for i in keep]
    featurizer = Featurizer(model_dir, layers=-1, pooling="mean", sentence_pooling="mean", device=device)
    x_train, x_dev = featurizer.embed_sentences(train_sst.texts), featurizer.embed_sentences(dev_sst.texts)
    accuracy = {}
    for name, probe in (
        ("sst2_dev_accuracy", LogisticRegression(max_iter=2000)),
        ("sst2_dev_accuracy_standardized", make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))),
    ):
        probe.fit(x_train, train_sst.labels)
        accuracy[name] = float(np.mean(probe.predict(x_dev) == np.array(dev_sst.labels)))
    return {
        **accuracy,
        "sst2_sizes": [len(train_sst.texts), len(dev_sst.texts)],
        "sst2_majority": max(np.mean(dev_sst.labels), 1 - np.mean(dev_sst.labels)),
    }


def start_objective(objective: str, args) -> subprocess.Popen:
    """Start a worker and wait until its tokenizer and packed corpus are ready (not timed)."""
    cmd = [sys.executable, __file__, "--worker", objective, *sys.argv[1:]]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.strip() == "READY":
            return proc
    raise SystemExit(f"{objective}: the worker stopped before training (exit {proc.wait()})")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None where /proc is not available."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def run_group(objectives: list[str], args) -> list[dict]:
    """Train these objectives side by side for the same compute budget, then collect their results."""
    procs = [start_objective(objective, args) for objective in objectives]
    used0 = [cpu_seconds(p.pid) for p in procs]
    for proc in procs:
        proc.stdin.write("GO\n")
        proc.stdin.flush()
    started, budget = time.monotonic(), args.minutes * 60
    running = list(procs)
    while running:
        time.sleep(1)
        for proc, u0 in zip(procs, used0):
            if proc not in running:
                continue
            used = cpu_seconds(proc.pid)
            on_cpu = args.device == "cpu" and used is not None and u0 is not None
            spent = (used - u0) / args.threads if on_cpu else time.monotonic() - started
            if proc.poll() is not None or spent >= budget:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)  # the Trainer finishes the step, saves the model and returns
                running.remove(proc)
    results = []
    for objective, proc in zip(objectives, procs):
        output = proc.stdout.read()
        if proc.wait():
            raise SystemExit(f"{objective}: the worker failed (exit {proc.returncode})")
        results.append(json.loads(output.strip().splitlines()[-1]))
    return results


def budget_unit(args) -> str:
    return "CPU minutes per thread" if args.device == "cpu" else f"wall-clock minutes on {args.device}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="training budget per objective: CPU minutes per thread (= wall-clock on an idle machine)",
    )
    p.add_argument(
        "--objectives",
        default=",".join(OBJECTIVES),
        help=f"comma-separated, from {', '.join(OBJECTIVES + SEQ2SEQ)} and {CONTROL!r} (an untrained control)",
    )
    p.add_argument("--config", default="small", help="model shape and training settings (a pretrain config)")
    p.add_argument("--vocab-size", type=int, default=16000, help="tokenizer entries (gutenberg/train is ~16 MB)")
    p.add_argument("--lr-warmup", type=int, default=200, help="learning-rate warm-up steps")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (gutenberg/, sst/)")
    p.add_argument("--train", default=None, help="training text folder (default: DATA/gutenberg/train)")
    p.add_argument("--valid", default=None, help="held-out text folder (default: DATA/gutenberg/valid)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: train and featurize on the GPU, one at a time")
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--limit-sst", type=int, default=None, help="use only the first N SST-2 train and dev sentences")
    p.add_argument("--threads", type=int, default=2, help="torch threads per objective")
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="objectives trained side by side (their clocks start together); "
        "threads x parallel should not exceed the cores",
    )
    p.add_argument("--out-root", default="runs/objectives", help="one run folder per objective under this")
    p.add_argument("--markdown-out", default=None)
    p.add_argument(
        "--probe-only",
        action="store_true",
        help="only rerun the SST-2 probes on the models already saved under --out-root",
    )
    p.add_argument("--worker", choices=(*OBJECTIVES, *SEQ2SEQ, CONTROL), default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.train = args.train or str(args.data / "gutenberg" / "train")
    args.valid = args.valid or str(args.data / "gutenberg" / "valid")
    if not (args.data / "sst" / "train.txt").is_file() or not Path(args.train).is_dir():
        sys.exit(f"error: {args.data} does not hold sst/ and gutenberg/train: pass the shared data folder with --data")
    if args.device != "cpu" and args.parallel != 1:
        sys.exit("error: --device cuda trains one objective at a time on the GPU: leave --parallel at 1")
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    if args.probe_only:
        lines = ["| objective | SST-2 dev acc (LR) | SST-2 dev acc (standardized LR) |", "|---|---:|---:|"]
        for objective in args.objectives.split(","):
            r = sst2_probe(Path(args.out_root) / objective, args.limit_sst, args.data, args.device)
            lines.append(f"| {objective} | {r['sst2_dev_accuracy']:.3f} | {r['sst2_dev_accuracy_standardized']:.3f} |")
            print(lines[-1], flush=True)
        lines += ["", "Command: `python benchmarks/objectives.py " + " ".join(sys.argv[1:]) + "`"]
        text = "\n".join(lines) + "\n"
        print("\n" + text)
        if args.markdown_out:
            Path(args.markdown_out).write_text(text)
        return

    rows, objectives = [], args.objectives.split(",")
    for start in range(0, len(objectives), args.parallel):
        group = run_group(objectives[start : start + args.parallel], args)
        rows += group
        for r in group:
            print(
                f"{r['objective']}: {r['steps']} steps, valid loss {r['valid_loss']:.3f}, SST-2 dev {r['sst2_dev_accuracy']:.3f}",
                flush=True,
            )
    n_train, n_dev = rows[0]["sst2_sizes"]
    lines = [
        f"Equal-compute pretraining ({args.minutes:g} {budget_unit(args)} each, {args.threads} thread(s), "
        f"{args.parallel} objective(s) at a time), `{args.config}` shape, "
        f"vocab {args.vocab_size}, on gutenberg/train; held-out loss on gutenberg/valid (each objective's own "
        f"loss: not comparable across rows); SST-2 dev accuracy of a logistic regression on frozen mean-pooled "
        f"last-layer features, raw and standardized ({n_train} train / {n_dev} dev sentences; majority class "
        f"{rows[0]['sst2_majority']:.3f}).",
        "",
        "| objective | steps | wall min | tokens/s | train loss | valid loss | SST-2 dev acc | (standardized) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['objective']} | {r['steps']} | {r['train_minutes']:.1f} | {r['tokens_per_s']:.0f} | "
            f"{r['train_loss']:.3f} | {r['valid_loss']:.3f} | {r['sst2_dev_accuracy']:.3f} | "
            f"{r['sst2_dev_accuracy_standardized']:.3f} |"
        )
    lines += ["", "Command: `python benchmarks/objectives.py " + " ".join(sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.markdown_out:
        Path(args.markdown_out).write_text(text)


if __name__ == "__main__":
    main()
