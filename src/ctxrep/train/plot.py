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


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a PNG of the run's curves (default RUN_DIR/curves.png) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(run_dir)
    out = Path(run_dir) / "curves.png" if out is None else Path(out)

    def series(key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        points = [(s, v) for s, v in points if math.isfinite(v)]
        return [s for s, _ in points], [v for _, v in points]

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=100)
    loss_ax, lr_ax, speed_ax = axes
    for key, label, style in (("loss", "train", "-"), ("eval_loss", "held-out", "o-")):
        steps, values = series(key)
        if steps:
            loss_ax.plot(steps, values, style, label=label, markersize=3)
    loss_ax.set_title("loss")
    loss_ax.legend(fontsize=8)
    for ax, key, title in ((lr_ax, "lr", "learning rate"), (speed_ax, "tokens_per_s", "tokens / s")):
        steps, values = series(key)
        ax.plot(steps, values)
        ax.set_title(title)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(Path(run_dir).resolve().name, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
