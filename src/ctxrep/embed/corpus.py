"""Embed a corpus into shards of word or sentence vectors: the library behind `ctxrep embed` (its front door).

    from ctxrep.embed.corpus import EmbedJob, SentenceVectors, embed_corpus
    summary = embed_corpus(EmbedJob("corpus.txt", "out/", vectors=SentenceVectors(), model="minilm"), workers=2)

Output folder (read it back with `ctxrep.load_vectors`):
  manifest.json            what was asked (model, layers, pooling, input) and the finished shards
  shard-00000.safetensors  (or .npy)  `vectors`: (rows, dim) or (rows, n_layers, dim), float32
  index-00000.tsv          one line per row: row, text (0-based record number), line (1-based input line), word, token

Input (`EmbedInput`): one text per line (text), JSON Lines (jsonl: `text_column` names the field), CSV / TSV (csv,
tsv: read by ctxrep.data.table; `text_column` is a header name or a column number counted from 1, -1 the last;
`header` says whether the first row names the columns, needed when the column is a number), CoNLL token columns
(conll), or Parquet (parquet: `text_column` names the column; a record's "line" is its 1-based row); the format is
read from the file name when not given (ctxrep.data.table.detect_format; else text); a gzip-compressed text input is
read as is. What is written (ctxrep.embed.outputs): `WordVectors`, `SentenceVectors` (per text or per chunk, float32
or int8 / uint8 / binary / ubinary codes) or `SparseVectors`.

Into a store instead of a folder: `EmbedJob(input, StoreTable("lancedb:vecs.lancedb/corpus"), ...)` (`ctxrep embed
--store URI`; ctxrep.embed.store_run: the same shards, their rows written to the table in input order, resumable).

Shards: shard k holds the texts k x shard_size .. (k + 1) x shard_size - 1, whatever runs it, so the folder is the
same for one process, `workers=N` CPU processes or one process per GPU (`devices=["cuda:0", "cuda:1"]`). Records
are parsed lazily, a shard at a time: memory stays bounded. A shard is written to temporary names and renamed when
complete, then the manifest (written only by the process that reads the input) lists it; an interrupted run (Ctrl-C,
`kill -9` of the main process or of any worker) resumes when run again with the same settings: the shards the
manifest lists are kept, the others are embedded (again) and renamed over whatever a killed worker left.

The rooms: `ctxrep.embed.records` reads the input, `.outputs` holds the output variants (what a shard's rows are),
`.job` is the job (`EmbedJob`: `EmbedInput`, `ShardFolder`, one output variant, the model), `.shards` embeds and
writes one shard, `.run` keeps the manifest (`EmbedRun`: resume, record, finish), `.workers` runs worker processes;
this module opens them in order and embeds in this process or hands the shards to the workers. Every public name of
those rooms that users meet is importable from here.
"""

from __future__ import annotations

import copy
import gzip
import itertools
import os
from collections.abc import Callable, Iterator

import numpy as np

from ctxrep.embed.codes import RANGED, OutputCodes, output_codes
from ctxrep.embed.job import (
    EmbedInput,
    EmbedJob,
    EmbedSummary,
    ShardFolder,
    StoreTable,
    choose_precision,
    describe_row_shape,
)
from ctxrep.embed.outputs import OutputVectors, SentenceVectors, SparseVectors, WordVectors, vectors_of
from ctxrep.embed.records import (
    DEFAULT_TEXT_COLUMN,
    FORMATS,
    Record,
    open_input,
    parquet_records,
    parquet_rows,
    read_records,
    shards_of,
    to_stderr,
)
from ctxrep.embed.run import EmbedRun, WorkerDied, open_run
from ctxrep.embed.shards import cut_summary, embed_shard, vector_row_shape, with_cut, write_shard
from ctxrep.embed.workers import embed_in_workers, expand_devices, worker_placements
from ctxrep.util.progress import progress


def embed_corpus(
    job: EmbedJob,
    *,
    workers: int = 1,
    devices: list[str] | None = None,
    show_progress: bool = True,
    log: Callable[[str], None] = to_stderr,
) -> EmbedSummary:
    """Embed `job.input` into shards in `job.out` (see the module docstring); resumes an unfinished run.

    workers: CPU processes, each with an equal share of the cores (`job.threads`, or all cores, divided by workers).
    devices: one process per device, e.g. ["cuda:0", "cuda:1"]; overrides `workers`. One worker (the default) runs
    in this process. Every worker embeds whole shards; the folder is the same as one process's.
    """
    placements = worker_placements(job, workers, devices)  # bad options fail before the folder is touched
    job.vectors.check_prompt(job.model)  # an unknown --prompt-name: before any model loads
    job = choose_precision(job, placements[0][0], log)
    run = open_run(job, log, placements[0][0])  # a store run (--store) or the folder's manifest
    if isinstance(run, EmbedSummary):
        return run
    if len(placements) > 1 and run.codes.precision in RANGED and run.codes.ranges is None:
        raise ValueError(
            f"--output-precision {run.codes.precision} with several worker processes needs its ranges before "
            "the first shard: give --calibration FILE (a .npy of sample vectors), or run one process"
        )
    bar, stream, records = open_records(job, show_progress, log, done=run.texts_done)
    run.bar = bar
    try:
        run.say_resuming()
        shards = _first_read(shards_of(records, job.out.shard_size))  # an input error comes first, alone
        if len(placements) == 1:
            _embed_here(run, shards, *placements[0])
        else:
            bar.refresh()  # the first line, before the workers load the model
            embed_in_workers(run, shards, placements)
    except KeyboardInterrupt:
        bar.disable = True
        log(run.kept())  # what Ctrl-C keeps, and that the same command resumes
        raise
    except BaseException:
        bar.disable = True  # the error message is the last word, not a progress line
        if hasattr(run, "abort"):  # a store run: its writer thread stops, what is written stays
            run.abort()
        raise
    finally:
        bar.close()
        if stream is not None:
            stream.close()
    return run.finish()


def _embed_here(run: EmbedRun, shards, device: str | None, threads: int | None) -> None:
    """Embed `shards` in this process (loading the model once), recording each in `run`."""
    job = run.job
    fz = job.featurizer(device, threads)
    row_shape = job.vectors.row_shape(fz)
    run.set_row_shape(row_shape)
    spec = job.vectors.spec(fz)
    run.check(spec)  # a resumed folder's vectors must be these: refused before any shard is embedded
    if run.bar is not None:
        run.bar.refresh()  # the first line: the model is loaded and the options it checks are fine (errors come alone)
    for k, first, records in shards:
        run.seen = k + 1
        if k in run.done:
            continue
        # int8 / uint8 without ranges: shard 0 (the first embedded: a folder with shards has its ranges) calibrates
        shown = _reporting(fz, run.shard_progress(k))  # the shard's batches move the progress line
        if not run.writes_in_workers:  # a store: the rows go to the run, which writes them in order
            rows, index = embed_shard(shown, records, first, job.vectors)
            cut = [first + i for i in getattr(shown, "cut_texts", [])]
            run.write_rows(k, run.codes.encode(rows, k), index, records, first, cut)
            continue
        entry = write_shard(shown, records, k, first, job.vectors, job.out.storage, run.out, codes=run.codes)
        run.record(k, entry, row_shape, spec)


def _first_read(shards: Iterator) -> Iterator:
    """`shards`, the first one read now (before any model loads): a bad row in it is said at once."""
    first = next(shards, None)
    return shards if first is None else itertools.chain([first], shards)


def _reporting(encoder, report):
    """A copy of `encoder` (a Featurizer, or a SparseEncoder over one) whose Featurizer calls `report(tokens done,
    tokens in the call)` after each batch (`Featurizer.progress`)."""
    encoder = copy.copy(encoder)
    if hasattr(encoder, "featurizer"):  # a SparseEncoder: its Featurizer runs the batches
        encoder.featurizer = _reporting(encoder.featurizer, report)
    else:
        encoder.progress = report
    return encoder


def open_records(
    job: EmbedJob,
    show_progress: bool = True,
    log: Callable[[str], None] = to_stderr,
    done: int = 0,
    desc: str = "embed",
):
    """(progress display, the stream to close or None, the lazy records) of the job's input.

    The progress counts texts embedded (`done`: those an earlier run embedded); whoever embeds them updates it
    (`EmbedRun.record`, and `EmbedRun.shard_progress` within a shard), and says how many texts were read. Its total
    never changes once shown: a Parquet file's rows or a plain text file's non-empty lines, counted first; unknown
    for the other formats, standard input and gzip (their records can span lines) until the input is read.
    `embed_corpus` shows the first line once the first shard is read and the model loaded (an error in either is the
    one line said)."""
    bar = progress(unit="texts", desc=desc, enabled=show_progress, initial=done)
    source = job.input
    parquet = False
    if source.path != "-":
        with open(source.path, "rb") as f:
            parquet = f.read(4) == b"PAR1"
    if source.format == "parquet":
        bar.total = parquet_rows(source.path)
        if not parquet:
            raise ValueError(f"{source.source}: not a Parquet file (no PAR1 magic); check --format")
        records = parquet_records(source.path, source.source, source.text_column, source.skip_empty)
        return bar, None, _TextTotal(bar).counted(records)
    if parquet:  # detect_format knows no .parquet (data.table reads none): say so instead of reading bytes as lines
        raise ValueError(f"{source.source}: a Parquet file (PAR1 magic), not {source.format}; pass --format parquet")
    stream = open_input(source.path)
    if source.format == "text" and source.path != "-" and not isinstance(stream, gzip.GzipFile):
        bar.total = _count_texts(source.path)  # one text a non-empty line: counted first, the total stays
    records = read_records(
        stream, source.source, source.format, source.text_column, source.skip_empty, log, source.header
    )
    return bar, (stream if source.path != "-" else None), _TextTotal(bar).counted(records)


def _count_texts(path: str) -> int:
    """The non-empty lines of a plain text file (its texts; an empty line is skipped or refused, never a text)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


class _TextTotal:
    """Counts the texts read (`read`, shown beside the progress); a total that was unknown is set when the input
    ends, never estimated."""

    def __init__(self, bar) -> None:
        self.bar, self.read = bar, 0
        bar.texts_read = self  # EmbedRun's progress line reads it

    def counted(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            self.read += 1
            yield record
        if self.bar.total is None:
            self.bar.total = self.read


# ---- reading back (tests and small scripts; ctxrep.load_vectors maps the shards instead) --------------------------


def load_shards(out_dir: str | os.PathLike) -> tuple[np.ndarray, list[dict]]:
    """All vectors and index rows (as dicts) of an `ctxrep embed` output folder, in memory, through
    `ctxrep.load_vectors` (the reader for users: it maps the shards instead); for tests and small outputs."""
    from ctxrep.vectors.store import load_vectors

    vectors = load_vectors(out_dir)
    index = vectors.index()
    rows = [
        {"text": int(t), "line": int(line), "word": int(w), "token": token}
        for t, line, w, token in zip(index.text, index.line, index.word, index.token)
    ]
    return vectors.array, rows


__all__ = [
    "DEFAULT_TEXT_COLUMN",
    "FORMATS",
    "EmbedInput",
    "EmbedJob",
    "OutputCodes",
    "EmbedRun",
    "EmbedSummary",
    "OutputVectors",
    "Record",
    "SentenceVectors",
    "ShardFolder",
    "StoreTable",
    "SparseVectors",
    "WordVectors",
    "WorkerDied",
    "choose_precision",
    "cut_summary",
    "describe_row_shape",
    "embed_corpus",
    "embed_shard",
    "expand_devices",
    "load_shards",
    "open_input",
    "open_records",
    "open_run",
    "output_codes",
    "read_records",
    "shards_of",
    "to_stderr",
    "vector_row_shape",
    "vectors_of",
    "with_cut",
    "write_shard",
]
