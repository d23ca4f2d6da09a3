"""`ctxrep plot-run` on short runs: one to three logged steps still give points you can see."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ctxrep.cli.plot_run import plot_run as plot_run_command
from ctxrep.train.plot import draw_run, plot_run

BLUE = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib's first colour, C0


def write_log(run_dir, steps: int, eval_at_end: bool = True) -> list[dict]:
    records = [
        {"step": s, "loss": 7.0 - 0.3 * s, "lr": 1e-3 * (s - 1), "tokens_per_s": 800.0 + 10 * s}
        for s in range(1, steps + 1)
    ]
    if eval_at_end:
        records.append({"step": steps, "eval_loss": 6.0, "eval_perplexity": float(np.exp(6.0))})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def blue_pixels(png_path) -> list[int]:
    """How many pixels of C0 blue each third of the image (the loss, lr and tokens/s panels) holds."""
    import matplotlib.image

    image = matplotlib.image.imread(png_path)[:, :, :3]
    blue = np.all(np.abs(image - BLUE) < 0.08, axis=-1)
    width = blue.shape[1]
    return [int(blue[:, i * width // 3 : (i + 1) * width // 3].sum()) for i in range(3)]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_short_run_shows_its_points(tmp_path, steps):
    records = write_log(tmp_path, steps)
    out = plot_run(tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loss, lr, speed = blue_pixels(out)
    # the lr and tokens/s panels have no legend: their blue is the drawn points alone (a one-point line is invisible)
    assert lr > 30 and speed > 30, (loss, lr, speed)
    fig = draw_run(records)
    for ax in fig.axes:
        lines = ax.get_lines()
        assert lines and all(line.get_marker() == "o" for line in lines)
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks) and set(range(1, steps + 1)) <= set(ticks)
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text() == "6"] == ["6"]  # the held-out value printed


def test_a_long_run_is_a_plain_line(tmp_path):
    fig = draw_run(write_log(tmp_path, 200, eval_at_end=False))
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    assert len(lines) == 3 and all(line.get_marker() in (None, "None", "") for line in lines)
    assert not any(ax.texts for ax in fig.axes)


def test_a_panel_without_data_says_so(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    fig = draw_run([{"step": 1, "loss": 2.5}])
    assert [t.get_text() for t in fig.axes[1].texts] == ["not in the log"]
    assert [t.get_text() for t in fig.axes[2].texts] == ["not in the log"]
    result = CliRunner().invoke(plot_run_command, [str(tmp_path), "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert blue_pixels(tmp_path / "c.png")[1:] == [0, 0]


def test_a_translation_run_gets_a_bleu_panel():
    records = [{"step": s, "loss": 5.0 - s / 100, "lr": 1e-3, "tokens_per_s": 5000.0} for s in range(1, 301)]
    records += [{"step": 100, "eval_loss": 4.5, "eval_bleu": 12.5}, {"step": 300, "eval_loss": 3.5, "eval_bleu": 30.0}]
    fig = draw_run(records)
    assert [ax.get_title() for ax in fig.axes] == [
        "loss",
        "learning rate",
        "tokens / s",
        "validation BLEU (during training)",
    ]
    (bleu,) = fig.axes[3].get_lines()
    assert list(bleu.get_xdata()) == [100, 300] and list(bleu.get_ydata()) == [12.5, 30.0]
    assert len(draw_run(records[:300]).axes) == 3  # no BLEU in the log: the usual three panels
