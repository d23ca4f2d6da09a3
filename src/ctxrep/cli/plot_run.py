"""`ctxrep plot-run RUN_DIR`: loss, learning-rate and speed curves of a training run."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors


@click.command("plot-run")
@click.argument("run_dir")
@click.option("--out", default=None, help="PNG file to write (default RUN_DIR/curves.png).")
@user_errors
def plot_run(run_dir: str, out: str | None) -> None:
    """Draw loss (train and held-out), lr, tokens/s (and a translation run's BLEU) from RUN_DIR/log.jsonl to a PNG."""
    from ctxrep.train.plot import plot_run as draw

    click.echo(f"wrote {draw(run_dir, out)}")
