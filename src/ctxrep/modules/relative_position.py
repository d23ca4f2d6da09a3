"""T5's relative position bias (Raffel et al. 2020, sec. 2.1), which MPNet adds in every layer too (Song et al. 2020):

    scores_h(i, j) = q_i . k_j (/ sqrt(d_k) in MPNet) + b_h(bucket(j - i))

b is a learned (num_buckets, heads) table. Bidirectional buckets (Mesh TensorFlow's; encoders): half of them for keys
before the query and half for keys after it; within each half the distances |j - i| below num_buckets / 4 have a
bucket each, larger ones share log-spaced buckets up to max_distance, and anything farther falls in the half's last.
Unidirectional buckets (T5's decoder, whose keys never follow the query): all num_buckets for the distance i - j >= 0,
the first num_buckets / 2 exact.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def relative_position_bucket(
    relative_position: torch.Tensor, num_buckets: int, max_distance: int, bidirectional: bool = True
) -> torch.Tensor:
    """bucket(j - i) of each relative position j - i. Bidirectional: keys after the query in the upper half;
    |j - i| below num_buckets / 4 exact, larger distances log-spaced up to max_distance, farther ones in the last
    bucket. Unidirectional: the distance max(i - j, 0) over all buckets, below num_buckets / 2 exact."""
    if bidirectional:
        half = num_buckets // 2
        bucket = (relative_position > 0).long() * half
        n = relative_position.abs()
    else:
        half = num_buckets
        bucket = torch.zeros_like(relative_position)
        n = (-relative_position).clamp(min=0)
    exact = half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    large = large.clamp(max=half - 1)
    return bucket + torch.where(n < exact, n, large)


def relative_position_bias(
    table: nn.Embedding,
    seq_len: int,
    num_buckets: int,
    max_distance: int,
    device: torch.device,
    bidirectional: bool = True,
    past: int = 0,
) -> torch.Tensor:
    """(1, heads, seq, past + seq): b_h(bucket(j - i)) read from `table` (num_buckets, heads) for queries at positions
    past..past + seq - 1 and keys at 0..past + seq - 1 of every row, so that padding does not move it."""
    q = torch.arange(past, past + seq_len, device=device)
    k = torch.arange(past + seq_len, device=device)
    bucket = relative_position_bucket(k[None, :] - q[:, None], num_buckets, max_distance, bidirectional)  # j - i
    return table(bucket).permute(2, 0, 1)[None]  # (1, heads, seq, past + seq)
