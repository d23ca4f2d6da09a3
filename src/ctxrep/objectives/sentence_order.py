"""Sentence-order prediction (Lan et al. 2019, sec. 4.1) with masked-LM: ALBERT's pretraining loss.

NSP's negatives come from another document, so a model can solve NSP by topic alone. SOP takes two consecutive
segments of one document for every example: in order (label 0) or swapped (label 1), so only discourse
coherence tells them apart. The label convention is transformers' AlbertForPreTraining `sentence_order_label`.
The classifier reads ALBERT's pooled output p = tanh(W_p h_[CLS] + b_p):
    logits = W Dropout(p) + b,    L_SOP = -log softmax(logits)[label]
    L = L_MLM + L_SOP             (L_MLM as in ctxrep.objectives.masked_lm: gathered at the selected positions)

`SentenceOrderPacker` makes the pairs from a PackedCorpus like `SegmentPairPacker` (same chunking, targets,
truncation, plan / resume machinery) but never draws B from another document; its batches carry
`sentence_order_label` instead of `next_sentence_label`. `SentenceOrderObjective` is the module the Trainer runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.data.corpus import PackedCorpus
from ctxrep.data.packing import Chunk, SegmentPairConfig, SegmentPairPacker, following_segment, truncate_pair
from ctxrep.models.albert import AlbertConfig, AlbertForPreTraining
from ctxrep.objectives.masked_lm import BatchMasker, MaskedLMConfig, SegmentPairSettings, mlm_loss
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import Built, Ingredients, Packing, Recipe, Shape
from ctxrep.text.tokenizer import Tokenizer

IN_ORDER, SWAPPED = 0, 1


class SentenceOrderPacker(SegmentPairPacker):
    """[CLS] A [SEP] B [SEP] with A, B consecutive segments of one document, swapped half of the time.

    As ALBERT's create_pretraining_data (sentence-order mode): sentences are gathered into a chunk until it reaches
    the target length (max_length - 3, or with probability short_seq_prob a random shorter one); A is the chunk's
    first k sentences (k random), B the rest; with probability 0.5 the two are swapped (label 1). A one-sentence
    chunk takes the document's following sentence as B, or at the document's end is cut in two at a random token;
    a one-token sentence left alone at a document's end is not used. The longer segment is then cut one token at
    a time from a random end until the pair fits. One document is enough (no random segments are drawn).

    Instances: input_ids, token_type_ids, sentence_order_label (0 = in order, 1 = swapped).
    """

    kind = "sentence_order"

    def _check_corpus(self, max_length: int) -> None:
        self._check_length(max_length)  # pairs come from one document: one document is enough

    def _pair(
        self, chunk: Chunk, sent_off: list[int], doc_off: list[int], max_tokens: int, rng: np.random.Generator
    ) -> tuple[tuple[int, ...] | None, int]:
        """(first_start, first_end, second_start, second_end, label): A and B in order or swapped, or None for a
        one-token sentence alone at its document's end; and the sentence the walk goes on after."""
        i = chunk.end
        a = [sent_off[chunk.start], sent_off[chunk.split]]
        b = [sent_off[chunk.split], sent_off[chunk.end + 1]]
        if chunk.end == chunk.start:  # B must come from beyond the one-sentence chunk
            following = following_segment(a, chunk, sent_off, rng)
            if following is None:
                return None, i
            b, i = following
        truncate_pair(a, b, max_tokens, rng)
        swapped = rng.random() < 0.5  # Lan et al. 2019, sec. 4.1: the negative is the same pair swapped
        return ((*b, *a, SWAPPED) if swapped else (*a, *b, IN_ORDER)), i

    def _materialise(self, position: int) -> dict[str, np.ndarray]:
        instance = super()._materialise(position)
        instance["sentence_order_label"] = instance.pop("next_sentence_label")
        return instance

    def _collate(self, instances: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        batch = super()._collate(instances)
        batch["sentence_order_label"] = np.array([x["sentence_order_label"] for x in instances], np.int64)
        return batch


def sentence_order_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (batch, 2) logits against labels (batch,) in {0 = in order, 1 = swapped}."""
    if labels.shape != logits.shape[:1]:
        raise ValueError(
            f"sentence_order_label must have one label per sequence, shape {tuple(logits.shape[:1])}, "
            f"got {tuple(labels.shape)}"
        )
    if bool(((labels != IN_ORDER) & (labels != SWAPPED)).any()):
        raise ValueError(
            f"sentence_order_label must be 0 (A then B) or 1 (swapped), got values {labels.unique().tolist()}"
        )
    return F.cross_entropy(logits.float(), labels.long())


class SentenceOrderObjective(nn.Module):
    """ALBERT + masked-LM head + sentence-order head: loss = L_MLM + L_SOP (Lan et al. 2019, sec. 4.1).

    forward(batch) reads input_ids, attention_mask, token_type_ids and sentence_order_label (SentenceOrderPacker's
    batches); masks with the global torch RNG. word_start: the (vocab,) table of
    `masked_lm.word_start_table(tokenizer)`, needed for whole-word masking (ALBERT used n-gram masking; not here).
    """

    def __init__(
        self, encoder_config: AlbertConfig, mlm: MaskedLMConfig, word_start: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.config = encoder_config
        self.mlm = mlm
        self.masker = BatchMasker(mlm, encoder_config.vocab_size, word_start)
        self.model = AlbertForPreTraining(encoder_config)

    @property
    def encoder(self) -> nn.Module:
        return self.model.albert

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if batch.get("sentence_order_label") is None:
            raise ValueError(
                "the batch has no sentence_order_label: mlm+sop trains on SentenceOrderPacker batches "
                "(ctxrep.objectives.sentence_order), not on NSP pairs or full sentences"
            )
        masked, labels = self.masker(input_ids, attention_mask)
        return self.loss(masked, labels, attention_mask, batch.get("token_type_ids"), batch["sentence_order_label"])

    def loss(
        self,
        masked_input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        sentence_order_label: torch.Tensor,
    ) -> ObjectiveOutput:
        """The loss on an already masked batch (labels: (batch, seq), -100 where not predicted)."""
        if labels.shape != masked_input_ids.shape:
            raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(masked_input_ids.shape)}")
        out = self.model.albert(masked_input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        mlm, logits, targets = mlm_loss(self.model.predictions, out.last_hidden_state, labels)
        sop_logits = self.model.sop_classifier(out.pooler_output)  # (batch, 2)
        sop = sentence_order_loss(sop_logits, sentence_order_label)
        metrics = {
            "mlm_loss": float(mlm.detach()),
            "masked_tokens": float(targets.numel()),
            "sop_loss": float(sop.detach()),
            "sop_accuracy": float((sop_logits.argmax(-1) == sentence_order_label).float().mean()),
        }
        if targets.numel():
            metrics["mlm_accuracy"] = float((logits.argmax(-1) == targets).float().mean())
        return ObjectiveOutput(
            loss=mlm + sop, num_tokens=int(attention_mask.sum()), metrics=metrics, nll=metrics["mlm_loss"]
        )

    def save_pretrained(self, path: str | Path) -> Path:
        """An AlbertForPreTraining folder: transformers' AutoModel and ctxrep's AlbertModel load its encoder."""
        return self.model.save_pretrained(path)


# ------------------------------------------------------------------------------------------------- recipe

# [encoder] keys AlbertConfig takes: BERT's (model_type aside) and the cross-layer sharing.
ALBERT_SHAPE = tuple(f.name for f in dataclasses.fields(Shape) if f.name != "model_type")


def albert_config(x: Ingredients) -> AlbertConfig:
    """[encoder] onto AlbertConfig: E = embedding_size, or min(128, hidden_size) as ALBERT's 128 below H."""
    s = x.shape
    return AlbertConfig(
        vocab_size=x.vocab_size,
        embedding_size=s.embedding_size or min(128, s.hidden_size),
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        intermediate_size=s.intermediate_size,
        hidden_act=s.hidden_act,
        hidden_dropout_prob=s.hidden_dropout_prob,
        attention_probs_dropout_prob=s.attention_probs_dropout_prob,
        max_position_embeddings=s.max_position_embeddings,
        type_vocab_size=s.type_vocab_size,
        layer_norm_eps=s.layer_norm_eps,
        initializer_range=s.initializer_range,
        pad_token_id=x.tokenizer.pad_token_id,
        share=s.share,
    )


def build_sop(x: Ingredients) -> Built:
    masking = x.settings.masking(x.tokenizer, x.seed)
    module = SentenceOrderObjective(albert_config(x), masking, x.settings.word_start(x.tokenizer))
    return Built(module, module.config.max_position_embeddings)


def sentence_order_pairs(corpus: PackedCorpus, tokenizer: Tokenizer, plan: Packing) -> SentenceOrderPacker:
    """ALBERT's pairs: two consecutive segments of one document, in order or swapped (sentence_order_label)."""
    config = SegmentPairConfig(plan.max_length, plan.settings.short_seq_prob, plan.seed, plan.warmup)
    return SentenceOrderPacker(corpus, config, tokenizer)


# ALBERT: masked LM + sentence-order prediction over sentence-order pairs.
SOP = Recipe(
    "mlm+sop",
    build_sop,
    SegmentPairSettings,
    ALBERT_SHAPE,
    tokenizer_kinds=("wordpiece", "bpe"),
    packing=sentence_order_pairs,
)
