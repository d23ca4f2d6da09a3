"""Tiny Marian models for the search tests: random sentences of token ids, and a model trained for a few seconds to
reverse them (half-learned, so that its outputs end at many lengths and beam search finds other outputs than greedy
search; a random model rarely stops, or always does)."""

from __future__ import annotations

import torch

from ctxrep.models.marian import MarianConfig, MarianMTModel

PAD, EOS, VOCAB = 59, 0, 60


def sources(n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """n random sentences of 3 to 13 tokens ending with </s>, padded on the right."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 14, (n,), generator=g)
    ids = torch.full((n, int(lengths.max())), PAD)
    mask = torch.zeros_like(ids)
    for i, n_i in enumerate(lengths.tolist()):
        ids[i, : n_i - 1] = torch.randint(1, PAD, (n_i - 1,), generator=g)
        ids[i, n_i - 1] = EOS
        mask[i, :n_i] = 1
    return ids, mask


def train_reverser(d_model: int, ffn_dim: int, steps: int) -> MarianMTModel:
    """A 2 + 2 layer model (torch seed 0) after `steps` Adam steps on batches of 16 reversals; eval mode."""
    torch.manual_seed(0)
    model = MarianMTModel(
        MarianConfig(
            vocab_size=VOCAB,
            d_model=d_model,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=ffn_dim,
            decoder_ffn_dim=ffn_dim,
            max_position_embeddings=64,
            pad_token_id=PAD,
            eos_token_id=EOS,
            dropout=0.0,
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        ids, mask = sources(16, seed=100 + step)
        labels = ids.clone()
        for i, n in enumerate(mask.sum(dim=1).tolist()):
            labels[i, : n - 1] = ids[i, : n - 1].flip(0)
        loss = model(ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()
