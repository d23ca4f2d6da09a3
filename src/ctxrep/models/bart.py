"""BART (Lewis et al. 2019) and mBART (Liu et al. 2020): a bidirectional encoder and an autoregressive decoder,
pretrained by corrupting documents and reconstructing them (objectives/denoising.py).

The network is the Transformer encoder-decoder of models/seq2seq.py (Vaswani et al. 2017; the layers Marian shares,
post-LN for BART, pre-LN with a final LayerNorm after each stack for mBART), with BART's own embeddings:

    x_0 = dropout(LayerNorm_emb(s * E[tokens] + P[positions + 2]))       (encoder and decoder alike)

    E          one table shared by the encoder input, the decoder input and the output projection (tied)
    s          sqrt(d_model) with scale_embedding (mBART's checkpoints), else 1 (BART's)
    P          learned positions; fairseq reserves rows 0 and 1 (its padding offset), so position i reads row i + 2
    logits     = y E^T + final_logits_bias

`normalize_before` is the one flag between the two: model_type "mbart" is the pre-LN variant (transformers'
MBartModel), whose teacher forcing starts the decoder with each row's last real token (its language code) instead
of decoder_start_token_id (transformers' mbart shift_tokens_right).

As an `Encoder` (models/encoder.py) a BART folder gives the encoder's layers, then the decoder's with the text
teacher-forced (models/seq2seq.py); its classification state is the decoder's at the final </s>
(`classifies_at_end`), as BartForSequenceClassification reads it, whose head (classification_head.dense, tanh,
out_proj) ctxrep.rerank's cross-encoder reads from such a folder.

Checkpoints: config.json with model_type "bart" / "mbart" and the weights of BartForConditionalGeneration (under
"model.", plus final_logits_bias), BartModel (no prefix), or BartForSequenceClassification (its classification_head
left out by name, logged). Settings the network does not have are refused before any weight is read: an unknown
activation, sinusoidal positions (static_position_embeddings), another position offset (extra_pos_embeddings),
no embedding LayerNorm (normalize_embedding false) or a pre-LN switch on model_type "bart" (which transformers
ignores).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from ctxrep.models import folders
from ctxrep.models.folders import CheckpointError
from ctxrep.models.seq2seq import (
    DECODER_LAYER_MODULES,
    ENCODER_LAYER_MODULES,
    DecoderLayer,
    EncoderLayer,
    TransformerEncoderDecoder,
)
from ctxrep.modules.activations import check_activation
from ctxrep.modules.init_weights import normal_init
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

MODEL_TYPES = ("bart", "mbart")
POSITION_OFFSET = 2  # fairseq's learned positions start at row 2 (BartLearnedPositionalEmbedding.offset)
ARCHITECTURES = {"bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration"}
# Task heads on top of the model in task folders: left out by name (ctxrep.rerank reads the classification head).
HEAD_PREFIXES = ("classification_head.", "qa_outputs.")
# Older configs' switches and the only value the network has for each (transformers ignores the keys today).
FIXED_SWITCHES = {
    "static_position_embeddings": False,
    "extra_pos_embeddings": POSITION_OFFSET,
    "normalize_embedding": True,
    "add_bias_logits": False,
}


@dataclass
class BartConfig:
    """Field names of transformers' BartConfig / MBartConfig; the defaults are facebook/bart-base's."""

    model_type: str = "bart"
    vocab_size: int = 50265
    d_model: int = 768
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 12
    decoder_attention_heads: int = 12
    encoder_ffn_dim: int = 3072
    decoder_ffn_dim: int = 3072
    activation_function: str = "gelu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_position_embeddings: int = 1024
    init_std: float = 0.02
    scale_embedding: bool = False
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    decoder_start_token_id: int = 2
    forced_eos_token_id: int | None = 2
    forced_bos_token_id: int | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        for heads, side in ((self.encoder_attention_heads, "encoder"), (self.decoder_attention_heads, "decoder")):
            if self.d_model % heads:
                raise ValueError(f"d_model {self.d_model} is not a multiple of {side}_attention_heads {heads}")
        check_activation("activation_function", self.activation_function)

    @property
    def normalize_before(self) -> bool:
        """mBART's pre-LN layers and final LayerNorms; BART is post-LN."""
        return self.model_type == "mbart"

    @classmethod
    def from_hf_dict(cls, d: dict) -> BartConfig:
        """From a config.json dict; switches of older configs that change the network are refused in one line."""
        for key, value in FIXED_SWITCHES.items():
            if key in d and d[key] != value:
                raise ValueError(
                    f"{key}={d[key]!r}: a {d.get('model_type', 'bart')} model with another position or embedding "
                    f"scheme than BART's ({key}={value!r}), which neither transformers nor ctxrep runs"
                )
        if d.get("model_type") == "bart" and (d.get("normalize_before") or d.get("add_final_layer_norm")):
            raise ValueError(
                "pre-LayerNorm layers (normalize_before / add_final_layer_norm) with model_type "
                "'bart' are asked for, which transformers ignores; a pre-LN BART is an mBART: set model_type 'mbart'"
            )
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        for key in ("eos_token_id", "forced_eos_token_id"):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = kwargs[key][0]
        if kwargs.get("decoder_start_token_id") is None:  # mBART's configs: the eos (its language code comes first)
            kwargs["decoder_start_token_id"] = kwargs.get("eos_token_id", cls.eos_token_id)
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d |= {
            "architectures": [ARCHITECTURES[self.model_type]],
            "is_encoder_decoder": True,
            "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0,
        }
        return d


class BartForConditionalGeneration(TransformerEncoderDecoder):
    """The encoder-decoder with its LM head. `forward` follows transformers' BartForConditionalGeneration (same
    arguments, same logits); search, training and the encoder interface come from models/seq2seq.py."""

    word_level = False
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a source batch with this share of padding runs unpadded
    classifies_at_end = True  # the classification state: the decoder's at the final </s>

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.shared = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder, self.decoder = nn.Module(), nn.Module()
        for stack, count, layer in (
            (self.encoder, config.encoder_layers, EncoderLayer),
            (self.decoder, config.decoder_layers, DecoderLayer),
        ):
            stack.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, d)
            stack.layernorm_embedding = nn.LayerNorm(d)
            stack.layers = nn.ModuleList(layer(config) for _ in range(count))
            if config.normalize_before:  # mBART: the stacks' outputs are not normalised by their last layer
                stack.layer_norm = nn.LayerNorm(d)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(d, config.vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' BartPreTrainedModel: N(0, init_std) weights, zero biases, the padding row zero."""
        normal_init(module, self.config.init_std)

    # ---- the encoder interface (models/encoder.py) ----

    config_fields = {"hidden_size": "d_model", "max_tokens": "max_position_embeddings"}
    embedding_table = "shared"

    @property
    def family(self) -> str:
        """The model_type: "bart", or "mbart"."""
        return self.config.model_type

    def layer_of(self, name: str) -> int:
        """The shared embeddings and the encoder's positions and embedding LayerNorm 0; encoder.layers.i i + 1; the
        encoder's final LayerNorm (mBART) E; the decoder's positions and embedding LayerNorm E + 1 (they feed decoder
        layer 1); decoder.layers.j E + j + 1; the decoder's final LayerNorm and an untied LM head E + D."""
        e, parts = self.encoder_depth, name.split(".")
        if parts[0] == "shared" or (parts[0] == "encoder" and parts[1] in ("embed_positions", "layernorm_embedding")):
            return 0
        if parts[0] == "decoder" and parts[1] in ("embed_positions", "layernorm_embedding"):
            return e + 1
        if parts[0] in ("encoder", "decoder") and parts[1] == "layers" and len(parts) > 3 and parts[2].isdigit():
            i, count = int(parts[2]), (self.encoder_depth if parts[0] == "encoder" else self.decoder_depth)
            if i < count:
                return i + 1 if parts[0] == "encoder" else e + i + 1
        elif parts[0] == "encoder" and parts[1] == "layer_norm":
            return e
        elif (parts[0] == "decoder" and parts[1] == "layer_norm") or parts[0] == "lm_head":
            return e + self.decoder_depth
        raise self.unknown_parameter(name)

    # ---- what the search reads ----

    @property
    def forces_eos(self) -> bool:
        return self.config.forced_eos_token_id is not None

    # ---- embeddings ----

    def output_weight(self) -> torch.Tensor:
        """The output projection (vocab, d_model): the shared embeddings when tied."""
        return self.shared.weight if self.lm_head is None else self.lm_head.weight

    def output_bias(self) -> torch.Tensor:
        return self.final_logits_bias[0]

    def embed(
        self, stack: nn.Module, ids: torch.Tensor, start: int, unpadding: Unpadding | None = None
    ) -> torch.Tensor:
        """dropout(LayerNorm_emb(s * E[ids] + P[start + i + 2])) of one stack; ids (batch, seq) -> (batch, seq,
        d_model), or with `unpadding` the (tokens, d_model) rows of real tokens (positions on the padded grid)."""
        b, t = ids.shape
        if start + t > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {start + t} tokens is longer than the model's {self.config.max_position_embeddings} "
                "positions (max_position_embeddings); shorten or split it"
            )
        positions = torch.arange(start, start + t, device=ids.device) + POSITION_OFFSET  # (seq,)
        if unpadding is not None:
            ids, positions = unpadding.select(ids), unpadding.select(positions.expand(b, t))  # (tokens,) each
        x = self.shared(ids) * self.embed_scale + stack.embed_positions(positions)  # (batch, seq | tokens, d_model)
        return self.embed_dropout(stack.layernorm_embedding(x))

    def embed_source(self, ids: torch.Tensor, unpadding: Unpadding | None) -> torch.Tensor:
        return self.embed(self.encoder, ids, 0, unpadding)

    def embed_target(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.embed(self.decoder, ids, start)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """BART: decoder_start_token_id (</s>), then the labels but the last. mBART (transformers' mbart
        shift_tokens_right): each row's last real token (its language code) first instead."""
        if not self.config.normalize_before:
            return super().shift_right(labels)
        labels = labels.masked_fill(labels == -100, self.config.pad_token_id)
        last = (labels != self.config.pad_token_id).sum(dim=1) - 1  # (batch,) the last real token's position
        shifted = labels.roll(1, dims=1)
        shifted[:, 0] = labels.gather(1, last[:, None].clamp(min=0))[:, 0]
        return shifted

    # ---- Hugging Face's folder format: the Encoder base's loader and saver over these declarations ----

    config_class = BartConfig
    checkpoint = folders.CheckpointLayout(
        MODEL_TYPES,
        what="a BART encoder-decoder",
        head_prefixes=HEAD_PREFIXES,
        head_noun="task-head weights (ctxrep.rerank reads a classification head from the folder itself)",
    )

    @classmethod
    def model_state(cls, state: dict[str, torch.Tensor], hf_config: dict) -> dict[str, torch.Tensor]:
        """Names as BartForConditionalGeneration has them: a bare BartModel's ("shared.weight", ...) get "model."."""
        if not any(k.startswith("model.") for k in state):
            return {k if k.startswith(HEAD_PREFIXES) else f"model.{k}": v for k, v in state.items()}
        return state

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
        """The Encoder base's loading, once the tied copies older files keep (each stack's embed_tokens, lm_head) are
        checked against model.shared and dropped; a missing final_logits_bias is zeros, as in transformers."""
        state = dict(state)
        tied = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
        if self.config.tie_word_embeddings:
            tied.append("lm_head.weight")
        if "model.shared.weight" not in state and tied[0] in state:
            state["model.shared.weight"] = state[tied[0]]
        for name in tied:
            copy = state.pop(name, None)
            if copy is not None and not torch.equal(copy, state.get("model.shared.weight", copy)):
                raise CheckpointError(f"{source}: {name} differs from model.shared.weight, of which it is a tied copy")
        state.setdefault("final_logits_bias", torch.zeros_like(self.final_logits_bias))
        super().load_hf_state_dict(state, source)


def hf_parameter_names(config: BartConfig) -> dict[str, str]:
    """transformers' BartForConditionalGeneration name -> ctxrep's name, for every weight saved and loaded."""
    names = {"model.shared.weight": "shared.weight", "final_logits_bias": "final_logits_bias"}
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for side, count, per_layer in (
        ("encoder", config.encoder_layers, ENCODER_LAYER_MODULES),
        ("decoder", config.decoder_layers, DECODER_LAYER_MODULES),
    ):
        names[f"model.{side}.embed_positions.weight"] = f"{side}.embed_positions.weight"
        modules = ["layernorm_embedding"] + (["layer_norm"] if config.normalize_before else [])
        modules += [f"layers.{i}.{m}" for i in range(count) for m in per_layer]
        for module in modules:
            for p in ("weight", "bias"):
                names[f"model.{side}.{module}.{p}"] = f"{side}.{module}.{p}"
    return names
