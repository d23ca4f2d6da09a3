"""The frozen / fine-tune split, in one place: each mode is one object (FINETUNE, FROZEN), chosen once per fit or
predict call from the estimator's `mode` (`mode_of`) and carried in the call; the estimators ask it and never branch
on the mode themselves.

                  finetune                                      frozen
    refuses       -                                             discriminative_lr, gradual_unfreezing, quantize,
                                                                  lora, gradient_checkpointing
    default lr    5e-5                                          1e-3 (a head trained from scratch)
    fitted state  -                                             frozen_shape_ = [layers + 1, dim] of the features
    call          -                                             a FeatureCache (Featurizer vectors of every layer per
                                                                word, cached on disk, pooled as the task asks)
    records       est._piece_records(X, y, call): windows of    est._feature_records(X, y, call): each text's (or
                  subword pieces (inputs.EncoderInput)           window's) cached features (words, layers, dim)
    batch units   inputs.collate (input_ids, attention_mask,    network.pad_features (features, mask)
                  + cls_position unless word-level, + a
                  (batch, words, pieces) pooling matrix for a
                  task that reads one vector per word)
    network       Representation("finetune") over the encoder   Representation("frozen"): ScalarMix (+ BiLSTM)

A task estimator provides the two record builders; what its head needs of the representation it asks the
Representation (out_dim, has_cls, bidirectional_states).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctxrep.tasks.features import FeatureCache
from ctxrep.tasks.network import Representation, pad_features
from ctxrep.text.inputs import collate


@dataclass
class Call:
    """What one fit or predict call encodes its examples with.

    tokenizer: the encoder's tokenizer; a word-level one (ELMo) is a fresh copy per call, since it numbers words.
    features: the frozen-feature cache (frozen mode), else None.
    max_length: the longest window in pieces: max_length, at most the encoder's max_tokens.
    mode: the mode object (tasks/modes.py) that builds this call's records and batches.
    """

    tokenizer: object
    features: FeatureCache | None
    max_length: int
    mode: FineTune | Frozen


MODES = ("finetune", "frozen")


class FineTune:
    """The encoder and the head train together; records are windows of subword pieces (or of ELMo's words)."""

    name = "finetune"
    default_lr = 5e-5
    trains_encoder = True

    def check(self, est) -> None:
        pass  # every parameter applies

    def start_fit(self, est) -> None:
        pass

    def features(self, est) -> FeatureCache | None:
        return None

    def records(self, est, X, y, call) -> list:
        return est._piece_records(X, y, call)

    def final_states(self, est) -> bool:
        """Whether the representation gives a text's final states to pool ("cls"): the classification token, or
        ELMo's biLM states."""
        return True

    def units(self, records: list, call, word_pooling: str | None = None) -> dict[str, torch.Tensor]:
        """The padded pieces of the records' .input, `cls_position` (batch,) unless the encoder is word-level, and
        with `word_pooling` ("first" / "mean") `pool` (batch, words, pieces): 1 at each word's first piece, or 1 / k
        over its k pieces, for the words each window predicts (`.input.words`)."""
        inputs = [r.input for r in records]
        batch = collate(inputs, call.tokenizer)
        if not call.tokenizer.word_level:  # ELMo has no classification token: a head reads its final states
            batch["cls_position"] = torch.tensor([i.cls_position for i in inputs])
        if word_pooling is not None:
            batch["pool"] = _pool_matrix(inputs, batch["input_ids"].shape[1], word_pooling)
        return batch

    def representation(self, est) -> Representation:
        encoder = est.backbone_.model
        if encoder.word_level:  # ELMo: the biLM trains under a ScalarMix; the Representation applies dropout
            from ctxrep.models.elmo import Elmo

            encoder = Elmo(encoder, dropout=0.0, freeze=False)
        return Representation("finetune", encoder=encoder, dropout=est.dropout)


class Frozen:
    """The encoder stays as it is: its vectors of every layer per word are featurized once (and cached); a ScalarMix
    and a BiLSTM (or nothing: frozen_head="linear") train under the head."""

    name = "frozen"
    default_lr = 1e-3
    trains_encoder = False

    def check(self, est) -> None:
        if est.discriminative_lr or est.gradual_unfreezing or est.lora is not None or est.gradient_checkpointing:
            raise ValueError(
                "discriminative_lr, gradual_unfreezing, lora and gradient_checkpointing change how the encoder is "
                "trained; in mode='frozen' the encoder is not trained: use mode='finetune' or switch them off"
            )
        if est.quantize:
            raise ValueError(
                "quantize='int8' applies to a fine-tuned encoder; in mode='frozen' the features come from "
                "the featurizer: use mode='finetune', or quantize=None"
            )

    def start_fit(self, est) -> None:
        encoder = est.backbone_.model
        est.frozen_shape_ = [encoder.num_layers + 1, encoder.hidden_size]

    def features(self, est) -> FeatureCache | None:
        return FeatureCache(est.backbone_, est._frozen_pooling(), est.cache_dir, est.progress)

    def records(self, est, X, y, call) -> list:
        return est._feature_records(X, y, call)

    def final_states(self, est) -> bool:
        """Only the BiLSTM has final states (forward at the last word, backward at the first)."""
        return est.frozen_head == "bilstm"

    def units(self, records: list, call, word_pooling: str | None = None) -> dict[str, torch.Tensor]:
        """The records' .features padded: features (batch, words, layers, dim), mask (batch, words). They are
        already one vector per word (the FeatureCache pools as the task asks), so `word_pooling` has nothing to do."""
        return pad_features([r.features for r in records])

    def representation(self, est) -> Representation:
        n_layers, dim = est.frozen_shape_
        return Representation(
            "frozen",
            num_layers=n_layers,
            dim=dim,
            frozen_head=est.frozen_head,
            lstm_size=est.lstm_size,
            dropout=est.dropout,
        )


FINETUNE, FROZEN = FineTune(), Frozen()


def mode_of(name: str) -> FineTune | Frozen:
    """The mode object for an estimator's `mode` parameter; a ValueError names the choices."""
    if name == "finetune":
        return FINETUNE
    if name == "frozen":
        return FROZEN
    raise ValueError(f"mode must be one of {MODES}, got {name!r}")


def units_of(record) -> int:
    """Units of one record: pieces of its encoder input (finetune) or words of its features (frozen)."""
    return len(record.input) if record.input is not None else len(record.features)


def _pool_matrix(inputs: list, n_pieces: int, word_pooling: str) -> torch.Tensor:
    """(batch, words, pieces) weights: row (r, j) is 1 at word j's first piece ("first"), or 1 / k over its k
    pieces ("mean"). Built with one scatter from flat index lists, not one tensor write per word."""
    n_words = max(1, max(len(i.words) for i in inputs))
    spans = [
        (r, j, s, e if word_pooling == "mean" else s + 1)
        for r, i in enumerate(inputs)
        for j, (_, s, e) in enumerate(i.words)
    ]
    rows = [r for r, _, s, e in spans for _ in range(s, e)]
    words = [j for _, j, s, e in spans for _ in range(s, e)]
    pieces = [p for _, _, s, e in spans for p in range(s, e)]
    weights = [1.0 / (e - s) for _, _, s, e in spans for _ in range(s, e)]
    pool = torch.zeros((len(inputs), n_words, n_pieces))  # (batch, words, pieces)
    pool[rows, words, pieces] = torch.tensor(weights)
    return pool


__all__ = ["FINETUNE", "FROZEN", "MODES", "FineTune", "Frozen", "mode_of", "units_of"]
