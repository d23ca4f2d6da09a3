"""The task network: a representation (fine-tuned encoder, or a mix over cached frozen features) and a head.

finetune  batch from ctxrep.text.inputs.collate -> encoder.encode(batch) -> top layer (batch, pieces, hidden);
          ELMo (a word-level encoder): batch["char_ids"] -> models.elmo.Elmo, the biLM under a trainable
          ScalarMix (Peters et al. 2018, eq. 1) -> (batch, words, hidden)
frozen    batch["features"] (batch, words, layers, dim), batch["mask"] -> ScalarMix (gamma * sum_j softmax(s)_j h_j)
          -> BiLSTM, or nothing ("linear") -> (batch, words, out_dim)

Predictions run `inference_network(network)`: the network itself, or for a call large enough to pay for compiling,
the same head over ctxrep.runtime.fast's compiled copy of a fine-tuned Transformer encoder; tested against the network.

Depth of each encoder parameter (for discriminative learning rates and gradual unfreezing) is the encoder's own
answer, `encoder.layer_of(name)` (models/encoder.py): no parameter names are guessed here.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ctxrep.models.adapters import has_adapter, merged_copy
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.runtime import fast
from ctxrep.train.distributed import is_sharded
from ctxrep.train.optim import adamw, discriminative, param_groups


class Representation(nn.Module):
    """Vectors for the units of each batch row: subword pieces (finetune), words (ELMo, frozen features).

    What a head needs to know of it: out_dim (the vectors' width), has_cls (batches carry cls_position: a
    fine-tuned subword encoder), bidirectional_states (the vectors are [forward; backward] halves, so a text's final
    states are the forward half at its last unit and the backward half at its first: ELMo's biLM, the frozen BiLSTM).
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
            word_level = getattr(encoder, "word_level", True)  # models.elmo.Elmo (the biLM under its mix) has none
            self.has_cls, self.bidirectional_states = not word_level, word_level
        else:
            self.mix = ScalarMix(num_layers)
            self.lstm = (
                nn.LSTM(dim, lstm_size, batch_first=True, bidirectional=True) if frozen_head == "bilstm" else None
            )
            self.out_dim = 2 * lstm_size if self.lstm is not None else dim
            self.has_cls, self.bidirectional_states = False, self.lstm is not None

    @property
    def trains_encoder(self) -> bool:
        """Whether an encoder is part of this network (finetune), rather than features cached from one (frozen)."""
        return self.mode == "finetune"

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.mode == "finetune":
            if "char_ids" in batch:  # the word-level encoder under its trainable ScalarMix: one unit per word
                return self.dropout(self.encoder(batch["char_ids"]).representations[0])  # (batch, words, hidden)
            out = self.encoder.encode(batch)
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


def inference_network(network: TaskNetwork, num_tokens: int = 0) -> TaskNetwork:
    """The network to predict with (eval mode, under torch.inference_mode): for a call of `num_tokens` large enough to
    pay for compiling (`ctxrep.runtime.fast.worth_compiling`, as the Featurizer's compile="auto"), a fine-tuned Transformer
    encoder is replaced by `fast.compile_encoder`'s copy (frozen weights: built per call), the head shared; otherwise
    the network itself. The featurizer's oneDNN pre-packing is left out: measured on this project's 2-core Xeon it
    ran the estimators' prediction batches 1.1-1.3x slower than the plain float32 path (notes_finetune_speed.md)."""
    rep = network.representation
    network.eval()
    transformer = rep.trains_encoder and rep.has_cls  # a fine-tuned Transformer (not ELMo)
    sharded = any(is_sharded(m) for m in rep.modules())  # evaluated during an FSDP run: no copy can be made
    if not transformer or sharded or not fast.worth_compiling(num_tokens, rep.encoder):
        return network
    return _with_encoder(network, fast.compile_encoder(_plain(rep.encoder)))


def int8_network(network: TaskNetwork, tokenizer) -> TaskNetwork:
    """The network with its fine-tuned Transformer encoder's linear layers in int8 (`fast.quantize_int8`, calibrated
    on `fast.calibration_batches` through `tokenizer`): a copy, the head shared; for predict, eval mode."""
    rep = network.representation
    if not rep.trains_encoder:
        raise ValueError("quantize='int8' applies to a fine-tuned encoder; a frozen-mode network has none")
    batches = fast.calibration_batches(tokenizer, rep.encoder.max_tokens)
    return _with_encoder(network, fast.quantize_int8(_plain(rep.encoder), batches))


def _plain(encoder: nn.Module) -> nn.Module:
    """The encoder as the fast paths take it: with LoRA adapters, a copy with them merged into its projections."""
    return merged_copy(encoder) if has_adapter(encoder) else encoder


def _with_encoder(network: TaskNetwork, encoder: nn.Module) -> TaskNetwork:
    """The same head over another copy of the fine-tuned encoder (compiled or int8), in eval mode."""
    rep = Representation("finetune", encoder=encoder, dropout=network.representation.dropout.p)
    return TaskNetwork(rep, network.head).eval()


def encoder_depths(encoder: nn.Module) -> dict[str, int]:
    """Depth of every encoder parameter by its name, as the encoder answers it (`layer_of`): 0 = embeddings (or
    ELMo's char CNN), l = layer l, L = the top layer and what sits above it."""
    return {name: encoder.layer_of(name) for name, _ in encoder.named_parameters()}


def network_depths(network: TaskNetwork) -> tuple[dict[str, int], int]:
    """(depth of each fine-tuned encoder parameter by its name in `network`, the top depth L). Everything else in
    the network (the head, a frozen mix / BiLSTM) sits at the top. Frozen mode: ({}, 0)."""
    rep = network.representation
    if not rep.trains_encoder:
        return {}, 0
    depth = {"representation.encoder." + k: v for k, v in encoder_depths(rep.encoder).items()}
    return depth, rep.encoder.num_layers


def unfreeze_from_top(network: TaskNetwork, epoch: int, trainable: set[str] | None = None) -> None:
    """Gradual unfreezing: at epoch e only encoder layers deeper than L - e (and the head) train; of the encoder's
    parameters only those named in `trainable` (None: all; with LoRA: the adapters)."""
    encoder = network.representation.encoder
    lowest = encoder.num_layers - epoch + 1  # epoch 0: none of the encoder; epoch 1: the top layer
    for name, d in encoder_depths(encoder).items():
        encoder.get_parameter(name).requires_grad_(d >= lowest and (trainable is None or name in trainable))


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


def make_optimizer(
    network: TaskNetwork,
    lr: float,
    weight_decay: float,
    *,
    discriminative_lr_factor: float | None = None,
    own_lr: tuple[str, float] | None = None,
    extra: nn.Module | None = None,
    fused: bool = True,
) -> torch.optim.AdamW:
    """AdamW over the network (ctxrep.train.optim's one builder and no-decay rule). With a discriminative factor,
    encoder layer l gets lr / factor^(L - l) (ULMFiT); the head sits at L and gets lr. With own_lr = (prefix, lr),
    the parameters whose names start with prefix form their own groups (at depth L + 1) at that learning rate (the
    CRF's). `extra`: a module outside the network whose parameters train too, at lr, as further groups (a
    distillation loss's projection). fused: torch's fused kernel where it applies; False, the for-loop reference."""
    depth, top = network_depths(network)
    lr_at_depth = discriminative(lr, discriminative_lr_factor, top) if discriminative_lr_factor is not None else None
    if own_lr is not None:
        prefix, own = own_lr
        depth = depth | {name: top + 1 for name, _ in network.named_parameters() if name.startswith(prefix)}
        below = lr_at_depth or (lambda d: lr)

        def lr_at_depth(d):
            return own if d == top + 1 else below(d)

    optimizer = adamw(network, lr, weight_decay, depth=depth, default_depth=top, lr_at_depth=lr_at_depth, fused=fused)
    if extra is not None:
        for group in param_groups(extra, weight_decay):
            optimizer.add_param_group(group)  # lr: the optimizer's default, lr
    return optimizer
