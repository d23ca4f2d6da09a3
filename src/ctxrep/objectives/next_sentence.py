"""Next-sentence prediction (Devlin et al. 2019, sec. 3.1 Task #2).

Given "[CLS] A [SEP] B [SEP]", classify whether B follows A (IsNext, label 0) or is a random segment
(NotNext, label 1): the label convention of transformers' BertForPreTraining and of SegmentPairPacker.
The classifier reads BertModel's pooled output p = tanh(W_p h_[CLS] + b_p):
    logits = W p + b,   L_NSP = -log softmax(logits)[label]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models.bert import BertConfig

IS_NEXT, NOT_NEXT = 0, 1


class NextSentenceHead(nn.Module):
    """logits = W pooled + b over (IsNext, NotNext); transformers' cls.seq_relationship."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled: (batch, hidden) -> logits (batch, 2)."""
        if pooled is None:
            raise ValueError("next-sentence prediction needs the pooled [CLS] vector: build BertModel with a pooler")
        return self.seq_relationship(pooled)


def next_sentence_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (batch, 2) logits against labels (batch,) in {0 = IsNext, 1 = NotNext}."""
    if labels.shape != logits.shape[:1]:
        raise ValueError(
            f"next_sentence_label must have one label per sequence, shape {tuple(logits.shape[:1])}, "
            f"got {tuple(labels.shape)}"
        )
    if bool(((labels != IS_NEXT) & (labels != NOT_NEXT)).any()):
        raise ValueError(
            f"next_sentence_label must be 0 (B follows A) or 1 (B is random), got values {labels.unique().tolist()}"
        )
    return F.cross_entropy(logits.float(), labels.long())
