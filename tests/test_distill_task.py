"""Task-specific distillation (compress/distill_task.py): the loss terms on known tensors, the estimators' loss hook,
1-layer students of 2-layer tiny teachers that fit, save, load, predict and export to transformers, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

import ctxrep
from ctxrep.compress import distill_task as D

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


X = ["good great fine nice", "nice good", "bad awful poor sad", "poor sad bad"] * 3
Y = [1, 1, 0, 0] * 3
TAG_X = [["john", "lives", "in", "paris"], ["mary", "visited", "london", "today"], ["the", "dog", "ran"]] * 2
TAG_Y = [["B-PER", "O", "O", "B-LOC"], ["B-PER", "O", "B-LOC", "O"], ["O", "O", "O"]] * 2


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)  # 0 log 0 = 0 (a masked-out position)


def softmax(z: list[float]) -> list[float]:
    e = [math.exp(v) for v in z]
    return [v / sum(e) for v in e]


# ---- the loss terms on known tensors --------------------------------------------------------------------------


def test_kd_loss_is_t_squared_kl_of_softened_distributions():
    from ctxrep.tasks import SequenceClassifier

    student, teacher = (
        torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0]]),
        torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
    )
    T = 2.0
    by_hand = (
        T
        * T
        * np.mean(
            [
                kl(softmax([v / T for v in t]), softmax([v / T for v in s]))
                for s, t in zip(student.tolist(), teacher.tolist())
            ]
        )
    )
    got = D.kd_loss(SequenceClassifier(), student, teacher, {}, temperature=T)
    assert float(got) == pytest.approx(by_hand, rel=1e-6)
    assert float(D.kd_loss(SequenceClassifier(), teacher, teacher, {}, temperature=T)) == pytest.approx(0, abs=1e-7)


def test_kd_rows_per_task():
    from ctxrep.tasks import SpanExtractor, TokenTagger

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)  # (batch, words, labels)
    pool = torch.zeros(2, 3, 5)
    pool[0, 0, 1] = pool[0, 1, 2] = pool[0, 2, 3] = pool[1, 0, 1] = 1.0  # row 1 has one real word
    got = D.kd_loss(TokenTagger(), s, t, {"pool": pool}, temperature=1.0)
    rows = [(0, 0), (0, 1), (0, 2), (1, 0)]
    by_hand = np.mean([kl(softmax(t[r, w].tolist()), softmax(s[r, w].tolist())) for r, w in rows])
    assert float(got) == pytest.approx(by_hand, rel=1e-5)

    s, t = torch.randn(2, 6, 2, generator=g), torch.randn(2, 6, 2, generator=g)  # (batch, pieces, start/end)
    s[1, 4:], t[1, 4:] = -1e4, -1e4  # outside the context: SpanHead's fill
    got = D.kd_loss(SpanExtractor(), s, t, {}, temperature=3.0)
    by_hand = 9 * np.mean(
        [kl(softmax((t[r, :, k] / 3).tolist()), softmax((s[r, :, k] / 3).tolist())) for r in range(2) for k in range(2)]
    )
    assert float(got) == pytest.approx(by_hand, rel=1e-5)
    with pytest.raises(TypeError, match="takes a SequenceClassifier, TokenTagger or SpanExtractor"):
        D.soft_target_rows(object(), s, {})


def test_hidden_state_loss_maps_layers_and_masks_padding():
    g = torch.Generator().manual_seed(0)
    teacher = [torch.randn(1, 3, 4, generator=g) for _ in range(4)]  # embeddings + 3 layers
    student = [teacher[0], teacher[3].clone()]  # student layer 1 <- teacher layer 2 (hidden_states[3])
    mask = torch.tensor([[True, True, False]])
    student[1][0, 2] = 100.0  # a padded piece: never compared
    for kind in ("cosine", "mse"):
        assert float(D.hidden_state_loss(student, teacher, [2], mask, kind)) == pytest.approx(0, abs=1e-6)
    moved = [teacher[0], 2 * teacher[3]]
    assert float(D.hidden_state_loss(moved, teacher, [2], mask, "cosine")) == pytest.approx(0, abs=1e-6)
    mse = float(((teacher[3][0, :2]) ** 2).mean())
    assert float(D.hidden_state_loss(moved, teacher, [2], mask, "mse")) == pytest.approx(mse, rel=1e-6)
    projection = nn.Linear(4, 4)
    with torch.no_grad():
        projection.weight.copy_(2 * torch.eye(4))
        projection.bias.zero_()
    half = [teacher[0], teacher[3] / 2]
    with torch.no_grad():
        assert float(D.hidden_state_loss(half, teacher, [2], mask, "mse", projection)) == pytest.approx(0, abs=1e-6)


def test_fit_trains_with_a_given_loss_and_its_parameters(tiny_models):
    """The estimators' hook: fit(..., train_loss=module) trains with it, and its own parameters too."""
    from ctxrep.tasks import SequenceClassifier

    class Pulled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))
            self.calls = 0

        def forward(self, logits, batch):
            self.calls += 1
            return F.cross_entropy(logits, batch["labels"]) + (self.w - 1.0) ** 2

    loss = Pulled()
    clf = SequenceClassifier(
        model=str(tiny_models["bert"]), max_epochs=2, batch_size=4, lr=1e-2, random_state=0, weight_decay=0.0
    )
    clf.fit(X, Y, train_loss=loss)
    assert loss.calls == 6 and 0.0 < float(loss.w.detach()) <= 1.0  # AdamW moved w towards 1
    assert all(not n.startswith("w") for n in clf.model_.state_dict())  # not part of the saved network


# ---- students of a fine-tuned tiny teacher -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher(tiny_models, tmp_path_factory):
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier(
        model=str(tiny_models["bert"]), max_epochs=10, batch_size=4, lr=3e-3, random_state=0, dropout=0.0
    )
    path = tmp_path_factory.mktemp("teacher") / "model"
    clf.fit(X, Y).save(path)
    assert clf.score(X, Y) == 1.0  # a teacher that knows the task
    return path


def test_distilled_classifier_fits_saves_loads_predicts_and_exports(teacher, tmp_path):
    from ctxrep.tasks import SequenceClassifier

    t = SequenceClassifier.load(teacher)
    t_state = {k: v.clone() for k, v in t.model_.state_dict().items()}
    student = D.distill_estimator(
        t,
        X,
        Y,
        student_layers=1,
        temperature=2.0,
        alpha=0.7,
        hidden_loss="cosine",
        encoder_dir=tmp_path / "work",
        max_epochs=3,
        lr=3e-3,
    )
    assert type(student) is SequenceClassifier and student.classes_.tolist() == [0, 1]
    encoder = student.model_.representation.encoder
    assert encoder.num_layers == 1 and student.distillation_["teacher_layers"] == [0]
    assert student.warm_start is False and student.max_epochs == 3 and student.pooling == t.pooling
    assert all(torch.equal(v, t.model_.state_dict()[k]) for k, v in t_state.items())  # teacher untouched
    assert student.score(X, Y) == 1.0  # the tiny task is learnt
    assert student.history_[-1]["train_loss"] < student.history_[0]["train_loss"]

    out = D.save_distilled(student, tmp_path / "out")
    loaded = SequenceClassifier.load(out / "model")
    assert loaded.model == str((out / "encoder").resolve())
    np.testing.assert_allclose(loaded.predict_proba(X), student.predict_proba(X), atol=1e-6)
    assert (loaded.predict(X) == student.predict(X)).all()
    # The saved student and its encoder folder move together: config.json names the encoder relative to itself.
    moved = tmp_path / "moved"
    (out).rename(moved)
    again = SequenceClassifier.load(moved / "model")
    assert again.model == str((moved / "encoder").resolve())
    np.testing.assert_allclose(again.predict_proba(X), student.predict_proba(X), atol=1e-6)
    moved.rename(out)

    # The encoder folder: transformers' AutoModel gives the student encoder's hidden states.
    hf = transformers.AutoModel.from_pretrained(out / "encoder").eval()
    ours = ctxrep.load_model(out / "encoder")
    tok = transformers.AutoTokenizer.from_pretrained(out / "encoder")
    batch = tok(["good great fine nice", "bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = hf(**batch, output_hidden_states=True).hidden_states
        mine = ours(batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True).hidden_states
        direct = encoder(batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    assert len(theirs) == 2
    real = batch["attention_mask"].bool()
    for a, b, c in zip(theirs, mine, direct.hidden_states):
        assert torch.allclose(a[real], b[real], atol=1e-5) and torch.allclose(b, c, atol=1e-6)


def test_student_starts_from_the_teacher(teacher, tmp_path):
    """Before any step the student's embeddings, layer and head are the teacher's (max_steps=1 at lr ~ 0)."""
    from ctxrep.tasks import SequenceClassifier

    t = SequenceClassifier.load(teacher)
    student = D.distill_estimator(
        t, X, Y, teacher_layers=[1], encoder_dir=tmp_path / "s", max_steps=1, lr=1e-12, warmup_fraction=0.0
    )
    s_enc, t_enc = student.model_.representation.encoder, t.model_.representation.encoder
    assert torch.allclose(s_enc.layers[0].output.weight, t_enc.layers[1].output.weight, atol=1e-9)
    assert torch.allclose(student.model_.head.linear.weight, t.model_.head.linear.weight, atol=1e-9)
    fresh = D.distill_estimator(
        t, X, Y, teacher_layers=[1], encoder_dir=tmp_path / "f", max_steps=1, lr=1e-12, copy_head=False, random_state=1
    )
    assert not torch.allclose(fresh.model_.head.linear.weight, t.model_.head.linear.weight, atol=1e-3)


def test_narrower_student_learns_a_projection(teacher, tmp_path):
    from ctxrep.tasks import SequenceClassifier

    t = SequenceClassifier.load(teacher)
    student = D.distill_estimator(
        t,
        X,
        Y,
        student_layers=1,
        student_hidden_size=16,
        hidden_loss="mse",
        encoder_dir=tmp_path / "n",
        max_epochs=1,
        lr=3e-3,
    )
    assert student.model_.representation.encoder.hidden_size == 16
    assert transformers.AutoModel.from_pretrained(tmp_path / "n").config.hidden_size == 16
    assert np.isfinite(student.history_[-1]["train_loss"])


def test_distilled_tagger(tiny_models, tmp_path):
    from ctxrep.tasks import TokenTagger

    t = TokenTagger(model=str(tiny_models["bert"]), max_epochs=4, batch_size=2, lr=3e-3, random_state=0, crf=True)
    t.fit(TAG_X, TAG_Y)
    student = D.distill_estimator(
        t,
        TAG_X,
        TAG_Y,
        student_layers=1,
        encoder_dir=tmp_path / "e",
        max_epochs=1,
        hidden_loss="cosine",
        eval_set=(TAG_X, TAG_Y),
    )
    assert type(student) is TokenTagger and student.crf and "dev_score" in student.history_[-1]
    out = D.save_distilled(student, tmp_path / "out")
    loaded = TokenTagger.load(out / "model")
    assert loaded.predict(TAG_X) == student.predict(TAG_X)
    assert all(len(p) == len(x) for p, x in zip(loaded.predict(TAG_X), TAG_X))


def test_distilled_span_extractor(tiny_models, tmp_path):
    from ctxrep.tasks import SpanExtractor

    X_qa = [("who lives in paris ?", "john lives in paris ."), ("where is mary ?", "mary is in london today .")]
    y_qa = [("john", 0), ("london", 11)]
    t = SpanExtractor(model=str(tiny_models["bert"]), max_epochs=30, lr=3e-3, batch_size=2, random_state=0)
    t.fit(X_qa, y_qa)  # a teacher sure of its answers

    def kl_to_teacher(student) -> float:
        """L_kd at T = 1 between the student's and the teacher's start / end distributions over X_qa."""
        with torch.no_grad():
            return sum(
                float(D.kd_loss(student, student.model_.eval()(b), t.model_.eval()(b), b, 1.0))
                for b in t.task_batches(X_qa, y_qa)
            )

    def distilled(epochs: int, lr: float):
        return D.distill_estimator(
            t,
            X_qa,
            y_qa,
            student_layers=1,
            student_hidden_size=16,  # fresh weights: a student that starts far from its teacher
            alpha=1.0,
            encoder_dir=tmp_path / f"e{epochs}",
            max_epochs=epochs,
            lr=lr,
        )

    start, student = distilled(1, 1e-9), distilled(30, 3e-3)  # the student as initialised, and as taught
    assert type(student) is SpanExtractor and len(student.predict(X_qa)) == 2
    assert kl_to_teacher(student) < 0.5 * kl_to_teacher(start)  # the soft targets moved it towards its teacher


# ---- the estimators' public seam that compression uses --------------------------------------------------------------


def test_task_batches_and_task_loss_are_the_fit_loss(teacher):
    """task_batches makes the network's batches in order; task_loss on them is the cross-entropy of predict_proba."""
    from ctxrep.tasks import SequenceClassifier

    t = SequenceClassifier.load(teacher)
    batches = t.task_batches(X[:5], Y[:5], batch_size=2)
    assert [len(b["labels"]) for b in batches] == [2, 2, 1]
    t.model_.eval()
    with torch.no_grad():
        losses = [float(t.task_loss(t.model_(b), b)) * len(b["labels"]) for b in batches]
    proba = t.predict_proba(X[:5])
    column = {c: i for i, c in enumerate(t.classes_)}
    by_hand = -np.mean([math.log(proba[i, column[Y[i]]]) for i in range(5)])
    assert sum(losses) / 5 == pytest.approx(by_hand, rel=1e-4)
    with pytest.raises(ValueError, match="not fitted"):
        SequenceClassifier().task_batches(X, Y)


def test_with_encoder_keeps_the_task_and_builds_a_new_network(teacher, tmp_path):
    from ctxrep.models.student import init_student
    from ctxrep.tasks import SequenceClassifier

    t = SequenceClassifier.load(teacher)
    head = {k: v.clone() for k, v in t.model_.head.state_dict().items()}
    student = init_student(t.model_.representation.encoder, [1])
    folder = D._write_encoder(student, t.backbone_.folder, tmp_path / "student")
    est = t.with_encoder(student, folder, max_epochs=1)
    assert type(est) is SequenceClassifier and list(est.classes_) == list(t.classes_)
    assert est.model == str(folder.resolve()) and est.warm_start and est.max_epochs == 1 and t.max_epochs == 10
    assert est.model_.representation.encoder is student and est.backbone_.tokenizer is t.backbone_.tokenizer
    assert est.fit(X, Y).predict(X).shape == (len(X),)
    for k, v in t.model_.head.state_dict().items():  # the teacher is left as it was
        torch.testing.assert_close(v, head[k], atol=0, rtol=0)


# ---- bad input ----------------------------------------------------------------------------------------------------


def test_bad_input_one_line_errors(teacher, tiny_models, elmo_dir, tmp_path):
    from ctxrep.tasks import SequenceClassifier

    t = SequenceClassifier.load(teacher)

    def refused(message, **kwargs):
        with pytest.raises(ValueError, match=message) as info:
            D.distill_estimator(kwargs.pop("teacher", t), X, Y, encoder_dir=tmp_path / "x", **kwargs)
        assert "\n" not in str(info.value)

    refused("student layers 3 is larger than the teacher's 2 layers", student_layers=3)
    refused(r"has a different tokenizer from the teacher's .* leave student= out", student=str(tiny_models["roberta"]))
    refused("student= gives a ready student encoder", student=str(tiny_models["bert"]), student_layers=1)
    refused("temperature must be a number greater than 0", temperature=0)
    refused(r"alpha \(the weight of the soft targets\) must be in \[0, 1\]", alpha=1.5)
    refused("hidden_loss must be None, 'cosine' or 'mse'", hidden_loss="l1")
    refused("SequenceClassifier has no parameter 'epochs'", student_layers=1, epochs=2)
    refused("teacher is not fitted", teacher=SequenceClassifier())

    frozen = SequenceClassifier(
        model=str(tiny_models["bert"]),
        mode="frozen",
        frozen_head="linear",
        pooling="mean",
        max_epochs=1,
        cache_dir=str(tmp_path / "cache"),
        random_state=0,
    ).fit(X, Y)
    refused(
        "trained with mode='frozen': .* nothing to distil into a smaller encoder; distil a teacher fitted with "
        "mode='finetune'",
        teacher=frozen,
    )
    elmo = SequenceClassifier(model=f"elmo:{elmo_dir}", max_epochs=1, batch_size=4, random_state=0).fit(X, Y)
    refused(
        "a elmo teacher cannot be distilled: task-specific distillation builds students for bert, .*roberta, .*xlnet "
        "encoders",
        teacher=elmo,
    )


@pytest.mark.parametrize("fixture", ["gpt2_dir", "xlnet_dir"])
def test_other_families_distil_through_the_interface(fixture, request, tmp_path):
    """A GPT-2 or XLNet teacher builds its student itself (Encoder.init_student): a 1-layer model of its family
    whose layer is the teacher's top layer; the student fits, predicts and saves a folder its family loads."""
    from ctxrep.tasks import SequenceClassifier

    folder = request.getfixturevalue(fixture)
    t = SequenceClassifier(model=str(folder), max_epochs=1, batch_size=4, random_state=0).fit(X, Y)
    student = D.distill_estimator(
        t, X, Y, teacher_layers=[1], hidden_loss="mse", encoder_dir=tmp_path / "e", max_epochs=1, progress=False
    )
    encoder, teacher_encoder = student.model_.representation.encoder, t.model_.representation.encoder
    assert encoder.family == teacher_encoder.family and encoder.num_layers == 1
    assert student.predict(X).shape == (len(X),) and student.distillation_["teacher_layers"] == [1]
    reloaded = ctxrep.load_model(str(tmp_path / "e"))
    assert reloaded.family == encoder.family and reloaded.num_layers == 1
    for name, p in reloaded.named_parameters():
        torch.testing.assert_close(p, encoder.get_parameter(name), atol=0, rtol=0, msg=name)


# ---- the command line ---------------------------------------------------------------------------------------------


def sst_file(path):
    path.write_text("(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n(3 (3 nice) (2 fine))\n(1 (1 poor) (0 sad))\n" * 3)
    return path


def test_cli_distill_task(teacher, tmp_path):
    import json

    from click.testing import CliRunner

    from ctxrep.cli.distill import distill
    from ctxrep.tasks import SequenceClassifier
    from ctxrep.tasks.experiment import read_task

    sst, out = sst_file(tmp_path / "sst.txt"), tmp_path / "student"
    args = [
        "--teacher",
        str(teacher.parent),
        "--student-layers",
        "1",
        "--task",
        "sst2",
        "--train",
        str(sst),
        "--dev",
        str(sst),
        "--out",
        str(out),
        "--max-epochs",
        "2",
        "--lr",
        "3e-3",
        "--hidden-loss",
        "cosine",
        "--no-progress",
    ]
    result = CliRunner().invoke(distill, args)
    assert result.exit_code == 0, result.output
    assert "2 -> 1 layers" in result.output and "dev score" in result.output
    report = json.loads((out / "distill.json").read_text())
    assert report["student_parameters"] < report["teacher_parameters"] and report["train_examples"] == 12
    assert f"dev score {report['student_dev_score']:.4f} (teacher {report['teacher_dev_score']:.4f})" in result.output
    dev = read_task("sst2", sst)
    assert SequenceClassifier.load(out / "model").score(dev.X, dev.y) == report["student_dev_score"]
    assert transformers.AutoModel.from_pretrained(out / "encoder").config.num_hidden_layers == 1


def test_cli_distill_task_bad_input(teacher, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli.distill import distill

    sst = sst_file(tmp_path / "sst.txt")
    base = ["--teacher", str(teacher), "--out", str(tmp_path / "o")]
    cases = [
        (["--task", "sst2"], "task-specific distillation takes --task and --train"),
        (["--task", "sst2", "--train", str(sst), "--corpus", str(sst)], "takes --task and --train (and no --corpus)"),
        (["--task", "sst2", "--train", str(sst), "--resume"], "--resume is for --corpus runs"),
        (["--task", "sst2", "--train", str(sst), "--student-layers", "5"], "larger than the teacher's 2 layers"),
        (["--task", "conll2003", "--train", str(sst)], "holds a SequenceClassifier, but --task conll2003"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(distill, base + extra)
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
