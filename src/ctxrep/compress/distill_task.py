"""Task-specific distillation: a fine-tuned estimator (the teacher) teaches a smaller estimator of the same class.

    student = distill_estimator(teacher, X, y, student_layers=3, temperature=2.0, alpha=0.5, hidden_loss="cosine")
    save_distilled(student, "out")     # out/model: the estimator (<Class>.load), out/encoder: a Hugging Face folder

The teacher is any fitted finetune-mode SequenceClassifier, TokenTagger or SpanExtractor (tasks/); X, y are the
task's training examples in the form its fit takes. The student is an estimator of the teacher's class with the
teacher's parameters, labels and tokenizer; its encoder is initialised from the teacher's (models/student.py:
K of the teacher's layers, every other one by default as DistilBERT; a layer list; or a narrower fresh encoder),
its head is a copy of the teacher's head when the widths agree (else fresh). It is trained by the estimators'
own fit on the one training loop (ctxrep.train.trainer) on

    L = alpha L_kd + (1 - alpha) L_task + beta L_hidden
    L_kd     = T^2 / n sum_i KL(softmax(z^t_i / T) || softmax(z^s_i / T))    (Hinton et al. 2015, sec. 2: soft
               targets at temperature T, scaled by T^2 so that their gradients keep the size of the hard-label ones)
    L_task   the estimator's own loss on the hard labels (cross-entropy; the CRF's NLL; start/end cross-entropy)
    L_hidden = 1/K sum_{j=1..K} d(H^s_j W_h, H^t_{g(j)})    over real pieces, d = 1 - cos (DistilBERT's cosine
               loss) or MSE (TinyBERT, Jiao et al. 2020, eq. 8); g(j) = layers[j - 1] + 1, the teacher layer the
               student layer came from; W_h a learned projection when the widths differ (else the identity)

The rows i of L_kd are what each task predicts: one distribution over classes per text (SequenceClassifier); one
over labels per word, padding words left out (TokenTagger; with crf=True the per-word softmax of the CRF's
emissions); one over pieces for the start and one for the end of each window (SpanExtractor).

The teacher runs in eval mode without gradients on every batch the student trains on (same tokenizer, same
windows); it is left as it was. The result is a normal estimator: its `model` parameter is the folder its encoder
lives in (`encoder_dir`: config.json, model.safetensors and the teacher's tokenizer files), which
transformers' AutoModel loads, and `save` / `<Class>.load` / `predict` work as for any fitted estimator.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from ctxrep.models.encoder import Encoder
from ctxrep.models.loading import LoadedEncoder, load_encoder, resolve
from ctxrep.models.student import choose_layers, distillable_families, init_student, spread_layers
from ctxrep.objectives.distill import cosine_loss, hidden_mse, soft_target_kl
from ctxrep.text.tokenizer_files import TOKENIZER_FILES
from ctxrep.train.trainer import seeded_torch

logger = logging.getLogger(__name__)

HIDDEN_LOSSES = (None, "cosine", "mse")


# ---- the loss terms --------------------------------------------------------------------------------------------


def soft_target_rows(estimator, logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """The (n, outcomes) rows whose distributions L_kd compares, from a task head's logits (see the module
    docstring): classifier (batch, classes) as is; tagger (batch, words, labels) at real words only; span
    extractor (batch, pieces, 2) as the start and the end distribution of each window."""
    from ctxrep.tasks import SequenceClassifier, SpanExtractor, TokenTagger

    if isinstance(estimator, SequenceClassifier):
        return logits  # (batch, classes)
    if isinstance(estimator, TokenTagger):
        real = batch["pool"].sum(dim=-1) > 0  # (batch, words): a padded word pools no piece
        return logits[real]  # (real words, labels)
    if isinstance(estimator, SpanExtractor):
        return logits.transpose(1, 2).flatten(0, 1)  # (batch * 2, pieces): start rows and end rows
    raise TypeError(
        f"cannot distil a {type(estimator).__name__}: task-specific distillation takes a SequenceClassifier, "
        "TokenTagger or SpanExtractor"
    )


def kd_loss(
    estimator, student_logits: torch.Tensor, teacher_logits: torch.Tensor, batch: dict, temperature: float
) -> torch.Tensor:
    """L_kd of the module docstring: T^2 times the mean KL from the teacher's softened distribution to the
    student's over the task's rows (`soft_target_rows`)."""
    return soft_target_kl(
        soft_target_rows(estimator, student_logits, batch),
        soft_target_rows(estimator, teacher_logits, batch),
        temperature,
    )


def hidden_state_loss(
    student_states: Sequence[torch.Tensor],
    teacher_states: Sequence[torch.Tensor],
    layers: Sequence[int],
    mask: torch.Tensor,
    kind: str,
    projection: nn.Module | None = None,
) -> torch.Tensor:
    """L_hidden of the module docstring: student layer j (hidden_states[j], j >= 1) against teacher layer
    layers[j - 1] + 1, through `projection` when given; `mask` (batch, pieces) marks real pieces."""
    distance = cosine_loss if kind == "cosine" else hidden_mse
    terms = []
    for j, i in enumerate(layers, start=1):
        s = student_states[j]
        if projection is not None:
            s = projection(s)  # (batch, pieces, teacher width)
        terms.append(distance(s, teacher_states[i + 1], mask))
    return torch.stack(terms).mean()


class DistillationLoss(nn.Module):
    """alpha L_kd + (1 - alpha) L_task + beta L_hidden (module docstring) for the estimators' loop.

    Called as loss(student_logits, batch) after the student network ran on the batch; it runs the teacher's network
    on the same batch. Its only parameters are the projection W_h (when the widths differ and hidden_loss is
    set): the loop trains them with the student. The teacher and student estimators are held as plain
    attributes, so the teacher's weights are never in this module's parameters."""

    def __init__(
        self,
        teacher,
        student,
        layers: Sequence[int],
        temperature: float,
        alpha: float,
        hidden_loss: str | None,
        hidden_weight: float,
    ) -> None:
        super().__init__()
        self.teacher, self.student = teacher, student
        self.layers = list(layers)
        self.temperature, self.alpha = temperature, alpha
        self.hidden_loss, self.hidden_weight = hidden_loss, hidden_weight
        s_dim = student.model_.representation.encoder.hidden_size
        t_dim = teacher.model_.representation.encoder.hidden_size
        use_projection = hidden_loss is not None and s_dim != t_dim
        self.projection = nn.Linear(s_dim, t_dim) if use_projection else None
        self._states: dict[str, tuple] = {}

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """While the block runs, the hidden states of every student and teacher encoder call are kept for
        L_hidden (forward hooks, removed afterwards); the teacher is in eval mode."""
        self.teacher.model_.eval()
        handles = []
        if self.hidden_loss is not None:
            for key, estimator in (("student", self.student), ("teacher", self.teacher)):
                encoder = estimator.model_.representation.encoder
                handles.append(encoder.register_forward_hook(self._keeper(key)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._states.clear()

    def _keeper(self, key: str):
        def hook(module, args, output):
            self._states[key] = output.hidden_states

        return hook

    def forward(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = self.teacher.model_(batch)
        loss = self.alpha * kd_loss(self.student, logits, teacher_logits, batch, self.temperature)
        if self.alpha < 1:
            loss = loss + (1 - self.alpha) * self.student.task_loss(logits, batch)
        if self.hidden_loss is not None and self.hidden_weight > 0:
            mask = batch["attention_mask"].bool()
            loss = loss + self.hidden_weight * hidden_state_loss(
                self._states["student"],
                self._states["teacher"],
                self.layers,
                mask,
                self.hidden_loss,
                self.projection,
            )
        return loss


# ---- the student -----------------------------------------------------------------------------------------------


def _check_settings(temperature, alpha, hidden_loss, hidden_weight) -> None:
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number greater than 0 (e.g. 2.0), got {temperature!r}")
    if not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha (the weight of the soft targets) must be in [0, 1], got {alpha!r}")
    if hidden_loss not in HIDDEN_LOSSES:
        raise ValueError(f"hidden_loss must be None, 'cosine' or 'mse', got {hidden_loss!r}")
    if not isinstance(hidden_weight, (int, float)) or not hidden_weight >= 0:
        raise ValueError(f"hidden_weight must be 0 or more, got {hidden_weight!r}")


def teacher_encoder(teacher) -> Encoder:
    """The fine-tuned encoder of a fitted finetune-mode estimator; one-line errors for what cannot be distilled."""
    name = type(teacher).__name__
    network = getattr(teacher, "model_", None)
    if network is None:
        raise ValueError(f"this {name} teacher is not fitted: fit it (or {name}.load a saved one) before distilling")
    if not network.representation.trains_encoder:  # frozen: a mix and head over cached features
        raise ValueError(
            f"the {name} teacher was trained with mode={teacher.mode!r}: its encoder was not trained on the task "
            "(only a mix and head over frozen features), so there is nothing to distil into a smaller encoder; "
            "distil a teacher fitted with mode='finetune', or fit a frozen-mode estimator on a smaller model"
        )
    encoder = network.representation.encoder
    family = getattr(encoder, "family", type(encoder).__name__)
    if not getattr(encoder, "can_distill", False):
        raise ValueError(
            f"a {family} teacher cannot be distilled: task-specific distillation builds students for "
            f"{', '.join(distillable_families())} encoders; fine-tune one of those as the teacher"
        )
    return encoder


def same_tokenizer(a, b) -> bool:
    """Whether two ctxrep Tokenizers turn words into the same ids: the same vocabulary and special-token layout."""
    if getattr(a, "word_level", False) or getattr(b, "word_level", False):
        return False
    return a.backend.get_vocab(with_added_tokens=True) == b.backend.get_vocab(with_added_tokens=True) and (
        a.template == b.template
    )


def _write_encoder(encoder: nn.Module, tokenizer_from: Path, path: Path) -> Path:
    """encoder.save_pretrained(path) and the tokenizer files of `tokenizer_from` beside it."""
    path.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(path)
    if tokenizer_from.resolve() != path.resolve():
        for name in TOKENIZER_FILES:
            if (tokenizer_from / name).is_file():
                shutil.copy(tokenizer_from / name, path / name)
    return path


def _ready_student(student, teacher, t_encoder, student_layers, teacher_layers, student_hidden_size) -> tuple:
    """The student encoder given as `student=` (a name or folder), checked against the teacher; with the teacher
    layers its layers learn from."""
    if student_layers or teacher_layers or student_hidden_size:
        raise ValueError(
            "student= gives a ready student encoder, so student_layers / teacher_layers / student_hidden_size "
            "(which build one from the teacher) do not apply; give one or the other"
        )
    loaded = load_encoder(student, dtype="fp32")  # float32 master weights to train
    if not same_tokenizer(loaded.tokenizer, teacher.backbone_.tokenizer):
        raise ValueError(
            f"the student {student} has a different tokenizer from the teacher's ({teacher.model}): the "
            "student learns from the teacher's outputs on the same pieces, so they must share it; leave "
            "student= out to build the student from the teacher (its tokenizer kept), or give a student "
            "trained with the teacher's tokenizer"
        )
    s_encoder = loaded.model
    layers = spread_layers(t_encoder.num_layers, s_encoder.num_layers)
    if s_encoder.num_layers > t_encoder.num_layers:
        raise ValueError(
            f"the student {student} has {s_encoder.num_layers} layers, more than the teacher's "
            f"{t_encoder.num_layers}; give a smaller student"
        )
    return s_encoder, layers


def distill_estimator(
    teacher,
    X,
    y,
    student_layers: int | None = None,
    temperature: float = 2.0,
    alpha: float = 0.5,
    hidden_loss: str | None = None,
    hidden_weight: float = 1.0,
    teacher_layers: Sequence[int] | None = None,
    student_hidden_size: int | None = None,
    student: str | os.PathLike | None = None,
    copy_head: bool = True,
    encoder_dir: str | os.PathLike | None = None,
    eval_set: tuple | None = None,
    **params,
):
    """A student estimator of the teacher's class, distilled from `teacher` on X, y (see the module docstring).

    student_layers: K layers taken from the teacher's, spread from its first to its last (None: half of them,
        rounded up: 3 for the 6-layer MiniLM); teacher_layers: exactly these teacher layers instead (bottom first).
    student_hidden_size: a narrower student (fresh encoder weights of that width, the teacher's heads);
        None: the teacher's width, weights copied.
    student: a model name or folder to train as the student instead of one built from the teacher (e.g. a
        task-agnostic `ctxrep distill --corpus` student); it must have the teacher's tokenizer.
    temperature T, alpha (weight of the soft targets; 1 - alpha goes to the hard labels), hidden_loss
        (None, "cosine" or "mse") with its weight beta = hidden_weight: the loss of the module docstring.
    copy_head: start the student's head from the teacher's (when the widths agree); else a fresh head.
    encoder_dir: the folder the student's encoder is written to (before training, then again with the trained
        weights); it becomes the student's `model` parameter. None: a new temporary folder (save_distilled
        moves the encoder next to the saved estimator).
    eval_set: (X_dev, y_dev), scored after every epoch into the student's history_ (a teacher's keep="best" then
        keeps the student's best dev epoch too; without eval_set the student keeps its last epoch).
    **params: the student estimator's own parameters (max_epochs, lr, batch_size, random_state, ...); the rest are
        the teacher's.
    """
    _check_settings(temperature, alpha, hidden_loss, hidden_weight)
    t_encoder = teacher_encoder(teacher)
    if student is not None:
        s_encoder, layers = _ready_student(
            student, teacher, t_encoder, student_layers, teacher_layers, student_hidden_size
        )
    else:
        layers = choose_layers(t_encoder, student_layers, teacher_layers)

    settings = type(teacher)(**teacher.get_params()).set_params(**params)  # refuses a name the estimator lacks
    if settings.keep == "best" and eval_set is None and not settings.early_stopping and "keep" not in params:
        params["keep"] = None  # a dev set picked the teacher's epoch; without one the student keeps its last
    seed = int(settings.random_state) if settings.random_state is not None else secrets.randbelow(2**31)
    with seeded_torch(seed):
        if student is None:
            s_encoder = init_student(t_encoder, layers, student_hidden_size)
    if encoder_dir is None:
        encoder_dir = tempfile.mkdtemp(prefix="ctxrep-student-")
        logger.info("student encoder folder: %s (give encoder_dir, or save_distilled, to keep it)", encoder_dir)
    encoder_dir = _write_encoder(s_encoder, teacher.backbone_.folder, Path(encoder_dir))

    with seeded_torch(seed):  # the teacher's class, parameters, labels and tokenizer over the student encoder
        est = teacher.with_encoder(s_encoder, encoder_dir, **params)
        if copy_head and s_encoder.hidden_size == t_encoder.hidden_size:
            est.model_.head.load_state_dict(teacher.model_.head.state_dict())
        loss = DistillationLoss(teacher, est, layers, temperature, alpha, hidden_loss, hidden_weight)
    try:
        with loss.attached():
            est.fit(X, y, eval_set=eval_set, train_loss=loss)  # warm_start: trains the network built above
    finally:
        est.set_params(warm_start=teacher.warm_start)
    _write_encoder(est.model_.representation.encoder, encoder_dir, encoder_dir)  # the trained weights
    est.distillation_ = {
        "teacher": str(teacher.model),
        "teacher_layers": layers,
        "temperature": temperature,
        "alpha": alpha,
        "hidden_loss": hidden_loss,
        "hidden_weight": hidden_weight,
    }
    return est


def export_encoder(estimator, path: str | os.PathLike) -> Path:
    """The estimator's (fine-tuned or distilled) encoder as a Hugging Face folder at `path`: config.json,
    model.safetensors and its tokenizer files; transformers' AutoModel and ctxrep.load_model load it."""
    encoder = estimator.model_.representation.encoder
    return _write_encoder(encoder, estimator.backbone_.folder, Path(path))


def save_distilled(estimator, out: str | os.PathLike) -> Path:
    """out/encoder: the student's encoder (export_encoder); out/model: the estimator (<Class>.load(out/model)),
    whose `model` parameter now names out/encoder."""
    out = Path(out)
    encoder_dir = export_encoder(estimator, out / "encoder")
    estimator.set_params(model=str(encoder_dir.resolve()))
    estimator.backbone_ = LoadedEncoder(estimator.backbone_.model, estimator.backbone_.tokenizer, resolve(encoder_dir))
    estimator.save(out / "model")
    return out


__all__ = [
    "DistillationLoss",
    "distill_estimator",
    "export_encoder",
    "hidden_state_loss",
    "kd_loss",
    "same_tokenizer",
    "save_distilled",
    "soft_target_rows",
    "teacher_encoder",
]
