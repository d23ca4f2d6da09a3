"""What each layer of a model knows: probing and word-in-context numbers on real data, with timings.

  UPOS   linear probe per layer (+ learned ScalarMix), trained on UD English-EWT train (first --train-sentences),
         scored on the whole EWT dev set; a random-init model of the same shape is the control row.
  NER    the same on CoNLL-2003 (eng.train -> eng.testa), token-level accuracy of the IOB1 tag.
  WiC    cosine of the two target words' vectors, threshold chosen on WiC train, accuracy on dev, per layer
         (layer 0 = the static, context-free baseline).

Expected shape (Tenney et al. 2019; Peters et al. 2018): part of speech peaks in lower-middle layers, word sense in
higher layers. The script says whether that held.

Run:  .venv/bin/python benchmarks/analysis.py --markdown-out benchmarks/results/analysis.md
      .venv/bin/python benchmarks/analysis.py --train-sentences 300 --dev-sentences 300   # quick trial
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ctxrep.analysis.neighbors import evaluate_wic
from ctxrep.analysis.probe import load_probe_data, read_wic_pairs, run_probe
from ctxrep.featurize import Featurizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--train-sentences", type=int, default=3000)
    p.add_argument("--dev-sentences", type=int, default=None, help="default: the whole dev set")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--markdown-out", type=Path, default=None)
    args = p.parse_args()
    files = {
        "ud_train": args.data / "ud_english_ewt" / "en_ewt-ud-train.conllu",
        "ud_dev": args.data / "ud_english_ewt" / "en_ewt-ud-dev.conllu",
        "ner_train": args.data / "conll2003" / "eng.train",
        "ner_dev": args.data / "conll2003" / "eng.testa",
        "wic_train": args.data / "wic" / "train",
        "wic_dev": args.data / "wic" / "dev",
    }
    missing = [str(f) for f in files.values() if not f.exists()]
    if missing:
        print(f"error: data not found: {', '.join(missing)} (pass --data DIR)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    fz = Featurizer(args.model, layers="all")
    lines, results = [], {}

    for task, train_f, dev_f in (("upos", "ud_train", "ud_dev"), ("ner", "ner_train", "ner_dev")):
        start = time.perf_counter()
        train = load_probe_data(task, files[train_f], args.train_sentences)
        dev = load_probe_data(task, files[dev_f], args.dev_sentences)
        result = run_probe(fz, train, dev, control=True)
        seconds = time.perf_counter() - start
        print(result.table(), f"\n({seconds:.0f} s)\n", flush=True)
        results[task] = (result, seconds)

    start = time.perf_counter()
    wic = evaluate_wic(fz, read_wic_pairs(files["wic_train"]), read_wic_pairs(files["wic_dev"]))
    wic_seconds = time.perf_counter() - start
    print(wic.table(), f"\n({wic_seconds:.0f} s)\n")

    n = fz.num_layers + 1
    header = "| task | " + " | ".join(f"L{j}" for j in range(n)) + " | mix | expected layer | time |"
    lines += [header, "|" + " --- |" * (n + 4)]
    for task, (result, seconds) in results.items():
        for row in result.rows:
            accs = " | ".join(f"{a:.3f}" for a in row.layer_accuracy)
            lines.append(
                f"| {task} ({row.name}) | {accs} | {row.mix_accuracy:.3f} | {row.expected_layer:.2f} | "
                f"{seconds:.0f} s |"
            )
    accs = " | ".join(f"{layer.dev_accuracy:.3f}" for layer in wic.layers)
    lines.append(f"| WiC dev (cosine threshold) | {accs} | - | - | {wic_seconds:.0f} s |")

    upos_row = results["upos"][0].rows[0].layer_accuracy
    upos_peak = int(np.argmax(upos_row))
    wic_peak = max(wic.layers, key=lambda layer: layer.dev_accuracy).layer
    held = 1 <= upos_peak <= n // 2 and wic_peak > upos_peak
    verdict = (
        f"UPOS peaks at layer {upos_peak} of {n - 1}; WiC peaks at layer {wic_peak}. The expected shape "
        f"(part of speech in lower-middle layers, word sense higher) {'held' if held else 'did NOT hold'}."
    )
    majority = results["upos"][0].majority_accuracy
    notes = [
        f"- model: {args.model}; probes: softmax regression (L-BFGS) per layer and over a learned ScalarMix; "
        f"train = first {args.train_sentences} sentences, dev = {'all' if args.dev_sentences is None else args.dev_sentences} "
        f"dev sentences; majority-class UPOS accuracy {majority:.3f}.",
        f"- WiC: {wic.n_train} train / {wic.n_dev} dev pairs; layer 0 is the static baseline.",
        f"- {verdict}",
        f"- torch threads {args.threads}; torch {torch.__version__}.",
        f"- command: `.venv/bin/python benchmarks/analysis.py {shlex.join(sys.argv[1:])}`",
    ]
    text = "\n".join(lines + [""] + notes) + "\n"
    print(text)
    if args.markdown_out:
        args.markdown_out.parent.mkdir(parents=True, exist_ok=True)
        args.markdown_out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
