"""Pretrain a small ELMo biLM on Gutenberg, then check held-out perplexity and the word-sense test.

1. ctxrep pretrain's pipeline for --objective bilm (prepare_run: word-level tokenizer, packed corpus, held-out
   tail, FULL-SENTENCES packer, BiLMObjective with the sampled softmax) + the shared Trainer, for --minutes of training on gutenberg/train of --data
   (the number of steps is set from the measured time of a few steps, so that the learning rate decays to 0
   at the end; a timer stops the run cleanly, as Ctrl-C would, if it overruns by more than 10%).
2. Forward and backward perplexity (full softmax) on gutenberg/valid (--eval-batches; 0 = all of it).
3. The sense test on the sentences of `ctxrep demo` (src/ctxrep/cli/demo.py): the cosine similarity of the
   target word's vectors between sentences, per layer, averaged over same-sense and different-sense pairs.
   Layer 0 (the character CNN) is context-free, so its two means are equal; a contextual layer should give
   same-sense pairs the higher mean.

Full run (about 65 minutes, of which 60 are training; about 1.1 s per step of 32 x 48 words on one thread of an
idle machine, 0.76 s on two: ~3,000 or ~4,700 steps):

    .venv/bin/python benchmarks/elmo_gutenberg.py --out runs/elmo-gutenberg \\
        --markdown-out benchmarks/results/elmo_gutenberg.md

Quick check:  .venv/bin/python benchmarks/elmo_gutenberg.py --minutes 1 --out /tmp/elmo-check
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _common import DEFAULT_DATA

# A small biLM (about a twentieth of the published "original" model): a 512-filter char CNN, two layers of
# 1024-cell LSTMs projected to 128 in each direction, a 30k-word softmax sampled with 4096 draws.
# The schema of `ctxrep pretrain`'s TOML configs ([elmo] in the layout of ELMo's options.json).
CONFIG = {
    "elmo": {
        "char_cnn": {
            "embedding": {"dim": 16},
            "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]],
            "n_highway": 1,
            "activation": "relu",
            "n_characters": 262,
            "max_characters_per_token": 50,
        },
        "lstm": {
            "dim": 1024,
            "projection_dim": 128,
            "n_layers": 2,
            "cell_clip": 3.0,
            "proj_clip": 3.0,
            "use_skip_connections": True,
        },
    },
    "tokenizer": {"vocab_size": 30000, "min_frequency": 1, "lowercase": False},
    "data": {"max_length": 48, "eval_fraction": 0.005, "document_boundary": "file"},
    "objective": {"softmax": "sampled", "num_samples": 4096, "dropout": 0.1},
    "trainer": {"seed": 0},
}

# "broke" in the demo sentences, grouped by sense (our labels; the demo itself does not label them):
# become known / begin, go beyond a limit, force one's way in, and two senses with one sentence each.
BROKE_SENSES = {
    "The vase broke .": "shatter",
    "Dawn broke .": "emerge",
    "The news broke .": "emerge",
    "Sandy broke the world record .": "exceed a limit",
    "Sandy broke the law .": "exceed a limit",
    "The burglar broke into the house .": "break into",
    "The newscaster broke into the movie broadcast .": "break into",
    "We broke even .": "break even",
}


def calibrate_step_seconds(run, batch_size: int, lr: float, steps: int = 3) -> float:
    """Seconds per optimizer step, timed on a copy of the objective (the run's data position is restored)."""
    import torch

    objective = copy.deepcopy(run.objective).train()
    optimizer = torch.optim.AdamW(objective.parameters(), lr=lr)
    state = run.train_data.state_dict()
    times = []
    for _ in range(steps + 1):  # the first step warms up the allocator: not counted
        batch = {k: torch.from_numpy(v) for k, v in run.train_data.next_batch(batch_size).items()}
        start = time.perf_counter()
        optimizer.zero_grad()
        objective(batch).loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    run.train_data.load_state_dict(state)
    return float(np.median(times[1:]))


def sense_gaps(
    fz, sentences: list[str], senses: list[str], word: str, half: str | None = None
) -> list[tuple[float, float]]:
    """Per layer: (mean cosine over same-sense pairs, mean cosine over different-sense pairs); half="forward" or
    "backward" uses only that direction's half of each vector (the left or the right context)."""
    from ctxrep.cli.demo import cosine_matrix, target_vectors

    vectors = target_vectors(fz, sentences, word)  # (sentences, layers, dim)
    if half is not None:
        d = vectors.shape[-1] // 2
        vectors = vectors[..., :d] if half == "forward" else vectors[..., d:]
    same = np.array([[a == b for b in senses] for a in senses]) & ~np.eye(len(senses), dtype=bool)
    different = np.array([[a != b for b in senses] for a in senses])
    gaps = []
    for layer in range(vectors.shape[1]):
        sims = cosine_matrix(vectors[:, layer])
        gaps.append((float(sims[same].mean()), float(sims[different].mean())))
    return gaps


def sense_test(fz) -> tuple[list[str], list[list[str]], list[str]]:
    """The sense test: (header, one row per layer and per direction, verdicts on the whole vectors)."""
    from ctxrep.cli.demo import BROKE, CRANE

    header = ["layer", "crane same", "crane diff", "crane gap", "broke same", "broke diff", "broke gap"]
    rows, whole = [], {}
    for half in (None, "forward", "backward"):
        crane = sense_gaps(fz, [s for s, _ in CRANE], [sense for _, sense in CRANE], "crane", half)
        broke = sense_gaps(fz, BROKE, [BROKE_SENSES[s] for s in BROKE], "broke", half)
        if half is None:
            whole = {"crane": crane, "broke": broke}
        for layer, (c, b) in enumerate(zip(crane, broke)):
            if half is not None and layer == 0:
                continue  # layer 0 is the same context-free vector in both halves
            name = str(layer) if half is None else f"{layer} ({half} half)"
            rows.append(
                [
                    name,
                    f"{c[0]:.4f}",
                    f"{c[1]:.4f}",
                    f"{c[0] - c[1]:+.4f}",
                    f"{b[0]:.4f}",
                    f"{b[1]:.4f}",
                    f"{b[0] - b[1]:+.4f}",
                ]
            )

    def separated(gaps, layer):
        return gaps[layer][0] - gaps[layer][1] > 1e-4

    verdicts = []
    for word, gaps in whole.items():
        upper = [layer for layer in range(1, len(gaps)) if separated(gaps, layer)]
        ok = bool(upper) and not separated(gaps, 0)
        where = ", ".join(map(str, upper)) or "none"
        verdicts.append(
            f"{word}: same-sense pairs closer at layer(s) {where}; at layer 0 "
            f"{'not' if not separated(gaps, 0) else 'also'} -> {'PASS' if ok else 'FAIL'}"
        )
    return header, rows, verdicts


def sense_markdown(header: list[str], rows: list[list[str]], verdicts: list[str]) -> list[str]:
    return [
        "Sense test (sentences of `ctxrep demo`): mean cosine similarity of the target word's vectors over "
        "same-sense and different-sense sentence pairs; the whole vector, then its forward (left-context) and "
        "backward (right-context) halves. crane: the demo's [bird]/[machine] labels; broke: our grouping "
        + "; ".join(f"{s!r} = {v}" for s, v in BROKE_SENSES.items())
        + ".",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *(f"- {v} (whole vector)" for v in verdicts),
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="The shared data folder (gutenberg/).")
    parser.add_argument(
        "--train", type=Path, default=None, help="Folder of .txt files to train on (DATA/gutenberg/train)."
    )
    parser.add_argument(
        "--valid", type=Path, default=None, help="Folder of .txt files for perplexity (DATA/gutenberg/valid)."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/elmo-gutenberg"),
        help="Run folder (a new one: the Trainer refuses a folder holding a checkpoint).",
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="Training time budget.")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="Train exactly this many steps instead of what --minutes buys (for a machine shared "
        "with other jobs, where the measured step time would not hold).",
    )
    parser.add_argument(
        "--projection-dim",
        type=int,
        default=CONFIG["elmo"]["lstm"]["projection_dim"],
        help="Width of each direction's LSTM output (and of the token vector).",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--eval-batches",
        type=int,
        default=40,
        help="Validation batches (40: about 55k words, 3 minutes; 0 = all of gutenberg/valid).",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="Torch threads. On a machine shared with other jobs, 2 threads on 2 cores ran 20x "
        "slower than 1 (threads wait for each other): use 2 only on an idle machine.",
    )
    parser.add_argument("--markdown-out", type=Path, default=None, help="Write the results as Markdown here.")
    parser.add_argument("--senses-only", action="store_true", help="Only rerun the sense test on the model in --out.")
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="Continue training the biLM saved in this folder (its tokenizer and weights; the text is "
        "drawn in a new order) instead of starting from random weights.",
    )
    args = parser.parse_args(argv)
    args.train = args.train or args.data / "gutenberg" / "train"
    args.valid = args.valid or args.data / "gutenberg" / "valid"
    if not args.senses_only and not args.train.is_dir():
        sys.exit(f"error: {args.train} is not a folder: pass the shared data folder with --data (or --train)")
    command = shlex.join(["python", "benchmarks/elmo_gutenberg.py", *(sys.argv[1:] if argv is None else argv)])
    if args.senses_only:
        from ctxrep.featurize import Featurizer

        header, rows, verdicts = sense_test(Featurizer(f"elmo:{args.out}", layers="all", pooling="mean"))
        md = [
            f"## Sense test of the ELMo in {args.out}",
            "",
            f"Command: `{command}`",
            "",
            *sense_markdown(header, rows, verdicts),
        ]
        print("\n".join(md))
        if args.markdown_out:
            args.markdown_out.write_text("\n".join(md))
        return

    import torch

    from ctxrep.data.corpus import CorpusConfig, pack_corpus
    from ctxrep.data.packing import FullSentencesConfig, FullSentencesPacker
    from ctxrep.featurize import Featurizer
    from ctxrep.objectives.bilm import evaluate_perplexity
    from ctxrep.text.tokenizer import Tokenizer
    from ctxrep.train.pretrain import prepare_run
    from ctxrep.train.pretrain_config import config_from_dict
    from ctxrep.train.trainer import Trainer, TrainerConfig

    torch.set_num_threads(args.threads)
    config = json.loads(json.dumps(CONFIG))
    config["data"]["num_workers"] = 0 if args.threads == 1 else args.threads  # 0: tokenize in this process
    config["elmo"]["lstm"]["projection_dim"] = args.projection_dim
    tokenizer = None
    if args.init_from is not None:  # the saved model's vocabulary, and a new data order
        tokenizer = args.init_from
        config["trainer"]["seed"] = 1
    settings = config_from_dict(config, "benchmarks/elmo_gutenberg.py", objective="bilm")
    started = time.perf_counter()
    torch.manual_seed(settings.trainer.seed)  # the initial weights, as `ctxrep pretrain` draws them
    run = prepare_run("bilm", settings, args.train, args.out, tokenizer)
    if args.init_from is not None:
        from ctxrep.models.elmo import ElmoBiLM

        run.objective.bilm.load_state_dict(ElmoBiLM.from_pretrained(args.init_from).state_dict())
        print(f"continuing from the weights in {args.init_from}")
    prepared = time.perf_counter() - started
    n_params = sum(p.numel() for p in run.objective.parameters())
    print(
        f"prepared in {prepared:.0f}s: vocabulary {len(run.objective.vocab_words)} words, "
        f"{run.train_data.corpus.num_tokens:,} training words, {n_params / 1e6:.1f}M parameters"
    )

    if args.steps is None:
        step_seconds = calibrate_step_seconds(run, args.batch_size, args.lr)
        budget = args.minutes * 60
        max_steps = max(10, int(budget / step_seconds))
        print(
            f"{step_seconds:.2f}s per step of {args.batch_size} x {config['data']['max_length']} words: "
            f"{max_steps} steps in {args.minutes:g} minutes"
        )
    else:
        max_steps, budget = args.steps, math.inf
    trainer_config = TrainerConfig(
        lr=args.lr,
        weight_decay=0.0,
        warmup_steps=min(200, max_steps // 10),
        max_steps=max_steps,
        schedule="linear",
        grad_clip=1.0,
        batch_size=args.batch_size,
        eval_every=0,
        eval_batches=10,
        checkpoint_every=0,
        log_every=max(1, min(50, max_steps // 20)),
    )
    trainer = Trainer(run.objective, trainer_config, run.train_data, args.out, run.eval_data, run.save_model)
    # A safety net, not the plan: if the steps get slower than measured, stop (as Ctrl-C does) at +10%.
    timer = threading.Timer(budget * 1.1 + 30, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.daemon = True
    train_start, cpu_start = time.perf_counter(), time.process_time()
    if math.isfinite(budget):
        timer.start()
    try:
        result = trainer.train()
    finally:
        timer.cancel()
    train_seconds, train_cpu_seconds = time.perf_counter() - train_start, time.process_time() - cpu_start
    steps = result["step"]
    words_seen = steps * args.batch_size * config["data"]["max_length"]  # an upper bound: rows may be shorter

    # Held-out perplexity on gutenberg/valid, packed with the run's tokenizer, every sequence once.
    tokenizer = Tokenizer.from_model_dir(args.out)
    valid_corpus = pack_corpus(
        args.valid, args.out / "tokenizer.json", args.out / "valid_corpus", CorpusConfig(num_workers=args.threads)
    )
    valid = FullSentencesPacker(
        valid_corpus,
        FullSentencesConfig(config["data"]["max_length"], seed=0, separator_id=tokenizer.backend.token_to_id("</S>")),
        tokenizer,
    )
    n_batches = args.eval_batches or max(1, valid.epoch_size() // args.batch_size)
    eval_start = time.perf_counter()
    ppl = evaluate_perplexity(run.objective, valid, n_batches, batch_size=args.batch_size)
    eval_seconds = time.perf_counter() - eval_start
    print(
        f"gutenberg/valid ({int(ppl['tokens']):,} words): forward perplexity {ppl['forward_ppl']:.1f}, "
        f"backward {ppl['backward_ppl']:.1f}"
    )

    # The sense test, on the saved folder as a user would load it.
    fz = Featurizer(f"elmo:{args.out}", layers="all", pooling="mean")
    header, rows, verdicts = sense_test(fz)
    print("\n" + "  ".join(f"{h:>11}" for h in header))
    for row in rows:
        print("  ".join(f"{c:>11}" for c in row))
    print("\n".join(verdicts))

    if args.markdown_out:
        md = [
            "## ELMo biLM pretrained on Gutenberg",
            "",
            f"Command: `{command}`",
            "",
            f"Model: char CNN filters {config['elmo']['char_cnn']['filters']}, "
            f"{config['elmo']['char_cnn']['n_highway']} highway, {config['elmo']['lstm']['n_layers']} x LSTM "
            f"{config['elmo']['lstm']['dim']} projected to {config['elmo']['lstm']['projection_dim']} per direction, vocabulary {len(run.objective.vocab_words):,} words, "
            f"sampled softmax {config['objective']['num_samples']} draws; {n_params / 1e6:.1f}M parameters.",
            "",
            f"Training: {steps} steps of {args.batch_size} x <= {config['data']['max_length']} words "
            f"(<= {words_seen:,} words, {run.train_data.corpus.num_tokens:,} in the training text), AdamW lr {args.lr:g}, "
            f"{train_seconds / 60:.1f} min on {args.threads} thread(s), {train_cpu_seconds / 60:.1f} CPU minutes "
            f"(+ {prepared:.0f}s tokenizer and packing)"
            + (", stopped early by the time limit" if result.get("interrupted") else "")
            + ".",
            "",
            "| held-out (gutenberg/valid, full softmax) | forward | backward |",
            "| --- | --- | --- |",
            f"| perplexity ({int(ppl['tokens']):,} words, {eval_seconds:.0f}s) | {ppl['forward_ppl']:.1f} "
            f"| {ppl['backward_ppl']:.1f} |",
            "",
            *sense_markdown(header, rows, verdicts),
        ]
        args.markdown_out.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_out.write_text("\n".join(md))
        print(f"wrote {args.markdown_out}")


if __name__ == "__main__":
    main()
