"""XLNet's permutation language modelling as a trainer objective (Yang et al. 2019, sec. 2.2-2.3).

For each sequence a factorization order z is sampled (`sample_permutation_lm_batch`: special tokens first,
then the context, then the last 1/K of the order as targets), and the query stream predicts the targets:
    L = -1/|T| sum_{t in T} log p(x_{z_t} | x_{z_<t})        (T = the targets of the whole batch)
The order only shapes perm_mask and target_mapping; the input is never permuted. Draws use the global
torch RNG, so the trainer's exact resume covers them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ctxrep.models.xlnet import XLNetConfig, XLNetLMHeadModel
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.permutation_lm import PermutationLMConfig, sample_permutation_lm_batch


class PermutationLMObjective(nn.Module):
    """XLNetLMHeadModel (head tied to the word embeddings) trained on permutation LM.

    special_token_ids: the tokenizer's special tokens (<sep>, <cls>, ...), never predicted and seen by all.
    """

    def __init__(self, config: XLNetConfig, plm: PermutationLMConfig, special_token_ids: tuple[int, ...] = ()) -> None:
        super().__init__()
        if plm.k < 1:
            raise ValueError(f"k={plm.k} must be at least 1 (predict the last 1/k of each factorization order)")
        self.config = config
        self.plm = plm
        self.model = XLNetLMHeadModel(config)
        self.register_buffer("special_ids", torch.tensor(sorted(special_token_ids), dtype=torch.long), persistent=False)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        """batch: input_ids (batch, seq) and attention_mask (batch, seq), padded on the right."""
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        special = torch.isin(input_ids, self.special_ids)  # (batch, seq)
        sampled = sample_permutation_lm_batch(input_ids, self.plm, attention_mask, special)
        out = self.model(**sampled.model_inputs())
        predicted = sampled.labels != -100  # (batch, num_predict)
        metrics = {"plm_loss": float(out.loss.detach()), "predicted_tokens": float(predicted.sum())}
        if bool(predicted.any()):
            hits = out.logits.argmax(-1) == sampled.labels  # (batch, num_predict)
            metrics["plm_accuracy"] = float(hits[predicted].float().mean())
        return ObjectiveOutput(
            loss=out.loss, num_tokens=int(attention_mask.sum()), metrics=metrics, nll=metrics["plm_loss"]
        )

    def save_pretrained(self, path: str | Path) -> None:
        """An XLNetLMHeadModel folder (transformers' AutoModel and ctxrep.load_model load the encoder)."""
        self.model.save_pretrained(path)
