#!/usr/bin/env python
"""The readers against the official counts of the real files in the shared data folder (sentences, tokens, labels,
entity types), one table, exit 1 on any mismatch. The unit tests check the readers on small synthetic files (a
user's clone has no ../shared/data); this checks them on the real ones.

    .venv/bin/python benchmarks/data_counts.py [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from _common import DEFAULT_DATA, fmt_table

from ctxrep.data.conll import read_conll
from ctxrep.data.conllu import read_conllu
from ctxrep.data.sst import read_sst
from ctxrep.data.tags import entities
from ctxrep.data.wic import read_wic


def conll2003(data: Path) -> list[tuple[str, object, object]]:
    rows = []
    for name, n_sentences, n_tokens, by_type in [
        ("eng.train", 14041, 203621, {"LOC": 7140, "PER": 6600, "ORG": 6321, "MISC": 3438}),
        ("eng.testa", 3250, 51362, {"PER": 1842, "LOC": 1837, "ORG": 1341, "MISC": 922}),
    ]:
        sentences = read_conll(data / "conll2003" / name)
        rows += [
            (f"conll2003/{name} sentences", n_sentences, len(sentences)),
            (f"conll2003/{name} tokens", n_tokens, sum(len(s.words) for s in sentences)),
            (f"conll2003/{name} 3 columns besides the word", True, all(len(c) == 3 for s in sentences for c in s.columns)),
            (f"conll2003/{name} entities by type", by_type, dict(Counter(e.type for s in sentences for e in entities(s.tags)))),
        ]  # fmt: skip
    return rows


def ud_english_ewt(data: Path) -> list[tuple[str, object, object]]:
    rows = []
    for name, n_sentences, n_words in [("train", 12544, 204577), ("dev", 2001, 25147)]:
        sentences = read_conllu(data / "ud_english_ewt" / f"en_ewt-ud-{name}.conllu")
        rows += [
            (f"ud_english_ewt/{name} sentences", n_sentences, len(sentences)),
            (f"ud_english_ewt/{name} words", n_words, sum(len(s.words) for s in sentences)),
            (f"ud_english_ewt/{name} every sentence has sent_id and text", True, all(s.sent_id and s.text for s in sentences)),
            (f"ud_english_ewt/{name} UPOS tags", 17, len({u for s in sentences for u in s.upos})),
        ]  # fmt: skip
    return rows


def sst(data: Path) -> list[tuple[str, object, object]]:
    train, dev = data / "sst" / "train.txt", data / "sst" / "dev.txt"
    binary_dev = read_sst(dev, classes=2)
    return [
        ("sst/train labels", {0: 1092, 1: 2218, 2: 1624, 3: 2322, 4: 1288}, dict(Counter(read_sst(train).labels))),
        ("sst/dev labels", {0: 139, 1: 289, 2: 229, 3: 279, 4: 165}, dict(Counter(read_sst(dev).labels))),
        ("sst/train binary sentences", 6920, len(read_sst(train, classes=2).texts)),
        ("sst/dev binary labels", {0: 428, 1: 444}, dict(Counter(binary_dev.labels))),
        ("sst/dev labelled phrases", 41447, len(read_sst(dev, phrases=True).texts)),
    ]


def wic(data: Path) -> list[tuple[str, object, object]]:
    rows = []
    for split, n, by_pos in [("train", 5428, {"N": 2794, "V": 2634}), ("dev", 638, {"N": 395, "V": 243})]:
        pairs = read_wic(data / "wic" / split / f"{split}.data.txt", data / "wic" / split / f"{split}.gold.txt")
        rows += [
            (f"wic/{split} pairs", n, len(pairs)),
            (f"wic/{split} labels", {True: n // 2, False: n // 2}, dict(Counter(p.label for p in pairs))),
            (f"wic/{split} parts of speech", by_pos, dict(Counter(p.pos for p in pairs))),
        ]
    return rows


CHECKS: list[Callable[[Path], list[tuple[str, object, object]]]] = [conll2003, ud_english_ewt, sst, wic]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"the shared data folder [{DEFAULT_DATA}]")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        sys.exit(f"error: the data folder {args.data} does not exist; pass its location with --data DIR")
    rows = [row for check in CHECKS for row in check(args.data)]
    table = [
        [what, str(official), str(read), "ok" if official == read else "MISMATCH"] for what, official, read in rows
    ]
    print(fmt_table(["what", "official", "read", ""], table, markdown=True, text_columns=4))
    bad = sum(official != read for _, official, read in rows)
    print(f"{len(rows) - bad} of {len(rows)} counts match")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
