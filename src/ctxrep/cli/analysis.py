"""`ctxrep probe`, `ctxrep attention`, `ctxrep neighbors ...` and `ctxrep report`: the analysis tools.

Paths and choices are checked by the tools themselves (not by click), so a bad input ends in one line,
`error: <what is wrong>`, and exit status 1.
"""

from __future__ import annotations

from pathlib import Path

import click

from ctxrep.cli.common import user_errors
from ctxrep.cli.runtime_options import runtime_kwargs, runtime_options

MODEL_HELP = "Packaged model name (minilm), model folder (ELMo: with or without elmo:), or Hub name."


def _featurizer(model: str, runtime: dict | None = None):
    """All layers of `model`; `runtime`: the --device / --precision / --backend keyword arguments given."""
    from ctxrep.featurize import Featurizer

    return Featurizer(model, layers="all", **(runtime or {}))


def _out_dir(path: str) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a folder; pick another --out-dir")
    out.mkdir(parents=True, exist_ok=True)
    return out


@click.command()
@click.option("--model", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--task", required=True, help="upos or xpos (CoNLL-U), ner (CoNLL-2003), wic (WiC *.data.txt).")
@click.option("--train", "train_path", required=True, help="Training data file (WiC: data file or its folder).")
@click.option("--dev", "dev_path", default=None, help="Dev data file; without it the last 20% of --train is held out.")
@click.option("--max-sentences", default=2000, show_default=True, help="Sentences (WiC: pairs) to use of each file.")
@click.option("--control/--no-control", default=True, show_default=True, help="Also probe a random-init model.")
@click.option("--out-dir", default="probe-out", show_default=True, help="Where probe.json and probe.png go.")
@click.option("--seed", default=0, show_default=True, help="Seed of the control model and the probes.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Say what is being done on stderr.")
@runtime_options
@user_errors
def probe(
    model, task, train_path, dev_path, max_sentences, control, out_dir, seed, progress, device, precision, backend
) -> None:
    """Linear probes per layer and over a learned ScalarMix of all layers (Tenney et al. 2019)."""
    from ctxrep.analysis.probe import load_probe_data, run_probe, split_data

    if max_sentences < 1:
        raise ValueError(f"--max-sentences must be at least 1, got {max_sentences}")
    train = load_probe_data(task, train_path, max_sentences)
    if dev_path is None:
        train, dev = split_data(train)
    else:
        dev = load_probe_data(task, dev_path, max_sentences)
    out = _out_dir(out_dir)
    fz = _featurizer(model, runtime_kwargs(device, precision, backend))
    result = run_probe(fz, train, dev, control=control, seed=seed, progress=progress)
    click.echo(result.table())
    result.save_json(out / "probe.json")
    result.save_plot(out / "probe.png")
    click.echo(f"wrote {out / 'probe.json'} and {out / 'probe.png'}")


@click.command()
@click.option("--model", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--corpus", default=None, help="CoNLL-U (adds dependency heads), CoNLL, or text (one sentence per line).")
@click.option("--max-sentences", default=500, show_default=True, help="Use at most this many sentences of --corpus.")
@click.option("--sentence", default=None, help="Draw one head's attention on this sentence (see --layer, --head).")
@click.option("--layer", default=1, show_default=True, help="Layer of the heatmap, 1..L.")
@click.option("--head", default=0, show_default=True, help="Head of the heatmap, 0..H-1.")
@click.option("--out-dir", default="attention-out", show_default=True, help="Where the JSON files and PNGs go.")
@user_errors
def attention(model, corpus, max_sentences, sentence, layer, head, out_dir) -> None:
    """Per-head attention statistics (Clark et al. 2019), layer x head grids, a heatmap of one head."""
    from ctxrep.analysis import attention as att
    from ctxrep.analysis.corpus import read_sentences

    if corpus is None and sentence is None:
        raise ValueError("nothing to do: give --corpus FILE (statistics) and/or --sentence TEXT (heatmap)")
    if max_sentences < 1:
        raise ValueError(f"--max-sentences must be at least 1, got {max_sentences}")
    fz = _featurizer(model)
    att.require_attention(fz)  # ELMo: one line, before any work
    if sentence is not None:
        att.check_head(fz, layer, head)
    out = _out_dir(out_dir)
    if corpus is not None:
        stats = att.head_statistics(fz, read_sentences(corpus, max_sentences))
        click.echo(stats.table())
        stats.save_json(out / "attention.json")
        for name in att.STATISTICS:
            stats.save_grid_png(name, out / f"grid-{name}.png")
        if Path(corpus).suffix == ".conllu":
            from ctxrep.data.conllu import read_conllu

            deps = att.dependency_heads(fz, read_conllu(corpus)[:max_sentences])
            click.echo(deps.table())
            deps.save_json(out / "dependency-heads.json")
    if sentence is not None:
        att.save_heatmap_png(fz, sentence, layer, head, out / f"heatmap-L{layer}-H{head}.png")
    click.echo(f"wrote results to {out}")


@click.group()
def neighbors() -> None:
    """Nearest word occurrences in context (an index on disk), static neighbours, WiC by layer."""


@neighbors.command("index")
@click.option("--model", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--corpus", required=True, help="CoNLL-U, CoNLL, or text (one tokenized sentence per line).")
@click.option("--layer", default=-1, show_default=True, help="Layer to index (0 = embeddings, -1 = top).")
@click.option("--max-sentences", default=5000, show_default=True, help="Index at most this many sentences.")
@click.option("--out", "out_dir", required=True, help="Folder for the index and its metadata.")
@runtime_options
@user_errors
def neighbors_index(model, corpus, layer, max_sentences, out_dir, device, precision, backend) -> None:
    """Embed every word occurrence of a corpus at one layer and save an HNSW index."""
    from ctxrep.analysis.corpus import read_sentences
    from ctxrep.analysis.neighbors import OccurrenceIndex

    if max_sentences < 1:
        raise ValueError(f"--max-sentences must be at least 1, got {max_sentences}")
    fz = _featurizer(model, runtime_kwargs(device, precision, backend))
    index = OccurrenceIndex.build(fz, read_sentences(corpus, max_sentences), layer=layer)
    index.save(_out_dir(out_dir))
    click.echo(
        f"indexed {len(index.occurrences)} occurrences of {len(index.sentences)} sentences at layer "
        f"{index.layer} in {out_dir}"
    )


@neighbors.command("query")
@click.option("--index", "index_dir", required=True, help="Folder written by `neighbors index`.")
@click.option("--sentence", default=None, help="The query sentence (whitespace-tokenized); with --word.")
@click.option("--word", default=None, type=int, help="0-based index of the query word in --sentence.")
@click.option(
    "--queries",
    "queries_path",
    default=None,
    help="A file of queries instead of --sentence/--word, one a line (blank lines skipped): "
    "SENTENCE<TAB>WORD_INDEX (0-based), or the sentence with one word marked, as in "
    "'A [[crane]] lifted the beam .'. The index and model are loaded once for all of them.",
)
@click.option("-k", "--k", default=10, show_default=True, help="How many neighbours.")
@click.option("--model", default=None, help="Model to embed the queries with (default: the index's model).")
@runtime_options
@user_errors
def neighbors_query(index_dir, sentence, word, queries_path, k, model, device, precision, backend) -> None:
    """The occurrences closest to a word in a sentence, and the word's static (input-embedding) neighbours.

    One query (--sentence and --word) or a file of them (--queries FILE); each answer of a file starts with
    its FILE:LINE."""
    from ctxrep.analysis.neighbors import (
        OccurrenceIndex,
        StaticVocabulary,
        no_static_table_reason,
        parse_query,
        read_queries,
    )

    if queries_path is not None:
        if sentence is not None or word is not None:
            raise ValueError("give either --queries FILE or --sentence with --word, not both")
        queries = read_queries(queries_path)  # every line checked (FILE:LINE errors) before anything is loaded
    elif sentence is None or word is None:
        raise ValueError("nothing to query: give --sentence TEXT with --word N, or --queries FILE")
    else:
        queries = [parse_query(f"{sentence}\t{word}", "--sentence/--word")]
    if k < 1:
        raise ValueError(f"-k must be at least 1, got {k}")
    index = OccurrenceIndex.load(index_dir)
    fz = _featurizer(model or index.model, runtime_kwargs(device, precision, backend))
    no_static = no_static_table_reason(fz)
    vocabulary = None if no_static else StaticVocabulary.from_featurizer(fz)  # built once for every query
    for q, hits in zip(queries, index.query_many(fz, queries, k)):
        _print_query(q, hits, index.layer, fz, k, no_static, vocabulary, with_source=queries_path is not None)


def _print_query(q, hits, layer: int, fz, k: int, no_static: str | None, vocabulary, with_source: bool) -> None:
    from ctxrep.analysis.neighbors import static_neighbors

    where = f"{q.source}: " if with_source else ""
    click.echo(f"{where}contextual neighbours of {q.target!r} (layer {layer}):")
    for n in hits:
        click.echo(f"  {n.similarity:.3f}  {n.text:<15} s{n.sentence}:{n.word}  {n.context}")
    if no_static:  # a model that reads characters (ELMo): the contextual answer stands on its own
        click.echo(f"static neighbours of {q.target!r}: none ({no_static})")
        return
    static = static_neighbors(fz, q.target, k, vocabulary)
    click.echo(
        f"static neighbours of {q.target!r} (input embeddings): " + ", ".join(f"{w} ({s:.2f})" for w, s in static)
    )


@neighbors.command("static")
@click.argument("word")
@click.option("--model", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("-k", "--k", default=10, show_default=True, help="How many neighbours.")
@user_errors
def neighbors_static(word, model, k) -> None:
    """Vocabulary words nearest to WORD by the model's input embeddings (no context)."""
    from ctxrep.analysis.neighbors import static_neighbors

    if k < 1:
        raise ValueError(f"-k must be at least 1, got {k}")
    for w, s in static_neighbors(_featurizer(model), word, k):
        click.echo(f"{s:.3f}  {w}")


@neighbors.command("wic")
@click.option("--model", default="minilm", show_default=True, help=MODEL_HELP)
@click.option("--train", "train_path", required=True, help="WiC train *.data.txt (gold file beside it) or its folder.")
@click.option("--dev", "dev_path", required=True, help="WiC dev *.data.txt or its folder.")
@click.option("--max-pairs", default=None, type=int, help="Use at most this many train pairs.")
@click.option("--out", "out_file", default=None, help="Also write the result as JSON here.")
@runtime_options
@user_errors
def neighbors_wic(model, train_path, dev_path, max_pairs, out_file, device, precision, backend) -> None:
    """WiC accuracy per layer: cosine of the two targets, threshold chosen on train, scored on dev."""
    from ctxrep.analysis.neighbors import evaluate_wic
    from ctxrep.analysis.probe import read_wic_pairs

    fz = _featurizer(model, runtime_kwargs(device, precision, backend))
    result = evaluate_wic(fz, read_wic_pairs(train_path, max_pairs), read_wic_pairs(dev_path))
    click.echo(result.table())
    if out_file:
        result.save_json(out_file)


@click.command()
@click.argument("model", default="minilm")
@click.option(
    "--out", "--out-dir", "out_dir", default="report", show_default=True, help="Where report.html and report.json go."
)
@click.option("--ud", "ud_path", default=None, help="A CoNLL-U file for the probe and attention sections.")
@click.option("--wic", "wic_path", default=None, help="A WiC folder with train/ and dev/: WiC by layer.")
@click.option("--max-sentences", default=300, show_default=True, help="Sentences of --ud to use.")
@click.option("--control/--no-control", default=True, show_default=True, help="Probe a random-init control too.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Say what is being done on stderr.")
@runtime_options
@user_errors
def report(model, out_dir, ud_path, wic_path, max_sentences, control, progress, device, precision, backend) -> None:
    """Write one self-contained HTML page about MODEL: probes, attention, sense demos, WiC.

    MODEL is a packaged model name (minilm) or a model folder."""
    from ctxrep.analysis.report import build_report

    if max_sentences < 2:
        raise ValueError(f"--max-sentences must be at least 2 (a train and a dev part), got {max_sentences}")
    for option, path in (("--ud", ud_path), ("--wic", wic_path)):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{option} {path}: no such file or folder")
    runtime = runtime_kwargs(device, precision, backend)
    page = build_report(
        _featurizer(model, runtime) if runtime else model,
        _out_dir(out_dir),
        ud_path=ud_path,
        wic_path=wic_path,
        max_sentences=max_sentences,
        control=control,
        progress=progress,
    )
    click.echo(f"wrote {page}")


COMMANDS = (probe, attention, neighbors, report)
