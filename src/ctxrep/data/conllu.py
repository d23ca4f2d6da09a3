"""CoNLL-U (Universal Dependencies): 10 tab-separated columns per word, sentences end with a blank line.

    # sent_id = s1
    # text = Don't go.
    1-2   Don't  _     _     _    _  _  _      _  _
    1     Do     do    AUX   VBP  _  3  aux    _  _
    2     n't    not   PART  RB   _  3  advmod _  _
    3     go     go    VERB  VB   _  0  root   _  _

Columns: ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC. Only word lines (integer ID) make
up a sentence's word list: multiword-token ranges ("1-2") and empty nodes ("8.1") are skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ctxrep.data.conll import iter_utf8_lines

logger = logging.getLogger(__name__)

_RANGE_OR_EMPTY = re.compile(r"\d+-\d+|\d+\.\d+")


@dataclass
class ConlluSentence:
    words: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)
    xpos: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)  # 1-based index of each word's head, 0 = root
    deprels: list[str] = field(default_factory=list)
    sent_id: str | None = None
    text: str | None = None
    line: int = 0  # 1-based line number of the sentence's first line (comment or word)


def iter_conllu(lines: Iterable[str], source: str = "<input>") -> Iterator[ConlluSentence]:
    """Stream sentences from the lines of a CoNLL-U file; errors name `source` and the line."""
    sentence = ConlluSentence()
    word_lines: list[int] = []  # line number of each word, to point at a bad HEAD
    for number, text in enumerate(lines, start=1):
        text = text.rstrip("\r\n")
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not text.strip():
            if sentence.line:
                yield _finish(sentence, word_lines, source)
                sentence, word_lines = ConlluSentence(), []
            continue
        if not sentence.line:
            sentence.line = number
        if text.startswith("#"):
            if sentence.words:
                raise ValueError(
                    f"{source}:{number}: comment line inside a sentence; comments go before the "
                    "sentence's first word line (is a blank line missing before it?)"
                )
            key, equals, value = text[1:].partition("=")
            if equals and key.strip() == "sent_id":
                sentence.sent_id = value.strip()
            elif equals and key.strip() == "text":
                sentence.text = value.strip()
            continue
        fields = text.split("\t")
        if len(fields) != 10:
            raise ValueError(
                f"{source}:{number}: expected 10 tab-separated columns, found {len(fields)}; "
                "CoNLL-U columns are ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC "
                "(spaces do not separate columns)"
            )
        id_, form, _, upos, xpos, _, head, deprel, _, _ = fields
        if _RANGE_OR_EMPTY.fullmatch(id_):
            continue
        expected = len(sentence.words) + 1
        if id_ != str(expected):
            raise ValueError(
                f"{source}:{number}: word ID is {id_!r} but {expected} was expected; word IDs "
                "count 1, 2, 3, ... within a sentence (is a blank line missing before it?)"
            )
        if not (head.isascii() and head.isdigit()):
            raise ValueError(
                f"{source}:{number}: HEAD (column 7) is {head!r}; it must be the ID of the "
                "word's head, or 0 for the root"
            )
        sentence.words.append(form)
        sentence.upos.append(upos)
        sentence.xpos.append(xpos)
        sentence.heads.append(int(head))
        sentence.deprels.append(deprel)
        word_lines.append(number)
    if sentence.line:
        yield _finish(sentence, word_lines, source)


def _finish(sentence: ConlluSentence, word_lines: list[int], source: str) -> ConlluSentence:
    if not sentence.words:
        raise ValueError(
            f"{source}:{sentence.line}: sentence has comment lines but no word lines; "
            "remove the stray comments or add the sentence's words"
        )
    for head, number in zip(sentence.heads, word_lines):
        if head > len(sentence.words):
            raise ValueError(
                f"{source}:{number}: HEAD is {head} but the sentence has only "
                f"{len(sentence.words)} words; point HEAD at a word of the same sentence"
            )
    return sentence


def read_conllu(path: str | Path) -> list[ConlluSentence]:
    """Read a whole CoNLL-U file (UTF-8) into memory."""
    sentences = list(iter_conllu((text for _, text in iter_utf8_lines(path)), str(path)))
    logger.info("%s: %d sentences, %d words", path, len(sentences), sum(len(s.words) for s in sentences))
    return sentences
