"""Deprecated import path: `ctxrep.ray_embed` is `ctxrep.embed.ray_engine` since 0.2 (the application wing's rooms); removed in 0.3."""

import warnings

from ctxrep.embed.ray_engine import *  # noqa: F401,F403
from ctxrep.embed.ray_engine import __all__  # noqa: F401

warnings.warn(
    "ctxrep.ray_embed moved to ctxrep.embed.ray_engine; the old path goes in 0.3", DeprecationWarning, stacklevel=2
)
