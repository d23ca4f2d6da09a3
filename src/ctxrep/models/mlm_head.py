"""The masked-LM head of the BERT-network families (BERT's cls.predictions, RoBERTa's lm_head), and its reading
from a *ForMaskedLM / *ForPreTraining folder. Pretraining (objectives/masked_lm.py, electra.py), distillation's
teacher (objectives/distill.py) and SPLADE's sparse vectors (vectors/sparse.py) share it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models.bert import ROBERTA_LIKE, BertModel
from ctxrep.models.folders import CheckpointError, check_weights, read_state_dict
from ctxrep.modules.activations import ACTIVATIONS

__all__ = ["MaskedLMHead", "head_prefix", "head_tensors", "read_mlm_head"]


class MaskedLMHead(nn.Module):
    """logits = LayerNorm(act(W h + b)) E^T + bias, E the input word embeddings (BERT's cls.predictions).

    The dense layer maps hidden_size -> embedding_size (equal for BERT / RoBERTa; ELECTRA's generator is
    narrower than its shared embeddings). BERT applies config.hidden_act; RoBERTa's lm_head and ELECTRA's
    generator always apply gelu (as transformers).
    """

    def __init__(self, config, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        e = config.embedding_size
        self.dense = nn.Linear(config.hidden_size, e)
        self.activation = ACTIVATIONS[config.hidden_act] if config.model_type == "bert" else F.gelu
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(e, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one Parameter, two names
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (n, hidden_size), the selected positions only -> logits (n, vocab)."""
        return self.decoder(self.norm(self.activation(self.dense(hidden)))) + self.bias


def head_prefix(model_type: str) -> str:
    """Where a *ForMaskedLM checkpoint of this model type keeps its head."""
    return "lm_head" if model_type in ROBERTA_LIKE else "cls.predictions"


def head_tensors(head: MaskedLMHead, prefix: str, model_type: str) -> dict[str, torch.Tensor]:
    """The MLM head's weights under transformers' names. The decoder weight is the word embedding matrix and
    is left out, as transformers does for tied weights; decoder.bias is the same tensor as bias."""
    if model_type == "bert":  # BertLMPredictionHead: transform.{dense, LayerNorm}, decoder, bias
        names = {"transform.dense": head.dense, "transform.LayerNorm": head.norm}
    elif model_type in ROBERTA_LIKE:  # RobertaLMHead: dense, layer_norm, decoder, bias
        names = {"dense": head.dense, "layer_norm": head.norm}
    else:  # ElectraGeneratorPredictions: dense, LayerNorm (the decoder is generator_lm_head)
        names = {"dense": head.dense, "LayerNorm": head.norm}
    tensors = {f"{prefix}.{hf}.{p}": w for hf, m in names.items() for p, w in m.state_dict().items()}
    if model_type != "electra":
        tensors[f"{prefix}.bias"] = head.bias
        tensors[f"{prefix}.decoder.bias"] = head.bias
    return tensors


def read_mlm_head(folder: Path, encoder: BertModel) -> MaskedLMHead | None:
    """The masked-LM head of a BertForMaskedLM / BertForPreTraining (cls.predictions.*) or RobertaForMaskedLM-like
    (lm_head.*) folder over `encoder` (its decoder is the encoder's word embedding matrix, tied), frozen, in eval
    mode; None when the folder holds no head (a plain encoder). Every missing or mis-shaped head weight is one
    CheckpointError; a decoder that differs from the word embeddings is refused (ctxrep's head ties them)."""
    model_type = encoder.config.model_type
    if model_type == "electra":  # a discriminator has no MLM head, and a generator's is not under these names
        return None
    from ctxrep.models.loading import weights_folder

    prefix = head_prefix(model_type)
    found = {k: v for k, v in read_state_dict(weights_folder(folder)).items() if k.startswith(prefix + ".")}
    if not found:
        return None
    head = MaskedLMHead(encoder.config, encoder.embeddings.word_embeddings)
    expected = head_tensors(head, prefix, model_type)  # names -> our tensors (decoder.bias = bias)
    decoder = found.pop(f"{prefix}.decoder.weight", None)
    if decoder is not None and not torch.equal(decoder, encoder.embeddings.word_embeddings.weight):
        raise CheckpointError(
            f"{folder}: {prefix}.decoder.weight differs from the word embeddings; ctxrep's MLM head ties them "
            "(as BERT and RoBERTa do), so an untied head cannot be read"
        )
    bias, decoder_bias = f"{prefix}.bias", f"{prefix}.decoder.bias"  # one tensor under two names; files hold either
    for name, other in ((bias, decoder_bias), (decoder_bias, bias)):
        if name not in found and other in found:
            found[name] = found[other]
    shapes = {k: tuple(v.shape) for k, v in found.items()}
    check_weights(shapes, {k: tuple(v.shape) for k, v in expected.items()}, str(folder), "a masked-LM head")
    with torch.no_grad():
        for name, ours in expected.items():
            ours.copy_(found[name])
    return head.eval().requires_grad_(False)
