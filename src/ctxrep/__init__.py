"""ctxrep: contextual word representations in one PyTorch codebase.

`import ctxrep` is cheap: torch and tokenizers are imported on first use of these names.
"""

__all__ = [
    "load_model",
    "load_encoder",
    "load_vectors",
    "Featurizer",
    "ScalarMix",
    "SequenceRegressor",
    "similarity",
    "SentenceIndex",
    "open_store",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "load_model":
        from ctxrep.models.loading import load_model

        return load_model
    if name == "load_encoder":
        from ctxrep.models.loading import load_encoder

        return load_encoder
    if name == "load_vectors":
        from ctxrep.vectors.store import load_vectors

        return load_vectors
    if name == "Featurizer":
        from ctxrep.featurize import Featurizer

        return Featurizer
    if name == "ScalarMix":
        from ctxrep.modules.scalar_mix import ScalarMix

        return ScalarMix
    if name == "SequenceRegressor":
        from ctxrep.tasks.regressor import SequenceRegressor

        return SequenceRegressor
    if name == "similarity":
        from ctxrep.vectors.similarity import similarity

        return similarity
    if name == "SentenceIndex":
        from ctxrep.vectors.index import SentenceIndex

        return SentenceIndex
    if name == "open_store":
        from ctxrep.stores import open_store

        return open_store
    raise AttributeError(f"module 'ctxrep' has no attribute {name!r}")
