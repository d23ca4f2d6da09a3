"""Attention heads as units: splitting a projection into heads and joining them back, which heads a layer keeps,
the mask over them, and removing them for real.

    split_heads(x)    (batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)    head_i = x W_i (sec. 3.2)
    merge_heads(c)    (batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim)    Concat(head_1, ..., head_h)

(Vaswani et al. 2017, sec. 3.2; the output projection W^O is the family's.) Michel et al. (2019, sec. 2.1) give each
head h a mask variable xi_h, MHAtt(x) = sum_h xi_h Att_h(x), which `merge_heads` applies; pruning a head drops its
rows of the query / key / value projections and its columns of the output projection, so the layer computes less
instead of multiplying by zero. Every family that can prune heads uses these helpers; head indices are always in the
original numbering 0..num_heads - 1, before and after pruning (transformers' `pruned_heads` field).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from ctxrep.modules.unpadding import Unpadding


def split_heads(x: torch.Tensor, num_heads: int, head_dim: int, unpadding: Unpadding | None = None) -> torch.Tensor:
    """(batch, seq, num_heads * head_dim) -> (batch, num_heads, seq, head_dim): each head's head_dim columns of a
    query, key or value projection. With `unpadding`, x is the (tokens, num_heads * head_dim) rows of an unpadded batch,
    re-padded first (zeros at padding, which the attention mask hides)."""
    if unpadding is not None:
        x = unpadding.pad(x)  # (batch, seq, num_heads * head_dim)
    b, t, _ = x.shape
    return x.view(b, t, num_heads, head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)


def merge_heads(
    context: torch.Tensor,
    unpadding: Unpadding | None = None,
    head_mask: torch.Tensor | None = None,
    kept_heads: Sequence[int] | None = None,
) -> torch.Tensor:
    """(batch, heads, seq, head_dim) -> (batch, seq, heads * head_dim), the heads side by side for the output
    projection; with `unpadding`, the (tokens, heads * head_dim) rows of the real tokens. head_mask: the mask
    variables xi (num_attention_heads,) in the original numbering, of which head h of the layer's `kept_heads` reads
    xi[kept_heads[h]] and multiplies its output by it (entries of pruned heads are not read)."""
    if head_mask is not None:
        xi = head_mask[kept_heads].to(context.dtype)  # (heads,)
        context = context * xi[None, :, None, None]  # (batch, heads, seq, head_dim)
    context = context.transpose(1, 2)  # (batch, seq, heads, head_dim)
    if unpadding is not None:
        context = unpadding.unpad(context)  # (tokens, heads, head_dim)
    return context.flatten(-2)  # (batch, seq | tokens, heads * head_dim)


def check_head_dim(hidden_size: int, num_attention_heads: int) -> None:
    """A config's heads split hidden_size evenly (head_dim = hidden_size / num_attention_heads), else a one-line
    ValueError."""
    if hidden_size % num_attention_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}")


def check_pruned_heads(pruned: Mapping, num_layers: int, num_heads: int) -> dict[int, list[int]]:
    """A config's pruned_heads as {layer: sorted unique heads} with int keys (config.json has strings); a one-line
    ValueError for what cannot be built (a missing layer or head, or every head of a layer)."""
    if not isinstance(pruned, Mapping):
        raise ValueError(f"pruned_heads must map a layer index to a list of heads, got {type(pruned).__name__}")
    out = {}
    for key, heads in pruned.items():
        try:
            layer = int(key)
            heads = sorted({int(h) for h in heads})
        except (TypeError, ValueError):
            raise ValueError(
                f"pruned_heads: {key!r}: {heads!r} is not a layer index and a list of head indices"
            ) from None
        if not 0 <= layer < num_layers:
            raise ValueError(f"pruned_heads names layer {layer}, but the model has layers 0..{num_layers - 1}")
        bad = [h for h in heads if not 0 <= h < num_heads]
        if bad:
            raise ValueError(f"pruned_heads: layer {layer} has heads 0..{num_heads - 1}, not {bad}")
        if len(heads) == num_heads:
            raise ValueError(
                f"pruned_heads removes all {num_heads} heads of layer {layer}; keep at least one head per layer"
            )
        if heads:
            out[layer] = heads
    return out


def pruned_heads_json(pruned: Mapping[int, Sequence[int]]) -> dict[str, list[int]]:
    """pruned_heads as config.json writes it (string keys, layers in order, empty layers left out)."""
    return {str(layer): list(heads) for layer, heads in sorted(pruned.items()) if heads}


def kept_heads(pruned: Mapping[int, Sequence[int]], layer: int, num_heads: int) -> list[int]:
    """The heads of `layer` left after pruning, in the original numbering."""
    gone = set(pruned.get(layer, ()))
    return [h for h in range(num_heads) if h not in gone]


def merge_pruned_heads(
    current: Mapping[int, Sequence[int]], request: Mapping[int, Iterable[int]], num_layers: int, num_heads: int
) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Check a prune_heads request {layer: [heads]} against the model before anything changes.

    Returns (request with lists, every head removed once it is done); refuses in one line a layer or head that does
    not exist and a request that would leave a layer without heads. Heads already removed may be named again."""
    request = {layer: list(heads) for layer, heads in request.items()}
    merged = {layer: list(heads) for layer, heads in current.items()}
    for layer, heads in request.items():
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
            raise ValueError(f"prune_heads: no layer {layer!r}; this model has layers 0..{num_layers - 1}")
        bad = [h for h in heads if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < num_heads]
        if bad:
            raise ValueError(f"prune_heads: layer {layer} has heads 0..{num_heads - 1} (original numbering), not {bad}")
        merged[layer] = sorted(set(merged.get(layer, [])) | set(heads))
        if len(merged[layer]) == num_heads:
            raise ValueError(
                f"prune_heads: that would remove all {num_heads} heads of layer {layer}; keep at least one head per layer"
            )
    return request, {layer: merged[layer] for layer in sorted(merged) if merged[layer]}


@dataclass
class PrunedHeadsConfig:
    """The head-pruning part of a family config, written once: a family's config dataclass subclasses it and calls
    `super().__post_init__()` at the end of its own, which checks `pruned_heads` against the layer and head counts
    named by HEAD_COUNTS (fields or properties of the config).

    pruned_heads: heads removed from each layer, {layer: [heads]} in the original numbering 0..heads - 1
    (transformers 4.x's field; string keys in config.json). Such a layer is built with the remaining heads only."""

    HEAD_COUNTS: ClassVar[tuple[str, str]] = ("num_hidden_layers", "num_attention_heads")

    pruned_heads: dict[int, list[int]] = field(default_factory=dict, kw_only=True)

    def __post_init__(self) -> None:
        layers, heads = (getattr(self, name) for name in self.HEAD_COUNTS)
        self.pruned_heads = check_pruned_heads(self.pruned_heads, layers, heads)

    def kept_heads(self, layer: int) -> list[int]:
        """The heads of `layer` that remain after pruning, in the original numbering."""
        return kept_heads(self.pruned_heads, layer, getattr(self, self.HEAD_COUNTS[1]))

    def pruned_heads_of(self, layers: Sequence[int]) -> dict[int, list[int]]:
        """pruned_heads of a student whose layer j is this config's layer layers[j]: the heads follow their layers."""
        return {j: list(self.pruned_heads[i]) for j, i in enumerate(layers) if i in self.pruned_heads}

    def write_pruned_heads(self, d: dict) -> dict:
        """A config.json dict `d` (from asdict) with pruned_heads as config.json writes it, or without the key when
        no head is gone (transformers' folders leave it out)."""
        heads = pruned_heads_json(d.pop("pruned_heads", self.pruned_heads))
        if heads:
            d["pruned_heads"] = heads
        return d


def check_head_mask(head_mask: torch.Tensor, num_layers: int, num_heads: int) -> torch.Tensor:
    """head_mask as (num_layers, num_heads): given so, or (num_heads,) for every layer; else a one-line ValueError."""
    shape = (num_layers, num_heads)
    if head_mask.dim() == 1 and head_mask.shape[0] == num_heads:
        return head_mask.expand(shape)  # (layers, heads)
    if tuple(head_mask.shape) != shape:
        raise ValueError(
            f"head_mask has shape {tuple(head_mask.shape)}; expected (num_layers, num_heads) = {shape} or "
            f"({num_heads},), in the original head numbering even after pruning"
        )
    return head_mask


def remaining(kept: Sequence[int], heads: Iterable[int], head_dim: int) -> tuple[list[int], torch.Tensor]:
    """After removing `heads` from a layer that has `kept` (original numbering): the heads left, and the rows of its
    (len(kept) * head_dim)-wide projections that belong to them (head-major, as the layer's view splits them)."""
    gone = set(heads)
    keep = [h for h in kept if h not in gone]
    positions = [kept.index(h) for h in keep]  # where the kept heads sit now
    rows = torch.tensor([p * head_dim + i for p in positions for i in range(head_dim)], dtype=torch.long)
    return keep, rows


def linear_subset(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear with the output rows (dim=0) or input columns (dim=1) of `linear` at `index`; a bias follows the
    rows (a column subset keeps the whole bias). Device, dtype, requires_grad and train mode are kept."""
    weight = linear.weight.detach().index_select(dim, index.to(linear.weight.device))  # (out, in) subset
    bias = None if linear.bias is None else linear.bias.detach()
    if bias is not None and dim == 0:
        bias = bias.index_select(0, index.to(bias.device))
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias)
    new.weight.requires_grad_(linear.weight.requires_grad)
    if bias is not None:
        new.bias.requires_grad_(linear.bias.requires_grad)
    new.train(linear.training)
    return new
