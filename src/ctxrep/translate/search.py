"""Decoding any encoder-decoder (Marian, BART / mBART, T5 / mT5): greedy search, beam search, and `translate` over
many sentences: ONE search for every family, over the methods models/seq2seq.py's `EncoderDecoder` writes down
(encode_source, init_cache, decode, project; the cache's reorder and keep).

Both searches are batched over sentences and decode one target token per step with the decoder's key/value cache
(the cross-attention keys/values are computed once per sentence; `cache.reorder` follows the beams, `cache.keep`
drops finished sentences so that later steps only compute the sentences still running). What differs between the
families' folders is read off the model, as transformers reads it off their generation_config: the tokens never
generated (`banned_ids`: Marian's pad) and whether </s> is forced at the maximum length (`forces_eos`: Marian and
BART; a T5 hypothesis still running there ends without it, its score divided by the length penalty of its length).

Beam search (Sutskever et al. 2014; as in fairseq and transformers' generate with early_stopping=True): each step
takes the 2K best continuations of the K beams of a sentence by total log-probability; an </s> among the first K
finishes a hypothesis, scored log P(Y|X) / lp(|Y|) with |Y| the target length including </s>; the K best
continuations that are not </s> go on. A sentence stops when K hypotheses have finished, or at its maximum length
(max_len_a * source length + max_len_b, at most the model's positions), where </s> is forced. Length penalties:
  "gnmt"  lp(|Y|) = ((5 + |Y|) / 6)^alpha   (Wu et al. 2016, eq. 14; the default alpha is 2.0, chosen on Multi30k
          validation so that beam 5 writes the references' lengths: the paper's 0.6 (Vaswani et al. 2017, sec. 6.1)
          wrote 12% too short; DEFAULT_LENGTH_PENALTY)
  "hf"    lp(|Y|) = |Y|^alpha               (transformers' length_penalty, fairseq's lenpen), and transformers'
          scoring of a forced </s>: log-probability 0 (its ForcedEOSTokenLogitsProcessor replaces the scores), where
          "gnmt" keeps the model's log P(</s>) as fairseq does; so "hf" with early stopping reproduces generate()
A banned token (Marian's pad, its decoder start) is never generated: its log-probability is set to -inf after the
softmax, as transformers' bad_words_ids=[[pad]] of the OPUS-MT generation configs does (the others are not
renormalised).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ctxrep.models.seq2seq import EncoderDecoder
from ctxrep.runtime.fast import Int8Linear, quantize_int8
from ctxrep.text.inputs import token_budget_batches
from ctxrep.translate.tokenizer import MTTokenizer

logger = logging.getLogger(__name__)

PENALTIES = ("gnmt", "hf")
# GNMT's alpha by default: 2.0, not the paper's 0.6. On Multi30k validation (1,014 sentences, the ten-minute model)
# beam 5 at 0.6 wrote 12% short (length ratio 0.880, +0.2 BLEU over greedy); 2.0 gives 0.968 and +1.6 BLEU, within
# 0.1 BLEU of the best alpha of the sweep (benchmarks/RESULTS.md, "Beam search's length penalty").
DEFAULT_LENGTH_PENALTY = 2.0
# Greedy search drops finished sentences from the batch (and the cache) once they are this share of it: each drop
# copies every layer's keys/values, and a finished row left in costs one row of each step's products until then.
# 0.25 against 0 (drop at every finish): 2-5% less CPU time on 500 Multi30k sentences, identical outputs.
GREEDY_DROP_SHARE = 0.25


@dataclass
class Hypothesis:
    """One finished translation: target ids without the start token and without </s>, and its score
    (log-probability including </s>, divided by the length penalty)."""

    tokens: list[int]
    score: float


def max_lengths(model: EncoderDecoder, src_mask: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """(batch,) the most target tokens (</s> included) each sentence may get: a * source length + b, at most
    the model's positions (the decoder input is the start token plus all but the last target token)."""
    src_len = src_mask.sum(dim=1).double()
    limit = (max_len_a * src_len + max_len_b).floor().long()
    return limit.clamp(min=1, max=model.max_tokens)


# The top-k of a row of logits goes by chunks of CHUNK tokens: the k largest values of a row lie in the k chunks
# with the largest maxima (each of those maxima is a distinct value at least as large as any value outside them),
# so a fast max over each chunk and a top-k over k * CHUNK values replace torch's top-k over the whole row (a partial
# sort that copies every value with its index: 2.3x slower for 131 x 8,000 log-probabilities, k = 6).
CHUNK = 64


def _row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k, dim=1) of a (rows, vocab) tensor without NaN: (values, indices), each (rows, k), largest first;
    the same, except for the order among exactly equal values."""
    rows, vocab = x.shape
    n = vocab // CHUNK
    if n < 4 * k:
        return x.topk(k, dim=1)
    chunks = x.unfold(1, CHUNK, CHUNK)  # (rows, n, CHUNK), a view; the last vocab % CHUNK tokens are the tail
    best = chunks.amax(dim=2).topk(k, dim=1).indices  # (rows, k) the chunks with the k largest maxima
    values = chunks.gather(1, best[:, :, None].expand(rows, k, CHUNK)).view(rows, k * CHUNK)
    index = (best[:, :, None] * CHUNK + torch.arange(CHUNK, device=x.device)).view(rows, k * CHUNK)
    if n * CHUNK < vocab:
        values = torch.cat([values, x[:, n * CHUNK :]], dim=1)
        tail = torch.arange(n * CHUNK, vocab, device=x.device).expand(rows, -1)
        index = torch.cat([index, tail], dim=1)
    values, j = values.topk(k, dim=1)
    return values, index.gather(1, j)


def _row_argmax(x: torch.Tensor) -> torch.Tensor:
    """(rows,) x.max(dim=1).indices of a (rows, vocab) tensor without NaN: the first of equal maxima, found
    by chunks as in `_row_topk` (the first chunk holding the row's maximum, then the first maximum in it)."""
    rows, vocab = x.shape
    n = vocab // CHUNK
    if n < 4:
        return x.max(dim=1).indices
    chunks = x.unfold(1, CHUNK, CHUNK)  # (rows, n, CHUNK)
    top, best = chunks.amax(dim=2).max(dim=1)  # (rows,) each: the row's maximum and the first chunk holding it
    within = chunks.gather(1, best[:, None, None].expand(rows, 1, CHUNK))[:, 0].max(dim=1).indices  # (rows,)
    index = best * CHUNK + within
    if n * CHUNK < vocab:
        tail_top, tail_index = x[:, n * CHUNK :].max(dim=1)
        index = torch.where(tail_top > top, n * CHUNK + tail_index, index)  # the tail comes last: only if larger
    return index


class _NextToken:
    """The decoder's next-token choices for the last tokens (rows, 1): `argmax` for greedy search, `top` for beam
    search (the k best log-probabilities of each row). The logits go into one (rows, vocab) buffer reused by every
    step of a search (rows only shrink): a fresh (rows, vocab) tensor per step, 48 MB for 1,500 beams x 8,000
    tokens, costs page faults as long as the projection itself, and so does log_softmax's output. (Projecting
    blocks of rows that stay in the cache through log_softmax and the top-k measured no faster end to end, at
    one thread, and slower at two threads on a loaded machine: more, smaller operations.)"""

    def __init__(self, model: EncoderDecoder) -> None:
        self.model = model
        self.vocab = model.output_weight().shape[0]
        self.buffer: torch.Tensor | None = None

    def _logits(self, last: torch.Tensor, cache) -> torch.Tensor:
        states = self.model.decode(last, cache, project=False).last_hidden_state[:, -1]  # (rows, d_model)
        rows = states.shape[0]
        if self.buffer is None or self.buffer.shape[0] < rows or self.buffer.dtype != states.dtype:
            self.buffer = states.new_empty(rows, self.vocab)
        return self.model.project(states, out=self.buffer[:rows])  # (rows, vocab), a prefix of the buffer

    def argmax(self, last: torch.Tensor, cache) -> torch.Tensor:
        """(rows,) the most probable next token of each row (the first of equal maxima), banned ids left out: the
        argmax of the logits, with no softmax."""
        logits = self._logits(last, cache)
        for i in self.model.banned_ids:
            logits[:, i] = float("-inf")
        return _row_argmax(logits)

    def top(
        self, last: torch.Tensor, cache, k: int, at_max: torch.Tensor, forced_eos_scores_zero: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best (log P(next token), token) of each row, each (rows, k), best first; banned ids left out, </s>
        forced on at_max rows where the model forces it (keeping its log-probability, or 0 as transformers scores
        it; their other k - 1 entries are -inf)."""
        c = self.model.config
        logits = self._logits(last, cache)
        if logits.dtype == torch.float32:
            log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: a row-wise kernel, the same numbers
        else:
            log_probs = logits.float().log_softmax(dim=-1)
        for i in self.model.banned_ids:
            log_probs[:, i] = float("-inf")
        values, indices = _row_topk(log_probs, k)
        if self.model.forces_eos and bool(at_max.any()):
            values[at_max] = float("-inf")
            values[at_max, 0] = 0.0 if forced_eos_scores_zero else log_probs[at_max, c.eos_token_id]
            indices[at_max, 0] = c.eos_token_id
        return values, indices


def _source(
    model: EncoderDecoder, src_ids: torch.Tensor, src_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    device = next(model.parameters()).device
    src_ids = src_ids.to(device)
    src_mask = torch.ones_like(src_ids) if src_mask is None else src_mask.to(device)
    return src_ids, src_mask


@torch.inference_mode()
def greedy_search(
    model: EncoderDecoder,
    src_ids: torch.Tensor,
    src_mask: torch.Tensor | None = None,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
) -> list[list[int]]:
    """The most probable next token at every step. src_ids, src_mask: (batch, src), padded on the right, each
    sentence ending with </s>. Returns each sentence's target ids, without the start token and </s> (a sentence that
    reaches its maximum length ends there: with </s> forced where the model forces it, else with its last token)."""
    c = model.config
    src_ids, src_mask = _source(model, src_ids, src_mask)
    limits = max_lengths(model, src_mask, max_len_a, max_len_b)  # (batch,)
    memory = model.encode_source(src_ids, src_mask).last_hidden_state
    cache = model.init_cache(memory, src_mask)
    batch = src_ids.shape[0]
    alive = torch.arange(batch, device=src_ids.device)  # original index of each running sentence
    tokens = src_ids.new_empty(batch, 0)  # (running, generated so far)
    last = src_ids.new_full((batch, 1), c.decoder_start_token_id)
    out: list[list[int]] = [[] for _ in range(batch)]
    next_token = _NextToken(model)
    done = torch.zeros(batch, dtype=torch.bool, device=src_ids.device)  # (running,) finished, still carried
    for step in range(int(limits.max())):
        at_max = step + 1 >= limits[alive]  # (running,)
        best = next_token.argmax(last, cache)  # (running,)
        nxt = torch.where(at_max, c.eos_token_id, best) if model.forces_eos else best  # (running,)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        finished = ((nxt == c.eos_token_id) | at_max) & ~done
        if bool(finished.any()):
            for i, row in zip(alive[finished].tolist(), tokens[finished].tolist()):
                out[i] = row[:-1] if row[-1] == c.eos_token_id else row
            done |= finished
            n_done = int(done.sum())
            if n_done == done.numel():
                break
            if n_done >= GREEDY_DROP_SHARE * done.numel():
                keep = (~done).nonzero().squeeze(1)
                alive, tokens, nxt, done = alive[keep], tokens[keep], nxt[keep], done[keep]
                cache.keep(keep)
        last = nxt[:, None]
    return out


@torch.inference_mode()
def beam_search(
    model: EncoderDecoder,
    src_ids: torch.Tensor,
    src_mask: torch.Tensor | None = None,
    beam: int = 5,
    length_penalty: float = DEFAULT_LENGTH_PENALTY,
    penalty: str = "gnmt",
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    n_best: int = 1,
) -> list[list[Hypothesis]]:
    """Beam search (module docstring). src_ids, src_mask: (batch, src), padded on the right, each sentence ending
    with </s>. Returns, per sentence, its n_best hypotheses, best first."""
    _check_beam_options(beam, n_best, penalty)
    c = model.config
    k = beam
    src_ids, src_mask = _source(model, src_ids, src_mask)
    device = src_ids.device
    batch = src_ids.shape[0]
    limits = max_lengths(model, src_mask, max_len_a, max_len_b)  # (batch,)
    longest = int(limits.max())
    memory = model.encode_source(src_ids, src_mask).last_hidden_state
    cache = model.init_cache(memory, src_mask, group=k)

    # Running state, for the sentences still running (n of them), K rows each.
    alive = torch.arange(batch, device=device)  # (n,) original index of each running sentence
    scores = torch.zeros(batch, k, device=device)  # (n, K) log P of each beam so far
    scores[:, 1:] = float("-inf")  # all beams start equal: expand only the first at step 0
    tokens = src_ids.new_empty(batch * k, 0)  # (n * K, generated so far)
    last = src_ids.new_full((batch * k, 1), c.decoder_start_token_id)
    # Finished hypotheses, per original sentence: at most K - 1 before a step, K more in it.
    pool_scores = torch.full((batch, 2 * k), float("-inf"), device=device)
    pool_tokens = src_ids.new_full((batch, 2 * k, longest), c.pad_token_id)
    pool_lengths = torch.zeros(batch, 2 * k, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.long, device=device)
    next_token = _NextToken(model)
    # The K + 1 best tokens of each beam: a sentence's K best continuations that are not </s> are among them (a
    # beam has one </s>), and so is any </s> among its K best candidates. The sum with the beam scores and the
    # second top-k then run over (n, K * (K + 1)) instead of (n, K * vocab).
    per_beam = min(k + 1, next_token.vocab)
    forced = model.forces_eos

    for step in range(longest):
        n = alive.numel()
        at_max = step + 1 >= limits[alive]  # (n,)
        log_probs, next_tokens = next_token.top(
            last, cache, per_beam, at_max.repeat_interleave(k), penalty == "hf"
        )  # (n * K, K + 1) each
        candidates = (scores[:, :, None] + log_probs.view(n, k, per_beam)).view(n, k * per_beam)  # (n, K(K+1))
        top_scores, top_index = candidates.topk(min(2 * k, k * per_beam), dim=1)  # (n, 2K)
        top_beam = torch.div(top_index, per_beam, rounding_mode="floor")  # (n, 2K) which beam it continues
        top_token = next_tokens.view(n, k * per_beam).gather(1, top_index)  # (n, 2K)
        is_eos = top_token == c.eos_token_id

        # An </s> among the first K candidates finishes a hypothesis; at the maximum length without a forced </s>,
        # so does each of the first K (transformers' stopping criteria end them there).
        ends = is_eos[:, :k] | (at_max[:, None] & ~forced)  # (n, K)
        done_now = ends & torch.isfinite(top_scores[:, :k])  # (n, K)
        if bool(done_now.any()):
            length = step + 1  # |Y|, </s> included
            lp = ((5 + length) / 6) ** length_penalty if penalty == "gnmt" else length**length_penalty
            s, j = done_now.nonzero(as_tuple=True)
            sentence = alive[s]
            slot = finished[sentence] + done_now.long().cumsum(dim=1)[s, j] - 1
            pool_scores[sentence, slot] = top_scores[s, j] / lp
            pool_tokens[sentence, slot, :step] = tokens[s * k + top_beam[s, j]]
            kept = ~is_eos[s, j]  # a hypothesis ended by the length limit keeps its last token
            pool_tokens[sentence[kept], slot[kept], step] = top_token[s, j][kept]
            pool_lengths[sentence, slot] = step + kept.long()
            finished[alive] += done_now.sum(dim=1)

        # The K best continuations that are not </s> go on.
        scores, pick = top_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)  # (n, K)
        rows = (torch.arange(n, device=device)[:, None] * k + top_beam.gather(1, pick)).view(-1)  # (n * K,)
        nxt = top_token.gather(1, pick).view(-1)  # (n * K,)
        tokens = torch.cat([tokens[rows], nxt[:, None]], dim=1)  # (n * K, step + 1)
        cache.reorder(rows)

        stop = (finished[alive] >= k) | at_max  # (n,)
        if bool(stop.all()):
            break
        if bool(stop.any()):
            keep = (~stop).nonzero().squeeze(1)  # (n',)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (n' * K,)
            alive, scores, tokens, nxt = alive[keep], scores[keep], tokens[keep_rows], nxt[keep_rows]
            cache.keep(keep)
        last = nxt[:, None]
    return _best_of_pool(pool_scores, pool_tokens, pool_lengths, n_best)


def _check_beam_options(beam: int, n_best: int, penalty: str) -> None:
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be between 1 and the beam size {beam}, got {n_best}")
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}")


def _best_of_pool(
    pool_scores: torch.Tensor, pool_tokens: torch.Tensor, pool_lengths: torch.Tensor, n_best: int
) -> list[list[Hypothesis]]:
    """Each sentence's n_best finished hypotheses, best first. pool_*: (batch, 2K, ...) as beam_search fills them."""
    batch, longest = pool_tokens.shape[0], pool_tokens.shape[2]
    order = pool_scores.argsort(dim=1, descending=True)[:, :n_best]  # (batch, n_best)
    best_scores = pool_scores.gather(1, order).tolist()
    best_lengths = pool_lengths.gather(1, order).tolist()
    best_tokens = pool_tokens.gather(1, order[:, :, None].expand(-1, -1, longest)).tolist()
    return [
        [Hypothesis(ids[:n], score) for ids, n, score in zip(best_tokens[b], best_lengths[b], best_scores[b])]
        for b in range(batch)
    ]


# ---- many sentences ---------------------------------------------------------------------------------------------


def translate_n_best(
    model: EncoderDecoder,
    tokenizer: MTTokenizer,
    sentences: Sequence[str],
    beam: int = 5,
    n_best: int = 1,
    batch_tokens: int = 4096,
    length_penalty: float = DEFAULT_LENGTH_PENALTY,
    penalty: str = "gnmt",
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    skip_long: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[list[tuple[str, float]] | None]:
    """Translate `sentences`: tokenize, sort by length, batch so that sentences x longest source <= batch_tokens,
    search, detokenize; results in input order, n_best (text, score) pairs each, best first.

    A sentence longer than the model's positions is an error naming its index (never cut short), unless
    skip_long: then its result is None and the count is logged. beam=1 is greedy search (score 0.0).
    `progress(n)` is called after each batch with the number of sentences it finished."""
    c = model.config
    if tokenizer.eos_id != c.eos_token_id or tokenizer.pad_id != c.pad_token_id:
        raise ValueError(
            f"the tokenizer's </s>/<pad> ids ({tokenizer.eos_id}, {tokenizer.pad_id}) differ from the model's "
            f"eos_token_id/pad_token_id ({c.eos_token_id}, {c.pad_token_id}); use the tokenizer the model was trained with"
        )
    ids = tokenizer.encode_source(list(sentences))
    limit = model.max_tokens
    long = [i for i, row in enumerate(ids) if len(row) > limit]
    if long and not skip_long:
        i = long[0]
        raise ValueError(
            f"sentence {i} has {len(ids[i])} tokens (with </s>), more than the model's {limit} positions"
            + (f" (and {len(long) - 1} more sentences are too long)" if len(long) > 1 else "")
            + "; shorten or split it, or skip such sentences with skip_long=True (--skip-long)"
        )
    if long:
        logger.warning(
            "skipped %d sentences longer than the model's %d positions (first: %d)", len(long), limit, long[0]
        )
    skipped = set(long)
    lengths = [len(row) for row in ids]
    order = sorted((i for i in range(len(ids)) if i not in skipped), key=lambda i: lengths[i])
    results: list[list[tuple[str, float]] | None] = [None] * len(ids)
    was_training = model.training
    model.eval()
    try:
        starts = [0, *itertools.accumulate(token_budget_batches([lengths[i] for i in order], batch_tokens))]
        for group in (order[a:b] for a, b in zip(starts, starts[1:])):
            longest = max(lengths[i] for i in group)
            src = torch.full((len(group), longest), c.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(src)
            for r, i in enumerate(group):
                src[r, : lengths[i]] = torch.tensor(ids[i])
                mask[r, : lengths[i]] = 1
            if beam == 1 and n_best == 1:
                hyps = [[Hypothesis(t, 0.0)] for t in greedy_search(model, src, mask, max_len_a, max_len_b)]
            else:
                hyps = beam_search(model, src, mask, beam, length_penalty, penalty, max_len_a, max_len_b, n_best)
            for i, found in zip(group, hyps):
                texts = tokenizer.decode_batch([h.tokens for h in found])
                results[i] = [(text, h.score) for text, h in zip(texts, found)]
            if progress is not None:
                progress(len(group))
    finally:
        model.train(was_training)
    return results


def translate(
    model: EncoderDecoder,
    tokenizer: MTTokenizer,
    sentences: Sequence[str],
    beam: int = 5,
    batch_tokens: int = 4096,
    length_penalty: float = DEFAULT_LENGTH_PENALTY,
    penalty: str = "gnmt",
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    skip_long: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[str | None]:
    """The best translation of each sentence, in input order (None for a sentence skipped by skip_long);
    see `translate_n_best` for the arguments."""
    found = translate_n_best(
        model,
        tokenizer,
        sentences,
        beam=beam,
        n_best=1,
        batch_tokens=batch_tokens,
        length_penalty=length_penalty,
        penalty=penalty,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        skip_long=skip_long,
        progress=progress,
    )
    return [None if f is None else f[0][0] for f in found]


def quantize_translator(model: EncoderDecoder) -> EncoderDecoder:
    """A copy of `model` (any encoder-decoder, eval mode) that decodes in int8: every nn.Linear of the encoder and
    decoder becomes ctxrep.runtime.fast's `Int8Linear` (int8 weights per output channel, activations quantized on
    each call with one scale per row: per_row=True, as a call's rows are the batch's sentences or beams), and so does
    the output projection (`int8_projection`, from the output weights with the model's output_scale folded in; the
    embeddings themselves stay float32).
    No SmoothQuant calibration (fast.quantize_int8 with no batches: every smoothing scale is 1), as CTranslate2's
    compute_type="int8" quantizes weights per row and activations on the fly. CPU only."""
    keep = ("lm_head",) if model.lm_head is not None else ()  # projected by int8_projection below instead
    quantized = quantize_int8(model, [], keep_float=keep, per_row=True)  # uncalibrated: no smoothing pass per call
    weight = model.output_weight().detach().float() * model.output_scale  # (target vocab, d_model), scale folded in
    bias = model.output_bias()
    projection = nn.Linear(weight.shape[1], weight.shape[0], device="meta")  # no RNG draw, no allocation
    projection.weight = nn.Parameter(weight)
    projection.bias = nn.Parameter(weight.new_zeros(weight.shape[0]) if bias is None else bias.detach().float().clone())
    quantized.int8_projection = Int8Linear(projection, per_row=True)
    return quantized
