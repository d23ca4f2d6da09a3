"""The post-LayerNorm Transformer encoder of BERT, RoBERTa and the ELECTRA discriminator.

Vaswani et al. 2017 (attention, eq. 1: softmax(QK^T / sqrt(d_k)) V), Devlin et al. 2019 (BERT),
Liu et al. 2019 (RoBERTa: same network, positions offset by padding_idx + 1), Clark et al. 2020
(ELECTRA: same network, token embeddings optionally narrower than the hidden size and projected up).

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded (modules/unpadding.py):
embeddings, query / key / value, the output projections, norms and feed-forwards on the (tokens, hidden) rows of
real tokens, re-padded only around the attention product; the same hidden states at real tokens (0 at padding).

Reads top to bottom: config, embeddings, attention, feed-forward, layer, encoder, then the declarations
the Encoder base loads and saves the Hugging Face folder format by (config.json + model.safetensors / .bin).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

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

MODEL_TYPES = ("bert", "roberta", "electra", "xlm-roberta", "camembert")
# RoBERTa's network under other model types (XLM-R: Conneau et al. 2020; CamemBERT: Martin et al. 2020): positions
# from padding_idx + 1, the encoder stored under "roberta." in task checkpoints.
ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")
ARCHITECTURES = {
    "bert": "BertModel",
    "roberta": "RobertaModel",
    "electra": "ElectraModel",
    "xlm-roberta": "XLMRobertaModel",
    "camembert": "CamembertModel",
}
# The special-token ids transformers' configs carry (not read by the encoder; written back for transformers).
_BOS_EOS = {"roberta": (0, 2), "xlm-roberta": (0, 2), "camembert": (5, 6)}


@dataclass
class BertConfig(PrunedHeadsConfig):
    """Everything needed to rebuild the network; field names are those of transformers' config.json.
    pruned_heads (PrunedHeadsConfig): heads removed from each layer, whose layers are built without them."""

    model_type: str = "bert"  # one of MODEL_TYPES
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    embedding_size: int | None = None  # ELECTRA; None means hidden_size
    add_pooling_layer: bool = True  # BERT/RoBERTa's tanh pooler over [CLS]; ELECTRA has none

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        check_head_dim(self.hidden_size, self.num_attention_heads)
        check_activation("hidden_act", self.hidden_act)
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        super().__post_init__()

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers positions from padding_idx + 1 (fairseq's make_positions); BERT from 0."""
        return self.pad_token_id + 1 if self.model_type in ROBERTA_LIKE else 0

    @property
    def max_tokens(self) -> int:
        """The longest sequence (special tokens included) the position table can encode."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_hf_dict(cls, d: dict) -> BertConfig:
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError(
                f"position_embedding_type={d['position_embedding_type']!r} is not supported: ctxrep's encoder "
                "implements absolute position embeddings only"
            )
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if kwargs.get("pad_token_id") is None:
            kwargs["pad_token_id"] = 1 if d.get("model_type") in ROBERTA_LIKE else 0
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d["architectures"] = [ARCHITECTURES[self.model_type]]
        d["position_embedding_type"] = "absolute"
        if self.model_type in _BOS_EOS:
            bos, eos = _BOS_EOS[self.model_type]
            d.update(bos_token_id=bos, eos_token_id=eos)
        del d["add_pooling_layer"]
        return self.write_pruned_heads(d)

    def student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> BertConfig:
        """A distillation student's config: this one with len(layers) layers; narrower when hidden_size is smaller.
        The student keeps the heads its layers had here (pruned_heads follow their layers); a narrower one has them
        all, fresh embeddings of its own width and intermediate_size in this config's ratio unless given."""
        h, inner = student_widths(
            self.hidden_size, self.num_attention_heads, self.intermediate_size, hidden_size, intermediate_size
        )
        narrower = h != self.hidden_size
        config = copy.deepcopy(self)
        config.num_hidden_layers = len(layers)
        if narrower:
            config.hidden_size = h
            config.intermediate_size = inner
            config.embedding_size = h  # fresh embeddings of the student's own width
            config.pruned_heads = {}
        else:
            config.pruned_heads = self.pruned_heads_of(layers)
        config.__post_init__()  # check the new shape as a fresh config would be
        return config


class Embeddings(nn.Module):
    """word + position + segment embeddings, LayerNorm, dropout (Devlin et al. 2019, fig. 2)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        e = config.embedding_size
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e)
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # ELECTRA-small: 128-wide embeddings projected to the 256-wide encoder.
        self.project = nn.Linear(e, config.hidden_size) if e != config.hidden_size else None

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        x = x + self.token_type_embeddings(token_type_ids)
        x = self.dropout(self.norm(x))
        if self.project is not None:
            x = self.project(x)
        return x  # (batch, seq, hidden), or (tokens, hidden) unpadded


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product attention with a key padding mask.

    Each head h reads its own head_dim rows of query/key/value and writes through its own head_dim columns of
    `output`. A pruned layer keeps only the rows and columns of its remaining heads (`kept_heads`, in the original
    numbering), so its matrices are (kept * head_dim, hidden) and (hidden, kept * head_dim).

    A head mask xi (Michel et al. 2019, sec. 2.1: MHAtt(x) = sum_h xi_h Att_h(x)) multiplies each head's output
    before the output projection; the output bias is added once, unmasked.
    """

    def __init__(self, config: BertConfig, layer: int = 0) -> None:
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

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, output_attentions: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """eq. 1 on (batch, heads, seq, head_dim) q, k, v: the context (batch, heads, seq, head_dim), and the
        probabilities (batch, heads, seq, seq) when asked for (the explicit softmax; else the fused kernel).
        key_mask: (batch, 1, 1, seq) bool, True where the key is a real token, or None."""
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (batch, heads, seq, seq)
            if key_mask is not None:
                scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            return F.dropout(probs, dropout_p, self.training) @ v, probs
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p), None

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None,
        output_attentions: bool,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`: then the projections read real tokens only
        # and q, k, v are re-padded (zeros, which key_mask hides) for the attention product.
        # key_mask: (batch, 1, 1, seq) bool, True where the key is a real token.
        # head_mask: (num_attention_heads,) in the original numbering; entries of pruned heads are not read.
        q, k, v = self.project_qkv(x, unpadding)  # each (batch, heads, seq, head_dim)
        context, probs = self.attend(q, k, v, key_mask, output_attentions)
        context = merge_heads(context, unpadding, head_mask, self.kept_heads)  # (batch, seq | tokens, kept dims)
        return self.output(context), probs

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

    def __init__(self, config: BertConfig, layer: int = 0) -> None:
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
        key_mask: torch.Tensor | None,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`
        a, probs = self.attention(x, key_mask, output_attentions, head_mask, unpadding)
        x = self.attention_norm(x + self.dropout(a))
        f = self.output(self.activation(self.intermediate(x)))
        x = self.output_norm(x + self.dropout(f))
        return x, probs


class BertModel(Encoder):
    """The encoder. `forward` follows transformers' BertModel: same arguments, same output fields."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        normal_init(module, self.config.initializer_range)

    # ---- the encoder interface (models/encoder.py) ----
    config_fields = Encoder.config_fields | {"max_tokens": "max_tokens"}  # RoBERTa's offset positions
    embedding_table = "embeddings.word_embeddings"
    prepack_for_inference = True  # oneDNN pre-packed linear layers: measured 1.4-2x faster here
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

    @property
    def family(self) -> str:
        return self.config.model_type

    def layer_of(self, name: str) -> int:
        """embeddings.* 0, layers.i.* i + 1, pooler.* num_layers."""
        parts = name.split(".")
        if parts[0] == "embeddings":
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        if parts[0] == "pooler" and self.pooler is not None:
            return self.num_layers
        raise self.unknown_parameter(name)

    can_prune_heads = True  # Encoder.prune_heads over attention_modules(); forward takes head_mask
    can_distill = True

    fuses_qkv = True  # every layer's SelfAttention: query, key and value read the same x
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = ("query", "key", "value", "intermediate", "output")  # "output": attention's and the FFN's

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> BertModel:
        """A student BertModel (BertConfig.student): of this width, the embeddings, layers[j] as layer j and the
        pooler copied; narrower, freshly initialised (the global torch RNG)."""
        layers = check_student_layers(layers, self.num_layers)
        config = self.config.student(layers, hidden_size, intermediate_size)
        student = BertModel(config)
        if config.hidden_size == self.config.hidden_size:
            student.embeddings.load_state_dict(self.embeddings.state_dict())  # copies (load_state_dict copies)
            for j, i in enumerate(layers):
                student.layers[j].load_state_dict(self.layers[i].state_dict())
            if student.pooler is not None:
                student.pooler.load_state_dict(self.pooler.state_dict())
        return student.train(self.training)

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.config.model_type in ROBERTA_LIKE:
            # Non-pad tokens count up from padding_idx + 1; pad tokens sit at padding_idx (fairseq).
            not_pad = input_ids.ne(self.config.pad_token_id).long()
            return torch.cumsum(not_pad, dim=1) * not_pad + self.config.pad_token_id
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)

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
        """input_ids, attention_mask, token_type_ids: (batch, seq). `num_layers` stops after that many layers.

        head_mask: Michel et al.'s mask variables xi, (num_layers, num_heads) or (num_heads,) for every layer, in
        the original head numbering; head h of layer l contributes xi[l, h] times its output (1 keeps it, 0
        silences it; entries of pruned heads are not read). It may require grad (head importance).
        `attentions` hold each layer's remaining heads, unmasked: (batch, heads_per_layer()[l], seq, seq).

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        check_length(input_ids.shape[1], self.max_tokens)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        key_mask = key_mask_of(attention_mask)  # (batch, 1, 1, seq) bool, or None without padding
        if head_mask is not None:
            head_mask = check_head_mask(head_mask, self.num_layers, self.num_heads)  # (layers, heads)
        unpadding = self.unpadding(attention_mask, padded)
        if unpadding is not None:  # each (tokens,)
            input_ids, token_type_ids, position_ids = map(unpadding.select, (input_ids, token_type_ids, position_ids))
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (batch, seq, hidden) or (tokens, hidden)
        hidden_states, attentions = [x], []
        for i, layer in enumerate(self.layers[: num_layers if num_layers is not None else len(self.layers)]):
            xi = head_mask[i] if head_mask is not None else None
            x, probs = layer(x, key_mask, output_attentions, xi, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        out = EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)
        if self.pooler is not None and num_layers is None:
            out.pooler_output = torch.tanh(self.pooler(out.last_hidden_state[:, 0]))  # (batch, hidden)
        return out

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------

    config_class = BertConfig
    checkpoint = folders.CheckpointLayout(
        MODEL_TYPES,
        # BertForMaskedLM etc. store the encoder under 'bert.' / 'roberta.' / 'electra.' (model_state); pre-training
        # and task heads (MLM, NSP, ELECTRA's discriminator head, ...) are not part of the encoder.
        head_prefixes=(
            "cls.",
            "lm_head.",
            "discriminator_predictions.",
            "generator_predictions.",
            "generator_lm_head.",
            "classifier.",
            "qa_outputs.",
            "linear.",  # Stanford-NLP ColBERT's token projection (HF_ColBERT; vectors/late_interaction.py reads it)
        ),
        buffers=("embeddings.position_ids", "embeddings.token_type_ids"),  # transformers' precomputed ids
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    @classmethod
    def model_state(cls, state: dict[str, torch.Tensor], hf_config: dict) -> dict[str, torch.Tensor]:
        """BertForMaskedLM etc. store the encoder under 'bert.' / 'roberta.' / 'electra.' (XLM-R and CamemBERT
        under 'roberta.' too); BertModel under ''."""
        model_type = hf_config["model_type"]
        prefix = ("roberta" if model_type in ROBERTA_LIKE else model_type) + "."
        return folders.without_prefix(state, prefix, marker=prefix + "encoder.")

    @classmethod
    def config_from_hf(cls, hf_config: dict, state: dict[str, torch.Tensor]) -> BertConfig:
        """A checkpoint without a pooler (ELECTRA's, some converted ones) builds none: the config follows the weights."""
        return BertConfig.from_hf_dict(hf_config | {"add_pooling_layer": "pooler.dense.weight" in state})


def hf_parameter_names(config: BertConfig) -> dict[str, str]:
    """transformers' name -> ctxrep's name, for every weight of the encoder."""
    names = {
        "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    }
    if config.embedding_size != config.hidden_size:
        names |= {f"embeddings_project.{p}": f"embeddings.project.{p}" for p in ("weight", "bias")}
    per_layer = {
        "attention.self.query": "attention.query",
        "attention.self.key": "attention.key",
        "attention.self.value": "attention.value",
        "attention.output.dense": "attention.output",
        "attention.output.LayerNorm": "attention_norm",
        "intermediate.dense": "intermediate",
        "output.dense": "output",
        "output.LayerNorm": "output_norm",
    }
    names |= folders.layer_names(config.num_hidden_layers, "encoder.layer", per_layer)
    if config.add_pooling_layer:
        names |= {f"pooler.dense.{p}": f"pooler.{p}" for p in ("weight", "bias")}
    return names
