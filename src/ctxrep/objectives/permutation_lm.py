"""XLNet's permutation language modelling objective (Yang et al. 2019, sec. 2.2-2.3 and 3.1).

For each sequence, sample a factorization order z (a permutation of the real positions) and maximise
    sum_{t > c} log p(x_{z_t} | x_{z_<t})                       (partial prediction, sec. 2.3)
Only the last 1/K of the order is predicted (partial prediction: |z| - c = ceil(n / K) targets), so most
tokens are context. The order is never applied to the input: it only decides who may attend to whom,
through two tensors that XLNetModel takes:

    perm_mask[b, i, j] = 1   position i may NOT attend to position j    (batch, seq, seq)
                             (query stream: j must come strictly before i in z; the content stream may also
                             see i itself, which XLNetModel adds)
    target_mapping[b, m, i] = 1   prediction m is of position i        (batch, num_predict, seq)

Padding and special tokens (<sep>, <cls>) are never predicted: special tokens go first in the order, so every
position may see them; padding is in no order and nobody sees it.

`bidirectional_context=True` is what the released XLNet code does: the context tokens (z_<=c) all see each other
(and never a target); the paper's figure is the strict version, False, where they too follow the order. The
targets see exactly the same tokens either way.

Span-based prediction (sec. 3.1: "sample a length L in [1, ..., 5], and then randomly select a consecutive span
of L tokens as prediction targets within a context of (KL) tokens"): the targets are spans, then put last in the
order. p(L) is proportional to 1/L, as `_sample_mask` in the released code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PermutationLMConfig:
    k: int = 6  # predict the last 1/K of each factorization order (the paper uses K = 6 or 7)
    span_prediction: bool = False  # choose the targets as spans of consecutive tokens
    max_span: int = 5  # longest span, in tokens
    bidirectional_context: bool = True  # context tokens see each other, as the released code


@dataclass
class PermutationLMBatch:
    """Inputs for XLNetLMHeadModel.forward(**batch.model_inputs())."""

    input_ids: torch.Tensor  # (batch, seq), unchanged: the query stream hides the target, not the input
    attention_mask: torch.Tensor  # (batch, seq), 1 = real token
    perm_mask: torch.Tensor  # (batch, seq, seq) float, 1 = may not attend
    target_mapping: torch.Tensor  # (batch, num_predict, seq) float, one-hot rows; all-zero rows are padding
    labels: torch.Tensor  # (batch, num_predict), -100 where the row is padding
    ranks: torch.Tensor  # (batch, seq), step of each position in the factorization order; -1 for padding

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "perm_mask": self.perm_mask,
            "target_mapping": self.target_mapping,
            "labels": self.labels,
        }


def num_targets(num_predictable: int, num_real: int, k: int) -> int:
    """ceil(n / K) of the n predictable tokens, but always leave at least one real token as context
    (a target that sees nothing would get a uniform attention over all keys, its own token included)."""
    return max(0, min(math.ceil(num_predictable / k), num_real - 1))


def perm_mask_from_ranks(
    ranks: torch.Tensor, attention_mask: torch.Tensor, seen_by_all: torch.Tensor | None = None
) -> torch.Tensor:
    """perm_mask (batch, seq, seq) from each position's step in the factorization order.

    ranks: (batch, seq) long, ranks[b, i] = t where z_t = i; attention_mask: (batch, seq), 1 = real token;
    seen_by_all: (batch, seq) bool, positions every real position may see (the context, when bidirectional).
    Query stream of i sees j  iff  j is real and (ranks[j] < ranks[i] or seen_by_all[j]).
    """
    real = attention_mask.bool()
    visible = ranks[:, None, :] < ranks[:, :, None]  # (batch, i, j): j comes before i
    if seen_by_all is not None:
        visible = visible | seen_by_all[:, None, :]
    visible = visible & real[:, None, :] & real[:, :, None]  # padding sees nothing and is seen by nobody
    return (~visible).float()


def sample_targets(
    predictable: torch.Tensor, count: int, config: PermutationLMConfig, generator: torch.Generator | None
) -> torch.Tensor:
    """Which of one sequence's positions are predicted: (seq,) bool with exactly `count` True, all predictable."""
    positions = predictable.nonzero().flatten()
    n = len(positions)
    chosen = torch.zeros(n, dtype=torch.bool)
    if config.span_prediction:
        lengths = torch.arange(1, config.max_span + 1)
        p_length = 1.0 / lengths.float()  # p(L) proportional to 1/L
        cur = 0
        while cur < n and int(chosen.sum()) < count:
            length = int(lengths[torch.multinomial(p_length, 1, generator=generator)])
            length = min(length, count - int(chosen.sum()))
            window = length * config.k  # one span of L tokens per K * L tokens: density 1/K
            left = int(torch.randint(0, window - length + 1, (1,), generator=generator))
            begin = cur + left
            if begin + length > n:
                break
            chosen[begin : begin + length] = True
            cur += window
    # Uniform choice, or topping up what the spans left short near the end of the sequence.
    missing = count - int(chosen.sum())
    if missing > 0:
        free = (~chosen).nonzero().flatten()
        chosen[free[torch.randperm(len(free), generator=generator)[:missing]]] = True
    targets = torch.zeros_like(predictable, dtype=torch.bool)
    targets[positions[chosen]] = True
    return targets


def sample_permutation_lm_batch(
    input_ids: torch.Tensor,
    config: PermutationLMConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    special_tokens_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> PermutationLMBatch:
    """Sample a factorization order per sequence and build perm_mask, target_mapping and labels.

    input_ids, attention_mask (1 = real token), special_tokens_mask (1 = <sep>/<cls>/...): (batch, seq).
    The order is: special tokens, then the other context tokens, then the targets, each group shuffled.
    """
    config = config if config is not None else PermutationLMConfig()
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    if config.k < 1:
        raise ValueError(f"k must be at least 1 (predict the last 1/k of each order), got {config.k}")
    if config.max_span < 1:
        raise ValueError(f"max_span must be at least 1, got {config.max_span}")
    b, t = input_ids.shape
    for name, x in (("attention_mask", attention_mask), ("special_tokens_mask", special_tokens_mask)):
        if x is not None and x.shape != input_ids.shape:
            raise ValueError(f"{name} must have the shape of input_ids {(b, t)}, got {tuple(x.shape)}")
    real = torch.ones(b, t, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()
    special = torch.zeros(b, t, dtype=torch.bool) if special_tokens_mask is None else special_tokens_mask.bool().cpu()
    predictable = real & ~special

    ranks = torch.full((b, t), -1, dtype=torch.long)
    is_target = torch.zeros(b, t, dtype=torch.bool)
    for row in range(b):
        count = num_targets(int(predictable[row].sum()), int(real[row].sum()), config.k)
        is_target[row] = sample_targets(predictable[row], count, config, generator)
        # Sort by (group, random): specials (0), other context (1), targets (2); padding goes last, unranked.
        group = torch.where(special[row], 0, torch.where(is_target[row], 2, 1))
        group = torch.where(real[row], group, 3)
        key = group.double() + torch.rand(t, generator=generator, dtype=torch.double)
        order = key.argsort()  # order[s] = position at step s
        ranks[row, order] = torch.arange(t)
        ranks[row, ~real[row]] = -1

    seen_by_all = real & ~is_target if config.bidirectional_context else None
    perm_mask = perm_mask_from_ranks(ranks, real, seen_by_all)

    # One row of target_mapping per target, left to right; shorter rows padded with zeros and label -100.
    num_predict = int(is_target.sum(1).max()) if b else 0
    target_mapping = torch.zeros(b, num_predict, t)
    labels = torch.full((b, num_predict), -100, dtype=torch.long)
    for row in range(b):
        positions = is_target[row].nonzero().flatten()
        target_mapping[row, torch.arange(len(positions)), positions] = 1.0
        labels[row, : len(positions)] = input_ids[row, positions.to(input_ids.device)].cpu()

    device = input_ids.device
    return PermutationLMBatch(
        input_ids=input_ids,
        attention_mask=real.long().to(device),
        perm_mask=perm_mask.to(device),
        target_mapping=target_mapping.to(device),
        labels=labels.to(device),
        ranks=ranks.to(device),
    )
