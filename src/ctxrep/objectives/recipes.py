"""The pretraining objectives: one recipe each (objectives/recipe.py), in one explicit table.

`ctxrep pretrain --objective` offers exactly these names, in this order, and the pipeline (train/pretrain.py)
reads everything about an objective from its row. A new objective is one file ending with its `Recipe` and one
line here.
"""

from __future__ import annotations

from ctxrep.objectives.bilm import BILM
from ctxrep.objectives.causal_lm import CLM
from ctxrep.objectives.denoising import DENOISING
from ctxrep.objectives.distill import DISTILL
from ctxrep.objectives.electra import ELECTRA
from ctxrep.objectives.masked_lm import MLM, MLM_NSP
from ctxrep.objectives.names import OBJECTIVES
from ctxrep.objectives.permutation_lm_objective import PLM
from ctxrep.objectives.recipe import PretrainError, Recipe
from ctxrep.objectives.sentence_order import SOP
from ctxrep.objectives.span_corruption import SPAN_CORRUPTION

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        MLM,  # RoBERTa: masked LM, FULL-SENTENCES (masked_lm.py)
        MLM_NSP,  # BERT: masked LM + next-sentence prediction, segment pairs (masked_lm.py)
        SOP,  # ALBERT: masked LM + sentence order, sentence-order pairs (sentence_order.py)
        ELECTRA,  # ELECTRA: replaced-token detection (electra.py)
        CLM,  # GPT: next-token prediction (causal_lm.py)
        PLM,  # XLNet: permutation LM (permutation_lm_objective.py)
        BILM,  # ELMo: forward and backward LSTM LMs over words (bilm.py)
        DISTILL,  # DistilBERT / MiniLM: a student of a teacher (distill.py)
        DENOISING,  # BART: reconstruct documents from text infilling and sentence permutation (denoising.py)
        SPAN_CORRUPTION,  # T5: the dropped spans after their sentinels (span_corruption.py)
    )
}
if tuple(RECIPES) != OBJECTIVES:  # names.py lists them for the CLI without torch
    raise ImportError(f"objectives/names.py lists {OBJECTIVES}, the recipes table {tuple(RECIPES)}: make them equal")


def recipe(name: str) -> Recipe:
    """The recipe of `--objective name`; an unknown name lists the known ones."""
    if name not in RECIPES:
        raise PretrainError(f"objective {name!r} is unknown; use one of {', '.join(OBJECTIVES)}")
    return RECIPES[name]
