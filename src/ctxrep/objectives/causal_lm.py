"""Left-to-right language modelling (Radford et al. 2018, eq. 1; Radford et al. 2019).

    L = -1/N sum_i log P(u_{i+1} | u_1, ..., u_i)
over every real next token; labels are input_ids with padding set to -100, shifted inside GPT2LMHeadModel.
No random draws: the loss is a deterministic function of the batch (and dropout).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ctxrep.models.gpt2 import GPT2Config, GPT2LMHeadModel
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import CORE_SHAPE, Built, Ingredients, Recipe, full_sentences


class CausalLMObjective(nn.Module):
    """GPT2LMHeadModel (head tied to the token embeddings) trained on next-token prediction."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.model = GPT2LMHeadModel(config)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        """batch: input_ids (batch, seq) and attention_mask (batch, seq), padded on the right."""
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected that of input_ids "
                f"{tuple(input_ids.shape)}"
            )
        if input_ids.shape[1] < 2:
            raise ValueError(f"sequences of {input_ids.shape[1]} token have no next token to predict; use >= 2 tokens")
        labels = input_ids.masked_fill(attention_mask == 0, -100)  # padding is never a target
        out = self.model(input_ids, attention_mask=attention_mask, labels=labels)
        nll = float(out.loss.detach())
        return ObjectiveOutput(loss=out.loss, num_tokens=int(attention_mask.sum()), metrics={"lm_loss": nll}, nll=nll)

    def save_pretrained(self, path: str | Path) -> None:
        """A GPT2LMHeadModel folder (AutoModelForCausalLM loads it; ctxrep.load_model loads the decoder)."""
        self.model.save_pretrained(path)


# ------------------------------------------------------------------------------------------------- recipe


def gpt2_config(x: Ingredients) -> GPT2Config:
    """[encoder] onto GPT2Config (GPT-2 keeps its own gelu_new and layer_norm_epsilon), with <s> and </s>."""
    s, backend = x.shape, x.tokenizer.backend
    return GPT2Config(
        vocab_size=x.vocab_size,
        n_positions=s.max_position_embeddings,
        n_embd=s.hidden_size,
        n_layer=s.num_hidden_layers,
        n_head=s.num_attention_heads,
        n_inner=s.intermediate_size,
        resid_pdrop=s.hidden_dropout_prob,
        embd_pdrop=s.hidden_dropout_prob,
        attn_pdrop=s.attention_probs_dropout_prob,
        initializer_range=s.initializer_range,
        bos_token_id=backend.token_to_id("<s>"),
        eos_token_id=backend.token_to_id("</s>"),
        pad_token_id=x.tokenizer.pad_token_id,
    )


def build_clm(x: Ingredients) -> Built:
    config = gpt2_config(x)
    return Built(CausalLMObjective(config), config.n_positions)


# GPT: next-token prediction over FULL-SENTENCES rows, with a byte-level BPE tokenizer.
CLM = Recipe(
    "clm",
    build_clm,
    shape_keys=(*CORE_SHAPE, "attention_probs_dropout_prob", "max_position_embeddings"),
    tokenizer_kinds=("bpe",),
    packing=full_sentences,
)
