"""Read a data set with ctxrep's readers, train a task model, evaluate on dev, write a report.

Tasks are the rows of tasks/kinds.py's table (KINDS): the named benchmark data sets (sst2, sst5, conll2003, upos,
glue-pair, squad, stsb, sick-r, each in its own format), or the user's own files (read by ctxrep.data.table with the
column settings in `columns`):
  classify   CSV / TSV / JSONL, a text and a label per example      -> SequenceClassifier
  pair       CSV / TSV / JSONL, two texts and a label               -> SequenceClassifier on pairs
  regress    CSV / TSV / JSONL, a text (or two) and a numeric score -> SequenceRegressor (Pearson, Spearman)
  tag        CoNLL-style columns or JSONL lists, a tag per word     -> TokenTagger
  span       SQuAD-style JSONL (question, context, answers)         -> SpanExtractor
  wic        WiC's own files (*.data.txt with *.gold.txt beside it), or CSV / TSV / JSONL with two texts whose
             target word is marked [[word]] (or given as "SENTENCE<TAB>WORD_INDEX", as `ctxrep neighbors query`
             reads it) and a label                                  -> WordInContextClassifier
stsb reads the STS benchmark's sts-*.csv or GLUE's STS-B TSV, sick-r SICK's SICK_*.txt (ctxrep.data.sts).

out_dir/
  model/            the estimator (model.safetensors + config.json; load with ctxrep.tasks.load or <Class>.load)
                    and task.json (the task and column settings `ctxrep predict` reads the input with)
  metrics.json      dev metrics, parameters, per-epoch history, wall-clock seconds
  report.txt        the printed classification / entity report
  confusion.png     classification tasks (sst2, sst5, glue-pair, upos)
  learning_curve.png  per-epoch dev score (every task)
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ctxrep.tasks.kinds import BENCHMARKS, KINDS, NAMES, Dataset, Kind, Reading, kind
from ctxrep.tasks.outputs import classification_report, confusion_matrix, plot_curve

TASKS = BENCHMARKS  # the named benchmark data sets (prune, distill)
ALL_TASKS = NAMES


def read_task(
    task: str,
    path: str | Path,
    limit: int | None = None,
    phrases: bool = False,
    columns: dict | None = None,
    labelled: bool = True,
) -> Dataset:
    """Examples of `task` from one file; `limit` keeps the first N. For SST, `phrases=True` gives every distinct
    labelled phrase of the trees (as GLUE's SST-2 training set does), not only the sentences. For a file task,
    `columns` holds the reader's settings (the row's `columns`: format, header, text_column, ...). `labelled=False`
    (prediction) reads the input without its label column (the row's prediction input rule); y is then None each."""
    data = kind(task).read_file(path, Reading(dict(columns or {}), labelled, phrases))
    if limit is not None:
        data = Dataset(data.X[:limit], data.y[:limit], data.lines[:limit] if data.lines is not None else None)
    return Dataset(list(data.X), list(data.y), data.lines)


def check_labels(row: Kind, train: Dataset, dev: Dataset, train_path, dev_path) -> None:
    """Labels of the user's files: scores in a label column point to regression; a dev label that the training file
    never has cannot be predicted, so its line is named."""
    if not (row.user_files and row.output.categorical):
        return
    if row.output.per_word:
        known = {t for tags in train.y for t in tags}
        dev_labels = [tags for tags in dev.y]
    else:
        from ctxrep.tasks.classifier import refuse_continuous_labels

        try:
            refuse_continuous_labels(train.y)
        except ValueError as e:
            raise ValueError(f"{train_path}: {e}") from None
        known, dev_labels = set(train.y), [[label] for label in dev.y]
    for line, labels in zip(dev.lines or [], dev_labels):
        for label in labels:
            if label not in known:
                shown = ", ".join(map(repr, sorted(known, key=str)[:10]))
                raise ValueError(
                    f"{dev_path}:{line}: label {label!r} does not occur in {train_path} (its labels: {shown}); the "
                    "model cannot predict it: add training examples of it, or remove it from the dev file"
                )


def make_estimator(task: str, **params):
    """The estimator of `task`'s row with `params` (and the row's fixed ones, e.g. a tagger's tag scheme)."""
    return kind(task).make_estimator(**params)


def experiment(
    task: str,
    train: str | Path,
    dev: str | Path,
    model: str = "minilm",
    mode: str = "finetune",
    out_dir: str | Path = "finetune-out",
    limit: int | None = None,
    train_phrases: bool = False,
    echo=print,
    columns: dict | None = None,
    **params,
) -> dict:
    """Train `task` on `train`, evaluate on `dev`, write model, metrics and plots to out_dir; return the metrics.
    `columns`: the file reader's settings for a file task (the row's `columns`); `params` go to the estimator, and
    those not given (or None) take the row's defaults when fine-tuning (tasks/kinds.py)."""
    row = kind(task)
    if train_phrases and "train_phrases" not in row.options:
        users = ", ".join(k.name for k in KINDS.values() if "train_phrases" in k.options)
        raise ValueError(f"train_phrases is for the SST tasks ({users}), not {task!r}")
    train_data = read_task(task, train, limit, phrases=train_phrases, columns=columns)
    dev_data = read_task(task, dev, limit, columns=columns)
    check_labels(row, train_data, dev_data, train, dev)
    settings = row.settings(mode, params)
    estimator = row.make_estimator(model=model, mode=mode, **settings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    echo(
        f"{task}: {len(train_data.X):,} training and {len(dev_data.X):,} dev examples; training "
        f"{type(estimator).__name__} ({mode}, {model})"
    )
    started = time.perf_counter()
    estimator.fit(train_data.X, train_data.y, eval_set=(dev_data.X, dev_data.y))
    train_seconds = time.perf_counter() - started
    echo(f"{task}: trained in {train_seconds:,.0f} s; {kept_line(estimator)}")
    echo(f"{task}: predicting the {len(dev_data.X):,} dev examples")
    report = row.output.report(estimator, dev_data.X, dev_data.y, out)
    metrics: dict = {
        "task": task,
        "estimator": type(estimator).__name__,
        "model": model,
        "mode": mode,
        "train_examples": len(train_data.X),
        "dev_examples": len(dev_data.X),
        "train_seconds": train_seconds,
        "kept_epoch": estimator.kept_epoch_,
        "precision": "bf16" if estimator.bf16 else "fp32",  # bf16: autocast in training and prediction
        **report.metrics,
        "seconds": time.perf_counter() - started,
        "params": estimator.get_params(),
        "history": estimator.history_,
    }
    echo(report.text)
    (out / "report.txt").write_text(report.text + "\n")
    # written beside, then renamed: a run stopped while saving (Ctrl-C) leaves no model/ without its task.json
    partial = out / "model.partial"
    shutil.rmtree(partial, ignore_errors=True)
    estimator.save(partial)
    # the header rule is decided per file, so prediction input does not inherit it
    saved = {k: v for k, v in (columns or {}).items() if v is not None and k != "header"}
    (partial / "task.json").write_text(json.dumps({"task": task, "columns": saved}, indent=2) + "\n")
    shutil.rmtree(out / "model", ignore_errors=True)
    partial.rename(out / "model")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    plot_curve(estimator.history_, report.curve_metric, out / "learning_curve.png")
    return metrics


def kept_line(estimator) -> str:
    """Which epoch's weights a fit kept, and why (`keep`: the best held-out score or the last epoch), with the
    scores that decided it and how to ask for the other choice."""
    history, kept = estimator.history_, estimator.kept_epoch_
    last = history[-1]
    score = "validation_score" if estimator.early_stopping else "dev_score"
    scores = {e["epoch"]: e[score] for e in history if score in e}
    where = f"epoch {kept} of {last['epoch']}"
    if kept not in scores:  # no held-out score (keep="last" without a dev set)
        return f"kept the last epoch's weights ({where})"
    which = "validation" if estimator.early_stopping else "dev"
    if estimator.early_stopping or estimator.keep == "best":
        return (
            f"kept the weights of {where}, the best {which} score ({scores[kept]:.4f}; the last epoch's "
            f"{scores[last['epoch']]:.4f}); --keep last keeps the last epoch's"
        )
    best = max(scores, key=scores.get)
    return (
        f"kept the last epoch's weights ({where}, {which} score {scores[kept]:.4f}; the best was epoch {best}'s "
        f"{scores[best]:.4f}: --keep best keeps it)"
    )


__all__ = ["experiment", "read_task", "make_estimator", "classification_report", "confusion_matrix", "ALL_TASKS"]
