"""`ctxrep rerank`: order documents by a reranker's relevance to one query or a file of queries
(ctxrep.rerank.load_reranker: the model loads once, whatever the number of queries).

ctxrep rerank --model cross-encoder/ms-marco-MiniLM-L6-v2 --query "how do I reset my password" --documents faq.txt
ctxrep rerank --model RERANKER --queries questions.txt --documents docs.txt --top-n 5 --prompt-name query
ctxrep rerank --model runs/stsb/model --query "..." --documents docs.txt   # a pair model `ctxrep finetune` trained
"""

from __future__ import annotations

import sys

import click

from ctxrep.cli.common import user_errors

HEADER = "query\trank\tscore\tid\tline\tdocument"


@click.command("rerank")
@click.option(
    "--model",
    required=True,
    help="A cross-encoder or LLM reranker (folder or Hugging Face Hub name), or a pair model `ctxrep finetune` "
    "trained (its OUT/model folder).",
)
@click.option("--query", "queries", multiple=True, help="A query text (repeatable).")
@click.option("--queries", "queries_file", default=None, help="A file of queries, one per line.")
@click.option("--documents", "documents_file", required=True, help="Documents, one per line ('-': standard input).")
@click.option("--top-n", default=None, type=int, help="Print the best N documents of each query [default: all].")
@click.option("--prompt", default=None, help="Text put before each query.")
@click.option("--prompt-name", default=None, help="A prompt the model's folder declares, by name.")
@click.option("--device", default=None, help="Where the model runs (cpu, cuda, cuda:1).")
@user_errors
def rerank(model, queries, queries_file, documents_file, top_n, prompt, prompt_name, device) -> None:
    """Print the documents best first for each query, one block of rows per query (TSV): query number, rank,
    score, id (the document's position among the documents), line (its line in --documents), document. Query
    numbers, ranks and ids count from 0, as everywhere in ctxrep; line numbers count from 1, as editors show them.

    A (query, document) pair longer than the reranker's max length is cut to fit, as sentence-transformers'
    CrossEncoder cuts it; one line on standard error says how many documents were cut, and their line numbers."""
    from ctxrep.util.files import utf8_lines

    queries = list(queries)
    if queries_file is not None:
        from ctxrep.vectors.index import read_texts

        queries += read_texts(queries_file, "text").texts  # an empty file: refused, naming it
    if not queries:
        raise ValueError("give --query TEXT or --queries FILE")
    source = sys.stdin.buffer if documents_file == "-" else documents_file
    lines = [(n, text) for n, text in utf8_lines(source, "<stdin>" if documents_file == "-" else None) if text.strip()]
    if not lines:
        raise ValueError(f"{documents_file}: no documents (every line is empty)")
    from ctxrep.rerank import load_reranker

    reranker = load_reranker(model, device=device)
    documents = [t for _, t in lines]
    cut: dict[int, list[int]] = {}  # query number -> lines of the documents cut to fit
    click.echo(HEADER)
    for number, query in enumerate(queries):
        ranked = reranker.rerank(query, documents, top_n=top_n, prompt=prompt, prompt_name=prompt_name)
        for rank, (i, score) in enumerate(zip(ranked.ids, ranked.scores.tolist())):
            click.echo(f"{number}\t{rank}\t{score:.6f}\t{i}\t{lines[i][0]}\t{lines[i][1].replace(chr(9), ' ')}")
        if reranker.cut_texts:
            cut[number] = [lines[i][0] for i in reranker.cut_texts]
    if cut:
        per_query = sorted({tuple(c) for c in cut.values()})
        if len(per_query) == 1:  # the same documents for every query: said once
            where = f"lines {', '.join(map(str, per_query[0]))}"
            count = len(per_query[0])
        else:
            where = "; ".join(f"query {q}: lines {', '.join(map(str, c))}" for q, c in cut.items())
            count = len({line for c in cut.values() for line in c})
        click.echo(
            f"ctxrep rerank: {count} of {len(lines)} documents were cut to fit the reranker's "
            f"{reranker.max_length} tokens ({where})",
            err=True,
        )
