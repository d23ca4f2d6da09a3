"""`ctxrep distill`: make a smaller encoder that imitates a bigger one.

Task-agnostic (this command with --corpus): a student built from --teacher (models/student.py: K of its layers,
or a narrower fresh one) learns on raw text to match the teacher: DistilBERT's soft targets + MLM + cosine loss
when the teacher has a masked-LM head, MiniLM's attention and value relations when it has none
(objectives/distill.py). It runs on the pretraining pipeline (`ctxrep pretrain --objective distill` is the same
run): the packed corpus, the Trainer (--resume, torchrun, log.jsonl), and --out becomes the student's model folder
(ctxrep.load_model, ctxrep.Featurizer and transformers' AutoModel load it) with the teacher's tokenizer.

Task-specific (this command with --task and --train; compress/distill_task.py): --teacher is a fine-tuned task model
(the --out folder of `ctxrep finetune`, or its model/ folder); a student of its class, built from its encoder as
above, learns on --train from the teacher's temperature-softened outputs (--temperature, --alpha) and the hard
labels, optionally matching hidden states (--hidden-loss). --out DIR holds:
  model/         the student task model (<Class>.load(DIR/model); its `model` parameter names DIR/encoder)
  encoder/       the student encoder as a Hugging Face folder with the teacher's tokenizer (transformers' AutoModel,
                 ctxrep.load_model)
  distill.json   settings, sizes, timings and, with --dev, the teacher's and the student's dev scores
"""

from __future__ import annotations

import click

from ctxrep.cli.common import ctrl_c_waits, exit_if_interrupted, user_errors
from ctxrep.tasks.experiment import TASKS


def _layer_list(text: str | None) -> tuple[int, ...]:
    """ "0,2,5" -> (0, 2, 5)."""
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"--teacher-layers {text!r}: give teacher layer numbers separated by commas, like 0,2,5"
        ) from None


@click.command("distill", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--teacher", required=True, help="The teacher: a model folder or name (BERT, RoBERTa, ELECTRA; minilm).")
@click.option(
    "--corpus",
    type=click.Path(),
    default=None,
    help="Raw text (a .txt file or a folder of them): task-agnostic distillation.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Run folder; becomes the student's model folder.",
)
@click.option(
    "--student-layers",
    type=int,
    default=0,
    show_default=True,
    help="K layers, spread over the teacher's from first to last (0: half of them).",
)
@click.option("--teacher-layers", default=None, help="Copy exactly these teacher layers, e.g. 0,2,5 (bottom first).")
@click.option(
    "--student-hidden-size",
    type=int,
    default=0,
    show_default=True,
    help="A narrower student (fresh weights, the teacher's heads); 0: the teacher's width, layers copied.",
)
@click.option(
    "--config",
    "config_name",
    default="distill",
    show_default=True,
    help="A shipped pretraining config or a TOML file: [data], [trainer], [objective] masking, [distill].",
)
@click.option("--max-steps", type=int, default=None, help="Optimizer steps (overrides [trainer] max_steps).")
@click.option("--resume", is_flag=True, help="Continue the run saved in --out.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option(
    "--task",
    type=click.Choice(TASKS),
    default=None,
    help="Task-specific distillation: the task of the fine-tuned --teacher (as in finetune).",
)
@click.option(
    "--train",
    "train",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --task: the training file the student learns on.",
)
@click.option(
    "--dev",
    "dev",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --task: a development file; the teacher's and the student's scores on it are printed.",
)
@click.option(
    "--student",
    default=None,
    help="With --task: a ready student encoder (folder or name) with the teacher's tokenizer, instead of one "
    "built from the teacher.",
)
@click.option("--temperature", type=float, default=2.0, show_default=True, help="With --task: softmax temperature T.")
@click.option(
    "--alpha",
    type=float,
    default=0.5,
    show_default=True,
    help="With --task: weight of the soft targets; 1 - alpha goes to the hard labels.",
)
@click.option(
    "--hidden-loss",
    type=click.Choice(["none", "cosine", "mse"]),
    default="none",
    show_default=True,
    help="With --task: also match the hidden states of mapped layers.",
)
@click.option("--hidden-weight", type=float, default=1.0, show_default=True, help="With --task: weight of that loss.")
@click.option("--max-epochs", type=int, default=3, show_default=True, help="With --task: passes over --train.")
@click.option("--batch-size", type=int, default=None, help="With --task: batch size (default: the teacher's).")
@click.option("--lr", type=float, default=None, help="With --task: peak learning rate (default: the teacher's).")
@click.option("--limit", type=int, default=None, help="With --task: use only the first N train and dev examples.")
@click.option("--seed", type=int, default=0, show_default=True, help="With --task: random seed.")
@click.pass_context
@user_errors
def distill(
    ctx,
    teacher,
    corpus,
    out_dir,
    student_layers,
    teacher_layers,
    student_hidden_size,
    config_name,
    max_steps,
    resume,
    progress,
    task,
    train,
    dev,
    student,
    temperature,
    alpha,
    hidden_loss,
    hidden_weight,
    max_epochs,
    batch_size,
    lr,
    limit,
    seed,
) -> None:
    """Distil --teacher into a smaller student encoder on --corpus, or a fine-tuned task model into a smaller one
    with --task and --train; the student is saved to --out.

    Any config field the task-agnostic distillation reads can be overridden as --section.field VALUE (e.g.
    --distill.temperature 4, --trainer.lr 5e-4).

    Ctrl-C with --corpus finishes the current step, saves a checkpoint in --out and exits with status 130; the same
    command with --resume continues from it (a second Ctrl-C stops at once, without saving). With --task, Ctrl-C
    stops at once with status 130 and saves no student (while the student is being saved, it waits for the save).
    """
    if task is not None or train is not None:
        _check_task_options(ctx, corpus, task, train, resume, config_name)
        _distill_task(
            teacher,
            task,
            train,
            dev,
            out_dir,
            student_layers,
            _layer_list(teacher_layers),
            student_hidden_size,
            student,
            temperature,
            alpha,
            hidden_loss,
            hidden_weight,
            max_epochs,
            max_steps,
            batch_size,
            lr,
            limit,
            seed,
            progress,
        )
        return
    _distill_corpus(
        ctx,
        teacher,
        corpus,
        out_dir,
        student_layers,
        teacher_layers,
        student_hidden_size,
        config_name,
        max_steps,
        resume,
        progress,
    )


def _check_task_options(ctx, corpus, task, train, resume, config_name) -> None:
    """Task-specific distillation takes --task and --train, and none of the --corpus run's options."""
    if corpus is not None or task is None or train is None:
        raise ValueError(
            "task-specific distillation takes --task and --train (and no --corpus); task-agnostic takes --corpus "
            "alone: give one kind"
        )
    if resume or ctx.args or config_name != "distill":
        given = "--resume" if resume else "--config" if config_name != "distill" else " ".join(ctx.args)
        raise ValueError(f"{given} is for --corpus runs; task-specific distillation does not read it")


def _distill_corpus(
    ctx,
    teacher,
    corpus,
    out_dir,
    student_layers,
    teacher_layers,
    student_hidden_size,
    config_name,
    max_steps,
    resume,
    progress,
) -> None:
    """Task-agnostic distillation on --corpus (the config's distill section, with the command's overrides)."""
    from ctxrep.train import distributed
    from ctxrep.train.config import parse_overrides
    from ctxrep.train.pretrain import pretrain as run_pretraining
    from ctxrep.train.pretrain_config import load_config

    if corpus is None:
        raise ValueError(
            "give --corpus FILE_OR_DIR: the raw text the student learns from its teacher on (or --task T --train F "
            "to distil a fine-tuned task model)"
        )
    layers = _layer_list(teacher_layers)
    dist = distributed.init_distributed()  # first: under torchrun every process joins before any work
    try:
        config = load_config(config_name, parse_overrides(ctx.args), "distill")
        d = config.distill
        d.teacher = teacher
        d.student_layers = student_layers or d.student_layers
        d.teacher_layers = layers or d.teacher_layers
        d.student_hidden_size = student_hidden_size or d.student_hidden_size
        metrics = run_pretraining("distill", config, corpus, out_dir, max_steps, resume, None, progress)
    finally:
        distributed.shutdown()
    exit_if_interrupted(metrics, "ctxrep distill", echo=dist.is_main)
    if dist.is_main:
        loss = f"loss {metrics['loss']:.4f}" if "loss" in metrics else "no new steps"
        held_out = f", eval loss {metrics['eval_loss']:.4f}" if "eval_loss" in metrics else ""
        click.echo(f"step {metrics['step']}: {loss}{held_out}; wrote the student to {out_dir}")


def _distill_task(
    teacher_dir,
    task,
    train,
    dev,
    out_dir,
    student_layers,
    teacher_layers,
    student_hidden_size,
    student,
    temperature,
    alpha,
    hidden_loss,
    hidden_weight,
    max_epochs,
    max_steps,
    batch_size,
    lr,
    limit,
    seed,
    progress,
) -> None:
    """Task-specific distillation from the command line (see the module docstring for --out)."""
    import json
    import tempfile
    import time
    from pathlib import Path

    from ctxrep.cli.prune import load_estimator
    from ctxrep.compress.distill_task import distill_estimator, save_distilled
    from ctxrep.tasks.experiment import read_task

    out = Path(out_dir)
    teacher, source = load_estimator(Path(teacher_dir), task)
    if out.resolve() in (source.resolve(), Path(teacher_dir).resolve()):
        raise ValueError(f"--out {out} is the teacher's folder; give a new folder")
    data = read_task(task, train, limit)
    dev_data = read_task(task, dev, limit) if dev is not None else None
    params = {"max_epochs": max_epochs, "random_state": seed, "progress": progress}
    params |= {k: v for k, v in (("batch_size", batch_size), ("lr", lr), ("max_steps", max_steps)) if v is not None}
    started = time.perf_counter()
    # the student's encoder lives in a temporary folder while it trains: a stopped run leaves no untrained student
    # in --out; the whole student and distill.json are written at the end, a Ctrl-C there waiting for them
    with tempfile.TemporaryDirectory(prefix="ctxrep-student-") as training_dir:
        student_est = distill_estimator(
            teacher,
            data.X,
            data.y,
            student_layers=student_layers or None,
            temperature=temperature,
            alpha=alpha,
            hidden_loss=None if hidden_loss == "none" else hidden_loss,
            hidden_weight=hidden_weight,
            teacher_layers=teacher_layers or None,
            student_hidden_size=student_hidden_size or None,
            student=student,
            encoder_dir=training_dir,
            eval_set=(dev_data.X, dev_data.y) if dev_data is not None else None,  # --keep best: the best dev epoch
            **params,
        )
        seconds = time.perf_counter() - started
        report, summary = _report(teacher, student_est, source, task, train, len(data.X), seconds, dev, dev_data)
        with ctrl_c_waits("saving the student"):  # distill.json, written last, marks a complete --out
            save_distilled(student_est, out)
            (out / "distill.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    click.echo(f"{summary}; wrote {out}")


def _report(teacher, student_est, source, task, train, train_examples, seconds, dev, dev_data) -> tuple[dict, str]:
    """distill.json's content and the line printed at the end: sizes, timings and the dev scores with --dev."""
    from ctxrep.compress.prune import parameter_count

    t_encoder, s_encoder = teacher.model_.representation.encoder, student_est.model_.representation.encoder
    report = {
        "teacher": str(source),
        "task": task,
        "train": str(train),
        "train_examples": train_examples,
        "seconds": seconds,
        "teacher_parameters": parameter_count(t_encoder),
        "student_parameters": parameter_count(s_encoder),
        "student_layers": s_encoder.num_layers,
        "student_hidden_size": s_encoder.hidden_size,
    } | student_est.distillation_
    summary = (
        f"{t_encoder.num_layers} -> {s_encoder.num_layers} layers, encoder parameters "
        f"{report['teacher_parameters']:,} -> {report['student_parameters']:,}"
    )
    if dev_data is not None:
        report["dev"], report["dev_examples"] = str(dev), len(dev_data.X)
        report["teacher_dev_score"] = float(teacher.score(dev_data.X, dev_data.y))
        report["student_dev_score"] = float(student_est.score(dev_data.X, dev_data.y))
        summary += f"; dev score {report['student_dev_score']:.4f} (teacher {report['teacher_dev_score']:.4f})"
    report["history"] = student_est.history_
    return report, summary
