"""A sparse sentence encoder you can train: SPLADE (Formal et al. 2021) on SentenceEncoder's loop, saved as a
sentence-transformers SparseEncoder folder (MLMTransformer + SpladePooling).

    enc = SparseSentenceEncoder("naver/splade-v3").fit(pairs)   # (query, document[, hard negative]) tuples
    enc.encode(texts)          # scipy.sparse.csr_matrix (n, vocabulary), float32
    enc.save("out/")           # sentence_transformers.SparseEncoder("out/") and ctxrep.vectors.sparse.SparseEncoder

Vector: w = max_t log(1 + ReLU(MLM logits_t)) over the text's tokens (padding left out), as SpladePooling("max").
Loss (sentence-transformers' SpladeLoss over SparseMultipleNegativesRankingLoss, default settings):
  L = -1/B sum_i log( exp(s q_i.d_i) / sum_j exp(s q_i.d_j) )          in-batch negatives, dot product, s = 1
      + lambda_q FLOPS(q) + lambda_d FLOPS(d)                           lambda_q = 5e-5, lambda_d = 3e-5
with d every positive and hard negative of the batch and FLOPS(w) = sum_j (mean_i w_ij)^2 (Paria et al. 2020), the
squared mean weight of each vocabulary id over the batch: it pushes every id towards zero in most texts.
The MLM head (its dense layer, LayerNorm and bias; the decoder is the tied word embedding matrix) trains with the
encoder. BERT and RoBERTa networks with their MLM head (a *ForMaskedLM folder) are the starting points.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ctxrep.models.adapters import LoRA, has_adapter, save_adapter
from ctxrep.models.folders import write_folder
from ctxrep.models.mlm_head import head_prefix, head_tensors, read_mlm_head
from ctxrep.models.sentence_transformers import Module
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.text.inputs import collate
from ctxrep.train.precision import bf16_autocast

__all__ = ["SparseSentenceEncoder", "flops"]

# the model types whose MLM head ctxrep reads and writes, and the transformers class of the saved folder
MASKED_LM_ARCHITECTURES = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}


def flops(weights: torch.Tensor) -> torch.Tensor:
    """FLOPS regulariser (Paria et al. 2020): sum_j (1/n sum_i w_ij)^2 over a (n, vocabulary) batch of weights."""
    return weights.mean(dim=0).square().sum()


class SparseSentenceEncoder(SentenceEncoder):
    """A trainable SPLADE encoder; see the module docstring. Parameters as SentenceEncoder's, except:

    loss: "mnrl" only (pairs or triplets; SPLADE's ranking part). scale: s on the dot products (1, as
    sentence-transformers' sparse ranking loss). query_regularizer_weight / document_regularizer_weight: lambda_q
    and lambda_d of the FLOPS terms (sentence-transformers' SpladeLoss settings; 0 turns one off).
    """

    _estimator_type = "regressor"

    def __init__(
        self,
        model: str = "google-bert/bert-base-uncased",
        loss: str = "mnrl",
        scale: float = 1.0,
        query_regularizer_weight: float = 5e-5,
        document_regularizer_weight: float = 3e-5,
        max_length: int = 128,
        max_epochs: int = 1,
        max_steps: int | None = None,
        batch_size: int = 32,
        mini_batch_size: int | None = None,
        lr: float = 2e-5,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.1,
        max_grad_norm: float = 1.0,
        random_state: int | None = None,
        device: str = "cpu",
        bf16: bool = False,
        progress: bool = False,
        lora: LoRA | None = None,
        gradient_checkpointing: bool = False,
        fsdp: bool = False,
    ) -> None:
        self.model = model
        self.loss = loss
        self.scale = scale
        self.query_regularizer_weight = query_regularizer_weight
        self.document_regularizer_weight = document_regularizer_weight
        self.max_length = max_length
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.batch_size = batch_size
        self.mini_batch_size = mini_batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_fraction = warmup_fraction
        self.max_grad_norm = max_grad_norm
        self.random_state = random_state
        self.device = device
        self.bf16 = bf16
        self.progress = progress
        self.lora = lora
        self.gradient_checkpointing = gradient_checkpointing
        self.fsdp = fsdp

    # the base class's pooling parameters have one answer here
    pooling = "model"
    normalize = False

    def _check_params(self) -> None:
        if self.loss != "mnrl":
            raise ValueError(
                f"SparseSentenceEncoder trains SPLADE's in-batch ranking loss: loss must be 'mnrl', got {self.loss!r}"
            )
        for name in ("query_regularizer_weight", "document_regularizer_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        super()._check_params()

    # ---- the hooks of SentenceEncoder's loop ----

    def _prepare(self) -> None:
        """The MLM head over the loaded encoder (trainable; its decoder is the encoder's word embeddings)."""
        encoder = self.backbone_.model
        folder = self.backbone_.source.folder
        model_type = getattr(getattr(encoder, "config", None), "model_type", None)
        if model_type not in MASKED_LM_ARCHITECTURES:
            raise ValueError(
                f"{folder}: a {encoder.family} model; SPLADE training reads and writes the MLM head of "
                f"{' or '.join(MASKED_LM_ARCHITECTURES)} networks: start from a *ForMaskedLM folder of those"
            )
        head = read_mlm_head(folder, encoder)
        if head is None:
            raise ValueError(
                f"{folder}: no masked-LM head (cls.predictions.* / lm_head.*); SPLADE's vectors are MLM logits: start "
                "from a *ForMaskedLM folder (e.g. google-bert/bert-base-uncased) or a SPLADE checkpoint"
            )
        self.head_ = head.requires_grad_(True)  # read_mlm_head freezes it, the tied embeddings with it
        encoder.requires_grad_(True)
        self.pooling_, self.normalize_ = "splade-max", False

    def _trained_module(self) -> torch.nn.Module:
        return torch.nn.ModuleDict({"encoder": self.backbone_.model, "head": self.head_})

    def _add_lora(self) -> None:
        """LoRA adapters on the encoder; the MLM head stays the base model's (frozen), so that the adapter alone
        over the *ForMaskedLM base is the whole model."""
        super()._add_lora()
        self.head_.requires_grad_(False)

    def _vectors(self, records: list) -> torch.Tensor:
        """SPLADE vectors (batch, vocabulary): max over kept tokens of log(1 + ReLU(MLM logits))."""
        batch = {k: v.to(self.device) for k, v in collate(records, self.backbone_.tokenizer).items()}
        with bf16_autocast(torch.device(self.device).type, bool(self.bf16)):
            h = self.backbone_.model.encode(batch).last_hidden_state  # (batch, seq, hidden)
            logits = self.head_(h)  # (batch, seq, vocabulary)
        w = torch.log1p(torch.relu(logits.float()))
        mask = batch["attention_mask"].to(w.dtype).unsqueeze(-1)  # (batch, seq, 1)
        return (w * mask).amax(dim=1)  # weights are >= 0, so padding's 0 never wins

    def _loss_from_vectors(self, vectors: list[torch.Tensor], scores: np.ndarray | None) -> torch.Tensor:
        """Ranking loss with in-batch negatives on dot products, plus the queries' and documents' FLOPS terms."""
        queries, documents = vectors[0], torch.cat(vectors[1:])  # (B, V), (B or 2B, V)
        logits = self.scale * queries @ documents.T  # (B, B or 2B)
        ranking = F.cross_entropy(logits, torch.arange(len(queries), device=logits.device))
        return (
            ranking
            + self.query_regularizer_weight * flops(queries)
            + self.document_regularizer_weight * flops(documents)
        )

    # ---- use ----

    def encode(self, texts):
        """(n, vocabulary) scipy.sparse.csr_matrix of float32 SPLADE weights, in input order."""
        import scipy.sparse

        self._check_fitted()
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list: [text]")
        texts = list(texts)
        vocab = int(self.head_.bias.shape[0])
        rows, parts = [], []
        for batch_rows, vectors in self._encoded_batches(texts):
            rows.extend(batch_rows)
            parts.append(scipy.sparse.csr_matrix(vectors.float().cpu().numpy()))
        if not parts:
            return scipy.sparse.csr_matrix((0, vocab), dtype=np.float32)
        stacked = scipy.sparse.vstack(parts, format="csr", dtype=np.float32)
        return stacked[np.argsort(rows)]  # back to input order

    def _pair_scores(self, u, v) -> np.ndarray:
        """The dot product of each pair's sparse vectors (sentence-transformers' SparseEncoder similarity)."""
        return np.asarray(u.multiply(v).sum(axis=1), np.float32).ravel()

    def _dense_vectors(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts).toarray()  # STS evaluation: the cosine of the pairs' sparse vectors

    def active_dims(self, texts) -> float:
        """The mean number of non-zero weights per text (what FLOPS regularisation lowers)."""
        return float(self.encode(texts).getnnz(axis=1).mean())

    # ---- save ----

    def _save_weights(self, path: Path) -> None:
        """A *ForMaskedLM folder: the encoder under '<model_type>.', the head under transformers' names."""
        from ctxrep.objectives.masked_lm import prefixed_encoder_tensors

        encoder = self.backbone_.model
        model_type = encoder.config.model_type
        if has_adapter(encoder):  # over the *ForMaskedLM base, which holds the encoder under "<model_type>."
            save_adapter(encoder, path, base=self._base_name(), prefix=model_type + ".")
            return
        tensors = prefixed_encoder_tensors(encoder)
        tensors |= head_tensors(self.head_, head_prefix(model_type), model_type)
        tensors = {k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}
        config = encoder.config.to_hf_dict() | {"architectures": [MASKED_LM_ARCHITECTURES[model_type]]}
        write_folder(path, config, tensors)

    def _modules(self, max_seq_length: int) -> list[Module]:
        """A SparseEncoder's modules: MLMTransformer (this folder, a fill-mask model) and SpladePooling (max, relu)."""
        st = "sentence_transformers.sparse_encoder.modules."
        transformer = {"max_seq_length": max_seq_length, "do_lower_case": False, "transformer_task": "fill-mask"}
        pooling = {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": None}
        return [
            Module(st + "mlm_transformer.MLMTransformer", "", transformer),
            Module(st + "splade_pooling.SpladePooling", "1_SpladePooling", pooling),
        ]

    def _settings(self) -> dict:
        """config_sentence_transformers.json: sentence-transformers loads the folder as a SparseEncoder (dot product)."""
        return {"model_type": "SparseEncoder", "similarity_fn_name": "dot", "prompts": {}}
