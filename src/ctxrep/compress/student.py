"""A smaller student encoder built from its teacher, for distillation (objectives/distill.py).

DistilBERT (Sanh et al. 2019, sec. 3) "initialize[s] the student from the teacher by taking one layer out of two":
the student keeps the teacher's embeddings and a subset of its layers, weights copied. Here:

    layers = choose_layers(teacher, num_layers=3)           # spread from the first layer to the last
    layers = choose_layers(teacher, layers=[0, 2, 5])       # any teacher layers, in order
    student = init_student(teacher, layers)                 # same width: embeddings, layers, pooler copied
    student = init_student(teacher, layers, hidden_size=192)  # narrower: fresh weights (nothing fits to copy)

The default choice takes K of the teacher's L layers at round(linspace(0, L - 1, K)): for 12 -> 6 that is
[0, 2, 4, 7, 9, 11], the layers DistilBERT's extraction script copies (one out of two, first and last kept).
Student layer j is then trained against teacher layer layers[j] where a loss compares layers (TinyBERT's mapping
g(j), Jiao et al. 2020, sec. 3.1); a narrower student keeps that mapping for its fresh layers.

A student has the teacher's family, vocabulary, positions, heads per layer and tokenizer; narrower means a smaller
hidden_size (and intermediate_size, by default in the teacher's ratio) with the same number of heads. Teachers
are encoders of models/bert.py (BERT, RoBERTa, ELECTRA); other families are refused in one line.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
from torch import nn

from ctxrep.models.bert import BertConfig, BertModel


def distillable_families() -> list[str]:
    """Model families (config.json's model_type) whose encoders can teach a student here (models/bert.py's)."""
    from ctxrep.models.loading import FAMILIES

    return sorted(name for name, cls in FAMILIES.items() if cls is BertModel)


def check_distillable(encoder: nn.Module) -> BertModel:
    """The encoder itself when it can be distilled; else a one-line ValueError naming the families that can."""
    family = getattr(encoder, "family", type(encoder).__name__)
    if family in distillable_families():
        return encoder
    raise ValueError(
        f"a {family} model cannot be distilled: task-agnostic distillation is implemented for "
        f"{', '.join(distillable_families())} teachers; give one of those as the teacher"
    )


def spread_layers(teacher_layers: int, num_layers: int) -> list[int]:
    """K of L layers at round(linspace(0, L - 1, K)) (12 -> 6: DistilBERT's [0, 2, 4, 7, 9, 11])."""
    return [int(i) for i in np.round(np.linspace(0, teacher_layers - 1, num_layers))]


def choose_layers(teacher: BertModel, num_layers: int | None = None, layers: Sequence[int] | None = None) -> list[int]:
    """The teacher layers the student's layers come from: `layers` as given (checked), or `num_layers` of them
    spread out (`spread_layers`), or half the teacher's layers (rounded up) when neither is given."""
    total = teacher.num_layers
    if layers:
        chosen = [int(i) for i in layers]
        bad = [i for i in chosen if not 0 <= i < total]
        if bad:
            raise ValueError(f"teacher layers {bad} do not exist: the teacher has layers 0..{total - 1}")
        if sorted(set(chosen)) != chosen:
            raise ValueError(f"teacher layers {chosen} must be increasing and distinct (bottom layer first)")
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
    teacher: BertConfig, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
) -> BertConfig:
    """The teacher's config with len(layers) layers; narrower when hidden_size < the teacher's. The student keeps
    the heads its layers had in the teacher (pruned_heads follow their layers); a narrower one has them all."""
    h = hidden_size or teacher.hidden_size
    if h > teacher.hidden_size:
        raise ValueError(
            f"student hidden size {h} is wider than the teacher's {teacher.hidden_size}; give at most "
            f"{teacher.hidden_size} (or 0 for the teacher's width)"
        )
    if h % teacher.num_attention_heads:
        raise ValueError(
            f"student hidden size {h} is not a multiple of the teacher's {teacher.num_attention_heads} attention "
            "heads; a student keeps the teacher's heads, so choose a multiple"
        )
    narrower = h != teacher.hidden_size
    if intermediate_size and not narrower and intermediate_size != teacher.intermediate_size:
        raise ValueError(
            f"student intermediate size {intermediate_size} differs from the teacher's {teacher.intermediate_size}, "
            "but a student of the teacher's width copies its layers; narrow the student too, or leave it out"
        )
    config = copy.deepcopy(teacher)
    config.num_hidden_layers = len(layers)
    if narrower:
        config.hidden_size = h
        config.intermediate_size = intermediate_size or teacher.intermediate_size * h // teacher.hidden_size
        config.embedding_size = h  # fresh embeddings of the student's own width
        config.pruned_heads = {}
    else:
        config.pruned_heads = {
            j: list(teacher.pruned_heads[i]) for j, i in enumerate(layers) if i in teacher.pruned_heads
        }
    config.__post_init__()  # check the new shape as a fresh config would be
    return config


def init_student(
    teacher: BertModel, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
) -> BertModel:
    """A student BertModel: of the teacher's width, its embeddings, layers[j] as layer j and its pooler copied;
    narrower, freshly initialised (the global torch RNG). The teacher is left as it was."""
    teacher = check_distillable(teacher)
    layers = choose_layers(teacher, layers=layers)
    config = student_config(teacher.config, layers, hidden_size, intermediate_size)
    student = BertModel(config)
    if config.hidden_size == teacher.config.hidden_size:
        student.embeddings.load_state_dict(teacher.embeddings.state_dict())  # copies (load_state_dict copies)
        for j, i in enumerate(layers):
            student.layers[j].load_state_dict(teacher.layers[i].state_dict())
        if student.pooler is not None:
            student.pooler.load_state_dict(teacher.pooler.state_dict())
    return student.train(teacher.training)
