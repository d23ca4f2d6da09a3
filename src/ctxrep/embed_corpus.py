"""Deprecated import path: `ctxrep.embed_corpus` is `ctxrep.embed.corpus` since 0.2 (the application wing's rooms); removed in 0.3."""

import warnings

from ctxrep.embed.corpus import *  # noqa: F401,F403
from ctxrep.embed.corpus import __all__  # noqa: F401

warnings.warn(
    "ctxrep.embed_corpus moved to ctxrep.embed.corpus; the old path goes in 0.3", DeprecationWarning, stacklevel=2
)
