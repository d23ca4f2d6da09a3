"""Deprecated import path: `ctxrep.vectors.spec` is `ctxrep.featurize.spec` since 0.2 (the settings that decide a
vector belong to the featurizer that reads them; vectors/ sits above it); removed in 0.3."""

import warnings

from ctxrep.featurize.spec import *  # noqa: F401,F403
from ctxrep.featurize.spec import __all__, model_identity  # noqa: F401

warnings.warn(
    "ctxrep.vectors.spec moved to ctxrep.featurize.spec; the old path goes in 0.3", DeprecationWarning, stacklevel=2
)
