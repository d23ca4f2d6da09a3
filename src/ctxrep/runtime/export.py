"""Export an encoder to ONNX, then check ONNX Runtime's output against ctxrep's own.

The graph takes input_ids and attention_mask (batch, seq), plus token_type_ids for families that read segments
(`Encoder.reads_segments`), with dynamic batch and sequence axes, and returns last_hidden_state
(batch, seq, hidden). Any subword encoder ctxrep loads works through the `Encoder` interface: BERT, RoBERTa,
ELECTRA, GPT-2, XLNet, ALBERT, and pruned or distilled ones. ELMo is refused (see `export_onnx`).

Two exporters are tried in turn, and the first whose graph passes the parity check is kept:
- "torchscript" (torch.onnx.export(dynamo=False)): traces one example run. Python branches on data are recorded
  as taken in that run, so the example batch has padding (the masked attention path, which is exact for
  unpadded batches too);
- "dynamo" (torch.export): keeps symbolic shapes, for models the tracer cannot express or ONNX Runtime cannot
  run from the traced graph (XLNet's boolean eye matrix).
The parity check runs batches of other shapes than the example (padded and unpadded) through ONNX Runtime and
through the encoder, and compares last_hidden_state at the real tokens: a graph that baked in the example's
shape or branch fails it.

A graph whose weights exceed EXTERNAL_DATA_LIMIT keeps them in one file beside it, NAME.onnx.data (ONNX's external
data: a protobuf, so an .onnx file, cannot exceed 2 GiB; a 0.6B-parameter decoder is 2.4 GB at float32). ONNX
Runtime and OpenVINO read it from beside the .onnx: move or copy the two files together.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.models.encoder import Encoder

EXPORTERS = ("torchscript", "dynamo")
OUTPUT_NAME = "last_hidden_state"
# Bytes of weights above which a graph's tensors go to data_file(graph): protobuf's 2 GiB limit on one message less
# room for the graph and the constants the exporters fold (the dynamo exporter's own threshold, 1.5 GiB).
EXTERNAL_DATA_LIMIT = 1536 * 2**20
SMALL_GRAPH_BYTES = 16 * 2**20  # an .onnx under this may keep its weights outside (graph_complete reads it to see)


class ExportError(ValueError):
    """A model that cannot be exported, or an exported graph whose output differs from ctxrep's."""


@dataclass
class ExportReport:
    """What export_onnx wrote and how closely ONNX Runtime matched ctxrep (max |difference| at real tokens)."""

    path: Path
    family: str
    exporter: str
    opset: int
    input_names: list[str]
    max_abs_diff: float
    tried: list[str] = field(default_factory=list)  # "exporter: why it was not kept", for the ones that failed
    data_file: Path | None = None  # the weights, beside `path`, when they exceed EXTERNAL_DATA_LIMIT


class _LastHiddenState(nn.Module):
    """The encoder as a function of tensors: (input_ids, attention_mask[, token_type_ids]) -> last_hidden_state."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return self.encoder.encode(batch).last_hidden_state  # (batch, seq, hidden)


def example_batch(encoder: Encoder, lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    """Random token ids (right-padded with id 0), the mask, and segment ids 0: every family with segments has a
    segment 0 (RoBERTa only that one), and no family branches on their values, so the trace loses nothing."""
    vocab = encoder.input_embeddings().shape[0]
    g = torch.Generator().manual_seed(seed)
    seq = max(lengths)
    ids = torch.randint(min(5, vocab - 1), vocab, (len(lengths), seq), generator=g)  # (batch, seq)
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()  # (batch, seq)
    ids = ids * mask
    batch = {"input_ids": ids, "attention_mask": mask}
    if encoder.reads_segments:
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def check_batches(encoder: Encoder) -> list[dict[str, torch.Tensor]]:
    """Shapes unlike the export example's (2 x 8): padded rows, and an unpadded batch."""
    n = min(13, encoder.max_tokens)
    return [example_batch(encoder, [n, n - 4, 3], seed=1), example_batch(encoder, [min(5, n)], seed=2)]


def data_file(graph: str | os.PathLike) -> Path:
    """Where `graph`'s weights are when they are outside it: NAME.onnx.data beside it (one file)."""
    graph = Path(graph)
    return graph.with_name(graph.name + ".data")


def weights_bytes(module: nn.Module) -> int:
    """The bytes of `module`'s parameters and buffers (shared ones once)."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def run_exporter(
    wrapper: nn.Module,
    example: dict[str, torch.Tensor],
    file: Path,
    opset: int,
    exporter: str,
    output_names: tuple[str, ...] = (OUTPUT_NAME,),
) -> None:
    """Write `wrapper` (inputs named as `example`'s keys, outputs `output_names`, each (batch, sequence, ...)) to
    `file` with dynamic batch and sequence axes; its weights go to data_file(file) when they exceed
    EXTERNAL_DATA_LIMIT, or when the exporter put them outside (the TorchScript one writes a file per tensor past
    2 GiB)."""
    external = weights_bytes(wrapper) > EXTERNAL_DATA_LIMIT
    with tempfile.TemporaryDirectory(dir=file.parent) as tmp:
        raw = Path(tmp) / file.name
        export_graph(wrapper, example, raw, opset, exporter, output_names, external)
        written = set(os.listdir(tmp)) - {raw.name}
        if written == ({data_file(raw).name} if external else set()):
            install(raw, file)
        else:  # one data file, whatever the exporter wrote
            import onnx

            onnx.save_model(
                onnx.load(str(raw)),
                str(file),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_file(file).name,
            )


def export_graph(
    wrapper: nn.Module,
    example: dict[str, torch.Tensor],
    file: Path,
    opset: int,
    exporter: str,
    output_names: tuple[str, ...],
    external: bool,
) -> None:
    """One exporter's graph of `wrapper` at `file` (the dynamo exporter's weights at data_file(file) if `external`)."""
    names = list(example)
    args = tuple(example[k] for k in names)
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of torch.export; it is still the one that handles
        # data-dependent Python branches (traced on a padded example), so its warnings are not the user's concern.
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {k: {0: "batch", 1: "sequence"} for k in [*names, *output_names]}
            torch.onnx.export(
                wrapper,
                args,
                str(file),
                input_names=names,
                output_names=list(output_names),
                opset_version=opset,
                dynamo=False,
                dynamic_axes=axes,
            )
        else:
            batch_dim, seq_dim = torch.export.Dim("batch"), torch.export.Dim("sequence")
            shapes = {k: {0: batch_dim, 1: seq_dim} for k in names}
            program = torch.onnx.export(
                wrapper,
                args,
                input_names=names,
                output_names=list(output_names),
                opset_version=opset,
                dynamo=True,
                dynamic_shapes=shapes,
                verbose=False,
            )
            program.save(str(file), external_data=external)  # writes data_file(file) (past 1.5 GiB in any case)


def install(candidate: Path, dest: Path) -> None:
    """Move the graph at `candidate` and its data file, if any, to `dest`: the data first and the .onnx last, so that
    whoever finds `dest` finds its weights; a data file of an earlier graph at `dest` goes."""
    if data_file(candidate).exists():
        os.replace(data_file(candidate), data_file(dest))
        os.replace(candidate, dest)
    else:
        os.replace(candidate, dest)
        data_file(dest).unlink(missing_ok=True)


def graph_complete(graph: Path) -> bool:
    """`graph` is there with the weights it names outside it (a cache entry whose data file was deleted is not)."""
    if not graph.is_file():
        return False
    if data_file(graph).is_file() or graph.stat().st_size >= SMALL_GRAPH_BYTES:
        return True  # the data file that ctxrep writes, or a graph with its weights inside
    import onnx

    proto = onnx.load(str(graph), load_external_data=False)
    tensors = [*proto.graph.initializer, *(a.t for n in proto.graph.node for a in n.attribute if a.HasField("t"))]
    places = {e.value for t in tensors for e in t.external_data if e.key == "location"}
    return all((graph.parent / place).is_file() for place in places)


def check_onnx(file: str | Path, encoder: Encoder, batches: list[dict[str, torch.Tensor]] | None = None) -> float:
    """Run `batches` (default: shapes unlike the export example's) through ONNX Runtime and through `encoder`;
    the largest |difference| of last_hidden_state at real (unmasked) tokens."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads())
    session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    expected_inputs = [i.name for i in session.get_inputs()]
    worst = 0.0
    for batch in batches if batches is not None else check_batches(encoder):
        feed = {k: v.numpy() for k, v in batch.items() if k in expected_inputs}
        (got,) = session.run([OUTPUT_NAME], feed)
        with torch.inference_mode():
            want = _LastHiddenState(encoder)(**batch).float().numpy()
        real = batch["attention_mask"].bool().numpy()
        if got.shape != want.shape:
            return float("inf")
        worst = max(worst, float(np.abs(got[real] - want[real]).max()))
    return worst


def export_onnx(
    model_dir_or_encoder: str | os.PathLike | Encoder,
    out_file: str | os.PathLike,
    opset: int = 17,
    atol: float = 1e-4,
    exporters: tuple[str, ...] = EXPORTERS,
) -> ExportReport:
    """Write `out_file` (.onnx) from a model folder / name that ctxrep.load_model reads, or from an Encoder, and
    check it against ctxrep's output; raises ExportError if no exporter gives a graph within `atol`."""
    if isinstance(model_dir_or_encoder, Encoder):
        encoder = model_dir_or_encoder
    elif isinstance(model_dir_or_encoder, nn.Module):
        raise TypeError(
            f"export_onnx takes a ctxrep encoder or a model folder, got a {type(model_dir_or_encoder).__name__}; "
            "load the folder with ctxrep.load_model, or pass its path"
        )
    else:
        from ctxrep.models.loading import load_model

        encoder = load_model(model_dir_or_encoder, dtype="fp32")  # exported from float32
    if encoder.word_level:
        raise ExportError(
            f"{encoder.family} cannot be exported to ONNX: it reads words as characters and its LSTMs step through "
            "the sentence in a Python loop, which export unrolls to the example's length; export a subword "
            "Transformer encoder, or run this model in PyTorch"
        )
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise ExportError(
            f"ONNX export needs onnx, onnxscript and onnxruntime ({e}): pip install onnx onnxscript onnxruntime"
        ) from e
    unknown = [e for e in exporters if e not in EXPORTERS]
    if unknown or not exporters:
        raise ValueError(f"exporters must be a non-empty selection of {EXPORTERS}, got {tuple(exporters)}")
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)

    was_training = encoder.training
    encoder.eval()
    wrapper = _LastHiddenState(encoder).eval()
    example = example_batch(encoder, [min(8, encoder.max_tokens), min(5, encoder.max_tokens - 1)], seed=0)
    tried = []
    try:
        for exporter in exporters:
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                candidate = Path(tmp) / out.name
                try:
                    run_exporter(wrapper, example, candidate, opset, exporter)
                    diff = check_onnx(candidate, encoder)
                except Exception as e:  # exporters and ONNX Runtime raise many types; the next exporter may work
                    tried.append(f"{exporter}: {type(e).__name__}: {first_line(e)}")
                    continue
                if not diff <= atol:
                    tried.append(f"{exporter}: max abs difference {diff:.3g} > {atol:g}")
                    continue
                install(candidate, out)
            names = ["input_ids", "attention_mask"] + (["token_type_ids"] if encoder.reads_segments else [])
            data = data_file(out) if data_file(out).is_file() else None
            return ExportReport(out, encoder.family, exporter, opset, names, diff, tried, data)
    finally:
        encoder.train(was_training)
    raise ExportError(
        f"{encoder.family}: no ONNX export matched ctxrep's output ({'; '.join(tried)}); try another --opset, or "
        "report the model's config.json with this message"
    )


def first_line(e: Exception) -> str:
    """The line of an exporter's error that says what went wrong (torch.export's comes after its advice)."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if line.strip()]
    if "## Exception summary" in lines[:-1]:
        lines = lines[lines.index("## Exception summary") + 1 :]
    return lines[0][:300] if lines else ""
