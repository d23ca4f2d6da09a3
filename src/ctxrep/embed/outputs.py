"""What an embedding job writes: one output variant, which checks its own options and answers what a run needs.

    WordVectors(layers=-1, pooling="mean")          one row per word: (dim,), or (layers, dim) for several layers
    SentenceVectors(dimensions=256, prompt_name=..) one row per text, or per chunk (chunks="sentences" or N tokens);
                                                    float32 or int8 / uint8 / binary / ubinary codes (output_precision)
    SparseVectors()                                 one SPLADE row per text over the vocabulary, from the last layer

Every variant answers the same questions, and the rooms that embed (shards.py, run.py, workers.py, ray_engine.py)
ask them instead of comparing names: the Featurizer's options (`featurizer_options`) and what embeds with it
(`encoder`), one shard's rows and index entries (`rows`), a row's shape (`row_shape`), the spec of the vectors
(`spec`), what it adds to the manifest's settings (`settings`), the codes it stores (`codes`), the Featurizer
settings that do not decide its vectors (`unread`: not compared on resume) and what only `--engine local` writes
(`local_only`).

`vectors_of(level, output, options)` is the one place where `ctxrep embed`'s --level / --output become a variant;
an option the variant does not take is refused in one line naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from ctxrep.embed.codes import OutputCodes, output_codes
from ctxrep.embed.records import Record
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING, FeaturizerSpec, layers_text, parse_layers
from ctxrep.vectors.quantize import PRECISIONS

STORAGES = ("safetensors", "npy")  # the shard files: write_arrays' `storage`


class _Vectors:
    """What every output variant answers; the defaults are those of dense vectors written as float32."""

    level: ClassVar[str]  # the manifest's settings["level"] and the summary's "wrote N ... vectors"
    flag: ClassVar[str]  # how `ctxrep embed` asks for it
    form: ClassVar[str] = "dense"  # what a store's row holds (`ctxrep embed --store`): dense or sparse
    storages: ClassVar[tuple[str, ...]] = STORAGES
    unread: ClassVar[tuple[str, ...]] = ()  # Featurizer settings these vectors do not depend on
    layers: Any
    pooling: str
    sentence_pooling: str

    def featurizer_options(self) -> dict:
        """The Featurizer's keyword arguments that decide these vectors (layers, pooling, sentence_pooling)."""
        return {"layers": self.layers, "pooling": self.pooling, "sentence_pooling": self.sentence_pooling}

    def embed_options(self) -> dict:
        """The keyword arguments of `embed_sentences` these vectors add (none but for sentence vectors)."""
        return {}

    def check_prompt(self, model: str) -> None:
        """Refuse an unknown prompt name before the model loads (sentence vectors only ask for one)."""

    def encoder(self, fz, model: str):
        """What embeds the shards, built over the Featurizer `fz` of `model` (itself, or a SparseEncoder)."""
        return fz

    def row_shape(self, fz) -> tuple[int, ...]:
        """The shape of one float row `fz` (this variant's `encoder`) gives: (dim,), or (layers, dim)."""
        return _shape(fz, fz.dim)

    def rows(self, fz, records: list[Record], first_text: int) -> tuple[Any, list[tuple]]:
        """The rows of `records` (text number `first_text` onwards) and one index entry (text, line, word position,
        word) per row."""
        raise NotImplementedError

    def spec(self, fz) -> FeaturizerSpec:
        """The FeaturizerSpec of the vectors `fz` (this variant's `encoder`) writes: the manifest's `spec`."""
        return FeaturizerSpec.of(fz)

    def settings(self) -> dict:
        """What these vectors add to the manifest's `settings` besides `level` (how rows are cut and stored)."""
        return {}

    def codes(self, recorded: dict | None, where: str) -> OutputCodes:
        """The codes the shards are written in (`recorded`: a resumed folder's manifest `quantization`)."""
        return OutputCodes()

    def local_only(self) -> str | None:
        """The flag of an option only `--engine local` writes, or None."""
        return None

    def legacy_settings(self) -> dict:
        """The vector settings a manifest of ctxrep before issue 31 kept in `settings` for these vectors."""
        return {
            "layers": layers_text(self.layers),
            "pooling": self.pooling,
            "sentence_pooling": self.sentence_pooling,
            **self.embed_options(),
        }


@dataclass(frozen=True)
class WordVectors(_Vectors):
    """One row per word: its subword pieces pooled (`pooling`: first, last, mean, first_last) at `layers` (an index,
    a list, "all" or "mix")."""

    layers: int | list[int] | str = -1
    pooling: str = "mean"

    level: ClassVar[str] = "word"
    flag: ClassVar[str] = "--level word"
    sentence_pooling: ClassVar[str] = DEFAULT_SENTENCE_POOLING  # the Featurizer's default; word vectors never read it
    unread: ClassVar[tuple[str, ...]] = ("sentence_pooling",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _layers(self.layers))

    def rows(self, fz, records: list[Record], first_text: int) -> tuple[np.ndarray, list[tuple]]:
        per_text = fz.embed_words([r.words for r in records])
        vectors = np.concatenate(per_text) if per_text else np.zeros((0, *self.row_shape(fz)), np.float32)
        index = [(first_text + t, r.line, w, word) for t, r in enumerate(records) for w, word in enumerate(r.words)]
        return vectors, index


@dataclass(frozen=True)
class SentenceVectors(_Vectors):
    """One row per text (or per chunk of it): the text's word vectors pooled (`sentence_pooling`: mean, cls, the
    model folder's own, or auto) at `layers`.

    dimensions: the first N coordinates, unit length again (Matryoshka). prompt / prompt_name: a text put before
    every text, or the model folder's prompt of that name. output_precision: float32, or the codes of
    sentence-transformers' quantize_embeddings (int8 / uint8 on ranges from `calibration`, a file, or the first
    shard; binary / ubinary), for vectors of one layer. chunks: one row per chunk, "sentences" or N tokens, pooled
    from the whole text's token vectors (`late_chunking`, taking no prompt or dimensions) or embedded alone."""

    layers: int | list[int] | str = -1
    pooling: str = "mean"
    sentence_pooling: str = DEFAULT_SENTENCE_POOLING
    dimensions: int | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    output_precision: str = "float32"
    calibration: str | None = None
    chunks: str | int | None = None
    late_chunking: bool = True

    level: ClassVar[str] = "sentence"
    flag: ClassVar[str] = "--level sentence"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _layers(self.layers))
        if isinstance(self.chunks, str) and self.chunks.isdigit():
            object.__setattr__(self, "chunks", int(self.chunks))
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"--dimensions must be a positive integer, got {self.dimensions!r}")
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError("give --prompt (a text) or --prompt-name (a prompt the model folder declares), not both")
        self._check_output_precision()
        self._check_chunks()

    def _check_output_precision(self) -> None:
        if self.output_precision not in PRECISIONS:
            raise ValueError(
                f"--output-precision must be one of {', '.join(PRECISIONS)}, got {self.output_precision!r}"
            )
        if self.calibration is not None and self.output_precision not in ("int8", "uint8"):
            raise ValueError("--calibration gives int8 / uint8 ranges: add --output-precision int8 or uint8")
        if self.output_precision != "float32" and (self.layers == "all" or isinstance(self.layers, list)):
            raise ValueError(
                f"--output-precision {self.output_precision} quantizes sentence vectors of one layer: give one "
                "--layers (or mix)"
            )

    def _check_chunks(self) -> None:
        if self.chunks is None:
            if not self.late_chunking:
                raise ValueError("--no-late-chunking applies to --chunks: add --chunks sentences or --chunks N")
            return
        if self.chunks != "sentences" and not (
            isinstance(self.chunks, int) and not isinstance(self.chunks, bool) and self.chunks >= 1
        ):
            raise ValueError(f"--chunks must be 'sentences' or a positive number of tokens, got {self.chunks!r}")
        given = [f for f, v in (("--dimensions", self.dimensions), ("--prompt", self.prompt),
                                ("--prompt-name", self.prompt_name)) if v is not None]  # fmt: skip
        if self.late_chunking and given:
            raise ValueError(
                f"{' / '.join(given)}: late chunks index the whole text's tokens and take none; leave them out, or "
                "add --no-late-chunking (each chunk embedded alone)"
            )

    def embed_options(self) -> dict:
        """The keyword arguments of `embed_sentences` given (dimensions, prompt, prompt_name, chunks,
        late_chunking)."""
        options = {"dimensions": self.dimensions, "prompt": self.prompt, "prompt_name": self.prompt_name}
        if self.chunks is not None:
            options.update(chunks=self.chunks, late_chunking=self.late_chunking)
        return {k: v for k, v in options.items() if v is not None}

    def check_prompt(self, model: str) -> None:
        """An unknown --prompt-name is a one-line ValueError naming the prompts the model folder declares, read from
        the folder without loading its weights."""
        if self.prompt_name is None:
            return
        from ctxrep.models.loading import resolve
        from ctxrep.models.sentence_transformers import read_prompts

        try:
            read_prompts(resolve(model).folder).resolve(None, self.prompt_name)
        except ValueError as e:
            raise ValueError(f"--prompt-name: {e}") from None

    def encoder(self, fz, model: str):
        """`fz` itself; --dimensions wider than its sentence vectors is a one-line ValueError before any text runs."""
        if self.dimensions is not None and self.dimensions > fz.sentence_dim:
            raise ValueError(
                f"--dimensions {self.dimensions} is more than {model}'s {fz.sentence_dim}-wide sentence vectors "
                f"(--sentence-pooling {fz.sentence_pooling}); give at most {fz.sentence_dim}"
            )
        return fz

    def row_shape(self, fz) -> tuple[int, ...]:
        return _shape(fz, self.dimensions if self.dimensions is not None else fz.sentence_dim)

    def rows(self, fz, records: list[Record], first_text: int) -> tuple[np.ndarray, list[tuple]]:
        """One row per text; with chunks, one per chunk, its number in the text in the index's word column."""
        words = [r.words for r in records]
        if self.chunks is None:
            return _one_per_text(fz.embed_sentences(words, **self.embed_options()), records, first_text)
        texts = [" ".join(w) for w in words] if self.chunks == "sentences" else words  # sentences are cut in strings
        per_text = fz.embed_sentences(texts, **self.embed_options())
        vectors = np.concatenate(per_text) if per_text else np.zeros((0, *self.row_shape(fz)), np.float32)
        index = [(first_text + t, r.line, c, "") for t, r in enumerate(records) for c in range(len(per_text[t]))]
        return vectors, index

    def spec(self, fz) -> FeaturizerSpec:
        """The Featurizer's spec, with the dimensions and the prompt text (resolved from its name, or the folder's
        default prompt; None without one)."""
        prompt = fz.prompts.resolve(self.prompt, self.prompt_name) or None  # None: no prompt, as a plain run
        if self.chunks is not None and self.late_chunking:
            prompt = None  # late chunks pool the text's own tokens: no prompt, not even the folder's default
        return replace(FeaturizerSpec.of(fz), dimensions=self.dimensions, prompt=prompt)

    def settings(self) -> dict:
        settings: dict = {}
        if self.chunks is not None:  # rows are chunks: the index's `word` column is the chunk's number in its text
            settings.update(chunks=self.chunks, late_chunking=self.late_chunking)
        if self.output_precision != "float32":  # how the shards store the vectors (the ranges: `quantization`)
            settings["output_precision"] = self.output_precision
        return settings

    def codes(self, recorded: dict | None, where: str) -> OutputCodes:
        return output_codes(self.output_precision, self.calibration, recorded, where)

    def local_only(self) -> str | None:
        if self.chunks is not None:
            return "--chunks"
        if self.output_precision != "float32":
            return f"--output-precision {self.output_precision}"
        return None


@dataclass(frozen=True)
class SparseVectors(_Vectors):
    """One SPLADE vector per text over the vocabulary (ctxrep.vectors.sparse.SparseEncoder: a model with a masked-LM
    head, or BGE-M3's sparse head), from the last layer's token states; stored as CSR arrays in safetensors."""

    level: ClassVar[str] = "sentence"
    flag: ClassVar[str] = "--output sparse"
    form: ClassVar[str] = "sparse"
    storages: ClassVar[tuple[str, ...]] = ("safetensors",)
    layers: ClassVar[int] = -1
    pooling: ClassVar[str] = "mean"  # the token states are read whole: neither pooling decides a sparse vector
    sentence_pooling: ClassVar[str] = "mean"
    unread: ClassVar[tuple[str, ...]] = ("pooling", "sentence_pooling")

    def encoder(self, fz, model: str):
        """The SparseEncoder over `fz`: the same interface, embed_sentences gives a (texts, vocabulary) csr_matrix."""
        from ctxrep.vectors.sparse import SparseEncoder

        return SparseEncoder(fz)

    def row_shape(self, fz) -> tuple[int, ...]:
        return (fz.sentence_dim,)  # the vocabulary

    def rows(self, fz, records: list[Record], first_text: int) -> tuple[Any, list[tuple]]:
        return _one_per_text(fz.embed_sentences([r.words for r in records]), records, first_text)

    def local_only(self) -> str | None:
        return self.flag

    def legacy_settings(self) -> dict:
        return {**super().legacy_settings(), "output": "sparse"}


OutputVectors = WordVectors | SentenceVectors | SparseVectors  # what an EmbedJob writes: one of them

# --level and --output as written on the command line: the variant they choose
VARIANTS: dict[tuple[str, str], type[_Vectors]] = {
    ("word", "dense"): WordVectors,
    ("sentence", "dense"): SentenceVectors,
    ("sentence", "sparse"): SparseVectors,
}
SPARSE = "--output sparse writes one sparse vector per text from the last layer"


def vectors_of(level: str = "word", output: str = "dense", options: dict | None = None) -> OutputVectors:
    """The variant `--level` and `--output` choose, built from `options` (the other vector options given, by field
    name: layers, pooling, sentence_pooling, dimensions, prompt, prompt_name, output_precision, calibration, chunks,
    late_chunking). An option the variant does not take is a one-line ValueError naming its flag."""
    if level not in ("word", "sentence"):
        raise ValueError(f"level must be 'word' or 'sentence', got {level!r}")
    if output not in ("dense", "sparse"):
        raise ValueError(f"output must be 'dense' or 'sparse', got {output!r}")
    if (level, output) not in VARIANTS:
        raise ValueError(f"{SPARSE}: add --level sentence")
    cls = VARIANTS[level, output]
    options = dict(options or {})
    taken = {f.name for f in fields(cls)}
    refused = [_flag(name, value) for name, value in options.items() if name not in taken]
    if refused:
        flags = ", ".join(refused)
        if cls is SparseVectors:
            raise ValueError(f"{SPARSE}: leave out {flags}")
        verb = "applies" if len(refused) == 1 else "apply"
        raise ValueError(f"{flags} {verb} to dense sentence vectors: add --level sentence")
    return cls(**options)


def _flag(name: str, value: Any) -> str:
    """The flag of option `name` as given: late_chunking=False is --no-late-chunking."""
    if name == "late_chunking" and value is False:
        return "--no-late-chunking"
    return "--" + name.replace("_", "-")


def _layers(layers):
    """A layers string of the command line ("6", "0,3") as parse_layers reads it; "all" and "mix" stay."""
    if isinstance(layers, str) and layers not in ("all", "mix"):
        return parse_layers(layers)
    return layers


def _shape(fz, dim: int) -> tuple[int, ...]:
    """(dim,) for one layer or a mix, (layers, dim) for several. (Binary codes are stored narrower:
    `OutputCodes.row_shape`.)"""
    return (dim,) if fz.single_layer else (len(fz.layer_indices), dim)


def _one_per_text(vectors, records: list[Record], first_text: int) -> tuple[Any, list[tuple]]:
    return vectors, [(first_text + t, r.line, -1, "") for t, r in enumerate(records)]


__all__ = ["OutputVectors", "SentenceVectors", "SparseVectors", "WordVectors", "vectors_of"]
