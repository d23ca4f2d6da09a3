"""The Transformer encoder-decoder for machine translation, in Marian's layout (the OPUS-MT checkpoints).

Vaswani et al. 2017, "Attention Is All You Need":
  eq. 1   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
  sec 3.2 MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
  eq. 2   FFN(x) = max(0, x W_1 + b_1) W_2 + b_2            (ReLU in the paper; Marian's OPUS-MT models use swish)
  sec 5.4 each sub-layer's output is LayerNorm(x + Sublayer(x))   (post-LN; `normalize_before` gives the
          pre-LN variant x + Sublayer(LayerNorm(x)) with a final LayerNorm after each stack, as in fairseq)
  sec 3.4 token embeddings are multiplied by sqrt(d_model) (`scale_embedding`), and one embedding matrix is
          shared by the encoder input, the decoder input and the pre-softmax projection
  sec 3.5 sinusoidal positions (see `sinusoidal_positions` for Marian's layout of them)
The decoder's self-attention is causal (position i sees 0..i); its encoder-decoder attention takes queries from
the decoder and keys/values from the encoder output.

Reads top to bottom: config, positions, attention, encoder layer, decoder layer, the decoder's key/value cache,
the model (encode_source, decode, forward with the loss), then the loader and saver for Hugging Face's Marian
folder format (config.json with model_type "marian" + model.safetensors / pytorch_model.bin), which
transformers' MarianMTModel loads. A pre-LN model cannot be written in that format (transformers has no
pre-LN Marian and would silently run it post-LN); it is saved with model_type "ctxrep_mt" instead: the same
weight names plus model.encoder.layer_norm / model.decoder.layer_norm.

Padding: a source batch whose padding is at least `unpad_from` of its (batch, src) grid runs the encoder unpadded
(modules/unpadding.py): embeddings, query / key / value, the output projections, norms and feed-forwards on the
(tokens, d_model) rows of real tokens, re-padded only around the attention product; the same hidden states at real
tokens (0 at padding). The decoder's cross-attention keys / values are projected from those rows too and padded
back with zeros (the source mask hides them); the decoder itself, and its cache, run as before.

Incremental decoding (fairseq's FairseqIncrementalDecoder idea): `init_cache(memory, source_mask)` computes every
decoder layer's cross-attention keys/values once per source sentence; `decode(tokens, cache)` runs only the new
target tokens and appends their self-attention keys/values; `cache.reorder(beam_indices)` and
`cache.keep(sentences)` are the two operations beam search needs.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder
from ctxrep.models.folders import CheckpointError
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import ACTIVATIONS, check_activation
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

MARIAN = "marian"  # transformers' model_type: post-LN only
OWN_FORMAT = "ctxrep_mt"  # ctxrep's own model_type: the same weights, pre-LN allowed
MODEL_TYPES = (MARIAN, OWN_FORMAT)
IGNORE_INDEX = -100  # a label that does not count in the loss (torch's cross_entropy default)


@dataclass
class MarianConfig:
    """Everything needed to rebuild the network; field names are those of transformers' MarianConfig.

    The defaults are the paper's base model (sec. 6.1) with Marian's conventions: the pad token starts every
    target (decoder_start_token_id = pad_token_id), </s> ends it, one shared vocabulary.
    """

    vocab_size: int = 8000
    decoder_vocab_size: int | None = None  # None: vocab_size (shared vocabulary)
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_position_embeddings: int = 512
    scale_embedding: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int | None = None  # None: pad_token_id, as Marian does
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    normalize_before: bool = False  # ctxrep's pre-LN option: saved in ctxrep's own format only

    def __post_init__(self) -> None:
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.pad_token_id
        for width, heads, side in (
            (self.d_model, self.encoder_attention_heads, "encoder"),
            (self.d_model, self.decoder_attention_heads, "decoder"),
        ):
            if width % heads:
                raise ValueError(f"d_model {width} is not a multiple of {side}_attention_heads {heads}")
        check_activation("activation_function", self.activation_function)
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"decoder_vocab_size {self.decoder_vocab_size} differs from vocab_size {self.vocab_size} but "
                "share_encoder_decoder_embeddings is true; a shared embedding has one vocabulary"
            )

    @classmethod
    def from_hf_dict(cls, d: dict) -> MarianConfig:
        """From a config.json dict. Options of older Marian configs that change the network are refused."""
        if d.get("model_type") == MARIAN:
            # Older transformers wrote these BART-era switches into OPUS-MT configs; the Marian network has them
            # at the values on the right, and transformers ignores the keys today, so another value means a model
            # that neither transformers nor ctxrep runs as it was trained.
            for key, value in (
                ("normalize_before", False),
                ("normalize_embedding", False),
                ("add_final_layer_norm", False),
                ("static_position_embeddings", True),
                ("add_bias_logits", False),
            ):
                if key in d and d[key] != value:
                    raise CheckpointError(
                        f"config.json has {key}={d[key]!r}, which a Marian model does not support (only {value!r}); "
                        "this checkpoint is not a Marian model that transformers or ctxrep can run"
                    )
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        """transformers' MarianConfig keys (normalize_before only in ctxrep's own format)."""
        d = asdict(self)
        del d["normalize_before"]
        d |= {
            "model_type": MARIAN,
            "architectures": ["MarianMTModel"],
            "is_encoder_decoder": True,
            "forced_eos_token_id": self.eos_token_id,
            "bos_token_id": None,
            "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0,
        }
        return d


# ---- positions --------------------------------------------------------------------------------------------------


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) sinusoidal table laid out as Marian (and transformers' Marian) lays it out.

    The paper (sec. 3.5) interleaves:  PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
    Marian puts all the sines first and all the cosines second:  PE(pos, i) = sin(pos / 10000^(2i/d)) and
    PE(pos, ceil(d/2) + i) = cos(pos / 10000^(2i/d)). Same frequencies, another column order: a checkpoint trained
    with one layout does not work with the other. Computed in float64 and rounded once, as transformers does.
    """
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (positions, 1)
    j = torch.arange(dim, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)  # (positions, dim)
    return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1).float()


# ---- attention --------------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head attention (sec. 3.2) with eq. 1 inside; q/k/v/out projections named as in transformers."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout_p = dropout

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)  # (batch, seq, d_model)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))  # each (batch, heads, seq, head_dim)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """eq. 1 on (batch, heads, seq, head_dim) tensors. mask: bool, True where a query may see a key
        (broadcast to (batch, heads, q_len, k_len)); is_causal: the lower-triangular mask (queries = keys)."""
        dropout_p = self.dropout_p if self.training else 0.0
        if not output_attentions:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            ), None
        if is_causal:
            t = q.shape[2]
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()  # (q_len, k_len)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (batch, heads, q_len, k_len)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        return F.dropout(probs, dropout_p, self.training) @ v, probs  # (batch, heads, q_len, head_dim)


class EncoderLayer(nn.Module):
    """x = LN(x + SelfAttn(x)); x = LN(x + FFN(x))  (post-LN, sec. 5.4), or x + Sublayer(LN(x)) (pre-LN)."""

    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        d = config.d_model
        self.pre_ln = config.normalize_before
        self.self_attn = Attention(d, config.encoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.activation = ACTIVATIONS[config.activation_function]
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None,
        output_attentions: bool,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, src, d_model), or (tokens, d_model) with `unpadding`: then the projections read real tokens
        # only and q, k, v are re-padded (zeros, which key_mask hides) for the attention product.
        # key_mask: (batch, 1, 1, src) bool, True at real source tokens, or None.
        h = self.self_attn_layer_norm(x) if self.pre_ln else x
        a = self.self_attn
        q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)
        if unpadding is not None:
            q, k, v = unpadding.pad(q), unpadding.pad(k), unpadding.pad(v)  # each (batch, src, d_model)
        context, probs = a.attend(a.split(q), a.split(k), a.split(v), key_mask, False, output_attentions)
        context = context.transpose(1, 2)  # (batch, src, heads, head_dim)
        if unpadding is not None:
            context = unpadding.unpad(context)  # (tokens, heads, head_dim)
        x = x + self.dropout(a.out_proj(context.flatten(-2)))  # (batch, src | tokens, d_model)
        if not self.pre_ln:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_ln else x
        x = x + self.dropout(self.fc2(self.activation_dropout(self.activation(self.fc1(h)))))  # eq. 2
        if not self.pre_ln:
            x = self.final_layer_norm(x)
        return x, probs


class DecoderLayer(nn.Module):
    """y = LN(y + CausalSelfAttn(y)); y = LN(y + CrossAttn(y, memory)); y = LN(y + FFN(y))  (sec. 3.1)."""

    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        d = config.d_model
        self.pre_ln = config.normalize_before
        self.self_attn = Attention(d, config.decoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = Attention(d, config.decoder_attention_heads, config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.activation = ACTIVATIONS[config.activation_function]
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(
        self,
        y: torch.Tensor,
        layer: int,
        cache: DecoderCache,
        self_mask: torch.Tensor | None,
        is_causal: bool,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        # y: (rows, new, d_model), rows = sentences x cache.group (beams per sentence).
        a = self.self_attn
        h = self.self_attn_layer_norm(y) if self.pre_ln else y
        k, v = cache.append(layer, *a.keys_values(h))  # (rows, heads, past + new, head_dim)
        context, self_probs = a.attend(a.split(a.q_proj(h)), k, v, self_mask, is_causal, output_attentions)
        y = y + self.dropout(a.out_proj(a.merge(context)))
        if not self.pre_ln:
            y = self.self_attn_layer_norm(y)

        # Encoder-decoder attention: queries from the decoder, keys/values from the encoder output, computed once
        # per sentence (cache.cross). The `group` rows of a sentence (its beams) share them: their queries are
        # stacked along the query axis instead of copying the keys/values `group` times.
        c = self.encoder_attn
        h = self.encoder_attn_layer_norm(y) if self.pre_ln else y
        rows, t, _ = h.shape
        g = cache.group
        q = c.split(c.q_proj(h))  # (rows, heads, new, head_dim)
        q = q.view(rows // g, g, c.num_heads, t, c.head_dim).transpose(1, 2)  # (sentences, heads, group, new, head_dim)
        q = q.reshape(rows // g, c.num_heads, g * t, c.head_dim)  # (sentences, heads, group * new, head_dim)
        k, v = cache.cross[layer]  # (sentences, heads, src, head_dim)
        context, cross_probs = c.attend(q, k, v, cache.source_mask, False, output_attentions)
        context = context.view(rows // g, c.num_heads, g, t, c.head_dim).transpose(
            1, 2
        )  # (sentences, group, heads, new, hd)
        context = context.reshape(rows, c.num_heads, t, c.head_dim)  # (rows, heads, new, head_dim)
        if cross_probs is not None:
            src = cross_probs.shape[-1]
            cross_probs = cross_probs.view(rows // g, c.num_heads, g, t, src).transpose(
                1, 2
            )  # (sent, group, heads, new, src)
            cross_probs = cross_probs.reshape(rows, c.num_heads, t, src)  # (rows, heads, new, src)
        y = y + self.dropout(c.out_proj(c.merge(context)))
        if not self.pre_ln:
            y = self.encoder_attn_layer_norm(y)

        h = self.final_layer_norm(y) if self.pre_ln else y
        if self.training or torch.is_grad_enabled() or self.activation is not F.relu:
            y = y + self.dropout(self.fc2(self.activation_dropout(self.activation(self.fc1(h)))))  # eq. 2
        else:  # inference (no dropout): the same numbers, ReLU and the residual sum in place (two fewer tensors)
            y = self.fc2(self.fc1(h).relu_()).add_(y)
        if not self.pre_ln:
            y = self.final_layer_norm(y)
        return y, self_probs, cross_probs


# ---- the decoder's key/value cache ------------------------------------------------------------------------------


class DecoderCache:
    """What incremental decoding keeps between steps (fairseq's incremental state + encoder_out).

    cross[l]      layer l's encoder-decoder keys and values, each (sentences, heads, src, head_dim): computed once
                  per source sentence by `MarianMTModel.init_cache`, shared by that sentence's `group` rows
    self_kv[l]    layer l's self-attention keys and values of the target tokens so far, each
                  (sentences * group, heads, past, head_dim); rows r*group .. r*group + group - 1 belong to sentence r
                  once `pending` is applied
    pending       None, or the rows of self_kv that each row continues from: a reorder not applied yet. The next
                  `append` applies it while it copies the keys/values anyway, so that a beam-search step copies
                  the cache once, not twice (index_select, then cat)
    source_mask   (sentences, 1, 1, src) bool, True at real source tokens; None when no source token is padding
    group         decoder rows per sentence: 1 for training and greedy search, the beam size in beam search
    """

    def __init__(
        self,
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        source_mask: torch.Tensor | None,
        group: int = 1,
    ) -> None:
        self.cross = cross
        self.source_mask = source_mask
        self.group = group
        self.self_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(cross)
        self.pending: torch.Tensor | None = None

    @property
    def num_sentences(self) -> int:
        return self.cross[0][0].shape[0]

    @property
    def length(self) -> int:
        """Target tokens decoded so far (the next token's position)."""
        kv = self.self_kv[0]
        return 0 if kv is None else kv[0].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' keys/values (rows, heads, new, head_dim); returns all of them so far."""
        past = self.self_kv[layer]
        if past is not None:
            k = _select_and_append(past[0], self.pending, k)  # (rows, heads, past + new, head_dim)
            v = _select_and_append(past[1], self.pending, v)  # (rows, heads, past + new, head_dim)
        self.self_kv[layer] = (k, v)
        if layer == len(self.self_kv) - 1:
            self.pending = None  # every layer has applied it
        return k, v

    def reorder(self, beam_indices: torch.Tensor) -> None:
        """Row i continues from row beam_indices[i] (fairseq's reorder_incremental_state). Every index must stay
        within its sentence's group of rows, as beam search's do; the cross-attention keys/values are per
        sentence and so are not copied at all. Recorded in `pending` (composed with one not applied yet) and
        applied by the next `append`."""
        if self.self_kv[0] is None:
            return  # nothing decoded yet: every row is the same empty prefix
        self.pending = beam_indices if self.pending is None else self.pending.index_select(0, beam_indices)

    def keep(self, sentences: torch.Tensor) -> None:
        """Keep only these sentences (and their rows), e.g. when the others have finished (fairseq's
        reorder_encoder_out on the surviving sentences)."""
        g = self.group
        rows = (sentences[:, None] * g + torch.arange(g, device=sentences.device)).reshape(-1)  # (kept * group,)
        self.cross = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.cross]
        if self.source_mask is not None:
            self.source_mask = self.source_mask.index_select(0, sentences)
        self.reorder(rows)


def _select_and_append(past: torch.Tensor, rows: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """cat([past[rows], new], dim=2) with a single copy of `past` (rows None: every row, in order)."""
    if rows is None:
        return torch.cat([past, new], dim=2)
    t = past.shape[2]
    out = past.new_empty(rows.shape[0], past.shape[1], t + new.shape[2], past.shape[3])  # (rows, heads, t + new, hd)
    torch.index_select(past, 0, rows, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


# ---- the training loss ------------------------------------------------------------------------------------------


def projected_smoothed_loss(
    states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    epsilon: float,
    chunk_elements: int = 1 << 22,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(label-smoothed loss, NLL), summed over tokens, of the logits z = states W^T + b, without ever holding
    the whole (tokens x vocabulary) logit matrix. states: (tokens, d_model); weight: (V, d_model); bias: (V,);
    targets: (tokens,). The NLL is detached.

    Per token, with p = softmax(z) and the smoothed target q'(k) = (1 - eps) [k = y] + eps / V (sec. 5.4):
        loss = -sum_k q'(k) log p_k = (1 - eps) (-log p_y) + (eps / V) sum_k (-log p_k)
        d loss / d z = p - q'
    The tokens go through in chunks of about `chunk_elements` logits (16 MB in float32): each chunk's logits are
    projected, scored, and turned into p - q' in place, whose products with W and with the states are that
    chunk's gradients (the fused linear cross-entropy of the Liger kernels, Hsu et al. 2024). Training's
    (tokens x V) matrices no longer go through the allocator as 100+ MB blocks that the kernel must map and zero
    at every step, and the softmax's backward needs no second pass. Outside autograd (evaluation) no gradient is
    computed. Equal to torch's cross_entropy(states W^T + b, targets, label_smoothing=eps, reduction="sum"), the
    reference path that tests/test_marian.py checks it against, value and gradients.
    """
    needs_grad = torch.is_grad_enabled() and (states.requires_grad or weight.requires_grad)
    chunk = max(1, chunk_elements // weight.shape[0])
    states = states.to(weight.dtype)  # bf16 autocast's states: the chunks compute in the weights' float32
    with torch.autocast(states.device.type, enabled=False):
        return _ProjectedSmoothedLoss.apply(
            states, weight, bias.to(weight.dtype), targets, float(epsilon), chunk, needs_grad
        )


class _ProjectedSmoothedLoss(torch.autograd.Function):
    """`projected_smoothed_loss`: forward computes the losses and (when asked) their gradients chunk by chunk;
    backward only scales those gradients by the incoming one."""

    @staticmethod
    def forward(ctx, states, weight, bias, targets, epsilon, chunk, needs_grad):
        vocab = weight.shape[0]
        loss = states.new_zeros((), dtype=torch.float32)
        nll = states.new_zeros((), dtype=torch.float32)
        grad_states = torch.empty_like(states) if needs_grad else None
        grad_weight = torch.zeros_like(weight) if needs_grad else None
        for start in range(0, states.shape[0], chunk):
            h, y = states[start : start + chunk], targets[start : start + chunk]  # (c, d_model), (c,)
            rows = torch.arange(y.shape[0], device=y.device)
            log_p = torch.addmm(bias, h, weight.t()).float().log_softmax(dim=-1)  # (c, V)
            nll_c = -log_p[rows, y].sum()
            loss += (1.0 - epsilon) * nll_c - (epsilon / vocab) * log_p.sum()
            nll += nll_c
            if needs_grad:
                g = log_p.exp_().sub_(epsilon / vocab)  # p - eps / V, in place: (c, V)
                g[rows, y] -= 1.0 - epsilon  # p - q'
                g = g.to(weight.dtype)
                torch.mm(g, weight, out=grad_states[start : start + chunk])  # (c, d_model)
                grad_weight.addmm_(g.t(), h)  # (V, d_model)
        ctx.mark_non_differentiable(nll)
        ctx.save_for_backward(grad_states, grad_weight)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        grad_states, grad_weight = ctx.saved_tensors
        if grad_states is None:
            raise RuntimeError(
                "projected_smoothed_loss was computed without gradients (under no_grad or for "
                "tensors that need none); compute it with grad enabled to backpropagate"
            )
        scale = grad_loss.to(grad_states.dtype)
        return grad_states * scale, grad_weight * scale, None, None, None, None, None


# ---- the model --------------------------------------------------------------------------------------------------


@dataclass
class DecoderOutput:
    """One `decode` call: logits (rows, new, target vocab; None with project=False), the last decoder states and,
    when asked, per-layer states and attentions.

    hidden_states[0] is the decoder's embedding output; self_attentions[l] (rows, heads, new, past + new);
    cross_attentions[l] (rows, heads, new, src): what each target token attends to in the source (alignment)."""

    logits: torch.Tensor | None
    last_hidden_state: torch.Tensor | None = None  # (rows, new, d_model): the states the logits project
    hidden_states: tuple[torch.Tensor, ...] | None = None
    self_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class Seq2SeqOutput:
    """`logits`: (batch, target length, target vocab); `loss`: mean cross-entropy over the non-ignored labels."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    num_tokens: int | None = None  # labels that counted in the loss
    encoder_last_hidden_state: torch.Tensor | None = None
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[torch.Tensor, ...] | None = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    decoder_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


class MarianMTModel(Encoder):
    """The encoder-decoder. `forward` follows transformers' MarianMTModel (same arguments, same logits); as an
    `Encoder` (models/encoder.py) it is its encoder stack: `encode(batch)` returns the source's hidden states."""

    family = "marian"
    word_level = False
    reads_segments = False
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a source batch with this share of padding runs unpadded

    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.shared = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        # Separate target embeddings only in models with two vocabularies (some OPUS-MT "tc" models).
        self.decoder_embed_tokens = (
            None
            if config.share_encoder_decoder_embeddings
            else nn.Embedding(config.decoder_vocab_size, d, padding_idx=config.pad_token_id)
        )
        # The pre-softmax projection is the target embedding matrix (sec. 3.4) unless tie_word_embeddings is off.
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(d, config.decoder_vocab_size, bias=False)
        # A constant bias on the logits (a buffer in transformers too: OPUS-MT models carry it, zeros here).
        self.register_buffer("final_logits_bias", torch.zeros(1, config.decoder_vocab_size))
        self.register_buffer("positions", sinusoidal_positions(config.max_position_embeddings, d), persistent=False)
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        if config.normalize_before:  # pre-LN: the stacks' outputs are not normalised by their last layer
            self.encoder.layer_norm = nn.LayerNorm(d)
            self.decoder.layer_norm = nn.LayerNorm(d)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """fairseq's Transformer initialisation: Xavier-uniform projections, zero biases, and embeddings
        N(0, d_model^-0.5) so that the sqrt(d_model)-scaled embeddings start at unit variance."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
            nn.init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    # ---- the encoder interface (models/encoder.py) ----
    config_fields = {
        "num_layers": "encoder_layers",
        "num_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "max_tokens": "max_position_embeddings",
    }
    embedding_table = "shared"
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py); the
    # decoder's blocks hold the same names, and its encoder_attn those of its cross-attention
    adapter_targets = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2")

    def blocks(self) -> list[nn.Module]:
        """The encoder's layers, then the decoder's (Encoder.blocks)."""
        return [*self.encoder.layers, *self.decoder.layers]

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def layer_of(self, name: str) -> int:
        """The encoder side's depths: the (shared) embeddings 0; encoder.layers.i.* i + 1; the encoder's final
        LayerNorm (pre-LN) num_layers; the decoder side (its layers, target embeddings, output projection), which
        encode never runs, num_layers: above the encoder's top layer."""
        parts = name.split(".")
        if parts[0] == "shared":
            return 0
        if parts[0] == "encoder" and len(parts) > 3 and parts[1] == "layers" and parts[2].isdigit():
            if int(parts[2]) < self.num_layers:
                return int(parts[2]) + 1
        elif parts[0] == "encoder" and parts[1:2] == ["layer_norm"]:
            return self.num_layers
        elif parts[0] in ("decoder", "decoder_embed_tokens", "lm_head"):
            return self.num_layers
        raise self.unknown_parameter(name)

    def encode(
        self, batch, output_attentions: bool = False, num_layers: int | None = None, padded: bool = False
    ) -> EncoderOutput:
        """The encoder stack on batch["input_ids"], ["attention_mask"] (batch, src)."""
        return self.encode_source(
            batch["input_ids"],
            batch.get("attention_mask"),
            output_hidden_states=True,
            output_attentions=output_attentions,
            num_layers=num_layers,
            padded=padded,
        )

    # ---- embeddings and the two stacks ----

    def target_embeddings(self) -> nn.Embedding:
        return self.shared if self.decoder_embed_tokens is None else self.decoder_embed_tokens

    def output_weight(self) -> torch.Tensor:
        """The pre-softmax projection (target vocab, d_model): the target embeddings when tied (sec. 3.4)."""
        return self.target_embeddings().weight if self.lm_head is None else self.lm_head.weight

    def embed(
        self, ids: torch.Tensor, table: nn.Embedding, start: int, unpadding: Unpadding | None = None
    ) -> torch.Tensor:
        """sqrt(d_model) * E[ids] + PE[start : start + len] (secs. 3.4, 3.5), then dropout (sec. 5.4).
        ids: (batch, seq) -> (batch, seq, d_model); with `unpadding`, the (tokens, d_model) rows of real tokens."""
        b, t = ids.shape
        if start + t > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {start + t} tokens is longer than the model's {self.config.max_position_embeddings} "
                "positions (max_position_embeddings); shorten or split the sentence"
            )
        positions = self.positions[start : start + t]  # (seq, d_model)
        if unpadding is not None:
            position_ids = torch.arange(t, device=ids.device).expand(b, t)  # (batch, seq), on the padded grid
            ids, positions = unpadding.select(ids), positions[unpadding.select(position_ids)]  # (tokens,), (tokens, d)
        return self.embed_dropout(table(ids) * self.embed_scale + positions)

    def encode_source(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """input_ids, attention_mask: (batch, src), padding on the right, </s> ending each sentence.
        hidden_states[0] is the embedding output, hidden_states[i] layer i's output (after the final LayerNorm
        for the last layer of a pre-LN model). `num_layers` stops after that many layers.

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        key_mask = _key_mask(attention_mask)
        unpadding = self.unpadding(attention_mask, padded)
        x = self.embed(input_ids, self.shared, 0, unpadding)  # (batch, src, d_model) or (tokens, d_model)
        layers = self.encoder.layers[: num_layers if num_layers is not None else len(self.encoder.layers)]
        hidden_states, attentions = [x], []
        for layer in layers:
            x, probs = layer(x, key_mask, output_attentions, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        if self.config.normalize_before and len(layers) == len(self.encoder.layers):
            x = hidden_states[-1] = self.encoder.layer_norm(x)
        if unpadding is not None:
            hidden_states = unpadding.pad_states(hidden_states, output_hidden_states)
            x = hidden_states[-1]  # (batch, src, d_model)
        return EncoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def init_cache(self, memory: torch.Tensor, attention_mask: torch.Tensor | None, group: int = 1) -> DecoderCache:
        """Every decoder layer's cross-attention keys/values of the encoder output `memory` (batch, src, d_model),
        computed once per sentence; `group` decoder rows (beams) will read each sentence. A source batch that the
        encoder runs unpadded is projected unpadded too: zero keys/values at padding, which the source mask hides."""
        unpadding = self.unpadding(attention_mask)
        if unpadding is None:
            cross = [layer.encoder_attn.keys_values(memory) for layer in self.decoder.layers]
        else:
            rows = unpadding.unpad(memory)  # (tokens, d_model)
            cross = [
                (a.split(unpadding.pad(a.k_proj(rows))), a.split(unpadding.pad(a.v_proj(rows))))
                for a in (layer.encoder_attn for layer in self.decoder.layers)
            ]  # each (batch, heads, src, head_dim)
        return DecoderCache(cross, _key_mask(attention_mask), group)

    def decode(
        self,
        decoder_input_ids: torch.Tensor,
        cache: DecoderCache,
        decoder_attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        project: bool = True,
    ) -> DecoderOutput:
        """Run the decoder on the new target tokens (rows, new) after the cache.length tokens already in `cache`
        (whose self-attention keys/values it appends). decoder_attention_mask (rows, past + new): 0 at padding
        keys; None: every key is real. One token at a time, as in search, needs no mask at all.
        project=False leaves the output projection out (logits None): training projects only the states of real
        target tokens (`translation_loss`)."""
        rows, t = decoder_input_ids.shape
        past = cache.length
        if rows != cache.num_sentences * cache.group:
            raise ValueError(
                f"decoder_input_ids has {rows} rows but the cache holds {cache.num_sentences} sentences x "
                f"{cache.group} rows; pass one row per sentence and beam"
            )
        self_mask, is_causal = None, False
        if decoder_attention_mask is not None or (t > 1 and past > 0):
            q_pos = torch.arange(past, past + t, device=decoder_input_ids.device)[:, None]  # (new, 1)
            k_pos = torch.arange(past + t, device=decoder_input_ids.device)[None, :]  # (1, past + new)
            self_mask = (k_pos <= q_pos)[None, None]  # (1, 1, new, past + new)
            if decoder_attention_mask is not None:
                # A padding query still sees itself, so that no row of the softmax is empty (NaN).
                self_mask = self_mask & decoder_attention_mask.bool()[:, None, None, :] | (k_pos == q_pos)
                # (rows, 1, new, past + new)
        elif t > 1:
            is_causal = True  # the plain lower-triangular mask: SDPA's fast path
        y = self.embed(decoder_input_ids, self.target_embeddings(), past)  # (rows, new, d_model)
        hidden_states, self_attentions, cross_attentions = [y], [], []
        for i, layer in enumerate(self.decoder.layers):
            y, self_probs, cross_probs = layer(y, i, cache, self_mask, is_causal, output_attentions)
            hidden_states.append(y)
            self_attentions.append(self_probs)
            cross_attentions.append(cross_probs)
        if self.config.normalize_before:
            y = hidden_states[-1] = self.decoder.layer_norm(y)
        return DecoderOutput(
            logits=self.project(y) if project else None,
            last_hidden_state=y,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            self_attentions=tuple(self_attentions) if output_attentions else None,
            cross_attentions=tuple(cross_attentions) if output_attentions else None,
        )

    def project(self, states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-softmax logits (..., target vocab) of decoder states (..., d_model): states E^T + b (sec. 3.4).
        out: a (rows, target vocab) tensor to write the logits of 2-D states into (search reuses one buffer for
        every step: a fresh (rows, vocab) tensor per step costs page faults as large as the product). A model
        quantized by `ctxrep.translate.search.quantize_translator` projects in int8 (`int8_projection`) and ignores `out`."""
        int8 = getattr(self, "int8_projection", None)
        if int8 is not None:
            return int8(states)
        bias = self.final_logits_bias[0]
        if out is None or states.dim() != 2 or torch.is_grad_enabled():  # out= takes no autograd
            return F.linear(states, self.output_weight(), bias)
        if bool(bias.any()):
            return torch.addmm(bias, states, self.output_weight().t(), out=out)  # what F.linear runs, into `out`
        return torch.mm(states, self.output_weight().t(), out=out)  # a zero bias (as trained here): no bias copy

    def translation_loss(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        decoder_input_ids: torch.Tensor,
        labels: torch.Tensor,
        label_smoothing: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(label-smoothed loss, NLL, tokens), the losses summed over the labels that are not IGNORE_INDEX.

        The training step's fast path: the same numbers as the label-smoothed loss of `forward`'s logits, but
        the decoder states of padding positions are dropped before the output projection, so neither the
        (tokens x vocabulary) projection nor the softmax is computed for them. Per token (Szegedy et al. 2016,
        Vaswani et al. sec. 5.4; q'(k) = (1 - eps) [k = y] + eps / V):
            loss = (1 - eps) (-log p_y) + (eps / V) sum_k (-log p_k)
        computed by `projected_smoothed_loss` a few hundred tokens at a time. input_ids, attention_mask:
        (batch, src); decoder_input_ids, labels: (batch, tgt)."""
        if labels.shape != decoder_input_ids.shape:
            raise ValueError(
                f"labels have shape {tuple(labels.shape)}, expected {tuple(decoder_input_ids.shape)} "
                "(the shape of decoder_input_ids)"
            )
        memory = self.encode_source(input_ids, attention_mask).last_hidden_state
        cache = self.init_cache(memory, attention_mask)
        states = self.decode(decoder_input_ids, cache, project=False).last_hidden_state  # (batch, tgt, d_model)
        keep = labels != IGNORE_INDEX  # (batch, tgt)
        targets = labels[keep]  # (tokens,)
        loss, nll = projected_smoothed_loss(
            states[keep], self.output_weight(), self.final_logits_bias[0], targets, label_smoothing
        )
        return loss, nll, int(targets.numel())

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing's decoder input: decoder_start_token_id, then the labels but the last (-100 -> pad)."""
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == IGNORE_INDEX, self.config.pad_token_id)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        label_smoothing: float = 0.0,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput:
        """input_ids, attention_mask: (batch, src); decoder_input_ids: (batch, tgt), or None to shift `labels`
        right (labels: (batch, tgt), ending with </s>; pad and -100 do not count). The loss is the mean
        cross-entropy over the counted labels, label-smoothed by `label_smoothing` (Szegedy et al. 2016;
        torch's convention: epsilon spread over the whole vocabulary)."""
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids, or labels to derive them from (shifted right)")
            decoder_input_ids = self.shift_right(labels)
        enc = self.encode_source(input_ids, attention_mask, output_hidden_states, output_attentions)
        cache = self.init_cache(enc.last_hidden_state, attention_mask)
        dec = self.decode(decoder_input_ids, cache, decoder_attention_mask, output_hidden_states, output_attentions)
        loss = num_tokens = None
        if labels is not None:
            if labels.shape != decoder_input_ids.shape:
                raise ValueError(
                    f"labels have shape {tuple(labels.shape)}, expected {tuple(decoder_input_ids.shape)} "
                    "(the shape of decoder_input_ids)"
                )
            targets = labels.masked_fill(labels == self.config.pad_token_id, IGNORE_INDEX)
            num_tokens = int((targets != IGNORE_INDEX).sum())
            loss = F.cross_entropy(
                dec.logits.float().reshape(-1, dec.logits.shape[-1]),  # (batch * tgt, vocab)
                targets.reshape(-1),  # (batch * tgt,)
                ignore_index=IGNORE_INDEX,
                label_smoothing=label_smoothing,
            )
        return Seq2SeqOutput(
            logits=dec.logits,
            loss=loss,
            num_tokens=num_tokens,
            encoder_last_hidden_state=enc.last_hidden_state,
            encoder_hidden_states=enc.hidden_states,
            encoder_attentions=enc.attentions,
            decoder_hidden_states=dec.hidden_states,
            decoder_attentions=dec.self_attentions,
            cross_attentions=dec.cross_attentions,
        )

    # ---- Hugging Face's Marian folder format ----------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path) -> MarianMTModel:
        """A folder with config.json (model_type "marian", or ctxrep's "ctxrep_mt") and model.safetensors or
        pytorch_model.bin, as transformers' MarianMTModel (or MarianModel) saves it."""
        path = Path(path)
        hf_config = folders.read_config(path, MODEL_TYPES)
        config = MarianConfig.from_hf_dict(hf_config)
        state = folders.read_state_dict(path)
        if not any(k.startswith("model.") for k in state):  # saved from MarianModel: no "model." prefix, no head
            state = {f"model.{k}": v for k, v in state.items()}
        model = cls(config)
        model.load_hf_state_dict(state, source=str(path))
        model.eval()
        return model

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Copy weights named as in transformers into this model; refuse anything missing, unknown or mis-shaped."""
        state = dict(state)
        # Older transformers also saved each tied copy of the shared embedding and the sinusoidal tables; they are
        # known names, accepted only when they hold what they should be a copy of.
        for hf, original in _redundant_names(self.config).items():
            if hf in state:
                copy = state.pop(hf)
                expected = self.positions if original is None else state.get(original)
                if expected is not None and (
                    copy.shape != expected.shape or not torch.allclose(copy.float(), expected.float(), atol=1e-5)
                ):
                    raise CheckpointError(
                        f"{source}: {hf} differs from {original or 'the sinusoidal position table'}, of which it should "
                        "be a copy; this checkpoint was not trained as a Marian model that ctxrep can run"
                    )
        if "final_logits_bias" not in state:  # transformers lets it be missing too: zeros
            state["final_logits_bias"] = torch.zeros_like(self.final_logits_bias)
        folders.load_named_weights(self, state, hf_parameter_names(self.config), source, "a Marian encoder-decoder")

    def save_pretrained(self, path: str | Path, format: str = "auto") -> Path:
        """Write config.json + model.safetensors + generation_config.json.

        format "marian": transformers' MarianMTModel.from_pretrained loads it (post-LN models only); "ctxrep":
        ctxrep's own model_type "ctxrep_mt" (any model); "auto": "marian" unless the model is pre-LN."""
        if format not in ("auto", "marian", "ctxrep"):
            raise ValueError(f"format must be 'auto', 'marian' or 'ctxrep', got {format!r}")
        pre_ln = self.config.normalize_before
        if format == "marian" and pre_ln:
            raise ValueError(
                "cannot save a pre-LayerNorm model (normalize_before=True) in Marian's format: transformers' "
                "MarianMTModel has no pre-LN variant and would run it post-LN; save with format='ctxrep'"
            )
        own = format == "ctxrep" or (format == "auto" and pre_ln)
        config = self.config.to_hf_dict()
        if own:
            config |= {"model_type": OWN_FORMAT, "architectures": ["ctxrep.MarianMTModel"], "normalize_before": pre_ln}
        path = folders.write_folder(path, config, folders.named_tensors(self, hf_parameter_names(self.config)))
        if not own:  # what transformers' generate() should do by default: Marian's conventions
            c = self.config
            generation = {
                "decoder_start_token_id": c.decoder_start_token_id,
                "eos_token_id": c.eos_token_id,
                "forced_eos_token_id": c.eos_token_id,
                "pad_token_id": c.pad_token_id,
                "bad_words_ids": [[c.pad_token_id]],
                "max_length": c.max_position_embeddings,
            }
            (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        return path


def _key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, seq) 1/0 -> (batch, 1, 1, seq) bool, or None when nothing is padding (SDPA's fast path)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]


def _redundant_names(config: MarianConfig) -> dict[str, str | None]:
    """Checkpoint names that duplicate another checkpoint tensor (tied copies), or the sinusoidal table (None)."""
    out: dict[str, str | None] = {f"model.{side}.embed_positions.weight": None for side in ("encoder", "decoder")}
    if config.share_encoder_decoder_embeddings:
        out |= {f"model.{side}.embed_tokens.weight": "model.shared.weight" for side in ("encoder", "decoder")}
    if config.tie_word_embeddings:
        out["lm_head.weight"] = (
            "model.shared.weight" if config.share_encoder_decoder_embeddings else "model.decoder.embed_tokens.weight"
        )
    return out


def hf_parameter_names(config: MarianConfig) -> dict[str, str]:
    """transformers' MarianMTModel name -> ctxrep's name, for every weight this model saves and loads."""
    names = {"model.shared.weight": "shared.weight", "final_logits_bias": "final_logits_bias"}
    if not config.share_encoder_decoder_embeddings:
        # transformers keeps no model.shared then: the encoder's table is model.encoder.embed_tokens.
        names = {
            "model.encoder.embed_tokens.weight": "shared.weight",
            "model.decoder.embed_tokens.weight": "decoder_embed_tokens.weight",
            "final_logits_bias": "final_logits_bias",
        }
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    attention = ("q_proj", "k_proj", "v_proj", "out_proj")
    per_encoder_layer = [f"self_attn.{p}" for p in attention] + [
        "self_attn_layer_norm",
        "fc1",
        "fc2",
        "final_layer_norm",
    ]
    per_decoder_layer = per_encoder_layer + [f"encoder_attn.{p}" for p in attention] + ["encoder_attn_layer_norm"]
    for side, count, per_layer in (
        ("encoder", config.encoder_layers, per_encoder_layer),
        ("decoder", config.decoder_layers, per_decoder_layer),
    ):
        for i in range(count):
            for module in per_layer:
                for p in ("weight", "bias"):
                    names[f"model.{side}.layers.{i}.{module}.{p}"] = f"{side}.layers.{i}.{module}.{p}"
        if config.normalize_before:
            for p in ("weight", "bias"):
                names[f"model.{side}.layer_norm.{p}"] = f"{side}.layer_norm.{p}"
    return names
