"""`ctxrep index build` and `ctxrep search`: a dense (ctxrep.SentenceIndex), sparse (SPLADE, vectors/sparse.py) or
late-interaction (ColBERT, vectors/late_interaction.py) index from the command line.

ctxrep index build --input faq.txt --out ix/                       # one text per line; ids = 0, 1, 2, ...
ctxrep index build --input faq.csv --text-column question --id-column qid --out ix/
ctxrep index build --vectors vecs/ --input faq.txt --out ix/        # `ctxrep embed --level sentence` output
ctxrep search --index ix/ --query "how do I reset my password" -k 10
ctxrep search --index ix/ --queries questions.txt -k 5 --out hits.tsv
ctxrep index build --input faq.txt --sparse --model naver/splade-v3 --out sx/      # SPLADE, inverted index
ctxrep index build --input faq.txt --late-interaction --model FOLDER --out lx/    # ColBERT token vectors, MaxSim
ctxrep search --index lx/ --query "how do I reset my password"                    # the kind is read from the folder
ctxrep index build --input faq.txt --model FOLDER --dimensions 128 --binary --document-prompt-name document --out bx/
ctxrep search --index bx/ --query "reset password" --query-prompt-name query     # same dimensions, binary + rescore
ctxrep search --index ix/ --query "reset password" --rerank RERANKER --rerank-depth 50   # retrieve 50, rerank to k
ctxrep search --store lancedb:vecs.lancedb/faq --query "reset password" -k 5      # a store `embed --store` wrote
ctxrep index build --vectors lancedb:vecs.lancedb/faq --out ix/                    # a store's rows as an index
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from ctxrep.cli.common import user_errors
from ctxrep.cli.finetune import COLUMN_RULE, HEADER_HELP
from ctxrep.featurize.spec import SENTENCE_POOLINGS


@click.group("index")
def index() -> None:
    """Build a sentence index for `ctxrep search`."""


@index.command("build")
@click.option("--input", "input_path", default=None, help="Texts: one per line, or CSV/TSV/JSONL with --text-column.")
@click.option(
    "--vectors",
    "vectors_dir",
    default=None,
    help="A `ctxrep embed --level sentence` folder, or a store's table (lancedb:DIR/TABLE, postgresql://..., "
    "qdrant:..., chroma:...) an embed --store wrote: no embedding.",
)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Index folder to write.")
@click.option("--model", default="minilm", show_default=True, help="Model name or folder (not with --vectors).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "csv", "tsv", "jsonl"]),
    default=None,
    help="Input format [default: from the file name; text otherwise].",
)
@click.option("--text-column", default="text", show_default=True, help=f"The column holding the text: {COLUMN_RULE}.")
@click.option(
    "--id-column",
    default=None,
    help="The column holding each text's id, counted as --text-column [default: the text's 0-based position, as "
    "SentenceIndex.build numbers them].",
)
@click.option("--header/--no-header", default=None, help=HEADER_HELP)
@click.option("--layers", default="-1", show_default=True, help="Layer index, comma-separated list or 'mix'.")
@click.option(
    "--sentence-pooling",
    type=click.Choice(SENTENCE_POOLINGS),
    default="auto",
    show_default=True,
    help="Mean of words, the classification token, a sentence-transformers folder's own pooling, the last token "
    "(lasttoken: decoder embedders), or auto (the folder's pooling where it has one, else mean).",
)
@click.option("--metric", type=click.Choice(["cosine", "dot"]), default="cosine", show_default=True)
@click.option(
    "--sparse", is_flag=True, help="Sparse lexical vectors (SPLADE / BGE-M3: the model needs an MLM or sparse head)."
)
@click.option(
    "--late-interaction",
    is_flag=True,
    help="One vector per token (ColBERT: a sentence-transformers MultiVectorEncoder folder, or any model's token "
    "states), searched by MaxSim.",
)
@click.option(
    "--dimensions",
    type=int,
    default=None,
    help="Keep the first N coordinates of each vector, L2-normalised again (Matryoshka); queries alike.",
)
@click.option(
    "--binary",
    is_flag=True,
    help="Store binary codes (1 bit a dimension), searched by Hamming distance, candidates rescored (--rescore).",
)
@click.option(
    "--rescore",
    type=click.Choice(["int8", "float32"]),
    default=None,
    help="--binary: the vectors kept to rescore the candidates (int8: 1 byte a dimension) [default: int8].",
)
@click.option(
    "--rescore-multiplier",
    type=int,
    default=None,
    help="--binary: candidates rescored per hit (k x this many) [default: 4].",
)
@click.option("--document-prompt-name", default=None, help="The model folder's prompt of this name before each text.")
@click.option("--document-prompt", default=None, help="This text before each text (not with --document-prompt-name).")
@click.option("--device", default=None, help="Where the model runs (cpu, cuda, cuda:1).")
@user_errors
def build(
    input_path,
    vectors_dir,
    out_dir,
    model,
    fmt,
    text_column,
    id_column,
    header,
    layers,
    sentence_pooling,
    metric,
    sparse,
    late_interaction,
    dimensions,
    binary,
    rescore,
    rescore_multiplier,
    document_prompt_name,
    document_prompt,
    device,
) -> None:
    """Embed the texts of INPUT (or take the vectors of an embed run) and write a searchable index to OUT."""
    from ctxrep.vectors.index import read_texts

    _check_build_options(
        input_path,
        vectors_dir,
        sparse,
        late_interaction,
        dimensions,
        binary,
        rescore,
        rescore_multiplier,
        document_prompt_name,
        document_prompt,
        layers,
        metric,
    )
    rescore, rescore_multiplier = rescore or "int8", 4 if rescore_multiplier is None else rescore_multiplier
    items = read_texts(input_path, fmt, text_column, id_column, header) if input_path is not None else None
    kwargs = {"device": device} if device else {}
    if sparse or late_interaction:
        ix = _build_per_token_or_sparse(items, vectors_dir, model, sparse, kwargs)
        ix.save(out_dir)
        what = "sparse vectors" if sparse else f"{len(ix.tokens)} token vectors"
        click.echo(f"indexed {len(ix)} texts ({what}) in {out_dir}")
        return
    from ctxrep.vectors.quantize import Binary, Rescore

    compact = {
        "dimensions": dimensions,
        "binary": Binary(Rescore(rescore), rescore_multiplier) if binary else None,
        "document_prompt": document_prompt,
        "document_prompt_name": document_prompt_name,
    }
    ix = _build_dense(items, vectors_dir, model, layers, sentence_pooling, metric, compact, kwargs)
    ix.save(out_dir)
    stored = f", binary codes rescored by {rescore}" if binary else ""
    click.echo(f"indexed {len(ix)} texts ({ix.dim} wide, {metric}{stored}) in {out_dir}")


def _check_build_options(
    input_path,
    vectors_dir,
    sparse,
    late_interaction,
    dimensions,
    binary,
    rescore,
    rescore_multiplier,
    document_prompt_name,
    document_prompt,
    layers,
    metric,
) -> None:
    """Refuse option combinations that do not go together, before any text is read or model loaded."""
    if input_path is None and vectors_dir is None:
        raise ValueError("give --input (texts to embed) or --vectors (a `ctxrep embed --level sentence` folder)")
    dense = {
        "--dimensions": dimensions is not None,
        "--binary": binary,
        "--document-prompt-name": document_prompt_name is not None,
        "--document-prompt": document_prompt is not None,
    }
    if (sparse or late_interaction) and any(dense.values()):
        given = ", ".join(flag for flag, on in dense.items() if on)
        raise ValueError(f"{given}: dense sentence indexes only; leave out --sparse / --late-interaction")
    if not binary and (rescore is not None or rescore_multiplier is not None):
        raise ValueError("--rescore and --rescore-multiplier apply to a binary index: add --binary, or leave them out")
    if vectors_dir is not None and (document_prompt_name is not None or document_prompt is not None):
        raise ValueError("--document-prompt(-name) applies when embedding --input; --vectors are embedded already")
    if sparse or late_interaction:
        kind = "--sparse" if sparse else "--late-interaction"
        if sparse and late_interaction:
            raise ValueError("give --sparse or --late-interaction, not both")
        if late_interaction and (vectors_dir is not None or input_path is None):
            raise ValueError(f"{kind} embeds the texts of --input; --vectors holds one vector per text")
        if layers != "-1" or metric != "cosine":
            raise ValueError(f"{kind} reads the last layer and scores by dot product; leave --layers and --metric out")


def _build_per_token_or_sparse(items, vectors_dir, model, sparse, kwargs):
    """--sparse (SPLADE; from an embed run's sparse vectors or by embedding) or --late-interaction (ColBERT)."""
    from ctxrep.vectors.late_interaction import LateInteractionIndex, MultiVectorEncoder
    from ctxrep.vectors.sparse import SparseEncoder, SparseIndex

    if sparse and vectors_dir is not None:  # `ctxrep embed --output sparse` output, not embedded again
        return SparseIndex.from_vectors(vectors_dir, *((items.ids, items.texts) if items is not None else ()))
    if sparse:
        return SparseIndex.build(items.texts, SparseEncoder(model, progress=True, **kwargs), ids=items.ids)
    return LateInteractionIndex.build(items.texts, MultiVectorEncoder(model, progress=True, **kwargs), items.ids)


def _build_dense(items, vectors_dir, model, layers, sentence_pooling, metric, compact, kwargs):
    """A SentenceIndex from an embed run's vectors (no model loaded) or by embedding the texts of --input."""
    from ctxrep.vectors.index import SentenceIndex

    if vectors_dir is not None:
        ids, texts = (items.ids, items.texts) if items is not None else (None, None)
        from ctxrep.stores import is_store_uri, open_store

        if is_store_uri(vectors_dir):  # a store's table: its rows carry their ids and texts
            if items is not None:
                raise ValueError(f"{vectors_dir}: a store's rows carry their ids and texts; leave out --input")
            with open_store(vectors_dir) as store:
                return store.sentence_index(metric=metric, **compact)
        index = SentenceIndex.from_vectors(vectors_dir, ids=ids, texts=texts, metric=metric, **compact)
        _note_codes(vectors_dir)
        return index
    from ctxrep.featurize import Featurizer
    from ctxrep.featurize.spec import parse_layers

    fz = Featurizer(model, layers=parse_layers(layers), sentence_pooling=sentence_pooling, progress=True, **kwargs)
    return SentenceIndex.build(items.texts, ids=items.ids, featurizer=fz, metric=metric, **compact)


def _note_codes(vectors_dir) -> None:
    """One stderr line when an `embed --output-precision` folder of int8 / uint8 codes is indexed."""
    from ctxrep.vectors.store import load_vectors

    precision = load_vectors(vectors_dir).precision
    if precision in ("int8", "uint8"):
        click.echo(
            f"note: {vectors_dir} holds {precision} codes: indexing their dequantized vectors (the grid of the ranges "
            "its manifest records)",
            err=True,
        )


@click.command("search")
@click.option("--index", "index_dir", default=None, help="A folder written by `ctxrep index build` (or --store).")
@click.option(
    "--store",
    "store_uri",
    default=None,
    help="Search a store's table instead of --index (lancedb:DIR/TABLE, postgresql://.../DB?table=T, "
    "qdrant://HOST:PORT/C, qdrant:DIR/C, chroma:DIR/C): queries embedded with the spec it records, its ANN index.",
)
@click.option("--exact", is_flag=True, help="--store: the store's exact search instead of its ANN index.")
@click.option(
    "--hybrid",
    is_flag=True,
    help="--store: dense and sparse vectors of one table (Qdrant; sparse ones added by `embed --output sparse`), "
    "the two rankings fused by the engine (RRF).",
)
@click.option("--query", "queries", multiple=True, help="A query text (repeatable).")
@click.option("--queries", "queries_file", default=None, help="A file of queries, one per line.")
@click.option("-k", "k", default=10, show_default=True, help="Neighbours per query.")
@click.option("--out", "out_path", default=None, help="Write the hits as TSV here instead of standard output.")
@click.option(
    "--candidates",
    default=64,
    show_default=True,
    help="Late-interaction indexes: document tokens each query token retrieves before exact MaxSim rescoring.",
)
@click.option(
    "--rerank",
    "rerank_model",
    default=None,
    help="Rerank the hits with this reranker: a cross-encoder or LLM reranker, or a pair model `ctxrep finetune` "
    "trained (OUT/model).",
)
@click.option("--rerank-depth", default=50, show_default=True, help="--rerank: hits retrieved, reranked to k.")
@click.option("--rerank-prompt", default=None, help="--rerank: text put before each query for the reranker.")
@click.option("--rerank-prompt-name", default=None, help="--rerank: a prompt the reranker's folder declares, by name.")
@click.option("--sparse", is_flag=True, help="Expect a sparse index (`index build --sparse`); else an error.")
@click.option(
    "--late-interaction", is_flag=True, help="Expect a late-interaction index (`index build --late-interaction`)."
)
@click.option("--query-prompt-name", default=None, help="Dense indexes: the model folder's prompt of this name.")
@click.option("--query-prompt", default=None, help="Dense indexes: this text before each query.")
@click.option("--device", default=None, help="Where the model runs (cpu, cuda, cuda:1).")
@user_errors
def search(
    index_dir,
    store_uri,
    exact,
    hybrid,
    queries,
    queries_file,
    k,
    out_path,
    candidates,
    rerank_model,
    rerank_depth,
    rerank_prompt,
    rerank_prompt_name,
    sparse,
    late_interaction,
    query_prompt_name,
    query_prompt,
    device,
) -> None:
    """Print the k nearest indexed texts of each query: query number, rank, score, id, text (TSV; query numbers,
    ranks and ids count from 0, as everywhere in ctxrep). Dense, sparse and late-interaction indexes alike (the
    kind is read from the folder); the model loads once for every query."""
    from ctxrep.vectors.index import SentenceIndex, read_texts

    queries = list(queries)
    if queries_file is not None:
        queries += read_texts(queries_file, "text").texts  # an empty file: refused, naming it
    if not queries:
        raise ValueError("give --query TEXT or --queries FILE")
    if k < 1:
        raise ValueError(f"-k must be at least 1, got {k}")
    if candidates < 1:
        raise ValueError(f"--candidates must be at least 1, got {candidates}")
    from ctxrep.vectors.late_interaction import LateInteractionIndex
    from ctxrep.vectors.sparse import SparseIndex

    if (index_dir is None) == (store_uri is None):
        raise ValueError("give --index DIR (an index folder) or --store URI (a store's table), one of them")
    if (exact or hybrid) and store_uri is None:
        raise ValueError("--exact and --hybrid apply to --store; an index folder searches exactly below exact_below")
    if store_uri is not None:
        from ctxrep.stores import open_store

        ix = open_store(store_uri, runtime={"device": device} if device else None)
        find = functools.partial(ix.search, exact=exact, hybrid=hybrid)
        if late_interaction or (sparse and (ix.kind is None or ix.kind.form != "sparse")):
            held = "nothing" if ix.kind is None else ix.kind.describe()
            raise ValueError(f"{ix.store.where} holds {held}, not the index --sparse / --late-interaction asks for")
        sparse = late_interaction = False
    else:
        ix = _open(Path(index_dir), device, candidates)
        find = ix.search
    for flag, asked, kind in (
        ("--sparse", sparse, SparseIndex),
        ("--late-interaction", late_interaction, LateInteractionIndex),
    ):
        if asked and not isinstance(ix, kind):
            raise ValueError(
                f"{index_dir} holds a {type(ix).__name__}, not the index {flag} asks for; build one with "
                f"`ctxrep index build {flag}`"
            )
    prompt = {}
    if query_prompt_name is not None or query_prompt is not None:
        if not isinstance(ix, SentenceIndex) and store_uri is None:
            raise ValueError(f"--query-prompt(-name): dense indexes only; {index_dir} holds a {type(ix).__name__}")
        prompt = {"prompt": query_prompt, "prompt_name": query_prompt_name}
    if rerank_model is None and (rerank_prompt is not None or rerank_prompt_name is not None):
        raise ValueError("--rerank-prompt(-name) applies with --rerank MODEL; add --rerank or leave them out")
    cut: dict[int, list] = {}  # query number -> ids of the hits the reranker cut to fit
    if rerank_model is None:
        hits = find(queries, k=k, **prompt)
    else:  # retrieve rerank_depth, then keep the reranker's k best (ctxrep.rerank.rerank_hits)
        from ctxrep.rerank import load_reranker, rerank_hits

        found = find(queries, k=max(k, rerank_depth), **prompt)
        reranker = load_reranker(rerank_model, device=device)
        hits = []
        for number, (q, h) in enumerate(zip(queries, found)):
            hits.append(rerank_hits(reranker, q, h, k, prompt=rerank_prompt, prompt_name=rerank_prompt_name))
            if reranker.cut_texts:
                cut[number] = [h.ids[i] for i in reranker.cut_texts]
    _write_hits(hits, out_path)
    if cut:
        named = "; ".join(f"query {q}: {', '.join(map(str, ids))}" for q, ids in cut.items())
        click.echo(
            f"ctxrep search: the reranker cut {sum(map(len, cut.values()))} (query, document) pairs to fit its "
            f"{reranker.max_length} tokens: {named}",
            err=True,
        )


def _write_hits(hits, out_path) -> None:
    """The hits as TSV (query number, rank, score, id, text) to `out_path`, or stdout; query numbers and ranks count
    from 0, as the ids do."""
    out = open(out_path, "w", encoding="utf-8") if out_path else sys.stdout
    try:
        out.write("query\trank\tscore\tid\ttext\n")
        for q, h in enumerate(hits):
            for rank, (i, text, score) in enumerate(h):
                shown = "" if text is None else text.replace("\t", " ").replace("\n", " ")
                out.write(f"{q}\t{rank}\t{score:.4f}\t{i}\t{shown}\n")
    finally:
        if out_path:
            out.close()
    if out_path:
        click.echo(f"wrote {sum(len(h) for h in hits)} hits for {len(hits)} queries to {Path(out_path)}")


def _open(folder: Path, device: str | None, candidates: int = 64):
    """The index in `folder`, whatever its kind, with the runtime options for its query encoder."""
    from ctxrep.vectors.index import SentenceIndex
    from ctxrep.vectors.late_interaction import LateInteractionIndex, MultiVectorEncoder
    from ctxrep.vectors.sparse import SparseEncoder, SparseIndex

    runtime = {"device": device} if device else {}
    if (folder / "late_interaction.json").is_file():
        ix = LateInteractionIndex.load(folder)
        ix.candidates = candidates
        if runtime and ix.spec is not None:
            ix.encoder = MultiVectorEncoder(**ix.spec.featurizer_kwargs(), **runtime)
        return ix
    if (folder / "postings.npz").is_file():
        ix = SparseIndex.load(folder)
        if runtime and ix.spec is not None:
            ix.encoder = SparseEncoder(**ix.spec.featurizer_kwargs(), max_active_dims=ix.max_active_dims, **runtime)
        return ix
    return SentenceIndex.load(folder, runtime=runtime or None)


COMMANDS = (index, search)
