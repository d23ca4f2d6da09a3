"""TokenTagger(crf=True): a linear-chain CRF output layer (Ma & Hovy 2016; TagLM) in both modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctxrep.data.tags import entities
from ctxrep.tasks import TokenTagger

# BIO data in which an I- tag only ever follows B- or I- of its type; "smith" is always I-PER
X = [
    ["john", "smith", "lives", "in", "paris"],
    ["mary", "jones", "visited", "new", "york", "today"],
    ["we", "met", "john", "smith"],
    ["the", "city", "of", "new", "york"],
] * 3
Y = [
    ["B-PER", "I-PER", "O", "O", "B-LOC"],
    ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"],
    ["O", "O", "B-PER", "I-PER"],
    ["O", "O", "O", "B-LOC", "I-LOC"],
] * 3


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def tagger(tiny_models, tmp_path, mode, **kw) -> TokenTagger:
    params = dict(
        model=str(tiny_models["bert"]),
        mode=mode,
        batch_size=4,
        lr=1e-2,
        random_state=0,
        lstm_size=16,
        dropout=0.0,
        cache_dir=str(tmp_path / "cache"),
        crf=True,
        tag_scheme="bio",
        max_epochs=15 if mode == "finetune" else 40,
    )
    return TokenTagger(**(params | kw))


def invalid_bio_pairs(paths: list[list[str]]) -> list[tuple[str, str]]:
    """(previous, tag) pairs where an I-X follows anything but B-X or I-X (or starts the sentence)."""
    bad = []
    for path in paths:
        for prev, tag in zip(["O"] + path[:-1], path):
            if tag.startswith("I-") and prev not in ("B-" + tag[2:], tag):
                bad.append((prev, tag))
    return bad


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_crf_tagger_fits_and_predicts(tiny_models, tmp_path, mode):
    model = tagger(tiny_models, tmp_path, mode).fit(X, Y)
    assert model.model_.head.crf is not None and model.model_.head.crf.num_tags == len(model.classes_) == 5
    assert model.predict(X[:4]) == Y[:4]
    assert model.score(X, Y) == 1.0
    assert model.history_[-1]["train_loss"] < model.history_[0]["train_loss"]


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_crf_predictions_obey_the_learned_transitions(tiny_models, tmp_path, mode):
    """The training data never has I-X after O (or at the start): the CRF learns that, and Viterbi never predicts
    it, even where the word's own scores ask for it ("smith" was only ever I-PER)."""
    # emissions that learn slowly next to the transitions (lr vs crf_lr), as on real data where they are unsure
    slow = dict(max_epochs=15, lr=1e-3) if mode == "finetune" else dict(max_epochs=40, lr=1e-3, frozen_head="linear")
    model = tagger(tiny_models, tmp_path, mode, crf_lr=0.1, **slow).fit(X, Y)
    crf = model.model_.head.crf
    index = {label: i for i, label in enumerate(model.classes_.tolist())}
    for kind in ("PER", "LOC"):
        allowed = crf.transitions[index["B-" + kind], index["I-" + kind]]
        assert crf.transitions[index["O"], index["I-" + kind]] < allowed
        assert crf.start_transitions[index["I-" + kind]] < crf.start_transitions[index["O"]]
    rng = np.random.default_rng(0)
    vocab = sorted({w for s in X for w in s}) + ["smith", "smith", "york"]
    sentences = [["smith", "lives"], ["in", "smith"], ["york", "of", "smith"]]
    sentences += [rng.choice(vocab, size=rng.integers(1, 8)).tolist() for _ in range(40)]
    predicted = model.predict(sentences)
    assert invalid_bio_pairs(predicted) == []
    assert all(len(p) == len(s) for p, s in zip(predicted, sentences))
    # the word-level scores alone break the rule many times: the CRF's transitions are what keeps it out
    call = model._call()
    outputs = model._forward_all(model._examples(sentences, None, call), call)
    by_scores = [[model.classes_[i] for i in o.argmax(-1).tolist()] for o in outputs]
    assert len(invalid_bio_pairs(by_scores)) > 10


def test_viterbi_runs_over_the_whole_sentence_across_windows(tiny_models, tmp_path):
    """A sentence longer than the model's 64 positions is cut into windows; the prediction has one label per word
    and decodes as one chain (no I-X right after the window boundary that the data never allows)."""
    long = (["john", "smith", "lives", "in", "paris"] * 20)[:90]
    model = tagger(tiny_models, tmp_path, "finetune").fit(X + [long], Y + [(Y[0] * 20)[:90]])
    assert len(model._examples([long], None, model._call())) > 1  # really windowed
    predicted = model.predict([long])[0]
    assert len(predicted) == 90 and invalid_bio_pairs([predicted]) == []
    assert predicted == (Y[0] * 20)[:90] and len(entities(predicted)) == 36


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_crf_save_load_round_trip(tiny_models, tmp_path, mode):
    model = tagger(tiny_models, tmp_path, mode, max_epochs=2).fit(X, Y)
    model.save(tmp_path / "crf")
    loaded = TokenTagger.load(tmp_path / "crf")
    assert loaded.crf is True
    assert torch.equal(loaded.model_.head.crf.transitions, model.model_.head.crf.transitions)
    assert loaded.predict(X) == model.predict(X)


def test_crf_loss_is_per_word_and_matches_the_crf_module(tiny_models, tmp_path):
    """The loss is -log p(y | E) summed over sentences, divided by the number of words (the CRF module's own nll is
    the mean over sentences)."""
    model = tagger(tiny_models, tmp_path, "finetune", max_epochs=1).fit(X[:4], Y[:4])
    call = model._call()
    records = model._examples(X[:4], Y[:4], call)
    batch = model._collate(records, call)
    with torch.no_grad():
        emissions = model.model_(batch)
        loss = model._head_loss(emissions, batch)
        mask = batch["labels"] != -100
        expected = model.model_.head.crf.nll(emissions, batch["labels"].clamp(min=0), mask) * 4 / mask.sum()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_crf_parameters_have_their_own_learning_rate(tiny_models, tmp_path):

    model = tagger(tiny_models, tmp_path, "finetune", max_epochs=1, lr=5e-5).fit(X[:4], Y[:4])
    groups = model._optimizer().param_groups
    crf = {id(p) for p in model.model_.head.crf.parameters()}
    assert {g["lr"] for g in groups if any(id(p) in crf for p in g["params"])} == {1e-2}  # the default
    assert {g["lr"] for g in groups if not any(id(p) in crf for p in g["params"])} == {5e-5}
    assert sum(len(g["params"]) for g in groups) == len(list(model.model_.parameters()))
    model.set_params(crf_lr=0.5, discriminative_lr=True, discriminative_lr_factor=2.0)
    lrs = {g["depth"]: g["lr"] for g in model._optimizer().param_groups}
    assert lrs == pytest.approx({0: 1.25e-5, 1: 2.5e-5, 2: 5e-5, 3: 0.5})  # tiny model: L = 2, the CRF at L + 1


def test_crf_bad_settings(tiny_models, tmp_path):
    with pytest.raises(ValueError, match="crf must be True or False"):
        tagger(tiny_models, tmp_path, "finetune", crf="yes").fit(X, Y)
    with pytest.raises(ValueError, match="crf_lr must be positive"):
        tagger(tiny_models, tmp_path, "finetune", crf_lr=0.0).fit(X, Y)
