"""The pretraining trainer: schedules, AdamW groups, accumulation, clipping, logs, Ctrl-C, exact resume, plots."""

from __future__ import annotations

import json
import math
import os
import signal
from functools import partial

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from ctxrep.cli.plot_run import plot_run as plot_run_command
from ctxrep.models.gpt2 import GPT2Config, GPT2LMHeadModel
from ctxrep.models.loading import CheckpointError
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.train import allocator
from ctxrep.train import trainer as trainer_module
from ctxrep.train.optim import param_groups
from ctxrep.train.plot import plot_run
from ctxrep.train.schedules import slanted_triangular, warmup_decay
from ctxrep.train.trainer import Trainer, TrainerConfig, TrainerError

VOCAB, LENGTH = 40, 8


class CausalLM(nn.Module):
    """The smallest objective: GPT-2 next-token loss over fixed-length rows."""

    def __init__(self, n_embd: int = 16, dropout: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=LENGTH,
            n_embd=n_embd,
            n_layer=2,
            n_head=2,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
        )
        self.model = GPT2LMHeadModel(config)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        ids = batch["input_ids"]
        loss = self.model(ids, labels=ids).loss
        return ObjectiveOutput(loss, ids.numel(), {"first_id": float(ids[:, 0].float().mean())}, nll=float(loss))


class OtherLM(CausalLM):
    pass


class Rows:
    """Row i of the stream is a fixed function of (seed, i), so any split into batches gives the same rows."""

    def __init__(self, seed: int = 0, interrupt_at_call: int | None = None) -> None:
        self.seed, self.position, self.calls = seed, 0, 0
        self.interrupt_at_call = interrupt_at_call

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.calls == self.interrupt_at_call:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, in the middle of a step
        stream = range(self.position, self.position + batch_size)
        rows = [np.random.default_rng([self.seed, i]).integers(0, VOCAB, LENGTH) for i in stream]
        self.position += batch_size
        return {"input_ids": np.stack(rows)}

    def state_dict(self) -> dict:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.position = state["seed"], state["position"]


def config(**overrides) -> TrainerConfig:
    base = dict(lr=1e-2, max_steps=4, batch_size=4, log_every=1, checkpoint_every=0, eval_batches=2, warmup_steps=0)
    return TrainerConfig(**{**base, **overrides})


def params(objective: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in objective.state_dict().items()}


def read_log(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------- schedules


def test_warmup_linear_known_answers():
    f = partial(warmup_decay, warmup_steps=4, max_steps=12, kind="linear")
    assert [f(s) for s in (0, 1, 2, 4, 6, 8, 12, 20)] == [0.0, 0.25, 0.5, 1.0, 0.75, 0.5, 0.0, 0.0]


def test_warmup_cosine_known_answers():
    f = partial(warmup_decay, warmup_steps=2, max_steps=10, kind="cosine")
    assert f(1) == 0.5 and f(2) == 1.0 and f(10) == 0.0
    assert f(6) == pytest.approx(0.5)  # halfway through the decay: (1 + cos(pi/2)) / 2
    assert f(4) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)


def test_warmup_decay_without_warmup_and_bad_kind():
    assert warmup_decay(0, 0, 10) == 1.0 and warmup_decay(5, 0, 10) == 0.5
    with pytest.raises(ValueError, match="unknown schedule 'step'; use one of linear, cosine"):
        warmup_decay(0, 0, 10, kind="step")


def test_slanted_triangular_known_answers():
    # T = 100, cut_frac = 0.1 -> cut = 10; ratio 32: from 1/32 up to 1 at step 10, back to 1/32 at step 100.
    f = partial(slanted_triangular, total_steps=100, cut_frac=0.1, ratio=32)
    assert f(0) == pytest.approx(1 / 32)
    assert f(5) == pytest.approx((1 + 0.5 * 31) / 32)
    assert f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx((1 + 0.5 * 31) / 32)  # p = 1 - 45 / (10 * 9) = 0.5
    assert f(100) == pytest.approx(1 / 32)
    with pytest.raises(ValueError, match="cut_frac=1.5 must be between 0 and 1"):
        slanted_triangular(0, 100, cut_frac=1.5)
    with pytest.raises(ValueError, match="ratio=0.5 must be at least 1"):
        slanted_triangular(0, 100, ratio=0.5)


def test_lambda_lr_follows_the_schedule():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(warmup_decay, warmup_steps=2, max_steps=4))
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [0.0, 1.0, 2.0, 1.0]


# ------------------------------------------------------------------------------------------- optimizer


def test_param_groups_decay_matrices_only_and_tied_weights_once():
    objective = CausalLM()
    objective.model.transformer.h[0].ln_1.weight.requires_grad_(False)  # frozen: in no group
    decay, no_decay = param_groups(objective, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    wte = objective.model.transformer.wte.weight
    assert sum(p is wte for p in decay["params"]) == 1  # tied with lm_head, yet listed once
    trainable = [p for p in objective.parameters() if p.requires_grad]
    assert len(decay["params"]) + len(no_decay["params"]) == len(trainable)
    names = {id(p): n for n, p in objective.named_parameters()}
    assert "model.transformer.h.0.ln_1.bias" in {names[id(p)] for p in no_decay["params"]}
    assert "model.transformer.h.0.ln_1.weight" not in {names[id(p)] for p in no_decay["params"]}


def test_param_groups_by_depth_with_discriminative_learning_rates():
    from ctxrep.train.optim import adamw, discriminative

    objective = CausalLM()
    depth = {n: int(n.split(".")[3]) + 1 for n, _ in objective.named_parameters() if ".h." in n}  # blocks 1, 2
    optimizer = adamw(objective, 1e-3, 0.1, depth=depth, default_depth=0, lr_at_depth=discriminative(1e-3, 2.0, 2))
    groups = optimizer.param_groups
    assert [(g["depth"], g["weight_decay"]) for g in groups] == [
        (0, 0.1),
        (0, 0.0),
        (1, 0.1),
        (1, 0.0),
        (2, 0.1),
        (2, 0.0),
    ]
    assert [g["lr"] for g in groups] == pytest.approx([2.5e-4, 2.5e-4, 5e-4, 5e-4, 1e-3, 1e-3])
    names = {id(p): n for n, p in objective.named_parameters()}
    in_groups = [names[id(p)] for g in groups for p in g["params"]]
    assert sorted(in_groups) == sorted(names.values())  # each parameter once (the tied wte / lm_head too)
    assert "model.transformer.h.1.ln_2.weight" in [names[id(p)] for p in groups[5]["params"]]


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    results = []
    for accumulation in (1, 4):
        objective = CausalLM(seed=1)
        # eps=1e-3: Adam's first step lr * g / (|g| + eps) would turn 1e-9 rounding in a tiny g into 1e-5 with eps=1e-6
        cfg = config(max_steps=1, batch_size=8, accumulation_steps=accumulation, grad_clip=0.0, eps=1e-3)
        Trainer(objective, cfg, Rows(), tmp_path / str(accumulation)).train()
        grads = {n: p.grad.clone() for n, p in objective.named_parameters()}
        results.append((params(objective), grads))
    (p1, g1), (p4, g4) = results
    for name in g1:
        torch.testing.assert_close(g4[name], g1[name], atol=1e-6, rtol=0)  # the gradient of the mean, not the sum
    for name in p1:
        torch.testing.assert_close(p4[name], p1[name], atol=1e-6, rtol=0)


def test_gradient_clipping_caps_the_global_norm(tmp_path):
    objective = CausalLM()
    result = Trainer(objective, config(max_steps=1, grad_clip=0.01), Rows(), tmp_path).train()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in objective.parameters()]))
    assert result["grad_norm"] > 0.1  # the norm before clipping, as logged
    assert norm.item() == pytest.approx(0.01, rel=1e-4)


def test_bf16_autocast_trains(tmp_path):
    result = Trainer(CausalLM(), config(max_steps=2, bf16=True), Rows(), tmp_path).train()
    assert math.isfinite(result["loss"]) and result["step"] == 2


# ------------------------------------------------------------------------------------------- logging and eval


def test_log_records_and_evaluation(tmp_path):
    cfg = config(lr=1e-3, max_steps=4, warmup_steps=2, log_every=2, eval_every=2, checkpoint_every=2)
    saved = []
    trainer = Trainer(CausalLM(), cfg, Rows(), tmp_path, eval_data=Rows(seed=99), save_model=saved.append)
    result = trainer.train()
    records = read_log(tmp_path)
    assert [(r["step"], "eval_loss" in r) for r in records] == [
        (1, False),
        (2, False),
        (2, True),
        (4, False),
        (4, True),
    ]
    train = [r for r in records if "loss" in r]
    assert set(train[0]) == {"step", "loss", "lr", "tokens_per_s", "grad_norm", "first_id", "peak_memory_bytes"}
    # lr of the step that was logged: warm-up 0, 0.5e-3 (step 2); decay 1e-3 (step 3), 0.5e-3 (step 4)
    assert [r["lr"] for r in train] == pytest.approx([0.0, 0.5e-3, 0.5e-3])
    assert all(r["tokens_per_s"] > 0 for r in train)
    evals = [r for r in records if "eval_loss" in r]
    assert all(r["eval_perplexity"] == pytest.approx(math.exp(r["eval_loss"])) for r in evals)
    # the same held-out batches every time: evaluating again gives the last logged value
    assert trainer.evaluate()["eval_loss"] == pytest.approx(evals[-1]["eval_loss"], abs=1e-7)
    assert result["eval_loss"] == evals[-1]["eval_loss"] and result["step"] == 4
    assert saved == [tmp_path, tmp_path]  # at each checkpoint (steps 2 and 4)
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()


class AuxiliaryLM(CausalLM):
    """A token NLL plus a term that is not one (like BERT's NSP loss), or no NLL at all (like ELECTRA's)."""

    def __init__(self, reports_nll: bool) -> None:
        super().__init__()
        self.reports_nll = reports_nll

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        out = super().forward(batch)
        return ObjectiveOutput(out.loss + 1.0, out.num_tokens, nll=out.nll if self.reports_nll else None)


def test_perplexity_comes_from_the_token_nll_only(tmp_path):
    cfg = config(max_steps=1, eval_every=1)
    with_nll = Trainer(AuxiliaryLM(reports_nll=True), cfg, Rows(), tmp_path / "a", eval_data=Rows(seed=99))
    metrics = with_nll.evaluate()
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(metrics["eval_loss"] - 1.0), rel=1e-5)
    without = Trainer(AuxiliaryLM(reports_nll=False), cfg, Rows(), tmp_path / "b", eval_data=Rows(seed=99))
    assert "eval_perplexity" not in without.evaluate()


def test_loss_of_a_logged_window_is_the_mean_of_its_steps(tmp_path):
    Trainer(CausalLM(seed=3), config(max_steps=4, log_every=1), Rows(), tmp_path / "a").train()
    Trainer(CausalLM(seed=3), config(max_steps=4, log_every=3), Rows(), tmp_path / "b").train()
    per_step = {r["step"]: r["loss"] for r in read_log(tmp_path / "a")}
    windows = {r["step"]: r["loss"] for r in read_log(tmp_path / "b")}
    assert sorted(windows) == [1, 3, 4]  # the first step, every log_every steps, the last step
    assert windows[3] == pytest.approx((per_step[2] + per_step[3]) / 2, abs=1e-6)


def test_every_run_logs_its_first_and_last_step(tmp_path):
    Trainer(CausalLM(), config(max_steps=5, log_every=10), Rows(), tmp_path / "five").train()
    assert [r["step"] for r in read_log(tmp_path / "five")] == [1, 5]
    Trainer(CausalLM(), config(max_steps=1, log_every=10), Rows(), tmp_path / "one").train()
    assert [r["step"] for r in read_log(tmp_path / "one")] == [1]


def test_a_run_bounded_by_minutes_ends_on_the_clock_and_its_bar_shows_time(tmp_path, monkeypatch, capsys):
    clock = {"now": 1000.0}
    monkeypatch.setattr(trainer_module, "_now", lambda: clock["now"])

    class SlowRows(Rows):  # every micro-batch takes 20 s of the fake clock
        def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
            clock["now"] += 20.0
            return super().next_batch(batch_size)

    saved = []
    cfg = config(max_steps=10**9, max_minutes=1.0)
    result = Trainer(CausalLM(), cfg, SlowRows(), tmp_path, eval_data=Rows(seed=99), save_model=saved.append).train()
    # 60 s = 3 steps of 20 s; then the run ends as a finished one: evaluated and saved, not "interrupted"
    assert result["step"] == 3 and result["interrupted"] is False and "eval_loss" in result
    assert saved == [tmp_path] and read_log(tmp_path)[-1]["step"] == 3
    captured = capsys.readouterr()
    # not a terminal: plain lines over the clock's seconds, with the step count
    assert "train: 60/60 s (100%)" in captured.err and "step 3" in captured.err, captured.err
    assert "1000000000" not in captured.err and "\r" not in captured.err  # no count against max_steps, no bar
    assert "max_minutes=1 reached at step 3" in captured.out
    with pytest.raises(TrainerError, match="max_minutes"):
        TrainerConfig(max_minutes=-1).validate()


def test_progress_to_a_log_file_is_a_few_plain_lines_of_steps(tmp_path, monkeypatch, capsys):
    clock = iter(range(0, 10**6, 4))  # every look at the progress clock moves 4 s on: a line every 3 looks
    monkeypatch.setattr("ctxrep.util.progress.time.monotonic", lambda: float(next(clock)))
    Trainer(CausalLM(), config(max_steps=12, log_every=100), Rows(), tmp_path).train()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = [line for line in err.splitlines() if line.startswith("train: ")]
    assert 2 <= len(lines) <= 8, err  # one line per 10 s of a 12-step run, and the last
    assert lines[-1].startswith("train: 12/12 steps (100%)") and "loss=" in lines[-1], lines


# ------------------------------------------------------------------------------------------- Ctrl-C and resume


def test_ctrl_c_finishes_the_step_saves_and_returns(tmp_path):
    data = Rows(interrupt_at_call=3)  # Ctrl-C during step 3
    before = signal.getsignal(signal.SIGINT)  # default_int_handler; SIG_IGN under `nohup ... &`
    result = Trainer(CausalLM(), config(max_steps=10), data, tmp_path).train()
    assert result["interrupted"] is True and result["step"] == 3
    state = json.loads((tmp_path / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["data"] == {"seed": 0, "position": 12}
    assert [r["step"] for r in read_log(tmp_path)] == [1, 2, 3]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    # dropout on, data-source position, AdamW moments, schedule: all must be restored for equality
    cfg = config(max_steps=6, warmup_steps=2, schedule="cosine", log_every=1, checkpoint_every=2, accumulation_steps=2)
    straight = CausalLM(dropout=0.2)
    full = Trainer(straight, cfg, Rows(), tmp_path / "straight").train()

    first = Trainer(CausalLM(dropout=0.2), cfg, Rows(interrupt_at_call=7), tmp_path / "stopped").train()
    assert first["interrupted"] and first["step"] == 4  # micro-batch 7 belongs to step 4
    resumed_objective = CausalLM(dropout=0.2, seed=123)  # other initial weights: the checkpoint replaces them
    second = Trainer(resumed_objective, cfg, Rows(), tmp_path / "stopped").train(resume=True)

    assert second["step"] == 6 and second["loss"] == full["loss"]
    for name, value in params(straight).items():
        assert torch.equal(resumed_objective.state_dict()[name], value), name
    straight_log = [{k: r[k] for k in ("step", "loss", "lr")} for r in read_log(tmp_path / "straight")]
    resumed_log = [{k: r[k] for k in ("step", "loss", "lr")} for r in read_log(tmp_path / "stopped")]
    assert resumed_log == straight_log


class PaddedCausalLM(nn.Module):
    """GPT-2 next-token loss on packer batches: padding (attention_mask 0) is neither input nor target."""

    def __init__(self, vocab_size: int, max_length: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=vocab_size, n_positions=max_length, n_embd=16, n_layer=1, n_head=2)
        self.model = GPT2LMHeadModel(config)  # dropout 0.1: resume must restore the torch RNG too

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        loss = self.model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        return ObjectiveOutput(loss, int(mask.sum()))


def test_exact_resume_with_a_real_packer(tmp_path):
    from ctxrep.data.corpus import CorpusConfig, pack_corpus
    from ctxrep.data.packing import FullSentencesConfig, FullSentencesPacker
    from ctxrep.data.tokenizer_training import train_tokenizer

    text = tmp_path / "text"
    text.mkdir()
    for d in range(4):
        sentences = [f"Document {d} sentence {s} has {'some ' * (s % 4)}words." for s in range(12)]
        (text / f"doc{d}.txt").write_text("\n".join(sentences) + "\n")
    tokenizer = train_tokenizer(text, "wordpiece", 200, tmp_path / "tok", lowercase=True, min_frequency=1)
    corpus = pack_corpus(text, tmp_path / "tok", tmp_path / "packed", CorpusConfig(num_workers=1), progress=False)

    def packer(interrupt_at_call=None):
        source = FullSentencesPacker(corpus, FullSentencesConfig(max_length=24, seed=3))
        if interrupt_at_call is not None:
            next_batch = source.next_batch

            def interrupting(batch_size):
                packer.calls += 1
                if packer.calls == interrupt_at_call:
                    os.kill(os.getpid(), signal.SIGINT)
                return next_batch(batch_size)

            source.next_batch = interrupting
        return source

    packer.calls = 0
    cfg = config(max_steps=12, batch_size=4, log_every=1)  # 12 steps of 4 sequences: more than one epoch
    objectives = [PaddedCausalLM(tokenizer.vocab_size, 24) for _ in range(2)]
    straight = Trainer(objectives[0], cfg, packer(), tmp_path / "straight").train()
    end = json.loads((tmp_path / "straight" / "checkpoint" / "trainer_state.json").read_text())["data"]
    assert end["epoch"] >= 1  # the run crossed an epoch boundary (a new shuffled plan)
    stopped = Trainer(objectives[1], cfg, packer(interrupt_at_call=5), tmp_path / "stopped").train()
    assert stopped["step"] == 5 and stopped["interrupted"]
    state = json.loads((tmp_path / "stopped" / "checkpoint" / "trainer_state.json").read_text())
    assert state["data"]["kind"] == "full_sentences" and state["data"]["step"] == 5
    torch.manual_seed(12345)  # as a new process would: the checkpoint must bring back the dropout RNG
    resumed = Trainer(objectives[1], cfg, packer(), tmp_path / "stopped").train(resume=True)
    assert resumed["loss"] == straight["loss"]
    for name, value in objectives[0].state_dict().items():
        assert torch.equal(objectives[1].state_dict()[name], value), name


def test_resume_drops_log_records_after_the_checkpoint(tmp_path):
    Trainer(CausalLM(), config(max_steps=3, checkpoint_every=2), Rows(), tmp_path).train()
    # the run ended at step 3 (final checkpoint); fake a crash after step 2's checkpoint by editing the state
    state_file = tmp_path / "checkpoint" / "trainer_state.json"
    assert json.loads(state_file.read_text())["step"] == 3
    log = read_log(tmp_path)
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log + [{"step": 4, "loss": 9.0}]))
    Trainer(CausalLM(), config(max_steps=5, checkpoint_every=2), Rows(), tmp_path).train(resume=True)
    assert [r["step"] for r in read_log(tmp_path)] == [1, 2, 3, 4, 5]
    assert read_log(tmp_path)[3]["loss"] != 9.0


def test_resume_with_another_objective_names_both(tmp_path):
    Trainer(CausalLM(), config(max_steps=1), Rows(), tmp_path).train()
    message = r"objective test_trainer\.CausalLM, but this run trains test_trainer\.OtherLM"
    with pytest.raises(CheckpointError, match=message):
        Trainer(OtherLM(), config(max_steps=2), Rows(), tmp_path).train(resume=True)


def test_resume_with_another_model_shape_names_both_shapes(tmp_path):
    Trainer(CausalLM(n_embd=16), config(max_steps=1), Rows(), tmp_path).train()
    message = r"another model shape.*model\.transformer\.wte\.weight is \(40, 16\) there, \(40, 32\) here"
    with pytest.raises(CheckpointError, match=message):
        Trainer(CausalLM(n_embd=32), config(max_steps=2), Rows(), tmp_path).train(resume=True)


def test_resume_refuses_changed_settings_but_allows_more_steps(tmp_path):
    Trainer(CausalLM(), config(max_steps=1), Rows(), tmp_path).train()
    with pytest.raises(TrainerError, match=r"other training settings \(lr=0\.01 there, 0\.5 here\)"):
        Trainer(CausalLM(), config(max_steps=2, lr=0.5), Rows(), tmp_path).train(resume=True)
    assert Trainer(CausalLM(), config(max_steps=2), Rows(), tmp_path).train(resume=True)["step"] == 2


def test_fresh_run_refuses_to_overwrite_and_resume_needs_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint to resume from.*start the run without resume"):
        Trainer(CausalLM(), config(), Rows(), tmp_path).train(resume=True)
    Trainer(CausalLM(), config(max_steps=1), Rows(), tmp_path).train()
    with pytest.raises(TrainerError, match="already holds a checkpoint; pass resume=True"):
        Trainer(CausalLM(), config(max_steps=1), Rows(), tmp_path).train()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(batch_size=6, accumulation_steps=4), "batch_size=6 does not split into accumulation_steps=4"),
        (dict(schedule="step"), "schedule='step' is unknown; use one of linear, cosine"),
        (dict(max_steps=0), r"max_steps=0 must be greater than 0"),
        (dict(grad_clip=-1.0), r"grad_clip=-1.0 must be 0 or more"),
    ],
)
def test_bad_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(TrainerError, match=message):
        Trainer(CausalLM(), config(**overrides), Rows(), tmp_path)


def test_diverging_loss_stops_with_advice(tmp_path):
    class NaNLoss(CausalLM):
        def forward(self, batch):
            out = super().forward(batch)
            return ObjectiveOutput(out.loss * float("nan"), out.num_tokens)

    with pytest.raises(TrainerError, match="training loss is nan at step 1; lower lr"):
        Trainer(NaNLoss(), config(), Rows(), tmp_path).train()


# ------------------------------------------------------------------------------------------- allocator


def test_tune_malloc_applies_on_glibc_only(monkeypatch):
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    import platform

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert allocator.tune_malloc() is glibc
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert allocator.tune_malloc() is False


def test_tune_malloc_keeps_the_users_choice_and_checks_values(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert allocator.tune_malloc() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(allocator.platform, "system", lambda: "Linux")
    with pytest.raises(ValueError, match=r"trim_threshold=-1 must be between 0 and 2\*\*31 - 1"):
        allocator.tune_malloc(trim_threshold=-1)


# ------------------------------------------------------------------------------------------- plot-run


def test_plot_run_writes_a_png(tmp_path):
    Trainer(CausalLM(), config(max_steps=3, eval_every=1), Rows(), tmp_path, eval_data=Rows(seed=5)).train()
    out = plot_run(tmp_path)
    assert out == tmp_path / "curves.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = CliRunner().invoke(plot_run_command, [str(tmp_path), "--out", str(tmp_path / "x" / "c.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_run_fails_clearly_on_missing_or_empty_or_bad_log(tmp_path):
    runner = CliRunner()
    result = runner.invoke(plot_run_command, [str(tmp_path / "nope")])
    assert result.exit_code == 1 and "error:" in result.output and "nope: no such folder" in result.output
    result = runner.invoke(plot_run_command, [str(tmp_path)])
    assert result.exit_code == 1 and "log.jsonl: no such file" in result.output
    (tmp_path / "log.jsonl").write_text("")
    result = runner.invoke(plot_run_command, [str(tmp_path)])
    assert result.exit_code == 1 and "has no records yet" in result.output
    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n')
    result = runner.invoke(plot_run_command, [str(tmp_path)])
    assert result.exit_code == 1 and "line 2: not JSON" in result.output
    assert not (tmp_path / "curves.png").exists()


class Ballast(CausalLM):
    """CausalLM that holds 256 MiB of touched memory during its third step's forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, batch):
        self.calls += 1
        if self.calls == 3:
            ballast = torch.ones(64 * 1024 * 1024)  # 256 MiB, every page written
            assert float(ballast[-1]) == 1.0
        return super().forward(batch)


def test_the_peak_memory_is_measured_and_logged(tmp_path, capsys):
    """Each log record and the progress lines carry the run's peak memory (the resident set's high-water mark on a
    CPU, reset when the run starts): a step that holds 256 MiB raises it by at least that much."""
    cfg = TrainerConfig(lr=1e-3, max_steps=4, batch_size=4, log_every=1, checkpoint_every=0)
    Trainer(Ballast(), cfg, Rows(), tmp_path / "run", progress="lines").train()
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    peaks = [r["peak_memory_bytes"] for r in records if "loss" in r]
    assert len(peaks) == 4 and peaks == sorted(peaks), peaks  # a high-water mark only rises
    assert peaks[2] - peaks[1] >= 250 * 2**20, peaks
    assert "peak memory=" in capsys.readouterr().err
