"""T5's relative position bias (Raffel et al. 2020, sec. 2.1), which MPNet adds in every layer too (Song et al. 2020):

    scores_h(i, j) = q_i . k_j (/ sqrt(d_k) in MPNet) + b_h(bucket(j - i))

b is a learned (num_buckets, heads) table. The buckets are bidirectional (Mesh TensorFlow's): half of them for keys
before the query and half for keys after it; within each half the distances |j - i| below num_buckets / 4 have a
bucket each, larger ones share log-spaced buckets up to max_distance, and anything farther falls in the half's last.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """bucket(j - i) of each relative position j - i: keys after the query in the upper half; |j - i| below
    num_buckets / 4 exact, larger distances log-spaced up to max_distance, farther ones in the last bucket."""
    half = num_buckets // 2
    bucket = (relative_position > 0).long() * half
    n = relative_position.abs()
    exact = half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    large = large.clamp(max=half - 1)
    return bucket + torch.where(n < exact, n, large)


def relative_position_bias(
    table: nn.Embedding, seq_len: int, num_buckets: int, max_distance: int, device: torch.device
) -> torch.Tensor:
    """(1, heads, seq, seq): b_h(bucket(j - i)) read from `table` (num_buckets, heads) for the positions 0..seq-1 of
    every row, so that padding does not move it."""
    pos = torch.arange(seq_len, device=device)
    bucket = relative_position_bucket(pos[None, :] - pos[:, None], num_buckets, max_distance)  # (seq, seq), j - i
    return table(bucket).permute(2, 0, 1)[None]  # (1, heads, seq, seq)
