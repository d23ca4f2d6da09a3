"""Pretraining sequences from a `PackedCorpus`: BERT segment pairs with NSP, and RoBERTa FULL-SENTENCES.

Both packers work in epochs. At the start of an epoch a *plan* is built: the token ranges of every
sequence of the epoch (a few int64 per sequence, no token copies), drawn with
``np.random.default_rng([seed, max_length, epoch])`` and then shuffled. Sequence ``position`` of the
plan is materialised on demand. The whole data position is therefore ``(seed, step, max_length, epoch,
position)``: `state_dict` / `load_state_dict` save and restore it exactly, and restoring only rebuilds
one epoch's plan (about a second per million sentences).

Special tokens come from the tokenizer's own template (`ctxrep.text.tokenizer.SpecialTemplate`), so a BERT
tokenizer gives ``[CLS] A [SEP] B [SEP]`` and a RoBERTa one ``<s> A </s></s> B </s>``.

Short-sequence warm-up (`ShortSequenceWarmup`): BERT trained 90% of its steps on 128-token sequences,
then 10% on 512. A packer counts the batches it has served (`step`); while ``step < warmup.steps`` it
packs to ``warmup.max_length``, then to ``max_length``. The switch starts a fresh epoch 0 of the new
length. With gradient accumulation, count micro-batches in ``warmup.steps``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ctxrep.data.corpus import PackedCorpus
from ctxrep.text.tokenizer import Tokenizer


class PackingError(ValueError):
    """A corpus too small for the requested sequences, bad packing options, or a state that does not fit."""


@dataclass
class ShortSequenceWarmup:
    """Pack to `max_length` tokens for the first `steps` batches (BERT: 128 for 90% of the steps)."""

    max_length: int = 128
    steps: int = 0

    @classmethod
    def from_fraction(cls, total_steps: int, fraction: float = 0.9, max_length: int = 128) -> ShortSequenceWarmup:
        return cls(max_length=max_length, steps=int(round(total_steps * fraction)))


@dataclass
class SegmentPairConfig:
    """BERT pretraining pairs: [CLS] A [SEP] B [SEP], B the true next segment half of the time.

    short_seq_prob: chance that a pair aims at a random length in [2, max_length - 3] instead of the
    full length (BERT: 0.1), so that the model also sees short inputs.
    """

    max_length: int = 512
    short_seq_prob: float = 0.1
    seed: int = 0
    warmup: ShortSequenceWarmup | None = None


@dataclass
class FullSentencesConfig:
    """RoBERTa FULL-SENTENCES: contiguous sentences up to max_length, crossing documents.

    separator_id: token put between two documents inside one sequence; None = the tokenizer's own
    separator (the first special token between segments A and B: [SEP] for BERT, </s> for RoBERTa).
    """

    max_length: int = 512
    seed: int = 0
    warmup: ShortSequenceWarmup | None = None
    separator_id: int | None = None


class _Packer:
    """Epoch plans, the data position, batches and state; subclasses build and materialise plans."""

    kind = ""

    def __init__(self, corpus: PackedCorpus, config, tokenizer: Tokenizer | None) -> None:
        self.corpus = corpus
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else corpus.load_tokenizer()
        self.template = self.tokenizer.template
        self.pad_id = self.tokenizer.pad_token_id
        self.seed = config.seed
        self.step = 0  # batches served
        self.max_length: int | None = None  # length of the current phase (None before the first sequence)
        self.epoch = 0
        self.position = 0  # sequences of the current epoch already served
        self._plan = None
        self._plan_key: tuple[int, int] | None = None
        lengths = [config.max_length] + ([config.warmup.max_length] if config.warmup else [])
        if config.warmup is not None and config.warmup.steps < 0:
            raise PackingError(f"warmup.steps={config.warmup.steps} must be 0 or more")
        for length in lengths:
            if length - self._num_special() < 2:
                raise PackingError(
                    f"max_length={length} leaves fewer than 2 tokens once the {self._num_special()} special "
                    "tokens are added; use a larger max_length"
                )
        self._check_corpus(max(lengths))

    # -- the schedule and the position

    def max_length_at(self, step: int) -> int:
        warmup = self.config.warmup
        if warmup is not None and step < warmup.steps:
            return warmup.max_length
        return self.config.max_length

    def next_instance(self) -> dict[str, np.ndarray]:
        """The next sequence (at the current step's max_length); does not advance `step`."""
        length = self.max_length_at(self.step)
        if length != self.max_length:  # a new phase (first call, or end of the warm-up)
            self.max_length, self.epoch, self.position = length, 0, 0
        plan_size = self._ensure_plan()
        if self.position >= plan_size:
            self.epoch, self.position = self.epoch + 1, 0
            self._ensure_plan()
        instance = self._materialise(self.position)
        self.position += 1
        return instance

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        """`batch_size` sequences padded to the longest, with attention_mask; advances `step` by one."""
        if batch_size < 1:
            raise PackingError(f"batch_size={batch_size} must be at least 1")
        instances = [self.next_instance() for _ in range(batch_size)]
        self.step += 1
        return self._collate(instances)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Endless batches (epochs follow each other)."""
        while True:
            yield self.next_batch(batch_size)

    def epoch_size(self) -> int:
        """Number of sequences in the current epoch (builds the epoch's plan if needed)."""
        if self.max_length is None:
            self.max_length = self.max_length_at(self.step)
        return self._ensure_plan()

    def state_dict(self) -> dict:
        """Everything needed to continue from exactly this data position (JSON-serialisable)."""
        return {
            "kind": self.kind,
            "seed": self.seed,
            "step": self.step,
            "max_length": self.max_length,
            "epoch": self.epoch,
            "position": self.position,
            "corpus": self._corpus_fingerprint(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind:
            raise PackingError(f"packer state is for {state.get('kind')!r} packing, not {self.kind!r}")
        if state.get("corpus") != self._corpus_fingerprint():
            raise PackingError(
                f"packer state was saved on another corpus ({state.get('corpus')}), not {self.corpus.path} "
                f"({self._corpus_fingerprint()}); resume with the corpus the run started with"
            )
        self.seed = int(state["seed"])
        self.step = int(state["step"])
        self.max_length = None if state["max_length"] is None else int(state["max_length"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._plan, self._plan_key = None, None

    # -- helpers

    def _corpus_fingerprint(self) -> dict:
        return {"tokens": self.corpus.num_tokens, "tokenizer_sha256": self.corpus.manifest.get("tokenizer_sha256")}

    def _rng(self, max_length: int, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, max_length, epoch])

    def _ensure_plan(self) -> int:
        key = (self.max_length, self.epoch)
        if self._plan_key != key:
            self._plan = self._build_plan(self.max_length, self._rng(*key))
            self._plan_key = key
        return self._plan_size(self._plan)

    def _collate(self, instances: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        longest = max(len(x["input_ids"]) for x in instances)
        batch: dict[str, np.ndarray] = {}
        for name, pad in (("input_ids", self.pad_id), ("token_type_ids", 0)):
            if name in instances[0]:
                out = np.full((len(instances), longest), pad, np.int64)
                for row, x in zip(out, instances):
                    row[: len(x[name])] = x[name]
                batch[name] = out
        mask = np.zeros((len(instances), longest), np.int64)
        for row, x in zip(mask, instances):
            row[: len(x["input_ids"])] = 1
        batch["attention_mask"] = mask
        if "next_sentence_label" in instances[0]:
            batch["next_sentence_label"] = np.array([x["next_sentence_label"] for x in instances], np.int64)
        return batch

    def _num_special(self) -> int:
        raise NotImplementedError

    def _check_corpus(self, max_length: int) -> None:
        raise NotImplementedError

    def _build_plan(self, max_length: int, rng: np.random.Generator):
        raise NotImplementedError

    def _plan_size(self, plan) -> int:
        raise NotImplementedError

    def _materialise(self, position: int) -> dict[str, np.ndarray]:
        raise NotImplementedError


class SegmentPairPacker(_Packer):
    """BERT segment pairs with the next-sentence label, following BERT's create_pretraining_data.

    For each document, sentences are gathered into a chunk until it reaches the target length
    (max_length - 3, or with probability short_seq_prob a random length in [2, max_length - 3]).
    A is the chunk's first k sentences (k random), and with probability 0.5 B is the rest of the chunk
    (label 0, "is next") or else sentences from a random point of another document (label 1, "random";
    the chunk's unused sentences go back to the document). The longer segment is then cut one token at
    a time from a random end until the pair fits. Labels follow transformers' BertForPreTraining.

    Two deliberate differences from the original: the short target length is drawn per pair, not once
    per document; and a one-sentence chunk that draws "is next" takes the document's following sentence
    as B, or at the document's end is cut in two at a random token (A = first part, B = the rest). The
    original always made such pairs random, which pushes the random share above 50% when sentences are
    long or documents short; here it stays at 50% (one-token final sentences aside).

    Instances: input_ids, token_type_ids, next_sentence_label (0 = B follows A, 1 = B is random).
    """

    kind = "segment_pair"

    def __init__(self, corpus: PackedCorpus, config: SegmentPairConfig, tokenizer: Tokenizer | None = None) -> None:
        if not 0.0 <= config.short_seq_prob <= 1.0:
            raise PackingError(f"short_seq_prob={config.short_seq_prob} must be between 0 and 1")
        super().__init__(corpus, config, tokenizer)

    def _num_special(self) -> int:
        return self.template.num_special(pair=True)

    def _check_corpus(self, max_length: int) -> None:
        if self.corpus.num_documents < 2:
            raise PackingError(
                f"{self.corpus.path}: next-sentence prediction needs at least 2 documents (random B segments come "
                f"from another document) but the corpus has {self.corpus.num_documents}; add files, or pack with "
                "document_boundary='blank_line'"
            )
        self._check_length(max_length)

    def _check_length(self, max_length: int) -> None:
        """Refuse a corpus shorter than one sequence."""
        need = max_length - self._num_special()
        if self.corpus.num_tokens < need:
            raise PackingError(
                f"{self.corpus.path}: the corpus has {self.corpus.num_tokens} tokens, fewer than one sequence of "
                f"max_length={max_length} ({need} tokens besides the special tokens); use more text or a smaller "
                "max_length"
            )

    def _build_plan(self, max_length: int, rng: np.random.Generator) -> np.ndarray:
        """Rows of (a_start, a_end, b_start, b_end, label): token offsets into corpus.tokens, shuffled.

        The walk is create_pretraining_data's, shared with SentenceOrderPacker: a document's sentences gather
        into a chunk until it reaches the target length, A is the chunk's first k sentences (k random), and
        `_pair` makes the row and says after which sentence the walk goes on.
        """
        doc_off = self.corpus.document_offsets.tolist()
        sent_off = self.corpus.sentence_offsets.tolist()
        max_tokens = max_length - self._num_special()
        short_prob = self.config.short_seq_prob

        def target_length() -> int:
            if rng.random() < short_prob:
                return int(rng.integers(2, max_tokens + 1))
            return max_tokens

        rows = []
        for d in range(len(doc_off) - 1):
            first, last = doc_off[d], doc_off[d + 1]  # sentence range of the document
            chunk_start, i = first, first
            target = target_length()
            while i < last:
                if i == last - 1 or sent_off[i + 1] - sent_off[chunk_start] >= target:
                    n = i + 1 - chunk_start  # sentences in the chunk
                    a_end = chunk_start + (int(rng.integers(1, n)) if n >= 2 else 1)
                    chunk = Chunk(d, chunk_start, a_end, i, last, target)
                    row, i = self._pair(chunk, sent_off, doc_off, max_tokens, rng)
                    if row is not None:
                        rows.append(row)
                    chunk_start = i + 1
                    target = target_length()
                i += 1
        if not rows:
            raise PackingError(
                f"{self.corpus.path}: no segment pair can be made (every document is one sentence of one token); "
                "use more text"
            )
        plan = np.array(rows, np.int64).reshape(-1, 5)
        return plan[rng.permutation(len(plan))]

    def _pair(
        self, chunk: Chunk, sent_off: list[int], doc_off: list[int], max_tokens: int, rng: np.random.Generator
    ) -> tuple[tuple[int, ...] | None, int]:
        """The chunk's row and the sentence the walk goes on after: B is the chunk's rest or, half of the time,
        sentences from a random point of another document (the chunk's unused sentences go back)."""
        i = chunk.end
        is_random = rng.random() < 0.5
        a = [sent_off[chunk.start], sent_off[chunk.split]]
        b = [sent_off[chunk.split], sent_off[chunk.end + 1]]
        if not is_random and chunk.end == chunk.start:  # B must come from beyond the one-sentence chunk
            following = following_segment(a, chunk, sent_off, rng)
            if following is None:
                is_random = True
            else:
                b, i = following
        if is_random:
            r = int(rng.integers(len(doc_off) - 2))
            r += r >= chunk.document  # any document but this one
            j = int(rng.integers(doc_off[r], doc_off[r + 1]))
            want = chunk.target - (a[1] - a[0])
            b = [sent_off[j], sent_off[j + 1]]
            while b[1] - b[0] < want and j + 1 < doc_off[r + 1]:
                j += 1
                b[1] = sent_off[j + 1]
            i = chunk.split - 1  # the chunk's unused sentences go back to the document
        truncate_pair(a, b, max_tokens, rng)
        return (a[0], a[1], b[0], b[1], int(is_random)), i

    def _plan_size(self, plan: np.ndarray) -> int:
        return len(plan)

    def _materialise(self, position: int) -> dict[str, np.ndarray]:
        a0, a1, b0, b1, label = self._plan[position]
        t, tokens = self.template, self.corpus.tokens
        ids = np.concatenate([t.prefix, tokens[a0:a1], t.middle, tokens[b0:b1], t.suffix]).astype(np.int64)
        types = np.concatenate(
            [t.prefix_types, np.full(a1 - a0, t.type_a), t.middle_types, np.full(b1 - b0, t.type_b), t.suffix_types]
        ).astype(np.int64)
        return {"input_ids": ids, "token_type_ids": types, "next_sentence_label": np.int64(label)}


@dataclass
class Chunk:
    """Sentences start..end (inclusive) of document `document`, whose sentences end before `document_end`;
    A is sentences start..split - 1; `target` is the chunk's target length in tokens."""

    document: int
    start: int
    split: int
    end: int
    document_end: int
    target: int


def following_segment(
    a: list[int], chunk: Chunk, sent_off: list[int], rng: np.random.Generator
) -> tuple[list[int], int] | None:
    """B for a one-sentence chunk A, and the sentence the walk goes on after: the document's following sentence;
    at the document's end, A's own second part (A is cut at a random token); None if A is one final token."""
    i = chunk.end
    if i + 1 < chunk.document_end:
        return [sent_off[i + 1], sent_off[i + 2]], i + 1
    if a[1] - a[0] >= 2:
        a[1] = a[0] + int(rng.integers(1, a[1] - a[0]))
        return [a[1], sent_off[i + 1]], i
    return None


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator) -> None:
    """BERT's truncate_seq_pair on [start, end) ranges: cut the longer one, from a random end, until they fit."""
    excess = (a[1] - a[0]) + (b[1] - b[0]) - max_tokens
    if excess <= 0:
        return
    for front in (rng.random(excess) < 0.5).tolist():
        seg = a if a[1] - a[0] > b[1] - b[0] else b
        if front:
            seg[0] += 1
        else:
            seg[1] -= 1


@dataclass
class _FullSentencesPlan:
    runs: np.ndarray  # (n_runs, 2) token ranges; consecutive runs of one sequence are different documents
    sequence_offsets: np.ndarray  # (n_sequences + 1,) index of each sequence's first run
    order: np.ndarray  # (n_sequences,) shuffled sequence order


class FullSentencesPacker(_Packer):
    """RoBERTa FULL-SENTENCES: sentences taken in order, as many as fit, across document boundaries.

    Documents are visited in a new random order each epoch. A sequence is ``<s> s1 s2 ... </s>`` (the
    tokenizer's single-sequence template) holding at most max_length tokens; when a document ends inside
    a sequence, the separator token is put before the next document's first sentence. A sentence longer
    than a whole sequence is cut into full-length pieces. Instances: input_ids only (no NSP).
    """

    kind = "full_sentences"

    def __init__(self, corpus: PackedCorpus, config: FullSentencesConfig, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(corpus, config, tokenizer)
        t = self.template
        if config.separator_id is not None:
            self.separator_id = config.separator_id
        elif t.middle or t.single_suffix:
            self.separator_id = (t.middle or t.single_suffix)[0]
        else:
            raise PackingError("the tokenizer has no separator token; set FullSentencesConfig.separator_id")

    def _num_special(self) -> int:
        return self.template.num_special(pair=False)

    def _check_corpus(self, max_length: int) -> None:
        need = max_length - self._num_special()
        have = self.corpus.num_tokens + self.corpus.num_documents - 1  # with the separators
        if have < need:
            raise PackingError(
                f"{self.corpus.path}: the corpus has {self.corpus.num_tokens} tokens, fewer than one sequence of "
                f"max_length={max_length} ({need} tokens besides the special tokens); use more text or a smaller "
                "max_length"
            )

    def _build_plan(self, max_length: int, rng: np.random.Generator) -> _FullSentencesPlan:
        doc_off = self.corpus.document_offsets.tolist()
        sent_off = self.corpus.sentence_offsets.tolist()
        capacity = max_length - self._num_special()
        runs: list[list[int]] = []
        sequence_offsets = [0]
        filled = 0  # tokens in the open sequence, separators included

        for d in rng.permutation(len(doc_off) - 1).tolist():
            new_document = True
            for s in range(doc_off[d], doc_off[d + 1]):
                start, end = sent_off[s], sent_off[s + 1]
                separator = 1 if new_document and filled > 0 else 0
                if filled > 0 and filled + separator + (end - start) > capacity:
                    sequence_offsets.append(len(runs))
                    filled, separator = 0, 0
                while end - start > capacity:  # an over-long sentence: full pieces on their own
                    runs.append([start, start + capacity])
                    sequence_offsets.append(len(runs))
                    start += capacity
                if filled > 0 and separator == 0:
                    runs[-1][1] = end  # same document: the run grows (sentences are contiguous)
                else:
                    runs.append([start, end])
                filled += separator + (end - start)
                new_document = False
        if filled > 0:
            sequence_offsets.append(len(runs))
        offsets = np.array(sequence_offsets, np.int64)
        return _FullSentencesPlan(
            runs=np.array(runs, np.int64).reshape(-1, 2),
            sequence_offsets=offsets,
            order=rng.permutation(len(offsets) - 1),
        )

    def _plan_size(self, plan: _FullSentencesPlan) -> int:
        return len(plan.order)

    def _materialise(self, position: int) -> dict[str, np.ndarray]:
        plan, t = self._plan, self.template
        k = plan.order[position]
        parts: list = [t.prefix]
        for r in range(plan.sequence_offsets[k], plan.sequence_offsets[k + 1]):
            if r > plan.sequence_offsets[k]:
                parts.append([self.separator_id])
            start, end = plan.runs[r]
            parts.append(self.corpus.tokens[start:end])
        parts.append(t.single_suffix)
        return {"input_ids": np.concatenate(parts).astype(np.int64)}
