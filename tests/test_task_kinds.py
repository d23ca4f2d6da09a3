"""Regression, cross-encoder ranking, word in context, `ctxrep predict`, the per-text feature cache and the readers
for STS / SICK, on tiny random encoders and small files written here (no ../shared/data)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import tiny_estimator_params

import ctxrep
from ctxrep.cli import main
from ctxrep.data.sts import read_sick, read_sts
from ctxrep.data.table import read_scored_texts
from ctxrep.tasks import SequenceClassifier, SequenceRegressor, WordInContextClassifier, load
from ctxrep.tasks.regressor import r2_score, regression_report

X_PAIRS = [("good great", "fine nice"), ("bad awful", "good great"), ("poor sad", "sad poor"), ("nice", "awful")] * 3
Y_SCORES = [4.5, 1.0, 4.8, 0.5] * 3
X_WIC = [
    ("a [[crane]] lifted the beam", "the [[crane]] lifted steel"),
    ("a [[crane]] caught fish", "the [[crane]] lifted steel"),
    (("he sat on the bank", 4), ("the bank of the river", 1)),
    (("money in the bank", 3), ("the bank of the river", 1)),
] * 3
Y_WIC = ["T", "F", "T", "F"] * 3


common = tiny_estimator_params  # conftest.py


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


# ---- SequenceRegressor ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_regressor_learns_pair_scores_and_round_trips(tiny_models, tmp_path, mode):
    reg = SequenceRegressor(**common(tiny_models, tmp_path, mode, max_epochs=20))
    assert reg.fit(X_PAIRS, Y_SCORES) is reg
    predicted = reg.predict(X_PAIRS[:4])
    assert predicted.dtype == np.float64 and predicted.shape == (4,)
    report = reg.evaluate(X_PAIRS, Y_SCORES)
    assert report["pearson"] > 0.95 and report["spearman"] > 0.9
    assert reg.score(X_PAIRS, Y_SCORES) == pytest.approx(r2_score(np.array(Y_SCORES), reg.predict(X_PAIRS)))
    assert reg.score(X_PAIRS, Y_SCORES) > 0.5
    reg.save(tmp_path / "reg")
    again = load(tmp_path / "reg")
    assert type(again) is SequenceRegressor
    assert np.allclose(again.predict(X_PAIRS), reg.predict(X_PAIRS), atol=1e-6)


def test_regressor_on_single_texts_predicts_on_the_targets_scale(tiny_models, tmp_path):
    X = ["good great fine", "bad awful poor"] * 4
    y = [100.0, 300.0] * 4  # far from 0-1: the standardised targets must put predictions back on this scale
    reg = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=25)).fit(X, y)
    assert reg.target_mean_ == 200.0 and reg.target_scale_ == 100.0
    assert np.allclose(reg.predict(["good great fine", "bad awful poor"]), [100.0, 300.0], atol=25)


def test_regressor_is_a_scikit_learn_regressor(tiny_models, tmp_path):
    from sklearn.base import is_regressor
    from sklearn.model_selection import cross_val_score

    reg = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=1))
    assert is_regressor(reg) and ctxrep.SequenceRegressor is SequenceRegressor
    scores = cross_val_score(reg, X_PAIRS, Y_SCORES, cv=2)  # R² per fold, through clone and score
    assert scores.shape == (2,) and np.all(np.isfinite(scores))


def test_regressor_refuses_a_target_that_is_not_a_number(tiny_models, tmp_path):
    reg = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=r"example 2: the target 'high' is not a number"):
        reg.fit(["a b", "c d", "e f"], [1.0, 2.0, "high"])


def test_classifier_given_continuous_scores_names_the_regressor(tiny_models, tmp_path):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=r"SequenceRegressor \(ctxrep finetune --task regress\)") as info:
        clf.fit(X_PAIRS, Y_SCORES)
    assert "\n" not in str(info.value)
    clf.fit(["a b", "c d", "e f"], [0.0, 1.0, 0.0])  # whole-number floats are still class labels
    assert clf.classes_.tolist() == [0.0, 1.0]


def test_regression_report_known_answers_and_constant_predictions():
    y = np.array([1.0, 2.0, 3.0, 5.0])
    perfect = regression_report(y, y)
    assert [perfect[k] for k in ("pearson", "spearman", "r2", "mse")] == pytest.approx([1, 1, 1, 0])
    assert perfect["n"] == 4
    reversed_ = regression_report(y, -y)
    assert reversed_["pearson"] == pytest.approx(-1) and reversed_["spearman"] == pytest.approx(-1)
    constant = regression_report(y, np.full(4, 2.0))  # correlates with nothing: 0.0, not NaN, so epochs compare
    assert constant["pearson"] == 0.0 and constant["spearman"] == 0.0 and constant["mse"] == pytest.approx(2.75)
    one = regression_report(y[:1], y[:1])
    assert one["pearson"] == 0.0 and one["n"] == 1


# ---- cross-encoder ranking --------------------------------------------------------------------------------


def test_rerank_orders_documents_by_the_pair_models_score(tiny_models, tmp_path):
    reg = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=20)).fit(X_PAIRS, Y_SCORES)
    candidates = ["fine nice", "awful", "sad poor"]
    hits = reg.rerank("good great", candidates)  # Hits, as every reranker: ids = the documents' positions
    expected = reg.predict([("good great", c) for c in candidates])
    assert hits.ids == np.argsort(-expected, kind="stable").tolist() and hits.texts == [candidates[i] for i in hits.ids]
    assert np.allclose(hits.scores, expected[hits.ids])
    assert reg.rerank("good great", candidates, top_n=1).ids == hits.ids[:1]
    with pytest.warns(DeprecationWarning, match=r"rank\(query, candidates, top_k\) -> Ranking goes in 0.3"):
        ranking = reg.rank("good great", candidates)  # the old name and result, until 0.3
    assert ranking.order.tolist() == hits.ids and np.allclose(ranking.scores, expected)

    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1)).fit(X_PAIRS, [1, 0, 1, 0] * 3)
    ranked = clf.rerank("good great", candidates)
    probabilities = clf.predict_proba([("good great", c) for c in candidates])[:, 1]
    assert np.allclose(ranked.scores, probabilities[ranked.ids])

    single = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=1)).fit(["a b", "c d"], [1.0, 2.0])
    with pytest.raises(ValueError, match="trained on single texts"):
        single.rerank("a", ["b"])


# ---- word in context ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_word_in_context_reads_the_marked_targets(tiny_models, tmp_path, mode):
    wic = WordInContextClassifier(**common(tiny_models, tmp_path, mode, max_epochs=15))
    wic.fit(X_WIC, Y_WIC)
    assert wic.score(X_WIC, Y_WIC) == 1.0
    wic.save(tmp_path / "wic")
    assert np.array_equal(load(tmp_path / "wic").predict_proba(X_WIC), wic.predict_proba(X_WIC))


def test_word_in_context_depends_on_which_word_is_marked(tiny_models, tmp_path):
    wic = WordInContextClassifier(**common(tiny_models, tmp_path, max_epochs=1)).fit(X_WIC, Y_WIC)
    a = wic.predict_proba([("a [[crane]] lifted the beam", "the crane [[lifted]] steel")])
    b = wic.predict_proba([("a [[crane]] lifted the beam", "the [[crane]] lifted steel")])
    assert not np.allclose(a, b)


def test_word_in_context_refuses_an_unmarked_target(tiny_models, tmp_path):
    wic = WordInContextClassifier(**common(tiny_models, tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=r"example 1: text_b has no target word marked \[\[like this\]\]"):
        wic.fit([X_WIC[0], ("a [[crane]] flew", "no mark here")], ["T", "F"])


# ---- the frozen-feature cache is per text --------------------------------------------------------------------


def test_cross_validation_featurizes_each_text_once(tiny_models, tmp_path, monkeypatch):
    from sklearn.model_selection import cross_val_score

    from ctxrep.featurize import Featurizer

    featurized = []
    embed = Featurizer.embed_words

    def counting(self, texts, pairs=None, *args, **kwargs):
        featurized.extend(" ".join(t) for t in texts)
        return embed(self, texts, pairs, *args, **kwargs)

    monkeypatch.setattr(Featurizer, "embed_words", counting)
    X = [f"text number {i} good" if i % 2 else f"text number {i} bad" for i in range(12)]
    y = ["pos" if i % 2 else "neg" for i in range(12)]
    clf = SequenceClassifier(**common(tiny_models, tmp_path, "frozen", max_epochs=1, frozen_head="linear"))
    clf.set_params(pooling="mean")
    cross_val_score(clf, X, y, cv=3)
    assert sorted(featurized) == sorted(X)  # every text once over 3 folds' fits and scores, not once per fold


# ---- readers ----------------------------------------------------------------------------------------------


def test_sts_readers_read_the_three_layouts(tmp_path):
    benchmark = tmp_path / "sts-dev.csv"
    benchmark.write_text(
        "main-captions\tMSRvid\t2012test\t0000\t5.000\tA man is dancing.\tA man dances.\n"
        'main-news\theadlines\t2016\t0001\t0.40\t "Quoted" text \tOther text\tsource one\tsource two\n'
    )
    pairs = read_sts(benchmark)
    assert [(p.text_a, p.text_b, p.score, p.line) for p in pairs] == [
        ("A man is dancing.", "A man dances.", 5.0, 1),
        ('"Quoted" text', "Other text", 0.4, 2),
    ]
    glue = tmp_path / "dev.tsv"
    glue.write_text("index\tgenre\tsentence1\tsentence2\tscore\n0\tmain\tA b.\tC d.\t3.2\n")
    assert [(p.text_a, p.text_b, p.score) for p in read_sts(glue)] == [("A b.", "C d.", 3.2)]
    sick = tmp_path / "SICK_trial.txt"
    sick.write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        "4\tThe boys play \tNo boy plays\t3.6\tCONTRADICTION\n"
    )
    (pair,) = read_sick(sick)
    assert (pair.text_a, pair.score, pair.label, pair.line) == ("The boys play", 3.6, "CONTRADICTION", 2)


@pytest.mark.parametrize(
    "text, message",
    [
        ("g\tf\ty\t0\tfive\tA b.\tC d.\n", r"sts-train\.csv:1: the score field is 'five', not a number"),
        ("g\tf\ty\t0\t5.0\tA b.\n", r"sts-train\.csv:1: 6 tab-separated field\(s\)"),
        ("g\tf\ty\t0\t1\tA b.\tC d.\ng\tf\ty\t1\tnan\tA b.\tC d.\n", r"sts-train\.csv:2: the score field is 'nan'"),
    ],
)
def test_sts_reader_errors_name_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "sts-train.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_sts(path)


def test_scored_texts_name_the_line_of_a_score_that_is_not_a_number(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("text,text_pair,score\na b,c d,1.5\ne f,g h,about three\n")
    with pytest.raises(ValueError, match=r"train\.csv:3: the score column 'score' \(--label-column\) holds"):
        read_scored_texts(path, label_column="score", text_pair_column="text_pair")
    path.write_text("text,text_pair,score\na b,c d,1.5\ne f,g h,3\n")
    data = read_scored_texts(path, label_column="score", text_pair_column="text_pair")
    assert data.X == [("a b", "c d"), ("e f", "g h")] and data.y == [1.5, 3.0] and data.lines == [2, 3]


# ---- the CLI: finetune and predict for each kind, bad input in one line ------------------------------------------


def _run(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_finetune_regress_then_predict(tiny_models, tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("s1\ts2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for (a, b), s in zip(X_PAIRS, Y_SCORES)))
    out = tmp_path / "run"
    result = _run(
        ["finetune", "--task", "regress", "--train", train, "--dev", train, "--text-column", "s1"]
        + ["--text-pair-column", "s2", "--label-column", "score", "--model", tiny_models["bert"], "--out", out]
        + ["--max-epochs", "2", "--batch-size", "4", "--cache-dir", tmp_path / "cache", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "pearson" in result.output and "spearman" in result.output
    assert f"ctxrep predict --model {out}/model" in result.output and "SequenceRegressor.load(" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["score_name"] == "pearson" and {"pearson", "spearman", "r2"} <= set(metrics)
    assert (out / "scatter.png").is_file()
    # prediction input without the score column, read with the columns saved at training
    unlabelled = tmp_path / "new.tsv"
    unlabelled.write_text("s1\ts2\ngood great\tfine nice\nbad awful\tgood\n")
    result = _run(["predict", "--model", out / "model", "--input", unlabelled, "--out", tmp_path / "preds.csv"])
    assert result.exit_code == 0, result.output
    rows = _rows(tmp_path / "preds.csv")
    expected = SequenceRegressor.load(out / "model").predict([("good great", "fine nice"), ("bad awful", "good")])
    assert [r["line"] for r in rows] == ["2", "3"] and rows[0]["text_pair"] == "fine nice"
    assert np.allclose([float(r["score"]) for r in rows], expected)


def test_finetune_keeps_the_best_dev_epoch_and_says_so(tiny_models, tmp_path):
    """`ctxrep finetune` saves the weights of the epoch with the best dev score (the one loop's EarlyStopping
    bookkeeping, never stopping early) and says which it kept; --keep last saves the last epoch's, as before."""
    train = tmp_path / "train.tsv"
    train.write_text("s1\ts2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for (a, b), s in zip(X_PAIRS, Y_SCORES)))
    args = ["finetune", "--task", "regress", "--train", train, "--dev", train, "--text-column", "s1"]
    args += ["--text-pair-column", "s2", "--label-column", "score", "--model", tiny_models["bert"]]
    args += ["--max-epochs", "4", "--batch-size", "4", "--lr", "0.1", "--no-progress"]  # a rate that overshoots
    kept = {}
    for keep in ("best", "last"):
        out = tmp_path / keep
        result = _run([*args, "--out", out, *(["--keep", "last"] if keep == "last" else [])])
        assert result.exit_code == 0, result.output
        metrics = json.loads((out / "metrics.json").read_text())
        scores = [e["dev_score"] for e in metrics["history"]]
        kept[keep] = metrics["kept_epoch"]
        saved = SequenceRegressor.load(out / "model").score(X_PAIRS, Y_SCORES)
        assert saved == pytest.approx(scores[kept[keep] - 1], abs=1e-5)  # the saved model is the kept epoch's
        if keep == "best":
            assert kept["best"] == 1 + int(np.argmax(scores)) < 4, scores  # this run's best epoch is not its last
            said = f"kept the weights of epoch {kept['best']} of 4, the best dev score ({max(scores):.4f}; the last "
            assert said + f"epoch's {scores[-1]:.4f}); --keep last keeps the last epoch's" in result.output
        else:
            assert kept["last"] == 4 and "kept the last epoch's weights (epoch 4 of 4, dev score" in result.output
    refused = _run([*args, "--out", tmp_path / "x", "--keep", "last", "--early-stopping"])
    assert refused.exit_code == 1 and "early stopping keeps the best epoch" in refused.output


def test_finetune_stsb_reads_the_benchmark_layout(tiny_models, tmp_path):
    path = tmp_path / "sts-train.csv"
    path.write_text(
        "".join(f"g\tf\t2012\t{i:04d}\t{s}\t{a}\t{b}\n" for i, ((a, b), s) in enumerate(zip(X_PAIRS, Y_SCORES)))
    )
    result = _run(
        ["finetune", "--task", "stsb", "--train", path, "--dev", path, "--model", tiny_models["bert"]]
        + ["--out", tmp_path / "run", "--max-epochs", "1", "--batch-size", "4"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["dev_examples"] == 12


def test_finetune_wic_files_then_predict(tiny_models, tmp_path):
    data = tmp_path / "train.data.txt"
    rows = [("crane", "N", "1-1", "a crane lifted the beam", "the crane lifted steel"),
            ("crane", "N", "1-1", "a crane caught fish", "the crane lifted steel")] * 4  # fmt: skip
    data.write_text("".join("\t".join(r) + "\n" for r in rows))
    (tmp_path / "train.gold.txt").write_text("T\nF\n" * 4)
    out = tmp_path / "run"
    result = _run(
        ["finetune", "--task", "wic", "--train", data, "--dev", data, "--model", tiny_models["bert"], "--out", out]
        + ["--max-epochs", "10", "--lr", "1e-2", "--batch-size", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "WordInContextClassifier" in result.output
    result = _run(["predict", "--model", out / "model", "--input", data, "--out", tmp_path / "p.csv"])
    assert result.exit_code == 0, result.output
    predicted = _rows(tmp_path / "p.csv")
    assert len(predicted) == 8 and predicted[0]["text"] == "a [[crane]] lifted the beam"
    assert [r["label"] for r in predicted] == ["T", "F"] * 4  # the gold labels of the training pairs it learned
    assert all(0.5 < float(r["probability"]) <= 1 for r in predicted)


def test_predict_tags_and_spans(tiny_models, tmp_path):
    conll = tmp_path / "ner.conll"
    conll.write_text("john B-PER\nlives O\nin O\nparis B-LOC\n\nmary B-PER\nvisited O\nlondon B-LOC\n")
    out = tmp_path / "tag"
    result = _run(
        ["finetune", "--task", "tag", "--train", conll, "--dev", conll, "--model", tiny_models["bert"], "--out", out]
        + ["--max-epochs", "1", "--batch-size", "2"]
    )
    assert result.exit_code == 0, result.output
    words = tmp_path / "words.conll"
    words.write_text("john\nlives\n\nmary\nvisited\nlondon\n")  # words alone: no tag column
    result = _run(["predict", "--model", out / "model", "--input", words, "--out", tmp_path / "tags.conll"])
    assert result.exit_code == 0, result.output
    blocks = (tmp_path / "tags.conll").read_text().strip().split("\n\n")
    assert [[line.split("\t")[0] for line in b.splitlines()] for b in blocks] == [
        ["john", "lives"],
        ["mary", "visited", "london"],
    ]
    assert all(line.split("\t")[1] in {"B-PER", "O", "B-LOC"} for b in blocks for line in b.splitlines())

    squad = tmp_path / "qa.jsonl"
    context = "the meeting was in london yesterday ."
    squad.write_text(
        json.dumps({"question": "where ?", "context": context, "answers": {"text": ["london"], "answer_start": [19]}})
        * 1
        + "\n"
    )
    result = _run(
        ["finetune", "--task", "span", "--train", squad, "--dev", squad, "--model", tiny_models["bert"]]
        + ["--out", tmp_path / "span", "--max-epochs", "1"]
    )
    assert result.exit_code == 0, result.output
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "when ?", "context": context}) + "\n")
    result = _run(
        ["predict", "--model", tmp_path / "span" / "model", "--input", questions, "--out", tmp_path / "a.csv"]
    )
    assert result.exit_code == 0, result.output
    (row,) = _rows(tmp_path / "a.csv")
    assert context[int(row["start"]) : int(row["end"])] == row["answer"]


@pytest.mark.parametrize(
    "task, header, row, message",
    [
        (
            "regress",
            "text,label",
            "a b,high",
            r"train\.csv:3: the score column 'label' \(--label-column\) holds 'high'",
        ),
        ("regress", "text,score", "a b,2", r"train\.csv:1: no column 'label' in the header"),
        (
            "wic",
            "text,text_pair,label",
            "a [[b]] c,no mark,T",
            r"train\.csv:3: the 'text_pair' text has no target word",
        ),
    ],
)
def test_cli_bad_input_is_one_line_naming_the_file_and_line(tiny_models, tmp_path, task, header, row, message):
    path = tmp_path / "train.csv"
    good = {"regress": "c d,1.5", "wic": "a [[b]] c,d [[b]],F"}[task]
    path.write_text(f"{header}\n{good}\n{row}\n")
    result = _run(
        [
            "finetune",
            "--task",
            task,
            "--train",
            path,
            "--dev",
            path,
            "--model",
            tiny_models["bert"],
            "--out",
            tmp_path / "r",
        ]
    )
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("error: ") and len(result.output.strip().splitlines()) <= 2
    assert re.search(message, error), error


def test_no_progress_prints_plain_progress_lines(tiny_models, tmp_path, capsys):
    from ctxrep.tasks.experiment import experiment

    path = tmp_path / "train.csv"
    path.write_text(
        "text,label\n" + "".join(f"{t},{s}\n" for t, s in zip(["good great", "bad awful"] * 4, [4.0, 1.5] * 4))
    )
    experiment("regress", path, path, model=str(tiny_models["bert"]), out_dir=tmp_path / "r", echo=lambda s: None,
               max_epochs=2, batch_size=4, progress="lines")  # fmt: skip
    err = capsys.readouterr().err
    assert "SequenceRegressor: epoch 1" in err and "SequenceRegressor: epoch 2" in err
    assert "steps (100%)" in err and "\r" not in err


def test_docs_use_a_fine_tuned_model_runs(tiny_models, tmp_path):
    """docs/finetune.md's "Use a fine-tuned model" Python block, on a tiny model saved where the page's path points."""
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "finetune.md").read_text()
    block = re.search(r"^## Use a fine-tuned model\n(?:(?!^## ).)*?^```python\n(.*?)^```", page, re.M | re.S)
    assert block, "docs/finetune.md: no ```python block under '## Use a fine-tuned model'"
    model = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=1)).fit(X_PAIRS, Y_SCORES)
    model.save(tmp_path / "runs" / "stsb" / "model")
    namespace: dict = {}
    exec(
        compile(block.group(1).replace("runs/stsb/model", str(tmp_path / "runs/stsb/model")), "finetune.md", "exec"),
        namespace,
    )  # noqa: S102
    assert sorted(namespace["hits"].ids) == [0, 1, 2]


def test_symmetric_word_in_context_answers_both_orders_alike(tiny_models, tmp_path, monkeypatch):
    sizes = []
    examples = WordInContextClassifier._piece_records  # the fine-tune mode's record builder

    def counting(self, X, y, call):
        sizes.append(len(X))
        return examples(self, X, y, call)

    monkeypatch.setattr(WordInContextClassifier, "_piece_records", counting)
    wic = WordInContextClassifier(**common(tiny_models, tmp_path, max_epochs=2, symmetric=True)).fit(X_WIC, Y_WIC)
    assert sizes == [12, 12]  # training records: the pairs, then the swapped pairs
    a, b = "a [[crane]] lifted the beam", "the [[crane]] caught fish"
    assert np.allclose(wic.predict_proba([(a, b)]), wic.predict_proba([(b, a)]), atol=1e-6)
    assert wic.score(X_WIC, Y_WIC) == pytest.approx(np.mean(wic.predict(X_WIC) == np.array(Y_WIC)))


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory):
    """A tiny random decoder LLM folder of a family (issue 35; tests/_decoders.py), built once per family."""
    from _decoders import tiny_folder

    built: dict = {}

    def folder(model_type: str, **extra):
        key = (model_type, *sorted(extra.items()))
        if key not in built:
            built[key] = tiny_folder(tmp_path_factory.mktemp(model_type), model_type, **extra)
        return built[key]

    return folder


DECODER_FAMILIES = ["qwen3", "qwen2", "llama", "mistral", "gemma3_text", "embeddinggemma"]


@pytest.mark.parametrize("family", ["roberta", "elmo", "xlnet", "gpt2", *DECODER_FAMILIES])
def test_regressor_and_word_in_context_on_every_family(family, tiny_models, request, tmp_path):
    if family in DECODER_FAMILIES:  # EmbeddingGemma: Gemma 3 with bidirectional attention
        bidirectional = family == "embeddinggemma"
        extra = {"use_bidirectional_attention": True} if bidirectional else {}
        model = request.getfixturevalue("decoder_dir")("gemma3_text" if bidirectional else family, **extra)
    elif family == "roberta":
        model = tiny_models["roberta"]
    else:
        built = request.getfixturevalue(f"{family}_dir")
        model = f"elmo:{built}" if family == "elmo" else built
    params = common(tiny_models, tmp_path, max_epochs=10, lr=1e-2, model=str(model))
    untrained = params | {"max_steps": 1, "lr": 1e-12}  # the same network, its head left as initialised
    reg = SequenceRegressor(**params).fit(X_PAIRS, Y_SCORES)
    before = SequenceRegressor(**untrained).fit(X_PAIRS, Y_SCORES).score(X_PAIRS, Y_SCORES)
    assert reg.score(X_PAIRS, Y_SCORES) > max(before + 0.5, 0.7)  # R² on the training pairs: it learned them
    wic = WordInContextClassifier(**params | {"max_epochs": 30}).fit(X_WIC, Y_WIC)  # ELMo's tiny biLM: ~25 epochs
    before = WordInContextClassifier(**untrained).fit(X_WIC, Y_WIC)
    assert wic.predict_proba(X_WIC).shape == (12, 2)
    assert _log_loss(wic, X_WIC, Y_WIC) < _log_loss(before, X_WIC, Y_WIC) / 2
    assert wic.predict(X_WIC).tolist() == Y_WIC  # the expected labels appear


def _log_loss(model, X, y) -> float:
    proba = model.predict_proba(X)
    column = {label: i for i, label in enumerate(model.classes_)}
    return float(-np.mean([np.log(proba[i, column[label]]) for i, label in enumerate(y)]))


def test_finetune_wic_reads_word_indices_as_neighbors_query_does(tiny_models, tmp_path):
    """A text may give its target as "SENTENCE<TAB>WORD_INDEX" instead of a [[mark]] (JSONL, or a quoted CSV field)."""
    path = tmp_path / "train.jsonl"
    rows = [
        {"text": "he sat on the bank\t4", "text_pair": "the bank of the river\t1", "label": "T"},
        {"text": "money in the [[bank]]", "text_pair": "the bank of the river\t1", "label": "F"},
    ] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _run(
        ["finetune", "--task", "wic", "--train", path, "--dev", path, "--model", tiny_models["bert"]]
        + ["--out", tmp_path / "run", "--max-epochs", "1", "--batch-size", "2"]
    )
    assert result.exit_code == 0, result.output
    path.write_text(json.dumps({"text": "he sat on the bank\t9", "text_pair": "a [[b]]", "label": "T"}) + "\n")
    result = _run(["predict", "--model", tmp_path / "run" / "model", "--input", path, "--out", tmp_path / "p.csv"])
    assert result.exit_code == 1 and "train.jsonl:1: word index 9 is outside the sentence" in result.output


def test_a_model_saved_on_a_gpu_loads_on_the_cpu(tiny_models, tmp_path):
    reg = SequenceRegressor(**common(tiny_models, tmp_path, max_epochs=1)).fit(X_PAIRS, Y_SCORES)
    reg.save(tmp_path / "reg")
    config = json.loads((tmp_path / "reg" / "config.json").read_text())
    config["params"]["device"] = "cuda:7"  # as written by a fit on a GPU
    (tmp_path / "reg" / "config.json").write_text(json.dumps(config))
    again = load(tmp_path / "reg", device="cpu")
    assert again.device == "cpu" and np.allclose(again.predict(X_PAIRS), reg.predict(X_PAIRS), atol=1e-6)


def test_finetune_classify_on_a_score_column_points_to_regress(tiny_models, tmp_path):
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\n" + "".join(f"t{i} words,{s}\n" for i, s in enumerate([0.4, 3.8, 2.25, 5.0])))
    dev.write_text("text,label\nt9 words,4.6\n")  # a dev "label" train never has: the scores are the real problem
    result = _run(["finetune", "--task", "classify", "--train", train, "--dev", dev, "--out", tmp_path / "r"])
    assert result.exit_code == 1
    assert "look like continuous scores" in result.output and "--task regress" in result.output
    assert str(train) in result.output and len(result.output.strip().splitlines()) == 1


def test_predict_classify_writes_labels_and_probabilities(tiny_models, tmp_path):
    train = tmp_path / "reviews.csv"
    train.write_text(
        "review,stars\n" + "".join(f'"{t}",{y}\n' for t, y in zip(["good great", "bad awful"] * 4, ["5", "1"] * 4))
    )
    out = tmp_path / "run"
    result = _run(
        ["finetune", "--task", "classify", "--train", train, "--dev", train, "--text-column", "review"]
        + ["--label-column", "stars", "--model", tiny_models["bert"], "--out", out, "--max-epochs", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "SequenceClassifier.load(" in result.output
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"review": "great good"}) + "\n" + json.dumps({"review": "awful"}) + "\n")
    result = _run(["predict", "--model", out / "model", "--input", new, "--out", tmp_path / "p.jsonl"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    model = load(out / "model")
    assert [r["label"] for r in rows] == model.predict(["great good", "awful"]).tolist()
    assert [r["text"] for r in rows] == ["great good", "awful"] and all(0.5 <= r["probability"] <= 1 for r in rows)
