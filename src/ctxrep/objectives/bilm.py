"""ELMo's biLM objective (Peters et al. 2018, sec. 3.1), trained from word ids with a shared softmax.

For a token sequence t_1 ... t_N the biLM jointly maximises the forward and backward log likelihoods
(Peters et al. 2018, eq. 1), with the token representation (char CNN) Theta_x and the softmax Theta_s shared
between directions:

    sum_k [ log p(t_k | t_1..t_{k-1}; Theta_x, ->Theta_LSTM, Theta_s)
          + log p(t_k | t_{k+1}..t_N; Theta_x, <-Theta_LSTM, Theta_s) ]

Here each direction's term is averaged over the batch's real tokens and the loss is their mean:
    L = (L_forward + L_backward) / 2,    L_dir = -1/n sum_k log p_dir(t_k | ...),    ppl_dir = exp(L_dir).

Alignment. ElmoBiLM runs over <S> t_1 ... t_n </S> (it adds the boundaries itself); with position 0 = <S> and
position k = t_k, the forward top layer at position k-1 has read <S> t_1 .. t_{k-1} and predicts t_k, and the
backward top layer at position k+1 has read t_{k+1} .. t_n </S> and predicts t_k. Every real token is thus a
target of both directions, and no prediction sees the token it predicts (tests/test_bilm.py checks this).

Softmax. "full": logits over the whole vocabulary. "sampled" (Jean et al. 2015; Jozefowicz et al. 2016,
sec. 3.1), during training only: the true word and a set S of candidates drawn from a log-uniform (Zipfian)
distribution over the frequency-sorted vocabulary,

    P(k) = (log(k + 2) - log(k + 1)) / log(V + 1),

num_samples draws with replacement, S = the distinct words drawn. Each logit is corrected by the log of
that word's chance of being in S, Q(w) = 1 - (1 - P(w))^num_samples (the log-Q correction of Jean et al.,
TensorFlow's `subtract_log_q`), and a candidate equal to the row's target is removed ("accidental hit"):

    loss = -s_y + log Q(y) + log( exp(s_y - log Q(y)) + sum_{w in S, w != y} exp(s_w - log Q(w)) ).

With S = the whole vocabulary and Q = 1 this is the full softmax's cross-entropy. Evaluation always uses the
full softmax, so held-out perplexities are true perplexities.

`build_bilm_run` turns a parsed TOML config into a `PretrainRun` for the shared Trainer: a word-level
tokenizer (ctxrep.tokenizer_training, kind="word"), the packed corpus, FULL-SENTENCES packers for training
and a held-out tail, the objective, and a `save_model` that writes an ELMo folder (options.json +
weights.hdf5 with the softmax + vocab.txt) that `ctxrep.load_model("elmo:DIR")` loads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tokenizers
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.data.corpus import CorpusConfig, PackedCorpus, pack_corpus
from ctxrep.data.packing import FullSentencesConfig, FullSentencesPacker
from ctxrep.models.elmo import ElmoBiLM, ElmoConfig, batch_to_ids
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.tokenize import Tokenizer
from ctxrep.train.run import PretrainRun

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
CORPUS_DIR = "corpus"
# Rows of the full softmax computed at once: bounds the (rows, vocab) logits to about 64 MB of float32.
_FULL_SOFTMAX_ELEMENTS = 1 << 24


@dataclass
class BiLMObjectiveConfig:
    """softmax: "sampled" (training; full at evaluation) or "full". num_samples: log-uniform draws per batch
    (with replacement; the distinct ones are the candidates). dropout: on the top layer before the softmax."""

    softmax: Literal["sampled", "full"] = "sampled"
    num_samples: int = 8192
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.softmax not in ("sampled", "full"):
            raise ValueError(f"objective.softmax must be 'sampled' or 'full', got {self.softmax!r}")
        if self.num_samples < 1:
            raise ValueError(f"objective.num_samples={self.num_samples} must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"objective.dropout={self.dropout} must be in [0, 1)")


# ---- Softmax losses -----------------------------------------------------------------------------------


def log_uniform_probs(vocab_size: int) -> torch.Tensor:
    """P(k) = (log(k + 2) - log(k + 1)) / log(V + 1) for k = 0..V-1 (sums to 1): Zipf for frequency-sorted ids."""
    k = torch.arange(vocab_size, dtype=torch.float64)
    return (torch.log1p(1.0 / (k + 1.0)) / math.log(vocab_size + 1.0)).float()


def sample_log_uniform(vocab_size: int, num_samples: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The distinct ids among `num_samples` log-uniform draws (sorted). Inverse CDF: k = floor((V+1)^u) - 1,
    u ~ U[0, 1), with the global torch RNG (so the Trainer's exact resume covers it)."""
    u = torch.rand(num_samples, dtype=torch.float64, device=device)
    k = torch.floor(torch.exp(u * math.log(vocab_size + 1.0))).long() - 1
    return torch.unique(k.clamp_(0, vocab_size - 1))


def log_inclusion_prob(ids: torch.Tensor, vocab_size: int, num_samples: int) -> torch.Tensor:
    """log Q(w) = log(1 - (1 - P(w))^num_samples): the log chance that w is among the sampled candidates."""
    k = ids.double()
    p = torch.log1p(1.0 / (k + 1.0)) / math.log(vocab_size + 1.0)
    return torch.log(-torch.expm1(num_samples * torch.log1p(-p))).float()


def full_softmax_nll(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """-log softmax(W h + b)_y for each row: hidden (n, dim), targets (n,) -> (n,); computed in row chunks."""
    rows = max(1, _FULL_SOFTMAX_ELEMENTS // weight.shape[0])
    out = [
        F.cross_entropy(F.linear(hidden[i : i + rows], weight, bias), targets[i : i + rows], reduction="none")
        for i in range(0, hidden.shape[0], rows)
    ]
    return torch.cat(out) if out else hidden.new_zeros(0)


def sampled_softmax_nll(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    candidates: torch.Tensor,
    log_q_candidates: torch.Tensor,
    log_q_targets: torch.Tensor,
) -> torch.Tensor:
    """The sampled softmax's per-row loss (module docstring; Jean et al. 2015, eq. 11 with the log-Q correction).

    hidden (n, dim), targets (n,), candidates (s,) shared by all rows, log_q_* the log inclusion chances.
    """
    true_logits = (hidden * weight[targets]).sum(-1) + bias[targets] - log_q_targets  # (n,)
    sampled = F.linear(hidden, weight[candidates], bias[candidates]) - log_q_candidates  # (n, s)
    # Accidental hits: the target among the candidates would count twice; bilm-tf removes it likewise.
    sampled = sampled.masked_fill(targets[:, None] == candidates[None, :], float("-inf"))
    logits = torch.cat([true_logits[:, None], sampled], dim=1)  # (n, 1 + s): the target first
    return torch.logsumexp(logits, dim=1) - true_logits


# ---- The objective -------------------------------------------------------------------------------------


class BiLMObjective(nn.Module):
    """ElmoBiLM + its shared softmax, trained on word ids: forward(batch) -> ObjectiveOutput.

    `vocab_words[i]` is the word of id i, most frequent first for the sampled softmax; id 0 is padding (its
    row of the character table is all zeros). The biLM's config is copied with the softmax switched on
    (n_tokens_vocab = len(vocab_words)).
    """

    def __init__(
        self, elmo_config: ElmoConfig, vocab_words: list[str], config: BiLMObjectiveConfig | None = None
    ) -> None:
        super().__init__()
        if len(vocab_words) < 2:
            raise ValueError(f"the vocabulary has {len(vocab_words)} word(s); the biLM needs padding + at least 1 word")
        self.config = config or BiLMObjectiveConfig()
        self.vocab_words = list(vocab_words)
        self.vocab_size = len(vocab_words)
        elmo_config = dataclasses.replace(elmo_config, n_tokens_vocab=self.vocab_size, has_softmax=True)
        self.bilm = ElmoBiLM(elmo_config)
        self.dropout = nn.Dropout(self.config.dropout)
        # Word id -> character ids, built once: (vocab, max_chars), row 0 (padding) zeros.
        chars = batch_to_ids([self.vocab_words[1:]], elmo_config.max_characters_per_token)[0]
        self.register_buffer("char_table", torch.cat([torch.zeros_like(chars[:1]), chars]), persistent=False)

    @property
    def elmo_config(self) -> ElmoConfig:
        return self.bilm.config

    def directional_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward, backward) top-layer states aligned with the token each predicts, (batch, seq, proj) each:
        forward[:, k] has read only the tokens before k, backward[:, k] only the tokens after k."""
        mask = attention_mask.bool()
        char_ids = self.char_table[input_ids] * mask[..., None]  # (batch, seq, max_chars), padding words zero
        top = self.bilm(char_ids, keep_boundaries=True).hidden_states[-1]  # (batch, seq + 2, 2 * proj)
        seq, p = input_ids.shape[1], self.elmo_config.projection_dim
        # Position 0 is <S>, position k + 1 token k, position n + 1 </S> (module docstring, "Alignment").
        forward = top[:, :seq, :p]  # (batch, seq, proj): positions 0..seq-1 predict tokens 0..seq-1
        backward = top[:, 2 : seq + 2, p:]  # (batch, seq, proj): positions 2..seq+1 predict tokens 0..seq-1
        return forward, backward

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-softmax (forward, backward) logits (batch, seq, vocab) for token k of each row (no dropout)."""
        forward, backward = self.directional_states(input_ids, self._check(input_ids, attention_mask))
        return self.bilm.softmax(forward), self.bilm.softmax(backward)

    def token_nll(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampled: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token negative log likelihoods (forward, backward), each (n_real_tokens,), in row-major order.

        sampled=True uses the sampled softmax (one candidate set for the batch, shared by both directions).
        """
        mask = self._check(input_ids, attention_mask).bool()
        forward, backward = self.directional_states(input_ids, mask)
        targets = input_ids[mask]  # (n,)
        hidden = self.dropout(torch.cat([forward[mask], backward[mask]]))  # (2n, proj): forward rows first
        both = torch.cat([targets, targets])
        weight, bias = self.bilm.softmax.weight, self.bilm.softmax.bias
        if sampled:
            v, s = self.vocab_size, self.config.num_samples
            candidates = sample_log_uniform(v, s, device=input_ids.device)
            nll = sampled_softmax_nll(
                hidden, both, weight, bias, candidates,
                log_inclusion_prob(candidates, v, s), log_inclusion_prob(both, v, s),
            )  # fmt: skip
        else:
            nll = full_softmax_nll(hidden, both, weight, bias)
        n = targets.shape[0]
        return nll[:n], nll[n:]

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        """batch: input_ids (batch, seq) word ids, attention_mask (batch, seq), padded on the right."""
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        sampled = self.training and self.config.softmax == "sampled"
        forward_nll, backward_nll = self.token_nll(input_ids, attention_mask, sampled=sampled)
        forward_loss, backward_loss = forward_nll.mean(), backward_nll.mean()
        loss = (forward_loss + backward_loss) / 2  # Peters et al. 2018, eq. 1: both directions, equal weight
        return ObjectiveOutput(
            loss=loss,
            num_tokens=int(forward_nll.shape[0]),
            metrics={"forward_ppl": _exp(forward_loss), "backward_ppl": _exp(backward_loss)},
        )

    def _check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq) word ids, got shape {tuple(input_ids.shape)}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected that of input_ids "
                f"{tuple(input_ids.shape)}"
            )
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(
                f"input_ids must lie in [0, {self.vocab_size}) (the vocabulary size), got values from "
                f"{int(input_ids.min())} to {int(input_ids.max())}; use the tokenizer the objective was built with"
            )
        if not bool(attention_mask.bool().any()):
            raise ValueError("the batch has no real tokens (attention_mask is all 0): nothing to predict")
        return attention_mask

    def save_pretrained(self, path: str | Path) -> None:
        """DIR/options.json + DIR/weights.hdf5 (bilm-tf layout, with softmax/W and softmax/b) + DIR/vocab.txt."""
        path = Path(path)
        self.bilm.save_pretrained(path)
        (path / VOCAB_FILE).write_text("".join(w + "\n" for w in self.vocab_words), encoding="utf-8")


def _exp(loss: torch.Tensor) -> float:
    value = float(loss.detach())
    return math.exp(value) if value < 700 else float("inf")


@torch.no_grad()
def evaluate_perplexity(
    objective: BiLMObjective, batch_source: Any, n_batches: int, batch_size: int = 32
) -> dict[str, float]:
    """Forward and backward perplexity with the full softmax over `n_batches` batches of `batch_source`
    (read from its current position), weighting every real token equally; the objective's mode is restored."""
    if n_batches < 1:
        raise ValueError(f"n_batches={n_batches} must be at least 1")
    was_training = objective.training
    objective.eval()
    device = objective.char_table.device
    totals = {"forward": 0.0, "backward": 0.0}
    tokens = 0
    try:
        for _ in range(n_batches):
            batch = batch_source.next_batch(batch_size)
            ids = torch.as_tensor(batch["input_ids"], device=device)
            mask = torch.as_tensor(batch["attention_mask"], device=device)
            forward_nll, backward_nll = objective.token_nll(ids, mask, sampled=False)
            totals["forward"] += float(forward_nll.double().sum())
            totals["backward"] += float(backward_nll.double().sum())
            tokens += forward_nll.shape[0]
    finally:
        objective.train(was_training)
    result: dict[str, float] = {"tokens": float(tokens)}
    for direction, total in totals.items():
        result[f"{direction}_loss"] = total / tokens
        result[f"{direction}_ppl"] = math.exp(total / tokens)
    return result


# ---- From a TOML config to a PretrainRun --------------------------------------------------------------


@dataclass
class WordTokenizerConfig:
    """[tokenizer]: the word-level vocabulary (specials + the most frequent words)."""

    vocab_size: int = 30000
    min_frequency: int = 1
    lowercase: bool = False


@dataclass
class BiLMDataConfig:
    """[data]: max_length words per sequence; eval_fraction of the sentences (the corpus's tail) held out
    (0 = none); document_boundary and num_workers as in ctxrep.data.corpus.CorpusConfig; seed for the
    packers and the initial weights."""

    max_length: int = 64
    eval_fraction: float = 0.01
    document_boundary: Literal["file", "blank_line"] = "file"
    num_workers: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ValueError(f"data.max_length={self.max_length} must be at least 2")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction={self.eval_fraction} must be in [0, 1)")


_ELMO_FIELDS_SET_BY_THE_OBJECTIVE = ("n_tokens_vocab", "has_softmax")


def _section(config: dict, name: str, cls, exclude: tuple[str, ...] = (), ignore_others: bool = False):
    """Build dataclass `cls` from config[name], refusing keys it does not have (or skipping them)."""
    values = dict(config.get(name) or {})
    known = [f.name for f in dataclasses.fields(cls) if f.name not in exclude]
    unknown = sorted(set(values) - set(known))
    if ignore_others:
        values = {k: v for k, v in values.items() if k in known}
    elif unknown:
        raise ValueError(f"[{name}] has unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return cls(**values)


def build_bilm_run(config: dict, corpus: Path, out_dir: Path, progress: bool = True) -> PretrainRun:
    """Everything the Trainer needs to pretrain an ELMo biLM on the text files of `corpus`.

    config: a parsed TOML dict with [elmo] (ElmoConfig fields), [tokenizer] (WordTokenizerConfig), [data]
    (BiLMDataConfig), [objective] (BiLMObjectiveConfig); [trainer] is not read here. In out_dir: the word-level
    tokenizer.json (trained, or reused if present), the packed corpus in out_dir/corpus (reused when up to
    date), and what save_model(out_dir) writes: options.json, weights.hdf5, vocab.txt.
    """
    from ctxrep.tokenizer_training import train_tokenizer

    corpus, out_dir = Path(corpus), Path(out_dir)
    elmo = dict(config.get("elmo") or {})
    if "char_cnn" in elmo or "lstm" in elmo:
        # The layout of ELMo's options.json, as in ctxrep pretrain's shipped configs; other keys of [elmo] are
        # the biLM objective's own settings (softmax, num_samples, dropout).
        if "n_tokens_vocab" in elmo:
            raise ValueError("[elmo] has unknown setting(s) n_tokens_vocab (set by the objective from the vocabulary)")
        objective_keys = {f.name for f in dataclasses.fields(BiLMObjectiveConfig)}
        elmo_config = ElmoConfig.from_options(elmo, source="[elmo]")
        objective_config = BiLMObjectiveConfig(**{k: v for k, v in elmo.items() if k in objective_keys})
        unknown = sorted(set(elmo) - objective_keys - {"char_cnn", "lstm"})
        if unknown:
            raise ValueError(f"[elmo] has unknown setting(s) {', '.join(unknown)}; known: char_cnn, lstm, "
                             f"{', '.join(sorted(objective_keys))}")  # fmt: skip
        # The shared [tokenizer] / [data] sections also hold the subword objectives' settings: take ours.
        tok_config = _section(config, "tokenizer", WordTokenizerConfig, ignore_others=True)
        data = _section(config, "data", BiLMDataConfig, ignore_others=True)
    else:
        elmo_config = _section(config, "elmo", ElmoConfig, exclude=_ELMO_FIELDS_SET_BY_THE_OBJECTIVE)
        tok_config = _section(config, "tokenizer", WordTokenizerConfig)
        data = _section(config, "data", BiLMDataConfig)
        objective_config = _section(config, "objective", BiLMObjectiveConfig)
    reading = CorpusConfig(document_boundary=data.document_boundary, num_workers=data.num_workers)

    tokenizer_file = out_dir / TOKENIZER_FILE
    if tokenizer_file.is_file():
        tokenizer = Tokenizer.from_model_dir(out_dir)
    else:
        tokenizer = train_tokenizer(
            corpus, "word", tok_config.vocab_size, out_dir, lowercase=tok_config.lowercase,
            min_frequency=tok_config.min_frequency, corpus=reading, show_progress=progress,
        )  # fmt: skip
    vocab_words = _word_vocabulary(tokenizer, tokenizer_file, tok_config.vocab_size)

    packed = pack_corpus(corpus, tokenizer_file, out_dir / CORPUS_DIR, reading, progress=progress)
    train_corpus, eval_corpus = split_held_out(packed, data.eval_fraction, min_tokens=data.max_length)
    # No template: ElmoBiLM adds <S> and </S> itself. </S> separates two documents inside a sequence.
    packing = FullSentencesConfig(
        max_length=data.max_length, seed=data.seed, separator_id=tokenizer.backend.token_to_id("</S>")
    )
    train_data = FullSentencesPacker(train_corpus, packing, tokenizer)
    eval_data = FullSentencesPacker(eval_corpus, packing, tokenizer) if eval_corpus is not None else None

    with torch.random.fork_rng(devices=[]):  # the initial weights depend on data.seed only
        torch.manual_seed(data.seed)
        objective = BiLMObjective(elmo_config, vocab_words, objective_config)
    return PretrainRun(objective=objective, train_data=train_data, eval_data=eval_data, save_model=objective.save_pretrained)


def _word_vocabulary(tokenizer: Tokenizer, file: Path, vocab_size: int) -> list[str]:
    """The words by id of a word-level tokenizer, checked to fit [tokenizer] and the biLM's conventions."""
    if not isinstance(tokenizer.backend.model, tokenizers.models.WordLevel):
        raise ValueError(
            f"{file} is not a word-level tokenizer; the biLM predicts whole words. Delete it (or use another "
            "out_dir) so that a word-level one is trained"
        )
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    words = [""] * len(vocab)
    for word, i in vocab.items():
        words[i] = word
    if len(vocab) > vocab_size:
        raise ValueError(
            f"{file} has {len(vocab)} words but [tokenizer] vocab_size is {vocab_size}: it was trained with other "
            "settings. Delete it (or use another out_dir) to train a new one"
        )
    if words[0] != "<pad>" or "</S>" not in vocab:
        raise ValueError(f"{file}: expected <pad> at id 0 and a </S> token, as train_tokenizer(kind='word') makes")
    return words


def split_held_out(
    corpus: PackedCorpus, eval_fraction: float, min_tokens: int
) -> tuple[PackedCorpus, PackedCorpus | None]:
    """(training part, held-out part): the held-out part is the last ceil(eval_fraction * sentences) sentences,
    grown until it holds at least `min_tokens` tokens; eval_fraction=0 holds out nothing."""
    if eval_fraction == 0:
        return corpus, None
    n = corpus.num_sentences
    offsets = corpus.sentence_offsets
    first = n - max(1, math.ceil(eval_fraction * n))
    while first > 0 and offsets[n] - offsets[first] < min_tokens:
        first -= 1
    if first < 1 or offsets[first] < min_tokens:
        raise ValueError(
            f"{corpus.path}: the corpus ({corpus.num_tokens} words in {n} sentences) is too small to hold out "
            f"eval_fraction={eval_fraction} and still fill a sequence of max_length={min_tokens} on both sides; "
            "use more text, a smaller max_length, or data.eval_fraction = 0"
        )
    return corpus_slice(corpus, 0, first), corpus_slice(corpus, first, n)


def corpus_slice(corpus: PackedCorpus, first: int, end: int) -> PackedCorpus:
    """A PackedCorpus over sentences [first, end) of `corpus` (a view: no token is copied); a document cut
    by the slice keeps its part inside."""
    sentences, documents = corpus.sentence_offsets, corpus.document_offsets
    t0, t1 = int(sentences[first]), int(sentences[end])
    inner = documents[(documents > first) & (documents < end)] - first  # documents starting inside the slice
    doc_offsets = np.concatenate([[0], inner, [end - first]]).astype(np.int64)
    manifest = dict(corpus.manifest)
    manifest["counts"] = {"documents": len(doc_offsets) - 1, "sentences": end - first, "tokens": t1 - t0}
    return PackedCorpus(corpus.path, corpus.tokens[t0:t1], sentences[first : end + 1] - t0, doc_offsets, manifest)
