"""A smaller student encoder built from its teacher, for distillation (objectives/distill.py, compress/).

DistilBERT (Sanh et al. 2019, sec. 3) "initialize[s] the student from the teacher by taking one layer out of two":
the student keeps the teacher's embeddings and a subset of its layers, weights copied. Here:

    layers = choose_layers(teacher, num_layers=3)           # spread from the first layer to the last
    layers = choose_layers(teacher, layers=[0, 2, 5])       # any teacher layers, in order
    student = init_student(teacher, layers)                 # same width: embeddings, layers (and pooler) copied
    student = init_student(teacher, layers, hidden_size=192)  # narrower: fresh weights (nothing fits to copy)

The default choice takes K of the teacher's L layers at round(linspace(0, L - 1, K)): for 12 -> 6 that is
[0, 2, 4, 7, 9, 11], the layers DistilBERT's extraction script copies (one out of two, first and last kept).
Student layer j is then trained against teacher layer layers[j] where a loss compares layers (TinyBERT's mapping
g(j), Jiao et al. 2020, sec. 3.1); a narrower student keeps that mapping for its fresh layers.

A student has the teacher's family, vocabulary, positions, heads per layer and tokenizer; narrower means a smaller
hidden size (and intermediate size, by default in the teacher's ratio) with the same number of heads. The family
builds it (`Encoder.init_student`, for families with `can_distill`: BERT, RoBERTa, ELECTRA, GPT-2, XLNet); the
others are refused in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn

from ctxrep.models.encoder import Encoder, check_student_layers


def distillable_families() -> list[str]:
    """Model families (config.json's model_type) whose encoders can build a student (`can_distill`)."""
    from ctxrep.models.loading import FAMILIES

    return sorted(name for name, cls in FAMILIES.items() if cls.can_distill)


def check_distillable(encoder: nn.Module) -> Encoder:
    """The encoder itself when it can build a student; else a one-line ValueError naming the families that can."""
    if getattr(encoder, "can_distill", False):
        return encoder
    family = getattr(encoder, "family", type(encoder).__name__)
    raise ValueError(
        f"a {family} model cannot be distilled: students are built from {', '.join(distillable_families())} "
        "teachers; give one of those as the teacher"
    )


def spread_layers(teacher_layers: int, num_layers: int) -> list[int]:
    """K of L layers at round(linspace(0, L - 1, K)) (12 -> 6: DistilBERT's [0, 2, 4, 7, 9, 11])."""
    return [int(i) for i in np.round(np.linspace(0, teacher_layers - 1, num_layers))]


def choose_layers(teacher: Encoder, num_layers: int | None = None, layers: Sequence[int] | None = None) -> list[int]:
    """The teacher layers the student's layers come from: `layers` as given (checked), or `num_layers` of them
    spread out (`spread_layers`), or half the teacher's layers (rounded up) when neither is given."""
    total = teacher.num_layers
    if layers:
        chosen = check_student_layers(layers, total)
        if num_layers and num_layers != len(chosen):
            raise ValueError(
                f"student layers {num_layers} but {len(chosen)} teacher layers {chosen} were named; give one of the two"
            )
        return chosen
    k = num_layers if num_layers else -(-total // 2)
    if k < 1:
        raise ValueError(f"student layers must be at least 1, got {k}")
    if k > total:
        raise ValueError(
            f"student layers {k} is larger than the teacher's {total} layers; a student has at most as many layers "
            "as its teacher"
        )
    return spread_layers(total, k)


def student_config(
    teacher_config, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
):
    """The student's config from the teacher's config alone (its family's `student` rule): len(layers) layers,
    narrower when hidden_size is smaller than the teacher's."""
    return teacher_config.student(layers, hidden_size, intermediate_size)


def init_student(
    teacher: Encoder, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
) -> Encoder:
    """A student of the teacher's family (`teacher.init_student`): of the teacher's width, its embeddings and
    layers[j] as layer j copied; narrower, freshly initialised (the global torch RNG). The teacher is left as it was."""
    return check_distillable(teacher).init_student(
        choose_layers(teacher, layers=layers), hidden_size or None, intermediate_size
    )


__all__ = [
    "check_distillable",
    "choose_layers",
    "distillable_families",
    "init_student",
    "spread_layers",
    "student_config",
]
