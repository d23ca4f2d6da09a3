"""`ctxrep info MODEL`: what a model is and where its files are, for every family (asked of the encoder interface)."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors


@click.command()
@click.argument("model", default="minilm")
@user_errors
def info(model: str) -> None:
    """Family (an encoder, or a decoder and its attention: causal or bidirectional), sizes, window limit, tokenizer,
    files and the sentence pooling to choose (last token for a causal decoder) of MODEL (a packaged name such as
    'minilm', a model folder, an ELMo folder with or without 'elmo:', or a Hugging Face Hub name)."""
    from ctxrep.models.loading import load_encoder
    from ctxrep.models.sentence_transformers import describe_sentence_pooling

    loaded = load_encoder(model)
    m, tok, folder = loaded.model, loaded.tokenizer, loaded.folder
    n_params = sum(p.numel() for p in m.parameters())
    heads = str(m.num_heads) if m.has_attention else f"none ({m.no_attention_reason()})"
    if m.word_level:
        tokenizer = f"words (characters): each word is read as up to {tok.max_characters_per_token} characters"
        special = "none"
    else:
        tokenizer = f"{type(tok.backend.model).__name__}, {tok.vocab_size:,} entries"
        special = " ".join(
            [
                *(tok.backend.id_to_token(i) for i in tok.template.prefix),
                "A",
                *(tok.backend.id_to_token(i) for i in tok.template.single_suffix),
            ]
        )
    rows = [
        ("model", model),
        ("folder", str(folder)),
        ("files", ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file()))),
        ("family", family_line(m)),
        ("layers", f"{m.num_layers} (+ the input layer = layer 0)"),
        *([("sides", m.describe_sides())] if m.describe_sides() else []),
        ("hidden size", str(m.hidden_size)),
        ("attention heads", heads),
        ("max tokens", f"{m.max_tokens} per window (longer texts are windowed)"),
        ("parameters", f"{n_params:,}"),
        ("tokenizer", tokenizer),
        ("special tokens", special),
        ("sentence vector", describe_sentence_pooling(folder, causal=m.causal)),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")


def family_line(model) -> str:
    """`info`'s family row, from the encoder interface: "bert encoder", "qwen3 decoder (causal attention)",
    "gemma3_text decoder (bidirectional attention)"."""
    if not model.is_decoder:
        return f"{model.family} encoder"
    attention = "causal attention: each token reads the tokens before it" if model.causal else "bidirectional attention"
    return f"{model.family} decoder ({attention})"
