"""Task-agnostic distillation: the loss terms on known tensors, student initialisation, `ctxrep distill` runs on
tiny teachers (with and without a masked-LM head) whose students load in ctxrep and transformers, resume, bad input."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import ctxrep
from ctxrep.cli.distill import distill
from ctxrep.cli.pretrain import pretrain
from ctxrep.models.bert import BertConfig, BertModel
from ctxrep.models.student import (
    check_distillable,
    choose_layers,
    init_student,
    spread_layers,
)
from ctxrep.objectives.distill import (
    DistillationObjective,
    DistillConfig,
    cosine_loss,
    load_teacher,
    relation_kl,
    relation_scores,
    soft_target_kl,
)
from ctxrep.text.tokenizer import Tokenizer
from ctxrep.train.trainer import Trainer


def run(command, args):
    return CliRunner().invoke(command, [str(a) for a in args])


def fails(command, args, *fragments: str) -> str:
    result = run(command, args)
    assert result.exit_code == 1, result.output
    message = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(message) == 1 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in message[0], message[0]
    return message[0]


def tiny_bert(layers: int = 4, hidden: int = 32, heads: int = 4, seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=50,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(config).eval()


# ----------------------------------------------------------------------------------------- loss terms


def test_soft_target_kl_is_t_squared_times_the_kl_of_the_softened_distributions():
    student = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    teacher = torch.tensor([[3.0, 1.0, 0.0], [2.0, 0.0, -2.0]])
    t = 2.0

    def softmax(row):
        e = [math.exp(v / t) for v in row]
        return [v / sum(e) for v in e]

    by_hand = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist(), strict=True):
        p, q = softmax(t_row), softmax(s_row)
        by_hand += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    by_hand = by_hand / 2 * t * t  # mean over the 2 rows, scaled by T^2
    assert soft_target_kl(student, teacher, t).item() == pytest.approx(by_hand, rel=1e-6)
    assert soft_target_kl(teacher, teacher, t).item() == pytest.approx(0.0, abs=1e-7)


def test_relation_kl_is_zero_for_equal_relations_and_ignores_padding():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 5)  # (batch, heads, seq, seq)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert relation_kl(scores, scores.clone(), mask).item() == pytest.approx(0.0, abs=1e-7)
    other = torch.randn(2, 3, 5, 5)
    loss = relation_kl(other, scores, mask)
    assert loss.item() > 0
    # Scores at padded keys and padded queries do not count.
    noisy = other.clone()
    noisy[1, :, :, 3:] = 50.0
    noisy[1, :, 3:, :] = -50.0
    assert relation_kl(noisy, scores, mask).item() == pytest.approx(loss.item(), rel=1e-6)
    # By hand for one row: KL(softmax(t) || softmax(s)) averaged over heads and the 5 + 3 real query rows.
    p, q = scores.softmax(-1)[0], other.softmax(-1)[0]
    kl0 = (p * (p / q).log()).sum(-1)  # (heads, seq)
    p1 = scores[1, :, :3, :3].softmax(-1)
    q1 = other[1, :, :3, :3].softmax(-1)
    kl1 = (p1 * (p1 / q1).log()).sum(-1)  # (heads, 3)
    assert loss.item() == pytest.approx(torch.cat([kl0.flatten(), kl1.flatten()]).mean().item(), rel=1e-5)


def test_relation_scores_give_the_layers_own_attention_distributions():
    model = tiny_bert()
    ids = torch.tensor([[2, 5, 7, 9, 3], [2, 8, 3, 0, 0]])
    mask = (ids != 0).long()
    out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    attention, values = relation_scores(model.layers[-1], out.hidden_states[-2])
    probs = attention.masked_fill(~mask.bool()[:, None, None, :], -1e9).softmax(-1)
    torch.testing.assert_close(probs, out.attentions[-1], atol=1e-6, rtol=1e-5)
    layer = model.layers[-1].attention
    v = layer.value(out.hidden_states[-2]).view(2, 5, 4, 8).transpose(1, 2)  # (batch, heads, seq, head_dim)
    torch.testing.assert_close(values, v @ v.transpose(-2, -1) / math.sqrt(8))


def test_cosine_loss():
    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    mask = torch.tensor([[True, True, False]])
    assert cosine_loss(a, a * 3, mask).item() == pytest.approx(0.0, abs=1e-7)
    assert cosine_loss(a, -a, mask).item() == pytest.approx(2.0)
    assert cosine_loss(a, a.flip(-1), mask).item() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------ student init


def test_spread_layers_is_distilberts_choice_for_12_to_6():
    assert spread_layers(12, 6) == [0, 2, 4, 7, 9, 11]
    assert spread_layers(6, 3) == [0, 2, 5] and spread_layers(4, 4) == [0, 1, 2, 3]


def test_student_copies_the_chosen_layers_and_leaves_the_teacher_alone():
    teacher = tiny_bert()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = init_student(teacher, [1, 3])
    assert student.num_layers == 2 and student.config.hidden_size == 32
    for j, i in enumerate([1, 3]):
        for name, value in student.layers[j].state_dict().items():
            torch.testing.assert_close(value, teacher.layers[i].state_dict()[name], atol=0, rtol=0, msg=name)
    for name, value in student.embeddings.state_dict().items():
        torch.testing.assert_close(value, teacher.embeddings.state_dict()[name], atol=0, rtol=0)
    with torch.no_grad():
        student.layers[0].attention.query.weight.add_(1.0)  # copies, not shared tensors
    for name, value in teacher.state_dict().items():
        torch.testing.assert_close(value, before[name], atol=0, rtol=0)
    ids = torch.tensor([[2, 5, 7, 9]])
    full = init_student(teacher, [0, 1, 2, 3])  # every layer: the teacher itself
    torch.testing.assert_close(full(ids).last_hidden_state, teacher(ids).last_hidden_state, atol=0, rtol=0)


def test_narrower_student_is_fresh_and_keeps_the_heads():
    teacher = tiny_bert()
    student = init_student(teacher, choose_layers(teacher, num_layers=2), hidden_size=16)
    c = student.config
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.embedding_size) == (16, 64, 4, 16)
    assert student.num_layers == 2 and student.embeddings.word_embeddings.weight.shape == (50, 16)


def test_student_layers_are_checked():
    teacher = tiny_bert()
    assert choose_layers(teacher) == [0, 3]  # half of 4, spread
    with pytest.raises(ValueError, match="student layers 5 is larger than the teacher's 4 layers"):
        choose_layers(teacher, num_layers=5)
    with pytest.raises(ValueError, match=r"teacher layers \[4\] do not exist"):
        choose_layers(teacher, layers=[0, 4])
    with pytest.raises(ValueError, match="increasing and distinct"):
        choose_layers(teacher, layers=[2, 1])
    with pytest.raises(ValueError, match="wider than the teacher's 32"):
        init_student(teacher, [0], hidden_size=64)
    with pytest.raises(ValueError, match="not a multiple of the teacher's 4 attention heads"):
        init_student(teacher, [0], hidden_size=18)


def test_families_that_cannot_be_distilled_are_named_in_one_line(gpt2_dir):
    from ctxrep.models.elmo import ElmoBiLM, ElmoConfig

    elmo = ElmoBiLM(ElmoConfig(filters=[(1, 4)], n_highway=1, lstm_dim=24, projection_dim=8))
    with pytest.raises(ValueError, match="a elmo model cannot be distilled: students are built from bert, .*xlnet"):
        check_distillable(elmo)
    # a GPT-2 builds students (task-specific distillation), but the DistilBERT / MiniLM losses read BERT's internals
    with pytest.raises(
        ValueError,
        match="a gpt2 model cannot be distilled here: .* for bert, .*roberta teachers.* also takes .*gpt2.*xlnet",
    ) as e:
        load_teacher(gpt2_dir)
    assert "\n" not in str(e.value)


def test_the_shipped_distill_config_holds_distilberts_settings():
    from ctxrep.train.pretrain_config import load_config

    config = load_config("distill", objective="distill")
    d, t = config.distill, config.trainer
    assert (d.temperature, d.alpha_kd, d.alpha_mlm, d.alpha_cos) == (2.0, 5.0, 2.0, 1.0)
    assert (t.lr, t.weight_decay, t.grad_clip, t.betas) == (5e-4, 0.0, 5.0, (0.9, 0.98))
    assert config.objective.mask_prob == 0.15 and config.distill.teacher_layers == ()
    layers = load_config("distill", [("teacher_layers", "[0, 2, 5]")], "distill").distill.teacher_layers
    assert layers == (0, 2, 5)


def test_a_student_equal_to_its_teacher_has_zero_distillation_losses():
    teacher = tiny_bert(layers=2)
    config = DistillConfig("teacher", (0, 1), 32, 128, alpha_hidden=1.0)
    objective = DistillationObjective(teacher, None, config).eval()
    ids = torch.tensor([[2, 5, 7, 9, 3], [2, 8, 3, 0, 0]])
    out = objective({"input_ids": ids, "attention_mask": (ids != 0).long()})
    for name in ("attention_loss", "value_loss", "hidden_loss"):
        assert out.metrics[name] == pytest.approx(0.0, abs=1e-6), name
    assert "teacher" not in "".join(objective.state_dict())  # checkpoints hold the student only
    objective.train().to(torch.float64)  # .to(device) moves the teacher too; train() leaves it in eval mode
    assert next(objective.teacher.parameters()).dtype == torch.float64 and not objective.teacher.training
    assert objective.student.training


# ----------------------------------------------------------------------------------- distill runs


@pytest.fixture(scope="module")
def mlm_teacher(corpus, tmp_path_factory) -> Path:
    """A tiny BERT with its masked-LM head (BertForMaskedLM), from `ctxrep pretrain --objective mlm`."""
    out = tmp_path_factory.mktemp("teachers") / "mlm"
    args = [
        "--objective",
        "mlm",
        "--config",
        "tiny",
        "--corpus",
        corpus,
        "--out",
        out,
        "--max-steps",
        20,
        "--no-progress",
    ]
    result = run(pretrain, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def plain_teacher(mlm_teacher, tmp_path_factory) -> Path:
    """The same encoder without an MLM head (as all-MiniLM-L6-v2 is): a BertModel folder and the tokenizer."""
    out = tmp_path_factory.mktemp("teachers") / "plain"
    BertModel.from_pretrained(mlm_teacher).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(mlm_teacher / name, out / name)
    return out


def distill_args(teacher: Path, corpus: Path, out: Path, *extra) -> list:
    return [
        "--teacher",
        teacher,
        "--corpus",
        corpus,
        "--out",
        out,
        "--config",
        "tiny",
        "--student-layers",
        1,
        "--max-steps",
        20,
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="module")
def mlm_student(mlm_teacher, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("students") / "mlm"
    result = run(distill, distill_args(mlm_teacher, corpus, out))
    assert result.exit_code == 0, result.output
    return out


def check_loads_everywhere(student: Path, teacher: Path) -> None:
    import transformers

    tok = Tokenizer.from_model_dir(student)
    assert tok.backend.to_str() == Tokenizer.from_model_dir(teacher).backend.to_str()
    ids = torch.tensor([tok.build_inputs(tok.backend.encode("Kalo mitu ren sava.", add_special_tokens=False).ids)[0]])
    model = ctxrep.load_model(student)
    assert model.num_layers == 1
    with torch.no_grad():
        theirs = transformers.AutoModel.from_pretrained(student).eval()(ids).last_hidden_state
        torch.testing.assert_close(model(ids).last_hidden_state, theirs, atol=1e-4, rtol=1e-4)


def logged(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_distilbert_recipe_with_an_mlm_teacher(mlm_student, mlm_teacher):
    check_loads_everywhere(mlm_student, mlm_teacher)
    config = json.loads((mlm_student / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and config["num_hidden_layers"] == 1
    train = [r for r in logged(mlm_student) if "loss" in r]
    assert train[-1]["step"] == 20
    assert {"kd_loss", "mlm_loss", "cos_loss"} <= set(train[-1]) and math.isfinite(train[-1]["loss"])
    # The student started from the teacher's layer 0, embeddings and MLM head, and kept its head.
    weights = load_file(mlm_student / "model.safetensors")
    assert "cls.predictions.transform.dense.weight" in weights
    record = json.loads((mlm_student / "pretrain.json").read_text())
    assert record["objective"] == "distill" and record["settings"]["distill"]["student_layers"] == 1
    assert "tokenizer" not in record["settings"] and "encoder" not in record["settings"]


def test_minilm_recipe_with_a_teacher_without_an_mlm_head(plain_teacher, corpus, tmp_path):
    out = tmp_path / "student"
    result = run(
        distill, distill_args(plain_teacher, corpus, out, "--student-hidden-size", 32, "--distill.alpha_hidden", 1.0)
    )
    assert result.exit_code == 0, result.output
    check_loads_everywhere(out, plain_teacher)
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32
    train = [r for r in logged(out) if "loss" in r]
    assert {"attention_loss", "value_loss", "hidden_loss"} <= set(train[-1]) and "kd_loss" not in train[-1]
    assert train[-1]["loss"] < train[0]["loss"]


def test_resumed_distillation_ends_where_an_uninterrupted_one_does(
    mlm_student, mlm_teacher, corpus, tmp_path, monkeypatch
):
    out = tmp_path / "resumed"
    with monkeypatch.context() as m:  # as if Ctrl-C were pressed during step 10 of 20
        m.setattr(Trainer, "_should_stop", lambda self: self.step == 10)
        interrupted = run(distill, distill_args(mlm_teacher, corpus, out))
        assert interrupted.exit_code == 130 and "plus --resume" in interrupted.output, interrupted.output
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 10
    assert not any("teacher" in k for k in load_file(out / "checkpoint" / "model.safetensors"))
    result = run(distill, distill_args(mlm_teacher, corpus, out, "--resume"))
    assert result.exit_code == 0, result.output
    resumed, straight = load_file(out / "model.safetensors"), load_file(mlm_student / "model.safetensors")
    assert resumed.keys() == straight.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], atol=0, rtol=0, msg=name)


def test_pretrain_objective_distill_is_the_same_run(mlm_teacher, corpus, tmp_path):
    out = tmp_path / "same"
    args = [
        "--objective",
        "distill",
        "--config",
        "tiny",
        "--corpus",
        corpus,
        "--out",
        out,
        "--max-steps",
        6,
        "--no-progress",
        "--distill.teacher",
        mlm_teacher,
        "--student_layers",
        1,
    ]
    result = run(pretrain, args)
    assert result.exit_code == 0, result.output
    assert ctxrep.load_model(out).num_layers == 1


def test_load_teacher_finds_the_mlm_head(mlm_teacher, plain_teacher):
    teacher, head, _ = load_teacher(mlm_teacher)
    weights = load_file(mlm_teacher / "model.safetensors")
    torch.testing.assert_close(head.dense.weight, weights["cls.predictions.transform.dense.weight"])
    assert head.decoder.weight is teacher.embeddings.word_embeddings.weight
    assert not any(p.requires_grad for p in teacher.parameters())
    assert load_teacher(plain_teacher)[1] is None


# ------------------------------------------------------------------------------------------ bad input


def test_student_layers_larger_than_the_teachers(mlm_teacher, corpus, tmp_path):
    args = distill_args(mlm_teacher, corpus, tmp_path / "o")
    args[args.index("--student-layers") + 1] = 3
    fails(distill, args, "student layers 3 is larger than the teacher's 2 layers")


def test_a_family_that_cannot_be_distilled(mlm_teacher, corpus, tmp_path):
    from ctxrep.models.gpt2 import GPT2Config, GPT2Model

    folder = tmp_path / "gpt2"
    GPT2Model(GPT2Config(vocab_size=1000, n_positions=64, n_embd=16, n_layer=1, n_head=2)).save_pretrained(folder)
    shutil.copyfile(mlm_teacher / "tokenizer.json", folder / "tokenizer.json")
    fails(
        distill,
        distill_args(folder, corpus, tmp_path / "o"),
        "a gpt2 model cannot be distilled",
        "bert, electra, roberta",
    )


def test_a_student_with_another_tokenizer_is_refused(mlm_teacher, corpus, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    other = HFTokenizer.from_file(str(mlm_teacher / "tokenizer.json"))
    other.add_tokens(["zzzq"])
    (tmp_path / "tok").mkdir()
    other.save(str(tmp_path / "tok" / "tokenizer.json"))
    args = [
        "--objective",
        "distill",
        "--config",
        "tiny",
        "--corpus",
        corpus,
        "--out",
        tmp_path / "o",
        "--distill.teacher",
        mlm_teacher,
        "--tokenizer",
        tmp_path / "tok",
    ]
    fails(pretrain, args, "is not the teacher's tokenizer", "leave --tokenizer out")


def test_distill_needs_a_corpus_and_a_teacher(mlm_teacher, corpus, tmp_path):
    fails(distill, ["--teacher", mlm_teacher, "--out", tmp_path / "o", "--config", "tiny"], "give --corpus")
    args = ["--objective", "distill", "--config", "tiny", "--corpus", corpus, "--out", tmp_path / "o"]
    fails(pretrain, args, "distill needs a teacher", "--teacher DIR")
    fails(distill, distill_args(mlm_teacher, corpus, tmp_path / "p", "--teacher-layers", "0,x"), "like 0,2,5")
