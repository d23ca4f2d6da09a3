"""MPNet's encoder (Song et al. 2020): BERT's post-LayerNorm layers plus a relative position bias in every attention.

    scores_h(i, j) = q_i . k_j / sqrt(d_k) + b_h(bucket(j - i))          (Song et al. 2020; T5's bias, Raffel et al.
    Attn = softmax(scores + padding mask) V                               2020, sec. 2.1)

The bias table b (num_buckets x heads) is one parameter shared by every layer: the bias is computed once per
forward pass, from the token positions 0..T-1 (not the position ids, so padding does not move it), and the same
(1, heads, T, T) tensor is added in every layer. Buckets as in T5 (modules/relative_position.py), bidirectional:
half the buckets for each direction, exact distances below 8, log-spaced up to 128 beyond (transformers'
MPNetEncoder, which always uses 32 buckets in that computation).

Head pruning (modules/heads.py; Michel et al. 2019) never touches the table, which every layer reads: a pruned
layer adds only its kept heads' slice of the bias, b[:, kept_heads], in the original head numbering.

Embeddings are RoBERTa's without token types: positions numbered from padding_idx + 1 over the non-pad tokens,
padding_idx fixed at 1 (as in transformers' MPNetEmbeddings, whatever pad_token_id says). The tanh pooler over the
first token is loaded when the checkpoint has it. Loading and saving follow transformers' MPNetModel names.

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded (modules/unpadding.py):
embeddings, query / key / value, the output projections, norms and feed-forwards on the (tokens, hidden) rows of
real tokens, re-padded only around the attention product. Position ids and the relative bias come from the padded
grid first, so they are the padded run's; the same hidden states at real tokens (0 at padding).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, check_length, check_student_layers, student_widths
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import ACTIVATIONS, check_activation
from ctxrep.modules.heads import (
    PrunedHeadsConfig,
    check_head_dim,
    check_head_mask,
    linear_subset,
    merge_heads,
    remaining,
    split_heads,
)
from ctxrep.modules.init_weights import normal_init
from ctxrep.modules.relative_position import relative_position_bias
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

MODEL_TYPE = "mpnet"
PADDING_IDX = 1  # transformers' MPNetEmbeddings.padding_idx: fixed, not read from the config
BUCKETS = 32  # the number of buckets transformers' MPNetEncoder.compute_position_bias uses
MAX_DISTANCE = 128


@dataclass
class MPNetConfig(PrunedHeadsConfig):
    """Everything needed to rebuild the network; field names are those of transformers' MPNetConfig.
    pruned_heads (PrunedHeadsConfig): heads removed from each layer, whose layers are built without them."""

    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 514
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    relative_attention_num_buckets: int = 32
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    add_pooling_layer: bool = True

    def __post_init__(self) -> None:
        check_head_dim(self.hidden_size, self.num_attention_heads)
        check_activation("hidden_act", self.hidden_act)
        if self.relative_attention_num_buckets < BUCKETS:
            raise ValueError(
                f"relative_attention_num_buckets is {self.relative_attention_num_buckets}, but MPNet's bias reads "
                f"{BUCKETS} buckets"
            )
        super().__post_init__()

    @property
    def max_tokens(self) -> int:
        """Positions start at padding_idx + 1, so two rows of the table are never used by a token."""
        return self.max_position_embeddings - PADDING_IDX - 1

    @classmethod
    def from_hf_dict(cls, d: dict) -> MPNetConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        del d["add_pooling_layer"]
        d["model_type"] = MODEL_TYPE
        d["architectures"] = ["MPNetModel"]
        return self.write_pruned_heads(d)


class Embeddings(nn.Module):
    """e_t = dropout(LN(W_word[x_t] + P[pos_t])), pos_t counting non-pad tokens from padding_idx + 1."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h, padding_idx=PADDING_IDX)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h, padding_idx=PADDING_IDX)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (batch, seq | tokens, hidden)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """softmax(QK^T / sqrt(d_k) + bias + mask) V, bias (1, heads, seq, seq) the shared relative position bias.

    Holds the layer's remaining heads only (`kept_heads`, original numbering), as bert.py's SelfAttention: its
    matrices are (kept * head_dim, hidden) and (hidden, kept * head_dim), and it adds the kept heads' rows of the
    shared bias. A head mask xi multiplies each head's output before the output projection (Michel et al. 2019)."""

    # Copied from ctxrep.models.bert.SelfAttention.__init__ with BertConfig->MPNetConfig
    def __init__(self, config: MPNetConfig, layer: int = 0) -> None:
        super().__init__()
        h = config.hidden_size
        self.kept_heads = config.kept_heads(layer)
        self.num_heads = len(self.kept_heads)
        self.head_dim = h // config.num_attention_heads
        inner = self.num_heads * self.head_dim
        self.query = nn.Linear(h, inner)
        self.key = nn.Linear(h, inner)
        self.value = nn.Linear(h, inner)
        self.output = nn.Linear(inner, h)
        self.dropout_p = config.attention_probs_dropout_prob
        # A fast path set by ctxrep.runtime.fast.quantize_int8: one int8 product for query, key and value (one
        # quantization of x instead of three); None runs the three projections above, the reference.
        self.query_key_value: nn.Module | None = None

    # Copied from ctxrep.models.bert.SelfAttention.project_qkv
    def project_qkv(
        self, x: torch.Tensor, unpadding: Unpadding | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x, each (batch, heads, seq, head_dim): the three projections, or the one int8 product that
        ctxrep.runtime.fast.quantize_int8 sets as `query_key_value`, split into heads (re-padded with `unpadding`)."""
        if self.query_key_value is None:
            q, k, v = self.query(x), self.key(x), self.value(x)
        else:
            q, k, v = self.query_key_value(x).chunk(3, dim=-1)
        q, k, v = (split_heads(y, self.num_heads, self.head_dim, unpadding) for y in (q, k, v))
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor,
        output_attentions: bool,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`: then the projections read real tokens only
        # and q, k, v are re-padded (zeros, which the bias's padding mask hides) for the attention product.
        # bias: (batch or 1, num_attention_heads, seq, seq) float, the position bias of every head (original
        # numbering) plus the padding mask (dtype's min). head_mask: (num_attention_heads,), original numbering.
        if self.num_heads < bias.shape[1]:  # a pruned layer: its own heads' slice of the shared bias
            bias = bias[:, self.kept_heads]  # (batch or 1, kept, seq, seq)
        q, k, v = self.project_qkv(x, unpadding)  # each (batch, heads, seq, head_dim)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim) + bias  # (batch, heads, seq, seq)
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ v
        else:
            probs = None
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)
        context = merge_heads(context, unpadding, head_mask, self.kept_heads)  # (batch, seq | tokens, kept dims)
        return self.output(context), probs

    # Copied from ctxrep.models.bert.SelfAttention.prune
    def prune(self, heads: Iterable[int]) -> None:
        """Remove `heads` (original numbering; ones already removed are ignored): drop their rows of
        query/key/value and their columns of output, so the layer computes less, not just zeros."""
        if self.query_key_value is not None:
            raise ValueError(
                "prune_heads: this attention runs a fused int8 query/key/value product (fast.quantize_int8); "
                "prune the float model, then quantize it"
            )
        keep, rows = remaining(self.kept_heads, heads, self.head_dim)
        self.query = linear_subset(self.query, rows, dim=0)
        self.key = linear_subset(self.key, rows, dim=0)
        self.value = linear_subset(self.value, rows, dim=0)
        self.output = linear_subset(self.output, rows, dim=1)
        self.kept_heads, self.num_heads = keep, len(keep)


class EncoderLayer(nn.Module):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    # Copied from ctxrep.models.bert.EncoderLayer.__init__ with BertConfig->MPNetConfig
    def __init__(self, config: MPNetConfig, layer: int = 0) -> None:
        super().__init__()
        h = config.hidden_size
        self.attention = SelfAttention(config, layer)
        self.attention_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(h, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`
        a, probs = self.attention(x, bias, output_attentions, head_mask, unpadding)
        x = self.attention_norm(x + self.dropout(a))
        f = self.output(self.activation(self.intermediate(x)))
        return self.output_norm(x + self.dropout(f)), probs


class MPNetModel(Encoder):
    """The encoder. `forward` follows transformers' MPNetModel: same arguments, same output fields."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_hidden_layers))
        # One table for every layer: b_h(bucket), (num_buckets, heads).
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        normal_init(module, self.config.initializer_range)

    # ---- the encoder interface (models/encoder.py) ----
    config_fields = Encoder.config_fields | {"max_tokens": "max_tokens"}  # positions from padding_idx + 1
    embedding_table = "embeddings.word_embeddings"
    family = MODEL_TYPE
    reads_segments = False  # no token-type embeddings
    prepack_for_inference = True
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

    can_prune_heads = True  # Encoder.prune_heads over attention_modules(); forward takes head_mask

    def layer_of(self, name: str) -> int:
        """embeddings.* 0; layers.i.* i + 1; the shared relative_attention_bias (read by every layer: the highest
        one that uses it, models/encoder.py) and the pooler num_layers."""
        parts = name.split(".")
        if parts[0] == "embeddings" and name in dict(self.named_parameters()):
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        if name == "relative_attention_bias.weight" or (parts[0] == "pooler" and self.pooler is not None):
            return self.num_layers
        raise self.unknown_parameter(name)

    fuses_qkv = True  # every layer's attention: query, key and value read the same x
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = ("query", "key", "value", "intermediate", "output")  # "output": attention's and the FFN's

    can_distill = True

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> MPNetModel:
        """A student MPNetModel with len(layers) layers: of this width, the embeddings, the shared relative position
        table, layers[j] as layer j (with the heads it kept here) and the pooler copied; narrower (hidden_size),
        freshly initialised (the global torch RNG), with all of this model's heads and its intermediate ratio unless
        given."""
        layers = check_student_layers(layers, self.num_layers)
        c = self.config
        h, inner = student_widths(
            c.hidden_size, c.num_attention_heads, c.intermediate_size, hidden_size, intermediate_size
        )
        same_width = h == c.hidden_size
        pruned = c.pruned_heads_of(layers) if same_width else {}
        config = dataclasses.replace(
            c, num_hidden_layers=len(layers), hidden_size=h, intermediate_size=inner, pruned_heads=pruned
        )
        student = MPNetModel(config)
        if same_width:
            for name in ("embeddings", "relative_attention_bias", "pooler"):
                if getattr(student, name) is not None:
                    getattr(student, name).load_state_dict(getattr(self, name).state_dict())
            for j, i in enumerate(layers):
                student.layers[j].load_state_dict(self.layers[i].state_dict())
        return student.train(self.training)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Non-pad tokens count up from padding_idx + 1; pad tokens sit at padding_idx (fairseq's make_positions)."""
        not_pad = input_ids.ne(PADDING_IDX).long()
        return torch.cumsum(not_pad, dim=1) * not_pad + PADDING_IDX

    def position_bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """(1, heads, seq, seq): b_h(bucket(j - i)) from the shared table, over positions 0..seq-1."""
        return relative_position_bias(self.relative_attention_bias, seq_len, BUCKETS, MAX_DISTANCE, device)

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
        """input_ids, attention_mask: (batch, seq); token_type_ids must be None or zero (MPNet has none).
        `num_layers` stops after that many layers (and skips the pooler).

        head_mask: Michel et al.'s mask variables xi, (num_layers, num_heads) or (num_heads,) for every layer, in
        the original head numbering (entries of pruned heads are not read), as in BertModel.forward.
        `attentions` hold each layer's remaining heads: (batch, heads_per_layer()[l], seq, seq).

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        check_length(input_ids.shape[1], self.max_tokens)
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("MPNet has no token-type (segment) embeddings: pass token_type_ids=None")
        if position_ids is None:
            position_ids = self.position_ids(input_ids)  # from the padded grid, before any unpadding
        bias = self.position_bias(input_ids.shape[1], input_ids.device)  # (1, heads, seq, seq)
        unpadding = self.unpadding(attention_mask, padded)
        if unpadding is not None:  # each (tokens,)
            input_ids, position_ids = unpadding.select(input_ids), unpadding.select(position_ids)
        x = self.embeddings(input_ids, position_ids)  # (batch, seq, hidden) or (tokens, hidden)
        bias = bias.to(x.dtype)
        if attention_mask is not None and not bool(attention_mask.all()):
            pad = ~attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, seq)
            bias = bias.masked_fill(pad, torch.finfo(bias.dtype).min)  # (batch, heads, seq, seq)
        if head_mask is not None:
            head_mask = check_head_mask(head_mask, self.num_layers, self.num_heads)  # (layers, heads)
        hidden_states, attentions = [x], []
        for i, layer in enumerate(self.layers[: num_layers if num_layers is not None else len(self.layers)]):
            xi = head_mask[i] if head_mask is not None else None
            x, probs = layer(x, bias, output_attentions, xi, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        out = EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)
        if self.pooler is not None and num_layers is None:
            out.pooler_output = torch.tanh(self.pooler(out.last_hidden_state[:, 0]))  # (batch, hidden)
        return out

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------

    config_class = MPNetConfig
    checkpoint = folders.CheckpointLayout(
        (MODEL_TYPE,),
        what="an MPNet encoder",
        prefix="mpnet.",  # MPNetForMaskedLM / task models: the encoder under 'mpnet.', heads not loaded
        prefix_marker="mpnet.encoder.",
        head_prefixes=("lm_head.", "classifier.", "qa_outputs."),
        buffers=("embeddings.position_ids",),  # transformers' precomputed position ids, not a weight
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    # Copied from ctxrep.models.bert.BertModel.config_from_hf with BertConfig->MPNetConfig
    @classmethod
    def config_from_hf(cls, hf_config: dict, state: dict[str, torch.Tensor]) -> MPNetConfig:
        """A checkpoint without a pooler (ELECTRA's, some converted ones) builds none: the config follows the weights."""
        return MPNetConfig.from_hf_dict(hf_config | {"add_pooling_layer": "pooler.dense.weight" in state})


def hf_parameter_names(config: MPNetConfig) -> dict[str, str]:
    """transformers' MPNetModel name -> ctxrep's name, for every weight of the encoder."""
    names = {
        "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
        "encoder.relative_attention_bias.weight": "relative_attention_bias.weight",
    }
    per_layer = {
        "attention.attn.q": "attention.query",
        "attention.attn.k": "attention.key",
        "attention.attn.v": "attention.value",
        "attention.attn.o": "attention.output",
        "attention.LayerNorm": "attention_norm",
        "intermediate.dense": "intermediate",
        "output.dense": "output",
        "output.LayerNorm": "output_norm",
    }
    names |= folders.layer_names(config.num_hidden_layers, "encoder.layer", per_layer)
    if config.add_pooling_layer:
        names |= {f"pooler.dense.{p}": f"pooler.{p}" for p in ("weight", "bias")}
    return names
