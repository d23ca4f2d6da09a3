"""The featurizer's forward step: rows -> length-sorted token-budget batches -> the runtime -> each batch's states.

run_rows(fz, rows, consume)       every row in batches; consume(selected, batch_rows, weights) pools each batch
                                  once its states are on the CPU, while later batches run (the runtime's
                                  `in_flight`); `fz.between_batches(drain)` between two batches; padded=True: on the
                                  padded grid (the states at masked positions are read)
run_in_chunks(n, prepare, finish) a call cut into chunks of OVERLAP_CHUNK_TEXTS texts, a thread tokenizing the
                                  next chunk while the device runs this one (`overlaps_tokenization`)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from ctxrep.text.inputs import Rows, token_budget_batches
from ctxrep.util.progress import progress as show_progress

if TYPE_CHECKING:
    from ctxrep.featurize.featurizer import Featurizer

# On CUDA, a call of more texts is tokenized in chunks of this many, the next one while the device runs this one.
OVERLAP_CHUNK_TEXTS = 4096


def run_rows(
    fz: Featurizer,
    rows: Rows,
    consume: Callable[[torch.Tensor, np.ndarray, np.ndarray | None], None],
    padded: bool = False,
) -> None:
    """Encode every row (text.inputs.Rows: windows of pieces) in length-sorted token-budget batches on `fz`'s
    runtime; `consume(selected, batch_rows, weights)` pools each batch once its hidden states (layers, batch, seq,
    hidden) are on the CPU as float32 (after the featurizer's mix). `padded`: every batch runs on the padded grid
    (`Encoder.encode(padded=True)`), for a caller that reads the states at positions whose attention_mask is 0."""
    order = np.argsort(rows.lengths, kind="stable")  # the same order for the same input: same batches
    sizes = token_budget_batches(rows.lengths[order].tolist(), fz.batch_tokens)
    num_tokens = int(rows.lengths.sum())
    report = fz.progress if callable(fz.progress) else None  # the caller's own progress (ctxrep embed's shards)
    shown = bool(fz.progress) and report is None
    bar = show_progress(total=num_tokens, unit="tok", enabled=shown, desc="embed")  # lines in a log
    fz.model.eval()
    run = fz.runtime
    in_flight = max(1, run.in_flight(num_tokens))  # batches started before the oldest is pooled

    def pool(batch_rows: np.ndarray, weights: np.ndarray | None, wait, real: int) -> None:
        selected = wait()
        if fz.mix is not None:
            selected = fz.mix(selected).unsqueeze(0)  # (1, batch, seq, hidden)
        consume(selected, batch_rows, weights)
        bar.update(real)
        if report is not None:
            report(bar.n, num_tokens)

    pending = collections.deque()  # started batches, pooled oldest first while later ones run

    def drain() -> None:
        while pending:
            pool(*pending.popleft())

    with torch.inference_mode():
        start = 0
        for size in sizes:
            batch_rows = order[start : start + size]
            start += size
            collated, weights = rows.collate(batch_rows, fz.tokenizer)
            real = int(rows.lengths[batch_rows].sum())
            pending.append((batch_rows, weights, run.start(collated, fz.layer_indices, num_tokens, padded), real))
            if len(pending) >= in_flight:
                pool(*pending.popleft())
            if fz.between_batches is not None and start < len(order):  # e.g. ctxrep serve: other calls' batches
                fz.between_batches(drain)  # run here, between two of this call's (not after its last: it ends)
        drain()
    bar.close()


def overlaps_tokenization(device: torch.device, word_level: bool, num_texts: int) -> bool:
    """A fixed rule: on CUDA (the host would otherwise leave the device idle while it tokenizes), for a call of
    more than OVERLAP_CHUNK_TEXTS texts, and not for ELMo (its word numbering is reset per call).

    Not on the CPU (measured on a shared 2-core AMD EPYC, load 5-7, SST sentences): tokenizing and building the
    rows is 0.5% of MiniLM's CPU time there, so a look-ahead thread has nothing to hide (2,048 sentences, chunks of
    512: 0.96x with torch on both cores, 0.97x with torch on one); it pays only for an encoder with ~no compute
    and a free core (a 1-layer 32-wide model, 17,088 sentences, torch on one core: 1.46x), and with torch on
    every core it competes with torch's threads (0.52x-0.91x). Chunks also change the batches, so the vectors by
    ~1e-7 (3.8e-7 on MiniLM)."""
    return device.type == "cuda" and not word_level and num_texts > OVERLAP_CHUNK_TEXTS


def run_in_chunks(num_texts: int, overlap: bool, prepare: Callable, finish: Callable) -> tuple[list, list[int]]:
    """(each chunk's `finish(prepare(chunk))`, the texts the windows cut, by index in the call). One chunk of
    every text, or with `overlap` chunks of OVERLAP_CHUNK_TEXTS texts, a thread preparing (tokenizing: `tokenizers`
    releases the GIL) the next chunk while this one runs; a chunk's windows are batched among themselves, and
    batching never changes a vector."""
    step = OVERLAP_CHUNK_TEXTS
    chunks = [slice(i, i + step) for i in range(0, num_texts, step)] if overlap else [slice(0, num_texts)]
    if len(chunks) == 1:
        prepared = prepare(chunks[0])
        return [finish(prepared)], prepared.cut
    results, cut = [], []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxrep-tokenize") as tokenizer_thread:
        ahead = tokenizer_thread.submit(prepare, chunks[0])
        for k in range(len(chunks)):
            prepared = ahead.result()
            if k + 1 < len(chunks):
                ahead = tokenizer_thread.submit(prepare, chunks[k + 1])
            results.append(finish(prepared))
            cut += [chunks[k].start + i for i in prepared.cut]
    return results, cut
