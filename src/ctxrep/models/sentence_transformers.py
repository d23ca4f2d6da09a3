"""A sentence-transformers folder's own sentence pooling: modules.json, 1_Pooling/config.json, Normalize.

sentence-transformers stores a model as a Hugging Face folder plus `modules.json`, the list of modules its
`SentenceTransformer` runs in order:

    Transformer (path "": the folder itself)  ->  Pooling (e.g. 1_Pooling/config.json)  ->  [Normalize]

The Pooling config says which vectors are concatenated, in this order (sentence-transformers' `Pooling.forward`):
    pooling_mode_cls_token             the classification token's vector
    pooling_mode_max_tokens            max over the tokens, per dimension
    pooling_mode_mean_tokens           sum_t h_t / n
    pooling_mode_mean_sqrt_len_tokens  sum_t h_t / sqrt(n)
where t runs over every token the attention mask keeps, special tokens included. Normalize divides the result by
its L2 norm (max(||v||, 1e-12), as torch.nn.functional.normalize). `Featurizer(sentence_pooling="model")` reads
this here and pools with `TokenPooler`. sentence_bert_config.json's `max_seq_length` is read by nobody on
purpose: ctxrep windows long texts instead of truncating them.

A folder whose modules.json lists a module ctxrep does not apply (Dense, LayerNorm, a custom one) or a pooling
mode it does not implement (weightedmean, lasttoken) is refused with one line, never silently half-applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ctxrep.models.folders import CheckpointError

MODULES_FILE = "modules.json"
SETTINGS_FILE = "config_sentence_transformers.json"  # prompts, default_prompt_name
# The config's flags, in the order sentence-transformers concatenates the vectors.
MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}
UNSUPPORTED_MODES = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's default


@dataclass(frozen=True)
class SentencePooling:
    """What a sentence-transformers folder does after its Transformer: pooling modes (concatenated in this order)
    and whether the result is L2-normalised."""

    modes: tuple[str, ...]
    normalize: bool
    dim: int  # the config's word_embedding_dimension: the Transformer's hidden size

    @property
    def width(self) -> int:
        """Width of one sentence vector (per layer): dim x the number of modes."""
        return self.dim * len(self.modes)


def _read_json(file: Path, expect: type) -> object:
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON (line {e.lineno}): {e.msg}") from e
    if not isinstance(data, expect):
        raise CheckpointError(f"{file}: expected a JSON {'list' if expect is list else 'object'}")
    return data


def is_sentence_transformers_folder(folder: str | Path) -> bool:
    return (Path(folder) / MODULES_FILE).is_file()


def read_sentence_pooling(folder: str | Path) -> SentencePooling:
    """The pooling and normalisation that `folder`'s modules.json describes, or a one-line CheckpointError."""
    folder = Path(folder)
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        raise CheckpointError(
            f"{folder}: sentence_pooling='model' needs a sentence-transformers folder ({MODULES_FILE} with a Pooling "
            "module) and this one has no modules.json; use sentence_pooling='mean' or 'cls'"
        )
    modules = _read_json(modules_file, list)
    kinds: list[tuple[str, str]] = []  # (last part of the module type, its path)
    for i, m in enumerate(modules):
        if not isinstance(m, dict) or not isinstance(m.get("type"), str):
            raise CheckpointError(f'{modules_file}: entry {i} has no "type"; expected sentence-transformers\' layout')
        kinds.append((m["type"].rsplit(".", 1)[-1], str(m.get("path", ""))))
    names = [k for k, _ in kinds]
    others = [f"{k} ({p or '.'})" for k, p in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if others:
        raise CheckpointError(
            f"{modules_file}: lists {', '.join(others)}, which ctxrep does not apply (it applies Transformer, Pooling "
            "and Normalize only); use sentence_pooling='mean' or 'cls' with this model"
        )
    if names.count("Pooling") != 1 or names[0] != "Transformer" or names.index("Pooling") != 1:
        raise CheckpointError(
            f"{modules_file}: expected Transformer, then one Pooling, then optionally Normalize; found "
            f"{', '.join(names) or 'no modules'}"
        )
    if "Normalize" in names and names.index("Normalize") != len(names) - 1:
        raise CheckpointError(f"{modules_file}: Normalize must be the last module; found {', '.join(names)}")
    if kinds[0][1] not in ("", "."):
        raise CheckpointError(
            f"{modules_file}: the Transformer lives in {kinds[0][1]}/, not in the folder itself; load "
            f"{folder / kinds[0][1]} as the model, or use sentence_pooling='mean' or 'cls'"
        )
    config_file = folder / kinds[1][1] / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing; modules.json says the Pooling module lives in {kinds[1][1]}/")
    config = _read_json(config_file, dict)
    unsupported = [k for k in UNSUPPORTED_MODES if config.get(k)]
    if unsupported:
        raise CheckpointError(
            f"{config_file}: {', '.join(unsupported)} is not implemented in ctxrep (it implements "
            f"{', '.join(MODES)}); use sentence_pooling='mean' or 'cls' with this model"
        )
    modes = tuple(name for flag, name in MODES.items() if config.get(flag))
    if not modes:
        raise CheckpointError(f"{config_file}: no pooling mode is switched on (expected one of {', '.join(MODES)})")
    dim = config.get("word_embedding_dimension")
    if not isinstance(dim, int):
        raise CheckpointError(f"{config_file}: word_embedding_dimension is missing or not an integer")
    return SentencePooling(modes=modes, normalize="Normalize" in names, dim=dim)


@dataclass(frozen=True)
class Prompts:
    """The prompts a sentence-transformers folder declares (config_sentence_transformers.json): name -> text put
    before each input, and the name used when a call names none (sentence-transformers' `_resolve_prompt`)."""

    prompts: dict[str, str]
    default_name: str | None = None
    where: str = "this model"  # the folder, for error messages

    def resolve(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
        """The text to put before each input: `prompt` as given; else the folder's prompt called `prompt_name`
        (a name it lacks is a one-line ValueError naming those it has); else the default prompt; else ""."""
        if prompt is not None and prompt_name is not None:
            raise ValueError(
                f"give prompt or prompt_name, not both (got prompt={prompt!r}, prompt_name={prompt_name!r})"
            )
        if prompt is not None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(repr(k) for k in self.prompts) or "none"
                raise ValueError(f"unknown prompt name {prompt_name!r}: {self.where} declares the prompts {known}")
            return self.prompts[prompt_name]
        if self.default_name is not None:
            return self.prompts.get(self.default_name, "")
        return ""


def read_prompts(folder: str | Path) -> Prompts:
    """The prompts of `folder`'s config_sentence_transformers.json; none (Prompts({})) when it has no such file."""
    folder = Path(folder)
    file = folder / SETTINGS_FILE
    if not file.is_file():
        return Prompts({}, None, str(folder))
    settings = _read_json(file, dict)
    prompts = settings.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise CheckpointError(f'{file}: "prompts" must map prompt names to prompt texts')
    default = settings.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"{file}: default_prompt_name {default!r} is not one of its prompts ({', '.join(prompts) or 'none'})"
        )
    return Prompts(dict(prompts), default, str(folder))


def describe_sentence_pooling(folder: str | Path) -> str:
    """One line for `ctxrep info` (its "sentence vector" row): the sentence pooling a sentence-transformers folder declares, whether ctxrep can
    apply it (sentence_pooling='model'), or that the folder declares none."""
    folder = Path(folder)
    if not is_sentence_transformers_folder(folder):
        return "none declared (no modules.json): choose sentence_pooling='mean' or 'cls'"
    try:
        pooling = read_sentence_pooling(folder)
    except CheckpointError as e:
        return f"declared in {MODULES_FILE} but not applicable by ctxrep: {e}"
    names = {"cls": "classification token", "max": "max", "mean": "mean", "mean_sqrt_len": "sum / sqrt(n)"}
    modes = " + ".join(names[m] for m in pooling.modes)
    concatenated = " (concatenated)" if len(pooling.modes) > 1 else ""
    normalized = ", then L2-normalised" if pooling.normalize else ""
    return f"{modes}{concatenated}{normalized}, from {MODULES_FILE} (sentence_pooling='model' applies it)"


class TokenPooler:
    """Pools token vectors into one vector per text over the batches of one call.

    Each window row comes with one weight per position (0 = padding or a position that another window
    answers for); with W_t the weights of a text's positions t over all its windows and n = sum_t W_t:
        mean = sum_t W_t h_t / n,   mean_sqrt_len = sum_t W_t h_t / sqrt(n),
        max = max over the positions with W_t > 0,   cls = the mean of the windows' classification tokens.
    """

    def __init__(self, pooling: SentencePooling, num_texts: int, num_layers: int, hidden: int) -> None:
        if hidden != pooling.dim:
            raise CheckpointError(
                f"the Pooling config says word_embedding_dimension={pooling.dim} but the model's hidden size is "
                f"{hidden}; the folder's modules do not belong together"
            )
        self.pooling = pooling
        self.sums = torch.zeros(num_texts, num_layers, hidden, dtype=torch.float64)
        self.counts = torch.zeros(num_texts, dtype=torch.float64)
        self.maxes = torch.full((num_texts, num_layers, hidden), -torch.inf)
        self.cls_sums = torch.zeros(num_texts, num_layers, hidden, dtype=torch.float64)
        self.cls_counts = torch.zeros(num_texts, dtype=torch.float64)

    def add(
        self, selected: torch.Tensor, texts: list[int], row_weights: list[np.ndarray], cls_positions: list[int]
    ) -> None:
        """selected: (layers, batch, seq, hidden); for each row: its text, its weights (one per position, no
        padding) and where its classification token sits."""
        weights = torch.zeros(selected.shape[1], selected.shape[2])  # (batch, seq): padding weighs 0
        for r, w in enumerate(row_weights):
            weights[r, : len(w)] = torch.from_numpy(w)
        rows = torch.tensor(texts)
        h = selected.double()
        self.sums.index_add_(0, rows, torch.einsum("lbsh,bs->blh", h, weights.double()))  # (batch, layers, hidden)
        self.counts.index_add_(0, rows, weights.double().sum(1))
        if "max" in self.pooling.modes:
            masked = selected.masked_fill((weights <= 0)[None, :, :, None], -torch.inf)  # (layers, batch, seq, hidden)
            row_max = masked.amax(dim=2).transpose(0, 1)  # (batch, layers, hidden)
            for r, t in enumerate(texts):
                self.maxes[t] = torch.maximum(self.maxes[t], row_max[r])
        if "cls" in self.pooling.modes:
            at_cls = h[:, torch.arange(len(texts)), torch.tensor(cls_positions)].transpose(
                0, 1
            )  # (batch, layers, hidden)
            self.cls_sums.index_add_(0, rows, at_cls)
            self.cls_counts.index_add_(0, rows, torch.ones(len(texts), dtype=torch.float64))

    def result(self) -> np.ndarray:
        """(texts, layers, width) float32: the modes concatenated, then L2-normalised if the folder says so."""
        n = self.counts.clamp(min=1e-9)[:, None, None]  # sentence-transformers' clamp of the token count
        parts = {
            "cls": lambda: self.cls_sums / self.cls_counts.clamp(min=1)[:, None, None],
            "max": lambda: self.maxes.double(),
            "mean": lambda: self.sums / n,
            "mean_sqrt_len": lambda: self.sums / n.sqrt(),
        }
        out = torch.cat([parts[m]() for m in self.pooling.modes], dim=-1)
        if self.pooling.normalize:
            out = out / out.norm(dim=-1, keepdim=True).clamp(min=NORMALIZE_EPS)
        return out.float().numpy()
