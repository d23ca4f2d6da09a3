"""Tokenizer files as the Hugging Face Hub ships them, read into one `tokenizers.Tokenizer`.

Most repositories carry tokenizer.json, which `tokenizers` reads directly. Older ones carry only a SentencePiece
model, whatever their family calls it:

    sentencepiece.bpe.model   XLM-RoBERTa, CamemBERT (a unigram model despite the name)
    spiece.model              T5, ALBERT, XLNet
    spm.model                 DeBERTa-v2 / v3

Such a file is converted once by transformers' own tokenizer classes (which run transformers' converters,
`transformers.convert_slow_tokenizer`: the piece vocabulary and scores read through protobuf, the model's
special tokens and template, its normaliser) and the result is cached as tokenizer.json under
$CTXREP_CACHE/tokenizers/KEY/, KEY a hash of the SentencePiece file, the folder's tokenizer settings and the
transformers version; later loads read the cached file and need neither transformers nor sentencepiece.

Word ids: ctxrep encodes pre-split words (`is_pretokenized=True`), and `tokenizers` runs the Metaspace
pre-tokenizer on each word as its own text, so every word gets the "▁" it carries in running text (with
prepend_scheme "always" and "first" alike) and its pieces are those of running text; tests/test_tokenizer_files.py
checks ids and word ids against transformers' tokenizers on raw text.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from importlib import metadata
from pathlib import Path

import tokenizers

# The SentencePiece file names, in the order they are looked for.
SENTENCEPIECE_FILES = ("sentencepiece.bpe.model", "spiece.model", "spm.model")
# Files beside it that change what transformers builds (special tokens, lower-casing, extra ids): part of the key.
SETTINGS_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "config.json")
TOKENIZER_JSON = "tokenizer.json"
# Every file a tokenizer may be stored in, as the Hub ships them: what a download fetches and what a tool copies
# beside a model it writes (a pruned or distilled encoder keeps its tokenizer). The one list of them.
TOKENIZER_FILES = (
    TOKENIZER_JSON,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",  # WordPiece (BERT, ELECTRA)
    "vocab.json",
    "merges.txt",  # byte-level BPE (RoBERTa, GPT-2)
    *SENTENCEPIECE_FILES,  # XLM-RoBERTa, CamemBERT; T5, ALBERT, XLNet; DeBERTa-v2/v3
    "source.spm",
    "target.spm",  # SentencePiece (Marian)
)


class TokenizerFileError(ValueError):
    """A tokenizer folder that cannot be read or converted, with what to do."""


def sentencepiece_file(folder: str | Path) -> Path | None:
    """The folder's SentencePiece model (see SENTENCEPIECE_FILES), or None."""
    folder = Path(folder)
    return next((folder / f for f in SENTENCEPIECE_FILES if (folder / f).is_file()), None)


def has_tokenizer_files(folder: str | Path) -> bool:
    """Whether `load_backend` finds something to read in `folder` (tokenizer.json or a SentencePiece model)."""
    return (Path(folder) / TOKENIZER_JSON).is_file() or sentencepiece_file(folder) is not None


def load_backend(folder: str | Path) -> tokenizers.Tokenizer | None:
    """tokenizer.json if the folder has one; else its SentencePiece model converted (once, then cached); else None
    (the caller reads vocab.txt or vocab.json + merges.txt itself)."""
    folder = Path(folder)
    if (folder / TOKENIZER_JSON).is_file():
        try:
            return tokenizers.Tokenizer.from_file(str(folder / TOKENIZER_JSON))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise TokenizerFileError(f"{folder / TOKENIZER_JSON}: cannot load tokenizer ({e})") from e
    spm = sentencepiece_file(folder)
    if spm is None:
        return None
    cached = cache_dir() / conversion_key(folder, spm) / TOKENIZER_JSON
    if not cached.is_file():
        backend = convert_sentencepiece(folder)
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cached.parent, suffix=".part", delete=False) as tmp:
            tmp.write(backend.to_str())
        os.replace(tmp.name, cached)  # a finished file or none: two processes may race, both write the same
    return tokenizers.Tokenizer.from_file(str(cached))


def cache_dir() -> Path:
    """$CTXREP_CACHE/tokenizers (~/.cache/ctxrep/tokenizers by default)."""
    from ctxrep.util.files import ctxrep_cache

    return ctxrep_cache() / "tokenizers"


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "none"


def conversion_key(folder: Path, spm: Path) -> str:
    """Hash of what the conversion reads: the SentencePiece file, the settings files, the transformers version."""
    h = hashlib.sha256()
    for file in (spm, *(folder / f for f in SETTINGS_FILES)):
        h.update(file.name.encode() + b"\0")
        h.update(file.read_bytes() if file.is_file() else b"(absent)")
        h.update(b"\0")
    h.update(_transformers_version().encode())
    return h.hexdigest()[:32]


def convert_sentencepiece(folder: str | Path) -> tokenizers.Tokenizer:
    """The folder's SentencePiece model as transformers' fast tokenizer for the folder's model type builds it."""
    folder = Path(folder)
    spm = sentencepiece_file(folder)
    if spm is None:
        raise TokenizerFileError(f"{folder}: no SentencePiece model ({', '.join(SENTENCEPIECE_FILES)})")
    try:
        import transformers
    except ImportError:
        raise TokenizerFileError(
            f"{folder}: the tokenizer is a SentencePiece model ({spm.name}) without tokenizer.json; converting it once "
            "needs transformers (its converters): pip install transformers sentencepiece protobuf. The result is "
            "cached, so later loads do without"
        ) from None
    try:
        fast = transformers.AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    except Exception as e:  # transformers raises many types for a folder it cannot read
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenizerFileError(
            f"{folder}: cannot convert {spm.name} to a tokenizers tokenizer with transformers ({type(e).__name__}: "
            f"{reason}); check that config.json or tokenizer_config.json names the model's tokenizer"
        ) from e
    backend = getattr(fast, "backend_tokenizer", None)
    if not isinstance(backend, tokenizers.Tokenizer):
        raise TokenizerFileError(
            f"{folder}: transformers built a {type(fast).__name__} for {spm.name}, which has no tokenizers backend; "
            "save the tokenizer as tokenizer.json with a transformers version that converts it"
        )
    return tokenizers.Tokenizer.from_str(backend.to_str())  # a copy: transformers keeps using its own
