"""ALBERT: BERT's post-LayerNorm encoder with factorised embeddings and cross-layer parameter sharing.

Lan et al. 2019, "ALBERT: A Lite BERT for Self-supervised Learning of Language Representations":
- sec. 3.1, factorised embedding parameterisation: tokens are embedded in E dimensions and projected to the
  hidden size H (embedding_hidden_mapping_in), so the vocabulary costs V x E + E x H instead of V x H;
- sec. 3.1, cross-layer parameter sharing: one set of layer weights applied num_hidden_layers times ("all"),
  or only the attention ("attention") or only the feed-forward network ("ffn") shared (the paper's Table 4);
- sec. 4.1 / 3.1, sentence-order prediction: the SOP head here, the objective in ctxrep.objectives.sentence_order.
Attention is Vaswani et al. 2017, eq. 1: softmax(QK^T / sqrt(d_k)) V.

How layers are shared. A layer is an attention block (with its LayerNorm) followed by a feed-forward block
(with its LayerNorm). transformers' format stores num_hidden_groups groups of inner_group_num layers; layer run
i (of num_hidden_layers) applies group g = floor(i / (num_hidden_layers / num_hidden_groups)), i.e. its
inner_group_num layers in turn, so a forward pass runs num_hidden_layers * inner_group_num layers. Here each
component has a list of weight *slots*: with share="all" both components use slot g * inner_group_num + j
(transformers' layout exactly); a component that is not shared gets its own slot in every layer run.
    share="all"        attention and FFN shared (ALBERT; transformers' format)
    share="attention"  attention shared, one FFN per layer run (ctxrep's format)
    share="ffn"        FFN shared, one attention per layer run (ctxrep's format)
    share="none"       nothing shared (like BERT; saved in transformers' format with one group per layer run)

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded (modules/unpadding.py):
embeddings, the E -> H projection, query / key / value, the output projections, norms and feed-forwards on the
(tokens, hidden) rows of real tokens, re-padded only around the attention product, whatever the sharing (a shared
block is the same function on either layout); the same hidden states at real tokens (0 at padding).

Reads top to bottom: config, embeddings, attention, feed-forward, encoder, pretraining heads, then the loader
and saver (config.json + model.safetensors; transformers' names, or ctxrep's own for attention/ffn sharing).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, check_length
from ctxrep.models.folders import CheckpointError
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import ACTIVATIONS, check_activation
from ctxrep.modules.heads import check_head_dim, merge_heads, split_heads
from ctxrep.modules.init_weights import normal_init
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

HF_MODEL_TYPE = "albert"
CTXREP_MODEL_TYPE = "ctxrep-albert"  # attention- or FFN-only sharing: transformers cannot express it
MODEL_TYPES = (HF_MODEL_TYPE, CTXREP_MODEL_TYPE)
SHARING = ("all", "attention", "ffn", "none")


@dataclass
class AlbertConfig:
    """Everything needed to rebuild the network; field names are transformers' AlbertConfig's, plus `share`."""

    vocab_size: int = 30000
    embedding_size: int = 128  # E
    hidden_size: int = 4096  # H
    num_hidden_layers: int = 12  # layer runs (of inner_group_num layers each)
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout_prob: float = 0.1  # the SOP head's dropout
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    share: str = "all"  # ctxrep's: "all", "attention", "ffn" or "none" (see the module docstring)

    def __post_init__(self) -> None:
        if self.share not in SHARING:
            raise ValueError(f"share must be one of {SHARING}, got {self.share!r}")
        check_head_dim(self.hidden_size, self.num_attention_heads)
        check_activation("hidden_act", self.hidden_act)
        if self.num_hidden_groups < 1 or self.inner_group_num < 1 or self.num_hidden_layers < 1:
            raise ValueError(
                f"num_hidden_layers ({self.num_hidden_layers}), num_hidden_groups ({self.num_hidden_groups}) and "
                f"inner_group_num ({self.inner_group_num}) must all be at least 1"
            )
        if self.num_hidden_groups > self.num_hidden_layers:
            raise ValueError(
                f"num_hidden_groups ({self.num_hidden_groups}) exceeds num_hidden_layers ({self.num_hidden_layers}): "
                "some groups would never run; use at most one group per layer"
            )

    @property
    def num_layers(self) -> int:
        """Layers a forward pass runs: each of the num_hidden_layers runs applies inner_group_num layers."""
        return self.num_hidden_layers * self.inner_group_num

    def group_of_run(self, i: int) -> int:
        """transformers' AlbertTransformer: group_idx = int(i / (num_hidden_layers / num_hidden_groups))."""
        return int(i / (self.num_hidden_layers / self.num_hidden_groups))

    def slots(self, component: str) -> list[int]:
        """The weight slot of `component` ("attention" or "ffn") in each of the num_layers layers, in order."""
        k = self.inner_group_num
        grouped = [self.group_of_run(i) * k + j for i in range(self.num_hidden_layers) for j in range(k)]
        shared = self.share == "all" or self.share == component
        return grouped if shared else list(range(self.num_layers))

    @property
    def transformers_compatible(self) -> bool:
        """transformers' format shares whole layers: "all" (any groups), or "none" (one group per layer run)."""
        return self.share in ("all", "none")

    @classmethod
    def from_hf_dict(cls, d: dict) -> AlbertConfig:
        """From config.json: transformers' AlbertConfig fields, or ctxrep's format with `ctxrep_share`."""
        names = {f.name for f in fields(cls)} - {"share"}
        kwargs = {k: v for k, v in d.items() if k in names}
        if kwargs.get("pad_token_id") is None:
            kwargs["pad_token_id"] = 0
        share = d.get("ctxrep_share", "all")
        if d.get("model_type") == HF_MODEL_TYPE and share not in ("all", "none"):
            raise CheckpointError(
                f"config.json says model_type 'albert' (transformers' format) but ctxrep_share={share!r}, which "
                f"only model_type {CTXREP_MODEL_TYPE!r} can hold; re-save the model with ctxrep"
            )
        return cls(**kwargs, share=share)

    def to_hf_dict(self) -> dict:
        """config.json: transformers' AlbertConfig for "all" / "none" sharing, else ctxrep's own model_type."""
        d = asdict(self)
        del d["share"]
        if self.share == "none":  # one group of weights per layer run: transformers' format can say that
            d["num_hidden_groups"] = self.num_hidden_layers
        if self.transformers_compatible:
            return d | {
                "model_type": HF_MODEL_TYPE,
                "architectures": ["AlbertModel"],
                "bos_token_id": 2,
                "eos_token_id": 3,
            }
        return d | {
            "model_type": CTXREP_MODEL_TYPE,
            "ctxrep_share": self.share,
            "architectures": ["ctxrep.AlbertModel"],
        }


class Embeddings(nn.Module):
    """word + segment + position embeddings in E dimensions, LayerNorm, dropout (Devlin et al. 2019, fig. 2)."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        e = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, e)
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        # transformers' summation order (word + segment, then + position), so float rounding matches too.
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.norm(x))  # (batch, seq | tokens, embedding_size)


class AttentionBlock(nn.Module):
    """x = LN(x + Dropout(W_o MultiHead(x))): self-attention with its residual and LayerNorm (AlbertAttention)."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dense = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout_p = config.attention_probs_dropout_prob
        self.output_dropout = nn.Dropout(config.hidden_dropout_prob)

    # Copied from ctxrep.models.bert.SelfAttention.attend
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
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`: then the projections read real tokens only
        # and q, k, v are re-padded (zeros, which key_mask hides) for the attention product.
        # key_mask: (batch, 1, 1, seq) bool, True where the key is a real token.
        q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (split_heads(y, self.num_heads, self.head_dim, unpadding) for y in (q, k, v))  # (b, heads, seq, d)
        context, probs = self.attend(q, k, v, key_mask, output_attentions)
        context = merge_heads(context, unpadding)  # (batch, seq | tokens, hidden)
        return self.norm(x + self.output_dropout(self.dense(context))), probs


class FeedForwardBlock(nn.Module):
    """x = LN(x + W_2 act(W_1 x + b_1) + b_2) (AlbertLayer's ffn, ffn_output, full_layer_layer_norm).

    transformers' ALBERT applies no dropout to the feed-forward output; neither does this block.
    """

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.ffn = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.activation = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.ffn_output(self.activation(self.ffn(x))))


class AlbertModel(Encoder):
    """The encoder. `forward` follows transformers' AlbertModel: same arguments, same output fields.

    hidden_states[0] is the embedding output projected to H (transformers' convention), then one entry per layer
    run (num_hidden_layers * inner_group_num of them).
    """

    family = "albert"
    reads_segments = True
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)  # E -> H
        self.attention_slots = config.slots("attention")
        self.ffn_slots = config.slots("ffn")
        self.attention_blocks = nn.ModuleList(AttentionBlock(config) for _ in range(max(self.attention_slots) + 1))
        self.ffn_blocks = nn.ModuleList(FeedForwardBlock(config) for _ in range(max(self.ffn_slots) + 1))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        normal_init(module, self.config.initializer_range)

    # ---- the Encoder interface --------------------------------------------------------------------
    config_fields = Encoder.config_fields | {"num_layers": "num_layers"}  # layer runs x inner_group_num
    embedding_table = "embeddings.word_embeddings"  # (vocab, embedding_size): E wide, before the projection to H
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = ("query", "key", "value", "dense", "ffn", "ffn_output")

    def blocks(self) -> list[nn.Module]:
        """The shared attention and feed-forward blocks (Encoder.blocks): each runs in one or more layers."""
        return [*self.attention_blocks, *self.ffn_blocks]

    def layer_of(self, name: str) -> int:
        """embeddings.* and the E -> H projection 0; a block 1 + the last layer that runs it (a block shared by
        every layer: num_layers, so it trains whenever any layer does); pooler.* num_layers."""
        parts = name.split(".")
        if parts[0] in ("embeddings", "embedding_hidden_mapping_in"):
            return 0
        slots = {"attention_blocks": self.attention_slots, "ffn_blocks": self.ffn_slots}.get(parts[0])
        if slots is not None and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) in slots:
            return max(depth for depth, slot in enumerate(slots, start=1) if slot == int(parts[1]))
        if parts[0] == "pooler":
            return self.num_layers
        raise self.unknown_parameter(name)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """input_ids, attention_mask, token_type_ids: (batch, seq). `num_layers` stops after that many layers
        (and leaves out the pooler, which reads the last layer).

        A batch with much padding (`Encoder.unpadding`) runs unpadded: its hidden states are those of the padded run
        at real tokens and 0 at padding."""
        check_length(input_ids.shape[1], self.max_tokens)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        key_mask = None
        # Without padding, attention runs unmasked (the fast kernel). Under torch.export (ONNX export) the mask is
        # always kept: whether the batch has padding is data, and the exported graph must serve every batch.
        if attention_mask is not None and (torch.compiler.is_exporting() or not bool(attention_mask.all())):
            key_mask = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, seq)
        unpadding = self.unpadding(attention_mask, padded)
        if unpadding is not None:  # each (tokens,)
            input_ids, token_type_ids, position_ids = map(unpadding.select, (input_ids, token_type_ids, position_ids))
        x = self.embedding_hidden_mapping_in(
            self.embeddings(input_ids, token_type_ids, position_ids)
        )  # (batch, seq, H) or (tokens, H)
        hidden_states, attentions = [x], []
        n = self.num_layers if num_layers is None else num_layers
        for a, f in zip(self.attention_slots[:n], self.ffn_slots[:n]):
            x, probs = self.attention_blocks[a](x, key_mask, output_attentions, unpadding)
            x = self.ffn_blocks[f](x)
            hidden_states.append(x)
            attentions.append(probs)
        out = EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)
        if num_layers is None:
            out.pooler_output = torch.tanh(self.pooler(out.last_hidden_state[:, 0]))  # (batch, H)
        return out

    # ---- checkpoint folders: the Encoder base's loader and saver over these declarations ----------------------
    # An AlbertModel / AlbertForPreTraining / AlbertForMaskedLM folder saved by transformers, or a folder that ctxrep
    # saved (either format); pretraining-head weights are named in a log message and not loaded.

    config_class = AlbertConfig
    checkpoint = folders.CheckpointLayout(
        MODEL_TYPES,
        prefix="albert.",  # AlbertFor*: the encoder under 'albert.'
        head_prefixes=("predictions.", "sop_classifier.", "classifier.", "qa_outputs."),
        head_noun="pretraining-head weights",
        buffers=("embeddings.position_ids", "embeddings.token_type_ids"),  # transformers' precomputed ids
        hint="check that config.json (num_hidden_groups, inner_group_num, sizes) belongs to these weights",
    )

    def checkpoint_names(self) -> dict[str, str]:
        """Checkpoint name -> our name: transformers' names where the sharing allows, else our own."""
        if self.config.transformers_compatible:
            return hf_parameter_names(self.config)
        with torch.device("meta"):  # the names as built, whatever has been put into this model since (adapters)
            built = AlbertModel(self.config)
        return {k: k for k in built.state_dict()}

    def checkpoint_layout(self) -> folders.CheckpointLayout:
        return dataclasses.replace(self.checkpoint, what=f"an ALBERT encoder (share={self.config.share!r})")

    def save_pretrained(self, path: str | Path, transformers_compatible: bool = False) -> Path:
        """config.json + model.safetensors. share "all" / "none": transformers' AutoModel loads it;
        "attention" / "ffn": ctxrep's format (model_type 'ctxrep-albert'), which only ctxrep loads, and with
        transformers_compatible=True an error instead."""
        if transformers_compatible and not self.config.transformers_compatible:
            raise CheckpointError(
                f"share={self.config.share!r} cannot be saved in transformers' ALBERT format, which shares whole "
                "layers only; save without transformers_compatible=True to get ctxrep's format (ctxrep.load_model "
                "reads it)"
            )
        return super().save_pretrained(path)


def hf_parameter_names(config: AlbertConfig) -> dict[str, str]:
    """transformers' name -> ctxrep's name, for every weight of an encoder whose sharing transformers can hold."""
    names = {
        "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
        "encoder.embedding_hidden_mapping_in.weight": "embedding_hidden_mapping_in.weight",
        "encoder.embedding_hidden_mapping_in.bias": "embedding_hidden_mapping_in.bias",
        "pooler.weight": "pooler.weight",
        "pooler.bias": "pooler.bias",
    }
    attention = {
        "attention.query": "query",
        "attention.key": "key",
        "attention.value": "value",
        "attention.dense": "dense",
        "attention.LayerNorm": "norm",
    }
    ffn = {"ffn": "ffn", "ffn_output": "ffn_output", "full_layer_layer_norm": "norm"}
    k = config.inner_group_num
    groups = config.num_hidden_layers if config.share == "none" else config.num_hidden_groups
    for g in range(groups):
        for j in range(k):
            slot = g * k + j  # the slot both components use in transformers' layout
            hf = f"encoder.albert_layer_groups.{g}.albert_layers.{j}"
            for p in ("weight", "bias"):
                names |= {f"{hf}.{a}.{p}": f"attention_blocks.{slot}.{b}.{p}" for a, b in attention.items()}
                names |= {f"{hf}.{a}.{p}": f"ffn_blocks.{slot}.{b}.{p}" for a, b in ffn.items()}
    return names


# ---- pretraining heads (AlbertForPreTraining's layout) ------------------------------------------------


class MaskedLMHead(nn.Module):
    """logits = LayerNorm(act(W h + b)) E^T + bias: H -> E, then the (tied) word embeddings (AlbertMLMHead)."""

    def __init__(self, config: AlbertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        e = config.embedding_size
        self.dense = nn.Linear(config.hidden_size, e)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(e, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one Parameter, two names
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., hidden_size) -> logits (..., vocab)."""
        return self.decoder(self.norm(self.activation(self.dense(hidden)))) + self.bias


class SentenceOrderHead(nn.Module):
    """logits = W Dropout(pooled) + b over (in order, swapped); transformers' sop_classifier (AlbertSOPHead)."""

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled: (batch, hidden) -> logits (batch, 2)."""
        return self.classifier(self.dropout(pooled))


@dataclass
class AlbertPreTrainingOutput:
    """prediction_logits: (batch, seq, vocab) or (n, vocab) at the positions asked for; sop_logits: (batch, 2)."""

    prediction_logits: torch.Tensor
    sop_logits: torch.Tensor
    encoder_output: EncoderOutput


class AlbertForPreTraining(nn.Module):
    """AlbertModel + masked-LM head + sentence-order head, saved in transformers' AlbertForPreTraining layout.

    The losses are in ctxrep.objectives.sentence_order (L = L_MLM + L_SOP, Lan et al. 2019, sec. 4.1).
    """

    def __init__(self, config: AlbertConfig) -> None:
        super().__init__()
        self.config = config
        self.albert = AlbertModel(config)
        self.predictions = MaskedLMHead(config, self.albert.embeddings.word_embeddings)
        self.sop_classifier = SentenceOrderHead(config)
        # Only the heads' own layers: the decoder weight is the (already initialised) word embedding matrix.
        for module in (self.predictions.dense, self.predictions.norm, self.sop_classifier):
            module.apply(self.albert._init_weights)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        predict: torch.Tensor | None = None,
    ) -> AlbertPreTrainingOutput:
        """predict: (batch, seq) bool; when given, the vocabulary projection runs at those positions only and
        prediction_logits is (n, vocab) in row-major order of the True entries."""
        out = self.albert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        hidden = out.last_hidden_state if predict is None else out.last_hidden_state[predict]
        return AlbertPreTrainingOutput(self.predictions(hidden), self.sop_classifier(out.pooler_output), out)

    def checkpoint_names(self) -> dict[str, str]:
        """AlbertForPreTraining's names -> ours. The decoder weight is the word embedding matrix, left out as
        transformers leaves out tied weights; predictions.decoder.bias is the same tensor as predictions.bias."""
        names = {"albert." + ckpt: "albert." + our for ckpt, our in self.albert.checkpoint_names().items()}
        head = {
            "predictions.dense": "predictions.dense",
            "predictions.LayerNorm": "predictions.norm",
            "sop_classifier.classifier": "sop_classifier.classifier",
        }
        names |= {f"{ckpt}.{p}": f"{our}.{p}" for ckpt, our in head.items() for p in ("weight", "bias")}
        names["predictions.bias"] = "predictions.bias"
        return names

    @classmethod
    def from_pretrained(cls, path: str | Path) -> AlbertForPreTraining:
        """An AlbertForPreTraining folder (transformers' or this class's save_pretrained), heads included."""
        path = Path(path)
        model = cls(AlbertConfig.from_hf_dict(folders.read_config(path, MODEL_TYPES)))
        state = folders.read_state_dict(path)
        state.pop("predictions.decoder.weight", None)  # tied to the word embeddings, when a file stores it
        decoder_bias = state.pop("predictions.decoder.bias", None)  # tied to predictions.bias
        if decoder_bias is not None and "predictions.bias" not in state:
            state["predictions.bias"] = decoder_bias
        buffers = tuple("albert." + b for b in AlbertModel.checkpoint.buffers)
        names = model.checkpoint_names()
        folders.load_named_weights(model, state, names, str(path), "an ALBERT pretraining model", not_weights=buffers)
        return model.eval()

    def save_pretrained(self, path: str | Path) -> Path:
        """An AlbertForPreTraining folder (ctxrep's format for attention / ffn sharing); ctxrep.load_model and
        AlbertModel.from_pretrained load its encoder, transformers' AutoModelForPreTraining all of it."""
        ours = self.state_dict()
        tensors = {ckpt: ours[our] for ckpt, our in self.checkpoint_names().items()}
        tensors["predictions.decoder.bias"] = ours["predictions.bias"]
        config = self.config.to_hf_dict()
        if self.config.transformers_compatible:
            config["architectures"] = ["AlbertForPreTraining"]
        return folders.write_folder(path, config, tensors)
