"""Read a data set with ctxrep's readers, train a task model, evaluate on dev, write a report.

Tasks: the named benchmark data sets (TASKS: sst2, sst5, conll2003, upos, glue-pair, squad, stsb, sick-r, each in
its own format), or the user's own files (FILE_TASKS, read by ctxrep.data.table with the column settings in `columns`):
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
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TASKS = ("sst2", "sst5", "conll2003", "upos", "glue-pair", "squad", "stsb", "sick-r")  # named benchmark data sets
FILE_TASKS = ("classify", "pair", "regress", "tag", "span", "wic")  # the user's own files (ctxrep.data.table)
REGRESSION = ("regress", "stsb", "sick-r")
CLASSIFICATION = ("sst2", "sst5", "glue-pair", "classify", "pair", "wic")
ALL_TASKS = TASKS + FILE_TASKS
# the `columns` settings each file task reads (ctxrep.data.table's keyword arguments; --text-column etc. on the CLI)
COLUMNS = {
    "classify": ("format", "text_column", "label_column"),
    "pair": ("format", "text_column", "text_pair_column", "label_column"),
    "regress": ("format", "text_column", "text_pair_column", "label_column"),
    "wic": ("format", "text_column", "text_pair_column", "label_column"),
    "tag": ("format", "word_column", "tag_column"),
    "span": ("format", "question_column", "context_column", "answers_column"),
}


@dataclass
class Dataset:
    X: list
    y: list
    lines: list[int] | None = None  # each example's first line (file tasks)


def is_wic_file(path: str | Path, columns: dict | None) -> bool:
    """Whether --task wic reads WiC's own layout (a *.data.txt file, or any name but .csv/.tsv/.jsonl without
    --format) rather than a table of marked texts."""
    from ctxrep.data.table import SUFFIXES

    if (columns or {}).get("format") is not None:
        return False
    name = Path(path).name.lower().removesuffix(".gz")
    return name.endswith(".data.txt") or Path(name).suffix not in SUFFIXES


def wic_gold_path(path: str | Path) -> Path | None:
    """WiC's gold file beside a data file (train.data.txt -> train.gold.txt), or None when there is none."""
    path = Path(path)
    if not path.name.endswith(".data.txt"):
        return None
    gold = path.with_name(path.name.removesuffix(".data.txt") + ".gold.txt")
    return gold if gold.is_file() else None


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
    `columns` holds the reader's settings (COLUMNS[task]: format, text_column, ...). `labelled=False` (prediction)
    reads a file task's input without its label column; y is then a list of None."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    lines = None
    if task == "wic" and is_wic_file(path, columns):
        from ctxrep.data.wic import read_wic

        given = [k for k, v in (columns or {}).items() if v is not None]
        if given:
            raise ValueError(
                f"{path}: WiC's own files have fixed fields, so {', '.join('--' + k.replace('_', '-') for k in given)} "
                "does not apply; column options are for a CSV / TSV / JSONL file of marked texts"
            )
        gold = wic_gold_path(path)
        if gold is None and labelled:
            raise ValueError(
                f"{path}: no gold file beside it (WiC's labels are in NAME.gold.txt next to NAME.data.txt); "
                "put it there, or give a CSV / TSV / JSONL file with a label column"
            )
        pairs = read_wic(path, gold if labelled else None)
        X = [((p.sentence1, p.idx1), (p.sentence2, p.idx2)) for p in pairs]
        y = [("T" if p.label else "F") if p.label is not None else None for p in pairs]
        lines = [p.line for p in pairs]
    elif task in FILE_TASKS:
        from ctxrep.data import table

        columns = {k: v for k, v in (columns or {}).items() if v is not None}
        unread = sorted(set(columns) - set(COLUMNS[task]))
        if unread:
            hint = "; for two texts per example use --task pair" if "text_pair_column" in unread else ""
            raise ValueError(
                f"--task {task} does not read {', '.join('--' + k.replace('_', '-') for k in unread)}; it reads "
                + ", ".join("--" + k.replace("_", "-") for k in COLUMNS[task])
                + hint
            )
        if task in ("classify", "pair", "regress", "wic"):
            if task in ("pair", "wic"):
                columns.setdefault("text_pair_column", "text_pair")
            if not labelled:
                columns["label_column"] = None
            reader = table.read_scored_texts if task == "regress" and labelled else table.read_labelled_texts
            data = reader(path, **columns)
            if task == "wic":  # every text marks its target: a text without one names its file and line
                from ctxrep.tasks.wic import parse_target

                for line, (a, b) in zip(data.lines, data.X):
                    parse_target(a, f"{path}:{line}", f"the {columns.get('text_column', 'text')!r} text")
                    parse_target(b, f"{path}:{line}", f"the {columns['text_pair_column']!r} text")
        elif task == "tag":
            if not labelled:
                columns["tag_column"] = None
            data = table.read_tagged(path, **columns)
        else:
            if not labelled:
                columns["answers_column"] = None
            data = table.read_questions(path, **columns)
        X, y, lines = data.X, data.y, data.lines
    elif columns and any(v is not None for v in columns.values()):
        given = [k for k, v in columns.items() if v is not None]
        raise ValueError(
            f"--task {task} reads its own format, so {', '.join('--' + k.replace('_', '-') for k in given)} does not "
            f"apply; column settings are for --task {', '.join(FILE_TASKS)}"
        )
    elif task in ("sst2", "sst5"):
        from ctxrep.data.sst import read_sst

        data = read_sst(path, classes=2 if task == "sst2" else 5, phrases=phrases, dedup=phrases)
        X, y = data.texts, data.labels
    elif task == "conll2003":
        from ctxrep.data.conll import read_conll

        sentences = read_conll(path)
        X, y = [s.words for s in sentences], [s.tags for s in sentences]
    elif task == "upos":
        from ctxrep.data.conllu import read_conllu

        sentences = read_conllu(path)
        X, y = [s.words for s in sentences], [s.upos for s in sentences]
    elif task == "glue-pair":
        from ctxrep.data.glue import read_glue_tsv

        examples = read_glue_tsv(path, text_a="sentence1", text_b="sentence2", label="label")
        X, y = [(e.text_a, e.text_b) for e in examples], [e.label for e in examples]
    elif task == "squad":
        from ctxrep.data.squad import read_squad

        examples = [e for e in read_squad(path) if e.answers or not labelled]
        X = [(e.question, e.context) for e in examples]
        y = [[(a.text, a.start) for a in e.answers] for e in examples]
    elif task in ("stsb", "sick-r"):
        from ctxrep.data.sts import read_sts

        pairs = read_sts(path, layout="sick" if task == "sick-r" else None)
        X, y, lines = [(p.text_a, p.text_b) for p in pairs], [p.score for p in pairs], [p.line for p in pairs]
    else:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(ALL_TASKS)}")
    if limit is not None:
        X, y = X[:limit], y[:limit]
        lines = lines[:limit] if lines is not None else None
    if not X:
        raise ValueError(f"{path}: no examples for task {task!r}")
    return Dataset(list(X), list(y), lines)


def check_dev_labels(task: str, train: Dataset, dev: Dataset, train_path, dev_path) -> None:
    """A dev label that the training file never has cannot be predicted: name its line (file tasks)."""
    if task not in ("classify", "pair", "tag", "wic") or dev.lines is None:
        return
    known = {label for labels in train.y for label in (labels if task == "tag" else [labels])}
    for line, labels in zip(dev.lines, dev.y):
        for label in labels if task == "tag" else [labels]:
            if label not in known:
                shown = ", ".join(map(repr, sorted(known, key=str)[:10]))
                raise ValueError(
                    f"{dev_path}:{line}: label {label!r} does not occur in {train_path} (its labels: {shown}); the "
                    "model cannot predict it: add training examples of it, or remove it from the dev file"
                )


def make_estimator(task: str, **params):
    from ctxrep.tasks.classifier import SequenceClassifier
    from ctxrep.tasks.regressor import SequenceRegressor
    from ctxrep.tasks.span import SpanExtractor
    from ctxrep.tasks.tagger import TokenTagger
    from ctxrep.tasks.wic import WordInContextClassifier

    if task in ("sst2", "sst5", "glue-pair", "classify", "pair"):
        return SequenceClassifier(**params)
    if task in REGRESSION:
        return SequenceRegressor(**params)
    if task == "wic":
        return WordInContextClassifier(**params)
    if task == "conll2003":
        return TokenTagger(**({"tag_scheme": "iob1"} | params))
    if task == "upos":
        return TokenTagger(**({"tag_scheme": "none"} | params))
    if task == "tag":
        return TokenTagger(**params)
    if task in ("squad", "span"):
        return SpanExtractor(**params)
    raise ValueError(f"unknown task {task!r}; choose one of {', '.join(ALL_TASKS)}")


def classification_report(gold: list, predicted: list, labels: list) -> tuple[dict, str]:
    """Per-class precision/recall/F1/support, macro F1 and accuracy; and the same as text."""
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    rows, lines = {}, [f"{'class':>12} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}"]
    for label in labels:
        tp = int(np.sum((predicted == label) & (gold == label)))
        n_pred, n_gold = int(np.sum(predicted == label)), int(np.sum(gold == label))
        p = tp / n_pred if n_pred else 0.0
        r = tp / n_gold if n_gold else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        rows[str(label)] = {"precision": p, "recall": r, "f1": f, "support": n_gold}
        lines.append(f"{str(label):>12} {p:9.4f} {r:9.4f} {f:9.4f} {n_gold:8d}")
    macro = float(np.mean([r["f1"] for r in rows.values()])) if rows else 0.0
    accuracy = float(np.mean(gold == predicted)) if len(gold) else 0.0
    lines += [f"{'macro f1':>12} {macro:9.4f}", f"{'accuracy':>12} {accuracy:9.4f}"]
    return {"per_class": rows, "macro_f1": macro, "accuracy": accuracy}, "\n".join(lines)


def confusion_matrix(gold: list, predicted: list, labels: list) -> np.ndarray:
    index = {str(label): i for i, label in enumerate(labels)}
    m = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for g, p in zip(gold, predicted):
        m[index[str(g)], index[str(p)]] += 1
    return m


def _plot_confusion(matrix: np.ndarray, labels: list, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 + 0.5 * len(labels), 1 + 0.5 * len(labels)))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), [str(x) for x in labels], rotation=90)
    ax.set_yticks(range(len(labels)), [str(x) for x in labels])
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)


def _plot_scatter(gold: np.ndarray, predicted: np.ndarray, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(gold, predicted, s=6, alpha=0.4)
    low, high = float(min(gold.min(), predicted.min())), float(max(gold.max(), predicted.max()))
    ax.plot([low, high], [low, high], color="grey", linewidth=0.8)
    ax.set_xlabel("gold score")
    ax.set_ylabel("predicted score")
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)


def _plot_curve(history: list[dict], metric: str, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    epochs = [h["epoch"] for h in history if "dev_score" in h]
    ax.plot(epochs, [h["dev_score"] for h in history if "dev_score" in h], marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"dev {metric}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)


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
    `columns`: the file reader's settings for a file task (COLUMNS[task]); `params` go to the estimator."""
    if task not in ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(ALL_TASKS)}")
    if train_phrases and task not in ("sst2", "sst5"):
        raise ValueError(f"train_phrases is for the SST tasks (sst2, sst5), not {task!r}")
    train_data = read_task(task, train, limit, phrases=train_phrases, columns=columns)
    dev_data = read_task(task, dev, limit, columns=columns)
    if task in ("classify", "pair"):  # scores in a label column: say so before "a dev label never seen in train"
        from ctxrep.tasks.classifier import _refuse_continuous_labels

        try:
            _refuse_continuous_labels(train_data.y)
        except ValueError as e:
            raise ValueError(f"{train}: {e}") from None
    check_dev_labels(task, train_data, dev_data, train, dev)
    estimator = make_estimator(task, model=model, mode=mode, **params)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    echo(
        f"{task}: {len(train_data.X):,} training and {len(dev_data.X):,} dev examples; training "
        f"{type(estimator).__name__} ({mode}, {model})"
    )
    started = time.perf_counter()
    estimator.fit(train_data.X, train_data.y, eval_set=(dev_data.X, dev_data.y))
    train_seconds = time.perf_counter() - started
    echo(f"{task}: trained in {train_seconds:,.0f} s; predicting the {len(dev_data.X):,} dev examples")
    metrics: dict = {
        "task": task,
        "estimator": type(estimator).__name__,
        "model": model,
        "mode": mode,
        "train_examples": len(train_data.X),
        "dev_examples": len(dev_data.X),
        "train_seconds": train_seconds,
        "precision": "bf16" if estimator.bf16 else "fp32",  # bf16: autocast in training and prediction
    }
    tagging = task in ("conll2003", "upos", "tag")
    entity_report = tagging and estimator.entity_scoring_
    if task in REGRESSION:
        predicted = estimator.predict(dev_data.X)
        from ctxrep.tasks.regressor import regression_report

        result = regression_report(np.asarray(dev_data.y, dtype=np.float64), predicted)
        metrics |= result
        text = "\n".join(f"{name:<9}{result[name]:.4f}" for name in ("pearson", "spearman", "r2", "mse"))
        metrics["score_name"], metrics["score"] = "pearson", result["pearson"]
        _plot_scatter(np.asarray(dev_data.y, dtype=np.float64), predicted, out / "scatter.png")
    elif task in CLASSIFICATION or (tagging and not entity_report):
        predicted = estimator.predict(dev_data.X)
        gold = dev_data.y
        if tagging:
            gold = [t for tags in gold for t in tags]
            predicted = [t for tags in predicted for t in tags]
        labels = estimator.classes_.tolist()
        report, text = classification_report(gold, list(predicted), labels)
        metrics |= report
        metrics["score_name"], metrics["score"] = "accuracy", report["accuracy"]
        _plot_confusion(confusion_matrix(gold, predicted, labels), labels, out / "confusion.png")
    elif entity_report:
        result = estimator.evaluate(dev_data.X, dev_data.y)
        metrics |= result
        lines = [f"{'type':>8} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}"]
        for t, s in result["by_type"].items():
            lines.append(f"{t:>8} {s['precision']:9.4f} {s['recall']:9.4f} {s['f1']:9.4f} {s['support']:8d}")
        lines.append(f"{'overall':>8} {result['precision']:9.4f} {result['recall']:9.4f} {result['f1']:9.4f}")
        text = "\n".join(lines)
        metrics["score_name"], metrics["score"] = "entity_f1", result["f1"]
    else:
        result = estimator.evaluate(dev_data.X, dev_data.y)
        metrics |= result
        text = f"exact match {result['exact_match']:.4f}\nf1          {result['f1']:.4f}"
        metrics["score_name"], metrics["score"] = "f1", result["f1"]
    metrics["seconds"] = time.perf_counter() - started
    metrics["params"] = estimator.get_params()
    metrics["history"] = estimator.history_
    echo(text)
    (out / "report.txt").write_text(text + "\n")
    estimator.save(out / "model")
    task_settings = {"task": task, "columns": {k: v for k, v in (columns or {}).items() if v is not None}}
    (out / "model" / "task.json").write_text(json.dumps(task_settings, indent=2) + "\n")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    curve_metric = "r2" if task in REGRESSION else metrics["score_name"]  # the per-epoch dev_score is score()'s
    _plot_curve(estimator.history_, curve_metric, out / "learning_curve.png")
    return metrics
