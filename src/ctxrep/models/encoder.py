"""The one interface every encoder family implements and every tool uses.

Tools ask the encoder, never its class or its config (transformers' `attribute_map` idea, AllenNLP's
`TokenEmbedder`): how many layers and heads, how wide, how long a window may be, whether it reads segment ids,
whether it reads whole words, and how to run it to hidden states. A new family is done when it subclasses
`Encoder`, fills these in, and passes the family x tool test matrix (tests/test_matrix.py).

    family          short name shown to users: "bert", "roberta", "electra", "gpt2", "xlnet", "elmo", ...
    num_layers      L; `hidden_states` has L + 1 entries, entry 0 the embedding (or char CNN) output
    num_heads       attention heads per layer, or None for a model without attention (ELMo's biLSTM)
    hidden_size     width of every hidden state
    max_tokens      the longest input one window may have, special tokens included
    reads_segments  whether token_type_ids are fed in (GPT-2 would add them as token embeddings: no)
    word_level      reads whole words as characters (ELMo) instead of subword pieces
    is_decoder      a decoder's layers (GPT-2, the decoder LLMs), trained to predict the next token; `ctxrep info` says so
    causal          each token reads only itself and the tokens before it (a decoder's attention, unless its model made
                    it bidirectional: EmbeddingGemma), so only the last token has read the whole text (last-token
                    pooling; `ctxrep info` proposes it)
    encode(batch)   runs the model on a batch from `ctxrep.text.inputs.collate` to an EncoderOutput whose
                    hidden_states is always filled (and attentions when asked and the family has them)
    input_embeddings()  the static token-embedding table (vocabulary, dim), or None for character input
    heads_per_layer()   heads left in each layer (a pruned model's layers differ; num_heads is the original count)
    kept_heads()        the original indices of each layer's remaining heads (all of them unless pruned)
    attention_modules() each layer's attention module, for families that prune heads (each holds `kept_heads`, the
                        original indices of its heads, and `prune(heads)`): `layers[i].<attention_name>`;
                        heads_per_layer, kept_heads and prune_heads are read off them here, once for every family
    layer_of(name)      depth of the parameter `name` (from named_parameters()): 0 = embeddings (ELMo: the char
                        CNN), l = layer l (1..num_layers), num_layers = what sits above the top layer (pooler,
                        final LayerNorm, scalar mixes; Marian: the decoder, which encode never runs). A block
                        shared by several layers (ALBERT) gets the depth of the highest layer that uses it: it
                        trains as soon as any layer using it does (gradual unfreezing) and at that layer's rate
                        (discriminative learning rates).

The Hugging Face folder, written once here: a family declares `config_class` (from_hf_dict / to_hf_dict),
`checkpoint` (a models/folders.py CheckpointLayout: model types, the prefix of task checkpoints, heads and buffers
left out) and `checkpoint_names()` (transformers' weight name -> its own); from_pretrained, load_hf_state_dict and
save_pretrained below read them. Hooks for what differs: `model_state` (a prefix that depends on config.json),
`config_from_hf` (a config that depends on the weights), `checkpoint_layout()` (a layout that depends on the config).

Capabilities: what a tool may do with the family. The base class says no; a family that can says so here.

    can_prune_heads          prune_heads({layer: [heads]}) removes heads for real, and forward takes
                             head_mask (num_layers, num_heads) (Michel et al. 2019's mask variables xi); such a
                             family lists attention_modules() and keeps config.pruned_heads
    fusable_qkv_modules()    names of attention modules whose query, key and value nn.Linear read the same input
                             and that run one product instead when their `query_key_value` is set (fast.py's int8)
    fuses_qkv                the family's declaration that fusable_qkv_modules() is every layer's attention
    can_distill              init_student(layers, hidden_size, intermediate_size) builds a smaller encoder of the
                             same family whose layer j starts as this one's layer layers[j] (DistilBERT's init)
    lm_logits(hidden, ids)   a causal LM head over final hidden states (..., hidden) -> (..., vocab), or only the
                             columns of token ids `ids` (an LLM reranker's "yes" / "no"); the decoder LLM families
                             (models/llama.py, gemma3.py) with a head or tied embeddings; elsewhere a one-line error
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
import torch.utils.checkpoint
from torch import nn

from ctxrep.models import folders
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.heads import merge_pruned_heads
from ctxrep.modules.unpadding import Unpadding, unpadding_for


class Encoder(nn.Module):
    """Base class of every encoder family; see the module docstring for what each member means."""

    family: str
    word_level: bool = False
    reads_segments: bool = True
    is_decoder: bool = False
    causal: bool = False
    prepack_for_inference: bool = False  # the featurizer may run its linear layers through oneDNN (pre-packed)
    # A batch whose padding is at least this share of its (batch, seq) grid runs unpadded: the per-token layers on
    # the real tokens only (modules/unpadding.py; UNPAD_FROM there, measured by benchmarks/unpad.py). None: the
    # family always runs padded.
    unpad_from: float | None = None

    # The config field that holds each number (transformers' attribute_map): the four properties below read them,
    # so a family declares its map (`Encoder.config_fields | {...}`) instead of writing the properties; a number that
    # is no config field (a fixed window, a width of two directions) is a property of the family.
    config_fields: Mapping[str, str] = {
        "num_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "hidden_size": "hidden_size",
        "max_tokens": "max_position_embeddings",
    }
    embedding_table: str | None = None  # the module whose weight input_embeddings() returns; None: no such table

    def _config_number(self, member: str) -> int:
        field = self.config_fields.get(member)
        if field is None:
            raise NotImplementedError(
                f"{type(self).__name__} neither answers {member} nor names the config field that holds it "
                "(Encoder.config_fields, models/encoder.py)"
            )
        return getattr(self.config, field)

    @property
    def num_layers(self) -> int:
        return self._config_number("num_layers")

    @property
    def num_heads(self) -> int | None:
        """Heads per layer before any pruning: the most a layer has, and the width of `head_mask` and of head
        importance arrays (head indices everywhere are in this original numbering). A pruned model's layers may
        have fewer: see `heads_per_layer()`."""
        return self._config_number("num_heads")

    @property
    def hidden_size(self) -> int:
        return self._config_number("hidden_size")

    @property
    def max_tokens(self) -> int:
        return self._config_number("max_tokens")

    @property
    def has_attention(self) -> bool:
        return self.num_heads is not None

    # The classification token is the last of a text (BART's final </s>, whose decoder state has read the whole text:
    # BartForSequenceClassification's pooling) instead of where the tokenizer's template puts it.
    classifies_at_end: bool = False

    # An encoder-decoder's hidden_states are the encoder's, then the decoder's (models/seq2seq.py): the first entry
    # from the decoder; None for a model of one stack.
    decoder_from: int | None = None

    def layer_sides(self) -> list[str]:
        """The side of each entry of hidden_states (0..num_layers): "encoder" or "decoder" for an encoder-decoder's
        layers; "" everywhere for a model of one stack."""
        n = self.num_layers + 1
        if self.decoder_from is None:
            return [""] * n
        return ["encoder"] * self.decoder_from + ["decoder"] * (n - self.decoder_from)

    def describe_sides(self) -> str:
        """One line on which layers are the encoder's and which the decoder's; "" for a model of one stack."""
        if self.decoder_from is None:
            return ""
        d = self.decoder_from
        return (
            f"layers 0-{d - 1} encoder, {d}-{self.num_layers} decoder (the text teacher-forced: decoder position i "
            "has read the start token and tokens before i, and stands for token i)"
        )

    attention_name: str = "attention"  # the attribute of each of `layers` that holds its attention (can_prune_heads)

    def attention_modules(self) -> list[nn.Module]:
        """Each layer's attention module, bottom first, in families that can prune heads: each has `kept_heads`
        (the original indices of its remaining heads) and `prune(heads)`. [] for the others."""
        if not self.can_prune_heads:
            return []
        return [getattr(layer, self.attention_name) for layer in self.layers]

    def heads_per_layer(self) -> list[int]:
        """Attention heads left in each layer (differs from num_heads after head pruning); [] without attention."""
        if modules := self.attention_modules():
            return [len(m.kept_heads) for m in modules]
        return [self.num_heads] * self.num_layers if self.has_attention else []

    def kept_heads(self) -> list[list[int]]:
        """Original indices (0..num_heads - 1) of the heads left in each layer; [] without attention."""
        if modules := self.attention_modules():
            return [list(m.kept_heads) for m in modules]
        return [list(range(n)) for n in self.heads_per_layer()]

    def input_embeddings(self) -> torch.Tensor | None:
        """The static token-embedding table (vocabulary, dim): `embedding_table`'s weight; None for character input."""
        return None if self.embedding_table is None else self.get_submodule(self.embedding_table).weight

    def encode(
        self,
        batch: Mapping[str, torch.Tensor],
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> EncoderOutput:
        """Subword families: batch["input_ids"], ["attention_mask"], ["token_type_ids"] (batch, seq); the default
        calls forward with them. `num_layers` stops after that many layers (None: all). `padded`: run the batch on
        the padded grid, so that positions whose attention_mask is 0 get the outputs transformers computes there
        (ColBERT's [MASK] query expansion reads them); False: the family's unpadding rule (`unpadding`)."""
        return self(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"] if self.reads_segments else None,
            output_hidden_states=True,
            output_attentions=output_attentions,
            num_layers=num_layers,
            padded=padded,
        )

    def unpadding(self, attention_mask: torch.Tensor | None, padded: bool = False) -> Unpadding | None:
        """How forward lays out a batch with this mask: None (the padded grid) when `padded`, else unpadded by the
        family's `unpad_from` rule (`modules.unpadding.unpadding_for`)."""
        return None if padded else unpadding_for(attention_mask, self.unpad_from)

    def no_attention_reason(self) -> str:
        """One line for tools that need attention heads and get a model without them."""
        return f"{self.family} has no attention heads"

    # ---- depth of each parameter ----------------------------------------------------------------------------

    def layer_of(self, name: str) -> int:
        """Depth of the parameter called `name` (see the module docstring); every family answers for each of its
        named_parameters() and raises `unknown_parameter` for any other name."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement Encoder.layer_of: a family says the depth of each of its "
            "parameters (models/encoder.py)"
        )

    def unknown_parameter(self, name: str) -> ValueError:
        return ValueError(
            f"{name!r} is not a parameter of this {self.family} encoder; give a name from named_parameters()"
        )

    # ---- the Hugging Face folder (families that declare config_class, checkpoint and checkpoint_names) ----------

    config_class: type | None = None  # the family's config dataclass: from_hf_dict(dict) and to_hf_dict()
    checkpoint: folders.CheckpointLayout | None = None

    def checkpoint_names(self) -> dict[str, str]:
        """transformers' name -> this model's name, for every weight the folder holds."""
        raise NotImplementedError(f"{type(self).__name__} declares no checkpoint_names (models/encoder.py)")

    def checkpoint_layout(self) -> folders.CheckpointLayout:
        """The class's `checkpoint`; a family whose layout depends on its config answers here."""
        return self.checkpoint

    @classmethod
    def config_from_hf(cls, hf_config: dict, state: Mapping[str, torch.Tensor]) -> object:
        """The config of a folder's config.json (`state`: its weights, prefix removed, for a family that reads
        a switch off them)."""
        return cls.config_class.from_hf_dict(hf_config)

    @classmethod
    def model_state(cls, state: dict[str, torch.Tensor], hf_config: dict) -> dict[str, torch.Tensor]:
        """A folder's weights under the model's own names: the layout's prefix removed where a task / pre-training
        checkpoint has it."""
        layout = cls.checkpoint
        return folders.without_prefix(state, layout.prefix, layout.prefix_marker) if layout.prefix else state

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Encoder:
        """A transformers folder of this family: the bare model, or a task / pre-training one whose model sits
        under the layout's prefix (the heads on top are named in a log line and not loaded). Eval mode."""
        path = Path(path)
        hf_config = folders.read_config(path, cls.checkpoint.model_types)
        state = cls.model_state(folders.read_state_dict(path), hf_config)
        with folders.config_errors(path):  # e.g. pruned_heads naming a missing layer
            config = cls.config_from_hf(hf_config, state)
        model = cls(config)
        model.load_hf_state_dict(state, source=str(path))
        return model.eval()

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Copy weights named as in transformers into this model; refuse anything missing, unknown or mis-shaped."""
        layout = self.checkpoint_layout()
        folders.load_named_weights(
            self,
            state,
            self.checkpoint_names(),
            source,
            layout.what or f"a {self.family} encoder",
            outside=layout.head_prefixes,
            outside_noun=layout.head_noun,
            not_weights=layout.buffers,
            transposed=layout.transposed,
            hint=layout.hint,
        )

    def hf_config(self) -> dict:
        """config.json of a saved folder: the config's to_hf_dict()."""
        return self.config.to_hf_dict()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """This model's weights under transformers' names and layouts."""
        return folders.named_tensors(self, self.checkpoint_names(), self.checkpoint_layout().transposed)

    def save_pretrained(self, path: str | Path) -> Path:
        """Write config.json + model.safetensors that transformers' AutoModel loads (unless the family's config
        says otherwise, as a pruned DeBERTa or ModernBERT does)."""
        return folders.write_folder(path, self.hf_config(), self.hf_state_dict())

    # ---- capabilities (the base class: none) --------------------------------------------------------------

    can_prune_heads: bool = False
    can_distill: bool = False

    def prune_heads(self, heads: Mapping[int, Iterable[int]]) -> None:
        """Remove heads {layer: [heads in the original numbering]} for good (families with can_prune_heads); heads
        already pruned are ignored. Each layer's attention module drops those heads' rows of its input projections
        and the columns of its output projection, so the result equals the unpruned model run with those heads'
        mask set to 0. Every request is checked before any layer changes; config.pruned_heads records every removed
        head, so that save_pretrained / from_pretrained rebuild the smaller model."""
        if not self.can_prune_heads:
            raise ValueError(f"a {self.family} model cannot have attention heads removed (can_prune_heads is False)")
        heads, merged = merge_pruned_heads(self.config.pruned_heads, heads, self.num_layers, self.num_heads)
        modules = self.attention_modules()
        for layer, removed in heads.items():
            modules[layer].prune(removed)
        self.config.pruned_heads = merged

    fuses_qkv: bool = False  # each layer's attention (attention_name) qualifies for fusable_qkv_modules()

    def fusable_qkv_modules(self) -> list[str]:
        """Names (as in named_modules()) of attention modules with `query`, `key`, `value` nn.Linear over the same
        input and a `query_key_value` slot that replaces the three by one product when set: every layer's attention
        in a family that declares fuses_qkv; [] for none."""
        if not self.fuses_qkv:
            return []
        return [f"layers.{i}.{self.attention_name}" for i in range(self.num_layers)]

    # ---- training big models: the repeated blocks, activation checkpointing, adapters' places --------------------

    blocks_name: str = "layers"  # the ModuleList of repeated blocks that blocks() lists

    def blocks(self) -> list[nn.Module]:
        """The repeated blocks, bottom first (each module once, however often it runs): one recomputation each under
        activation checkpointing, one unit each of FSDP's sharding (train/distributed.py). Default: `blocks_name`."""
        return list(self.get_submodule(self.blocks_name))

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Whether each block recomputes its activations in backward instead of keeping them (transformers' name)."""
        return any("forward" in vars(b) for b in self.blocks())

    def gradient_checkpointing_enable(self) -> None:
        """Activation checkpointing, per block: a block keeps only its inputs in a training forward and runs again in
        backward (torch.utils.checkpoint, non-reentrant: the same dropout masks, autocast and gradients, including a
        frozen encoder's LoRA adapters). Forwards without gradients run as before. Written once here over `blocks()`:
        each block's forward is wrapped on the instance, so names, weights and state dicts do not change."""
        for block in self.blocks():
            block.forward = types.MethodType(_checkpointed_forward, block)

    def gradient_checkpointing_disable(self) -> None:
        for block in self.blocks():
            vars(block).pop("forward", None)

    # The attention and MLP projections (nn.Linear modules, named relative to a block) that LoRA adapts by default
    # (models/adapters.py); () for a family without such projections, which no_adapters_reason() explains.
    adapter_targets: tuple[str, ...] = ()

    def no_adapters_reason(self) -> str:
        """One line for adapter tools on a family that declares no projections to adapt."""
        return f"a {self.family} encoder declares no attention or MLP projections for LoRA adapters"

    def hf_module_names(self) -> dict[str, str]:
        """This model's module name -> transformers' module name, for every module whose weight the folder holds
        (read off checkpoint_names(): an adapter saved under these names loads into transformers' model)."""
        return {
            ours.removesuffix(".weight"): theirs.removesuffix(".weight")
            for theirs, ours in self.checkpoint_names().items()
            if ours.endswith(".weight") and theirs.endswith(".weight")
        }

    def lm_logits(self, hidden: torch.Tensor, token_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Causal LM logits of final hidden states (..., hidden): (..., vocab), or (..., len(token_ids))."""
        raise ValueError(f"a {self.family} encoder has no causal language-model head (lm_logits)")

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> Encoder:
        """A smaller encoder of this family (families with can_distill): len(layers) layers, layer j copied from
        this encoder's layer layers[j] (0-based) with the embeddings and what sits above the layers; with a smaller
        hidden_size (intermediate_size in the teacher's ratio unless given) fresh weights of the same shape rules.
        The student is a new module; this encoder is left as it was."""
        raise ValueError(f"a {self.family} model cannot teach a student built from its layers (can_distill is False)")


def check_length(t: int, max_tokens: int) -> None:
    """A forward's input of t tokens fits the family's `max_tokens`, else a one-line ValueError."""
    if t > max_tokens:
        raise ValueError(
            f"sequence of {t} tokens is longer than the model's {max_tokens} positions; "
            "ctxrep.Featurizer splits long texts into windows for you"
        )


def _checkpointed_forward(block: nn.Module, *args, **kwargs):
    """A block's forward under activation checkpointing (Encoder.gradient_checkpointing_enable), bound to the block
    (so a copied module's wrapper calls its copy)."""
    forward = type(block).forward
    if not torch.is_grad_enabled():
        return forward(block, *args, **kwargs)
    return torch.utils.checkpoint.checkpoint(
        forward, block, *args, use_reentrant=False, context_fn=_recomputation_contexts, **kwargs
    )


_RECOMPUTING = contextvars.ContextVar("recomputing", default=False)


def recomputing() -> bool:
    """Whether activation checkpointing is running a block's forward again in backward: a block whose forward
    changes state outside itself (a decoder layer appending to its key/value cache) must not change it twice."""
    return _RECOMPUTING.get()


@contextlib.contextmanager
def _recomputing():
    token = _RECOMPUTING.set(True)
    try:
        yield
    finally:
        _RECOMPUTING.reset(token)


def _recomputation_contexts():
    """torch.utils.checkpoint's context_fn: the forward as it is, the recomputation under `recomputing()`."""
    return contextlib.nullcontext(), _recomputing()


def check_student_layers(layers: Sequence[int], total: int) -> list[int]:
    """`layers` as ints when they name distinct teacher layers 0..total - 1 in increasing order; else a one-line
    ValueError (what Encoder.init_student takes)."""
    chosen = [int(i) for i in layers]
    if not chosen:
        raise ValueError("a student needs at least one layer: name at least one teacher layer")
    bad = [i for i in chosen if not 0 <= i < total]
    if bad:
        raise ValueError(f"teacher layers {bad} do not exist: the teacher has layers 0..{total - 1}")
    if sorted(set(chosen)) != chosen:
        raise ValueError(f"teacher layers {chosen} must be increasing and distinct (bottom layer first)")
    return chosen


def student_widths(
    width: int, heads: int, inner: int, hidden_size: int | None, intermediate_size: int | None
) -> tuple[int, int]:
    """(hidden, intermediate) of a student of a teacher `width` wide with `heads` heads and an `inner`-wide
    feed-forward: the teacher's when hidden_size is None or 0; narrower with the teacher's heads and (unless given)
    the teacher's intermediate / hidden ratio. One-line ValueErrors for a shape that cannot be built."""
    h = hidden_size or width
    if h > width:
        raise ValueError(
            f"student hidden size {h} is wider than the teacher's {width}; give at most {width} "
            "(or 0 for the teacher's width)"
        )
    if h % heads:
        raise ValueError(
            f"student hidden size {h} is not a multiple of the teacher's {heads} attention heads; a student keeps "
            "the teacher's heads, so choose a multiple"
        )
    if h == width:
        if intermediate_size and intermediate_size != inner:
            raise ValueError(
                f"student intermediate size {intermediate_size} differs from the teacher's {inner}, but a student "
                "of the teacher's width copies its layers; narrow the student too, or leave it out"
            )
        return h, inner
    return h, intermediate_size or inner * h // width
