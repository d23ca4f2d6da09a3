#!/usr/bin/env python
"""Word vectors from real sentences: ctxrep at every backend and precision against the runtimes a speed-minded user
picks instead (ONNX Runtime, OpenVINO) and plain transformers, in one run.

The work: N real English sentences (SST train leaves, or UD EWT `# text` lines), already split into words;
one vector per word = the mean of the word's subword pieces in the last layer of MiniLM-L6 (384 wide).

  ctxrep ...       Featurizer("minilm", layers=-1, pooling="mean", backend=B, precision=P).embed_words(word_lists)
                   for (torch: fp32 default, bf16, int8), (onnxruntime: fp32, int8), (openvino: fp32, bf16, int8)
  A / B            transformers AutoTokenizer (fast, is_split_into_words=True) + BertModel, batches of 32 in corpus
                   order (A) or sorted by length (B), each word's pieces mean-pooled with word_ids()
  peers            the runtime's own session over the plain last-layer ONNX export (ctxrep.runtime.export, as a user exports
                   it), fed by ctxrep's tokenization, windows, length-sorted batches and pooling (only the encoder
                   differs): ONNX Runtime f32 (ORT_ENABLE_ALL) and int8 (quantize_dynamic with its defaults), OpenVINO
                   f32 (INFERENCE_PRECISION_HINT f32), OpenVINO default (bf16 on CPUs with it), OpenVINO int8 (NNCF
                   post-training quantization, --calibration sentences that follow the benchmark's in the corpus)

The ceiling, measured after them in the same run (--no-ceiling leaves it out): OpenVINO's compiled encoder alone over
the same sentences tokenized in advance and cut into the same length-sorted batches (no tokenization, batching or
pooling timed: the most any pipeline over that engine could reach), and torch's matrix product in fp32 and bf16 at
MiniLM's feed-forward shape (a batch of tokens x 384 x 1,536) and at 2,048 cubed: what the CPU's kernels do.

Each system is compared within its precision class (fp32, bf16, int8): "vs fastest peer" divides its tokens/s by the
fastest peer's of the same class; the target is >= 1.0x for ctxrep's fastest configuration at each precision.
GFLOP/s = tokens/s x the encoder's FLOPs per real token (2 x every linear layer's weights, plus attention's
4 x hidden x mean sequence length per layer): useful work, padding not counted.

Everything after model loading, exports and calibration is timed: tokenization, padding, the encoder, pooling, numpy
output. Each system is warmed up once on a few sentences; the timed runs go round-robin and the best of --repeats is
kept. tokens = non-pad subword tokens including [CLS]/[SEP]; the count is checked to be the same for all systems.
float32 systems must agree with ctxrep's default to max |difference| < 1e-4 (else exit 1); the others report their
mean word-vector cosine to it (target for int8: >= 0.99). The CPU's model and flags and the load average before and
after are printed: other processes on the machine change every number.

Run:  .venv/bin/python benchmarks/featurize.py                 # 4,000 SST sentences, 2 threads
      .venv/bin/python benchmarks/featurize.py --limit 300     # quick trial (not a benchmark result)
      .venv/bin/python benchmarks/featurize.py --repeats 3 --markdown-out bench.md   (needs ctxrep[bench,openvino])
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from _common import CORPORA, DEFAULT_DATA, flops_per_token, fmt_table, load_corpus, logical_cpus, mark
from transformers import AutoTokenizer, BertModel

from ctxrep.featurize import Featurizer
from ctxrep.runtime.hardware import cpu_description, cpu_has_bf16
from ctxrep.runtime.openvino_backend import keeping_signal_stack
from ctxrep.text.inputs import token_budget_batches

MODEL = "minilm"
MIN_SENTENCES = 2000
TOLERANCE = 1e-4
REF_BATCH = 32
TARGET_VS_A = 2.5
TARGET_VS_B = 1.1
TARGET_VS_PEER = 1.0  # at each precision: ctxrep's fastest configuration / the fastest peer (issue 23; stretch 1.2)
TARGET_INT8_COSINE = 0.99


# (the corpora, DEFAULT_DATA and the results table: benchmarks/_common.py, shared with other benchmarks)


# ---- the reference: plain transformers ------------------------------------------------------------


class Reference:
    """AutoTokenizer + BertModel, fed batches of `batch_size`, each word mean-pooled from its pieces."""

    def __init__(self, path: Path, batch_size: int = REF_BATCH) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not self.tokenizer.is_fast:
            sys.exit(f"error: AutoTokenizer gave a slow tokenizer for {path}; the reference needs the fast one")
        self.model = BertModel.from_pretrained(path).eval()
        self.batch_size = batch_size

    def embed_words(self, word_lists: Sequence[list[str]], sort: bool) -> tuple[list[np.ndarray], int, int]:
        """One (n_words, hidden) float32 array per sentence, in corpus order; plus (real tokens, padded tokens)."""
        n = len(word_lists)
        if sort:
            lengths = [len(ids) for ids in self.tokenizer(list(word_lists), is_split_into_words=True)["input_ids"]]
            order = sorted(range(n), key=lengths.__getitem__)
        else:
            order = list(range(n))
        out: list[np.ndarray | None] = [None] * n
        real = padded = 0
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = [word_lists[i] for i in idx]
                enc = self.tokenizer(
                    batch, is_split_into_words=True, padding=True, truncation=False, return_tensors="pt"
                )
                hidden = self.model(**enc).last_hidden_state  # (b, t, h)
                b, t, h = hidden.shape
                real += int(enc["attention_mask"].sum())
                padded += b * t
                # Mean of each word's pieces: row r*t+pos of the flattened batch goes to word slot offset(r)+word.
                rows, slots, offsets = [], [], [0]
                for r in range(b):
                    for pos, w in enumerate(enc.word_ids(r)):
                        if w is not None:
                            rows.append(r * t + pos)
                            slots.append(offsets[-1] + w)
                    offsets.append(offsets[-1] + len(batch[r]))
                slot_index = torch.tensor(slots)
                sums = torch.zeros(offsets[-1], h).index_add_(0, slot_index, hidden.reshape(b * t, h)[rows])
                counts = torch.zeros(offsets[-1]).index_add_(0, slot_index, torch.ones(len(slots)))
                vectors = (sums / counts[:, None]).numpy()
                for r, i in enumerate(idx):
                    out[i] = vectors[offsets[r] : offsets[r + 1]]
        return out, real, padded  # type: ignore[return-value]


# ---- the peers: a runtime session behind ctxrep's pipeline --------------------------------------------------------


class PeerRuntime:
    """A peer's session over the plain last-hidden-state graph (`ctxrep.runtime.export.export_onnx`, as a user exports it),
    behind the runtime interface (`start(batch, layers)` with layers = [top] only, one batch at a time: a peer
    session runs each call to the end, as its documentation shows)."""

    device = torch.device("cpu")

    def __init__(self, run: Callable[[dict[str, np.ndarray]], np.ndarray], input_names: list[str], top: int) -> None:
        self.run, self.input_names, self.top = run, input_names, top

    def in_flight(self, call_tokens: int) -> int:
        return 1

    def start(self, batch, layers, call_tokens: int = 0) -> Callable[[], torch.Tensor]:
        hidden = self.hidden_states(batch, layers, call_tokens)
        return lambda: hidden

    def hidden_states(self, batch, layers, call_tokens: int = 0) -> torch.Tensor:
        if list(layers) != [self.top]:
            sys.exit("error: the peers' graphs return the last layer only; the benchmark asks for layers=-1")
        last = self.run({name: batch[name].numpy() for name in self.input_names})
        return torch.from_numpy(np.asarray(last, dtype=np.float32))[None]  # (1, batch, seq, hidden)


class PeerFeaturizer(Featurizer):
    """ctxrep's Featurizer (tokenization, windows, batches, pooling) with a peer runtime as the encoder."""

    def __init__(self, peer: PeerRuntime, **kwargs) -> None:
        super().__init__(MODEL, compile=False, **kwargs)
        self.peer = peer

    @property
    def runtime(self) -> PeerRuntime:
        return self.peer


def ort_peer(onnx_file: Path, threads: int, top: int) -> PeerRuntime:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return PeerRuntime(lambda feed: session.run(None, feed)[0], names, top)


def openvino_peer(model, threads: int, top: int, hint: str | None) -> PeerRuntime:
    """An OpenVINO compiled model; hint None = the plugin's default inference precision (bf16 on CPUs with it)."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if hint is not None:
        config["INFERENCE_PRECISION_HINT"] = hint
    with keeping_signal_stack():  # OpenVINO's plugin can leave the thread on a freed signal stack (Ctrl-C: SIGSEGV)
        compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    names = [
        next(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in i.get_names())
        for i in compiled.inputs
    ]

    def run(feed):
        request.infer(feed)
        return request.get_output_tensor(0).data.copy()

    return PeerRuntime(run, names, top)


def peer_files(featurizer: Featurizer, folder: Path) -> tuple[Path, Path]:
    """The plain ONNX export of the model (parity-checked) and ONNX Runtime's quantize_dynamic of it with its
    defaults (int8 weights per tensor, every quantizable op), as its documentation shows for Transformer models."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from ctxrep.runtime.export import export_onnx

    f32, int8 = folder / "model.onnx", folder / "model.int8.onnx"
    export_onnx(featurizer.model, f32)
    quantize_dynamic(str(f32), str(int8), weight_type=QuantType.QInt8)
    return f32, int8


def nncf_int8(onnx_file: Path, featurizer: Featurizer, sentences: Sequence[list[str]]):
    """NNCF post-training quantization (model_type TRANSFORMER) of the OpenVINO model, calibrated on `sentences`
    (one sample each), as OpenVINO's documentation shows."""
    import nncf
    import openvino as ov

    from ctxrep.text.inputs import WindowPlan, collate

    model = ov.Core().read_model(str(onnx_file))
    names = [
        next(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in i.get_names()) for i in model.inputs
    ]
    plan = WindowPlan(featurizer.tokenizer, featurizer.max_length)  # the featurizer's windows, built in public
    pieces = featurizer.tokenizer.encode_words(list(sentences))
    windows = [w for i, p in enumerate(pieces) for w in plan.single(i, p)]
    samples = [{k: v.numpy() for k, v in collate([w], featurizer.tokenizer).items() if k in names} for w in windows]
    return nncf.quantize(model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(samples))


def mean_cosine(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """Mean over all words of cos(ours, theirs)."""
    a, b = np.concatenate(ours), np.concatenate(theirs)
    return float(np.mean((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))))


# ---- measuring ------------------------------------------------------------------------------------


def max_abs_diff(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """Largest |difference| over all word vectors; inf if a shape differs, nan if any value is nan."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            return float("inf")
        if np.isnan(a).any() or np.isnan(b).any():
            return float("nan")
        worst = max(worst, float(np.abs(a - b).max(initial=0.0)))
    return worst


# ---- main -----------------------------------------------------------------------------------------

SKIPPABLE = ["A", "B", "ctxrep-torch", "ctxrep-ort", "ctxrep-ov", "ort", "ov"]
System = Callable[[Sequence[list[str]]], tuple[list[np.ndarray], int, int]]  # -> vectors, real tokens, padded


@dataclass
class Entry:
    label: str
    precision: str  # the precision class it is compared within: fp32, bf16 or int8
    ours: bool  # a ctxrep configuration (else a peer)
    run: System


# ---- the ceiling: the encoder alone, and the CPU's matrix products --------------------------------------------


def sorted_batches(tokenizer, word_lists: Sequence[list[str]], budget: int) -> list[dict[str, np.ndarray]]:
    """The sentences tokenized once (untimed), sorted by length and cut into padded batches by the pipeline's own rule
    (`token_budget_batches`: rows x longest <= `budget`): what an encoder alone is fed."""
    ids = tokenizer(list(word_lists), is_split_into_words=True)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches, start = [], 0
    for size in token_budget_batches([len(ids[i]) for i in order], budget):
        rows = [ids[i] for i in order[start : start + size]]
        start += size
        input_ids = np.zeros((len(rows), len(rows[-1])), np.int64)
        mask = np.zeros_like(input_ids)
        for r, row in enumerate(rows):
            input_ids[r, : len(row)] = row
            mask[r, : len(row)] = 1
        batches.append({"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)})
    return batches


def encoder_alone_seconds(compiled_model, batches: list[dict[str, np.ndarray]], repeats: int) -> float:
    """Best seconds of one OpenVINO compiled model over every batch (inputs ready; no tokenization, no pooling)."""
    request = compiled_model.create_infer_request()
    names = [next(n for n in batches[0] if n in i.get_names()) for i in compiled_model.inputs]
    request.infer({n: batches[0][n] for n in names})  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for batch in batches:
            request.infer({n: batch[n] for n in names})
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, seconds: float = 2.0) -> float:
    """GFLOP/s of torch's (m x k) @ (k x n) product in `dtype` at torch's threads: the best call of ~`seconds`."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    torch.mm(a, b)
    best, stop = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"the shared data folder (default: {DEFAULT_DATA})")
    p.add_argument("--corpus", choices=sorted(CORPORA), default="sst", help="SST train or UD EWT train (default: sst)")
    p.add_argument("--sentences", type=int, default=4000, help=f"corpus size, >= {MIN_SENTENCES:,} (default: 4000)")
    p.add_argument("--limit", type=int, help="quick trial on this many sentences (any number; not a benchmark result)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for all systems (default: 2)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per system; the best is reported (default: 1)")
    p.add_argument("--warmup", type=int, default=64, help="sentences in each system's untimed warm-up (default: 64)")
    p.add_argument("--calibration", type=int, default=300, help="NNCF peer: calibration sentences (default: 300)")
    p.add_argument("--compiled", action="store_true", help="also ctxrep with compile=True (compiles in the warm-up)")
    p.add_argument(
        "--no-ceiling", action="store_true", help="leave out the ceiling rows (the encoder alone; matrix products)"
    )
    p.add_argument("--markdown-out", type=Path, metavar="FILE", help="also write the Markdown table to FILE")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=SKIPPABLE,
        help="leave these systems out (quick trials only; the full table has them all)",
    )
    args = p.parse_args(argv)
    if args.limit is None and args.sentences < MIN_SENTENCES:
        p.error(f"--sentences must be at least {MIN_SENTENCES:,}; use --limit for a quick trial")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    if args.threads < 1 or args.repeats < 1 or args.warmup < 1:
        p.error("--threads, --repeats and --warmup must be at least 1")
    return args


def ctxrep_system(featurizer: Featurizer) -> System:
    """embed_words, with the real and padded sizes of the batches the encoder is given counted on the way in.
    Works for every runtime (torch, ONNX Runtime, OpenVINO, a peer's session)."""
    seen = {"real": 0, "padded": 0}
    runtime = featurizer.runtime
    inner = runtime.start  # every batch the Featurizer runs is started here

    def counted(batch, layers, call_tokens: int = 0):
        seen["padded"] += batch["attention_mask"].numel()
        seen["real"] += int(batch["attention_mask"].sum())
        return inner(batch, layers, call_tokens)

    runtime.start = counted

    def run(sentences: Sequence[list[str]]) -> tuple[list[np.ndarray], int, int]:
        seen["real"] = seen["padded"] = 0
        vectors = featurizer.embed_words(sentences)
        return vectors, seen["real"], seen["padded"]

    return run


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    n = args.limit if args.limit is not None else args.sentences
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    skip = set(args.skip)
    load_before = os.getloadavg()

    corpus = load_corpus(args.data, args.corpus, n + args.calibration)
    sentences, calibration = corpus[:n], corpus[n:]
    featurizer = Featurizer(MODEL, layers=-1, pooling="mean", num_threads=args.threads)
    reference = Reference(featurizer.source.folder)  # the folder the featurizer resolved MODEL to
    top = featurizer.num_layers

    # Token count from the tokenizer (untimed); each system's attention masks must add up to the same.
    special = featurizer.tokenizer.template.num_special(pair=False)
    lengths = [len(a.tokens) + special for a in featurizer.tokenize(sentences)]
    tokens = sum(lengths)
    if max(lengths) > featurizer.max_length:
        sys.exit(
            f"error: a sentence has {max(lengths)} tokens, more than the model's {featurizer.max_length}: ctxrep "
            "would window it and the reference cannot run it; choose other sentences"
        )

    def ours(backend: str, precision: str, **kwargs) -> System:
        return ctxrep_system(
            Featurizer(MODEL, layers=-1, pooling="mean", backend=backend, precision=precision, **kwargs)
        )

    half = "bf16" if cpu_has_bf16() else "fp32"  # what OpenVINO runs by default here
    systems: dict[str, Entry] = {
        "ctxrep": Entry("ctxrep default (torch fp32)", "fp32", True, ctxrep_system(featurizer))
    }
    if "ctxrep-torch" not in skip:
        systems["ctxrep-bf16"] = Entry("ctxrep torch bf16", "bf16", True, ours("torch", "bf16"))
        systems["ctxrep-int8"] = Entry("ctxrep torch int8 (SmoothQuant)", "int8", True, ours("torch", "int8"))
        if args.compiled:
            compiled = Featurizer(MODEL, layers=-1, pooling="mean", compile=True)
            systems["compiled"] = Entry("ctxrep torch fp32 compile=True", "fp32", True, ctxrep_system(compiled))
    if "ctxrep-ort" not in skip:
        systems["ctxrep-ort"] = Entry("ctxrep onnxruntime fp32", "fp32", True, ours("onnxruntime", "fp32"))
        systems["ctxrep-ort-int8"] = Entry("ctxrep onnxruntime int8", "int8", True, ours("onnxruntime", "int8"))
    if "ctxrep-ov" not in skip:
        systems["ctxrep-ov"] = Entry("ctxrep openvino fp32", "fp32", True, ours("openvino", "fp32"))
        systems["ctxrep-ov-bf16"] = Entry("ctxrep openvino bf16", "bf16", True, ours("openvino", "bf16"))
        systems["ctxrep-ov-int8"] = Entry("ctxrep openvino int8 (NNCF)", "int8", True, ours("openvino", "int8"))
    if "A" not in skip:
        run_a = lambda s: reference.embed_words(s, sort=False)  # noqa: E731
        systems["A"] = Entry(f"A: transformers, corpus order, {REF_BATCH} sentences", "fp32", False, run_a)
    if "B" not in skip:
        run_b = lambda s: reference.embed_words(s, sort=True)  # noqa: E731
        systems["B"] = Entry(f"B: transformers, length-sorted, {REF_BATCH} sentences", "fp32", False, run_b)
    tmp = tempfile.TemporaryDirectory()
    ov_model = None
    if not {"ort", "ov"} <= skip:
        onnx_f32, onnx_int8 = peer_files(featurizer, Path(tmp.name))
        peer = lambda runtime: ctxrep_system(PeerFeaturizer(runtime, layers=-1, pooling="mean"))  # noqa: E731
        if "ort" not in skip:
            systems["ort"] = Entry("ONNX Runtime f32", "fp32", False, peer(ort_peer(onnx_f32, args.threads, top)))
            systems["ort-int8"] = Entry(
                "ONNX Runtime int8 (quantize_dynamic defaults)",
                "int8",
                False,
                peer(ort_peer(onnx_int8, args.threads, top)),
            )
        if "ov" not in skip:
            import openvino as ov

            ov_model = ov.Core().read_model(str(onnx_f32))
            systems["ov"] = Entry(
                "OpenVINO f32 hint", "fp32", False, peer(openvino_peer(ov_model, args.threads, top, "f32"))
            )
            systems["ov-default"] = Entry(
                f"OpenVINO default (runs {half} here)",
                half,
                False,
                peer(openvino_peer(ov_model, args.threads, top, None)),
            )
            quantized = nncf_int8(onnx_f32, featurizer, calibration)
            systems["ov-int8"] = Entry(
                f"OpenVINO int8 (NNCF, {len(calibration)} calibration sentences)",
                "int8",
                False,
                peer(openvino_peer(quantized, args.threads, top, None)),
            )
    # Each peer runs right after the ctxrep configuration on its runtime and precision, so that a load that changes
    # during the run (other processes) falls on both alike.
    pairs = {"ort": "ctxrep-ort", "ort-int8": "ctxrep-ort-int8", "ov": "ctxrep-ov", "ov-default": "ctxrep-ov-bf16"}
    pairs["ov-int8"] = "ctxrep-ov-int8"
    order = [n for n in systems if n not in pairs or pairs[n] not in systems]
    for peer, mine in pairs.items():
        if peer in systems and mine in systems:
            order.insert(order.index(mine) + 1, peer)
    systems = {n: systems[n] for n in order}
    warm = sentences[: args.warmup]
    for entry in systems.values():
        entry.run(warm)

    # Round-robin timed runs; the first run's vectors are kept for the check.
    best = {name: float("inf") for name in systems}
    outputs: dict[str, list[np.ndarray]] = {}
    padded: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, entry in systems.items():
            gc.collect()
            t0 = time.perf_counter()
            vectors, real, pad = entry.run(sentences)
            best[name] = min(best[name], time.perf_counter() - t0)
            if real != tokens:
                sys.exit(f"error: {name} ran {real:,} real tokens but the corpus has {tokens:,}")
            outputs.setdefault(name, vectors)
            padded[name] = pad
            del vectors
    tmp.cleanup()

    # The ceiling, after the timed runs: OpenVINO's encoder alone over ready inputs (the fastest peer engine, with no
    # tokenization, batching or pooling), and torch's matrix product at MiniLM's feed-forward shape and a large one.
    ceiling_rows = []
    if not args.no_ceiling:
        import openvino as ov

        batches = sorted_batches(reference.tokenizer, sentences, featurizer.batch_tokens)
        for hint, precision in (("f32", "fp32"), (None, half)):
            if ov_model is None:
                break
            config = {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY"}
            if hint is not None:
                config["INFERENCE_PRECISION_HINT"] = hint
            with keeping_signal_stack():
                compiled_model = ov.Core().compile_model(ov_model, "CPU", config)
            seconds = encoder_alone_seconds(compiled_model, batches, args.repeats)
            rate = tokens / seconds
            ceiling_rows.append(
                [
                    f"OpenVINO encoder alone ({hint or 'default'}), ready sorted batches",
                    precision,
                    f"{seconds:.2f}",
                    f"{rate:,.0f}",
                    f"{rate * flops_per_token(featurizer.model, tokens / len(sentences)) / 1e9:.0f}",
                ]
            )
        h = featurizer.model.hidden_size
        for dtype, precision in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            if precision == "bf16" and not cpu_has_bf16():
                continue
            for shape in ((featurizer.batch_tokens, h, 4 * h), (2048, 2048, 2048)):
                gflops = matmul_gflops(*shape, dtype)
                label = "torch matmul " + " x ".join(f"{d:,}" for d in shape)
                ceiling_rows.append([label, precision, "-", "-", f"{gflops:.0f}"])
    load_after = os.getloadavg()

    exact = [name for name, e in systems.items() if e.precision == "fp32" and name != "ctxrep"]
    diffs = {name: max_abs_diff(outputs["ctxrep"], outputs[name]) for name in exact}
    worst = max(diffs.values(), key=lambda d: float("inf") if np.isnan(d) else d) if diffs else 0.0
    cosines = {name: mean_cosine(outputs[name], outputs["ctxrep"]) for name in systems if name not in diffs}
    outputs.clear()
    speed = {name: tokens / best[name] for name in systems}
    flops = flops_per_token(featurizer.model, tokens / len(sentences))

    def fastest(precision: str, mine: bool) -> str | None:
        names = [n for n, e in systems.items() if e.precision == precision and e.ours == mine]
        return max(names, key=speed.__getitem__) if names else None

    def row(name: str) -> list[str]:
        e = systems[name]
        peer_name = fastest(e.precision, False)
        vs = f"{speed[name] / speed[peer_name]:.2f}x" if peer_name else "-"
        agree = f"{diffs[name]:.1e}" if name in diffs else "0" if name == "ctxrep" else f"cos {cosines[name]:.4f}"
        return [
            e.label,
            e.precision,
            f"{best[name]:.2f}",
            f"{speed[name]:,.0f}",
            f"{speed[name] * flops / 1e9:.0f}",
            f"{1 - tokens / padded[name]:.0%}",
            vs,
            agree,
        ]

    header = [
        "system",
        "precision",
        "wall time (s)",
        "tokens/s",
        "GFLOP/s",
        "padding",
        "vs fastest peer at its precision",
        "vs ctxrep fp32: max abs diff / mean cosine",
    ]
    rows = [row(name) for name in systems]
    ratio_header = ["check", "measured", "target", "result"]
    ratio_rows = []

    def check(label: str, value: float, target: float, shown: str, at_least: bool = True) -> None:
        ok = value >= target if at_least else value < target
        ratio_rows.append([label, shown, f"{'>=' if at_least else '<'} {target:g}", mark(ok)])

    for precision in ("fp32", "bf16", "int8"):
        mine, theirs = fastest(precision, True), fastest(precision, False)
        if mine and theirs:
            r = speed[mine] / speed[theirs]
            check(f"{precision}: {systems[mine].label} / {systems[theirs].label}", r, TARGET_VS_PEER, f"{r:.2f}x")
    for name, target in (("A", TARGET_VS_A), ("B", TARGET_VS_B)):
        if name in speed:
            r = speed["ctxrep"] / speed[name]
            check(f"ctxrep default / {name}", r, target, f"{r:.2f}x")
    for name in (n for n, e in systems.items() if e.ours and e.precision == "int8"):
        check(f"{systems[name].label}: word-vector cosine", cosines[name], TARGET_INT8_COSINE, f"{cosines[name]:.4f}")
    check("float32 outputs equal", worst, TOLERANCE, f"{worst:.1e}", at_least=False)
    trial = f" QUICK TRIAL (--limit {n}): not a benchmark result." if n < MIN_SENTENCES else ""
    skipped = f" Left out: {', '.join(sorted(skip))}." if skip else ""
    notes = [
        (
            f"corpus: {args.corpus} ({CORPORA[args.corpus][0]}), {n:,} sentences "
            f"({'a seeded sample in file order' if args.corpus == 'sst' else 'the first'}), "
            f"{sum(len(s) for s in sentences):,} words, {tokens:,} tokens (non-pad, with [CLS]/[SEP]).{trial}{skipped}"
        ),
        (
            f"model: {MODEL} ({featurizer.num_layers} layers, {featurizer.dim} wide), last layer, mean of each word's "
            f"pieces; transformers attention: {reference.model.config._attn_implementation}; "
            f"{flops / 1e6:.1f} MFLOP per token."
        ),
        (
            "timing: tokenization through to numpy word vectors (model loading, exports and calibration excluded); "
            "every system but A/B runs ctxrep's pipeline (length-sorted batches under a "
            f"{featurizer.batch_tokens:,}-token budget); peers = the runtime's own session over the plain last-layer "
            f"ONNX export; warm-up {len(warm)} sentences per system; best of {args.repeats} round-robin run(s)."
        ),
        (
            f"torch threads: {torch.get_num_threads()}; torch {torch.__version__}; "
            f"transformers {transformers.__version__}; onnxruntime {_version('onnxruntime')}; "
            f"openvino {_version('openvino')}; nncf {_version('nncf')}; python {platform.python_version()}."
        ),
        (
            f"CPU: {cpu_description()}, {logical_cpus()} logical CPUs; load average (1/5/15 min) "
            f"{' / '.join(f'{x:.2f}' for x in load_before)} before, {' / '.join(f'{x:.2f}' for x in load_after)} after."
        ),
    ]

    ceiling_header = ["ceiling", "precision", "wall time (s)", "tokens/s", "GFLOP/s"]
    print(fmt_table(header, rows, markdown=False, text_columns=2))
    print()
    if ceiling_rows:
        print(fmt_table(ceiling_header, ceiling_rows, markdown=False, text_columns=2))
        print()
    print(fmt_table(ratio_header, ratio_rows, markdown=False))
    print()
    print("\n".join(notes))
    markdown = "\n".join(
        [fmt_table(header, rows, markdown=True, text_columns=2), ""]
        + ([fmt_table(ceiling_header, ceiling_rows, markdown=True, text_columns=2), ""] if ceiling_rows else [])
        + [fmt_table(ratio_header, ratio_rows, markdown=True), ""]
        + [f"- {note}" for note in notes]
    )
    print("\n--- Markdown ---\n")
    print(markdown)
    if args.markdown_out is not None:
        args.markdown_out.write_text(markdown + "\n", encoding="utf-8")
        print(f"\n(written to {args.markdown_out})")

    if not worst < TOLERANCE:  # also true for nan
        print(f"\nerror: outputs differ: max abs diff {worst:.3g} is not < {TOLERANCE:g}", file=sys.stderr)
        return 1
    return 0


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
