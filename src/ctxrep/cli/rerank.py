"""`ctxrep rerank`: order documents by a reranker's relevance to a query (ctxrep.rerank.load_reranker).

ctxrep rerank --model cross-encoder/ms-marco-MiniLM-L6-v2 --query "how do I reset my password" --documents faq.txt
ctxrep rerank --model RERANKER --query "..." --documents docs.txt --top-n 5 --prompt-name query
ctxrep rerank --model runs/stsb/model --query "..." --documents docs.txt   # a pair model `ctxrep finetune` trained
"""

from __future__ import annotations

import sys

import click

from ctxrep.cli.common import user_errors


@click.command("rerank")
@click.option(
    "--model",
    required=True,
    help="A cross-encoder or LLM reranker (folder or Hugging Face Hub name), or a pair model `ctxrep finetune` "
    "trained (its OUT/model folder).",
)
@click.option("--query", required=True, help="The query text.")
@click.option("--documents", "documents_file", required=True, help="Documents, one per line ('-': standard input).")
@click.option("--top-n", default=None, type=int, help="Print the best N documents only [default: all].")
@click.option("--prompt", default=None, help="Text put before the query.")
@click.option("--prompt-name", default=None, help="A prompt the model's folder declares, by name.")
@click.option("--device", default=None, help="Where the model runs (cpu, cuda, cuda:1).")
@user_errors
def rerank(model, query, documents_file, top_n, prompt, prompt_name, device) -> None:
    """Print the documents best first: rank, score, line number (1-based), document (TSV). A (query, document)
    pair longer than the reranker's max length is cut to fit, as sentence-transformers' CrossEncoder cuts it; one line
    on standard error says how many documents were cut, and their line numbers."""
    from ctxrep.rerank import load_reranker
    from ctxrep.util.files import utf8_lines

    source = sys.stdin.buffer if documents_file == "-" else documents_file
    lines = [(n, text) for n, text in utf8_lines(source, "<stdin>" if documents_file == "-" else None) if text.strip()]
    if not lines:
        raise ValueError(f"{documents_file}: no documents (every line is empty)")
    reranker = load_reranker(model, device=device)
    ranked = reranker.rerank(query, [t for _, t in lines], top_n=top_n, prompt=prompt, prompt_name=prompt_name)
    click.echo("rank\tscore\tline\tdocument")
    for rank, (i, score) in enumerate(zip(ranked.ids, ranked.scores.tolist()), start=1):
        click.echo(f"{rank}\t{score:.6f}\t{lines[i][0]}\t{lines[i][1].replace(chr(9), ' ')}")
    if reranker.cut_texts:
        click.echo(
            f"ctxrep rerank: {len(reranker.cut_texts)} of {len(lines)} documents were cut to fit the reranker's "
            f"{reranker.max_length} tokens (lines {', '.join(str(lines[i][0]) for i in reranker.cut_texts)})",
            err=True,
        )
