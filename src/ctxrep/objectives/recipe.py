"""A pretraining objective as one unit: its recipe, what `ctxrep pretrain --objective NAME` needs to know about it.

Each objective file ends with its recipe (masked_lm.py with mlm and mlm+nsp, sentence_order.py, electra.py,
causal_lm.py, permutation_lm_objective.py, bilm.py, distill.py) and objectives/recipes.py lists them in one table,
the way models/loading.py's FAMILIES lists the encoders. The pipeline (train/pretrain.py) asks the recipe and
never the objective's name:

- `settings`: the dataclass of the [objective] keys it reads (None: none). The config's [objective] table is the
  union of every recipe's settings (train/pretrain_config.py), so a key two recipes share means the same in both;
- `shape_keys`: the [encoder] keys (`Shape`, the Transformer's shape in BERT's names) that its `build` maps onto
  its family's config (BertConfig, AlbertConfig, GPT2Config, XLNetConfig); () = it reads no [encoder];
- `sections`: sections of its own: a dataclass ([distill]) or a dict of tables and their keys ([elmo.lstm]);
- `tokenizer_kinds`: the tokenizer kinds it can train, its default first; `tokenizer_template` is applied to a
  tokenizer trained for it (XLNet's "A <sep> <cls>", which adds `template_tokens` entries); `own_tokenizer`
  instead brings its tokenizer (distill: the teacher's) and then it trains none and reads no [tokenizer];
- `build(Ingredients) -> Built`: the objective module from the shape, its settings and the tokenizer, with its
  position limit (None: any length) and the separator its packing puts between documents;
- `packing(corpus, tokenizer, Packing)`: its batch source (RoBERTa's FULL-SENTENCES, BERT's segment pairs,
  ALBERT's sentence-order pairs); `min_documents`: the documents each side of the held-out split needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrep.data.corpus import PackedCorpus
from ctxrep.data.packing import FullSentencesConfig, FullSentencesPacker, ShortSequenceWarmup
from ctxrep.text.tokenizer import Tokenizer


class PretrainError(ValueError):
    """A config, corpus or output folder that cannot be used for pretraining, with what to change."""


@dataclass
class Shape:
    """The Transformer's shape ([encoder]), in BERT's names; each recipe maps the keys it lists in `shape_keys` onto
    its family's config (mlm+sop onto AlbertConfig, clm onto GPT2Config, plm onto XLNetConfig)."""

    model_type: str = "bert"  # "bert" or "roberta"; electra builds ELECTRA, mlm+sop ALBERT, clm GPT-2, plm XLNet
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    # 0 = hidden_size (mlm+sop: min(128, hidden_size), ALBERT's E); ELECTRA-small has narrower embeddings projected up
    embedding_size: int = 0
    share: str = "all"  # ALBERT's cross-layer sharing: "all", "attention", "ffn" or "none"
    hidden_act: str = "gelu"  # GPT-2 keeps its own gelu_new
    hidden_dropout_prob: float = 0.1  # plm: XLNet's one dropout
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512  # XLNet's relative positions have no limit
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12  # GPT-2 keeps its own 1e-5
    initializer_range: float = 0.02


# The [encoder] keys every Transformer recipe maps; the others add what their family has.
CORE_SHAPE = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_dropout_prob",
    "initializer_range",
)


@dataclass
class Ingredients:
    """What a recipe's `build` gets from the pipeline."""

    shape: Shape  # [encoder]
    settings: Any  # the recipe's settings dataclass filled from [objective] (None without settings)
    sections: dict[str, Any]  # its own sections: a dataclass instance, or the raw dict of a table section
    tokenizer: Tokenizer
    vocab_size: int  # [tokenizer] vocab_size: the model's embedding (softmax) rows
    seed: int  # [trainer] seed (static masks)
    source: str  # the config file, named in errors


@dataclass
class Built:
    """A recipe's objective module, its position limit (None: any length) and the token its packing puts between
    documents inside a row (None: the tokenizer's template alone)."""

    module: Any  # nn.Module with forward(batch) -> ObjectiveOutput and save_pretrained(folder)
    positions: int | None
    separator_id: int | None = None


@dataclass
class Packing:
    """How the pipeline asks a recipe's packing for its rows."""

    max_length: int  # [data] max_length
    seed: int  # [trainer] seed
    warmup: ShortSequenceWarmup | None  # the short-sequence warm-up (training side only)
    settings: Any  # the recipe's settings (short_seq_prob of the pair objectives)
    separator_id: int | None  # Built.separator_id


def full_sentences(corpus: PackedCorpus, tokenizer: Tokenizer, plan: Packing) -> FullSentencesPacker:
    """RoBERTa's FULL-SENTENCES rows: contiguous sentences up to max_length, crossing documents."""
    return FullSentencesPacker(
        corpus, FullSentencesConfig(plan.max_length, plan.seed, plan.warmup, plan.separator_id), tokenizer
    )


@dataclass(frozen=True)
class Recipe:
    """One pretraining objective (module docstring)."""

    name: str  # `--objective NAME`
    build: Callable[[Ingredients], Built]
    settings: type | None = None
    shape_keys: tuple[str, ...] = ()
    sections: dict[str, type | dict[str, tuple[str, ...]]] = field(default_factory=dict)
    tokenizer_kinds: tuple[str, ...] = ()
    tokenizer_template: Callable[[Path], None] | None = None
    template_tokens: int = 0
    # (its sections, the config file, the run folder, --tokenizer or None) -> the tokenizer saved in the run folder
    own_tokenizer: Callable[[dict[str, Any], str, Path, str | Path | None], Tokenizer] | None = None
    packing: Callable[[PackedCorpus, Tokenizer, Packing], Any] = full_sentences
    min_documents: int = 1

    @property
    def trains_tokenizer(self) -> bool:
        return self.own_tokenizer is None

    def tokenizer_kind(self, kind: str, source: str) -> str:
        """[tokenizer] kind, or the recipe's default when it is ""; one it cannot train is refused."""
        kind = kind or self.tokenizer_kinds[0]
        if kind not in self.tokenizer_kinds:
            usable = self.tokenizer_kinds
            raise PretrainError(
                f"[tokenizer] kind={kind!r} in {source}: {self.name} trains a {' or '.join(usable)} tokenizer; "
                f"set --tokenizer.kind {usable[0]} (or leave kind out of the config)"
            )
        return kind
