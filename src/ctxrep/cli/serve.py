"""`ctxrep serve`: the embedding server (`ctxrep.serve.app`) on uvicorn; what it serves follows what --model's folder
is (`ctxrep.serve.kinds`)."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors
from ctxrep.cli.runtime_options import runtime_options
from ctxrep.featurize.spec import SENTENCE_POOLINGS


@click.command()
@click.option(
    "--model",
    default="minilm",
    show_default=True,
    help="Packaged model name, model folder or Hub name; served by what it is: a sentence-embedding model at the "
    "embedding routes, a reranker (cross-encoder, LLM reranker, a pair model `ctxrep finetune` trained) at /rerank "
    "and /v1/rerank, a SPLADE folder at /embed_sparse.",
)
@click.option(
    "--model-kind",
    type=click.Choice(["auto", "reranker", "sparse", "bge-m3", "sentence-embedding"]),  # serve/kinds.py KIND_NAMES
    default="auto",
    show_default=True,
    help="What --model is; auto: read from its folder (e.g. to serve a causal LM's embeddings: sentence-embedding).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", default=8080, show_default=True, type=int)
@runtime_options
@click.option(
    "--api-key",
    default=None,
    help="Require 'Authorization: Bearer KEY' on every request but /health (default: the CTXREP_API_KEY "
    "environment variable; none: no key).",
)
@click.option(
    "--layers", default="-1", show_default=True, help="Layer of the sentence vectors: an index, a list, 'mix'."
)
@click.option(
    "--sentence-pooling",
    type=click.Choice(SENTENCE_POOLINGS),
    default="auto",
    show_default=True,
    help="auto: the folder's own pooling where it has a sentence-transformers modules.json, else the mean of the "
    "words; lasttoken: the text's last token (decoder embedders).",
)
@click.option("--normalize", is_flag=True, help="Unit-length sentence vectors on /v1/embeddings.")
@click.option("--threads", type=int, default=None, help="Torch threads (default: torch's choice).")
@click.option(
    "--max-batch-tokens",
    default=16384,
    show_default=True,
    help="Token budget of one merged call of several requests (words + pieces estimated); the model's batches "
    "inside it are --step-ms long.",
)
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=50.0,
    show_default=True,
    help="How long one step of a request should take: a long request runs in batches sized to this time at the "
    "throughput the server measures (warm-up, then its own calls), and a short request that arrives meanwhile runs "
    "after the current step. Smaller: shorter waits beside long requests; larger: a little more throughput.",
)
@click.option("--max-wait-ms", default=5.0, show_default=True, help="How long a batch waits for more requests.")
@click.option("--max-queue", default=4096, show_default=True, help="Texts waiting; beyond it: 503 + Retry-After.")
@click.option(
    "--max-body-bytes", default=32 * 1024 * 1024, show_default=True, help="Bytes of a request body; beyond it: 413."
)
@click.option("--max-texts", default=2048, show_default=True, help="Texts per request; beyond it: 413.")
@click.option("--max-text-chars", default=200_000, show_default=True, help="Characters per text; beyond it: 413.")
@click.option(
    "--reranker",
    default=None,
    metavar="MODEL",
    help="A reranker (folder or name) served beside --model at /rerank (TEI) and /v1/rerank (Cohere, Jina): a "
    "cross-encoder, an LLM reranker or a pair model `ctxrep finetune` trained; a pair past its max length is cut to "
    "fit, and the answer names those documents (cut, x-cut-indices).",
)
@click.option(
    "--sparse-model",
    default=None,
    metavar="MODEL",
    help="A SPLADE (masked-LM head) or BGE-M3 folder or name whose sparse vectors /embed_sparse (TEI) serves.",
)
@click.option(
    "--access-log",
    default=None,
    metavar="FILE",
    help="One line per request (client, method, path, status, milliseconds) appended to FILE; '-': stderr.",
)
@click.option(
    "--graceful-shutdown-s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="On Ctrl-C or SIGTERM, how long requests in flight may run on; those still running then are cut with a 503.",
)
@user_errors
def serve(
    model,
    model_kind,
    host,
    port,
    device,
    precision,
    backend,
    api_key,
    layers,
    sentence_pooling,
    normalize,
    threads,
    max_batch_tokens,
    step_ms,
    max_wait_ms,
    max_queue,
    max_body_bytes,
    max_texts,
    max_text_chars,
    reranker,
    sparse_model,
    access_log,
    graceful_shutdown_s,
) -> None:
    """Serve sentence and word vectors over HTTP: OpenAI's /v1/embeddings and /v1/models, text-embeddings-inference's
    /embed, ctxrep's /v1/word-embeddings, /health and /metrics; with --reranker, /rerank and /v1/rerank; with
    --sparse-model, /embed_sparse. A --model folder that is a reranker or a SPLADE model is served at those routes
    instead (as text-embeddings-inference serves a reranker), and the embedding routes answer 404 saying which folder
    they need. Long requests run in steps of about --step-ms between other requests' steps, so a short request never
    waits for a whole long one. Before /health answers, the server runs each model over the shapes it serves
    (warm-up), so the first request is as fast as later ones.

    Ctrl-C (or SIGTERM) stops accepting connections, answers the requests in flight (--graceful-shutdown-s at most;
    one line says how many; those still running then get a 503, named in one log line) and ends; after Ctrl-C the exit status is 130, as for
    every ctxrep command."""
    try:
        from ctxrep.serve.server import access_log_to, bind, serve
        from ctxrep.serve.service import ServeConfig, api_key_from, make_service
    except ImportError as e:
        raise ValueError(f"ctxrep serve needs FastAPI and uvicorn ({e}): pip install 'ctxrep[serve]'") from None
    from ctxrep.featurize.spec import parse_layers

    config = ServeConfig(
        max_batch_tokens=max_batch_tokens,
        step_ms=step_ms,
        max_wait_ms=max_wait_ms,
        max_queue_texts=max_queue,
        max_body_bytes=max_body_bytes,
        max_texts=max_texts,
        max_text_chars=max_text_chars,
        api_key=api_key_from(api_key),
        graceful_shutdown_s=graceful_shutdown_s,
    )
    sock = bind(host, port)  # before the model loads: a taken port is said at once
    service = make_service(
        model,
        layers=parse_layers(layers),
        sentence_pooling=sentence_pooling,
        normalize=normalize,
        device=device,
        precision=precision,
        backend=backend,
        threads=threads,
        config=config,
        reranker=reranker,
        sparse_model=sparse_model,
        model_kind=None if model_kind == "auto" else model_kind,
    )
    access_log_to(access_log)
    key = "an API key" if config.api_key else "no API key"

    def started() -> None:
        from ctxrep.serve.kinds import ROUTES, Answer

        what = f"{service.dim}-dim sentence vectors" if service.dim is not None else "no sentence vectors"
        routes = [
            ROUTES[a].shown if a is Answer.EMBEDDINGS else f"{name} at {ROUTES[a].shown}"
            for a, (name, _) in service.parts().items()
        ]
        warmed = f"; {service.warmed.describe()}" if service.warmed is not None else ""
        click.echo(
            f"serving {model} ({what}) on http://{host}:{port} with {key}: POST {'; '.join(routes)}"
            f"; GET /v1/models, /health, /metrics{warmed}",
            err=True,
        )

    serve(sock, service, on_started=started)
