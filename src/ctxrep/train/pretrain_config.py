"""Pretraining configs: one schema for every objective, its sections read off the recipes' table.

    config = load_config("tiny", [("trainer.lr", "1e-3")], objective="mlm")
    print(reading_table())          # which objective reads which key (docs/architecture.md shows it)

Configs are TOML files (train/config.py reads them); a file may hold the settings of several objectives in
[encoder], [elmo] and [objective] (the shipped tiny and small configure all of them), and each run reads those
of its own objective and records what it read in pretrain.json:
- [tokenizer], [data], [trainer] (TrainerConfig): read by every objective, each key with one meaning ([tokenizer]
  only by the recipes that train a tokenizer: not by distill, whose student shares its teacher's tokenizer);
- [encoder]: the Transformer's shape in BERT's names (`Shape`); a recipe reads the keys its `shape_keys` list;
- [objective]: the union of the recipes' settings dataclasses; a recipe reads the keys of its own settings;
- sections a recipe declares as its own: [elmo] (bilm: the biLM's shape in ELMo's options.json layout,
  [elmo.char_cnn] and [elmo.lstm]) and [distill] (distill: the teacher, the student's shape, the loss weights).
A key that no objective reads is an error; so is a command-line setting the chosen objective does not read.
Shipped configs live in ctxrep/configs/pretrain/ and are named without ".toml".
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ctxrep.objectives.recipe import PretrainError, Recipe, Shape
from ctxrep.objectives.recipes import RECIPES, recipe
from ctxrep.train.config import Schema, field_types
from ctxrep.train.trainer import TrainerConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "pretrain"


@dataclass
class TokenizerSection:
    """The vocabulary, trained on the corpus unless --tokenizer gives one. Read by every recipe that trains one."""

    kind: str = ""  # "" = the objective's own (its recipe's first tokenizer kind: wordpiece, bpe or word)
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


def _union_of_settings() -> type:
    """[objective]: every recipe's settings keys in table order; a key two recipes share has one type and default."""
    fields: dict[str, tuple[object, dataclasses.Field]] = {}
    for r in RECIPES.values():
        if r.settings is None:
            continue
        hints = field_types(r.settings)
        for f in dataclasses.fields(r.settings):
            if f.name in fields:
                hint, other = fields[f.name]
                if (hint, other.default) != (hints[f.name], f.default):
                    raise TypeError(f"[objective] {f.name}: {r.name}'s settings give it another type or default")
                continue
            fields[f.name] = (hints[f.name], f)
    cls = dataclasses.make_dataclass(
        "ObjectiveSection", [(name, hint, field(default=f.default)) for name, (hint, f) in fields.items()]
    )
    cls.__module__ = __name__
    cls.__doc__ = "[objective]: the settings of particular objectives (each recipe's settings dataclass)."
    return cls


ObjectiveSection = _union_of_settings()
OWN_SECTIONS: dict[str, type] = {
    name: spec for r in RECIPES.values() for name, spec in r.sections.items() if isinstance(spec, type)
}
TABLE_SECTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    name: spec for r in RECIPES.values() for name, spec in r.sections.items() if isinstance(spec, dict)
}
SECTIONS: dict[str, type] = {
    "encoder": Shape,
    "tokenizer": TokenizerSection,
    "data": DataSection,
    "objective": ObjectiveSection,
    "trainer": TrainerConfig,
    **OWN_SECTIONS,
}
# Keys that an earlier schema had elsewhere: where they are now.
MOVED = {
    ("data", "short_seq_prob"): "[objective] short_seq_prob",
    ("data", "seed"): "[trainer] seed (one seed for the data order and the initial weights of every objective)",
    ("elmo", "softmax"): "[objective] softmax",
    ("elmo", "num_samples"): "[objective] num_samples",
    ("elmo", "dropout"): "[objective] dropout",
}
SCHEMA = Schema(SECTIONS, CONFIG_DIR, PretrainError, "config", TABLE_SECTIONS, MOVED)
TRAINS_TOKENIZER = tuple(r.name for r in RECIPES.values() if r.trains_tokenizer)


@dataclass
class PretrainConfig:
    encoder: Shape
    tokenizer: TokenizerSection
    data: DataSection
    objective: typing.Any  # ObjectiveSection
    trainer: TrainerConfig
    own: dict[str, object] = field(default_factory=dict)  # the recipes' own dataclass sections ([distill])
    raw: dict = field(default_factory=dict)  # the whole config after overrides (table sections are read from here)
    source: str = ""  # the file it came from

    def __getattr__(self, name: str):  # config.distill: a recipe's own section
        own = self.__dict__.get("own", {})
        if name in own:
            return own[name]
        raise AttributeError(name)

    def settings(self, r: Recipe):
        """The recipe's settings dataclass filled from [objective] (None for a recipe without settings)."""
        if r.settings is None:
            return None
        values = {f.name: getattr(self.objective, f.name) for f in dataclasses.fields(r.settings)}
        try:
            return r.settings(**values)
        except ValueError as e:
            raise PretrainError(f"{self.source}: {e}") from None

    def sections_of(self, r: Recipe) -> dict[str, object]:
        """The recipe's own sections: dataclass instances, or the raw tables."""
        return {name: self.own[name] if name in self.own else self.raw.get(name, {}) for name in r.sections}


def readers(section: str, key: str) -> tuple[str, ...]:
    """The objectives that read `key` ("lstm.dim" in [elmo]) of `section`."""
    who: list[Recipe]
    if section == "encoder":
        who = [r for r in RECIPES.values() if key in r.shape_keys]
    elif section == "tokenizer":
        who = [r for r in RECIPES.values() if r.trains_tokenizer]
    elif section == "objective":
        who = [r for r in RECIPES.values() if r.settings and key in {f.name for f in dataclasses.fields(r.settings)}]
    elif section in ("data", "trainer"):
        who = list(RECIPES.values())
    else:
        who = [r for r in RECIPES.values() if section in r.sections]
    return tuple(r.name for r in who)


def reading_table() -> str:
    """Which keys each objective reads, as a Markdown table (x = read)."""
    objectives = tuple(RECIPES)
    lines = ["| key | " + " | ".join(objectives) + " |", "|---|" + "---|" * len(objectives)]
    keys = [(s, f.name) for s, cls in SECTIONS.items() if s != "trainer" for f in dataclasses.fields(cls)]
    keys += [(section, f"{table}.*") for section, tables in TABLE_SECTIONS.items() for table in tables]
    for section, key in keys:
        who = readers(section, key)
        lines.append(f"| [{section}] {key} | " + " | ".join("x" if o in who else "" for o in objectives) + " |")
    lines.append("| [trainer] (every key) | " + " | ".join("x" for _ in objectives) + " |")
    return "\n".join(lines)


def config_path(name_or_path: str | Path) -> Path:
    """A shipped config name ("tiny", "small", "bert-base", ...) or the path of a TOML file."""
    return SCHEMA.path(name_or_path)


def load_config(
    name_or_path: str | Path, overrides: Sequence[tuple[str, str]] = (), objective: str | None = None
) -> PretrainConfig:
    """Read a TOML config and apply `overrides` ((key, text value): "trainer.lr", or "lr" when one section has
    it); with `objective`, an override that objective does not read is refused."""
    raw, source = SCHEMA.read(name_or_path)
    return config_from_dict(raw, source, overrides, objective)


def config_from_dict(
    raw: dict, source: str, overrides: Sequence[tuple[str, str]] = (), objective: str | None = None
) -> PretrainConfig:
    """A PretrainConfig from a parsed TOML dict (`source` names it in errors); see `load_config`."""
    if objective is not None:
        recipe(objective)  # an unknown name lists the known ones

    def read_by_objective(section: str, name: str, key: str) -> None:
        who = readers(section, name)
        if objective is not None and objective not in who:
            raise PretrainError(
                f"--{key}: [{section}] {name} is read by {', '.join(who)}, not by {objective}; leave it out, or "
                f"pretrain {' or '.join(f'--objective {o}' for o in who)}"
            )

    sections, raw, source = SCHEMA.load_dict(raw, source, overrides, read_by_objective)
    common = {name: sections.pop(name) for name in ("encoder", "tokenizer", "data", "objective", "trainer")}
    return PretrainConfig(**common, own=sections, raw=raw, source=source)


def read_settings(config: PretrainConfig, objective: str) -> dict:
    """The settings `objective` reads, by section (what pretrain.json records)."""
    settings: dict[str, dict] = {}
    for name in SECTIONS:
        section = config.own[name] if name in config.own else getattr(config, name)
        values = dataclasses.asdict(section)
        settings[name] = {k: v for k, v in values.items() if objective in readers(name, k)}
    for name in TABLE_SECTIONS:
        if objective in readers(name, ""):
            settings[name] = config.raw.get(name, {})
    return {name: values for name, values in settings.items() if values}
