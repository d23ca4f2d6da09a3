"""The front class: `Featurizer` (settings, then embed_words / embed_sentences / embed_tokens / embed_ids) over the
featurize package's rooms, as transformers' Pipeline runs preprocess, forward and postprocess:

    settings.py  arguments checked, the model loaded in the dtype that runs, the layers chosen
    rows.py      preprocess: texts -> words -> pieces -> windows -> encoder rows, one builder per input kind
    pipeline.py  forward: rows -> length-sorted token-budget batches -> the runtime (`ctxrep.runtime`)
    pooling.py   postprocess: the word and sentence poolings (explicit tables) and what each call collects
    chunks.py    late chunking and plain chunks of a text
    spec.py      FeaturizerSpec: the settings that decide a vector, as writers record them
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ctxrep import runtime
from ctxrep.featurize import chunks as chunking
from ctxrep.featurize import pipeline
from ctxrep.featurize.chunks import Chunks
from ctxrep.featurize.pooling import (
    SENTENCE_POOLERS,
    WORD_POOLERS,
    Readout,
    TokenStateRows,
    TokenStates,
    WordVectors,
    pool_rows,
    truncated,
)
from ctxrep.featurize.rows import Alignment, sentence_rows, token_id_rows, word_rows
from ctxrep.featurize.settings import auto_sentence_pooling, check_settings, layer_choice, load, precision_of
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING
from ctxrep.models.encoder import Encoder
from ctxrep.models.sentence_transformers import read_prompts, with_prompt
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.text.inputs import Rows, Text, WindowPlan, as_list, check_texts, words_of
from ctxrep.util.arrays import normalize_rows


class Featurizer:
    """Turn texts into contextual vectors.

    layers: an index (negative counts from the top; 0 is the embedding output), a list of indices,
        "all" (every layer, embedding output first), "mix" (the plain average of all layers), or a
        `ScalarMix` over all num_layers + 1 layers (e.g. `ScalarMix.from_weights([...])`).
    pooling: how a word's subword pieces become one vector: "first", "last", "mean" or "first_last"
        (the first and last piece concatenated, 2 x hidden wide). A word's leading piece that is only a
        word-start marker ("▁" or "Ġ") is left out when the word has other pieces: it is the same for every such word.
    sentence_pooling: "mean" (over the text's word vectors), "cls" (the classification token), "lasttoken" (the text's
        last token, special tokens included: a causal decoder's embedding, `ctxrep info` proposes it), or "model": what a
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
    progress: False, True (a bar over each call's tokens on a terminal, plain lines in a log), or a function called
        after each batch with (tokens done, tokens in the call): a caller's own progress (`ctxrep embed`'s shards).
    normalize: embed_sentences returns unit-length vectors, v / max(||v||, 1e-12) per layer (so that a dot product is
        the cosine, as sentence-transformers' normalize_embeddings); word vectors are left as they are.
    between_batches: None, or a function called between two batches of a call with one argument, `drain`: calling
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
        progress: bool | Callable[[int, int], None] = False,
        compile: bool | str = "auto",
        quantize: str | None = None,
        normalize: bool = False,
        device: str | torch.device | None = None,
        precision: str | None = None,
        backend: str = "torch",
    ) -> None:
        precision = check_settings(pooling, sentence_pooling, compile, quantize, precision, backend)
        device = runtime.parse_device(device)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        loaded, precision = load(model, device, backend, precision)
        self.model, self.tokenizer, self.source = loaded.model, loaded.tokenizer, loaded.source
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
        self.pooling = pooling
        self.sentence_pooling = sentence_pooling
        SENTENCE_POOLERS[sentence_pooling].check(self)
        # sentence_pooling="model": the folder's modules.json + Pooling config, read (or refused) once, here
        self.model_pooling = SENTENCE_POOLERS[sentence_pooling].folder_pooling(self)
        self.prompts = read_prompts(self.source.folder)  # config_sentence_transformers.json's, or none
        self.progress = progress
        self.max_length = min(max_length or self.model.max_tokens, self.model.max_tokens)
        self.batch_tokens = batch_tokens or runtime.hardware.default_batch_tokens(
            next(self.model.parameters()).device, self.model.hidden_size, self.model.num_layers
        )
        self.plan = WindowPlan(self.tokenizer, self.max_length, stride)
        self.layer_indices, self.mix, self.single_layer = layer_choice(layers, self.model.num_layers)
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
        view.layer_indices, view.mix, view.single_layer = layer_choice(layers, self.model.num_layers)
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
        return self.model.hidden_size * WORD_POOLERS[self.pooling].width

    @property
    def sentence_dim(self) -> int:
        """Width of one sentence vector: the word width for "mean", the hidden size for "cls", and for "model" the
        hidden size x the number of pooling modes the folder concatenates."""
        return SENTENCE_POOLERS[self.sentence_pooling].width(self)

    def tokenize(self, texts: Sequence[Text]) -> list[Alignment]:
        """The words, subword tokens and `word_ids` of each text (no special tokens). `word_ids` follow the word
        pooling's rule (`text.tokenizer.WordPieces.pooling_spans`): a bare word-start marker ("▁", "Ġ") before its
        word's other pieces belongs to no word (None), so that each word's first piece by `word_ids` is the one
        pooling="first" reads."""
        words = [words_of(t, i) for i, t in enumerate(as_list(texts))]
        pieces = self.tokenizer.encode_words(words)
        return [Alignment(w, p.tokens, p.pooled_word_ids()) for w, p in zip(words, pieces)]

    def run_rows(
        self,
        rows: Rows,
        consume: Callable[[torch.Tensor, np.ndarray, np.ndarray | None], None],
        padded: bool = False,
    ) -> None:
        """Encode every row (text.inputs.Rows: windows of pieces) in length-sorted token-budget batches;
        `consume(selected, batch_rows, weights)` pools each batch once its hidden states (layers, batch, seq, hidden)
        are on the CPU as float32 (after the mix). The seam for tools that pool rows their own way (late_interaction's
        expanded ColBERT queries, which read positions whose attention_mask is 0: `padded=True` runs every batch on
        the padded grid, as transformers does, instead of the family's unpadding rule)."""
        pipeline.run_rows(self, rows, consume, padded)

    def embed_words(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None = None) -> list[np.ndarray]:
        """One float32 array per text: (n_words, dim) for one layer or a mix, (n_words, n_layers, dim) otherwise.

        With `text_pairs`, text i is encoded together with text_pairs[i] ([CLS] A [SEP] B [SEP]) and its
        array holds A's words, then B's.
        """
        words = self._encode(texts, text_pairs, WordVectors)
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
                return chunking.plain_chunks(self, texts, chunks, prompt, prompt_name, dimensions)
            if (prompt, prompt_name, dimensions) != (None, None, None):
                raise ValueError(
                    "late chunks take no prompt, prompt_name or dimensions (the chunks index the document's tokens); "
                    "leave them out, or give late_chunking=False for plain per-chunk vectors"
                )
            return chunking.late_chunks(self, texts, chunks)
        prefix = self.prompts.resolve(prompt, prompt_name)
        pooler = SENTENCE_POOLERS[self.sentence_pooling]
        out = self._encode(
            with_prompt(prefix, as_list(texts)), text_pairs, pooler.readout, pooler.left_out(self, prefix)
        )
        out = pooler.finish(self, out)
        out = out[:, 0] if self.single_layer else out
        if dimensions is not None:
            return truncated(out, dimensions)
        return normalize_rows(out) if self.normalize else out  # each layer's vector unit length

    def embed_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Sentence vectors of texts given as token ids (this tokenizer's, without special tokens; e.g. a corpus
        tokenized once ahead): what embed_sentences gives for the texts these ids come from, under the model's own
        pooling or the classification token (the mean of words needs words). The template's special tokens are added
        here; a sequence longer than one window is windowed with every token as its own word (a window may then start
        inside a word where embed_sentences starts it on the word's first piece: a slightly different vector)."""
        pooler = SENTENCE_POOLERS[self.sentence_pooling]
        if not pooler.pools_token_ids or self.tokenizer.word_level:
            raise ValueError(
                "embed_ids pools tokens without words: it needs sentence_pooling='model' or 'cls' and a subword "
                f"tokenizer (this featurizer: {self.sentence_pooling!r}, {self.model.family}); use embed_sentences"
            )
        ids = as_list(ids)
        self.cut_texts = []  # every token is its own word: nothing to cut
        out = pool_rows(self, token_id_rows(self.tokenizer, self.plan, ids), pooler.readout) if ids else None
        out = pooler.readout.empty(self) if out is None else out
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
        return self._encode(texts, None, TokenStateRows)

    def _encode(self, texts: Sequence[Text], text_pairs: Sequence[Text] | None, readout: type[Readout], left_out=""):
        """Every text's result, as `readout` collects it (`pooling.py`). Every text is checked first, so errors
        name its index in the call; then `pipeline.run_in_chunks` prepares the rows (`rows.py`) and runs them.
        `left_out`: a prompt whose positions the pooling leaves out."""
        texts = as_list(texts)
        by_words = text_pairs is not None or readout.needs_words  # word alignment: split every text once, here
        if by_words:
            texts = [words_of(t, i) for i, t in enumerate(texts)]
        else:
            check_texts(texts)
        pairs = None
        if text_pairs is not None:
            pairs = [words_of(t, i) for i, t in enumerate(as_list(text_pairs))]
            if len(pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(pairs)} text_pairs; give one pair text per text")

        if not texts:  # nothing to run: the empty result, shaped as any other
            self.cut_texts = []
            return readout.empty(self)

        def prepare(chunk: slice):
            if by_words:
                return word_rows(self.tokenizer, self.plan, texts[chunk], None if pairs is None else pairs[chunk])
            return sentence_rows(self.tokenizer, self.plan, texts[chunk], readout.one_sequence)

        overlap = self._overlaps_tokenization(len(texts))
        results, cut = pipeline.run_in_chunks(
            len(texts), overlap, prepare, lambda p: pool_rows(self, p, readout, left_out)
        )
        self.cut_texts = sorted(cut)
        return readout.join(results)

    def _overlaps_tokenization(self, num_texts: int) -> bool:
        """Whether a call of `num_texts` texts is tokenized in chunks on a thread (`pipeline.overlaps_tokenization`)."""
        return pipeline.overlaps_tokenization(self.runtime.device, self.model.word_level, num_texts)
