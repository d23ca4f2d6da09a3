"""BART's denoising objective (Lewis et al. 2019, sec. 2.2): corrupt a document, reconstruct the original.

    source = rotate(insert(infill(permute(document))))          target = document
    L = -1/N sum_t log P(target_t | target_<t, source)          (the decoder, teacher-forced; models/bart.py)

The noise, as the released bart-base / bart-large runs set fairseq's DenoisingDataset (`DenoisingSettings`'s
defaults: --mask 0.3 --mask-random 0.1 --poisson-lambda 3.5 --permute-sentences 1.0 --replace-length 1
--rotate 0.0 --insert 0.0; fairseq's *task* default --rotate 0.5 is a trap: the released models were not trained
with document rotation, and half of all rows would start mid-document):

    permute      the row's sentences (the packed corpus's own sentence boundaries, carried by the packer) in a random
                 order; a fraction permute_sentences of them take part. A corpus whose documents are single
                 sentences (no sentence ends) makes this a no-op: `denoising_rows` warns, never silently
    infill       text infilling over whole words: span lengths ~ Poisson(poisson_lambda) in words, drawn until
                 ceil(mask_ratio x words) are covered (the last one trimmed to the budget); each span of length >= 1
                 becomes ONE <mask> (replace_length 1), or a random token for a fraction mask_random of the spans;
                 a span of length 0 inserts a <mask> (a zero-length span). Spans are placed without overlapping
                 (fairseq's random starts may overlap, masking fewer words than the ratio: about 0.26 of 0.3), so the
                 masked share of word starts is the ratio
    insert       ceil(insert x length) <mask> (or random) tokens inserted at random places
    rotate       with probability `rotate`, the row rotated to start at a random token (<s> and </s> stay)

The noise runs on the batches' rows in numpy (`DenoisingPacker`, from a numpy Generator seeded by the run's seed and
the batch's step, so that a resumed run draws the same noise), never with the global torch RNG. The decoder starts
with </s> (decoder_start_token_id = eos, transformers' shift_tokens_right): labels are the original row and the
decoder input is the labels shifted right (models/seq2seq.py), the start token BART's checkpoints were trained with
(transformers #18773: a wrong one gives NaN losses).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.data.corpus import PackedCorpus
from ctxrep.data.packing import FullSentencesConfig, FullSentencesPacker
from ctxrep.models.bart import BartConfig, BartForConditionalGeneration
from ctxrep.objectives.masked_lm import word_start_table
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import CORE_SHAPE, Built, Ingredients, Packing, PretrainError, Recipe
from ctxrep.text.tokenizer import Tokenizer


@dataclass
class DenoisingSettings:
    """[objective] keys of `denoising`, fairseq's names; the defaults are the released bart-base / large runs'."""

    mask_ratio: float = 0.3  # --mask: share of words in masked spans
    poisson_lambda: float = 3.5  # --poisson-lambda: mean span length in words
    mask_random: float = 0.1  # --mask-random: share of spans replaced by a random token instead of <mask>
    permute_sentences: float = 1.0  # --permute-sentences: share of a row's sentences shuffled
    rotate: float = 0.0  # --rotate: probability of rotating a row (fairseq's task default 0.5 is a trap)
    insert: float = 0.0  # --insert: inserted noise tokens, a share of the row's length

    def check(self, source: str) -> None:
        for name in ("mask_ratio", "mask_random", "permute_sentences", "rotate", "insert"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise PretrainError(f"[objective] {name}={value} in {source} must be between 0 and 1")
        if self.poisson_lambda <= 0:
            raise PretrainError(f"[objective] poisson_lambda={self.poisson_lambda} in {source} must be positive")


@dataclass
class NoiseVocabulary:
    """What the noise needs of the tokenizer: <mask>, the range random tokens are drawn from (specials excluded),
    and which pieces begin a word."""

    mask_id: int
    first_random: int  # random tokens are drawn from [first_random, vocab_size)
    vocab_size: int
    word_start: np.ndarray  # (vocab,) bool
    special: np.ndarray  # (vocab,) bool: never masked, never a word


def noise_vocabulary(tokenizer: Tokenizer) -> NoiseVocabulary:
    mask_id = tokenizer.backend.token_to_id("<mask>")
    if mask_id is None:
        raise PretrainError("denoising needs a <mask> token in the tokenizer; train a bpe tokenizer ([tokenizer] kind)")
    n = tokenizer.vocab_size
    special = np.zeros(n, bool)
    special[list(tokenizer.backend.get_added_tokens_decoder())] = True
    return NoiseVocabulary(
        mask_id, int(special.nonzero()[0].max()) + 1, n, word_start_table(tokenizer).numpy(), special
    )


# ---- the noise, one row at a time ---------------------------------------------------------------------------------


def permute_sentences(row: np.ndarray, sentence: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """The tokens between the row's first and last (<s> ... </s>) with `share` of its sentences in a random order.
    sentence: (len,) each token's sentence number in the row (-1 outside any: specials and separators, which go with
    the sentence before them)."""
    inner, ids = row[1:-1], sentence[1:-1].copy()
    for i in range(1, len(ids)):  # a separator travels with the sentence it ends
        if ids[i] < 0:
            ids[i] = ids[i - 1]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, np.int64)
    n = len(starts)
    if n < 2 or share <= 0:
        return row
    pieces = np.split(inner, starts[1:])
    k = math.ceil(n * share)  # fairseq: ceil(num_sentences * 2 * p / 2)
    chosen = rng.permutation(n)[:k]
    order = np.arange(n)
    order[chosen] = chosen[rng.permutation(k)]
    return np.concatenate([row[:1], *(pieces[i] for i in order), row[-1:]])


def span_lengths(words: int, ratio: float, poisson_lambda: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson(lambda) span lengths (in words) drawn until ceil(ratio x words) are covered, the last one trimmed to
    the budget (fairseq's add_whole_word_mask); zero-length spans included."""
    budget = math.ceil(words * ratio)
    if budget == 0:
        return np.zeros(0, np.int64)
    lengths = rng.poisson(poisson_lambda, size=budget)
    while lengths.sum() < budget:
        lengths = np.concatenate([lengths, rng.poisson(poisson_lambda, size=budget)])
    total = np.cumsum(lengths)
    last = int(np.searchsorted(total, budget))  # the first span reaching the budget
    lengths = lengths[: last + 1].copy()
    lengths[last] = budget - (total[last - 1] if last > 0 else 0)
    return lengths


def infill(row: np.ndarray, settings: DenoisingSettings, vocab: NoiseVocabulary, rng: np.random.Generator):
    """Text infilling over whole words (module docstring): (noised row, masked (len,) bool over the input row, the
    word starts that were masked). The first and last tokens and special tokens are never masked."""
    starts = vocab.word_start[row] & ~vocab.special[row]
    starts[0] = starts[-1] = False
    word_at = np.flatnonzero(starts)  # the token index of each word start
    n = len(word_at)
    lengths = span_lengths(n, settings.mask_ratio, settings.poisson_lambda, rng)
    inserts = int((lengths == 0).sum())
    lengths = lengths[lengths > 0]
    m = len(lengths)
    masked = np.zeros(len(row), bool)
    keep = np.ones(len(row), bool)
    out = row.copy()
    if m:
        # non-overlapping placement: the n - masked unmasked words and the m spans in a random order
        free = n - int(lengths.sum())
        if free + 1 < m:  # more spans than gaps (a very short row): spans may touch
            gaps = np.sort(rng.choice(free + m, size=m, replace=False)) - np.arange(m)
        else:
            gaps = np.sort(rng.choice(free + 1, size=m, replace=False))  # spans after `gaps` unmasked words
        first_word = gaps + np.r_[0, np.cumsum(lengths)[:-1]]  # word index where each span starts
        # the token span of words [w, w + L): from word_at[w] to the next word start (or a special token) after it
        bounds = np.r_[word_at, len(row) - 1]
        special_at = np.flatnonzero(vocab.special[row])
        random_span = rng.random(m) < settings.mask_random
        for w, length, is_random in zip(first_word.tolist(), lengths.tolist(), random_span.tolist()):
            a = bounds[w]
            b = bounds[min(w + length, n)]
            nxt = special_at[special_at > a]
            b = min(b, int(nxt[0])) if len(nxt) else b
            masked[a:b] = True
            keep[a + 1 : b] = False
            out[a] = rng.integers(vocab.first_random, vocab.vocab_size) if is_random else vocab.mask_id
    out = out[keep]
    if inserts:
        out = insert_noise(out, inserts, settings.mask_random, vocab, rng)
    return out, masked, starts & masked


def insert_noise(
    row: np.ndarray, count: int, random_share: float, vocab: NoiseVocabulary, rng: np.random.Generator
) -> np.ndarray:
    """`count` noise tokens (<mask>, or a random token for `random_share` of them) inserted at random places between
    the row's first and last tokens (fairseq's add_insertion_noise)."""
    if count == 0:
        return row
    n = len(row) + count
    places = np.sort(rng.choice(n - 2, size=count, replace=False)) + 1  # never first or last
    noise = np.full(count, vocab.mask_id, row.dtype)
    random = rng.random(count) < random_share
    noise[random] = rng.integers(vocab.first_random, vocab.vocab_size, size=int(random.sum()))
    out = np.empty(n, row.dtype)
    is_noise = np.zeros(n, bool)
    is_noise[places] = True
    out[is_noise] = noise
    out[~is_noise] = row
    return out


def rotate(row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The row between its first and last tokens rotated to start at a random token (fairseq's add_rolling_noise)."""
    inner = row[1:-1]
    if len(inner) < 2:
        return row
    offset = int(rng.integers(1, len(inner)))
    return np.concatenate([row[:1], inner[offset:], inner[:offset], row[-1:]])


def noise_row(
    row: np.ndarray, sentence: np.ndarray, settings: DenoisingSettings, vocab: NoiseVocabulary, rng: np.random.Generator
) -> np.ndarray:
    """A row's source: permute, infill, insert, rotate (module docstring); the target is `row` itself."""
    source = permute_sentences(row, sentence, settings.permute_sentences, rng)
    source, _, _ = infill(source, settings, vocab, rng)
    if settings.insert > 0:
        source = insert_noise(source, math.ceil(len(source) * settings.insert), settings.mask_random, vocab, rng)
    if settings.rotate > 0 and rng.random() < settings.rotate:
        source = rotate(source, rng)
    return source


# ---- the batches ----------------------------------------------------------------------------------------------------


class DenoisingPacker(FullSentencesPacker):
    """FULL-SENTENCES rows (RoBERTa's), each with its tokens' sentence numbers, noised into (source, target) pairs:
    input_ids / attention_mask the source, labels the original row (-100 at padding). The noise of a batch comes
    from np.random.default_rng([seed, step]): a resumed run (the packer's state) draws the same."""

    kind = "denoising"

    def __init__(
        self, corpus: PackedCorpus, config: FullSentencesConfig, tokenizer: Tokenizer, settings: DenoisingSettings
    ) -> None:
        super().__init__(corpus, config, tokenizer)
        self.settings = settings
        self.vocab = noise_vocabulary(self.tokenizer)

    def _materialise(self, position: int) -> dict[str, np.ndarray]:
        instance = super()._materialise(position)
        plan, t = self._plan, self.template
        sentence = [np.full(len(t.prefix), -1)]
        k = plan.order[position]
        offsets = self.corpus.sentence_offsets
        for r in range(plan.sequence_offsets[k], plan.sequence_offsets[k + 1]):
            if r > plan.sequence_offsets[k]:
                sentence.append(np.full(1, -1))
            start, end = plan.runs[r]
            sentence.append(np.searchsorted(offsets, np.arange(start, end), side="right") - 1)
        sentence.append(np.full(len(t.single_suffix), -1))
        instance["sentence"] = np.concatenate(sentence).astype(np.int64)
        return instance

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.step])
        instances = [self.next_instance() for _ in range(batch_size)]
        self.step += 1
        sources = [noise_row(x["input_ids"], x["sentence"], self.settings, self.vocab, rng) for x in instances]
        batch = self._collate([{"input_ids": s} for s in sources])
        targets = self._collate(instances)
        batch["labels"] = np.where(targets["attention_mask"] == 1, targets["input_ids"], -100)
        return batch


def denoising_rows(corpus: PackedCorpus, tokenizer: Tokenizer, plan: Packing) -> DenoisingPacker:
    """The recipe's packing; warns when sentence permutation can do nothing (no document has two sentences)."""
    settings = plan.settings
    if settings.permute_sentences > 0 and corpus.num_sentences <= corpus.num_documents:
        warnings.warn(
            f"{corpus.path}: no document has more than one sentence, so permute_sentences="
            f"{settings.permute_sentences} shuffles nothing; give a corpus with sentence ends (one sentence a line, "
            "documents between blank lines) or set --objective.permute_sentences 0",
            stacklevel=2,
        )
    config = FullSentencesConfig(plan.max_length, plan.seed, plan.warmup, plan.separator_id)
    return DenoisingPacker(corpus, config, tokenizer, settings)


# ---- the objective ------------------------------------------------------------------------------------------------


class DenoisingObjective(nn.Module):
    """BartForConditionalGeneration trained to reconstruct the original rows (cross-entropy over the real target
    tokens, through the model's seq2seq_loss: only real tokens are projected onto the vocabulary)."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.config = config
        self.model = BartForConditionalGeneration(config)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        labels = batch["labels"]
        loss, nll, tokens = self.model.seq2seq_loss(
            batch["input_ids"], batch["attention_mask"], self.model.shift_right(labels), labels
        )
        tokens = max(tokens, 1)
        value = float(nll) / tokens
        return ObjectiveOutput(
            loss / tokens, int(batch["attention_mask"].sum()) + tokens, {"lm_loss": value}, nll=value
        )

    def save_pretrained(self, path: str | Path) -> None:
        """A BART folder (transformers' BartForConditionalGeneration loads it)."""
        self.model.save_pretrained(path)


# ------------------------------------------------------------------------------------------------- recipe


def bart_config(x: Ingredients) -> BartConfig:
    """[encoder] onto BartConfig (as many decoder as encoder layers, bart-base's shape rule), with the bpe
    tokenizer's <s> <pad> </s> at 0, 1, 2 as BART's."""
    s, backend = x.shape, x.tokenizer.backend
    eos = backend.token_to_id("</s>")
    return BartConfig(
        vocab_size=x.vocab_size,
        d_model=s.hidden_size,
        encoder_layers=s.num_hidden_layers,
        decoder_layers=s.num_hidden_layers,
        encoder_attention_heads=s.num_attention_heads,
        decoder_attention_heads=s.num_attention_heads,
        encoder_ffn_dim=s.intermediate_size,
        decoder_ffn_dim=s.intermediate_size,
        activation_function=s.hidden_act,
        dropout=s.hidden_dropout_prob,
        attention_dropout=s.attention_probs_dropout_prob,
        max_position_embeddings=s.max_position_embeddings,
        init_std=s.initializer_range,
        pad_token_id=x.tokenizer.pad_token_id,
        bos_token_id=backend.token_to_id("<s>"),
        eos_token_id=eos,
        decoder_start_token_id=eos,
        forced_eos_token_id=eos,
    )


def build_denoising(x: Ingredients) -> Built:
    x.settings.check(x.source)
    noise_vocabulary(x.tokenizer)  # a tokenizer without <mask> is refused before any work
    config = bart_config(x)
    return Built(DenoisingObjective(config), config.max_position_embeddings)


# BART: denoising over FULL-SENTENCES rows, with a byte-level BPE tokenizer (<s> <pad> </s> <unk> <mask>).
DENOISING = Recipe(
    "denoising",
    build_denoising,
    DenoisingSettings,
    (*CORE_SHAPE, "hidden_act", "attention_probs_dropout_prob", "max_position_embeddings"),
    tokenizer_kinds=("bpe",),
    packing=denoising_rows,
)
