"""Run by tests/test_distributed.py under torchrun (2 CPU processes); also gives it the single-process reference.

python -m torch.distributed.run --nproc_per_node 2 tests/_ddp_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from ctxrep.models.gpt2 import GPT2Config, GPT2LMHeadModel
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.train import distributed
from ctxrep.train.trainer import Trainer, TrainerConfig

VOCAB, LENGTH = 40, 8
CONFIG = TrainerConfig(
    lr=1e-2,
    eps=1e-3,
    max_steps=3,
    batch_size=8,
    accumulation_steps=2,
    grad_clip=0.5,
    warmup_steps=1,
    log_every=1,
    checkpoint_every=2,
)


class CausalLM(nn.Module):
    """GPT-2 next-token loss without dropout: every process computes exactly what a single one would."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=LENGTH,
            n_embd=16,
            n_layer=2,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        self.model = GPT2LMHeadModel(config)
        self.rows_seen: list[list[int]] = []  # the rows this process trained on

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        ids = batch["input_ids"]
        self.rows_seen += ids.tolist()
        return ObjectiveOutput(self.model(ids, labels=ids).loss, ids.numel())


class Rows:
    """Row i is a fixed function of i: every process draws the same global batches."""

    def __init__(self) -> None:
        self.position = 0

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        stream = range(self.position, self.position + batch_size)
        rows = [np.random.default_rng([7, i]).integers(0, VOCAB, LENGTH) for i in stream]
        self.position += batch_size
        return {"input_ids": np.stack(rows)}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def train(out_dir: Path) -> tuple[dict, dict[str, torch.Tensor], list[list[int]]]:
    objective = CausalLM()
    result = Trainer(objective, CONFIG, Rows(), out_dir).train()
    params = {k: v.detach().clone().contiguous() for k, v in objective.state_dict().items()}
    return result, params, objective.rows_seen


if __name__ == "__main__":
    torch.set_num_threads(1)
    ctx = distributed.init_distributed()
    out = Path(sys.argv[1])
    result, params, rows = train(out)
    (out / f"rows-rank{ctx.rank}.json").write_text(json.dumps(rows))
    if ctx.is_main:
        params.pop("model.lm_head.weight")  # tied to wte: safetensors stores a tensor once
        save_file(params, str(out / "params.safetensors"))
        (out / "result.json").write_text(json.dumps({**result, "world_size": ctx.world_size}))
    distributed.shutdown()
