"""Files that ctxrep writes get the mode the user's umask gives a new file (0o666 & ~umask).

Writers that go through a temporary file give it owner-only permissions (0o600): Python's tempfile.mkstemp and
safetensors' `save_file` / `save_model` (it writes a temporary file and renames it) do. A shard or a saved model
written that way cannot be read by the user's group, unlike everything else they create. `apply_umask(path)`
after such a write puts the mode back to what `open(path, "w")` would have given.
"""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux /proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # os.umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The permission bits a new file gets from open(): 0o666 less the umask (0o644 under the usual 022)."""
    return 0o666 & ~current_umask()


def apply_umask(path: str | os.PathLike) -> None:
    """Give the file at `path` the mode a new file gets under the user's umask (call it after writing)."""
    os.chmod(path, default_file_mode())


def ctxrep_cache() -> Path:
    """$CTXREP_CACHE, else ~/.cache/ctxrep (XDG_CACHE_HOME respected): downloads, converted tokenizers, graphs."""
    if os.environ.get("CTXREP_CACHE"):
        return Path(os.environ["CTXREP_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ctxrep"


GZIP_MAGIC = b"\x1f\x8b"


def utf8_lines(
    source: str | os.PathLike | BinaryIO,
    name: str | None = None,
    *,
    keep_ends: bool = False,
    error: type[ValueError] = ValueError,
) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of every line of UTF-8 text: THE line reader of ctxrep's text inputs.

    `source` is a file (gunzipped when it starts with gzip's magic bytes) or a binary stream (stdin, an open file;
    `name` names it in errors). Lines are split on "\n" only, so the numbers match what an editor shows; the line
    ending ("\n", or "\r\n") is removed unless `keep_ends` (the csv module needs it inside quoted fields); a UTF-8
    byte-order mark at the start is dropped. Invalid UTF-8 raises `error` (a ValueError) naming the file, line and
    column; a missing file is a FileNotFoundError naming it."""
    if not isinstance(source, (str, os.PathLike)):
        yield from _decoded_lines(source, name or "<stream>", keep_ends, error)
        return
    path = Path(source)
    name = name or str(path)
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such file; check the path")
    with open(path, "rb") as probe:
        compressed = probe.read(2) == GZIP_MAGIC
    try:
        with (gzip.open if compressed else open)(path, "rb") as f:
            yield from _decoded_lines(f, name, keep_ends, error)
    except (gzip.BadGzipFile, EOFError) as e:
        raise error(f"{name}: the gzip stream is damaged ({e}); compress the file again or give it unpacked") from None


def _decoded_lines(stream: BinaryIO, name: str, keep_ends: bool, error: type[ValueError]) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(stream, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(
                f"{name}:{number}: invalid UTF-8 byte {raw[e.start : e.start + 1]!r} at column {e.start + 1}; "
                "convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
            ) from None
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not keep_ends:
            text = text.removesuffix("\n").removesuffix("\r")
        yield number, text
