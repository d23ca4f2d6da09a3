"""WiC, the Word-in-Context dataset: does a word have the same sense in two sentences?

`*.data.txt` (tab-separated, sentences already tokenized):
    target_word <tab> N|V <tab> idx1-idx2 <tab> sentence1 <tab> sentence2
idx1 and idx2 are 0-based positions of the target among the whitespace-separated words of each
sentence. `*.gold.txt` holds the labels, T or F, one per line, in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from ctxrep.data.conll import iter_utf8_lines

logger = logging.getLogger(__name__)


@dataclass
class WicPair:
    word: str  # the target's lemma, as given (the sentences may inflect it)
    pos: str  # "N" or "V"
    idx1: int  # sentence1[idx1] is the target in the first sentence
    idx2: int
    sentence1: list[str]
    sentence2: list[str]
    label: bool | None  # True = same sense; None when read without a gold file
    line: int  # 1-based line number in the data file


def _parse_row(text: str, number: int, source: str) -> WicPair:
    fields = text.split("\t")
    if len(fields) != 5:
        raise ValueError(
            f"{source}:{number}: expected 5 tab-separated fields (word, PoS, idx1-idx2, "
            f"sentence1, sentence2), found {len(fields)}"
        )
    word, pos, indices, text1, text2 = fields
    if pos not in ("N", "V"):
        raise ValueError(f"{source}:{number}: PoS is {pos!r}; WiC uses N (noun) or V (verb)")
    idx1, dash, idx2 = indices.partition("-")
    if not (dash and idx1.isascii() and idx1.isdigit() and idx2.isascii() and idx2.isdigit()):
        raise ValueError(
            f"{source}:{number}: indices field is {indices!r}; expected two 0-based word "
            "positions joined by '-', e.g. '2-1'"
        )
    pair = WicPair(word, pos, int(idx1), int(idx2), text1.split(), text2.split(), None, number)
    for which, index, words in ((1, pair.idx1, pair.sentence1), (2, pair.idx2, pair.sentence2)):
        if index >= len(words):
            raise ValueError(
                f"{source}:{number}: idx{which} is {index} but sentence {which} has only "
                f"{len(words)} words (positions 0-{len(words) - 1}); fix the index"
            )
    return pair


def iter_wic(
    data_lines: Iterable[str],
    gold_lines: Iterable[str] | None = None,
    source: str = "<data>",
    gold_source: str = "<gold>",
) -> Iterator[WicPair]:
    """Stream pairs from the lines of a data file and, if given, its gold file."""
    missing = object()
    golds = gold_lines if gold_lines is not None else []
    pairs = zip_longest(data_lines, golds, fillvalue=missing)
    for number, (text, gold) in enumerate(pairs, start=1):
        if gold_lines is not None and (text is missing or gold is missing):
            longer, shorter = (gold_source, source) if text is missing else (source, gold_source)
            raise ValueError(
                f"{longer}:{number}: this line has no partner in {shorter}, which ends after "
                f"{number - 1} lines; pass the gold file that belongs to the data file"
            )
        pair = _parse_row(text.rstrip("\r\n"), number, source)
        if gold_lines is not None:
            gold = gold.strip()
            if gold not in ("T", "F"):
                raise ValueError(f"{gold_source}:{number}: label is {gold!r}; each line must be T or F")
            pair.label = gold == "T"
        yield pair


def read_wic(data_path: str | Path, gold_path: str | Path | None = None) -> list[WicPair]:
    """Read a WiC data file and, if given, its gold file (UTF-8)."""
    data_lines = (text for _, text in iter_utf8_lines(data_path))
    gold_lines = None
    if gold_path is not None:
        gold_lines = (text for _, text in iter_utf8_lines(gold_path))
    pairs = list(iter_wic(data_lines, gold_lines, str(data_path), str(gold_path)))
    logger.info("%s: %d pairs", data_path, len(pairs))
    return pairs
