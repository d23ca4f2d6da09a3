"""Subword tokenization through the `tokenizers` library, with the word alignment kept.

A model folder's tokenizer.json may switch on truncation and fixed padding (MiniLM's truncates at 128
and pads to 128): `Tokenizer` always switches both off, so nothing is cut and no compute is wasted;
windowing and padding are the featurizer's job.

Special tokens are not hard-coded per model: the tokenizer's own post-processor is probed once to learn
the template ([CLS] A [SEP] B [SEP] for BERT, <s> A </s></s> B </s> for RoBERTa, A <sep> <cls> for XLNet).
"""

from __future__ import annotations

import functools
import itertools
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tokenizers

if TYPE_CHECKING:
    import torch


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded, or input it cannot encode."""


@dataclass
class SpecialTemplate:
    """Special-token ids and their token_type_ids around segment A (and B)."""

    prefix: list[int]
    prefix_types: list[int]
    middle: list[int]  # between A and B (pairs only)
    middle_types: list[int]
    suffix: list[int]
    suffix_types: list[int]
    type_a: int
    type_b: int
    single_suffix: list[int]  # after A when there is no B
    single_suffix_types: list[int]
    cls_index: int  # where the classification token sits in a single sequence: 0, or -1 (XLNet: at the end)

    def num_special(self, pair: bool) -> int:
        return len(self.prefix) + (len(self.middle) + len(self.suffix) if pair else len(self.single_suffix))

    def build_inputs(self, ids_a: list[int], ids_b: list[int] | None = None) -> tuple[list[int], list[int], int]:
        """Add special tokens: (input_ids, token_type_ids, offset of A's first piece in input_ids)."""
        if ids_b is None:
            ids = self.prefix + ids_a + self.single_suffix
            types = self.prefix_types + [self.type_a] * len(ids_a) + self.single_suffix_types
        else:
            ids = self.prefix + ids_a + self.middle + ids_b + self.suffix
            types = (
                self.prefix_types
                + [self.type_a] * len(ids_a)
                + self.middle_types
                + [self.type_b] * len(ids_b)
                + self.suffix_types
            )
        return ids, types, len(self.prefix)


WORD_START_MARKERS = ("\u2581", "\u0120")  # SentencePiece's "▁", byte-level BPE's "Ġ"


@dataclass
class WordPieces:
    """One text's subword ids (no special tokens) and, for each piece, the index of the word it came from."""

    ids: list[int]
    word_ids: list[int]
    tokens: list[str]
    num_words: int

    def spans(self) -> list[tuple[int, int]]:
        """(start, end) piece range of every word; every word has at least one piece."""
        starts = [-1] * self.num_words
        ends = [0] * self.num_words
        for i, w in enumerate(self.word_ids):
            if starts[w] < 0:
                starts[w] = i
            ends[w] = i + 1
        return list(zip(starts, ends))

    def pooling_spans(self) -> list[tuple[int, int]]:
        """spans() without a word's first piece when that piece is a bare word-start marker ("▁" alone, as a small
        SentencePiece vocabulary often splits a rare word or a symbol; "Ġ" alone in byte-level BPE, before "—" or
        "😀") and the word has other pieces: the marker is the same piece for every such word, so "first" pooling
        would read it, not the word. THE rule for such pieces: the word pooling reads these spans (featurize/rows.py
        applies the same rule to whole arrays) and `pooled_word_ids` gives those pieces no word."""
        out = []
        for s, e in self.spans():
            if e - s > 1 and self.tokens[s] in WORD_START_MARKERS:
                s += 1
            out.append((s, e))
        return out

    def pooled_word_ids(self) -> list[int | None]:
        """Each piece's word index as the word pooling reads it (`pooling_spans`): None for a bare word-start marker
        it leaves out, so that a word's first piece by these ids is the piece "first" pooling reads."""
        out: list[int | None] = [None] * len(self.word_ids)
        for w, (s, e) in enumerate(self.pooling_spans()):
            out[s:e] = [w] * (e - s)
        return out


class Tokenizer:
    """A `tokenizers.Tokenizer` with truncation and padding off, and its special-token template."""

    word_level = False  # subword pieces

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.backend = tokenizer
        self.template = _probe_template(tokenizer)
        self.unk_token = getattr(tokenizer.model, "unk_token", None)
        # Byte-level BPE without add_prefix_space (the Hub's GPT-2, RoBERTa and ModernBERT tokenizer.json): in
        # running text every word but the first carries its space ("Ġdog"); pre-split words get it back.
        self.space_before_words = _byte_level_without_prefix_space(tokenizer)

    @classmethod
    def from_model_dir(cls, path: str | Path) -> Tokenizer:
        """tokenizer.json; or a SentencePiece model (sentencepiece.bpe.model, spiece.model, spm.model: converted once
        and cached, see ctxrep.text.tokenizer_files); or vocab.txt (WordPiece, BERT) / vocab.json + merges.txt (byte-level
        BPE, RoBERTa)."""
        from ctxrep.text.tokenizer_files import TokenizerFileError, load_backend

        path = Path(path)
        try:
            backend = load_backend(path)
        except TokenizerFileError as e:
            raise TokenizerError(str(e)) from e
        if backend is not None:
            return cls(backend)
        settings = _read_json(path / "tokenizer_config.json")
        if (path / "vocab.txt").is_file():
            from tokenizers.implementations import BertWordPieceTokenizer

            tok = BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=settings.get("do_lower_case", True))
            return cls(tok._tokenizer)
        if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            from tokenizers import processors
            from tokenizers.implementations import ByteLevelBPETokenizer

            tok = ByteLevelBPETokenizer(str(path / "vocab.json"), str(path / "merges.txt"), add_prefix_space=True)
            backend = tok._tokenizer
            backend.post_processor = processors.RobertaProcessing(
                ("</s>", backend.token_to_id("</s>")), ("<s>", backend.token_to_id("<s>"))
            )
            return cls(backend)
        raise TokenizerError(
            f"{path}: no tokenizer found: expected tokenizer.json, a SentencePiece model (sentencepiece.bpe.model, "
            "spiece.model, spm.model), vocab.txt, or vocab.json + merges.txt"
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def pad_token_id(self) -> int:
        """[PAD] or <pad>, else 0; looked up once (every batch's collate reads it)."""
        for name in ("[PAD]", "<pad>"):
            i = self.backend.token_to_id(name)
            if i is not None:
                return i
        return 0

    def encode_words(self, texts: Sequence[Sequence[str]]) -> list[WordPieces]:
        """Encode pre-split words; a word that the tokenizer reduces to nothing is encoded as the unknown token."""
        encodings = self.backend.encode_batch(
            [self._as_in_text(t) for t in texts], is_pretokenized=True, add_special_tokens=False
        )
        out = []
        for i, (words, enc) in enumerate(zip(texts, encodings)):
            pieces = WordPieces(list(enc.ids), list(enc.word_ids), list(enc.tokens), len(words))
            covered = set(pieces.word_ids)
            if len(covered) < len(words):
                empty = [w for w in range(len(words)) if w not in covered]
                if self.unk_token is None:
                    raise TokenizerError(
                        f"text {i}: words {[words[w] for w in empty]!r} give no subword pieces and the tokenizer has no "
                        "unknown token to stand for them; remove or replace these words"
                    )
                warnings.warn(
                    f"text {i}: words {[words[w] for w in empty]!r} give no subword pieces; encoded as "
                    f"{self.unk_token} so that every word keeps a vector",
                    stacklevel=2,
                )
                fixed = [self.unk_token if w in empty else word for w, word in enumerate(words)]
                enc = self.backend.encode(self._as_in_text(fixed), is_pretokenized=True, add_special_tokens=False)
                pieces = WordPieces(list(enc.ids), list(enc.word_ids), list(enc.tokens), len(words))
            out.append(pieces)
        return out

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Raw strings tokenized whole, as sentence-transformers tokenizes them (no special tokens, no word
        alignment): (every text's ids end to end (int64), each text's number of ids). A text may give no ids.
        `encode_batch_fast`: the same ids without the character offsets that nothing here reads (~10% less work)."""
        encodings = self.backend.encode_batch_fast(list(texts), add_special_tokens=False)
        lengths = np.fromiter(map(len, encodings), np.int64, count=len(encodings))
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64, count=int(lengths.sum()))
        return ids, lengths

    def char_offsets(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per raw string tokenized whole (as `encode_texts`), each token's first character (int64)."""
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [np.fromiter((a for a, _ in e.offsets), np.int64, count=len(e)) for e in encodings]

    def encode_words_flat(self, texts: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pre-split words encoded as `encode_words` encodes them, as flat arrays and without its repair of a word
        that gives no pieces: (every text's ids end to end, each id's word index, each text's number of ids)."""
        words = [self._as_in_text(t) for t in texts] if self.space_before_words else texts
        encodings = self.backend.encode_batch(words, is_pretokenized=True, add_special_tokens=False)
        lengths = np.fromiter(map(len, encodings), np.int64, count=len(encodings))
        total = int(lengths.sum())
        ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64, count=total)
        word_ids = np.fromiter(itertools.chain.from_iterable(e.word_ids for e in encodings), np.int64, count=total)
        return ids, word_ids, lengths

    @property
    def word_start_ids(self) -> list[int]:
        """The ids of the bare word-start markers ("▁", "Ġ") this vocabulary has (see WordPieces.pooling_spans)."""
        found = (self.backend.token_to_id(m) for m in WORD_START_MARKERS)
        return [i for i in found if i is not None]

    def _as_in_text(self, words: Sequence[str]) -> list[str]:
        """The words as the pre-tokenizer sees them in running text: with their space where it is kept."""
        if self.space_before_words:
            return [w if j == 0 else " " + w for j, w in enumerate(words)]
        return list(words)

    def build_inputs(self, ids_a: list[int], ids_b: list[int] | None = None) -> tuple[list[int], list[int], int]:
        """Add special tokens: (input_ids, token_type_ids, offset of A's first piece in input_ids)."""
        return self.template.build_inputs(ids_a, ids_b)


class WordTokenizer:
    """For word-level models (ELMo), which read whole words: every word is its own 'piece'.

    `encode_words` numbers distinct words from 1 (0 is padding) and keeps them in `words`, so the model's
    input can be looked up per id; `char_table` gives their character ids. The numbering holds until
    `reset()` (a streaming featurizer resets per call so that memory stays bounded; a task estimator keeps
    it, so ids from separate calls can share a batch). Not thread-safe.
    """

    word_level = True

    def __init__(self, max_characters_per_token: int = 50) -> None:
        self.template = SpecialTemplate([], [], [], [], [], [], 0, 0, [], [], cls_index=-1)
        self.pad_token_id = 0
        self.max_characters_per_token = max_characters_per_token
        self.reset()

    def reset(self) -> None:
        self.words: list[str] = [""]
        self._ids: dict[str, int] = {}
        self._chars = None  # char_table's rows so far (a torch.Tensor)

    def encode_words(self, texts: Sequence[Sequence[str]]) -> list[WordPieces]:
        out = []
        for words in texts:
            ids = []
            for w in words:
                if w not in self._ids:
                    self._ids[w] = len(self.words)
                    self.words.append(w)
                ids.append(self._ids[w])
            out.append(WordPieces(ids, list(range(len(words))), list(words), len(words)))
        return out

    def build_inputs(self, ids_a: list[int], ids_b: list[int] | None = None) -> tuple[list[int], list[int], int]:
        return self.template.build_inputs(ids_a, ids_b)

    def char_table(self) -> torch.Tensor:
        """(len(words), max_characters_per_token) ELMo character ids of every word so far; row 0 (padding) is 0."""
        import torch

        from ctxrep.text.char_ids import batch_to_ids

        width = self.max_characters_per_token
        if self._chars is None or self._chars.shape[1] != width:
            self._chars = torch.zeros((1, width), dtype=torch.long)
        known = len(self._chars)
        if known < len(self.words):  # only the words added since the last call
            new = batch_to_ids([self.words[known:]], max_characters_per_token=width)[0]
            self._chars = torch.cat([self._chars, new.to(torch.long)])
        return self._chars


def _read_json(file: Path) -> dict:
    return json.loads(file.read_text()) if file.is_file() else {}


def _byte_level_without_prefix_space(tok: tokenizers.Tokenizer) -> bool:
    """Whether the pre-tokenizer is (or holds) ByteLevel with add_prefix_space off."""
    pre = json.loads(tok.to_str()).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    return any(p.get("type") == "ByteLevel" and not p.get("add_prefix_space", True) for p in steps if p)


def _probe_template(tok: tokenizers.Tokenizer) -> SpecialTemplate:
    """Learn where the post-processor puts special tokens by encoding one-word probes."""

    def layout(enc: tokenizers.Encoding, n_segments: int):
        """Specials before segment 0, between 0 and 1, after the last: lists of (id, type_id); and segment types."""
        gaps: list[list[tuple[int, int]]] = [[] for _ in range(n_segments + 1)]
        types = [0] * n_segments
        seen = -1
        for i, t, seq in zip(enc.ids, enc.type_ids, enc.sequence_ids):
            if seq is None:  # a special token
                gaps[seen + 1].append((i, t))
            else:
                seen = seq
                types[seq] = t
        return gaps, types

    single, _ = layout(tok.encode(["a"], is_pretokenized=True, add_special_tokens=True), 1)
    pair, pair_types = layout(tok.encode(["a"], ["b"], is_pretokenized=True, add_special_tokens=True), 2)

    def ids(gap):
        return [i for i, _ in gap]

    def types(gap):
        return [t for _, t in gap]

    return SpecialTemplate(
        prefix=ids(single[0]),
        prefix_types=types(single[0]),
        middle=ids(pair[1]),
        middle_types=types(pair[1]),
        suffix=ids(pair[2]),
        suffix_types=types(pair[2]),
        type_a=pair_types[0],
        type_b=pair_types[1],
        single_suffix=ids(single[1]),
        single_suffix_types=types(single[1]),
        cls_index=0 if single[0] else -1,
    )
