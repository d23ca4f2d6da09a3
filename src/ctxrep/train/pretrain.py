"""Pretrain a model from plain text: tokenizer, packed corpus, objective, Trainer, a loadable model folder.

    pretrain("mlm", load_config("tiny"), "corpus/", "runs/bert-tiny")
    pretrain("distill", load_config("distill", [("teacher", "minilm"), ("student_layers", "3")]), "corpus/", "runs/mini3")

One pipeline for every objective (`ctxrep pretrain` runs exactly this); everything particular to an objective is
in its recipe (objectives/recipe.py; the table in objectives/recipes.py), never in a branch on its name here:
1. the tokenizer: `--tokenizer PATH`, else OUT/tokenizer.json from an earlier run, else trained on the corpus, of
   the recipe's kind ([tokenizer] kind, one of its `tokenizer_kinds`) plus its `tokenizer_template`; a recipe
   with its `own_tokenizer` brings its tokenizer instead (distill: its teacher's, always);
2. its vocabulary must have exactly [tokenizer] vocab_size entries, the model's embedding (softmax) rows;
3. the corpus is packed into OUT/corpus/ (reused when up to date) and its last sentences are held out
   ([data] eval_fraction, `min_documents` of the recipe on each side) for the trainer's evaluations;
4. the recipe's `build` makes the objective module from [encoder], its settings and the tokenizer; [data]
   max_length must fit its position limit; its `packing` makes the train / held-out batch sources;
5. `Trainer(...).train(resume=...)`. OUT itself becomes the model folder (the module's save_pretrained: config.json,
   model.safetensors, tokenizer.json, tokenizer_config.json; for bilm options.json, weights.hdf5, vocab.txt), which
   ctxrep.load_model, ctxrep.Featurizer and transformers load; OUT/log.jsonl holds the training log,
   OUT/checkpoint/ the resumable state, OUT/pretrain.json the objective and the settings it read.

Configs: train/pretrain_config.py (one schema for every objective; `reading_table()` lists which keys each reads).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from ctxrep.data.corpus import CorpusConfig, PackedCorpus, pack_corpus
from ctxrep.data.packing import PackingError, ShortSequenceWarmup
from ctxrep.models.adapters import LoRA, add_lora, merged_copy
from ctxrep.objectives.recipe import Ingredients, Packing, PretrainError, Recipe
from ctxrep.objectives.recipes import recipe
from ctxrep.text.tokenizer import Tokenizer
from ctxrep.train import distributed
from ctxrep.train.config import check_run_folder
from ctxrep.train.memory import encoders_of
from ctxrep.train.precision import check_precision, resolve_precision
from ctxrep.train.pretrain_config import DataSection, PretrainConfig, read_settings
from ctxrep.train.run import PretrainRun
from ctxrep.train.trainer import Trainer

RUN_FILE = "pretrain.json"
CORPUS_DIR = "corpus"


def pretrain(
    objective: str,
    config: PretrainConfig,
    corpus: str | Path,
    out_dir: str | Path,
    max_steps: int | None = None,
    resume: bool = False,
    tokenizer: str | Path | None = None,
    progress: bool = True,
    lora: LoRA | None = None,
) -> dict:
    """Train `objective` on the text of `corpus` into `out_dir`; returns the trainer's last metrics. `lora`: LoRA
    adapters (models/adapters.py) train on the objective's encoders instead of their weights (the heads train in
    full); the model folder is saved with them merged in.

    Call `distributed.init_distributed()` first under torchrun: rank 0 trains the tokenizer and packs the
    corpus while the others wait.
    """
    recipe(objective)  # an unknown name lists the known ones
    if max_steps is not None:
        config.trainer.max_steps = max_steps
    out = Path(out_dir)

    def same_objective(saved: dict) -> None:
        if saved.get("objective") != objective:
            raise PretrainError(
                f"{out} holds a {saved.get('objective')} run, not {objective}; resume with "
                f"--objective {saved.get('objective')}, or pretrain {objective} into another --out folder"
            )
        if saved.get("lora") != record["lora"]:
            was, now = saved.get("lora"), record["lora"]
            raise PretrainError(
                f"{out} was trained {'with LoRA ' + str(was) if was else 'without LoRA'}, this run is "
                f"{'with LoRA ' + str(now) if now else 'without'}; resume with the --lora options the run started with"
            )

    record = {
        "objective": objective,
        "config": config.source,
        "precision": "bf16" if config.trainer.bf16 else "fp32",  # bf16: autocast ([trainer] bf16)
        "settings": read_settings(config, objective),
        "lora": dataclasses.asdict(lora) if lora is not None else None,
    }
    check_run_folder(out, resume, RUN_FILE, record, PretrainError, same_objective)
    torch.manual_seed(config.trainer.seed)  # the same initial weights on every process and every run
    run = prepare_run(objective, config, corpus, out, tokenizer, progress)
    save_model = run.save_model
    if lora is not None:
        trained = [e for e in encoders_of(run.objective) if any(p.requires_grad for p in e.parameters())]
        for encoder in trained:  # not a frozen teacher's
            add_lora(encoder, lora)

        def save_model(folder: Path) -> None:  # the plain folder every tool reads: the adapters merged into a copy
            merged_copy(run.objective).save_pretrained(folder)

    trainer = Trainer(run.objective, config.trainer, run.train_data, out, run.eval_data, save_model, progress=progress)
    return trainer.train(resume=resume)


def choose_precision(config: PretrainConfig, precision: str, out_dir: str | Path, resume: bool) -> str:
    """Set config.trainer.bf16 for `precision` ("fp32", "bf16" or "auto": train/precision.py) and return what the
    run computes in, "fp32" or "bf16". With `resume`, "auto" keeps the choice the saved run made (its pretrain.json),
    so that a run computes as it began wherever it is resumed."""
    check_precision(precision)
    saved = Path(out_dir) / RUN_FILE
    if precision == "auto" and resume and saved.is_file():
        bf16 = json.loads(saved.read_text()).get("settings", {}).get("trainer", {}).get("bf16")
        if isinstance(bf16, bool):
            config.trainer.bf16 = bf16
            return "bf16" if bf16 else "fp32"
    chosen = resolve_precision(precision, config.trainer.device)
    config.trainer.bf16 = chosen == "bf16"
    return chosen


def prepare_run(
    objective: str,
    config: PretrainConfig,
    corpus: str | Path,
    out: str | Path,
    tokenizer: str | Path | None = None,
    progress: bool = True,
) -> PretrainRun:
    """Steps 1-4 of the module docstring: the tokenizer and the packed corpus in `out` (made by rank 0 under
    torchrun, then read by the others), the held-out split and the objective's run. Seed torch first: the
    objective's initial weights are drawn here."""
    corpus, out = Path(corpus), Path(out)

    def prepare() -> tuple[Tokenizer, PackedCorpus]:
        tok = prepare_tokenizer(objective, config, corpus, out, tokenizer, progress)
        return tok, pack_corpus(corpus, out, out / CORPUS_DIR, corpus_config_of(config.data), progress=progress)

    def load() -> tuple[Tokenizer, PackedCorpus]:
        return Tokenizer.from_model_dir(out), PackedCorpus.open(out / CORPUS_DIR)

    tok, packed = distributed.current().main_first(prepare, load)
    return build_run(objective, config, packed, tok)


def corpus_config_of(data: DataSection) -> CorpusConfig:
    """The packed corpus's settings from the [data] section (document boundary and workers checked here)."""
    if data.document_boundary not in ("file", "blank_line"):
        raise PretrainError(f"[data] document_boundary={data.document_boundary!r}: use 'file' or 'blank_line'")
    if data.num_workers < -1:
        raise PretrainError(
            f"[data] num_workers={data.num_workers}: use 0 (this process), N processes, or -1 (one per CPU)"
        )
    workers = None if data.num_workers == -1 else data.num_workers  # CorpusConfig: None = one per CPU, 0/1 = here
    return CorpusConfig(data.document_boundary, data.strip_gutenberg, workers)


def tokenizer_kind(objective: str, config: PretrainConfig) -> str:
    """[tokenizer] kind, or the objective's own kind (its recipe's first) when it is ""."""
    return recipe(objective).tokenizer_kind(config.tokenizer.kind, config.source)


def prepare_tokenizer(
    objective: str,
    config: PretrainConfig,
    corpus: Path,
    out: Path,
    tokenizer: str | Path | None = None,
    progress: bool = False,
) -> Tokenizer:
    """The run's tokenizer in out/: the recipe's own, copied from `tokenizer`, kept from an earlier run, or trained
    on the corpus."""
    from ctxrep.data.tokenizer_training import train_tokenizer

    r = recipe(objective)
    out.mkdir(parents=True, exist_ok=True)
    if r.own_tokenizer is not None:
        return r.own_tokenizer(config.sections_of(r), config.source, out, tokenizer)
    t = config.tokenizer
    kind = r.tokenizer_kind(t.kind, config.source)
    if tokenizer is not None:
        source = Path(tokenizer)
        source_file = source / "tokenizer.json" if source.is_dir() else source
        if not source_file.is_file():
            raise PretrainError(
                f"--tokenizer {tokenizer}: no tokenizer.json there; pass a tokenizer.json file or its folder"
            )
        if source_file.resolve() != (out / "tokenizer.json").resolve():
            shutil.copyfile(source_file, out / "tokenizer.json")
            if (source_file.parent / "tokenizer_config.json").is_file():
                shutil.copyfile(source_file.parent / "tokenizer_config.json", out / "tokenizer_config.json")
        where = f"--tokenizer {tokenizer}"
    elif (out / "tokenizer.json").is_file():
        where = f"{out / 'tokenizer.json'} (from an earlier run)"
    else:
        corpus_config = corpus_config_of(config.data)
        train_tokenizer(
            corpus,
            kind,
            t.vocab_size - r.template_tokens,
            out,
            t.lowercase,
            t.min_frequency,
            corpus_config,
            show_progress=progress,
        )
        if r.tokenizer_template is not None:
            r.tokenizer_template(out)
        where = f"the {kind} tokenizer trained on {corpus}"
    tok = Tokenizer.from_model_dir(out)
    if tok.vocab_size != t.vocab_size:
        raise PretrainError(
            f"{where} has {tok.vocab_size} entries but the model's vocab_size is {t.vocab_size} ([tokenizer] "
            f"vocab_size in {config.source}); set --tokenizer.vocab_size {tok.vocab_size}, or use a larger corpus "
            "or another tokenizer"
        )
    return tok


def build_run(objective: str, config: PretrainConfig, corpus: PackedCorpus, tokenizer: Tokenizer) -> PretrainRun:
    """The recipe's objective module, its train / held-out batch sources (the corpus's tail held out) and its saver."""
    r = recipe(objective)
    settings = config.settings(r)
    ingredients = Ingredients(
        config.encoder,
        settings,
        config.sections_of(r),
        tokenizer,
        config.tokenizer.vocab_size,
        config.trainer.seed,
        config.source,
    )
    built = r.build(ingredients)
    data = config.data
    for name in ("max_length", "short_seq_warmup_length"):
        length = getattr(data, name)
        if built.positions is not None and length > built.positions:
            raise PretrainError(
                f"[data] {name}={length} is longer than the model's {built.positions} positions "
                f"([encoder] max_position_embeddings in {config.source}); lower {name} or raise max_position_embeddings"
            )
    train_corpus, eval_corpus = split_held_out(corpus, data, r.min_documents)
    train_data = make_packer(r, train_corpus, config, tokenizer, settings, built.separator_id, warmup=True)
    eval_data = None
    if eval_corpus is not None:
        eval_data = make_packer(r, eval_corpus, config, tokenizer, settings, built.separator_id, warmup=False)
    return PretrainRun(built.module, train_data, eval_data, built.module.save_pretrained)


def make_packer(
    r: Recipe,
    corpus: PackedCorpus,
    config: PretrainConfig,
    tokenizer: Tokenizer,
    settings,
    separator_id: int | None,
    warmup: bool,
):
    """The objective's packer over a packed corpus (the training data the Trainer pulls batches from); `warmup`
    adds the [data] short-sequence warmup of the training split."""
    data, trainer = config.data, config.trainer
    schedule = None
    if warmup and data.short_seq_warmup_length and data.short_seq_warmup_steps:
        # The packer counts micro-batches.
        micro_batches = data.short_seq_warmup_steps * trainer.accumulation_steps
        schedule = ShortSequenceWarmup(data.short_seq_warmup_length, micro_batches)
    return r.packing(corpus, tokenizer, Packing(data.max_length, trainer.seed, schedule, settings, separator_id))


def split_held_out(
    corpus: PackedCorpus, data: DataSection, min_documents: int = 1
) -> tuple[PackedCorpus, PackedCorpus | None]:
    """(train, held-out): the held-out part is the corpus's last sentences: ceil(eval_fraction x sentences) of
    them, or more where needed for one sequence (max_length tokens) and `min_documents` documents; the training
    part keeps at least as much. A document cut by the split becomes one document on each side.
    eval_fraction = 0: (corpus, None)."""
    if not 0.0 <= data.eval_fraction < 1.0:
        raise PretrainError(f"[data] eval_fraction={data.eval_fraction} must be in [0, 1)")
    if data.eval_fraction == 0:
        return corpus, None
    sent_off = corpus.sentence_offsets
    n = corpus.num_sentences
    doc_starts = corpus.document_offsets[:-1]
    cuts = np.arange(1, n)  # held-out = sentences [c, n)
    tokens_after = corpus.num_tokens - sent_off[cuts]
    docs_after = 1 + (len(doc_starts) - np.searchsorted(doc_starts, cuts, side="right"))
    docs_before = np.searchsorted(doc_starts, cuts, side="left")
    ok = n - cuts >= int(np.ceil(data.eval_fraction * n))
    ok &= (tokens_after >= data.max_length) & (sent_off[cuts] >= data.max_length)
    ok &= (docs_after >= min_documents) & (docs_before >= min_documents)
    if not ok.any():
        raise PackingError(
            f"{corpus.path}: the corpus ({corpus.num_tokens} tokens in {n} sentences, {corpus.num_documents} "
            f"documents) is too small to hold out {data.eval_fraction:.0%} of its sentences (at least one sequence "
            f"of max_length={data.max_length} tokens"
            + (f" and {min_documents} documents" if min_documents > 1 else "")
            + ") for evaluation and still train; use more text, or set --data.eval_fraction 0 to train without "
            "evaluation"
        )
    c = int(cuts[ok].max())
    return slice_sentences(corpus, 0, c), slice_sentences(corpus, c, n)


def slice_sentences(corpus: PackedCorpus, first: int, end: int) -> PackedCorpus:
    """Sentences [first, end) of `corpus` as a PackedCorpus (a view: no token is copied); a document cut by the
    slice keeps its part inside."""
    sentences, documents = corpus.sentence_offsets, corpus.document_offsets
    t0, t1 = int(sentences[first]), int(sentences[end])
    inner = documents[(documents > first) & (documents < end)] - first  # documents starting inside the slice
    doc_offsets = np.concatenate([[0], inner, [end - first]]).astype(np.int64)
    manifest = dict(corpus.manifest)
    manifest["counts"] = {"documents": len(doc_offsets) - 1, "sentences": end - first, "tokens": t1 - t0}
    return PackedCorpus(corpus.path, corpus.tokens[t0:t1], sentences[first : end + 1] - t0, doc_offsets, manifest)
