"""Sentence encoders you can train: a bi-encoder (one Transformer encodes each text alone; texts compare by the
cosine of their pooled vectors), fine-tuned with one of four losses, saved as a sentence-transformers folder.

    enc = SentenceEncoder("minilm", loss="cosent").fit(pairs, scores)      # scored pairs (e.g. STS-B train)
    enc = SentenceEncoder("minilm", loss="mnrl").fit(pairs)                # (anchor, positive[, hard negative])
    enc = SentenceEncoder("minilm", loss="simcse").fit(texts)              # plain text, unsupervised
    enc.encode(["A man plays a guitar ."])      # (n, dim) float32
    enc.evaluate(pairs_dev, scores_dev)         # {"spearman": ..., "pearson": ...} x 100, as SentEval / MTEB
    enc.save("out/")                            # modules.json, 1_Pooling, [2_Normalize], config + weights + tokenizer
    SentenceEncoder("minilm", lora=LoRA(), gradient_checkpointing=True)   # LoRA adapters (peft), less memory

Sentence vector (sentence-transformers' Pooling): u = sum_t m_t h_t / sum_t m_t over every token the attention mask
m keeps, special tokens included ("mean"), or the first token's h ("cls"); then u / ||u|| when `normalize`.
Losses, with c_ij = cos(u_i, v_j) and s = `scale`:
  mnrl    multiple-negatives ranking / InfoNCE with in-batch negatives (Henderson et al. 2017; van den Oord et al.
          2018): L = -1/B sum_i log( exp(s c_ii) / sum_j exp(s c_ij) ), j over every positive of the batch and every
          hard negative when the examples carry a third text. s = 20 (sentence-transformers' default).
  simcse  unsupervised SimCSE (Gao et al. 2021): each text is encoded twice in train mode, so the two copies differ
          only by dropout; the mnrl loss over (copy 1, copy 2) with s = 1 / temperature = 1 / 0.05 = 20.
  cosine  (c_ii - y_i)^2 with y the scores rescaled to [0, 1] by the training scores' range (sentence-transformers'
          CosineSimilarityLoss after dividing STS scores by 5).
  cosent  CoSENT (Su 2022): L = log(1 + sum_{(i,j): y_i > y_j} exp(s (c_jj - c_ii))), s = 20; only the order of
          the scores matters.

With `lora` only LoRA adapters train (models/adapters.py) and `save` writes them in peft's format
(adapter_config.json + adapter_model.safetensors over the base model, with the modules and tokenizer), which
sentence_transformers.SentenceTransformer loads; `ctxrep merge` folds them into a plain folder. Under torchrun each
process embeds its share of a batch's texts and the loss reads every process's vectors (train/distributed.py's
gather_rows), so the in-batch negatives are the whole batch's, as in one process.

The estimator follows scikit-learn's contract like ctxrep.tasks' estimators (`__init__` stores, `fit` returns self,
learned state ends in `_`, get_params / set_params), with `random_state` seeding a local numpy Generator and a
forked torch RNG. `predict(pairs)` gives each pair's cosine and `score(pairs, y)` the Spearman correlation of those
with y (STS evaluation: `ctxrep.vectors.similarity.sts_evaluate`). A text longer than `max_length` pieces is
truncated, in training and encoding alike (sentence-transformers' max_seq_length, saved with the folder).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ctxrep.models.adapters import LoRA, add_lora, has_adapter, save_adapter
from ctxrep.models.loading import PACKAGED_MODELS, LoadedEncoder, load_encoder
from ctxrep.models.sentence_transformers import (
    MODULES_FILE,
    SETTINGS_FILE,
    TRANSFORMER_CONFIG_FILE,
    Module,
    is_sentence_transformers_folder,
    read_sentence_pooling,
    write_modules,
)
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.tasks.base import ParamsProtocol, check_lora, lora_from_json
from ctxrep.tasks.grad_cache import cached_embeddings
from ctxrep.text.inputs import collate, token_budget_batches, words_of
from ctxrep.train import distributed
from ctxrep.train.batches import EpochBatches, batches_per_epoch, epochs_and_steps, shuffled
from ctxrep.train.precision import bf16_autocast
from ctxrep.train.trainer import Trainer, TrainerConfig, seeded_torch
from ctxrep.vectors.similarity import sts_evaluate

LOSSES = ("mnrl", "simcse", "cosine", "cosent")
POOLINGS = ("model", "mean", "cls")
PAIRWISE = ("mnrl", "simcse", "cosent")  # losses that compare the examples of a batch with each other
CONFIG_FILE = "ctxrep_sentence_encoder.json"
ENCODE_TOKENS = 8192  # token budget of one encoding batch (rows x longest)


class PairwiseObjective(torch.nn.Module):
    """A sentence encoder's training objective: the modules it trains, and the loss of a batch of examples (texts
    compared with each other inside the batch), as the Trainer calls it."""

    def __init__(self, trained: torch.nn.Module, batch_loss, batch_tokens=None) -> None:
        super().__init__()
        self.trained = trained
        self.batch_loss = batch_loss
        self._tokens = batch_tokens

    def forward(self, batch: tuple[list, np.ndarray | None]) -> ObjectiveOutput:
        return ObjectiveOutput(self.batch_loss(batch), len(batch[0]))

    def batch_tokens(self, batch) -> int:
        """Tokens of the padded grid that runs with gradients at once (the Trainer's memory estimate)."""
        return self._tokens(batch) if self._tokens is not None else 0


class SentenceEncoder(ParamsProtocol):
    """A trainable bi-encoder; see the module docstring.

    model: encoder name or folder (a Transformer family; "minilm" is sentence-transformers' all-MiniLM-L6-v2).
    loss: "mnrl" (pairs or triplets, no labels), "simcse" (texts, no labels), "cosine" or "cosent" (pairs + scores).
    pooling: "model" (the folder's sentence-transformers Pooling when it has one, else "mean"), "mean" or "cls".
    normalize: L2-normalise the sentence vectors (None: as the folder's modules.json says; False without one).
    scale: s in the mnrl / simcse / cosent losses (20 = 1 / SimCSE's temperature 0.05).
    max_length: pieces per text, special tokens included (longer texts are truncated).
    mini_batch_size: cached in-batch negatives (GradCache, tasks/grad_cache.py): each batch is embedded this many
        texts at a time and the loss back-propagated chunk by chunk, so batch_size sets the negatives and
        mini_batch_size the activation memory; None embeds the whole batch at once.
    max_epochs / max_steps / batch_size / lr / weight_decay / warmup_fraction / max_grad_norm: the training loop
        (linear warm-up then linear decay, AdamW with ctxrep.train.optim's no-decay rule).
    random_state: an int for repeatable fits. device / bf16: where to train and encode, bfloat16 autocast.
    lora: None (every weight trains) or ctxrep.models.adapters.LoRA(rank, alpha, dropout, targets): only LoRA
        adapters on the attention and MLP projections train. gradient_checkpointing: each layer's activations are
        recomputed in backward instead of kept. fsdp: under torchrun, shard weights, gradients and AdamW states.
    """

    _estimator_type = "regressor"  # predict gives a similarity score per pair

    def __init__(
        self,
        model: str = "minilm",
        loss: str = "mnrl",
        pooling: str = "model",
        normalize: bool | None = None,
        scale: float = 20.0,
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
        self.pooling = pooling
        self.normalize = normalize
        self.scale = scale
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

    def _check_params(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        for name in ("max_epochs", "batch_size", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, (int, np.integer)) or self.max_steps < 1):
            raise ValueError(f"max_steps must be a positive integer or None, got {self.max_steps!r}")
        mini = self.mini_batch_size
        if mini is not None and (isinstance(mini, bool) or not isinstance(mini, (int, np.integer)) or mini < 1):
            raise ValueError(f"mini_batch_size must be a positive integer or None, got {mini!r}")
        if mini is not None and mini > self.batch_size:
            raise ValueError(
                f"mini_batch_size={mini} is larger than batch_size={self.batch_size}: it embeds a batch in chunks of "
                "that many texts, so give one at most batch_size (e.g. batch_size=1024, mini_batch_size=32)"
            )
        if self.loss in ("mnrl", "simcse") and self.batch_size < 2:
            raise ValueError(
                f"loss={self.loss!r} uses the other texts of a batch as negatives: batch_size must be >= 2"
            )
        if not self.lr > 0 or not self.scale > 0:
            raise ValueError(f"lr and scale must be positive, got lr={self.lr!r}, scale={self.scale!r}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}")
        rs = self.random_state
        if rs is not None and (isinstance(rs, bool) or not isinstance(rs, (int, np.integer)) or rs < 0):
            raise ValueError(f"random_state must be a non-negative int or None, got {rs!r}")
        check_lora(self.lora)

    # ---- data ----

    def _check_X_y(self, X, y) -> tuple[list[tuple[str, ...]], np.ndarray | None]:
        """Examples as tuples of texts (1 for simcse, 2 for scored pairs, 2 or 3 for mnrl) and scores (or None)."""
        if isinstance(X, str) or not isinstance(X, Sequence | np.ndarray):
            raise TypeError(f"X must be a list of examples, got {type(X).__name__}")
        X = list(X)
        if not X:
            raise ValueError("the training set is empty: fit needs at least one example")
        if self.loss == "simcse":
            for i, x in enumerate(X):
                if not isinstance(x, str):
                    raise ValueError(f"example {i}: loss='simcse' trains on plain texts; got {type(x).__name__}")
            examples = [(x,) for x in X]
        else:
            sizes = (2, 3) if self.loss == "mnrl" else (2,)
            examples = []
            for i, x in enumerate(X):
                if isinstance(x, str) or not isinstance(x, Sequence) or len(x) not in sizes:
                    what = (
                        "(anchor, positive) or (anchor, positive, negative)" if self.loss == "mnrl" else "(text, text)"
                    )
                    raise ValueError(f"example {i}: loss={self.loss!r} takes {what} tuples; got {x!r:.80}")
                if not all(isinstance(t, str) for t in x):
                    raise ValueError(f"example {i}: every element must be a text, got {x!r:.80}")
                examples.append(tuple(x))
            if len({len(e) for e in examples}) > 1:
                raise ValueError("mix of pairs and triplets: give every example a hard negative, or none")
        if self.loss in PAIRWISE and len(examples) < 2:
            raise ValueError(f"loss={self.loss!r} compares the examples of a batch with each other: give at least two")
        for i, e in enumerate(examples):
            for t in e:
                words_of(t, i)  # an empty text is named here
        if self.loss in ("cosine", "cosent"):
            if y is None:
                raise ValueError(f"loss={self.loss!r} trains on scored pairs: give fit(pairs, scores)")
            y = np.asarray(y, dtype=np.float64)
            if y.shape != (len(examples),):
                raise ValueError(f"{len(examples)} pairs but scores of shape {y.shape}; give one score per pair")
            if not np.isfinite(y).all():
                raise ValueError(f"score {int(np.argwhere(~np.isfinite(y))[0, 0])} is not a finite number")
            if y.max() == y.min():
                raise ValueError("every score is the same; the losses learn from differences between scores")
        elif y is not None:
            raise ValueError(f"loss={self.loss!r} needs no labels (y); fit(X) only, or use loss='cosine' / 'cosent'")
        return examples, y

    # ---- fit ----

    def fit(self, X, y=None, eval_set: tuple | None = None) -> SentenceEncoder:
        """Train on X (see `loss`). eval_set=(pairs, scores): the STS Spearman x 100 after every epoch in history_."""
        self._check_params()
        if self.mini_batch_size is not None and distributed.current().enabled:
            raise ValueError(
                "mini_batch_size (cached negatives) back-propagates inside the loss's backward, which DDP and FSDP "
                "cannot share out between processes; under torchrun leave it out (gradient_checkpointing and fsdp "
                "lower the memory instead), or train in one process"
            )
        examples, y = self._check_X_y(X, y)
        seed = int(self.random_state) if self.random_state is not None else secrets.randbelow(2**31)
        rng = np.random.default_rng(seed)
        self.backbone_ = load_encoder(self.model, dtype="fp32")  # float32 master weights to train
        encoder = self.backbone_.model
        if encoder.word_level:
            raise ValueError(
                f"{encoder.family} reads whole words through a biLSTM; a sentence encoder here is a Transformer "
                "saved as a sentence-transformers folder: use a Transformer model"
            )
        self._prepare()
        if self.lora is not None:
            with seeded_torch(seed):
                self._add_lora()
        self._trained_module().to(self.device)
        if y is not None and self.loss == "cosine":
            self.score_range_ = [float(y.min()), float(y.max())]
            y = (y - y.min()) / (y.max() - y.min())  # to [0, 1], the range of useful cosines
        texts = sorted({t for e in examples for t in e})
        inputs = dict(zip(texts, self._inputs(texts)))
        trainer = self._trainer(examples, y, inputs, rng, eval_set)
        with seeded_torch(seed):  # dropout
            trainer.train()
        self.history_ = trainer.epochs
        self.n_epochs_ = len(trainer.epochs)
        return self

    def _trainer(self, examples: list, y: np.ndarray | None, inputs: dict, rng: np.random.Generator, eval_set):
        """The one training loop (ctxrep.train.trainer) over shuffled epochs of the examples: AdamW (fused), linear
        warm-up and decay, the STS evaluation of eval_set after each epoch (dev_spearman, dev_pearson)."""
        # a last batch of one row is left out by the in-batch losses (it has no negatives, or no pair of scores)
        rows, min_rows = int(self.batch_size), 2 if self.loss in PAIRWISE else 1
        _, total = epochs_and_steps(batches_per_epoch(len(examples), rows, min_rows), self.max_epochs, self.max_steps)
        config = TrainerConfig(
            lr=self.lr,
            weight_decay=self.weight_decay,
            eps=1e-8,  # torch's AdamW default
            warmup_steps=int(self.warmup_fraction * total),
            max_steps=total,
            grad_clip=self.max_grad_norm,
            batch_size=rows,
            bf16=bool(self.bf16),
            seed=None,  # the caller's seeded_torch
            device=str(self.device),
            fused=True,
            gradient_checkpointing=bool(self.gradient_checkpointing),
            fsdp=bool(self.fsdp),
        )
        batches = EpochBatches(
            shuffled(len(examples), rows, min_rows),
            lambda batch: ([examples[i] for i in batch], None if y is None else y[batch]),
            rng,
        )
        evaluate = None
        if eval_set is not None:

            def evaluate() -> dict[str, float]:
                return {f"dev_{k}": v for k, v in self.evaluate(*eval_set).items()}

        objective = PairwiseObjective(
            self._trained_module(),
            lambda batch: self._batch_loss(*batch, inputs),
            lambda batch: self._batch_tokens(batch[0], inputs),
        )
        return Trainer(
            objective,
            config,
            batches,
            evaluate=evaluate,
            progress=self.progress,
            desc=type(self).__name__,
            warmup_option="warmup_fraction={fraction:g}",
        )

    def _prepare(self) -> None:
        """What fit and load set up over the loaded backbone: the pooling (a sparse subclass reads its MLM head)."""
        self.pooling_, self.normalize_ = self._resolve_pooling()

    def _trained_module(self) -> torch.nn.Module:
        """Every module fit trains (and moves, clips, switches to train / eval)."""
        return self.backbone_.model

    def _add_lora(self) -> None:
        """LoRA adapters on the encoder (the rest of it frozen)."""
        add_lora(self.backbone_.model, self.lora)

    def _resolve_pooling(self) -> tuple[str, bool]:
        """("mean" or "cls", normalise?) from `pooling`, `normalize` and the model folder's modules.json."""
        folder = self.backbone_.source.folder
        from_folder = None
        if is_sentence_transformers_folder(folder):
            from_folder = read_sentence_pooling(folder)
        pooling, normalize = self.pooling, self.normalize
        if pooling == "model":
            if from_folder is None:
                pooling = "mean"
            elif from_folder.modes in (("mean",), ("cls",)):
                pooling = from_folder.modes[0]
            else:
                raise ValueError(
                    f"{folder}: its Pooling concatenates {', '.join(from_folder.modes)}; SentenceEncoder trains 'mean' "
                    "or 'cls' pooling: give pooling='mean' or 'cls'"
                )
        if normalize is None:
            normalize = bool(from_folder.normalize) if from_folder is not None else False
        if pooling == "cls" and self.backbone_.tokenizer.template.cls_index != 0:
            raise ValueError(
                f"{self.backbone_.model.family} puts its classification token at the end; sentence-transformers' cls "
                "pooling reads the first token: use pooling='mean'"
            )
        return pooling, bool(normalize)

    def _inputs(self, texts: list[str]) -> list:
        """One EncoderInput per text, cut to max_length pieces (special tokens included)."""
        from ctxrep.text.inputs import WindowPlan

        tokenizer = self.backbone_.tokenizer
        limit = min(int(self.max_length), self.backbone_.model.max_tokens)
        plan = WindowPlan(tokenizer, limit)
        pieces = tokenizer.encode_words([words_of(t, i) for i, t in enumerate(texts)])
        return [plan.truncated(i, p) for i, p in enumerate(pieces)]

    def _vectors(self, records: list) -> torch.Tensor:
        """Pooled (and normalised) sentence vectors (batch, hidden) of EncoderInputs, with gradients when training."""
        batch = {k: v.to(self.device) for k, v in collate(records, self.backbone_.tokenizer).items()}
        with bf16_autocast(torch.device(self.device).type, bool(self.bf16)):
            h = self.backbone_.model.encode(batch).last_hidden_state  # (batch, seq, hidden)
        h = h.float()
        if self.pooling_ == "cls":
            u = h[:, 0]
        else:
            mask = batch["attention_mask"].to(h.dtype).unsqueeze(-1)  # (batch, seq, 1)
            u = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # sentence-transformers' mean over kept tokens
        return F.normalize(u, dim=-1) if self.normalize_ else u

    def _batch_loss(self, batch: list[tuple[str, ...]], scores: np.ndarray | None, inputs: dict) -> torch.Tensor:
        columns = list(zip(*batch))  # one tuple of texts per column: anchors, positives[, negatives]
        if self.loss == "simcse":
            columns = [columns[0], columns[0]]  # the same texts twice; dropout makes the two views differ
        flat = [inputs[t] for col in columns for t in col]
        ctx = distributed.current()
        if ctx.enabled:  # this process's share of the texts; gather_rows puts every process's vectors together
            flat = flat[ctx.rank * len(flat) // ctx.world_size : (ctx.rank + 1) * len(flat) // ctx.world_size]
        if self.mini_batch_size is not None:  # cached in-batch negatives: tasks/grad_cache.py
            vectors = cached_embeddings(self._vectors, flat, int(self.mini_batch_size))
        else:
            vectors = self._vectors(flat)
        vectors = distributed.gather_rows(vectors)
        return self._loss_from_vectors(list(vectors.split(len(batch))), scores)

    def _batch_tokens(self, batch: list[tuple[str, ...]], inputs: dict) -> int:
        """The padded grid embedded with gradients at once: every text of the batch (SimCSE's twice), or a
        mini_batch_size chunk of them, times the longest text's pieces."""
        texts = [t for example in batch for t in example] * (2 if self.loss == "simcse" else 1)
        longest = max(len(inputs[t]) for t in texts)
        return min(len(texts), int(self.mini_batch_size or len(texts))) * longest

    def _loss_from_vectors(self, vectors: list[torch.Tensor], scores: np.ndarray | None) -> torch.Tensor:
        """The loss of one batch from its columns' sentence vectors, one (B, hidden) per column (anchors, positives
        [, negatives]; SimCSE's two views), and its scores (cosine, cosent)."""
        if self.loss in ("mnrl", "simcse"):
            a = F.normalize(vectors[0], dim=-1)
            candidates = F.normalize(torch.cat(vectors[1:]), dim=-1)  # (B or 2B, hidden): positives, then negatives
            logits = self.scale * a @ candidates.T  # (B, B or 2B)
            return F.cross_entropy(logits, torch.arange(len(a), device=logits.device))
        cos = F.cosine_similarity(vectors[0], vectors[1], dim=-1)  # (B,)
        target = torch.as_tensor(scores, dtype=cos.dtype, device=cos.device)
        if self.loss == "cosine":
            return F.mse_loss(cos, target)
        # cosent: log(1 + sum over pairs (i, j) with y_i > y_j of exp(s (c_j - c_i)))
        diff = self.scale * (cos[None, :] - cos[:, None])  # (B, B): s (c_j - c_i)
        diff = diff.masked_fill(~(target[:, None] > target[None, :]), -1e12)
        return torch.logsumexp(torch.cat([torch.zeros(1, device=diff.device), diff.flatten()]), dim=0)

    # ---- use ----

    def _check_fitted(self) -> None:
        if not hasattr(self, "backbone_"):
            raise ValueError(
                "this SentenceEncoder is not fitted yet: call fit first (or SentenceEncoder.load a folder)"
            )

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dim) float32 sentence vectors: length-sorted batches under a token budget, in input order."""
        self._check_fitted()
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list: [text]")
        texts = list(texts)
        dim = self.backbone_.model.hidden_size
        if not texts:
            return np.zeros((0, dim), np.float32)
        out = np.zeros((len(texts), dim), np.float32)
        for rows, vectors in self._encoded_batches(texts):
            out[rows] = vectors.cpu().numpy()
        return out

    def _encoded_batches(self, texts: list[str]):
        """(row numbers, their vectors) of length-sorted batches under a token budget, in inference mode."""
        records = self._inputs(texts)
        order = sorted(range(len(records)), key=lambda i: len(records[i]))
        self._trained_module().eval()
        with torch.inference_mode():
            start = 0
            for size in token_budget_batches([len(records[i]) for i in order], ENCODE_TOKENS):
                rows = order[start : start + size]
                start += size
                yield rows, self._vectors([records[i] for i in rows])

    def predict(self, X) -> np.ndarray:
        """The cosine similarity of each (text, text) pair."""
        a, b = _pairs(X)
        return self._pair_scores(self.encode(a), self.encode(b))

    def _pair_scores(self, u, v) -> np.ndarray:
        """Row i's score of two batches of vectors: the cosine (a sparse subclass: the dot product)."""
        from ctxrep.vectors.similarity import similarity

        return similarity(u, v, pairwise=True)

    def _dense_vectors(self, texts: list[str]) -> np.ndarray:
        """(n, dim) array of vectors for STS evaluation (a sparse subclass densifies its rows)."""
        return self.encode(texts)

    def evaluate(self, X, y) -> dict[str, float]:
        """STS evaluation (SentEval / MTEB): Spearman and Pearson x 100 of the pairs' cosines against the scores."""
        self._check_fitted()
        a, b = _pairs(X)
        return sts_evaluate(self._dense_vectors, a, b, y)

    def score(self, X, y) -> float:
        """Spearman correlation of the pairs' cosines with y (in [-1, 1], as scikit-learn's scores)."""
        return self.evaluate(X, y)["spearman"] / 100

    # ---- save / load ----

    def save(self, path: str | os.PathLike) -> Path:
        """Write a sentence-transformers folder: config.json + model.safetensors + tokenizer files, modules.json,
        1_Pooling/config.json, 2_Normalize (when normalising), sentence_bert_config.json, and ctxrep's own
        parameters (ctxrep_sentence_encoder.json)."""
        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        encoder = self.backbone_.model
        self._save_weights(path)
        source = self.backbone_.source.folder
        for file in source.iterdir():  # the tokenizer's files, whatever the family calls them (vocab.txt, spm.model)
            if file.is_file() and _is_tokenizer_file(file.name) and file.resolve() != (path / file.name).resolve():
                shutil.copyfile(file, path / file.name)
        limit = min(int(self.max_length), encoder.max_tokens)
        write_modules(path, self._modules(limit), self._settings())
        params = self.get_params()
        params["model"] = str(params["model"])
        params["lora"] = dataclasses.asdict(self.lora) if self.lora is not None else None
        state = {"pooling": self.pooling_, "normalize": self.normalize_, "history": getattr(self, "history_", [])}
        _write_json(path / CONFIG_FILE, {"estimator": type(self).__name__, "params": params, "state": state})
        return path

    def _save_weights(self, path: Path) -> None:
        """config.json + the encoder's weights (a sparse subclass adds its MLM head); with LoRA adapters, the adapter
        alone over the base model (adapter_config.json + adapter_model.safetensors)."""
        encoder = self.backbone_.model
        if has_adapter(encoder):
            save_adapter(encoder, path, base=self._base_name())
            return
        if not hasattr(encoder, "save_pretrained"):
            raise ValueError(f"a {encoder.family} model cannot be saved as a Hugging Face folder")
        encoder.save_pretrained(path)

    def _base_name(self) -> str:
        """The base model as peft and sentence-transformers load it (base_model_name_or_path): a Hub name as given,
        a folder (a packaged model's too) by its absolute path."""
        if str(self.model) in PACKAGED_MODELS or Path(str(self.model)).expanduser().is_dir():
            return str(self.backbone_.source.folder.resolve())
        return str(self.model)

    def _modules(self, max_seq_length: int) -> list[Module]:
        """The folder's modules: Transformer (this folder), Pooling (mean or cls) and Normalize when normalising."""
        st = "sentence_transformers.models."
        pooling = {
            "word_embedding_dimension": self.backbone_.model.hidden_size,
            "pooling_mode_cls_token": self.pooling_ == "cls",
            "pooling_mode_mean_tokens": self.pooling_ == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        }
        modules = [
            Module(st + "Transformer", "", {"max_seq_length": max_seq_length, "do_lower_case": False}),
            Module(st + "Pooling", "1_Pooling", pooling),
        ]
        return modules + ([Module(st + "Normalize", "2_Normalize")] if self.normalize_ else [])

    def _settings(self) -> dict:
        """config_sentence_transformers.json: how sentence-transformers compares the vectors; no prompts."""
        return {"similarity_fn_name": "cosine", "prompts": {}}

    @classmethod
    def load(cls, path: str | os.PathLike, **params) -> SentenceEncoder:
        """A fitted SentenceEncoder over a sentence-transformers folder (one `save` wrote, or any with Transformer +
        mean/cls Pooling [+ Normalize]); further training starts from it. `params` override the saved ones."""
        path = Path(path)
        saved: dict = {}
        if (path / CONFIG_FILE).is_file():
            config = json.loads((path / CONFIG_FILE).read_text())
            if config.get("estimator", cls.__name__) != cls.__name__:  # e.g. a SparseSentenceEncoder's folder
                raise ValueError(
                    f"{path}: saved by ctxrep's {config['estimator']}; load it with {config['estimator']}.load"
                )
            saved = config.get("params", {})
            if saved.get("lora") is not None:
                saved["lora"] = lora_from_json(saved["lora"])
        saved.update(params)
        saved.update(model=str(path), pooling="model", normalize=None)  # the folder is the model now
        est = cls(**{k: v for k, v in saved.items() if k in cls._get_param_names()})
        est._check_params()
        est.backbone_ = load_encoder(path, dtype="fp32")  # the float32 weights it was trained in
        est._prepare()
        est._trained_module().to(est.device).eval()
        est.history_ = []
        return est

    @property
    def loaded_encoder_(self) -> LoadedEncoder:
        """The (fine-tuned) encoder with its tokenizer, e.g. for ctxrep.Featurizer(enc.loaded_encoder_)."""
        self._check_fitted()
        return self.backbone_


# Files of a model folder that are not the tokenizer's: weights, configs, sentence-transformers' modules, notes.
def choose_loss(loss: str | None, data) -> str:
    """The loss a file of examples trains with (data: ctxrep.data.sentence_pairs' SentenceData): `loss` when it can
    read the examples, else a one-line error naming the loss that reads them. None: cosent for scored pairs, mnrl
    for pairs or triplets, simcse for single texts, refused when the file has other columns that were not read (a
    file of pairs is never trained as single texts without being told)."""
    texts = len(data.X[0])
    scored = data.y is not None
    shown = f" ({', '.join(map(repr, data.unread))})" if data.unread else ""
    if loss is None:
        if scored:
            loss = "cosent"
        elif texts > 1:
            loss = "mnrl"
        elif data.unread:
            raise ValueError(
                f"{data.source}: only one text column is read, but the file has other columns{shown}; to train on "
                "pairs name the second text with --text-pair-column (mnrl reads pairs; cosine / cosent read scored "
                "pairs with --score-column); to train SimCSE on the one column alone give --loss simcse"
            )
        else:
            loss = "simcse"
    if loss == "simcse" and texts > 1:
        raise ValueError(
            f"{data.source}: --loss simcse reads one text per example, but {texts} text columns are read; pairs train "
            "with --loss mnrl (or cosine / cosent with --score-column); for SimCSE read one column (--text-column)"
        )
    if loss in ("cosine", "cosent") and not (scored and texts == 2):
        raise ValueError(
            f"{data.source}: --loss {loss} reads scored pairs: two text columns (--text-column, --text-pair-column) "
            "and --score-column (or --format sts)"
        )
    if loss == "mnrl" and texts == 1:
        raise ValueError(
            f"{data.source}: --loss mnrl reads pairs (anchor, positive); name the second text with --text-pair-column, "
            "or train SimCSE on single texts (--loss simcse)"
        )
    return loss


def evaluate_file(
    model: str | os.PathLike, path: str | os.PathLike, device: str = "cpu", **reading
) -> dict[str, float]:
    """STS evaluation of a saved sentence encoder (a sentence-transformers folder) on a file of scored pairs in any
    layout (ctxrep.data.sentence_pairs.read_scored_pairs; `reading`: its columns, score_column, format, header,
    limit): Spearman and Pearson x 100 and the number of pairs."""
    from ctxrep.data.sentence_pairs import read_scored_pairs

    data = read_scored_pairs(path, **reading)
    return SentenceEncoder.load(model, device=device).evaluate(data.X, data.y)


NOT_TOKENIZER = {
    "config.json",
    MODULES_FILE,
    TRANSFORMER_CONFIG_FILE,
    SETTINGS_FILE,
    "generation_config.json",
    "README.md",
    CONFIG_FILE,
}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".hdf5", ".msgpack", ".onnx", ".pt", ".ckpt", ".index")


def _is_tokenizer_file(name: str) -> bool:
    return name not in NOT_TOKENIZER and not name.endswith(WEIGHT_SUFFIXES) and not name.startswith(".")


def _pairs(X) -> tuple[list[str], list[str]]:
    pairs = list(X)
    for i, p in enumerate(pairs):
        if isinstance(p, str) or len(p) != 2 or not all(isinstance(t, str) for t in p):
            raise ValueError(f"example {i}: expected a (text, text) pair, got {p!r:.80}")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _write_json(file: Path, obj) -> None:
    file.write_text(json.dumps(obj, indent=2) + "\n")
