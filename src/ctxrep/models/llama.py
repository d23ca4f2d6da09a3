"""Llama: a decoder-only, pre-RMSNorm Transformer with rotary positions, grouped-query attention and SwiGLU
(Touvron et al. 2023, sec. 2.2; Llama 2 adds grouped-query attention). Mistral (Jiang et al. 2023) is the same
network with a sliding attention window, and serves model_type "mistral" from this file; Qwen2 and Qwen3
(models/qwen2.py, models/qwen3.py) are this network with query/key/value biases or per-head q/k norms.

    x_0 = E[w]
    x = x + W_o Attn(RMSNorm(x))            grouped-query, causal, rotary q and k (modules/grouped_attention.py)
    x = x + W_down (SiLU(W_gate y) * (W_up y)),  y = RMSNorm(x)          (modules/gated_mlp.py)
    h_L = RMSNorm(x)                                                       final norm

Hidden states: entry 0 is the embedding output, entry l < L layer l's output, entry L the final RMSNorm of layer
L's output (= last_hidden_state, as transformers 5 returns it). Attention is causal (each token reads itself and
the tokens before it), within `sliding_window` tokens on the layers `layer_types` marks "sliding_attention".
Positions count the real tokens of each row, so a left-padded text gets the positions it has unpadded.

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid runs unpadded (modules/unpadding.py),
on either side: embeddings, projections, q / k norms, the rotary turn, norms and feed-forwards on the (tokens, hidden)
rows of real tokens; positions, rotary tables and causal / sliding-window masks stay those of the padded grid, and
q, k, v are re-padded only around the attention product. The same hidden states at real tokens (0 at padding).

Weights: config.json + model.safetensors or shards with model.safetensors.index.json, read one tensor at a time
into a model built on the meta device (models/shards.py); `dtype="auto"` keeps a bfloat16 checkpoint in bfloat16
where the CPU has native bfloat16. A causal-LM folder's head (lm_head, or the tied token embeddings) answers
`lm_logits` (LLM rerankers read a few tokens' logits); the model is otherwise the decoder stack alone.

Reads top to bottom: config, layer, model (the encoder interface, forward, LM logits), the Hugging Face format.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from ctxrep.models.encoder import Encoder, check_length
from ctxrep.models.folders import CheckpointError, read_config
from ctxrep.models.outputs import EncoderOutput
from ctxrep.models.shards import WeightIndex, load_into, resolve_dtype, write_sharded
from ctxrep.modules.activations import check_activation
from ctxrep.modules.gated_mlp import GatedMLP
from ctxrep.modules.grouped_attention import GroupedQueryAttention, decoder_mask, padding_of, positions_of
from ctxrep.modules.rms_norm import RMSNorm
from ctxrep.modules.rotary import RopeError, RopeSpec, rotary_cos_sin
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types
# Checkpoint names of heads on top of the decoder that the encoder does not hold (classification heads).
HEAD_PREFIXES = ("lm_head.", "score.", "classifier.")


@dataclass
class LlamaConfig:
    """Everything needed to rebuild the network; field names are transformers' config.json keys, plus the three
    layout switches the Qwen files set (qkv_bias, o_bias, qk_norm)."""

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: as many as query heads
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10_000.0})
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's query and key
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)
    tie_word_embeddings: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self) -> None:
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        check_activation("hidden_act", self.hidden_act)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{self.num_key_value_heads}"
            )
        if not self.layer_types:
            self.layer_types = [SLIDING if self.sliding_window else FULL] * self.num_hidden_layers
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {FULL, SLIDING}:
            raise ValueError(f"layer_types must name {FULL!r} or {SLIDING!r} for each layer, got {self.layer_types}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        self.rope = RopeSpec.from_hf(self.rope_parameters, 10_000.0, "config")

    def to_hf_dict(self, architecture: str) -> dict:
        d = asdict(self)
        for key in ("qkv_bias", "o_bias", "qk_norm"):  # implied by the model_type (the family's file)
            del d[key]
        d["rope_parameters"] = self.rope.to_hf()
        d["rope_theta"] = self.rope.theta  # transformers 4.x reads it here
        d["attention_bias"] = self.qkv_bias
        if SLIDING in self.layer_types:  # Qwen2 / Qwen3 read their windows from these two
            d["use_sliding_window"] = True
            d["max_window_layers"] = self.layer_types.index(SLIDING)
        return d | {"architectures": [architecture]}


# The config.json keys every Llama-style folder shares (the family files add or derive the rest).
_SHARED_KEYS = {f.name for f in fields(LlamaConfig)} - {"qkv_bias", "o_bias", "qk_norm", "rope_parameters"}


def shared_config(d: dict, where: str) -> dict:
    """The LlamaConfig keys found in config.json `d`, with its rotary settings read once: transformers 5's
    rope_parameters, or 4.x's rope_theta + rope_scaling; an unknown scaling type is refused here."""
    out = {k: v for k, v in d.items() if k in _SHARED_KEYS and v is not None}
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    spec = RopeSpec.from_hf(rope, float(d.get("rope_theta") or rope.get("rope_theta") or 10_000.0), where)
    out["rope_parameters"] = spec.to_hf()
    return out


def config_from_folder(path: Path, model_types: tuple[str, ...], build):
    """config.json -> a decoder family's config through its `build(d, where)`; every problem is one CheckpointError
    naming the file, raised before any weight is read."""
    where = str(path / "config.json")
    d = read_config(path, model_types)
    try:
        return build(d, where)
    except RopeError as e:
        raise CheckpointError(str(e)) from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from None


def llama_layout(d: dict) -> dict:
    """Llama and Mistral: attention_bias on all four projections; Mistral's sliding_window on every layer."""
    bias = bool(d.get("attention_bias", False))
    return {"qkv_bias": bias, "o_bias": bias, "qk_norm": False}


class DecoderLayer(nn.Module):
    """Pre-norm: attention then the gated feed-forward, each RMSNorm-ed in and added to the residual stream."""

    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        c = config
        self.sliding = c.layer_types[layer] == SLIDING
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = GroupedQueryAttention(
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            qkv_bias=c.qkv_bias,
            o_bias=c.o_bias,
            qk_norm=RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None,
            dropout=c.attention_dropout,
        )
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_act, bias=c.mlp_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        output_attentions: bool,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding` (GroupedQueryAttention.forward)
        a, probs = self.self_attn(self.input_layernorm(x), cos, sin, mask, True, output_attentions, unpadding)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), probs


class DecoderEncoder(Encoder):
    """The encoder-interface members every decoder LLM family answers alike (LlamaModel and its Qwen layouts,
    Gemma3Model): their configs share transformers' names, embed_tokens / layers / norm / lm_head their modules."""

    reads_segments = False
    is_decoder = True
    causal = True  # each token reads only itself and the tokens before it (last-token pooling reads the whole text)
    MODEL_TYPES: tuple[str, ...]  # config.json model_type values the family reads
    BARE_ARCHITECTURE: str | None = None  # transformers' class of the bare decoder, when not <Family>Model
    embedding_table = "embed_tokens"
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )

    def checkpoint_names(self) -> dict[str, str]:
        """transformers' names are this model's own as the family builds it (the bare decoder; a causal-LM folder
        adds "model."); read off a weightless copy, whatever has been put into this one since (adapters)."""
        with torch.device("meta"):
            built = type(self)(self.config, lm_head=self.lm_head is not None)
        return {name: name for name in built.state_dict()}

    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

    def init_weights(self) -> None:
        """transformers' init: normal(0, initializer_range) linear and embedding weights, zero biases; norms as
        built. Nothing happens on the meta device (a model about to be loaded)."""
        if any(p.is_meta for p in self.parameters()):
            return
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.initializer_range)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def layer_of(self, name: str) -> int:
        """embed_tokens 0; layers.i i + 1; the final norm and the LM head num_layers."""
        parts = name.split(".")
        if parts[0] == "embed_tokens":
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        if parts[0] in ("norm", "lm_head"):
            return self.num_layers
        raise self.unknown_parameter(name)

    # ---- Hugging Face folder format (lazy: tensor by tensor from the shards, models/shards.py) ----------------

    @classmethod
    def config_from_json(cls, d: dict, where: str) -> object:
        """The family's config of config.json `d` (`where` names the file in errors)."""
        raise NotImplementedError(f"{cls.__name__} declares no config_from_json (models/llama.py)")

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str | torch.dtype = "auto") -> DecoderEncoder:
        """A transformers folder of this family (the bare model or ...ForCausalLM), one file or shards; `dtype`
        "auto" (bfloat16 for a bfloat16 checkpoint on a CPU with native bfloat16, else float32), "fp32", "bf16"."""
        path = Path(path)
        return build_from_folder(cls, config_from_folder(path, cls.MODEL_TYPES, cls.config_from_json), path, dtype)

    def save_pretrained(self, path: str | Path, max_shard_bytes: int | None = None) -> None:
        """config.json and the weights (sharded above `max_shard_bytes`) as transformers saves this family's bare
        model, or its ...ForCausalLM with the LM head."""
        save_folder(self, Path(path), self.config.to_hf_dict(architecture_of(self)), max_shard_bytes)

    def lm_head_weight(self, token_ids: Sequence[int] | None) -> torch.Tensor:
        """(vocab or len(token_ids), hidden): lm_head's weight, or the token embeddings when the folder ties them."""
        if self.lm_head is not None:
            w = self.lm_head.weight
        elif self.config.tie_word_embeddings:
            w = self.embed_tokens.weight
        else:
            raise ValueError(
                f"this {self.family} folder has no LM head (no lm_head.weight and untied embeddings): load a "
                "...ForCausalLM folder (a reranker's) for lm_logits"
            )
        return w if token_ids is None else w[torch.as_tensor(list(token_ids), device=w.device)]


class LlamaModel(DecoderEncoder):
    """The decoder stack; `forward` takes transformers' LlamaModel arguments and returns the same hidden states."""

    MODEL_TYPES: tuple[str, ...] = ("llama", "mistral")
    layout = staticmethod(llama_layout)

    def __init__(self, config: LlamaConfig, lm_head: bool = False) -> None:
        """lm_head: hold a separate LM head (an untied causal-LM checkpoint's lm_head.weight)."""
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False) if lm_head else None
        self.init_weights()

    # ---- the encoder interface (models/encoder.py; the rest in DecoderEncoder) ----

    @property
    def family(self) -> str:
        return self.config.model_type

    @property
    def max_tokens(self) -> int:
        """max_position_embeddings (Qwen3: 40,960; Llama 3.1: 131,072), times the factor of a linear or dynamic
        rope scaling, which stretch the positions past it."""
        return context_length(self.config.rope, self.config.max_position_embeddings)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """input_ids, attention_mask: (batch, seq), padding on either side; token_type_ids are not read.
        `num_layers` stops after that many layers (the final norm only after the last one). A batch with much
        padding (`Encoder.unpadding`) runs unpadded: the same hidden states at real tokens, 0 at padding."""
        b, t = input_ids.shape
        check_length(t, self.max_tokens)
        real = padding_of(attention_mask)  # (batch, seq) bool, or None without padding
        unpadding = self.unpadding(attention_mask, padded)
        ids = input_ids if unpadding is None else unpadding.select(input_ids)  # (batch, seq) or (tokens,)
        x = self.embed_tokens(ids)  # (batch, seq | tokens, hidden)
        c = self.config
        positions = positions_of(real, b, t, input_ids.device)  # (batch, seq)
        cos, sin = rotary_cos_sin(c.rope, c.head_dim, c.max_position_embeddings, positions, x.dtype)
        if unpadding is not None:
            cos, sin = unpadding.select(cos), unpadding.select(sin)  # each (tokens, head_dim)
        masks = {
            FULL: decoder_mask(real, t, True, None, x.device),
            SLIDING: decoder_mask(real, t, True, c.sliding_window, x.device),
        }
        hidden_states, attentions = [x], []
        stop = num_layers if num_layers is not None else self.num_layers
        for i, layer in enumerate(self.layers[:stop]):
            x, probs = layer(x, cos, sin, masks[SLIDING if layer.sliding else FULL], output_attentions, unpadding)
            if i == self.num_layers - 1:
                x = self.norm(x)
            hidden_states.append(x)
            attentions.append(probs)
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    def lm_logits(self, hidden: torch.Tensor, token_ids: Sequence[int] | None = None) -> torch.Tensor:
        """The causal LM head on final hidden states (..., hidden) -> logits (..., vocab), or only the columns of
        `token_ids` (a reranker's "yes" / "no"). The head is lm_head, or the token embeddings when tied."""
        return hidden @ self.lm_head_weight(token_ids).T

    @classmethod
    def config_from_json(cls, d: dict, where: str) -> LlamaConfig:
        """The keys every Llama-style folder shares, and the family's `layout(d)`: its biases, norms and windows."""
        return LlamaConfig(**(shared_config(d, where) | cls.layout(d)))


# ---- shared by the Llama-style families (llama, qwen2, qwen3, gemma3) ---------------------------------------


def context_length(rope: RopeSpec, max_positions: int) -> int:
    """The longest window: the model's positions, stretched by a linear or dynamic rope scaling's factor."""
    if rope.rope_type in ("linear", "dynamic"):
        return int(max_positions * rope.factor)
    return max_positions


def architecture_of(model: nn.Module) -> str:
    """transformers' class name for a saved folder: ...ForCausalLM with an LM head, else ...Model (or the family's
    BARE_ARCHITECTURE)."""
    if model.lm_head is not None:
        return type(model).__name__.removesuffix("Model") + "ForCausalLM"
    return getattr(model, "BARE_ARCHITECTURE", None) or type(model).__name__


def build_from_folder(cls, config, path: Path, dtype: str | torch.dtype):
    """The model of `config` built on the meta device and filled tensor by tensor from the folder's weights
    (a causal-LM folder's decoder sits under "model."; an untied lm_head is kept for lm_logits)."""
    index = WeightIndex.of(path)  # headers only; a missing shard is refused here
    prefix = "model." if any(k.startswith("model.layers.") for k in index.entries) else ""
    head = "lm_head.weight" in index.entries and not config.tie_word_embeddings
    with torch.device("meta"):
        model = cls(config, lm_head=head)
    names = {(n if n.startswith("lm_head.") else prefix + n): n for n, _ in model.named_parameters()}
    skipped = [k for k in index.entries if k not in names and k.startswith(HEAD_PREFIXES)]
    if skipped:
        logger.info("%s: not loading %s (not part of the decoder)", path, ", ".join(skipped))
    what = f"a {model.family} model"
    load_into(model, index, names, resolve_dtype(dtype, index.stored_dtype()), what, skip=HEAD_PREFIXES)
    return model.eval()


def save_folder(model: nn.Module, path: Path, config: dict, max_shard_bytes: int | None = None) -> None:
    """config.json + weights under transformers' names ("model." before the decoder's when an LM head is saved)."""
    prefix = "model." if model.lm_head is not None else ""
    tensors = {(n if n.startswith("lm_head.") else prefix + n): p for n, p in model.state_dict().items()}
    write_sharded(path, tensors, max_shard_bytes)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
