"""SequenceRegressor: one real-valued score per text or per text pair (STS-B, SICK-R), on top of a contextual encoder.

The texts, pairs, records, batches and pooling head are the classifier's (classifier.SequenceTask); the regressor
adds its targets and loss:
  targets   standardised at fit, z = (y - mean_y) / std_y (target_mean_, target_scale_), so that one learning rate
            suits scores on any scale; predictions are mean_y + std_y * z_hat
  head      the pooled vector -> one linear output z_hat
  loss      mean squared error (z_hat - z)^2
  score     R^2 = 1 - sum (y - y_hat)^2 / sum (y - mean(y))^2 (scikit-learn's RegressorMixin.score);
            `evaluate` adds Pearson's r and Spearman's rho, the STS measures
A model trained on pairs is a cross-encoder: `rerank(query, documents, top_n)` orders documents by predicted score
(Hits, as every ctxrep reranker).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.tasks.classifier import PoolingHead, SequenceTask
from ctxrep.tasks.network import Representation
from ctxrep.vectors.similarity import pearson, spearman


class SequenceRegressor(SequenceTask):
    """Predict a score for texts (X: list of strings) or text pairs (X: list of (text_a, text_b)); y: numbers.
    Texts are split on whitespace into words; fine-tuning truncates a text (the longer of a pair first) to
    max_length pieces.

    pooling: "cls", "mean" or "concat" (see ctxrep.tasks.classifier).
    """

    _estimator_type = "regressor"

    # ---- targets ----------------------------------------------------------------------------------

    def _check_X_y(self, X, y, fitting: bool):
        X, y = super()._check_X_y(X, y, fitting)
        return X, _scores(y)

    def _learn_targets(self, y) -> None:
        y = np.asarray(y, dtype=np.float64)
        self.target_mean_ = float(y.mean())
        spread = float(y.std())
        self.target_scale_ = spread if spread > 0 else 1.0  # every target equal: z = 0 for all

    def _encode_labels(self, y) -> np.ndarray:
        """z = (y - target_mean_) / target_scale_."""
        return ((np.asarray(y, dtype=np.float64) - self.target_mean_) / self.target_scale_).astype(np.float32)

    def _state_to_json(self) -> dict:
        return super()._state_to_json() | {"target_mean": self.target_mean_, "target_scale": self.target_scale_}

    def _state_from_json(self, state: dict) -> None:
        super()._state_from_json(state)
        self.target_mean_ = state["target_mean"]
        self.target_scale_ = state["target_scale"]

    # ---- head -------------------------------------------------------------------------------------

    def _make_head(self, rep: Representation) -> nn.Module:
        return PoolingHead(rep.out_dim, 1, self.pooling, rep.bidirectional_states)

    def _head_loss(self, outputs: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.mse_loss(outputs.squeeze(-1).float(), batch["labels"].float())

    # ---- prediction -------------------------------------------------------------------------------

    def _decode(self, X, examples, outputs) -> np.ndarray:
        if not outputs:
            return np.zeros(0, dtype=np.float64)
        z = torch.stack(outputs).reshape(-1).double().numpy()
        return self.target_mean_ + self.target_scale_ * z

    def _score(self, X, y, predicted) -> float:
        """R^2, the coefficient of determination (scikit-learn's RegressorMixin.score)."""
        return r2_score(np.asarray(y, dtype=np.float64), predicted)

    def evaluate(self, X, y) -> dict:
        """{"pearson", "spearman", "r2", "mse", "n"} of the predictions for X against y."""
        self._check_fitted()
        X, y = self._check_X_y(X, y, fitting=False)
        predicted = self._predict_checked(X) if X else np.zeros(0)
        return regression_report(np.asarray(y, dtype=np.float64), predicted)

    def _pair_scores(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        return np.asarray(self.predict(pairs), dtype=np.float64)


def _scores(y) -> list[float]:
    """y as floats; a value that is not a finite number names its example."""
    out = []
    for i, value in enumerate(y):
        if isinstance(value, (bool, np.bool_)):
            raise ValueError(f"example {i}: the target {value!r} is a bool; a regressor needs numbers (scores)")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"example {i}: the target {value!r} is not a number; a regressor needs a score per example (for "
                "class labels use SequenceClassifier)"
            ) from None
        if not np.isfinite(number):
            raise ValueError(f"example {i}: the target is {number}; give a finite score")
        out.append(number)
    return out


def r2_score(y: np.ndarray, predicted: np.ndarray) -> float:
    """1 - SS_res / SS_tot; with constant y, 1.0 for a perfect prediction and 0.0 otherwise (as scikit-learn)."""
    y, predicted = np.asarray(y, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    if len(y) != len(predicted):
        raise ValueError(f"X has {len(predicted)} examples but y has {len(y)} scores")
    if not len(y):
        return 0.0
    residual = float(((y - predicted) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0:
        return 1.0 if residual == 0 else 0.0
    return 1.0 - residual / total


def regression_report(y: np.ndarray, predicted: np.ndarray) -> dict:
    """Pearson, Spearman, R^2 and mean squared error of `predicted` against `y`. A constant prediction (or fewer
    than two examples) correlates with nothing: 0.0 there instead of NaN, so that epochs still compare."""
    y, predicted = np.asarray(y, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    enough = len(y) >= 2 and np.ptp(y) > 0 and np.ptp(predicted) > 0
    return {
        "pearson": pearson(predicted, y) if enough else 0.0,
        "spearman": spearman(predicted, y) if enough else 0.0,
        "r2": r2_score(y, predicted),
        "mse": float(((y - predicted) ** 2).mean()) if len(y) else 0.0,
        "n": int(len(y)),
    }


__all__ = ["SequenceRegressor", "r2_score", "regression_report"]
