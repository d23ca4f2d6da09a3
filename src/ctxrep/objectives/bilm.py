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

Pretraining goes through the one pipeline of `ctxrep pretrain` (ctxrep.train.pretrain): this module adds only
what is the biLM's own, its word-level vocabulary (`word_vocabulary`, from a tokenizer trained with
kind="word") and the separator between documents in its rows of words (`SEPARATOR`); `save_pretrained`
writes an ELMo folder (options.json + weights.hdf5 with the softmax + vocab.txt) that
`ctxrep.load_model("elmo:DIR")` loads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tokenizers
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models.elmo import ElmoBiLM, ElmoConfig
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import Built, Ingredients, PretrainError, Recipe, full_sentences
from ctxrep.text.char_ids import batch_to_ids
from ctxrep.text.tokenizer import Tokenizer

VOCAB_FILE = "vocab.txt"
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


def full_softmax_nll(
    hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
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
                hidden,
                both,
                weight,
                bias,
                candidates,
                log_inclusion_prob(candidates, v, s),
                log_inclusion_prob(both, v, s),
            )
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
            nll=float(loss.detach()),
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


# ---- Its data: a word vocabulary and sentences of words ----------------------------------------------------

# Between two documents inside one training row (`ctxrep pretrain` packs sentences back to back, as for RoBERTa).
SEPARATOR = "</S>"


def word_vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The words by id of a word-level tokenizer (train_tokenizer(kind="word")): the biLM's softmax vocabulary,
    checked against the biLM's conventions (<pad> at id 0, a </S> token, most frequent words first)."""
    if not isinstance(tokenizer.backend.model, tokenizers.models.WordLevel):
        raise ValueError(  # noqa: TRY004 (a user-fixable input: the CLI reports ValueErrors)
            f"the tokenizer is {type(tokenizer.backend.model).__name__}, not word-level: the biLM predicts whole "
            "words; give it a word-level tokenizer (ctxrep tokenizer train --kind word), or delete the run folder's "
            "tokenizer.json so that one is trained"
        )
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    words = [""] * len(vocab)
    for word, i in vocab.items():
        words[i] = word
    if words[0] != "<pad>" or SEPARATOR not in vocab:
        raise ValueError(
            f"the word-level tokenizer has {words[0]!r} at id 0 and {'a' if SEPARATOR in vocab else 'no'} "
            f"{SEPARATOR} token; the biLM needs <pad> at id 0 and {SEPARATOR}, as train_tokenizer(kind='word') makes"
        )
    return words


# ------------------------------------------------------------------------------------------------- recipe

# [elmo]: the biLM's shape in the layout of ELMo's options.json, handed to ElmoConfig.from_options.
ELMO_TABLES = {
    "char_cnn": ("embedding", "filters", "n_highway", "activation", "n_characters", "max_characters_per_token"),
    "lstm": ("dim", "projection_dim", "n_layers", "cell_clip", "proj_clip", "use_skip_connections"),
}


def build_bilm(x: Ingredients) -> Built:
    """The biLM of [elmo] over the word vocabulary; documents are separated by </S> inside a row (no template:
    the biLM adds <S> and </S> itself); LSTMs take any length."""
    from ctxrep.models.folders import CheckpointError

    elmo = x.sections.get("elmo")
    if not elmo:
        raise PretrainError(
            f"{x.source} has no [elmo] section: bilm reads the biLM's shape from [elmo.char_cnn] and "
            "[elmo.lstm] (see the shipped tiny.toml); add them"
        )
    try:
        words = word_vocabulary(x.tokenizer)
    except ValueError as e:
        raise PretrainError(f"{x.source}: {e}") from None
    try:
        shape = ElmoConfig.from_options(elmo, source=f"[elmo] in {x.source}")
    except (CheckpointError, ValueError) as e:
        raise PretrainError(str(e)) from None
    return Built(BiLMObjective(shape, words, x.settings), None, x.tokenizer.backend.token_to_id(SEPARATOR))


# ELMo: the biLM's forward and backward LM over sentences of words (a word-level vocabulary, most frequent first).
BILM = Recipe(
    "bilm",
    build_bilm,
    BiLMObjectiveConfig,
    sections={"elmo": ELMO_TABLES},
    tokenizer_kinds=("word",),
    packing=full_sentences,
)
