"""Running the app: bind the address first (a taken port is one clear error, before the model loads), then serve
on uvicorn; the access log, when asked for, goes to a file or stderr.

Shutdown (SIGINT / SIGTERM): uvicorn stops accepting connections and waits for the requests in flight, at most
ServeConfig.graceful_shutdown_s (one line says how many and for how long); then it cancels those still running. `CutOnShutdown` answers each of them with a
503 in its route's schema (or, where its answer had begun, the client sees the connection close) and logs one line
naming them, where uvicorn would log a traceback per request; their model calls stop at their next step.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from ctxrep.serve.app import ACCESS_LOG, build_app
from ctxrep.serve.errors import error_body
from ctxrep.serve.service import EmbeddingService

SERVER_LOG = logging.getLogger("uvicorn.error")  # uvicorn's own log: the shutdown's line goes with its lines


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


@dataclass
class InFlight:
    """One request the server is answering."""

    method: str
    path: str
    client: str
    since: float
    answering: bool = False  # its answer has begun to go out
    answered: bool = False  # and has gone out whole

    def describe(self, now: float) -> str:
        told = "its client saw the connection close" if self.answering else "answered 503"
        return f"{self.method} {self.path} from {self.client} (running {now - self.since:.1f} s; {told})"


class CutOnShutdown:
    """ASGI middleware around the app: the requests in flight. Once the server shuts down (`stopping`) and the
    graceful-shutdown wait has run out, uvicorn cancels the requests still running; each is answered with a 503 in
    its route's schema instead, and the first one cut logs one line naming them all."""

    def __init__(self, app, wait_s: float) -> None:
        self.app, self.wait_s = app, wait_s
        self.stopping = False
        self.in_flight: dict[int, InFlight] = {}
        self._reported = False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = scope.get("client")
        flight = InFlight(
            scope["method"], scope["path"], f"{client[0]}:{client[1]}" if client else "-", time.monotonic()
        )
        self.in_flight[id(flight)] = flight

        async def watched(message):
            if message["type"] == "http.response.start":
                flight.answering = True
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                flight.answered = True

        try:
            await self.app(scope, receive, watched)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            asyncio.current_task().uncancel()  # the cut is handled here: the request ends with its answer
            if not flight.answered:
                self._report()
            if not flight.answering:
                await self._refuse(flight, send)
        finally:
            del self.in_flight[id(flight)]

    def _report(self) -> None:
        """One line for every request cut (uvicorn cancels them all at once: all are in flight now)."""
        if self._reported:
            return
        self._reported = True
        now = time.monotonic()
        cut = [flight.describe(now) for flight in self.in_flight.values() if not flight.answered]
        SERVER_LOG.error(
            "shutting down: the %g s graceful-shutdown wait ran out; cut %d request%s still running: %s",
            self.wait_s, len(cut), "" if len(cut) == 1 else "s", "; ".join(cut),
        )  # fmt: skip

    async def _refuse(self, flight: InFlight, send) -> None:
        message = (
            f"the server is shutting down and this request was still running after its {self.wait_s:g} s "
            "graceful-shutdown wait, so it was cut; send it again once the server is back"
        )
        body = json.dumps(error_body(flight.path, 503, message, "service_unavailable")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def shutdown_line(in_flight: int, wait_s: float) -> str:
    """What the server says when it starts to shut down (Ctrl-C, SIGTERM): the requests it finishes, for how long."""
    if not in_flight:
        return "shutting down: no requests in flight"
    return (
        f"shutting down: finishing {in_flight} request{'' if in_flight == 1 else 's'} in flight, for at most "
        f"{wait_s:g} s (--graceful-shutdown-s); those still running then get a 503"
    )


class _WithoutUvicornCancelLine(logging.Filter):
    """Drops uvicorn's "Cancel N running task(s), timeout graceful shutdown exceeded": CutOnShutdown's line names
    the requests instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and "timeout graceful shutdown exceeded" in record.msg)


class Server(uvicorn.Server):
    """uvicorn's server, telling `cutoff` when it shuts down and calling on_started once it accepts connections."""

    def __init__(self, config: uvicorn.Config, cutoff: CutOnShutdown, on_started: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.cutoff, self.on_started = cutoff, on_started

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    async def shutdown(self, sockets=None) -> None:
        self.cutoff.stopping = True
        SERVER_LOG.warning(shutdown_line(len(self.cutoff.in_flight), self.cutoff.wait_s))
        quiet = _WithoutUvicornCancelLine()
        SERVER_LOG.addFilter(quiet)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            SERVER_LOG.removeFilter(quiet)


def make_server(service: EmbeddingService, on_started: Callable[[], None] | None = None) -> Server:
    """The uvicorn server of `service`'s app, waiting ServeConfig.graceful_shutdown_s for requests in flight when it
    stops; on_started runs once it accepts connections."""
    wait = service.config.graceful_shutdown_s
    app = CutOnShutdown(build_app(service), wait)
    return Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=wait), app, on_started)


def serve(sock: socket.socket, service: EmbeddingService, on_started: Callable[[], None] | None = None) -> None:
    """Serve `service` on the bound `sock` until SIGINT / SIGTERM (requests in flight are answered first, for
    ServeConfig.graceful_shutdown_s at most); on_started runs once the server accepts connections."""
    make_server(service, on_started).run(sockets=[sock])
