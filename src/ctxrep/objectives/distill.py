"""Task-agnostic distillation: a smaller student encoder trained on raw text against a frozen teacher encoder.

Two recipes, chosen by what the teacher has:

With a masked-LM head (DistilBERT, Sanh et al. 2019, sec. 3): the student (with its own MLM head) and the teacher
read the same masked input (masking as ctxrep.objectives.masked_lm), and
    L = alpha_kd L_kd + alpha_mlm L_mlm + alpha_cos L_cos
    L_kd  = T^2 / n sum_i KL(softmax(z^t_i / T) || softmax(z^s_i / T))   (Hinton et al. 2015: soft targets at
            temperature T, scaled by T^2 so their gradients keep the size of the hard-label ones; n positions:
            every real token as DistilBERT's default, or only the masked ones with kd_masked_only)
    L_mlm = -1/|M| sum_{i in M} log p_s(x_i | x_masked)                     (the student's own MLM loss)
    L_cos = 1/n sum_i (1 - cos(h^s_i, h^t_i))                               (last hidden states, real tokens)
DistilBERT's weights: alpha_kd 5, alpha_mlm 2, alpha_cos 1, T = 2.

Without one (MiniLM, Wang et al. 2020, sec. 3; our packaged default all-MiniLM-L6-v2 is such a teacher): the
student mimics the teacher's last self-attention layer, per head a, on the unmasked input:
    L = alpha_attention L_AT + alpha_value L_VR
    L_AT = 1 / (A |x|) sum_a sum_t KL(A^t_{a,t} || A^s_{a,t}),      A = softmax(Q K^T / sqrt(d_k))      (eq. 5)
    L_VR = 1 / (A |x|) sum_a sum_t KL(VR^t_{a,t} || VR^s_{a,t}),    VR = softmax(V V^T / sqrt(d_k))    (eq. 6-7)
t runs over real query tokens and each row's distribution over real keys; d_k is each model's own head width, so
a narrower student with the teacher's number of heads works (the relations are seq x seq either way).

Either recipe can add TinyBERT's hidden-state loss (Jiao et al. 2020, eq. 8):
    L_hidden = sum_{m=0..K} MSE(H^s_m W_h, H^t_{g(m)})     (g(0) = 0, the embeddings; g(m) = layers[m - 1] + 1)
with a learned W_h (student width -> teacher width) when the widths differ; alpha_hidden weights it (0 = off).
W_h also maps the student's states for L_cos when the widths differ.

The teacher is frozen, in eval mode, and kept out of this module's state_dict: the trainer's checkpoints hold the
student (its MLM head, W_h) only, and each process loads the teacher from its folder. The saved folder is the
student: BertForMaskedLM / RobertaForMaskedLM with a head, else a plain encoder folder; ctxrep.load_model and
transformers' AutoModel load it.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models.bert import MODEL_TYPES, BertModel, EncoderLayer
from ctxrep.models.folders import (
    CheckpointError,
    write_folder,
)
from ctxrep.models.mlm_head import read_mlm_head
from ctxrep.models.student import choose_layers, distillable_families, student_config
from ctxrep.objectives.masked_lm import (
    IGNORE_INDEX,
    BatchMasker,
    MaskedLMConfig,
    MaskedLMHead,
    MaskingSettings,
    head_tensors,
    mlm_loss,
    prefixed_encoder_tensors,
)
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import Built, Ingredients, PretrainError, Recipe, full_sentences
from ctxrep.text.tokenizer import Tokenizer
from ctxrep.text.tokenizer_files import TOKENIZER_FILES, TOKENIZER_JSON

MASKED_FILL = -1e9  # the score of a padded key (float32): exp underflows to 0, the log stays finite


@dataclass
class DistillConfig:
    """What the run distils and how; the trainer's checkpoint fingerprint compares it on resume."""

    teacher: str  # the teacher's folder
    layers: tuple[int, ...]  # teacher layer of each student layer (models/student.py)
    hidden_size: int  # the student's width
    intermediate_size: int
    temperature: float = 2.0
    alpha_kd: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    alpha_attention: float = 1.0
    alpha_value: float = 1.0
    alpha_hidden: float = 0.0
    kd_masked_only: bool = False

    def check(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be greater than 0, got {self.temperature}")
        alphas = {k: v for k, v in vars(self).items() if k.startswith("alpha_")}
        negative = [f"{k}={v}" for k, v in alphas.items() if v < 0]
        if negative:
            raise ValueError(f"loss weights must be 0 or more, got {', '.join(negative)}")


# ---- the loss terms -----------------------------------------------------------------------------------------


def soft_target_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 / n sum_i KL(softmax(z^t_i / T) || softmax(z^s_i / T)) over n rows of (n, classes) logits."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} differ"
        )
    if student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    t = temperature
    log_s = F.log_softmax(student_logits.float() / t, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * t * t


def cosine_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1/n sum_i (1 - cos(s_i, t_i)) over the n positions where mask is True; (batch, seq, dim) states."""
    cos = F.cosine_similarity(student[mask].float(), teacher[mask].float(), dim=-1)  # (n,)
    return (1.0 - cos).mean() if cos.numel() else student.sum() * 0.0


def hidden_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the positions where mask is True and every dimension; (batch, seq, dim) states."""
    return F.mse_loss(student[mask].float(), teacher[mask].float()) if bool(mask.any()) else student.sum() * 0.0


def relation_scores(layer: EncoderLayer, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MiniLM's two relations of one self-attention layer, as scores before the softmax:
    (Q K^T / sqrt(d_k), V V^T / sqrt(d_k)), each (batch, heads, seq, seq). `hidden` is the layer's input."""
    q, k, v = layer.attention.project_qkv(hidden)  # each (batch, heads, seq, head_dim)
    scale = math.sqrt(layer.attention.head_dim)
    return (q @ k.transpose(-2, -1)) / scale, (v @ v.transpose(-2, -1)) / scale  # (batch, heads, seq, seq)


def relation_kl(student_scores: torch.Tensor, teacher_scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 / (A |x|) sum_a sum_t KL(softmax(teacher)_{a,t} || softmax(student)_{a,t}) (MiniLM eq. 5 and 7).

    scores: (batch, heads, seq, seq) before the softmax; mask: (batch, seq), True at real tokens. Each row is a
    distribution over the real keys; the mean runs over heads and real query tokens of the whole batch."""
    if student_scores.shape != teacher_scores.shape:
        raise ValueError(
            f"student relations {tuple(student_scores.shape)} and teacher relations {tuple(teacher_scores.shape)} "
            "differ: MiniLM compares heads one to one, so the student's last layer needs the teacher's number of heads"
        )
    keys = mask.bool()[:, None, None, :]  # (batch, 1, 1, seq)
    log_s = student_scores.float().masked_fill(~keys, MASKED_FILL).log_softmax(-1)  # (batch, heads, seq, seq)
    log_t = teacher_scores.float().masked_fill(~keys, MASKED_FILL).log_softmax(-1)
    kl = (log_t.exp() * (log_t - log_s)).masked_fill(~keys, 0.0).sum(-1)  # (batch, heads, seq): one per query row
    queries = mask.bool()[:, None, :].expand_as(kl)  # (batch, heads, seq)
    return kl[queries].mean() if bool(queries.any()) else student_scores.sum() * 0.0


# ---- the teacher ---------------------------------------------------------------------------------------------

_HEAD_PREFIX = {"bert": "cls.predictions", "roberta": "lm_head"}


def load_teacher(name_or_path: str | Path) -> tuple[BertModel, MaskedLMHead | None, Path]:
    """(encoder, its masked-LM head or None, folder): any name ctxrep.load_model accepts; frozen, eval mode.

    The head is read from a BertForMaskedLM / BertForPreTraining (cls.predictions.*) or RobertaForMaskedLM
    (lm_head.*) folder; its decoder is the (tied) word embedding matrix. ELECTRA discriminators and plain encoders
    (all-MiniLM-L6-v2) have none: they teach with MiniLM's recipe."""
    from ctxrep.models.loading import load_model, resolve_model_path

    folder = resolve_model_path(name_or_path)
    teacher = load_model(folder, dtype="fp32")  # float32, as the student it teaches
    if getattr(teacher, "family", None) not in MODEL_TYPES:  # the losses read BERT's MLM head and attention
        family = getattr(teacher, "family", type(teacher).__name__)
        others = sorted(set(distillable_families()) - set(MODEL_TYPES))
        raise ValueError(
            f"a {family} model cannot be distilled here: task-agnostic distillation (DistilBERT / MiniLM) is "
            f"implemented for {', '.join(sorted(MODEL_TYPES))} teachers; give one of those as the teacher "
            f"(task-specific distillation, ctxrep distill without --corpus, also takes {', '.join(others)} teachers)"
        )
    head = read_mlm_head(folder, teacher) if teacher.config.model_type in _HEAD_PREFIX else None
    teacher.eval().requires_grad_(False)
    return teacher, head, folder


# ---- the objective -------------------------------------------------------------------------------------------


class DistillationObjective(nn.Module):
    """Student (+ its MLM head when the teacher has one) trained against a frozen teacher: see the module docs.

    forward(batch) reads input_ids, attention_mask, token_type_ids (FULL-SENTENCES rows); masks with the global
    torch RNG when the teacher has an MLM head (then `mlm` is needed)."""

    def __init__(
        self,
        teacher: BertModel,
        teacher_head: MaskedLMHead | None,
        config: DistillConfig,
        mlm: MaskedLMConfig | None = None,
        word_start: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        config.check()
        self.config = config
        self._teacher = (teacher.eval().requires_grad_(False),)  # a tuple: not a submodule, not in state_dict
        self._teacher_head = (teacher_head,)
        self.student = teacher.init_student(config.layers, config.hidden_size, config.intermediate_size)
        self.student.train()
        s, t = self.student.config, teacher.config
        if teacher_head is None and self.student.heads_per_layer()[-1] != teacher.heads_per_layer()[-1]:
            raise ValueError(
                f"the teacher's last layer has {teacher.heads_per_layer()[-1]} attention heads and the student's "
                f"{self.student.heads_per_layer()[-1]} (pruned heads): MiniLM compares heads one to one; end the "
                "student on the teacher's last layer, or distil from an unpruned teacher"
            )
        self.head = None
        self.masker = None
        if teacher_head is not None:
            if mlm is None:
                raise ValueError(
                    "the teacher has a masked-LM head, so distillation masks its input: pass mlm=MaskedLMConfig"
                )
            self.masker = BatchMasker(mlm, s.vocab_size, word_start)
            self.head = MaskedLMHead(s, self.student.embeddings.word_embeddings)
            if s.hidden_size == t.hidden_size:  # DistilBERT copies the teacher's head too
                for ours, theirs in ((self.head.dense, teacher_head.dense), (self.head.norm, teacher_head.norm)):
                    ours.load_state_dict(theirs.state_dict())
                with torch.no_grad():
                    self.head.bias.copy_(teacher_head.bias)
            else:
                for module in (self.head.dense, self.head.norm):
                    module.apply(self.student._init_weights)
        uses_states = config.alpha_hidden > 0 or (teacher_head is not None and config.alpha_cos > 0)
        self.project = None  # TinyBERT's W_h: student width -> teacher width
        if uses_states and s.hidden_size != t.hidden_size:
            self.project = nn.Linear(s.hidden_size, t.hidden_size)
            self.project.apply(self.student._init_weights)

    @property
    def teacher(self) -> BertModel:
        return self._teacher[0]

    @property
    def teacher_head(self) -> MaskedLMHead | None:
        return self._teacher_head[0]

    @property
    def recipe(self) -> str:
        return "distilbert" if self.teacher_head is not None else "minilm"

    def _apply(self, fn, recurse: bool = True):
        """.to(device) / .half() reach the teacher too, although it is not a submodule."""
        super()._apply(fn, recurse)
        self.teacher._apply(fn, recurse)
        if self.teacher_head is not None:
            self.teacher_head._apply(fn, recurse)
        return self

    def train(self, mode: bool = True) -> DistillationObjective:
        """The student trains; the teacher stays in eval mode (no dropout in the targets)."""
        super().train(mode)
        self.teacher.eval()
        return self

    def _mapped(self, states: torch.Tensor) -> torch.Tensor:
        return self.project(states) if self.project is not None else states

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        token_type_ids = batch.get("token_type_ids")
        labels = None
        if self.masker is not None:
            input_ids, labels = self.masker(input_ids, attention_mask)
        c = self.config
        real = attention_mask.bool()  # (batch, seq)
        kwargs = {"attention_mask": attention_mask, "token_type_ids": token_type_ids, "output_hidden_states": True}
        with torch.no_grad():
            t_out = self.teacher(input_ids, **kwargs)
        s_out = self.student(input_ids, **kwargs)
        terms: dict[str, tuple[float, torch.Tensor]] = {}
        metrics: dict[str, float] = {}
        if self.head is not None:
            mlm, logits, targets = mlm_loss(self.head, s_out.last_hidden_state, labels)
            metrics["masked_tokens"] = float(targets.numel())
            if targets.numel():
                metrics["mlm_accuracy"] = float((logits.argmax(-1) == targets).float().mean())
            at = labels != IGNORE_INDEX if c.kd_masked_only else real  # (batch, seq): where the soft targets are
            student_logits = logits if c.kd_masked_only else self.head(s_out.last_hidden_state[at])  # (n, vocab)
            with torch.no_grad():
                teacher_logits = self.teacher_head(t_out.last_hidden_state[at])  # (n, vocab)
            terms["kd"] = (c.alpha_kd, soft_target_kl(student_logits, teacher_logits, c.temperature))
            terms["mlm"] = (c.alpha_mlm, mlm)
            if c.alpha_cos:
                terms["cos"] = (
                    c.alpha_cos,
                    cosine_loss(self._mapped(s_out.last_hidden_state), t_out.last_hidden_state, real),
                )
        else:
            s_att, s_val = relation_scores(self.student.layers[-1], s_out.hidden_states[-2])
            with torch.no_grad():
                t_att, t_val = relation_scores(self.teacher.layers[-1], t_out.hidden_states[-2])
            terms["attention"] = (c.alpha_attention, relation_kl(s_att, t_att, real))
            terms["value"] = (c.alpha_value, relation_kl(s_val, t_val, real))
        if c.alpha_hidden:
            mapping = [0, *(i + 1 for i in c.layers)]  # g(m): embeddings to embeddings, layer m to its teacher layer
            mse = sum(
                hidden_mse(self._mapped(s_out.hidden_states[m]), t_out.hidden_states[g], real)
                for m, g in enumerate(mapping)
            )
            terms["hidden"] = (c.alpha_hidden, mse)
        loss = sum(alpha * value for alpha, value in terms.values())
        metrics |= {f"{name}_loss": float(value.detach()) for name, (_, value) in terms.items()}
        return ObjectiveOutput(loss=loss, num_tokens=int(attention_mask.sum()), metrics=metrics)

    def save_pretrained(self, path: str | Path) -> Path:
        """The student: a BertForMaskedLM / RobertaForMaskedLM folder with its MLM head, else an encoder folder."""
        s = self.student.config
        if self.head is None:
            self.student.save_pretrained(path)
            return Path(path)
        tensors = prefixed_encoder_tensors(self.student)
        tensors |= head_tensors(self.head, _HEAD_PREFIX[s.model_type], s.model_type)
        arch = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}[s.model_type]
        return write_folder(path, s.to_hf_dict() | {"architectures": [arch]}, tensors)


# ------------------------------------------------------------------------------------------------- recipe


@dataclass
class DistillSettings:
    """[distill]: the teacher, the student's shape (models/student.py) and the loss weights (DistillConfig).
    The student is built from the teacher and shares its tokenizer."""

    teacher: str = ""  # a model folder or name, as ctxrep.load_model takes it (BERT, RoBERTa or ELECTRA)
    student_layers: int = 0  # K; 0 = half the teacher's layers, rounded up
    teacher_layers: tuple[int, ...] = ()  # the teacher layer of each student layer; () = K spread from first to last
    student_hidden_size: int = 0  # 0 = the teacher's width (weights copied); narrower = fresh weights
    student_intermediate_size: int = 0  # 0 = the teacher's intermediate_size x student / teacher width
    temperature: float = 2.0  # T of the soft targets (teacher with an MLM head)
    alpha_kd: float = 5.0  # DistilBERT's weights: soft-target KL, MLM, cosine of the last hidden states
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    kd_masked_only: bool = False  # soft targets at the masked positions only (default: every real token)
    alpha_attention: float = 1.0  # MiniLM's weights (teacher without an MLM head): attention and value relations
    alpha_value: float = 1.0
    alpha_hidden: float = 0.0  # TinyBERT's hidden-state MSE over the layer mapping, either recipe; 0 = off

    def teacher_name(self, source: str) -> str:
        if not self.teacher:
            raise PretrainError(
                f"distill needs a teacher: give --teacher DIR (or [distill] teacher in {source}), a model folder "
                "or name such as minilm"
            )
        return self.teacher


def teacher_tokenizer(sections: dict, source: str, out: Path, tokenizer: str | Path | None = None) -> Tokenizer:
    """The student shares its teacher's tokenizer, copied into out/ (tokenizer.json and the files transformers'
    AutoTokenizer reads). Another tokenizer (`--tokenizer`, or one left in out/ by another run) is refused: the
    student reads the teacher's token ids."""
    from ctxrep.models.loading import resolve_model_path

    folder = resolve_model_path(sections["distill"].teacher_name(source))
    own = Tokenizer.from_model_dir(folder)
    for other, where in (
        (tokenizer, f"--tokenizer {tokenizer}"),
        (out if (out / "tokenizer.json").is_file() else None, f"{out / 'tokenizer.json'} (from an earlier run)"),
    ):
        if other is None:
            continue
        other = Path(other)
        found = Tokenizer.from_model_dir(other.parent if other.is_file() else other)
        if found.backend.to_str() != own.backend.to_str():
            raise PretrainError(
                f"{where} is not the teacher's tokenizer ({folder}): a distilled student reads its teacher's token "
                "ids, so it shares the teacher's tokenizer; leave --tokenizer out, or distil into a new --out folder"
            )
    own.backend.save(str(out / TOKENIZER_JSON))
    for name in (n for n in TOKENIZER_FILES if n != TOKENIZER_JSON):  # the files transformers' AutoTokenizer reads
        if (folder / name).is_file() and (folder / name).resolve() != (out / name).resolve():
            shutil.copyfile(folder / name, out / name)
    return Tokenizer.from_model_dir(out)


def build_distill(x: Ingredients) -> Built:
    """The student built from the teacher ([distill]); masking from [objective] when the teacher has an MLM head;
    the teacher's positions are the limit."""
    d = x.sections["distill"]
    try:
        teacher, head, folder = load_teacher(d.teacher_name(x.source))
        if x.tokenizer.vocab_size > teacher.config.vocab_size:
            raise PretrainError(
                f"the tokenizer has {x.tokenizer.vocab_size} entries but the teacher {folder} only "
                f"{teacher.config.vocab_size} embedding rows; distil with the teacher's own tokenizer"
            )
        layers = choose_layers(teacher, d.student_layers or None, d.teacher_layers or None)
        shape = student_config(
            teacher.config, layers, d.student_hidden_size or None, d.student_intermediate_size or None
        )
        distill = DistillConfig(
            str(folder.resolve()),
            tuple(layers),
            shape.hidden_size,
            shape.intermediate_size,
            d.temperature,
            d.alpha_kd,
            d.alpha_mlm,
            d.alpha_cos,
            d.alpha_attention,
            d.alpha_value,
            d.alpha_hidden,
            d.kd_masked_only,
        )
        mlm = x.settings.masking(x.tokenizer, x.seed) if head is not None else None
        word_start = x.settings.word_start(x.tokenizer) if head is not None else None
        module = DistillationObjective(teacher, head, distill, mlm, word_start)
    except (CheckpointError, PretrainError):  # already say where
        raise
    except ValueError as e:  # the student's shape or the loss weights
        raise PretrainError(f"[distill] in {x.source}: {e}") from None
    return Built(module, module.teacher.max_tokens)


# Task-agnostic distillation (DistilBERT, MiniLM): a student of the teacher over FULL-SENTENCES rows, in the
# teacher's tokenizer; [objective]'s masking applies when the teacher has an MLM head. No [encoder], no [tokenizer].
DISTILL = Recipe(
    "distill",
    build_distill,
    MaskingSettings,
    sections={"distill": DistillSettings},
    own_tokenizer=teacher_tokenizer,
    packing=full_sentences,
)
