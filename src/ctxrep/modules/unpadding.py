"""Unpadded (packed) batches: the per-token layers of a Transformer read only the real tokens of a padded batch.

A padded batch (batch, seq) whose padding is a large share of the grid wastes that share of every per-token
operation (embeddings, linear layers, norms, feed-forwards). Packed, those run on the (tokens, hidden) rows of real
tokens, and only attention, which mixes positions, re-pads around itself, as transformers' unpadded ModernBERT does
with flash-attn (and as varlen attention kernels do on a GPU). The hidden states are those of the padded run at
real tokens, and 0 at padding.

    unpadding_for(attention_mask, unpad_from)  the rule: packed when padding is at least `unpad_from` of the grid
    Unpadding.pad(x) / unpad(x) / select(t)    moves between the two layouts, each one operation whatever the mask
    key_mask_of(attention_mask)                the padded grid's mask over attention keys, None without padding

Whether a batch is unpadded is a fixed rule on its mask, never a timing, and traced, exported or compiled graphs
always run padded: whether a batch has padding is data, and such a graph must serve every batch. A caller that reads
the outputs at masked positions (ColBERT's query expansion: [MASK] tokens attention skips, whose vectors are scored)
asks for the padded grid explicitly: `Encoder.encode(batch, padded=True)` (`Encoder.unpadding(mask, padded)`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Encoder.unpad_from of every family that unpads: benchmarks/unpad.py (RESULTS.md, "Unpadded batches for every
# family": each family's published shape, 16 x 128 tokens, 2 threads) ran the forward 1.04-1.16x faster unpadded at 10%
# padding in 12 of 13 families, 1.01-1.11x already at 5%, 1.49-2.07x at 50%, with the same vectors; a fixed rule on
# the mask that leaves a margin, never a timing.
UNPAD_FROM = 0.1


@dataclass
class Unpadding:
    """Where the real tokens of a padded (batch, seq) batch sit once packed into (tokens, ...) rows. Each move
    between the two layouts is one operation whatever the mask (on a CPU shared with other work, small operations
    cost most in waiting for threads: one copy per sequence measured 2.4x slower in all)."""

    index: torch.Tensor  # (tokens,) each real token's place in the flattened (batch * seq) grid, row-major
    batch: int
    seq: int

    @classmethod
    def of(cls, real: torch.Tensor) -> Unpadding:
        """real: (batch, seq) bool, True at real tokens."""
        return cls(real.flatten().nonzero().squeeze(1), *real.shape)

    @property
    def tokens(self) -> int:
        return self.index.numel()

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) contiguous in its first two dims (ids, positions, segments) -> (tokens, ...)."""
        return x.reshape(self.batch * self.seq, *x.shape[2:]).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (batch, seq, ...), zeros at padding."""
        grid = x.new_zeros((self.batch * self.seq, *x.shape[1:]))  # (batch * seq, ...)
        return grid.index_copy_(0, self.index, x).view(self.batch, self.seq, *x.shape[1:])

    def pad_states(self, hidden_states: list[torch.Tensor], output_hidden_states: bool) -> list[torch.Tensor]:
        """A forward's hidden states (each (tokens, hidden)) back on the (batch, seq) grid: every one when they are
        returned, else only the last."""
        return [self.pad(h) for h in hidden_states] if output_hidden_states else [self.pad(hidden_states[-1])]

    @functools.cached_property
    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, columns) of the real tokens in the (batch, seq) grid, each (tokens,): worked out once per batch,
        read by every layer's `unpad`."""
        return self.index // self.seq, self.index % self.seq

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) -> (tokens, ...), in one gather whatever x's strides (a transposed view is not copied
        whole first)."""
        return x[self.positions]


def unpadding_for(attention_mask: torch.Tensor | None, unpad_from: float | None) -> Unpadding | None:
    """How a forward lays out a batch with `attention_mask` (batch, seq): packed when its padding is at least
    `unpad_from` of the (batch, seq) grid; None (padded) without a mask, without padding, with `unpad_from` None
    (the family never unpads), and inside traced, compiled or exported graphs. A caller that reads the outputs at
    padding asks for the padded grid (`Encoder.unpadding(mask, padded=True)`) and never gets here."""
    if attention_mask is None or unpad_from is None or attention_mask.dim() != 2:
        return None
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return None
    real = attention_mask.bool()  # (batch, seq)
    tokens = int(real.sum())
    padding = real.numel() - tokens
    if tokens == 0 or padding == 0 or padding < unpad_from * real.numel():
        return None
    return Unpadding.of(real)


def key_mask_of(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """attention_mask (batch, seq), 1 at real tokens and 0 at padding -> (batch, 1, 1, seq) bool, True at the keys a
    query may read (broadcast over heads and queries); None without a mask or without padding, so that attention runs
    unmasked (the kernels' fast path)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, seq)
