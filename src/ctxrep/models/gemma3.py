"""Gemma 3's text decoder (Gemma Team 2025, "Gemma 3 Technical Report", sec. 2): model_type gemma3_text.
EmbeddingGemma is this network with bidirectional attention (config.json: use_bidirectional_attention).

    x_0 = sqrt(hidden) * E[w]                                              scaled embeddings
    x = x + RMSNorm(W_o Attn(RMSNorm(x)))                                  norms before and after each block
    x = x + RMSNorm(W_down (GELU(W_gate y) * (W_up y))),  y = RMSNorm(x)   GeGLU, GELU's tanh form
    h_L = RMSNorm(x)

Every RMSNorm scales by (1 + w) (modules/rms_norm.py's unit_offset), the per-head q and k norms included.
Attention scores are scaled by query_pre_attn_scalar^-1/2 (not head_dim^-1/2); attn_logit_softcapping is read
and not applied, as transformers 5 does (the report replaced Gemma 2's soft-capping by the q/k norms). Five sliding-window layers run between global ones (layer_types), each kind with its
own rotary base (rope_parameters per layer type: 10,000 local, 1,000,000 global, the global one possibly
scaled). Causal: the sliding layers read the `sliding_window` tokens up to and including themselves; bidirectional
(EmbeddingGemma): every token, and within sliding_window / 2 on either side on the sliding layers (transformers 5:
|i - j| < sliding_window // 2 + 1).

The final logits (`lm_logits`, the tied embeddings) are capped by final_logit_softcapping when set. Loading,
saving, hidden states, positions and unpadded batches (padding) are as models/llama.py describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import torch
from torch import nn

from ctxrep.models.encoder import check_length
from ctxrep.models.llama import FULL, SLIDING, DecoderEncoder, context_length
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import check_activation
from ctxrep.modules.gated_mlp import GatedMLP
from ctxrep.modules.grouped_attention import GroupedQueryAttention, decoder_mask, padding_of, positions_of
from ctxrep.modules.rms_norm import RMSNorm
from ctxrep.modules.rotary import RopeSpec, rotary_cos_sin
from ctxrep.modules.unpadding import Unpadding

MODEL_TYPE = "gemma3_text"
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}


@dataclass
class Gemma3Config:
    """Field names and defaults are transformers' Gemma3TextConfig (Gemma 3 1B's shape, roughly)."""

    vocab_size: int = 262_208
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-6
    rope_parameters: dict = field(
        default_factory=lambda: {k: {"rope_type": "default", "rope_theta": v} for k, v in DEFAULT_THETA.items()}
    )
    attention_bias: bool = False
    attention_dropout: float = 0.0
    query_pre_attn_scalar: float = 256
    sliding_window: int = 4096  # as config.json writes it (bidirectional models: the whole window, both sides)
    layer_types: list[str] = field(default_factory=list)
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    use_bidirectional_attention: bool = False
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 1

    def __post_init__(self) -> None:
        check_activation("hidden_activation", self.hidden_activation)
        if not self.layer_types:  # five sliding layers, then a global one
            self.layer_types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(self.num_hidden_layers)]
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {FULL, SLIDING}:
            raise ValueError(f"layer_types must name {FULL!r} or {SLIDING!r} for each layer, got {self.layer_types}")
        self.rope = {
            kind: RopeSpec.from_hf(self.rope_parameters.get(kind), DEFAULT_THETA[kind], "config")
            for kind in DEFAULT_THETA
        }

    @property
    def window(self) -> int:
        """The window transformers 5 masks with: i - j < window (causal), |i - j| < window (bidirectional)."""
        return self.sliding_window // 2 + 1 if self.use_bidirectional_attention else self.sliding_window

    @classmethod
    def from_hf_dict(cls, d: dict, where: str) -> Gemma3Config:
        """transformers 5's nested rope_parameters, or 4.x's rope_theta (global), rope_local_base_freq (sliding)
        and rope_scaling (the global layers'); an unknown scaling type is refused here."""
        names = {f.name for f in fields(cls)} - {"rope_parameters"}
        out = {k: v for k, v in d.items() if k in names and v is not None}
        nested = d.get("rope_parameters") or {}
        if nested and not set(nested) <= {FULL, SLIDING}:  # a flat dict: the global layers' settings
            nested = {FULL: nested}
        old = {FULL: d.get("rope_theta"), SLIDING: d.get("rope_local_base_freq")}
        rope = {}
        for kind in (FULL, SLIDING):
            params = dict(nested.get(kind) or {})
            if kind == FULL and d.get("rope_scaling"):
                params |= d["rope_scaling"]
            rope[kind] = RopeSpec.from_hf(params, float(old[kind] or DEFAULT_THETA[kind]), where).to_hf()
        out["rope_parameters"] = rope
        if "sliding_window_pattern" in d and "layer_types" not in d:
            n = d["sliding_window_pattern"]
            out["layer_types"] = [FULL if (i + 1) % n == 0 else SLIDING for i in range(d["num_hidden_layers"])]
        return cls(**out)

    def to_hf_dict(self, architecture: str) -> dict:
        d = asdict(self) | {"model_type": MODEL_TYPE, "architectures": [architecture]}
        d["rope_parameters"] = {kind: spec.to_hf() for kind, spec in self.rope.items()}
        return d


class Gemma3Layer(nn.Module):
    """Attention and GeGLU blocks, each between an input RMSNorm and an output RMSNorm."""

    def __init__(self, config: Gemma3Config, layer: int) -> None:
        super().__init__()
        c = config
        self.kind = c.layer_types[layer]

        def norm(dim: int) -> RMSNorm:
            return RMSNorm(dim, c.rms_norm_eps, unit_offset=True)

        self.input_layernorm = norm(c.hidden_size)
        self.self_attn = GroupedQueryAttention(
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            qkv_bias=c.attention_bias,
            o_bias=c.attention_bias,
            qk_norm=norm(c.head_dim),
            scale=c.query_pre_attn_scalar**-0.5,
            dropout=c.attention_dropout,
        )
        self.post_attention_layernorm = norm(c.hidden_size)
        self.pre_feedforward_layernorm = norm(c.hidden_size)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, c.hidden_activation)
        self.post_feedforward_layernorm = norm(c.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        output_attentions: bool,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding` (GroupedQueryAttention.forward)
        a, probs = self.self_attn(self.input_layernorm(x), cos, sin, mask, causal, output_attentions, unpadding)
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))), probs


class Gemma3Model(DecoderEncoder):
    """The text decoder; `forward` takes transformers' Gemma3TextModel arguments and returns its hidden states."""

    def __init__(self, config: Gemma3Config, lm_head: bool = False) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(Gemma3Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, unit_offset=True)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False) if lm_head else None
        self.init_weights()

    # ---- the encoder interface (models/encoder.py; the rest in DecoderEncoder) ----
    family = MODEL_TYPE

    @property
    def causal(self) -> bool:
        """False for EmbeddingGemma (use_bidirectional_attention): every token reads the whole text."""
        return not self.config.use_bidirectional_attention

    @property
    def max_tokens(self) -> int:
        return context_length(self.config.rope[FULL], self.config.max_position_embeddings)

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
        """input_ids, attention_mask: (batch, seq), padding on either side; token_type_ids are not read. A batch
        with much padding (`Encoder.unpadding`) runs unpadded: the same hidden states at real tokens, 0 at padding."""
        b, t = input_ids.shape
        check_length(t, self.max_tokens)
        c = self.config
        real = padding_of(attention_mask)  # (batch, seq) bool, or None without padding
        unpadding = self.unpadding(attention_mask, padded)
        ids = input_ids if unpadding is None else unpadding.select(input_ids)  # (batch, seq) or (tokens,)
        w = self.embed_tokens.weight
        # sqrt(hidden) in the weights' dtype, as transformers rounds it (55.4256 becomes 55.5 in bfloat16)
        x = self.embed_tokens(ids) * torch.tensor(c.hidden_size**0.5, dtype=w.dtype)  # (batch, seq | tokens, hidden)
        positions = positions_of(real, b, t, input_ids.device)  # (batch, seq)
        rotary = {
            kind: rotary_cos_sin(spec, c.head_dim, c.max_position_embeddings, positions, x.dtype)
            for kind, spec in c.rope.items()
        }
        if unpadding is not None:  # each (tokens, head_dim)
            rotary = {kind: (unpadding.select(cos), unpadding.select(sin)) for kind, (cos, sin) in rotary.items()}
        masks = {
            FULL: decoder_mask(real, t, self.causal, None, x.device),
            SLIDING: decoder_mask(real, t, self.causal, c.window, x.device),
        }
        hidden_states, attentions = [x], []
        stop = num_layers if num_layers is not None else self.num_layers
        for i, layer in enumerate(self.layers[:stop]):
            x, probs = layer(x, *rotary[layer.kind], masks[layer.kind], self.causal, output_attentions, unpadding)
            if i == self.num_layers - 1:
                x = self.norm(x)
            hidden_states.append(x)
            attentions.append(probs)
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    def lm_logits(self, hidden: torch.Tensor, token_ids: Sequence[int] | None = None) -> torch.Tensor:
        """The LM head (tied embeddings unless the folder has lm_head) on final hidden states (..., hidden), capped
        as c tanh(logits / c) by final_logit_softcapping when set; only the `token_ids` columns when given."""
        logits = hidden @ self.lm_head_weight(token_ids).T
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # ---- Hugging Face folder format: DecoderEncoder's loader and saver over these declarations ------------
    # A gemma3_text folder (Gemma3TextModel, Gemma3ForCausalLM, EmbeddingGemma's), one file or shards.

    MODEL_TYPES = (MODEL_TYPE,)
    BARE_ARCHITECTURE = "Gemma3TextModel"

    @classmethod
    def config_from_json(cls, d: dict, where: str) -> Gemma3Config:
        return Gemma3Config.from_hf_dict(d, where)
