"""One question about a server before a client library waits on it: does a TCP connection open at all?

Clients retry an address that does not answer for a long time (Ray for minutes, HTTP clients by their own rules);
asking first turns that into one line within seconds.
"""

from __future__ import annotations

import socket


def why_unreachable(host: str, port: int, timeout: float = 5.0) -> str | None:
    """Why no TCP connection opens to host:port within `timeout` seconds ("connection refused", "timed out", ...),
    or None when one opens."""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        return "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
    return None
