"""The estimator base class: scikit-learn's contract, fit / predict around the parts that do the work.

    tasks/network.py   the network: Representation (fine-tuned encoder, or a mix over frozen features) + head
    tasks/modes.py     the frozen / fine-tune split: every decision that depends on `mode`, one object per mode
    tasks/features.py  the frozen-feature cache
    ctxrep/train/      the one training loop (trainer.py: AdamW, the schedule, early stopping; batches.py: epochs)
    ctxrep/text/inputs.py   windows, EncoderInput records, collate

A task estimator follows scikit-learn's contract (`__init__` stores its arguments, `fit` returns self, learned
state ends in `_`, `predict` and `score` change nothing). Its parameters are dataclass fields: the shared ones
declared once in TaskParams, each estimator's own in its class. Subclasses only say how to read their data, build
their head and batches, and turn outputs into predictions, through the hooks declared (with their contracts) at the
end of TaskEstimator: _check_params, _check_X, _check_X_y, _learn_targets, _check_same_targets, _make_head,
_piece_records (finetune), _feature_records (frozen), _collate, _head_loss, _split_outputs, _decode, _score, and
the optional _frozen_pooling, _own_lr, _state_to_json / _state_from_json.

The encoder is loaded once per fit (ctxrep.models.loading.load_encoder) and only its interface is asked
(word_level, max_tokens, num_layers, hidden_size). Two modes share the head (tasks/modes.py decides everything
else: records, batches, the representation, default lr, what each refuses):
  finetune  encoder pieces -> top layer, encoder and head trained; a word-level encoder (ELMo) trains under a
            trainable ScalarMix (models.elmo.Elmo);
  frozen    word vectors of every layer from ctxrep.Featurizer (cached on disk) -> ScalarMix -> BiLSTM / linear.

Randomness: `random_state` seeds a numpy Generator (held-out split, batch order) and a forked torch RNG (head
initialisation, dropout); the global RNGs are left as they were. Held-out data (the early-stopping split and
eval_set) is encoded once per fit. A word-level tokenizer numbers words per call (fit, predict), so predicting
changes nothing in the estimator.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import secrets
import sys
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from ctxrep.models.adapters import LoRA, add_lora, has_adapter, load_adapter, save_adapter
from ctxrep.models.folders import write_safetensors
from ctxrep.models.loading import LoadedEncoder, load_encoder, resolve
from ctxrep.tasks.inference import Inference
from ctxrep.tasks.modes import Call, FineTune, Frozen, mode_of, units_of
from ctxrep.tasks.network import Representation, TaskNetwork, make_optimizer, unfreeze_from_top
from ctxrep.train.batches import EpochBatches, batches_per_epoch, epochs_and_steps, length_bucketed
from ctxrep.train.trainer import EarlyStopping, ObjectiveOf, Trainer, TrainerConfig, seeded_torch

FROZEN_HEADS = ("bilstm", "linear")
KEEP = (None, "best", "last")  # which epoch's weights fit ends with (TaskParams.keep)
ADAPTER_DIR = "adapter"  # a LoRA-trained estimator's encoder adapter (models/adapters.py), beside model.safetensors
ENCODER_PREFIX = "representation.encoder."  # the fine-tuned encoder's weights in the task network's state_dict
IGNORE = -100  # label of positions that carry no loss
SHARED_DOC_TITLE = "Parameters shared by every task estimator (ctxrep.tasks.base.TaskParams):"


@dataclass(eq=False, repr=False)
class TaskParams:
    """Parameters shared by every task estimator (declared once here; each estimator adds its own as dataclass fields).

    model: encoder name or folder ("minilm", a Hugging Face folder, an ELMo folder or "elmo:DIR").
    mode: "finetune" (encoder + head trained) or "frozen" (ScalarMix + BiLSTM/linear head on cached features).
    max_epochs: passes over the training data.
    max_steps: when set, training stops after that many optimizer steps instead (the last epoch may be partial;
        max_epochs is then ignored) and the schedule is laid out over max_steps.
    batch_size: training records per optimizer step (a long text's windows count one each); prediction batches
        hold batch_size records or a budget of 2048 pieces, whichever is more.
    lr: the peak learning rate; None: 5e-5 to fine-tune, 1e-3 for a head on frozen features.
    weight_decay: AdamW's decoupled weight decay (not on biases and norms: ctxrep.train.optim's no-decay rule).
    warmup_fraction: share of steps of linear warm-up (linear schedule). A warm-up as long as the run
        (warmup_fraction >= 1) warns: the learning rate would never reach lr.
    slanted_triangular: ULMFiT's slanted triangular schedule instead of warm-up and linear decay.
    max_grad_norm: gradients are clipped to this total norm (0: no clipping).
    dropout: on the representation the head reads (the encoder's top layer, or the frozen mix / BiLSTM).
    max_length: the longest window in pieces (None: the encoder's own limit, which is also the most).
    frozen_head: "bilstm" or "linear": what reads the ScalarMix of the frozen features (mode="frozen").
    lstm_size: the frozen BiLSTM's hidden size per direction.
    validation_fraction: share of the training data held out to pick the best epoch (with early_stopping).
    early_stopping / n_iter_no_change / tol: stop when the held-out score has not improved by tol for
        n_iter_no_change epochs; the best epoch's weights are kept.
    keep: which epoch's weights `fit` ends with: "best", the epoch with the best held-out score (the validation
        split's with early_stopping, else `eval_set`'s dev score: `ctxrep finetune`'s default), "last", the last
        epoch's, or None: "best" with early_stopping, else "last". `kept_epoch_` says which it kept (the Trainer's
        EarlyStopping keeps the best epoch's weights, the one loop's mechanism).
    warm_start: a second `fit` continues from the learned weights (same labels) instead of starting over.
    discriminative_lr / discriminative_lr_factor: layer l gets lr / factor^(L - l) (finetune only).
    gradual_unfreezing: unfreeze one encoder layer per epoch from the top (finetune only).
    cache_dir: where frozen features are cached (None: $CTXREP_CACHE/features, else ~/.cache/ctxrep/features).
    random_state: an int for repeatable fits, or None.
    progress: False (silent), True (a bar on a terminal, plain lines on stderr otherwise: ctxrep.util.progress) or
        "lines" (plain lines at most every 10 s, and one per epoch, even on a terminal; `ctxrep finetune --no-progress`).
    quantize: None, or "int8": predict and score run the fine-tuned Transformer encoder's linear layers in int8
        (`ctxrep.runtime.fast.quantize_int8`, SmoothQuant-calibrated on built-in sentences; a copy built once per fitted
        model). Training stays float32. Frozen mode and ELMo refuse it in one line.
    device: where the network trains and predicts ("cpu", "cuda", "cuda:1"); batches follow it, saved weights are
        written from CPU copies.
    bf16: bfloat16 autocast for the forward passes (training and prediction; the weights and optimizer stay
        float32): for GPUs with bf16 (on CPUs without AMX it is slower than float32).
    lora: None (every weight trains), or ctxrep.models.adapters.LoRA(rank, alpha, dropout, targets): LoRA adapters
        (through peft) on the encoder's attention and MLP projections train instead of its weights (finetune only);
        `save` writes them as adapter/ (peft's format) beside the head.
    gradient_checkpointing: the encoder keeps only each layer's input and recomputes the layer in backward (less
        memory, about a third more compute; finetune only).
    fsdp: under torchrun (after ctxrep.train.distributed.init_distributed()), shard the weights, gradients and AdamW
        states between the processes (FSDP2) instead of replicating them (DDP).

    model and mode may be given by position; an estimator's own leading parameters follow them (e.g.
    SequenceClassifier's pooling), and everything else is keyword-only. Values are stored unchanged (scikit-learn's
    contract) and checked in `fit`.
    """

    model: str = "minilm"
    mode: str = "finetune"
    _: KW_ONLY
    max_epochs: int = 3
    batch_size: int = 32
    max_steps: int | None = None
    lr: float | None = None
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    max_grad_norm: float = 1.0
    dropout: float = 0.1
    max_length: int | None = None
    frozen_head: str = "bilstm"
    lstm_size: int = 256
    validation_fraction: float = 0.1
    early_stopping: bool = False
    n_iter_no_change: int = 2
    tol: float = 1e-4
    keep: str | None = None
    warm_start: bool = False
    discriminative_lr: bool = False
    discriminative_lr_factor: float = 2.6
    slanted_triangular: bool = False
    gradual_unfreezing: bool = False
    cache_dir: str | None = None
    random_state: int | None = None
    progress: bool | str = False
    quantize: str | None = None
    device: str = "cpu"
    bf16: bool = False
    lora: LoRA | None = None
    gradient_checkpointing: bool = False
    fsdp: bool = False


class ParamsProtocol:
    """scikit-learn's parameter protocol (no scikit-learn import needed): the parameters are `__init__`'s arguments,
    stored unchanged as attributes; shared by the task estimators and tasks/sentence_encoder.py's SentenceEncoder."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return sorted(p.name for p in signature.parameters.values() if p.name != "self")

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params) -> ParamsProtocol:
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


class TaskEstimator(TaskParams, ParamsProtocol, Inference):
    """Fit and predict around the parts that do the work; see the module docstring for what subclasses provide.
    How prediction runs (device, precision, token-budget batches, the int8 copy) is tasks/inference.py's Inference.

    A subclass is a dataclass over TaskParams (`@dataclass(eq=False, repr=False)`) that declares only its own
    parameters; its docstring documents those, and the shared parameters' documentation (TaskParams') is appended
    to it, so that help() on any estimator lists every parameter.
    """

    _estimator_type: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__doc__")
        if own and SHARED_DOC_TITLE not in own:
            cls.__doc__ = f"{inspect.cleandoc(own)}\n\n{SHARED_DOC_TITLE}\n{_shared_doc()}"

    def __sklearn_tags__(self):  # only scikit-learn calls this, so it is the only place that imports it
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        is_classifier = self._estimator_type == "classifier"
        return Tags(
            estimator_type=self._estimator_type,
            target_tags=TargetTags(required=True),
            input_tags=InputTags(one_d_array=False, two_d_array=False, string=True),
            classifier_tags=ClassifierTags() if is_classifier else None,
        )

    def _mode(self) -> FineTune | Frozen:
        """The mode object (tasks/modes.py) for the `mode` parameter: every frozen / fine-tune decision is its."""
        return mode_of(self.mode)

    def _check_common(self) -> None:
        mode = self._mode()  # a ValueError names the modes
        if self.frozen_head not in FROZEN_HEADS:
            raise ValueError(f"frozen_head must be one of {FROZEN_HEADS}, got {self.frozen_head!r}")
        for name in ("max_epochs", "batch_size", "n_iter_no_change"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        steps = self.max_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1):
            raise ValueError(f"max_steps must be a positive integer (or None: max_epochs full epochs), got {steps!r}")
        if not self.warmup_fraction >= 0:
            raise ValueError(f"warmup_fraction must be 0 or more (e.g. 0.1), got {self.warmup_fraction!r}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be positive (or None for the mode's default), got {self.lr!r}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        if self.early_stopping and self.validation_fraction == 0:
            raise ValueError("early_stopping needs held-out data: set validation_fraction > 0 (e.g. 0.1)")
        if self.keep not in KEEP:
            raise ValueError(f"keep must be one of {', '.join(map(repr, KEEP))}, got {self.keep!r}")
        if self.keep == "last" and self.early_stopping:
            raise ValueError("keep='last' with early_stopping: early stopping keeps the best epoch; give keep='best'")
        if self.discriminative_lr and not self.discriminative_lr_factor > 0:
            raise ValueError(f"discriminative_lr_factor must be positive, got {self.discriminative_lr_factor!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), got {self.device!r}") from e
        if not isinstance(self.bf16, (bool, np.bool_)):
            raise ValueError(f"bf16 must be True or False, got {self.bf16!r}")
        if self.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {self.quantize!r}")
        check_lora(self.lora)
        mode.check(self)  # what the mode refuses (frozen: the encoder's training options, int8)
        rs = self.random_state
        if rs is not None and (isinstance(rs, bool) or not isinstance(rs, (int, np.integer)) or rs < 0):
            raise ValueError(f"random_state must be a non-negative int or None, got {rs!r}")

    # ---- fit -------------------------------------------------------------------------------------

    def fit(self, X, y, eval_set: tuple | None = None, train_loss=None) -> TaskEstimator:
        """Train on X, y. `eval_set=(X_dev, y_dev)` records the dev score after every epoch in history_.
        `train_loss(logits, batch) -> scalar`: a loss to train with instead of the task's own (`_head_loss`), e.g.
        compress/distill_task.py's distillation loss; when it is an nn.Module, its parameters train too."""
        self._check_common()
        self._check_params()
        X, y = self._check_X_y(X, y, fitting=True)
        if len(X) == 0:
            raise ValueError("the training set is empty: fit needs at least one example")
        seed = int(self.random_state) if self.random_state is not None else secrets.randbelow(2**31)
        rng = np.random.default_rng(seed)

        self.__dict__.pop("_int8_network", None)  # built from the weights this fit is about to change
        continuing = self.warm_start and hasattr(self, "model_")
        if continuing:
            self._check_same_targets(y)
        else:
            self._learn_targets(y)
            self.backbone_ = load_encoder(self.model, dtype="fp32")  # float32 master weights to train
            self.backbone_.model.to(self.device)  # frozen mode featurizes with it on the estimator's device
            if self.quantize and self.backbone_.model.word_level:  # said before training, not at predict time
                raise ValueError(
                    f"quantize='int8': {self.backbone_.model.family} is a biLSTM over characters; int8 "
                    "applies to Transformer linear layers: use quantize=None"
                )
            self._mode().start_fit(self)  # frozen: frozen_shape_

        train_idx = np.arange(len(X))
        val_idx = np.array([], dtype=np.int64)
        if self.early_stopping and len(X) > 1:
            perm = rng.permutation(len(X))
            n_val = max(1, int(round(self.validation_fraction * len(X))))
            val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
            if len(train_idx) == 0:
                raise ValueError("validation_fraction leaves no training examples; lower it or add data")

        # every example of this fit is encoded here, once, before any random number is drawn for training
        call = self._call()
        examples = self._examples([X[i] for i in train_idx], [y[i] for i in train_idx], call)
        held_out = {}
        if len(val_idx):
            X_val, y_val = [X[i] for i in val_idx], [y[i] for i in val_idx]
            held_out["validation_score"] = (X_val, y_val, self._examples(X_val, None, call))
        if eval_set is not None:
            X_dev, y_dev = self._check_X_y(*eval_set, fitting=False)
            self._check_same_targets(y_dev)
            held_out["dev_score"] = (X_dev, y_dev, self._examples(X_dev, None, call))
        if call.features is not None:
            self.cache_hits_ = call.features.hits

        def evaluate() -> dict[str, float]:
            return {name: self._score_examples(Xh, yh, records, call) for name, (Xh, yh, records) in held_out.items()}

        kept_by = self._kept_by(held_out)  # the held-out score whose best epoch's weights fit ends with, or None

        if not continuing:
            with seeded_torch(seed):
                if self.lora is not None:
                    add_lora(self.backbone_.model, self.lora)
                self.model_ = self._make_network()
            self.history_ = []
            self.n_epochs_ = 0
        self.model_.to(self.device)
        trainable = [p.requires_grad for p in self.model_.parameters()]  # LoRA: the adapters and the head
        with seeded_torch(seed + self.n_epochs_):  # dropout
            trainer = self._trainer(examples, call, rng, evaluate, train_loss, kept_by)
            try:
                result = trainer.train()
            finally:
                for p, t in zip(self.model_.parameters(), trainable):  # gradual unfreezing froze some
                    p.requires_grad_(t)
        self.history_ += trainer.epochs
        self.n_epochs_ = self.history_[-1]["epoch"]
        self.kept_epoch_ = self.n_epochs_
        if "best_score" in result:
            if kept_by == "validation_score":
                self.best_validation_score_ = result["best_score"]
            self.kept_epoch_ = next(e["epoch"] for e in trainer.epochs if e.get(kept_by) == result["best_score"])
        return self

    def _kept_by(self, held_out: dict) -> str | None:
        """The held-out score `keep` selects the epoch by ("validation_score", "dev_score"), or None: the last
        epoch's weights; a ValueError when keep="best" has no held-out score to go by."""
        if self.early_stopping:
            return "validation_score"
        if self.keep != "best":
            return None
        if "dev_score" not in held_out:
            raise ValueError(
                "keep='best' picks the epoch by a held-out score: give fit an eval_set=(X_dev, y_dev), or set "
                "early_stopping=True (it holds out validation_fraction), or keep='last'"
            )
        return "dev_score"

    def _trainer(
        self, examples: list, call: Call, rng: np.random.Generator, evaluate, train_loss, kept_by: str | None = None
    ) -> Trainer:
        """The one training loop (ctxrep.train.trainer) over this fit's examples: length-bucketed epochs, AdamW by
        encoder depth, the schedule, the held-out scores after each epoch and early stopping; `kept_by`: the held-out
        score whose best epoch's weights the loop puts back at the end (the loop's EarlyStopping; with keep="best"
        and no early_stopping it never stops early)."""
        lr, per_epoch = self._lr(), batches_per_epoch(len(examples), self.batch_size)
        _, total = epochs_and_steps(per_epoch, self.max_epochs, self.max_steps)
        config = TrainerConfig(
            lr=lr,
            weight_decay=self.weight_decay,
            warmup_steps=int(self.warmup_fraction * total),
            max_steps=total,
            schedule="slanted_triangular" if self.slanted_triangular else "linear",
            grad_clip=self.max_grad_norm,
            batch_size=self.batch_size,
            bf16=bool(self.bf16),
            seed=None,  # the caller's seeded_torch
            device=str(self.device),
            gradient_checkpointing=bool(self.gradient_checkpointing),
            fsdp=bool(self.fsdp),
        )
        optimizer = self._optimizer(train_loss if isinstance(train_loss, nn.Module) else None)
        loss = self._head_loss if train_loss is None else train_loss
        objective = ObjectiveOf(self.model_, loss)
        batches = EpochBatches(
            length_bucketed([units_of(e) for e in examples], self.batch_size),
            lambda rows: self._batch([examples[i] for i in rows], call),
            rng,
        )
        unfreezing = self.gradual_unfreezing and self._mode().trains_encoder
        if unfreezing:  # only what trains at all (LoRA: the adapters) is unfrozen
            trainable = {n for n, p in self.model_.representation.encoder.named_parameters() if p.requires_grad}
        return Trainer(
            objective,
            config,
            batches,
            evaluate=evaluate,
            progress=self.progress,
            optimizer=optimizer,
            early_stopping=self._early_stopping(kept_by),
            epoch_start=(lambda e: unfreeze_from_top(self.model_, e, trainable)) if unfreezing else None,
            first_epoch=self.n_epochs_,
            desc=type(self).__name__,
            warmup_option="warmup_fraction={fraction:g} (--warmup-fraction on `ctxrep finetune`)",
        )

    def _early_stopping(self, kept_by: str | None) -> EarlyStopping | None:
        """early_stopping: stop after n_iter_no_change epochs without a better validation score, then put the best
        epoch's weights back; keep="best" on the dev score alone: the same bookkeeping, never stopping early."""
        if kept_by is None:
            return None
        if self.early_stopping:
            return EarlyStopping("validation_score", self.n_iter_no_change, self.tol, self.model_)
        return EarlyStopping(kept_by, patience=sys.maxsize, tol=0.0, module=self.model_)

    _fused_adamw: ClassVar[bool] = True  # torch's fused AdamW kernel; False: the for-loop reference (tests)

    def _optimizer(self, extra: nn.Module | None = None) -> torch.optim.AdamW:
        """AdamW over the fitted network's parameters: by encoder depth with discriminative_lr, the own_lr groups
        (`_own_lr`), and `extra`'s parameters (a loss with parameters of its own) at lr."""
        return make_optimizer(
            self.model_,
            self._lr(),
            self.weight_decay,
            discriminative_lr_factor=self.discriminative_lr_factor if self.discriminative_lr else None,
            own_lr=self._own_lr(),
            extra=extra,
            fused=self._fused_adamw,
        )

    def _lr(self) -> float:
        """The peak learning rate: lr, or 5e-5 to fine-tune and 1e-3 for a head on frozen features."""
        if self.lr is not None:
            return self.lr
        return self._mode().default_lr

    # ---- backbone and network -----------------------------------------------------------------------

    def _call(self) -> Call:
        """A fresh Call: a word-level tokenizer (which numbers words as it meets them) is copied empty, so ids from
        this call share a table and the estimator's own tokenizer never changes."""
        from ctxrep.text.tokenizer import WordTokenizer

        loaded: LoadedEncoder = self.backbone_
        tokenizer = loaded.tokenizer
        if tokenizer.word_level:
            tokenizer = WordTokenizer(max_characters_per_token=tokenizer.max_characters_per_token)
        mode = self._mode()
        limit = loaded.model.max_tokens
        return Call(tokenizer, mode.features(self), min(self.max_length or limit, limit), mode)

    def _make_network(self) -> TaskNetwork:
        rep = self._mode().representation(self)
        return TaskNetwork(rep, self._make_head(rep))

    def _examples(self, X, y, call: Call) -> list:
        """The records of X (and y): the mode's builder, `_piece_records` (finetune) or `_feature_records` (frozen)."""
        return call.mode.records(self, X, y, call)

    # ---- learned layer weights ---------------------------------------------------------------------

    def _learned_mix(self):
        """The trained ScalarMix: frozen mode's mix over the cached layers, or ELMo's when fine-tuning ELMo.
        AttributeError otherwise (so hasattr(est, "mix_weights_") is False before fit and without a mix)."""
        if not hasattr(self, "model_"):
            raise AttributeError(
                f"this {type(self).__name__} is not fitted yet: call fit(X, y) first (or load a saved one)"
            )
        rep = self.model_.representation
        if not rep.trains_encoder:
            return rep.mix
        mixes = getattr(rep.encoder, "scalar_mixes", None)  # models.elmo.Elmo
        if mixes is not None:
            return mixes[0]
        raise AttributeError(
            f"this {type(self).__name__} fine-tunes {self.model!r}, which has no layer mix: mix_weights_ exists in "
            "mode='frozen' (a ScalarMix over all layers) and when fine-tuning ELMo; fit with mode='frozen' to learn one"
        )

    @property
    def mix_weights_(self) -> np.ndarray:
        """The learned layer weights softmax(s)_j of the ScalarMix (Peters et al. 2018, eq. 1), layer 0 first
        (0 = embeddings); they sum to 1. Only in mode='frozen' and when fine-tuning ELMo."""
        return self._learned_mix().weights.detach().cpu().numpy().astype(np.float64)

    @property
    def mix_gamma_(self) -> float:
        """The learned scale gamma of the ScalarMix (see mix_weights_)."""
        return float(self._learned_mix().gamma.detach().reshape(-1)[0])

    # ---- prediction -------------------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise ValueError(
                f"this {type(self).__name__} is not fitted yet: call fit(X, y) first (or load a saved one)"
            )

    def _predict_checked(self, X: list):
        """Predictions for an already-checked X (encoded with a fresh Call)."""
        call = self._call()
        records = self._examples(X, None, call)
        return self._decode(X, records, self._forward_all(records, call))

    def _score_examples(self, X: list, y: list, records: list, call: Call) -> float:
        return self._score(X, y, self._decode(X, records, self._forward_all(records, call)))

    def predict(self, X, *, device: str | torch.device | None = None, precision: str | None = None):
        """One prediction per example of X. device / precision: for this call only (see `using`)."""
        self._check_fitted()
        X = self._check_X(X)
        with self.using(device, precision):
            return self._predict_checked(X) if X else self._decode(X, [], [])

    def score(self, X, y, *, device: str | torch.device | None = None, precision: str | None = None) -> float:
        self._check_fitted()
        X, y = self._check_X_y(X, y, fitting=False)
        self._check_same_targets(y)  # labels unseen at fit time are an error, not a silent miss
        with self.using(device, precision):
            return self._score(X, y, self._predict_checked(X) if X else self._decode(X, [], []))

    # ---- save / load --------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write model.safetensors (every weight of the task network) and config.json (parameters + labels). An
        encoder with LoRA adapters is saved as its adapter alone (adapter/: peft's format, over the base `model`)
        and model.safetensors holds the rest of the network (the head)."""
        self._check_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.model_.state_dict()
        encoder = self.model_.representation.encoder if self.model_.representation.trains_encoder else None
        if encoder is not None and has_adapter(encoder):
            save_adapter(encoder, path / ADAPTER_DIR, base=str(self.model))
            state = {k: v for k, v in state.items() if not k.startswith(ENCODER_PREFIX)}
        write_safetensors(state, path / "model.safetensors")
        params = self.get_params()
        params["lora"] = dataclasses.asdict(self.lora) if self.lora is not None else None
        config = {
            "estimator": type(self).__name__,
            "params": params,
            # An encoder folder saved beside the estimator (a pruned or distilled student), relative to it, so the
            # two can be moved together; None for a packaged or hub name or a folder elsewhere.
            "model_beside": _folder_beside(self.model, path),
            "state": self._state_to_json(),
            "n_epochs": self.n_epochs_,
            "history": self.history_,
        }
        (path / "config.json").write_text(json.dumps(config, indent=2, default=_json_default) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | None = None) -> TaskEstimator:
        """Rebuild a saved estimator. The base encoder named in `model` must be available (finetune: its
        architecture is rebuilt from it, every weight then comes from model.safetensors; frozen: it featurizes
        texts the cache has not seen). `device` overrides the saved one (a model trained on "cuda" loads on "cpu")."""
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: no config.json; expected a folder written by {cls.__name__}.save")
        config = json.loads((path / "config.json").read_text())
        if config.get("estimator") != cls.__name__:
            raise ValueError(f"{path} holds a {config.get('estimator')!r}, not a {cls.__name__}; use that class's load")
        params = config["params"]
        if params.get("lora") is not None:
            params["lora"] = lora_from_json(params["lora"])
        if device is not None:
            params["device"] = device
        if config.get("model_beside") and (path / config["model_beside"]).is_dir():
            params["model"] = str((path / config["model_beside"]).resolve())
        est = cls(**params)
        est._state_from_json(config["state"])
        est.backbone_ = load_encoder(est.model, dtype="fp32")  # the float32 weights it was trained in
        if (path / ADAPTER_DIR).is_dir():
            load_adapter(est.backbone_.model, path / ADAPTER_DIR)
        est.model_ = est._make_network()
        state = load_file(path / "model.safetensors")
        if (path / ADAPTER_DIR).is_dir():  # the encoder's weights: the base model's and the adapter's
            state |= {k: v for k, v in est.model_.state_dict().items() if k.startswith(ENCODER_PREFIX)}
        est.model_.load_state_dict(state)
        est.model_.to(est.device).eval()
        est.backbone_.model.to(est.device)
        est.n_epochs_ = config["n_epochs"]
        est.history_ = config["history"]
        return est

    # ---- the public seam for tools (compress/: head importance, distillation) ----------------------------------

    def task_batches(self, X, y, batch_size: int | None = None) -> list[dict[str, torch.Tensor]]:
        """X, y (in the form fit takes) checked and made into the batches this fitted estimator's network reads,
        `batch_size` records each (default: the estimator's batch_size), in order. A loss on one of them:
        `task_loss(model_(batch), batch)`."""
        self._check_fitted()
        X, y = self._check_X_y(X, y, fitting=False)
        if len(X) == 0:
            raise ValueError("no examples were given: give at least one")
        call = self._call()  # what this call encodes with: tokenizer, window length
        examples = self._examples(X, y, call)
        size = batch_size or self.batch_size
        return [self._collate(examples[i : i + size], call) for i in range(0, len(examples), size)]

    def task_loss(self, outputs, batch: dict) -> torch.Tensor:
        """The task's own training loss (what fit minimises without train_loss=) of the network's outputs for a
        batch from `task_batches`: cross-entropy, the CRF's NLL, start/end cross-entropy, squared error."""
        return self._head_loss(outputs, batch)

    def with_encoder(self, encoder: nn.Module, folder: str | os.PathLike, **params) -> TaskEstimator:
        """A new estimator of this class over another encoder (saved in `folder`, which becomes its `model`): this
        fitted estimator's parameters (changed by `params`), tokenizer and fitted task state (classes_, ...), a new
        fine-tune network over `encoder` with a freshly initialised head (the global torch RNG: seed around the
        call), and warm_start=True so that `fit` trains that network. This estimator is left as it was."""
        self._check_fitted()
        est = type(self)(**self.get_params())
        est.set_params(**params)
        est.set_params(model=str(Path(folder).resolve()), mode="finetune", warm_start=True)
        est._state_from_json(self._state_to_json())
        est.backbone_ = LoadedEncoder(encoder.train(), self.backbone_.tokenizer, resolve(folder))
        est.model_ = est._make_network()
        est.history_, est.n_epochs_ = [], 0
        return est

    # ---- hooks: what a task says; each is declared here, the abstract ones raise NotImplementedError ------------

    def _check_params(self) -> None:
        """The task's own parameters checked at fit time (scikit-learn: __init__ only stores them)."""

    def _check_X(self, X) -> list:
        """X normalised (a list of the task's inputs) or a one-line error naming the bad example."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to read X (_check_X)")

    def _check_X_y(self, X, y, fitting: bool) -> tuple[list, list]:
        """X and y normalised and checked against each other; `fitting`: y is the training labels."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to read X, y (_check_X_y)")

    def _learn_targets(self, y) -> None:
        """Set the fitted target state from the training labels (classes_, the tag set, the score range)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what it learns from y (_learn_targets)")

    def _check_same_targets(self, y) -> None:
        """A warm start's or an eval_set's labels checked against the fitted ones (unseen labels: an error)."""

    def _make_head(self, rep: Representation) -> nn.Module:
        """The task head over `rep` (its out_dim, has_cls, bidirectional_states)."""
        raise NotImplementedError(f"{type(self).__name__} builds no head (_make_head)")

    def _piece_records(self, X, y, call: Call) -> list:
        """finetune: records whose .input is an EncoderInput (windows of pieces)."""
        raise NotImplementedError(f"{type(self).__name__} has no fine-tuning records (_piece_records)")

    def _feature_records(self, X, y, call: Call) -> list:
        """frozen: records whose .features are a text's (words, layers, dim) from call.features."""
        raise NotImplementedError(f"{type(self).__name__} has no frozen-feature records (_feature_records)")

    def _collate(self, records: list, call: Call) -> dict[str, torch.Tensor]:
        """One batch of records as tensors: call.mode.units(records, call) plus the task's targets."""
        raise NotImplementedError(f"{type(self).__name__} cannot batch its records (_collate)")

    def _head_loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of the network's outputs for a batch (a mean over its units)."""
        raise NotImplementedError(f"{type(self).__name__} has no loss (_head_loss)")

    def _split_outputs(self, outputs: torch.Tensor, records: list) -> list:
        """The network's outputs for a batch, one per record (default: along the first dimension)."""
        return list(outputs.unbind(0))

    def _decode(self, X: list, records: list, outputs: list) -> object:
        """The predictions for X from each record's output (windows of one text joined here)."""
        raise NotImplementedError(f"{type(self).__name__} cannot turn outputs into predictions (_decode)")

    def _score(self, X: list, y: list, predicted) -> float:
        """What `score` returns for predictions against y (accuracy, entity F1, R^2, ...)."""
        raise NotImplementedError(f"{type(self).__name__} has no score (_score)")

    def _frozen_pooling(self) -> str:
        """How frozen features pool a word's pieces ("mean"; a tagger's word_pooling)."""
        return "mean"

    def _own_lr(self) -> tuple[str, float] | None:
        """(parameter-name prefix in the network, its learning rate) for parameters that train at a rate of their
        own (TokenTagger's CRF), or None."""
        return None

    def _state_to_json(self) -> dict:
        """The fitted target state saved in config.json (classes_, ...); `_state_from_json` reads it back."""
        state = {"classes": list(self.classes_)} if hasattr(self, "classes_") else {}
        if hasattr(self, "frozen_shape_"):
            state["frozen_shape"] = self.frozen_shape_
        return state

    def _state_from_json(self, state: dict) -> None:
        if "classes" in state:
            self.classes_ = np.array(state["classes"])
        if "frozen_shape" in state:
            self.frozen_shape_ = state["frozen_shape"]


def check_lora(lora) -> None:
    """`lora` is None or a LoRA with valid settings (a one-line ValueError otherwise)."""
    if lora is not None and not isinstance(lora, LoRA):
        raise ValueError(
            f"lora must be None or ctxrep.models.adapters.LoRA(rank=16, alpha=32, dropout=0.05), got {lora!r}"
        )
    if lora is not None:
        lora.check()


def lora_from_json(saved: dict) -> LoRA:
    """A LoRA from its dataclasses.asdict form (config.json)."""
    targets = saved.get("targets")
    return LoRA(**(saved | {"targets": tuple(targets) if targets is not None else None}))


def _shared_doc() -> str:
    """TaskParams' parameter documentation (its docstring after the first line), indented for a subclass's docstring."""
    body = inspect.cleandoc(TaskParams.__doc__).split("\n\n", 1)[1]
    return "\n".join("    " + line if line else "" for line in body.splitlines())


def _folder_beside(model: str, saved_in: Path) -> str | None:
    """The path of `model` relative to `saved_in` when it is a folder under `saved_in`'s parent, else None."""
    folder = Path(str(model)).expanduser()
    if not folder.is_dir():
        return None
    try:
        folder.resolve().relative_to(saved_in.resolve().parent)
    except ValueError:
        return None
    return os.path.relpath(folder.resolve(), saved_in.resolve())


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, os.PathLike):
        return str(o)
    raise TypeError(f"cannot write {type(o).__name__} to config.json")
