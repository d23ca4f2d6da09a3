"""Run by tests/test_fsdp.py under torchrun (2 CPU processes, gloo) with FSDP; also gives it the single-process runs.

python -m torch.distributed.run --nproc_per_node 2 tests/_fsdp_worker.py OUT_DIR TINY_BERT_DIR

Three trainers on the one loop, each over the same global batches in one process and in two sharded ones:
  pretraining   the GPT-2 next-token objective of tests/_ddp_worker.py (accumulation, clipping, warm-up) with a
                parameter the loss never reads; and the same run stopped after step 2 (its sharded checkpoint) and
                resumed to step 3
  sentence      SentenceEncoder mnrl with LoRA adapters and activation checkpointing (each process embeds half of
                every batch's texts; the loss reads both halves)
  classifier    SequenceClassifier fine-tuning every weight, with a dev score after each epoch (every process runs it,
                on the sharded model itself even where a large call would compile a copy)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from _ddp_worker import CONFIG, CausalLM, Rows
from safetensors.torch import save_file

from ctxrep.train import distributed
from ctxrep.train.trainer import Trainer

PAIRS = [
    ("A man is playing a guitar .", "Someone plays the guitar ."),
    ("A woman slices an onion .", "An onion is being cut by a woman ."),
    ("Stocks fell sharply on Monday .", "Markets dropped at the start of the week ."),
    ("The cat sleeps on the sofa .", "A cat is asleep on a couch ."),
    ("Two dogs run in a field .", "Dogs are running across the grass ."),
    ("The train left the station late .", "The train departed behind schedule ."),
    ("A child reads a book .", "A kid is reading ."),
    ("The sun sets over the sea .", "Sunset at the beach ."),
]
X_CLS = ["good great fine nice", "bad awful poor sad", "fine nice good", "poor sad bad awful"] * 2
Y_CLS = ["pos", "neg", "pos", "neg"] * 2


def plain(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}


def pretraining(out: Path, fsdp: bool, stop_at: int | None = None, resume: bool = False) -> dict:
    objective = CausalLM()
    objective.unused = torch.nn.Linear(4, 4)  # never in the loss (as a pooler without NSP): no gradient, no AdamW state

    def save(folder: Path) -> None:  # the model folder: one ordinary file of whole tensors
        tensors = plain(objective)
        tensors.pop("model.lm_head.weight")  # tied to wte
        del tensors["unused.weight"], tensors["unused.bias"]
        save_file(tensors, str(folder / "model.safetensors"))

    trainer = Trainer(objective, dataclasses.replace(CONFIG, fsdp=fsdp), Rows(), out, save_model=save)
    if stop_at is not None:  # as a Ctrl-C after that step: the checkpoint is written and train() returns
        trainer._should_stop = lambda: trainer.step == stop_at
    return trainer.train(resume=resume)


def sentence(bert: str, fsdp: bool) -> tuple[list, dict]:
    from ctxrep.models.adapters import LoRA
    from ctxrep.tasks import SentenceEncoder

    enc = SentenceEncoder(
        bert,
        batch_size=4,
        max_steps=3,
        lr=1e-2,
        random_state=0,
        lora=LoRA(rank=2, dropout=0.0),
        gradient_checkpointing=True,
        fsdp=fsdp,
    ).fit(PAIRS)
    return enc.history_, plain(enc.backbone_.model)


def classifier(bert: str, fsdp: bool) -> tuple[list, dict]:
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier(bert, max_epochs=2, batch_size=4, lr=1e-3, dropout=0.0, random_state=0, fsdp=fsdp)
    clf.fit(X_CLS, Y_CLS, eval_set=(X_CLS[:4], Y_CLS[:4]))
    return clf.history_, plain(clf.model_)


if __name__ == "__main__":
    torch.set_num_threads(1)
    ctx = distributed.init_distributed()
    out, bert = Path(sys.argv[1]), sys.argv[2]
    pretraining(out / "whole", fsdp=True)
    stopped = pretraining(out / "resumed", fsdp=True, stop_at=2)
    pretraining(out / "resumed", fsdp=True, resume=True)
    sentence_history, sentence_weights = sentence(bert, fsdp=True)
    from ctxrep.runtime import fast

    fast.worth_compiling = lambda *args: True  # the dev score's forward would compile a copy: not of a sharded model
    classifier_history, classifier_weights = classifier(bert, fsdp=True)
    if ctx.is_main:
        save_file(sentence_weights, str(out / "sentence.safetensors"))
        save_file(classifier_weights, str(out / "classifier.safetensors"))
        record = {"stopped": stopped, "sentence": sentence_history, "classifier": classifier_history}
        (out / "result.json").write_text(json.dumps(record, default=str))
    distributed.shutdown()
