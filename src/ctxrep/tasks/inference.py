"""How a fitted task estimator's network runs for prediction: on which device and at which precision (`using`), in
token-budget batches sorted by length (`_forward_all`, tested against the plain loop `_forward_reference`), compiled
for a large call or as an int8 copy (`_prediction_network`). `_batch` (a collated batch on that device) serves the
training loop too: outside `using` the device is the estimator's own.

`Inference` is a part of ctxrep.tasks.base.TaskEstimator (one of its bases); it reads the estimator's `model_`,
`backbone_`, `device`, `bf16`, `quantize`, `batch_size` and asks the subclass for `_collate` and `_split_outputs`.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ctxrep.tasks.modes import Call, units_of
from ctxrep.tasks.network import TaskNetwork, inference_network, int8_network
from ctxrep.text.inputs import token_budget_batches

PREDICT_TOKENS = 2048  # token budget of one prediction batch (rows x longest), as the Featurizer's batch_tokens


class Inference:
    """Prediction's device, precision and batches for a TaskEstimator (see the module docstring)."""

    def _forward_all(self, records: list, call: Call) -> list:
        """The head's output for every record, in order: the records sorted by length and run in batches under a
        token budget (PREDICT_TOKENS, or batch_size rows of the longest record when that is more) through
        `inference_network` (compiled for a large call) under torch.inference_mode. The same outputs as
        `_forward_reference` (to float rounding: tests/test_tasks.py), which runs batches of batch_size in order."""
        lengths = [units_of(r) for r in records]
        order = sorted(range(len(records)), key=lambda i: lengths[i])
        budget = max(PREDICT_TOKENS, self.batch_size * max(lengths, default=1))
        sizes = token_budget_batches([lengths[i] for i in order], budget)
        network = self._prediction_network(num_tokens=sum(lengths))
        outputs: list = [None] * len(records)
        with torch.inference_mode():
            start = 0
            for size in sizes:
                rows = order[start : start + size]
                start += size
                part = [records[i] for i in rows]
                for i, out in zip(rows, self._split_outputs(self._predict_batch(network, part, call), part)):
                    outputs[i] = out
        return outputs

    @contextlib.contextmanager
    def using(self, device: str | torch.device | None = None, precision: str | None = None):
        """Within this block, predict, score and predict_proba run on `device` at `precision` ("fp32", "bf16" or
        "fp16" autocast, "int8" (CPU: the encoder's linear layers, as quantize="int8"), or "auto": the Featurizer's
        rule, `ctxrep.runtime.hardware.auto_precision`); None keeps the estimator's own device / bf16 / quantize.
        The parameters are left as they are, and the network goes back to `device` afterwards."""
        from ctxrep import runtime

        if precision is not None:
            runtime.check_precision(precision)
        target = runtime.parse_device(device) or torch.device(self.device)
        if precision == "auto":
            precision = runtime.hardware.auto_precision(target, ("fp32", "bf16", "fp16", "int8"))
        if precision == "int8" and target.type != "cpu":
            raise ValueError(f"precision='int8' runs on the CPU only, not {target}: use precision='bf16' on a GPU")
        saved = self.__dict__.get("_predict_with")
        self._predict_with = (target, precision)
        try:
            yield self
        finally:
            if saved is None:  # predict leaves no attribute behind (scikit-learn's contract)
                del self._predict_with
            else:
                self._predict_with = saved
            if hasattr(self, "model_"):
                self.model_.to(self.device)

    def _predict_device(self) -> torch.device:
        """Where prediction runs: `using`'s device, else the estimator's."""
        chosen = self.__dict__.get("_predict_with")
        return chosen[0] if chosen else torch.device(self.device)

    def _predict_precision(self) -> str:
        """`using`'s precision, else the parameters': "int8" (quantize), "bf16" (bf16 autocast) or "fp32"."""
        chosen = self.__dict__.get("_predict_with")
        if chosen and chosen[1] is not None:
            return chosen[1]
        return "int8" if self.quantize else "bf16" if self.bf16 else "fp32"

    def _prediction_network(self, num_tokens: int) -> TaskNetwork:
        """`inference_network(self.model_)`, or at precision "int8" the int8 copy (built once, kept until the next
        fit or a change of `quantize`). The network is on the prediction device (`using`, else `device`)."""
        self.model_.to(self._predict_device()).eval()
        if self._predict_precision() != "int8":
            return inference_network(self.model_, num_tokens=num_tokens)
        self._check_common()
        cached = self.__dict__.get("_int8_network")
        if cached is None or cached[0] is not self.model_:
            self._int8_network = (self.model_, int8_network(self.model_, self.backbone_.tokenizer))
        return self._int8_network[1]

    def _batch(self, records: list, call: Call) -> dict[str, torch.Tensor]:
        """The collated batch on the estimator's device (the prediction device inside `using`)."""
        device = self._predict_device()
        return {k: v.to(device) for k, v in self._collate(records, call).items()}

    def _predict_batch(self, network: nn.Module, records: list, call: Call) -> torch.Tensor:
        """The network's output for one batch of records, float32 on the CPU (under bf16 / fp16 autocast when asked)."""
        precision = self._predict_precision()
        device_type = self._predict_device().type
        if precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if precision == "bf16" else torch.float16
            autocast = torch.autocast(device_type, dtype=dtype)
        else:
            autocast = contextlib.nullcontext()
        with autocast:
            return network(self._batch(records, call)).float().cpu()

    def _forward_reference(self, records: list, call: Call) -> list:
        """The head's output for every record, in order: the network itself in batches of batch_size (eval mode,
        no gradients). The clear path `_forward_all` is tested against."""
        self.model_.eval()
        outputs = []
        with torch.no_grad():
            for start in range(0, len(records), self.batch_size):
                part = records[start : start + self.batch_size]
                outputs.extend(self._split_outputs(self._predict_batch(self.model_, part, call), part))
        return outputs


__all__ = ["Inference", "PREDICT_TOKENS"]
