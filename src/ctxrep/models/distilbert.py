"""DistilBERT's encoder (Sanh et al. 2019): BERT's post-LayerNorm layers, half as many, without segment embeddings.

Sanh et al. 2019, sec. 2: "the student - DistilBERT - has the same general architecture as BERT. The token-type
embeddings and the pooler are removed while the number of layers is reduced by a factor of 2." So a layer here is
bert.py's `EncoderLayer`, unchanged (x = LN(x + Attn(x)); x = LN(x + FFN(x)), attention softmax(QK^T / sqrt(d_k)) V
with a key padding mask), and what differs lives in this file:

    embeddings  e_t = LN(W_word[x_t] + P[t])            (no token types; LayerNorm eps 1e-12)
    P           learned, or with `sinusoidal_pos_embds` Vaswani et al. 2017, sec. 3.5:
                P[pos, 2i] = sin(pos / 10000^(2i/d)),  P[pos, 2i+1] = cos(pos / 10000^(2i/d)), frozen
    no pooler   the encoder's output is the last layer's hidden states

DistilBERT's config.json names (dim, n_layers, n_heads, hidden_dim, activation, dropout, attention_dropout) are
kept as the dataclass's fields; the properties answer under BERT's names (transformers' attribute_map idea), which
is what bert.py's layer reads. Loading and saving follow transformers' DistilBertModel names (`hf_parameter_names`).

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded as BERT's does
(modules/unpadding.py): embeddings and bert.py's layers on the (tokens, hidden) rows of real tokens, re-padded only
around the attention product; the same hidden states at real tokens (0 at padding).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from ctxrep.models import folders
from ctxrep.models.bert import EncoderLayer
from ctxrep.models.encoder import Encoder, check_length, check_student_layers, student_widths
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import check_activation
from ctxrep.modules.heads import PrunedHeadsConfig, check_head_mask
from ctxrep.modules.unpadding import UNPAD_FROM, key_mask_of

logger = logging.getLogger(__name__)

MODEL_TYPE = "distilbert"
LAYER_NORM_EPS = 1e-12  # fixed in DistilBERT (not in its config)


@dataclass
class DistilBertConfig(PrunedHeadsConfig):
    """Everything needed to rebuild the network; field names are those of transformers' DistilBertConfig.
    pruned_heads (PrunedHeadsConfig): heads removed from each layer, whose layers are built without them."""

    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        check_activation("activation", self.activation)
        super().__post_init__()

    # BERT's names for the same numbers: what bert.py's EncoderLayer and SelfAttention read.
    model_type = MODEL_TYPE
    layer_norm_eps = LAYER_NORM_EPS

    @property
    def hidden_size(self) -> int:
        return self.dim

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def intermediate_size(self) -> int:
        return self.hidden_dim

    @property
    def hidden_act(self) -> str:
        return self.activation

    @property
    def hidden_dropout_prob(self) -> float:
        return self.dropout

    @property
    def attention_probs_dropout_prob(self) -> float:
        return self.attention_dropout

    @classmethod
    def from_hf_dict(cls, d: dict) -> DistilBertConfig:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if kwargs.get("pad_token_id") is None:
            kwargs["pad_token_id"] = 0
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d["model_type"] = MODEL_TYPE
        d["architectures"] = ["DistilBertModel"]
        return self.write_pruned_heads(d)


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """(n_pos, dim): P[pos, 2i] = sin(pos / 10000^(2i/dim)), P[pos, 2i+1] = cos(pos / 10000^(2i/dim)).

    Computed in float64 as transformers does (numpy), then rounded once to float32."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]  # (n_pos, 1)
    j = torch.arange(dim, dtype=torch.float64)[None, :]  # (1, dim)
    angle = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)  # (n_pos, dim)
    table = torch.empty(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle[:, 0::2])
    table[:, 1::2] = torch.cos(angle[:, 1::2])
    return table.float()


class Embeddings(nn.Module):
    """e_t = dropout(LN(W_word[x_t] + P[t])): no token-type embeddings (Sanh et al. 2019, sec. 2)."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        if config.sinusoidal_pos_embds:
            with torch.no_grad():
                self.position_embeddings.weight.copy_(sinusoidal_table(config.max_position_embeddings, config.dim))
            self.position_embeddings.weight.requires_grad_(False)  # fixed, as in transformers
        self.norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (batch, seq | tokens, dim)
        return self.dropout(self.norm(x))


class DistilBertModel(Encoder):
    """The encoder. `forward` follows transformers' DistilBertModel: no token_type_ids read, no pooler."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.n_layers))
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding) and module.weight.requires_grad:  # not the sinusoidal table
                nn.init.normal_(module.weight, std=std)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    # ---- the encoder interface (models/encoder.py) ----
    embedding_table = "embeddings.word_embeddings"  # the config answers BERT's names (DistilBertConfig)
    family = MODEL_TYPE
    reads_segments = False  # DistilBERT has no token-type embeddings
    prepack_for_inference = True  # BERT's layers: oneDNN pre-packed linear layers help as they do for BERT
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

    def layer_of(self, name: str) -> int:
        """embeddings.* 0, layers.i.* i + 1 (DistilBERT has nothing above its last layer)."""
        parts = name.split(".")
        if parts[0] == "embeddings" and name in dict(self.named_parameters()):
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        raise self.unknown_parameter(name)

    can_prune_heads = True  # Encoder.prune_heads over attention_modules(); forward takes head_mask
    can_distill = True

    fuses_qkv = True  # every layer's attention is bert.py's SelfAttention
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = ("query", "key", "value", "intermediate", "output")  # "output": attention's and the FFN's

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> DistilBertModel:
        """A student DistilBertModel with len(layers) layers: of this width, layer j copied from this one's layers[j]
        with the embeddings (DistilBERT's own initialisation, Sanh et al. 2019 sec. 3); narrower (hidden_size),
        freshly initialised (the global torch RNG), with this model's heads and intermediate ratio unless given."""
        layers = check_student_layers(layers, self.num_layers)
        c = self.config
        h, inner = student_widths(c.dim, c.n_heads, c.hidden_dim, hidden_size, intermediate_size)
        config = copy.deepcopy(c)
        config.n_layers, config.dim, config.hidden_dim = len(layers), h, inner
        same_width = h == c.dim
        config.pruned_heads = c.pruned_heads_of(layers) if same_width else {}
        config.__post_init__()
        student = DistilBertModel(config)
        if same_width:
            student.embeddings.load_state_dict(self.embeddings.state_dict())
            for j, i in enumerate(layers):
                student.layers[j].load_state_dict(self.layers[i].state_dict())
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
        """input_ids, attention_mask: (batch, seq). token_type_ids must be None or all zero: DistilBERT has no
        segment embeddings (pairs are told apart by [SEP] alone). head_mask, attentions and a batch with much padding
        (run unpadded: the padded run's hidden states at real tokens, 0 at padding) as in BertModel.forward."""
        check_length(input_ids.shape[1], self.max_tokens)
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("DistilBERT has no token-type (segment) embeddings: pass token_type_ids=None")
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        key_mask = key_mask_of(attention_mask)  # (batch, 1, 1, seq) bool, or None without padding
        if head_mask is not None:
            head_mask = check_head_mask(head_mask, self.num_layers, self.num_heads)  # (layers, heads)
        unpadding = self.unpadding(attention_mask, padded)
        if unpadding is not None:  # each (tokens,)
            input_ids, position_ids = unpadding.select(input_ids), unpadding.select(position_ids)
        x = self.embeddings(input_ids, position_ids)  # (batch, seq, dim) or (tokens, dim)
        hidden_states, attentions = [x], []
        for i, layer in enumerate(self.layers[: num_layers if num_layers is not None else len(self.layers)]):
            xi = head_mask[i] if head_mask is not None else None
            x, probs = layer(x, key_mask, output_attentions, xi, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------

    config_class = DistilBertConfig
    checkpoint = folders.CheckpointLayout(
        (MODEL_TYPE,),
        what="a DistilBERT encoder",
        prefix="distilbert.",  # DistilBertForMaskedLM / task checkpoints: the encoder under 'distilbert.'
        head_prefixes=(
            "vocab_transform.",
            "vocab_layer_norm.",
            "vocab_projector.",
            "pre_classifier.",
            "classifier.",
            "qa_outputs.",
        ),
        buffers=("embeddings.position_ids",),  # transformers' precomputed position ids, not a weight
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """The Encoder base's loading, then a warning if a sinusoidal table is not the formula's."""
        super().load_hf_state_dict(state, source)
        if self.config.sinusoidal_pos_embds:  # the checkpoint's table should be the formula's: say so if not
            table = sinusoidal_table(self.config.max_position_embeddings, self.config.dim)
            if not torch.allclose(self.embeddings.position_embeddings.weight.float(), table, atol=1e-4):
                logger.warning(
                    "%s: sinusoidal_pos_embds is set but the stored position table differs from the formula; "
                    "using the stored table",
                    source,
                )


def hf_parameter_names(config: DistilBertConfig) -> dict[str, str]:
    """transformers' DistilBertModel name -> ctxrep's name, for every weight of the encoder."""
    names = {
        "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    }
    per_layer = {
        "attention.q_lin": "attention.query",
        "attention.k_lin": "attention.key",
        "attention.v_lin": "attention.value",
        "attention.out_lin": "attention.output",
        "sa_layer_norm": "attention_norm",
        "ffn.lin1": "intermediate",
        "ffn.lin2": "output",
        "output_layer_norm": "output_norm",
    }
    names |= folders.layer_names(config.n_layers, "transformer.layer", per_layer)
    return names
