"""The Transformer encoder-decoder for machine translation, in Marian's layout (the OPUS-MT checkpoints).

Vaswani et al. 2017, "Attention Is All You Need":
  eq. 1   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
  sec 3.2 MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
  eq. 2   FFN(x) = max(0, x W_1 + b_1) W_2 + b_2            (ReLU in the paper; Marian's OPUS-MT models use swish)
  sec 5.4 each sub-layer's output is LayerNorm(x + Sublayer(x))   (post-LN; `normalize_before` gives the
          pre-LN variant x + Sublayer(LayerNorm(x)) with a final LayerNorm after each stack, as in fairseq)
  sec 3.4 token embeddings are multiplied by sqrt(d_model) (`scale_embedding`), and one embedding matrix is
          shared by the encoder input, the decoder input and the pre-softmax projection
  sec 3.5 sinusoidal positions (see `sinusoidal_positions` for Marian's layout of them)
The decoder's self-attention is causal (position i sees 0..i); its encoder-decoder attention takes queries from
the decoder and keys/values from the encoder output.

Reads top to bottom: config, positions, the model (its embeddings; the layers, the stacks, the decoder's key/value
cache, forward with the loss are the encoder-decoder's shared parts in models/seq2seq.py, which BART reads too:
transformers' Marian is "Copied from" BART), then the loader and saver for Hugging Face's Marian
folder format (config.json with model_type "marian" + model.safetensors / pytorch_model.bin), which
transformers' MarianMTModel loads. A pre-LN model cannot be written in that format (transformers has no
pre-LN Marian and would silently run it post-LN); it is saved with model_type "ctxrep_mt" instead: the same
weight names plus model.encoder.layer_norm / model.decoder.layer_norm.

Padding: a source batch whose padding is at least `unpad_from` of its (batch, src) grid runs the encoder unpadded
(modules/unpadding.py): embeddings, query / key / value, the output projections, norms and feed-forwards on the
(tokens, d_model) rows of real tokens, re-padded only around the attention product; the same hidden states at real
tokens (0 at padding). The decoder's cross-attention keys / values are projected from those rows too and padded
back with zeros (the source mask hides them); the decoder itself, and its cache, run as before.

Incremental decoding (fairseq's FairseqIncrementalDecoder idea): `init_cache(memory, source_mask)` computes every
decoder layer's cross-attention keys/values once per source sentence; `decode(tokens, cache)` runs only the new
target tokens and appends their self-attention keys/values; `cache.reorder(beam_indices)` and
`cache.keep(sentences)` are the two operations beam search needs.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from ctxrep.models import folders
from ctxrep.models.folders import CheckpointError

# The decoder's cache, its outputs and the training loss were defined here before models/seq2seq.py: their names stay.
from ctxrep.models.seq2seq import (  # noqa: F401
    DECODER_LAYER_MODULES,
    ENCODER_LAYER_MODULES,
    IGNORE_INDEX,
    DecoderCache,
    DecoderLayer,
    DecoderOutput,
    EncoderLayer,
    Seq2SeqOutput,
    TransformerEncoderDecoder,
    projected_smoothed_loss,
)
from ctxrep.modules.activations import check_activation
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

MARIAN = "marian"  # transformers' model_type: post-LN only
OWN_FORMAT = "ctxrep_mt"  # ctxrep's own model_type: the same weights, pre-LN allowed
MODEL_TYPES = (MARIAN, OWN_FORMAT)


@dataclass
class MarianConfig:
    """Everything needed to rebuild the network; field names are those of transformers' MarianConfig.

    The defaults are the paper's base model (sec. 6.1) with Marian's conventions: the pad token starts every
    target (decoder_start_token_id = pad_token_id), </s> ends it, one shared vocabulary.
    """

    vocab_size: int = 8000
    decoder_vocab_size: int | None = None  # None: vocab_size (shared vocabulary)
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_position_embeddings: int = 512
    scale_embedding: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int | None = None  # None: pad_token_id, as Marian does
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    normalize_before: bool = False  # ctxrep's pre-LN option: saved in ctxrep's own format only

    def __post_init__(self) -> None:
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.pad_token_id
        for width, heads, side in (
            (self.d_model, self.encoder_attention_heads, "encoder"),
            (self.d_model, self.decoder_attention_heads, "decoder"),
        ):
            if width % heads:
                raise ValueError(f"d_model {width} is not a multiple of {side}_attention_heads {heads}")
        check_activation("activation_function", self.activation_function)
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"decoder_vocab_size {self.decoder_vocab_size} differs from vocab_size {self.vocab_size} but "
                "share_encoder_decoder_embeddings is true; a shared embedding has one vocabulary"
            )

    @classmethod
    def from_hf_dict(cls, d: dict) -> MarianConfig:
        """From a config.json dict. Options of older Marian configs that change the network are refused."""
        if d.get("model_type") == MARIAN:
            # Older transformers wrote these BART-era switches into OPUS-MT configs; the Marian network has them
            # at the values on the right, and transformers ignores the keys today, so another value means a model
            # that neither transformers nor ctxrep runs as it was trained.
            for key, value in (
                ("normalize_before", False),
                ("normalize_embedding", False),
                ("add_final_layer_norm", False),
                ("static_position_embeddings", True),
                ("add_bias_logits", False),
            ):
                if key in d and d[key] != value:
                    raise CheckpointError(
                        f"config.json has {key}={d[key]!r}, which a Marian model does not support (only {value!r}); "
                        "this checkpoint is not a Marian model that transformers or ctxrep can run"
                    )
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        return cls(**kwargs)

    def to_hf_dict(self) -> dict:
        """transformers' MarianConfig keys (normalize_before only in ctxrep's own format)."""
        d = asdict(self)
        del d["normalize_before"]
        d |= {
            "model_type": MARIAN,
            "architectures": ["MarianMTModel"],
            "is_encoder_decoder": True,
            "forced_eos_token_id": self.eos_token_id,
            "bos_token_id": None,
            "encoder_layerdrop": 0.0,
            "decoder_layerdrop": 0.0,
        }
        return d


# ---- positions --------------------------------------------------------------------------------------------------


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) sinusoidal table laid out as Marian (and transformers' Marian) lays it out.

    The paper (sec. 3.5) interleaves:  PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
    Marian puts all the sines first and all the cosines second:  PE(pos, i) = sin(pos / 10000^(2i/d)) and
    PE(pos, ceil(d/2) + i) = cos(pos / 10000^(2i/d)). Same frequencies, another column order: a checkpoint trained
    with one layout does not work with the other. Computed in float64 and rounded once, as transformers does.
    """
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (positions, 1)
    j = torch.arange(dim, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)  # (positions, dim)
    return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1).float()


class MarianMTModel(TransformerEncoderDecoder):
    """The encoder-decoder. `forward` follows transformers' MarianMTModel (same arguments, same logits); as an
    `Encoder` (models/encoder.py) it is its encoder stack: `encode(batch)` returns the source's hidden states (its
    decoder reads the target language, not the text given: no teacher-forced layers)."""

    family = "marian"
    word_level = False
    teacher_forced_layers = False
    reads_template = False  # translate/tokenizer.py: ids then </s>
    unpad_from = UNPAD_FROM  # Encoder.unpadding: a source batch with this share of padding runs unpadded

    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.shared = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        # Separate target embeddings only in models with two vocabularies (some OPUS-MT "tc" models).
        self.decoder_embed_tokens = (
            None
            if config.share_encoder_decoder_embeddings
            else nn.Embedding(config.decoder_vocab_size, d, padding_idx=config.pad_token_id)
        )
        # The pre-softmax projection is the target embedding matrix (sec. 3.4) unless tie_word_embeddings is off.
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(d, config.decoder_vocab_size, bias=False)
        # A constant bias on the logits (a buffer in transformers too: OPUS-MT models carry it, zeros here).
        self.register_buffer("final_logits_bias", torch.zeros(1, config.decoder_vocab_size))
        self.register_buffer("positions", sinusoidal_positions(config.max_position_embeddings, d), persistent=False)
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        if config.normalize_before:  # pre-LN: the stacks' outputs are not normalised by their last layer
            self.encoder.layer_norm = nn.LayerNorm(d)
            self.decoder.layer_norm = nn.LayerNorm(d)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """fairseq's Transformer initialisation: Xavier-uniform projections, zero biases, and embeddings
        N(0, d_model^-0.5) so that the sqrt(d_model)-scaled embeddings start at unit variance."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
            nn.init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    # ---- the encoder interface (models/encoder.py) ----
    config_fields = {
        "num_layers": "encoder_layers",
        "num_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "max_tokens": "max_position_embeddings",
    }
    embedding_table = "shared"

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def layer_of(self, name: str) -> int:
        """The encoder side's depths: the (shared) embeddings 0; encoder.layers.i.* i + 1; the encoder's final
        LayerNorm (pre-LN) num_layers; the decoder side (its layers, target embeddings, output projection), which
        encode never runs, num_layers: above the encoder's top layer."""
        parts = name.split(".")
        if parts[0] == "shared":
            return 0
        if parts[0] == "encoder" and len(parts) > 3 and parts[1] == "layers" and parts[2].isdigit():
            if int(parts[2]) < self.num_layers:
                return int(parts[2]) + 1
        elif parts[0] == "encoder" and parts[1:2] == ["layer_norm"]:
            return self.num_layers
        elif parts[0] in ("decoder", "decoder_embed_tokens", "lm_head"):
            return self.num_layers
        raise self.unknown_parameter(name)

    # ---- embeddings and the two stacks ----

    def target_embeddings(self) -> nn.Embedding:
        return self.shared if self.decoder_embed_tokens is None else self.decoder_embed_tokens

    def output_weight(self) -> torch.Tensor:
        """The pre-softmax projection (target vocab, d_model): the target embeddings when tied (sec. 3.4)."""
        return self.target_embeddings().weight if self.lm_head is None else self.lm_head.weight

    def output_bias(self) -> torch.Tensor:
        return self.final_logits_bias[0]

    @property
    def banned_ids(self) -> tuple[int, ...]:
        """The pad token (Marian's decoder start) is never generated: OPUS-MT's bad_words_ids=[[pad]]."""
        return (self.config.pad_token_id,)

    def embed_source(self, ids: torch.Tensor, unpadding: Unpadding | None) -> torch.Tensor:
        return self.embed(ids, self.shared, 0, unpadding)

    def embed_target(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.embed(ids, self.target_embeddings(), start)

    def embed(
        self, ids: torch.Tensor, table: nn.Embedding, start: int, unpadding: Unpadding | None = None
    ) -> torch.Tensor:
        """sqrt(d_model) * E[ids] + PE[start : start + len] (secs. 3.4, 3.5), then dropout (sec. 5.4).
        ids: (batch, seq) -> (batch, seq, d_model); with `unpadding`, the (tokens, d_model) rows of real tokens."""
        b, t = ids.shape
        if start + t > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {start + t} tokens is longer than the model's {self.config.max_position_embeddings} "
                "positions (max_position_embeddings); shorten or split the sentence"
            )
        positions = self.positions[start : start + t]  # (seq, d_model)
        if unpadding is not None:
            position_ids = torch.arange(t, device=ids.device).expand(b, t)  # (batch, seq), on the padded grid
            ids, positions = unpadding.select(ids), positions[unpadding.select(position_ids)]  # (tokens,), (tokens, d)
        return self.embed_dropout(table(ids) * self.embed_scale + positions)

    # ---- Hugging Face's Marian folder format ----------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path) -> MarianMTModel:
        """A folder with config.json (model_type "marian", or ctxrep's "ctxrep_mt") and model.safetensors or
        pytorch_model.bin, as transformers' MarianMTModel (or MarianModel) saves it."""
        path = Path(path)
        hf_config = folders.read_config(path, MODEL_TYPES)
        config = MarianConfig.from_hf_dict(hf_config)
        state = folders.read_state_dict(path)
        if not any(k.startswith("model.") for k in state):  # saved from MarianModel: no "model." prefix, no head
            state = {f"model.{k}": v for k, v in state.items()}
        model = cls(config)
        model.load_hf_state_dict(state, source=str(path))
        model.eval()
        return model

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Copy weights named as in transformers into this model; refuse anything missing, unknown or mis-shaped."""
        state = dict(state)
        # Older transformers also saved each tied copy of the shared embedding and the sinusoidal tables; they are
        # known names, accepted only when they hold what they should be a copy of.
        for hf, original in _redundant_names(self.config).items():
            if hf in state:
                copy = state.pop(hf)
                expected = self.positions if original is None else state.get(original)
                if expected is not None and (
                    copy.shape != expected.shape or not torch.allclose(copy.float(), expected.float(), atol=1e-5)
                ):
                    raise CheckpointError(
                        f"{source}: {hf} differs from {original or 'the sinusoidal position table'}, of which it should "
                        "be a copy; this checkpoint was not trained as a Marian model that ctxrep can run"
                    )
        if "final_logits_bias" not in state:  # transformers lets it be missing too: zeros
            state["final_logits_bias"] = torch.zeros_like(self.final_logits_bias)
        folders.load_named_weights(self, state, hf_parameter_names(self.config), source, "a Marian encoder-decoder")

    def save_pretrained(self, path: str | Path, format: str = "auto") -> Path:
        """Write config.json + model.safetensors + generation_config.json.

        format "marian": transformers' MarianMTModel.from_pretrained loads it (post-LN models only); "ctxrep":
        ctxrep's own model_type "ctxrep_mt" (any model); "auto": "marian" unless the model is pre-LN."""
        if format not in ("auto", "marian", "ctxrep"):
            raise ValueError(f"format must be 'auto', 'marian' or 'ctxrep', got {format!r}")
        pre_ln = self.config.normalize_before
        if format == "marian" and pre_ln:
            raise ValueError(
                "cannot save a pre-LayerNorm model (normalize_before=True) in Marian's format: transformers' "
                "MarianMTModel has no pre-LN variant and would run it post-LN; save with format='ctxrep'"
            )
        own = format == "ctxrep" or (format == "auto" and pre_ln)
        config = self.config.to_hf_dict()
        if own:
            config |= {"model_type": OWN_FORMAT, "architectures": ["ctxrep.MarianMTModel"], "normalize_before": pre_ln}
        path = folders.write_folder(path, config, folders.named_tensors(self, hf_parameter_names(self.config)))
        if not own:  # what transformers' generate() should do by default: Marian's conventions
            c = self.config
            generation = {
                "decoder_start_token_id": c.decoder_start_token_id,
                "eos_token_id": c.eos_token_id,
                "forced_eos_token_id": c.eos_token_id,
                "pad_token_id": c.pad_token_id,
                "bad_words_ids": [[c.pad_token_id]],
                "max_length": c.max_position_embeddings,
            }
            (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        return path


def _redundant_names(config: MarianConfig) -> dict[str, str | None]:
    """Checkpoint names that duplicate another checkpoint tensor (tied copies), or the sinusoidal table (None)."""
    out: dict[str, str | None] = {f"model.{side}.embed_positions.weight": None for side in ("encoder", "decoder")}
    if config.share_encoder_decoder_embeddings:
        out |= {f"model.{side}.embed_tokens.weight": "model.shared.weight" for side in ("encoder", "decoder")}
    if config.tie_word_embeddings:
        out["lm_head.weight"] = (
            "model.shared.weight" if config.share_encoder_decoder_embeddings else "model.decoder.embed_tokens.weight"
        )
    return out


def hf_parameter_names(config: MarianConfig) -> dict[str, str]:
    """transformers' MarianMTModel name -> ctxrep's name, for every weight this model saves and loads."""
    names = {"model.shared.weight": "shared.weight", "final_logits_bias": "final_logits_bias"}
    if not config.share_encoder_decoder_embeddings:
        # transformers keeps no model.shared then: the encoder's table is model.encoder.embed_tokens.
        names = {
            "model.encoder.embed_tokens.weight": "shared.weight",
            "model.decoder.embed_tokens.weight": "decoder_embed_tokens.weight",
            "final_logits_bias": "final_logits_bias",
        }
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for side, count, per_layer in (
        ("encoder", config.encoder_layers, ENCODER_LAYER_MODULES),
        ("decoder", config.decoder_layers, DECODER_LAYER_MODULES),
    ):
        for i in range(count):
            for module in per_layer:
                for p in ("weight", "bias"):
                    names[f"model.{side}.layers.{i}.{module}.{p}"] = f"{side}.layers.{i}.{module}.{p}"
        if config.normalize_before:
            for p in ("weight", "bias"):
                names[f"model.{side}.layer_norm.{p}"] = f"{side}.layer_norm.{p}"
    return names
