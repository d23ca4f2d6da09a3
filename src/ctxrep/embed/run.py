"""The bookkeeping of one embedding run into an output folder: `open_run` resumes what an earlier run with the same
settings completed (or refuses a different run's folder), `EmbedRun.record` lists each finished shard in the
manifest, `EmbedRun.finish` marks the folder complete. Whatever embeds the shards drives it: `embed_corpus` in this
process, its worker processes (`ctxrep.embed.workers`) or Ray (`ctxrep.embed.ray_engine`). Only the process that
reads the input writes the manifest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ctxrep.embed.job import EmbedJob, EmbedSummary
from ctxrep.embed.records import to_stderr
from ctxrep.embed.shards import cut_summary, vector_row_shape
from ctxrep.vectors.spec import FeaturizerSpec
from ctxrep.vectors.store import MANIFEST, read_manifest, write_manifest


class WorkerDied(ValueError):
    """A worker process ended without finishing its shards (killed, out of memory, crashed). A ValueError, as the
    other errors the user acts on: the message says what to run."""


class EmbedRun:
    """The manifest's bookkeeping for one run: the shards done (kept from an earlier run, or recorded now), the spec
    of their vectors, and the progress display the caller attaches (`bar`)."""

    def __init__(
        self, job: EmbedJob, out: Path, manifest_file: Path, settings: dict, done: dict, log, spec=None
    ) -> None:
        self.job, self.out, self.manifest_file, self.settings, self.log = job, out, manifest_file, settings, log
        self.spec: FeaturizerSpec | None = spec
        self.done = dict(done)
        self.resumed = len(done)
        self.seen = 0  # shards in the input
        self.texts = 0
        self.row_shape: tuple[int, ...] | None = None
        self.bar = None

    def say_resuming(self) -> None:
        if self.done:
            kept = sum(s["texts"] for s in self.done.values())
            self.log(f"resuming after {kept} texts in {len(self.done)} complete shards")

    def record(self, k: int, entry: dict, row_shape: tuple[int, ...], spec: FeaturizerSpec | None = None) -> None:
        """Shard `k` is written (`entry`: its manifest entry): list it in the manifest."""
        if spec is not None:
            if self.spec is not None and spec != self.spec:  # e.g. the Hub model changed between runs
                self.spec.check(spec, str(self.out), "use another --out folder, or delete this one")
            self.spec = spec
        self.done[k] = entry
        self.row_shape = tuple(row_shape)
        self._write(complete=False)
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"{sum(s['texts'] for s in self.done.values()):,} texts in {len(self.done)} shards"
            )

    def _write(self, complete: bool) -> None:
        shards = [self.done[k] for k in sorted(self.done)]
        extra = {"cut": cut_summary(shards)}
        write_manifest(self.out, self.settings, shards, self.row_shape, complete, self.spec, extra)

    def finish(self) -> EmbedSummary:
        """Mark the folder complete (every shard of the input is listed); the summary of what it holds."""
        texts = sum(s["texts"] for s in self.done.values())
        if self.seen == 0:
            empty = "all its texts were empty and skipped" if self.job.skip_empty else "it holds no texts"
            self.log(f"warning: {self.job.source}: nothing to embed: {empty}; check the input file and --format")
        if self.row_shape is None:  # nothing embedded in this run: every shard was already done, or no input
            self.row_shape = tuple(self._row_shape_without_model())
        missing = [k for k in range(self.seen) if k not in self.done]
        if missing:  # cannot happen unless a worker lost a shard silently: never mark such a run complete
            raise WorkerDied(f"shards {missing} were not written; run the same command again to finish")
        self._write(complete=True)
        cut = cut_summary(list(self.done.values()))["count"]
        if cut:
            self.log(
                f"note: {cut} text{'s' if cut != 1 else ''} cut: a word longer than a whole window of {self.job.model} "
                f'keeps its first pieces; their text numbers and lines are in {self.manifest_file}\'s "cut"'
            )
        rows = sum(s["rows"] for s in self.done.values())
        return EmbedSummary(
            self.out, self.job.model, self.job.level, texts, rows, self.row_shape, len(self.done), self.resumed
        )

    def _row_shape_without_model(self) -> tuple[int, ...]:
        old = read_manifest(self.out)
        if old is not None:
            if old.get("row_shape"):
                return tuple(old["row_shape"])
        return vector_row_shape(self.job.featurizer(), self.job.level, self.job.dimensions)


def open_run(job: EmbedJob, log: Callable[[str], None] = to_stderr) -> EmbedRun | EmbedSummary:
    """The bookkeeping of a run into `job.out_dir`: the shards an earlier run with the same settings completed (a
    different run's folder is refused), or the summary of a complete folder."""
    out = Path(job.out_dir)
    settings = job.settings()
    manifest_file = out / MANIFEST
    done: dict[int, dict] = {}
    spec = None  # what the shards already written hold (a resumed run must add the same)
    manifest = read_manifest(out)
    if manifest is not None:
        if manifest["settings"] != settings:
            keys = set(settings) | set(manifest["settings"])
            changed = sorted(k for k in keys if manifest["settings"].get(k) != settings.get(k))
            raise ValueError(
                f"{out} holds the output of a different run (differs in: {', '.join(changed)}); "
                "use another --out directory or delete this one"
            )
        if manifest.get("complete"):
            return EmbedSummary(
                out,
                job.model,
                job.level,
                manifest["texts"],
                manifest["rows"],
                tuple(manifest.get("row_shape") or [manifest["dim"]]),
                len(manifest["shards"]),
                already_complete=True,
            )
        done = {_shard_number(s): s for s in manifest["shards"]}
        spec = FeaturizerSpec.from_dict(manifest["spec"], str(manifest_file)) if "spec" in manifest else None
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):  # what a killed run left half-written (the manifest's own .tmp included)
        stale.unlink(missing_ok=True)
    return EmbedRun(job, out, manifest_file, settings, done, log, spec)


def _shard_number(entry: dict) -> int:
    return int(entry["file"].split("-")[1].split(".")[0])
