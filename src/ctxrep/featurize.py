"""Contextual word and sentence vectors from any layer (or mix of layers) of an encoder.

Pipeline for a list of texts:
  1. split into words (whitespace for strings; word lists are taken as given) and into subword pieces,
     keeping each piece's word index (`word_ids`);
  2. cut texts longer than the model's positions into overlapping windows on word boundaries; every word
     is assigned to the one window where it has the most context on its poorer side;
  3. sort all windows by length and run them in batches under a token budget;
  4. pool each word's pieces (first / last / mean / first_last) from the chosen layers, in input order.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ctxrep.models.loading import elmo_folder, load_model, resolve_model_path
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.tokenize import Tokenizer, WordPieces, WordTokenizer

Text = str | Sequence[str]
POOLINGS = ("first", "last", "mean", "first_last")
SENTENCE_POOLINGS = ("mean", "cls")


@dataclass
class Alignment:
    """How one text was split: its words, its subword pieces, and each piece's word index."""

    words: list[str]
    tokens: list[str]
    word_ids: list[int]


@dataclass
class _Window:
    """One encoder input: a piece range of one text (or a whole pair) and the words it is responsible for."""

    text: int
    input_ids: list[int]
    token_type_ids: list[int]
    # (output word index, first piece position, last piece position + 1), positions within input_ids
    words: list[tuple[int, int, int]]
    cls_position: int


class Featurizer:
    """Turn texts into contextual vectors.

    layers: an index (negative counts from the top; 0 is the embedding output), a list of indices,
        "all" (every layer, embedding output first), "mix" (the plain average of all layers), or a
        `ScalarMix` over all num_layers + 1 layers (e.g. `ScalarMix.from_weights([...])`).
    pooling: how a word's subword pieces become one vector: "first", "last", "mean" or "first_last"
        (the first and last piece concatenated, 2 x hidden wide). A word's leading piece that is only a
        word-start marker ("▁" or "Ġ") is left out when the word has other pieces: it is the same for every such word.
    sentence_pooling: "mean" (over the text's word vectors) or "cls" (the classification token).
    stride: how many pieces each window of a long text advances (default: half a window).
    batch_tokens: the token budget of one batch (padded batch size x longest sequence).
    """

    def __init__(
        self,
        model: str | os.PathLike = "minilm",
        layers: int | Sequence[int] | str | ScalarMix = -1,
        pooling: str = "mean",
        sentence_pooling: str = "mean",
        stride: int | None = None,
        max_length: int | None = None,
        batch_tokens: int = 2048,
        num_threads: int | None = None,
        progress: bool = False,
    ) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if sentence_pooling not in SENTENCE_POOLINGS:
            raise ValueError(f"sentence_pooling must be one of {SENTENCE_POOLINGS}, got {sentence_pooling!r}")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model = load_model(model)
        self._packed: tuple[torch.nn.Module, torch.nn.Module] | None = None  # (model, its inference copy)
        # ELMo reads whole words (characters); every other family reads subword pieces.
        self.word_level = elmo_folder(model) is not None
        self.tokenizer = WordTokenizer() if self.word_level else Tokenizer.from_model_dir(resolve_model_path(model))
        if self.word_level and sentence_pooling == "cls":
            raise ValueError("ELMo has no classification token: use sentence_pooling='mean'")
        self.pooling = pooling
        self.sentence_pooling = sentence_pooling
        self.batch_tokens = batch_tokens
        self.progress = progress
        limit = max_tokens(self.model)
        self.max_length = min(max_length or limit, limit)
        self.window_size = self.max_length - self.tokenizer.template.num_special(pair=False)
        if self.window_size < 2:
            raise ValueError(f"max_length={self.max_length} leaves no room for text between the special tokens")
        self.stride = stride if stride is not None else max(1, self.window_size // 2)
        if not 1 <= self.stride <= self.window_size:
            raise ValueError(f"stride must be between 1 and the window size {self.window_size}, got {stride}")
        self.layer_indices, self.mix = self._parse_layers(layers)
        self.single_layer = isinstance(layers, int) or self.mix is not None  # one array per word, no layer axis

    @property
    def _encoder(self) -> torch.nn.Module:
        """The inference copy of `self.model` (rebuilt if `self.model` was replaced)."""
        if self._packed is None or self._packed[0] is not self.model:
            self._packed = (self.model, _prepack_for_inference(self.model))
        return self._packed[1]

    def with_layers(self, layers: int | Sequence[int] | str | ScalarMix) -> "Featurizer":
        """A copy that returns other layers, sharing the model and tokenizer (nothing is reloaded)."""
        view = copy.copy(self)
        view.layer_indices, view.mix = view._parse_layers(layers)
        view.single_layer = isinstance(layers, int) or view.mix is not None
        return view

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def dim(self) -> int:
        """Width of one word vector."""
        return self.model.hidden_size * (2 if self.pooling == "first_last" else 1)

    def _parse_layers(self, layers) -> tuple[list[int], ScalarMix | None]:
        n = self.model.num_layers + 1  # embedding output + every layer
        if isinstance(layers, ScalarMix):
            if layers.num_layers != n:
                raise ValueError(f"the ScalarMix mixes {layers.num_layers} layers but the model has {n} (with layer 0)")
            return list(range(n)), layers
        if isinstance(layers, str):
            if layers == "all":
                return list(range(n)), None
            if layers == "mix":
                return list(range(n)), ScalarMix(n, trainable=False)
            raise ValueError(f"layers must be an int, a list of ints, 'all', 'mix' or a ScalarMix, got {layers!r}")
        indices = [layers] if isinstance(layers, int) else list(layers)
        if not indices:
            raise ValueError("layers is an empty list")
        out = []
        for i in indices:
            if not isinstance(i, int) or not -n <= i < n:
                raise ValueError(f"layer {i!r} is out of range: the model has layers 0..{n - 1} (0 = embeddings)")
            out.append(i % n)
        return out, None

    # ---- input handling -------------------------------------------------------------------------

    @staticmethod
    def _words(text: Text, index: int) -> list[str]:
        if isinstance(text, str):
            words = text.split()
        elif isinstance(text, Sequence) and all(isinstance(w, str) for w in text):
            words = list(text)
            for j, w in enumerate(words):
                if not w or w.isspace():
                    raise ValueError(f"text {index}: word {j} is empty or whitespace; remove it from the word list")
        else:
            raise TypeError(f"text {index}: expected a string or a list of word strings, got {type(text).__name__}")
        if not words:
            raise ValueError(f"text {index} is empty (no words); remove it or give it some text")
        return words

    def tokenize(self, texts: Sequence[Text]) -> list[Alignment]:
        """The words, subword tokens and `word_ids` of each text (no special tokens)."""
        words = [self._words(t, i) for i, t in enumerate(_as_list(texts))]
        pieces = self.tokenizer.encode_words(words)
        return [Alignment(w, p.tokens, p.word_ids) for w, p in zip(words, pieces)]

    def _windows(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None) -> tuple[list[_Window], list[int]]:
        texts = _as_list(texts)
        if self.word_level:
            self.tokenizer.reset()  # number only this call's words: memory stays bounded over a corpus
        words_a = [self._words(t, i) for i, t in enumerate(texts)]
        if text_pairs is None:
            pieces = self.tokenizer.encode_words(words_a)
            windows = [w for i, p in enumerate(pieces) for w in self._split_long(i, p)]
            return windows, [len(w) for w in words_a]
        text_pairs = _as_list(text_pairs)
        if len(text_pairs) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(text_pairs)} text_pairs; give one pair text per text")
        words_b = [self._words(t, i) for i, t in enumerate(text_pairs)]
        pieces = self.tokenizer.encode_words(words_a + words_b)
        windows, counts = [], []
        for i in range(len(texts)):
            a, b = pieces[i], pieces[len(texts) + i]
            ids, types, offset = self.tokenizer.build_inputs(a.ids, b.ids)
            if len(ids) > self.max_length:
                raise ValueError(
                    f"pair {i} is {len(ids)} tokens long, more than the model's {self.max_length}; sentence pairs are "
                    "not windowed: shorten the texts or embed them separately"
                )
            offset_b = offset + len(a.ids) + len(self.tokenizer.template.middle)
            spans = [(w, offset + s, offset + e) for w, (s, e) in enumerate(a.pooling_spans())]
            spans += [(a.num_words + w, offset_b + s, offset_b + e) for w, (s, e) in enumerate(b.pooling_spans())]
            windows.append(_Window(i, ids, types, spans, self._cls_position(len(ids))))
            counts.append(a.num_words + b.num_words)
        return windows, counts

    def _cls_position(self, length: int) -> int:
        return self.tokenizer.template.cls_index % length

    def _split_long(self, text: int, pieces: WordPieces) -> list[_Window]:
        """Windows of at most window_size pieces, starting on word boundaries, about `stride` pieces apart."""
        spans = pieces.spans()
        for w, (s, e) in enumerate(spans):
            if e - s > self.window_size:
                warnings.warn(
                    f"text {text}: word {w} has {e - s} subword pieces, more than a window ({self.window_size}); "
                    f"its vector is pooled from the first {self.window_size} pieces",
                    stacklevel=3,
                )
        pool = pieces.pooling_spans()
        windows = []
        for p0, p1, owned in split_windows(spans, self.window_size, self.stride):
            ids, types, offset = self.tokenizer.build_inputs(pieces.ids[p0:p1])
            words = [(w, offset + pool[w][0] - p0, offset + min(pool[w][1], p1) - p0) for w in owned]
            windows.append(_Window(text, ids, types, words, self._cls_position(len(ids))))
        return windows

    # ---- running the encoder --------------------------------------------------------------------

    def _run(self, windows: list[_Window], word_counts: list[int], want_words: bool, want_cls: bool):
        """Encode all windows; returns per-text word arrays and per-text mean CLS vectors (as requested)."""
        n_out = 1 if self.single_layer else len(self.layer_indices)
        word_out = [np.zeros((c, n_out, self.dim), dtype=np.float32) for c in word_counts] if want_words else None
        cls_sum = np.zeros((len(word_counts), n_out, self.model.hidden_size), dtype=np.float32) if want_cls else None
        cls_count = np.zeros(len(word_counts), dtype=np.int64)
        top = max(self.layer_indices)
        pad = self.tokenizer.pad_token_id
        order = sorted(range(len(windows)), key=lambda i: len(windows[i].input_ids))
        batches = _token_budget_batches([len(windows[i].input_ids) for i in order], self.batch_tokens)
        bar = tqdm(total=sum(len(w.input_ids) for w in windows), unit="tok", disable=not self.progress, desc="embed")
        char_table = (
            self.tokenizer.char_table(self.model.config.max_characters_per_token) if self.word_level else None
        )
        self.model.eval()
        with torch.inference_mode():
            start = 0
            for size in batches:
                batch = [windows[i] for i in order[start : start + size]]
                start += size
                inputs = pad_inputs(batch, pad)
                input_ids, token_type_ids, attention_mask = (
                    inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"]
                )  # fmt: skip
                if self.word_level:  # ELMo: each id is a word of this call; look up its characters
                    out = self._encoder(char_table[input_ids])
                else:
                    out = self._encoder(
                        input_ids,
                        attention_mask=attention_mask,
                        token_type_ids=token_type_ids if uses_segments(self.model) else None,
                        output_hidden_states=True,
                        num_layers=top if top < self.model.num_layers else None,
                    )
                selected = torch.stack([out.hidden_states[i] for i in self.layer_indices])  # (layers, batch, seq, hidden)
                if self.mix is not None:
                    selected = self.mix(selected).unsqueeze(0)  # (1, batch, seq, hidden)
                if want_words:
                    self._pool_words(selected, batch, word_out)
                if want_cls:
                    for r, w in enumerate(batch):
                        cls_sum[w.text] += selected[:, r, w.cls_position].numpy()
                        cls_count[w.text] += 1
                bar.update(int(attention_mask.sum()))
        bar.close()
        cls = cls_sum / cls_count[:, None, None] if want_cls else None
        return word_out, cls

    def _pool_words(self, selected: torch.Tensor, batch: list[_Window], word_out: list[np.ndarray]) -> None:
        """Pool each word's pieces; selected: (layers, batch, seq, hidden)."""
        n_layers, b, t, h = selected.shape
        flat = selected.permute(1, 2, 0, 3).reshape(b * t, n_layers, h)  # (batch*seq, layers, hidden)
        targets = [(w.text, word) for w in batch for word, _, _ in w.words]
        firsts = [r * t + s for r, w in enumerate(batch) for _, s, _ in w.words]
        lasts = [r * t + e - 1 for r, w in enumerate(batch) for _, _, e in w.words]
        if not targets:
            return
        if self.pooling == "first":
            vectors = flat[firsts]
        elif self.pooling == "last":
            vectors = flat[lasts]
        elif self.pooling == "first_last":
            vectors = torch.cat([flat[firsts], flat[lasts]], dim=-1)
        else:  # mean: sum each word's pieces with index_add, then divide by the piece count
            token_rows, slots = [], []
            for k, (s, e) in enumerate(zip(firsts, lasts)):
                token_rows.extend(range(s, e + 1))
                slots.extend([k] * (e + 1 - s))
            sums = torch.zeros(len(targets), n_layers, h).index_add_(0, torch.tensor(slots), flat[token_rows])
            counts = torch.tensor([e + 1 - s for s, e in zip(firsts, lasts)], dtype=sums.dtype)
            vectors = sums / counts[:, None, None]
        vectors = vectors.numpy()
        for k, (text, word) in enumerate(targets):
            word_out[text][word] = vectors[k]

    # ---- public API -----------------------------------------------------------------------------

    def embed_words(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None = None) -> list[np.ndarray]:
        """One float32 array per text: (n_words, dim) for one layer or a mix, (n_words, n_layers, dim) otherwise.

        With `text_pairs`, text i is encoded together with text_pairs[i] ([CLS] A [SEP] B [SEP]) and its
        array holds A's words, then B's.
        """
        windows, counts = self._windows(texts, text_pairs)
        words, _ = self._run(windows, counts, want_words=True, want_cls=False)
        return [w[:, 0] if self.single_layer else w for w in words]

    def embed_sentences(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None = None) -> np.ndarray:
        """(n_texts, dim) for one layer or a mix, (n_texts, n_layers, dim) otherwise.

        "mean" averages the text's word vectors; "cls" takes the classification token (for a text longer than
        one window, the average over its windows).
        """
        windows, counts = self._windows(texts, text_pairs)
        if self.sentence_pooling == "cls":
            _, cls = self._run(windows, counts, want_words=False, want_cls=True)
            out = cls
        else:
            words, _ = self._run(windows, counts, want_words=True, want_cls=False)
            out = np.stack([w.mean(axis=0) for w in words]) if words else np.zeros((0, 1, self.dim), np.float32)
        return out[:, 0] if self.single_layer else out


def pad_inputs(rows: Sequence, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows that have .input_ids and .token_type_ids: input_ids, token_type_ids, attention_mask
    (batch, longest)."""
    length = max(len(r.input_ids) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(rows), length), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        input_ids[i, :n] = torch.tensor(r.input_ids)
        token_type_ids[i, :n] = torch.tensor(r.token_type_ids)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def uses_segments(model: torch.nn.Module) -> bool:
    """Whether the model reads token_type_ids as segments. GPT-2 would add them as extra *token* embeddings."""
    from ctxrep.models.gpt2 import GPT2Model

    return not isinstance(model, GPT2Model)


def max_tokens(model: torch.nn.Module) -> int:
    """The longest input one window may have."""
    config = model.config
    if hasattr(config, "max_tokens"):  # BERT family: the position table (minus RoBERTa's offset)
        return config.max_tokens
    if hasattr(config, "n_positions"):  # GPT-2
        return config.n_positions
    # XLNet's relative positions and ELMo's LSTMs have no limit; windows keep memory bounded.
    return 512 if getattr(config, "model_type", None) == "xlnet" else 4096


def _prepack_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose linear layers run through oneDNN with pre-packed weights.

    Same results (to ~1e-6) and, on the CPUs measured here, 1.4-2x the speed of the default BLAS path for the
    matrix shapes of featurization. Inference only: `self.model` stays the ordinary module.
    """
    if not torch.backends.mkldnn.is_available() or any(p.device.type != "cpu" for p in model.parameters()):
        return model
    if not hasattr(model.config, "max_tokens"):  # measured for the BERT family only
        return model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.utils.mkldnn builds TorchScript modules
        try:
            from torch.utils import mkldnn

            return mkldnn.to_mkldnn(copy.deepcopy(model))
        except (RuntimeError, AttributeError):  # a torch build without a usable oneDNN path
            return model


def _as_list(texts) -> list:
    if isinstance(texts, str):
        raise TypeError("expected a list of texts, got a single string; wrap it in a list: [text]")
    return list(texts)


def window_words(spans: list[tuple[int, int]], window: int, stride: int) -> list[tuple[int, int]]:
    """(first word, last word + 1) of each window: as many whole words as fit in `window` pieces; the next
    window starts at the first word at least `stride` pieces further on (never past the previous window's end,
    so no word is left out), until a window reaches the last word."""
    out = []
    first = 0
    while True:
        end = first + 1
        while end < len(spans) and spans[end][1] - spans[first][0] <= window:
            end += 1
        out.append((first, end))
        if end == len(spans):
            return out
        nxt = first + 1
        while nxt < end and spans[nxt][0] < spans[first][0] + stride:
            nxt += 1
        first = nxt


def split_windows(spans: list[tuple[int, int]], size: int, stride: int) -> list[tuple[int, int, list[int]]]:
    """(first piece, last piece + 1, the words it owns) of each window over one text (see window_words). Each word
    is owned by the window where min(left context, right context) is largest. A word longer than a whole window
    is cut to the window's `size` pieces."""
    bounds = [(w0, w1, spans[w0][0], min(spans[w1 - 1][1], spans[w0][0] + size))
              for w0, w1 in window_words(spans, size, stride)]  # fmt: skip
    owner, best = [-1] * len(spans), [-1] * len(spans)
    for k, (w0, w1, p0, p1) in enumerate(bounds):
        for w in range(w0, w1):
            context = min(spans[w][0] - p0, p1 - spans[w][1])
            if context > best[w]:
                best[w], owner[w] = context, k
    return [(p0, p1, [w for w in range(w0, w1) if owner[w] == k]) for k, (w0, w1, p0, p1) in enumerate(bounds)]


def _token_budget_batches(lengths: list[int], budget: int) -> list[int]:
    """Sizes of consecutive batches over length-sorted sequences so that size x longest <= budget."""
    sizes, size, longest = [], 0, 0
    for n in lengths:
        if size and max(longest, n) * (size + 1) > budget:
            sizes.append(size)
            size, longest = 0, 0
        size += 1
        longest = max(longest, n)
    if size:
        sizes.append(size)
    return sizes
