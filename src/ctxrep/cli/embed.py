"""`ctxrep embed`: stream texts from a file (or stdin) into shards of word or sentence vectors.

The work is done by `ctxrep.embed.corpus` (output layout, input formats, resume, several workers: see there); this
module holds only the command's options.
"""

from __future__ import annotations

import warnings

import click
from click.core import ParameterSource

from ctxrep.cli.common import LazyChoice, user_errors
from ctxrep.cli.finetune import COLUMN_RULE, HEADER_HELP
from ctxrep.cli.runtime_options import runtime_options
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING, SENTENCE_POOLINGS, parse_layers


def _formats() -> tuple[str, ...]:
    from ctxrep.embed.corpus import FORMATS  # numpy and the readers: imported to run, not to print --help

    return FORMATS


def _output_precisions() -> tuple[str, ...]:
    from ctxrep.vectors.quantize import PRECISIONS

    return PRECISIONS


def __getattr__(name: str):
    """read_records and load_shards, re-exported for scripts and tests, imported when first asked for."""
    if name in ("read_records", "load_shards"):
        from ctxrep.embed import corpus

        return getattr(corpus, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@click.command()
@click.option("--model", default="minilm", show_default=True, help="Packaged model name or model folder.")
@click.option("--input", "input_path", required=True, help="Input file, or - for standard input.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="Output directory (or --store).")
@click.option(
    "--store",
    "store_uri",
    default=None,
    help="Write the vectors to a store's table instead of --out: lancedb:DIR/TABLE (embedded), "
    "postgresql://USER@HOST:PORT/DB?table=T (pgvector), qdrant://HOST:PORT/COLLECTION or qdrant:DIR/COLLECTION "
    "(the client's local mode), chroma:DIR/COLLECTION. A rerun resumes; each text's rows are written once.",
)
@click.option(
    "--store-text/--no-store-text",
    default=True,
    show_default=True,
    help="--store: keep each text beside its vectors.",
)
@click.option(
    "--format",
    "fmt",
    type=LazyChoice(_formats),
    default=None,
    help="text: one text per line; jsonl: one JSON object per line; csv/tsv: one row per text (after a header "
    "row unless --no-header); conll: token columns, blank-line separated; parquet: a column of texts. A .gz input "
    "is decompressed. [default: from the file name (.csv, .tsv, .jsonl, .conll, with or without .gz), else text]",
)
@click.option(
    "--text-column",
    "--text-field",
    "text_column",
    default=None,
    help=f"The column holding the text: {COLUMN_RULE} (Parquet: a name or a number) [default: text].",
)
@click.option("--header/--no-header", default=None, help=HEADER_HELP)
@click.option("--level", type=click.Choice(["word", "sentence"]), default="word", show_default=True)
@click.option("--layers", default="-1", show_default=True, help="Layer index, comma-separated list, 'all' or 'mix'.")
@click.option(
    "--pooling",
    type=click.Choice(["first", "last", "mean", "first_last"]),
    default="mean",
    show_default=True,
    help="How a word's subword pieces become one vector.",
)
@click.option(
    "--sentence-pooling",
    type=click.Choice(SENTENCE_POOLINGS),
    default=DEFAULT_SENTENCE_POOLING,
    show_default=True,
    help="--level sentence: mean of the word vectors, the classification token, or the model folder's own "
    "pooling (a sentence-transformers folder: modules.json); auto: the folder's pooling where it has one, else mean.",
)
@click.option(
    "--output",
    type=click.Choice(["dense", "sparse"]),
    default="dense",
    show_default=True,
    help="sparse: one SPLADE vector over the vocabulary per text (--level sentence; a model with an MLM head, e.g. "
    "naver/splade-v3, or BGE-M3's sparse head); read back with ctxrep.load_vectors as scipy.sparse rows.",
)
@click.option(
    "--dimensions",
    type=int,
    default=None,
    help="--level sentence: keep the first N coordinates of each vector, then unit length again (Matryoshka; "
    "OpenAI's dimensions). At most the model's width.",
)
@click.option(
    "--prompt",
    default=None,
    help="--level sentence: text put before every text (e.g. 'query: '), as sentence-transformers' encode(prompt=).",
)
@click.option(
    "--prompt-name",
    default=None,
    help="--level sentence: the prompt of that name the model folder declares (config_sentence_transformers.json). "
    "Neither given: the folder's default prompt, if it has one.",
)
@click.option(
    "--output-precision",
    type=LazyChoice(_output_precisions),
    default="float32",
    show_default=True,
    help="--level sentence: what the vectors are written as, sentence-transformers' encode(precision=) / "
    "quantize_embeddings, bit for bit: int8 / uint8 one byte a dimension on per-dimension ranges (--calibration; "
    "recorded in the manifest), binary / ubinary the signs packed 8 to a byte. Not --precision, the precision the "
    "model computes in.",
)
@click.option(
    "--calibration",
    default=None,
    type=click.Path(exists=True),
    help="--output-precision int8 / uint8: where the ranges come from: a .npy of sample float vectors (or of (2, dim) "
    "ranges), or an earlier int8 / uint8 --out folder. Default: the first shard's vectors (--shard-size texts, "
    "embedded before anything is written); needed with several --workers / --devices.",
)
@click.option(
    "--chunks",
    default=None,
    help="--level sentence: one vector per chunk of each text instead of one per text: 'sentences' (cut after . ! ? "
    "and a space) or N (chunks of N tokens); the index's word column numbers a text's chunks.",
)
@click.option(
    "--late-chunking/--no-late-chunking",
    default=True,
    show_default=True,
    help="--chunks: pool each chunk from the token vectors of the whole text (late chunking), or embed each chunk's "
    "text alone (takes --prompt / --dimensions).",
)
@click.option(
    "--shard-size",
    type=int,
    default=None,
    help="Texts per shard: a Ctrl-C keeps the complete shards [default: 500 (a few seconds of a small model on a CPU; "
    "give more on a GPU), or the folder's own when it resumes one].",
)
@click.option(
    "--shard-format",
    type=click.Choice(["safetensors", "npy"]),
    default=None,
    help="--out: the shard files' format [default: safetensors].",
)
@click.option(
    "--storage",
    type=click.Choice(["safetensors", "npy"]),
    default=None,
    hidden=True,
    help="Deprecated: the old name of --shard-format (goes in 0.3).",
)
@click.option("--skip-empty", is_flag=True, help="Skip empty lines instead of stopping with an error.")
@click.option(
    "--allow-empty",
    is_flag=True,
    help="An input with no text writes an empty folder instead of stopping with an error.",
)
@click.option(
    "--batch-tokens",
    type=int,
    default=None,
    help="Token budget of one encoder batch (default: 2,048 on a CPU, sized for the GPU's memory on CUDA).",
)
@click.option("--threads", type=int, default=None, help="Torch threads (default: torch's choice).")
@click.option(
    "--quantize",
    type=click.Choice(["int8"]),
    default=None,
    help="Deprecated: the same as --precision int8.",
)
@runtime_options
@click.option(
    "--compile/--no-compile",
    "compile_",
    default=None,
    help="torch.compile the encoder (default: only when a shard is large enough to repay the compilation).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    help="CPU processes, each embedding whole shards with an equal share of the cores (--threads, or all of them).",
)
@click.option(
    "--devices",
    default=None,
    help="One process per device, each embedding whole shards: cuda:0,cuda:1 or 'all' (every visible GPU).",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: this machine's processes (--workers / --devices); ray: a pool of Ray Data actors on a Ray cluster "
    "(pip install 'ctxrep[ray]'; --workers is then the number of actors, default: one per CPU of the cluster).",
)
@click.option(
    "--ray-address",
    default=None,
    help="--engine ray: the cluster to join (auto, HOST:6379 or ray://HOST:10001); default: start a local Ray.",
)
@click.option(
    "--ray-gpus",
    type=float,
    default=0.0,
    show_default=True,
    help="--engine ray: GPUs per actor (1 puts each actor on its own GPU).",
)
@click.option(
    "--ray-log",
    default=None,
    type=click.Path(dir_okay=False),
    help="--engine ray: the file Ray's own output (its log lines, Ray Data's progress) is appended to "
    "[default: OUT/ray.log].",
)
@click.option("--ray-verbose", is_flag=True, help="--engine ray: leave Ray's own output on the terminal.")
@user_errors
def embed(
    model,
    input_path,
    out_dir,
    store_uri,
    store_text,
    fmt,
    text_column,
    header,
    level,
    layers,
    pooling,
    sentence_pooling,
    output,
    dimensions,
    prompt,
    prompt_name,
    output_precision,
    calibration,
    chunks,
    late_chunking,
    shard_size,
    shard_format,
    storage,
    skip_empty,
    allow_empty,
    batch_tokens,
    threads,
    quantize,
    compile_,
    workers,
    devices,
    engine,
    ray_address,
    ray_gpus,
    ray_log,
    ray_verbose,
    device,
    precision,
    backend,
) -> None:
    """Write word- or sentence-level vectors of every text in INPUT to shards in OUT, or to a store's table
    (--store URI).

    Shards are written under temporary names and renamed when complete: an interrupted run resumes after the complete
    shards when run again with the same arguments. --workers N / --devices run several processes, each embedding
    whole shards; the folder is the same as one process's.
    """
    from ctxrep.embed.corpus import DEFAULT_TEXT_COLUMN, EmbedInput, EmbedJob, vectors_of

    _check_options(device, devices, workers, engine, ray_address, ray_gpus, ray_log, ray_verbose)
    shard_format = _shard_format(shard_format, storage)
    out = _sink(out_dir, store_uri, store_text, shard_size, shard_format)
    source = EmbedInput(input_path, fmt, text_column or DEFAULT_TEXT_COLUMN, header, skip_empty, allow_empty)
    # the vector options given on the command line: the variant --level / --output choose refuses those it does not take
    given = {
        "layers": parse_layers(layers),
        "pooling": pooling,
        "sentence_pooling": sentence_pooling,
        "dimensions": dimensions,
        "prompt": prompt,
        "prompt_name": prompt_name,
        "output_precision": output_precision,
        "calibration": calibration,
        "chunks": chunks,
        "late_chunking": late_chunking,
    }
    context = click.get_current_context()
    given = {k: v for k, v in given.items() if context.get_parameter_source(k) is not ParameterSource.DEFAULT}
    job = EmbedJob(
        source,
        out,
        vectors=vectors_of(level, output, given),
        model=model,
        batch_tokens=batch_tokens,
        threads=threads,
        quantize=quantize,
        compile="auto" if compile_ is None else compile_,
        device=device,
        precision=precision,
        backend=backend,
    )
    if engine == "ray":
        summary = _run_on_ray(job, workers, ray_address, ray_gpus, ray_log, ray_verbose)
    else:
        from ctxrep.embed.corpus import embed_corpus, expand_devices

        devices_list = expand_devices(devices) if devices is not None else None
        summary = embed_corpus(job, workers=workers, devices=devices_list, log=_log)
    click.echo(summary.describe())


def _check_options(device, devices, workers, engine, ray_address, ray_gpus, ray_log, ray_verbose) -> None:
    """Refuse option combinations of how the job runs that do not go together, naming the options and what to give
    instead (those of the input, the layout and the vectors: EmbedInput, ShardFolder, the output variants)."""
    if devices is not None and device is not None:
        raise ValueError("give --device (one process there) or --devices (one process per device), not both")
    if devices is not None and workers != 1:
        raise ValueError("give --devices (one process per device) or --workers (CPU processes), not both")
    if engine != "ray" and (ray_address is not None or ray_gpus):
        raise ValueError("--ray-address and --ray-gpus apply to --engine ray; add --engine ray")
    if engine != "ray" and (ray_log is not None or ray_verbose):
        raise ValueError("--ray-log and --ray-verbose apply to --engine ray; add --engine ray")
    if ray_log is not None and ray_verbose:
        raise ValueError("give --ray-log (Ray's output to a file) or --ray-verbose (on the terminal), not both")
    if engine == "ray" and devices is not None:
        raise ValueError("--engine ray places actors on GPUs by itself: give --ray-gpus 1 instead of --devices")


def _shard_format(shard_format, storage):
    """--shard-format, or the deprecated --storage with a note (and a DeprecationWarning)."""
    if storage is None:
        return shard_format
    if shard_format is not None:
        raise ValueError("give --shard-format (--storage is its old name), not both")
    message = "--storage is deprecated: it is now --shard-format (the shard files' format); --storage goes in 0.3"
    warnings.warn(message, DeprecationWarning, stacklevel=2)
    click.echo(f"note: {message}", err=True)
    return storage


def _sink(out_dir, store_uri, store_text, shard_size, shard_format):
    """Where the vectors go: the ShardFolder of --out or the StoreTable of --store (exactly one of them)."""
    from ctxrep.embed.corpus import ShardFolder, StoreTable
    from ctxrep.embed.run import DEFAULT_SHARD_TEXTS, shard_size_for

    if (out_dir is None) == (store_uri is None):
        raise ValueError("give --out DIR (a folder of shards) or --store URI (a store's table), one of them")
    if store_uri is None:
        if not store_text:
            raise ValueError("--no-store-text applies to --store; a folder keeps no texts")
        return ShardFolder(out_dir, shard_size_for(out_dir, shard_size), shard_format or "safetensors")
    if shard_format is not None:
        raise ValueError("--shard-format is the format of --out's shard files; a --store keeps its own")
    return StoreTable(store_uri, shard_size or DEFAULT_SHARD_TEXTS, with_text=store_text)


def _log(message: str) -> None:
    click.echo(message, err=True)


def _run_on_ray(job, workers, ray_address, ray_gpus, ray_log, ray_verbose):
    """--engine ray: the job on a pool of Ray Data actors; returns the run's summary."""
    from ctxrep.embed.ray_engine import embed_with_ray

    actors = workers if workers != 1 else None  # --workers 1 is the default: one actor per CPU then
    return embed_with_ray(
        job,
        address=ray_address,
        actors=actors,
        gpus_per_actor=ray_gpus,
        log=_log,
        ray_log=ray_log,
        ray_verbose=ray_verbose,
    )
