"""`ctxrep info MODEL`: what a model is and where its files are."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors


@click.command()
@click.argument("model", default="minilm")
@user_errors
def info(model: str) -> None:
    """Architecture, sizes, tokenizer and files of MODEL (a packaged name such as 'minilm' or a folder)."""
    from ctxrep.models.loading import load_model, resolve_model_path
    from ctxrep.tokenize import Tokenizer

    path = resolve_model_path(model)
    m = load_model(model)
    tok = Tokenizer.from_model_dir(path)
    cfg = m.config
    n_params = sum(p.numel() for p in m.parameters())
    rows = [
        ("model", model),
        ("folder", str(path)),
        ("files", ", ".join(sorted(p.name for p in path.iterdir() if p.is_file()))),
        ("architecture", f"{cfg.model_type} encoder (post-LayerNorm Transformer)"),
        ("layers", f"{m.num_layers} (+ embedding output = layer 0)"),
        ("hidden size", str(m.hidden_size)),
        ("attention heads", str(getattr(cfg, "num_attention_heads", "-"))),
        ("feed-forward size", str(getattr(cfg, "intermediate_size", "-"))),
        ("max tokens", f"{cfg.max_tokens} per window (longer texts are windowed)"),
        ("parameters", f"{n_params:,}"),
        ("tokenizer", f"{type(tok.backend.model).__name__}, {tok.vocab_size:,} entries"),
        ("special tokens", " ".join(tok.backend.id_to_token(i) for i in tok.template.prefix) + " A "
         + " ".join(tok.backend.id_to_token(i) for i in tok.template.single_suffix)),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
