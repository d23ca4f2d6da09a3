"""Run ctxrep models in MTEB (Muennighoff et al. 2023): an encoder that `mteb.evaluate` accepts.

    import mteb
    from ctxrep.vectors.mteb import MTEBEncoder
    model = MTEBEncoder("minilm")                                  # a name or folder: Featurizer(..., "model" pooling
                                                                  #   for a sentence-transformers folder, else mean)
    model = MTEBEncoder(ctxrep.Featurizer("minilm", layers=4))     # any featurizer of one layer
    model = MTEBEncoder(trained_sentence_encoder)                  # ctxrep.tasks.SentenceEncoder
    results = mteb.evaluate(model, mteb.get_tasks(tasks=["STSBenchmark"]))

mteb's encoder protocol (mteb >= 2: `encode(inputs: DataLoader[batch dicts with "text"], *, task_metadata, hf_split,
hf_subset, prompt_type, **kwargs) -> array`) and the older one (`encode(sentences: list[str], **kwargs)`) are both
answered: a list of strings is embedded as it is, anything else is read batch by batch for its "text" lists. Scores
are cosine similarities (`similarity_fn_name="cosine"` in the model's metadata). mteb is imported only here (pip
install mteb); prompts and instructions are not used (ctxrep models take none).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["MTEBEncoder"]

_CLASS: list[type] = []


def _embedder(model):
    """texts -> (n, dim) float32 from a SentenceEncoder, a Featurizer, or a model name / folder."""
    from ctxrep.featurize import Featurizer

    if hasattr(model, "encode") and hasattr(model, "backbone_"):  # a fitted ctxrep.tasks.SentenceEncoder
        return model.encode, f"ctxrep/{Path(str(model.model)).name}"
    if isinstance(model, Featurizer):
        return _featurizer_embedder(model), f"ctxrep/{Path(str(model.source.name)).name}"
    return _featurizer_embedder(Featurizer(model, sentence_pooling="auto")), f"ctxrep/{Path(str(model)).name}"


def _featurizer_embedder(fz):
    def embed(texts: list[str]) -> np.ndarray:
        out = fz.embed_sentences(texts)
        if out.ndim != 2:
            raise ValueError(f"MTEB needs one vector per text; the featurizer gives {out.shape[1:]} (several layers)")
        return out

    return embed


def _texts(inputs) -> list[str]:
    if isinstance(inputs, str):
        raise TypeError("encode takes a list of sentences (or mteb's DataLoader), not a single string")
    items = list(inputs)
    if all(isinstance(t, str) for t in items):
        return items
    texts: list[str] = []
    for batch in items:
        if not isinstance(batch, dict) or "text" not in batch:
            raise TypeError(f"expected mteb batches with a 'text' field, got {type(batch).__name__}")
        texts.extend(batch["text"])
    return texts


def _encoder_class() -> type:
    """The adapter class, built on first use over mteb's AbsEncoder (so that mteb stays an optional import)."""
    if _CLASS:
        return _CLASS[0]
    try:
        from mteb.models.abs_encoder import AbsEncoder
        from mteb.models.model_meta import ModelMeta
    except ImportError as e:
        raise ImportError("MTEBEncoder needs mteb: pip install mteb") from e

    class _MTEBEncoder(AbsEncoder):
        """ctxrep sentence vectors behind mteb's encoder protocol."""

        def __init__(self, model, name: str | None = None) -> None:
            self.model = None  # AbsEncoder asks self.model for similarity(); the metadata says cosine instead
            self._embed, default_name = _embedder(model)
            self.mteb_model_meta = ModelMeta(
                name=name or default_name,
                revision="local",
                release_date=None,
                languages=None,
                loader=None,
                n_parameters=None,
                memory_usage_mb=None,
                max_tokens=None,
                embed_dim=None,
                license=None,
                open_weights=None,
                public_training_code=None,
                public_training_data=None,
                framework=["PyTorch"],
                similarity_fn_name="cosine",
                use_instructions=False,
                training_datasets=None,
                reference=None,
            )

        def encode(self, inputs, **kwargs) -> np.ndarray:
            """(n, dim) float32 vectors of a list of sentences or of mteb's DataLoader of {"text": [...]} batches."""
            texts = _texts(inputs)
            return self._embed(texts) if texts else np.zeros((0, 0), np.float32)

    _CLASS.append(_MTEBEncoder)
    return _MTEBEncoder


def MTEBEncoder(model="minilm", name: str | None = None):  # noqa: N802 (a class to its users; built lazily)
    """An mteb encoder over `model`: a fitted ctxrep.tasks.SentenceEncoder, a ctxrep.Featurizer of one layer, or a
    model name or folder. `name` is the model name MTEB records in its results (default "ctxrep/<model>")."""
    return _encoder_class()(model, name)
