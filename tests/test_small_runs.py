"""Small pretraining runs behave: a warm-up longer than the run warns and names the option to change, the progress
bar can be silenced, and resuming with another max_steps says (truthfully) what happens to the schedule."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.train.trainer import Trainer, TrainerConfig


class Regression(nn.Module):
    """The smallest objective: a linear layer fitting a fixed target."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        x = batch["x"]
        loss = (self.linear(x).squeeze(-1) - x.sum(-1)).pow(2).mean()
        return ObjectiveOutput(loss, len(x), {})


class Rows:
    def __init__(self) -> None:
        self.position = 0

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        stream = range(self.position, self.position + batch_size)
        rows = [np.random.default_rng(i).standard_normal(4).astype(np.float32) for i in stream]
        self.position += batch_size
        return {"x": np.stack(rows)}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def config(**overrides) -> TrainerConfig:
    return TrainerConfig(
        **({"lr": 1e-2, "max_steps": 4, "batch_size": 2, "log_every": 1, "checkpoint_every": 0} | overrides)
    )


def test_a_warm_up_longer_than_the_run_warns_and_names_an_option_that_exists(tmp_path):
    """The README's `pretrain --config small --max-steps 30` kept small.toml's warmup_steps = 1000: the learning
    rate never got above 2.9% of its peak."""
    from ctxrep.train.pretrain_config import load_config

    with pytest.warns(
        UserWarning,
        match=r"the warm-up \(1000 steps\) is as long as the run \(30 optimizer steps\) or longer: the "
        r"learning rate never gets above 2\.9% of lr=0\.01",
    ) as record:
        Trainer(Regression(), config(warmup_steps=1000, max_steps=30), Rows(), tmp_path / "a", progress=False).train()
    message = str(record[0].message)
    suggested = re.search(r"e\.g\. --(\S+) (\d+) on `ctxrep pretrain`", message)
    assert suggested.groups() == ("trainer.warmup_steps", "3")
    # the option it names is one `ctxrep pretrain` accepts, with the value it suggests
    assert load_config("small", [(suggested[1], suggested[2])], "mlm").trainer.warmup_steps == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(Regression(), config(warmup_steps=3, max_steps=30), Rows(), tmp_path / "b", progress=False).train()
        Trainer(
            Regression(), config(max_steps=30), Rows(), tmp_path / "c", progress=False, schedule=lambda step: 1.0
        ).train()


def test_no_progress_silences_the_bar(tmp_path, capsys):
    Trainer(Regression(), config(), Rows(), tmp_path / "quiet", progress=False).train()
    assert "train" not in capsys.readouterr().err
    Trainer(Regression(), config(), Rows(), tmp_path / "loud").train()
    assert "(100%)" in capsys.readouterr().err  # a plain line when stderr is not a terminal (util.progress)


def test_resuming_with_more_steps_says_what_the_schedule_does_and_does_it(tmp_path, capsys):
    out = tmp_path / "run"
    Trainer(Regression(), config(max_steps=4, warmup_steps=2), Rows(), out, progress=False).train()
    capsys.readouterr()
    Trainer(Regression(), config(max_steps=8, warmup_steps=2), Rows(), out, progress=False).train(resume=True)
    note = capsys.readouterr().out.strip().splitlines()
    assert note[0] == (
        "resuming at step 4 with max_steps=8 (was 4): the linear decay now ends at step 8 instead of 4 (warm-up "
        "unchanged, 2 steps); the learning rate at step 4 is 0.667 x lr (it was 0 x lr)"
    )
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if "lr" in r}
    # step N's record holds the rate it trained with, warmup_decay(N - 1): the new schedule from the first resumed
    # step on (without resetting it, step 5 would have trained at the finished run's 0)
    assert lrs[5] == pytest.approx(1e-2 * (1 - 2 / 6)) and lrs[8] == pytest.approx(1e-2 * (1 - 5 / 6))
    assert lrs[4] == pytest.approx(1e-2 * (1 - 1 / 2))  # the first run's schedule, untouched
    Trainer(Regression(), config(max_steps=6, warmup_steps=2), Rows(), out, progress=False).train(resume=True)
    assert "already at step 8, so nothing is trained; raise --max-steps" in capsys.readouterr().out


def test_resuming_with_the_same_max_steps_says_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    Trainer(Regression(), config(max_steps=4, checkpoint_every=2), Rows(), out, progress=False).train()
    capsys.readouterr()
    Trainer(Regression(), config(max_steps=4, checkpoint_every=2), Rows(), out, progress=False).train(resume=True)
    assert "resuming" not in capsys.readouterr().out
