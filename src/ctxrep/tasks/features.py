"""The frozen-feature cache: word vectors of every layer from ctxrep.Featurizer, kept on disk per text.

    cache = FeatureCache(loaded, pooling="mean", cache_dir=None)   # one per fit / predict call
    store = cache(texts, pairs)                                     # FeatureStore; cache.hits counts reads

Keys are per text: SHA-256 of the text's words (and its pair's). A call featurizes only the texts whose keys no
earlier call wrote, so cross-validation, a grid search or a dev set that shares texts with the training set
featurizes each text once, not once per fold. Layout:

    CACHE/<space>/            space = SHA-256 of the model identity (its folder and the size and mtime of its
                              files), the layer choice ("all") and the pooling
      <shard>/                one per call that featurized something: features.npy (words, layers, dim) float32,
                              offsets.npy (texts + 1,), keys.txt (one key per line), meta.json (written last, so a
                              half-written shard is never read)

A text's vectors are read memory-mapped from the shard that holds it, so a cold and a warm cache hand training the
same numbers (the featurizer's output does not depend on which texts share its batches).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctxrep.models.loading import LoadedEncoder, ModelSource

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return Path(os.environ.get("CTXREP_CACHE", Path.home() / ".cache" / "ctxrep")) / "features"


def model_identity(source: ModelSource) -> dict:
    """What identifies a model's weights: its folder plus the size and mtime of its files."""
    folder = source.folder
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {"path": str(folder.resolve()), "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]}


def text_key(words: Sequence[str], pair: Sequence[str] | None = None) -> str:
    """The cache key of one text (or pair): SHA-256 of its words, unit separator between words."""
    h = hashlib.sha256("\x1f".join(words).encode())
    if pair is not None:
        h.update(b"\x1d" + "\x1f".join(pair).encode())
    return h.hexdigest()


@dataclass
class FeatureStore:
    """Word vectors of every layer for a list of texts: store[i] is (words, layers, dim) float32, memory-mapped."""

    arrays: list[np.ndarray]
    folder: Path  # the cache space the texts were read from
    hit: bool  # True when every text came from the cache without running the encoder

    def __getitem__(self, i: int) -> np.ndarray:
        return self.arrays[i]

    def __len__(self) -> int:
        return len(self.arrays)


class _Shard:
    """One shard folder, memory-mapped: the vectors of the texts one call featurized."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.features = np.load(folder / "features.npy", mmap_mode="r", allow_pickle=False)
        self.offsets = np.load(folder / "offsets.npy", allow_pickle=False)
        self.keys = (folder / "keys.txt").read_text().split()

    def __getitem__(self, i: int) -> np.ndarray:
        return self.features[self.offsets[i] : self.offsets[i + 1]]


def _space(loaded: LoadedEncoder, pooling: str, cache_dir: str | os.PathLike | None) -> Path:
    h = hashlib.sha256(
        json.dumps({"model": model_identity(loaded.source), "layers": "all", "pooling": pooling}).encode()
    )
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / h.hexdigest()[:32]


def _index(space: Path, known: dict[str, tuple[_Shard, int]], seen: set[str]) -> None:
    """Add the complete shards of `space` not read yet to `known` (key -> (shard, position))."""
    if not space.is_dir():
        return
    for folder in sorted(space.iterdir()):
        if folder.name in seen or not (folder / "meta.json").is_file():
            continue
        shard = _Shard(folder)
        seen.add(folder.name)
        for i, key in enumerate(shard.keys):
            known.setdefault(key, (shard, i))


def _write_shard(
    space: Path,
    featurizer,
    texts: list[Sequence[str]],
    pairs: list[Sequence[str]] | None,
    keys: list[str],
    progress: bool | str,
    chunk: int,
) -> Path:
    """Featurize texts[, pairs] into a new shard of `space`; meta.json is written last."""
    from ctxrep.util.progress import progress_from

    counts = [len(t) + (len(pairs[i]) if pairs is not None else 0) for i, t in enumerate(texts)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    folder = space / f"shard-{secrets.token_hex(8)}"
    folder.mkdir(parents=True, exist_ok=False)
    features = np.lib.format.open_memmap(
        folder / "features.npy",
        mode="w+",
        dtype=np.float32,
        shape=(int(offsets[-1]), featurizer.num_layers + 1, featurizer.dim),
    )
    bar = progress_from(progress, total=len(texts), desc="featurize (frozen features)", unit="texts")
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
    (folder / "keys.txt").write_text("".join(k + "\n" for k in keys))
    (folder / "meta.json").write_text(json.dumps({"texts": len(texts), "pairs": pairs is not None}, indent=2) + "\n")
    return folder


def _featurizer(loaded: LoadedEncoder, pooling: str):
    """A Featurizer on the already-loaded encoder. A word-level tokenizer numbers words as it goes, so the
    featurizer gets its own: the estimator's is left as it was."""
    from ctxrep.featurize import Featurizer
    from ctxrep.text.tokenizer import WordTokenizer

    tokenizer = loaded.tokenizer
    if tokenizer.word_level:
        tokenizer = WordTokenizer(max_characters_per_token=tokenizer.max_characters_per_token)
    return Featurizer(LoadedEncoder(loaded.model, tokenizer, loaded.source), layers="all", pooling=pooling)


class FeatureCache:
    """Frozen features for one encoder and pooling, cached per text; `hits` counts the calls answered wholly from
    the cache, `featurized` the texts this object sent to the encoder."""

    def __init__(
        self,
        loaded: LoadedEncoder,
        pooling: str,
        cache_dir: str | os.PathLike | None,
        progress: bool | str = False,
        chunk: int = 1024,
    ) -> None:
        self.loaded = loaded
        self.pooling = pooling
        self.cache_dir = cache_dir
        self.progress = progress
        self.chunk = chunk
        self.hits = 0
        self.featurized = 0
        self._space: Path | None = None
        self._known: dict[str, tuple[_Shard, int]] = {}
        self._seen: set[str] = set()

    def __call__(self, texts: Sequence[Sequence[str]], pairs: Sequence[Sequence[str]] | None = None) -> FeatureStore:
        if self._space is None:
            self._space = _space(self.loaded, self.pooling, self.cache_dir)
        keys = [text_key(t, pairs[i] if pairs is not None else None) for i, t in enumerate(texts)]
        _index(self._space, self._known, self._seen)  # shards other calls (or processes) wrote meanwhile
        missing: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key not in self._known and key not in missing:
                missing[key] = i  # each distinct new text once
        if missing:
            rows = list(missing.values())
            folder = _write_shard(
                self._space,
                _featurizer(self.loaded, self.pooling),
                [texts[i] for i in rows],
                [pairs[i] for i in rows] if pairs is not None else None,
                list(missing),
                self.progress,
                self.chunk,
            )
            self.featurized += len(rows)
            logger.info("frozen features: %d new texts in %s", len(rows), folder)
            _index(self._space, self._known, self._seen)
        else:
            self.hits += 1
            logger.info("frozen features: cache hit (%d texts) in %s", len(texts), self._space)
        arrays = [self._known[key][0][self._known[key][1]] for key in keys]
        return FeatureStore(arrays, self._space, hit=not missing)


__all__ = ["FeatureCache", "FeatureStore", "default_cache_dir", "model_identity", "text_key"]
