"""The bookkeeping of one embedding run into an output folder: `open_run` resumes what an earlier run with the same
settings completed (or refuses a different run's folder), `EmbedRun.record` lists each finished shard in the
manifest, `EmbedRun.finish` marks the folder complete. Whatever embeds the shards drives it: `embed_corpus` in this
process, its worker processes (`ctxrep.embed.workers`) or Ray (`ctxrep.embed.ray_engine`). Only the process that
reads the input writes the manifest.

What a resumed run must match: the manifest's `settings` (the input, its fingerprint, format, column, header, level,
shard size, storage: `EmbedJob.settings`) exactly, before anything loads, and its `spec` (the FeaturizerSpec of the
vectors: model, revision, layers, pooling, precision, ...) once the model is loaded (`EmbedRun.check`), so that
settings which resolve to the same vectors (layers -1 and 6 of a 6-layer model) resume; the settings the job's
output variant does not read (`vectors.unread`: word vectors' sentence pooling) are not compared. A manifest of an
older ctxrep repeated the vector settings inside `settings` (LEGACY_VECTOR_KEYS): those are compared as that version
did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ctxrep.embed.codes import OutputCodes
from ctxrep.embed.job import EmbedJob, EmbedSummary, StoreTable
from ctxrep.embed.records import to_stderr
from ctxrep.embed.shards import cut_summary
from ctxrep.featurize.spec import FeaturizerSpec, SpecMismatch
from ctxrep.vectors.store import MANIFEST, read_manifest, write_manifest


class WorkerDied(ValueError):
    """A worker process ended without finishing its shards (killed, out of memory, crashed). A ValueError, as the
    other errors the user acts on: the message says what to run."""


class EmbedRun:
    """The manifest's bookkeeping for one run: the shards done (kept from an earlier run, or recorded now), the spec
    of their vectors, and the progress display the caller attaches (`bar`: counts the texts of each shard recorded)."""

    writes_in_workers = True  # worker processes write their shard files; this process records them

    def __init__(
        self,
        job: EmbedJob,
        out: Path,
        manifest_file: Path,
        settings: dict,
        done: dict,
        log,
        spec=None,
        codes: OutputCodes | None = None,
    ) -> None:
        self.job, self.out, self.manifest_file, self.settings, self.log = job, out, manifest_file, settings, log
        self.spec: FeaturizerSpec | None = spec
        self.codes = codes if codes is not None else OutputCodes()  # --output-precision, its ranges once fixed
        self.done = dict(done)
        self.resumed = len(done)
        self.seen = 0  # shards in the input
        self.row_shape: tuple[int, ...] | None = None  # a stored row (binary codes: dim / 8 bytes)
        self.dim: int | None = None  # the vectors' width (before any binary packing)
        self.bar = None

    @property
    def texts_done(self) -> int:
        """The texts in the shards done so far."""
        return sum(s["texts"] for s in self.done.values())

    def say_resuming(self) -> None:
        if self.done:
            self.log(f"resuming after {self.texts_done} texts in {len(self.done)} complete shards")

    def check(self, spec: FeaturizerSpec) -> None:
        """SpecMismatch (one line: the fields that differ, what to do) unless `spec`, what this run's model makes,
        gives the vectors the folder holds; the first spec of a new folder is kept."""
        if self.spec is not None and spec != self.spec:
            differences = self.spec.differences(spec, ignore=self.job.vectors.unread)
            if differences:  # e.g. other layers, or the Hub model changed between runs
                raise SpecMismatch(
                    f"{self.out} holds the output of a different run (differs in: "
                    f"{', '.join(d.split()[0] for d in differences)}): written != asked: {'; '.join(differences)}; "
                    "use another --out directory or delete this one"
                )
        self.spec = spec

    def set_row_shape(self, row_shape: tuple[int, ...]) -> None:
        """The shape of one float vector row (`vectors.row_shape`); what is stored follows from the codes."""
        self.row_shape, self.dim = self.codes.row_shape(tuple(row_shape)), int(row_shape[-1])

    def record(self, k: int, entry: dict, row_shape: tuple[int, ...], spec: FeaturizerSpec | None = None) -> None:
        """Shard `k` is written (`entry`: its manifest entry, `row_shape`: one float vector row's shape, `spec`: what
        made it): list it in the manifest."""
        if spec is not None:
            self.check(spec)
        self.done[k] = entry
        self.set_row_shape(row_shape)
        self._write(complete=False)
        if self.bar is not None:  # the progress counts texts embedded
            self.bar.set_postfix_str(self._read(_shards_written(len(self.done))), refresh=False)
            self.bar.update(entry["texts"])

    def shard_progress(self, k: int):
        """What shard `k`'s Featurizer calls after each batch (tokens done, tokens in the shard): the progress line
        says how far the shard is, so that a long first shard shows work from its first batches."""

        def report(done: int, total: int) -> None:
            if self.bar is not None:
                share = f"shard {k}: {100 * done / max(total, 1):.0f}% of its tokens"
                self.bar.set_postfix_str(self._read(f"{_shards_written(len(self.done))}, {share}"), refresh=False)
                self.bar.update(0)  # a terminal's bar redraws; a log gets its line when its interval is up

        return report

    def _read(self, postfix: str) -> str:
        """`postfix` with the texts read so far (open_records' count), when known."""
        counter = getattr(self.bar, "texts_read", None)
        return postfix if counter is None else f"{counter.read:,} texts read, {postfix}"

    def kept(self) -> str:
        """The line a Ctrl-C ends with: what the folder keeps (its manifest on disk: a Ctrl-C may land while the
        manifest is written), and that the same command resumes after it."""
        shards = (read_manifest(self.out) or {"shards": []})["shards"]
        if not shards:
            return (
                f"Ctrl-C: no shard was complete yet, so {self.out} keeps no vectors (a shard is "
                f"{self.job.out.shard_size:,} texts); the same command starts again"
            )
        texts = sum(s["texts"] for s in shards)
        return (
            f"Ctrl-C: kept {texts:,} texts in {len(shards)} complete shard{'' if len(shards) == 1 else 's'} in "
            f"{self.out}; the same command resumes after them"
        )

    def _write(self, complete: bool) -> None:
        shards = [self.done[k] for k in sorted(self.done)]
        extra: dict = {"cut": cut_summary(shards)}
        if self.codes.quantized:  # precision, width and the int8 / uint8 ranges every shard was written with
            extra["quantization"] = self.codes.record(self.dim)
        write_manifest(self.out, self.settings, shards, self.row_shape, complete, self.spec, extra, dim=self.dim)

    def finish(self) -> EmbedSummary:
        """Mark the folder complete (every shard of the input is listed); the summary of what it holds."""
        texts = self.texts_done
        if self.seen == 0:  # an error, as every command's empty input, unless asked for (--allow-empty)
            empty = "all its texts were empty and skipped" if self.job.input.skip_empty else "it holds no texts"
            if not self.job.input.allow_empty:
                raise ValueError(
                    f"{self.job.input.source}: nothing to embed: {empty}; check the input file and --format (or give "
                    "--allow-empty to write an empty folder)"
                )
            self.log(f"warning: {self.job.input.source}: nothing to embed: {empty}; check the input file and --format")
        if self.row_shape is None or self.spec is None:  # nothing embedded now: every shard was done, or no input
            self._row_shape_without_model()
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
            self.out,
            self.job.model,
            self.job.vectors.level,
            texts,
            rows,
            self.row_shape,
            len(self.done),
            self.resumed,
            precision=self.codes.precision,
            dim=self.dim,
        )

    def _row_shape_without_model(self) -> None:
        old = read_manifest(self.out)
        if old is not None and old.get("row_shape") and self.spec is not None:
            self.row_shape, self.dim = tuple(old["row_shape"]), old.get("dim")
            return
        fz = self.job.featurizer()  # nothing was embedded yet: the model says what it would write
        if self.spec is None:
            self.spec = self.job.vectors.spec(fz)
        self.set_row_shape(self.job.vectors.row_shape(fz))


def _shards_written(n: int) -> str:
    return f"{n:,} shard{'' if n == 1 else 's'} written"


def open_run(
    job: EmbedJob,
    log: Callable[[str], None] = to_stderr,
    device: str | None = None,
    asked: FeaturizerSpec | None = None,
):
    """The bookkeeping of a run into `job.out_dir`: the shards an earlier run with the same settings completed (a
    different run's folder is refused), or the summary of a complete folder. A complete folder's spec is checked
    here against `asked` (else the spec of the job's model, loaded on `device`); an unfinished one's when the run
    loads its model (`EmbedRun.check`). A job into a store (`StoreTable`) gets its StoreRun (ctxrep.embed.store_run)."""
    if isinstance(job.out, StoreTable):
        from ctxrep.embed.store_run import open_store_run

        return open_store_run(job, log, device, asked)
    out = Path(job.out.path)
    settings = job.settings()
    manifest_file = out / MANIFEST
    done: dict[int, dict] = {}
    spec = None  # what the shards already written hold (a resumed run must add the same)
    manifest = read_manifest(out)
    if manifest is not None:
        written = dict(manifest["settings"])
        legacy = {k: written.pop(k) for k in LEGACY_VECTOR_KEYS if k in written}
        changed = _changed(written, settings)
        if legacy:  # a manifest of an older ctxrep: its copy of the vector settings, compared as it did
            changed += _changed(legacy, legacy_vector_settings(job), ignore=job.vectors.unread)
        if changed:
            raise ValueError(
                f"{out} holds the output of a different run (differs in: {', '.join(sorted(changed))}); "
                "use another --out directory or delete this one"
            )
        spec = written_spec(manifest, legacy, manifest_file)
        done = {_shard_number(s): s for s in manifest["shards"]}
        codes = job.vectors.codes(manifest.get("quantization"), str(out))
        if manifest.get("complete"):
            run = EmbedRun(job, out, manifest_file, settings, done, log, spec)
            run.check(asked or job.vectors.spec(job.featurizer(device)))
            return EmbedSummary(
                out,
                job.model,
                job.vectors.level,
                manifest["texts"],
                manifest["rows"],
                tuple(manifest.get("row_shape") or [manifest["dim"]]),
                len(manifest["shards"]),
                already_complete=True,
            )
    else:
        codes = job.vectors.codes(None, str(out))
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):  # what a killed run left half-written (the manifest's own .tmp included)
        stale.unlink(missing_ok=True)
    return EmbedRun(job, out, manifest_file, settings, done, log, spec, codes)


# `ctxrep embed --shard-size` when not given for a new folder: a few seconds of MiniLM on a 2-core CPU, so that a
# Ctrl-C keeps all but the last few seconds of work (2,000 texts took ~40 s there: a Ctrl-C in that time kept nothing).
DEFAULT_SHARD_TEXTS = 500


def shard_size_for(out: str | Path, asked: int | None) -> int:
    """The shard size of a run into `out`: `asked`; not given, the folder's own (an unfinished folder resumes with
    the same command, whatever the default was when it began), else DEFAULT_SHARD_TEXTS."""
    if asked is not None:
        return asked
    written = (read_manifest(out) or {}).get("settings", {}).get("shard_size")
    return written if isinstance(written, int) else DEFAULT_SHARD_TEXTS


def _changed(written: dict, asked: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    return [k for k in set(written) | set(asked) if k not in ignore and written.get(k) != asked.get(k)]


def written_spec(manifest: dict, legacy: dict, manifest_file: Path) -> FeaturizerSpec | None:
    """The spec of the vectors a manifest lists: its `spec`, else (an older ctxrep's manifest) the one its vector
    settings give; None when it lists no shard yet. A manifest that lists shards but says nothing of what made them
    is refused in one line."""
    if "spec" in manifest:
        return FeaturizerSpec.from_dict(manifest["spec"], str(manifest_file))
    if "model" in legacy:
        spec = FeaturizerSpec.from_embed_settings(legacy)
        return replace(spec, head="sparse") if legacy.get("output") == "sparse" else spec
    if not manifest["shards"]:
        return None
    raise SpecMismatch(
        f"{manifest_file}: lists {len(manifest['shards'])} shards but neither the spec of their vectors nor the model "
        f"that made them; delete {manifest_file.parent} or use another --out directory, and embed again"
    )


# The vector settings that manifests of ctxrep before the embed rooms (issue 31) repeated inside `settings`.
LEGACY_VECTOR_KEYS = (
    "model",
    "layers",
    "pooling",
    "sentence_pooling",
    "quantize",
    "precision",
    "backend",
    "output",
    "dimensions",
    "prompt",
    "prompt_name",
)


def legacy_vector_settings(job: EmbedJob) -> dict:
    """The vector settings an older ctxrep wrote into `settings` for `job`: what its manifest is compared with."""
    settings = {"model": job.model, **job.vectors.legacy_settings()}
    if job.quantize is not None:
        settings["quantize"] = job.quantize
    if job.precision not in ("fp32", None):
        settings["precision"] = job.precision
    if job.backend not in ("torch", None):
        settings["backend"] = job.backend
    return settings


def _shard_number(entry: dict) -> int:
    return int(entry["file"].split("-")[1].split(".")[0])
