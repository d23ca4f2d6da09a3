"""DeBERTa-v2 and DeBERTa-v3: a post-LN encoder with disentangled attention over log-bucketed relative positions.

He et al. 2021 (DeBERTa, ICLR), sec. 3.1: each token is represented by its content H_i, and each distance by a
relative-position vector P_{delta}; the attention score of query i and key j sums three terms

    A_ij = Q^c_i K^c_j^T  +  Q^c_i K^r_{delta(i,j)}^T  +  K^c_j Q^r_{delta(j,i)}^T                    (eq. 2, 4)
           content->content  content->position (c2p)    position->content (p2c)

    Q^c = H W_q, K^c = H W_k, V^c = H W_v;  K^r = P W_{k,r}, Q^r = P W_{q,r};  H_o = softmax(A / sqrt(3d)) V^c

where delta(i, j) is the distance i - j clipped to [-k, k) and shifted to [0, 2k) (eq. 3), and the sqrt(3d) scale
counts the terms actually used (sqrt(d * (1 + [c2p] + [p2c]))). DeBERTa-v2 (the published v2 / v3 checkpoints,
transformers' DebertaV2Model) adds:
  - log buckets (`position_buckets`): distances within +-buckets/2 are exact, longer ones share log-spaced buckets
    up to `max_relative_positions`;
  - `share_att_key`: W_{k,r} = W_k and W_{q,r} = W_q (no separate position projections);
  - `norm_rel_ebd="layer_norm"`: the relative-embedding table P goes through a LayerNorm before use;
  - `conv_kernel_size` > 0: a convolution over the embedding output added to the first layer's output
    (DeBERTa-v2-xlarge's "nGiE", sec. 5.3 of the v2 release notes); v3 has none;
  - `position_biased_input=False` (v2 / v3): no absolute position embeddings at the input;
  - type_vocab_size 0 (v3): no segment embeddings, so token_type_ids are not read.

Heads can be removed for real (Michel et al. 2019; `prune_heads`, `config.pruned_heads` in the original numbering):
a head owns its head_dim rows of W_q, W_k, W_v (and of W_{k,r}, W_{q,r} without share_att_key) and its columns of
the output projection. The table P and its LayerNorm are read by every layer and every head, so they are never
pruned: the remaining heads project all of P through their own rows. The scale sqrt(d * factor) counts head_dim and
the attention terms, not heads, so it does not change. transformers' DebertaV2Model cannot prune heads, so a pruned
folder loads back in ctxrep only (transformers refuses its narrower projections).

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded (modules/unpadding.py):
embeddings, query / key / value, the output projections, norms and feed-forwards on the (tokens, hidden) rows of
real tokens. q and k are re-padded for the attention product and for c2p / p2c, whose relative positions delta(i, j)
are those of the padded grid; the convolution reads the re-padded embeddings (zeros at padding, as before). The
same hidden states at real tokens (0 at padding).

Reads top to bottom: config, relative positions, embeddings, attention, layer, encoder, then the loader and saver
for the Hugging Face folder format (config.json + model.safetensors / pytorch_model.bin).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, check_length, check_student_layers, student_widths
from ctxrep.models.folders import CheckpointError
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
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding, key_mask_of

logger = logging.getLogger(__name__)

MODEL_TYPE = "deberta-v2"


@dataclass
class DebertaV2Config(PrunedHeadsConfig):
    """Everything needed to rebuild the network; field names and defaults are those of transformers' config.json
    (DebertaV2Config, whose defaults are DeBERTa-v2-xlarge's; the extra keys default as transformers reads them).
    pruned_heads (PrunedHeadsConfig): heads removed from each layer, whose layers are built without them."""

    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-7
    pad_token_id: int = 0
    embedding_size: int | None = None  # None: hidden_size (else projected up by embed_proj, no bias)
    position_biased_input: bool = True  # absolute position embeddings added at the input (v1); v2 / v3: False
    relative_attention: bool = False  # the c2p / p2c terms with relative-position embeddings
    pos_att_type: list[str] = field(default_factory=list)  # subset of ["c2p", "p2c"]; config.json may say "p2c|c2p"
    max_relative_positions: int = -1  # k of eq. 3; < 1 means max_position_embeddings
    position_buckets: int = -1  # > 0: log buckets, the table has 2 * position_buckets rows
    share_att_key: bool = False  # W_{k,r} = W_k, W_{q,r} = W_q
    norm_rel_ebd: str = "none"  # "layer_norm": LayerNorm over the relative-embedding table
    conv_kernel_size: int = 0  # > 0: the convolution beside the first layer
    conv_groups: int = 1
    conv_act: str = "tanh"

    def __post_init__(self) -> None:
        if isinstance(self.pos_att_type, str):  # the published configs write "p2c|c2p"
            self.pos_att_type = [x.strip() for x in self.pos_att_type.lower().split("|") if x.strip()]
        self.pos_att_type = list(self.pos_att_type or [])
        bad = [t for t in self.pos_att_type if t not in ("c2p", "p2c")]
        if bad:
            raise ValueError(f"pos_att_type may hold 'c2p' and 'p2c', not {bad}")
        check_head_dim(self.hidden_size, self.num_attention_heads)
        for name in ("hidden_act", "conv_act"):
            check_activation(name, getattr(self, name))
        norms = {x.strip() for x in self.norm_rel_ebd.lower().split("|")}
        if not norms <= {"none", "layer_norm"}:
            raise ValueError(f"norm_rel_ebd {self.norm_rel_ebd!r} is not supported; use 'none' or 'layer_norm'")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        super().__post_init__()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_relative(self) -> int:
        """k: the largest distance with its own embedding (before bucketing)."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def att_span(self) -> int:
        """Half the number of relative-embedding rows: buckets when bucketed, else k."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative

    @property
    def layer_norm_rel(self) -> bool:
        return "layer_norm" in {x.strip() for x in self.norm_rel_ebd.lower().split("|")}

    @property
    def scale_factor(self) -> int:
        """1 + one per relative term: the sqrt(3d) of eq. 4 when both are used."""
        return 1 + (("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type) if self.relative_attention else 0)

    @classmethod
    def from_hf_dict(cls, d: dict) -> DebertaV2Config:
        if d.get("attention_head_size") not in (None, d.get("hidden_size", 1536) // d.get("num_attention_heads", 24)):
            raise CheckpointError(
                f"attention_head_size={d['attention_head_size']} differs from hidden_size / num_attention_heads; "
                "ctxrep's DeBERTa implements heads of hidden_size / num_attention_heads only"
            )
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names and v is not None}
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d["model_type"] = MODEL_TYPE
        d["architectures"] = ["DebertaV2Model"]
        if d["embedding_size"] == self.hidden_size:
            del d["embedding_size"]
        return self.write_pruned_heads(d)

    def student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> DebertaV2Config:
        """A distillation student's config: len(layers) layers; narrower (fresh embeddings) when hidden_size is.
        Of this width the student keeps the heads its layers had here (pruned_heads follow their layers); a narrower
        one has them all."""
        h, inner = student_widths(
            self.hidden_size, self.num_attention_heads, self.intermediate_size, hidden_size, intermediate_size
        )
        config = copy.deepcopy(self)
        config.num_hidden_layers = len(layers)
        if h != self.hidden_size:
            config.hidden_size, config.intermediate_size, config.embedding_size = h, inner, h
            config.pruned_heads = {}
        else:
            config.pruned_heads = self.pruned_heads_of(layers)
        config.__post_init__()
        return config


# ---- relative positions --------------------------------------------------------------------------------------


def log_bucket_position(relative_pos: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's log buckets: |r| <= mid = bucket_size // 2 keeps r; beyond, sign(r) * (mid + ceil(log(|r| / mid)
    / log((max_position - 1) / mid) * (mid - 1))), so distances up to max_position share mid - 1 log-spaced buckets
    on each side. Computed in float32 exactly as transformers' make_log_bucket_position (the ceil is exact there)."""
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where(
        (relative_pos < mid) & (relative_pos > -mid), torch.tensor(mid - 1).type_as(relative_pos), relative_pos.abs()
    )
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos.type_as(log_pos), log_pos * sign)


def relative_positions(seq: int, config: DebertaV2Config, device: torch.device) -> torch.Tensor:
    """delta(i, j) before the shift of eq. 3: i - j, log-bucketed when position_buckets > 0. (seq, seq) long."""
    ids = torch.arange(seq, device=device)
    rel = ids[:, None] - ids[None, :]  # (query, key)
    if config.position_buckets > 0:
        rel = log_bucket_position(rel, config.position_buckets, config.max_relative)
    return rel.long()


# ---- the network -------------------------------------------------------------------------------------------


class Embeddings(nn.Module):
    """word (+ absolute position when position_biased_input) (+ segment when type_vocab_size > 0) embeddings,
    projected to hidden_size when narrower, LayerNorm, zeroed at padding, dropout."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        e = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, e) if config.position_biased_input else None
        )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size > 0 else None
        self.project = nn.Linear(e, config.hidden_size, bias=False) if e != config.hidden_size else None
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        mask: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, token_type_ids, mask: (batch, seq); or, unpadded, input_ids, token_type_ids and position_ids
        (tokens,) and no mask (every row is a real token). position_ids None: 0..seq-1 in every row."""
        x = self.word_embeddings(input_ids)  # (batch, seq, embedding_size) or (tokens, embedding_size)
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)  # (seq,)
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(
                token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            )
        if self.project is not None:
            x = self.project(x)
        x = self.norm(x)
        if mask is not None:
            x = x * mask[:, :, None].to(x.dtype)  # padding rows are zero (the convolution reads them)
        return self.dropout(x)  # (batch, seq, hidden) or (tokens, hidden)


class DisentangledSelfAttention(nn.Module):
    """softmax((Q^c K^c^T + c2p + p2c) / sqrt(d * factor)) V^c (eq. 4), one head per head_dim slice.

    Each head h reads its own head_dim rows of query / key / value (and of pos_key / pos_query) and writes through
    its own head_dim columns of `output`. A pruned layer keeps only those of its remaining heads (`kept_heads`, in
    the original numbering): its projections are (kept * head_dim, hidden) and (hidden, kept * head_dim).
    A head mask xi (Michel et al. 2019) multiplies each head's output before the output projection.
    """

    def __init__(self, config: DebertaV2Config, layer: int = 0) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.kept_heads = config.kept_heads(layer)
        self.num_heads = len(self.kept_heads)
        self.head_dim = config.head_dim
        inner = self.num_heads * self.head_dim
        self.query = nn.Linear(h, inner)
        self.key = nn.Linear(h, inner)
        self.value = nn.Linear(h, inner)
        rel = config.relative_attention and not config.share_att_key
        self.pos_key = nn.Linear(h, inner) if rel and "c2p" in config.pos_att_type else None  # W_{k,r}
        self.pos_query = nn.Linear(h, inner) if rel and "p2c" in config.pos_att_type else None  # W_{q,r}
        self.output = nn.Linear(inner, h)
        self.output_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.dropout_p = config.attention_probs_dropout_prob
        self.scale = 1.0 / math.sqrt(self.head_dim * config.scale_factor)
        # Set by ctxrep.runtime.fast.quantize_int8: one int8 product for query, key and value of x; None: the three.
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

    def position_bias(
        self, q: torch.Tensor, k: torch.Tensor, rel_embeddings: torch.Tensor, index: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """(c2p + p2c) * scale: (batch, heads, seq, seq). rel_embeddings P: (2 span, hidden); index: the rows of P
        that each pair reads, (seq, seq) each: clamp(delta(i, j) + span) for c2p, clamp(-delta(a, b) + span) for p2c."""
        b, _, t, _ = q.shape
        p = rel_embeddings[None]  # (1, 2 span, hidden)
        c2p_index, p2c_index = (ix[None, None].expand(b, self.num_heads, t, t) for ix in index)
        bias = 0
        if "c2p" in self.config.pos_att_type:
            k_r = (self.key if self.config.share_att_key else self.pos_key)(p)  # (1, 2 span, kept dims)
            k_r = split_heads(k_r, self.num_heads, self.head_dim)  # (1, heads, 2 span, d)
            c2p = q @ k_r.transpose(-2, -1)  # (batch, heads, query, 2 span): Q^c_i K^r_r^T for every r
            bias = bias + torch.gather(c2p, -1, c2p_index)  # (batch, heads, query i, key j): Q^c_i K^r_{delta(i,j)}^T
        if "p2c" in self.config.pos_att_type:
            q_r = (self.query if self.config.share_att_key else self.pos_query)(p)  # (1, 2 span, kept dims)
            q_r = split_heads(q_r, self.num_heads, self.head_dim)  # (1, heads, 2 span, d)
            p2c = k @ q_r.transpose(-2, -1)  # (batch, heads, key, 2 span): K^c_j Q^r_r^T for every r
            # on the (key j, query i) grid take row clamp(-delta(j, i) + span) of P, then turn the grid to (i, j)
            bias = bias + torch.gather(p2c, -1, p2c_index).transpose(-1, -2)  # (batch, heads, query, key)
        return bias * self.scale

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None,
        rel_embeddings: torch.Tensor | None,
        rel_index: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`: then the projections read real tokens only
        # and q, k, v are re-padded (zeros, which key_mask hides) for the attention product and c2p / p2c.
        # key_mask: (batch, 1, 1, seq) bool, True at real tokens.
        # head_mask: (num_attention_heads,) in the original numbering; entries of pruned heads are not read.
        q, k, v = self.project_qkv(x, unpadding)  # each (batch, heads, seq, head_dim)
        bias = None
        if rel_embeddings is not None and self.config.pos_att_type:
            bias = self.position_bias(q, k, rel_embeddings, rel_index)  # (batch, heads, seq, seq)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (batch, heads, seq, seq)
            if bias is not None:
                scores = scores + bias
            if key_mask is not None:
                scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ v
        else:
            probs = None
            mask = key_mask
            if bias is not None:
                mask = bias if key_mask is None else bias.masked_fill(~key_mask, float("-inf"))
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)
        context = merge_heads(context, unpadding, head_mask, self.kept_heads)  # (batch, seq | tokens, kept dims)
        return self.output_norm(x + self.dropout(self.output(context))), probs

    def prune(self, heads: Iterable[int]) -> None:
        """Remove `heads` (original numbering; ones already removed are ignored): drop their rows of query / key /
        value and of the position projections, and their columns of output. With share_att_key the position terms
        go through the pruned query / key, so c2p and p2c are those of the remaining heads either way."""
        keep, rows = remaining(self.kept_heads, heads, self.head_dim)
        for name in ("query", "key", "value", "pos_key", "pos_query"):
            if getattr(self, name) is not None:
                setattr(self, name, linear_subset(getattr(self, name), rows, dim=0))
        self.output = linear_subset(self.output, rows, dim=1)
        self.kept_heads, self.num_heads = keep, len(keep)


class EncoderLayer(nn.Module):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: DebertaV2Config, layer: int = 0) -> None:
        super().__init__()
        h = config.hidden_size
        self.attention = DisentangledSelfAttention(config, layer)
        self.intermediate = nn.Linear(h, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None,
        rel_embeddings: torch.Tensor | None,
        rel_index: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`
        x, probs = self.attention(x, key_mask, rel_embeddings, rel_index, output_attentions, head_mask, unpadding)
        f = self.output(self.activation(self.intermediate(x)))
        return self.output_norm(x + self.dropout(f)), probs


class ConvLayer(nn.Module):
    """DeBERTa-v2-xlarge's convolution beside the first layer: out = LN(layer1(x) + act(conv(x) at real tokens)),
    zero at padding; x is the embedding output. Unpadded (`unpadding`), x and residual are (tokens, hidden): the
    convolution reads x re-padded (zeros at padding, as the padded run's embeddings are) and the rest is per token."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        h, k = config.hidden_size, config.conv_kernel_size
        self.conv = nn.Conv1d(h, h, k, padding=(k - 1) // 2, groups=config.conv_groups)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.activation = ACTIVATIONS[config.conv_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, mask: torch.Tensor | None, unpadding: Unpadding | None = None
    ) -> torch.Tensor:
        if unpadding is not None:
            out = self.conv(unpadding.pad(x).transpose(1, 2)).transpose(1, 2)  # (batch, seq, hidden)
            out = unpadding.unpad(out)  # (tokens, hidden)
            return self.norm(residual + self.activation(self.dropout(out)))
        out = self.conv(x.transpose(1, 2)).transpose(1, 2)  # (batch, seq, hidden): Conv1d reads (batch, hidden, seq)
        if mask is not None:
            out = out.masked_fill(~mask.bool()[:, :, None], 0.0)
        out = self.norm(residual + self.activation(self.dropout(out)))
        return out if mask is None else out * mask[:, :, None].to(out.dtype)


class DebertaV2Model(Encoder):
    """The encoder. `forward` takes transformers' DebertaV2Model arguments and returns the same fields."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_hidden_layers))
        h = config.hidden_size
        self.rel_embeddings = nn.Embedding(2 * config.att_span, h) if config.relative_attention else None  # P
        self.rel_norm = nn.LayerNorm(h, eps=config.layer_norm_eps) if config.layer_norm_rel else None
        self.conv = ConvLayer(config) if config.conv_kernel_size > 0 else None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        normal_init(module, std)
        if isinstance(module, nn.Conv1d):  # the optional convolution beside the first layer: as a Linear
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # ---- the encoder interface (models/encoder.py) ----
    # max_tokens: max_position_embeddings (512 for the published models), the length the model was trained at. With
    # relative positions only, longer inputs would run, but their far distances share the last buckets.
    embedding_table = "embeddings.word_embeddings"
    family = MODEL_TYPE
    prepack_for_inference = True  # its linear layers are BERT's; the featurizer times whether pre-packing pays
    # Encoder.unpadding: BERT's share; benchmarks/unpad.py (DeBERTa-v3-small, 8 x 128, 1 thread): 1.06x at 10%
    unpad_from = UNPAD_FROM

    @property
    def reads_segments(self) -> bool:  # v3 has no segment embeddings
        return self.config.type_vocab_size > 0

    def prune_heads(self, heads: Mapping[int, Iterable[int]]) -> None:
        """Encoder.prune_heads, after refusing a quantized model. Query / key / value and the position projections
        lose the heads' rows, the output projection their columns; the shared relative table P is kept whole.
        transformers cannot load a pruned folder back (it has no DeBERTa head pruning); ctxrep does."""
        if any(a.query_key_value is not None or not isinstance(a.value, nn.Linear) for a in self.attention_modules()):
            raise ValueError(
                "prune_heads: this model's attention is quantized (fast.quantize_int8); prune the float model, "
                "then quantize it"
            )
        super().prune_heads(heads)

    def layer_of(self, name: str) -> int:
        """embeddings.* 0; layers.i.* i + 1; the convolution 1 (it joins layer 1's output); the relative-position
        table and its LayerNorm, read by every layer, num_layers (encoder.py: a shared block takes the highest
        layer that uses it)."""
        parts = name.split(".")
        if parts[0] == "embeddings":
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        if parts[0] == "conv" and self.conv is not None:
            return 1
        if parts[0] in ("rel_embeddings", "rel_norm") and getattr(self, parts[0]) is not None:
            return self.num_layers
        raise self.unknown_parameter(name)

    can_prune_heads = True  # Encoder.prune_heads over attention_modules(); forward takes head_mask
    can_distill = True

    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py); not
    # pos_key / pos_query, which project the relative table
    adapter_targets = ("query", "key", "value", "intermediate", "output")  # "output": attention's and the FFN's
    fuses_qkv = True  # every layer's attention: query, key and value read the same x ...

    def fusable_qkv_modules(self) -> list[str]:
        """... but none with shared attention keys (v3): there query and key also project the relative table P."""
        if self.config.share_att_key and self.config.relative_attention and self.config.pos_att_type:
            return []
        return super().fusable_qkv_modules()

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> DebertaV2Model:
        """A student DeBERTa: of this width, the embeddings, the relative-position table (and its LayerNorm), the
        convolution and layers[j] as layer j copied; narrower, freshly initialised (the global torch RNG)."""
        layers = check_student_layers(layers, self.num_layers)
        config = self.config.student(layers, hidden_size, intermediate_size)
        student = DebertaV2Model(config)
        if config.hidden_size == self.config.hidden_size:
            for name in ("embeddings", "rel_embeddings", "rel_norm", "conv"):
                if getattr(self, name) is not None:
                    getattr(student, name).load_state_dict(getattr(self, name).state_dict())
            for j, i in enumerate(layers):
                student.layers[j].load_state_dict(self.layers[i].state_dict())
        return student.train(self.training)

    def relative_embeddings(self) -> torch.Tensor | None:
        """P: the relative-position table, LayerNorm-ed when norm_rel_ebd says so. (2 span, hidden)"""
        if self.rel_embeddings is None:
            return None
        p = self.rel_embeddings.weight
        return self.rel_norm(p) if self.rel_norm is not None else p

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        head_mask: torch.Tensor | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """input_ids, attention_mask, token_type_ids: (batch, seq). `num_layers` stops after that many layers;
        head_mask: (num_layers, num_heads) or (num_heads,) mask variables xi (1 keeps a head, 0 silences it), in the
        original head numbering even after pruning.

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        b, t = input_ids.shape
        check_length(t, self.max_tokens)
        if head_mask is not None:
            head_mask = check_head_mask(head_mask, self.num_layers, self.num_heads)  # (layers, heads)
        key_mask = key_mask_of(attention_mask)  # (batch, 1, 1, seq) bool, or None without padding
        if key_mask is None:
            attention_mask = None  # nothing to mask: the embeddings and the convolution read every position
        token_type_ids = token_type_ids if self.reads_segments else None
        rel = self.relative_embeddings()  # computed once, read by every layer
        rel_index = None
        if rel is not None:  # the rows of P each (query, key) pair reads, shifted as in eq. 3; on the padded grid
            span, delta = self.config.att_span, relative_positions(t, self.config, input_ids.device)  # (seq, seq)
            rel_index = ((delta + span).clamp(0, 2 * span - 1), (span - delta).clamp(0, 2 * span - 1))
        unpadding = self.unpadding(attention_mask, padded)
        if unpadding is None:
            x = self.embeddings(input_ids, token_type_ids, attention_mask)  # (batch, seq, hidden)
        else:  # each (tokens,): a token's absolute position is its column of the padded grid
            positions = torch.arange(t, device=input_ids.device).expand(b, t)  # (batch, seq)
            input_ids, positions = unpadding.select(input_ids), unpadding.select(positions)
            token_type_ids = unpadding.select(token_type_ids) if token_type_ids is not None else None
            x = self.embeddings(input_ids, token_type_ids, None, positions)  # (tokens, hidden)
        embedded = x
        hidden_states, attentions = [x], []
        for i, layer in enumerate(self.layers[: num_layers if num_layers is not None else len(self.layers)]):
            xi = head_mask[i] if head_mask is not None else None
            x, probs = layer(x, key_mask, rel, rel_index, output_attentions, xi, unpadding)
            if i == 0 and self.conv is not None:
                x = self.conv(embedded, x, attention_mask, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------
    # save_pretrained writes a folder transformers' AutoModel loads (as DebertaV2Model), unless heads were pruned:
    # transformers cannot load that one back (it has no DeBERTa head pruning); ctxrep does.

    config_class = DebertaV2Config
    checkpoint = folders.CheckpointLayout(
        (MODEL_TYPE,),
        prefix="deberta.",  # DebertaV2ForMaskedLM etc.: the encoder under "deberta."
        head_prefixes=("lm_predictions.", "mask_predictions.", "cls.", "pooler.", "classifier.", "qa_outputs."),
        head_noun="weights outside the encoder",
        buffers=("embeddings.position_ids",),  # transformers' precomputed position ids, not weights
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def checkpoint_layout(self) -> folders.CheckpointLayout:
        """The v3 checkpoints also carry an absolute position table their config switches off
        (position_biased_input=False); transformers ignores it too, and so does this loader."""
        if self.config.position_biased_input:
            return self.checkpoint
        heads = self.checkpoint.head_prefixes + ("embeddings.position_embeddings.weight",)
        return dataclasses.replace(self.checkpoint, head_prefixes=heads)


def hf_parameter_names(config: DebertaV2Config) -> dict[str, str]:
    """transformers' name -> ctxrep's name, for every weight of the encoder."""
    names = {"embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight"}
    if config.position_biased_input:
        names["embeddings.position_embeddings.weight"] = "embeddings.position_embeddings.weight"
    if config.type_vocab_size > 0:
        names["embeddings.token_type_embeddings.weight"] = "embeddings.token_type_embeddings.weight"
    if config.embedding_size != config.hidden_size:
        names["embeddings.embed_proj.weight"] = "embeddings.project.weight"
    names |= {f"embeddings.LayerNorm.{p}": f"embeddings.norm.{p}" for p in ("weight", "bias")}
    per_layer = {
        "attention.self.query_proj": "attention.query",
        "attention.self.key_proj": "attention.key",
        "attention.self.value_proj": "attention.value",
        "attention.output.dense": "attention.output",
        "attention.output.LayerNorm": "attention.output_norm",
        "intermediate.dense": "intermediate",
        "output.dense": "output",
        "output.LayerNorm": "output_norm",
    }
    if config.relative_attention and not config.share_att_key:
        if "c2p" in config.pos_att_type:
            per_layer["attention.self.pos_key_proj"] = "attention.pos_key"
        if "p2c" in config.pos_att_type:
            per_layer["attention.self.pos_query_proj"] = "attention.pos_query"
    names |= folders.layer_names(config.num_hidden_layers, "encoder.layer", per_layer)
    if config.relative_attention:
        names["encoder.rel_embeddings.weight"] = "rel_embeddings.weight"
    if config.layer_norm_rel:
        names |= {f"encoder.LayerNorm.{p}": f"rel_norm.{p}" for p in ("weight", "bias")}
    if config.conv_kernel_size > 0:
        names |= {f"encoder.conv.conv.{p}": f"conv.conv.{p}" for p in ("weight", "bias")}
        names |= {f"encoder.conv.LayerNorm.{p}": f"conv.norm.{p}" for p in ("weight", "bias")}
    return names
