"""A store's address as users write it (`ctxrep embed --store URI`, `ctxrep.open_store(URI)`), parsed once.

    lancedb:DIR/TABLE                         LanceDB, embedded (no server): the database folder DIR, its table
    postgresql://USER:PW@HOST:PORT/DB?table=T PostgreSQL with pgvector (postgres:// too)
    qdrant://HOST:PORT/COLLECTION             a Qdrant server (?api_key=KEY, ?https=true)
    qdrant:DIR/COLLECTION                     qdrant-client's local mode: the client's own engine in DIR, no server
    chroma:DIR/COLLECTION                     Chroma, embedded (chroma://HOST:PORT/COLLECTION: a Chroma server)

Options after `?` are the store's (`vector=half`, `index=none`, ...: each store's module lists those it reads; an
option it does not read is refused). `StoreURI.shown` is the address with every credential (a password, an
api_key or token option) replaced by ***: the only form that messages and logs print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

# option names whose values are credentials: never printed
SECRET_OPTIONS = ("password", "api_key", "apikey", "token", "sslpassword")
HIDDEN = "***"


class StoreError(ValueError):
    """A store that cannot be used as asked: a bad address, a server that does not answer, a table holding other
    vectors, a vector kind the store cannot hold (one line: what, where, what to do; never a credential)."""


@dataclass(frozen=True)
class StoreURI:
    """One parsed address: `scheme` (the table row of ctxrep.stores.STORES), `server` (host, port) or None for an
    embedded store, `location` (a folder, or the database name), `table`, `options` (the query string), and the
    credentials (`user`, `password`), which only the connecting code reads."""

    text: str
    scheme: str
    location: str
    table: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    options: dict = field(default_factory=dict, repr=False)

    @property
    def shown(self) -> str:
        """The address with its credentials replaced by *** (what every message names)."""
        return redact(self.text, self.secrets())

    def secrets(self) -> list[str]:
        """The credential strings in this address (for scrubbing them out of a client's error text)."""
        found = [self.password] if self.password else []
        found += [v for k, v in self.options.items() if k.lower() in SECRET_OPTIONS and v]
        return found

    def scrub(self, message: str) -> str:
        """`message` (a client's error) with this address's credentials replaced by ***."""
        return redact(message, self.secrets())

    def option(self, name: str, default: str | None = None, choices: tuple[str, ...] | None = None) -> str | None:
        value = self.options.get(name, default)
        if choices is not None and value not in choices:
            raise StoreError(f"{self.shown}: ?{name}= must be one of {', '.join(choices)}, got {value!r}")
        return value

    def check_options(self, known: tuple[str, ...]) -> None:
        """Refuse an option this store does not read (a typo would otherwise be ignored)."""
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            reads = f"it reads {', '.join(known)}" if known else "it reads none"
            raise StoreError(f"{self.shown}: unknown option {unknown[0]!r} for a {self.scheme} store ({reads})")


def redact(text: str, secrets: list[str]) -> str:
    """`text` with the password of any URL in it and each of `secrets` replaced by ***."""
    text = re.sub(r"(://[^:/?#@\s]*:)[^@/\s]*@", rf"\g<1>{HIDDEN}@", text)
    for key in SECRET_OPTIONS:
        text = re.sub(rf"(?i)([?&]{key}=)[^&\s]*", rf"\g<1>{HIDDEN}", text)
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, HIDDEN)
    return text


def parse_uri(text: str, schemes: tuple[str, ...]) -> StoreURI:
    """The StoreURI of `text`; an unknown scheme, or an address without its table, is a one-line StoreError that
    names the forms ctxrep reads (and never the credentials)."""
    if not isinstance(text, str) or not text.strip():
        raise StoreError(f"a store address is a non-empty string, got {text!r}; e.g. lancedb:vectors.lancedb/corpus")
    text = text.strip()
    scheme, sep, rest = text.partition(":")
    scheme = scheme.lower()
    scheme = "postgresql" if scheme == "postgres" else scheme
    if not sep or scheme not in schemes:
        shown = redact(text, [])
        raise StoreError(
            f"{shown}: unknown store (scheme {scheme!r}); give one of lancedb:DIR/TABLE, "
            "postgresql://USER@HOST:PORT/DB?table=TABLE, qdrant://HOST:PORT/COLLECTION, qdrant:DIR/COLLECTION, "
            "chroma:DIR/COLLECTION"
        )
    path, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    if path.startswith("//"):  # a server: //[user[:password]@]host[:port]/name
        return _server_uri(text, scheme, options)
    folder, slash, table = path.rstrip("/").rpartition("/")
    if not slash or not folder or not table:
        raise StoreError(f"{redact(text, [])}: give the folder and the table: {scheme}:DIR/TABLE")
    if scheme == "postgresql":
        raise StoreError(f"{redact(text, [])}: PostgreSQL is a server: postgresql://USER@HOST:PORT/DB?table=TABLE")
    return StoreURI(text, scheme, unquote(folder), unquote(table), options=options)


def _server_uri(text: str, scheme: str, options: dict) -> StoreURI:
    parts = urlsplit(text.partition("?")[0].replace("postgres://", "postgresql://", 1))
    try:
        port = parts.port
    except ValueError:
        raise StoreError(f"{redact(text, [])}: the port is not a number") from None
    name = unquote(parts.path.strip("/"))
    if scheme == "postgresql":  # the database in the path, the table as an option
        table = options.pop("table", None)
        if not name or not table:
            raise StoreError(
                f"{redact(text, [])}: give the database and the table: postgresql://USER@HOST:PORT/DB?table=T"
            )
        location = name
    else:
        if not name or "/" in name:
            raise StoreError(f"{redact(text, [])}: give the collection: {scheme}://HOST:PORT/COLLECTION")
        location, table = "", name
    if not parts.hostname:
        raise StoreError(f"{redact(text, [])}: no host; e.g. {scheme}://127.0.0.1:PORT/...")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return StoreURI(text, scheme, location, table, parts.hostname, port, user, password, options)
