"""Cached in-batch negatives (GradCache; Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"): a loss over a large batch of embeddings in the activation memory of a small one.

A contrastive loss (mnrl, SimCSE, SPLADE's ranking loss) compares every text of a batch with every other, so its
gradient needs the whole batch's embeddings; the encoder's activations need not be kept for all of them at once.

    1. embed the batch in chunks of `mini_batch_size` texts without keeping activations, each chunk's RNG state noted
    2. the loss on the whole (B, dim) embeddings, back-propagated to the embeddings only: g = dL / d embeddings
    3. per chunk: embed it again with the same RNG state (the same dropout masks), and back-propagate g's rows for it
       into the encoder's parameters

Step 3 runs inside the backward of `cached_embeddings`' output, an autograd Function (as re-entrant activation
checkpointing does), so the Trainer's ordinary `loss.backward()`, accumulation, clipping and optimizer step are
unchanged: the one training loop needs nothing of its own for it. The parameters' gradients equal those of the
uncached loss up to float rounding (each chunk is padded to its own longest text), with the same dropout masks when
dropout is off, and the same per chunk when it is on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch


def cached_embeddings(embed: Callable[[list], torch.Tensor], items: Sequence, mini_batch_size: int) -> torch.Tensor:
    """(len(items), dim) embeddings of `items`, `mini_batch_size` at a time, whose backward recomputes each chunk
    with gradients (see the module docstring). `embed(list_of_items)` -> (n, dim), with gradients when enabled."""
    chunks = [list(items[i : i + mini_batch_size]) for i in range(0, len(items), mini_batch_size)]
    anchor = torch.empty(0, requires_grad=True)  # makes autograd call backward; it gets no gradient
    return _CachedEmbeddings.apply(anchor, embed, chunks)


class _CachedEmbeddings(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, embed, chunks):  # runs without gradients
        ctx.embed, ctx.chunks, ctx.states = embed, chunks, []
        outputs = []
        for chunk in chunks:
            ctx.states.append(_rng_state())
            outputs.append(embed(chunk).detach())
        return torch.cat(outputs)

    @staticmethod
    def backward(ctx, grad):
        start = 0
        for chunk, state in zip(ctx.chunks, ctx.states):
            with torch.enable_grad(), _replayed(state):
                out = ctx.embed(chunk)
            torch.autograd.backward(out, grad[start : start + len(out)])
            start += len(out)
        return None, None, None


def _rng_state() -> tuple:
    cuda = (
        [torch.cuda.get_rng_state(d) for d in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else []
    )
    return torch.get_rng_state(), cuda


@contextlib.contextmanager
def _replayed(state: tuple) -> Iterator[None]:
    """The RNG as it was before a chunk's first pass, restored to where it is now afterwards."""
    cpu, cuda = state
    with torch.random.fork_rng(devices=list(range(len(cuda)))):
        torch.set_rng_state(cpu)
        for device, s in enumerate(cuda):
            torch.cuda.set_rng_state(s, device)
        yield
