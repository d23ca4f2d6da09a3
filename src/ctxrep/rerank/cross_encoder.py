"""Cross-encoder rerankers: a sequence-classification checkpoint scores (query, document) pairs.

A sentence-transformers CrossEncoder folder is a Hugging Face `*ForSequenceClassification` folder (plus, in its
config.json, `sentence_transformers.activation_fn`). ctxrep builds the encoder of the folder's family through
models/loading.py (the family's loader skips the head's weights) and reads the head itself from the checkpoint,
as the table HEADS says transformers lays it out for each architecture:

    BERT        pooler (tanh, the encoder's own) -> classifier
    RoBERTa     classification token -> classifier.dense -> tanh -> classifier.out_proj  (XLM-R, CamemBERT, MPNet)
    ELECTRA     classification token -> classifier.dense -> gelu -> classifier.out_proj
    DistilBERT  classification token -> pre_classifier -> relu -> classifier
    DeBERTa-v2  classification token -> pooler.dense -> pooler_hidden_act (gelu) -> classifier
    ModernBERT  classification token or mean (classifier_pooling) -> head.dense -> classifier_activation ->
                head.norm -> classifier

score = activation(logits): the folder's `activation_fn` (sigmoid or identity), else sigmoid for one label and the
logits themselves for several, as sentence-transformers' CrossEncoder.predict. A pair is one window, cut to fit
longest-first as transformers' tokenizers truncate (`WindowPlan.truncated`); each side is tokenized whole, as
transformers encodes a pair. After each call, `cut_texts` names the pairs so cut (indices in that call) and
`cut_pieces` how many pieces each lost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.models.folders import CheckpointError, read_config, read_state_dict
from ctxrep.models.loading import LoadedEncoder, load_encoder
from ctxrep.models.sentence_transformers import SETTINGS_FILE, TORCH_ACTIVATIONS, Prompts, read_prompts
from ctxrep.models.shards import WeightIndex, read_tensor
from ctxrep.modules.activations import ACTIVATIONS
from ctxrep.rerank.ranking import BetweenBatches, Reranker, length_batches
from ctxrep.runtime.hardware import default_batch_tokens
from ctxrep.text.inputs import WindowPlan, collate


@dataclass(frozen=True)
class HeadLayout:
    """Where a `*ForSequenceClassification` checkpoint keeps its head: a pooled vector (the classification token,
    or the mean over the tokens where `pooling_key` says so), an optional hidden -> hidden layer, its activation
    (a row of modules/activations.py, or the one config.json's `activation_key` names) and optional LayerNorm, then
    the output layer. `from_pooler`: the encoder's own pooler output feeds the output layer (BERT)."""

    out: str
    dense: str | None = None
    activation: str = "tanh"
    activation_key: str | None = None
    norm: str | None = None
    pooling_key: str | None = None
    from_pooler: bool = False


_ROBERTA_HEAD = HeadLayout("classifier.out_proj", "classifier.dense")
# config.json's architectures[0] -> its head (transformers' modeling files of each family).
HEADS: dict[str, HeadLayout] = {
    "BertForSequenceClassification": HeadLayout("classifier", from_pooler=True),
    "RobertaForSequenceClassification": _ROBERTA_HEAD,
    "XLMRobertaForSequenceClassification": _ROBERTA_HEAD,
    "CamembertForSequenceClassification": _ROBERTA_HEAD,
    "MPNetForSequenceClassification": _ROBERTA_HEAD,
    "ElectraForSequenceClassification": HeadLayout("classifier.out_proj", "classifier.dense", "gelu"),
    "DistilBertForSequenceClassification": HeadLayout("classifier", "pre_classifier", "relu"),
    # the decoder's state at the final </s> (the encoder interface's classification token for BART: classifies_at_end)
    "BartForSequenceClassification": HeadLayout("classification_head.out_proj", "classification_head.dense", "tanh"),
    "MBartForSequenceClassification": HeadLayout("classification_head.out_proj", "classification_head.dense", "tanh"),
    "DebertaV2ForSequenceClassification": HeadLayout("classifier", "pooler.dense", "gelu", "pooler_hidden_act"),
    "ModernBertForSequenceClassification": HeadLayout(
        "classifier", "head.dense", "gelu", "classifier_activation", "head.norm", "classifier_pooling"
    ),
}


@dataclass(frozen=True)
class Pieces:
    """One side of a pair as token ids (what `WindowPlan.truncated` reads)."""

    ids: list[int]


class ClassificationHead(nn.Module):
    """logits = out(norm(activation(dense(pooled)))), or out(pooler_output) for BERT (see HeadLayout)."""

    def __init__(self, layout: HeadLayout, state: dict[str, torch.Tensor], config: dict, source: str) -> None:
        super().__init__()
        self.from_pooler = layout.from_pooler
        self.pooling = config.get(layout.pooling_key, "cls") if layout.pooling_key else "cls"
        if self.pooling not in ("cls", "mean"):
            raise CheckpointError(f"{source}: {layout.pooling_key} {self.pooling!r} is not 'cls' or 'mean'")
        name = config.get(layout.activation_key, layout.activation) if layout.activation_key else layout.activation
        if name not in ACTIVATIONS:
            raise CheckpointError(f"{source}: head activation {name!r} is not one of {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[name]
        self.dense = _linear(state, layout.dense, source) if layout.dense else None
        self.norm = _layer_norm(state, layout.norm, config.get("norm_eps", 1e-5), source) if layout.norm else None
        self.out = _linear(state, layout.out, source)

    def forward(self, output, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.from_pooler:
            return self.out(output.pooler_output)  # (batch, labels)
        h = output.last_hidden_state
        if self.pooling == "mean":
            mask = batch["attention_mask"].unsqueeze(-1).to(h.dtype)  # (batch, seq, 1)
            h = (h * mask).sum(dim=1) / mask.sum(dim=1)  # (batch, hidden)
        else:
            h = h[torch.arange(len(h)), batch["cls_position"]]  # (batch, hidden)
        if self.dense is not None:
            h = self.activation(self.dense(h))
        if self.norm is not None:
            h = self.norm(h)
        return self.out(h)  # (batch, labels)


def _linear(state: dict[str, torch.Tensor], name: str, source: str) -> nn.Linear:
    weight, bias = state.get(f"{name}.weight"), state.get(f"{name}.bias")
    if weight is None:
        raise CheckpointError(f"{source}: the classification head lacks {name}.weight; is this a cross-encoder?")
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight.float())
        if bias is not None:
            layer.bias.copy_(bias.float())
    return layer.eval()


def _layer_norm(state: dict[str, torch.Tensor], name: str, eps: float, source: str) -> nn.LayerNorm:
    weight, bias = state.get(f"{name}.weight"), state.get(f"{name}.bias")
    if weight is None:
        raise CheckpointError(f"{source}: the classification head lacks {name}.weight")
    norm = nn.LayerNorm(weight.shape[0], eps=eps, bias=bias is not None)
    with torch.no_grad():
        norm.weight.copy_(weight.float())
        if bias is not None:
            norm.bias.copy_(bias.float())
    return norm.eval()


def head_tensors(folder: Path, layout: HeadLayout) -> dict[str, torch.Tensor]:
    """The head's tensors alone: read at their offsets from safetensors (one file or shards), else from the whole
    pytorch_model.bin (the encoder's weights are the family loader's)."""
    prefixes = tuple(f"{name}." for name in (layout.dense, layout.norm, layout.out) if name)
    if not (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").is_file():
        return {k: v for k, v in read_state_dict(folder).items() if k.startswith(prefixes)}
    out = {}
    for name, entry in WeightIndex.of(folder).entries.items():
        if name.startswith(prefixes):
            with entry.file.open("rb") as f:
                out[name] = read_tensor(f, entry)
    return out


def architecture_of(folder: Path) -> str:
    """config.json's architectures[0], or a one-line CheckpointError."""
    architectures = read_config(folder).get("architectures") or []
    if not architectures or not isinstance(architectures[0], str):
        raise CheckpointError(
            f'{folder / "config.json"}: no "architectures" entry, so the head cannot be told; a cross-encoder '
            f"folder names one of {', '.join(HEADS)}"
        )
    return architectures[0]


def _activation(folder: Path, num_labels: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The folder's activation_fn, where sentence-transformers looks for it, in its order: config_sentence_transformers.json
    (v6), config.json's "sentence_transformers" (v4-5), its "sbert_ce_default_activation_function" (older); else
    sigmoid for one label, identity for several."""
    settings = folder / SETTINGS_FILE
    config = read_config(folder)
    path = (json.loads(settings.read_text()).get("activation_fn") if settings.is_file() else None) or (
        (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
    )
    if path is None:
        return torch.sigmoid if num_labels == 1 else TORCH_ACTIVATIONS["torch.nn.Identity"]
    if path not in TORCH_ACTIVATIONS:
        raise CheckpointError(
            f"{folder}: activation_fn {path!r} is not one ctxrep applies ({', '.join(TORCH_ACTIVATIONS)}); pass "
            "activation='identity' or 'sigmoid' to choose one"
        )
    return TORCH_ACTIVATIONS[path]


ACTIVATION_CHOICES = {"sigmoid": torch.sigmoid, "identity": TORCH_ACTIVATIONS["torch.nn.Identity"]}


class CrossEncoderReranker(Reranker):
    """Scores (query, document) pairs with a cross-encoder folder; `rerank` orders documents by their score.

    model: a folder or a name `ctxrep.load_encoder` resolves (its config.json's architectures[0] in HEADS).
    activation: None (the folder's, see the module docstring), "sigmoid" or "identity" (raw logits).
    batch_tokens: rows x longest per batch (default: the Featurizer's rule for the device).
    between_batches: None, or a function called between two batches (ranking.BetweenBatches; ctxrep serve's turns).
    Set it on a copy.
    After each call, `cut_texts` lists the pairs (indices in that call; a document's index in `rerank`) cut to fit
    max_length, longest side first, and `cut_pieces` the pieces each of them lost, in the same order.
    """

    between_batches: BetweenBatches | None = None  # the batches call it (ranking.length_batches)

    def __init__(
        self,
        model: str | os.PathLike | LoadedEncoder,
        activation: str | None = None,
        max_length: int | None = None,
        batch_tokens: int | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        if activation is not None and activation not in ACTIVATION_CHOICES:
            raise ValueError(f"activation must be None, 'sigmoid' or 'identity', got {activation!r}")
        loaded = model if isinstance(model, LoadedEncoder) else load_encoder(model)
        folder, source = loaded.folder, str(loaded.folder)
        architecture = architecture_of(folder)
        if architecture not in HEADS:
            raise CheckpointError(
                f"{folder / 'config.json'}: architectures says {architecture}, which is not a cross-encoder ctxrep "
                f"reads (it reads {', '.join(HEADS)}; causal LMs through ctxrep.rerank.LLMReranker)"
            )
        if loaded.model.word_level:
            raise CheckpointError(f"{source}: {loaded.model.family} has no classification token to rerank with")
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.folder = folder
        layout = HEADS[architecture]
        self.head = ClassificationHead(layout, head_tensors(folder, layout), read_config(folder), source)
        if device is not None:
            self.model.to(device)
            self.head.to(device)
        self.num_labels = self.head.out.out_features
        self.activation = (
            ACTIVATION_CHOICES[activation] if activation is not None else _activation(folder, self.num_labels)
        )
        self.prompts: Prompts = read_prompts(folder)
        self.max_length = min(max_length or self.model.max_tokens, self.model.max_tokens)
        self.plan = WindowPlan(self.tokenizer, self.max_length)
        self.batch_tokens = batch_tokens or default_batch_tokens(
            self.device, self.model.hidden_size, self.model.num_layers
        )
        self.cut_texts: list[int] = []  # the pairs of the last call cut to fit max_length, by index in that call
        self.cut_pieces: list[int] = []  # the pieces each of them lost

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def predict(
        self, pairs: Sequence[tuple[str, str]], prompt: str | None = None, prompt_name: str | None = None
    ) -> np.ndarray:
        """Scores of (query, document) pairs in their order: (pairs,) for one label, (pairs, labels) for several.
        The prompt (given, named, or the folder's default) goes before each query, as sentence-transformers does."""
        prefix = self.prompts.resolve(prompt, prompt_name)
        pairs = list(pairs)
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"pair {i}: expected a (query, document) pair of strings, got {type(pair).__name__}")
        # each side tokenized whole and alone, as transformers' tokenizers encode a pair, then cut to fit
        sides = [self._pieces([prefix + a for a, _ in pairs]), self._pieces([b for _, b in pairs])]
        records = [self.plan.truncated(i, a, b) for i, (a, b) in enumerate(zip(*sides))]
        special = self.tokenizer.template.num_special(pair=True)
        lost = [len(a.ids) + len(b.ids) + special - len(r) for a, b, r in zip(*sides, records)]
        self.cut_texts = [i for i, n in enumerate(lost) if n > 0]
        self.cut_pieces = [lost[i] for i in self.cut_texts]
        scores = torch.zeros(len(records), self.num_labels)
        lengths = [len(r) for r in records]
        with torch.inference_mode():
            for rows in length_batches(lengths, self.batch_tokens, self.between_batches):
                batch = collate([records[r] for r in rows], self.tokenizer)
                batch["cls_position"] = torch.tensor([records[r].cls_position for r in rows])
                batch = {k: v.to(self.device) for k, v in batch.items()}
                logits = self.head(self.model.encode(batch), batch)
                scores[rows] = self.activation(logits.float()).cpu()
        out = scores.numpy()
        return out[:, 0] if self.num_labels == 1 else out

    def _pieces(self, texts: list[str]) -> list[Pieces]:
        ids, lengths = self.tokenizer.encode_texts(texts)
        ends = np.cumsum(lengths)
        return [Pieces(ids[e - n : e].tolist()) for e, n in zip(ends.tolist(), lengths.tolist())]

    def check_reranks(self) -> None:
        """rerank needs one relevance score per pair: a cross-encoder of several labels is refused in one line."""
        if self.num_labels != 1:
            raise ValueError(
                f"{self.folder}: this cross-encoder has {self.num_labels} labels; rerank needs one relevance score "
                "per pair (use predict for the per-label scores)"
            )
