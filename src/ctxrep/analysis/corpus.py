"""The word lists of a corpus file, as the analysis tools (attention statistics, the occurrence index) read them:
CoNLL-U, CoNLL columns, or plain text with one whitespace-tokenized sentence per line."""

from __future__ import annotations

import os
from pathlib import Path


def read_sentences(path: str | os.PathLike, max_sentences: int | None = None) -> list[list[str]]:
    """The word lists of a corpus: CoNLL-U (.conllu), CoNLL columns (.conll, eng.train, ...) or plain text
    (one whitespace-tokenized sentence per line, blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such corpus file")
    if path.suffix == ".conllu":
        from ctxrep.data.conllu import read_conllu

        sentences = [s.words for s in read_conllu(path)]
    elif path.suffix in (".conll", ".train", ".testa", ".testb", ".bio", ".iob"):
        from ctxrep.data.conll import read_conll

        sentences = [s.words for s in read_conll(path)]
    else:
        from ctxrep.data.conll import iter_utf8_lines

        sentences = [line.split() for _, line in iter_utf8_lines(path) if line.strip()]
    if max_sentences is not None:
        sentences = sentences[:max_sentences]
    if not sentences:
        raise ValueError(f"{path}: the corpus is empty (no sentences)")
    return sentences
