"""An embedding job: what to embed and how (`EmbedJob`), what the run left (`EmbedSummary`).

job = EmbedJob("corpus.txt", "out/", model="minilm", level="sentence")
job.settings()       # the manifest's record of the input and the shard layout
job.featurizer()     # the Featurizer (or SparseEncoder) it embeds with
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxrep.embed.records import DEFAULT_TEXT_COLUMN, FORMATS, to_stderr
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING, FeaturizerSpec, parse_layers
from ctxrep.vectors.quantize import PRECISIONS


@dataclass
class EmbedJob:
    """What to embed and how. Everything but the performance knobs (batch_tokens, threads, compile, device) is
    recorded in the manifest (the input and the layout in `settings()`, the vectors in `spec_of(featurizer)`): a
    resumed run must ask for the same."""

    input_path: str
    out_dir: str
    model: str = "minilm"
    fmt: str = "text"
    text_field: str = DEFAULT_TEXT_COLUMN
    header: bool | None = None  # csv / tsv: whether the first row names the columns (ctxrep.data.table's rule)
    level: str = "word"  # "word" or "sentence"
    layers: int | list[int] | str = -1
    pooling: str = "mean"
    sentence_pooling: str = DEFAULT_SENTENCE_POOLING
    shard_size: int = 2000
    storage: str = "safetensors"
    skip_empty: bool = False
    batch_tokens: int | None = None  # None: the Featurizer's default for the device
    threads: int | None = None
    quantize: str | None = None
    compile: bool | str = "auto"
    device: str | None = None
    precision: str | None = None  # None: the model's own dtype (a given "fp32" loads a bf16 checkpoint as float32)
    backend: str = "torch"
    output: str = "dense"  # "sparse": SPLADE vectors over the vocabulary (ctxrep.vectors.sparse), sentence level
    dimensions: int | None = None  # sentence vectors: the first N coordinates, renormalised (Matryoshka)
    prompt: str | None = None  # sentence vectors: text put before every text
    prompt_name: str | None = None  # sentence vectors: the model folder's prompt of that name
    output_precision: str = "float32"  # sentence vectors written as float32 or int8/uint8/binary/ubinary codes
    calibration: str | None = None  # int8 / uint8: the file the ranges come from (default: the first shard)
    chunks: str | int | None = None  # sentence vectors: one per chunk ("sentences" or N tokens) instead of per text
    late_chunking: bool = True  # chunks pooled from the whole text's token vectors; False: each chunk embedded alone
    extra_settings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.shard_size < 1:
            raise ValueError(f"--shard-size must be at least 1, got {self.shard_size}")
        if self.level not in ("word", "sentence"):
            raise ValueError(f"level must be 'word' or 'sentence', got {self.level!r}")
        if self.storage not in ("safetensors", "npy"):
            raise ValueError(f"storage must be 'safetensors' or 'npy', got {self.storage!r}")
        if self.fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.fmt!r}")
        if isinstance(self.layers, str) and self.layers not in ("all", "mix"):
            self.layers = parse_layers(self.layers)
        if self.output not in ("dense", "sparse"):
            raise ValueError(f"output must be 'dense' or 'sparse', got {self.output!r}")
        if self.output == "sparse" and (self.level != "sentence" or self.storage != "safetensors" or self.layers != -1):
            raise ValueError(
                "--output sparse writes one sparse vector per text from the last layer: use --level sentence, "
                "safetensors storage and the default --layers"
            )
        self._check_sentence_options()
        self._check_output_precision()
        self._check_chunks()
        if self.header is not None and self.fmt not in ("csv", "tsv"):
            raise ValueError(f"--header / --no-header apply to --format csv or tsv, not {self.fmt}")
        if self.fmt in ("csv", "tsv"):  # a numbered column without --header / --no-header: refused before any work
            from ctxrep.data.table import decide_header

            decide_header(Path(self.source), self.fmt, self.header, {"--text-column": self.text_field})
        if self.fmt == "parquet" and self.input_path == "-":
            raise ValueError("--format parquet reads a file, not standard input; give --input FILE")

    def _check_sentence_options(self) -> None:
        given = [
            flag
            for flag, value in (
                ("--dimensions", self.dimensions),
                ("--prompt", self.prompt),
                ("--prompt-name", self.prompt_name),
            )
            if value is not None
        ]
        if not given:
            return
        if self.level != "sentence" or self.output != "dense":
            raise ValueError(
                f"{' / '.join(given)} apply to dense sentence vectors: add --level sentence"
                + (" and leave out --output sparse" if self.output != "dense" else "")
            )
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError("give --prompt (a text) or --prompt-name (a prompt the model folder declares), not both")
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"--dimensions must be a positive integer, got {self.dimensions!r}")

    def _check_output_precision(self) -> None:
        """--output-precision other than float32 (and --calibration) apply to dense sentence vectors of one layer."""
        if self.output_precision == "float32" and self.calibration is None:
            return
        if self.output_precision not in PRECISIONS:
            raise ValueError(
                f"--output-precision must be one of {', '.join(PRECISIONS)}, got {self.output_precision!r}"
            )
        flag = "--calibration" if self.output_precision == "float32" else f"--output-precision {self.output_precision}"
        if self.calibration is not None and self.output_precision not in ("int8", "uint8"):
            raise ValueError("--calibration gives int8 / uint8 ranges: add --output-precision int8 or uint8")
        wrong = []
        if self.level != "sentence":
            wrong.append("add --level sentence")
        if self.output != "dense":
            wrong.append("leave out --output sparse")
        if self.layers == "all" or isinstance(self.layers, list):
            wrong.append("give one --layers (or mix)")
        if wrong:
            raise ValueError(f"{flag} quantizes dense sentence vectors of one layer: {'; '.join(wrong)}")

    def _check_chunks(self) -> None:
        """--chunks applies to dense sentence vectors; late chunks take no prompt or dimensions."""
        if isinstance(self.chunks, str) and self.chunks.isdigit():
            self.chunks = int(self.chunks)
        if self.chunks is None:
            if not self.late_chunking:
                raise ValueError("--no-late-chunking applies to --chunks: add --chunks sentences or --chunks N")
            return
        if self.chunks != "sentences" and not (
            isinstance(self.chunks, int) and not isinstance(self.chunks, bool) and self.chunks >= 1
        ):
            raise ValueError(f"--chunks must be 'sentences' or a positive number of tokens, got {self.chunks!r}")
        if self.level != "sentence" or self.output != "dense":
            raise ValueError(
                f"--chunks {self.chunks} cuts dense sentence vectors: "
                + ("add --level sentence" if self.level != "sentence" else "leave out --output sparse")
            )
        given = [f for f, v in (("--dimensions", self.dimensions), ("--prompt", self.prompt),
                                ("--prompt-name", self.prompt_name)) if v is not None]  # fmt: skip
        if self.late_chunking and given:
            raise ValueError(
                f"{' / '.join(given)}: late chunks index the whole text's tokens and take none; leave them out, or "
                "add --no-late-chunking (each chunk embedded alone)"
            )

    @property
    def source(self) -> str:
        return "<stdin>" if self.input_path == "-" else self.input_path

    def sentence_options(self) -> dict:
        """The keyword arguments of `embed_sentences` this job adds (dimensions, prompt, prompt_name, chunks,
        late_chunking), those given."""
        options = {"dimensions": self.dimensions, "prompt": self.prompt, "prompt_name": self.prompt_name}
        if self.chunks is not None:
            options.update(chunks=self.chunks, late_chunking=self.late_chunking)
        return {k: v for k, v in options.items() if v is not None}

    def check_prompt(self) -> None:
        """An unknown --prompt-name is a one-line ValueError naming the prompts the model folder declares, read
        from the folder without loading its weights."""
        if self.prompt_name is None:
            return
        from ctxrep.models.loading import resolve
        from ctxrep.models.sentence_transformers import read_prompts

        try:
            read_prompts(resolve(self.model).folder).resolve(None, self.prompt_name)
        except ValueError as e:
            raise ValueError(f"--prompt-name: {e}") from None

    def spec_of(self, fz) -> FeaturizerSpec:
        """The FeaturizerSpec of what this job writes with `fz`: the Featurizer's, with the dimensions and the
        prompt text (resolved from its name, or the folder's default prompt; None without one) of sentence vectors."""
        spec = FeaturizerSpec.of(fz)
        if self.level != "sentence" or self.output != "dense":
            return spec
        prompt = fz.prompts.resolve(self.prompt, self.prompt_name) or None  # None: no prompt, as a plain run
        if self.chunks is not None and self.late_chunking:
            prompt = None  # late chunks pool the text's own tokens: no prompt, not even the folder's default
        return replace(spec, dimensions=self.dimensions, prompt=prompt)

    def settings(self) -> dict:
        """The manifest's `settings`: what decides which texts are read and how the shards are laid out (the input
        and its fingerprint, format, column, header, level, shard size, storage). What decides the vectors themselves
        (model, layers, pooling, precision, ...) is the manifest's `spec` (`spec_of`), recorded once, not here."""
        settings = {
            "format": self.fmt,
            "text_field": self.text_field,
            "level": self.level,
            "shard_size": self.shard_size,
            "storage": self.storage,
            "skip_empty": self.skip_empty,
            **_fingerprint(self.input_path),
        }
        if self.header is not None:  # decides which rows are texts
            settings["header"] = self.header
        if self.chunks is not None:  # rows are chunks: the index's `word` column is the chunk's number in its text
            settings.update(chunks=self.chunks, late_chunking=self.late_chunking)
        if self.output_precision != "float32":  # how the shards store the vectors (the ranges: `quantization`)
            settings["output_precision"] = self.output_precision
        settings.update(self.extra_settings)
        return settings

    def featurizer(self, device: str | None = None, threads: int | None = None):
        """The Featurizer this job embeds with (on `device`, with `threads` torch threads, when given); for
        output="sparse" the SparseEncoder over it."""
        from ctxrep.featurize import Featurizer

        kwargs: dict[str, Any] = {}
        device = device if device is not None else self.device
        # the runtime options (device, precision, backend) are passed only when asked for, so that a Featurizer
        # without them still serves the default run
        if device not in (None, "cpu"):
            kwargs["device"] = device
        precision = "int8" if self.quantize == "int8" else self.precision  # the old quantize="int8" spelling
        if precision is not None:
            kwargs["precision"] = precision
        if self.backend != "torch":
            kwargs["backend"] = self.backend
        fz = Featurizer(
            self.model,
            layers=self.layers,
            pooling=self.pooling,
            sentence_pooling="mean" if self.output == "sparse" else self.sentence_pooling,  # sparse: unread
            batch_tokens=self.batch_tokens,
            num_threads=threads if threads is not None else self.threads,
            compile=self.compile,
            **kwargs,
        )
        if self.output == "sparse":  # the same interface: embed_sentences gives a (texts, vocabulary) csr_matrix
            from ctxrep.vectors.sparse import SparseEncoder

            return SparseEncoder(fz)
        self.check_width(fz)
        return fz

    def check_width(self, fz) -> None:
        """--dimensions wider than the model's sentence vectors: a one-line ValueError before any text runs."""
        if self.dimensions is not None and self.dimensions > fz.sentence_dim:
            raise ValueError(
                f"--dimensions {self.dimensions} is more than {self.model}'s {fz.sentence_dim}-wide sentence vectors "
                f"(--sentence-pooling {fz.sentence_pooling}); give at most {fz.sentence_dim}"
            )


@dataclass
class EmbedSummary:
    """What a run left in its folder."""

    out: Path
    model: str
    level: str
    texts: int
    rows: int
    row_shape: tuple[int, ...]  # the shape of one row: (dim,) or (layers, dim)
    shards: int
    resumed_shards: int = 0
    already_complete: bool = False
    precision: str = "float32"  # --output-precision: what the rows hold
    dim: int | None = None  # the vectors' width where rows are stored narrower (binary codes)

    def describe(self) -> str:
        """One line for the user, e.g. "wrote 7 word vectors (7 layers x 384) of minilm for 2 texts to out"."""
        if self.already_complete:
            return f"{self.out}: already complete ({self.texts} texts, {self.rows} rows); nothing to do"
        shape = describe_row_shape(self.row_shape)
        if self.precision in ("binary", "ubinary"):
            shape = f"{self.dim} wide as {self.precision} codes, {self.row_shape[-1]} bytes a row"
        elif self.precision != "float32":
            shape += f" {self.precision} codes"
        return f"wrote {self.rows} {self.level} vectors ({shape}) of {self.model} for {self.texts} texts to {self.out}"


def describe_row_shape(row_shape: tuple[int, ...] | list[int]) -> str:
    """(384,) -> "384 wide"; (7, 384) -> "7 layers x 384 wide"."""
    if len(row_shape) == 1:
        return f"{row_shape[0]} wide"
    return f"{row_shape[0]} layers x {row_shape[1]} wide"


def _fingerprint(path: str) -> dict:
    if path == "-":
        return {"input": "-"}
    st = os.stat(path)
    return {"input": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def choose_precision(job: EmbedJob, device: str | None, log: Callable[[str], None] = to_stderr) -> EmbedJob:
    """`job` with precision "auto" replaced by the precision it chooses on `device` (the Featurizer's rule,
    `runtime.hardware.auto_precision`), so that the manifest records what ran; says the choice in one line, and one
    more where the precision runs slower than float32 on this hardware (`hardware.slower_than_fp32`)."""
    import torch

    from ctxrep.runtime import hardware, parse_device, runtime_class

    where = parse_device(device) or torch.device("cpu")
    chosen = job.precision
    if job.precision == "auto":
        chosen = hardware.auto_precision(where, runtime_class(job.backend).precisions)
        why = "native bfloat16 on this device" if chosen == "bf16" else "no native bfloat16 on this device"
        log(f"precision: {chosen} (auto: {why})")
    slow = hardware.slower_than_fp32(where, job.backend, chosen)
    if slow:
        log(f"note: {slow}")
    return replace(job, precision=chosen) if chosen != job.precision else job
