"""Vector stores ctxrep writes to and searches: LanceDB (embedded, the default), PostgreSQL + pgvector, Qdrant and
Chroma, each through its own client, each an optional extra (`pip install 'ctxrep[lancedb]'`, `[pgvector]`,
`[qdrant]`, `[chroma]`).

    store = ctxrep.open_store("lancedb:vectors.lancedb/corpus")   # a table `ctxrep embed --store URI` wrote
    len(store); store.search("how do I reset my password", k=5)   # Hits, as every index answers
    store.add(["another text"])                                    # embedded with the table's recorded spec

The rooms: uri.py (the address, credentials never printed: StoreURI.shown), base.py (the protocol each store
implements, the rows, the record a table keeps: spec, vector kind, resume points), one module per store over its
client (lancedb_store, pgvector_store, qdrant_store, chroma_store), handle.py (VectorStore: search / add / len by
text). `STORES` is THE table from a URI's scheme to its store.
"""

from __future__ import annotations

from ctxrep.stores.base import Store
from ctxrep.stores.chroma_store import ChromaStore
from ctxrep.stores.lancedb_store import LanceDBStore
from ctxrep.stores.pgvector_store import PgvectorStore
from ctxrep.stores.qdrant_store import QdrantStore
from ctxrep.stores.uri import StoreError, StoreURI, parse_uri

# a URI's scheme -> its store (postgres:// is read as postgresql://)
STORES: dict[str, type[Store]] = {
    "lancedb": LanceDBStore,
    "postgresql": PgvectorStore,
    "qdrant": QdrantStore,
    "chroma": ChromaStore,
}


def parse(uri: str | StoreURI) -> StoreURI:
    """The StoreURI of `uri` (an unknown scheme: one-line StoreError)."""
    return uri if isinstance(uri, StoreURI) else parse_uri(uri, tuple(STORES))


def is_store_uri(text) -> bool:
    """Whether `text` names a store (its scheme is a row of STORES) rather than a folder."""
    if not isinstance(text, str):
        return False
    scheme = text.partition(":")[0].lower()
    return ":" in text and (scheme in STORES or scheme == "postgres")


def store_class(uri: str | StoreURI) -> type[Store]:
    """The store class of an address, without connecting (to check what it holds before any work)."""
    return STORES[parse(uri).scheme]


def connect(uri: str | StoreURI) -> Store:
    """The store at `uri`, connected (its client imported: a missing extra is a one-line StoreError)."""
    parsed = parse(uri)
    return STORES[parsed.scheme](parsed)


def open_store(uri: str | StoreURI, featurizer=None, runtime: dict | None = None):
    """A VectorStore over the table at `uri` (see ctxrep.stores.handle)."""
    from ctxrep.stores.handle import VectorStore

    return VectorStore(connect(uri), featurizer=featurizer, runtime=runtime)


__all__ = ["STORES", "Store", "StoreError", "StoreURI", "connect", "is_store_uri", "open_store", "parse", "store_class"]
