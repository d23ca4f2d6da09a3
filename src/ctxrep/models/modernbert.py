"""ModernBERT: a pre-norm, bias-free encoder with rotary positions, GeGLU feed-forwards and alternating local and
global attention (Warner et al. 2024, "Smarter, Better, Faster, Longer", sec. 2.1).

    x_0 = LN(E[w])                                                     token embeddings only, no position table
    x = x + Attn(LN(x))        (layer 1 has no LayerNorm here: x_0 is already normalised)
    x = x + W_o (GELU(x W_i^a) * (x W_i^g))                            GeGLU (Shazeer 2020), W_i = [W_i^a; W_i^g]
    h_L = LN(x)                                                        final norm

Attention is Vaswani et al.'s softmax(QK^T / sqrt(d)) V with rotary positions (Su et al. 2021, eq. 34: q and k of
position m rotated by m * theta_i, theta_i = base^(-2i/d)): every `global_attn_every_n_layers`-th layer (layer 1,
4, 7, ...) attends globally with base `global_rope_theta` (160,000); the others attend within a sliding window,
|i - j| <= local_attention / 2 (64 of 128), with base `local_rope_theta` (10,000). Every LayerNorm and linear layer
is bias-free unless the config says otherwise (norm_bias, attention_bias, mlp_bias).

Hidden states: entry 0 is the embedding output, entry l < L the residual stream after layer l, entry L the final
LayerNorm of layer L's output (= last_hidden_state, as transformers >= 5 returns it; 4.x returned the stream before
the final norm there).

Padding: like transformers' unpadded ModernBERT (with flash-attn), a batch whose padding is at least `unpad_from`
of its (batch, seq) grid runs packed: embeddings, norms, Wqkv, Wo and GeGLU on the (tokens, hidden) rows of real
tokens, re-padded only around attention; the same hidden states at real tokens (0 at padding). The share is a
fixed rule on the mask (modules/unpadding.py's UNPAD_FROM, benchmarks/unpad.py); traced, exported and compiled
graphs run padded.

Reads top to bottom: config, rotary positions, attention, feed-forward, layer, encoder, then the declarations
the Encoder base loads and saves the Hugging Face folder format by (config.json + model.safetensors).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
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
)
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding, key_mask_of

logger = logging.getLogger(__name__)

MODEL_TYPE = "modernbert"
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer_types


@dataclass
class ModernBertConfig(PrunedHeadsConfig):
    """Everything needed to rebuild the network; field names and defaults are those of transformers' config.json
    (ModernBERT-base's). `layer_types` lists each layer's attention; when config.json has none it follows
    global_attn_every_n_layers (layer i is global when i % n == 0). pruned_heads (PrunedHeadsConfig): heads removed
    from each layer, whose layers are built without them."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    mlp_dropout: float = 0.0
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    local_attention: int = 128  # the whole window; a token sees local_attention // 2 on each side
    pad_token_id: int = 50283
    bos_token_id: int = 50281
    eos_token_id: int = 50282
    cls_token_id: int = 50281
    sep_token_id: int = 50282
    layer_types: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_head_dim(self.hidden_size, self.num_attention_heads)
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"rotary positions need an even head size, got {self.hidden_size // self.num_attention_heads}"
            )
        check_activation("hidden_activation", self.hidden_activation)
        if not self.layer_types:
            n = self.global_attn_every_n_layers
            self.layer_types = [LOCAL if i % n else GLOBAL for i in range(self.num_hidden_layers)]
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {GLOBAL, LOCAL}:
            raise ValueError(
                f"layer_types must name {GLOBAL!r} or {LOCAL!r} for each of the {self.num_hidden_layers} layers, "
                f"got {self.layer_types}"
            )
        super().__post_init__()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf_dict(cls, d: dict) -> ModernBertConfig:
        d = dict(d)
        if d.get("rope_scaling"):
            raise CheckpointError(f"rope_scaling={d['rope_scaling']!r} is not supported: ctxrep implements plain RoPE")
        rope = d.pop("rope_parameters", None) or {}  # transformers >= 5: {layer type: {"rope_theta", "rope_type"}}
        for kind, key in ((GLOBAL, "global_rope_theta"), (LOCAL, "local_rope_theta")):
            params = rope.get(kind) or {}
            if params.get("rope_type", "default") != "default":
                raise CheckpointError(
                    f"rope_parameters[{kind!r}] has rope_type {params['rope_type']!r}: ctxrep implements plain RoPE"
                )
            if "rope_theta" in params:
                d[key] = params["rope_theta"]
        if d.get("head_dim") not in (None, d.get("hidden_size", 768) // d.get("num_attention_heads", 12)):
            raise CheckpointError(f"head_dim={d['head_dim']} differs from hidden_size / num_attention_heads")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and v is not None})

    def to_hf_dict(self) -> dict:
        """transformers 4.x reads global_attn_every_n_layers and the two rope thetas; 5.x reads layer_types (when
        the layers do not follow one every-n pattern, 4.x would build the wrong one: write with care).
        pruned_heads is written when a head is gone: ctxrep rebuilds such a folder, transformers' ModernBertModel
        cannot (it has no pruned_heads support and expects every layer's full Wqkv / Wo)."""
        d = asdict(self)
        d["model_type"] = MODEL_TYPE
        d["architectures"] = ["ModernBertModel"]
        n = self.global_attn_every_n_layers
        if self.layer_types != [LOCAL if i % n else GLOBAL for i in range(self.num_hidden_layers)]:
            del d["global_attn_every_n_layers"]
        return self.write_pruned_heads(d)


# ---- rotary positions -------------------------------------------------------------------------------------


def rotary_tables(seq: int, head_dim: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of m * theta_i for positions m < seq and i < d/2, theta_i = base^(-2i/d): the angle by which the
    pair (x_i, x_{i + d/2}) of a head at position m turns. (seq, head_dim / 2) each, float32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))
    angles = torch.arange(seq, device=device).float()[:, None] * inv_freq[None, :]  # (seq, head_dim / 2)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_m x: (x_i, x_{i + d/2}) -> (x_i cos - x_{i + d/2} sin, x_{i + d/2} cos + x_i sin), in float32 as
    transformers does. x: (batch, seq, 2, heads, head_dim), q and k together; cos, sin: (seq, head_dim / 2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    cos, sin = cos[:, None, None, :], sin[:, None, None, :]  # (seq, 1, 1, head_dim / 2)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


# ---- the network ------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head attention with rotary q and k; query, key and value from one product (Wqkv, whose rows are every
    head's query, then every head's key, then every head's value).

    A pruned layer keeps only its remaining heads (`kept_heads`, original numbering): their rows in each third of
    Wqkv and their columns of Wo, so its matrices are (3 * kept * head_dim, hidden) and (hidden, kept * head_dim).
    A head mask xi (Michel et al. 2019, sec. 2.1: MHAtt(x) = sum_h xi_h Att_h(x)) multiplies each head's output
    before Wo."""

    def __init__(self, config: ModernBertConfig, layer: int = 0) -> None:
        super().__init__()
        h = config.hidden_size
        self.kept_heads = config.kept_heads(layer)
        self.num_heads = len(self.kept_heads)
        self.head_dim = config.head_dim
        inner = self.num_heads * self.head_dim
        self.Wqkv = nn.Linear(h, 3 * inner, bias=config.attention_bias)
        self.Wo = nn.Linear(inner, h, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        self.out_drop = nn.Dropout(config.attention_dropout)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        output_attentions: bool,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`: then Wqkv and Wo read real tokens only, and
        # q, k, v are re-padded (zeros, which the mask hides) for the rotation and the attention; rotary: (seq, hd / 2).
        # mask: bool, True where query i may read key j: (batch, 1, 1, seq) or (batch, 1, seq, seq)
        # head_mask: (num_attention_heads,) in the original numbering; entries of pruned heads are not read.
        qkv = self.Wqkv(x)  # (batch, seq, 3 * kept dims) or (tokens, 3 * kept dims)
        if unpadding is not None:
            qkv = unpadding.pad(qkv)  # (batch, seq, 3 * kept dims)
        b, t, _ = qkv.shape
        qkv = qkv.view(b, t, 3, self.num_heads, self.head_dim)  # (batch, seq, 3, heads, head_dim)
        # q and k rotated in one pass, in the (seq, heads) layout the product wrote (faster than per tensor after
        # the transpose: measured 1.35x for rotation + attention at 32 x 40 tokens, 12 heads of 64)
        q, k = rotate(qkv[:, :, :2], *rotary).permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, heads, seq, head_dim)
        v = qkv[:, :, 2].transpose(1, 2)  # (batch, heads, seq, head_dim)
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5  # (batch, heads, seq, seq)
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ v
        else:
            probs = None
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        context = merge_heads(context, unpadding, head_mask, self.kept_heads)  # (batch, seq | tokens, kept dims)
        return self.out_drop(self.Wo(context)), probs

    def prune(self, heads: Iterable[int]) -> None:
        """Remove `heads` (original numbering; ones already removed are ignored): their rows in each of Wqkv's
        three thirds (query, key, value) and their columns of Wo, so the layer computes less, not just zeros.
        Rotary positions turn each head_dim pair alike in every head: nothing there to prune."""
        inner = self.num_heads * self.head_dim  # the width of one third now
        keep, rows = remaining(self.kept_heads, heads, self.head_dim)  # rows within one third
        self.Wqkv = linear_subset(self.Wqkv, torch.cat([rows, rows + inner, rows + 2 * inner]), dim=0)
        self.Wo = linear_subset(self.Wo, rows, dim=1)
        self.kept_heads, self.num_heads = keep, len(keep)


class GeGLU(nn.Module):
    """W_o (act(x W_i^a) * x W_i^g): Wi holds [W_i^a; W_i^g] (2 x intermediate rows)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.activation = ACTIVATIONS[config.hidden_activation]
        self.drop = nn.Dropout(config.mlp_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, gate = self.Wi(x).chunk(2, dim=-1)  # (batch, seq, intermediate) each
        return self.Wo(self.drop(self.activation(a) * gate))


class EncoderLayer(nn.Module):
    """Pre-norm block: x = x + Attn(LN(x)); x = x + GeGLU(LN(x)). The first layer has no attention LayerNorm."""

    def __init__(self, config: ModernBertConfig, layer: int) -> None:
        super().__init__()
        h = config.hidden_size
        self.local = config.layer_types[layer] == LOCAL
        self.attn_norm = nn.LayerNorm(h, eps=config.norm_eps, bias=config.norm_bias) if layer > 0 else None
        self.attn = Attention(config, layer)
        self.mlp_norm = nn.LayerNorm(h, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = GeGLU(config)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) when the batch runs packed
        a, probs = self.attn(
            self.attn_norm(x) if self.attn_norm is not None else x,
            rotary,
            mask,
            output_attentions,
            head_mask,
            unpadding,
        )
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), probs


class ModernBertModel(Encoder):
    """The encoder. `forward` takes transformers' ModernBertModel arguments and returns the same fields."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embeddings = nn.Module()
        self.embeddings.tok_embeddings = nn.Embedding(config.vocab_size, h, padding_idx=config.pad_token_id)
        self.embeddings.norm = nn.LayerNorm(h, eps=config.norm_eps, bias=config.norm_bias)
        self.embedding_dropout = nn.Dropout(config.embedding_dropout)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(h, eps=config.norm_eps, bias=config.norm_bias)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # transformers: truncated normal at +-2 std; output projections std / sqrt(2 L)
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # ---- the encoder interface (models/encoder.py) ----
    # max_tokens: max_position_embeddings, 8,192 for the published models (rotary positions need no table).
    embedding_table = "embeddings.tok_embeddings"
    family = MODEL_TYPE
    reads_segments = False  # no segment embeddings
    prepack_for_inference = True  # the featurizer times whether pre-packed linear layers pay on this CPU

    can_prune_heads = True  # Encoder.prune_heads over attention_modules(); forward takes head_mask
    attention_name = "attn"  # each layer's attention: what attention_modules() lists
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = ("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo")

    def layer_of(self, name: str) -> int:
        """embeddings.* 0; layers.i.* i + 1; final_norm.* num_layers."""
        parts = name.split(".")
        if parts[0] == "embeddings":
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        if parts[0] == "final_norm":
            return self.num_layers
        raise self.unknown_parameter(name)

    can_distill = True

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> ModernBertModel:
        """A student ModernBERT whose layer j is this model's layers[j] with its kind of attention (global / local);
        of this width, embeddings, layers and final norm copied (pruned heads follow their layers); narrower, fresh
        (the global torch RNG) with every head. The first student layer must be layer 0: ModernBERT's first layer
        has no attention LayerNorm, the others have one."""
        layers = check_student_layers(layers, self.num_layers)
        if layers[0] != 0:
            raise ValueError(
                f"a ModernBERT student starts at the teacher's layer 0, not {layers[0]} (only the first layer works "
                "without an attention LayerNorm); name layer 0 first"
            )
        h, inner = student_widths(
            self.hidden_size, self.num_heads, self.config.intermediate_size, hidden_size, intermediate_size
        )
        config = copy.deepcopy(self.config)
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = len(layers), h, inner
        config.layer_types = [self.config.layer_types[i] for i in layers]
        config.pruned_heads = self.config.pruned_heads_of(layers) if h == self.hidden_size else {}
        config.__post_init__()
        student = ModernBertModel(config)
        if h == self.hidden_size:
            student.embeddings.load_state_dict(self.embeddings.state_dict())
            student.final_norm.load_state_dict(self.final_norm.state_dict())
            for j, i in enumerate(layers):
                student.layers[j].load_state_dict(self.layers[i].state_dict())
        return student.train(self.training)

    def attention_masks(self, attention_mask: torch.Tensor | None, t: int, device: torch.device) -> dict:
        """Boolean masks (True: may attend) for each layer type: global (batch, 1, 1, seq) keys at real tokens,
        None without padding; local (batch or 1, 1, seq, seq) also |i - j| <= local_attention // 2. A query whose
        window holds only padding keeps its own position, so that no row is empty (an empty row would give NaN at
        padding, which later layers would read as 0 * NaN). The window is built whatever the length, so that an
        exported graph traced on a short example keeps it for long inputs."""
        keys = key_mask_of(attention_mask)  # (batch, 1, 1, seq), or None without padding
        pos = torch.arange(t, device=device)
        band = (pos[:, None] - pos[None, :]).abs() <= self.config.local_attention // 2  # (seq, seq)
        local = band[None, None] if keys is None else (band & keys) | (pos[:, None] == pos[None, :])
        return {GLOBAL: keys, LOCAL: local}

    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

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
        """input_ids, attention_mask: (batch, seq); token_type_ids are not read (there are no segments).
        `num_layers` stops after that many layers (the final norm only after the last one); head_mask:
        (num_layers, num_heads) or (num_heads,) mask variables xi (1 keeps a head, 0 silences it), in the
        original head numbering even after pruning.

        A batch with much padding (`unpadding`) runs packed, as transformers' unpadded ModernBERT does: the
        per-token layers read real tokens only and attention re-pads around itself; its hidden states are those
        of the padded run at real tokens and 0 at padding.
        """
        b, t = input_ids.shape
        check_length(t, self.max_tokens)
        if head_mask is not None:
            head_mask = check_head_mask(head_mask, self.num_layers, self.num_heads)  # (layers, heads)
        masks = self.attention_masks(attention_mask, t, input_ids.device)
        d = self.config.head_dim
        rotary = {
            GLOBAL: rotary_tables(t, d, self.config.global_rope_theta, input_ids.device),
            LOCAL: rotary_tables(t, d, self.config.local_rope_theta, input_ids.device),
        }
        unpadding = self.unpadding(attention_mask, padded)
        ids = input_ids
        if unpadding is not None:
            ids = unpadding.select(input_ids)  # (tokens,)
        # (batch, seq, hidden), or (tokens, hidden) packed
        x = self.embedding_dropout(self.embeddings.norm(self.embeddings.tok_embeddings(ids)))
        hidden_states, attentions = [x], []
        stop = num_layers if num_layers is not None else self.num_layers
        for i, layer in enumerate(self.layers[:stop]):
            kind = LOCAL if layer.local else GLOBAL
            xi = head_mask[i] if head_mask is not None else None
            x, probs = layer(x, rotary[kind], masks[kind], output_attentions, xi, unpadding)
            if i == self.num_layers - 1:
                x = self.final_norm(x)
            hidden_states.append(x)
            attentions.append(probs)
        return EncoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------

    config_class = ModernBertConfig
    checkpoint = folders.CheckpointLayout(
        (MODEL_TYPE,),
        prefix="model.",  # ModernBertForMaskedLM etc.: the encoder under "model.", MLM / task heads not loaded
        prefix_marker="model.layers.",
        head_prefixes=("head.", "decoder.", "classifier.", "drop."),
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)


def hf_parameter_names(config: ModernBertConfig) -> dict[str, str]:
    """transformers' name -> ctxrep's name, for every weight of the encoder (the same names: nothing is renamed,
    but the list is explicit about which biases exist)."""
    norm = ("weight", "bias") if config.norm_bias else ("weight",)
    attn = ("weight", "bias") if config.attention_bias else ("weight",)
    mlp = ("weight", "bias") if config.mlp_bias else ("weight",)
    names = {"embeddings.tok_embeddings.weight": "embeddings.tok_embeddings.weight"}
    names |= {f"embeddings.norm.{p}": f"embeddings.norm.{p}" for p in norm}
    for i in range(config.num_hidden_layers):
        layer = {f"attn.{m}.{p}" for m in ("Wqkv", "Wo") for p in attn}
        layer |= {f"mlp.{m}.{p}" for m in ("Wi", "Wo") for p in mlp}
        layer |= {f"mlp_norm.{p}" for p in norm}
        if i > 0:
            layer |= {f"attn_norm.{p}" for p in norm}
        names |= {f"layers.{i}.{n}": f"layers.{i}.{n}" for n in sorted(layer)}
    names |= {f"final_norm.{p}": f"final_norm.{p}" for p in norm}
    return names
