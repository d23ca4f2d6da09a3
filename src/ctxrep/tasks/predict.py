"""Apply a fine-tuned model to a file: `ctxrep predict --model runs/x/model --input FILE --out preds.csv`.

The input is read as at training (`ctxrep finetune` saves the task and its column settings in MODEL/task.json; the
label column may be absent). What is written, by task kind:
  classify, pair, sst2, sst5, glue-pair, wic   line, the text(s), label, probability (of the predicted label)
  regress, stsb, sick-r                        line, the text(s), score
  tag, conll2003, upos                         the words with their predicted tags: CoNLL columns "word<TAB>tag"
                                               with a blank line between sentences (or one row per word in
                                               CSV / TSV: line, sentence, word_index, word, tag; JSONL: words, tags)
  span, squad                                  line, question, answer, start, end (character offsets in the context)
The output format follows --out's name: .csv, .tsv, .jsonl (else CSV; for tags, CoNLL columns).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctxrep.tasks.experiment import ALL_TASKS, CLASSIFICATION, REGRESSION, read_task

TAGGING = ("conll2003", "upos", "tag")
SPANS = ("squad", "span")
# the task an estimator saved without task.json (from Python) reads its input as
DEFAULT_TASK = {
    "SequenceClassifier": "classify",
    "SequenceRegressor": "regress",
    "WordInContextClassifier": "wic",
    "TokenTagger": "tag",
    "SpanExtractor": "span",
}


@dataclass
class Predictions:
    task: str
    examples: int
    out: Path


def task_settings(model_dir: str | Path) -> dict:
    """MODEL/task.json ({"task", "columns"}) as `ctxrep finetune` wrote it, or {} for a model saved from Python."""
    file = Path(model_dir) / "task.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def _marked(words: list[str], index: int) -> str:
    return " ".join(f"[[{w}]]" if i == index else w for i, w in enumerate(words))


def _texts(task: str, x) -> dict:
    """The input's text columns for one output row."""
    if task == "wic":
        a, b = x
        if isinstance(a, tuple):  # WiC's own files: (words, index)
            a, b = _marked(list(a[0]), a[1]), _marked(list(b[0]), b[1])
        return {"text": a, "text_pair": b}
    if isinstance(x, tuple):
        return {"text": x[0], "text_pair": x[1]}
    return {"text": x}


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
    task = task or settings.get("task") or DEFAULT_TASK[type(estimator).__name__]
    if task not in ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(ALL_TASKS)}")
    given = {k: v for k, v in (columns or {}).items() if v is not None}
    columns = settings.get("columns", {}) | given if settings.get("task", task) == task else given
    data = read_task(task, input_path, columns=columns or None, labelled=False)
    if echo is not None:
        echo(f"predict: {len(data.X):,} examples from {input_path} with {type(estimator).__name__} ({task})")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = data.lines or list(range(1, len(data.X) + 1))
    suffix = out.name.lower().removesuffix(".gz").rsplit(".", 1)[-1] if "." in out.name else ""
    if task in TAGGING:
        tags = estimator.predict(data.X)
        _write_tags(out, suffix, lines, data.X, tags)
    elif task in SPANS:
        answers = estimator.predict(data.X)
        offsets = estimator.predict_offsets(data.X)
        rows = [
            {"line": line, "question": q, "answer": a, "start": s, "end": e}
            for line, (q, _), a, (s, e) in zip(lines, data.X, answers, offsets)
        ]
        _write_rows(out, suffix, rows)
    elif task in REGRESSION:
        scores = estimator.predict(data.X)
        rows = [{"line": line, **_texts(task, x), "score": float(s)} for line, x, s in zip(lines, data.X, scores)]
        _write_rows(out, suffix, rows)
    elif task in CLASSIFICATION:
        proba = estimator.predict_proba(data.X)
        best = proba.argmax(axis=1)
        labels = estimator.classes_[best]
        rows = [
            {"line": line, **_texts(task, x), "label": _plain(label), "probability": float(proba[i, best[i]])}
            for i, (line, x, label) in enumerate(zip(lines, data.X, labels))
        ]
        _write_rows(out, suffix, rows)
    else:  # pragma: no cover - ALL_TASKS is covered above
        raise ValueError(f"no prediction output for task {task!r}")
    return Predictions(task, len(data.X), out)


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _write_rows(out: Path, suffix: str, rows: list[dict]) -> None:
    if suffix == "jsonl":
        with open(out, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    with open(out, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if suffix == "tsv" else ",")
        writer.writeheader()
        writer.writerows(rows)


def _write_tags(out: Path, suffix: str, lines: list[int], sentences: list, tags: list) -> None:
    if suffix in ("csv", "tsv"):
        rows = [
            {"line": line, "sentence": s, "word_index": j, "word": w, "tag": t}
            for s, (line, words, predicted) in enumerate(zip(lines, sentences, tags))
            for j, (w, t) in enumerate(zip(words, predicted))
        ]
        _write_rows(out, suffix, rows)
    elif suffix == "jsonl":
        rows = [{"line": line, "words": list(w), "tags": list(t)} for line, w, t in zip(lines, sentences, tags)]
        _write_rows(out, suffix, rows)
    else:
        with open(out, "w", encoding="utf-8") as f:
            for words, predicted in zip(sentences, tags):
                f.writelines(f"{w}\t{t}\n" for w, t in zip(words, predicted))
                f.write("\n")


__all__ = ["predict_file", "task_settings", "Predictions"]
