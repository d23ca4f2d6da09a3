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
    encode(batch)   runs the model on a batch from `ctxrep.inputs.collate` to an EncoderOutput whose
                    hidden_states is always filled (and attentions when asked and the family has them)
    input_embeddings()  the static token-embedding table (vocabulary, dim), or None for character input
    heads_per_layer()   heads left in each layer (a pruned model's layers differ; num_heads is the original count)
    kept_heads()        the original indices of each layer's remaining heads (all of them unless pruned)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ctxrep.models.outputs import EncoderOutput


class Encoder(nn.Module):
    """Base class of every encoder family; see the module docstring for what each member means."""

    family: str
    word_level: bool = False
    reads_segments: bool = True
    prepack_for_inference: bool = False  # the featurizer may run its linear layers through oneDNN (pre-packed)

    @property
    def num_layers(self) -> int:
        raise NotImplementedError

    @property
    def num_heads(self) -> int | None:
        raise NotImplementedError

    @property
    def hidden_size(self) -> int:
        raise NotImplementedError

    @property
    def max_tokens(self) -> int:
        raise NotImplementedError

    @property
    def has_attention(self) -> bool:
        return self.num_heads is not None

    def heads_per_layer(self) -> list[int]:
        """Attention heads left in each layer (differs from num_heads after head pruning); [] without attention."""
        return [self.num_heads] * self.num_layers if self.has_attention else []

    def kept_heads(self) -> list[list[int]]:
        """Original indices (0..num_heads - 1) of the heads left in each layer; [] without attention."""
        return [list(range(n)) for n in self.heads_per_layer()]

    def input_embeddings(self) -> torch.Tensor | None:
        return None

    def encode(
        self, batch: Mapping[str, torch.Tensor], output_attentions: bool = False, num_layers: int | None = None
    ) -> EncoderOutput:
        """Subword families: batch["input_ids"], ["attention_mask"], ["token_type_ids"] (batch, seq); the default
        calls forward with them. `num_layers` stops after that many layers (None: all)."""
        return self(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"] if self.reads_segments else None,
            output_hidden_states=True,
            output_attentions=output_attentions,
            num_layers=num_layers,
        )

    def no_attention_reason(self) -> str:
        """One line for tools that need attention heads and get a model without them."""
        return f"{self.family} has no attention heads"
