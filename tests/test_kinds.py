"""Task kinds as one table (ctxrep.tasks.kinds.KINDS): every row trains, reports and predicts from a file of its own
layout on a tiny random encoder, its prediction input is the texts alone, and the code around the table (experiment,
predict, the CLI) never compares task names."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest

import ctxrep
from ctxrep.tasks import load
from ctxrep.tasks.experiment import experiment
from ctxrep.tasks.kinds import KINDS, NAMES, Reading, kind, kind_of_estimator
from ctxrep.tasks.outputs import CLASSES, SCORES, SPANS, TAGS
from ctxrep.tasks.predict import predict_file

CONTEXT = "the meeting was in london yesterday ."
SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": "t",
            "paragraphs": [
                {
                    "context": CONTEXT,
                    "qas": [
                        {"id": "1", "question": "where ?", "answers": [{"text": "london", "answer_start": 19}]},
                        {"id": "2", "question": "when ?", "answers": [{"text": "yesterday", "answer_start": 26}]},
                    ],
                }
            ],
        }
    ],
}
CONLLU_ROW = "{i}\t{w}\t{w}\t{t}\t_\t_\t0\troot\t_\t_\n"


def _conllu(sentences) -> str:
    return "".join(
        "".join(CONLLU_ROW.format(i=i, w=w, t=t) for i, (w, t) in enumerate(s, start=1)) + "\n" for s in sentences
    )


# row -> (training file name, its text, prediction input name, its text, examples in the input): the input holds the
# texts alone (no label, tag, score or answer)
SAMPLES = {
    "sst2": ("t.txt", "(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n" * 2, "in.txt", "good film\nbad one\n", 2),
    "sst5": ("t.txt", "(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n" * 2, "in.txt", "(2 (2 a) (2 b))\n", 1),
    "conll2003": ("t.conll", "john B-PER\nlives O\n\nparis B-LOC\nis O\n\n" * 2, "in.conll", "mary\nruns\n\nrome\n", 2),
    "upos": (
        "t.conllu",
        _conllu([[("the", "DET"), ("cat", "NOUN")], [("a", "DET"), ("dog", "NOUN")]]),
        "in.txt",
        "the\ndog\n\na\ncat\n\nthe\n",
        3,
    ),
    "glue-pair": (
        "t.tsv",
        "index\tsentence1\tsentence2\tlabel\n" + "0\ta b\ta b\t1\n1\tc d\te f\t0\n" * 2,
        "in.tsv",
        "index\tsentence1\tsentence2\n0\tx y\tx y\n",
        1,
    ),
    "squad": ("t.json", json.dumps(SQUAD), "in.json", json.dumps(SQUAD), 2),
    "stsb": (
        "sts-train.csv",
        "".join(f"g\tf\t2012\t{i}\t{s}\ta b {i}\tc d {i}\n" for i, s in enumerate([4.5, 1.0, 3.0, 0.5])),
        "pairs.tsv",
        "text\ttext_pair\na man plays\ta man is playing\ndogs run\tthe sky is blue\n",
        2,
    ),
    "sick-r": (
        "SICK_train.txt",
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        + "".join(f"{i}\ta b {i}\tc d\t{s}\tNEUTRAL\n" for i, s in enumerate([4.5, 1.0, 3.0, 2.0])),
        "SICK_test.txt",
        "pair_ID\tsentence_A\tsentence_B\n1\ta b\tc d\n2\te f\tg h\n3\ti j\tk l\n",
        3,
    ),
    "classify": ("t.csv", "text,label\n" + "good great,pos\nbad awful,neg\n" * 2, "in.csv", "text\nfine\nawful\n", 2),
    "pair": (
        "t.csv",
        "text,text_pair,label\n" + "a b,a b,same\nc d,e f,diff\n" * 2,
        "in.jsonl",
        '{"text": "x", "text_pair": "y"}\n',
        1,
    ),
    "regress": ("t.csv", "text,label\n" + "good great,4.5\nbad awful,1.0\n" * 2, "in.csv", "text\nnice\n", 1),
    "tag": ("t.conll", "john B-PER\nlives O\n\nparis B-LOC\nis O\n\n" * 2, "in.conll", "mary\nruns\n", 1),
    "span": (
        "t.jsonl",
        "".join(
            json.dumps(
                {"question": q, "context": CONTEXT, "answers": {"text": [a], "answer_start": [CONTEXT.index(a)]}}
            )
            + "\n"
            for q, a in (("where ?", "london"), ("when ?", "yesterday"))
        ),
        "in.jsonl",
        json.dumps({"question": "where ?", "context": CONTEXT}) + "\n",
        1,
    ),
    "wic": (
        "t.csv",
        "text,text_pair,label\n" + "a [[bank]] loan,the [[bank]] pays,T\nthe river [[bank]],a [[bank]] loan,F\n" * 2,
        "in.csv",
        "text,text_pair\nmy [[bank]],your [[bank]]\n",
        1,
    ),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def test_every_row_has_a_sample_here():
    assert set(SAMPLES) == set(KINDS) and NAMES == tuple(KINDS)


@pytest.mark.parametrize("name", NAMES)
def test_every_row_trains_reports_and_predicts_the_texts_alone(name, tiny_models, tmp_path):
    row = kind(name)
    train_name, train_text, input_name, input_text, n_input = SAMPLES[name]
    train = tmp_path / train_name
    train.write_text(train_text)
    (tmp_path / input_name).write_text(input_text)  # SQuAD's: the same document, its answers not read
    out = tmp_path / "run"
    params = dict(max_epochs=1, batch_size=4, cache_dir=str(tmp_path / "cache"), random_state=0)
    metrics = experiment(name, train, train, model=str(tiny_models["bert"]), out_dir=out, echo=lambda s: None, **params)
    assert metrics["estimator"] == row.estimator().__name__
    assert metrics["score_name"] and isinstance(metrics["score"], float)
    assert all(metrics["params"][k] == v for k, v in row.estimator_params.items())
    assert metrics["params"]["lr"] == row.defaults.get("lr")  # the row's default (None: the estimator's own)
    assert (out / "report.txt").read_text().strip() and (out / "learning_curve.png").is_file()
    assert json.loads((out / "model" / "task.json").read_text())["task"] == name

    result = predict_file(out / "model", tmp_path / input_name, tmp_path / "preds.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert result.task == name and result.examples == n_input == len(rows)
    model = load(out / "model")
    expected = {CLASSES: "label", SCORES: "score", TAGS: "tags", SPANS: "answer"}[row.output]
    assert all(expected in r for r in rows)
    if row.output is CLASSES:
        assert {r["label"] for r in rows} <= set(model.classes_.tolist())


def test_reading_labelled_and_unlabelled_gives_the_same_examples(tmp_path):
    """The prediction input rule of a row reads its training layout too, without the labels."""
    for name in NAMES:
        train_name, train_text, *_ = SAMPLES[name]
        path = tmp_path / name / train_name
        path.parent.mkdir()
        path.write_text(train_text)
        row = kind(name)
        labelled = row.read_file(path, Reading())
        unlabelled = row.read_file(path, Reading(labelled=False))
        assert unlabelled.X == labelled.X and unlabelled.y == [None] * len(labelled.X), name
        assert all(v is not None for v in labelled.y), name


def test_an_sts_model_reads_its_layout_whatever_the_header_flag_says(tmp_path):
    _, text, *_ = SAMPLES["stsb"]
    (tmp_path / "sts-test.csv").write_text(text)
    for header in (None, True, False):
        data = kind("stsb").read_file(tmp_path / "sts-test.csv", Reading({"header": header}, labelled=False))
        assert data.X == [(f"a b {i}", f"c d {i}") for i in range(4)], header


def test_defaults_apply_when_fine_tuning_and_given_values_win():
    regress = kind("regress")
    assert regress.settings("finetune", {"lr": None}) == {"lr": 1e-4, "max_epochs": 4, "batch_size": 16}
    assert regress.settings("finetune", {"lr": 3e-5, "max_epochs": None}) == {
        "lr": 3e-5,
        "max_epochs": 4,
        "batch_size": 16,
    }
    assert regress.settings("frozen", {"lr": None, "batch_size": 8}) == {"batch_size": 8}
    assert kind("span").settings("finetune", {}) == {}


def test_a_model_saved_from_python_predicts_as_its_estimators_row(tiny_models, tmp_path):
    from ctxrep.tasks import SequenceRegressor, TokenTagger, WordInContextClassifier

    assert [kind_of_estimator(cls(str(tiny_models["bert"]))).name for cls in (SequenceRegressor, TokenTagger)] == [
        "regress",
        "tag",
    ]
    assert kind_of_estimator(WordInContextClassifier(str(tiny_models["bert"]))).name == "wic"


def test_unknown_task_lists_the_rows():
    with pytest.raises(ValueError, match="unknown task 'sts'; choose one of sst2, sst5, .*, wic"):
        kind("sts")


# ---- no task names compared outside the table -------------------------------------------------------------

SRC = Path(ctxrep.__file__).parent
SCANNED = [SRC / "tasks" / "experiment.py", SRC / "tasks" / "predict.py", *sorted((SRC / "cli").glob("*.py"))]


def _task_name_branches(path: Path) -> list[str]:
    """`task == "wic"`, `task in ("stsb", "sick-r")`, `{"stsb": ...}[task]`: comparisons with a task name and dict
    literals keyed by task names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            constants = [c for side in (node.left, *node.comparators) for c in ast.walk(side)]
            if any(isinstance(c, ast.Constant) and c.value in NAMES for c in constants):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict):
            if any(isinstance(k, ast.Constant) and k.value in NAMES for k in node.keys):
                found.append(f"{path.name}:{node.lineno}: a table keyed by task names")
    return found


def test_experiment_predict_and_the_cli_never_compare_task_names():
    assert len(SCANNED) > 10
    found = [b for path in SCANNED for b in _task_name_branches(path)]
    assert found == [], f"task-name branches outside tasks/kinds.py: {found}"


def test_the_scan_finds_a_task_name_branch(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('if task == "wic":\n    pass\nif task in ("stsb", "x"):\n    pass\nKIND = {"upos": 1}\n')
    assert len(_task_name_branches(code)) == 3


def test_predictions_write_one_row_per_example_in_every_format(tiny_models, tmp_path):
    _, text, _, _, _ = SAMPLES["classify"]
    (tmp_path / "t.csv").write_text(text)
    experiment("classify", tmp_path / "t.csv", tmp_path / "t.csv", model=str(tiny_models["bert"]),
               out_dir=tmp_path / "run", echo=lambda s: None, max_epochs=1)  # fmt: skip
    for suffix in ("csv", "tsv"):
        predict_file(tmp_path / "run" / "model", tmp_path / "t.csv", tmp_path / f"p.{suffix}")
        with open(tmp_path / f"p.{suffix}", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if suffix == "tsv" else ","))
        assert [r["line"] for r in rows] == ["2", "3", "4", "5"] and rows[0]["text"] == "good great"
