"""`ctxrep tokenizer train`: train a WordPiece (BERT), byte-level BPE (RoBERTa, GPT-2) or word-level (ELMo)
tokenizer; the same command on the same files writes the same tokenizer.json."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors


@click.group("tokenizer")
def tokenizer() -> None:
    """Train tokenizers."""


@tokenizer.command("train")
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option(
    "--kind",
    type=click.Choice(["wordpiece", "bpe", "word"]),
    required=True,
    help="wordpiece (BERT), byte-level bpe (RoBERTa, GPT-2) or word (ELMo's biLM vocabulary).",
)
@click.option("--vocab-size", type=int, required=True, help="Entries in the vocabulary, special tokens included.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Output folder.")
@click.option("--lowercase", is_flag=True, help="Lowercase (and, for WordPiece, strip accents).")
@click.option(
    "--min-frequency",
    type=int,
    default=2,
    show_default=True,
    help="Rarest pair that is merged (word: rarest word kept).",
)
@user_errors
def train(files, kind, vocab_size, out_dir, lowercase, min_frequency) -> None:
    """Train on FILES (.txt files or folders of them); write OUT/tokenizer.json and tokenizer_config.json."""
    from ctxrep.data.tokenizer_training import train_tokenizer

    tok = train_tokenizer(list(files), kind, vocab_size, out_dir, lowercase=lowercase, min_frequency=min_frequency)
    click.echo(f"{kind} tokenizer with {tok.vocab_size} entries; wrote {out_dir}")
