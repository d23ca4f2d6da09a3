"""T5's span corruption (Raffel et al. 2020, sec. 3.1.4 and 3.3.4): drop random spans of a row, each replaced in the
input by one sentinel token; the target is the dropped spans, each after its sentinel.

    "Thank you for inviting me to your party last week ."
    input   Thank you <X> me to your party <Y> week . </s>          target   <X> for inviting <Y> last <Z> </s>

noise_density 0.15 of the tokens in spans of mean length 3 (`random_spans_noise_mask`: the noise and non-noise
tokens each cut into the same number of segments at random, interleaved, non-noise first); sentinels counted down
from the end of the vocabulary (<extra_id_0> = vocab_size - 1, <extra_id_1> = vocab_size - 2, ...), as T5's
SentencePiece vocabularies and transformers' run_t5_mlm_flax.py number them. The raw rows are longer than the
model's inputs so that the input after corruption is exactly [data] max_length: `input_and_target_lengths`
(T5's compute_input_and_target_lengths; 512 inputs -> 568 raw tokens, 114 target tokens).

The noise runs on the batches' rows in numpy (`SpanCorruptionPacker`, seeded by the run's seed and the batch's step:
a resumed run draws the same), never with the global torch RNG. Labels are the target; the decoder starts with
<pad> (T5's decoder_start_token_id) and reads the target shifted right (models/seq2seq.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctxrep.data.corpus import PackedCorpus
from ctxrep.data.packing import FullSentencesConfig, FullSentencesPacker
from ctxrep.models.t5 import T5Config, T5ForConditionalGeneration
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import CORE_SHAPE, Built, Ingredients, Packing, PretrainError, Recipe
from ctxrep.text.tokenizer import Tokenizer

SENTINELS = 100  # T5's extra_ids: <extra_id_0> .. <extra_id_99>, the last entries of the vocabulary


@dataclass
class SpanCorruptionSettings:
    """[objective] keys of `span-corruption`: T5's defaults."""

    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0

    def check(self, source: str) -> None:
        if not 0.0 < self.noise_density < 1.0:
            raise PretrainError(f"[objective] noise_density={self.noise_density} in {source} must be in (0, 1)")
        if self.mean_noise_span_length < 1:
            raise PretrainError(
                f"[objective] mean_noise_span_length={self.mean_noise_span_length} in {source} must be at least 1"
            )


def _lengths_after(tokens: int, density: float, mean_span: float) -> tuple[int, int]:
    noise = int(round(tokens * density))
    spans = int(round(noise / mean_span))
    return tokens - noise + spans + 1, noise + spans + 1  # inputs, targets (each with its </s>)


def input_and_target_lengths(inputs_length: int, density: float, mean_span: float) -> tuple[int, int]:
    """(raw tokens per row, target length) such that corrupting the row gives exactly inputs_length input tokens
    (T5's compute_input_and_target_lengths): the most raw tokens whose input still fits."""
    tokens = inputs_length
    while _lengths_after(tokens + 1, density, mean_span)[0] <= inputs_length:
        tokens += 1
    inputs, targets = _lengths_after(tokens, density, mean_span)
    if density == 0.5 and targets > inputs:  # T5's hack: targets as long as the (round) inputs
        tokens, targets = tokens - 1, targets - 1
    return tokens, targets


def random_spans_noise_mask(length: int, density: float, mean_span: float, rng) -> np.ndarray:
    """(length,) bool, True at noise: round(length x density) noise tokens (at least 1, at most length - 1) in
    round(noise / mean_span) spans (at least 1), noise and non-noise each cut into that many segments at random,
    interleaved, non-noise first (T5's random_spans_noise_mask). rng: a numpy Generator or RandomState (whose
    permutation draws what T5's np.random.shuffle draws)."""
    noise = min(max(int(round(length * density)), 1), length - 1)
    spans = max(int(round(min(noise, length - noise) / mean_span)), 1)

    def segments(items: int) -> np.ndarray:  # `items` cut into `spans` non-empty segments at random
        first = np.zeros(items, bool)
        first[1:] = rng.permutation(np.arange(items - 1) < spans - 1)
        return np.bincount(np.cumsum(first), minlength=spans)

    noise_lengths = segments(noise)  # drawn first, as T5's helper draws them
    interleaved = np.stack([segments(length - noise), noise_lengths], axis=1).reshape(-1)  # (2 spans,)
    starts = np.zeros(length, np.int64)
    starts[np.cumsum(interleaved)[:-1]] = 1
    return np.cumsum(starts) % 2 == 1


def corrupt(row: np.ndarray, noise: np.ndarray, vocab_size: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(input, target) of a raw row and its noise mask: each noise span -> one sentinel in the input, each non-noise
    span -> one sentinel in the target (sentinels vocab_size - 1, - 2, ... in order), </s> ending each."""

    def keep(drop: np.ndarray) -> np.ndarray:
        start = drop & ~np.r_[False, drop[:-1]]  # the first token of each dropped span
        sentinel = vocab_size - np.cumsum(start)  # the span's sentinel, counted down from the vocabulary's end
        out = np.where(start, sentinel, row)[~drop | start]
        return np.r_[out, eos_id].astype(np.int64)

    return keep(noise), keep(~noise)


class SpanCorruptionPacker(FullSentencesPacker):
    """FULL-SENTENCES rows of the raw length (`input_and_target_lengths` of [data] max_length) plus </s>, corrupted
    into input_ids / attention_mask and labels (-100 at padding). The noise of a batch comes from
    np.random.default_rng([seed, step])."""

    kind = "span_corruption"

    def __init__(
        self, corpus: PackedCorpus, config: FullSentencesConfig, tokenizer: Tokenizer, settings: SpanCorruptionSettings
    ) -> None:
        super().__init__(corpus, config, tokenizer)
        self.settings = settings
        self.eos_id = tokenizer.backend.token_to_id("</s>")
        self.vocab_size = tokenizer.vocab_size

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.step])
        rows = [self.next_instance()["input_ids"][:-1] for _ in range(batch_size)]  # without the template's </s>
        self.step += 1
        s = self.settings
        pairs = [
            corrupt(
                r,
                random_spans_noise_mask(len(r), s.noise_density, s.mean_noise_span_length, rng),
                self.vocab_size,
                self.eos_id,
            )
            for r in rows
        ]
        batch = self._collate([{"input_ids": a} for a, _ in pairs])
        targets = self._collate([{"input_ids": b} for _, b in pairs])
        batch["labels"] = np.where(targets["attention_mask"] == 1, targets["input_ids"], -100)
        return batch


def span_corruption_rows(corpus: PackedCorpus, tokenizer: Tokenizer, plan: Packing) -> SpanCorruptionPacker:
    s = plan.settings
    raw, _ = input_and_target_lengths(plan.max_length, s.noise_density, s.mean_noise_span_length)
    warmup = plan.warmup
    if warmup is not None:
        short, _ = input_and_target_lengths(warmup.max_length, s.noise_density, s.mean_noise_span_length)
        warmup = type(warmup)(short + 1, warmup.steps)
    config = FullSentencesConfig(raw + 1, plan.seed, warmup, plan.separator_id)  # + the template's </s>
    return SpanCorruptionPacker(corpus, config, tokenizer, s)


# ---- the objective ------------------------------------------------------------------------------------------------


class SpanCorruptionObjective(nn.Module):
    """T5ForConditionalGeneration trained on span corruption (cross-entropy over the real target tokens)."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.model = T5ForConditionalGeneration(config)

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
        """A whole-T5 folder (transformers' T5ForConditionalGeneration loads it)."""
        self.model.save_pretrained(path)


# ------------------------------------------------------------------------------------------------- recipe


def add_t5_template(out: Path) -> None:
    """Give a trained byte-level BPE tokenizer T5's template (A </s>) and its sentinels <extra_id_0> ..
    <extra_id_99> as the last entries, <extra_id_0> last (counted down from the end of the vocabulary)."""
    from tokenizers import AddedToken, processors
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(f"<extra_id_{i}>", special=True) for i in reversed(range(SENTINELS))])
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)]
    )
    tok.save(str(out / "tokenizer.json"))
    settings_file = out / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    settings.update(extra_ids=SENTINELS, model_input_names=["input_ids", "attention_mask"])
    settings_file.write_text(json.dumps(settings, indent=2) + "\n")


def t5_config(x: Ingredients) -> T5Config:
    """[encoder] onto T5Config (T5 v1.1's gated-gelu, as many decoder as encoder layers), with the tokenizer's
    <pad> as pad and decoder start and </s> as eos."""
    s, backend = x.shape, x.tokenizer.backend
    if s.hidden_size % s.num_attention_heads:
        raise PretrainError(
            f"[encoder] hidden_size={s.hidden_size} in {x.source} is not a multiple of num_attention_heads="
            f"{s.num_attention_heads}"
        )
    return T5Config(
        vocab_size=x.vocab_size,
        d_model=s.hidden_size,
        d_kv=s.hidden_size // s.num_attention_heads,
        d_ff=s.intermediate_size,
        num_layers=s.num_hidden_layers,
        num_decoder_layers=s.num_hidden_layers,
        num_heads=s.num_attention_heads,
        dropout_rate=s.hidden_dropout_prob,
        initializer_factor=1.0,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=x.tokenizer.pad_token_id,
        eos_token_id=backend.token_to_id("</s>"),
    )


def build_span_corruption(x: Ingredients) -> Built:
    x.settings.check(x.source)
    if x.tokenizer.backend.token_to_id(f"<extra_id_{SENTINELS - 1}>") != x.vocab_size - SENTINELS:
        raise PretrainError(
            f"span-corruption needs the sentinels <extra_id_0> .. <extra_id_{SENTINELS - 1}> as the last "
            "entries of the vocabulary (the tokenizer this recipe trains); train a new tokenizer"
        )
    return Built(SpanCorruptionObjective(t5_config(x)), None)  # relative positions: any length


# T5: span corruption over FULL-SENTENCES rows, with a byte-level BPE tokenizer and T5's sentinels.
SPAN_CORRUPTION = Recipe(
    "span-corruption",
    build_span_corruption,
    SpanCorruptionSettings,
    CORE_SHAPE,
    tokenizer_kinds=("bpe",),
    tokenizer_template=add_t5_template,
    template_tokens=SENTINELS,
    packing=span_corruption_rows,
)
