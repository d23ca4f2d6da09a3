"""Run an embedding job into a store and kill this process (SIGKILL) in the middle of its `at`-th write: half of
that write's rows are in the store, its resume point is not. tests/test_stores.py and benchmarks/stores.py run it
in a subprocess, then rerun the job and count rows and duplicates.

    python tests/_store_kill.py URI INPUT MODEL AT [COMMIT_ROWS] [LEVEL]
"""

from __future__ import annotations

import os
import signal
import sys


def main(uri: str, input_path: str, model: str, at: int, commit_rows: int = 5, level: str = "sentence") -> None:
    from ctxrep.embed.corpus import EmbedJob, SentenceVectors, StoreTable, WordVectors, embed_corpus
    from ctxrep.stores import STORES, parse

    store = STORES[parse(uri).scheme]
    original = store.write
    calls = [0]

    def write(self, rows, record=None):
        calls[0] += 1
        if calls[0] == at:  # half the rows land, then the process dies before the resume point is kept
            half = max(1, len(rows) // 2)
            original(self, _head(rows, half), None)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, rows, record)

    store.write = write
    vectors = SentenceVectors() if level == "sentence" else WordVectors()
    job = EmbedJob(input_path, StoreTable(uri, shard_size=4, commit_rows=commit_rows), vectors=vectors, model=model)
    embed_corpus(job, show_progress=False, log=lambda _: None)
    print("finished without being killed", file=sys.stderr)


def _head(rows, n: int):
    from ctxrep.stores.base import Rows

    return Rows(rows.ids[:n], rows.sources[:n], rows.lines[:n], rows.fields[:n], rows.positions[:n], rows.words[:n],
                rows.texts[:n], rows.vectors[:n])  # fmt: skip


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], args[2], int(args[3]), *(int(a) for a in args[4:5]), *args[5:6])
