"""GPT-2: a decoder-only, pre-LayerNorm Transformer language model.

Radford et al. 2018 (GPT: a Transformer decoder trained as a left-to-right LM, eq. 1:
L = sum_i log P(u_i | u_{i-k}, ..., u_{i-1})), Radford et al. 2019 (GPT-2: LayerNorm moved to the input
of each sub-block, one more LayerNorm after the last block, residual projections initialised with
std / sqrt(2 * n_layer)). Attention is Vaswani et al. 2017, eq. 1: softmax(QK^T / sqrt(d_k) + M) V,
with M = -inf above the diagonal (causal) and on padding keys.

Reads top to bottom: config, attention, MLP, block, model, LM head with generation, then the loader
and saver for the Hugging Face folder format (config.json + model.safetensors / pytorch_model.bin).

The key/value cache is a plain list with one (key, value) pair per layer, each (batch, heads, past, head_dim):
`forward(..., use_cache=True)` returns it in `past_key_values`; pass it back with the next tokens only.

Padding: a batch whose padding is at least `unpad_from` of its (batch, seq) grid, and no cache, runs unpadded
(modules/unpadding.py): embeddings, c_attn / c_proj, LayerNorms and MLPs on the (tokens, hidden) rows of real
tokens; positions and the causal mask stay those of the padded grid, and q, k, v are re-padded only around the
attention product. The same hidden states at real tokens (0 at padding, so logits 0 there).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, check_student_layers, student_widths
from ctxrep.models.folders import CheckpointError
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import ACTIVATIONS, check_activation
from ctxrep.modules.heads import merge_heads, split_heads
from ctxrep.modules.init_weights import normal_init
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

# One (key, value) pair per layer, each (batch, heads, past_len, head_dim).
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class GPT2Config:
    """Everything needed to rebuild the network; field names are those of transformers' config.json."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # None means 4 * n_embd
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    bos_token_id: int | None = 50256
    eos_token_id: int | list[int] | None = 50256
    pad_token_id: int | None = None
    scale_attn_weights: bool = True  # divide QK^T by sqrt(head_dim)
    scale_attn_by_inverse_layer_idx: bool = False  # and further by layer_idx + 1 (Mistral's GPT-2 runs)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        check_activation("activation_function", self.activation_function)
        if self.n_inner is None:
            self.n_inner = 4 * self.n_embd

    @classmethod
    def from_hf_dict(cls, d: dict) -> GPT2Config:
        if d.get("add_cross_attention"):
            raise CheckpointError(
                "add_cross_attention=true is not supported: ctxrep's GPT-2 is a decoder-only language model "
                "without cross-attention to an encoder"
            )
        names = {f.name for f in fields(cls)}
        # Keys we do not model (summary_* of GPT2DoubleHeadsModel, use_cache, n_ctx of old configs,
        # reorder_and_upcast_attn which only changes mixed-precision numerics) are dropped.
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_hf_dict(self, architecture: str = "GPT2LMHeadModel") -> dict:
        return asdict(self) | {"model_type": "gpt2", "architectures": [architecture], "tie_word_embeddings": True}

    def student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> GPT2Config:
        """A distillation student's config: len(layers) blocks; narrower (n_embd, n_inner) when hidden_size is."""
        h, inner = student_widths(self.n_embd, self.n_head, self.n_inner, hidden_size, intermediate_size)
        return replace(self, n_layer=len(layers), n_embd=h, n_inner=inner)


class CausalSelfAttention(nn.Module):
    """Multi-head attention where position i sees keys 0..i (and the cached past), eq. 1 of Vaswani et al."""

    def __init__(self, config: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        h = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = h // config.n_head
        self.c_attn = nn.Linear(h, 3 * h)  # q, k, v in one projection
        self.c_proj = nn.Linear(h, h)
        self.attn_dropout_p = config.attn_pdrop
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        self.scale = 1.0 / math.sqrt(self.head_dim) if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= layer_idx + 1

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`: then c_attn and c_proj read real tokens only
        # and q, k, v are re-padded (zeros, which the mask hides) for the attention product.
        # mask: (batch or 1, 1, seq, past + seq) bool, True where attending is allowed.
        h = x.shape[-1]
        qkv = self.c_attn(x)  # (batch, seq | tokens, 3 * hidden)
        if unpadding is not None:
            qkv = unpadding.pad(qkv)  # (batch, seq, 3 * hidden)
        q, k, v = (split_heads(y, self.num_heads, self.head_dim) for y in qkv.split(h, dim=2))  # (b, heads, seq, d)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (batch, heads, past + seq, head_dim)
            v = torch.cat([past[1], v], dim=2)  # (batch, heads, past + seq, head_dim)
        dropout_p = self.attn_dropout_p if self.training else 0.0
        if output_attentions:
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (batch, heads, seq, past + seq)
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            y = F.dropout(probs, dropout_p, self.training) @ v  # (batch, heads, seq, head_dim)
        else:
            probs = None
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)
        y = merge_heads(y, unpadding)  # (batch, seq | tokens, hidden)
        return self.resid_dropout(self.c_proj(y)), (k, v), probs


class MLP(nn.Module):
    """Position-wise feed-forward: c_proj(act(c_fc(x)))."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner)
        self.c_proj = nn.Linear(config.n_inner, config.n_embd)
        self.act = ACTIVATIONS[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN block (Radford et al. 2019, sec. 2.3): x = x + Attn(LN(x)); x = x + MLP(LN(x))."""

    def __init__(self, config: GPT2Config, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        # x: (batch, seq, hidden), or (tokens, hidden) with `unpadding`
        a, present, probs = self.attn(self.ln_1(x), mask, past, output_attentions, unpadding)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, present, probs


@dataclass
class DecoderOutput(EncoderOutput):
    """EncoderOutput plus the key/value cache (one (k, v) per layer) when `use_cache=True`."""

    past_key_values: KVCache | None = None


@dataclass
class CausalLMOutput:
    """`logits`: (batch, seq, vocab); `loss`: mean next-token cross-entropy when labels were given."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    past_key_values: KVCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# transformers' Conv1D layers store their weight as (in, out): these are transposed on load and save.
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers of older checkpoints that are not weights: attn.bias is the precomputed causal (lower-triangular)
# mask and attn.masked_bias the -1e4 fill value; ctxrep builds its mask on the fly, so both are skipped.
_BUFFERS = ("bias", "masked_bias")


class GPT2Model(Encoder):
    """The decoder stack. `forward` follows transformers' GPT2Model: same arguments, same hidden states."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        normal_init(module, std)
        if isinstance(module, (CausalSelfAttention, MLP)):
            # Radford et al. 2019, sec. 2.3: scale residual-path weights by 1/sqrt(N), N = 2 residuals per block.
            nn.init.normal_(module.c_proj.weight, std=std / math.sqrt(2 * self.config.n_layer))

    # ---- the encoder interface (models/encoder.py) ----
    config_fields = {
        "num_layers": "n_layer",
        "num_heads": "n_head",
        "hidden_size": "n_embd",
        "max_tokens": "n_positions",
    }
    embedding_table = "wte"
    family = "gpt2"
    blocks_name = "h"  # Encoder.blocks
    # the attention and MLP projections LoRA adapts by default (Encoder.adapter_targets, models/adapters.py)
    adapter_targets = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    reads_segments = False  # GPT-2 would look token_type_ids up in its *token* embeddings
    is_decoder = causal = True  # a decoder: each token reads only the tokens before it
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a batch with this share of padding runs unpadded

    def layer_of(self, name: str) -> int:
        """wte, wpe 0; h.i.* i + 1; ln_f.* (the LayerNorm after the last block) num_layers."""
        parts = name.split(".")
        if parts[0] in ("wte", "wpe"):
            return 0
        if parts[0] == "h" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        if parts[0] == "ln_f":
            return self.num_layers
        raise self.unknown_parameter(name)

    can_distill = True

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> GPT2Model:
        """A student GPT2Model (GPT2Config.student): of this width, wte, wpe, blocks layers[j] as block j and ln_f
        copied; narrower, freshly initialised (the global torch RNG)."""
        layers = check_student_layers(layers, self.num_layers)
        student = GPT2Model(self.config.student(layers, hidden_size, intermediate_size))
        if student.config.n_embd == self.config.n_embd:
            for name in ("wte", "wpe", "ln_f"):
                getattr(student, name).load_state_dict(getattr(self, name).state_dict())
            for j, i in enumerate(layers):
                student.h[j].load_state_dict(self.h[i].state_dict())
        return student.train(self.training)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> DecoderOutput:
        """input_ids: (batch, seq), only the new tokens when `past_key_values` is given.

        attention_mask: (batch, past + seq), 1 for real tokens, 0 for padding (pad on the right: positions
        count from 0 regardless of the mask, as in transformers). token_type_ids, as in transformers, are
        looked up in the token embedding table and added; leave them None for plain GPT-2.
        hidden_states[0] is the embedding output, hidden_states[i] block i's output, except that the last
        one is after the final LayerNorm (like transformers). `num_layers` stops after that many blocks
        and then skips the final LayerNorm, so hidden_states stays a prefix of the full run's.

        A batch with much padding (`Encoder.unpadding`) and no cache runs unpadded: the same hidden states at real
        tokens, 0 at padding (and zeros at padding in the returned key/value cache, which the mask hides).
        """
        b, t = input_ids.shape
        past_len = past_key_values[0][0].shape[2] if past_key_values is not None else 0
        if past_key_values is not None and len(past_key_values) != self.config.n_layer:
            raise ValueError(
                f"past_key_values has {len(past_key_values)} layers but the model has {self.config.n_layer}; "
                "pass back the past_key_values of the previous call unchanged"
            )
        if past_len + t > self.config.n_positions:
            raise ValueError(
                f"sequence of {past_len + t} tokens ({past_len} cached + {t} new) is longer than the model's "
                f"{self.config.n_positions} positions; shorten the input or split it into windows"
            )
        if attention_mask is not None and attention_mask.shape != (b, past_len + t):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected (batch, cached + new tokens) = "
                f"{(b, past_len + t)}"
            )
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + t, device=input_ids.device)[None, :]  # (1, seq)

        # mask[i, j]: query i (absolute position past_len + i) may attend key j.
        q_pos = torch.arange(past_len, past_len + t, device=input_ids.device)[:, None]  # (seq, 1)
        k_pos = torch.arange(past_len + t, device=input_ids.device)[None, :]  # (1, past + seq)
        mask = (k_pos <= q_pos)[None, None]  # (1, 1, seq, past + seq)
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, :]  # (batch, 1, seq, past + seq)

        # A cache's mask covers past + seq: only a call without one runs unpadded.
        unpadding = self.unpadding(attention_mask, padded) if past_key_values is None else None
        if unpadding is not None:  # each (tokens,); positions as the padded grid numbers them
            input_ids, position_ids = unpadding.select(input_ids), unpadding.select(position_ids.expand(b, t))
            if token_type_ids is not None:
                token_type_ids = unpadding.select(token_type_ids)
        x = self.wte(input_ids) + self.wpe(position_ids)  # (batch, seq, hidden) or (tokens, hidden)
        if token_type_ids is not None:
            x = x + self.wte(token_type_ids)
        x = self.drop(x)

        stop = num_layers if num_layers is not None else self.config.n_layer
        hidden_states, attentions, presents = [x], [], []
        for i, block in enumerate(self.h[:stop]):
            past = past_key_values[i] if past_key_values else None
            x, present, probs = block(x, mask, past, output_attentions, unpadding)
            hidden_states.append(x)
            attentions.append(probs)
            presents.append(present)
        if stop == self.config.n_layer:
            hidden_states[-1] = self.ln_f(x)
        out = DecoderOutput.of_layers(hidden_states, attentions, output_hidden_states, output_attentions, unpadding)
        out.past_key_values = presents if use_cache else None
        return out

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------
    # A GPT2Model folder, or a GPT2LMHeadModel one (the decoder under 'transformer.'; its tied LM head is not part of
    # the decoder and is not loaded).

    config_class = GPT2Config
    checkpoint = folders.CheckpointLayout(
        ("gpt2",),
        what="a GPT-2 model",
        prefix="transformer.",
        head_prefixes=("lm_head.",),
        head_noun="LM-head weights (the decoder has no LM head)",
        transposed=TRANSPOSED,  # transformers' Conv1D keeps its weight as (in, out); nn.Linear wants (out, in)
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def checkpoint_layout(self) -> folders.CheckpointLayout:
        """Older checkpoints carry each block's causal-mask buffers (_BUFFERS), which are not weights."""
        buffers = frozenset(f"h.{i}.attn.{b}" for i in range(self.config.n_layer) for b in _BUFFERS)
        return replace(self.checkpoint, buffers=buffers)

    def hf_config(self) -> dict:
        return self.config.to_hf_dict("GPT2Model")


class GPT2LMHeadModel(nn.Module):
    """GPT2Model plus a language-model head whose weight is the token embedding matrix (tied)."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one Parameter, two names

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> CausalLMOutput:
        """labels: (batch, seq), usually input_ids with -100 at padding; shifted inside (token i predicts label
        i + 1), -100 is ignored. (A batch with much padding runs unpadded, its logits 0 at padding: give padding
        the label -100.) Radford et al. 2018, eq. 1: loss = -mean_i log P(u_{i+1} | u_1..u_i)."""
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        logits = self.lm_head(out.last_hidden_state)  # (batch, seq, vocab)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(input_ids.shape)}")
            shifted = logits[:, :-1].float()  # (batch, seq - 1, vocab)
            loss = F.cross_entropy(
                shifted.reshape(-1, shifted.shape[-1]),  # (batch * (seq - 1), vocab)
                labels[:, 1:].reshape(-1),  # (batch * (seq - 1),)
                ignore_index=-100,
            )
        return CausalLMOutput(
            logits=logits,
            loss=loss,
            past_key_values=out.past_key_values,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue each prompt by up to `max_new_tokens` tokens; returns (batch, prompt + new).

        All prompts in a batch must have the same length (no padding). Greedy unless `do_sample`;
        sampling divides the logits by `temperature`, keeps the `top_k` best tokens, then the smallest
        set whose probability reaches `top_p` (Holtzman et al. 2020). A row that produced an
        `eos_token_id` is filled with it (the first one given) until every row has finished.
        Call `model.eval()` first: dropout stays active in training mode.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids must be (batch, prompt_len) with prompt_len >= 1, got {tuple(input_ids.shape)}"
            )
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if input_ids.shape[1] + max_new_tokens > self.config.n_positions:
            raise ValueError(
                f"prompt of {input_ids.shape[1]} tokens + {max_new_tokens} new tokens exceeds the model's "
                f"{self.config.n_positions} positions; lower max_new_tokens or shorten the prompt"
            )
        if do_sample:
            if temperature <= 0:
                raise ValueError(
                    f"temperature must be > 0 when sampling, got {temperature}; use do_sample=False for greedy"
                )
            if top_k is not None and top_k < 1:
                raise ValueError(f"top_k must be >= 1, got {top_k}")
            if top_p is not None and not 0 < top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        eos = None
        if eos_token_id is not None:
            eos = torch.tensor(
                [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=input_ids.device
            )
        tokens = input_ids
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        past, step_input = None, input_ids
        for _ in range(max_new_tokens):
            out = self(step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()  # (batch, vocab)
            if do_sample:
                logits = filter_logits(logits / temperature, top_k, top_p)
                next_token = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]  # (batch,)
            else:
                next_token = logits.argmax(dim=-1)  # (batch,)
            if eos is not None:
                next_token = torch.where(finished, eos[0], next_token)
                finished = finished | torch.isin(next_token, eos)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (batch, len + 1)
            step_input = next_token[:, None]  # (batch, 1): the cache holds everything before it
            if bool(finished.all()):
                break
        return tokens

    # ---- Hugging Face folder format -------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path) -> GPT2LMHeadModel:
        """Load a GPT2LMHeadModel or GPT2Model folder; the head is the token embedding matrix."""
        path = Path(path)
        config, state = _read_checkpoint(path)
        head = state.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, state.get("wte.weight", head)):
            raise CheckpointError(
                f"{path}: lm_head.weight differs from the token embeddings wte.weight; ctxrep's GPT-2 ties the "
                "two (tie_word_embeddings=true) and cannot load an untied head"
            )
        model = cls(config)
        model.transformer.load_hf_state_dict(state, source=str(path))
        model.eval()
        return model

    def save_pretrained(self, path: str | Path) -> None:
        """Write config.json + model.safetensors that transformers' GPT2LMHeadModel / AutoModelForCausalLM
        load; lm_head.weight is left out, as transformers does for a tied head."""
        tensors = {"transformer." + k: v for k, v in self.transformer.hf_state_dict().items()}
        folders.write_folder(path, self.config.to_hf_dict("GPT2LMHeadModel"), tensors)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top_k best and outside the nucleus of probability top_p.

    logits: (batch, vocab). The nucleus is the smallest set of best tokens whose probabilities sum to
    at least top_p; the best token is always kept.
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (batch, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (batch, vocab)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability mass of the better tokens
        drop_sorted = before >= top_p  # the best token has before == 0 and always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def hf_parameter_names(config: GPT2Config) -> dict[str, str]:
    """transformers' GPT2Model name -> ctxrep's name, for every weight of the decoder (the same names)."""
    names = {n: n for n in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias")}
    per_layer = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    for i in range(config.n_layer):
        for m in per_layer:
            for p in ("weight", "bias"):
                names[f"h.{i}.{m}.{p}"] = f"h.{i}.{m}.{p}"
    return names


def _read_checkpoint(path: Path) -> tuple[GPT2Config, dict[str, torch.Tensor]]:
    """config.json and the weights, with GPT2LMHeadModel's 'transformer.' prefix removed."""
    hf_config = folders.read_config(path, ("gpt2",))
    config = GPT2Config.from_hf_dict(hf_config)
    state = folders.read_state_dict(path)
    # GPT2LMHeadModel stores the decoder under 'transformer.'; GPT2Model stores it without a prefix.
    prefix = "transformer."
    return config, {k.removeprefix(prefix): v for k, v in state.items()}
