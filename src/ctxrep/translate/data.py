"""Parallel text for machine translation: reading, a joint subword vocabulary, token-budget batches.

    corpus = read_parallel("train.en", "train.de")             # aligned lines; empty pairs skipped, counted
    tok = train_joint_tokenizer([corpus.src, corpus.tgt], 8000, "runs/mt")   # runs/mt/tokenizer.json
    pairs = encode_pairs(corpus, MTTokenizer.from_model_dir("runs/mt"), max_positions=256)  # ids with </s>
    batches = TokenBatches(pairs, pad_id=0, seed=0)
    batch = batches.next_batch(4096)                             # rows x longest side <= 4096 tokens

Files are read as UTF-8 (a BOM on the first line and CRLF line ends are accepted); a line that is not valid
UTF-8 is an error naming file:line. Line numbers are always those of the files (1-based), also after empty
pairs were skipped, so every later message (a pair too long for the model) points at the real line.

The vocabulary is shared by source and target (the paper's shared source-target vocabulary, sec. 5.1), with
`<pad>`, `</s>`, `<unk>` at ids 0, 1, 2 and the post-processor "$A </s>" (Marian appends </s> to both sides).
Pre-tokenization is SentencePiece-style (Metaspace: a space becomes "▁" at the start of the next piece), so
decoding gives the detokenized text back. Ids are the same in every process: the BPE trainer of the
`tokenizers` version in use is deterministic, and the unigram trainer's scores (summed in parallel, in hash
order) are rounded and the pieces sorted by (-score, piece) before the file is written.

Batches follow fairseq's token budget: pairs are sorted by length (ties in a seeded random order) and cut
greedily into batches of at most `budget` tokens counted as rows x max(longest source, longest target), so
little padding is computed; the batches of an epoch are then visited in a seeded random order. Every draw
comes from a local `numpy.random.Generator` seeded with (seed, epoch), never from the global RNG, and
`state_dict()` is (epoch, batches done): a resumed run sees the same batches as one that never stopped.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import (
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from ctxrep.util.files import utf8_lines

logger = logging.getLogger(__name__)

SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
TOKENIZER_KINDS = ("bpe", "unigram")
IGNORE_INDEX = -100  # label of a padding position (torch's cross_entropy default)


class DataError(ValueError):
    """Parallel text that cannot be used as it is, with file:line and what to do."""


# ------------------------------------------------------------------------------------------ reading


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without line ends; an invalid line is an error naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; check the path")
    return decode_lines(path.read_bytes(), str(path))


def decode_lines(data: bytes, name: str) -> list[str]:
    """UTF-8 bytes -> lines (a BOM and CRLF accepted; ctxrep.util.files.utf8_lines); `name` is the file (or "<stdin>")
    named in errors."""
    return [text for _, text in utf8_lines(io.BytesIO(data), name, error=DataError)]


@dataclass
class ParallelCorpus:
    """Aligned sentence pairs and the 1-based line each came from (the same line in both files)."""

    src: list[str]
    tgt: list[str]
    lines: list[int]
    src_path: str = "<source>"
    tgt_path: str = "<target>"
    skipped_empty: int = 0  # pairs with an empty (or blank) side, left out
    first_empty_line: int = 0  # the first of them; 0 = none

    def __len__(self) -> int:
        return len(self.src)


def read_parallel(src: str | Path, tgt: str | Path) -> ParallelCorpus:
    """Line-aligned source and target files. A pair with a blank side is skipped and counted; files of
    different lengths are an error saying where the shorter one ends."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        (short, n_short), (long, n_long) = sorted([(src, len(src_lines)), (tgt, len(tgt_lines))], key=lambda x: x[1])
        raise DataError(
            f"{short} ends at line {n_short} but {long} has {n_long} lines (line {n_short + 1} has no partner); "
            "source and target files must have one sentence per line, aligned line by line"
        )
    corpus = ParallelCorpus([], [], [], str(src), str(tgt))
    for number, (s, t) in enumerate(zip(src_lines, tgt_lines), start=1):
        if not s.strip() or not t.strip():
            corpus.skipped_empty += 1
            corpus.first_empty_line = corpus.first_empty_line or number
            continue
        corpus.src.append(s.strip())
        corpus.tgt.append(t.strip())
        corpus.lines.append(number)
    if not corpus.src:
        raise DataError(
            f"{src} and {tgt} hold no sentence pair ({corpus.skipped_empty} empty line(s)); check the paths"
        )
    if corpus.skipped_empty:
        logger.warning(
            "%s / %s: skipped %d pair(s) with an empty side (the first at line %d)",
            src,
            tgt,
            corpus.skipped_empty,
            corpus.first_empty_line,
        )
    return corpus


# --------------------------------------------------------------------------------------- vocabulary


def train_joint_tokenizer(
    texts: Sequence[Sequence[str]],
    vocab_size: int,
    out_dir: str | Path,
    kind: Literal["bpe", "unigram"] = "bpe",
    min_frequency: int = 2,
) -> HFTokenizer:
    """Train one subword vocabulary on all of `texts` (e.g. [source sentences, target sentences]) and save
    out_dir/tokenizer.json and tokenizer_config.json; returns the tokenizer as saved."""
    if kind not in TOKENIZER_KINDS:
        raise DataError(f"tokenizer kind {kind!r} is not known; use 'bpe' or 'unigram'")
    if vocab_size < len(SPECIALS) + 1:
        raise DataError(f"vocab_size={vocab_size} is too small: the vocabulary needs {len(SPECIALS)} specials + pieces")
    if kind == "bpe":
        tok = HFTokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
        )
    else:
        tok = HFTokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIALS), unk_token="<unk>", show_progress=False
        )
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator((line for text in texts for line in text), trainer=trainer)
    ids = [tok.token_to_id(s) for s in SPECIALS]
    if ids != [PAD_ID, EOS_ID, UNK_ID]:
        raise RuntimeError(f"special tokens {SPECIALS} got ids {ids}, expected 0, 1, 2")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS_ID)])
    if kind == "unigram":
        tok = _canonical_unigram(tok)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_input_names": ["input_ids", "attention_mask"],
        "pad_token": "<pad>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return HFTokenizer.from_file(str(out / "tokenizer.json"))


def _canonical_unigram(tok: HFTokenizer) -> HFTokenizer:
    """The unigram trainer's scores differ in the last bits between processes (floating-point sums in hash
    order), and so may the order of the pieces: round the scores, sort the pieces by (-score, piece)."""
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    specials, pieces = vocab[: len(SPECIALS)], vocab[len(SPECIALS) :]
    pieces = sorted(([p, round(s, 8)] for p, s in pieces), key=lambda ps: (-ps[1], ps[0]))
    spec["model"]["vocab"] = specials + pieces
    return HFTokenizer.from_str(json.dumps(spec))


# ------------------------------------------------------------------------------------- encoded pairs


@dataclass
class EncodedPairs:
    """Token ids of each pair, both sides ending in </s>, with the pair's line in the files."""

    src: list[np.ndarray]
    tgt: list[np.ndarray]
    lines: np.ndarray
    skipped_long: int = 0
    first_long_line: int = 0
    src_lengths: np.ndarray = field(init=False)
    tgt_lengths: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.src_lengths = np.array([len(s) for s in self.src], dtype=np.int64)
        self.tgt_lengths = np.array([len(t) for t in self.tgt], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.src)

    @property
    def num_tokens(self) -> int:
        """Target tokens (with </s>): what the loss is summed over."""
        return int(self.tgt_lengths.sum())


def encode_pairs(corpus: ParallelCorpus, tokenizer, max_positions: int, skip_long: bool = False) -> EncodedPairs:
    """Encode both sides with an MTTokenizer (ctxrep.translate.tokenizer: encode_source / encode_target, </s>
    appended). A side with more than `max_positions` ids (</s> included; the decoder's input is as long as its
    labels) is an error naming file:line, or with skip_long=True left out and counted."""
    src = tokenizer.encode_source(corpus.src)
    tgt = tokenizer.encode_target(corpus.tgt)
    keep_src, keep_tgt, keep_lines = [], [], []
    skipped, first = 0, 0
    for s, t, line in zip(src, tgt, corpus.lines):
        for ids, path in ((s, corpus.src_path), (t, corpus.tgt_path)):
            if len(ids) > max_positions and not skip_long:
                raise DataError(
                    f"{path}:{line}: {len(ids)} tokens (with </s>), more than the model's {max_positions} positions; "
                    "shorten or remove the line, or pass --skip-long to leave such pairs out"
                )
        if len(s) > max_positions or len(t) > max_positions:
            skipped += 1
            first = first or line
            continue
        keep_src.append(np.asarray(s, dtype=np.int64))
        keep_tgt.append(np.asarray(t, dtype=np.int64))
        keep_lines.append(line)
    if not keep_src:
        raise DataError(
            f"{corpus.src_path}: every pair is longer than the model's {max_positions} positions; raise "
            "max_position_embeddings or use shorter sentences"
        )
    if skipped:
        logger.warning(
            "%s: skipped %d pair(s) longer than %d tokens (the first at line %d)",
            corpus.src_path,
            skipped,
            max_positions,
            first,
        )
    return EncodedPairs(keep_src, keep_tgt, np.asarray(keep_lines, dtype=np.int64), skipped, first)


# -------------------------------------------------------------------------------------------- batches


def collate(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], pad_id: int, decoder_start_id: int) -> dict:
    """Padded arrays for a list of pairs (ids ending in </s>):

    input_ids       (rows, longest source)  pad_id after the end
    attention_mask  (rows, longest source)  1 on real tokens
    decoder_input_ids (rows, longest target)  [decoder_start] + target[:-1]  (Marian's shift_tokens_right)
    labels          (rows, longest target)  target, IGNORE_INDEX after the end
    """
    rows, ls, lt = len(src), max(len(s) for s in src), max(len(t) for t in tgt)
    input_ids = np.full((rows, ls), pad_id, dtype=np.int64)
    attention_mask = np.zeros((rows, ls), dtype=np.int64)
    decoder_input_ids = np.full((rows, lt), pad_id, dtype=np.int64)
    labels = np.full((rows, lt), IGNORE_INDEX, dtype=np.int64)
    for i, (s, t) in enumerate(zip(src, tgt)):
        input_ids[i, : len(s)] = s
        attention_mask[i, : len(s)] = 1
        labels[i, : len(t)] = t
        decoder_input_ids[i, 0] = decoder_start_id
        decoder_input_ids[i, 1 : len(t)] = t[:-1]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }


def plan_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    budget: int,
    rng: np.random.Generator | None = None,
    row_multiple: int = 1,
) -> list[np.ndarray]:
    """Pair indices cut into batches of rows x max(longest source, longest target) <= budget.

    Pairs are sorted by (target length, source length); with `rng`, equal lengths come in a random order and the
    batches are returned shuffled, else in length order. Each batch's rows are a multiple of `row_multiple`
    (the processes sharing it under torchrun); a remainder of fewer pairs at the end is left out.
    """
    n = len(src_lengths)
    order = rng.permutation(n) if rng is not None else np.arange(n)
    order = order[np.lexsort((src_lengths[order], tgt_lengths[order]))]  # stable: ties keep the random order
    longest = np.maximum(src_lengths, tgt_lengths)[order]
    too_long = longest * row_multiple > budget
    if too_long.any():
        raise DataError(
            f"a token budget of {budget} cannot hold {row_multiple} pair(s) of {int(longest[too_long][0])} tokens; "
            f"raise the batch's token budget ([trainer] batch_size / accumulation_steps) to at least "
            f"{int(longest.max()) * row_multiple}"
        )
    batches, start = [], 0
    while start < n:
        end, width = start, 0
        while end < n and (end - start + 1) * max(width, longest[end]) <= budget:
            width = max(width, longest[end])
            end += 1
        end = start + (end - start) // row_multiple * row_multiple
        if end == start:  # fewer than row_multiple pairs left
            break
        batches.append(order[start:end])
        start = end
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


class TokenBatches:
    """An endless, resumable stream of token-budget batches over `pairs` (a BatchSource for the Trainer).

    `next_batch(budget)` reads its argument as the token budget of the batch (the Trainer passes
    batch_size / accumulation_steps: for MT, [trainer] batch_size counts tokens per optimizer step).
    Epoch e's batches come from `numpy.random.default_rng([seed, e])` and nothing else.
    """

    def __init__(
        self,
        pairs: EncodedPairs,
        pad_id: int = PAD_ID,
        decoder_start_id: int = PAD_ID,
        seed: int = 0,
        row_multiple: int = 1,
    ) -> None:
        self.pairs = pairs
        self.pad_id, self.decoder_start_id = pad_id, decoder_start_id
        self.seed, self.row_multiple = seed, row_multiple
        self.epoch, self.index = 0, 0
        self._plan: list[np.ndarray] | None = None
        self._budget = 0

    def _planned(self, budget: int) -> list[np.ndarray]:
        if self._plan is None or budget != self._budget:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._plan = plan_batches(self.pairs.src_lengths, self.pairs.tgt_lengths, budget, rng, self.row_multiple)
            self._budget = budget
        return self._plan

    def next_batch(self, budget: int) -> dict[str, np.ndarray]:
        plan = self._planned(budget)
        if self.index >= len(plan):
            self.epoch, self.index, self._plan = self.epoch + 1, 0, None
            plan = self._planned(budget)
        rows = plan[self.index]
        self.index += 1
        return collate(
            [self.pairs.src[i] for i in rows], [self.pairs.tgt[i] for i in rows], self.pad_id, self.decoder_start_id
        )

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "num_pairs": len(self.pairs),
            "num_tokens": self.pairs.num_tokens,
        }

    def load_state_dict(self, state: dict) -> None:
        if (state["num_pairs"], state["num_tokens"]) != (len(self.pairs), self.pairs.num_tokens):
            raise DataError(
                f"the checkpoint was written for {state['num_pairs']} training pairs of {state['num_tokens']} target "
                f"tokens, this data has {len(self.pairs)} of {self.pairs.num_tokens}; resume with the same files "
                "and tokenizer, or start a new run"
            )
        self.epoch, self.index, self.seed = int(state["epoch"]), int(state["index"]), int(state["seed"])
        self._plan = None


def iter_batches(pairs: EncodedPairs, budget: int, pad_id: int = PAD_ID, decoder_start_id: int = PAD_ID):
    """Every pair once, in length order, in batches of at most `budget` tokens (evaluation)."""
    for rows in plan_batches(pairs.src_lengths, pairs.tgt_lengths, budget):
        yield collate([pairs.src[i] for i in rows], [pairs.tgt[i] for i in rows], pad_id, decoder_start_id)
