"""Attention-head importance and pruning (Michel, Levy and Neubig 2019, "Are sixteen heads really better than one?").

Mask variables. Every head h of every layer gets a variable xi_h multiplying its output (sec. 2.1):

    MHAtt(x) = sum_h xi_h Att_h(x),    xi_h = 1 for the model as trained.

Importance (sec. 4.1, after Molchanov et al. 2017): the expected absolute sensitivity of the loss to xi_h,

    I_h = E_{x ~ X} | dL(x) / d xi_h |,

estimated here as the mean over batches of |d L_batch / d xi| at xi = 1 (with one example per batch this is exactly
the expectation above; larger batches average gradients inside a batch first, as the authors' code does), and
normalised per layer by its L2 norm, I_l,h / ||I_l||_2 (the authors' code, exponent 2), so that layers compare.
X is training data: importance is never computed on the dev set that pruning is then scored on.

Pruning removes the least important heads across all layers, in steps, recomputing importance after each step
(the paper's iterative procedure, sec. 4.2), and always keeps at least one head per layer. Removal is real:
the encoder's `prune_heads` drops those heads' query/key/value rows and output columns.

Everything here takes any encoder with `can_prune_heads` (`prunable_families()`: the BERT family, XLM-R, CamemBERT,
DistilBERT, MPNet, T5 and mT5, DeBERTa-v2/v3, ModernBERT), a list of batches and a loss function; only
`estimator_loss` knows about ctxrep's task estimators. A pruned folder records config.pruned_heads (transformers 4's
field) and loads back in ctxrep; transformers 5 has no head pruning and refuses the smaller weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

logger = logging.getLogger(__name__)

Batch = Any  # whatever loss_fn reads: usually a dict of tensors


# ---- which encoders can be pruned -----------------------------------------------------------------------------


def prunable_families() -> list[str]:
    """Model families (config.json's model_type) whose encoder class can remove heads (`can_prune_heads`)."""
    from ctxrep.models.loading import FAMILIES

    return sorted(name for name, cls in FAMILIES.items() if cls.can_prune_heads)


def check_prunable(encoder: nn.Module) -> None:
    """Refuse, in one line, an encoder that cannot have heads masked and removed."""
    if getattr(encoder, "can_prune_heads", False):  # an Encoder's capability; any other module: no
        return
    family = getattr(encoder, "family", type(encoder).__name__)
    raise ValueError(
        f"a {family} model cannot be pruned: attention-head pruning is implemented for "
        f"{', '.join(prunable_families())}; fine-tune one of those to prune it"
    )


def pruned_heads(encoder: nn.Module) -> dict[int, list[int]]:
    """The heads removed so far, {layer: [heads]} in the original numbering (config.pruned_heads, transformers'
    field for every family)."""
    return {int(k): sorted(v) for k, v in getattr(encoder.config, "pruned_heads", {}).items() if v}


def pruned_fraction(encoder: nn.Module) -> float:
    """Share of the original num_layers * num_heads heads that have been removed."""
    total = encoder.num_layers * encoder.num_heads
    return (total - sum(encoder.heads_per_layer())) / total


# ---- importance ------------------------------------------------------------------------------------------------


@contextmanager
def head_mask_applied(encoder: nn.Module, head_mask: torch.Tensor):
    """Within the block, every forward call of `encoder` (however deep in a task network) gets `head_mask`."""

    def hook(module, args, kwargs):
        return args, kwargs | {"head_mask": head_mask}

    handle = encoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def normalize_per_layer(importance: torch.Tensor) -> torch.Tensor:
    """I_l,h / ||I_l||_2 for each layer l (row); a row of zeros stays zeros."""
    return importance / (importance.norm(p=2, dim=-1, keepdim=True) + 1e-20)


def head_importance(
    encoder: nn.Module,
    batches: Iterable[Batch],
    loss_fn: Callable[[Batch], torch.Tensor],
    normalize: bool = True,
) -> torch.Tensor:
    """Michel et al.'s head importance, (num_layers, num_heads) in the original head numbering.

    `loss_fn(batch)` must run `encoder` (directly, or inside the task network that holds it) and return a scalar
    loss; the mask variables xi are passed to every encoder call while it runs. The result is the mean over
    `batches` of |dL/dxi| (see the module docstring), divided per layer by its L2 norm unless `normalize=False`.
    Heads already pruned get 0.

    Give training data (a held-out slice of it), never the dev or test set that the pruned model is scored on:
    choosing heads on the evaluation data would leak it into the model. Modes are left as they are: put the network
    in eval mode first for a deterministic answer (estimator_loss's loss_fn does).
    """
    check_prunable(encoder)
    device = next(encoder.parameters()).device
    xi = torch.ones(encoder.num_layers, encoder.num_heads, device=device, requires_grad=True)  # (layers, heads)
    total = torch.zeros(encoder.num_layers, encoder.num_heads, device=device)
    n = 0
    with torch.enable_grad(), head_mask_applied(encoder, xi):
        for batch in batches:
            loss = loss_fn(batch)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar tensor (the batch's mean loss), got {_describe(loss)}")
            try:
                (grad,) = torch.autograd.grad(loss, xi)
            except RuntimeError as e:
                raise ValueError(
                    "loss_fn's loss does not depend on the encoder's heads: loss_fn must run this encoder "
                    f"(the head mask is passed to its forward calls) and keep the graph ({e})"
                ) from None
            total += grad.abs()
            n += 1
    if n == 0:
        raise ValueError("head_importance got no batches: give at least one batch of training examples")
    importance = total / n
    return normalize_per_layer(importance) if normalize else importance


def _describe(x) -> str:
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def heatmap_png(
    importance: torch.Tensor, path: str | Path, pruned: Mapping[int, Sequence[int]] | None = None, title: str = ""
) -> Path:
    """Layers (rows, layer 0 at the top) x heads (columns) of importance; heads in `pruned` are marked x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = importance.detach().float().cpu().numpy()
    layers, heads = values.shape
    fig, ax = plt.subplots(figsize=(1.5 + 0.45 * heads, 1.0 + 0.4 * layers))
    image = ax.imshow(values, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, label="importance (normalised per layer)")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if heads * layers <= 400:
        for layer in range(layers):
            for head in range(heads):
                gone = pruned is not None and head in pruned.get(layer, ())
                text = "x" if gone else f"{values[layer, head]:.2f}"
                ax.text(head, layer, text, ha="center", va="center", fontsize=6, color="white")
    ax.set_title(title or "attention-head importance (Michel et al. 2019)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- pruning ---------------------------------------------------------------------------------------------------


def least_important(importance: torch.Tensor, alive: Sequence[Sequence[int]], count: int) -> dict[int, list[int]]:
    """The `count` live heads of lowest importance over all layers, keeping at least one head in every layer.
    `alive[l]` lists layer l's remaining heads (original numbering). Ties go to the lower layer, then head."""
    remaining = [len(heads) for heads in alive]
    candidates = sorted(
        (float(importance[layer, head]), layer, head) for layer, heads in enumerate(alive) for head in heads
    )
    chosen: dict[int, list[int]] = {}
    for _, layer, head in candidates:
        if sum(len(v) for v in chosen.values()) == count:
            break
        if remaining[layer] > 1:
            chosen.setdefault(layer, []).append(head)
            remaining[layer] -= 1
    taken = sum(len(v) for v in chosen.values())
    if taken < count:
        raise ValueError(f"only {taken} heads can go while keeping one head per layer, not {count}")
    return {layer: sorted(heads) for layer, heads in sorted(chosen.items())}


@dataclass
class PruneStep:
    """One step of iterative pruning: the importance it used and the heads it removed."""

    step: int
    heads: dict[int, list[int]]  # removed in this step, original numbering
    fraction: float  # share of all original heads removed after this step
    importance: torch.Tensor  # (layers, heads) computed before this step's removal


def prune_iteratively(
    encoder: nn.Module,
    importance_fn: Callable[[nn.Module], torch.Tensor],
    fraction: float,
    steps: int = 1,
    after_step: Callable[[PruneStep], None] | None = None,
) -> list[PruneStep]:
    """Remove the least important heads until `fraction` of the original num_layers * num_heads heads are gone, in
    `steps` equal steps; `importance_fn(encoder)` is recomputed before each step (on the encoder as pruned so far).
    At least one head stays in every layer, so fraction can be at most (heads - layers) / heads. Heads pruned
    before the call count towards the fraction. `after_step(step)` runs after each removal (e.g. to score it).
    Prunes `encoder` in place; rebuild any optimizer over its parameters afterwards."""
    check_prunable(encoder)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1) (the share of heads to remove), got {fraction!r}")
    layers, heads = encoder.num_layers, encoder.num_heads
    total = layers * heads
    target = round(fraction * total)
    most = total - layers
    if target > most:
        raise ValueError(
            f"fraction {fraction} would remove {target} of {total} heads, but each of the {layers} layers keeps at "
            f"least one: at most {most} heads (fraction {most / total:.3f}) can go; lower the fraction"
        )
    done = total - sum(encoder.heads_per_layer())
    if target < done:
        raise ValueError(
            f"the model already has {done} of {total} heads pruned (fraction {done / total:.3f}); ask for a fraction "
            "at least that large"
        )
    history = []
    for step in range(1, steps + 1):
        goal = done + round((target - done) * step / steps)  # heads gone after this step
        count = goal - (total - sum(encoder.heads_per_layer()))
        if count == 0:
            continue
        importance = importance_fn(encoder)
        if tuple(importance.shape) != (layers, heads):
            raise ValueError(
                f"importance_fn returned shape {tuple(importance.shape)}; expected (num_layers, num_heads) = "
                f"({layers}, {heads})"
            )
        gone = pruned_heads(encoder)
        alive = [[h for h in range(heads) if h not in gone.get(layer, ())] for layer in range(layers)]
        chosen = least_important(importance, alive, count)
        encoder.prune_heads(chosen)
        record = PruneStep(step, chosen, pruned_fraction(encoder), importance.detach().cpu())
        logger.info("pruning step %d: removed %s (fraction %.3f)", step, chosen, record.fraction)
        history.append(record)
        if after_step is not None:
            after_step(record)
    return history


def accuracy_curve(
    encoder: nn.Module,
    importance_fn: Callable[[nn.Module], torch.Tensor],
    score_fn: Callable[[], float],
    fraction: float,
    steps: int,
    png: str | Path | None = None,
    score_name: str = "score",
) -> list[tuple[float, float]]:
    """The paper's curve (fig. 3 there): [(fraction of heads pruned, score)] from the encoder as given through each
    of `steps` pruning steps up to `fraction` (prune_iteratively; the encoder is pruned in place). `score_fn()`
    scores the model that holds the encoder on held-out data (dev), not on the data importance is computed on.
    With `png`, also draws the curve there."""
    points = [(pruned_fraction(encoder), float(score_fn()))]
    prune_iteratively(
        encoder,
        importance_fn,
        fraction,
        steps,
        after_step=lambda record: points.append((record.fraction, float(score_fn()))),
    )
    if png is not None:
        curve_png(points, png, score_name)
    return points


def curve_png(points: Sequence[tuple[float, float]], path: str | Path, score_name: str = "score") -> Path:
    """Score against the fraction of heads pruned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([100 * f for f, _ in points], [s for _, s in points], marker="o")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(score_name)
    ax.grid(True, alpha=0.3)
    ax.set_title("score against heads pruned (Michel et al. 2019, fig. 3)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- the task loss of a fine-tuned ctxrep estimator -------------------------------------------------------------


class TaskLoss(NamedTuple):
    """What head_importance takes: head_importance(*estimator_loss(estimator, X, y))."""

    encoder: nn.Module
    batches: list
    loss_fn: Callable[[Batch], torch.Tensor]


def estimator_loss(estimator, X, y, batch_size: int | None = None) -> TaskLoss:
    """The encoder of a fitted finetune-mode estimator (SequenceClassifier, TokenTagger, SpanExtractor), X and y
    made into its batches, and its task loss on a batch (network in eval mode). X, y: training examples, in the
    form the estimator's fit takes (see head_importance: never the dev set).

    Uses the estimator's fitted network `model_` (forward(batch) -> the head's logits, with the encoder at
    `model_.representation.encoder`) and its public seam (tasks/base.py): task_batches, task_loss."""
    network = getattr(estimator, "model_", None)
    if network is None:
        raise ValueError(f"this {type(estimator).__name__} is not fitted: fit it (or load a saved one) before pruning")
    if not network.representation.trains_encoder:  # frozen: a mix and head over cached features
        raise ValueError(
            f"this {type(estimator).__name__} was trained with mode={estimator.mode!r}: its encoder is not part of the "
            "task model, so there are no heads to prune; fine-tune one with mode='finetune'"
        )
    encoder = network.representation.encoder
    check_prunable(encoder)
    if len(X) == 0:
        raise ValueError("no examples to compute head importance on: give at least one training example")
    batches = estimator.task_batches(X, y, batch_size)

    def loss_fn(batch: Batch) -> torch.Tensor:
        network.eval()
        return estimator.task_loss(network(batch), batch)

    return TaskLoss(encoder, batches, loss_fn)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---- the whole workflow on a fitted estimator (what `ctxrep prune` runs) -----------------------------------------


def prune_estimator(
    estimator,
    X,
    y,
    fraction: float,
    out: str | Path,
    *,
    steps: int = 1,
    dev: tuple | None = None,
    curve: bool = False,
    finetune_epochs: int = 0,
    importance_fraction: float = 0.1,
    batch_size: int = 32,
    seed: int = 0,
    score_name: str = "dev score",
    about: Mapping[str, Any] | None = None,
    after_step: Callable[[PruneStep, float | None], None] | None = None,
) -> dict:
    """Prune a fitted finetune-mode estimator's encoder and save the result to `out`; returns the report.

    X, y: the training examples. Head importance is computed on a held-out slice of them (`importance_fraction`,
    drawn with `seed`; never on `dev`); `fraction` of all heads go in `steps` steps (prune_iteratively), and with
    `finetune_epochs` the pruned model trains that many epochs on the rest. `dev = (X_dev, y_dev)` is scored before
    and after (and at every step with `curve`). `after_step(step, dev score or None)` runs after each removal.
    `about` (e.g. the model folder and task) opens the report. The estimator is pruned in place. `out` gets:

        config.json, model.safetensors, tokenizer files   the pruned encoder (config.pruned_heads)
        estimator/        the pruned task model (<Class>.load; its `model` parameter is `out`)
        importance.png    head importance of the model as given, layers x heads
        curve.png         with `curve`: dev score against the fraction of heads pruned
        prune.json        the report: steps (importance, heads removed), parameter counts, scores
    """
    from ctxrep.models.loading import resolve_model_path

    _check_settings(curve, dev, importance_fraction, finetune_epochs, batch_size)
    out = Path(out)
    base_folder = resolve_model_path(estimator.model)
    if out.resolve() == base_folder.resolve():
        raise ValueError(f"out {out} is the folder of the encoder being pruned; give a new folder")
    held, rest = _importance_split(len(X), importance_fraction, seed, finetune_epochs)
    X_held, y_held = [X[i] for i in held], [y[i] for i in held]

    task_loss = estimator_loss(estimator, X_held, y_held, batch_size)  # refuses frozen and unprunable models
    encoder = task_loss.encoder

    def importance_fn(enc: nn.Module) -> torch.Tensor:
        return head_importance(enc, task_loss.batches, task_loss.loss_fn)

    def score() -> float:
        return float(estimator.score(*dev))

    report: dict = dict(about or {}) | {
        "fraction": fraction,
        "steps": steps,
        "importance_examples": len(X_held),
        "parameters_before": parameter_count(encoder),
    }
    if dev is not None:
        report["dev_score_before"] = score()
    out.mkdir(parents=True, exist_ok=True)
    points = [(pruned_fraction(encoder), report["dev_score_before"])] if curve else []
    history = _prune_scored(encoder, importance_fn, fraction, steps, points, score if curve else None, after_step)
    first = history[0].importance if history else importance_fn(encoder)
    heatmap_png(first, out / "importance.png", title="head importance before pruning (held-out training slice)")
    if curve:
        curve_png(points, out / "curve.png", score_name)
        report["curve"] = [{"fraction": f, "dev_score": s} for f, s in points]
    report["steps_log"] = _steps_log(history)
    if finetune_epochs:
        _finetune_more(estimator, [X[i] for i in rest], [y[i] for i in rest], finetune_epochs)
    report |= _pruned_summary(encoder) | {"finetune_epochs": finetune_epochs}
    if dev is not None:
        report["dev_score_after"] = score()
    _save_pruned(estimator, encoder, base_folder, out, report)
    return report


def _check_settings(curve: bool, dev, importance_fraction: float, finetune_epochs: int, batch_size: int) -> None:
    """prune_estimator's settings checked before anything is loaded or pruned."""
    if curve and dev is None:
        raise ValueError("curve scores every pruning step on held-out data: give dev (importance uses X, y only)")
    if not 0 < importance_fraction < 1:
        raise ValueError(f"importance_fraction must be in (0, 1), got {importance_fraction}")
    if finetune_epochs < 0 or batch_size < 1:
        raise ValueError("finetune_epochs must be >= 0 and batch_size >= 1")


def _prune_scored(
    encoder: nn.Module,
    importance_fn: Callable[[nn.Module], torch.Tensor],
    fraction: float,
    steps: int,
    points: list[tuple[float, float]],
    score: Callable[[], float] | None,
    after_step: Callable[[PruneStep, float | None], None] | None,
) -> list[PruneStep]:
    """prune_iteratively; with `score`, (fraction pruned, score) is appended to `points` after each step, and
    `after_step(step, that score or None)` runs after it."""

    def step_done(record: PruneStep) -> None:
        if score is not None:
            points.append((record.fraction, score()))
        if after_step is not None:
            after_step(record, points[-1][1] if score is not None else None)

    return prune_iteratively(encoder, importance_fn, fraction, steps, after_step=step_done)


def _pruned_summary(encoder: nn.Module) -> dict:
    """prune.json's account of the pruned encoder: heads removed and left per layer, fraction, parameters."""
    return {
        "pruned_heads": {str(k): v for k, v in pruned_heads(encoder).items()},
        "heads_per_layer": encoder.heads_per_layer(),
        "fraction_pruned": pruned_fraction(encoder),
        "parameters_after": parameter_count(encoder),
    }


def _importance_split(n: int, importance_fraction: float, seed: int, finetune_epochs: int):
    """Indices (sorted) of the held-out slice head importance is computed on, and of the rest (fine-tuned on)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(n)
    n_held = max(1, round(importance_fraction * n))
    held, rest = np.sort(order[:n_held]), np.sort(order[n_held:])
    if finetune_epochs and len(rest) == 0:
        raise ValueError(
            "no training examples left to fine-tune on after holding out the importance slice; "
            "lower importance_fraction or add data"
        )
    return held, rest


def _steps_log(history: Sequence[PruneStep]) -> list[dict]:
    """prune.json's record of each step: heads removed, fraction pruned after it, the importance it used."""
    return [
        {
            "step": r.step,
            "removed": {str(k): v for k, v in r.heads.items()},
            "fraction": r.fraction,
            "importance": r.importance.tolist(),
        }
        for r in history
    ]


def _finetune_more(estimator, X, y, epochs: int) -> None:
    """`epochs` more epochs of the (pruned) estimator on X, y, its own warm_start and max_epochs restored after."""
    warm, max_epochs = estimator.warm_start, estimator.max_epochs
    estimator.set_params(warm_start=True, max_epochs=epochs)
    estimator.fit(X, y)
    estimator.set_params(warm_start=warm, max_epochs=max_epochs)


def _save_pruned(estimator, encoder: nn.Module, base_folder: Path, out: Path, report: dict) -> None:
    """The pruned encoder with the tokenizer files of `base_folder`, the task model under estimator/, then prune.json
    (written last)."""
    import json
    import shutil

    from ctxrep.text.tokenizer_files import TOKENIZER_FILES

    encoder.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (base_folder / name).is_file():
            shutil.copy(base_folder / name, out / name)
    estimator.set_params(model=str(out.resolve()))  # the saved task model rebuilds its (pruned) encoder from out
    estimator.save(out / "estimator")
    (out / "prune.json").write_text(json.dumps(report, indent=2) + "\n")


__all__ = [
    "PruneStep",
    "TaskLoss",
    "accuracy_curve",
    "check_prunable",
    "curve_png",
    "estimator_loss",
    "head_importance",
    "head_mask_applied",
    "heatmap_png",
    "least_important",
    "normalize_per_layer",
    "parameter_count",
    "prunable_families",
    "prune_estimator",
    "prune_iteratively",
    "pruned_fraction",
    "pruned_heads",
]
