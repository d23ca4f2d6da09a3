"""ELMo's context-independent token encoder (Peters et al. 2018, sec. 3.1; Kim et al. 2016's character CNN).

For a token given as character ids c_1..c_L (L = max_characters_per_token):

    e_k   = E[c_k]                                     character embeddings, row 0 = padding (zeros)
    z_w   = act(max_k (conv_w(e)_k + b_w))             one filter bank per width w, max-pooled over positions
    z     = [z_1; ...; z_W]                            (n_filters,)
    x     = Highway(z)                                 n_highway layers, see modules/highway.py
    token = W_proj x + b_proj                          to projection_dim (skipped when n_filters == projection_dim)

The convolutions are VALID (no padding), so a filter of width w yields L - w + 1 positions to pool over;
act is relu or tanh (options.json `activation`), applied after the max-pool as in bilm-tf.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ctxrep.modules.activations import ACTIVATIONS as ALL_ACTIVATIONS
from ctxrep.modules.highway import Highway

# bilm-tf's options.json knows these two (rows of the one activation table)
ACTIVATIONS = {name: ALL_ACTIVATIONS[name] for name in ("relu", "tanh")}


class CharCNN(nn.Module):
    """Character ids (..., max_characters_per_token) -> token vectors (..., output_dim)."""

    def __init__(
        self,
        n_characters: int,
        embedding_dim: int,
        filters: Sequence[tuple[int, int]],
        n_highway: int,
        activation: str,
        output_dim: int,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"char_cnn activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = ACTIVATIONS[activation]
        self.n_filters = sum(num for _, num in filters)
        self.char_embedding = nn.Embedding(n_characters, embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(nn.Conv1d(embedding_dim, num, width) for width, num in filters)
        self.highway = Highway(self.n_filters, n_highway)
        self.projection = nn.Linear(self.n_filters, output_dim) if self.n_filters != output_dim else None

    def convolve(self, char_ids: torch.Tensor) -> torch.Tensor:
        """The max-pooled, activated filter outputs z: (..., max_chars) -> (..., n_filters)."""
        lead, n_chars = char_ids.shape[:-1], char_ids.shape[-1]
        e = self.char_embedding(char_ids.reshape(-1, n_chars))  # (tokens, max_chars, char_dim)
        e = e.transpose(1, 2)  # (tokens, char_dim, max_chars): Conv1d wants channels first
        pooled = [self.activation(conv(e).max(dim=-1).values) for conv in self.convolutions]
        z = torch.cat(pooled, dim=-1)  # (tokens, n_filters)
        return z.reshape(*lead, self.n_filters)  # (..., n_filters)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        # Running text repeats most of its words (and padding rows): encode each distinct word once and
        # scatter the vectors back. Same result, and the convolutions, the bulk of the cost, run on fewer rows.
        lead, n_chars = char_ids.shape[:-1], char_ids.shape[-1]
        words, inverse = torch.unique(char_ids.reshape(-1, n_chars), dim=0, return_inverse=True)
        x = self.highway(self.convolve(words))
        if self.projection is not None:
            x = self.projection(x)
        return x[inverse].reshape(*lead, x.shape[-1])
