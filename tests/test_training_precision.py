"""The training precision (ctxrep.train.precision): "auto" follows the hardware's description, and `ctxrep finetune
--precision` / `ctxrep pretrain --precision` reach the estimator's bf16 and the Trainer's bf16, are printed and are
recorded in what the run saves; bad values fail in one line."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import write_corpus

from ctxrep.cli.finetune import finetune
from ctxrep.cli.pretrain import pretrain
from ctxrep.runtime import hardware
from ctxrep.train import precision as P
from ctxrep.train.trainer import CHECKPOINT_DIR

CSV = "text,label\n" + "good nice great,pos\nbad sad awful,neg\n" * 4
NATIVE = {"avx512_bf16", "avx512f"}, {"amx_bf16"}  # flag sets with native bfloat16
EMULATED = {"avx2", "avx512f"}  # without


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def cpu_with(monkeypatch, flags: set[str]) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda f=frozenset(flags): f)


def test_auto_follows_the_cpu_flags(monkeypatch):
    for flags in NATIVE:
        cpu_with(monkeypatch, flags)
        assert P.resolve_precision("auto", "cpu") == "bf16"
        assert P.resolve_precision("fp32", torch.device("cpu")) == "fp32"  # an explicit choice stays
    cpu_with(monkeypatch, EMULATED)
    assert P.resolve_precision("auto", "cpu") == "fp32"
    assert P.resolve_precision("bf16", "cpu") == "bf16"  # allowed, only slower
    assert P.resolve_precision("auto", "meta") == "fp32"  # neither a CPU nor a GPU with bf16
    assert P.describe("bf16", "auto") == "precision: bf16 autocast (float32 weights and optimizer) (auto: this " + (
        "device multiplies bfloat16 natively)"
    )
    assert P.describe("fp32", "fp32") == "precision: float32"


@pytest.mark.parametrize("bad", ["fp16", "int8", "BF16", ""])
def test_bad_values_fail_in_one_line(bad):
    with pytest.raises(ValueError, match="use fp32 .*, bf16 .* or auto") as e:
        P.resolve_precision(bad, "cpu")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="device must name a torch device"):
        P.resolve_precision("auto", "gpu")


def cli_error(command, args) -> str:
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_the_commands_refuse_bad_values_in_one_line(tmp_path):
    common = ["--out", str(tmp_path / "out"), "--precision", "fp16"]
    line = cli_error(finetune, ["--task", "classify", "--train", "x.csv", "--dev", "x.csv", *common])
    assert "'fp16' is not one of 'fp32', 'bf16', 'auto'" in line
    line = cli_error(pretrain, ["--objective", "mlm", "--corpus", "x", *common])
    assert "'fp16' is not one of 'fp32', 'bf16', 'auto'" in line


# ---- ctxrep finetune ----------------------------------------------------------------------------------------


def run_finetune(tiny_models, tmp_path, name: str, *extra: str) -> tuple[str, dict, dict]:
    """(printed output, metrics.json, the saved model's parameters) of a one-step fine-tuning run."""
    train = tmp_path / "train.csv"
    train.write_text(CSV)
    out = tmp_path / name
    args = ["--task", "classify", "--train", str(train), "--dev", str(train), "--model", str(tiny_models["bert"])]
    args += ["--max-steps", "1", "--batch-size", "4", "--no-progress", "--out", str(out), *extra]
    result = CliRunner().invoke(finetune, args)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    saved = json.loads((out / "model" / "config.json").read_text())
    return result.output, metrics, saved


def test_finetune_precision_reaches_the_estimator_and_is_recorded(tiny_models, tmp_path, monkeypatch):
    from ctxrep.train import trainer

    seen = []
    original = trainer.bf16_autocast

    def recording(device_type: str, enabled: bool):
        seen.append(enabled)
        return original(device_type, enabled)

    monkeypatch.setattr(trainer, "bf16_autocast", recording)  # the training step's autocast
    cpu_with(monkeypatch, EMULATED)
    output, metrics, saved = run_finetune(tiny_models, tmp_path, "bf16", "--precision", "bf16")
    assert "precision: bf16 autocast" in output and "auto:" not in output
    assert metrics["precision"] == "bf16" and metrics["params"]["bf16"] is True and seen == [True]
    assert json.dumps(saved).count('"bf16": true') == 1  # the saved estimator predicts under bf16 autocast too

    seen.clear()
    output, metrics, _ = run_finetune(tiny_models, tmp_path, "auto-emulated", "--precision", "auto")
    assert "precision: float32 (auto: no native bfloat16" in output
    assert metrics["precision"] == "fp32" and metrics["params"]["bf16"] is False and seen == [False]

    cpu_with(monkeypatch, NATIVE[1])
    seen.clear()
    output, metrics, _ = run_finetune(tiny_models, tmp_path, "auto-amx", "--precision", "auto")
    assert "precision: bf16 autocast (float32 weights and optimizer) (auto: this device" in output
    assert metrics["precision"] == "bf16" and seen == [True]


def test_finetune_default_is_the_modules_default(tiny_models, tmp_path, monkeypatch):
    cpu_with(monkeypatch, NATIVE[0])
    _, metrics, _ = run_finetune(tiny_models, tmp_path, "default")
    assert metrics["precision"] == P.resolve_precision(P.DEFAULT_PRECISION, "cpu")


# ---- ctxrep pretrain ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "text")


def run_pretrain(corpus, out, *extra: str, code: int = 0) -> str:
    args = ["--objective", "mlm", "--config", "tiny", "--corpus", str(corpus), "--out", str(out), "--no-progress"]
    args += ["--trainer.warmup_steps", "0"]
    result = CliRunner().invoke(pretrain, [*args, *extra])
    assert result.exit_code == code, result.output
    return result.output


def saved_bf16(out) -> tuple[str, bool]:
    """(pretrain.json's precision, the checkpoint's TrainerConfig.bf16)."""
    record = json.loads((out / "pretrain.json").read_text())
    state = json.loads((out / CHECKPOINT_DIR / "trainer_state.json").read_text())
    assert record["settings"]["trainer"]["bf16"] == state["config"]["bf16"]
    return record["precision"], state["config"]["bf16"]


def test_pretrain_precision_reaches_the_trainer_and_resume_keeps_autos_choice(corpus, tmp_path, monkeypatch):
    cpu_with(monkeypatch, NATIVE[1])
    output = run_pretrain(corpus, tmp_path / "auto", "--precision", "auto", "--max-steps", "1")
    assert "precision: bf16 autocast (float32 weights and optimizer) (auto:" in output
    assert saved_bf16(tmp_path / "auto") == ("bf16", True)
    cpu_with(monkeypatch, EMULATED)  # resumed on a machine without bf16: auto keeps the run's choice
    output = run_pretrain(corpus, tmp_path / "auto", "--resume", "--max-steps", "2")
    assert "precision: bf16 autocast" in output and "step 2" in output

    output = run_pretrain(corpus, tmp_path / "emulated", "--max-steps", "1")  # the default, auto here -> fp32
    assert saved_bf16(tmp_path / "emulated") == ("fp32", False)  # auto and fp32 alike without native bfloat16
    output = run_pretrain(corpus, tmp_path / "bf16", "--precision", "bf16", "--max-steps", "1")
    assert "precision: bf16 autocast" in output and "auto:" not in output
    assert saved_bf16(tmp_path / "bf16") == ("bf16", True)


def test_pretrain_takes_the_configs_bf16_and_refuses_both(corpus, tmp_path, monkeypatch):
    cpu_with(monkeypatch, NATIVE[0])
    output = run_pretrain(corpus, tmp_path / "config", "--trainer.bf16", "false", "--max-steps", "1")
    assert "precision: float32" in output and saved_bf16(tmp_path / "config") == ("fp32", False)
    output = run_pretrain(
        corpus, tmp_path / "both", "--precision", "bf16", "--trainer.bf16", "false", "--max-steps", "1", code=2
    )
    assert "--precision and --trainer.bf16 both set the precision" in output
    assert not (tmp_path / "both").exists()
