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

import collections
import copy
import itertools
import os
import re
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ctxrep import runtime
from ctxrep.models.encoder import Encoder
from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import LoadedEncoder, load_encoder
from ctxrep.models.sentence_transformers import (
    TokenPooler,
    is_sentence_transformers_folder,
    prompt_positions,
    read_prompts,
    read_sentence_pooling,
    with_prompt,
)
from ctxrep.models.shards import DTYPES
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.text.inputs import (
    Rows,
    Text,
    WindowPlan,
    as_list,
    check_texts,
    split_windows,
    token_budget_batches,
    words_of,
)
from ctxrep.text.tokenizer import WordPieces
from ctxrep.util.arrays import normalize_rows
from ctxrep.util.progress import progress as show_progress
from ctxrep.vectors.spec import DEFAULT_SENTENCE_POOLING, SENTENCE_POOLINGS

POOLINGS = ("first", "last", "mean", "first_last")
# On CUDA, a call of more texts is tokenized in chunks of this many, the next one while the device runs this one.
OVERLAP_CHUNK_TEXTS = 4096


@dataclass
class Alignment:
    """How one text was split: its words, its subword pieces, and each piece's word index."""

    words: list[str]
    tokens: list[str]
    word_ids: list[int]


def auto_sentence_pooling(folder) -> str:
    """sentence_pooling="auto" for a model folder: "model" where the folder declares its own pooling (a
    sentence-transformers modules.json) that ctxrep applies; "mean" without one, or, with a warning naming why,
    where ctxrep cannot apply the declared one."""
    if folder is None or not is_sentence_transformers_folder(folder):
        return "mean"
    try:
        read_sentence_pooling(folder)
    except CheckpointError as e:
        warnings.warn(f"sentence_pooling='auto' uses the mean of the words: {e}", stacklevel=3)
        return "mean"
    return "model"


def load_dtype(backend: str, precision: str | None) -> str:
    """The dtype (load_encoder's `dtype`) in which the Featurizer loads a model given by name, for a concrete
    precision: on backend="torch" the precision's own, so that the runtime runs the loaded weights (no cast copy);
    float32 for int8 (quantized from float32) and for ONNX Runtime and OpenVINO (graphs exported from float32);
    None: "auto", the model's own default (models/shards.resolve_dtype)."""
    if backend != "torch" or precision == "int8":
        return "fp32"
    return "auto" if precision is None else precision


def precision_of(model: torch.nn.Module) -> str:
    """The precision name of the dtype `model`'s parameters are in ("fp32", "bf16", "fp16")."""
    dtype = next(model.parameters()).dtype
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"the model's parameters are {dtype}: ctxrep runs float32, bfloat16 or float16 models")
    return names[dtype]


def _checked_settings(pooling, sentence_pooling, compile, quantize, precision, backend) -> str | None:
    """Featurizer's settings checked before anything loads; returns the precision asked for (quantize="int8": "int8")."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if sentence_pooling not in SENTENCE_POOLINGS:
        raise ValueError(f"sentence_pooling must be one of {SENTENCE_POOLINGS}, got {sentence_pooling!r}")
    if compile not in (True, False, "auto"):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    if quantize is not None:  # stacklevel 3: the line that built the Featurizer
        warnings.warn("quantize='int8' is now precision='int8'", DeprecationWarning, stacklevel=3)
        precision = "int8"
    if precision is not None:
        runtime.check_precision(precision)
    runtime.runtime_class(backend).require()  # an unknown backend, or a missing package, is said here
    return precision


def _load(model, device, backend: str, precision: str | None) -> tuple[LoadedEncoder, str | None]:
    """The encoder (a LoadedEncoder as it is, else loaded by name or folder) and the precision, "auto" decided
    before loading so that the weights load in the dtype that runs (a LoadedEncoder's "auto" is decided later)."""
    if isinstance(model, LoadedEncoder):
        return model, precision
    if precision == "auto":
        where = device or torch.device("cpu")
        precision = runtime.hardware.auto_precision(where, runtime.runtime_class(backend).precisions)
    return load_encoder(model, dtype=load_dtype(backend, precision)), precision


class Featurizer:
    """Turn texts into contextual vectors.

    layers: an index (negative counts from the top; 0 is the embedding output), a list of indices,
        "all" (every layer, embedding output first), "mix" (the plain average of all layers), or a
        `ScalarMix` over all num_layers + 1 layers (e.g. `ScalarMix.from_weights([...])`).
    pooling: how a word's subword pieces become one vector: "first", "last", "mean" or "first_last"
        (the first and last piece concatenated, 2 x hidden wide). A word's leading piece that is only a
        word-start marker ("▁" or "Ġ") is left out when the word has other pieces: it is the same for every such word.
    sentence_pooling: "mean" (over the text's word vectors), "cls" (the classification token), or "model": what a
        sentence-transformers folder's modules.json says (its Pooling config, e.g. the mean over every token,
        special tokens included, then L2 normalisation when it lists Normalize; `ctxrep.models.sentence_transformers`),
        applied to each chosen layer; on a layers=-1 featurizer and a text that fits one window, the vector
        sentence-transformers gives. Nothing truncates at the folder's max_seq_length: a longer text is windowed as
        below, each of its pieces counts once, from the window that owns its word, and each window's special tokens
        count 1 / (number of windows), so the mean is over as many positions as one long sequence would have.
        A string that fits one window is tokenized whole, as sentence-transformers tokenizes it (odd spacing included).
        "auto" (the default here and in every entry point: ctxrep embed, index build, similarity, serve, mteb):
        "model" where the folder declares its own pooling that ctxrep applies, else "mean" (with a warning where a
        declared pooling cannot be applied); `auto_sentence_pooling`.
    stride: how many pieces each window of a long text advances (default: half a window).
    batch_tokens: the token budget of one batch (padded batch size x longest sequence); None: on a CPU 2,048 (1,024
        for models wider than 512), sized for the GPU's memory on CUDA (`runtime.hardware.default_batch_tokens`). Batching never changes a vector.
    compile: run the encoder under torch.compile (`ctxrep.runtime.fast.compile_encoder`): True, False, or "auto": compile
        only a call whose work (tokens x the model's FLOPs per token) repays the compilation even on the fastest
        machine of the device's kind (`fast.worth_compiling`: MiniLM from about 34M tokens on a CPU), so a one-off
        call is never slower than eager; stay eager before.
    device: where the model runs ("cpu", "cuda", "cuda:1"); None: where it is (the CPU after loading). On CUDA,
        batches go through pinned memory with non-blocking copies, and pooling of one batch overlaps the next's run.
    precision: None (default: the model as it loads: float32, except a decoder LLM's bfloat16 checkpoint, kept in
        bfloat16 where the CPU has it natively), "fp32", "bf16" / "fp16", "int8" (the backend's int8 path, CPU only),
        or "auto": the fastest precision on this hardware whose vectors keep a mean cosine >= 0.999 to float32, read
        from its description (bf16 on GPUs and on CPUs with avx512_bf16 or AMX, else fp32;
        `runtime.hardware.auto_precision`). A model given by name loads its weights in that precision's dtype (no
        cast copy; int8, ONNX Runtime and OpenVINO: float32, which they quantize or export); a LoadedEncoder runs as
        it is at "fp32" or None, in a cast copy at "bf16" / "fp16". `featurizer.precision` says what runs after
        construction (a bfloat16 model at "fp32" or None: "bf16"), and the FeaturizerSpec records it.
    backend: what runs the encoder (`ctxrep.runtime`): "torch" (every family, every precision), "onnxruntime"
        (fp32, int8) or "openvino" (fp32, bf16, fp16, int8; `pip install 'ctxrep[openvino]'`). The ONNX/OpenVINO
        graphs are exported once per model, depth and precision into $CTXREP_CACHE/graphs and checked against the
        torch forward when written. ELMo runs on torch only. Windows, pooling and mixes are the same on every backend.
    quantize: deprecated spelling of precision="int8" (quantize="int8"), kept for old code.
    normalize: embed_sentences returns unit-length vectors, v / max(||v||, 1e-12) per layer (so that a dot product is
        the cosine, as sentence-transformers' normalize_embeddings); word vectors are left as they are.
    between_batches: None, or a function called after each batch of a call with one argument, `drain`: calling
        drain() pools every batch still in flight, so that the function may then run other calls on the same model
        before it returns (ctxrep serve interleaves long and short requests this way). Set it on a copy.
    After each call, `cut_texts` lists the texts (indices in that call) a window cut: a word longer than a whole window
    keeps its first pieces (with a warning). Windows cut nothing else, and a pair that does not fit one window is
    an error, never cut.
    The model's device and dtype are used as they are: move `featurizer.model` to "cuda" or bfloat16, or call
    inside `torch.autocast`; vectors come back as float32 numpy arrays.
    """

    between_batches: Callable[[Callable[[], None]], None] | None = None

    def __init__(
        self,
        model: str | os.PathLike = "minilm",
        layers: int | Sequence[int] | str | ScalarMix = -1,
        pooling: str = "mean",
        sentence_pooling: str = DEFAULT_SENTENCE_POOLING,
        stride: int | None = None,
        max_length: int | None = None,
        batch_tokens: int | None = None,
        num_threads: int | None = None,
        progress: bool = False,
        compile: bool | str = "auto",
        quantize: str | None = None,
        normalize: bool = False,
        device: str | torch.device | None = None,
        precision: str | None = None,
        backend: str = "torch",
    ) -> None:
        precision = _checked_settings(pooling, sentence_pooling, compile, quantize, precision, backend)
        device = runtime.parse_device(device)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        loaded, precision = _load(model, device, backend, precision)
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.source = loaded.source
        if device is not None:
            self.model.to(device)
        if self.model.word_level and compile is True:
            raise ValueError(
                f"{self.model.family} is a biLSTM over characters: compile is for Transformer encoders; "
                "leave it at its default"
            )
        self.compile = compile
        self.backend = backend
        # the runtime class and the concrete precision ("auto" decided), chosen once, here
        self._runtime_class, self.precision = runtime.resolve(self.model, backend, precision or "fp32")
        if backend == "torch" and self.precision == "fp32":  # torch runs the model as it is: say its dtype
            self.precision = precision_of(self.model)
        # [(model, its runtime)]: one slot that the views from with_layers share, so the runtime is built once
        self._runtimes: list[tuple[torch.nn.Module, tuple, object]] = []
        self.normalize = bool(normalize)  # embed_sentences: unit-length vectors (cosine = dot product)
        if sentence_pooling == "auto":
            sentence_pooling = auto_sentence_pooling(self.source.folder)
        if self.model.word_level and sentence_pooling == "cls":
            raise ValueError(f"{self.model.family} has no classification token: use sentence_pooling='mean'")
        self.pooling = pooling
        self.sentence_pooling = sentence_pooling
        # sentence_pooling="model": the folder's modules.json + Pooling config, read (or refused) once, here
        self.model_pooling = read_sentence_pooling(self.source.folder) if sentence_pooling == "model" else None
        self.prompts = read_prompts(self.source.folder)  # config_sentence_transformers.json's, or none
        self.progress = progress
        self.max_length = min(max_length or self.model.max_tokens, self.model.max_tokens)
        self.batch_tokens = batch_tokens or runtime.hardware.default_batch_tokens(
            next(self.model.parameters()).device, self.model.hidden_size, self.model.num_layers
        )
        self.plan = WindowPlan(self.tokenizer, self.max_length, stride)
        self.layer_indices, self.mix = self._parse_layers(layers)
        self.single_layer = isinstance(layers, int) or self.mix is not None  # one array per word, no layer axis
        # the texts of the last call that a window cut (a word longer than a whole window), by index in that call
        self.cut_texts: list[int] = []

    @property
    def runtime(self):
        """The backend's runtime over `self.model` (`ctxrep.runtime`), built on first use for this featurizer and its
        `with_layers` views (rebuilt if `self.model` was replaced, moved or cast)."""
        first = next(self.model.parameters())
        where = (first.device, first.dtype)
        if not self._runtimes or self._runtimes[0][0] is not self.model or self._runtimes[0][1] != where:
            built = self._runtime_class(self.model, self.tokenizer, self.precision, self.compile, self.max_length)
            self._runtimes[:] = [(self.model, where, built)]
        return self._runtimes[0][2]

    @property
    def quantize(self) -> str | None:
        """Deprecated: "int8" when precision is "int8", else None."""
        return "int8" if self.precision == "int8" else None

    def with_layers(self, layers: int | Sequence[int] | str | ScalarMix) -> Featurizer:
        """A copy that returns other layers, sharing the model and tokenizer (nothing is reloaded)."""
        view = copy.copy(self)
        view.layer_indices, view.mix = view._parse_layers(layers)
        view.single_layer = isinstance(layers, int) or view.mix is not None
        return view

    def with_model(self, model: Encoder) -> Featurizer:
        """A copy over another model of the same shape that reads the same tokenizer (e.g. the random-init control
        of a probe); the same layers and pooling, its own inference copy."""
        if model.num_layers != self.model.num_layers or model.hidden_size != self.model.hidden_size:
            raise ValueError(
                f"with_model needs a model of the same shape: {model.num_layers} layers x "
                f"{model.hidden_size} instead of {self.model.num_layers} x {self.model.hidden_size}"
            )
        view = copy.copy(self)
        view.model = model
        view._runtime_class, view.precision = runtime.resolve(model, self.backend, self.precision)
        view._runtimes = []
        return view

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def dim(self) -> int:
        """Width of one word vector."""
        return self.model.hidden_size * (2 if self.pooling == "first_last" else 1)

    @property
    def sentence_dim(self) -> int:
        """Width of one sentence vector: the word width for "mean", the hidden size for "cls", and for "model" the
        hidden size x the number of pooling modes the folder concatenates."""
        if self.sentence_pooling == "model":
            return self.model_pooling.width
        return self.model.hidden_size if self.sentence_pooling == "cls" else self.dim

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

    def tokenize(self, texts: Sequence[Text]) -> list[Alignment]:
        """The words, subword tokens and `word_ids` of each text (no special tokens)."""
        words = [words_of(t, i) for i, t in enumerate(as_list(texts))]
        pieces = self.tokenizer.encode_words(words)
        return [Alignment(w, p.tokens, p.word_ids) for w, p in zip(words, pieces)]

    def _word_windows(self, words_a: list[list[str]], words_b: list[list[str]] | None) -> _Prepared:
        """The rows of checked word lists (`words_of`), each text's alone or paired with words_b's, with the words
        each row pools and each text's word count: what word vectors (and pairs) need."""
        n = len(words_a)
        if self.tokenizer.word_level:
            self.tokenizer.reset()  # number only this call's words: memory stays bounded over a corpus
        if words_b is None:
            counts = np.fromiter(map(len, words_a), np.int64, count=n)
        else:
            counts = np.fromiter((len(a) + len(b) for a, b in zip(words_a, words_b)), np.int64, count=n)
        slots = np.cumsum(counts) - counts  # each text's first word in the call's output
        cut: list[int] = []
        if words_b is None and not self.tokenizer.word_level:
            rows, cut = self._single_word_rows(words_a, slots)
        elif words_b is None:
            pieces = self.tokenizer.encode_words(words_a)
            windows = [w for i, p in enumerate(pieces) for w in self.plan.single(i, p)]
            rows = Rows.from_records(windows, word_slots=slots)
        else:
            pieces = self.tokenizer.encode_words(words_a + words_b)
            windows = [self.plan.pair(i, pieces[i], pieces[n + i]) for i in range(n)]
            rows = Rows.from_records(windows, word_slots=slots)
        rows.weights = np.ones(len(rows.ids), np.float32)  # a pair is one window; word pooling reads no weights
        return _Prepared(rows, n, counts, cut)

    def _single_word_rows(self, words: list[list[str]], slots: np.ndarray) -> tuple[Rows, list[int]]:
        """Rows and word spans of single texts: a text that fits one window (every word with a piece) straight from
        the tokenizer's flat arrays, the others (long texts, a word without pieces) through `WindowPlan.single`;
        and the texts a window cuts (`WindowPlan.cuts`)."""
        ids, word_ids, lengths = self.tokenizer.encode_words_flat(words)
        n = len(words)
        text_of = np.repeat(np.arange(n), lengths)  # (pieces,) each piece's text
        starts = np.cumsum(lengths) - lengths
        first_piece = np.ones(len(ids), bool)  # a word's first piece: the text's first, or a new word index
        first_piece[1:] = word_ids[1:] != word_ids[:-1]
        first_piece[starts[lengths > 0]] = True
        covered = np.bincount(text_of[first_piece], minlength=n)  # words with pieces, per text
        counts = np.fromiter(map(len, words), np.int64, count=n)
        fits = (covered == counts) & (lengths <= self.plan.window_size)
        parts, cut = [], []
        if fits.any():
            keep = fits[text_of]
            ids_k, word_ids_k, lengths_k = ids[keep], word_ids[keep], lengths[fits]
            texts = np.flatnonzero(fits)
            rows = Rows.single_texts(self.tokenizer.template, ids_k, lengths_k, texts)
            firsts = np.flatnonzero(first_piece[keep])  # (K,) every word's first piece, in the kept arrays
            ends = np.append(firsts[1:], len(ids_k))  # the next word's first piece (texts start with a word)
            row = np.repeat(np.arange(len(texts)), lengths_k)[firsts]  # (K,) each word's row
            # a bare word-start marker ("▁", "Ġ") before the word's other pieces is not pooled (pooling_spans)
            bare = np.isin(ids_k[firsts], self.tokenizer.word_start_ids) & (ends - firsts > 1)
            at = len(self.tokenizer.template.prefix) - (np.cumsum(lengths_k) - lengths_k)[row]  # piece -> position
            slot = slots[texts[row]] + word_ids_k[firsts]
            rows.words = np.stack([row, slot, firsts + bare + at, ends + at], axis=1)
            parts.append(rows)
        if not fits.all():
            rest = np.flatnonzero(~fits)
            pieces = self.tokenizer.encode_words([words[i] for i in rest])  # repairs a word without pieces
            windows = [w for i, p in zip(rest.tolist(), pieces) for w in self.plan.single(i, p)]  # the chunk's numbers
            parts.append(Rows.from_records(windows, word_slots=slots))
            cut = [int(rest[i]) for i, p in enumerate(pieces) if self.plan.cuts(p)]
        return (Rows.concat(parts) if len(parts) > 1 else parts[0]), cut

    def _sentence_rows(self, texts: list[Text], keep_specials: str) -> _Prepared:
        """The rows of checked texts for vectors that need no word alignment (the model's pooling, the
        classification token, every token's state). A string that fits one window is tokenized whole, as
        sentence-transformers tokenizes it, and its row assembled with array operations; word lists, long
        texts (windows on word boundaries, `_token_weights`) and ELMo go through the words. `keep_specials`:
        "share" or "ends" (see `_token_weights`)."""
        n = len(texts)
        if self.tokenizer.word_level:
            strings = np.zeros(n, bool)
        else:
            strings = np.fromiter(map(isinstance, texts, itertools.repeat(str)), bool, count=n)
        fast, slow = np.flatnonzero(strings), np.flatnonzero(~strings)
        parts, cut = [], []
        if len(fast):
            ids, lengths = self.tokenizer.encode_texts(texts if len(fast) == n else [texts[i] for i in fast.tolist()])
            fits = (lengths > 0) & (lengths <= self.plan.window_size)
            keep = np.repeat(fits, lengths)
            rows = Rows.single_texts(self.tokenizer.template, ids[keep], lengths[fits], fast[fits])
            rows.weights = np.ones(len(rows.ids), np.float32)  # one window: every position counts once
            parts.append(rows)
            slow = np.union1d(slow, fast[~fits])  # long texts and those that give no ids whole, in order
        if len(slow):
            numbers = slow.tolist()
            words = [words_of(texts[i], i) for i in numbers]
            windows, weights, cut = self._token_weights(words, keep_specials, numbers)
            parts.append(Rows.from_records(windows, weights))
        return _Prepared(Rows.concat(parts) if len(parts) > 1 else parts[0], n, cut=cut)

    def _token_weights(self, words: list[list[str]], keep_specials: str, numbers: list[int]):
        """`_piece_weights` of the checked word lists' pieces."""
        return self._piece_weights(self.tokenizer.encode_words(words), keep_specials, numbers)

    def _piece_weights(self, texts_pieces: list[WordPieces], keep_specials: str, numbers: list[int]):
        """The windows of tokenized texts (as `_word_windows` cuts them) and one weight per position of
        each window: 1 for a piece of a word the window owns, 0 for the other pieces (another window answers for
        them); a special token weighs 1 / (the text's number of windows) with keep_specials="share", and with
        "ends" 1 in the first window's leading and the last window's trailing specials, else 0 (the text's tokens
        as one long sequence). One window: every position weighs 1. `numbers`: each word list's text number (the
        windows' .text); also the text numbers a window cuts (`WindowPlan.cuts`)."""
        offset = self.tokenizer.build_inputs([])[2]  # special tokens before the text's first piece
        windows, weights, cut = [], [], []
        for i, pieces in zip(numbers, texts_pieces):
            rows = self.plan.single(i, pieces)
            if len(rows) > 1 and self.plan.cuts(pieces):
                cut.append(i)
            if len(rows) == 1:  # one window (the common case): every position weighs 1, no second cut needed
                windows.append(rows[0])
                weights.append(np.ones(len(rows[0]), dtype=np.float32))
                continue
            spans = pieces.spans()
            # the same cut, with its piece ranges: split_windows is what plan.single windows by
            cuts = split_windows(spans, self.plan.window_size, self.plan.stride)
            assert len(cuts) == len(rows)
            for k, (row, (p0, p1, owned)) in enumerate(zip(rows, cuts)):
                if keep_specials == "share":
                    w = np.full(len(row), 1.0 / len(rows), dtype=np.float32)  # (seq,) special tokens: shared
                else:
                    w = np.zeros(len(row), dtype=np.float32)
                    w[: offset if k == 0 else 0] = 1.0
                    if k == len(rows) - 1:
                        w[offset + p1 - p0 :] = 1.0
                w[offset : offset + p1 - p0] = 0.0
                for word in owned:
                    s, e = spans[word]
                    w[offset + s - p0 : offset + min(e, p1) - p0] = 1.0
                windows.append(row)
                weights.append(w)
        return windows, weights, cut

    # ---- running the encoder --------------------------------------------------------------------

    def run_rows(self, rows: Rows, consume: Callable[[torch.Tensor, np.ndarray, np.ndarray | None], None]) -> None:
        """Encode every row (text.inputs.Rows: windows of pieces) in length-sorted token-budget batches;
        `consume(selected, batch_rows, weights)` pools each batch once its hidden states (layers, batch, seq, hidden)
        are on the CPU as float32 (after the mix). The seam for tools that pool rows their own way (late_interaction's
        expanded ColBERT queries)."""
        order = np.argsort(rows.lengths, kind="stable")  # the same order for the same input: same batches
        sizes = token_budget_batches(rows.lengths[order].tolist(), self.batch_tokens)
        num_tokens = int(rows.lengths.sum())
        bar = show_progress(total=num_tokens, unit="tok", enabled=bool(self.progress), desc="embed")  # lines in a log
        self.model.eval()
        run = self.runtime
        in_flight = max(1, run.in_flight(num_tokens))  # batches started before the oldest is pooled

        def pool(batch_rows: np.ndarray, weights: np.ndarray | None, wait, real: int) -> None:
            selected = wait()
            if self.mix is not None:
                selected = self.mix(selected).unsqueeze(0)  # (1, batch, seq, hidden)
            consume(selected, batch_rows, weights)
            bar.update(real)

        pending = collections.deque()  # started batches, pooled oldest first while later ones run

        def drain() -> None:
            while pending:
                pool(*pending.popleft())

        with torch.inference_mode():
            start = 0
            for size in sizes:
                batch_rows = order[start : start + size]
                start += size
                collated, weights = rows.collate(batch_rows, self.tokenizer)
                real = int(rows.lengths[batch_rows].sum())
                pending.append((batch_rows, weights, run.start(collated, self.layer_indices, num_tokens), real))
                if len(pending) >= in_flight:
                    pool(*pending.popleft())
                if self.between_batches is not None:  # e.g. ctxrep serve: other calls' batches run here
                    self.between_batches(drain)
            drain()
        bar.close()

    def _pool_words(self, selected: torch.Tensor, rows: Rows, batch_rows: np.ndarray, out: np.ndarray) -> None:
        """Pool each word's pieces of one batch into its slot of `out`; selected: (layers, batch, seq, hidden)."""
        n_layers, b, t, h = selected.shape
        position, slot, first, end = rows.batch_words(batch_rows)  # one entry per word
        if not len(slot):
            return
        flat = selected.permute(1, 2, 0, 3).reshape(b * t, n_layers, h)  # (batch*seq, layers, hidden)
        firsts, lasts = position * t + first, position * t + end - 1  # rows of each word's first and last piece
        if self.pooling == "first":
            vectors = flat[firsts]
        elif self.pooling == "last":
            vectors = flat[lasts]
        elif self.pooling == "first_last":
            vectors = torch.cat([flat[firsts], flat[lasts]], dim=-1)
        else:  # mean: a word's pieces are consecutive rows once gathered: one reduceat sums each word's run
            counts = lasts - firsts + 1  # (K,)
            runs = np.cumsum(counts) - counts  # each word's first row in the gathered pieces
            pieces = np.arange(counts.sum()) - np.repeat(runs, counts) + np.repeat(firsts, counts)  # rows in `flat`
            sums = np.add.reduceat(flat.numpy()[pieces], runs, axis=0)  # (K, layers, hidden)
            out[slot] = sums / counts[:, None, None].astype(np.float32)
            return
        out[slot] = vectors.numpy()

    # ---- public API -----------------------------------------------------------------------------

    def embed_words(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None = None) -> list[np.ndarray]:
        """One float32 array per text: (n_words, dim) for one layer or a mix, (n_words, n_layers, dim) otherwise.

        With `text_pairs`, text i is encoded together with text_pairs[i] ([CLS] A [SEP] B [SEP]) and its
        array holds A's words, then B's.
        """
        words = self._encode(texts, text_pairs, "words")
        return [w[:, 0] if self.single_layer else w for w in words]

    def embed_sentences(
        self,
        texts: Sequence[Text],
        text_pairs: Sequence[Text] | None = None,
        *,
        chunks: Chunks | None = None,
        late_chunking: bool = True,
        prompt: str | None = None,
        prompt_name: str | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray | list[np.ndarray]:
        """(n_texts, dim) for one layer or a mix, (n_texts, n_layers, dim) otherwise.

        "mean" averages the text's word vectors; "cls" takes the classification token (for a text longer than
        one window, the average over its windows).

        chunks (late chunking): one vector per chunk of each text instead, a list of (n_chunks, dim) arrays (with a
        layer axis as above). The whole text is encoded first (in windows where it is long: `embed_tokens`), so
        every chunk's tokens carry the context of the document around them; a chunk's vector is the mean of its
        tokens' states (special tokens left out), unit length where the model's pooling normalises or normalize=True.
        chunks is "sentences" (a string cut after ".", "!" or "?" followed by white space), an int N (consecutive
        chunks of N tokens), or per text a list of (start, end) character spans (a token belongs to the span its
        first character falls in). Spans and sentences need strings; word lists take N tokens.
        late_chunking=False (Jina's "naive chunking"): the plain per-chunk vectors instead, each chunk's text embedded
        alone as embed_sentences embeds a text (the same chunks; N tokens: the characters from the chunk's first
        token to the next chunk's, of a word list the words whose first piece falls in the chunk); these take
        prompt, prompt_name and dimensions as embed_sentences does.

        prompt / prompt_name: text put before each text (before a word list's words): given, or the folder's
        prompt of that name (config_sentence_transformers.json), else the folder's default prompt, as
        sentence-transformers' encode; a Pooling with include_prompt false leaves the prompt's positions out.
        dimensions: the first N coordinates of each vector, then L2-normalised (Matryoshka; OpenAI's dimensions).
        """
        if chunks is not None:
            if text_pairs is not None:
                raise ValueError("chunks= embeds single texts: leave text_pairs out")
            if not late_chunking:
                return self._embed_plain_chunks(texts, chunks, prompt, prompt_name, dimensions)
            if (prompt, prompt_name, dimensions) != (None, None, None):
                raise ValueError(
                    "late chunks take no prompt, prompt_name or dimensions (the chunks index the document's tokens); "
                    "leave them out, or give late_chunking=False for plain per-chunk vectors"
                )
            return self._embed_chunks(texts, chunks)
        prefix = self.prompts.resolve(prompt, prompt_name)
        texts = with_prompt(prefix, as_list(texts))
        if self.sentence_pooling in ("model", "cls"):
            left_out = prefix if self.model_pooling is not None and not self.model_pooling.include_prompt else ""
            out = self._encode(texts, text_pairs, self.sentence_pooling, left_out)
        else:
            words = self._encode(texts, text_pairs, "words")
            out = np.stack([w.mean(axis=0) for w in words]) if words else np.zeros((0, 1, self.dim), np.float32)
        out = out[:, 0] if self.single_layer else out
        if dimensions is not None:
            if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) or dimensions < 1:
                raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
            if dimensions > out.shape[-1]:
                raise ValueError(
                    f"dimensions={dimensions} is more than this model's {out.shape[-1]}-wide sentence vectors; "
                    f"give at most {out.shape[-1]}"
                )
            return normalize_rows(out[..., :dimensions])  # truncate, then unit length again
        return normalize_rows(out) if self.normalize else out  # each layer's vector unit length

    def _check_chunks(self, texts: list[Text], chunks: Chunks) -> dict[int, np.ndarray]:
        """Refuse a bad chunks= argument; each text's tokens' first characters where chunks go by characters."""
        if isinstance(chunks, str) and chunks != "sentences":
            raise ValueError(f"chunks must be 'sentences', a number of tokens or per-text spans, got {chunks!r}")
        if isinstance(chunks, bool) or (isinstance(chunks, int) and chunks < 1):
            raise ValueError(f"chunks as a number of tokens must be at least 1, got {chunks!r}")
        per_text_spans = not isinstance(chunks, (str, int))
        if per_text_spans and len(chunks) != len(texts):
            raise ValueError(
                f"got {len(texts)} texts but chunk spans for {len(chunks)}; give one list of spans per text"
            )
        by_characters = [i for i, t in enumerate(texts) if not isinstance(chunks, int)]
        for i in by_characters:
            if not isinstance(texts[i], str):
                raise ValueError(f"text {i}: chunks by characters (spans, sentences) need a string, not a word list")
        return dict(zip(by_characters, self.tokenizer.char_offsets([texts[i] for i in by_characters])))

    @staticmethod
    def _chunk_ranges(text: Text, i: int, chunks: Chunks, n_pieces: int, starts: np.ndarray | None):
        """Text i's chunks as (token ranges, character spans or None for N tokens) over its n_pieces tokens."""
        if isinstance(chunks, int):
            return [(k, min(k + chunks, n_pieces)) for k in range(0, n_pieces, chunks)], None
        spans = sentence_spans(text) if chunks == "sentences" else chunks[i]
        return [_token_range(starts, span, i, k) for k, span in enumerate(spans)], spans

    def _embed_chunks(self, texts: Sequence[Text], chunks: Chunks) -> list[np.ndarray]:
        """embed_sentences(texts, chunks=...): the chunks' token ranges, then the means of embed_tokens' states."""
        texts = as_list(texts)
        offsets = self._check_chunks(texts, chunks)
        tokens = self.embed_tokens(texts)
        before = len(self.tokenizer.template.prefix)  # special tokens before the text's first piece
        after = len(self.tokenizer.template.single_suffix)
        normalize = self.normalize or (self.model_pooling is not None and self.model_pooling.normalize)
        out = []
        for i, (_, states) in enumerate(tokens):
            pieces = states[before : len(states) - after]  # (pieces, ...) the text's tokens, no special tokens
            if i in offsets and len(offsets[i]) != len(pieces):
                raise ValueError(
                    f"text {i}: its {len(pieces)} tokens in windows differ from its {len(offsets[i])} tokens whole; "
                    "chunk it by a number of tokens instead"
                )
            ranges, _ = self._chunk_ranges(texts[i], i, chunks, len(pieces), offsets.get(i))
            vectors = np.stack([pieces[a:b].mean(axis=0) for a, b in ranges])  # (chunks, ...)
            out.append(normalize_rows(vectors) if normalize else vectors)
        return out

    def _embed_plain_chunks(
        self,
        texts: Sequence[Text],
        chunks: Chunks,
        prompt: str | None,
        prompt_name: str | None,
        dimensions: int | None,
    ) -> list[np.ndarray]:
        """embed_sentences(texts, chunks=..., late_chunking=False): the same chunks cut out of each text, then all
        of them embedded alone in one embed_sentences call."""
        texts = as_list(texts)
        offsets = self._check_chunks(texts, chunks)
        if not texts:
            return []
        word_ids: dict[int, np.ndarray] = {}  # N tokens of a word list: each piece's word
        if isinstance(chunks, int):  # N tokens: the tokens' characters (strings) or words (word lists)
            strings = [i for i, t in enumerate(texts) if isinstance(t, str)]
            offsets = dict(zip(strings, self.tokenizer.char_offsets([texts[i] for i in strings])))
            lists = [i for i, t in enumerate(texts) if not isinstance(t, str)]
            encoded = self.tokenizer.encode_words([words_of(texts[i], i) for i in lists])
            word_ids = {i: np.asarray(p.word_ids, np.int64) for i, p in zip(lists, encoded)}
        pieces: list[Text] = []
        counts = []
        for i, text in enumerate(texts):
            n = len(offsets[i]) if i in offsets else len(word_ids[i])
            ranges, spans = self._chunk_ranges(text, i, chunks, n, offsets.get(i))
            if spans is not None:
                cut = [text[int(a) : int(b)] for a, b in spans]
            elif i in offsets:
                bounds = [*offsets[i].tolist(), len(text)]
                cut = [text[bounds[a] : bounds[b]].strip() for a, b in ranges]
            else:  # a word goes with the chunk its first piece falls in
                firsts = np.searchsorted(word_ids[i], np.arange(len(text)))
                cut = [[text[w] for w in np.flatnonzero((firsts >= a) & (firsts < b))] for a, b in ranges]
            for k, chunk in enumerate(cut):
                if not (chunk.strip() if isinstance(chunk, str) else chunk):
                    raise ValueError(
                        f"text {i}: chunk {k} of {chunks} tokens starts inside one word and holds none of its own; "
                        "give more tokens per chunk, or late_chunking=True"
                    )
            pieces.extend(cut)
            counts.append(len(cut))
        vectors = self.embed_sentences(pieces, prompt=prompt, prompt_name=prompt_name, dimensions=dimensions)
        return np.split(vectors, np.cumsum(counts)[:-1])

    def embed_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Sentence vectors of texts given as token ids (this tokenizer's, without special tokens; e.g. a corpus
        tokenized once ahead): what embed_sentences gives for the texts these ids come from, under the model's own
        pooling or the classification token (the mean of words needs words). The template's special tokens are added
        here; a sequence longer than one window is windowed with every token as its own word (a window may then start
        inside a word where embed_sentences starts it on the word's first piece: a slightly different vector)."""
        if self.sentence_pooling not in ("model", "cls") or self.tokenizer.word_level:
            raise ValueError(
                "embed_ids pools tokens without words: it needs sentence_pooling='model' or 'cls' and a subword "
                f"tokenizer (this featurizer: {self.sentence_pooling!r}, {self.model.family}); use embed_sentences"
            )
        seqs = [np.asarray(x, dtype=np.int64).reshape(-1) for x in as_list(ids)]
        vocab = self.tokenizer.vocab_size
        for i, seq in enumerate(seqs):
            if not len(seq) or seq.min() < 0 or seq.max() >= vocab:
                raise ValueError(f"ids {i}: expected 1 or more token ids in 0..{vocab - 1}, got {seq[:8].tolist()}...")
        lengths = np.fromiter(map(len, seqs), np.int64, count=len(seqs))
        fits = lengths <= self.plan.window_size
        parts = []
        if fits.any():
            flat = np.concatenate([s for s, f in zip(seqs, fits) if f])
            rows = Rows.single_texts(self.tokenizer.template, flat, lengths[fits], np.flatnonzero(fits))
            rows.weights = np.ones(len(rows.ids), np.float32)
            parts.append(rows)
        if not fits.all():
            long = np.flatnonzero(~fits).tolist()
            pieces = [
                WordPieces(seqs[i].tolist(), list(range(len(seqs[i]))), [""] * len(seqs[i]), len(seqs[i])) for i in long
            ]
            windows, weights, _ = self._piece_weights(pieces, "share", long)
            parts.append(Rows.from_records(windows, weights))
        rows = Rows.concat(parts) if len(parts) > 1 else parts[0]
        self.cut_texts = []  # every token is its own word: nothing to cut
        out = self._finish(_Prepared(rows, len(seqs)), self.sentence_pooling)
        out = out[:, 0] if self.single_layer else out
        return normalize_rows(out) if self.normalize else out

    def embed_tokens(self, texts: Sequence[Text]) -> list[TokenStates]:
        """Every token's hidden state, per text: `TokenStates(ids, states)` with ids (n_tokens,) int64 and states
        (n_tokens, hidden) float32 for one layer or a mix, (n_tokens, n_layers, hidden) otherwise.

        The tokens are the text's as the model reads it, special tokens included ([CLS] ... [SEP] for BERT): a
        string that fits one window is tokenized whole (as sentence-transformers tokenizes it), a word list word
        by word. A text longer than one window is run in the featurizer's windows and comes back as one long
        sequence: the first window's leading special tokens, each piece from the window that owns its word (the
        most context on its poorer side), the last window's trailing special tokens. The raw material of
        token-level heads (SPLADE's MLM logits, ColBERT's projection): the same batches, runtime and precision as
        embed_sentences, so the states equal what the encoder gives for that window (within 1e-5 in float32).
        """
        return self._encode(texts, None, "tokens")

    def _encode(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None, want: str, left_out: str = ""):
        """Every text's result for `want`: "words" (a list of (words, layers, dim) arrays), "cls" or "model" (one
        (texts, layers, width) array), "tokens" (a list of TokenStates). Every text is checked first, so errors
        name its index in the call.

        On CUDA a call of more than OVERLAP_CHUNK_TEXTS texts is cut into chunks of that many, and a thread
        tokenizes the next chunk while the device encodes this one (`tokenizers` releases the GIL); a chunk's
        windows are batched among themselves, and batching never changes a vector."""
        texts = as_list(texts)
        by_words = text_pairs is not None or want == "words"  # word alignment needed: split every text once, here
        if by_words:
            texts = [words_of(t, i) for i, t in enumerate(texts)]
        else:
            check_texts(texts)
        pairs = None
        if text_pairs is not None:
            pairs = [words_of(t, i) for i, t in enumerate(as_list(text_pairs))]
            if len(pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(pairs)} text_pairs; give one pair text per text")
        n, step = len(texts), OVERLAP_CHUNK_TEXTS
        chunks = [slice(i, i + step) for i in range(0, n, step)] if self._overlaps_tokenization(n) else [slice(0, n)]

        def prepare(chunk: slice) -> _Prepared:
            if by_words:
                return self._word_windows(texts[chunk], None if pairs is None else pairs[chunk])
            return self._sentence_rows(texts[chunk], "ends" if want == "tokens" else "share")

        cut: list[int] = []
        if len(chunks) == 1:
            prepared = prepare(chunks[0])
            results, cut = [self._finish(prepared, want, left_out)], prepared.cut
        else:
            results = []
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxrep-tokenize") as tokenizer_thread:
                ahead = tokenizer_thread.submit(prepare, chunks[0])
                for k in range(len(chunks)):
                    prepared = ahead.result()
                    if k + 1 < len(chunks):
                        ahead = tokenizer_thread.submit(prepare, chunks[k + 1])
                    results.append(self._finish(prepared, want, left_out))
                    cut += [chunks[k].start + i for i in prepared.cut]
        self.cut_texts = sorted(cut)
        if want in ("words", "tokens"):
            return [w for chunk in results for w in chunk]
        return results[0] if len(results) == 1 else np.concatenate(results)

    def _overlaps_tokenization(self, num_texts: int) -> bool:
        """A fixed rule: on CUDA (the host would otherwise leave the device idle while it tokenizes), for a call of
        more than OVERLAP_CHUNK_TEXTS texts, and not for ELMo (its word numbering is reset per call).

        Not on the CPU (measured on a shared 2-core AMD EPYC, load 5-7, SST sentences): tokenizing and building the
        rows is 0.5% of MiniLM's CPU time there, so a look-ahead thread has nothing to hide (2,048 sentences, chunks of
        512: 0.96x with torch on both cores, 0.97x with torch on one); it pays only for an encoder with ~no compute
        and a free core (a 1-layer 32-wide model, 17,088 sentences, torch on one core: 1.46x), and with torch on
        every core it competes with torch's threads (0.52x-0.91x). Chunks also change the batches, so the vectors by
        ~1e-7 (3.8e-7 on MiniLM)."""
        return self.runtime.device.type == "cuda" and not self.model.word_level and num_texts > OVERLAP_CHUNK_TEXTS

    def _finish(self, prepared: _Prepared, want: str, left_out: str = ""):
        """Run the rows of one prepared chunk and pool them as `want` asks: the encoding half of `_encode`.
        `left_out`: a prompt whose positions (with the leading special tokens) weigh 0 in each text's first row
        (want "model", include_prompt false)."""
        rows, n = prepared.rows, prepared.num_texts
        n_layers = 1 if self.single_layer else len(self.layer_indices)
        if want == "words":
            counts = prepared.word_counts
            out = np.zeros((int(counts.sum()), n_layers, self.dim), dtype=np.float32)  # every word of the chunk

            def consume(selected, batch_rows, _weights):
                self._pool_words(selected, rows, batch_rows, out)

            self.run_rows(rows, consume)
            return np.split(out, np.cumsum(counts)[:-1])  # one view per text
        if want == "cls":
            sums = np.zeros((n, n_layers, self.model.hidden_size), dtype=np.float32)
            counts = np.zeros(n, dtype=np.int64)

            def consume(selected, batch_rows, _weights):
                at_cls = selected[:, torch.arange(len(batch_rows)), torch.from_numpy(rows.cls_position[batch_rows])]
                np.add.at(sums, rows.text[batch_rows], at_cls.transpose(0, 1).numpy())  # (batch, layers, hidden)
                np.add.at(counts, rows.text[batch_rows], 1)

            self.run_rows(rows, consume)
            return sums / counts[:, None, None]
        if want == "model":
            pooler = TokenPooler(self.model_pooling, n, n_layers, self.model.hidden_size)
            if left_out:  # rows are made in each text's window order: its first row holds the prompt
                skip, starts = prompt_positions(self.tokenizer, left_out), rows.starts
                for first in np.unique(rows.text, return_index=True)[1]:
                    rows.weights[starts[first] : starts[first] + min(skip, rows.lengths[first])] = 0.0

            def consume(selected, batch_rows, weights):
                # row numbers: last-token pooling reads a text's last window
                pooler.add(selected, rows.text[batch_rows], weights, rows.cls_position[batch_rows], batch_rows)

            self.run_rows(rows, consume)
            return pooler.result()  # (texts, layers, width)
        parts: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(rows)  # "tokens": (ids, states) per row
        starts = rows.starts

        def consume(selected, batch_rows, weights):
            states = selected.transpose(0, 1).transpose(1, 2).numpy()  # (batch, seq, layers, hidden)
            for r, row in enumerate(batch_rows):
                keep = np.flatnonzero(weights[r] > 0)
                ids = rows.ids[starts[row] : starts[row] + rows.lengths[row]][keep]
                kept = states[r, keep]
                parts[row] = (ids, kept[:, 0] if self.single_layer else kept)

        self.run_rows(rows, consume)
        per_text: list[list[int]] = [[] for _ in range(n)]
        for row, t in enumerate(rows.text.tolist()):  # rows are made in each text's window order
            per_text[t].append(row)
        return [
            TokenStates(*parts[r[0]]) if len(r) == 1 else TokenStates(*map(np.concatenate, zip(*(parts[k] for k in r))))
            for r in per_text
        ]


Chunks = str | int | Sequence[Sequence[tuple[int, int]]]
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`: cut after ".", "!" or "?" (runs of them) followed
    by white space or the end; white space between sentences belongs to none."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:  # trim the white space around each, drop the empty ones
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
    return out


def _token_range(starts: np.ndarray, span, text: int, chunk: int) -> tuple[int, int]:
    """The tokens whose first character lies in the character span [start, end), or an error naming the chunk."""
    try:
        start, end = (int(x) for x in span)
    except (TypeError, ValueError):
        raise ValueError(f"text {text}: chunk {chunk} must be a (start, end) character span, got {span!r}") from None
    a, b = int(np.searchsorted(starts, start)), int(np.searchsorted(starts, end))
    if not 0 <= start < end or a >= b:
        raise ValueError(f"text {text}: chunk {chunk} ({start}, {end}) holds no token; give spans that cover text")
    return a, b


class TokenStates(NamedTuple):
    """One text's tokens and their hidden states (`Featurizer.embed_tokens`)."""

    ids: np.ndarray  # (n_tokens,) int64, special tokens included
    states: np.ndarray  # (n_tokens, hidden) float32, or (n_tokens, n_layers, hidden)


@dataclass
class _Prepared:
    """One chunk of a call, tokenized: its rows, its number of texts, and for word vectors each text's word count."""

    rows: Rows
    num_texts: int
    word_counts: np.ndarray | None = None
    cut: list[int] = field(default_factory=list)  # texts a window cuts (a word longer than a window)
