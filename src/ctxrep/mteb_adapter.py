"""Deprecated import path: `ctxrep.mteb_adapter` is `ctxrep.vectors.mteb` since 0.2 (the application wing's rooms); removed in 0.3."""

import warnings

from ctxrep.vectors.mteb import *  # noqa: F401,F403
from ctxrep.vectors.mteb import __all__  # noqa: F401

warnings.warn(
    "ctxrep.mteb_adapter moved to ctxrep.vectors.mteb; the old path goes in 0.3", DeprecationWarning, stacklevel=2
)
