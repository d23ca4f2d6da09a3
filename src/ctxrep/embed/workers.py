"""Worker processes of an embedding run: `workers=N` CPU processes or one process per GPU (`devices=[...]`), each
loading the model once and embedding whole shards, so that the folder is the same as one process's.

A worker is a spawned interpreter (no forked torch thread pools or CUDA state) that dies with the process that
started it; the main process reads the input, hands out shards through a bounded queue and writes the manifest.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import time
from pathlib import Path

from ctxrep.embed.codes import OutputCodes
from ctxrep.embed.job import EmbedJob, StoreTable
from ctxrep.embed.run import EmbedRun, WorkerDied
from ctxrep.embed.shards import embed_shard, write_shard
from ctxrep.featurize.spec import FeaturizerSpec


def worker_placements(job: EmbedJob, workers: int, devices: list[str] | None) -> list[tuple[str | None, int | None]]:
    """(device, torch threads) for each worker."""
    if devices:
        return [(d, job.threads) for d in devices]
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if workers == 1:
        return [(job.device, job.threads)]
    cores = job.threads or os.cpu_count() or 1
    return [(job.device, max(1, cores // workers))] * workers


def expand_devices(value: str) -> list[str]:
    """--devices "cuda:0,cuda:1" or "all" (every visible GPU) as a list of device names."""
    if value.strip() == "all":
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise ValueError("--devices all: no CUDA device is visible; use --workers N to run N CPU processes")
        return [f"cuda:{i}" for i in range(n)]
    devices = [d.strip() for d in value.split(",") if d.strip()]
    if not devices:
        raise ValueError(f"--devices {value!r}: give device names separated by commas (cuda:0,cuda:1) or 'all'")
    if len(set(devices)) != len(devices):
        raise ValueError(f"--devices {value!r} names a device twice; use --workers for several CPU processes")
    return devices


def embed_in_workers(run: EmbedRun, shards, placements: list[tuple[str | None, int | None]]) -> None:
    """Embed `shards` ((k, first text, records) from `shards_of`) in one spawned process per placement (device,
    threads), each loading the model once; `run` records each shard a worker finishes. A worker's error or death
    stops the run with a one-line error (WorkerDied: what to run again); the complete shards are kept."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch thread pools or CUDA state
    tasks = ctx.Queue(maxsize=len(placements))  # bounded: at most one shard waits per worker
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(run.job, run.codes, device, threads, tasks, results, i),
            daemon=True,
            name=f"embed-{i}",
        )
        for i, (device, threads) in enumerate(placements)
    ]
    with _main_not_reimported():
        for p in procs:
            p.start()
    where = ", ".join(f"{d or 'cpu'} x {t or 'default'} threads" for d, t in placements)
    run.log(f"embedding with {len(procs)} worker processes ({where})")
    pending: dict[int, int] = {}  # shard -> worker (once known)
    finished = False
    try:
        for k, first, records in shards:
            run.seen = k + 1
            if k in run.done:
                continue
            pending[k] = -1
            while True:
                try:
                    tasks.put((k, first, records), timeout=0.2)
                    break
                except queue.Full:
                    _collect(run, results, procs, pending, wait=0.0)
            _collect(run, results, procs, pending, wait=0.0)
        for _ in procs:
            while True:
                try:
                    tasks.put(None, timeout=0.2)
                    break
                except queue.Full:
                    _collect(run, results, procs, pending, wait=0.0)
        while pending:
            _collect(run, results, procs, pending, wait=0.5)
        for p in procs:
            p.join(timeout=30)
        finished = True
    finally:
        if not finished:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=10)
        tasks.cancel_join_thread()
        results.cancel_join_thread()


def _collect(run: EmbedRun, results, procs, pending: dict[int, int], wait: float) -> None:
    """Take the workers' reports; a worker's error or death stops the run (the manifest keeps what is done)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            kind, k, worker, payload = results.get(timeout=max(0.0, deadline - time.monotonic()) or 0.01)
        except queue.Empty:
            break
        if kind == "started":
            pending[k] = worker
        elif kind == "done":
            entry, row_shape, spec = payload
            pending.pop(k, None)
            run.record(k, entry, row_shape, FeaturizerSpec.from_dict(spec))
        elif kind == "rows":  # a store run: the worker's rows, written here
            vectors, index, records, first, cut, row_shape, spec = payload
            pending.pop(k, None)
            run.write_rows(k, vectors, index, records, first, cut, row_shape, FeaturizerSpec.from_dict(spec))
        elif kind == "error":
            where = f" while embedding shard {k}" if k >= 0 else ""
            raise ValueError(f"worker {worker}{where}: {payload}")
    for i, p in enumerate(procs):
        if p.exitcode is not None and p.exitcode != 0:
            lost = sorted(k for k, w in pending.items() if w == i)
            how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with status {p.exitcode}"
            raise WorkerDied(
                f"worker {i} (pid {p.pid}) {how}"
                + (f" while embedding shard {', '.join(map(str, lost))}" if lost else "")
                + f"; the {len(run.done)} complete shards are kept: run the same command again to finish"
            )


@contextlib.contextmanager
def _main_not_reimported():
    """Start spawned workers without re-running the caller's script in them: a spawned child imports the parent's
    __main__ (by name or path) unless it has neither, and a script without an `if __name__ == "__main__":` guard
    would start the whole job again in every worker. The workers need nothing from __main__ (their target and
    arguments live in ctxrep), so __spec__ and __file__ are hidden while they start."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies (even by kill -9), so no orphan
    keeps writing shards beside a rerun."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker(job: EmbedJob, codes: OutputCodes, device, threads, tasks, results, worker: int) -> None:
    """A worker process: load the model once, then embed whole shards until told to stop (None); `codes`: what
    the shards are written as (--output-precision, with its ranges fixed)."""
    _die_with_parent()
    try:
        fz = job.featurizer(device, threads)
        row_shape = job.vectors.row_shape(fz)
        spec = job.vectors.spec(fz).to_dict()
    except Exception as e:
        results.put(("error", -1, worker, f"{type(e).__name__}: {e}"))
        return
    in_store = isinstance(job.out, StoreTable)
    out = Path(job.out.path)
    while True:
        task = tasks.get()
        if task is None:
            return
        k, first, records = task
        results.put(("started", k, worker, None))
        try:
            if in_store:  # the rows go back to the main process, which alone writes to the store, in order
                rows, index = embed_shard(fz, records, first, job.vectors)
                cut = [first + i for i in getattr(fz, "cut_texts", [])]
                payload = (codes.encode(rows, k), index, records, first, cut, row_shape, spec)
                results.put(("rows", k, worker, payload))
                continue
            entry = write_shard(fz, records, k, first, job.vectors, job.out.storage, out, codes=codes)
        except Exception as e:
            results.put(("error", k, worker, f"{type(e).__name__}: {e}"))
            return
        results.put(("done", k, worker, (entry, row_shape, spec)))
