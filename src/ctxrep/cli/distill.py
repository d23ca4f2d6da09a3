"""`ctxrep distill`: make a smaller encoder that imitates a bigger one.

Task-agnostic (this command with --corpus): a student built from --teacher (compress/student.py: K of its layers,
or a narrower fresh one) learns on raw text to match the teacher: DistilBERT's soft targets + MLM + cosine loss
when the teacher has a masked-LM head, MiniLM's attention and value relations when it has none
(objectives/distill.py). It runs on the pretraining pipeline (`ctxrep pretrain --objective distill` is the same
run): the packed corpus, the Trainer (--resume, torchrun, log.jsonl), and --out becomes the student's model folder
(ctxrep.load_model, ctxrep.Featurizer and transformers' AutoModel load it) with the teacher's tokenizer.

Task-specific distillation (--task / --train: a fine-tuned estimator teaching a student estimator) joins this
command with its own options; --corpus stays the task-agnostic kind.
"""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors
from ctxrep.cli.pretrain import parse_overrides


def _layer_list(text: str | None) -> tuple[int, ...]:
    """"0,2,5" -> (0, 2, 5)."""
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--teacher-layers {text!r}: give teacher layer numbers separated by commas, like 0,2,5") from None


@click.command("distill", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--teacher", required=True, help="The teacher: a model folder or name (BERT, RoBERTa, ELECTRA; minilm).")
@click.option("--corpus", type=click.Path(), default=None,
              help="Raw text (a .txt file or a folder of them): task-agnostic distillation.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Run folder; becomes the student's model folder.")
@click.option("--student-layers", type=int, default=0, show_default=True,
              help="K layers, spread over the teacher's from first to last (0: half of them).")
@click.option("--teacher-layers", default=None, help="Copy exactly these teacher layers, e.g. 0,2,5 (bottom first).")
@click.option("--student-hidden-size", type=int, default=0, show_default=True,
              help="A narrower student (fresh weights, the teacher's heads); 0: the teacher's width, layers copied.")
@click.option("--config", "config_name", default="distill", show_default=True,
              help="A shipped pretraining config or a TOML file: [data], [trainer], [objective] masking, [distill].")
@click.option("--max-steps", type=int, default=None, help="Optimizer steps (overrides [trainer] max_steps).")
@click.option("--resume", is_flag=True, help="Continue the run saved in --out.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.pass_context
@user_errors
def distill(ctx, teacher, corpus, out_dir, student_layers, teacher_layers, student_hidden_size, config_name, max_steps,
            resume, progress) -> None:  # fmt: skip
    """Distil --teacher into a smaller student encoder on --corpus; the student is saved to --out.

    Any config field the distillation reads can be overridden as --section.field VALUE (e.g. --distill.temperature
    4, --trainer.lr 5e-4).
    """
    from ctxrep.train import distributed
    from ctxrep.train.pretrain import load_config
    from ctxrep.train.pretrain import pretrain as run_pretraining

    if corpus is None:
        raise ValueError("give --corpus FILE_OR_DIR: the raw text the student learns from its teacher on")
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
    if dist.is_main:
        loss = f"loss {metrics['loss']:.4f}" if "loss" in metrics else "no new steps"
        held_out = f", eval loss {metrics['eval_loss']:.4f}" if "eval_loss" in metrics else ""
        click.echo(f"step {metrics['step']}: {loss}{held_out}; wrote the student to {out_dir}")
