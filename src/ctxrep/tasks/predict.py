"""Apply a fine-tuned model to a file: `ctxrep predict --model runs/x/model --input FILE --out preds.csv`.

The input is read as at training (`ctxrep finetune` saves the task and its column settings in MODEL/task.json),
without labels: every task kind takes just the texts (the kind's prediction input rule, tasks/kinds.py; an STS model
takes the benchmark's layout with or without its score, or a table of two texts). What is written follows the
kind's output (tasks/outputs.py):
  a label     line, the text(s), label, probability (of the predicted label)
  a score     line, the text(s), score
  tags        the words with their predicted tags: CoNLL columns "word<TAB>tag" with a blank line between
              sentences (or one row per word in CSV / TSV: line, sentence, word_index, word, tag; JSONL: words, tags)
  a span      line, question, answer, start, end (character offsets in the context)
The output format follows --out's name: .csv, .tsv, .jsonl (else CSV; for tags, CoNLL columns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ctxrep.tasks.experiment import read_task
from ctxrep.tasks.kinds import kind, kind_of_estimator


@dataclass
class Predictions:
    task: str
    examples: int
    out: Path


def task_settings(model_dir: str | Path) -> dict:
    """MODEL/task.json ({"task", "columns"}) as `ctxrep finetune` wrote it, or {} for a model saved from Python."""
    file = Path(model_dir) / "task.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def predict_file(
    model_dir: str | Path,
    input_path: str | Path,
    out: str | Path,
    task: str | None = None,
    columns: dict | None = None,
    echo=None,
    device: str | None = None,
) -> Predictions:
    """Predict every example of `input_path` with the saved estimator in `model_dir` and write them to `out`.
    `task` and `columns` default to what MODEL/task.json recorded at training; given ones override it. `device`:
    where to predict (None: the saved estimator's own)."""
    from ctxrep.tasks import load

    settings = task_settings(model_dir)
    estimator = load(model_dir, device=device)
    row = kind(task) if task else kind(settings["task"]) if settings.get("task") else kind_of_estimator(estimator)
    given = {k: v for k, v in (columns or {}).items() if v is not None}
    saved = settings.get("columns", {}) if settings.get("task", row.name) == row.name else {}
    columns = {k: v for k, v in saved.items() if k in row.predict_columns()} | given
    data = read_task(row.name, input_path, columns=columns, labelled=False)
    if echo is not None:
        echo(f"predict: {len(data.X):,} examples from {input_path} with {type(estimator).__name__} ({row.name})")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    row.output.write(estimator, data.X, data.lines or list(range(1, len(data.X) + 1)), out)
    return Predictions(row.name, len(data.X), out)


__all__ = ["predict_file", "task_settings", "Predictions"]
