"""The task estimators' parameters: declared once (ctxrep.tasks.base.TaskParams, a dataclass each estimator extends
with its own fields), with the public signatures pinned to the names and defaults they had when every estimator
wrote out its own 29-parameter __init__, documented by help(), and scikit-learn's protocol (clone, get_params /
set_params, GridSearchCV) working on the dataclass estimators."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
import re

import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV

from ctxrep.tasks import SequenceClassifier, SequenceRegressor, SpanExtractor, TokenTagger, WordInContextClassifier
from ctxrep.tasks.base import TaskEstimator, TaskParams

# The shared parameters and their defaults, as the hand-written signatures had them.
SHARED = {
    "model": "minilm",
    "mode": "finetune",
    "max_epochs": 3,
    "batch_size": 32,
    "max_steps": None,
    "lr": None,
    "weight_decay": 0.01,
    "warmup_fraction": 0.1,
    "max_grad_norm": 1.0,
    "dropout": 0.1,
    "max_length": None,
    "frozen_head": "bilstm",
    "lstm_size": 256,
    "validation_fraction": 0.1,
    "early_stopping": False,
    "n_iter_no_change": 2,
    "tol": 1e-4,
    "keep": None,
    "warm_start": False,
    "discriminative_lr": False,
    "discriminative_lr_factor": 2.6,
    "slanted_triangular": False,
    "gradual_unfreezing": False,
    "cache_dir": None,
    "random_state": None,
    "progress": False,
    "quantize": None,
    "device": "cpu",
    "bf16": False,
    "lora": None,  # issue 43: LoRA adapters, activation checkpointing, FSDP
    "gradient_checkpointing": False,
    "fsdp": False,
}
# Each estimator's own parameters (and overridden defaults), and the parameters that may be given by position:
# the leading ones of the old signatures; everything after them is keyword-only.
OWN = {
    SequenceClassifier: ({"pooling": "cls"}, ["model", "mode", "pooling"]),
    SequenceRegressor: ({"pooling": "cls"}, ["model", "mode", "pooling"]),
    WordInContextClassifier: ({"pooling": "cls", "symmetric": False}, ["model", "mode", "pooling"]),
    TokenTagger: (
        {"word_pooling": "first", "tag_scheme": "auto", "stride": None, "crf": False, "crf_lr": None},
        ["model", "mode", "word_pooling", "tag_scheme"],
    ),
    SpanExtractor: (
        {"doc_stride": 128, "max_answer_length": 30, "max_query_length": 64, "max_epochs": 2},
        ["model", "mode", "doc_stride", "max_answer_length", "max_query_length"],
    ),
}


def parameters(cls) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}


@pytest.mark.parametrize("cls", list(OWN))
def test_signature_keeps_every_name_and_default(cls):
    own, positional = OWN[cls]
    params = parameters(cls)
    assert {n: p.default for n, p in params.items()} == SHARED | own
    assert len(params) == len(SHARED | own)
    kinds = {n: p.kind for n, p in params.items()}
    assert [n for n, k in kinds.items() if k is inspect.Parameter.POSITIONAL_OR_KEYWORD] == positional
    assert all(kinds[n] is inspect.Parameter.KEYWORD_ONLY for n in params if n not in positional)
    assert sorted(params) == cls._get_param_names()


@pytest.mark.parametrize("cls", list(OWN))
def test_shared_parameters_are_declared_only_in_task_params(cls):
    """No estimator redeclares a shared parameter, except SpanExtractor's own default for max_epochs."""
    allowed = {"max_epochs"} if cls is SpanExtractor else set()
    for klass in cls.__mro__:
        if klass in (TaskParams, TaskEstimator) or not issubclass(klass, TaskParams):
            continue
        declared = set(vars(klass).get("__annotations__", {})) - {"_"}
        assert declared & set(SHARED) <= allowed, f"{klass.__name__} redeclares {declared & set(SHARED)}"
    assert [f.name for f in dataclasses.fields(TaskParams)] == list(SHARED)


def test_task_params_documents_each_shared_parameter():
    doc = TaskParams.__doc__
    for name in SHARED:
        assert re.search(rf"^    (\w+ / )*{name}( / \w+)*: ", doc, re.M), (
            f"TaskParams' docstring does not document {name}"
        )


@pytest.mark.parametrize("cls", list(OWN))
def test_help_documents_every_parameter(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    body = text.split("Parameters shared by every task estimator", 1)
    assert len(body) == 2, "help() lacks the shared parameters' documentation"
    own_part, shared_part = body
    for name in OWN[cls][0]:
        if name not in SHARED:
            assert re.search(rf"\b{name}\b", own_part.split(") -> None", 1)[1]), f"help({cls.__name__}) lacks {name}"
    for name in SHARED:
        assert re.search(rf"^ \|      (\w+ / )*{name}( / \w+)*: ", shared_part, re.M), (
            f"help({cls.__name__}) lacks {name}"
        )
    assert text.count("Parameters shared by every task estimator") == 1


def test_positional_parameters_and_dataclass_identity():
    clf = SequenceClassifier("bert-folder", "frozen", "mean")
    assert (clf.model, clf.mode, clf.pooling, clf.max_epochs) == ("bert-folder", "frozen", "mean", 3)
    with pytest.raises(TypeError):
        SequenceClassifier("bert-folder", "frozen", "mean", 3)  # max_epochs is keyword-only
    tagger = TokenTagger("m", "finetune", "mean", "bio", crf=True)
    assert (tagger.word_pooling, tagger.tag_scheme, tagger.crf) == ("mean", "bio", True)
    # estimators compare and hash by identity (scikit-learn's), not by their fields as a default dataclass would
    assert SequenceClassifier() != SequenceClassifier() and len({SequenceClassifier(), SequenceClassifier()}) == 2
    assert repr(SpanExtractor(max_epochs=3, doc_stride=8)) == "SpanExtractor(doc_stride=8, max_epochs=3)"
    assert repr(SpanExtractor()) == "SpanExtractor()"


@pytest.mark.parametrize("cls", list(OWN))
def test_clone_keeps_every_parameter_object(cls):
    est = cls(cache_dir="/tmp/somewhere", lr=1e-3, random_state=3)
    copy = clone(est)
    assert type(copy) is cls and copy is not est
    assert all(copy.get_params()[n] is v for n, v in est.get_params().items())
    assert set(vars(copy)) == set(est.get_params())


def test_grid_search_over_shared_and_own_parameters(tiny_models, tmp_path):
    X = ["good great fine", "bad awful poor", "nice good", "sad bad"] * 2
    y = ["pos", "neg", "pos", "neg"] * 2
    clf = SequenceClassifier(
        str(tiny_models["bert"]),
        "frozen",
        max_epochs=4,  # 3 learn these 8 texts at either lr and pooling
        batch_size=4,
        lstm_size=8,
        random_state=0,
        cache_dir=str(tmp_path / "cache"),
    )
    search = GridSearchCV(clf, {"pooling": ["mean", "concat"], "lr": [1e-2, 3e-2]}, cv=2).fit(X, y)
    assert set(search.best_params_) == {"pooling", "lr"}
    best = search.best_estimator_
    assert isinstance(best, SequenceClassifier) and best.frozen_head == "bilstm" and best.lstm_size == 8
    assert len(search.cv_results_["mean_test_score"]) == 4
    assert best.predict(X).tolist() == y  # refit on all of X: the expected labels


def test_every_hook_the_base_class_calls_is_declared_on_it():
    """The base class's own code (tasks/base.py, inference.py, modes.py) calls a subclass's hooks by name; each is
    declared on TaskEstimator with its contract, so a new task sees every hook it may fill in one place."""
    import ast
    from pathlib import Path

    from ctxrep.tasks.base import TaskEstimator

    folder = Path(__file__).resolve().parents[1] / "src" / "ctxrep" / "tasks"
    read, stored = set(), set()  # attributes read, and those assigned (state such as a cached int8 copy, not hooks)
    for name in ("base.py", "inference.py", "modes.py"):
        for node in ast.walk(ast.parse((folder / name).read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "est", "estimator")
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                (stored if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    called = read - stored
    assert len(called) > 15
    missing = sorted(name for name in called if not hasattr(TaskEstimator, name))
    assert not missing, f"called on an estimator but not declared on TaskEstimator: {missing}"
