"""ctxrep: contextual word representations in one PyTorch codebase."""

from ctxrep.models.loading import load_model
from ctxrep.modules.scalar_mix import ScalarMix

__all__ = ["load_model", "ScalarMix", "Featurizer"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Featurizer pulls in the tokenizers library; import it on first use.
    if name == "Featurizer":
        from ctxrep.featurize import Featurizer

        return Featurizer
    raise AttributeError(f"module 'ctxrep' has no attribute {name!r}")
