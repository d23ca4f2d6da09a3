"""What attention heads look at (Clark et al. 2019, "What Does BERT Look At?").

Per head, averaged over every query token of a corpus (special tokens included, as Clark et al.):
  cls      attention to the classification token ([CLS], <s>)
  sep      attention to the other special tokens ([SEP], </s>)
  prev / next / self   attention to the token one to the left / one to the right / itself
  punct    attention to the pieces of punctuation words
  entropy  the entropy -sum_k a_k log a_k of the head's attention distribution (nats)

With a dependency-parsed corpus (CoNLL-U), each head is also used as a parser: token attention becomes word
attention (sum over the pieces of the attended-to word, average over the pieces of the attending word) and a
dependent's predicted head is the word it attends to most. For each relation the best head is reported with
its accuracy, next to the best fixed-offset baseline (always predicting the word k positions away).

Layers are numbered 1..L as in the hidden states (0 is the embedding output, which has no attention); heads
0..H-1.
"""

from __future__ import annotations

import json
import math
import os
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ctxrep.analysis._common import model_name
from ctxrep.featurize import Featurizer
from ctxrep.text.inputs import EncoderInput, collate, words_of

STATISTICS = ("cls", "sep", "prev", "next", "self", "punct", "entropy")


@dataclass
class _Sentence:
    """One sentence as one encoder input (`record`, from ctxrep.text.inputs), and what each position is."""

    words: list[str]
    record: EncoderInput
    tokens: list[str]
    word_of: list[int]  # word index of each position, -1 for special tokens

    @property
    def input_ids(self) -> list[int]:
        return self.record.input_ids

    @property
    def cls_position(self) -> int:
        return self.record.cls_position


def _is_punct(word: str) -> bool:
    return all(unicodedata.category(c).startswith("P") for c in word)


def _encode(fz: Featurizer, index: int, words: list[str]) -> _Sentence | None:
    """Sentence `index` as one input with every piece of every word marked; None when it is longer than the
    featurizer's window (fz.plan.max_length pieces, special tokens included)."""
    pieces = fz.tokenizer.encode_words([words])[0]
    ids, types, offset = fz.tokenizer.build_inputs(pieces.ids)
    if len(ids) > fz.plan.max_length:
        return None
    spans = [(w, offset + s, offset + e) for w, (s, e) in enumerate(pieces.spans())]
    record = EncoderInput(index, ids, types, fz.plan.cls_position(len(ids)), spans)
    word_of = [-1] * len(ids)
    for w, s, e in spans:
        word_of[s:e] = [w] * (e - s)
    tokens = [fz.tokenizer.backend.id_to_token(i) or str(i) for i in ids]
    return _Sentence(words, record, tokens, word_of)


def require_attention(fz: Featurizer) -> None:
    """A one-line error for a model without attention heads (the encoder interface says which: ELMo's biLSTM)."""
    m = fz.model
    if not m.has_attention:
        raise ValueError(
            f"{m.no_attention_reason()}; attention statistics and heatmaps need a model with "
            "attention heads (a Transformer: BERT, RoBERTa, ELECTRA, GPT-2, XLNet, ...)"
        )


def pruned_heads_mask(fz: Featurizer) -> torch.Tensor:
    """(layers, num_heads) bool, True where a head was pruned (the grids keep the original head numbering)."""
    m = fz.model
    mask = torch.ones(m.num_layers, m.num_heads, dtype=torch.bool)
    for layer, kept in enumerate(m.kept_heads()):
        mask[layer, kept] = False
    return mask


def _attentions(
    fz: Featurizer, inputs: list[_Sentence], batch_size: int = 16
) -> Iterator[tuple[_Sentence, torch.Tensor]]:
    """Each input with its attention probabilities (layers, heads, seq, seq), in input order; a pruned head's
    entries are NaN (heads in the original numbering)."""
    fz.model.eval()
    kept = fz.model.kept_heads()
    with torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size]
            out = fz.model.encode(collate([x.record for x in batch], fz.tokenizer), output_attentions=True)
            if all(len(k) == fz.model.num_heads for k in kept):
                stacked = torch.stack(out.attentions, dim=1)  # (batch, layers, heads, seq, seq)
            else:  # each layer's remaining heads at their original indices
                first = out.attentions[0]
                stacked = first.new_full((len(batch), len(kept), fz.model.num_heads, *first.shape[-2:]), math.nan)
                for layer, (a, heads) in enumerate(zip(out.attentions, kept)):
                    stacked[:, layer, heads] = a
            for r, x in enumerate(batch):
                n = len(x.input_ids)
                yield x, stacked[r, :, :, :n, :n]


def _encode_all(fz: Featurizer, sentences: Sequence[str | Sequence[str]]) -> tuple[list[_Sentence], int]:
    require_attention(fz)
    inputs, skipped = [], 0
    for i, s in enumerate(sentences):
        x = _encode(fz, i, words_of(s, i))
        if x is None:
            skipped += 1
        else:
            inputs.append(x)
    return inputs, skipped


# ---- per-head statistics ------------------------------------------------------------------------


@dataclass
class AttentionStats:
    """Per-head averages over all query tokens; `stats[name][layer - 1][head]`."""

    model: str
    n_sentences: int
    n_tokens: int
    n_skipped: int  # sentences longer than the model's positions
    stats: dict[str, list[list[float]]]

    def grid(self, name: str) -> np.ndarray:
        """(layers, heads) array of one statistic; NaN for pruned heads (None in `stats`)."""
        if name not in self.stats:
            raise ValueError(f"unknown attention statistic {name!r}; choose one of {', '.join(self.stats)}")
        return np.array(self.stats[name], dtype=float)

    def top_head(self, name: str) -> tuple[int, int]:
        """(layer index from 0, head) with the largest value of a statistic, among the heads the model has."""
        g = self.grid(name)
        layer, head = np.unravel_index(int(np.nanargmax(g)), g.shape)
        return int(layer), int(head)

    def table(self) -> str:
        """Each statistic's per-layer head average, and its top head."""
        lines = [
            f"attention | {self.model} | {self.n_sentences} sentences, {self.n_tokens} tokens"
            + (f" ({self.n_skipped} too long, skipped)" if self.n_skipped else "")
        ]
        n_layers = len(next(iter(self.stats.values())))
        lines.append(f"{'':<9}" + "".join(f"{'L' + str(j + 1):>7}" for j in range(n_layers)) + "   top head")
        for name in self.stats:
            g = self.grid(name)
            layer, head = self.top_head(name)
            means = "".join(f"{v:>7.3f}" for v in np.nanmean(g, axis=1))
            lines.append(f"{name:<9}{means}   L{layer + 1}-H{head} {g[layer, head]:.3f}")
        return "\n".join(lines)

    def save_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def save_grid_png(self, name: str, path: str | os.PathLike) -> None:
        save_grid_png(self.grid(name), path, title=f"{name} ({self.model.rstrip('/').split('/')[-1]})")


def head_statistics(fz: Featurizer, sentences: Sequence[str | Sequence[str]], batch_size: int = 16) -> AttentionStats:
    """Clark et al.'s per-head averages over `sentences` (strings or word lists)."""
    if not sentences:
        raise ValueError("no sentences to compute attention statistics on (empty corpus)")
    inputs, skipped = _encode_all(fz, sentences)
    if not inputs:
        raise ValueError(f"all {len(sentences)} sentences are longer than the model's positions")
    n_layers, n_heads = fz.model.num_layers, fz.model.num_heads
    sums = {name: torch.zeros(n_layers, n_heads, dtype=torch.float64) for name in STATISTICS}
    n_tokens = 0
    for x, a in _attentions(fz, inputs, batch_size):  # a: (layers, heads, seq, seq)
        n = len(x.input_ids)
        special = [p for p in range(n) if x.word_of[p] < 0 and p != x.cls_position]
        punct = [p for p in range(n) if x.word_of[p] >= 0 and _is_punct(x.words[x.word_of[p]])]
        sums["cls"] += a[..., x.cls_position].sum(-1)
        sums["sep"] += a[..., special].sum((-1, -2))
        sums["prev"] += torch.diagonal(a, offset=-1, dim1=-2, dim2=-1).sum(-1)
        sums["next"] += torch.diagonal(a, offset=1, dim1=-2, dim2=-1).sum(-1)
        sums["self"] += torch.diagonal(a, dim1=-2, dim2=-1).sum(-1)
        sums["punct"] += a[..., punct].sum((-1, -2))
        sums["entropy"] += -(a * torch.log(a.clamp_min(1e-12))).sum((-1, -2))
        n_tokens += n
    pruned = pruned_heads_mask(fz)
    stats = {
        name: [
            [None if p else v for v, p in zip(row, gone)] for row, gone in zip((s / n_tokens).tolist(), pruned.tolist())
        ]
        for name, s in sums.items()
    }
    return AttentionStats(model_name(fz), len(inputs), n_tokens, skipped, stats)


# ---- dependency relations -----------------------------------------------------------------------


@dataclass
class RelationHead:
    relation: str
    count: int  # dependents with this relation
    layer: int  # 1-based
    head: int  # 0-based
    accuracy: float  # of the best head, dependent -> its syntactic head
    baseline_offset: int  # the best fixed offset (head position - dependent position)
    baseline_accuracy: float


@dataclass
class DependencyHeads:
    model: str
    n_sentences: int
    n_skipped: int
    relations: list[RelationHead] = field(default_factory=list)  # most frequent relation first

    def table(self) -> str:
        lines = [
            f"best head per dependency relation | {self.model} | {self.n_sentences} sentences",
            f"{'relation':<14}{'count':>7}{'head':>9}{'acc':>7}{'offset':>8}{'base':>7}",
        ]
        for r in self.relations:
            lines.append(
                f"{r.relation:<14}{r.count:>7}{'L' + str(r.layer) + '-H' + str(r.head):>9}"
                f"{r.accuracy:>7.3f}{r.baseline_offset:>+8d}{r.baseline_accuracy:>7.3f}"
            )
        return "\n".join(lines)

    def save_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def word_attention(x: _Sentence, a: torch.Tensor) -> torch.Tensor:
    """(layers, heads, words, words): row d = attention of word d's pieces (averaged) to word j's pieces (summed)."""
    n_words = len(x.words)
    m = torch.zeros(len(x.input_ids), n_words, dtype=a.dtype)  # (seq, words) piece -> word membership
    for p, w in enumerate(x.word_of):
        if w >= 0:
            m[p, w] = 1.0
    summed = a @ m  # (layers, heads, seq, words)
    return (m.T @ summed) / m.sum(0)[:, None]  # (layers, heads, words, words)


def dependency_heads(fz: Featurizer, sentences: Sequence, batch_size: int = 16, min_count: int = 1) -> DependencyHeads:
    """The best head per relation. `sentences`: parsed sentences with `.words`, `.heads` (1-based, 0 = root) and
    `.deprels`, e.g. from `ctxrep.data.conllu.read_conllu`."""
    if not sentences:
        raise ValueError("no parsed sentences to evaluate attention heads on (empty corpus)")
    for i, s in enumerate(sentences):
        if not len(s.words) == len(s.heads) == len(s.deprels):
            raise ValueError(
                f"sentence {i}: {len(s.words)} words but {len(s.heads)} heads and {len(s.deprels)} relations"
            )
        for d, h in enumerate(s.heads):
            if not 0 <= h <= len(s.words):
                raise ValueError(
                    f"sentence {i}: word {d + 1} has head {h}, outside the sentence's {len(s.words)} words"
                )
    require_attention(fz)
    encoded = [(s, _encode(fz, i, list(s.words))) for i, s in enumerate(sentences)]
    kept = [s for s, x in encoded if x is not None]
    inputs = [x for _, x in encoded if x is not None]
    skipped = len(sentences) - len(inputs)
    n_layers, n_heads = fz.model.num_layers, fz.model.num_heads
    correct: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros(n_layers, n_heads, dtype=torch.long))
    counts: Counter[str] = Counter()
    offsets: dict[str, Counter[int]] = defaultdict(Counter)
    for s, (x, a) in zip(kept, _attentions(fz, inputs, batch_size)):
        predicted = word_attention(x, a).argmax(-1)  # (layers, heads, words)
        for d, (h, rel) in enumerate(zip(s.heads, s.deprels)):
            if h == 0:  # the root has no head word
                continue
            correct[rel] += predicted[..., d] == h - 1
            counts[rel] += 1
            offsets[rel][h - 1 - d] += 1
    rows = []
    pruned = pruned_heads_mask(fz)
    for rel, count in counts.most_common():
        if count < min_count:
            continue
        c = correct[rel].masked_fill(pruned, -1)  # a pruned head is never the best
        layer, head = np.unravel_index(int(c.argmax()), tuple(c.shape))
        offset, hits = offsets[rel].most_common(1)[0]
        rows.append(
            RelationHead(rel, count, int(layer) + 1, int(head), float(c[layer, head]) / count, offset, hits / count)
        )
    return DependencyHeads(model_name(fz), len(inputs), skipped, rows)


# ---- pictures -----------------------------------------------------------------------------------


def check_head(fz: Featurizer, layer: int, head: int) -> None:
    """Refuse a layer (1..L) or head (0..H-1) the model does not have, or a pruned head, saying which exist."""
    require_attention(fz)
    n_layers, n_heads = fz.model.num_layers, fz.model.num_heads
    if not isinstance(layer, int) or not 1 <= layer <= n_layers:
        raise ValueError(f"layer {layer!r} is out of range: the model's attention layers are 1..{n_layers}")
    if not isinstance(head, int) or not 0 <= head < n_heads:
        raise ValueError(f"head {head!r} is out of range: each layer has heads 0..{n_heads - 1}")
    kept = fz.model.kept_heads()[layer - 1]
    if head not in kept:
        raise ValueError(f"head {head} of layer {layer} was pruned; that layer keeps heads {', '.join(map(str, kept))}")


def head_attention(
    fz: Featurizer, sentence: str | Sequence[str], layer: int, head: int
) -> tuple[list[str], np.ndarray]:
    """The tokens of `sentence` and one head's (seq, seq) attention matrix over them (row = query)."""
    check_head(fz, layer, head)
    x = _encode(fz, 0, words_of(sentence, 0))
    if x is None:
        raise ValueError(
            f"the sentence is longer than the model's window of {fz.plan.max_length} pieces; draw a shorter sentence"
        )
    _, a = next(_attentions(fz, [x]))
    return x.tokens, a[layer - 1, head].numpy()


def save_heatmap_png(
    fz: Featurizer, sentence: str | Sequence[str], layer: int, head: int, path: str | os.PathLike
) -> None:
    """A heatmap of one head's attention on one sentence: rows attend (queries), columns are attended to."""
    tokens, a = head_attention(fz, sentence, layer, head)
    tokens = [t.replace("$", r"\$") for t in tokens]  # a '$' would start matplotlib's mathtext
    plt = _pyplot()
    size = min(12.0, 2.0 + 0.28 * len(tokens))
    fig, ax = plt.subplots(figsize=(size + 1, size), dpi=100)
    image = ax.imshow(a, cmap="Blues", vmin=0, vmax=max(1e-6, float(a.max())))
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
    ax.set_xlabel("attended to")
    ax.set_ylabel("attending token")
    ax.set_title(f"layer {layer}, head {head}")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def save_grid_png(grid: np.ndarray, path: str | os.PathLike, title: str = "") -> None:
    """A layer x head grid (layers 1..L down, heads 0..H-1 across) of any per-head statistic."""
    grid = np.asarray(grid, dtype=float)
    if grid.ndim != 2 or not grid.size:
        raise ValueError(f"expected a (layers, heads) grid, got shape {grid.shape}")
    plt = _pyplot()
    n_layers, n_heads = grid.shape
    fig, ax = plt.subplots(figsize=(min(12.0, 1.5 + 0.5 * n_heads), min(10.0, 1.2 + 0.45 * n_layers)), dpi=100)
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers), [str(j + 1) for j in range(n_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if n_heads * n_layers <= 144:
        for (j, h), v in np.ndenumerate(grid):
            if np.isnan(v):  # a pruned head: left blank
                continue
            colour = "white" if v < np.nanmean(grid) else "black"
            ax.text(h, j, f"{v:.2f}", ha="center", va="center", fontsize=6, color=colour)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
