"""One config layer for every training command: TOML files of dataclass sections, `--section.key VALUE`
overrides, and the run folder's checks. Pretraining (train/pretrain_config.py) and translation
(translate/train.py) each describe their sections with a `Schema` and read them through it.

    schema = Schema({"model": ModelSection, "trainer": TrainerConfig}, CONFIG_DIR, MTTrainError, "MT config")
    raw, source = schema.read("multi30k")         # a shipped name or a TOML path; unknown sections and keys refused
    schema.override(raw, "lr", "1e-3", source)     # "trainer.lr", or "lr" when one section has it; TOML literals
    sections = schema.build(raw, source)           # {"model": ModelSection(...), "trainer": TrainerConfig(...)}
    check_run_folder(out, resume, "mt_train.json", record, MTTrainError)   # before the run writes anything

A schema's sections are dataclasses (their field types check the values: int, float, bool, str, tuple[float, ...],
tuple[int, ...]); `tables` are free-form sections of named tables (pretraining's [elmo.char_cnn], [elmo.lstm])
whose keys are checked by name and handed on as they are; `moved` says where keys of an older schema went.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

from ctxrep.train import distributed
from ctxrep.train.trainer import CHECKPOINT_DIR


class ConfigError(ValueError):
    """A config that cannot be used, with what to change (schemas raise their own subclass)."""


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """["--trainer.lr", "1e-3", "--warmup_steps=5"] -> [("trainer.lr", "1e-3"), ("warmup_steps", "5")]."""
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"unexpected argument {arg!r}; config fields are given as --section.field VALUE")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            i += 2
        else:
            raise ValueError(f"{arg} needs a value: {arg} VALUE")
        pairs.append((key, value))
    return pairs


def parse_value(text: str):
    """A TOML literal (1e-3, true, [0.9, 0.98], "x"), or else the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def field_types(cls: type) -> dict[str, object]:
    """{field name: resolved type} of a dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(value, hint, where: str, error: type[Exception] = ConfigError):
    """Check a value against a dataclass field type (int, float, bool, str, tuple[float, ...], tuple[int, ...])."""
    origin = typing.get_origin(hint)
    if origin is tuple and typing.get_args(hint) == (int, Ellipsis):
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise error(f"{where}: expected a list of integers like [0, 2, 5], got {value!r}")
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            return tuple(float(v) for v in value)
        raise error(f"{where}: expected a list of numbers like [0.9, 0.999], got {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise error(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


@dataclass
class Schema:
    """The sections of one kind of config file (module docstring)."""

    sections: dict[str, type]  # section name -> dataclass
    config_dir: Path  # where the shipped configs live, named without ".toml"
    error: type[Exception] = ConfigError
    kind: str = "config"  # "a shipped {kind}" in messages
    tables: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # section -> table -> keys
    moved: dict[tuple[str, str], str] = field(default_factory=dict)  # (section, key) -> where it is now

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.sections, *self.tables)

    def path(self, name_or_path: str | Path) -> Path:
        """A shipped config name or the path of a TOML file."""
        path = Path(name_or_path).expanduser()
        if path.is_file():
            return path
        shipped = self.config_dir / f"{name_or_path}.toml"
        if shipped.is_file():
            return shipped
        names = ", ".join(sorted(p.stem for p in self.config_dir.glob("*.toml")))
        raise self.error(f"config {str(name_or_path)!r} is neither a TOML file nor a shipped {self.kind} ({names})")

    def read(self, name_or_path: str | Path) -> tuple[dict, str]:
        """(the parsed file, its path as text), its sections and keys checked (`check`)."""
        path = self.path(name_or_path)
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise self.error(f"{path}: not valid TOML ({e})") from None
        self.check(raw, str(path))
        return raw, str(path)

    def check(self, raw: dict, source: str) -> None:
        """Every section and key of `raw` is one of the schema's; `source` names the file in errors."""
        for section, value in raw.items():
            if section not in self.names:
                known = ", ".join(f"[{s}]" for s in self.names)
                raise self.error(f"{source}: unknown section [{section}]; the sections are {known}")
            if not isinstance(value, dict):
                raise self.error(f"{source}: {section} must be a [{section}] table, not a value")
            for key, inner in value.items():
                if (section, key) in self.moved:
                    raise self.error(f"{source}: [{section}] {key} is now {self.moved[section, key]}; move it there")
                if section in self.tables:
                    tables = self.tables[section]
                    if key not in tables:
                        names = " and ".join(f"[{section}.{t}]" for t in tables)
                        raise self.error(
                            f"{source}: unknown key {key!r} in [{section}]; [{section}] holds the tables {names}"
                        )
                    unknown = sorted(set(inner) - set(tables[key])) if isinstance(inner, dict) else ["(a value)"]
                    if unknown:
                        raise self.error(
                            f"{source}: unknown key(s) {', '.join(unknown)} in [{section}.{key}]; known: "
                            f"{', '.join(tables[key])}"
                        )
                elif key not in field_types(self.sections[section]):
                    known = ", ".join(field_types(self.sections[section]))
                    raise self.error(f"{source}: unknown key {key!r} in [{section}]; known: {known}")

    def locate(self, key: str, source: str) -> tuple[str, str]:
        """(section, name) of an override key: "section.name" ("elmo.lstm.dim" for a table's key), or a bare
        name that exactly one section has."""
        key = key.replace("-", "_")
        if "." in key:
            section, name = key.split(".", 1)
            if section in self.sections:
                if name not in field_types(self.sections[section]):
                    raise self.error(f"--{key}: no such config field: [{section}] in {source} has no key {name!r}")
            elif section in self.tables:
                table, _, leaf = name.partition(".")
                if leaf not in self.tables[section].get(table, ()):
                    known = ", ".join(f"{t}.{k}" for t, keys in self.tables[section].items() for k in keys)
                    raise self.error(f"--{key}: [{section}] has no key {name!r}; known: {known}")
            else:
                raise self.error(
                    f"--{key}: no such config field: unknown section {section!r} (sections: {', '.join(self.names)})"
                )
            return section, name
        owners = [s for s, cls in self.sections.items() if key in field_types(cls)]
        if not owners:
            raise self.error(f"--{key}: no config section has a key {key!r} ({source})")
        if len(owners) > 1:
            raise self.error(
                f"--{key}: sections {', '.join(owners)} all have it; use --section.{key} (sections: "
                f"{', '.join(self.names)})"
            )
        return owners[0], key

    def override(self, raw: dict, key: str, text: str, source: str) -> tuple[str, str]:
        """Set `key` (see `locate`) in `raw` to the TOML literal `text`, checked against the field's type;
        returns (section, name)."""
        section, name = self.locate(key, source)
        value = parse_value(text)
        if section in self.sections:
            value = coerce(value, field_types(self.sections[section])[name], f"--{key}", self.error)
        table = raw.setdefault(section, {})
        *parents, leaf = name.split(".")
        for p in parents:
            table = table.setdefault(p, {})
        table[leaf] = value
        return section, name

    def build(self, raw: dict, source: str) -> dict[str, object]:
        """{section: its dataclass filled from `raw`} for every dataclass section (absent keys: the defaults)."""
        built = {}
        for name, cls in self.sections.items():
            hints = field_types(cls)
            values = {
                k: coerce(v, hints[k], f"{source}: [{name}] {k}", self.error) for k, v in raw.get(name, {}).items()
            }
            try:
                built[name] = cls(**values)
            except (TypeError, ValueError) as e:
                raise self.error(f"{source}: [{name}]: {e}") from None
        return built

    def load(
        self, name_or_path: str | Path, overrides: typing.Sequence[tuple[str, str]] = (), check=None
    ) -> tuple[dict[str, object], dict, str]:
        """(built sections, raw dict after overrides, source) of a config file with `overrides` applied;
        `check(section, name, key)` may refuse an override before it is applied."""
        raw, source = self.read(name_or_path)
        return self.load_dict(raw, source, overrides, check)

    def load_dict(
        self, raw: dict, source: str, overrides: typing.Sequence[tuple[str, str]] = (), check=None
    ) -> tuple[dict[str, object], dict, str]:
        """`load` for a parsed TOML dict (`source` names it in errors)."""
        raw = copy.deepcopy(raw)
        self.check(raw, source)
        for key, text in overrides:
            if check is not None:
                check(*self.locate(key, source), key)
            self.override(raw, key, text, source)
        return self.build(raw, source), raw, source


def check_run_folder(
    out: Path,
    resume: bool,
    record_name: str,
    record: dict,
    error: type[Exception] = ConfigError,
    same_run=None,
) -> None:
    """Before a run: with `resume`, the folder must hold a checkpoint and the run's record (`same_run(saved)` may
    refuse a record of another kind of run); without, it must hold no checkpoint, and the main process writes
    `record` (what the run reads) as out/record_name."""
    path = out / record_name
    has_checkpoint = (out / CHECKPOINT_DIR / "trainer_state.json").is_file()
    if resume:
        if not path.is_file() or not has_checkpoint:
            missing = f"{record_name} is missing" if not path.is_file() else "no checkpoint"
            raise error(f"{out}: nothing to resume ({missing}); start the run without --resume")
        if same_run is not None:
            same_run(json.loads(path.read_text()))
        return
    if has_checkpoint:
        raise error(
            f"{out} already holds a checkpoint; pass --resume to continue that run, or choose another --out folder"
        )
    if distributed.current().is_main:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
