"""What every encoder-decoder shares (Marian, BART / mBART, T5): the decoder's key/value cache, cross-attention read
by a sentence's beams, the outputs, the training loss, and `EncoderDecoder`, the few methods one search and one
training loop need (fairseq's FairseqEncoder / FairseqIncrementalDecoder idea), written down once:

    encode_source(input_ids, attention_mask)  -> EncoderOutput        the encoder stack, once per sentence
    init_cache(memory, attention_mask, group) -> DecoderCache         every decoder layer's cross-attention keys and
                                                                      values, computed once; `group` rows per sentence
    decode(decoder_input_ids, cache)          -> DecoderOutput        the new target tokens only, appending their
                                                                      self-attention keys / values to the cache
    cache.reorder(rows), cache.keep(sentences)                        what beam search does to the cache
    project(states, out)                      -> logits               the output projection (tied or not, scaled,
                                                                      biased as the family's checkpoints are)

and, on top of them, written once for every family: `shift_right` (teacher forcing's decoder input: the decoder
start token, then the labels but the last), `forward` with the loss (transformers' arguments and logits),
`seq2seq_loss` (the training step's fast path: only real target tokens are projected), and the encoder interface's
`encode` (models/encoder.py): the encoder's layers, then the decoder's with the same text teacher-forced.

The Transformer layers of Vaswani et al. 2017 in the layout Marian and BART share (transformers' MarianModel is
"Copied from" BartModel): `Attention`, `EncoderLayer`, `DecoderLayer` (post-LN, or pre-LN with `normalize_before`:
mBART, ctxrep's pre-LN Marian), and the stacks over them (`TransformerEncoderDecoder`: each family writes only its
embeddings and its checkpoint's names). T5's layers differ (RMSNorm, relative position bias, no scaling) and live in
models/t5.py, over the same cache, cross-attention and base class.

    eq. 1   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    sec 3.2 MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    eq. 2   FFN(x) = act(x W_1 + b_1) W_2 + b_2
    sec 5.4 each sub-layer's output is LayerNorm(x + Sublayer(x)) (post-LN), or x + Sublayer(LayerNorm(x)) with a
            final LayerNorm after each stack (pre-LN, `normalize_before`; fairseq, mBART)

The encoder interface of an encoder-decoder (`teacher_forced_layers`, BART and T5): `hidden_states` are the encoder's
embedding output and its E layers, then the decoder's D layers (the decoder's embedding output is left out), so
num_layers = E + D. The decoder reads the text itself shifted right (`shift_right`: the start token, then every token
but the last), so decoder position i has read the start token and tokens 0..i-1 and, through cross-attention, the
whole encoded text: its state stands for token i, on the same grid as the encoder's (the state that predicts token i
from the tokens before it), as BartForSequenceClassification reads it at the final </s>. Batches are padded on the
right there (the causal mask then keeps padding out of every real position).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, recomputing
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import ACTIVATIONS
from ctxrep.modules.heads import merge_heads, split_heads
from ctxrep.modules.unpadding import Unpadding, key_mask_of

IGNORE_INDEX = -100  # a label that does not count in the loss (torch's cross_entropy default)


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

    def split(self, x: torch.Tensor, unpadding: Unpadding | None = None) -> torch.Tensor:
        return split_heads(x, self.num_heads, self.head_dim, unpadding)  # (batch, heads, seq, head_dim)

    def keys_values(self, x: torch.Tensor, unpadding: Unpadding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.k_proj(x), unpadding), self.split(self.v_proj(x), unpadding)  # each (b, heads, seq, hd)

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

    def __init__(self, config) -> None:
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
        q, k, v = (a.split(p(h), unpadding) for p in (a.q_proj, a.k_proj, a.v_proj))  # each (batch, heads, src, hd)
        context, probs = a.attend(q, k, v, key_mask, False, output_attentions)
        x = x + self.dropout(a.out_proj(merge_heads(context, unpadding)))  # (batch, src | tokens, d_model)
        if not self.pre_ln:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_ln else x
        x = x + self.dropout(self.fc2(self.activation_dropout(self.activation(self.fc1(h)))))  # eq. 2
        if not self.pre_ln:
            x = self.final_layer_norm(x)
        return x, probs


class DecoderLayer(nn.Module):
    """y = LN(y + CausalSelfAttn(y)); y = LN(y + CrossAttn(y, memory)); y = LN(y + FFN(y))  (sec. 3.1)."""

    def __init__(self, config) -> None:
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
        y = y + self.dropout(a.out_proj(merge_heads(context)))
        if not self.pre_ln:
            y = self.self_attn_layer_norm(y)

        # Encoder-decoder attention: queries from the decoder, keys/values from the encoder output, computed once
        # per sentence (cache.cross), read by the sentence's `group` rows (`cross_attention`).
        c = self.encoder_attn
        h = self.encoder_attn_layer_norm(y) if self.pre_ln else y
        context, cross_probs = cross_attention(c.split(c.q_proj(h)), cache, layer, c.attend, output_attentions)
        y = y + self.dropout(c.out_proj(merge_heads(context)))
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


# transformers' module names in each layer (Marian's and BART's checkpoints alike), each with a weight and a bias
_ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")
ENCODER_LAYER_MODULES = (
    *(f"self_attn.{p}" for p in _ATTENTION),
    "self_attn_layer_norm",
    "fc1",
    "fc2",
    "final_layer_norm",
)
DECODER_LAYER_MODULES = (
    *ENCODER_LAYER_MODULES,
    *(f"encoder_attn.{p}" for p in _ATTENTION),
    "encoder_attn_layer_norm",
)


# ---- the decoder's key/value cache ------------------------------------------------------------------------------


class DecoderCache:
    """What incremental decoding keeps between steps (fairseq's incremental state + encoder_out).

    cross[l]      layer l's encoder-decoder keys and values, each (sentences, heads, src, head_dim): computed once
                  per source sentence by `EncoderDecoder.init_cache`, shared by that sentence's `group` rows
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
        # the past each layer's last append started from, kept while gradients are on: activation checkpointing
        # runs a layer again in backward, and its second append must see what the first saw
        self._replay: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(cross)

    @property
    def num_sentences(self) -> int:
        return self.cross[0][0].shape[0]

    @property
    def length(self) -> int:
        """Target tokens decoded so far (the next token's position)."""
        kv = self.self_kv[0]
        return 0 if kv is None else kv[0].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' keys/values (rows, heads, new, head_dim); returns all of them so far. Run again by
        activation checkpointing (`recomputing()`), it returns what its first run returned and changes nothing."""
        if recomputing():
            past = self._replay[layer]
            return (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        past = self.self_kv[layer]
        if torch.is_grad_enabled():
            self._replay[layer] = past
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


def cross_attention(
    q: torch.Tensor, cache: DecoderCache, layer: int, attend, output_attentions: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Encoder-decoder attention of decoder queries q (rows, heads, new, head_dim) over layer `layer`'s keys / values
    in `cache.cross` (sentences, heads, src, head_dim), masked by the source mask. The `group` rows of a sentence
    (its beams) share them: their queries are stacked along the query axis instead of copying the keys / values
    `group` times. attend(q, k, v, mask, is_causal, output_attentions) is the family's eq. 1 (scaled or not).
    Returns (context (rows, heads, new, head_dim), probabilities (rows, heads, new, src) or None)."""
    rows, heads, t, hd = q.shape
    g = cache.group
    q = q.view(rows // g, g, heads, t, hd).transpose(1, 2)  # (sentences, heads, group, new, head_dim)
    q = q.reshape(rows // g, heads, g * t, hd)  # (sentences, heads, group * new, head_dim)
    k, v = cache.cross[layer]  # (sentences, heads, src, head_dim)
    context, probs = attend(q, k, v, cache.source_mask, False, output_attentions)
    context = context.view(rows // g, heads, g, t, hd).transpose(1, 2)  # (sentences, group, heads, new, head_dim)
    context = context.reshape(rows, heads, t, hd)  # (rows, heads, new, head_dim)
    if probs is not None:
        src = probs.shape[-1]
        probs = probs.view(rows // g, heads, g, t, src).transpose(1, 2)  # (sentences, group, heads, new, src)
        probs = probs.reshape(rows, heads, t, src)  # (rows, heads, new, src)
    return context, probs


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


# ---- the base class: what search, training and the encoder interface ask of every encoder-decoder ----------------


class EncoderDecoder(Encoder):
    """An encoder-decoder (module docstring). A family fills in `encode_source`, `init_cache`, `decode`,
    `output_weight` (and `output_bias`, `output_scale` where its checkpoints have them) and answers `layer_of`; its
    config has pad_token_id, eos_token_id and decoder_start_token_id. Everything else is written here once."""

    reads_segments = False

    def blocks(self) -> list[nn.Module]:
        """The encoder's layers, then the decoder's (Encoder.blocks): every family's two stacks are
        `encoder.layers` and `decoder.layers`."""
        return [*self.encoder.layers, *self.decoder.layers]

    def run_decoder_layers(
        self,
        y: torch.Tensor,
        run: Callable[[nn.Module, int, torch.Tensor], tuple],
        final: Callable[[torch.Tensor], torch.Tensor] | None,
        output_hidden_states: bool,
        output_attentions: bool,
        project: bool,
    ) -> DecoderOutput:
        """`decode`'s end, written once: the embedded target y (rows, new, d_model) through every decoder layer
        (`run(layer, i, y)` -> (y, self-attention probs, cross-attention probs)), `final` (the last norm) on the top
        state, and the DecoderOutput with the logits (project) and what was asked for."""
        hidden_states, self_attentions, cross_attentions = [y], [], []
        for i, layer in enumerate(self.decoder.layers):
            y, self_probs, cross_probs = run(layer, i, y)
            hidden_states.append(y)
            self_attentions.append(self_probs)
            cross_attentions.append(cross_probs)
        if final is not None:
            y = hidden_states[-1] = final(y)
        return DecoderOutput(
            logits=self.project(y) if project else None,
            last_hidden_state=y,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            self_attentions=tuple(self_attentions) if output_attentions else None,
            cross_attentions=tuple(cross_attentions) if output_attentions else None,
        )

    # The encoder interface gives the decoder's layers too, teacher-forced (BART, T5); False: the encoder's only
    # (Marian: its decoder reads another language than the text given).
    teacher_forced_layers: bool = True
    # config fields of the two stacks' depths (transformers' names differ by family)
    stack_fields: tuple[str, str] = ("encoder_layers", "decoder_layers")
    output_scale: float = 1.0  # decoder states are multiplied by this before the output projection (tied T5)
    # The family reads its folder's tokenizer with its special-token template (BART's "<s> A </s>", T5's "A </s>");
    # False: ids then </s> (Marian: `ctxrep mt train`'s tokenizer.json, OPUS-MT's SentencePiece files)
    reads_template: bool = True

    # ---- what the search reads (transformers' generation_config of the family's folders) ----

    @property
    def banned_ids(self) -> tuple[int, ...]:
        """Token ids never generated (their log-probability -inf after the softmax); none by default."""
        return ()

    @property
    def forces_eos(self) -> bool:
        """Whether </s> is forced at the maximum length (transformers' forced_eos_token_id); else a hypothesis
        still running there ends without it, as generate() leaves it."""
        return True

    @classmethod
    def from_pretrained(cls, path) -> EncoderDecoder:
        """The Encoder base's loading (models/encoder.py), with config.json checked before any weight is read."""
        path = Path(path)
        with folders.config_errors(path):
            cls.config_class.from_hf_dict(folders.read_config(path, cls.checkpoint.model_types))
        return super().from_pretrained(path)

    # ---- the two stacks ----

    @property
    def encoder_depth(self) -> int:
        return getattr(self.config, self.stack_fields[0])

    @property
    def decoder_depth(self) -> int:
        return getattr(self.config, self.stack_fields[1])

    @property
    def num_layers(self) -> int:
        """E + D with `teacher_forced_layers` (the encoder's layers, then the decoder's), else E."""
        return self.encoder_depth + (self.decoder_depth if self.teacher_forced_layers else 0)

    @property
    def decoder_from(self) -> int | None:
        """The first entry of `hidden_states` that is a decoder layer's output (E + 1), or None without them."""
        return self.encoder_depth + 1 if self.teacher_forced_layers else None

    def encode_source(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        raise NotImplementedError

    def init_cache(self, memory: torch.Tensor, attention_mask: torch.Tensor | None, group: int = 1) -> DecoderCache:
        raise NotImplementedError

    def decode(
        self,
        decoder_input_ids: torch.Tensor,
        cache: DecoderCache,
        decoder_attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        project: bool = True,
    ) -> DecoderOutput:
        raise NotImplementedError

    def output_weight(self) -> torch.Tensor:
        """The output projection (target vocab, d_model)."""
        raise NotImplementedError

    def output_bias(self) -> torch.Tensor | None:
        """A constant bias on the logits (target vocab,), or None."""
        return None

    def project(self, states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-softmax logits (..., target vocab) of decoder states (..., d_model): (output_scale * states) W^T + b.
        out: a (rows, target vocab) tensor to write the logits of 2-D states into (search reuses one buffer for
        every step: a fresh (rows, vocab) tensor per step costs page faults as large as the product). A model
        quantized by `ctxrep.translate.search.quantize_translator` projects in int8 (`int8_projection`) and ignores
        `out`."""
        int8 = getattr(self, "int8_projection", None)
        if int8 is not None:
            return int8(states)
        if self.output_scale != 1.0:
            states = states * self.output_scale
        bias = self.output_bias()
        if out is None or states.dim() != 2 or torch.is_grad_enabled():  # out= takes no autograd
            return F.linear(states, self.output_weight(), bias)
        if bias is not None and bool(bias.any()):
            return torch.addmm(bias, states, self.output_weight().t(), out=out)  # what F.linear runs, into `out`
        return torch.mm(states, self.output_weight().t(), out=out)  # no bias, or a zero one: no bias copy

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing's decoder input: decoder_start_token_id, then the labels but the last (-100 -> pad), as
        transformers' shift_tokens_right (BART, Marian) and T5's _shift_right."""
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == IGNORE_INDEX, self.config.pad_token_id)

    def seq2seq_loss(
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
        weight = self.output_weight()
        bias = self.output_bias()
        loss, nll = projected_smoothed_loss(
            states[keep] * self.output_scale,
            weight,
            weight.new_zeros(weight.shape[0]) if bias is None else bias,
            targets,
            label_smoothing,
        )
        return loss, nll, int(targets.numel())

    def translation_loss(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Deprecated: `seq2seq_loss` (the same numbers, for every encoder-decoder); goes in 0.3."""
        warnings.warn(
            "translation_loss is deprecated and goes in ctxrep 0.3; use seq2seq_loss (the same arguments)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.seq2seq_loss(*args, **kwargs)

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
        torch's convention: epsilon spread over the whole vocabulary). As transformers' *ForConditionalGeneration."""
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

    # ---- the encoder interface (models/encoder.py) ----

    def encode(
        self, batch, output_attentions: bool = False, num_layers: int | None = None, padded: bool = False
    ) -> EncoderOutput:
        """batch["input_ids"], ["attention_mask"] (batch, seq), padded on the right. With `teacher_forced_layers`:
        the encoder's hidden states, then the decoder's layers with the same text shifted right into the decoder
        (module docstring); `attentions` the encoder's self-attention, then the decoder's (causal) self-attention,
        each (batch, heads, seq, seq); `cross_attentions` each decoder layer's attention over the encoded text. A
        batch the encoder runs unpadded has 0 at padding in the decoder's states too. Without: the encoder's."""
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        e = self.encoder_depth
        stop = self.num_layers if num_layers is None else num_layers
        enc = self.encode_source(ids, mask, True, output_attentions, min(stop, e), padded)
        if not self.teacher_forced_layers or stop <= e:
            return enc
        cache = self.init_cache(enc.last_hidden_state, mask)
        dec = self.decode(self.shift_right(ids), cache, None, True, output_attentions, project=False)
        decoder_states = list(dec.hidden_states[1 : 1 + stop - e])  # the decoder's embedding output left out
        if mask is not None and self.unpadding(mask, padded) is not None:  # as the unpadded encoder: 0 at padding
            real = mask[:, :, None].to(decoder_states[0].dtype)  # (batch, seq, 1)
            decoder_states = [h * real for h in decoder_states]
        hidden = (*enc.hidden_states, *decoder_states)
        return EncoderOutput(
            last_hidden_state=hidden[-1],
            hidden_states=hidden,
            attentions=(*enc.attentions, *dec.self_attentions[: stop - e]) if output_attentions else None,
            cross_attentions=dec.cross_attentions[: stop - e] if output_attentions else None,
        )

    def heads_per_layer(self) -> list[int]:
        """The encoder's heads in its layers, then the decoder's (self-attention) heads in its layers."""
        heads = [self.config_heads(0)] * self.encoder_depth
        return heads + ([self.config_heads(1)] * self.decoder_depth if self.teacher_forced_layers else [])

    def config_heads(self, side: int) -> int:
        """Heads per layer of the encoder (side 0) or the decoder (1); a family with other field names answers."""
        return getattr(self.config, ("encoder_attention_heads", "decoder_attention_heads")[side])

    @property
    def num_heads(self) -> int:
        """The most heads any layer has (the width of head grids; a layer with fewer shows NaN in the rest)."""
        return max(self.heads_per_layer())

    def kept_heads(self) -> list[list[int]]:
        return [list(range(n)) for n in self.heads_per_layer()]


# ---- the Transformer stacks of Marian and BART ------------------------------------------------------------------


class TransformerEncoderDecoder(EncoderDecoder):
    """The stacks of `EncoderLayer` / `DecoderLayer` that Marian and BART share: `self.encoder.layers`,
    `self.decoder.layers` (and `self.encoder.layer_norm`, `self.decoder.layer_norm` when pre-LN). A family writes its
    embeddings: `embed_source(ids, unpadding)` and `embed_target(ids, start)` (position `start` onwards)."""

    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py): both
    # stacks' self-attention, the decoder's cross-attention (encoder_attn) and the feed-forwards
    adapter_targets = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")

    def embed_source(self, ids: torch.Tensor, unpadding: Unpadding | None) -> torch.Tensor:
        raise NotImplementedError

    def embed_target(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        raise NotImplementedError

    def encode_source(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """input_ids, attention_mask: (batch, src), </s> ending each sentence. hidden_states[0] is the embedding
        output, hidden_states[i] layer i's output (after the final LayerNorm for the last layer of a pre-LN model).
        `num_layers` stops after that many layers.

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        key_mask = key_mask_of(attention_mask)  # (batch, 1, 1, src) bool, or None without padding
        unpadding = self.unpadding(attention_mask, padded)
        x = self.embed_source(input_ids, unpadding)  # (batch, src, d_model) or (tokens, d_model)
        layers = self.encoder.layers[: num_layers if num_layers is not None else len(self.encoder.layers)]
        hidden_states, attentions = [x], []
        for layer in layers:
            x, probs = layer(x, key_mask, output_attentions, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        if self.config.normalize_before and len(layers) == len(self.encoder.layers):
            hidden_states[-1] = self.encoder.layer_norm(x)
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    def init_cache(self, memory: torch.Tensor, attention_mask: torch.Tensor | None, group: int = 1) -> DecoderCache:
        """Every decoder layer's cross-attention keys/values of the encoder output `memory` (batch, src, d_model),
        computed once per sentence; `group` decoder rows (beams) will read each sentence. A source batch that the
        encoder runs unpadded is projected unpadded too: zero keys/values at padding, which the source mask hides."""
        unpadding = self.unpadding(attention_mask)
        rows = memory if unpadding is None else unpadding.unpad(memory)  # (batch, src, d_model) or (tokens, d_model)
        cross = [layer.encoder_attn.keys_values(rows, unpadding) for layer in self.decoder.layers]  # (b, h, src, hd)
        return DecoderCache(cross, key_mask_of(attention_mask), group)

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
        target tokens (`seq2seq_loss`)."""
        self_mask, is_causal = self_attention_mask(decoder_input_ids, cache, decoder_attention_mask)
        y = self.embed_target(decoder_input_ids, cache.length)  # (rows, new, d_model)
        final = self.decoder.layer_norm if self.config.normalize_before else None
        run = lambda layer, i, y: layer(y, i, cache, self_mask, is_causal, output_attentions)  # noqa: E731
        return self.run_decoder_layers(y, run, final, output_hidden_states, output_attentions, project)


def self_attention_mask(
    decoder_input_ids: torch.Tensor, cache: DecoderCache, decoder_attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor | None, bool]:
    """The decoder's self-attention mask for new tokens (rows, new) after cache.length past ones: (mask, is_causal).
    mask (rows or 1, 1, new, past + new) bool, True where a query may read a key: causal, and not at padding keys of
    decoder_attention_mask (rows, past + new); a padding query still reads itself, so that no row of the softmax is
    empty (NaN). (None, True): the plain lower-triangular mask (SDPA's fast path); (None, False) for one new token
    and no padding: it reads every key."""
    rows, t = (int(n) for n in decoder_input_ids.shape)  # plain ints, also under tracing
    past = cache.length
    if rows != cache.num_sentences * cache.group:
        raise ValueError(
            f"decoder_input_ids has {rows} rows but the cache holds {cache.num_sentences} sentences x "
            f"{cache.group} rows; pass one row per sentence and beam"
        )
    if decoder_attention_mask is None and not (t > 1 and past > 0):
        return None, t > 1
    device = decoder_input_ids.device
    q_pos = torch.arange(past, past + t, device=device)[:, None]  # (new, 1)
    k_pos = torch.arange(past + t, device=device)[None, :]  # (1, past + new)
    mask = (k_pos <= q_pos)[None, None]  # (1, 1, new, past + new)
    if decoder_attention_mask is not None:
        mask = mask & decoder_attention_mask.bool()[:, None, None, :] | (k_pos == q_pos)  # (rows, 1, new, past + new)
    return mask, False
