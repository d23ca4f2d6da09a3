"""Pretrain a model from plain text: tokenizer, packed corpus, objective, Trainer, a loadable model folder.

    pretrain("mlm", load_config("tiny"), "corpus/", "runs/bert-tiny")
    pretrain("distill", load_config("distill", [("teacher", "minilm"), ("student_layers", "3")]), "corpus/", "runs/mini3")

One pipeline for every objective (`ctxrep pretrain` runs exactly this):
1. the tokenizer: `--tokenizer PATH`, else OUT/tokenizer.json from an earlier run, else trained on the
   corpus: WordPiece or byte-level BPE for mlm / mlm+nsp / mlm+sop / electra ([tokenizer] kind), byte-level BPE for
   clm, byte-level BPE plus <sep> and <cls> with XLNet's template "A <sep> <cls>" for plm, a word-level
   vocabulary (most frequent words first) for bilm; for distill, the teacher's tokenizer, always;
2. its vocabulary must have exactly [tokenizer] vocab_size entries, the model's embedding (softmax) rows (distill:
   at most the teacher's rows);
3. the corpus is packed into OUT/corpus/ (reused when up to date) and its last sentences are held out
   ([data] eval_fraction) for the trainer's evaluations;
4. the objective's `PretrainRun` (`build_run`): the objective module, BERT segment pairs for mlm+nsp,
   ALBERT's sentence-order pairs for mlm+sop and RoBERTa FULL-SENTENCES otherwise (for bilm: sentences of
   words, documents separated by </S>); distill's module holds the student and a frozen teacher (outside its
   state_dict, so checkpoints hold the student only);
5. `Trainer(...).train(resume=...)`. OUT itself becomes the model folder: config.json, model.safetensors,
   tokenizer.json, tokenizer_config.json (for bilm: options.json, weights.hdf5, vocab.txt), which
   ctxrep.load_model, ctxrep.Featurizer and transformers load; OUT/log.jsonl holds the training log,
   OUT/checkpoint/ the resumable state, OUT/pretrain.json the objective and the settings it read.

Configs are TOML files; one schema for every objective (`reading_table()` lists which keys each reads):
- [tokenizer], [data], [trainer] (TrainerConfig): read by every objective, each key with one meaning ([tokenizer]
  not by distill, whose student shares its teacher's tokenizer);
- [encoder]: the Transformer's shape in BERT's names (mapped onto AlbertConfig for mlm+sop, GPT2Config for clm,
  XLNetConfig for plm);
- [elmo]: the biLM's shape, in the layout of ELMo's options.json ([elmo.char_cnn], [elmo.lstm]);
- [objective]: the settings of particular objectives (masking, ELECTRA, XLNet, the biLM softmax);
- [distill]: distill's teacher, the student's shape (compress/student.py) and the loss weights (objectives/distill.py).
A key that no objective reads is an error. A file may hold the settings of several objectives in [encoder],
[elmo] and [objective] (the shipped tiny and small configure all of them); each run reads those of its own
objective, and records what it read in pretrain.json. A setting given on the command line must be one the
chosen objective reads. Shipped configs live in ctxrep/configs/pretrain/ and are named without ".toml".
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ctxrep.data.corpus import CorpusConfig, PackedCorpus, pack_corpus
from ctxrep.data.packing import (
    FullSentencesConfig,
    FullSentencesPacker,
    PackingError,
    SegmentPairConfig,
    SegmentPairPacker,
    ShortSequenceWarmup,
)
from ctxrep.tokenize import Tokenizer
from ctxrep.train import distributed
from ctxrep.train.run import PretrainRun
from ctxrep.train.trainer import CHECKPOINT_DIR, Trainer, TrainerConfig

OBJECTIVES = ("mlm", "mlm+nsp", "mlm+sop", "electra", "clm", "plm", "bilm", "distill")
TRANSFORMERS = ("mlm", "mlm+nsp", "mlm+sop", "electra", "clm", "plm")
MASKED = ("mlm", "mlm+nsp", "mlm+sop", "electra")
MASKING = (*MASKED, "distill")  # distill masks as mlm does when its teacher has a masked-LM head
TRAINS_TOKENIZER = tuple(o for o in OBJECTIVES if o != "distill")  # distill uses its teacher's tokenizer
BERTS = ("mlm", "mlm+nsp")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "pretrain"
RUN_FILE = "pretrain.json"
CORPUS_DIR = "corpus"
XLNET_SPECIALS = ("<sep>", "<cls>")


class PretrainError(ValueError):
    """A config, corpus or output folder that cannot be used for pretraining, with what to change."""


# ------------------------------------------------------------------------------------------- config


def _key(default, read_by: tuple[str, ...]):
    """A config field read by some objectives only (the others ignore it in a file and refuse it as an override)."""
    return field(default=default, metadata={"read_by": read_by})


@dataclass
class EncoderSection:
    """The Transformer's shape, in BERT's names; mlm+sop maps them onto AlbertConfig, clm onto GPT2Config, plm
    onto XLNetConfig. Read by mlm, mlm+nsp, mlm+sop, electra, clm and plm; the keys a family has no counterpart
    for are marked."""

    model_type: str = _key(
        "bert", BERTS
    )  # "bert" or "roberta"; electra builds ELECTRA, mlm+sop ALBERT, clm GPT-2, plm XLNet
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    # 0 = hidden_size (mlm+sop: min(128, hidden_size), ALBERT's E); ELECTRA-small has narrower embeddings projected up
    embedding_size: int = _key(0, MASKED)
    share: str = _key("all", ("mlm+sop",))  # ALBERT's cross-layer sharing: "all", "attention", "ffn" or "none"
    hidden_act: str = _key("gelu", (*MASKED, "plm"))  # GPT-2 keeps its own gelu_new
    hidden_dropout_prob: float = 0.1  # plm: XLNet's one dropout
    attention_probs_dropout_prob: float = _key(0.1, (*MASKED, "clm"))
    max_position_embeddings: int = _key(512, (*MASKED, "clm"))  # XLNet's relative positions have no limit
    type_vocab_size: int = _key(2, MASKED)
    layer_norm_eps: float = _key(1e-12, (*MASKED, "plm"))  # GPT-2 keeps its own 1e-5
    initializer_range: float = 0.02


@dataclass
class TokenizerSection:
    """The vocabulary, trained on the corpus unless --tokenizer gives one. Read by every objective."""

    kind: str = ""  # "" = the objective's: wordpiece (mlm, mlm+nsp, electra; or "bpe"), bpe (clm, plm), word (bilm)
    vocab_size: int = 30522  # entries, special tokens included = the model's embedding (softmax) rows, exactly
    lowercase: bool = True
    min_frequency: int = 2  # rarest pair merged (wordpiece, bpe) or word kept (word)


@dataclass
class DataSection:
    """Reading, holding out and packing the corpus. Read by every objective; lengths count tokens (words for bilm)."""

    max_length: int = 128  # tokens per sequence, special tokens included
    short_seq_warmup_length: int = 0  # short-sequence warm-up length; 0 = no warm-up
    short_seq_warmup_steps: int = 0  # optimizer steps at short_seq_warmup_length (BERT: 90% of its steps at 128)
    document_boundary: str = "file"  # "file" or "blank_line"
    strip_gutenberg: bool = True  # drop Project Gutenberg headers and footers
    eval_fraction: float = 0.02  # share of the corpus's sentences held out (its last ones); 0 = no evaluation
    num_workers: int = 0  # tokenizer processes for packing: 0 = this process, N = N processes, -1 = one per CPU


@dataclass
class ObjectiveSection:
    """Settings of particular objectives; each key says which objectives read it."""

    mask_prob: float = _key(0.15, MASKING)
    replace_prob: float = _key(0.8, MASKING)  # of the selected tokens: [MASK]
    random_prob: float = _key(0.1, MASKING)  # ... a random token (the rest stay unchanged)
    whole_word: bool = _key(False, MASKING)
    static_copies: int = _key(0, MASKING)  # 0 = dynamic masking (RoBERTa); N = one of N fixed masks per sequence (BERT)
    short_seq_prob: float = _key(0.1, ("mlm+nsp", "mlm+sop"))  # pairs aiming at a random shorter length (BERT, ALBERT)
    generator_size_fraction: float = _key(
        0.25, ("electra",)
    )  # generator hidden / heads / intermediate vs discriminator
    disc_weight: float = _key(50.0, ("electra",))  # lambda
    k: int = _key(6, ("plm",))  # predict the last 1/K of each factorization order
    span_prediction: bool = _key(False, ("plm",))
    max_span: int = _key(5, ("plm",))
    bidirectional_context: bool = _key(True, ("plm",))
    softmax: str = _key("sampled", ("bilm",))  # "sampled" (training; full at evaluation) or "full"
    num_samples: int = _key(8192, ("bilm",))  # log-uniform draws per batch for the sampled softmax
    dropout: float = _key(0.1, ("bilm",))  # on the biLM's top layer before the softmax


@dataclass
class DistillSection:
    """Task-agnostic distillation (objective distill, objectives/distill.py): the teacher, the student's shape and
    the loss weights. The student is built from the teacher (compress/student.py) and shares its tokenizer."""

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


SECTIONS: dict[str, type] = {
    "encoder": EncoderSection,
    "tokenizer": TokenizerSection,
    "data": DataSection,
    "objective": ObjectiveSection,
    "trainer": TrainerConfig,
    "distill": DistillSection,
}
# Which objectives read a section's keys unless a key says otherwise (field metadata "read_by").
SECTION_READERS: dict[str, tuple[str, ...]] = {
    "encoder": TRANSFORMERS,
    "tokenizer": TRAINS_TOKENIZER,
    "data": OBJECTIVES,
    "objective": (),
    "trainer": OBJECTIVES,
    "elmo": ("bilm",),
    "distill": ("distill",),
}
# [elmo]: the biLM's shape in the layout of ELMo's options.json, handed to ElmoConfig.from_options.
ELMO_KEYS = {
    "char_cnn": ("embedding", "filters", "n_highway", "activation", "n_characters", "max_characters_per_token"),
    "lstm": ("dim", "projection_dim", "n_layers", "cell_clip", "proj_clip", "use_skip_connections"),
}
# Keys that an earlier schema had elsewhere: where they are now.
MOVED = {
    ("data", "short_seq_prob"): "[objective] short_seq_prob",
    ("data", "seed"): "[trainer] seed (one seed for the data order and the initial weights of every objective)",
    ("elmo", "softmax"): "[objective] softmax",
    ("elmo", "num_samples"): "[objective] num_samples",
    ("elmo", "dropout"): "[objective] dropout",
}


@dataclass
class PretrainConfig:
    encoder: EncoderSection
    tokenizer: TokenizerSection
    data: DataSection
    objective: ObjectiveSection
    trainer: TrainerConfig
    distill: DistillSection = field(default_factory=DistillSection)
    raw: dict = field(default_factory=dict)  # the whole config after overrides ([elmo] is read from here)
    source: str = ""  # the file it came from


def readers(section: str, key: str) -> tuple[str, ...]:
    """The objectives that read `key` ("lstm.dim" in [elmo]) of `section`."""
    cls = SECTIONS.get(section)
    if cls is not None:
        for f in dataclasses.fields(cls):
            if f.name == key:
                return f.metadata.get("read_by", SECTION_READERS[section])
    return SECTION_READERS[section]


def reading_table() -> str:
    """Which keys each objective reads, as a Markdown table (x = read)."""
    lines = ["| key | " + " | ".join(OBJECTIVES) + " |", "|---|" + "---|" * len(OBJECTIVES)]
    keys = [(s, f.name) for s, cls in SECTIONS.items() if s != "trainer" for f in dataclasses.fields(cls)]
    keys += [("elmo", f"{table}.*") for table in ELMO_KEYS]
    for section, key in keys:
        who = readers(section, key)
        lines.append(f"| [{section}] {key} | " + " | ".join("x" if o in who else "" for o in OBJECTIVES) + " |")
    lines.append("| [trainer] (every key) | " + " | ".join("x" for _ in OBJECTIVES) + " |")
    return "\n".join(lines)


def config_path(name_or_path: str | Path) -> Path:
    """A shipped config name ("tiny", "small", "bert-base", ...) or the path of a TOML file."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = CONFIG_DIR / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
    raise PretrainError(f"config {str(name_or_path)!r} is neither a TOML file nor a shipped config ({names})")


def load_config(
    name_or_path: str | Path, overrides: list[tuple[str, str]] = (), objective: str | None = None
) -> PretrainConfig:
    """Read a TOML config and apply `overrides` ((key, text value): "trainer.lr", or "lr" when one section has
    it); with `objective`, an override that objective does not read is refused."""
    path = config_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise PretrainError(f"{path}: not valid TOML ({e})") from None
    return config_from_dict(raw, str(path), overrides, objective)


def config_from_dict(
    raw: dict, source: str, overrides: list[tuple[str, str]] = (), objective: str | None = None
) -> PretrainConfig:
    """A PretrainConfig from a parsed TOML dict (`source` names it in errors); see `load_config`."""
    if objective is not None and objective not in OBJECTIVES:
        raise PretrainError(f"objective {objective!r} is unknown; use one of {', '.join(OBJECTIVES)}")
    raw = copy.deepcopy(raw)
    _check_keys(raw, source)
    for key, text in overrides:
        _apply_override(raw, key, text, source, objective)
    sections = {}
    for name, cls in SECTIONS.items():
        hints = _field_types(cls)
        values = {k: _coerce(v, hints[k], f"{source}: [{name}] {k}") for k, v in raw.get(name, {}).items()}
        try:
            sections[name] = cls(**values)
        except (TypeError, ValueError) as e:
            raise PretrainError(f"{source}: [{name}]: {e}") from None
    return PretrainConfig(**sections, raw=raw, source=source)


def _check_keys(raw: dict, source: str) -> None:
    """Every section and key is one that some objective reads."""
    for section, value in raw.items():
        if section not in SECTION_READERS:
            known = ", ".join(f"[{s}]" for s in SECTION_READERS)
            raise PretrainError(f"{source}: unknown section [{section}]; the sections are {known}")
        if not isinstance(value, dict):
            raise PretrainError(f"{source}: {section} must be a [{section}] table, not a value")
        for key, inner in value.items():
            if (section, key) in MOVED:
                raise PretrainError(f"{source}: [{section}] {key} is now {MOVED[section, key]}; move it there")
            if section == "elmo":
                if key not in ELMO_KEYS:
                    raise PretrainError(
                        f"{source}: unknown key {key!r} in [elmo]; [elmo] holds the biLM's shape as the tables "
                        "[elmo.char_cnn] and [elmo.lstm] (the biLM's softmax settings are in [objective])"
                    )
                unknown = sorted(set(inner) - set(ELMO_KEYS[key])) if isinstance(inner, dict) else ["(a value)"]
                if unknown:
                    raise PretrainError(
                        f"{source}: unknown key(s) {', '.join(unknown)} in [elmo.{key}]; known: "
                        f"{', '.join(ELMO_KEYS[key])}"
                    )
            elif key not in _field_types(SECTIONS[section]):
                known = ", ".join(_field_types(SECTIONS[section]))
                raise PretrainError(f"{source}: unknown key {key!r} in [{section}]; known: {known}")


def _field_types(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _apply_override(raw: dict, key: str, text: str, source: str, objective: str | None) -> None:
    """Set raw[section][field] from "--section.field VALUE" or "--field VALUE" (no two sections share a name)."""
    key = key.replace("-", "_")
    if "." in key:
        section, name = key.split(".", 1)
        if section in SECTIONS:
            if name not in _field_types(SECTIONS[section]):
                raise PretrainError(f"--{key}: [{section}] in {source} has no key {name!r}")
        elif section == "elmo":
            table, _, leaf = name.partition(".")
            if leaf not in ELMO_KEYS.get(table, ()):
                raise PretrainError(
                    f"--{key}: [elmo] has no key {name!r}; known: "
                    + ", ".join(f"{t}.{k}" for t, keys in ELMO_KEYS.items() for k in keys)
                )
        else:
            raise PretrainError(f"--{key}: unknown section {section!r} (sections: {', '.join(SECTION_READERS)})")
    else:
        owners = [s for s, cls in SECTIONS.items() if key in _field_types(cls)]  # one at most (a test checks)
        if not owners:
            raise PretrainError(f"--{key}: no config section has a key {key!r} ({source})")
        section, name = owners[0], key
    who = readers(section, name)
    if objective is not None and objective not in who:
        raise PretrainError(
            f"--{key}: [{section}] {name} is read by {', '.join(who)}, not by {objective}; leave it out, or "
            f"pretrain {' or '.join(f'--objective {o}' for o in who)}"
        )
    value = _parse_value(text)
    if section in SECTIONS:
        value = _coerce(value, _field_types(SECTIONS[section])[name], f"--{key}")
    table = raw.setdefault(section, {})
    *parents, leaf = name.split(".")
    for p in parents:
        table = table.setdefault(p, {})
    table[leaf] = value


def _parse_value(text: str):
    """A TOML literal (1e-3, true, [0.9, 0.98], "x"), or else the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _coerce(value, hint, where: str):
    """Check a value against a dataclass field type (int, float, bool, str, tuple[float, float])."""
    origin = typing.get_origin(hint)
    if origin is tuple and typing.get_args(hint) == (int, Ellipsis):
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise PretrainError(f"{where}: expected a list of integers like [0, 2, 5], got {value!r}")
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            return tuple(float(v) for v in value)
        raise PretrainError(f"{where}: expected a list of numbers like [0.9, 0.999], got {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise PretrainError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def read_settings(config: PretrainConfig, objective: str) -> dict:
    """The settings `objective` reads, by section (what pretrain.json records)."""
    settings: dict[str, dict] = {}
    for name in SECTIONS:
        values = dataclasses.asdict(getattr(config, name))
        settings[name] = {k: v for k, v in values.items() if objective in readers(name, k)}
    if objective in SECTION_READERS["elmo"]:
        settings["elmo"] = config.raw.get("elmo", {})
    return {name: values for name, values in settings.items() if values}


# ------------------------------------------------------------------------------------------ the run


def pretrain(
    objective: str,
    config: PretrainConfig,
    corpus: str | Path,
    out_dir: str | Path,
    max_steps: int | None = None,
    resume: bool = False,
    tokenizer: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Train `objective` on the text of `corpus` into `out_dir`; returns the trainer's last metrics.

    Call `distributed.init_distributed()` first under torchrun: rank 0 trains the tokenizer and packs the
    corpus while the others wait.
    """
    if objective not in OBJECTIVES:
        raise PretrainError(f"objective {objective!r} is unknown; use one of {', '.join(OBJECTIVES)}")
    if max_steps is not None:
        config.trainer.max_steps = max_steps
    out = Path(out_dir)
    _check_out_dir(out, objective, config, resume, distributed.current())
    torch.manual_seed(config.trainer.seed)  # the same initial weights on every process and every run
    run = prepare_run(objective, config, corpus, out, tokenizer, progress)
    trainer = Trainer(
        run.objective, config.trainer, run.train_data, out, run.eval_data, run.save_model, progress=progress
    )
    return trainer.train(resume=resume)


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
        return tok, pack_corpus(corpus, out, out / CORPUS_DIR, _corpus_config(config.data), progress=progress)

    def load() -> tuple[Tokenizer, PackedCorpus]:
        return Tokenizer.from_model_dir(out), PackedCorpus.open(out / CORPUS_DIR)

    tok, packed = distributed.current().main_first(prepare, load)
    return build_run(objective, config, packed, tok)


def _check_out_dir(out: Path, objective: str, config: PretrainConfig, resume: bool, ctx) -> None:
    """Refuse to resume a run of another objective; record this run's objective and the settings it reads."""
    record = out / RUN_FILE
    has_checkpoint = (out / CHECKPOINT_DIR / "trainer_state.json").is_file()
    if resume:
        if not record.is_file():
            raise PretrainError(f"{out}: nothing to resume ({RUN_FILE} is missing); start the run without --resume")
        saved = json.loads(record.read_text())
        if saved.get("objective") != objective:
            raise PretrainError(
                f"{out} holds a {saved.get('objective')} run, not {objective}; resume with "
                f"--objective {saved.get('objective')}, or pretrain {objective} into another --out folder"
            )
        return
    if has_checkpoint:
        raise PretrainError(
            f"{out} already holds a checkpoint; pass --resume to continue that run, or choose another --out folder"
        )
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        settings = read_settings(config, objective)
        text = json.dumps({"objective": objective, "config": config.source, "settings": settings}, indent=2)
        record.write_text(text + "\n")


def _corpus_config(data: DataSection) -> CorpusConfig:
    if data.document_boundary not in ("file", "blank_line"):
        raise PretrainError(f"[data] document_boundary={data.document_boundary!r}: use 'file' or 'blank_line'")
    if data.num_workers < -1:
        raise PretrainError(
            f"[data] num_workers={data.num_workers}: use 0 (this process), N processes, or -1 (one per CPU)"
        )
    workers = None if data.num_workers == -1 else data.num_workers  # CorpusConfig: None = one per CPU, 0/1 = here
    return CorpusConfig(data.document_boundary, data.strip_gutenberg, workers)


def tokenizer_kind(objective: str, config: PretrainConfig) -> str:
    """[tokenizer] kind, or the objective's own kind when it is "": wordpiece for the BERT family (which may
    also use bpe), byte-level bpe for clm and plm, word for bilm."""
    own = {"clm": "bpe", "plm": "bpe", "bilm": "word"}.get(objective, "wordpiece")
    usable = ("wordpiece", "bpe") if objective in MASKED else (own,)
    kind = config.tokenizer.kind or own
    if kind not in usable:
        raise PretrainError(
            f"[tokenizer] kind={kind!r} in {config.source}: {objective} trains a {' or '.join(usable)} tokenizer; "
            f"set --tokenizer.kind {usable[0]} (or leave kind out of the config)"
        )
    return kind


def prepare_tokenizer(
    objective: str,
    config: PretrainConfig,
    corpus: Path,
    out: Path,
    tokenizer: str | Path | None = None,
    progress: bool = False,
) -> Tokenizer:
    """The run's tokenizer in out/: copied from `tokenizer`, kept from an earlier run, or trained on the corpus."""
    from ctxrep.tokenizer_training import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    if objective == "distill":
        return teacher_tokenizer(config, out, tokenizer)
    t = config.tokenizer
    kind = tokenizer_kind(objective, config)
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
        extra = len(XLNET_SPECIALS) if objective == "plm" else 0
        corpus_config = _corpus_config(config.data)
        train_tokenizer(
            corpus, kind, t.vocab_size - extra, out, t.lowercase, t.min_frequency, corpus_config, show_progress=progress
        )
        if objective == "plm":
            _add_xlnet_template(out)
        where = f"the {kind} tokenizer trained on {corpus}"
    tok = Tokenizer.from_model_dir(out)
    if tok.vocab_size != t.vocab_size:
        raise PretrainError(
            f"{where} has {tok.vocab_size} entries but the model's vocab_size is {t.vocab_size} ([tokenizer] "
            f"vocab_size in {config.source}); set --tokenizer.vocab_size {tok.vocab_size}, or use a larger corpus "
            "or another tokenizer"
        )
    return tok


TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt")


def teacher_tokenizer(config: PretrainConfig, out: Path, tokenizer: str | Path | None = None) -> Tokenizer:
    """distill: the student shares its teacher's tokenizer, copied into out/ (tokenizer.json and the files
    transformers' AutoTokenizer reads). Another tokenizer (`--tokenizer`, or one left in out/ by another run) is
    refused: the student reads the teacher's token ids."""
    from ctxrep.models.loading import resolve_model_path

    teacher = _teacher_name(config)
    folder = resolve_model_path(teacher)
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
    own.backend.save(str(out / "tokenizer.json"))
    for name in TOKENIZER_FILES:
        if (folder / name).is_file() and (folder / name).resolve() != (out / name).resolve():
            shutil.copyfile(folder / name, out / name)
    return Tokenizer.from_model_dir(out)


def _teacher_name(config: PretrainConfig) -> str:
    if not config.distill.teacher:
        raise PretrainError(
            f"distill needs a teacher: give --teacher DIR (or [distill] teacher in {config.source}), a model folder "
            "or name such as minilm"
        )
    return config.distill.teacher


def _add_xlnet_template(out: Path) -> None:
    """Give a trained byte-level BPE tokenizer XLNet's specials and template: A <sep> <cls>, A <sep> B <sep> <cls>."""
    from tokenizers import AddedToken, processors
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True) for s in XLNET_SPECIALS])
    sep, cls = (tok.token_to_id(s) for s in XLNET_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)],
    )
    tok.save(str(out / "tokenizer.json"))
    settings_file = out / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    settings.update(sep_token="<sep>", cls_token="<cls>", model_input_names=["input_ids", "attention_mask"])
    settings_file.write_text(json.dumps(settings, indent=2) + "\n")


# ----------------------------------------------------------------------------------- objective runs


def build_run(objective: str, config: PretrainConfig, corpus: PackedCorpus, tokenizer: Tokenizer) -> PretrainRun:
    """The objective module, its train / held-out packers (the corpus's tail held out) and its saver."""
    enc, o = config.encoder, config.objective
    vocab_size = config.tokenizer.vocab_size
    separator_id = None  # the tokenizer's own separator between documents inside a FULL-SENTENCES row
    mlm = None
    if objective in MASKED:
        from ctxrep.objectives.masked_lm import MaskedLMConfig

        mlm = MaskedLMConfig.from_tokenizer(
            tokenizer,
            mask_prob=o.mask_prob,
            replace_prob=o.replace_prob,
            random_prob=o.random_prob,
            whole_word=o.whole_word,
            static_copies=o.static_copies or None,
            seed=config.trainer.seed,
        )

    if objective in BERTS:
        from ctxrep.objectives.masked_lm import MaskedLMObjective

        if enc.model_type not in ("bert", "roberta"):
            raise PretrainError(
                f"[encoder] model_type={enc.model_type!r} cannot be trained with {objective}: use 'bert' or "
                "'roberta' (or --objective electra for ELECTRA)"
            )
        bert = _bert_config(config, enc.model_type, tokenizer)
        module = MaskedLMObjective(bert, mlm, nsp=objective == "mlm+nsp", word_start=_word_start(tokenizer, o))
        positions = module.config.max_tokens
    elif objective == "mlm+sop":
        from ctxrep.objectives.sentence_order import SentenceOrderObjective

        module = SentenceOrderObjective(_albert_config(config, tokenizer), mlm, _word_start(tokenizer, o))
        positions = module.config.max_position_embeddings
    elif objective == "electra":
        from ctxrep.objectives.electra import ElectraObjective, ElectraObjectiveConfig

        electra = ElectraObjectiveConfig(o.generator_size_fraction, o.disc_weight, mlm)
        module = ElectraObjective(_bert_config(config, "electra", tokenizer), electra, _word_start(tokenizer, o))
        positions = module.encoder_config.max_tokens
    elif objective == "clm":
        from ctxrep.models.gpt2 import GPT2Config
        from ctxrep.objectives.causal_lm import CausalLMObjective

        eos = tokenizer.backend.token_to_id("</s>")
        gpt2 = GPT2Config(
            vocab_size=vocab_size,
            n_positions=enc.max_position_embeddings,
            n_embd=enc.hidden_size,
            n_layer=enc.num_hidden_layers,
            n_head=enc.num_attention_heads,
            n_inner=enc.intermediate_size,
            resid_pdrop=enc.hidden_dropout_prob,
            embd_pdrop=enc.hidden_dropout_prob,
            attn_pdrop=enc.attention_probs_dropout_prob,
            initializer_range=enc.initializer_range,
            bos_token_id=tokenizer.backend.token_to_id("<s>"),
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id,
        )
        module = CausalLMObjective(gpt2)
        positions = gpt2.n_positions
    elif objective == "plm":
        from ctxrep.models.xlnet import XLNetConfig
        from ctxrep.objectives.permutation_lm import PermutationLMConfig
        from ctxrep.objectives.permutation_lm_objective import PermutationLMObjective

        xlnet = XLNetConfig(
            vocab_size=vocab_size,
            d_model=enc.hidden_size,
            n_layer=enc.num_hidden_layers,
            n_head=enc.num_attention_heads,
            d_inner=enc.intermediate_size,
            ff_activation=enc.hidden_act,
            dropout=enc.hidden_dropout_prob,
            initializer_range=enc.initializer_range,
            layer_norm_eps=enc.layer_norm_eps,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.backend.token_to_id("<s>"),
            eos_token_id=tokenizer.backend.token_to_id("</s>"),
        )
        special_ids = tuple(sorted(i for i, t in tokenizer.backend.get_added_tokens_decoder().items() if t.special))
        plm = PermutationLMConfig(o.k, o.span_prediction, o.max_span, o.bidirectional_context)
        module = PermutationLMObjective(xlnet, plm, special_ids)
        positions = None  # relative positions: any length
    elif objective == "distill":
        module = _distill_objective(config, tokenizer)
        positions = module.teacher.max_tokens
    elif objective == "bilm":
        from ctxrep.objectives.bilm import (
            SEPARATOR,
            BiLMObjective,
            BiLMObjectiveConfig,
            word_vocabulary,
        )

        try:
            words = word_vocabulary(tokenizer)
            bilm = BiLMObjectiveConfig(o.softmax, o.num_samples, o.dropout)
        except ValueError as e:
            raise PretrainError(f"{config.source}: {e}") from None
        module = BiLMObjective(_elmo_config(config), words, bilm)
        separator_id = tokenizer.backend.token_to_id(SEPARATOR)  # no template: the biLM adds <S> and </S> itself
        positions = None  # LSTMs: any length
    else:
        raise PretrainError(f"objective {objective!r} has no pretraining run here; use one of {', '.join(OBJECTIVES)}")

    data = config.data
    for name in ("max_length", "short_seq_warmup_length"):
        length = getattr(data, name)
        if positions is not None and length > positions:
            raise PretrainError(
                f"[data] {name}={length} is longer than the model's {positions} positions "
                f"([encoder] max_position_embeddings in {config.source}); lower {name} or raise max_position_embeddings"
            )
    pairs = {"mlm+nsp": "nsp", "mlm+sop": "sop"}.get(objective)
    train_corpus, eval_corpus = split_held_out(corpus, data, min_documents=2 if pairs == "nsp" else 1)
    train_data = _packer(pairs, train_corpus, config, tokenizer, warmup=True, separator_id=separator_id)
    eval_data = None
    if eval_corpus is not None:
        eval_data = _packer(pairs, eval_corpus, config, tokenizer, warmup=False, separator_id=separator_id)
    return PretrainRun(module, train_data, eval_data, module.save_pretrained)


def _word_start(tokenizer: Tokenizer, o: ObjectiveSection):
    from ctxrep.objectives.masked_lm import word_start_table

    return word_start_table(tokenizer) if o.whole_word else None


def _distill_objective(config: PretrainConfig, tokenizer: Tokenizer):
    """The student built from the teacher ([distill]); masking from [objective] when the teacher has an MLM head."""
    from ctxrep.models.folders import CheckpointError
    from ctxrep.models.student import choose_layers, student_config
    from ctxrep.objectives.distill import (
        DistillationObjective,
        DistillConfig,
        load_teacher,
    )
    from ctxrep.objectives.masked_lm import MaskedLMConfig

    d, o = config.distill, config.objective
    try:
        teacher, head, folder = load_teacher(_teacher_name(config))
        if tokenizer.vocab_size > teacher.config.vocab_size:
            raise PretrainError(
                f"the tokenizer has {tokenizer.vocab_size} entries but the teacher {folder} only "
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
        mlm = None
        if head is not None:
            mlm = MaskedLMConfig.from_tokenizer(
                tokenizer,
                mask_prob=o.mask_prob,
                replace_prob=o.replace_prob,
                random_prob=o.random_prob,
                whole_word=o.whole_word,
                static_copies=o.static_copies or None,
                seed=config.trainer.seed,
            )
        return DistillationObjective(
            teacher, head, distill, mlm, _word_start(tokenizer, o) if head is not None else None
        )
    except (CheckpointError, PretrainError):  # already say where
        raise
    except ValueError as e:  # the student's shape or the loss weights
        raise PretrainError(f"[distill] in {config.source}: {e}") from None


def _elmo_config(config: PretrainConfig):
    """The biLM's shape from [elmo] (ELMo's options.json layout)."""
    from ctxrep.models.elmo import ElmoConfig
    from ctxrep.models.folders import CheckpointError

    elmo = config.raw.get("elmo")
    if not elmo:
        raise PretrainError(
            f"{config.source} has no [elmo] section: bilm reads the biLM's shape from [elmo.char_cnn] and "
            "[elmo.lstm] (see the shipped tiny.toml); add them"
        )
    try:
        return ElmoConfig.from_options(elmo, source=f"[elmo] in {config.source}")
    except (CheckpointError, ValueError) as e:
        raise PretrainError(str(e)) from None


def _bert_config(config: PretrainConfig, model_type: str, tokenizer: Tokenizer):
    from ctxrep.models.bert import BertConfig

    enc = config.encoder
    return BertConfig(
        model_type=model_type,
        vocab_size=config.tokenizer.vocab_size,
        hidden_size=enc.hidden_size,
        num_hidden_layers=enc.num_hidden_layers,
        num_attention_heads=enc.num_attention_heads,
        intermediate_size=enc.intermediate_size,
        hidden_act=enc.hidden_act,
        hidden_dropout_prob=enc.hidden_dropout_prob,
        attention_probs_dropout_prob=enc.attention_probs_dropout_prob,
        max_position_embeddings=enc.max_position_embeddings,
        type_vocab_size=enc.type_vocab_size,
        layer_norm_eps=enc.layer_norm_eps,
        initializer_range=enc.initializer_range,
        pad_token_id=tokenizer.pad_token_id,
        embedding_size=enc.embedding_size or None,
        add_pooling_layer=model_type != "electra",
    )


def _albert_config(config: PretrainConfig, tokenizer: Tokenizer):
    from ctxrep.models.albert import AlbertConfig

    enc = config.encoder
    return AlbertConfig(
        vocab_size=config.tokenizer.vocab_size,
        embedding_size=enc.embedding_size or min(128, enc.hidden_size),
        hidden_size=enc.hidden_size,
        num_hidden_layers=enc.num_hidden_layers,
        num_attention_heads=enc.num_attention_heads,
        intermediate_size=enc.intermediate_size,
        hidden_act=enc.hidden_act,
        hidden_dropout_prob=enc.hidden_dropout_prob,
        attention_probs_dropout_prob=enc.attention_probs_dropout_prob,
        max_position_embeddings=enc.max_position_embeddings,
        type_vocab_size=enc.type_vocab_size,
        layer_norm_eps=enc.layer_norm_eps,
        initializer_range=enc.initializer_range,
        pad_token_id=tokenizer.pad_token_id,
        share=enc.share,
    )


def _packer(
    pairs: str | None,
    corpus: PackedCorpus,
    config: PretrainConfig,
    tokenizer: Tokenizer,
    warmup: bool,
    separator_id: int | None = None,
):
    data, trainer = config.data, config.trainer
    schedule = None
    if warmup and data.short_seq_warmup_length and data.short_seq_warmup_steps:
        # The packer counts micro-batches.
        micro_batches = data.short_seq_warmup_steps * trainer.accumulation_steps
        schedule = ShortSequenceWarmup(data.short_seq_warmup_length, micro_batches)
    if pairs:  # "nsp": B follows A or is random (BERT); "sop": A, B consecutive, in order or swapped (ALBERT)
        from ctxrep.objectives.sentence_order import SentenceOrderPacker

        pair_config = SegmentPairConfig(data.max_length, config.objective.short_seq_prob, trainer.seed, schedule)
        return (SentenceOrderPacker if pairs == "sop" else SegmentPairPacker)(corpus, pair_config, tokenizer)
    packing = FullSentencesConfig(data.max_length, trainer.seed, schedule, separator_id)
    return FullSentencesPacker(corpus, packing, tokenizer)


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
