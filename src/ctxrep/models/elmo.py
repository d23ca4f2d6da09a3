"""ELMo: a character-CNN token encoder under a two-layer biLSTM language model (Peters et al. 2018).

Reads top to bottom: the config (built from the official options.json), the biLM (`ElmoBiLM`), the task-side
module (`Elmo`: frozen biLM + trainable scalar mixes, eq. 1), then the loader and saver for the official bilm-tf /
AllenNLP files (options.json + weights.hdf5). The input, character ids, is made on the tokenizer side
(ctxrep.text.char_ids.batch_to_ids).

The biLM's layers, for a sentence with boundary tokens <S> w_1 ... w_n </S>:

    layer 0: x_k = CharCNN(w_k)                     (projection_dim), reported as [x_k; x_k]
    layer j: [->h_{k,j}; <-h_{k,j}]                  forward and backward ProjectedLSTM stacks, each layer
                                                     after the first adding its input (residual connection)

hidden_states therefore has n_layers + 1 entries of width 2 * projection_dim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.models.encoder import Encoder
from ctxrep.models.folders import CheckpointError, check_weights
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.char_cnn import ACTIVATIONS, CharCNN
from ctxrep.modules.projected_lstm import ProjectedLSTM
from ctxrep.modules.scalar_mix import ScalarMix
from ctxrep.text.char_ids import BOS_CHAR, EOS_CHAR, MAX_CHARACTERS_PER_TOKEN, boundary_char_ids

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"

# ---- Config -------------------------------------------------------------------------------------------

_CHAR_CNN_KEYS = {"embedding", "filters", "n_highway", "activation", "n_characters", "max_characters_per_token"}
_LSTM_KEYS = {"dim", "projection_dim", "n_layers", "cell_clip", "proj_clip", "use_skip_connections"}


@dataclass
class ElmoConfig:
    """The biLM's shape, with the fields of the official options.json (defaults: the "original" model)."""

    # char_cnn
    char_embedding_dim: int = 16  # char_cnn.embedding.dim
    filters: list[tuple[int, int]] = field(
        default_factory=lambda: [(1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)]
    )  # (width, number of filters)
    n_highway: int = 2
    activation: str = "relu"
    n_characters: int = 262  # 261 in the weight file + the padding row 0
    max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN
    # lstm
    lstm_dim: int = 4096  # lstm.dim: the cell size
    projection_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True
    # The softmax over the training vocabulary, shared by both directions. The published weight files do not
    # contain it (bilm-tf's dump_weights skips it); it is built only when a weight file has softmax/W.
    n_tokens_vocab: int | None = None
    has_softmax: bool = False

    def __post_init__(self) -> None:
        self.filters = [tuple(int(x) for x in f) for f in self.filters]
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"char_cnn.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        widest = max(w for w, _ in self.filters) if self.filters else 0
        if not self.filters or widest > self.max_characters_per_token:
            raise ValueError(
                f"char_cnn.filters {self.filters} must be non-empty with widths <= max_characters_per_token "
                f"({self.max_characters_per_token})"
            )
        if self.projection_dim >= self.lstm_dim:
            raise ValueError(
                f"lstm.projection_dim ({self.projection_dim}) must be smaller than lstm.dim ({self.lstm_dim}): "
                "ctxrep implements the projected LSTM of the published models only"
            )
        if self.has_softmax and not self.n_tokens_vocab:
            raise ValueError("has_softmax=True needs n_tokens_vocab (the softmax vocabulary size)")

    @property
    def n_filters(self) -> int:
        return sum(num for _, num in self.filters)

    @classmethod
    def from_options(cls, options: dict, source: str = "options.json") -> ElmoConfig:
        """Build from the parsed options.json; unknown keys inside char_cnn / lstm are refused (they could
        change the network), other top-level keys (training hyper-parameters) are ignored."""
        try:
            cnn, lstm = options["char_cnn"], options["lstm"]
        except KeyError as e:
            raise CheckpointError(f"{source}: not an ELMo options file: the {e.args[0]!r} section is missing") from e
        unknown = sorted(set(cnn) - _CHAR_CNN_KEYS) + sorted(set(lstm) - _LSTM_KEYS)
        if unknown:
            raise CheckpointError(f"{source}: options ctxrep does not implement: {', '.join(unknown)}")
        try:
            return cls(
                char_embedding_dim=cnn["embedding"]["dim"],
                filters=cnn["filters"],
                n_highway=cnn.get("n_highway") or 0,
                activation=cnn["activation"],
                n_characters=cnn["n_characters"],
                max_characters_per_token=cnn["max_characters_per_token"],
                lstm_dim=lstm["dim"],
                projection_dim=lstm["projection_dim"],
                n_layers=lstm.get("n_layers", 1),
                cell_clip=lstm.get("cell_clip"),
                proj_clip=lstm.get("proj_clip"),
                use_skip_connections=lstm.get("use_skip_connections", False),
                n_tokens_vocab=options.get("n_tokens_vocab"),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: required option {e.args[0]!r} is missing") from e
        except ValueError as e:
            raise CheckpointError(f"{source}: {e}") from e

    def to_options(self) -> dict:
        options = {
            "char_cnn": {
                "embedding": {"dim": self.char_embedding_dim},
                "filters": [list(f) for f in self.filters],
                "n_highway": self.n_highway,
                "activation": self.activation,
                "n_characters": self.n_characters,
                "max_characters_per_token": self.max_characters_per_token,
            },
            "lstm": {
                "dim": self.lstm_dim,
                "projection_dim": self.projection_dim,
                "n_layers": self.n_layers,
                "cell_clip": self.cell_clip,
                "proj_clip": self.proj_clip,
                "use_skip_connections": self.use_skip_connections,
            },
        }
        if self.n_tokens_vocab is not None:
            options["n_tokens_vocab"] = self.n_tokens_vocab
        return options


@dataclass
class ElmoOutput(EncoderOutput):
    """EncoderOutput plus the word mask (batch, words), True at real words.

    `hidden_states` is always filled: n_layers + 1 tensors (batch, words, 2 * projection_dim).
    """

    mask: torch.Tensor | None = None


# ---- The biLM -----------------------------------------------------------------------------------------


class ElmoBiLM(Encoder):
    """Char CNN + forward and backward ProjectedLSTM stacks. Input: character ids from `batch_to_ids`."""

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.config = config
        p = config.projection_dim
        self.char_cnn = CharCNN(
            n_characters=config.n_characters,
            embedding_dim=config.char_embedding_dim,
            filters=config.filters,
            n_highway=config.n_highway,
            activation=config.activation,
            output_dim=p,
        )

        def stack(go_forward: bool) -> nn.ModuleList:
            return nn.ModuleList(
                ProjectedLSTM(p, config.lstm_dim, p, go_forward, config.cell_clip, config.proj_clip)
                for _ in range(config.n_layers)
            )

        self.forward_layers = stack(go_forward=True)
        self.backward_layers = stack(go_forward=False)
        # The LM's output layer (bilm-tf softmax/W, softmax/b), shared by both directions: next-word logits from
        # the forward half of the top layer, previous-word logits from the backward half. Only when loaded.
        self.softmax = nn.Linear(p, config.n_tokens_vocab) if config.has_softmax else None
        m = config.max_characters_per_token
        self.register_buffer("bos_ids", torch.tensor(boundary_char_ids(BOS_CHAR, m)), persistent=False)
        self.register_buffer("eos_ids", torch.tensor(boundary_char_ids(EOS_CHAR, m)), persistent=False)

    # ---- the encoder interface (models/encoder.py) ----
    family = "elmo"
    word_level = True  # reads whole words as characters: the tokenizer is ctxrep.text.tokenizer.WordTokenizer
    reads_segments = False
    # LSTMs have no position limit; windows of this many words keep memory bounded.
    WINDOW = 4096

    @property
    def num_layers(self) -> int:
        """LSTM layers; hidden_states has num_layers + 1 entries (the char-CNN layer first)."""
        return self.config.n_layers

    @property
    def num_heads(self) -> None:
        return None

    @property
    def hidden_size(self) -> int:
        return 2 * self.config.projection_dim

    @property
    def max_tokens(self) -> int:
        return self.WINDOW

    def encode(
        self, batch, output_attentions: bool = False, num_layers: int | None = None, padded: bool = False
    ) -> ElmoOutput:
        """batch["char_ids"] (batch, words, max_chars), as ctxrep.text.inputs.collate makes them for WordTokenizer;
        a biLSTM has no grid to unpad, so every batch runs `padded`."""
        return self(batch["char_ids"])

    def no_attention_reason(self) -> str:
        return "ELMo is a biLSTM: it has no attention heads"

    def no_adapters_reason(self) -> str:
        return "ELMo is a biLSTM: it has no attention or MLP projections for LoRA adapters"

    def blocks(self) -> list[nn.Module]:
        """Each direction's LSTM layers, bottom first (Encoder.blocks)."""
        return [m for pair in zip(self.forward_layers, self.backward_layers) for m in pair]

    def layer_of(self, name: str) -> int:
        """char_cnn.* (characters -> highway -> projection) 0; forward_layers.i / backward_layers.i (both
        directions of LSTM layer i) i + 1; the LM's softmax num_layers."""
        parts = name.split(".")
        if parts[0] == "char_cnn":
            return 0
        if parts[0] in ("forward_layers", "backward_layers") and len(parts) > 2 and parts[1].isdigit():
            if int(parts[1]) < self.num_layers:
                return int(parts[1]) + 1
        elif parts[0] == "softmax" and self.softmax is not None:
            return self.num_layers
        raise self.unknown_parameter(name)

    def _check_ids(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Validate (batch, words, max_chars) ids and return the word mask (batch, words)."""
        m = self.config.max_characters_per_token
        if char_ids.dim() != 3 or char_ids.shape[-1] != m:
            raise ValueError(
                f"ElmoBiLM expects character ids of shape (batch, words, {m}) from ctxrep.text.char_ids.batch_to_ids, "
                f"got {tuple(char_ids.shape)}"
            )
        if char_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"character ids must be integers, got {char_ids.dtype}")
        if bool((char_ids < 0).any()) or bool((char_ids >= self.config.n_characters).any()):
            raise ValueError(f"character ids must lie in [0, {self.config.n_characters}), as batch_to_ids makes them")
        mask = (char_ids > 0).any(dim=-1)  # (batch, words)
        lengths = mask.sum(dim=1)
        prefix = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
        if not torch.equal(mask, prefix):
            row = int((mask != prefix).any(dim=1).nonzero()[0])
            raise ValueError(
                f"sentence {row} has an all-zero (padding) word before a real word; pad sentences at the end only"
            )
        return mask

    def forward(self, char_ids: torch.Tensor, keep_boundaries: bool = False) -> ElmoOutput:
        """char_ids: (batch, words, max_chars). Returns per-layer states for the words, aligned with char_ids.

        keep_boundaries=True returns them for <S> w_1 ... w_n </S> instead, (batch, words + 2, ...), with the
        matching mask (what the scalar mix's layer norm sees in AllenNLP).
        """
        word_mask = self._check_ids(char_ids)
        batch, words, _ = char_ids.shape
        lengths = word_mask.sum(dim=1)
        rows = torch.arange(batch, device=char_ids.device)

        # <S> w_1 ... w_n </S> padding: (batch, words + 2, max_chars)
        ids = char_ids.new_zeros(batch, words + 2, char_ids.shape[-1])
        ids[:, 1 : words + 1] = char_ids
        ids[:, 0] = self.bos_ids
        ids[rows, lengths + 1] = self.eos_ids.to(ids.dtype)
        mask = torch.arange(words + 2, device=ids.device)[None, :] < (lengths + 2)[:, None]  # (batch, words + 2)

        x = self.char_cnn(ids) * mask[..., None]  # (batch, words + 2, proj); padding words -> 0
        layers = [torch.cat([x, x], dim=-1)]
        fwd, bwd = x, x
        for j, (f_layer, b_layer) in enumerate(zip(self.forward_layers, self.backward_layers)):
            f_out, b_out = f_layer(fwd, mask), b_layer(bwd, mask)
            if self.config.use_skip_connections and j > 0:
                # bilm-tf wraps every layer but the first in a ResidualWrapper: output + input.
                f_out, b_out = f_out + fwd, b_out + bwd
            fwd, bwd = f_out, b_out
            layers.append(torch.cat([fwd, bwd], dim=-1))

        if not keep_boundaries:
            # Drop <S> (position 0) and </S> (position length + 1; inside the slice for shorter sentences).
            layers = [h[:, 1 : words + 1] * word_mask[..., None] for h in layers]  # (batch, words, 2 * proj)
            mask = word_mask
        return ElmoOutput(last_hidden_state=layers[-1], hidden_states=tuple(layers), mask=mask)

    # ---- Official bilm-tf / AllenNLP files ----------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ElmoBiLM:
        """Load DIR/options.json + DIR/weights.hdf5 (or DIR's single *options.json + *weights.hdf5 pair,
        the names of the published downloads, e.g. elmo_2x1024_128_2048cnn_1xhighway_options.json)."""
        path = Path(path).expanduser()
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a folder; expected a folder with {OPTIONS_FILE} and {WEIGHTS_FILE}")
        return cls.from_files(_find_file(path, OPTIONS_FILE), _find_file(path, WEIGHTS_FILE))

    @classmethod
    def from_files(cls, options_file: str | Path, weight_file: str | Path) -> ElmoBiLM:
        options_file, weight_file = Path(options_file), Path(weight_file)
        try:
            options = json.loads(options_file.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{options_file}: not valid JSON (line {e.lineno}): {e.msg}") from e
        config = ElmoConfig.from_options(options, source=str(options_file))
        arrays = read_hdf5(weight_file)
        if "softmax/W" in arrays:
            vocab = arrays["softmax/W"].shape[0]
            if config.n_tokens_vocab is None:
                config.n_tokens_vocab = vocab  # the options of released models need not say it
            config.has_softmax = True
        model = cls(config)
        model.load_official_arrays(arrays, source=f"{weight_file} (with {options_file.name})")
        model.eval()
        return model

    def load_official_arrays(self, arrays: dict[str, np.ndarray], source: str = "weight file") -> None:
        """Copy bilm-tf datasets into this model; refuse anything missing, unknown or mis-shaped."""
        check_weights(
            {k: tuple(v.shape) for k, v in arrays.items()},
            official_shapes(self.config),
            source,
            "the weights of these options",
            hint="Use the options.json published with this weight file",
            noun="datasets",
        )
        state = _from_official(self.config, arrays)
        self.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in state.items()})

    def official_arrays(self) -> dict[str, np.ndarray]:
        """This model's weights as bilm-tf datasets (the inverse of load_official_arrays)."""
        state = {k: v.detach().cpu().float().numpy() for k, v in self.state_dict().items()}
        return _to_official(self.config, state)

    def save_pretrained(self, path: str | Path) -> None:
        """Write DIR/options.json + DIR/weights.hdf5 in the official layout (loadable by AllenNLP / bilm-tf)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_hdf5(self.official_arrays(), path / WEIGHTS_FILE)
        (path / OPTIONS_FILE).write_text(json.dumps(self.config.to_options(), indent=2) + "\n")


# ---- ELMo for users' models ---------------------------------------------------------------------------


@dataclass
class ElmoRepresentations:
    """`representations[r]` is ELMo vector set r, (batch, words, 2 * projection_dim); `mask` (batch, words)."""

    representations: tuple[torch.Tensor, ...]
    mask: torch.Tensor


class Elmo(nn.Module):
    """ELMo_k^task = gamma^task * sum_j s_j^task h_{k,j} (Peters et al. 2018, eq. 1), one ScalarMix per output.

    Wraps a biLM (frozen by default) with `num_output_representations` trainable scalar mixes (the paper adds
    ELMo at the input and output of a task model: two mixes), dropout on the result and optionally the
    mixes' layer norm, computed as in AllenNLP over the words and the sentence-boundary tokens.
    """

    family = "elmo"  # what tools name it by (the biLM's family); it declares no capabilities

    def __init__(
        self,
        bilm: ElmoBiLM,
        num_output_representations: int = 1,
        dropout: float = 0.5,
        do_layer_norm: bool = False,
        freeze: bool = True,
    ) -> None:
        super().__init__()
        if num_output_representations < 1:
            raise ValueError(f"num_output_representations must be >= 1, got {num_output_representations}")
        self.bilm = bilm
        if freeze:
            bilm.requires_grad_(False)
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(bilm.num_layers + 1, do_layer_norm=do_layer_norm) for _ in range(num_output_representations)
        )
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> Elmo:
        return cls(ElmoBiLM.from_pretrained(path), **kwargs)

    @property
    def hidden_size(self) -> int:  # each representation's width, by the name every encoder uses
        return self.bilm.hidden_size

    @property
    def num_layers(self) -> int:
        return self.bilm.num_layers

    @property
    def config(self) -> ElmoConfig:
        return self.bilm.config

    def layer_of(self, name: str) -> int:
        """The biLM's depths (ElmoBiLM.layer_of) for bilm.*; the scalar mixes, above every layer, num_layers."""
        if name.startswith("bilm."):
            return self.bilm.layer_of(name.removeprefix("bilm."))
        if name.split(".")[0] == "scalar_mixes":
            return self.num_layers
        raise self.bilm.unknown_parameter(name)

    def forward(self, char_ids: torch.Tensor) -> ElmoRepresentations:
        out = self.bilm(char_ids, keep_boundaries=True)
        mask = out.mask  # (batch, words + 2)
        words = char_ids.shape[1]
        word_mask = mask[:, 2:]  # word k is real iff position k + 2 (its successor, or </S>) is: (batch, words)
        reps = []
        for mix in self.scalar_mixes:
            mixed = mix(out.hidden_states, mask)  # (batch, words + 2, 2 * proj)
            mixed = mixed[:, 1 : words + 1] * word_mask[..., None]  # drop <S>, </S>: (batch, words, 2 * proj)
            reps.append(self.dropout(mixed))
        return ElmoRepresentations(representations=tuple(reps), mask=word_mask)


# ---- Weight-file layout -------------------------------------------------------------------------------

_RNN = "RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"  # d = 0 forward, 1 backward; l = layer


def official_shapes(config: ElmoConfig) -> dict[str, tuple[int, ...]]:
    """Every dataset of a bilm-tf weight file for this config, with its shape (bilm-tf `model.py`)."""
    c, f, p, h = config.char_embedding_dim, config.n_filters, config.projection_dim, config.lstm_dim
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (config.n_characters - 1, c)}  # no padding row
    for i, (width, num) in enumerate(config.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, c, num)  # TF conv2d kernel over (1, chars)
        shapes[f"CNN/b_cnn_{i}"] = (num,)
    for k in range(config.n_highway):
        for name, shape in (("W_carry", (f, f)), ("b_carry", (f,)), ("W_transform", (f, f)), ("b_transform", (f,))):
            shapes[f"CNN_high_{k}/{name}"] = shape
    if f != p:
        shapes["CNN_proj/W_proj"], shapes["CNN_proj/b_proj"] = (f, p), (p,)
    for d in range(2):
        for l in range(config.n_layers):
            shapes[_RNN.format(d=d, l=l) + "W_0"] = (p + p, 4 * h)  # rows: [input; previous output]
            shapes[_RNN.format(d=d, l=l) + "B"] = (4 * h,)
            shapes[_RNN.format(d=d, l=l) + "W_P_0"] = (h, p)
    if config.has_softmax:
        shapes["softmax/W"], shapes["softmax/b"] = (config.n_tokens_vocab, p), (config.n_tokens_vocab,)
    return shapes


def _swap_gates(a: np.ndarray, cell: int) -> np.ndarray:
    """TF's LSTMCell orders gate blocks (i, j, f, o), ours (i, f, g=j, o): swap blocks 1 and 2 of axis 0.
    The swap is its own inverse, so saving uses it too."""
    i, j, f, o = (a[k * cell : (k + 1) * cell] for k in range(4))
    return np.concatenate([i, f, j, o], axis=0)


def _from_official(config: ElmoConfig, a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """bilm-tf datasets -> our state dict; one comment per convention undone."""
    s: dict[str, np.ndarray] = {}
    # char_embed has no row for id 0 (the "no word" padding the Batcher's +1 makes room for): add a zero row.
    s["char_cnn.char_embedding.weight"] = np.concatenate([np.zeros_like(a["char_embed"][:1]), a["char_embed"]])
    for i in range(len(config.filters)):
        # TF conv2d kernel (1, width, in, out) -> Conv1d weight (out, in, width).
        s[f"char_cnn.convolutions.{i}.weight"] = a[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0)
        s[f"char_cnn.convolutions.{i}.bias"] = a[f"CNN/b_cnn_{i}"]
    for k in range(config.n_highway):
        g = f"CNN_high_{k}/"
        # tf.matmul(x, W) stores W as (in, out); nn.Linear as (out, in): transpose every dense matrix.
        # W_carry is the gate that multiplies relu(transform): our `gate`, no sign flip (see modules/highway.py).
        s[f"char_cnn.highway.layers.{k}.gate.weight"] = a[g + "W_carry"].T
        s[f"char_cnn.highway.layers.{k}.gate.bias"] = a[g + "b_carry"]
        s[f"char_cnn.highway.layers.{k}.transform.weight"] = a[g + "W_transform"].T
        s[f"char_cnn.highway.layers.{k}.transform.bias"] = a[g + "b_transform"]
    if config.n_filters != config.projection_dim:
        s["char_cnn.projection.weight"] = a["CNN_proj/W_proj"].T
        s["char_cnn.projection.bias"] = a["CNN_proj/b_proj"]
    p, h = config.projection_dim, config.lstm_dim
    for d, direction in enumerate(("forward_layers", "backward_layers")):
        for l in range(config.n_layers):
            cell, ours = _RNN.format(d=d, l=l), f"{direction}.{l}."
            w = _swap_gates(a[cell + "W_0"].T, h)  # (4*cell, input + proj), gate blocks reordered
            # TF multiplies [x_t; h_{t-1}] by one matrix: the first `input` columns act on x_t.
            s[ours + "input_gates.weight"] = w[:, :p]
            s[ours + "state_gates.weight"] = w[:, p:]
            b = a[cell + "B"].copy()
            # LSTMCell adds forget_bias=1.0 at run time instead of storing it (AllenNLP elmo_lstm.load_weights).
            b[2 * h : 3 * h] += 1.0
            s[ours + "state_gates.bias"] = _swap_gates(b, h)
            s[ours + "projection.weight"] = a[cell + "W_P_0"].T
    if config.has_softmax:
        s["softmax.weight"] = a["softmax/W"]  # (vocab, proj) is already nn.Linear's (out, in)
        s["softmax.bias"] = a["softmax/b"]
    return s


def _to_official(config: ElmoConfig, s: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our state dict -> bilm-tf datasets, undoing each step of _from_official."""
    a: dict[str, np.ndarray] = {"char_embed": s["char_cnn.char_embedding.weight"][1:]}
    for i in range(len(config.filters)):
        a[f"CNN/W_cnn_{i}"] = s[f"char_cnn.convolutions.{i}.weight"].transpose(2, 1, 0)[None]
        a[f"CNN/b_cnn_{i}"] = s[f"char_cnn.convolutions.{i}.bias"]
    for k in range(config.n_highway):
        g, ours = f"CNN_high_{k}/", f"char_cnn.highway.layers.{k}."
        a[g + "W_carry"], a[g + "b_carry"] = s[ours + "gate.weight"].T, s[ours + "gate.bias"]
        a[g + "W_transform"], a[g + "b_transform"] = s[ours + "transform.weight"].T, s[ours + "transform.bias"]
    if config.n_filters != config.projection_dim:
        a["CNN_proj/W_proj"], a["CNN_proj/b_proj"] = s["char_cnn.projection.weight"].T, s["char_cnn.projection.bias"]
    h = config.lstm_dim
    for d, direction in enumerate(("forward_layers", "backward_layers")):
        for l in range(config.n_layers):
            cell, ours = _RNN.format(d=d, l=l), f"{direction}.{l}."
            w = np.concatenate([s[ours + "input_gates.weight"], s[ours + "state_gates.weight"]], axis=1)
            a[cell + "W_0"] = _swap_gates(w, h).T  # (input + proj, 4*cell)
            b = _swap_gates(s[ours + "state_gates.bias"], h)
            b[2 * h : 3 * h] -= 1.0
            a[cell + "B"] = b
            a[cell + "W_P_0"] = s[ours + "projection.weight"].T
    if config.has_softmax:
        a["softmax/W"], a["softmax/b"] = s["softmax.weight"], s["softmax.bias"]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in a.items()}


def _h5py():
    try:
        import h5py
    except ImportError as e:  # h5py is an optional dependency of ctxrep
        raise ImportError("reading and writing ELMo weight files needs h5py: pip install h5py") from e
    return h5py


def read_hdf5(file: str | Path) -> dict[str, np.ndarray]:
    """Every dataset of an HDF5 file by its full path ("CNN/W_cnn_0"), read in one pass."""
    h5py = _h5py()
    file = Path(file)
    if not file.is_file():
        raise CheckpointError(f"{file}: weight file not found")
    arrays: dict[str, np.ndarray] = {}

    def collect(name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            arrays[name] = obj[...]

    try:
        with h5py.File(file, "r") as fin:
            fin.visititems(collect)
    except OSError as e:
        raise CheckpointError(f"{file}: not a readable HDF5 file ({e}); re-download it") from e
    return arrays


def write_hdf5(arrays: dict[str, np.ndarray], file: str | Path) -> None:
    h5py = _h5py()
    with h5py.File(file, "w") as fout:
        for name, value in arrays.items():
            fout.create_dataset(name, data=value.astype(np.float32))


def _find_file(folder: Path, name: str) -> Path:
    if (folder / name).is_file():
        return folder / name
    candidates = sorted(folder.glob(f"*{name}"))  # the published names: elmo_..._options.json / _weights.hdf5
    if len(candidates) == 1:
        return candidates[0]
    found = ", ".join(c.name for c in candidates) or "none"
    raise CheckpointError(f"{folder}: expected {name} (or exactly one *{name}); found {found}")
