"""What a task kind's model outputs, one object per kind of output: how `ctxrep finetune` scores it on dev (metrics,
the printed report, a plot) and how `ctxrep predict` writes it (one row per example).

  CLASSES   a label per example:   per-class precision / recall / F1, accuracy; confusion.png; label, probability
  SCORES    a number per example:  Pearson, Spearman, R², MSE; scatter.png; score
  TAGS      a tag per word:        entity P / R / F1 (an entity tag scheme) or per-tag scores; CoNLL columns
  SPANS     an answer per question: exact match, F1; answer with its character offsets in the context

Rows of tasks/kinds.py's table name one of these; nothing here knows a task's name. numpy and matplotlib are imported
on first use (the CLI reads the table to print --help).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Report:
    """Dev metrics (with `score_name` and `score`), the printed text, and the metric the learning curve plots."""

    metrics: dict
    text: str
    curve_metric: str


class Output:
    """One kind of output. `categorical`: dev labels must occur in training (a model cannot predict others);
    `per_word`: a label per word (y holds a list per example)."""

    categorical = False
    per_word = False

    def report(self, estimator, X: list, y: list, out: Path) -> Report:
        raise NotImplementedError

    def rows(self, estimator, X: list, lines: list[int]) -> list[dict]:
        raise NotImplementedError

    def write(self, estimator, X: list, lines: list[int], out: Path) -> None:
        """Predict X and write one row per example to `out` (.csv, .tsv, .jsonl; else CSV)."""
        write_rows(out, self.rows(estimator, X, lines))


class Classes(Output):
    categorical = True

    def report(self, estimator, X, y, out):
        predicted = list(estimator.predict(X))
        labels = estimator.classes_.tolist()
        metrics, text = classification_report(y, predicted, labels)
        plot_confusion(confusion_matrix(y, predicted, labels), labels, out / "confusion.png")
        return Report(metrics | {"score_name": "accuracy", "score": metrics["accuracy"]}, text, "accuracy")

    def rows(self, estimator, X, lines):
        proba = estimator.predict_proba(X)
        best = proba.argmax(axis=1)
        labels = estimator.classes_[best]
        return [
            {"line": line, **texts_of(x), "label": plain(label), "probability": float(proba[i, best[i]])}
            for i, (line, x, label) in enumerate(zip(lines, X, labels))
        ]


class Scores(Output):
    def report(self, estimator, X, y, out):
        import numpy as np

        from ctxrep.tasks.regressor import regression_report

        gold, predicted = np.asarray(y, dtype=np.float64), estimator.predict(X)
        metrics = regression_report(gold, predicted)
        text = "\n".join(f"{name:<9}{metrics[name]:.4f}" for name in ("pearson", "spearman", "r2", "mse"))
        plot_scatter(gold, predicted, out / "scatter.png")
        # the per-epoch dev_score is the regressor's score(), R²
        return Report(metrics | {"score_name": "pearson", "score": metrics["pearson"]}, text, "r2")

    def rows(self, estimator, X, lines):
        scores = estimator.predict(X)
        return [{"line": line, **texts_of(x), "score": float(s)} for line, x, s in zip(lines, X, scores)]


class Tags(Output):
    categorical = True
    per_word = True

    def report(self, estimator, X, y, out):
        if not estimator.entity_scoring_:  # tags without entities (UPOS): per-tag scores over every word
            gold = [t for tags in y for t in tags]
            predicted = [t for tags in estimator.predict(X) for t in tags]
            labels = estimator.classes_.tolist()
            metrics, text = classification_report(gold, predicted, labels)
            plot_confusion(confusion_matrix(gold, predicted, labels), labels, out / "confusion.png")
            return Report(metrics | {"score_name": "accuracy", "score": metrics["accuracy"]}, text, "accuracy")
        result = estimator.evaluate(X, y)
        lines = [f"{'type':>8} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}"]
        for t, s in result["by_type"].items():
            lines.append(f"{t:>8} {s['precision']:9.4f} {s['recall']:9.4f} {s['f1']:9.4f} {s['support']:8d}")
        lines.append(f"{'overall':>8} {result['precision']:9.4f} {result['recall']:9.4f} {result['f1']:9.4f}")
        return Report(result | {"score_name": "entity_f1", "score": result["f1"]}, "\n".join(lines), "entity_f1")

    def write(self, estimator, X, lines, out):
        """CoNLL columns "word<TAB>tag" with a blank line between sentences; CSV / TSV: one row per word (line,
        sentence, word_index, word, tag); JSONL: words and tags per sentence."""
        tags = estimator.predict(X)
        suffix = suffix_of(out)
        if suffix in ("csv", "tsv"):
            rows = [
                {"line": line, "sentence": s, "word_index": j, "word": w, "tag": t}
                for s, (line, words, predicted) in enumerate(zip(lines, X, tags))
                for j, (w, t) in enumerate(zip(words, predicted))
            ]
            write_rows(out, rows)
        elif suffix == "jsonl":
            write_rows(out, [{"line": line, "words": list(w), "tags": list(t)} for line, w, t in zip(lines, X, tags)])
        else:
            with open(out, "w", encoding="utf-8") as f:
                for words, predicted in zip(X, tags):
                    f.writelines(f"{w}\t{t}\n" for w, t in zip(words, predicted))
                    f.write("\n")


class Spans(Output):
    def report(self, estimator, X, y, out):
        result = estimator.evaluate(X, y)
        text = f"exact match {result['exact_match']:.4f}\nf1          {result['f1']:.4f}"
        return Report(result | {"score_name": "f1", "score": result["f1"]}, text, "f1")

    def rows(self, estimator, X, lines):
        answers = estimator.predict(X)
        offsets = estimator.predict_offsets(X)
        return [
            {"line": line, "question": q, "answer": a, "start": s, "end": e}
            for line, (q, _), a, (s, e) in zip(lines, X, answers, offsets)
        ]


CLASSES, SCORES, TAGS, SPANS = Classes(), Scores(), Tags(), Spans()


# ---- reports ------------------------------------------------------------------------------------------------


def classification_report(gold: list, predicted: list, labels: list) -> tuple[dict, str]:
    """Per-class precision/recall/F1/support, macro F1 and accuracy; and the same as text."""
    import numpy as np

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


def confusion_matrix(gold: list, predicted: list, labels: list):
    import numpy as np

    index = {str(label): i for i, label in enumerate(labels)}
    m = np.zeros((len(labels), len(labels)), dtype=np.int64)
    for g, p in zip(gold, predicted):
        m[index[str(g)], index[str(p)]] += 1
    return m


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(matrix, labels: list, file: Path) -> None:
    plt = _pyplot()
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


def plot_scatter(gold, predicted, file: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(gold, predicted, s=6, alpha=0.4)
    low, high = float(min(gold.min(), predicted.min())), float(max(gold.max(), predicted.max()))
    ax.plot([low, high], [low, high], color="grey", linewidth=0.8)
    ax.set_xlabel("gold score")
    ax.set_ylabel("predicted score")
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)


def plot_curve(history: list[dict], metric: str, file: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    epochs = [h["epoch"] for h in history if "dev_score" in h]
    ax.plot(epochs, [h["dev_score"] for h in history if "dev_score" in h], marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"dev {metric}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)


# ---- prediction rows ----------------------------------------------------------------------------------------


def _marked(words: list[str], index: int) -> str:
    return " ".join(f"[[{w}]]" if i == index else w for i, w in enumerate(words))


def texts_of(x) -> dict:
    """The input's text columns for one output row: a text, a pair, or a pair of (words, target index) (WiC's own
    files, written back with the target marked [[word]])."""
    if not isinstance(x, tuple):
        return {"text": x}
    a, b = (_marked(list(t[0]), t[1]) if isinstance(t, tuple) else t for t in x)
    return {"text": a, "text_pair": b}


def plain(value):
    """A numpy scalar label as the plain Python value (for CSV and JSON)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def suffix_of(out: Path) -> str:
    return out.name.lower().removesuffix(".gz").rsplit(".", 1)[-1] if "." in out.name else ""


def write_rows(out: Path, rows: list[dict]) -> None:
    """Rows as JSON Lines (.jsonl), TSV (.tsv) or CSV (any other name), with a header row."""
    suffix = suffix_of(out)
    if suffix == "jsonl":
        with open(out, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    with open(out, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if suffix == "tsv" else ",")
        writer.writeheader()
        writer.writerows(rows)


__all__ = ["CLASSES", "SCORES", "TAGS", "SPANS", "Output", "Report", "classification_report", "confusion_matrix"]
