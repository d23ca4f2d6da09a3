"""Sharded data parallelism (FSDP2's fully_shard) on the one training loop: 2 CPU processes under torchrun (gloo)
give the losses and weights of one process over the same global batches (1e-5, float32) for pretraining, a sentence
encoder with LoRA and activation checkpointing, and a task estimator; a sharded checkpoint resumes exactly and the
final save is one ordinary folder. FSDP asked without torchrun is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import save_tiny_bert
from safetensors.torch import load_file
from test_distributed import torchrun

from ctxrep.train.trainer import Trainer, TrainerConfig, TrainerError

WORKER = Path(__file__).with_name("_fsdp_worker.py")


def losses(log: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in log.read_text().splitlines() if '"loss"' in line]


def test_two_sharded_processes_equal_one_process(tmp_path):
    import _fsdp_worker as worker

    bert = save_tiny_bert(tmp_path / "bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    out = tmp_path / "fsdp"
    out.mkdir()
    torchrun(WORKER, out, bert, timeout=300)
    result = json.loads((out / "result.json").read_text())

    # pretraining: the same losses step by step and the same weights, saved as one ordinary file of whole tensors
    worker.pretraining(tmp_path / "single", fsdp=False)
    assert losses(out / "whole" / "log.jsonl") == pytest.approx(losses(tmp_path / "single" / "log.jsonl"), abs=1e-5)
    sharded, single = (
        load_file(out / "whole" / "model.safetensors"),
        load_file(tmp_path / "single" / "model.safetensors"),
    )
    assert sharded.keys() == single.keys()
    for name in single:
        torch.testing.assert_close(sharded[name], single[name], atol=1e-5, rtol=0)
    checkpoint = out / "whole" / "checkpoint"
    assert (checkpoint / "sharded" / ".metadata").is_file() and not (checkpoint / "model.safetensors").exists()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["sharded"] is True
    # stopped after step 2 (a sharded checkpoint), resumed to step 3: the run that never stopped, exactly
    assert result["stopped"]["interrupted"] and result["stopped"]["step"] == 2
    resumed = load_file(out / "resumed" / "model.safetensors")
    for name in sharded:
        torch.testing.assert_close(resumed[name], sharded[name], atol=0, rtol=0)

    # a sentence encoder with LoRA and checkpointing: each process embeds half of a batch's texts
    history, weights = worker.sentence(str(bert), fsdp=False)
    got = load_file(out / "sentence.safetensors")
    assert [h["train_loss"] for h in result["sentence"]] == pytest.approx([h["train_loss"] for h in history], abs=1e-5)
    assert got.keys() == weights.keys() and any("lora_B" in k for k in got)
    for name in weights:
        torch.testing.assert_close(got[name], weights[name], atol=1e-5, rtol=0)

    # a task estimator, every weight trained, its dev score after each epoch computed by both processes
    history, weights = worker.classifier(str(bert), fsdp=False)
    got = load_file(out / "classifier.safetensors")
    for ours, theirs in zip(result["classifier"], history):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], abs=1e-5)
        assert ours["dev_score"] == theirs["dev_score"]
    for name in weights:
        torch.testing.assert_close(got[name], weights[name], atol=1e-5, rtol=0)


def test_fsdp_without_torchrun_is_refused_in_one_line(tmp_path, monkeypatch):
    from _ddp_worker import CausalLM, Rows

    from ctxrep.cli import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(TrainerError) as e:
        Trainer(CausalLM(), TrainerConfig(fsdp=True, max_steps=1, batch_size=2), Rows())
    assert "\n" not in str(e.value) and "launch with torchrun --nproc_per_node N" in str(e.value)
    (tmp_path / "pairs.tsv").write_text("text\ttext_pair\na b\tc d\ne f\tg h\n")
    result = CliRunner().invoke(
        main, ["train-sentence-encoder", "--train", str(tmp_path / "pairs.tsv"), "--out", str(tmp_path / "o"), "--fsdp"]
    )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: --fsdp shards training between the processes torchrun starts"), lines


def test_cached_negatives_under_torchrun_are_refused(tmp_path, monkeypatch):
    """GradCache back-propagates inside the loss's backward, which DDP and FSDP cannot share out: one line."""
    from ctxrep.tasks import SentenceEncoder
    from ctxrep.train import distributed

    monkeypatch.setattr(distributed, "current", lambda: distributed.Distributed(rank=0, world_size=2))
    enc = SentenceEncoder(tmp_path / "not-read", batch_size=4, mini_batch_size=2)
    with pytest.raises(ValueError, match="mini_batch_size .cached negatives. back-propagates inside") as e:
        enc.fit([("a b", "c d"), ("e f", "g h")])
    assert "\n" not in str(e.value)
