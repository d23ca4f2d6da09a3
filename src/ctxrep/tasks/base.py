"""One training loop for every task model: batching, AdamW, schedules, ULMFiT options, early stopping.

A task estimator follows scikit-learn's contract (`__init__` stores its arguments, `fit` returns self,
learned state ends in `_`). Subclasses only say how to read their data, build their head and batches,
and turn outputs into predictions:

    _check_X_y(X, y)          -> normalised X, y (errors name the bad example)
    _learn_targets(y)         set classes_ etc. from the training labels
    _make_head(in_dim)        the task head (an nn.Module)
    _examples(X, y)           list of examples (one input may give several windows)
    _collate(examples)        dict of tensors for one batch
    _head_loss(logits, batch) the loss
    _decode(X, examples, logits) -> predictions for X
    score(X, y)

Two modes share the head:
  finetune  encoder pieces -> (batch, pieces, hidden) from the encoder's top layer; encoder and head trained;
            ELMo ("elmo:DIR"): words -> the biLM's layers under a trainable ScalarMix (Peters et al. 2018, eq. 1);
  frozen    word vectors of every layer from ctxrep.Featurizer (cached on disk, keyed by a content hash)
            -> ScalarMix (gamma * sum_j softmax(s)_j h_j) -> BiLSTM or nothing ("linear") -> head.

Schedules (ctxrep.train.schedules):
  linear     lr_t = lr * t / w for t < w (warm-up), then lr * (T - t) / (T - w)
  slanted    ULMFiT (Howard & Ruder 2018, eq. 3): cut = floor(T * cut_frac),
             p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1)),
             lr_t = lr * (1 + p * (ratio - 1)) / ratio, with cut_frac = 0.1 and ratio = 32.
Discriminative fine-tuning: encoder layer l (0 = embeddings, L = top) gets lr / factor^(L - l); the head gets lr.
Gradual unfreezing: epoch 0 trains the head only; each later epoch unfreezes the next encoder layer down.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ctxrep.featurize import uses_segments
from ctxrep.models.loading import elmo_folder, load_model, resolve_model_path, write_safetensors
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.train.schedules import slanted_triangular, warmup_decay

logger = logging.getLogger(__name__)

MODES = ("finetune", "frozen")
FROZEN_HEADS = ("bilstm", "linear")
WORD_POOLINGS = ("first", "mean")
IGNORE = -100  # label of positions that carry no loss


# ---- learning-rate schedules ------------------------------------------------------------------------


# ---- the network: representation + head ---------------------------------------------------------------


class Representation(nn.Module):
    """Vectors for the units of each batch row: subword pieces (finetune) or words (frozen).

    finetune: batch["input_ids"], ["attention_mask"], ["token_type_ids"] -> encoder top layer;
              ELMo: batch["char_ids"] -> ctxrep.models.elmo.Elmo (a ScalarMix over the biLM's layers).
    frozen:   batch["features"] (batch, words, layers, dim), batch["mask"] -> ScalarMix -> BiLSTM (or not).
    """

    def __init__(
        self,
        mode: str,
        encoder: nn.Module | None = None,
        num_layers: int = 0,
        dim: int = 0,
        frozen_head: str = "bilstm",
        lstm_size: int = 256,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.mode = mode
        self.dropout = nn.Dropout(dropout)
        if mode == "finetune":
            self.encoder = encoder
            self.out_dim = encoder.hidden_size
        else:
            self.mix = ScalarMix(num_layers)
            self.lstm = (
                nn.LSTM(dim, lstm_size, batch_first=True, bidirectional=True) if frozen_head == "bilstm" else None
            )
            self.out_dim = 2 * lstm_size if self.lstm is not None else dim

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.mode == "finetune":
            if "char_ids" in batch:  # ELMo: one unit per word
                return self.dropout(self.encoder(batch["char_ids"]).representations[0])  # (batch, words, hidden)
            types = batch["token_type_ids"] if uses_segments(self.encoder) else None
            out = self.encoder(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=types)
            return self.dropout(out.last_hidden_state)  # (batch, pieces, hidden)
        features = batch["features"].permute(2, 0, 1, 3)  # (layers, batch, words, dim)
        x = self.dropout(self.mix(features, mask=batch["mask"]))  # (batch, words, dim)
        if self.lstm is None:
            return x
        lengths = batch["mask"].sum(dim=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return self.dropout(out)  # (batch, words, 2 * lstm_size)


class TaskNetwork(nn.Module):
    """The representation and a task head; forward returns the head's logits."""

    def __init__(self, representation: Representation, head: nn.Module) -> None:
        super().__init__()
        self.representation = representation
        self.head = head

    def forward(self, batch: dict[str, torch.Tensor]):
        return self.head(self.representation(batch), batch)


BLOCK_LISTS = ("layers", "layer", "h", "forward_layers", "backward_layers")  # BERT, XLNet, GPT-2, ELMo
ABOVE_BLOCKS = ("pooler", "ln_f", "scalar_mixes")  # BERT's pooler, GPT-2's final LayerNorm, ELMo's mixes


def encoder_layer_of(encoder: nn.Module) -> dict[str, int]:
    """Depth of every encoder parameter: 0 = embeddings (or ELMo's char CNN), l = layer l, L = the top layer
    (and what sits above it: a pooler, a final LayerNorm, ELMo's scalar mixes)."""
    num_layers = encoder.num_layers
    depth = {}
    for name, _ in encoder.named_parameters():
        parts = name.removeprefix("bilm.").split(".")  # ctxrep.models.elmo.Elmo wraps the biLM
        if parts[0] in BLOCK_LISTS and parts[1].isdigit():
            depth[name] = int(parts[1]) + 1
        elif parts[0] in ABOVE_BLOCKS:
            depth[name] = num_layers
        else:
            depth[name] = 0
    return depth


def _no_decay(name: str, param: nn.Parameter) -> bool:
    return param.ndim < 2 or "norm" in name.lower() or "scalar_parameters" in name or name.endswith("gamma")


# ---- frozen-feature cache ---------------------------------------------------------------------------------


def _model_identity(model: str) -> dict:
    """What identifies a model's weights: its folder plus the size and mtime of its files."""
    folder = elmo_folder(model) or resolve_model_path(model)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {"path": str(folder.resolve()), "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]}


def default_cache_dir() -> Path:
    return Path(os.environ.get("CTXREP_CACHE", Path.home() / ".cache" / "ctxrep")) / "features"


@dataclass
class FeatureStore:
    """Word vectors of every layer for a list of texts, memory-mapped from a cache folder."""

    features: np.ndarray  # (total words, layers, dim) float32, memory-mapped
    offsets: np.ndarray  # (texts + 1,) start of each text's words
    folder: Path
    hit: bool  # True when read from the cache without running the encoder

    def __getitem__(self, i: int) -> np.ndarray:
        return self.features[self.offsets[i] : self.offsets[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1


def cached_features(
    model: str,
    texts: Sequence[Sequence[str]],
    pairs: Sequence[Sequence[str]] | None,
    pooling: str,
    cache_dir: str | os.PathLike | None,
    progress: bool = False,
    chunk: int = 1024,
) -> FeatureStore:
    """Featurize (texts[, pairs]) with layers="all" once; later calls with the same content read the cache.

    The folder name is a SHA-256 of the model identity, the layer choice, the pooling and every word.
    Files: features.npy (words, layers, dim), offsets.npy, meta.json (written last, so a half-written
    folder is never read).
    """
    h = hashlib.sha256()
    h.update(json.dumps({"model": _model_identity(model), "layers": "all", "pooling": pooling}).encode())
    for i, words in enumerate(texts):
        h.update("\x1f".join(words).encode() + b"\x1e")
        if pairs is not None:
            h.update(b"\x1d" + "\x1f".join(pairs[i]).encode() + b"\x1e")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = folder / h.hexdigest()[:32]
    if (folder / "meta.json").is_file():
        features = np.load(folder / "features.npy", mmap_mode="r", allow_pickle=False)
        offsets = np.load(folder / "offsets.npy", allow_pickle=False)
        logger.info("frozen features: cache hit %s", folder)
        return FeatureStore(features, offsets, folder, hit=True)

    from ctxrep.featurize import Featurizer

    featurizer = Featurizer(model, layers="all", pooling=pooling, progress=False)
    counts = [len(t) + (len(pairs[i]) if pairs is not None else 0) for i, t in enumerate(texts)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    n_layers = featurizer.num_layers + 1
    features = np.lib.format.open_memmap(
        folder / "features.npy", mode="w+", dtype=np.float32, shape=(int(offsets[-1]), n_layers, featurizer.dim)
    )
    bar = tqdm(total=len(texts), unit="text", desc="featurize", disable=not progress)
    for start in range(0, len(texts), chunk):
        part = list(texts[start : start + chunk])
        part_pairs = list(pairs[start : start + chunk]) if pairs is not None else None
        for k, array in enumerate(featurizer.embed_words(part, part_pairs)):
            features[offsets[start + k] : offsets[start + k + 1]] = array
        bar.update(len(part))
    bar.close()
    features.flush()
    np.save(folder / "offsets.npy", offsets, allow_pickle=False)
    meta = {"model": str(model), "layers": "all", "pooling": pooling, "texts": len(texts), "pairs": pairs is not None}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    del features
    return FeatureStore(np.load(folder / "features.npy", mmap_mode="r"), offsets, folder, hit=False)


# ---- the estimator base class -------------------------------------------------------------------------------


class TaskEstimator:
    """Shared parameters and the training loop; see the module docstring for what subclasses provide.

    model: encoder name or folder ("minilm", a Hugging Face folder, "elmo:DIR" in frozen mode).
    mode: "finetune" (encoder + head trained) or "frozen" (ScalarMix + BiLSTM/linear head on cached features).
    validation_fraction: share of the training data held out to pick the best epoch (with early_stopping).
    early_stopping / n_iter_no_change / tol: stop when the held-out score has not improved by tol for
        n_iter_no_change epochs; the best epoch's weights are kept.
    warm_start: a second `fit` continues from the learned weights (same labels) instead of starting over.
    warmup_fraction: share of steps of linear warm-up (linear schedule); slanted_triangular: ULMFiT's schedule.
    discriminative_lr / discriminative_lr_factor: layer l gets lr / factor^(L - l) (finetune only).
    gradual_unfreezing: unfreeze one encoder layer per epoch from the top (finetune only).
    """

    def _check_common(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.frozen_head not in FROZEN_HEADS:
            raise ValueError(f"frozen_head must be one of {FROZEN_HEADS}, got {self.frozen_head!r}")
        for name in ("max_epochs", "batch_size", "n_iter_no_change"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be positive (or None for the mode's default), got {self.lr!r}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        if self.early_stopping and self.validation_fraction == 0:
            raise ValueError("early_stopping needs held-out data: set validation_fraction > 0 (e.g. 0.1)")
        if self.mode == "frozen" and (self.discriminative_lr or self.gradual_unfreezing):
            raise ValueError(
                "discriminative_lr and gradual_unfreezing change how the encoder is trained; in mode='frozen' the "
                "encoder is not trained: use mode='finetune' or switch them off"
            )
        if self.discriminative_lr and not self.discriminative_lr_factor > 0:
            raise ValueError(f"discriminative_lr_factor must be positive, got {self.discriminative_lr_factor!r}")

    # ---- scikit-learn's parameter protocol (no scikit-learn import needed) ----

    @classmethod
    def _get_param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return sorted(p.name for p in signature.parameters.values() if p.name != "self")

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params) -> "TaskEstimator":
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {name!r}; valid parameters: {valid}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        signature = inspect.signature(type(self).__init__)
        changed = [
            f"{n}={getattr(self, n)!r}"
            for n, p in signature.parameters.items()
            if n != "self" and getattr(self, n) != p.default
        ]
        return f"{type(self).__name__}({', '.join(changed)})"

    def __sklearn_tags__(self):  # only scikit-learn calls this, so it is the only place that imports it
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        is_classifier = self._estimator_type == "classifier"
        return Tags(
            estimator_type=self._estimator_type,
            target_tags=TargetTags(required=True),
            input_tags=InputTags(one_d_array=False, two_d_array=False, string=True),
            classifier_tags=ClassifierTags() if is_classifier else None,
        )

    _estimator_type: str | None = None

    # ---- fit -------------------------------------------------------------------------------------

    def fit(self, X, y, eval_set: tuple | None = None) -> "TaskEstimator":
        """Train on X, y. `eval_set=(X_dev, y_dev)` records the dev score after every epoch in history_."""
        self._check_common()
        self._check_params()
        X_raw, y_raw = list(X), list(y)  # the held-out part is scored through the public score(X, y)
        X, y = self._check_X_y(X_raw, y_raw, fitting=True)
        if len(X) == 0:
            raise ValueError("the training set is empty: fit needs at least one example")
        seed = self.random_state if self.random_state is not None else random.randrange(2**31)
        rng = np.random.default_rng(seed)
        torch.manual_seed(seed)

        continuing = self.warm_start and hasattr(self, "model_")
        if continuing:
            self._check_same_targets(y)
        else:
            self._learn_targets(y)

        train_idx = np.arange(len(X))
        val_idx = np.array([], dtype=np.int64)
        if self.early_stopping and len(X) > 1:
            perm = rng.permutation(len(X))
            n_val = max(1, int(round(self.validation_fraction * len(X))))
            val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
            if len(train_idx) == 0:
                raise ValueError("validation_fraction leaves no training examples; lower it or add data")
        X_train, y_train = [X[i] for i in train_idx], [y[i] for i in train_idx]
        X_val, y_val = [X_raw[i] for i in val_idx], [y_raw[i] for i in val_idx]

        if not continuing:
            self._prepare_backbone()
        examples = self._examples(X_train, y_train)  # frozen mode: sets frozen_shape_ from the features
        if not continuing:
            torch.manual_seed(seed)  # loading an encoder draws random numbers: start the head from the seed
            self.model_ = self._make_network()
            self.history_ = []
            self.n_epochs_ = 0
        network = self.model_
        groups = self._param_groups(network)
        optimizer = torch.optim.AdamW(groups, lr=self._lr(), weight_decay=self.weight_decay)
        for g in optimizer.param_groups:
            g["initial_lr"] = g["lr"]
        steps_per_epoch = math.ceil(len(examples) / self.batch_size)
        total = steps_per_epoch * self.max_epochs
        warmup = int(self.warmup_fraction * total)

        def factor(step: int) -> float:
            if self.slanted_triangular:
                return slanted_triangular(step, total)
            return warmup_decay(step, warmup, total)

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        torch.manual_seed(seed + self.n_epochs_)  # dropout
        best_score, best_state, since_best = -math.inf, None, 0
        bar = tqdm(total=total, desc=type(self).__name__, unit="batch", disable=not self.progress)
        for epoch in range(self.max_epochs):
            self._unfreeze(network, epoch)
            network.train()
            epoch_loss, n = 0.0, 0
            for rows in length_bucketed_batches(examples, self.batch_size, rng):
                batch = self._batch([examples[i] for i in rows])
                loss = self._head_loss(network(batch), batch)
                optimizer.zero_grad()
                loss.backward()
                if self.max_grad_norm:
                    nn.utils.clip_grad_norm_(network.parameters(), self.max_grad_norm)
                optimizer.step()
                scheduler.step()
                epoch_loss += float(loss.detach())
                n += 1
                bar.update(1)
                bar.set_postfix(loss=f"{epoch_loss / n:.4f}")
            self.n_epochs_ += 1
            record = {"epoch": self.n_epochs_, "train_loss": epoch_loss / max(1, n)}
            if len(X_val):
                record["validation_score"] = self.score(X_val, y_val)
            if eval_set is not None:
                record["dev_score"] = self.score(*eval_set)
            self.history_.append(record)
            logger.info("epoch %s", record)
            if self.early_stopping:
                score = record["validation_score"]
                if score > best_score + self.tol:
                    best_score, since_best = score, 0
                    best_state = copy.deepcopy(network.state_dict())
                else:
                    since_best += 1
                    if since_best >= self.n_iter_no_change:
                        logger.info("early stopping after epoch %d", self.n_epochs_)
                        break
        bar.close()
        for p in network.parameters():
            p.requires_grad_(True)
        if best_state is not None:
            network.load_state_dict(best_state)
            self.best_validation_score_ = best_score
        network.eval()
        return self

    def _param_groups(self, network: TaskNetwork) -> list[dict]:
        """AdamW groups: (depth, decay / no decay); every parameter lands in exactly one group."""
        rep = network.representation
        depth: dict[str, int] = {}
        top = 0
        if self.mode == "finetune":
            top = rep.encoder.num_layers
            depth = {"representation.encoder." + k: v for k, v in encoder_layer_of(rep.encoder).items()}
        buckets: dict[tuple[int, bool], list[nn.Parameter]] = {}
        for name, p in network.named_parameters():
            d = depth.get(name, top)  # the head (and frozen mix / BiLSTM) train at the full lr
            buckets.setdefault((d, _no_decay(name, p)), []).append(p)
        groups = []
        for (d, no_decay), params in sorted(buckets.items()):
            lr = self._lr() / self.discriminative_lr_factor ** (top - d) if self.discriminative_lr else self._lr()
            groups.append({"params": params, "lr": lr, "weight_decay": 0.0 if no_decay else self.weight_decay,
                           "depth": d})  # fmt: skip
        grouped = [id(p) for g in groups for p in g["params"]]
        assert len(grouped) == len(set(grouped)) == len(list(network.parameters())), "a parameter is in 0 or 2 groups"
        return groups

    def _unfreeze(self, network: TaskNetwork, epoch: int) -> None:
        """Gradual unfreezing: at epoch e only encoder layers deeper than L - e (and the head) train."""
        if not (self.gradual_unfreezing and self.mode == "finetune"):
            return
        encoder = network.representation.encoder
        lowest = encoder.num_layers - epoch + 1  # epoch 0: none of the encoder; epoch 1: the top layer
        for name, d in encoder_layer_of(encoder).items():
            encoder.get_parameter(name).requires_grad_(d >= lowest)

    # ---- backbone ----------------------------------------------------------------------------------

    def _prepare_backbone(self) -> None:
        """Load the encoder (finetune) or learn the feature shape (frozen) and the tokenizer."""
        if self.mode != "finetune":
            return
        if self._word_level:  # ELMo: the biLM trains under a ScalarMix; the Representation applies dropout
            from ctxrep.models.elmo import Elmo
            from ctxrep.tokenize import WordTokenizer

            self._encoder = Elmo(load_model(self.model), dropout=0.0, freeze=False)
            self.tokenizer_ = WordTokenizer()  # keeps its word numbering for the estimator's life
        else:
            from ctxrep.tokenize import Tokenizer

            self._encoder = load_model(self.model)
            self.tokenizer_ = Tokenizer.from_model_dir(resolve_model_path(self.model))

    @property
    def _word_level(self) -> bool:
        """ELMo reads whole words (as characters); every other family reads subword pieces."""
        return elmo_folder(self.model) is not None

    def _batch(self, examples: list) -> dict[str, torch.Tensor]:
        """The subclass's batch, plus ELMo's character ids when fine-tuning ELMo."""
        batch = self._collate(examples)
        if self.mode == "finetune" and self._word_level:
            width = self._encoder.config.max_characters_per_token
            batch["char_ids"] = self.tokenizer_.char_table(width)[batch["input_ids"]]
        return batch

    def _lr(self) -> float:
        """The peak learning rate: lr, or 5e-5 to fine-tune and 1e-3 for a head on frozen features."""
        if self.lr is not None:
            return self.lr
        return 5e-5 if self.mode == "finetune" else 1e-3

    def _make_network(self) -> TaskNetwork:
        if self.mode == "finetune":
            rep = Representation("finetune", encoder=self._encoder, dropout=self.dropout)
        else:
            n_layers, dim = self.frozen_shape_
            rep = Representation("frozen", num_layers=n_layers, dim=dim, frozen_head=self.frozen_head,
                                 lstm_size=self.lstm_size, dropout=self.dropout)  # fmt: skip
        return TaskNetwork(rep, self._make_head(rep.out_dim))

    def _frozen_store(self, texts, pairs=None) -> FeatureStore:
        store = cached_features(self.model, texts, pairs, self._frozen_pooling(), self.cache_dir, self.progress)
        self.cache_hits_ = getattr(self, "cache_hits_", 0) + int(store.hit)
        self.frozen_shape_ = [int(store.features.shape[1]), int(store.features.shape[2])]
        return store

    def _frozen_pooling(self) -> str:
        return "mean"

    # ---- prediction -------------------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise ValueError(f"this {type(self).__name__} is not fitted yet: call fit(X, y) first (or load a saved one)")

    def _forward_all(self, examples: list) -> list[torch.Tensor]:
        """The head's output for every example, in order (batched; eval mode; no gradients)."""
        self.model_.eval()
        outputs = []
        with torch.no_grad():
            for start in range(0, len(examples), self.batch_size):
                part = examples[start : start + self.batch_size]
                logits = self.model_(self._batch(part))
                outputs.extend(self._split_outputs(logits, part))
        return outputs

    def _split_outputs(self, logits, examples) -> list:
        return list(logits.unbind(0))

    # ---- save / load --------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write model.safetensors (every weight of the task network) and config.json (parameters + labels)."""
        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_safetensors(self.model_.state_dict(), path / "model.safetensors")
        config = {
            "estimator": type(self).__name__,
            "params": self.get_params(),
            "state": self._state_to_json(),
            "n_epochs": self.n_epochs_,
            "history": self.history_,
        }
        (path / "config.json").write_text(json.dumps(config, indent=2, default=_json_default) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TaskEstimator":
        """Rebuild a saved estimator. In finetune mode the base encoder named in `model` must be available
        (its architecture is rebuilt from it; every weight then comes from model.safetensors)."""
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: no config.json; expected a folder written by {cls.__name__}.save")
        config = json.loads((path / "config.json").read_text())
        if config.get("estimator") != cls.__name__:
            raise ValueError(f"{path} holds a {config.get('estimator')!r}, not a {cls.__name__}; use that class's load")
        est = cls(**config["params"])
        est._state_from_json(config["state"])
        est._prepare_backbone()
        est.model_ = est._make_network()
        est.model_.load_state_dict(load_file(path / "model.safetensors"))
        est.model_.eval()
        est.n_epochs_ = config["n_epochs"]
        est.history_ = config["history"]
        return est

    def _state_to_json(self) -> dict:
        state = {"classes": list(self.classes_)} if hasattr(self, "classes_") else {}
        if hasattr(self, "frozen_shape_"):
            state["frozen_shape"] = self.frozen_shape_
        return state

    def _state_from_json(self, state: dict) -> None:
        if "classes" in state:
            self.classes_ = np.array(state["classes"])
        if "frozen_shape" in state:
            self.frozen_shape_ = state["frozen_shape"]

    # ---- hooks -----------------------------------------------------------------------------------------

    def _check_params(self) -> None:
        pass

    def _check_same_targets(self, y) -> None:
        pass


def length_bucketed_batches(examples: list, batch_size: int, rng: np.random.Generator, pool_batches: int = 50):
    """Random batches of similar length: shuffle, sort each pool of `pool_batches` batches by length, cut it into
    batches, shuffle the batches. Far less padding than plain random batches, and still a random order."""
    order = rng.permutation(len(examples))
    pool = batch_size * pool_batches
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool].tolist(), key=lambda i: _example_length(examples[i]))
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    return [batches[k] for k in rng.permutation(len(batches))]


def _example_length(example) -> int:
    return len(example.input_ids) if example.input_ids is not None else len(example.features)


def pad_features(arrays: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """features (batch, longest, layers, dim) and mask (batch, longest) from per-text (words, layers, dim)."""
    length = max(len(a) for a in arrays)
    _, n_layers, dim = arrays[0].shape
    features = torch.zeros((len(arrays), length, n_layers, dim))
    mask = torch.zeros((len(arrays), length), dtype=torch.bool)
    for r, a in enumerate(arrays):
        features[r, : len(a)] = torch.from_numpy(np.array(a, dtype=np.float32))
        mask[r, : len(a)] = True
    return {"features": features, "mask": mask}


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, os.PathLike):
        return str(o)
    raise TypeError(f"cannot write {type(o).__name__} to config.json")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
