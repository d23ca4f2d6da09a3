"""Linear probes on frozen features: which layer knows what (Tenney et al. 2019, "BERT Rediscovers the
Classical NLP Pipeline"; Liu et al. 2019, "Linguistic Knowledge and Transferability of Contextual
Representations").

For a word-level task every word occurrence gets the frozen vectors of all layers 0..L (0 = embedding
output). Then, trained on the train split and scored on the dev split:
  * one softmax-regression probe per layer j:   p(y | h_j) = softmax(W h_j + b)
  * one probe over a learned ScalarMix of all layers:   p(y | x) = softmax(W (gamma sum_j softmax(s)_j h_j) + b)
    whose weights give the expected layer   E[layer] = sum_j j * softmax(s)_j
  * the same probes on a randomly initialised model of the same shape (the control row): what a probe
    finds there comes from the probe and the word identity, not from what pre-training taught the model.

Tasks: "upos" / "xpos" (CoNLL-U columns 4 / 5), "ner" (the last column of a CoNLL-2003 file) and "wic"
(WiC pairs: the feature of a pair is [u * v, |u - v|] of the two target-word vectors, the label T/F).
Each probe is fitted full-batch with L-BFGS on standardised features; a probe takes seconds.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.analysis._common import model_name, random_control, with_layers
from ctxrep.featurize import Featurizer
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.util.progress import progress as show_progress

TASKS = ("upos", "xpos", "ner", "wic")


@dataclass
class ProbeData:
    """Examples of one task: each example is one word (tagging) or two words (WiC) of `sentences`, and a label."""

    task: str
    sentences: list[list[str]]
    positions: list[tuple[tuple[int, int], ...]]  # per example, its (sentence index, word index) pairs
    labels: list[str]
    source: str = "<memory>"

    @classmethod
    def from_tagged(cls, task: str, sentences: list[list[str]], tags: list[list[str]], source: str = "<memory>"):
        """Every word of every sentence is one example labelled by its tag."""
        for i, (words, t) in enumerate(zip(sentences, tags, strict=True)):
            if len(words) != len(t):
                raise ValueError(f"{source}: sentence {i} has {len(words)} words but {len(t)} tags")
        positions = [((i, j),) for i, words in enumerate(sentences) for j in range(len(words))]
        labels = [tag for t in tags for tag in t]
        return cls(task, sentences, positions, labels, source)

    def __post_init__(self) -> None:
        if not self.positions:
            raise ValueError(f"{self.source}: no examples for task {self.task!r} (empty corpus)")
        for k, example in enumerate(self.positions):
            for s, w in example:
                if not 0 <= s < len(self.sentences):
                    raise ValueError(
                        f"{self.source}: example {k} points at sentence {s}, but there are "
                        f"{len(self.sentences)} sentences"
                    )
                if not 0 <= w < len(self.sentences[s]):
                    raise ValueError(
                        f"{self.source}: example {k}: word index {w} is outside sentence {s}, which "
                        f"has {len(self.sentences[s])} words"
                    )


def load_probe_data(task: str, path: str | os.PathLike, max_sentences: int | None = None) -> ProbeData:
    """Read a task's examples: a CoNLL-U file (upos, xpos), a CoNLL-2003 file (ner), or a WiC data file whose
    gold file sits beside it (wic; a folder holding one *.data.txt also works). `max_sentences` keeps the first
    sentences (WiC: pairs)."""
    if task not in TASKS:
        raise ValueError(f"unknown probing task {task!r}; choose one of {', '.join(TASKS)}")
    path = Path(path)
    if task == "wic":
        return _load_wic(path, max_sentences)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such {task} data file")
    if task in ("upos", "xpos"):
        from ctxrep.data.conllu import read_conllu

        sentences = read_conllu(path)[:max_sentences]
        tags = [s.upos if task == "upos" else s.xpos for s in sentences]
        if sentences and all(t == "_" for ts in tags for t in ts):
            raise ValueError(f"{path}: the {task.upper()} column is empty ('_') in every word; use another task")
        return ProbeData.from_tagged(task, [s.words for s in sentences], tags, str(path))
    from ctxrep.data.conll import read_conll

    sentences = read_conll(path)[:max_sentences]
    return ProbeData.from_tagged(task, [s.words for s in sentences], [s.tags for s in sentences], str(path))


def _wic_files(path: Path) -> tuple[Path, Path]:
    if path.is_dir():
        found = sorted(path.glob("*.data.txt"))
        if len(found) != 1:
            raise FileNotFoundError(f"{path}: expected one *.data.txt file in the folder, found {len(found)}")
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such WiC data file")
    if not path.name.endswith(".data.txt"):
        raise ValueError(f"{path}: a WiC data file is named *.data.txt (its labels in *.gold.txt beside it)")
    gold = path.with_name(path.name[: -len(".data.txt")] + ".gold.txt")
    if not gold.is_file():
        raise FileNotFoundError(f"{gold}: the gold labels of {path} are missing")
    return path, gold


def read_wic_pairs(path: str | os.PathLike, max_pairs: int | None = None):
    """WiC pairs with labels from a *.data.txt file (or a folder holding one) and its *.gold.txt."""
    from ctxrep.data.wic import read_wic

    data, gold = _wic_files(Path(path))
    pairs = read_wic(data, gold)[:max_pairs]
    if not pairs:
        raise ValueError(f"{data}: no WiC pairs (empty file)")
    return pairs


def _load_wic(path: Path, max_pairs: int | None) -> ProbeData:
    pairs = read_wic_pairs(path, max_pairs)
    sentences, positions, labels = [], [], []
    for p in pairs:
        positions.append(((len(sentences), p.idx1), (len(sentences) + 1, p.idx2)))
        sentences += [p.sentence1, p.sentence2]
        labels.append("T" if p.label else "F")
    return ProbeData("wic", sentences, positions, labels, str(path))


def extract_features(fz: Featurizer, data: ProbeData) -> np.ndarray:
    """(examples, n_layers + 1, dim) float32: the word vector of every layer, [u*v, |u-v|] for two-word examples."""
    vectors = with_layers(fz, "all").embed_words(data.sentences)  # per sentence (words, layers, dim)
    width = len(data.positions[0])
    if any(len(p) != width for p in data.positions):
        raise ValueError(f"{data.source}: examples mix one-word and two-word positions")
    if width == 1:
        return np.stack([vectors[s][w] for ((s, w),) in data.positions])
    if width == 2:
        u = np.stack([vectors[s][w] for (s, w), _ in data.positions])
        v = np.stack([vectors[s][w] for _, (s, w) in data.positions])
        return np.concatenate([u * v, np.abs(u - v)], axis=-1)
    raise ValueError(f"{data.source}: examples have {width} words; probes take one or two")


# ---- fitting ------------------------------------------------------------------------------------


def _standardise(train: torch.Tensor, dev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature z-scores with the train statistics (over examples; the layer axis is kept apart)."""
    mean = train.mean(0, keepdim=True)
    std = train.std(0, keepdim=True).clamp_min(1e-6)
    return (train - mean) / std, (dev - mean) / std


def _lbfgs(params, loss_fn, max_iter: int) -> None:
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)


def fit_linear_probe(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float, max_iter: int) -> nn.Linear:
    """Softmax regression: minimise cross-entropy + l2 * ||W||^2 with full-batch L-BFGS."""
    linear = nn.Linear(x.shape[1], n_classes)
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    _lbfgs(
        linear.parameters(),
        lambda: nn.functional.cross_entropy(linear(x), y) + l2 * linear.weight.pow(2).sum(),
        max_iter,
    )
    return linear


class MixProbe(nn.Module):
    """softmax(W (gamma sum_j softmax(s)_j h_j) + b): a ScalarMix over all layers under one linear probe."""

    def __init__(self, n_layers: int, dim: int, n_classes: int) -> None:
        super().__init__()
        self.mix = ScalarMix(n_layers)
        self.linear = nn.Linear(dim, n_classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (examples, layers, dim) -> logits (examples, classes)."""
        return self.linear(self.mix(x.transpose(0, 1)))  # mix over (layers, examples, dim)

    @property
    def mix_weights_(self) -> np.ndarray:
        """The learned layer weights softmax(s)_j, layer 0 (embeddings) first; they sum to 1."""
        return self.mix.weights.detach().cpu().numpy().astype(np.float64)

    @property
    def mix_gamma_(self) -> float:
        """The learned scale gamma."""
        return float(self.mix.gamma.detach().reshape(-1)[0])


def fit_mix_probe(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float, max_iter: int) -> MixProbe:
    probe = MixProbe(x.shape[1], x.shape[2], n_classes)
    _lbfgs(
        probe.parameters(),
        lambda: nn.functional.cross_entropy(probe(x), y) + l2 * probe.linear.weight.pow(2).sum(),
        max_iter,
    )
    return probe


# ---- results ------------------------------------------------------------------------------------


@dataclass
class ProbeRow:
    """One model's probes: dev accuracy per layer (0 = embeddings), of the mix probe, and its layer weights."""

    name: str
    layer_accuracy: list[float]
    mix_accuracy: float
    mix_weights: list[float]
    expected_layer: float  # sum_j j * softmax(s)_j
    mix_gamma: float = 1.0  # the mix probe's learned scale gamma


@dataclass
class ProbeResult:
    task: str
    model: str
    labels: list[str]
    n_train: int
    n_dev: int
    majority_accuracy: float  # always predicting the most frequent train label, on dev
    rows: list[ProbeRow]  # the model, then the random-init control (if run)

    @property
    def mix_weights_(self) -> np.ndarray:
        """The model's learned layer weights softmax(s)_j (its mix probe; layer 0 = embeddings); they sum to 1."""
        return np.asarray(self.rows[0].mix_weights, dtype=np.float64)

    @property
    def mix_gamma_(self) -> float:
        """The model's mix probe's learned scale gamma."""
        return self.rows[0].mix_gamma

    def table(self) -> str:
        """A plain-text table: accuracy by layer, the mix probe, E[layer], and each row's mix weights."""
        n = len(self.rows[0].layer_accuracy)
        head = f"{'':<21}" + "".join(f"{'L' + str(j):>7}" for j in range(n)) + f"{'mix':>7}{'E[layer]':>10}"
        lines = [
            f"probe {self.task} | {self.model} | {self.n_train} train / {self.n_dev} dev examples, "
            f"{len(self.labels)} labels, majority baseline {self.majority_accuracy:.3f}",
            head,
        ]
        for row in self.rows:
            accs = "".join(f"{a:>7.3f}" for a in row.layer_accuracy)
            lines.append(f"{row.name:<21}{accs}{row.mix_accuracy:>7.3f}{row.expected_layer:>10.2f}")
        for row in self.rows:
            lines.append(f"{row.name + ' weights':<21}" + "".join(f"{w:>7.3f}" for w in row.mix_weights))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)

    def save_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def save_plot(self, path: str | os.PathLike) -> None:
        """Bar plot of dev accuracy by layer (model and control), the model's mix weights overlaid."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = len(self.rows[0].layer_accuracy)
        layers = np.arange(n)
        width = 0.8 / len(self.rows)
        fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * n + 2), 3.6), dpi=100)
        for k, (row, colour) in enumerate(zip(self.rows, ("tab:blue", "tab:grey"))):
            ax.bar(
                layers + (k - (len(self.rows) - 1) / 2) * width,
                row.layer_accuracy,
                width,
                color=colour,
                label=f"{row.name} (mix {row.mix_accuracy:.3f})",
            )
        ax.axhline(self.rows[0].mix_accuracy, color="tab:blue", linestyle="--", linewidth=1)
        ax.axhline(self.majority_accuracy, color="black", linestyle=":", linewidth=1, label="majority")
        ax.set_xticks(layers)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("dev accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(f"{self.task} probe, E[layer] = {self.rows[0].expected_layer:.2f}")
        weights = ax.twinx()
        weights.plot(layers, self.rows[0].mix_weights, color="tab:red", marker="o", label="mix weights")
        weights.set_ylabel("mix weight softmax(s)_j", color="tab:red")
        weights.set_ylim(0, max(1e-3, max(self.rows[0].mix_weights)) * 1.15)
        handles = ax.get_legend_handles_labels()
        more = weights.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, format="png")
        plt.close(fig)


def _probe_row(
    name: str, x_train, y_train, x_dev, y_dev, n_classes: int, l2: float, max_iter: int, bar=None
) -> ProbeRow:
    bar = bar if bar is not None else show_progress(enabled=False)
    x_train, x_dev = _standardise(torch.from_numpy(x_train), torch.from_numpy(x_dev))
    accs = []
    for j in range(x_train.shape[1]):
        linear = fit_linear_probe(x_train[:, j], y_train, n_classes, l2, max_iter)
        with torch.no_grad():
            accs.append(float((linear(x_dev[:, j]).argmax(-1) == y_dev).float().mean()))
        bar.update(1)
    mix = fit_mix_probe(x_train, y_train, n_classes, l2, max_iter)
    bar.update(1)
    with torch.no_grad():
        mix_acc = float((mix(x_dev).argmax(-1) == y_dev).float().mean())
        weights = mix.mix.weights
        expected = float((weights * torch.arange(len(weights), dtype=weights.dtype)).sum())
    return ProbeRow(name, accs, mix_acc, [float(w) for w in weights], expected, mix.mix_gamma_)


def run_probe(
    fz: Featurizer,
    train: ProbeData,
    dev: ProbeData,
    control: bool = True,
    l2: float = 1e-3,
    max_iter: int = 100,
    seed: int = 0,
    progress: bool = False,
) -> ProbeResult:
    """Probe every layer and a ScalarMix of all layers of `fz`'s model (and of a random-init control).
    progress: say what is being done on stderr (a bar on a terminal, plain lines in a log)."""
    if train.task != dev.task:
        raise ValueError(f"train is task {train.task!r} but dev is task {dev.task!r}")
    labels = sorted(set(train.labels))
    if len(labels) < 2:
        raise ValueError(f"{train.source}: only one label ({labels[0]!r}) in the training data; a probe needs two")
    index = {label: i for i, label in enumerate(labels)}
    y_train = torch.tensor([index[t] for t in train.labels])
    y_dev = torch.tensor([index.get(t, -1) for t in dev.labels])  # a label unseen in train is always wrong
    majority = Counter(train.labels).most_common(1)[0][0]
    majority_acc = sum(t == majority for t in dev.labels) / len(dev.labels)
    models = [("model", fz)] + ([("random-init", random_control(fz, seed))] if control else [])
    n_probes = fz.num_layers + 2  # one per layer (embeddings included) and the mix
    bar = show_progress(total=len(models) * n_probes, desc="probe", unit="probes", enabled=progress)
    rows = []
    for name, f in models:
        torch.manual_seed(seed)
        bar.set_postfix_str(f"{name}: featurizing {len(train.sentences) + len(dev.sentences):,} sentences")
        x_train, x_dev = extract_features(f, train), extract_features(f, dev)
        bar.set_postfix_str(f"{name}: fitting")
        rows.append(_probe_row(name, x_train, y_train, x_dev, y_dev, len(labels), l2, max_iter, bar))
    bar.set_postfix_str("")
    bar.close()
    return ProbeResult(train.task, model_name(fz), labels, len(train.labels), len(dev.labels), majority_acc, rows)


def split_data(data: ProbeData, dev_fraction: float = 0.2) -> tuple[ProbeData, ProbeData]:
    """Split by sentence (WiC: by pair): the last `dev_fraction` of the examples' sentences become dev."""
    groups = sorted({p[0][0] for p in data.positions})
    if len(groups) < 2:
        raise ValueError(f"{data.source}: {len(groups)} sentence(s) cannot be split into train and dev")
    cut = groups[min(len(groups) - 1, max(1, round(len(groups) * (1 - dev_fraction))))]

    def part(keep) -> ProbeData:
        chosen = [k for k, p in enumerate(data.positions) if keep(p[0][0])]
        used = sorted({s for k in chosen for s, _ in data.positions[k]})
        new_index = {s: i for i, s in enumerate(used)}
        positions = [tuple((new_index[s], w) for s, w in data.positions[k]) for k in chosen]
        return ProbeData(
            data.task, [data.sentences[s] for s in used], positions, [data.labels[k] for k in chosen], data.source
        )

    return part(lambda s: s < cut), part(lambda s: s >= cut)
