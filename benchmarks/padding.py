#!/usr/bin/env python
"""How much of a batch is padding under ctxrep's batching: SST training sentences tokenized by MiniLM, sorted by
length and cut by `ctxrep.text.inputs.token_budget_batches` at the CPU budget (2,048 tokens) and at GPU-sized
budgets, against unsorted batches of 64. What packed (unpadded) attention could save at most.

    .venv/bin/python benchmarks/padding.py [--data DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
from _common import DEFAULT_DATA, fmt_table, load_corpus

from ctxrep.models.loading import resolve_model_path
from ctxrep.text.inputs import token_budget_batches

BUDGETS = (2048, 16384, 65536)


def padded_share(lengths: list[int], sizes: list[int]) -> float:
    """Padding's share of the batch tokens when consecutive batches of `sizes` pad to their longest sequence."""
    padded, start = 0, 0
    for size in sizes:
        padded += size * max(lengths[start : start + size])
        start += size
    return 1 - sum(lengths) / padded


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"the shared data folder [{DEFAULT_DATA}]")
    args = parser.parse_args(argv)
    tokenizer = Tokenizer.from_file(str(resolve_model_path("minilm") / "tokenizer.json"))
    tokenizer.no_truncation()  # the packaged file truncates and pads at 128
    tokenizer.no_padding()
    sentences = [" ".join(words) for words in load_corpus(args.data, "sst", 8544)]
    lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences)]
    ascending = sorted(lengths)
    rows = [
        [
            f"length-sorted, budget {b:,} tokens",
            f"{100 * padded_share(ascending, token_budget_batches(ascending, b)):.1f}%",
        ]
        for b in BUDGETS
    ]
    shuffled = lengths[:]
    random.Random(0).shuffle(shuffled)
    rows.append(
        [
            "unsorted, batches of 64",
            f"{100 * padded_share(shuffled, [min(64, len(shuffled) - i) for i in range(0, len(shuffled), 64)]):.1f}%",
        ]
    )
    print(fmt_table(["batches", "padding"], rows, markdown=True))
    print(f"\n{len(lengths):,} SST training sentences, {int(np.sum(lengths)):,} MiniLM tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
