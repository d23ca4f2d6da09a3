"""The frozen-feature cache: word vectors of every layer from ctxrep.Featurizer, kept on disk by content hash.

    cache = FeatureCache(loaded, pooling="mean", cache_dir=None)   # one per fit / predict call
    store = cache(texts, pairs)                                     # FeatureStore; cache.hits counts reads

The folder name is a SHA-256 of the model identity (its folder and the size and mtime of its files), the
layer choice, the pooling and every word. Files: features.npy (words, layers, dim) float32, offsets.npy,
meta.json (written last, so a half-written folder is never read). A cold and a warm cache hand back the same
memory-mapped file, so training reads the same numbers either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ctxrep.models.loading import LoadedEncoder, ModelSource

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return Path(os.environ.get("CTXREP_CACHE", Path.home() / ".cache" / "ctxrep")) / "features"


def model_identity(source: ModelSource) -> dict:
    """What identifies a model's weights: its folder plus the size and mtime of its files."""
    folder = source.folder
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {"path": str(folder.resolve()), "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]}


@dataclass
class FeatureStore:
    """Word vectors of every layer for a list of texts, memory-mapped from a cache folder."""

    features: np.ndarray  # (total words, layers, dim) float32, memory-mapped
    offsets: np.ndarray  # (texts + 1,) start of each text's words
    folder: Path
    hit: bool  # True when read from the cache without running the encoder

    def __getitem__(self, i: int) -> np.ndarray:
        return self.features[self.offsets[i] : self.offsets[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1


def cached_features(
    loaded: LoadedEncoder,
    texts: Sequence[Sequence[str]],
    pairs: Sequence[Sequence[str]] | None,
    pooling: str,
    cache_dir: str | os.PathLike | None,
    progress: bool = False,
    chunk: int = 1024,
) -> FeatureStore:
    """Featurize (texts[, pairs]) with layers="all" once; later calls with the same content read the cache."""
    h = hashlib.sha256()
    h.update(json.dumps({"model": model_identity(loaded.source), "layers": "all", "pooling": pooling}).encode())
    for i, words in enumerate(texts):
        h.update("\x1f".join(words).encode() + b"\x1e")
        if pairs is not None:
            h.update(b"\x1d" + "\x1f".join(pairs[i]).encode() + b"\x1e")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = folder / h.hexdigest()[:32]
    if (folder / "meta.json").is_file():
        logger.info("frozen features: cache hit %s", folder)
        return _read(folder, hit=True)

    featurizer = _featurizer(loaded, pooling)
    counts = [len(t) + (len(pairs[i]) if pairs is not None else 0) for i, t in enumerate(texts)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    n_layers = featurizer.num_layers + 1
    features = np.lib.format.open_memmap(
        folder / "features.npy", mode="w+", dtype=np.float32, shape=(int(offsets[-1]), n_layers, featurizer.dim)
    )
    bar = tqdm(total=len(texts), unit="text", desc="featurize", disable=not progress)
    for start in range(0, len(texts), chunk):
        part = list(texts[start : start + chunk])
        part_pairs = list(pairs[start : start + chunk]) if pairs is not None else None
        for k, array in enumerate(featurizer.embed_words(part, part_pairs)):
            features[offsets[start + k] : offsets[start + k + 1]] = array
        bar.update(len(part))
    bar.close()
    features.flush()
    del features
    np.save(folder / "offsets.npy", offsets, allow_pickle=False)
    meta = {
        "model": loaded.source.name,
        "layers": "all",
        "pooling": pooling,
        "texts": len(texts),
        "pairs": pairs is not None,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return _read(folder, hit=False)


def _read(folder: Path, hit: bool) -> FeatureStore:
    features = np.load(folder / "features.npy", mmap_mode="r", allow_pickle=False)
    offsets = np.load(folder / "offsets.npy", allow_pickle=False)
    return FeatureStore(features, offsets, folder, hit=hit)


def _featurizer(loaded: LoadedEncoder, pooling: str):
    """A Featurizer on the already-loaded encoder. A word-level tokenizer numbers words as it goes, so the
    featurizer gets its own: the estimator's is left as it was."""
    from ctxrep.featurize import Featurizer
    from ctxrep.tokenize import WordTokenizer

    tokenizer = loaded.tokenizer
    if tokenizer.word_level:
        tokenizer = WordTokenizer(max_characters_per_token=tokenizer.max_characters_per_token)
    return Featurizer(LoadedEncoder(loaded.model, tokenizer, loaded.source), layers="all", pooling=pooling)


class FeatureCache:
    """cached_features for one encoder and pooling; `hits` counts the calls answered from the cache."""

    def __init__(
        self, loaded: LoadedEncoder, pooling: str, cache_dir: str | os.PathLike | None, progress: bool = False
    ) -> None:
        self.loaded = loaded
        self.pooling = pooling
        self.cache_dir = cache_dir
        self.progress = progress
        self.hits = 0

    def __call__(self, texts: Sequence[Sequence[str]], pairs: Sequence[Sequence[str]] | None = None) -> FeatureStore:
        store = cached_features(self.loaded, texts, pairs, self.pooling, self.cache_dir, self.progress)
        self.hits += int(store.hit)
        return store
