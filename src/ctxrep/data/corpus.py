"""Plain-text corpora for pretraining: read, split into documents and sentences, tokenize, pack to disk.

Reading (`iter_documents`):
- the input is one .txt file or a directory (searched recursively) of .txt files, read in sorted order;
- a UTF-8 BOM is dropped and CRLF / CR line endings become LF;
- a file holding a NUL byte or bytes that are not UTF-8 is refused, naming the byte offset and line;
- a Project Gutenberg header and footer are removed when present: only the text between the line
  starting ``*** START OF THE/THIS PROJECT GUTENBERG EBOOK`` and the line starting
  ``*** END OF THE/THIS PROJECT GUTENBERG EBOOK`` is kept (either marker alone cuts its own side);
- documents are whole files (``document_boundary="file"``, e.g. books) or blocks of text separated by
  blank lines (``"blank_line"``, one document per paragraph-like block).

Sentence splitting (`split_sentences`) is rule based:
1. a blank line always ends a sentence (paragraphs never share a sentence); inside a paragraph the
   hard line wraps are joined with spaces;
2. a sentence ends after ``.``, ``?`` or ``!`` (a run of them, and any closing quotes or brackets
   right after) when whitespace follows and the next word starts with an upper-case letter or a digit,
   possibly behind opening quotes, brackets or ``_``;
3. except after a ``.`` that ends a known abbreviation (Mr. Mrs. Dr. St. ...) or a single-letter
   initial ("J. Smith").

Packing (`pack_corpus`): sentences are tokenized in worker processes (each loads tokenizer.json itself)
and written to ``out_dir``:

- ``tokens.bin``: every token id, documents and sentences back to back, np.uint16 when the vocabulary
  has fewer than 65,536 entries, else np.int32 (memory-mapped on open);
- ``sentence_offsets.npy`` (int64, n_sentences + 1): token offset where each sentence starts;
- ``document_offsets.npy`` (int64, n_documents + 1): sentence index where each document starts;
- ``tokenizer.json``: a copy of the tokenizer used;
- ``manifest.json``: tokenizer hash, source files with size and mtime, reading options, counts. It is
  written last; a second run with the same sources, tokenizer and options reuses the packed files.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from ctxrep.util.progress import progress as show_progress

FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
SENTENCES_FILE = "sentence_offsets.npy"
DOCUMENTS_FILE = "document_offsets.npy"
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"


class CorpusError(ValueError):
    """Corpus input that cannot be used, or a packed corpus that is missing or damaged."""


@dataclass
class CorpusConfig:
    """How text files are read and packed.

    document_boundary: "file" (one document per file) or "blank_line" (blocks separated by blank lines).
    strip_gutenberg: remove a Project Gutenberg header and footer when the markers are present.
    num_workers: tokenizer processes; None = one per CPU; 0 or 1 = tokenize in this process.
    chunk_chars: about how many characters each worker task holds.
    """

    document_boundary: Literal["file", "blank_line"] = "file"
    strip_gutenberg: bool = True
    num_workers: int | None = None
    chunk_chars: int = 1 << 16

    def reading_options(self) -> dict:
        """The options that change the packed result (the manifest compares these)."""
        return {"document_boundary": self.document_boundary, "strip_gutenberg": self.strip_gutenberg}


@dataclass
class Document:
    """One document's text (LF line endings, Gutenberg header and footer removed) and where it came from."""

    file: Path
    index: int  # position of the document in its file
    text: str


# ---------------------------------------------------------------------------------------------- reading


def list_text_files(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The .txt files of `source`: a file, a directory (recursive, sorted), or a list of either."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not sources:
        raise CorpusError("no corpus files given: pass a .txt file or a directory of .txt files")
    files: list[Path] = []
    for item in sources:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file())
            if not found:
                raise CorpusError(f"{path}: directory holds no .txt files; put the corpus text in .txt files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise CorpusError(f"{path}: no such file or directory")
    return files


def read_text(file: str | Path) -> str:
    """The text of a UTF-8 file with the BOM dropped and line endings made LF; binary files are refused."""
    file = Path(file)
    data = file.read_bytes()
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise CorpusError(
            f"{file}: NUL byte at byte offset {nul} (line {line}): this looks like a "
            "binary file, not plain text; remove it from the corpus or convert it to UTF-8 text"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise CorpusError(
            f"{file}: invalid UTF-8 at byte offset {e.start} (line {line}): "
            f"{e.reason}; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove it"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


_GUTENBERG_START = re.compile(r"^[ \t]*\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^[ \t]*\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK.*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """The text between the START and END marker lines; text without markers comes back unchanged."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")


def iter_documents(files: Sequence[Path], config: CorpusConfig) -> Iterator[Document]:
    """Every non-blank document of `files`, in order (see the module docstring for the rules)."""
    if config.document_boundary not in ("file", "blank_line"):
        raise CorpusError(f"document_boundary={config.document_boundary!r} is not known: use 'file' or 'blank_line'")
    for file in files:
        text = read_text(file)
        if config.strip_gutenberg:
            text = strip_gutenberg(text)
        blocks = [text] if config.document_boundary == "file" else _BLANK_LINES.split(text)
        index = 0
        for block in blocks:
            block = block.strip()
            if block:
                yield Document(Path(file), index, block)
                index += 1


# ---------------------------------------------------------------------------------- sentence splitting

ABBREVIATIONS = frozenset(
    "mr mrs ms messrs dr prof rev hon st sr jr mt ft capt col gen lt sgt maj gov pres vs etc cf viz "
    "e.g i.e no nos vol vols ch chap fig p pp ed eds co inc ltd bros dept est approx".split()
)
_SENTENCE_END = re.compile(r"(?P<word>[^\s.?!]*)(?P<end>[.?!]+[\"'\u201d\u2019)\]]*)\s+")
_OPENERS = "\"'\u201c\u2018([_"


def split_sentences(text: str) -> list[str]:
    """Split text into sentences by the rules in the module docstring; whitespace inside is normalised."""
    sentences = []
    for paragraph in _BLANK_LINES.split(text):
        paragraph = " ".join(paragraph.split())
        start = 0
        for m in _SENTENCE_END.finditer(paragraph):
            nxt = paragraph[m.end() :].lstrip(_OPENERS)[:1]
            if not (nxt.isupper() or nxt.isdigit()):
                continue
            word = m.group("word").lower()
            if m.group("end").startswith(".") and len(m.group("end")) == 1:
                if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                    continue
                if word.rstrip(".") in ABBREVIATIONS:  # "e.g." matched as word "e.g"
                    continue
            sentences.append(paragraph[start : m.end()].rstrip())
            start = m.end()
        if start < len(paragraph):
            sentences.append(paragraph[start:])
    return [s for s in sentences if s]


# ---------------------------------------------------------------------------------------- packed corpus


class PackedCorpus:
    """A packed corpus on disk: token ids memory-mapped, sentence and document boundaries in memory.

    Sentence i is ``tokens[sentence_offsets[i]:sentence_offsets[i + 1]]``; document d is made of the
    sentences ``document_offsets[d]`` to ``document_offsets[d + 1]`` (exclusive), whose tokens are
    contiguous in `tokens`.
    """

    def __init__(
        self,
        path: Path,
        tokens: np.ndarray,
        sentence_offsets: np.ndarray,
        document_offsets: np.ndarray,
        manifest: dict,
    ) -> None:
        self.path = path
        self.tokens = tokens
        self.sentence_offsets = sentence_offsets
        self.document_offsets = document_offsets
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path) -> PackedCorpus:
        """Open a directory written by `pack_corpus` (cheap: the token array is memory-mapped)."""
        path = Path(path)
        manifest_file = path / MANIFEST_FILE
        if not manifest_file.is_file():
            raise CorpusError(
                f"{path}: no {MANIFEST_FILE}; this is not a packed corpus (or packing did not finish): "
                "run pack_corpus on the text first"
            )
        manifest = json.loads(manifest_file.read_text())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CorpusError(
                f"{manifest_file}: format version {manifest.get('format_version')} is not {FORMAT_VERSION}; "
                "pack the corpus again with this version of ctxrep"
            )
        counts = manifest["counts"]
        try:
            sentences = np.load(path / SENTENCES_FILE)
            documents = np.load(path / DOCUMENTS_FILE)
            dtype = np.dtype(manifest["dtype"])
            size = (path / TOKENS_FILE).stat().st_size
        except OSError as e:
            raise CorpusError(f"{path}: packed corpus file missing or unreadable ({e}); pack the corpus again") from e
        if (
            size != counts["tokens"] * dtype.itemsize
            or len(sentences) != counts["sentences"] + 1
            or len(documents) != counts["documents"] + 1
        ):
            raise CorpusError(
                f"{path}: packed files do not match {MANIFEST_FILE} (interrupted write?); "
                "delete the directory and pack the corpus again"
            )
        tokens = np.memmap(path / TOKENS_FILE, dtype=dtype, mode="r", shape=(counts["tokens"],))
        return cls(path, tokens, sentences, documents, manifest)

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return self.num_documents

    def sentence(self, i: int) -> np.ndarray:
        """Token ids of sentence i (a view into the memory map)."""
        return self.tokens[self.sentence_offsets[i] : self.sentence_offsets[i + 1]]

    def document_sentence_range(self, d: int) -> range:
        """Indices of document d's sentences."""
        return range(int(self.document_offsets[d]), int(self.document_offsets[d + 1]))

    def document(self, d: int) -> np.ndarray:
        """Token ids of document d, all its sentences back to back."""
        s = self.document_offsets
        return self.tokens[self.sentence_offsets[s[d]] : self.sentence_offsets[s[d + 1]]]

    def document_sentences(self, d: int) -> list[np.ndarray]:
        return [self.sentence(i) for i in self.document_sentence_range(d)]

    def sentence_lengths(self) -> np.ndarray:
        return np.diff(self.sentence_offsets)

    def load_tokenizer(self):
        """The tokenizer the corpus was packed with (a `ctxrep.text.tokenizer.Tokenizer`)."""
        from ctxrep.text.tokenizer import Tokenizer

        return Tokenizer.from_model_dir(self.path)


# -------------------------------------------------------------------------------------------- packing


def pack_corpus(
    source: str | Path | Sequence[str | Path],
    tokenizer: str | Path,
    out_dir: str | Path,
    config: CorpusConfig | None = None,
    progress: bool = True,
) -> PackedCorpus:
    """Tokenize the text files of `source` and pack them into `out_dir`; reuse `out_dir` when up to date.

    `tokenizer` is a tokenizer.json file or a folder holding one (see `ctxrep.data.tokenizer_training`).
    """
    from ctxrep.text.tokenizer import Tokenizer, TokenizerError

    config = config or CorpusConfig()
    files = list_text_files(source)
    tokenizer_file = _tokenizer_file(tokenizer)
    out = Path(out_dir)
    key = {
        "format_version": FORMAT_VERSION,
        "tokenizer_sha256": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest(),
        "sources": [_source_entry(f) for f in files],
        "reading": config.reading_options(),
    }
    if _is_up_to_date(out, key):
        return PackedCorpus.open(out)

    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # from here on the directory is incomplete
    if tokenizer_file.resolve() != (out / TOKENIZER_FILE).resolve():
        shutil.copyfile(tokenizer_file, out / TOKENIZER_FILE)
    try:
        vocab_size = Tokenizer.from_model_dir(out).vocab_size
    except TokenizerError as e:
        raise CorpusError(f"{tokenizer_file}: cannot load the tokenizer ({e})") from e
    dtype = np.dtype(np.uint16 if vocab_size < 2**16 else np.int32)

    total_bytes = sum(entry["size"] for entry in key["sources"])
    sentence_lengths: list[np.ndarray] = []
    document_starts: list[int] = []
    num_sentences = 0
    num_tokens = 0
    bytes_done = 0
    with (
        open(out / TOKENS_FILE, "wb") as sink,
        show_progress(unit="sentences", desc="tokenize", enabled=progress) as bar,
    ):
        for task, (tokens, piece_counts, lengths) in _run_tasks(_tasks(files, config), out, config.num_workers):
            for (new_document, _), count in zip(task.pieces, piece_counts):
                if new_document:
                    document_starts.append(num_sentences)
                num_sentences += count
            sentence_lengths.append(lengths)
            sink.write(tokens.astype(dtype, copy=False).tobytes())
            num_tokens += len(tokens)
            # the progress counts sentences; the bytes read so far only estimate how many the corpus holds
            bytes_done += task.progress_bytes
            if bytes_done:
                bar.total = max(num_sentences, round(num_sentences * total_bytes / bytes_done))
            bar.update(sum(piece_counts))
        bar.total = num_sentences

    if num_tokens == 0:
        raise CorpusError(
            f"{source}: the corpus is empty: {len(files)} file(s) hold no text"
            + (" after removing Project Gutenberg headers and footers" if config.strip_gutenberg else "")
            + "; check the path and the files' contents"
        )
    documents = _write_offsets(out, sentence_lengths, document_starts, num_sentences)
    counts = {"documents": documents, "sentences": num_sentences, "tokens": num_tokens}
    _write_manifest(out, {**key, "dtype": dtype.name, "vocab_size": vocab_size, "counts": counts})
    return PackedCorpus.open(out)


def _tokenizer_file(tokenizer: str | Path) -> Path:
    """The tokenizer.json named by `tokenizer` (the file, or a folder holding it); it must exist."""
    tokenizer_file = Path(tokenizer)
    if tokenizer_file.is_dir():
        tokenizer_file = tokenizer_file / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise CorpusError(
            f"{tokenizer_file}: no such tokenizer file; train one with "
            "ctxrep.data.tokenizer_training.train_tokenizer or pass a folder holding tokenizer.json"
        )
    return tokenizer_file


def _write_offsets(
    out: Path, sentence_lengths: list[np.ndarray], document_starts: list[int], num_sentences: int
) -> int:
    """Save the sentence and document offsets into `out`; returns the number of documents kept."""
    lengths_all = np.concatenate(sentence_lengths) if sentence_lengths else np.zeros(0, np.int64)
    sentence_offsets = np.zeros(num_sentences + 1, np.int64)
    np.cumsum(lengths_all, out=sentence_offsets[1:])
    starts = np.array(document_starts, np.int64)
    # A document whose text gave no sentence has the same start as the next one: drop it.
    document_offsets = np.append(np.unique(starts[starts < num_sentences]), num_sentences).astype(np.int64)
    np.save(out / SENTENCES_FILE, sentence_offsets)
    np.save(out / DOCUMENTS_FILE, document_offsets)
    return len(document_offsets) - 1


def _write_manifest(out: Path, manifest: dict) -> None:
    """Write the manifest last, atomically: its presence marks the folder complete."""
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(out / MANIFEST_FILE)


def _source_entry(file: Path) -> dict:
    st = file.stat()
    return {"path": str(file.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _is_up_to_date(out: Path, key: dict) -> bool:
    manifest_file = out / MANIFEST_FILE
    if not manifest_file.is_file():
        return False
    try:
        manifest = json.loads(manifest_file.read_text())
    except ValueError:
        return False
    if any(manifest.get(k) != v for k, v in key.items()):
        return False
    try:
        PackedCorpus.open(out)
    except CorpusError:
        return False
    return True


@dataclass
class _Task:
    """Text for one worker call: pieces of (starts a new document, text), and its share of the file bytes."""

    pieces: list[tuple[bool, str]]
    progress_bytes: int


def _tasks(files: list[Path], config: CorpusConfig) -> Iterator[_Task]:
    """Cut the documents into tasks of about `chunk_chars` characters, never splitting a paragraph.

    Each task carries its share of the files' bytes for the progress bar: its characters (never more
    than their bytes), plus, at a file's end, the bytes of that file not yet charged (headers, CRs, ...).
    """
    pieces: list[tuple[bool, str]] = []
    chars = task_bytes = 0
    for file in files:
        size, charged = file.stat().st_size, 0
        for doc in iter_documents([file], config):
            paragraphs = [doc.text] if len(doc.text) <= config.chunk_chars else _BLANK_LINES.split(doc.text)
            new_document = True
            for paragraph in paragraphs:
                pieces.append((new_document, paragraph))
                new_document = False
                chars += len(paragraph)
                charged += len(paragraph)
                task_bytes += len(paragraph)
                if chars >= config.chunk_chars:
                    yield _Task(pieces, task_bytes)
                    pieces, chars, task_bytes = [], 0, 0
        task_bytes += max(size - charged, 0)
    if pieces or task_bytes:
        yield _Task(pieces, task_bytes)


_WORKER_TOKENIZER = None


def _init_worker(tokenizer_dir: str) -> None:
    global _WORKER_TOKENIZER
    from ctxrep.text.tokenizer import Tokenizer

    _WORKER_TOKENIZER = Tokenizer.from_model_dir(tokenizer_dir)


def _tokenize_task(task: _Task) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(all token ids, number of sentences per piece, length of each sentence); empty sentences dropped."""
    backend = _WORKER_TOKENIZER.backend
    sentences: list[str] = []
    counts: list[int] = []
    for _, text in task.pieces:
        split = split_sentences(text)
        sentences += split
        counts.append(len(split))
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: no offsets (tokenizers >= 0.20)
    encodings = encode(sentences, add_special_tokens=False) if sentences else []
    ids = [enc.ids for enc in encodings]
    lengths = np.array([len(x) for x in ids], np.int64)
    # Drop sentences that tokenized to nothing, and fix the per-piece counts.
    keep = lengths > 0
    if not keep.all():
        bounds = np.cumsum([0] + counts)
        counts = [int(keep[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]
        lengths = lengths[keep]
    flat = np.fromiter((t for x in ids for t in x), np.int64, count=int(lengths.sum()))
    return flat, counts, lengths


def _run_tasks(tasks: Iterator[_Task], tokenizer_dir: Path, num_workers: int | None):
    """Yield (task, result) in task order, from a pool of `num_workers` processes (or in this process)."""
    workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    if workers <= 1:
        _init_worker(str(tokenizer_dir))
        for task in tasks:
            yield task, _tokenize_task(task)
        return
    # fork starts workers in milliseconds; spawn would re-import torch in each one (ctxrep/__init__ imports it).
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_dir),)) as pool:
        pending: deque = deque()
        for task in tasks:  # at most 2 tasks per worker in flight: memory stays bounded
            pending.append((task, pool.apply_async(_tokenize_task, (task,))))
            if len(pending) >= 2 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()
