"""The sink of an embedding job whose vectors go to a store (`ctxrep embed --store URI`) instead of a shard folder:
`StoreTable` (ctxrep.embed.job) says where, `StoreRun` writes the rows and keeps the resume point in the table's record.

Every engine (this process, `--workers` / `--devices` processes, Ray actors) embeds the shards it embeds for a
folder; their rows come back to the process that reads the input, which alone writes to the store, shards in input
order: `StoreRun.write_rows` holds a shard that arrives early until those before it are in, gathers shards up to
`commit_rows` rows and hands them to a writer thread (the store's bulk path runs while the next shards embed). After
each write the table's record says how far this input is written (shards, texts, the next input line); a rerun of
the same command after a kill at any moment deletes what a write left past that point (`Store.discard`) and
embeds from there, so each text has its rows exactly once. Row ids derive from the input (file, line, field, word or
chunk number), so a store that writes by id (Qdrant, Chroma) overwrites rather than repeats.

What the store cannot hold (several layers in a row, int8 / uint8 codes, a kind outside the store's `holds`) is
refused in one line before the model loads; a table of other vectors (spec, kind, width, level) before any text is
embedded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from ctxrep.embed.codes import OutputCodes
from ctxrep.embed.job import EmbedJob, EmbedSummary
from ctxrep.embed.records import Record, to_stderr
from ctxrep.featurize.spec import FeaturizerSpec, SpecMismatch
from ctxrep.stores import StoreError, connect
from ctxrep.stores.base import Rows, StoreRecord, VectorKind, row_id


def kind_of(job: EmbedJob) -> tuple[VectorKind, str]:
    """(the kind of vector a job writes, its width not known until the model loads; the level: sentence / word),
    or a one-line StoreError for what no store row holds."""
    vectors = job.vectors
    where = job.out.path
    if vectors.layers == "all" or isinstance(vectors.layers, list):
        raise StoreError(f"{where}: a store row holds one vector: give one --layers (or mix), not several")
    if vectors.form != "dense":
        return VectorKind(vectors.form), vectors.level
    precision = getattr(vectors, "output_precision", "float32")
    if precision in ("int8", "uint8"):
        raise StoreError(
            f"{where}: --output-precision {precision} codes are on ctxrep's own grid, which no store searches; "
            "write float32 and let the store quantize (qdrant ?quantization=scalar, postgresql / lancedb ?vector=half)"
        )
    kind = VectorKind("dense", 0, "bit" if precision in ("binary", "ubinary") else "float32")
    return kind, vectors.level


def open_store_run(
    job: EmbedJob, log: Callable[[str], None] = to_stderr, device: str | None = None, asked=None
) -> StoreRun | EmbedSummary:
    """The run of `job` into its store: what an earlier run of the same input wrote is kept (the rest of a killed
    write deleted), a different run of the same input refused, a complete one summarised."""
    kind, level = kind_of(job)
    store = connect(job.out.uri)
    kind = store.stored(kind)
    store.refuse(kind, store.uri)
    source = "<stdin>" if job.input.path == "-" else str(Path(job.input.path).resolve())
    settings = job.settings()
    record = store.read_record()
    # sparse vectors into a table of dense sentence vectors, in a store that keeps both on a row: beside them
    beside = bool(store.hybrid and record is not None and kind.form == "sparse" and record.kind.form == "dense"
                  and record.level == level)  # fmt: skip
    key = f"{source}|{job.input.text_column}" + ("|sparse" if beside else "")
    entry: dict | None = None
    if record is not None:
        if not beside and (
            record.level != level or (record.kind.form, record.kind.precision) != (kind.form, kind.precision)
        ):
            asked = kind.name
            raise StoreError(
                f"{store.where} holds {record.level}-level {record.kind.describe()}, not {level}-level {asked} "
                "vectors; use another table"
            )
        entry = record.runs.get(key)
    if entry is not None:
        changed = sorted(k for k in set(entry["settings"]) | set(settings)
                         if entry["settings"].get(k) != settings.get(k))  # fmt: skip
        if changed:
            raise ValueError(
                f"{store.where} holds an earlier run of {job.input.source} with other settings (differs in: "
                f"{', '.join(changed)}); use another table"
            )
        if entry.get("complete"):
            spec = asked or job.vectors.spec(job.featurizer(device))
            if beside:
                record.sparse.check(spec, store.where, "embed with the recorded settings, or use another table")
            else:
                record.check(spec, record.kind, level, store.where, ignore=job.vectors.unread)
            store.close()
            return EmbedSummary(
                job.out.path, job.model, job.vectors.level, entry["texts"], entry["rows"], (record.kind.dim,),
                entry["shards"], already_complete=True,
            )  # fmt: skip
    if record is not None and not beside:  # what a killed write left past the resume point (no entry: all of it)
        store.discard(source, job.input.text_column, entry["next_line"] if entry else 0)
    run = StoreRun(job, store, record, kind, level, source, key, settings, entry, log)
    if beside:
        run.beside_dense()
    return run


class StoreRun:
    """An embedding run into a store, driven as an EmbedRun is (`done`, `seen`, `check`, `set_row_shape`,
    `finish`, `bar`), with `write_rows` taking each shard's rows where EmbedRun's `record` takes a written file."""

    writes_in_workers = False  # worker processes send their rows here; only this process writes to the store

    def __init__(self, job, store, record, kind, level, source, key, settings, entry, log) -> None:
        self.job, self.store, self.record, self.kind, self.level = job, store, record, kind, level
        self.source, self.key, self.settings, self.log = source, key, settings, log
        self.out = Path(".")  # where --engine ray's log goes by default
        self.spec: FeaturizerSpec | None = record.spec if record is not None else None
        self.codes: OutputCodes = job.vectors.codes(None, job.out.path)
        entry = entry or {"settings": settings, "shards": 0, "texts": 0, "rows": 0, "next_line": 0, "cut_lines": []}
        self.entry = dict(entry, complete=False)
        self.done: dict[int, dict] = {k: {} for k in range(entry["shards"])}
        self.resumed = entry["shards"]
        self.seen = 0
        self.row_shape: tuple[int, ...] | None = None
        self.dim: int | None = None
        self.bar = None
        self._early: dict[int, tuple] = {}  # shards that arrived before the ones in front of them
        self._batch: list[tuple] = []
        self._batch_rows = 0
        self._checked = False  # the engine's spec compared with the table's
        self.beside = False  # sparse vectors put beside a hybrid table's dense ones
        self._writer = _Writer(store.write)

    def beside_dense(self) -> None:
        """Write sparse vectors beside the dense vectors of the table's rows (a hybrid table: Qdrant)."""
        self.beside, self.spec = True, self.record.sparse
        self._writer = _Writer(self.store.write_sparse)

    @property
    def texts_done(self) -> int:
        return self.entry["texts"] + sum(len(b[3]) for b in self._batch)

    def say_resuming(self) -> None:
        if self.entry["shards"]:
            self.log(
                f"resuming after {self.entry['texts']} texts ({self.entry['shards']} shards) already in {self.store.where}"
            )

    def set_row_shape(self, row_shape: tuple[int, ...]) -> None:
        self.row_shape, self.dim = self.codes.row_shape(tuple(row_shape)), int(row_shape[-1])

    def check(self, spec: FeaturizerSpec) -> None:
        """SpecMismatch / StoreError (one line) unless this run's vectors are the table's; a new table is made
        here, once the width is known, before any text is embedded."""
        if self.spec is not None and self.record is None and spec != self.spec:
            raise SpecMismatch(f"{self.store.where}: the workers' vectors differ from the first ones")
        kind = replace(self.kind, dim=self.dim) if self.dim is not None else None
        if self.beside and self.record.sparse is not None:
            self.record.sparse.check(spec, self.store.where, "embed with the recorded settings, or use another table")
        elif self.beside:  # the first sparse vectors beside the dense ones: their spec is recorded
            self.record = replace(self.record, sparse=spec)
            self.store.write_record(self.record)
        elif self.record is not None:
            self.record.check(
                spec, kind or self.record.kind, self.level, self.store.where, ignore=self.job.vectors.unread
            )
        elif kind is not None:
            self.record = StoreRecord(spec, kind, self.level)
            self.store.create(self.record)
        self.spec = spec
        self._checked = True

    def write_rows(
        self, k: int, vectors, index: list[tuple], records: list[Record], first: int, cut=(), row_shape=None, spec=None
    ) -> None:
        """Shard `k`'s rows (`vectors`, as `codes` made them; one index entry (text, line, position, word) per row)
        of `records` (text number `first` onwards): written once the shards before it are."""
        if row_shape is not None and self.row_shape is None:
            self.set_row_shape(row_shape)
        if spec is not None and not self._checked:
            self.check(spec)
        cut_lines = [records[t - first].line for t in cut]
        self._early[k] = (vectors, index, records, first, cut_lines)
        while self.entry["shards"] + self._pending_shards() in self._early:
            n = self.entry["shards"] + self._pending_shards()
            self._batch.append((n, *self._early.pop(n)))
            self._batch_rows += len(self._batch[-1][2])
            self.done[n] = {}
            if self.bar is not None:
                self.bar.update(len(self._batch[-1][3]))
            if self._batch_rows >= self.job.out.commit_rows:
                self._flush()

    def shard_progress(self, k: int):
        """What shard `k`'s Featurizer calls after each batch (tokens done, tokens in the shard): the progress line
        says how far the shard is (as `EmbedRun.shard_progress` does for a folder)."""

        def report(done: int, total: int) -> None:
            if self.bar is not None:
                self.bar.set_postfix_str(f"shard {k}: {100 * done / max(total, 1):.0f}% of its tokens", refresh=False)
                self.bar.update(0)

        return report

    def _pending_shards(self) -> int:
        return len(self._batch)

    def _flush(self) -> None:
        if not self._batch:
            return
        if self.record is None:  # an engine that gave no spec before its first rows
            raise StoreError(f"{self.store.where}: rows arrived before the table was made")
        rows = self._rows(self._batch)
        last_records = self._batch[-1][3]
        self.entry = dict(
            self.entry,
            shards=self.entry["shards"] + len(self._batch),
            texts=self.entry["texts"] + sum(len(b[3]) for b in self._batch),
            rows=self.entry["rows"] + len(rows),
            next_line=int(last_records[-1].line) + 1 if last_records else self.entry["next_line"],
            cut_lines=self.entry["cut_lines"] + [line for b in self._batch for line in b[5]],
        )
        record = replace(self.record, runs={**self.record.runs, self.key: dict(self.entry)})
        self.record = record
        self._writer.put((rows, record))
        self._batch, self._batch_rows = [], 0

    def _rows(self, batch: list[tuple]) -> Rows:
        """The store rows of shards (k, vectors, index, records, first, cut)."""
        field = self.job.input.text_column
        ids, lines, positions, words, texts, parts = [], [], [], [], [], []
        for _, vectors, index, records, first, _ in batch:
            for text, line, position, word in index:
                ids.append(row_id(self.source, line, field, position))
                lines.append(line)
                positions.append(position)
                words.append(word)
                texts.append(" ".join(records[text - first].words) if self.job.out.with_text else None)
            parts.append(vectors)
        if self.kind.form == "sparse":
            import scipy.sparse

            vectors = scipy.sparse.vstack(parts, format="csr")
        else:
            vectors = np.concatenate(parts)
            if self.codes.precision == "binary":  # sentence-transformers' int8 packing: the bits are the ubinary ones
                vectors = (vectors.astype(np.int16) + 128).astype(np.uint8)
        n = len(ids)
        return Rows(ids, [self.source] * n, np.asarray(lines, np.int64), [field] * n, np.asarray(positions, np.int64),
                    words, texts, vectors)  # fmt: skip

    def finish(self) -> EmbedSummary:
        """Write what is gathered, mark this input complete, build the store's index (after the load)."""
        try:
            if self._early:
                missing = [k for k in range(self.entry["shards"], max(self._early)) if k not in self._early]
                raise StoreError(f"shards {missing} never came back; run the same command again to finish")
            self._flush()
            self._writer.close()
            if self.record is None:  # nothing embedded: every text was done, or no input
                fz = self.job.featurizer()
                self.set_row_shape(self.job.vectors.row_shape(fz))
                self.check(self.job.vectors.spec(fz))
            self.entry["complete"] = True
            self.record = replace(self.record, runs={**self.record.runs, self.key: dict(self.entry)})
            self.store.write_record(self.record)
            self.store.finish()
        finally:
            self._writer.stop()
            self.store.close()
        cut = len(self.entry["cut_lines"])
        if cut:
            self.log(
                f"note: {cut} text{'s' if cut != 1 else ''} cut: a word longer than a whole window of {self.job.model} "
                f"keeps its first pieces; their lines are in the table's record (runs, cut_lines)"
            )
        return EmbedSummary(
            self.job.out.path, self.job.model, self.job.vectors.level, self.entry["texts"], self.entry["rows"],
            self.row_shape or (self.record.kind.dim,), self.entry["shards"], self.resumed,
            precision=self.codes.precision, dim=self.dim,
        )  # fmt: skip

    def abort(self) -> None:
        """Stop the writer thread and close the store (an error or Ctrl-C: what is written stays, resumable)."""
        self._writer.stop()
        self.store.close()


class _Writer:
    """The thread that runs the store's writes while the next shards embed: one write in progress, one waiting."""

    def __init__(self, write: Callable) -> None:
        self.write = write  # the store's write (or write_sparse): (rows, record)
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ctxrep-store-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.write(*item)
                except BaseException as e:  # re-raised in the driver at its next put / close
                    self.error = e

    def put(self, item) -> None:
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Wait for every write; the first error is raised here."""
        if self.thread.is_alive():
            self.put(None)
            self.thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        if self.thread.is_alive():
            try:
                self.queue.put(None, timeout=60)
            except queue.Full:
                return
            self.thread.join(timeout=600)
