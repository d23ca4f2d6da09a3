"""Graded sentence similarity: the STS benchmark, GLUE's STS-B and SICK (relatedness), as scored sentence pairs.

    pairs = read_sts("stsbenchmark/sts-train.csv")    # any of the three layouts below, told apart by the first line
    X, y = [(p.text_a, p.text_b) for p in pairs], [p.score for p in pairs]

Layouts (tab-separated; a quote character is ordinary text in all three, so no CSV quoting is applied):
  STS benchmark   sts-{train,dev,test}.csv (Cer et al. 2017), no header:
                  genre <tab> file <tab> year <tab> id <tab> score <tab> sentence1 <tab> sentence2 [<tab> source1
                  <tab> source2]; score 0-5 (the headlines-2016 rows add the two source fields)
  GLUE STS-B      {train,dev}.tsv: a header naming index, genre, ..., sentence1, sentence2, score
  SICK            SICK_{train,trial,test_annotated}.txt (Marelli et al. 2014): a header pair_ID, sentence_A,
                  sentence_B, relatedness_score, entailment_judgment; relatedness 1-5 (SICK-R), the entailment
                  label kept in `label` (SICK-E)
Sentences are stripped of surrounding spaces (as GLUE does). A score that is not a number, or a row with too few
fields, names the file and line.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from ctxrep.data.conll import iter_utf8_lines
from ctxrep.data.table import numeric_score

logger = logging.getLogger(__name__)

LAYOUTS = ("sts-benchmark", "glue-stsb", "sick")


@dataclass
class ScoredPair:
    text_a: str
    text_b: str
    score: float
    line: int  # 1-based line in the file
    label: str | None = None  # SICK's entailment judgment; None elsewhere
    genre: str | None = None  # the STS benchmark's genre (main-news, main-captions, main-forum(s))


def detect_layout(first_line: str) -> str:
    """Which of LAYOUTS a file is, from its first line."""
    fields = first_line.split("\t")
    if fields[:3] == ["pair_ID", "sentence_A", "sentence_B"]:
        return "sick"
    if "sentence1" in fields and "sentence2" in fields:
        return "glue-stsb"
    return "sts-benchmark"


def sniff_layout(first_line: str) -> str | None:
    """Which of LAYOUTS a file's first line shows for sure (a SICK or GLUE STS-B header, or an STS benchmark row of
    7 or 9 tab-separated fields with a numeric score), or None (e.g. a file of two texts per line)."""
    fields = first_line.rstrip("\r\n").split("\t")
    layout = detect_layout(first_line.rstrip("\r\n"))
    if layout != "sts-benchmark":
        return layout
    return layout if len(fields) in (7, 9) and math.isfinite(numeric_score(fields[4])) else None


def _score(value: str, source: str, line: int, column: str, scored: bool = True) -> float:
    if not scored:
        return math.nan
    score = numeric_score(value)
    if not math.isfinite(score):
        raise ValueError(
            f"{source}:{line}: the {column} field is {value!r}, not a number; every pair needs a numeric score"
        )
    return score


def text_of(value: str, source: str, line: int, which: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"{source}:{line}: {which} is empty; every pair needs two sentences")
    return text


def read_sts(path: str | Path, layout: str | None = None, scored: bool = True) -> list[ScoredPair]:
    """Scored pairs from an STS benchmark, GLUE STS-B or SICK file (`layout` one of LAYOUTS; None: from the first
    line). A GLUE STS-B test file (no score column) is refused: there is nothing to train or score on.
    `scored=False` reads the pairs alone (score NaN), as `ctxrep predict` does: a score column may be absent."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    lines = iter_utf8_lines(path)
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{path}: the file is empty; expected sentence pairs with similarity scores")
    layout = layout or detect_layout(first[1])
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    source = str(path)
    pairs: list[ScoredPair] = []
    if layout == "sts-benchmark":
        for number, text in [first, *lines]:
            if not text.strip():
                continue
            fields = text.split("\t")
            if len(fields) < 7:
                raise ValueError(
                    f"{source}:{number}: {len(fields)} tab-separated field(s); an STS benchmark row has 7 (genre, "
                    "file, year, id, score, sentence1, sentence2), or 9 with two source notes"
                )
            pairs.append(
                ScoredPair(
                    text_of(fields[5], source, number, "sentence1"),
                    text_of(fields[6], source, number, "sentence2"),
                    _score(fields[4], source, number, "score", scored),
                    number,
                    genre=fields[0],
                )
            )
    else:
        header = first[1].split("\t")
        names = (
            ("sentence_A", "sentence_B", "relatedness_score", "entailment_judgment")
            if layout == "sick"
            else ("sentence1", "sentence2", "score", None)
        )
        missing = [n for n in names[: 3 if scored else 2] if n not in header]
        if missing:
            hint = "; a GLUE test file has no scores to train or evaluate on" if missing == ["score"] else ""
            raise ValueError(
                f"{source}:1: the header has no column {', '.join(map(repr, missing))} (columns: "
                f"{', '.join(header)}){hint}"
            )
        a, b = header.index(names[0]), header.index(names[1])
        s = header.index(names[2]) if scored else None
        label = header.index(names[3]) if names[3] is not None and names[3] in header else None
        for number, text in lines:
            if not text.strip():
                continue
            fields = text.split("\t")
            if len(fields) != len(header):
                raise ValueError(
                    f"{source}:{number}: {len(fields)} tab-separated field(s) but the header has {len(header)}; fix "
                    "the row (a tab or line break inside a sentence?)"
                )
            pairs.append(
                ScoredPair(
                    text_of(fields[a], source, number, names[0]),
                    text_of(fields[b], source, number, names[1]),
                    _score(fields[s], source, number, names[2]) if s is not None else math.nan,
                    number,
                    label=fields[label] if label is not None else None,
                )
            )
    if not pairs:
        raise ValueError(f"{path}: no sentence pairs in the file")
    logger.info("%s: %d scored pairs (%s)", path, len(pairs), layout)
    return pairs


def read_sick(path: str | Path) -> list[ScoredPair]:
    """SICK's pairs with their relatedness (score, 1-5) and entailment judgment (label)."""
    return read_sts(path, layout="sick")


__all__ = ["LAYOUTS", "ScoredPair", "detect_layout", "read_sick", "read_sts", "sniff_layout"]
