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
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ctxrep import runtime
from ctxrep.models.encoder import Encoder
from ctxrep.models.loading import LoadedEncoder, load_encoder
from ctxrep.models.sentence_transformers import TokenPooler, is_sentence_transformers_folder, read_sentence_pooling
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.text.inputs import (
    EncoderInput,
    Text,
    WindowPlan,
    as_list,
    collate,
    split_windows,
    token_budget_batches,
    words_of,
)
from ctxrep.util.arrays import normalize_rows

POOLINGS = ("first", "last", "mean", "first_last")
SENTENCE_POOLINGS = ("mean", "cls", "model", "auto")
# On CUDA, a call of more texts is tokenized in chunks of this many, the next one while the device runs this one.
OVERLAP_CHUNK_TEXTS = 4096


@dataclass
class Alignment:
    """How one text was split: its words, its subword pieces, and each piece's word index."""

    words: list[str]
    tokens: list[str]
    word_ids: list[int]


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
        "auto": "model" for a sentence-transformers folder (it has modules.json), else "mean".
    stride: how many pieces each window of a long text advances (default: half a window).
    batch_tokens: the token budget of one batch (padded batch size x longest sequence); None: on a CPU 2,048 (1,024
        for models wider than 512), sized for the GPU's memory on CUDA (`runtime.hardware.default_batch_tokens`). Batching never changes a vector.
    compile: run the encoder under torch.compile (`ctxrep.runtime.fast.compile_encoder`): True, False, or "auto" (compile
        once a call's work is large enough to pay for the compilation, `fast.worth_compiling`; stay eager before).
    device: where the model runs ("cpu", "cuda", "cuda:1"); None: where it is (the CPU after loading). On CUDA,
        batches go through pinned memory with non-blocking copies, and pooling of one batch overlaps the next's run.
    precision: "fp32" (default: the model as it is, exact), "bf16" / "fp16" (a copy cast to that type), "int8" (the
        backend's int8 path, CPU only), or "auto": the fastest precision on this hardware whose vectors keep a mean
        cosine >= 0.999 to float32, read from its description (bf16 on GPUs and on CPUs with avx512_bf16 or AMX,
        else fp32; `runtime.hardware.auto_precision`); the choice is in `featurizer.precision` after construction.
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
    The model's device and dtype are used as they are: move `featurizer.model` to "cuda" or bfloat16, or call
    inside `torch.autocast`; vectors come back as float32 numpy arrays.
    """

    between_batches: Callable[[Callable[[], None]], None] | None = None

    def __init__(
        self,
        model: str | os.PathLike = "minilm",
        layers: int | Sequence[int] | str | ScalarMix = -1,
        pooling: str = "mean",
        sentence_pooling: str = "mean",
        stride: int | None = None,
        max_length: int | None = None,
        batch_tokens: int | None = None,
        num_threads: int | None = None,
        progress: bool = False,
        compile: bool | str = "auto",
        quantize: str | None = None,
        normalize: bool = False,
        device: str | torch.device | None = None,
        precision: str = "fp32",
        backend: str = "torch",
    ) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if sentence_pooling not in SENTENCE_POOLINGS:
            raise ValueError(f"sentence_pooling must be one of {SENTENCE_POOLINGS}, got {sentence_pooling!r}")
        if compile not in (True, False, "auto"):
            raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
        if quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
        if quantize is not None:
            warnings.warn("quantize='int8' is now precision='int8'", DeprecationWarning, stacklevel=2)
            precision = "int8"
        runtime.check_precision(precision)
        runtime.runtime_class(backend).require()  # an unknown backend, or a missing package, is said here
        device = runtime.parse_device(device)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        loaded = model if isinstance(model, LoadedEncoder) else load_encoder(model)
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
        self._runtime_class, self.precision = runtime.resolve(self.model, backend, precision)
        # [(model, its runtime)]: one slot that the views from with_layers share, so the runtime is built once
        self._runtimes: list[tuple[torch.nn.Module, tuple, object]] = []
        self.normalize = bool(normalize)  # embed_sentences: unit-length vectors (cosine = dot product)
        if sentence_pooling == "auto":
            folder = self.source.folder
            sentence_pooling = "model" if folder is not None and is_sentence_transformers_folder(folder) else "mean"
        if self.model.word_level and sentence_pooling == "cls":
            raise ValueError(f"{self.model.family} has no classification token: use sentence_pooling='mean'")
        self.pooling = pooling
        self.sentence_pooling = sentence_pooling
        # sentence_pooling="model": the folder's modules.json + Pooling config, read (or refused) once, here
        self.model_pooling = read_sentence_pooling(self.source.folder) if sentence_pooling == "model" else None
        self.progress = progress
        self.max_length = min(max_length or self.model.max_tokens, self.model.max_tokens)
        self.batch_tokens = batch_tokens or runtime.hardware.default_batch_tokens(
            next(self.model.parameters()).device, self.model.hidden_size, self.model.num_layers
        )
        self.plan = WindowPlan(self.tokenizer, self.max_length, stride)
        self.layer_indices, self.mix = self._parse_layers(layers)
        self.single_layer = isinstance(layers, int) or self.mix is not None  # one array per word, no layer axis

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

    def _windows(
        self, words_a: list[list[str]], words_b: list[list[str]] | None
    ) -> tuple[list[EncoderInput], list[int]]:
        """The windows of checked word lists (`words_of`), each text's alone or paired with words_b's, and each
        text's word count."""
        if self.tokenizer.word_level:
            self.tokenizer.reset()  # number only this call's words: memory stays bounded over a corpus
        if words_b is None:
            pieces = self.tokenizer.encode_words(words_a)
            windows = [w for i, p in enumerate(pieces) for w in self.plan.single(i, p)]
            return windows, [len(w) for w in words_a]
        pieces = self.tokenizer.encode_words(words_a + words_b)
        n = len(words_a)
        windows = [self.plan.pair(i, pieces[i], pieces[n + i]) for i in range(n)]
        return windows, [pieces[i].num_words + pieces[n + i].num_words for i in range(n)]

    # ---- running the encoder --------------------------------------------------------------------

    def _run(
        self,
        windows: list[EncoderInput],
        word_counts: list[int],
        want_words: bool,
        want_cls: bool,
        tokens: tuple[TokenPooler, list[np.ndarray]] | None = None,
    ):
        """Encode all windows; returns per-text word arrays and per-text mean CLS vectors (as requested). `tokens`:
        a TokenPooler fed every batch, with one weight array per window (sentence_pooling="model")."""
        n_out = 1 if self.single_layer else len(self.layer_indices)
        word_out = [np.zeros((c, n_out, self.dim), dtype=np.float32) for c in word_counts] if want_words else None
        cls_sum = np.zeros((len(word_counts), n_out, self.model.hidden_size), dtype=np.float32) if want_cls else None
        cls_count = np.zeros(len(word_counts), dtype=np.int64)
        order = sorted(range(len(windows)), key=lambda i: len(windows[i].input_ids))
        batches = token_budget_batches([len(windows[i].input_ids) for i in order], self.batch_tokens)
        num_tokens = sum(len(w.input_ids) for w in windows)
        bar = tqdm(total=num_tokens, unit="tok", disable=not self.progress, desc="embed")
        self.model.eval()
        run = self.runtime
        in_flight = max(1, run.in_flight(num_tokens))  # batches started before the oldest is pooled

        def pool(batch: list[EncoderInput], rows: list[int], wait, real: int) -> None:
            """Pool one batch once its hidden states (layers, batch, seq, hidden) are on the CPU as float32."""
            selected = wait()
            if self.mix is not None:
                selected = self.mix(selected).unsqueeze(0)  # (1, batch, seq, hidden)
            if want_words:
                self._pool_words(selected, batch, word_out)
            if want_cls:
                for r, w in enumerate(batch):
                    cls_sum[w.text] += selected[:, r, w.cls_position].numpy()
                    cls_count[w.text] += 1
            if tokens is not None:
                pooler, weights = tokens
                pooler.add(
                    selected, [w.text for w in batch], [weights[i] for i in rows], [w.cls_position for w in batch]
                )
            bar.update(real)

        pending = collections.deque()  # started batches, pooled oldest first while later ones run

        def drain() -> None:
            while pending:
                pool(*pending.popleft())

        with torch.inference_mode():
            start = 0
            for size in batches:
                rows = order[start : start + size]
                batch = [windows[i] for i in rows]
                start += size
                collated = collate(batch, self.tokenizer)
                real = int(collated["attention_mask"].sum())
                if run.device.type == "cuda":  # pinned host memory: the copies run asynchronously with the host's work
                    inputs = {k: v.pin_memory().to(run.device, non_blocking=True) for k, v in collated.items()}
                else:
                    inputs = {k: v.to(run.device) for k, v in collated.items()}
                pending.append((batch, rows, run.start(inputs, self.layer_indices, call_tokens=num_tokens), real))
                if len(pending) >= in_flight:
                    pool(*pending.popleft())
                if self.between_batches is not None:  # e.g. ctxrep serve: other calls' batches run here
                    self.between_batches(drain)
            drain()
        bar.close()
        cls = cls_sum / cls_count[:, None, None] if want_cls else None
        return word_out, cls

    def _pool_words(self, selected: torch.Tensor, batch: list[EncoderInput], word_out: list[np.ndarray]) -> None:
        """Pool each word's pieces; selected: (layers, batch, seq, hidden)."""
        n_layers, b, t, h = selected.shape
        flat = selected.permute(1, 2, 0, 3).reshape(b * t, n_layers, h)  # (batch*seq, layers, hidden)
        rows = [(r, w) for r, w in enumerate(batch) if w.words]
        if not rows:
            return
        words = np.array([span for _, w in rows for span in w.words], dtype=np.int64)  # (K, 3): word, start, end
        sizes = [len(w.words) for _, w in rows]
        base = np.repeat([r * t for r, _ in rows], sizes)  # (K,) the window's first row in `flat`
        firsts, lasts = base + words[:, 1], base + words[:, 2] - 1  # (K,) rows of each word's first and last piece
        if self.pooling == "first":
            vectors = flat[firsts]
        elif self.pooling == "last":
            vectors = flat[lasts]
        elif self.pooling == "first_last":
            vectors = torch.cat([flat[firsts], flat[lasts]], dim=-1)
        else:  # mean: sum each word's pieces with index_add, then divide by the piece count
            counts = lasts - firsts + 1  # (K,)
            starts = np.repeat(np.cumsum(counts) - counts, counts)  # each piece's word's first slot in `pieces`
            pieces = np.arange(counts.sum()) - starts + np.repeat(firsts, counts)  # (pieces,) rows in `flat`
            slots = torch.from_numpy(np.repeat(np.arange(len(words)), counts))  # (pieces,) the word of each piece
            sums = torch.zeros(len(words), n_layers, h).index_add_(0, slots, flat[torch.from_numpy(pieces)])
            vectors = sums / torch.from_numpy(counts).to(sums.dtype)[:, None, None]
        vectors = vectors.numpy()
        k = 0
        for (_, w), size in zip(rows, sizes):  # a window's words are one slice of `vectors`
            word_out[w.text][words[k : k + size, 0]] = vectors[k : k + size]
            k += size

    # ---- public API -----------------------------------------------------------------------------

    def embed_words(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None = None) -> list[np.ndarray]:
        """One float32 array per text: (n_words, dim) for one layer or a mix, (n_words, n_layers, dim) otherwise.

        With `text_pairs`, text i is encoded together with text_pairs[i] ([CLS] A [SEP] B [SEP]) and its
        array holds A's words, then B's.
        """
        words = self._encode(texts, text_pairs, "words")
        return [w[:, 0] if self.single_layer else w for w in words]

    def embed_sentences(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None = None) -> np.ndarray:
        """(n_texts, dim) for one layer or a mix, (n_texts, n_layers, dim) otherwise.

        "mean" averages the text's word vectors; "cls" takes the classification token (for a text longer than
        one window, the average over its windows).
        """
        if self.sentence_pooling == "model":
            out = self._encode(texts, text_pairs, "model")  # the folder's Pooling (+ Normalize)
        elif self.sentence_pooling == "cls":
            out = self._encode(texts, text_pairs, "cls")
        else:
            words = self._encode(texts, text_pairs, "words")
            out = np.stack([w.mean(axis=0) for w in words]) if words else np.zeros((0, 1, self.dim), np.float32)
        out = out[:, 0] if self.single_layer else out
        return normalize_rows(out) if self.normalize else out  # each layer's vector unit length

    def _encode(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None, want: str):
        """Every text's result for `want`: "words" (a list of (words, layers, dim) arrays), "cls" or "model" (one
        (texts, layers, width) array). Every text is checked first, so errors name its index in the call.

        On CUDA a call of more than OVERLAP_CHUNK_TEXTS texts is cut into chunks of that many, and a thread
        tokenizes the next chunk while the device encodes this one (`tokenizers` releases the GIL); a chunk's
        windows are batched among themselves, and batching never changes a vector."""
        words_a = [words_of(t, i) for i, t in enumerate(as_list(texts))]
        words_b = None
        if text_pairs is not None:
            words_b = [words_of(t, i) for i, t in enumerate(as_list(text_pairs))]
            if len(words_b) != len(words_a):
                raise ValueError(f"got {len(words_a)} texts but {len(words_b)} text_pairs; give one pair text per text")
        n, step = len(words_a), OVERLAP_CHUNK_TEXTS
        chunks = [slice(i, i + step) for i in range(0, n, step)] if self._overlaps_tokenization(n) else [slice(0, n)]

        def prepare(chunk: slice):
            return self._prepare(words_a[chunk], None if words_b is None else words_b[chunk], want)

        if len(chunks) == 1:
            results = [self._finish(prepare(chunks[0]), want)]
        else:
            results = []
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxrep-tokenize") as tokenizer_thread:
                ahead = tokenizer_thread.submit(prepare, chunks[0])
                for k in range(len(chunks)):
                    prepared = ahead.result()
                    if k + 1 < len(chunks):
                        ahead = tokenizer_thread.submit(prepare, chunks[k + 1])
                    results.append(self._finish(prepared, want))
        if want == "words":
            return [w for chunk in results for w in chunk]
        return results[0] if len(results) == 1 else np.concatenate(results)

    def _overlaps_tokenization(self, num_texts: int) -> bool:
        """A fixed rule: on CUDA (the host would otherwise leave the device idle while it tokenizes), for a call of
        more than OVERLAP_CHUNK_TEXTS texts, and not for ELMo (its word numbering is reset per call)."""
        return self.runtime.device.type == "cuda" and not self.model.word_level and num_texts > OVERLAP_CHUNK_TEXTS

    def _prepare(self, words_a: list[list[str]], words_b: list[list[str]] | None, want: str):
        """(windows, word counts, token weights or None) of checked word lists: the tokenizing half of `_encode`."""
        if want == "model" and words_b is None:
            return self._token_weights(words_a)
        windows, counts = self._windows(words_a, words_b)
        if want != "model":
            return windows, counts, None
        return windows, counts, [np.ones(len(w), dtype=np.float32) for w in windows]  # a pair is one window

    def _finish(self, prepared, want: str):
        """Run the windows of one `_prepare` and pool them as `want` asks: the encoding half of `_encode`."""
        windows, counts, weights = prepared
        if want == "words":
            return self._run(windows, counts, want_words=True, want_cls=False)[0]
        if want == "cls":
            return self._run(windows, counts, want_words=False, want_cls=True)[1]
        n_layers = 1 if self.single_layer else len(self.layer_indices)
        pooler = TokenPooler(self.model_pooling, len(counts), n_layers, self.model.hidden_size)
        self._run(windows, counts, want_words=False, want_cls=False, tokens=(pooler, weights))
        return pooler.result()  # (texts, layers, width)

    def _token_weights(self, words: list[list[str]]) -> tuple[list[EncoderInput], list[int], list[np.ndarray]]:
        """The windows of the checked word lists (as `_windows` cuts them), their word counts, and one weight per position of
        each window: 1 for a piece of a word the window owns, 0 for the other pieces (another window answers for
        them), 1 / (the text's number of windows) for a special token. One window: every position weighs 1."""
        offset = self.tokenizer.build_inputs([])[2]  # special tokens before the text's first piece
        windows, weights = [], []
        for i, pieces in enumerate(self.tokenizer.encode_words(words)):
            rows = self.plan.single(i, pieces)
            if len(rows) == 1:  # one window (the common case): every position weighs 1, no second cut needed
                windows.append(rows[0])
                weights.append(np.ones(len(rows[0]), dtype=np.float32))
                continue
            spans = pieces.spans()
            # the same cut, with its piece ranges: split_windows is what plan.single windows by
            cuts = split_windows(spans, self.plan.window_size, self.plan.stride)
            assert len(cuts) == len(rows)
            for row, (p0, p1, owned) in zip(rows, cuts):
                w = np.full(len(row), 1.0 / len(rows), dtype=np.float32)  # (seq,) special tokens: shared
                w[offset : offset + p1 - p0] = 0.0
                for word in owned:
                    s, e = spans[word]
                    w[offset + s - p0 : offset + min(e, p1) - p0] = 1.0
                windows.append(row)
                weights.append(w)
        return windows, [len(w) for w in words], weights
