"""Running the app: bind the address first (a taken port is one clear error, before the model loads), then serve
on uvicorn; the access log, when asked for, goes to a file or stderr."""

from __future__ import annotations

import errno
import logging
import socket
import sys
from collections.abc import Callable

from ctxrep.serve.app import ACCESS_LOG, build_app
from ctxrep.serve.service import EmbeddingService


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port); a ValueError that says what to do when it cannot be."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"cannot listen on {host}:{port}: the address does not resolve ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse a port in TIME_WAIT
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(
                f"cannot listen on {host}:{port}: the port is taken by another program; choose another --port"
            ) from None
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def access_log_to(target: str | None) -> None:
    """Write one line per request to `target` ("-": stderr; a path: appended to that file); None: no access log."""
    for handler in list(ACCESS_LOG.handlers):
        ACCESS_LOG.removeHandler(handler)
        handler.close()
    if target is None:
        ACCESS_LOG.setLevel(logging.WARNING)
        return
    handler = logging.StreamHandler(sys.stderr) if target == "-" else logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    ACCESS_LOG.addHandler(handler)
    ACCESS_LOG.setLevel(logging.INFO)
    ACCESS_LOG.propagate = False


def serve(sock: socket.socket, service: EmbeddingService, on_started: Callable[[], None] | None = None) -> None:
    """Serve `service` on the bound `sock` until SIGINT / SIGTERM (requests in flight are answered first);
    on_started runs once the server accepts connections."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and on_started is not None:
                on_started()

    config = uvicorn.Config(build_app(service), log_level="warning", timeout_graceful_shutdown=30)
    Server(config).run(sockets=[sock])
