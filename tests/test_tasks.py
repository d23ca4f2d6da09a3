"""Task estimators on tiny random encoders: both modes, sklearn's contract, save/load, cache, ULMFiT options."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_estimator_params

from ctxrep.models.elmo import Elmo
from ctxrep.models.loading import load_model
from ctxrep.tasks import SequenceClassifier, SpanExtractor, TokenTagger

X_CLS = ["good great fine nice"] * 6 + ["bad awful poor sad"] * 6
Y_CLS = ["pos"] * 6 + ["neg"] * 6
X_TAG = [["john", "lives", "in", "paris"], ["mary", "visited", "london", "today"]] * 4
Y_TAG = [["B-PER", "O", "O", "B-LOC"], ["B-PER", "O", "B-LOC", "O"]] * 4
CTX = "the weather is nice . " * 12 + "paris is the capital of france ."
X_SPAN = [("what is the capital ?", CTX), ("where was the meeting ?", "the meeting was in london yesterday .")] * 4
Y_SPAN = [("paris", CTX.index("paris")), ("london", 19)] * 4


common = tiny_estimator_params  # conftest.py


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


# ---- the three estimators in both modes ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_classifier_learns_toy_task(tiny_models, tmp_path, mode):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, mode, max_epochs=15, lstm_size=16, pooling="concat"))
    assert clf.fit(X_CLS, Y_CLS) is clf
    assert clf.classes_.tolist() == ["neg", "pos"]
    proba = clf.predict_proba(["fine good", "sad bad", "nice"])
    assert proba.shape == (3, 2) and np.allclose(proba.sum(axis=1), 1, atol=1e-5)
    assert clf.predict(["fine good", "sad bad"]).tolist() == ["pos", "neg"]
    assert clf.score(X_CLS, Y_CLS) == 1.0


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_pairs(tiny_models, tmp_path, pooling):
    X = [("the cat", "good great"), ("the dog", "bad awful")] * 6
    y = [1, 0] * 6
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=8, pooling=pooling)).fit(X, y)
    assert clf.predict(X[:2]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="trained on sentence pairs but X holds single texts"):
        clf.predict(["the cat good great"])


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_tagger_learns_toy_task_and_windows_long_sentences(tiny_models, tmp_path, mode):
    long = ["the", "cat"] * 50  # 100 words: more pieces than the tiny model's 64 positions
    X, y = X_TAG + [long], Y_TAG + [["O"] * 100]
    params = common(tiny_models, tmp_path, mode, max_epochs=12 if mode == "finetune" else 30, lr=1e-2, lstm_size=16)
    tagger = TokenTagger(**params, word_pooling="mean").fit(X, y)
    predicted = tagger.predict(X_TAG[:2] + [long])
    assert predicted[:2] == Y_TAG[:2]
    assert len(predicted[2]) == 100 and all(isinstance(t, str) for t in predicted[2])
    assert tagger.entity_scoring_ and tagger.score(X_TAG, Y_TAG) == 1.0


def test_tagger_scores_token_accuracy_for_pos_tags(tiny_models, tmp_path):
    X = [["the", "cat", "runs"], ["a", "dog", "sleeps"]] * 4
    y = [["DET", "NOUN", "VERB"]] * 8
    tagger = TokenTagger(**common(tiny_models, tmp_path, max_epochs=3)).fit(X, y)
    assert not tagger.entity_scoring_
    wrong = [["DET", "DET", "DET"]] * 8
    assert tagger.score(X, y) == 1.0 and tagger.score(X, wrong) == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_span_extractor_learns_toy_task(tiny_models, tmp_path, mode):
    span = SpanExtractor(**common(tiny_models, tmp_path, mode, max_epochs=25, doc_stride=16))
    span.fit(X_SPAN, Y_SPAN)  # the first context is longer than one window
    assert span.predict(X_SPAN[:2]) == ["paris", "london"]
    s, e = span.predict_offsets(X_SPAN[:1])[0]
    assert CTX[s:e] == "paris"
    assert span.evaluate(X_SPAN, Y_SPAN) == {"exact_match": 1.0, "f1": 1.0}


def test_squad_normalisation_and_f1():
    from ctxrep.tasks.span import exact_match, f1, normalize_answer

    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match("the Eiffel tower", "Eiffel Tower.") == 1.0
    assert f1("Eiffel tower in Paris", "the Eiffel Tower") == pytest.approx(2 * 0.5 * 1 / 1.5)


# ---- scikit-learn's contract ------------------------------------------------------------------------


def test_clone_and_grid_search(tiny_models, tmp_path):
    from sklearn.base import clone
    from sklearn.model_selection import GridSearchCV

    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=6))
    copy = clone(clf)
    assert copy.get_params() == clf.get_params() and not hasattr(copy, "model_")
    search = GridSearchCV(clf, {"lr": [1e-9, 3e-3]}, cv=2, scoring="neg_log_loss").fit(X_CLS, Y_CLS)
    assert search.best_params_["lr"] == 3e-3  # 1e-9 leaves the head as initialised: the trained one wins
    assert search.predict(["good great fine nice", "bad awful poor sad"]).tolist() == ["pos", "neg"]
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        clf.set_params(nope=1)


def test_warm_start_continues(tiny_models, tmp_path):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1, warm_start=True)).fit(X_CLS, Y_CLS)
    first = {k: v.clone() for k, v in clf.model_.state_dict().items()}
    network = clf.model_
    clf.fit(X_CLS, Y_CLS)
    assert clf.model_ is network and clf.n_epochs_ == 2 and len(clf.history_) == 2
    assert any(not torch.equal(first[k], v) for k, v in clf.model_.state_dict().items())
    cold = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1)).fit(X_CLS, Y_CLS)
    network = cold.model_
    cold.fit(X_CLS, Y_CLS)
    assert cold.model_ is not network and cold.n_epochs_ == 1


def test_early_stopping_stops(tiny_models, tmp_path):
    # a learning rate too small to change the held-out accuracy: no improvement after the first epoch
    clf = SequenceClassifier(
        **common(
            tiny_models,
            tmp_path,
            max_epochs=20,
            lr=1e-12,
            early_stopping=True,
            n_iter_no_change=1,
            validation_fraction=0.25,
        )
    )
    clf.fit(X_CLS, Y_CLS)
    assert clf.n_epochs_ == 2 and all("validation_score" in h for h in clf.history_)
    with pytest.raises(ValueError, match="validation_fraction > 0"):
        SequenceClassifier(early_stopping=True, validation_fraction=0.0).fit(X_CLS, Y_CLS)


@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_save_load_round_trip(tiny_models, tmp_path, mode):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, mode, max_epochs=1)).fit(X_CLS, Y_CLS)
    clf.save(tmp_path / "clf")
    assert json.loads((tmp_path / "clf" / "config.json").read_text())["estimator"] == "SequenceClassifier"
    loaded = SequenceClassifier.load(tmp_path / "clf")
    assert np.array_equal(loaded.predict_proba(X_CLS), clf.predict_proba(X_CLS))
    tagger = TokenTagger(**common(tiny_models, tmp_path, mode, max_epochs=1)).fit(X_TAG, Y_TAG)
    tagger.save(tmp_path / "tagger")
    assert TokenTagger.load(tmp_path / "tagger").predict(X_TAG) == tagger.predict(X_TAG)
    with pytest.raises(ValueError, match="holds a 'TokenTagger'"):
        SequenceClassifier.load(tmp_path / "tagger")


def test_span_save_load_round_trip(tiny_models, tmp_path):
    span = SpanExtractor(**common(tiny_models, tmp_path, max_epochs=1, doc_stride=16)).fit(X_SPAN, Y_SPAN)
    span.save(tmp_path / "span")
    assert SpanExtractor.load(tmp_path / "span").predict_offsets(X_SPAN) == span.predict_offsets(X_SPAN)


def test_frozen_feature_cache_hit(tiny_models, tmp_path, monkeypatch):
    params = common(tiny_models, tmp_path, "frozen", max_epochs=1)
    first = SequenceClassifier(**params).fit(X_CLS, Y_CLS)
    assert first.cache_hits_ == 0
    assert len(list((tmp_path / "cache").iterdir())) == 1

    def no_encoder(*args, **kwargs):
        raise AssertionError("the encoder ran although the features are cached")

    monkeypatch.setattr("ctxrep.featurize.Featurizer.embed_words", no_encoder)
    second = SequenceClassifier(**params).fit(X_CLS, Y_CLS)
    assert second.cache_hits_ == 1
    assert np.array_equal(second.predict_proba(X_CLS), first.predict_proba(X_CLS))


def test_frozen_fit_is_the_same_on_a_cold_and_a_warm_cache(tiny_models, tmp_path):
    """The held-out split and eval_set are featurized once, before training draws any random number; loading the
    encoder on the cold path used to draw from the global RNG mid-training and change later epochs' dropout."""
    params = common(
        tiny_models,
        tmp_path,
        "frozen",
        max_epochs=3,
        dropout=0.3,
        early_stopping=True,
        validation_fraction=0.25,
        n_iter_no_change=5,
    )
    eval_set = (["good fine", "awful sad"], ["pos", "neg"])
    cold = SequenceClassifier(**params).fit(X_CLS, Y_CLS, eval_set=eval_set)
    warm = SequenceClassifier(**params).fit(X_CLS, Y_CLS, eval_set=eval_set)
    # the cache is keyed per text: the held-out part repeats training texts, so even the cold fit reads it cached
    assert cold.cache_hits_ == 1 and warm.cache_hits_ == 3  # train, held-out part, eval_set
    assert [h["train_loss"] for h in warm.history_] == [h["train_loss"] for h in cold.history_]
    # the runs' peak memory is the process's (a module the first run imports counts there), not the fit's result
    measured = [{k: v for k, v in h.items() if k != "peak_memory_bytes"} for h in cold.history_]
    assert [{k: v for k, v in h.items() if k != "peak_memory_bytes"} for h in warm.history_] == measured
    assert np.array_equal(warm.predict_proba(X_CLS), cold.predict_proba(X_CLS))


def test_held_out_data_is_encoded_once_per_fit(tiny_models, tmp_path, monkeypatch):
    calls = []
    encode = SequenceClassifier._examples

    def counting(self, X, y, call):
        calls.append(len(X))
        return encode(self, X, y, call)

    monkeypatch.setattr(SequenceClassifier, "_examples", counting)
    params = common(
        tiny_models, tmp_path, max_epochs=3, early_stopping=True, validation_fraction=0.25, n_iter_no_change=5
    )
    clf = SequenceClassifier(**params).fit(X_CLS, Y_CLS, eval_set=(X_CLS[:2], Y_CLS[:2]))
    assert len(clf.history_) == 3 and all("dev_score" in h and "validation_score" in h for h in clf.history_)
    assert calls == [9, 3, 2]  # training part, held-out part, eval_set: once each, not once per epoch


# ---- ULMFiT options and schedules -------------------------------------------------------------------


def test_discriminative_lr_param_groups(tiny_models, tmp_path):
    clf = SequenceClassifier(
        **common(tiny_models, tmp_path, max_epochs=1, lr=1e-3, discriminative_lr=True, discriminative_lr_factor=2.0)
    )
    clf.fit(X_CLS, Y_CLS)
    groups = clf._optimizer().param_groups
    lr_by_depth = {g["depth"]: g["lr"] for g in groups}
    assert lr_by_depth == pytest.approx({0: 2.5e-4, 1: 5e-4, 2: 1e-3})  # tiny model: L = 2
    head = {id(p) for p in clf.model_.head.parameters()}
    assert all(g["lr"] == 1e-3 for g in groups if any(id(p) in head for p in g["params"]))
    n = sum(len(g["params"]) for g in groups)
    assert n == len(list(clf.model_.parameters()))
    biases = [g for g in groups if g["weight_decay"] == 0.0]
    assert biases and all(p.ndim == 1 for g in biases for p in g["params"])


def test_gradual_unfreezing_trains_only_the_head_in_the_first_epoch(tiny_models, tmp_path):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1, gradual_unfreezing=True))
    clf.fit(X_CLS, Y_CLS)
    original = load_model(tiny_models["bert"]).state_dict()
    tuned = clf.model_.representation.encoder.state_dict()
    assert all(torch.equal(original[k], tuned[k]) for k in original)
    with pytest.raises(ValueError, match="mode='frozen'"):
        SequenceClassifier(mode="frozen", gradual_unfreezing=True).fit(X_CLS, Y_CLS)


# ---- errors that speak to the user ---------------------------------------------------------------------


def test_bad_input_errors(tiny_models, tmp_path):
    params = common(tiny_models, tmp_path, max_epochs=1)
    with pytest.raises(ValueError, match="training set is empty"):
        SequenceClassifier(**params).fit([], [])
    with pytest.raises(ValueError, match="sentence 1: 4 words but 3 labels"):
        TokenTagger(**params).fit(X_TAG[:2], [Y_TAG[0], Y_TAG[1][:3]])
    with pytest.raises(ValueError, match="mode must be one of"):
        SequenceClassifier(mode="frozen-ish").fit(X_CLS, Y_CLS)
    clf = SequenceClassifier(**params).fit(X_CLS, Y_CLS)
    with pytest.raises(ValueError, match=r"labels \['meh'\] were not seen at fit time"):
        clf.score(["good"], ["meh"])
    with pytest.raises(ValueError, match="trained on single texts but X holds sentence pairs"):
        clf.predict([("good", "bad")])
    tagger = TokenTagger(**params).fit(X_TAG, Y_TAG)
    with pytest.raises(ValueError, match=r"sentence 0: labels \['B-ORG'\] were not seen"):
        tagger.score([["acme", "inc"]], [["B-ORG", "O"]])
    with pytest.raises(ValueError, match="single text; SpanExtractor needs"):
        SpanExtractor(**params).fit(["what is this"], [("this", 0)])
    with pytest.raises(ValueError, match="is not at character"):
        SpanExtractor(**params).fit([("q ?", "a b c")], [("c", 0)])
    with pytest.raises(ValueError, match="not fitted yet"):
        TokenTagger().predict(X_TAG)


# ---- the command line ---------------------------------------------------------------------------------


def test_cli_finetune_sst2_and_conll(tiny_models, tmp_path):
    from ctxrep.cli.finetune import finetune

    sst = tmp_path / "sst.txt"
    sst.write_text("(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n(2 (2 so) (2 so))\n" * 4)
    conll = tmp_path / "eng.train"
    conll.write_text("John NNP I-NP I-PER\nlives VBZ I-VP O\nin IN I-PP O\nParis NNP I-NP I-LOC\n\n" * 4)
    runner = CliRunner()
    model = str(tiny_models["bert"])
    base = [
        "--model",
        model,
        "--max-epochs",
        "2",
        "--batch-size",
        "4",
        "--lr",
        "3e-3",
        "--no-progress",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    out = tmp_path / "sst-out"
    result = runner.invoke(
        finetune, ["--task", "sst2", "--train", str(sst), "--dev", str(sst), "--out", str(out)] + base
    )
    assert result.exit_code == 0, result.output
    assert "macro f1" in result.output and "accuracy" in result.output
    for name in ("metrics.json", "confusion.png", "learning_curve.png", "model/config.json", "model/model.safetensors"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev_examples"] == 8 and len(metrics["history"]) == 2
    out = tmp_path / "ner-out"
    args = ["--task", "conll2003", "--train", str(conll), "--dev", str(conll), "--out", str(out), "--mode", "frozen"]
    result = runner.invoke(finetune, args + base)
    assert result.exit_code == 0, result.output
    assert "PER" in result.output and (out / "learning_curve.png").is_file()
    assert json.loads((out / "metrics.json").read_text())["score_name"] == "entity_f1"
    result = runner.invoke(
        finetune, ["--task", "sst2", "--train", str(tmp_path / "missing"), "--dev", str(sst), "--out", str(out)] + base
    )
    assert result.exit_code == 1 and "error:" in result.output


@pytest.fixture
def family_model(request, tiny_models, elmo_dir, xlnet_dir, gpt2_dir):
    paths = dict(tiny_models, elmo=f"elmo:{elmo_dir}", xlnet=xlnet_dir, gpt2=gpt2_dir)
    return str(paths[request.param])


@pytest.mark.parametrize("family_model", ["roberta", "electra", "xlnet", "gpt2", "elmo"], indirect=True)
@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_estimators_work_with_every_encoder_family(family_model, tiny_models, tmp_path, mode):
    kw = dict(model=family_model, lstm_size=16, lr=1e-2 if mode == "frozen" else 3e-3)
    clf = SequenceClassifier(**common(tiny_models, tmp_path, mode, max_epochs=15, **kw))
    assert clf.fit(X_CLS, Y_CLS).score(X_CLS, Y_CLS) == 1.0
    assert SequenceClassifier.load(clf.save(tmp_path / "clf")).score(X_CLS, Y_CLS) == 1.0
    pairs = SequenceClassifier(**common(tiny_models, tmp_path, mode, max_epochs=40, **kw))
    assert pairs.fit([(x, "and so on") for x in X_CLS], Y_CLS).score([(x, "and so on") for x in X_CLS], Y_CLS) == 1.0
    tagger = TokenTagger(**common(tiny_models, tmp_path, mode, max_epochs=40, **kw))
    predicted = tagger.fit(X_TAG, Y_TAG).predict(X_TAG[:2])
    assert [len(p) for p in predicted] == [4, 4]
    assert tagger.score(X_TAG, Y_TAG) > 0.5
    spans = SpanExtractor(**common(tiny_models, tmp_path, mode, max_epochs=60, doc_stride=16, **kw))
    answers = spans.fit(X_SPAN, Y_SPAN).predict(X_SPAN[:2])
    assert answers == ["paris", "london"]


def test_gpt2_classifier_reads_the_last_token_and_no_segments(gpt2_dir, tiny_models, tmp_path):
    """GPT-2 has no classification token: "cls" pooling reads the last token, the only one that saw the whole
    text; and its token_type_ids would be extra token embeddings, so none are passed."""
    clf = SequenceClassifier(**common(tiny_models, tmp_path, model=str(gpt2_dir), max_epochs=1))
    clf.fit(X_CLS[:4], Y_CLS[:4])
    example = clf._examples([(X_CLS[0].split(), None)], None, clf._call())[0]
    assert example.input.cls_position == len(example.input.input_ids) - 1
    seen = {}
    encoder = clf.model_.representation.encoder
    handle = encoder.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    clf.predict(X_CLS[:2])
    handle.remove()
    assert seen["token_type_ids"] is None


def test_elmo_finetune_trains_the_bilm_and_the_mix(elmo_dir, tiny_models, tmp_path):
    clf = SequenceClassifier(
        **common(tiny_models, tmp_path, model=f"elmo:{elmo_dir}", max_epochs=2, discriminative_lr=True)
    )
    before = Elmo(load_model(f"elmo:{elmo_dir}"), dropout=0.0, freeze=False).state_dict()
    clf.fit(X_CLS, Y_CLS)
    after = clf.model_.representation.encoder.state_dict()
    assert before.keys() == after.keys()
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    for part in ("bilm.char_cnn.", "bilm.forward_layers.1.", "bilm.backward_layers.0.", "scalar_mixes.0."):
        assert any(k.startswith(part) for k in changed), f"{part} did not train"
    groups = clf._optimizer().param_groups
    depths = {g["depth"] for g in groups}
    assert depths == {0, 1, 2}, "char CNN at depth 0, the LSTM layers at 1 and 2 (the mixes with the top)"
    mix = clf.model_.representation.encoder.scalar_mixes[0]  # the mix the paper trains with the task
    assert clf.mix_weights_.shape == (3,) and np.allclose(clf.mix_weights_, mix.weights.detach())
    assert clf.mix_gamma_ == pytest.approx(float(mix.gamma.detach()))
    # each call numbers its own words: predicting words never seen at fit works
    assert clf.predict(["good splendid words never seen"]).shape == (1,)


def test_sst_phrases_for_training(tmp_path):
    from ctxrep.tasks.experiment import experiment, read_task

    sst = tmp_path / "sst.txt"
    sst.write_text("(4 (3 good) (4 (4 great) (2 film)))\n(0 (0 bad) (1 awful))\n")
    assert read_task("sst2", sst).X == ["good great film", "bad awful"]
    phrases = read_task("sst2", sst, phrases=True)
    # every distinct labelled phrase except the neutral ones (label 2): "film" is dropped
    assert sorted(zip(phrases.X, phrases.y)) == sorted(
        [
            ("good great film", 1),
            ("good", 1),
            ("great film", 1),
            ("great", 1),
            ("bad awful", 0),
            ("bad", 0),
            ("awful", 0),
        ]
    )
    conll = tmp_path / "x.conll"
    conll.write_text("EU I-ORG\n")
    with pytest.raises(ValueError, match="train_phrases is for the SST tasks"):
        experiment(task="conll2003", train=conll, dev=conll, out_dir=tmp_path / "o", train_phrases=True)


# ---- small runs: max_steps and the warm-up -------------------------------------------------------------


def test_max_steps_stops_training_and_lays_out_the_schedule(tiny_models, tmp_path, monkeypatch):
    from ctxrep.train import schedules

    calls = []
    real = schedules.warmup_decay
    monkeypatch.setattr(
        schedules, "warmup_decay", lambda step, w, t, kind: calls.append((step, w, t)) or real(step, w, t, kind)
    )
    # 12 examples in batches of 4: 3 steps per epoch, so 5 steps = one full epoch and 2 steps of the next
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1, max_steps=5, warmup_fraction=0.4))
    clf.fit(X_CLS, Y_CLS)
    assert [h["steps"] for h in clf.history_] == [3, 5] and clf.n_epochs_ == 2
    assert sorted({step for step, _, _ in calls}) == [0, 1, 2, 3, 4, 5]  # at construction, then after each step
    assert {(w, t) for _, w, t in calls} == {(2, 5)}  # warm-up 0.4 x 5 steps, decay to zero at step 5
    tagger = TokenTagger(**common(tiny_models, tmp_path, max_epochs=50, max_steps=1)).fit(X_TAG, Y_TAG)
    assert [h["steps"] for h in tagger.history_] == [1]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_steps must be a positive integer"):
            SequenceClassifier(max_steps=bad).fit(X_CLS, Y_CLS)


def test_a_warm_up_as_long_as_the_run_warns(tiny_models, tmp_path):
    import warnings

    with pytest.warns(
        UserWarning,
        match=r"warm-up \(3 steps\) is as long as the run \(3 optimizer steps\).* "
        r"never gets above 66\.7% of lr.*lower the warm-up, e\.g\. warmup_fraction=0\.1",
    ) as record:
        SequenceClassifier(**common(tiny_models, tmp_path, max_steps=3, warmup_fraction=1.0)).fit(X_CLS, Y_CLS)
    assert record[0].filename == __file__  # pointed at the caller's fit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SequenceClassifier(**common(tiny_models, tmp_path, max_steps=3)).fit(X_CLS, Y_CLS)
    assert not [w for w in caught if "warm-up" in str(w.message)]
    with pytest.raises(ValueError, match="warmup_fraction must be 0 or more"):
        SequenceClassifier(warmup_fraction=-0.1).fit(X_CLS, Y_CLS)


# ---- learned layer weights -----------------------------------------------------------------------------


def test_mix_weights_in_frozen_mode(tiny_models, tmp_path):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, "frozen", max_epochs=3, lr=3e-2))
    assert not hasattr(clf, "mix_weights_")
    clf.fit(X_CLS, Y_CLS)
    mix = clf.model_.representation.mix
    weights = clf.mix_weights_
    assert weights.shape == (3,)  # embeddings + the tiny model's 2 layers
    assert weights.sum() == pytest.approx(1.0) and np.allclose(weights, mix.scalar_parameters.softmax(0).detach())
    assert not np.allclose(weights, 1 / 3), "the weights were learned"
    assert clf.mix_gamma_ == pytest.approx(float(mix.gamma.detach())) and clf.mix_gamma_ != 1.0
    loaded = SequenceClassifier.load(clf.save(tmp_path / "clf"))
    assert np.array_equal(loaded.mix_weights_, weights) and loaded.mix_gamma_ == clf.mix_gamma_
    tagger = TokenTagger(**common(tiny_models, tmp_path, "frozen", max_epochs=1)).fit(X_TAG, Y_TAG)
    assert tagger.mix_weights_.shape == (3,)


def test_mix_weights_are_absent_when_fine_tuning_a_transformer(tiny_models, tmp_path):
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=1)).fit(X_CLS, Y_CLS)
    assert not hasattr(clf, "mix_weights_")
    with pytest.raises(AttributeError, match="mix_weights_ exists in mode='frozen'.*fine-tuning ELMo"):
        _ = clf.mix_weights_


def test_mix_weights_on_probes():
    """analysis.probe: the mix probe and a probe result give the same learned weights under the same names."""
    from ctxrep.analysis import probe

    torch.manual_seed(0)
    y = torch.randint(0, 3, (300,))
    x = torch.randn(300, 3, 8)
    x[:, 2, :3] += 4 * torch.nn.functional.one_hot(y, 3).float()  # only layer 2 knows the label
    mix = probe.fit_mix_probe(x, y, 3, l2=1e-3, max_iter=50)
    assert mix.mix_weights_.shape == (3,) and mix.mix_weights_.sum() == pytest.approx(1.0)
    assert int(mix.mix_weights_.argmax()) == 2 and mix.mix_gamma_ == pytest.approx(float(mix.mix.gamma.detach()))
    row = probe._probe_row("model", x.numpy(), y, x.numpy(), y, 3, 1e-3, 50)
    result = probe.ProbeResult("upos", "m", ["a", "b", "c"], 300, 300, 0.4, [row])
    assert np.allclose(result.mix_weights_, row.mix_weights) and int(result.mix_weights_.argmax()) == 2
    assert result.mix_gamma_ == row.mix_gamma != 1.0


# ---- the fast paths against their references ------------------------------------------------------------------


def _with_reference_adamw(cls, monkeypatch):
    """Make `cls` fit with the for-loop AdamW (the reference of the fused kernel)."""
    monkeypatch.setattr(cls, "_fused_adamw", False)


@pytest.mark.parametrize("cls,X,y", [(SequenceClassifier, X_CLS, Y_CLS), (TokenTagger, X_TAG, Y_TAG)])
def test_fused_adamw_fits_as_the_for_loop_reference(tiny_models, tmp_path, monkeypatch, cls, X, y):
    fast = cls(**common(tiny_models, tmp_path, max_epochs=3)).fit(X, y, eval_set=(X, y))
    assert all(g["fused"] for g in fast._optimizer().param_groups)
    _with_reference_adamw(cls, monkeypatch)
    reference = cls(**common(tiny_models, tmp_path, max_epochs=3)).fit(X, y, eval_set=(X, y))
    groups = reference._optimizer().param_groups
    assert not any(g["fused"] or g["foreach"] for g in groups)
    assert [h["dev_score"] for h in fast.history_] == [h["dev_score"] for h in reference.history_]
    np.testing.assert_allclose(
        [h["train_loss"] for h in fast.history_], [h["train_loss"] for h in reference.history_], rtol=1e-4
    )
    for (name, a), b in zip(fast.model_.state_dict().items(), reference.model_.state_dict().values()):
        # The key bias adds q.b to every score of a query, which the softmax over keys ignores: its gradient is zero
        # but for rounding, and AdamW turns that noise into steps near lr * |g| / eps of either sign. The two
        # kernels round differently (1e-5 apart on an AMD EPYC), so the key bias is held to the size of such steps.
        atol = 1e-4 if name.endswith("attention.key.bias") else 1e-5
        torch.testing.assert_close(a, b, rtol=1e-4, atol=atol, msg=name)


def test_fast_predict_gives_the_reference_outputs(tiny_models, tmp_path, monkeypatch):
    """predict's path (length-sorted token-budget batches, inference mode; the compiled encoder when the call is large
    enough, here a stand-in that records its use) against the network in batches of batch_size, in order, for the
    classifier and the tagger (long windowed sentences included); a tiny token budget forces many batches."""
    from ctxrep.runtime import fast
    from ctxrep.tasks import inference

    compiled = []

    def compile_encoder(encoder):  # the wiring is tested here; fast.compile_encoder's parity in tests/test_fast.py
        compiled.append(encoder)
        return encoder

    monkeypatch.setattr(inference, "PREDICT_TOKENS", 40)
    monkeypatch.setattr(fast, "compile_min_flops", lambda device: 1.0)
    monkeypatch.setattr(fast, "compile_encoder", compile_encoder)
    texts = X_CLS + ["good " * n + "bad" for n in range(1, 30, 3)]
    clf = SequenceClassifier(**common(tiny_models, tmp_path, max_epochs=2, batch_size=3)).fit(X_CLS, Y_CLS)
    call = clf._call()
    records = clf._examples(clf._check_X(texts), None, call)
    fast, reference = clf._forward_all(records, call), clf._forward_reference(records, call)
    torch.testing.assert_close(torch.stack(fast), torch.stack(reference), rtol=1e-5, atol=1e-5)
    assert compiled == [clf.model_.representation.encoder]
    assert inference.inference_network(clf.model_, num_tokens=0) is clf.model_  # a small call: the network itself

    sentences = X_TAG + [["the", "cat"] * 50, ["paris"] * 7]
    tagger = TokenTagger(**common(tiny_models, tmp_path, max_epochs=2, word_pooling="mean")).fit(X_TAG, Y_TAG)
    call = tagger._call()
    records = tagger._examples(tagger._check_X(sentences), None, call)
    fast, reference = tagger._forward_all(records, call), tagger._forward_reference(records, call)
    assert [f.shape for f in fast] == [r.shape for r in reference]
    for f, r in zip(fast, reference):
        torch.testing.assert_close(f, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("word_pooling", ["first", "mean"])
def test_tagger_pool_matrix_is_the_per_word_loop(tiny_models, tmp_path, word_pooling):
    tagger = TokenTagger(**common(tiny_models, tmp_path, word_pooling=word_pooling, max_epochs=1))
    tagger.fit(X_TAG, Y_TAG)
    call = tagger._call()
    windows = tagger._examples([["unbelievable", "x"], ["a", "tokenization", "of", "words"]], None, call)
    n_pieces = max(len(w.input) for w in windows)
    expected = torch.zeros((len(windows), 4, n_pieces))  # (batch, words, pieces), written one word at a time
    for r, w in enumerate(windows):
        for j, (_, s, e) in enumerate(w.input.words):
            if word_pooling == "first":
                expected[r, j, s] = 1.0
            else:
                expected[r, j, s:e] = 1.0 / (e - s)
    assert any(e - s > 1 for w in windows for _, s, e in w.input.words)  # a word of several pieces is pooled
    assert torch.equal(tagger._collate(windows, call)["pool"], expected)  # built by tasks/modes.py's FineTune.units


def test_fit_keeps_freed_memory_for_the_next_step(tiny_models, tmp_path, monkeypatch):
    """The one loop tunes glibc malloc (ctxrep.train.allocator) before its first step, for estimators too."""
    from ctxrep.train import trainer

    calls = []
    monkeypatch.setattr(trainer, "tune_malloc", lambda: calls.append("tuned") or True)
    SequenceClassifier(**common(tiny_models, tmp_path, max_steps=1)).fit(X_CLS, Y_CLS)
    assert calls == ["tuned"]
