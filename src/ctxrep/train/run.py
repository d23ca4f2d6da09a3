"""What `ctxrep pretrain` needs from an objective family to run the shared Trainer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn


@dataclass
class PretrainRun:
    """An objective module (forward(batch) -> ObjectiveOutput), its batch sources (objects with
    next_batch(batch_size) / state_dict() / load_state_dict()), and how to save the downstream model:
    `save_model(out_dir)` writes the folder that ctxrep.load_model (and, where one exists, transformers) loads."""

    objective: nn.Module
    train_data: Any
    eval_data: Any | None
    save_model: Callable[[Path], None]
