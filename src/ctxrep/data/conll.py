"""CoNLL-2003 style column files: one token per line, sentences separated by blank lines.

    EU NNP I-NP I-ORG
    rejects VBZ I-VP O

    -DOCSTART- -X- O O

Columns are separated by single spaces, or by tabs when a line contains a tab. ``-DOCSTART-`` lines
are document markers, not sentences: they are skipped wherever they appear (some copies put them at
the start of each document, some at the end) and always end the sentence before them.

`iter_utf8_lines` is the line source the other readers in `ctxrep.data` share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ctxrep.util.files import utf8_lines

logger = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"


@dataclass
class ConllSentence:
    """One sentence: the tokens, the remaining columns of each token line, and where it starts."""

    words: list[str]
    columns: list[list[str]]  # per word, every column except the token column, in file order
    line: int  # 1-based line number of the sentence's first token line

    @property
    def tags(self) -> list[str]:
        """The last column of each word: the NER tag in CoNLL-2003."""
        if self.columns and not self.columns[0]:
            raise ValueError(
                f"the sentence at line {self.line} has only a token column, so it has no tags; "
                "read a file with a tag column to use .tags"
            )
        return [cols[-1] for cols in self.columns]


def iter_utf8_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line ending) of each line of a UTF-8 file: ctxrep.util.files.utf8_lines
    (a BOM dropped; invalid bytes a ValueError naming the file, line and column)."""
    return utf8_lines(path)


def _split_row(text: str) -> list[str]:
    text = text.rstrip()
    return text.split("\t") if "\t" in text else text.split(" ")


def iter_conll(lines: Iterable[str], source: str = "<input>", token_column: int = 0) -> Iterator[ConllSentence]:
    """Stream sentences from the lines of a CoNLL column file.

    `source` names the input in error messages; `token_column` is the 0-based column holding the
    token (all other columns end up in `ConllSentence.columns`). Lines may keep their "\\n" or
    "\\r\\n". A malformed row raises ValueError("<source>:<line>: ...").
    """
    words: list[str] = []
    columns: list[list[str]] = []
    first_line = 0
    n_columns = 0
    for number, text in enumerate(lines, start=1):
        text = text.rstrip("\r\n")
        if number == 1:
            text = text.removeprefix("\ufeff")
        fields = _split_row(text)
        if fields == [""] or fields[0] == DOCSTART:
            if words:
                yield ConllSentence(words, columns, first_line)
                words, columns = [], []
            continue
        if not words:
            first_line, n_columns = number, len(fields)
            if token_column >= n_columns:
                raise ValueError(
                    f"{source}:{number}: the row has {n_columns} column(s) but token_column is "
                    f"{token_column} (0-based); pass the index of the column that holds the token"
                )
        elif len(fields) != n_columns:
            raise ValueError(
                f"{source}:{number}: found {len(fields)} column(s) but the sentence's first row "
                f"(line {first_line}) has {n_columns}; every row of a sentence needs the same "
                "columns, separated by single spaces or by tabs (a missing blank line between "
                "sentences also causes this)"
            )
        for index, field in enumerate(fields):
            if not field:
                what = "the token" if index == token_column else f"column {index + 1}"
                raise ValueError(
                    f"{source}:{number}: {what} is empty (a leading or doubled separator?); "
                    "separate columns with exactly one space or one tab"
                )
        words.append(fields[token_column])
        columns.append(fields[:token_column] + fields[token_column + 1 :])
    if words:
        yield ConllSentence(words, columns, first_line)


def read_conll(path: str | Path, token_column: int = 0) -> list[ConllSentence]:
    """Read a whole CoNLL column file (UTF-8) into memory."""
    sentences = list(iter_conll((text for _, text in iter_utf8_lines(path)), str(path), token_column))
    logger.info("%s: %d sentences, %d tokens", path, len(sentences), sum(len(s.words) for s in sentences))
    return sentences
