"""Grouped-query self-attention with rotary positions (Ainslie et al. 2023), as Llama, Qwen, Mistral and Gemma run it.

H query heads share K <= H key/value heads (H / K queries per group); per head (Vaswani et al. 2017, eq. 1):

    Attn(q, k, v) = softmax(s * R q (R k)^T + M) v           s = head_dim^-1/2 (Gemma: query_pre_attn_scalar^-1/2)

with R the rotary turn of each position (modules/rotary.py), optional RMSNorms over each head's q and k before it
(Qwen3, Gemma 3), and a boolean mask M (`decoder_mask`): causal, within a sliding window, or bidirectional, and
never a padding key. The products run through F.scaled_dot_product_attention (flash / memory-efficient kernels
where the device has them); the explicit softmax runs only when the probabilities are asked for. An unpadded batch
(modules/unpadding.py) projects, norms and turns its real tokens only, and re-pads q, k, v for the product.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.modules.heads import merge_heads
from ctxrep.modules.rms_norm import RMSNorm
from ctxrep.modules.rotary import rotate
from ctxrep.modules.unpadding import Unpadding


def decoder_mask(
    real: torch.Tensor | None, t: int, causal: bool, window: int | None, device: torch.device
) -> torch.Tensor | None:
    """Boolean (batch or 1, 1, seq, seq), True where query i may read key j: j <= i when `causal`, i - j < window
    (|i - j| < window when not causal) with a sliding window, and j a real token (`real`: (batch, seq) bool, None
    without padding). Every query keeps its own position, so that no row is empty (a padding query's row would
    give NaN, which later layers would read). None without padding or window: the attention then runs the kernels'
    own causal mask (`causal`) or none."""
    if window is None and real is None:
        return None
    pos = torch.arange(t, device=device)
    distance = pos[:, None] - pos[None, :]  # (seq, seq): query i minus key j
    allowed = torch.ones(t, t, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed & (distance >= 0)
    if window is not None:
        allowed = allowed & ((distance < window) if causal else (distance.abs() < window))
    mask = allowed[None, None]  # (1, 1, seq, seq)
    if real is not None:
        mask = mask & real.bool()[:, None, None, :]  # (batch, 1, seq, seq)
        mask = mask | torch.eye(t, dtype=torch.bool, device=device)[None, None]
    return mask


def padding_of(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask as bool (batch, seq), or None when there is no padding. A traced or exported graph keeps the mask
    whatever its example held: whether a batch has padding is data, and such a graph must serve every batch."""
    if attention_mask is None:
        return None
    exporting = torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
    if not exporting and bool(attention_mask.all()):
        return None
    return attention_mask.bool()


def positions_of(real: torch.Tensor | None, b: int, t: int, device: torch.device) -> torch.Tensor:
    """Each token's position (batch, seq): 0, 1, ... over the real tokens of a row, so that a left-padded row has
    the positions of the same text unpadded (padding slots get 0)."""
    if real is None:
        return torch.arange(t, device=device)[None, :].expand(b, t)
    return (real.long().cumsum(-1) - 1).clamp(min=0)


class GroupedQueryAttention(nn.Module):
    """q_proj, k_proj, v_proj, o_proj (and q_norm, k_norm) under the checkpoints' own names."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: RMSNorm | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
    ) -> None:
        """qk_norm: a model of the per-head norm (its eps and kind), copied for q and for k; None for none."""
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"{heads} attention heads cannot share {kv_heads} key/value heads evenly")
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=o_bias)
        if qk_norm is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm.eps, qk_norm.unit_offset)
            self.k_norm = RMSNorm(head_dim, qk_norm.eps, qk_norm.unit_offset)
        else:
            self.q_norm = self.k_norm = None
        self.scale = scale if scale is not None else head_dim**-0.5
        self.dropout_p = dropout

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        output_attentions: bool = False,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (batch, seq, hidden); cos, sin (batch, seq, head_dim); mask from `decoder_mask` (None: every key,
        or plain causal when `causal`). With `unpadding`, x (tokens, hidden) and cos, sin (tokens, head_dim): the
        projections, q / k norms and rotary turn read real tokens only, and q, k, v are re-padded (zeros, which the
        mask hides) for the attention product. Returns the output (batch, seq, hidden), or (tokens, hidden), and,
        when asked, the probabilities (batch, heads, seq, seq)."""
        lead = x.shape[:-1]  # (batch, seq) or (tokens,)
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)  # (..., heads, head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)  # (..., kv_heads, head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)  # (..., kv_heads, head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if unpadding is not None:
            q, k, v = unpadding.pad(q), unpadding.pad(k), unpadding.pad(v)  # each (batch, seq, heads, head_dim)
        t = q.shape[1]
        q = q.transpose(1, 2)  # (batch, heads, seq, head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # each (batch, kv_heads, seq, head_dim)
        groups = self.num_heads // self.num_kv_heads
        dropout_p = self.dropout_p if self.training else 0.0
        probs = None
        if output_attentions:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (batch, heads, seq, hd)
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (batch, heads, seq, seq)
            if mask is None and causal:
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()[None, None]
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
            context = F.dropout(probs, dropout_p, self.training) @ v  # (batch, heads, seq, head_dim)
        elif mask is None:  # no padding: the kernels' own causal mask and grouped heads
            context = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=causal, scale=self.scale, enable_gqa=groups > 1
            )
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (batch, heads, seq, hd)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)
        return self.o_proj(merge_heads(context, unpadding)), probs  # (batch, seq | tokens, hidden)
