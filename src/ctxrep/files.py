"""Files that ctxrep writes get the mode the user's umask gives a new file (0o666 & ~umask).

Writers that go through a temporary file give it owner-only permissions (0o600): Python's tempfile.mkstemp and
safetensors' `save_file` / `save_model` (it writes a temporary file and renames it) do. A shard or a saved model
written that way cannot be read by the user's group, unlike everything else they create. `apply_umask(path)`
after such a write puts the mode back to what `open(path, "w")` would have given.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
