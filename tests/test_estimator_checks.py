"""scikit-learn's estimator contract, checked on the three task estimators in both modes (check_estimator's
spirit: its data-free checks run as they are; the fitting checks are rewritten for text input).

clone, get_params / set_params, nothing set or validated in __init__, fit returns self, predict / score change
nothing in the estimator, the same random_state gives the same model twice in a row, and fit leaves the global
RNGs (torch, numpy, random) as it found them.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.utils import estimator_checks

from ctxrep.models.loading import LoadedEncoder
from ctxrep.tasks import SequenceClassifier, SequenceRegressor, SpanExtractor, TokenTagger, WordInContextClassifier

X_CLS = ["good great fine", "bad awful poor", "nice good", "sad bad"] * 2
Y_CLS = ["pos", "neg", "pos", "neg"] * 2
X_REG = [("good great", "fine nice"), ("bad awful", "good"), ("nice good", "good"), ("sad bad", "great")] * 2
Y_REG = [4.5, 0.5, 3.8, 1.2] * 2
X_WIC = [("a [[crane]] lifted it", "the [[crane]] flew"), (("he sat on the bank", 4), ("the bank lends", 1))] * 3
Y_WIC = ["F", "F", "T", "T", "F", "T"]
X_TAG = [["john", "lives", "in", "paris"], ["mary", "visited", "london"]] * 3
Y_TAG = [["B-PER", "O", "O", "B-LOC"], ["B-PER", "O", "B-LOC"]] * 3
CTX = "the weather is nice . " * 6 + "paris is the capital ."
X_SPAN = [("what is the capital ?", CTX), ("where was it ?", "it was in london .")] * 2
Y_SPAN = [("paris", CTX.index("paris")), ("london", 10)] * 2

DATA = {
    SequenceClassifier: (X_CLS, Y_CLS),
    SequenceRegressor: (X_REG, Y_REG),
    WordInContextClassifier: (X_WIC, Y_WIC),
    TokenTagger: (X_TAG, Y_TAG),
    SpanExtractor: (X_SPAN, Y_SPAN),
}
ESTIMATORS = [SequenceClassifier, SequenceRegressor, WordInContextClassifier, TokenTagger, SpanExtractor]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def make(cls, model, tmp_path, mode, **kw):
    params = dict(
        model=str(model),
        mode=mode,
        max_epochs=2,
        batch_size=4,
        lr=3e-3,
        random_state=0,
        lstm_size=8,
        cache_dir=str(tmp_path / "cache"),
    )
    if cls is SpanExtractor:
        params["doc_stride"] = 8
    return cls(**params | kw)


def fingerprint(value):
    """A plain, comparable picture of an attribute: tensors and arrays by content, modules by weights and flags,
    the loaded encoder by its weights and its tokenizer's state, anything else by its fields."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.detach().cpu().numpy().tobytes())
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes() if value.dtype != object else value.tolist())
    if isinstance(value, torch.nn.Module):
        return (
            "module",
            fingerprint(value.state_dict()),
            tuple(m.training for m in value.modules()),
            tuple(p.requires_grad for p in value.parameters()),
        )
    if isinstance(value, LoadedEncoder):
        tokenizer = {k: v for k, v in vars(value.tokenizer).items() if k != "backend"}  # the Rust tokenizer: stateless
        return ("encoder", fingerprint(value.model), fingerprint(tokenizer), value.source)
    if isinstance(value, dict):
        return tuple(sorted((str(k), fingerprint(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(fingerprint(v) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__name__, fingerprint(vars(value)))
    return value


def state_of(estimator) -> dict:
    return {k: fingerprint(v) for k, v in vars(estimator).items()}


def rng_states():
    return torch.get_rng_state().clone(), np.random.get_state()[1].copy(), random.getstate()


# ---- scikit-learn's own data-free checks -----------------------------------------------------------------


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_sklearn_parameter_checks(cls):
    name = cls.__name__
    estimator_checks.check_parameters_default_constructible(name, cls())
    estimator_checks.check_no_attributes_set_in_init(name, cls())
    estimator_checks.check_get_params_invariance(name, cls())
    estimator_checks.check_set_params(name, cls())
    estimator_checks.check_estimator_repr(name, cls())


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_init_stores_its_arguments_and_validates_nothing(cls):
    bad = cls(mode="nonsense", max_epochs=-1, random_state="yes")  # accepted here; fit refuses it
    assert bad.get_params()["mode"] == "nonsense" and set(vars(bad)) == set(bad.get_params())
    with pytest.raises(ValueError, match="mode must be one of"):
        bad.fit(*DATA[cls])
    with pytest.raises(ValueError, match="random_state must be a non-negative int or None, got 'yes'"):
        bad.set_params(mode="frozen", max_epochs=1).fit(*DATA[cls])


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_clone_and_params_round_trip(cls, tiny_models, tmp_path):
    est = make(cls, tiny_models["bert"], tmp_path, "frozen", dropout=0.25)
    params = est.get_params()
    assert est.set_params(**params) is est and est.get_params() == params
    copy = clone(est)
    assert copy is not est and copy.get_params() == params
    est.set_params(lr=0.5)
    assert est.get_params()["lr"] == 0.5 and copy.get_params()["lr"] == 3e-3


# ---- fitting: fit returns self, predict changes nothing, the same seed gives the same model, no global RNG ------


def predictions(est, X):
    out = est.predict(X)
    return out.tolist() if isinstance(out, np.ndarray) else out


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_fit_predict_contract(cls, mode, tiny_models, tmp_path):
    X, y = DATA[cls]
    est = make(cls, tiny_models["bert"], tmp_path, mode, dropout=0.3)
    before = rng_states()
    assert est.fit(X, y) is est
    after = rng_states()
    assert torch.equal(before[0], after[0]), "fit changed the global torch RNG"
    assert np.array_equal(before[1], after[1]) and before[2] == after[2], "fit changed numpy's or Python's global RNG"

    state = state_of(est)
    first = predictions(est, X)
    est.score(X, y)
    if hasattr(est, "predict_proba"):
        est.predict_proba(X)
    if hasattr(est, "evaluate"):
        est.evaluate(X, y)
    assert state_of(est).keys() == state.keys(), "predict / score added or removed attributes"
    changed = [k for k, v in state_of(est).items() if v != state[k]]
    assert not changed, f"predict / score changed {changed}"
    assert predictions(est, X) == first

    again = clone(est).fit(X, y)  # the same seed, in a row: the same model
    assert measured(again.history_) == measured(est.history_)
    assert predictions(again, X) == first
    assert all(torch.equal(v, again.model_.state_dict()[k]) for k, v in est.model_.state_dict().items())
    other = clone(est).set_params(random_state=1).fit(X, y)
    assert other.history_ != est.history_, "random_state has no effect"


def measured(history: list[dict]) -> list[dict]:
    """A fit's history without its peak memory: the process's high-water mark (a module the first fit imports, or
    compiles to bytecode, counts there), not a result of the fit."""
    return [{k: v for k, v in h.items() if k != "peak_memory_bytes"} for h in history]


def test_word_level_predict_changes_nothing(elmo_dir, tiny_models, tmp_path):
    """ELMo numbers words as it meets them: predicting unseen words must not grow the estimator's numbering."""
    est = make(SequenceClassifier, f"elmo:{elmo_dir}", tmp_path, "finetune", max_epochs=1).fit(X_CLS, Y_CLS)
    state = state_of(est)
    first = est.predict(["splendid words never seen", "good"]).tolist()
    assert state_of(est) == state
    assert est.predict(["splendid words never seen", "good"]).tolist() == first
