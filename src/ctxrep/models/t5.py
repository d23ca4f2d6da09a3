"""T5's encoder (Raffel et al. 2020): pre-RMSNorm layers, no biases, a bucketed relative position bias, no scaling.

    x_0 = dropout(E[tokens])                                          (no position embeddings)
    a   = x + Attn(RMSNorm(x));   x' = a + FFN(RMSNorm(a))            (pre-norm; Raffel et al. 2020, sec. 2.1)
    out = RMSNorm(x_L)                                                 (the encoder's final norm)

    RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)                         (Zhang & Sennrich 2019: no mean, no bias)
    Attn       = softmax(Q K^T + b_h(bucket(j - i)) + mask) V          (no 1/sqrt(d_k): folded into the init)
    FFN        = W_o relu(W_i x)                                        feed_forward_proj "relu" (T5 v1.0)
               = W_o (gelu_tanh(W_i0 x) * W_i1 x)                       "gated-gelu" (T5 v1.1, flan-t5; Shazeer 2020)

The relative position bias table b (num_buckets x heads) lives in the first layer's attention, which computes
the bias from the positions 0..T-1 once; every later layer adds the same (1, heads, T, T) tensor (transformers'
T5Stack passes the first layer's bias on). Buckets, bidirectional (modules/relative_position.py): half for each
direction, distances below num_buckets / 4 exact, log-spaced up to relative_attention_max_distance beyond. Head
pruning (modules/heads.py; Michel et al. 2019) never prunes the table, which every layer reads: a pruned layer adds
only its kept heads' slice of the bias, b[:, kept_heads] in the original numbering (as transformers 4.x's
T5Attention did).

Checkpoints: a T5EncoderModel folder (shared.weight + encoder.*), or a whole T5 (T5Model,
T5ForConditionalGeneration: sentence-t5 and flan-t5 ship these), whose decoder.* and lm_head.weight are left
out by name (logged), as `DECODER_PREFIXES` lists; any other weight ctxrep does not know is refused.
`hidden_states` follow transformers: entry 0 the embeddings, entry l the output of layer l, the last one after the
final RMSNorm; `num_layers` stops early and then skips the final norm, so they stay a prefix of the full run's.

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded (modules/unpadding.py):
embeddings, RMSNorms, query / key / value, the output projections and feed-forwards on the (tokens, d_model) rows of
real tokens, re-padded only around the attention product, whose position bias and padding mask are those of the
padded grid; the same hidden states at real tokens (0 at padding).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, check_student_layers, student_widths
from ctxrep.models.folders import CheckpointError
from ctxrep.models.outputs import EncoderOutput
from ctxrep.models.seq2seq import (
    DecoderCache,
    DecoderOutput,
    EncoderDecoder,
    cross_attention,
    self_attention_mask,
)
from ctxrep.modules.activations import ACTIVATIONS
from ctxrep.modules.heads import PrunedHeadsConfig, check_head_mask, linear_subset, merge_heads, remaining, split_heads
from ctxrep.modules.relative_position import relative_position_bias
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding, key_mask_of

logger = logging.getLogger(__name__)

MODEL_TYPE = "t5"
# mT5 (Xue et al. 2021) is T5 v1.1's network (gated GELU, untied head) over a multilingual vocabulary: one file.
ARCHITECTURES = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel"}
WHOLE_ARCHITECTURES = {"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration"}
DEFAULT_MAX_TOKENS = 512  # T5's pre-training length; relative positions themselves have no limit
# The decoder half of T5Model / T5ForConditionalGeneration checkpoints, not part of the encoder.
DECODER_PREFIXES = ("decoder.", "lm_head.")


@dataclass
class T5Config(PrunedHeadsConfig):
    """Everything the encoder needs; field names are those of transformers' T5Config. pruned_heads
    (PrunedHeadsConfig): heads removed from each encoder layer, whose layers are built without them."""

    HEAD_COUNTS = ("num_layers", "num_heads")

    model_type: str = MODEL_TYPE  # "t5" or "mt5"
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"  # "relu", "gated-gelu", or "[gated-]ACT"
    pad_token_id: int = 0
    eos_token_id: int = 1
    n_positions: int = DEFAULT_MAX_TOKENS  # not read by the network: the window ctxrep cuts long texts into
    # the decoder (a whole T5: T5ForConditionalGeneration; models/t5.py's second half)
    num_decoder_layers: int | None = None  # None: num_layers
    decoder_start_token_id: int | None = None  # None: pad_token_id, as T5's _shift_right
    tie_word_embeddings: bool = True  # the LM head is the shared table (T5 v1.0); v1.1 / flan-t5: its own lm_head
    # states x d_model^-0.5 before the LM head; None: a tied T5's (v1.0) scaling. mT5 never scales: its configs untie
    # the head (transformers 4) or tie it without scaling (transformers 5's MT5ForConditionalGeneration)
    scale_decoder_outputs: bool | None = None

    def __post_init__(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"model_type must be one of {tuple(ARCHITECTURES)}, got {self.model_type!r}")
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or self.dense_act_fn not in ACTIVATIONS:
            raise ValueError(
                f"feed_forward_proj {self.feed_forward_proj!r} is not supported; use ACT or gated-ACT with ACT one of "
                f"{sorted(ACTIVATIONS)}"
            )
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_layers
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.pad_token_id
        if self.scale_decoder_outputs is None:
            self.scale_decoder_outputs = self.tie_word_embeddings and self.model_type == "t5"
        super().__post_init__()

    @property
    def is_gated_act(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def dense_act_fn(self) -> str:
        """transformers' T5Config: the part after "gated-", and gelu_new for the historical "gated-gelu"."""
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]

    @classmethod
    def from_hf_dict(cls, d: dict) -> T5Config:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})

    def to_hf_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(
            architectures=[ARCHITECTURES[self.model_type]],
            is_encoder_decoder=False,
            use_cache=False,
            dense_act_fn=self.dense_act_fn,
            is_gated_act=self.is_gated_act,
        )
        return self.write_pruned_heads(d)


class RMSNorm(nn.Module):
    """w * x / sqrt(mean(x^2) + eps): T5's LayerNorm, without mean subtraction or bias; mean taken in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)  # (batch, seq | tokens, 1)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)


class SelfAttention(nn.Module):
    """softmax(Q K^T + bias) V with bias-free projections; head width d_kv (heads * d_kv may differ from d_model).
    The first layer's attention owns the relative position table and computes the bias (`position_bias`) for every
    head, pruned or not (the table is never pruned: every layer reads it).

    Holds the layer's remaining heads only (`kept_heads`, original numbering), as bert.py's SelfAttention, and adds
    their rows of the bias. A head mask xi multiplies each head's output before W_o (Michel et al. 2019)."""

    def __init__(self, config: T5Config, has_relative_attention_bias: bool, layer: int = 0) -> None:
        super().__init__()
        self.kept_heads = config.kept_heads(layer)
        self.num_heads, self.head_dim = len(self.kept_heads), config.d_kv
        inner = self.num_heads * config.d_kv
        self.query = nn.Linear(config.d_model, inner, bias=False)
        self.key = nn.Linear(config.d_model, inner, bias=False)
        self.value = nn.Linear(config.d_model, inner, bias=False)
        self.output = nn.Linear(inner, config.d_model, bias=False)
        self.dropout_p = config.dropout_rate
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.relative_attention_bias = (
            nn.Embedding(config.relative_attention_num_buckets, config.num_heads)
            if has_relative_attention_bias
            else None
        )

    def position_bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """(1, num_heads, seq, seq): b_h(bucket(j - i)) over positions 0..seq-1, every head of the original
        numbering."""
        return relative_position_bias(
            self.relative_attention_bias, seq_len, self.num_buckets, self.max_distance, device
        )

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor,
        output_attentions: bool,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, d_model), or (tokens, d_model) with `unpadding`: then the projections read real tokens
        # only and q, k, v are re-padded (zeros, which the bias's padding mask hides) for the attention product.
        # bias: (batch or 1, num_heads, seq, seq), the position bias of every head (original numbering) plus the
        # padding mask (dtype's min at pad keys). head_mask: (num_heads,), original numbering.
        if self.num_heads < bias.shape[1]:  # a pruned layer: its own heads' slice of the shared bias
            bias = bias[:, self.kept_heads]  # (batch or 1, kept, seq, seq)
        q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (split_heads(y, self.num_heads, self.head_dim, unpadding) for y in (q, k, v))  # (b, heads, seq, d_kv)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            probs = (q @ k.transpose(-2, -1) + bias).softmax(dim=-1)  # (batch, heads, seq, seq); no 1/sqrt(d_k)
            context = F.dropout(probs, dropout_p, self.training) @ v
        else:
            probs = None
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p, scale=1.0
            )
        context = merge_heads(context, unpadding, head_mask, self.kept_heads)  # (batch, seq | tokens, inner)
        return self.output(context), probs

    def prune(self, heads: Iterable[int]) -> None:
        """Remove `heads` (original numbering; ones already removed are ignored): drop their rows of
        query/key/value and their columns of output (bias-free linears). The relative position table stays whole."""
        keep, rows = remaining(self.kept_heads, heads, self.head_dim)
        self.query = linear_subset(self.query, rows, dim=0)
        self.key = linear_subset(self.key, rows, dim=0)
        self.value = linear_subset(self.value, rows, dim=0)
        self.output = linear_subset(self.output, rows, dim=1)
        self.kept_heads, self.num_heads = keep, len(keep)


class FeedForward(nn.Module):
    """W_o act(W_i x), or gated: W_o (act(W_i0 x) * W_i1 x); no biases."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.gated = config.is_gated_act
        self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)  # W_i, or W_i0 when gated
        self.wi_gate = nn.Linear(config.d_model, config.d_ff, bias=False) if self.gated else None  # W_i1
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.activation = ACTIVATIONS[config.dense_act_fn]
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.activation(self.wi(x))  # (batch, seq | tokens, d_ff)
        if self.wi_gate is not None:
            h = h * self.wi_gate(x)
        return self.wo(self.dropout(h))


class EncoderLayer(nn.Module):
    """Pre-norm block: x = x + Attn(RMSNorm(x)); x = x + FFN(RMSNorm(x))."""

    def __init__(self, config: T5Config, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.attention = SelfAttention(config, has_relative_attention_bias=layer == 0, layer=layer)
        self.ffn_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.ffn = FeedForward(config)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, d_model), or (tokens, d_model) with `unpadding`
        a, probs = self.attention(self.attention_norm(x), bias, output_attentions, head_mask, unpadding)
        x = _clamp_fp16(x + self.dropout(a))
        return _clamp_fp16(x + self.dropout(self.ffn(self.ffn_norm(x)))), probs


def init_block(config: T5Config, attentions: Sequence[SelfAttention], ffn: FeedForward) -> None:
    """Mesh TensorFlow's init of one block, as transformers' T5PreTrainedModel: N(0, f / sqrt(fan_in)) projections
    (query additionally / sqrt(d_kv): the scaling T5 leaves out of attention), a relative table N(0, f / sqrt(d))."""
    f, d, d_kv, heads = config.initializer_factor, config.d_model, config.d_kv, config.num_heads
    for att in attentions:
        nn.init.normal_(att.query.weight, std=f * (d * d_kv) ** -0.5)
        for lin in (att.key, att.value):
            nn.init.normal_(lin.weight, std=f * d**-0.5)
        nn.init.normal_(att.output.weight, std=f * (heads * d_kv) ** -0.5)
        if att.relative_attention_bias is not None:
            nn.init.normal_(att.relative_attention_bias.weight, std=f * d**-0.5)
    for lin in (ffn.wi, ffn.wi_gate):
        if lin is not None:
            nn.init.normal_(lin.weight, std=f * d**-0.5)
    nn.init.normal_(ffn.wo.weight, std=f * config.d_ff**-0.5)


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    """In float16 the residual stream of T5 v1.1 / flan-t5 overflows; pull infinities back to the largest finite
    value minus 1,000, as transformers' T5Block does (a no-op in float32 and bfloat16)."""
    if x.dtype != torch.float16:
        return x
    top = torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(x).any(), top - 1000, top)
    return x.clamp(min=-limit, max=limit)


class T5EncoderModel(Encoder):
    """The encoder. `forward` follows transformers' T5EncoderModel: same arguments, same output fields."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_layers))
        self.final_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)
        self._init_weights()

    def _init_weights(self) -> None:
        """Mesh TensorFlow's init as transformers' T5PreTrainedModel: N(0, f) embeddings, N(0, f / sqrt(fan_in))
        projections (query additionally / sqrt(d_kv): the scaling T5 leaves out of attention)."""
        nn.init.normal_(self.embed_tokens.weight, std=self.config.initializer_factor)
        for layer in self.layers:
            init_block(self.config, [layer.attention], layer.ffn)

    # ---- the encoder interface (models/encoder.py) ----
    # max_tokens: T5's positions are relative, so no table limits the length; windows are cut at the pre-training
    # length (config n_positions, 512 for the published models), the length the bias buckets were trained on.
    config_fields = {
        "num_layers": "num_layers",
        "num_heads": "num_heads",
        "hidden_size": "d_model",
        "max_tokens": "n_positions",
    }
    embedding_table = "embed_tokens"
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = (
        "attention.query",
        "attention.key",
        "attention.value",
        "attention.output",
        "ffn.wi",
        "ffn.wi_gate",
        "ffn.wo",
    )

    @property
    def family(self) -> str:
        """The model_type: "t5", or "mt5" for the multilingual checkpoints."""
        return self.config.model_type

    reads_segments = False  # no token-type embeddings
    prepack_for_inference = True
    # Encoder.unpadding: BERT's share; benchmarks/unpad.py (T5-small, 8 x 128, 1 thread): 1.14x at 10% padding
    unpad_from = UNPAD_FROM

    can_prune_heads = True  # Encoder.prune_heads over attention_modules(); forward takes head_mask

    def layer_of(self, name: str) -> int:
        """embed_tokens 0; layers.i.* i + 1, except the relative position table in layer 0's attention, which every
        layer reads (the highest one that uses it: num_layers, models/encoder.py); final_norm num_layers."""
        parts = name.split(".")
        if name == "embed_tokens.weight":
            return 0
        if name == "layers.0.attention.relative_attention_bias.weight" or name == "final_norm.weight":
            return self.num_layers
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            if name in dict(self.named_parameters()):
                return int(parts[1]) + 1
        raise self.unknown_parameter(name)

    can_distill = True

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> T5EncoderModel:
        """A student T5EncoderModel with len(layers) layers: of this width, the embeddings, layers[j] as layer j (with
        the heads it kept here), the relative position table (which only the first layer holds, whichever teacher
        layer it copies; all heads) and the final norm copied; narrower (d_model), freshly initialised (the global
        torch RNG) with all of this model's heads, d_kv scaled with the width and d_ff in this model's ratio unless
        given."""
        layers = check_student_layers(layers, self.num_layers)
        c = self.config
        h, inner = student_widths(c.d_model, c.num_heads, c.d_ff, hidden_size, intermediate_size)
        same_width = h == c.d_model
        d_kv = c.d_kv if same_width else max(1, c.d_kv * h // c.d_model)
        pruned = c.pruned_heads_of(layers) if same_width else {}
        student = T5EncoderModel(
            dataclasses.replace(c, num_layers=len(layers), d_model=h, d_ff=inner, d_kv=d_kv, pruned_heads=pruned)
        )
        if same_width:
            student.embed_tokens.load_state_dict(self.embed_tokens.state_dict())
            student.final_norm.load_state_dict(self.final_norm.state_dict())
            table = self.layers[0].attention.relative_attention_bias.state_dict()
            for j, i in enumerate(layers):
                own = {k: v for k, v in self.layers[i].state_dict().items() if "relative_attention_bias" not in k}
                if j == 0:
                    own |= {f"attention.relative_attention_bias.{k}": v for k, v in table.items()}
                student.layers[j].load_state_dict(own)
        return student.train(self.training)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        head_mask: torch.Tensor | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """input_ids, attention_mask: (batch, seq). token_type_ids must be None or zero and position_ids None: T5
        has neither segment nor absolute position embeddings.

        head_mask: Michel et al.'s mask variables xi, (num_layers, num_heads) or (num_heads,) for every layer, in
        the original head numbering (entries of pruned heads are not read), as in BertModel.forward.
        `attentions` hold each layer's remaining heads: (batch, heads_per_layer()[l], seq, seq).

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("T5 has no token-type (segment) embeddings: pass token_type_ids=None")
        if position_ids is not None:
            raise ValueError("T5's positions are relative (from 0 in every sequence): pass position_ids=None")
        # the bias on the padded grid: positions 0..seq-1 of every row, the padding mask
        bias = self.layers[0].attention.position_bias(input_ids.shape[1], input_ids.device)
        bias = bias.to(self.embed_tokens.weight.dtype)  # (1, heads, seq, seq)
        if attention_mask is not None and not bool(attention_mask.all()):
            pad = ~attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, seq)
            bias = bias.masked_fill(pad, torch.finfo(bias.dtype).min)  # (batch, heads, seq, seq)
        if head_mask is not None:
            head_mask = check_head_mask(head_mask, self.num_layers, self.num_heads)  # (layers, heads)
        unpadding = self.unpadding(attention_mask, padded)
        if unpadding is not None:
            input_ids = unpadding.select(input_ids)  # (tokens,)
        x = self.dropout(self.embed_tokens(input_ids))  # (batch, seq, d_model) or (tokens, d_model)
        stop = num_layers if num_layers is not None else self.num_layers
        hidden_states, attentions = [x], []
        for i, layer in enumerate(self.layers[:stop]):
            x, probs = layer(x, bias, output_attentions, head_mask[i] if head_mask is not None else None, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        if stop == self.num_layers:
            hidden_states[-1] = self.dropout(self.final_norm(x))
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------
    # A T5EncoderModel folder, or a whole T5 whose decoder and LM head are left out by name (DECODER_PREFIXES).

    config_class = T5Config
    checkpoint = folders.CheckpointLayout(
        tuple(ARCHITECTURES),
        what="a T5 encoder",
        head_prefixes=DECODER_PREFIXES,
        head_noun="decoder and LM-head weights (a whole T5 checkpoint: they are not part of the encoder)",
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """The Encoder base's loading, once the tied table is under one name: shared.weight and
        encoder.embed_tokens.weight are one table; a checkpoint may store either or both."""
        state = dict(state)
        if "shared.weight" not in state and "encoder.embed_tokens.weight" in state:
            state["shared.weight"] = state["encoder.embed_tokens.weight"]
        tied = state.pop("encoder.embed_tokens.weight", None)
        if tied is not None and not torch.equal(tied, state["shared.weight"]):
            raise CheckpointError(
                f"{source}: encoder.embed_tokens.weight differs from shared.weight; T5's encoder reads one tied table"
            )
        super().load_hf_state_dict(state, source)


def hf_parameter_names(config: T5Config) -> dict[str, str]:
    """transformers' T5EncoderModel name -> ctxrep's name, for every weight of the encoder."""
    names = {"shared.weight": "embed_tokens.weight", "encoder.final_layer_norm.weight": "final_norm.weight"}
    ffn = {"wi_0": "wi", "wi_1": "wi_gate", "wo": "wo"} if config.is_gated_act else {"wi": "wi", "wo": "wo"}
    for i in range(config.num_layers):
        hf, our = f"encoder.block.{i}.layer", f"layers.{i}"
        for p, q in {"q": "query", "k": "key", "v": "value", "o": "output"}.items():
            names[f"{hf}.0.SelfAttention.{p}.weight"] = f"{our}.attention.{q}.weight"
        names[f"{hf}.0.layer_norm.weight"] = f"{our}.attention_norm.weight"
        for p, q in ffn.items():
            names[f"{hf}.1.DenseReluDense.{p}.weight"] = f"{our}.ffn.{q}.weight"
        names[f"{hf}.1.layer_norm.weight"] = f"{our}.ffn_norm.weight"
    names["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (
        "layers.0.attention.relative_attention_bias.weight"
    )
    return names


# ---- the decoder: a whole T5 (T5ForConditionalGeneration, MT5ForConditionalGeneration; flan-t5) ------------------
#
#   y_0 = dropout(E[decoder tokens])
#   a   = y + SelfAttn(RMSNorm(y))         causal; its own relative bias, unidirectional buckets (first decoder layer)
#   c   = a + CrossAttn(RMSNorm(a), memory)   no position bias; keys / values of the encoder output, once per sentence
#   y'  = c + FFN(RMSNorm(c))
#   out = dropout(RMSNorm(y_L));  logits = (d_model^-0.5 out) E^T (tied, T5 v1.0), or lm_head(out) (v1.1, flan-t5)


def t5_attend(dropout_p: float, training: bool):
    """eq. 1 without 1/sqrt(d_k), as models/seq2seq.py's attend(q, k, v, mask, is_causal, output_attentions) reads it:
    mask bool (True where a query may read a key) or an additive float bias (position bias + padding)."""

    def attend(q, k, v, mask, is_causal, output_attentions):
        p = dropout_p if training else 0.0
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)
        if not output_attentions:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=1.0), None
        scores = q @ k.transpose(-2, -1)  # (rows, heads, new, keys)
        probs = (scores if mask is None else scores + mask).softmax(dim=-1)
        return F.dropout(probs, p, training) @ v, probs

    return attend


class DecoderLayer(nn.Module):
    """Pre-norm block: y = y + SelfAttn(RMSNorm(y)); y = y + CrossAttn(RMSNorm(y)); y = y + FFN(RMSNorm(y)). The
    attentions are `SelfAttention` modules (their q / k / v / o projections; the first layer's self-attention holds
    the decoder's relative position table)."""

    def __init__(self, config: T5Config, layer: int) -> None:
        super().__init__()
        self.self_attn_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.self_attn = SelfAttention(config, has_relative_attention_bias=layer == 0)
        self.cross_attn_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.cross_attn = SelfAttention(config, has_relative_attention_bias=False)
        self.ffn_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.ffn = FeedForward(config)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(
        self, y: torch.Tensor, layer: int, cache: DecoderCache, bias: torch.Tensor, output_attentions: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        # y: (rows, new, d_model); bias: (rows or 1, heads, new, past + new), position bias + causal / padding mask
        a, c = self.self_attn, self.cross_attn
        attend = t5_attend(a.dropout_p, self.training)
        h = self.self_attn_norm(y)
        q, k, v = (split_heads(p(h), a.num_heads, a.head_dim) for p in (a.query, a.key, a.value))  # (rows, h, new, d)
        k, v = cache.append(layer, k, v)  # (rows, heads, past + new, d_kv)
        context, self_probs = attend(q, k, v, bias, False, output_attentions)
        y = _clamp_fp16(y + self.dropout(a.output(merge_heads(context))))
        q = split_heads(c.query(self.cross_attn_norm(y)), c.num_heads, c.head_dim)  # (rows, heads, new, d_kv)
        context, cross_probs = cross_attention(q, cache, layer, attend, output_attentions)
        y = _clamp_fp16(y + self.dropout(c.output(merge_heads(context))))
        return _clamp_fp16(y + self.dropout(self.ffn(self.ffn_norm(y)))), self_probs, cross_probs


class T5ForConditionalGeneration(EncoderDecoder):
    """A whole T5: `encoder` is the T5EncoderModel above (its embed_tokens the shared table), the decoder below it.
    `forward` follows transformers' T5ForConditionalGeneration (same arguments, same logits); search, training and
    the encoder interface (the encoder's layers, then the decoder's, teacher-forced) come from models/seq2seq.py."""

    stack_fields = ("num_layers", "num_decoder_layers")
    config_fields = {"hidden_size": "d_model", "max_tokens": "n_positions"}
    # LoRA's default places (Encoder.adapter_targets): the encoder's attention, the decoder's self- and
    # cross-attention, both stacks' feed-forwards
    adapter_targets = ("query", "key", "value", "output", "ffn.wi", "ffn.wi_gate", "ffn.wo")
    embedding_table = "encoder.embed_tokens"
    prepack_for_inference = True
    unpad_from = UNPAD_FROM  # the encoder runs a batch with this share of padding unpadded (encode_source)

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.encoder = T5EncoderModel(config)
        self.encoder.unpad_from = 0.0  # this model's rule decides, through encode_source's `padded`
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_decoder_layers))
        self.decoder.final_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.output_scale = config.d_model**-0.5 if config.scale_decoder_outputs else 1.0
        self._init_decoder()

    def _init_decoder(self) -> None:
        """The encoder's init (T5EncoderModel._init_weights) for the decoder's layers; an untied head N(0, f)."""
        for layer in self.decoder.layers:
            init_block(self.config, [layer.self_attn, layer.cross_attn], layer.ffn)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=self.config.initializer_factor)

    # ---- the encoder interface (models/encoder.py) ----

    @property
    def family(self) -> str:
        """The model_type: "t5", or "mt5"."""
        return self.config.model_type

    def config_heads(self, side: int) -> int:
        return self.config.num_heads

    def layer_of(self, name: str) -> int:
        """The encoder's depths as T5EncoderModel's (its relative table and final norm E); decoder.layers.j E + j + 1;
        the decoder's relative table (held by its first layer, read by all), its final norm and an untied LM head
        E + D."""
        e, top = self.encoder_depth, self.num_layers
        if name.startswith("encoder."):
            return self.encoder.layer_of(name.removeprefix("encoder."))
        parts = name.split(".")
        if name in ("decoder.layers.0.self_attn.relative_attention_bias.weight", "decoder.final_norm.weight") or (
            parts[0] == "lm_head"
        ):
            return top
        if parts[:2] == ["decoder", "layers"] and len(parts) > 3 and parts[2].isdigit():
            if int(parts[2]) < self.decoder_depth and name in dict(self.named_parameters()):
                return e + int(parts[2]) + 1
        raise self.unknown_parameter(name)

    @property
    def forces_eos(self) -> bool:
        """T5's folders force nothing: a hypothesis still running at the maximum length ends there."""
        return False

    # ---- the search interface (models/seq2seq.py) ----

    def output_weight(self) -> torch.Tensor:
        return self.encoder.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def encode_source(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """The encoder (T5EncoderModel.forward): hidden_states[E] after the encoder's final norm."""
        padded = padded or self.unpadding(attention_mask) is None
        return self.encoder(
            input_ids,
            attention_mask=attention_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            num_layers=num_layers,
            padded=padded,
        )

    def init_cache(self, memory: torch.Tensor, attention_mask: torch.Tensor | None, group: int = 1) -> DecoderCache:
        """Every decoder layer's cross-attention keys / values of the encoder output (batch, src, d_model), once."""
        cross = []
        for layer in self.decoder.layers:
            c = layer.cross_attn
            cross.append(tuple(split_heads(p(memory), c.num_heads, c.head_dim) for p in (c.key, c.value)))
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
        """The decoder on the new target tokens (rows, new) after cache.length past ones (seq2seq.py's contract)."""
        t, past = decoder_input_ids.shape[1], cache.length
        mask, is_causal = self_attention_mask(decoder_input_ids, cache, decoder_attention_mask)
        first = self.decoder.layers[0].self_attn
        bias = relative_position_bias(
            first.relative_attention_bias,
            t,
            first.num_buckets,
            first.max_distance,
            decoder_input_ids.device,
            bidirectional=False,
            past=past,
        ).to(self.encoder.embed_tokens.weight.dtype)  # (1, heads, new, past + new)
        if is_causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=bias.device).tril()[None, None]  # (1, 1, new, new)
        if mask is not None:
            bias = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)  # (rows or 1, heads, new, past + new)
        y = self.dropout(self.encoder.embed_tokens(decoder_input_ids))  # (rows, new, d_model)
        run = lambda layer, i, y: layer(y, i, cache, bias, output_attentions)  # noqa: E731
        final = lambda y: self.dropout(self.decoder.final_norm(y))  # noqa: E731
        return self.run_decoder_layers(y, run, final, output_hidden_states, output_attentions, project)

    # ---- Hugging Face folder format ----

    config_class = T5Config
    checkpoint = folders.CheckpointLayout(tuple(ARCHITECTURES), what="a whole T5 (encoder and decoder)")

    @classmethod
    def config_from_hf(cls, hf_config: dict, state) -> T5Config:
        """An lm_head.weight of its own (T5 v1.1, flan-t5 as older transformers saved them) unties the head,
        whatever config.json's tie_word_embeddings says (transformers 5 writes true for every T5)."""
        config = T5Config.from_hf_dict(hf_config)
        if config.pruned_heads:
            raise ValueError("pruned_heads: head pruning is for T5 encoders (T5EncoderModel folders), not a whole T5")
        head, shared = state.get("lm_head.weight"), state.get("shared.weight")
        if head is not None and shared is not None and not torch.equal(head, shared):
            config = dataclasses.replace(config, tie_word_embeddings=False)
        return config

    def hf_config(self) -> dict:
        d = self.config.to_hf_dict()
        d.update(architectures=[WHOLE_ARCHITECTURES[self.config.model_type]], is_encoder_decoder=True, use_cache=True)
        return d

    def checkpoint_names(self) -> dict[str, str]:
        names = {hf: f"encoder.{ours}" for hf, ours in hf_parameter_names(self.config).items()}
        attention = {"q": "query", "k": "key", "v": "value", "o": "output"}
        ffn = {"wi_0": "wi", "wi_1": "wi_gate", "wo": "wo"} if self.config.is_gated_act else {"wi": "wi", "wo": "wo"}
        for i in range(self.config.num_decoder_layers):
            hf, our = f"decoder.block.{i}.layer", f"decoder.layers.{i}"
            for p, q in attention.items():
                names[f"{hf}.0.SelfAttention.{p}.weight"] = f"{our}.self_attn.{q}.weight"
                names[f"{hf}.1.EncDecAttention.{p}.weight"] = f"{our}.cross_attn.{q}.weight"
            names[f"{hf}.0.layer_norm.weight"] = f"{our}.self_attn_norm.weight"
            names[f"{hf}.1.layer_norm.weight"] = f"{our}.cross_attn_norm.weight"
            for p, q in ffn.items():
                names[f"{hf}.2.DenseReluDense.{p}.weight"] = f"{our}.ffn.{q}.weight"
            names[f"{hf}.2.layer_norm.weight"] = f"{our}.ffn_norm.weight"
        names["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (
            "decoder.layers.0.self_attn.relative_attention_bias.weight"
        )
        names["decoder.final_layer_norm.weight"] = "decoder.final_norm.weight"
        if self.lm_head is not None:
            names["lm_head.weight"] = "lm_head.weight"
        return names

    def load_hf_state_dict(self, state, source: str = "checkpoint") -> None:
        """The Encoder base's loading, once the tied copies (each stack's embed_tokens; a tied lm_head) are checked
        against shared.weight and dropped."""
        state = dict(state)
        if "shared.weight" not in state and "encoder.embed_tokens.weight" in state:
            state["shared.weight"] = state["encoder.embed_tokens.weight"]
        tied = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"] + (
            ["lm_head.weight"] if self.lm_head is None else []
        )
        for name in tied:
            copy = state.pop(name, None)
            if copy is not None and not torch.equal(copy, state.get("shared.weight", copy)):
                raise CheckpointError(f"{source}: {name} differs from shared.weight, of which it is a tied copy")
        super().load_hf_state_dict(state, source)
