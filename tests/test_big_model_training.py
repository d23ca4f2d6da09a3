"""Training big models from the command line (issue 43): --lora, --gradient-checkpointing on finetune,
train-sentence-encoder and pretrain; the memory estimate (train/memory.py) with known answers, and a run that cannot
fit stops before its first step with what to change."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import save_tiny_bert

import ctxrep
from ctxrep.cli import main
from ctxrep.models.adapters import ADAPTER_CONFIG, LoRA, add_lora
from ctxrep.models.loading import load_encoder
from ctxrep.train import trainer as trainer_module
from ctxrep.train.memory import MemoryEstimate, activation_bytes
from ctxrep.train.trainer import ObjectiveOf, Trainer, TrainerConfig, TrainerError

pytestmark = pytest.mark.usefixtures("one_thread")

CSV = "text,label\n" + "".join(f"{t},{y}\n" for t, y in [("good great fine", "pos"), ("bad awful poor", "neg")] * 4)
PAIRS = "text\ttext_pair\n" + "".join(
    f"{a}\t{b}\n"
    for a, b in [
        ("A man plays a guitar .", "Someone plays the guitar ."),
        ("A woman slices an onion .", "An onion is cut ."),
        ("Stocks fell on Monday .", "Markets dropped ."),
        ("The cat sleeps .", "A cat is asleep ."),
    ]
)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


# ---- the commands -------------------------------------------------------------------------------------------------


def test_train_sentence_encoder_with_lora_and_checkpointing(bert, tmp_path):
    (tmp_path / "pairs.tsv").write_text(PAIRS)
    args = ["train-sentence-encoder", "--model", bert, "--train", tmp_path / "pairs.tsv", "--out", tmp_path / "enc"]
    ok(
        run(
            *args,
            "--batch-size",
            4,
            "--max-steps",
            2,
            "--lr",
            1e-2,
            "--lora",
            "--lora-rank",
            4,
            "--gradient-checkpointing",
        )
    )
    config = json.loads((tmp_path / "enc" / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (4, 32.0, 0.05)
    saved = json.loads((tmp_path / "enc" / "ctxrep_sentence_encoder.json").read_text())["params"]
    assert saved["gradient_checkpointing"] is True and saved["lora"]["rank"] == 4
    ok(run("merge", tmp_path / "enc", "--out", tmp_path / "merged"))
    texts = ["A man plays a guitar .", "The cat sleeps ."]
    np.testing.assert_allclose(
        ctxrep.Featurizer(tmp_path / "merged", sentence_pooling="model").embed_sentences(texts),
        ctxrep.Featurizer(tmp_path / "enc", sentence_pooling="model").embed_sentences(texts),
        atol=1e-5,
    )
    lines = run(*args[:-1], tmp_path / "bad", "--lora-targets", "q_proj").output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: LoRA target 'q_proj' is not a projection"), lines


def test_finetune_with_lora_and_predict(bert, tmp_path):
    (tmp_path / "train.csv").write_text(CSV)
    args = ["finetune", "--task", "classify", "--train", tmp_path / "train.csv", "--dev", tmp_path / "train.csv"]
    args += ["--model", bert, "--batch-size", 4, "--lr", 1e-2, "--max-epochs", 1, "--no-progress", "--out", tmp_path]
    ok(run(*args, "--lora", "--lora-targets", "query,value", "--gradient-checkpointing"))
    adapter = json.loads((tmp_path / "model" / "adapter" / ADAPTER_CONFIG).read_text())
    assert len(adapter["target_modules"]) == 4  # query and value of 2 layers, by transformers' names
    assert all(m.endswith(("self.query", "self.value")) for m in adapter["target_modules"])
    (tmp_path / "texts.csv").write_text("text\ngood fine\nawful bad\n")
    ok(run("predict", "--model", tmp_path / "model", "--input", tmp_path / "texts.csv", "--out", tmp_path / "p.csv"))
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 3


def test_pretrain_with_lora_saves_a_plain_folder(corpus, tmp_path):
    import transformers

    out = tmp_path / "run"
    args = ["pretrain", "--objective", "mlm", "--config", "tiny", "--corpus", corpus, "--out", out, "--no-progress"]
    ok(
        run(
            *args, "--max-steps", 3, "--trainer.warmup_steps", 0, "--lora", "--lora-rank", 2, "--gradient-checkpointing"
        )
    )
    record = json.loads((out / "pretrain.json").read_text())
    assert record["lora"]["rank"] == 2 and record["settings"]["trainer"]["gradient_checkpointing"] is True
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert any(".lora_A." in k for k in state["fingerprint"]["shapes"])  # trained as adapters
    model = ctxrep.load_model(out)  # the folder itself: the adapters merged in
    assert not any("lora" in k for k in model.state_dict())
    ids = torch.tensor([[2, 50, 60, 70, 3]])
    with torch.no_grad():
        ours = model(ids).last_hidden_state
        theirs = transformers.AutoModel.from_pretrained(out).eval()(ids).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    result = run(*args, "--max-steps", 4, "--resume")  # without --lora
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(errors) == 1 and "was trained with LoRA" in errors[0], result.output


# ---- the memory estimate ------------------------------------------------------------------------------------------


def test_memory_estimate_known_answers(bert):
    """weights + gradients + AdamW's two float32 moments + Korthikanti et al.'s activations: 34 h bytes per token per
    layer at 16 bits (68 h at 32), or each layer's input (2 h / 4 h) and one whole layer with checkpointing."""
    encoder = load_encoder(bert).model
    n = sum(p.numel() for p in encoder.parameters())
    h, layers, tokens = 32, 2, 100
    full = MemoryEstimate.of(encoder, tokens)
    assert (full.weights, full.gradients, full.optimizer) == (4 * n, 4 * n, 8 * n)
    assert full.activations == tokens * layers * 68 * h
    bf16 = MemoryEstimate.of(encoder, tokens, bf16=True, checkpointing=True)
    assert bf16.activations == tokens * (layers * 2 * h + 34 * h)
    assert activation_bytes(encoder, tokens, False, True) == tokens * (layers * 4 * h + 68 * h)
    sharded = MemoryEstimate.of(encoder, tokens, world_size=4, sharded=True)
    assert (sharded.weights, sharded.optimizer, sharded.activations) == (n, 2 * n, full.activations)
    add_lora(encoder, LoRA(rank=2))
    adapters = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    lora = MemoryEstimate.of(encoder, tokens)
    assert (lora.gradients, lora.optimizer) == (4 * adapters, 8 * adapters) and adapters < n / 50
    assert "AdamW states" in lora.describe() and lora.total == sum(
        (lora.weights, lora.gradients, lora.optimizer, lora.activations)
    )


def test_a_run_that_cannot_fit_stops_before_its_first_step(bert, monkeypatch):
    """The estimate against the memory free now (the weights already in place counted as had), before any step."""
    encoder = load_encoder(bert).model.train()
    before = [p.detach().clone() for p in encoder.parameters()]

    class Batches:
        def next_batch(self, n):
            ids = np.full((n, 16), 5)
            return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    def loss(out, batch):
        return out.last_hidden_state.square().mean()

    class Network(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, batch):
            return self.encoder.encode(batch)

    objective = ObjectiveOf(Network(), loss)
    monkeypatch.setattr(trainer_module, "available", lambda device: 1 << 20)  # 1 MiB free
    trainer = Trainer(objective, TrainerConfig(max_steps=2, batch_size=8, lr=1e-3), Batches(), progress=False)
    with pytest.raises(TrainerError) as e:
        trainer.train()
    message = str(e.value)
    assert "\n" not in message and "before its first step" in message and "gradient checkpointing" in message
    assert "activations" in message and trainer.step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, encoder.parameters()))
    monkeypatch.setattr(trainer_module, "available", lambda device: 1 << 40)
    assert Trainer(objective, TrainerConfig(max_steps=1, batch_size=8), Batches(), progress=False).train()["step"] == 1


def test_docs_scale_shows_the_memory_table_the_script_computes():
    """docs/scale.md's table is benchmarks/memory_table.py's output (the models' configs through the Trainer's
    estimate), not numbers typed in."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("memory_table", root / "benchmarks" / "memory_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (root / "docs" / "scale.md").read_text()
    shown = page.split("<!-- memory table: benchmarks/memory_table.py -->\n")[1].split(
        "\n<!-- end of memory table -->"
    )[0]
    assert shown == script.table()
    assert "| Qwen/Qwen3-Embedding-8B (7.57B) | LoRA r=16 + checkpointing |" in shown
