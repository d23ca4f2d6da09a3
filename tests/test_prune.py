"""Attention-head masks, pruning and importance (Michel et al. 2019): parity of pruned and masked models, round trips,
importance against finite differences, iterative pruning, the estimator adapter, `ctxrep prune`, bad input."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import ctxrep
from ctxrep.compress import prune as P
from ctxrep.models.bert import BertConfig, BertModel
from ctxrep.models.loading import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def batch_for(model, lengths=(12, 7, 3), seed=1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pad = model.config.pad_token_id
    ids = torch.randint(5, model.config.vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids[mask == 0] = pad
    types = torch.zeros_like(ids)
    if model.config.type_vocab_size > 1:
        types[0, 6:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def run(model, batch, head_mask=None):
    with torch.no_grad():
        return model(**batch, output_hidden_states=True, head_mask=head_mask)


def assert_same(a, b, batch, atol=1e-5) -> None:
    real = batch["attention_mask"].bool()
    for layer, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        assert torch.allclose(x[real], y[real], atol=atol), f"hidden state {layer} differs"
    if a.pooler_output is not None:
        assert torch.allclose(a.pooler_output, b.pooler_output, atol=atol)


def mask_of(model, heads: dict[int, list[int]]) -> torch.Tensor:
    mask = torch.ones(model.num_layers, model.num_heads)
    for layer, hs in heads.items():
        mask[layer, hs] = 0.0
    return mask


# ---- head mask and removal in BertModel -----------------------------------------------------------------------


def test_head_mask_multiplies_each_heads_output(tiny_models):
    """Known answer without the mask code: xi_h scales head h's columns of the output projection."""
    model = ctxrep.load_model(tiny_models["bert"])
    batch = batch_for(model)
    plain = run(model, batch)
    assert_same(run(model, batch, torch.ones(model.num_layers, model.num_heads)), plain, batch, atol=0)
    xi = torch.ones(model.num_layers, model.num_heads)
    xi[0, 1], xi[1, 3] = 0.0, 0.5
    masked = run(model, batch, xi)
    edited = copy.deepcopy(model)
    d = model.hidden_size // model.num_heads
    with torch.no_grad():
        edited.layers[0].attention.output.weight[:, 1 * d : 2 * d] *= 0.0
        edited.layers[1].attention.output.weight[:, 3 * d : 4 * d] *= 0.5
    assert_same(masked, run(edited, batch), batch)
    assert not torch.allclose(masked.last_hidden_state, plain.last_hidden_state, atol=1e-3)
    # One row for every layer: (num_heads,) is broadcast.
    row = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert_same(run(model, batch, row), run(model, batch, row.expand(2, 4)), batch, atol=0)


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra"])
def test_pruned_model_equals_masked_model(tiny_models, kind):
    model = ctxrep.load_model(tiny_models[kind])
    batch = batch_for(model)
    heads = {0: [0, 2], 1: [3]}
    masked = run(model, batch, mask_of(model, heads))
    pruned = copy.deepcopy(model)
    pruned.prune_heads(heads)
    assert pruned.heads_per_layer() == [2, 3] and pruned.num_heads == 4
    assert pruned.config.pruned_heads == {0: [0, 2], 1: [3]}
    assert_same(run(pruned, batch), masked, batch)
    # output_attentions: each layer's remaining heads.
    with torch.no_grad():
        out = pruned(**batch, output_attentions=True)
    assert [a.shape[1] for a in out.attentions] == [2, 3]
    # Smaller by exactly the removed rows of query/key/value (weights + biases) and columns of the output.
    h, d = model.hidden_size, model.hidden_size // model.num_heads
    per_head = 3 * (h * d + d) + h * d
    assert P.parameter_count(model) - P.parameter_count(pruned) == 3 * per_head
    assert pruned.layers[0].attention.query.weight.shape == (2 * d, h)
    assert pruned.layers[0].attention.output.weight.shape == (h, 2 * d)


def test_pruning_in_steps_uses_the_original_numbering(tiny_models):
    model = ctxrep.load_model(tiny_models["bert"])
    batch = batch_for(model)
    pruned = copy.deepcopy(model)
    pruned.prune_heads({0: [1]})
    pruned.prune_heads({0: [3], 1: [0]})
    pruned.prune_heads({0: [1]})  # already gone: nothing changes
    assert pruned.config.pruned_heads == {0: [1, 3], 1: [0]}
    assert pruned.layers[0].attention.kept_heads == [0, 2]
    assert_same(run(pruned, batch), run(model, batch, mask_of(model, {0: [1, 3], 1: [0]})), batch)
    # A head mask keeps the original numbering after pruning; entries of removed heads are not read.
    xi = torch.ones(2, 4)
    xi[0, 2] = 0.0
    xi[0, 1] = 123.0  # removed
    both = mask_of(model, {0: [1, 3, 2], 1: [0]})
    assert_same(run(pruned, batch, xi), run(model, batch, both), batch)


def test_pruned_folder_saves_and_reloads(tiny_models, tmp_path):
    model = ctxrep.load_model(tiny_models["roberta"])
    batch = batch_for(model)
    model.prune_heads({1: [0, 1, 2]})
    model.save_pretrained(tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert config["pruned_heads"] == {"1": [0, 1, 2]}  # transformers 4.x's field: string keys in JSON
    again = ctxrep.load_model(tmp_path / "pruned")
    assert again.heads_per_layer() == [4, 1] and again.config.pruned_heads == {1: [0, 1, 2]}
    assert P.parameter_count(again) == P.parameter_count(model)
    assert_same(run(again, batch), run(model, batch), batch, atol=0)
    # An unpruned model writes no pruned_heads (transformers 5 has no such field).
    ctxrep.load_model(tiny_models["bert"]).save_pretrained(tmp_path / "plain")
    assert "pruned_heads" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_bad_pruning_requests_are_refused_in_one_line(tiny_models, tmp_path):
    model = ctxrep.load_model(tiny_models["bert"])
    with pytest.raises(ValueError, match=r"layer 0 has heads 0\.\.3 \(original numbering\), not \[4, 5\]"):
        model.prune_heads({0: [0, 1, 2, 3, 4, 5]})  # more heads than the layer has
    with pytest.raises(ValueError, match="would remove all 4 heads of layer 1; keep at least one head per layer"):
        model.prune_heads({0: [0], 1: [0, 1, 2, 3]})
    with pytest.raises(ValueError, match=r"no layer 2; this model has layers 0\.\.1"):
        model.prune_heads({2: [0]})
    assert model.heads_per_layer() == [4, 4] and model.config.pruned_heads == {}  # nothing half-done
    model.prune_heads({0: [0, 1, 2]})
    with pytest.raises(ValueError, match="would remove all 4 heads of layer 0"):
        model.prune_heads({0: [3]})
    with pytest.raises(ValueError, match=r"head_mask has shape \(3, 4\); expected \(num_layers, num_heads\)"):
        model(**batch_for(model), head_mask=torch.ones(3, 4))
    # A folder whose config.json names heads the model cannot drop.
    model.save_pretrained(tmp_path / "bad")
    file = tmp_path / "bad" / "config.json"
    config = json.loads(file.read_text())
    file.write_text(json.dumps(config | {"pruned_heads": {"5": [0]}}))
    with pytest.raises(CheckpointError, match=r"config\.json: pruned_heads names layer 5, but the model has layers"):
        ctxrep.load_model(tmp_path / "bad")
    file.write_text(json.dumps(config | {"pruned_heads": {"0": [0, 1, 2, 3]}}))
    with pytest.raises(CheckpointError, match="removes all 4 heads of layer 0; keep at least one head per layer"):
        ctxrep.load_model(tmp_path / "bad")


# ---- importance -------------------------------------------------------------------------------------------------


def small_task():
    """A float64 BERT with a linear head on [CLS], and one example per batch: importance is then exactly
    E_x |dL(x)/dxi| (Michel et al. sec. 4.1)."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.5,
    )
    encoder = BertModel(config).double().eval()
    head = torch.nn.Linear(16, 3).double()
    g = torch.Generator().manual_seed(3)
    batches = [
        {"input_ids": torch.randint(1, 50, (1, 6), generator=g), "labels": torch.tensor([k % 3])} for k in range(5)
    ]

    def loss(batch, head_mask=None):
        out = encoder(batch["input_ids"], head_mask=head_mask)
        return F.cross_entropy(head(out.last_hidden_state[:, 0]), batch["labels"])

    return encoder, batches, loss


def test_importance_matches_finite_differences():
    encoder, batches, loss = small_task()
    got = P.head_importance(encoder, batches, loss, normalize=False)
    eps = 1e-6
    expected = torch.zeros(2, 4, dtype=torch.float64)
    with torch.no_grad():
        for batch in batches:
            for layer in range(2):
                for head in range(4):
                    up, down = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
                    up[layer, head] += eps
                    down[layer, head] -= eps
                    expected[layer, head] += abs(loss(batch, up) - loss(batch, down)) / (2 * eps)
    expected /= len(batches)
    assert expected.min() > 1e-4  # every head matters a little in this random model: the test can fail
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-9)
    normalised = P.head_importance(encoder, batches, loss)
    assert torch.allclose(normalised.double(), expected / expected.norm(dim=1, keepdim=True), rtol=1e-5)
    assert torch.allclose(normalised.norm(dim=1), torch.ones(2, dtype=normalised.dtype))
    assert all(p.grad is None for p in encoder.parameters())  # no gradients left on the weights


def test_importance_of_pruned_heads_is_zero_and_bad_loss_functions_are_refused():
    encoder, batches, loss = small_task()
    encoder.prune_heads({0: [2]})
    importance = P.head_importance(encoder, batches, loss)
    assert importance[0, 2] == 0 and bool((importance[0, [0, 1, 3]] > 0).all())
    with pytest.raises(ValueError, match="loss_fn's loss does not depend on the encoder's heads"):
        P.head_importance(encoder, batches, lambda b: torch.ones((), requires_grad=True) * 2.0)
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar tensor .* shape \(1, 3\)"):
        P.head_importance(encoder, batches, lambda b: torch.zeros(1, 3))
    with pytest.raises(ValueError, match="head_importance got no batches"):
        P.head_importance(encoder, [], loss)


def test_other_families_cannot_be_pruned(elmo_dir, gpt2_dir):
    _, batches, loss = small_task()
    for model in (ctxrep.load_model(f"elmo:{elmo_dir}"), ctxrep.load_model(gpt2_dir)):
        message = (
            rf"^a {model.family} model cannot be pruned: attention-head pruning is implemented for "
            r"bert, (.+, )?electra, (.+, )?roberta(, .+)?; fine-tune one of those to prune it$"
        )
        with pytest.raises(ValueError, match=message):
            P.head_importance(model, batches, loss)
        with pytest.raises(ValueError, match=message):
            P.prune_iteratively(model, lambda m: torch.zeros(2, 4), 0.25)


def test_heatmap_png(tmp_path):
    importance = torch.rand(3, 4)
    path = P.heatmap_png(importance, tmp_path / "importance.png", pruned={1: [2]})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- iterative pruning ------------------------------------------------------------------------------------------


def tiny_encoder(layers=3, heads=4) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30,
        hidden_size=8 * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=16,
        max_position_embeddings=8,
    )
    return BertModel(config).eval()


def test_least_important_keeps_a_head_in_every_layer():
    importance = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.8, 0.05]])
    assert P.least_important(importance, [[0, 1, 2], [0, 1, 2]], 3) == {0: [0, 1], 1: [2]}
    # Layer 0's three heads are the three least important, but one of them stays.
    importance = torch.tensor([[0.01, 0.02, 0.03], [0.9, 0.8, 0.7]])
    assert P.least_important(importance, [[0, 1, 2], [0, 1, 2]], 3) == {0: [0, 1], 1: [2]}
    assert P.least_important(importance, [[2], [0, 1, 2]], 1) == {1: [2]}  # only layer 1 can give a head


def test_prune_iteratively_recomputes_importance_each_step():
    encoder = tiny_encoder()
    calls = []

    def importance_fn(enc):
        calls.append(enc.heads_per_layer())
        # Known ranking: layer 2 least important; then layer 0 head 0 (0.2), layer 1 head 0 (0.3), layer 0 head 1.
        scale = torch.tensor([[2.0], [3.0], [0.1]])
        return scale * (1 + torch.arange(4.0)) / 10

    steps = P.prune_iteratively(encoder, importance_fn, fraction=0.5, steps=2)  # 6 of 12 heads, 3 per step
    assert calls == [[4, 4, 4], [4, 4, 1]]
    assert [s.heads for s in steps] == [{2: [0, 1, 2]}, {0: [0, 1], 1: [0]}]
    assert [s.fraction for s in steps] == [0.25, 0.5]
    assert encoder.heads_per_layer() == [2, 3, 1] and P.pruned_fraction(encoder) == 0.5
    assert P.pruned_heads(encoder) == {0: [0, 1], 1: [0], 2: [0, 1, 2]}
    # Heads pruned before count towards the fraction: going to 7/12 removes one more.
    more = P.prune_iteratively(encoder, importance_fn, fraction=7 / 12, steps=3)
    assert len(more) == 1 and sum(encoder.heads_per_layer()) == 5


def test_prune_iteratively_refuses_impossible_fractions():
    encoder = tiny_encoder()
    with pytest.raises(
        ValueError,
        match=(
            r"^fraction 0\.8 would remove 10 of 12 heads, but each of the 3 layers keeps "
            r"at least one: at most 9 heads \(fraction 0\.750\) can go; lower the "
            r"fraction$"
        ),
    ):
        P.prune_iteratively(encoder, lambda m: torch.rand(3, 4), 0.8)
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\)"):
        P.prune_iteratively(encoder, lambda m: torch.rand(3, 4), 1.0)
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        P.prune_iteratively(encoder, lambda m: torch.rand(3, 4), 0.5, steps=0)
    with pytest.raises(ValueError, match=r"importance_fn returned shape \(4, 3\); expected"):
        P.prune_iteratively(encoder, lambda m: torch.rand(4, 3), 0.5)
    assert encoder.heads_per_layer() == [4, 4, 4]
    P.prune_iteratively(encoder, lambda m: torch.rand(3, 4), 0.75)  # the largest fraction: one head per layer
    assert encoder.heads_per_layer() == [1, 1, 1]
    with pytest.raises(ValueError, match="already has 9 of 12 heads pruned"):
        P.prune_iteratively(encoder, lambda m: torch.rand(3, 4), 0.5)


def test_accuracy_curve(tmp_path):
    encoder = tiny_encoder()
    points = P.accuracy_curve(
        encoder,
        lambda m: torch.rand(3, 4),
        lambda: sum(encoder.heads_per_layer()) / 12,
        fraction=0.5,
        steps=3,
        png=tmp_path / "curve.png",
    )
    assert points == [(0.0, 1.0), (1 / 6, 5 / 6), (2 / 6, 4 / 6), (0.5, 0.5)]
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


# ---- a fine-tuned estimator and the command line ----------------------------------------------------------------

X = ["good great fine nice", "nice good", "bad awful poor sad", "poor sad bad"] * 3
Y = [1, 1, 0, 0] * 3  # SST-2 labels, as read_task gives them


@pytest.fixture(scope="module")
def classifier_dir(tiny_models, tmp_path_factory):
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier(
        model=str(tiny_models["bert"]), max_epochs=3, batch_size=4, lr=3e-3, random_state=0, dropout=0.0
    )
    path = tmp_path_factory.mktemp("clf") / "model"
    clf.fit(X, Y).save(path)
    return path


def test_estimator_loss_is_the_task_loss(classifier_dir):
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier.load(classifier_dir)
    task = P.estimator_loss(clf, X, Y, batch_size=5)
    assert task.encoder is clf.model_.representation.encoder and len(task.batches) == 3
    # Known answer: the mean negative log-probability of the gold label, from predict_proba.
    proba = torch.from_numpy(clf.predict_proba(X))
    gold = torch.tensor([list(clf.classes_).index(y) for y in Y])
    nll = -proba[torch.arange(len(Y)), gold].log()
    with torch.no_grad():
        losses = [float(task.loss_fn(b)) for b in task.batches]
    assert losses == pytest.approx([float(nll[i : i + 5].mean()) for i in range(0, 12, 5)], rel=1e-4)
    importance = P.head_importance(*task)
    assert importance.shape == (2, 4) and torch.allclose(importance.norm(dim=1), torch.ones(2))


def test_frozen_estimator_has_no_heads_to_prune(tiny_models, tmp_path):
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier(
        model=str(tiny_models["bert"]),
        mode="frozen",
        frozen_head="linear",
        pooling="mean",
        max_epochs=1,
        cache_dir=str(tmp_path / "cache"),
        random_state=0,
    ).fit(X, Y)
    with pytest.raises(ValueError, match="trained with mode='frozen': its encoder is not part of the task model"):
        P.estimator_loss(clf, X, Y)


def test_prune_estimator_is_the_workflow_as_a_library_call(classifier_dir, tmp_path):
    """`ctxrep prune` without the command line: the estimator pruned in place, the folder written, the report."""
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier.load(classifier_dir)
    seen = []
    report = P.prune_estimator(
        clf,
        X,
        Y,
        0.25,
        tmp_path / "out",
        steps=2,
        dev=(X, Y),
        curve=True,
        importance_fraction=0.5,
        about={"model": "tiny"},
        after_step=lambda record, score: seen.append((record.step, score)),
    )
    assert [step for step, _ in seen] == [1, 2] and all(isinstance(score, float) for _, score in seen)
    assert report["model"] == "tiny" and report["importance_examples"] == 6 and report["fraction_pruned"] == 0.25
    assert [p["dev_score"] for p in report["curve"][1:]] == [score for _, score in seen]
    assert sum(clf.model_.representation.encoder.heads_per_layer()) == 6  # in place
    assert json.loads((tmp_path / "out" / "prune.json").read_text()) == report
    assert sum(ctxrep.load_model(tmp_path / "out").heads_per_layer()) == 6
    assert (tmp_path / "out" / "tokenizer.json").is_file() and (tmp_path / "out" / "curve.png").is_file()
    assert SequenceClassifier.load(tmp_path / "out" / "estimator").score(X, Y) == pytest.approx(
        report["dev_score_after"]
    )
    with pytest.raises(ValueError, match="curve scores every pruning step on held-out data: give dev"):
        P.prune_estimator(clf, X, Y, 0.25, tmp_path / "o2", curve=True)
    with pytest.raises(ValueError, match="is the folder of the encoder being pruned"):
        P.prune_estimator(clf, X, Y, 0.25, tmp_path / "out")


def sst_file(path):
    path.write_text("(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n(3 (3 nice) (2 fine))\n(1 (1 poor) (0 sad))\n" * 3)
    return path


def test_cli_prune(classifier_dir, tmp_path):
    from ctxrep.cli.prune import prune
    from ctxrep.tasks import SequenceClassifier

    sst = sst_file(tmp_path / "sst.txt")
    out = tmp_path / "pruned"
    args = [
        "--model",
        str(classifier_dir.parent),
        "--task",
        "sst2",
        "--train",
        str(sst),
        "--dev",
        str(sst),
        "--fraction",
        "0.25",
        "--steps",
        "2",
        "--curve",
        "--finetune-epochs",
        "1",
        "--importance-fraction",
        "0.5",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(prune, args)
    assert result.exit_code == 0, result.output
    assert "step 2: removed" in result.output and "pruned 2 of 8 heads (fraction 0.250)" in result.output
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "importance.png",
        "curve.png",
        "prune.json",
        "estimator/config.json",
    ):
        assert (out / name).is_file(), name
    report = json.loads((out / "prune.json").read_text())
    assert [round(p["fraction"], 3) for p in report["curve"]] == [0.0, 0.125, 0.25]
    assert report["importance_examples"] == 6 and report["parameters_after"] < report["parameters_before"]
    encoder = ctxrep.load_model(out)  # the pruned encoder, from its own folder
    assert sum(encoder.heads_per_layer()) == 6
    assert P.parameter_count(encoder) == report["parameters_after"]
    clf = SequenceClassifier.load(out / "estimator")  # the pruned task model
    assert clf.model_.representation.encoder.heads_per_layer() == encoder.heads_per_layer()
    assert clf.score(X, Y) == pytest.approx(report["dev_score_after"])


def test_cli_prune_bad_input(classifier_dir, tmp_path):
    from ctxrep.cli.prune import prune

    sst = sst_file(tmp_path / "sst.txt")
    base = ["--model", str(classifier_dir), "--train", str(sst), "--out", str(tmp_path / "out")]
    cases = [
        (
            ["--task", "sst2", "--fraction", "0.9"],
            "error: fraction 0.9 would remove 7 of 8 heads, but each of the 2 layers keeps at least one",
        ),
        (
            ["--task", "conll2003", "--fraction", "0.25"],
            "holds a SequenceClassifier, but --task conll2003 is a TokenTagger",
        ),
        (["--task", "sst2", "--fraction", "0.25", "--curve"], "--curve scores every pruning step on held-out data"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(prune, base + extra)
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(
        prune,
        [
            "--model",
            str(tmp_path),
            "--task",
            "sst2",
            "--train",
            str(sst),
            "--fraction",
            "0.25",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert result.exit_code == 1 and "not a saved task model" in result.output
