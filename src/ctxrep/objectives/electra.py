"""ELECTRA's replaced-token detection (Clark et al. 2020, sec. 2).

A small masked-LM generator G fills the masked positions with tokens sampled from its softmax; the
discriminator D, for every real token of the corrupted sequence x^corrupt, predicts whether it was replaced:
    x^corrupt_i = x^hat_i ~ p_G(x_i | x^masked) for i in M, else x_i
    label_i     = 1[x^corrupt_i != x_i]        (a sample equal to the original counts as original)
    L = L_MLM(x, G) + lambda * L_Disc(x, D),   L_Disc = mean over real tokens of BCE(D(x^corrupt)_i, label_i)
(eq. 1-2; lambda = 50). No gradient flows through the sampling: the generator learns from L_MLM only.

Generator size (sec. 3.2): hidden size, attention heads and intermediate size are the discriminator's times
generator_size_fraction (1/4 works best); the number of layers, vocabulary and positions are the same.
Weight sharing (sec. 3.1): the generator and discriminator share the token, position and segment embeddings
and the embedding LayerNorm (the official code's "electra/embeddings" scope). Both read embeddings of
width embedding_size (the discriminator's); a model whose hidden size differs projects them with its own
embeddings_project, as in the official code and transformers' ElectraModel.

Masking defaults follow the official pretrain_helpers.mask: of the selected 15%, 85% become [MASK] and 15% stay
unchanged (no random tokens). `save_pretrained` writes the discriminator only (ElectraForPreTraining).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models.bert import ACTIVATIONS, BertConfig, BertModel
from ctxrep.models.folders import write_folder
from ctxrep.objectives.masked_lm import (
    BERT_SHAPE,
    IGNORE_INDEX,
    BatchMasker,
    MaskedLMConfig,
    MaskedLMHead,
    MaskingSettings,
    bert_config,
    mlm_loss,
    prefixed_encoder_tensors,
)
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import Built, Ingredients, Recipe, full_sentences


@dataclass
class ElectraObjectiveConfig:
    generator_size_fraction: float = 0.25
    disc_weight: float = 50.0  # lambda of eq. 2
    mlm: MaskedLMConfig = field(default_factory=lambda: MaskedLMConfig(replace_prob=0.85, random_prob=0.0))


def generator_config(discriminator: BertConfig, fraction: float) -> BertConfig:
    """The generator's encoder: hidden, heads and intermediate scaled by `fraction`; same embedding width."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"generator_size_fraction must be in (0, 1], got {fraction}")
    hidden = max(1, round(discriminator.hidden_size * fraction))
    heads = max(1, round(discriminator.num_attention_heads * fraction))
    if hidden % heads:
        raise ValueError(
            f"generator_size_fraction={fraction} gives a generator of hidden size {hidden} with {heads} attention "
            f"heads, which does not divide; pick a fraction that keeps hidden_size a multiple of the heads"
        )
    return replace(
        discriminator,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=max(1, round(discriminator.intermediate_size * fraction)),
        embedding_size=discriminator.embedding_size,
    )


class DiscriminatorHead(nn.Module):
    """logit_i = w^T act(W h_i + b) + c: is token i replaced? (transformers' discriminator_predictions)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (batch, seq, hidden) -> logits (batch, seq)."""
        return self.dense_prediction(self.activation(self.dense(hidden))).squeeze(-1)


def replace_tokens(
    input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted input_ids, is_replaced), both (batch, seq).

    labels: (batch, seq), -100 where not masked; sampled: (n,), the generator's tokens for the n masked
    positions in row-major order. is_replaced = corrupted != original (1 = replaced, as ElectraForPreTraining).
    """
    selected = labels != IGNORE_INDEX  # (batch, seq)
    if sampled.shape != (int(selected.sum()),):
        raise ValueError(
            f"expected one sampled token per masked position ({int(selected.sum())}), got {tuple(sampled.shape)}"
        )
    corrupted = input_ids.clone()
    corrupted[selected] = sampled.to(input_ids.dtype)
    return corrupted, (corrupted != input_ids).long()


def discriminator_loss(logits: torch.Tensor, is_replaced: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy over the real tokens (attention_mask 1), special tokens included (eq. 2)."""
    real = attention_mask.bool()  # (batch, seq)
    return F.binary_cross_entropy_with_logits(logits[real].float(), is_replaced[real].float())


class ElectraObjective(nn.Module):
    """Generator (small masked LM) + discriminator (the encoder being pretrained), sharing embeddings.

    forward(batch) reads input_ids, attention_mask and token_type_ids (optional); masking and sampling use the
    global torch RNG.
    """

    def __init__(
        self, encoder_config: BertConfig, config: ElectraObjectiveConfig, word_start: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        if encoder_config.model_type != "electra":
            raise ValueError(
                f"ElectraObjective needs BertConfig(model_type='electra'), got {encoder_config.model_type!r}"
            )
        if encoder_config.add_pooling_layer:
            raise ValueError("ELECTRA has no pooler: set add_pooling_layer=False in the discriminator's BertConfig")
        self.config = config
        self.encoder_config = encoder_config
        self.masker = BatchMasker(config.mlm, encoder_config.vocab_size, word_start)
        self.discriminator = BertModel(encoder_config)
        self.discriminator_head = DiscriminatorHead(encoder_config)
        self.discriminator_head.apply(self.discriminator._init_weights)
        gen_config = generator_config(encoder_config, config.generator_size_fraction)
        self.generator = BertModel(gen_config)
        # Share the embedding tables and their LayerNorm (one Parameter, two names); each model keeps its own
        # embeddings_project.
        shared, own = self.discriminator.embeddings, self.generator.embeddings
        own.word_embeddings = shared.word_embeddings
        own.position_embeddings = shared.position_embeddings
        own.token_type_embeddings = shared.token_type_embeddings
        own.norm = shared.norm
        self.generator_head = MaskedLMHead(gen_config, shared.word_embeddings)
        for module in (self.generator_head.dense, self.generator_head.norm):  # the decoder is the shared embeddings
            module.apply(self.generator._init_weights)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        token_type_ids = batch.get("token_type_ids")
        masked, labels = self.masker(input_ids, attention_mask)

        gen = self.generator(masked, attention_mask=attention_mask, token_type_ids=token_type_ids)
        gen_loss, gen_logits, targets = mlm_loss(self.generator_head, gen.last_hidden_state, labels)
        with torch.no_grad():  # sampling is not differentiable; the generator learns from L_MLM only
            sampled = torch.multinomial(gen_logits.float().softmax(-1), 1).squeeze(-1)  # (n,)
        corrupted, is_replaced = replace_tokens(input_ids, labels, sampled)

        disc = self.discriminator(corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids)
        disc_logits = self.discriminator_head(disc.last_hidden_state)  # (batch, seq)
        disc_loss = discriminator_loss(disc_logits, is_replaced, attention_mask)
        loss = gen_loss + self.config.disc_weight * disc_loss  # eq. 2

        real = attention_mask.bool()
        metrics = {
            "generator_loss": float(gen_loss.detach()),
            "discriminator_loss": float(disc_loss.detach()),
            "masked_tokens": float(targets.numel()),
            "replaced_tokens": float(is_replaced.sum()),
            "discriminator_accuracy": float(((disc_logits > 0).long() == is_replaced)[real].float().mean()),
        }
        if targets.numel():
            metrics["generator_accuracy"] = float((gen_logits.argmax(-1) == targets).float().mean())
        return ObjectiveOutput(loss=loss, num_tokens=int(real.sum()), metrics=metrics)

    def save_pretrained(self, path: str | Path) -> None:
        """The discriminator as an ElectraForPreTraining folder (the generator is not saved)."""
        tensors = prefixed_encoder_tensors(self.discriminator)
        tensors |= {f"discriminator_predictions.{k}": v for k, v in self.discriminator_head.state_dict().items()}
        hf_config = self.encoder_config.to_hf_dict() | {"architectures": ["ElectraForPreTraining"]}
        write_folder(path, hf_config, tensors)


# ------------------------------------------------------------------------------------------------- recipe


@dataclass
class ElectraSettings(MaskingSettings):
    """[objective] keys of electra: the generator's masking and size, the discriminator's weight."""

    generator_size_fraction: float = 0.25  # generator hidden / heads / intermediate vs discriminator
    disc_weight: float = 50.0  # lambda


def build_electra(x: Ingredients) -> Built:
    s = x.settings
    config = ElectraObjectiveConfig(s.generator_size_fraction, s.disc_weight, s.masking(x.tokenizer, x.seed))
    module = ElectraObjective(bert_config(x, "electra"), config, s.word_start(x.tokenizer))
    return Built(module, module.encoder_config.max_tokens)


# ELECTRA: replaced-token detection over FULL-SENTENCES rows; [encoder] is the discriminator's shape.
ELECTRA = Recipe(
    "electra",
    build_electra,
    ElectraSettings,
    tuple(k for k in BERT_SHAPE if k != "model_type"),
    tokenizer_kinds=("wordpiece", "bpe"),
    packing=full_sentences,
)
