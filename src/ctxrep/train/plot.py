"""Curves of a training run from its log.jsonl: loss (train and held-out), learning rate, tokens/s."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ctxrep.train.trainer import LOG_FILE


def read_log(run_dir: str | Path) -> list[dict]:
    """The records of RUN_DIR/log.jsonl, with errors that say which line is bad."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such folder; pass the out_dir of a training run")
    path = run_dir / LOG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; is {run_dir} the out_dir of a training run?")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {number}: not JSON ({e.msg}); the log is damaged") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}, line {number}: a record must be a JSON object with an integer 'step'")
        records.append(record)
    if not records:
        raise ValueError(f"{path} has no records yet; the run logs every log_every steps, plot it after that")
    return records


MARKERS_UP_TO = 50  # a series with at most this many points is drawn with a marker at each point


def draw_run(records: list[dict], title: str = ""):
    """A matplotlib Figure of the curves in `records` (log.jsonl records): loss, learning rate, tokens/s, and the
    validation BLEU of a translation run.

    Every point of a short series is marked, so a run of one to a few logged steps shows its points rather than
    an empty line; a panel with nothing to draw says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    def series(key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        points = [(s, v) for s, v in points if math.isfinite(v)]
        return [s for s, _ in points], [v for _, v in points]

    def draw(ax, steps: list[int], values: list[float], **style) -> None:
        marker = "o" if len(steps) <= MARKERS_UP_TO else None
        ax.plot(steps, values, marker=marker, markersize=5 if len(steps) <= 3 else 3, **style)
        if len(steps) <= 3:  # too few points to read a trend from: print the values
            for s, v in zip(steps, values):
                ax.annotate(f"{v:.4g}", (s, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)

    bleu = any("eval_bleu" in r for r in records)  # a translation run: its validation BLEU gets a panel too
    fig, axes = plt.subplots(1, 4 if bleu else 3, figsize=(17 if bleu else 13, 3.6), dpi=100)
    panels = [
        (axes[0], "loss", [("loss", "train", "-"), ("eval_loss", "held-out", "--")]),
        (axes[1], "learning rate", [("lr", None, "-")]),
        (axes[2], "tokens / s", [("tokens_per_s", None, "-")]),
    ]
    if bleu:
        panels.append((axes[3], "validation BLEU (during training)", [("eval_bleu", None, "-")]))
    for ax, title_, keys in panels:
        drawn: list[int] = []
        for key, label, linestyle in keys:
            steps, values = series(key)
            if steps:
                draw(ax, steps, values, linestyle=linestyle, label=label)
                drawn += steps
        if drawn and max(drawn) - min(drawn) < 2:  # one or two steps: whole-step ticks around them
            ax.set_xlim(min(drawn) - 1, max(drawn) + 1)
        ax.margins(y=0.15)  # room for the printed values
        if not drawn:
            ax.text(0.5, 0.5, "not in the log", ha="center", va="center", transform=ax.transAxes, color="gray")
        elif any(label for _, label, _ in keys):
            ax.legend(fontsize=8)
        ax.set_title(title_)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))  # whole steps, few enough to read
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a PNG of the run's curves (default RUN_DIR/curves.png) and return its path."""
    import matplotlib.pyplot as plt

    records = read_log(run_dir)
    out = Path(run_dir) / "curves.png" if out is None else Path(out)
    fig = draw_run(records, title=Path(run_dir).resolve().name)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
