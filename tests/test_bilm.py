"""The biLM objective: softmax arithmetic, no leakage between directions, learning, saving, and its run through
the one pretraining pipeline (ctxrep.train.pretrain.prepare_run)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ctxrep
from ctxrep.models.elmo import ElmoBiLM, ElmoConfig
from ctxrep.objectives.bilm import (
    BiLMObjective,
    BiLMObjectiveConfig,
    evaluate_perplexity,
    full_softmax_nll,
    log_inclusion_prob,
    log_uniform_probs,
    sample_log_uniform,
    sampled_softmax_nll,
)
from ctxrep.text.char_ids import batch_to_ids
from ctxrep.train.pretrain import prepare_run
from ctxrep.train.pretrain_config import PretrainError, config_from_dict
from ctxrep.train.trainer import Trainer, TrainerConfig

pytest.importorskip("h5py")  # a test extra of ctxrep (ELMo weight files); installed in the dev environment

TINY_ELMO = dict(
    char_embedding_dim=4, filters=[(1, 4), (2, 4), (3, 8)], n_highway=1, lstm_dim=24, projection_dim=8, n_layers=2
)
VOCAB = ["<pad>", "<unk>", "<S>", "</S>"] + "the cat sat on mat a dog log . ran".split()
IDS = {w: i for i, w in enumerate(VOCAB)}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def tiny_objective(**config) -> BiLMObjective:
    torch.manual_seed(0)
    return BiLMObjective(ElmoConfig(**TINY_ELMO), VOCAB, BiLMObjectiveConfig(**{"dropout": 0.0, **config}))


def encode(*sentences: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded word ids and attention mask."""
    rows = [[IDS[w] for w in s.split()] for s in sentences]
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
    return ids, (ids > 0).long()


# ---- softmax arithmetic ------------------------------------------------------------------------------


def test_full_softmax_loss_is_the_cross_entropy_of_the_logits():
    obj = tiny_objective().eval()
    ids, mask = encode("the cat sat on the mat .", "a dog ran .")
    forward_logits, backward_logits = obj.logits(ids, mask)  # (batch, seq, vocab)
    real = mask.bool()
    expected_forward = F.cross_entropy(forward_logits[real], ids[real])
    expected_backward = F.cross_entropy(backward_logits[real], ids[real])
    out = obj({"input_ids": ids, "attention_mask": mask})
    assert out.num_tokens == 11
    torch.testing.assert_close(out.loss, (expected_forward + expected_backward) / 2)
    assert out.metrics["forward_ppl"] == pytest.approx(math.exp(expected_forward.item()), rel=1e-5)
    assert out.metrics["backward_ppl"] == pytest.approx(math.exp(expected_backward.item()), rel=1e-5)


def test_sampled_softmax_with_every_class_as_candidate_is_the_full_softmax():
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(7, 5), torch.randn(11, 5), torch.randn(11)
    targets = torch.tensor([0, 3, 3, 10, 5, 1, 7])
    everything = torch.arange(11)
    sampled = sampled_softmax_nll(hidden, targets, weight, bias, everything, torch.zeros(11), torch.zeros(7))
    torch.testing.assert_close(sampled, full_softmax_nll(hidden, targets, weight, bias))
    torch.testing.assert_close(sampled, F.cross_entropy(hidden @ weight.T + bias, targets, reduction="none"))


def test_sampled_softmax_log_q_correction_known_answer():
    # Logits s = (0, 1, 2) for the three classes; candidates {1, 2} with Q = (1/4, 1); targets 0 (Q = 1/2) and 1.
    hidden, weight, bias = torch.tensor([[1.0], [1.0]]), torch.tensor([[0.0], [1.0], [2.0]]), torch.zeros(3)
    candidates = torch.tensor([1, 2])
    log_q_candidates = torch.log(torch.tensor([0.25, 1.0]))
    log_q_targets = torch.log(torch.tensor([0.5, 0.25]))
    nll = sampled_softmax_nll(hidden, torch.tensor([0, 1]), weight, bias, candidates, log_q_candidates, log_q_targets)
    e = math.e
    # Row 0: exp(0 - log 1/2) = 2 against exp(1 - log 1/4) = 4e and exp(2 - log 1) = e^2.
    # Row 1: the target is also candidate 1 (an accidental hit, removed): 4e against e^2.
    expected = [math.log((2 + 4 * e + e**2) / 2), math.log((4 * e + e**2) / (4 * e))]
    torch.testing.assert_close(nll, torch.tensor(expected))


def test_log_uniform_probabilities_and_inclusion_known_answer():
    p = log_uniform_probs(3)  # (log 2 - log 1, log 3 - log 2, log 4 - log 3) / log 4
    torch.testing.assert_close(p, torch.tensor([0.5, math.log(1.5) / math.log(4), math.log(4 / 3) / math.log(4)]))
    assert float(log_uniform_probs(50_000).double().sum()) == pytest.approx(1.0, abs=1e-5)
    # Two draws include id 0 unless both miss it: 1 - (1 - 1/2)^2 = 3/4.
    assert float(log_inclusion_prob(torch.tensor([0]), 3, 2)) == pytest.approx(math.log(0.75))


def test_sampler_includes_each_word_with_the_probability_the_correction_assumes():
    torch.manual_seed(0)
    vocab, draws, trials = 10, 3, 4000
    seen = torch.zeros(vocab)
    for _ in range(trials):
        candidates = sample_log_uniform(vocab, draws)
        assert torch.equal(candidates, torch.unique(candidates))  # distinct, sorted
        seen[candidates] += 1
    expected = log_inclusion_prob(torch.arange(vocab), vocab, draws).exp()
    # Binomial standard error at 4000 trials is below 0.008: allow 4 of them.
    torch.testing.assert_close(seen / trials, expected, atol=0.03, rtol=0)


def test_training_uses_the_sampled_softmax_and_evaluation_the_full_one():
    obj = tiny_objective(num_samples=4)
    ids, mask = encode("the cat sat on the mat .")
    obj.eval()
    full = obj({"input_ids": ids, "attention_mask": mask}).loss
    obj.train()
    torch.manual_seed(1)
    sampled = obj({"input_ids": ids, "attention_mask": mask}).loss
    assert not torch.allclose(full, sampled)  # 4 draws cannot cover 14 classes: a different (smaller) loss
    obj_full = tiny_objective(softmax="full").train()
    torch.testing.assert_close(obj_full({"input_ids": ids, "attention_mask": mask}).loss, full)


# ---- no leakage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 2, 5])
def test_forward_prediction_never_sees_the_token_it_predicts_or_later(k):
    obj = tiny_objective().eval()
    ids, mask = encode("the cat sat on the mat .")
    changed = ids.clone()
    changed[0, k] = IDS["dog"]
    before, _ = obj.logits(ids, mask)
    after, _ = obj.logits(changed, mask)
    # Forward logits at position j predict token j from tokens < j: positions <= k are unchanged...
    torch.testing.assert_close(after[:, : k + 1], before[:, : k + 1], rtol=0, atol=0)
    # ...and the next position does read token k (so the comparison above could fail).
    assert not torch.allclose(after[:, k + 1], before[:, k + 1])


@pytest.mark.parametrize("k", [1, 4, 6])
def test_backward_prediction_never_sees_the_token_it_predicts_or_earlier(k):
    obj = tiny_objective().eval()
    ids, mask = encode("the cat sat on the mat .")
    changed = ids.clone()
    changed[0, k] = IDS["dog"]
    _, before = obj.logits(ids, mask)
    _, after = obj.logits(changed, mask)
    torch.testing.assert_close(after[:, k:], before[:, k:], rtol=0, atol=0)
    assert not torch.allclose(after[:, k - 1], before[:, k - 1])


def test_padding_and_other_rows_do_not_change_a_row():
    obj = tiny_objective().eval()
    alone = obj.token_nll(*encode("a dog ran ."))
    ids, mask = encode("a dog ran .", "the cat sat on the mat .")
    together = obj.token_nll(ids, mask)
    for a, t in zip(alone, together):
        torch.testing.assert_close(t[:4], a)
    ids[0, 5] = IDS["cat"]  # under attention_mask 0: padding, whatever its id
    torch.testing.assert_close(obj.token_nll(ids, mask)[0], together[0])


# ---- learning and saving ------------------------------------------------------------------------------


def test_forty_adam_steps_lower_both_perplexities():
    obj = tiny_objective(num_samples=10)  # the sampled softmax (10 draws for 14 words) while training
    ids, mask = encode("the cat sat on the mat .", "a dog sat on the log .", "the dog ran .", "a cat ran .")

    def perplexities() -> tuple[float, float]:
        obj.eval()
        with torch.no_grad():
            forward, backward = obj.token_nll(ids, mask)
        obj.train()
        return math.exp(forward.mean().item()), math.exp(backward.mean().item())

    start = perplexities()
    optimizer = torch.optim.Adam(obj.parameters(), lr=3e-2)
    for _ in range(40):
        optimizer.zero_grad()
        obj({"input_ids": ids, "attention_mask": mask}).loss.backward()
        optimizer.step()
    end = perplexities()
    # From about 14 (uniform over the 14 words) to about 5 for both directions.
    assert end[0] < 0.6 * start[0] and end[1] < 0.6 * start[1], (start, end)


def test_save_pretrained_loads_through_load_model_with_the_same_vectors(tmp_path):
    obj = tiny_objective().eval()
    with torch.no_grad():  # non-default softmax values, so that a dropped softmax would show
        obj.bilm.softmax.bias.normal_()
    obj.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_text().splitlines() == VOCAB
    loaded = ctxrep.load_model(f"elmo:{tmp_path}")
    assert isinstance(loaded, ElmoBiLM) and loaded.config.has_softmax and loaded.config.n_tokens_vocab == len(VOCAB)
    chars = batch_to_ids([["the", "cat", "sat"], ["a", "dog"]])
    with torch.no_grad():
        ours, theirs = obj.bilm(chars), loaded(chars)
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loaded.softmax.bias, obj.bilm.softmax.bias)
    torch.testing.assert_close(loaded.softmax.weight, obj.bilm.softmax.weight)


# ---- bad input ----------------------------------------------------------------------------------------


def test_ids_outside_the_vocabulary_are_refused():
    obj = tiny_objective()
    ids = torch.tensor([[4, 5, 99]])
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 14\).*got values from 4 to 99"):
        obj({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_a_batch_without_real_tokens_is_refused():
    obj = tiny_objective()
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="the batch has no real tokens"):
        obj({"input_ids": ids, "attention_mask": torch.zeros_like(ids)})


def test_bad_objective_settings_are_refused():
    with pytest.raises(ValueError, match="objective.softmax must be 'sampled' or 'full', got 'adaptive'"):
        BiLMObjectiveConfig(softmax="adaptive")
    with pytest.raises(ValueError, match="objective.num_samples=0 must be at least 1"):
        BiLMObjectiveConfig(num_samples=0)


# ---- the pretraining pipeline + Trainer + Featurizer ---------------------------------------------------

TEXT = (
    "The cat sat on the mat. The dog sat on the log. A cat and a dog met on the mat, and the cat ran.\n\n"
    "The crane lifted the beam. A crane caught a fish in the lake. The dog was happy.\n\n"
)
WORDS = 29  # the word tokenizer's entries for TEXT below: 4 specials + 25 words and punctuation marks


def tiny_run_config(**data) -> dict:
    """A config as `ctxrep pretrain` reads it from TOML: [elmo] in the layout of ELMo's options.json."""
    elmo = {
        "char_cnn": {
            "embedding": {"dim": 4},
            "filters": [[1, 4], [2, 4], [3, 8]],
            "n_highway": 1,
            "activation": "relu",
            "n_characters": 262,
            "max_characters_per_token": 50,
        },
        "lstm": {"dim": 24, "projection_dim": 8, "n_layers": 2, "use_skip_connections": True},
    }
    return {
        "elmo": elmo,
        "tokenizer": {"vocab_size": WORDS, "min_frequency": 1, "lowercase": False},
        "data": {"max_length": 12, "eval_fraction": 0.1, "num_workers": 0, **data},
        "objective": {"softmax": "sampled", "num_samples": 16, "dropout": 0.1},
        "trainer": {"lr": 1e-3},
    }


def bilm_run(config: dict, text_dir, out):
    return prepare_run("bilm", config_from_dict(config, "test config", objective="bilm"), text_dir, out, progress=False)


@pytest.fixture
def text_dir(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT * 15)
    (folder / "b.txt").write_text(TEXT.replace("cat", "fox") * 15)
    return folder


def test_the_pipeline_builds_a_bilm_run_that_trains_and_saves_a_featurizer_folder(tmp_path, text_dir):
    out = tmp_path / "run"
    run = bilm_run(tiny_run_config(), text_dir, out)
    assert run.eval_data is not None
    vocab = run.objective.vocab_words
    assert vocab[:4] == ["<pad>", "<unk>", "<S>", "</S>"] and len(vocab) == WORDS
    batch = run.train_data.next_batch(4)
    assert batch["input_ids"].shape[1] <= 12 and (batch["input_ids"][batch["attention_mask"] == 1] > 0).all()

    trainer = Trainer(
        run.objective,
        TrainerConfig(lr=3e-3, max_steps=10, batch_size=4, eval_batches=2, log_every=5),
        run.train_data,
        out,
        eval_data=run.eval_data,
        save_model=run.save_model,
    )
    result = trainer.train()
    assert result["step"] == 10 and math.isfinite(result["eval_loss"])
    assert {"forward_ppl", "backward_ppl"} <= set(result)

    assert (out / "vocab.txt").read_text().splitlines() == vocab
    fz = ctxrep.Featurizer(f"elmo:{out}", layers="all")
    vectors = fz.embed_words([["The", "crane", "lifted", "the", "beam", "."]])[0]
    assert vectors.shape == (6, 3, 2 * TINY_ELMO["projection_dim"])

    ppl = evaluate_perplexity(run.objective, run.eval_data, n_batches=2, batch_size=4)
    assert ppl["forward_ppl"] > 1 and ppl["backward_ppl"] > 1 and ppl["tokens"] > 0
    assert run.objective.training  # evaluate_perplexity restores the mode


def test_the_pipeline_reuses_the_tokenizer_and_the_packed_corpus(tmp_path, text_dir):
    out = tmp_path / "run"
    bilm_run(tiny_run_config(), text_dir, out)
    tokenizer_time = (out / "tokenizer.json").stat().st_mtime_ns
    tokens_time = (out / "corpus" / "tokens.bin").stat().st_mtime_ns
    again = bilm_run(tiny_run_config(), text_dir, out)
    assert (out / "tokenizer.json").stat().st_mtime_ns == tokenizer_time
    assert (out / "corpus" / "tokens.bin").stat().st_mtime_ns == tokens_time
    assert again.objective.vocab_words[:4] == ["<pad>", "<unk>", "<S>", "</S>"]
    # vocab_size means the same as for every objective: exactly the tokenizer's entries.
    config = tiny_run_config()
    config["tokenizer"]["vocab_size"] = 10
    with pytest.raises(PretrainError, match=rf"has {WORDS} entries but the model's vocab_size is 10 .*--tokenizer"):
        bilm_run(config, text_dir, out)


def test_held_out_sentences_are_the_corpus_tail_and_not_trained_on(tmp_path, text_dir):
    run = bilm_run(tiny_run_config(eval_fraction=0.2), text_dir, tmp_path / "run")
    train, held_out = run.train_data.corpus, run.eval_data.corpus
    whole = np.asarray(np.memmap(tmp_path / "run" / "corpus" / "tokens.bin", dtype=train.tokens.dtype, mode="r"))
    assert train.num_tokens + held_out.num_tokens == len(whole)
    np.testing.assert_array_equal(np.concatenate([train.tokens, held_out.tokens]), whole)
    assert held_out.num_sentences == math.ceil(0.2 * (train.num_sentences + held_out.num_sentences))


def test_strip_gutenberg_is_read_by_the_bilm_too(tmp_path, text_dir):
    book = (
        "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n"
        + TEXT * 15
        + "*** END OF THE PROJECT GUTENBERG EBOOK X ***\n"
    )
    (text_dir / "a.txt").write_text("Licence zyxxy zyxxy.\n" * 30 + book)
    kept = bilm_run(tiny_run_config(), text_dir, tmp_path / "stripped").objective.vocab_words
    unstripped = bilm_run(tiny_run_config(strip_gutenberg=False), text_dir, tmp_path / "kept").objective.vocab_words
    assert "zyxxy" in unstripped  # 60 times in the header: among the most frequent words once the header is read
    assert len(kept) == WORDS and "zyxxy" not in kept


def test_bad_biLM_settings_are_refused_with_the_config_named(tmp_path, text_dir):
    config = tiny_run_config()
    config["elmo"]["lstm"]["size"] = 8
    with pytest.raises(PretrainError, match=r"test config: unknown key\(s\) size in \[elmo.lstm\]"):
        bilm_run(config, text_dir, tmp_path / "run")
    config = tiny_run_config()
    config["elmo"]["n_tokens_vocab"] = 8  # set by the objective from the vocabulary
    with pytest.raises(PretrainError, match=r"unknown key 'n_tokens_vocab' in \[elmo\]"):
        bilm_run(config, text_dir, tmp_path / "run")
    config = tiny_run_config()
    config["objective"]["softmax"] = "adaptive"
    with pytest.raises(PretrainError, match="test config: objective.softmax must be 'sampled' or 'full'"):
        bilm_run(config, text_dir, tmp_path / "run")
    config = tiny_run_config()
    config["elmo"]["lstm"]["projection_dim"] = 48
    with pytest.raises(PretrainError, match=r"\[elmo\] in test config: .*projection_dim \(48\) must be smaller"):
        bilm_run(config, text_dir, tmp_path / "run")
    del config["elmo"]
    with pytest.raises(PretrainError, match=r"test config has no \[elmo\] section"):
        bilm_run(config, text_dir, tmp_path / "run")


def test_pretrain_cli_trains_a_bilm_that_the_featurizer_reads(tmp_path, text_dir):
    """`ctxrep pretrain --objective bilm --config tiny` end to end: the shipped config's [elmo] (options.json
    layout, 20 characters per word) trains, and the folder works as `elmo:DIR` in the Featurizer."""
    from click.testing import CliRunner

    from ctxrep import Featurizer
    from ctxrep.cli import main

    out = tmp_path / "elmo-run"
    args = [
        "pretrain",
        "--objective",
        "bilm",
        "--config",
        "tiny",
        "--corpus",
        str(text_dir),
        "--out",
        str(out),
        "--max-steps",
        "6",
        "--tokenizer.vocab_size",
    ]
    # The tiny config's 1,000 entries are more words than this text has: the error says how many there are.
    result = CliRunner().invoke(main, [*args, "1000"])
    assert result.exit_code == 1 and "set --tokenizer.vocab_size " in result.output, result.output
    words = result.output.split("set --tokenizer.vocab_size ")[1].split(",")[0]
    result = CliRunner().invoke(main, [*args, words])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert any("forward_ppl" in r for r in records)
    fz = Featurizer(f"elmo:{out}", layers="all")
    assert fz.embed_words(["the cat sat on the mat"])[0].shape == (6, 3, 2 * fz.model.config.projection_dim)
