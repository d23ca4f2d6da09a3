"""`ctxrep export --format onnx --model DIR --out FILE`: an encoder as an ONNX graph, checked against ctxrep."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors


@click.command()
@click.option(
    "--format", "format_", type=click.Choice(["onnx"]), default="onnx", show_default=True, help="Output format."
)
@click.option("--model", required=True, help="A model folder, packaged name ('minilm') or cached Hub name.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The .onnx file to write.")
@click.option("--opset", type=int, default=17, show_default=True, help="ONNX opset version.")
@click.option(
    "--atol",
    type=float,
    default=1e-4,
    show_default=True,
    help="Largest |ONNX Runtime - ctxrep| difference of last_hidden_state accepted.",
)
@user_errors
def export(format_: str, model: str, out: str, opset: int, atol: float) -> None:
    """Export MODEL's encoder (inputs input_ids, attention_mask[, token_type_ids]; output last_hidden_state; dynamic
    batch and sequence axes) and check ONNX Runtime's output against ctxrep's on fresh batches."""
    from ctxrep.runtime.export import export_onnx

    report = export_onnx(model, out, opset=opset, atol=atol)
    click.echo(
        f"wrote {report.path} ({report.family}, opset {report.opset}, {report.exporter} exporter; inputs "
        f"{', '.join(report.input_names)}); ONNX Runtime vs ctxrep: max abs difference {report.max_abs_diff:.2e}"
    )
    if report.data_file is not None:
        click.echo(f"its weights are in {report.data_file} (over 2 GiB for one file): keep the two files together")
