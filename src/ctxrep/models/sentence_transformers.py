"""A sentence-transformers folder's own sentence pipeline: modules.json, Pooling, Dense, Normalize, prompts.

sentence-transformers stores a model as a Hugging Face folder plus `modules.json`, the list of modules its
`SentenceTransformer` runs in order:

    Transformer (path "": the folder itself) -> Pooling (1_Pooling/config.json) -> [Dense ...] -> [Normalize]

The Pooling config says which vectors are concatenated, in its order (`pooling_mode`, one name or a list, as
sentence-transformers 6 writes it; the older `pooling_mode_*` flags in the order below):
    cls             the classification token's vector
    max             max over the tokens, per dimension
    mean            sum_t h_t / n
    mean_sqrt_len   sum_t h_t / sqrt(n)
    lasttoken       the text's last token (its last window's last position, special tokens included): decoder
                    embedders (Qwen3-Embedding, e5-mistral), whichever side the batch is padded on
where t runs over every token the attention mask keeps, special tokens included; with `include_prompt: false` the
prompt's tokens (and the leading special tokens) are left out. Each Dense module (EmbeddingGemma's 2_Dense,
3_Dense) is activation(W v + b) with its own config.json and weights. Normalize divides the result by its L2 norm
(max(||v||, 1e-12), as torch.nn.functional.normalize). `Featurizer(sentence_pooling="model")` reads this here and
pools with `TokenPooler`. sentence_bert_config.json's `max_seq_length` is read by nobody on purpose: ctxrep windows
long texts instead of truncating them.

Prompts (config_sentence_transformers.json's `prompts` and `default_prompt_name`) are read by `read_prompts`;
the text of a prompt goes before each input, as sentence-transformers' encode(prompt=..., prompt_name=...).

A folder whose modules.json lists a module ctxrep does not apply (LayerNorm, a custom one) or a pooling mode it
does not implement (weightedmean) is refused with one line, never silently half-applied.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ctxrep.models.folders import CheckpointError, read_state_dict

MODULES_FILE = "modules.json"
SETTINGS_FILE = "config_sentence_transformers.json"  # prompts, default_prompt_name
# The older config's flags, in the order sentence-transformers concatenates the vectors.
MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
# sentence-transformers 6's `pooling_mode` names.
MODE_NAMES = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "lasttoken": "lasttoken",
}
UNSUPPORTED_MODES = ("pooling_mode_weightedmean_tokens", "weightedmean")
NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's default
# The activation paths sentence-transformers saves (Dense's activation_function, CrossEncoder's activation_fn).
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.Tanh": torch.tanh,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.Sigmoid": torch.sigmoid,
    "torch.nn.modules.activation.ReLU": torch.relu,
    "torch.nn.ReLU": torch.relu,
}


@dataclass(frozen=True)
class DenseLayer:
    """One Dense module: activation(v W^T + b)."""

    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None
    activation: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        out = v @ self.weight.to(v.dtype).T
        return self.activation(out + self.bias.to(v.dtype) if self.bias is not None else out)


@dataclass(frozen=True)
class SentencePooling:
    """What a sentence-transformers folder does after its Transformer: pooling modes (concatenated in this order),
    whether the prompt's tokens are pooled, the Dense modules and whether the result is L2-normalised."""

    modes: tuple[str, ...]
    normalize: bool
    dim: int  # the config's embedding dimension: the Transformer's hidden size
    include_prompt: bool = True
    dense: tuple[DenseLayer, ...] = field(default_factory=tuple)

    @property
    def width(self) -> int:
        """Width of one sentence vector (per layer): the last Dense module's output, else dim x the modes."""
        return self.dense[-1].weight.shape[0] if self.dense else self.dim * len(self.modes)


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
    kinds = [(m.kind, m.path) for m in read_modules(folder)]  # (the module's class name, its path)
    names = [k for k, _ in kinds]
    others = [f"{k} ({p or '.'})" for k, p in kinds if k not in ("Transformer", "Pooling", "Dense", "Normalize")]
    if others:
        raise CheckpointError(
            f"{modules_file}: lists {', '.join(others)}, which ctxrep does not apply (it applies Transformer, Pooling, "
            "Dense and Normalize only); use sentence_pooling='mean' or 'cls' with this model"
        )
    if names.count("Pooling") != 1 or names[0] != "Transformer" or names.index("Pooling") != 1:
        raise CheckpointError(
            f"{modules_file}: expected Transformer, then one Pooling, then Dense modules and optionally Normalize; "
            f"found {', '.join(names) or 'no modules'}"
        )
    if any(k != "Dense" for k in names[2 : len(names) - ("Normalize" in names)]):
        raise CheckpointError(
            f"{modules_file}: only Dense modules may sit between Pooling and Normalize; found {', '.join(names)}"
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
    modes = _pooling_modes(config, config_file)
    dim = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if not isinstance(dim, int):
        raise CheckpointError(f"{config_file}: embedding_dimension is missing or not an integer")
    dense = tuple(_read_dense(folder / p, modules_file) for k, p in kinds if k == "Dense")
    width = dim * len(modes)
    for layer, (_, p) in zip(dense, [kp for kp in kinds if kp[0] == "Dense"]):
        if layer.weight.shape[1] != width:
            raise CheckpointError(
                f"{folder / p}: the Dense module takes {layer.weight.shape[1]} inputs but receives {width}; the "
                "folder's modules do not belong together"
            )
        width = layer.weight.shape[0]
    return SentencePooling(
        modes=modes,
        normalize="Normalize" in names,
        dim=dim,
        include_prompt=bool(config.get("include_prompt", True)),
        dense=dense,
    )


def _pooling_modes(config: dict, config_file: Path) -> tuple[str, ...]:
    """The modes, in order: sentence-transformers 6's `pooling_mode` (a name or a list), else the older flags."""
    if "pooling_mode" in config:
        given = config["pooling_mode"]
        given = [given] if isinstance(given, str) else list(given)
        bad = [m for m in given if m not in MODE_NAMES]
        if bad:
            raise CheckpointError(
                f"{config_file}: pooling_mode {', '.join(map(str, bad))} is not implemented in ctxrep (it implements "
                f"{', '.join(MODE_NAMES)}); use sentence_pooling='mean' or 'cls' with this model"
            )
        modes = tuple(MODE_NAMES[m] for m in given)
    else:
        unsupported = [k for k in UNSUPPORTED_MODES if config.get(k)]
        if unsupported:
            raise CheckpointError(
                f"{config_file}: {', '.join(unsupported)} is not implemented in ctxrep (it implements "
                f"{', '.join(MODES)}); use sentence_pooling='mean' or 'cls' with this model"
            )
        modes = tuple(name for flag, name in MODES.items() if config.get(flag))
    if not modes:
        raise CheckpointError(
            f"{config_file}: no pooling mode is switched on (expected one of {', '.join(MODE_NAMES)})"
        )
    return modes


def _read_dense(path: Path, modules_file: Path) -> DenseLayer:
    """A Dense module's config.json (in_features, out_features, bias, activation_function) and weights."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing; {modules_file} lists a Dense module in {path.name}/")
    config = _read_json(config_file, dict)
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")  # Dense's default
    if activation not in TORCH_ACTIVATIONS:
        raise CheckpointError(
            f"{config_file}: activation_function {activation!r} is not one ctxrep applies "
            f"({', '.join(TORCH_ACTIVATIONS)})"
        )
    state = read_state_dict(path)
    shape = (config.get("out_features"), config.get("in_features"))
    weight = state.get("linear.weight")
    if weight is None or tuple(weight.shape) != shape:
        found = "no linear.weight" if weight is None else f"linear.weight {tuple(weight.shape)}"
        raise CheckpointError(
            f"{path}: expected linear.weight of shape {shape} (out, in) from config.json; found {found}"
        )
    bias = state.get("linear.bias") if config.get("bias", True) else None
    if config.get("bias", True) and bias is None:
        raise CheckpointError(f"{path}: config.json says bias but the weights have no linear.bias")
    return DenseLayer(weight.float(), None if bias is None else bias.float(), TORCH_ACTIVATIONS[activation])


def read_dense(path: str | Path) -> DenseLayer:
    """One Dense module folder (config.json + weights) of a sentence-transformers folder as a DenseLayer (e.g. a
    multi-vector encoder's token projection, vectors/late_interaction.py)."""
    path = Path(path)
    return _read_dense(path, path.parent / MODULES_FILE)


@dataclass(frozen=True)
class Prompts:
    """The prompts a sentence-transformers folder declares (config_sentence_transformers.json): name -> text put
    before each input, and the name used when a call names none (sentence-transformers' `_resolve_prompt`)."""

    prompts: dict[str, str]
    default_name: str | None = None
    where: str = "this model"  # the folder, for error messages

    def resolve(self, prompt: str | None = None, prompt_name: str | None = None, task: str | None = None) -> str:
        """The text to put before each input: `prompt` as given; else the folder's prompt called `prompt_name`
        (a name it lacks is a one-line ValueError naming those it has); else, for `task` "query" / "document", the
        folder's prompt of that name or "" (encode_query / encode_document never fall back to the default prompt);
        else the default prompt; else ""."""
        if task not in (None, "query", "document"):
            raise ValueError(f"task must be 'query', 'document' or None, got {task!r}")
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
        if task is not None:
            return self.prompts.get(task, "")
        if self.default_name is not None:
            return self.prompts.get(self.default_name, "")
        return ""


def with_prompt(prefix: str, texts: list) -> list:
    """Each text with `prefix` before it: a string as prefix + text (sentence-transformers' concatenation), a word
    list with the prefix's words first. No prefix: the texts as given."""
    if not prefix:
        return texts
    return [prefix + t if isinstance(t, str) else [*prefix.split(), *t] for t in texts]


def prompt_positions(tokenizer, prefix: str) -> int:
    """How many positions a prompt takes at the start of a text's first row: the leading special tokens and the
    prompt's own tokens (sentence-transformers' prompt_length: the prompt tokenized with its special tokens, less
    a trailing one). What Pooling's include_prompt=false leaves out."""
    if not prefix:
        return 0
    _, lengths = tokenizer.encode_texts([prefix])
    return tokenizer.build_inputs([])[2] + int(lengths[0])


def read_prompts(folder: str | Path) -> Prompts:
    """The prompts of `folder`'s config_sentence_transformers.json; none (Prompts({})) when it has no such file."""
    folder = Path(folder)
    file = folder / SETTINGS_FILE
    settings = read_settings(folder)
    prompts = settings.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise CheckpointError(f'{file}: "prompts" must map prompt names to prompt texts')
    default = settings.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"{file}: default_prompt_name {default!r} is not one of its prompts ({', '.join(prompts) or 'none'})"
        )
    return Prompts(dict(prompts), default, str(folder))


def describe_sentence_pooling(folder: str | Path, causal: bool = False) -> str:
    """One line for `ctxrep info` (its "sentence vector" row): the sentence pooling a sentence-transformers folder
    declares, whether ctxrep can apply it (sentence_pooling='model'), or that the folder declares none and what to
    choose: the last token for a `causal` model (only it has read the whole text), else the mean or the
    classification token."""
    folder = Path(folder)
    if not is_sentence_transformers_folder(folder):
        if causal:
            return (
                "none declared (no modules.json): choose sentence_pooling='lasttoken' (--sentence-pooling lasttoken): "
                "a causal decoder's last token is the one that has read the whole text"
            )
        return "none declared (no modules.json): choose sentence_pooling='mean' or 'cls'"
    try:
        pooling = read_sentence_pooling(folder)
    except CheckpointError as e:
        return f"declared in {MODULES_FILE} but not applicable by ctxrep: {e}"
    names = {
        "cls": "classification token",
        "max": "max",
        "mean": "mean",
        "mean_sqrt_len": "sum / sqrt(n)",
        "lasttoken": "last token",
    }
    modes = " + ".join(names[m] for m in pooling.modes)
    concatenated = " (concatenated)" if len(pooling.modes) > 1 else ""
    prompt = "" if pooling.include_prompt else ", prompt tokens left out"
    dense = f", {len(pooling.dense)} Dense to {pooling.width}" if pooling.dense else ""
    normalized = ", then L2-normalised" if pooling.normalize else ""
    return (
        f"{modes}{concatenated}{prompt}{dense}{normalized}, from {MODULES_FILE} (sentence_pooling='model' applies it)"
    )


class TokenPooler:
    """Pools token vectors into one vector per text over the batches of one call.

    Each window row comes with one weight per position (0 = padding or a position that another window
    answers for, or a prompt token with include_prompt false); with W_t the weights of a text's positions t over
    all its windows and n = sum_t W_t:
        mean = sum_t W_t h_t / n,   mean_sqrt_len = sum_t W_t h_t / sqrt(n),
        max = max over the positions with W_t > 0,   cls = the mean of the windows' classification tokens,
        lasttoken = the last position with W_t > 0 of the text's last window (`rows`: the rows' numbers in the call, made in
        each text's window order; without them a later `add` counts as a later window).
    """

    def __init__(self, pooling: SentencePooling, num_texts: int, num_layers: int, hidden: int) -> None:
        if hidden != pooling.dim:
            raise CheckpointError(
                f"the Pooling config says embedding_dimension={pooling.dim} but the model's hidden size is "
                f"{hidden}; the folder's modules do not belong together"
            )
        self.pooling = pooling
        self.sums = torch.zeros(num_texts, num_layers, hidden, dtype=torch.float64)
        self.counts = torch.zeros(num_texts, dtype=torch.float64)
        self.maxes = torch.full((num_texts, num_layers, hidden), -torch.inf)
        self.cls_sums = torch.zeros(num_texts, num_layers, hidden, dtype=torch.float64)
        self.cls_counts = torch.zeros(num_texts, dtype=torch.float64)
        self.last = torch.zeros(num_texts, num_layers, hidden, dtype=torch.float64)
        self.last_row = np.full(num_texts, -1, dtype=np.int64)
        self.added = 0

    def add(
        self,
        selected: torch.Tensor,
        texts: np.ndarray,
        weights: np.ndarray,
        cls_positions: np.ndarray,
        rows: np.ndarray | None = None,
    ) -> None:
        """selected: (layers, batch, seq, hidden); per row of the batch, as whole arrays (no loop per row): its text,
        its weights (batch, seq; one per position, 0 at padding), where its classification token sits and (optional)
        its number in the call."""
        b = selected.shape[1]
        w = torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float32))  # (batch, seq)
        text_index = torch.from_numpy(np.asarray(texts, dtype=np.int64))
        h = selected.double()
        # index_add_ into the flat (texts, layers * hidden) view: into the 3-D tensor torch's CPU kernel took 250x as
        # long with 2 threads (3.8 ms against 0.015 ms a batch of 600 rows; the same sums)
        weighted = torch.einsum("lbsh,bs->blh", h, w.double())  # (batch, layers, hidden)
        self.sums.view(len(self.sums), -1).index_add_(0, text_index, weighted.reshape(b, -1))
        self.counts.index_add_(0, text_index, w.double().sum(1))
        if "max" in self.pooling.modes:
            masked = selected.masked_fill((w <= 0)[None, :, :, None], -torch.inf)  # (layers, batch, seq, hidden)
            row_max = masked.amax(dim=2).transpose(0, 1).reshape(b, -1)  # (batch, layers * hidden)
            into = text_index[:, None].expand_as(row_max)
            self.maxes.view(len(self.maxes), -1).scatter_reduce_(0, into, row_max, "amax")
        if "cls" in self.pooling.modes:
            at_cls = h[:, torch.arange(b), torch.from_numpy(np.asarray(cls_positions, dtype=np.int64))]
            self.cls_sums.view(len(self.cls_sums), -1).index_add_(0, text_index, at_cls.transpose(0, 1).reshape(b, -1))
            self.cls_counts.index_add_(0, text_index, torch.ones(b, dtype=torch.float64))
        if "lasttoken" in self.pooling.modes:
            numbers = np.arange(self.added, self.added + b) if rows is None else np.asarray(rows, dtype=np.int64)
            texts = np.asarray(texts, dtype=np.int64)
            by_number = np.lexsort((numbers, texts))  # by text, then row number
            latest = by_number[np.append(texts[by_number][1:] != texts[by_number][:-1], True)]  # each text's last row
            latest = latest[numbers[latest] > self.last_row[texts[latest]]]  # later than any row seen before
            seq = w.shape[1]
            last = seq - 1 - np.argmax((weights[latest] > 0)[:, ::-1], axis=1)  # last weighted position (padding: 0)
            self.last_row[texts[latest]] = numbers[latest]
            at_last = h[:, torch.from_numpy(latest), torch.from_numpy(last)]  # (layers, rows, hidden)
            self.last[torch.from_numpy(texts[latest])] = at_last.transpose(0, 1)
        self.added += b

    def result(self) -> np.ndarray:
        """(texts, layers, width) float32: the modes concatenated, the Dense modules, then L2-normalised if the
        folder says so."""
        n = self.counts.clamp(min=1e-9)[:, None, None]  # sentence-transformers' clamp of the token count
        parts = {
            "cls": lambda: self.cls_sums / self.cls_counts.clamp(min=1)[:, None, None],
            "max": lambda: self.maxes.double(),
            "mean": lambda: self.sums / n,
            "mean_sqrt_len": lambda: self.sums / n.sqrt(),
            "lasttoken": lambda: self.last,
        }
        out = torch.cat([parts[m]() for m in self.pooling.modes], dim=-1)
        for layer in self.pooling.dense:
            out = layer(out.float()).double()  # the Dense modules run in float32, as sentence-transformers'
        if self.pooling.normalize:
            out = out / out.norm(dim=-1, keepdim=True).clamp(min=NORMALIZE_EPS)
        return out.float().numpy()


# ---- the folder's module list: the one reader and writer of modules.json, each module's config file and
# config_sentence_transformers.json (SentenceEncoder / SparseSentenceEncoder save through write_modules; the
# Featurizer's pooling, SparseEncoder's SpladePooling and MultiVectorEncoder's modules read through read_modules) ----

TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"  # the Transformer module's config (max_seq_length, ...)
# Each module's config file (sentence-transformers' `config_file_name`): config.json unless its class names another.
CONFIG_FILE_NAMES = {
    "Transformer": TRANSFORMER_CONFIG_FILE,
    "MLMTransformer": TRANSFORMER_CONFIG_FILE,
    "Router": "router_config.json",
    "LSTM": "lstm_config.json",
    "CNN": "cnn_config.json",
    "WordEmbeddings": "wordembedding_config.json",
}


@dataclass(frozen=True)
class Module:
    """One entry of a folder's modules.json with its config: `type` the module's class
    ("sentence_transformers.models.Pooling"), `path` its folder inside the model's ("" for the folder itself) and
    `config` the content of its config file (None: it has none, as Normalize)."""

    type: str
    path: str = ""
    config: dict | None = None

    @property
    def kind(self) -> str:
        """The class's own name: "Transformer", "Pooling", "Dense", "SpladePooling", ..."""
        return self.type.rsplit(".", 1)[-1]

    @property
    def config_file_name(self) -> str:
        return CONFIG_FILE_NAMES.get(self.kind, "config.json")


def read_modules(folder: str | Path) -> tuple[Module, ...]:
    """The modules `folder`'s modules.json lists, in order, each with its config file read (None where it has
    none); () when the folder has no modules.json. A malformed list or config file is a one-line CheckpointError."""
    folder = Path(folder)
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        return ()
    modules = []
    for i, entry in enumerate(_read_json(modules_file, list)):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise CheckpointError(f'{modules_file}: entry {i} has no "type"; expected sentence-transformers\' layout')
        path = str(entry.get("path", ""))
        module = Module(entry["type"], path)
        config_file = folder / path / module.config_file_name
        config = _read_json(config_file, dict) if config_file.is_file() else None
        modules.append(Module(entry["type"], path, config))
    return tuple(modules)


def read_settings(folder: str | Path) -> dict:
    """`folder`'s config_sentence_transformers.json (prompts, default_prompt_name, similarity_fn_name, model_type,
    ...); {} when it has none."""
    file = Path(folder) / SETTINGS_FILE
    return _read_json(file, dict) if file.is_file() else {}


def write_modules(folder: str | Path, modules: list[Module] | tuple[Module, ...], settings: dict) -> None:
    """Write `folder`'s module list as sentence-transformers' save does: modules.json (idx, name, path, type of each
    module, in order), each module's folder with its config file (none where config is None), and `settings` as
    config_sentence_transformers.json. A module folder that an earlier modules.json there listed and `modules` does
    not (2_Normalize after a save without normalising) is removed. The weights are the caller's to write."""
    import shutil

    folder = Path(folder)
    try:
        before = read_modules(folder)
    except CheckpointError:
        before = ()  # an unreadable earlier list: nothing known to clean up
    kept = {m.path for m in modules}
    for old in before:
        stale = (folder / old.path).resolve()
        if old.path and old.path not in kept and stale.is_dir() and stale.parent == folder.resolve():
            shutil.rmtree(stale)
    entries = [{"idx": i, "name": str(i), "path": m.path, "type": m.type} for i, m in enumerate(modules)]
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / MODULES_FILE, entries)
    for m in modules:
        (folder / m.path).mkdir(parents=True, exist_ok=True)
        if m.config is not None:
            _write_json(folder / m.path / m.config_file_name, m.config)
    _write_json(folder / SETTINGS_FILE, settings)


def _write_json(file: Path, data: object) -> None:
    file.write_text(json.dumps(data, indent=2) + "\n")
