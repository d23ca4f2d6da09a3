"""A linear-chain conditional random field over tag sequences (Lafferty et al. 2001), the output layer of the
BiLSTM-CNN-CRF taggers (Lample et al. 2016; Ma & Hovy 2016, sec. 2.3) and of TagLM (Peters et al. 2017).

For emissions E (seq, num_tags), tags y_1..y_n, transitions A (A[i, j]: score of tag i followed by tag j) and
start/end scores s, e, a path scores

    score(E, y) = s[y_1] + sum_{t=1..n} E[t, y_t] + sum_{t=2..n} A[y_{t-1}, y_t] + e[y_n]

and p(y | E) = exp(score(E, y)) / Z(E), Z(E) = sum over all num_tags^n paths. log Z comes from the forward
algorithm in log space (Lafferty et al. 2001, sec. 3; Ma & Hovy 2016, eq. 2's normaliser):

    alpha_1(j) = s[j] + E[1, j]
    alpha_t(j) = E[t, j] + logsumexp_i (alpha_{t-1}(i) + A[i, j])          t = 2..n
    log Z      = logsumexp_j (alpha_n(j) + e[j])

and the best path from the same recursion with max in place of logsumexp, keeping back-pointers (Viterbi).
Padded positions (mask False) leave alpha unchanged, so each sequence ends at its own last real position.
"""

from __future__ import annotations

import torch
from torch import nn


class CRF(nn.Module):
    """Transitions, start and end scores over `num_tags` tags; `nll` to train, `decode` for Viterbi paths.

    Emissions are (batch, seq, num_tags) scores from the layer below; `mask` (batch, seq) marks real positions,
    which must be a prefix of each row (padding on the right) with at least one real position per row.
    """

    def __init__(self, num_tags: int) -> None:
        super().__init__()
        if num_tags < 1:
            raise ValueError(f"CRF needs at least one tag, got num_tags={num_tags}")
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))  # [from, to]
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small random scores, as pytorch-crf: zeros would make every path of equal emissions tie.
        for p in (self.transitions, self.start_transitions, self.end_transitions):
            nn.init.uniform_(p, -0.1, 0.1)

    def extra_repr(self) -> str:
        return f"num_tags={self.num_tags}"

    # ---- checks -----------------------------------------------------------------------------------------

    def _check(self, emissions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Validate shapes and return a boolean mask (all True when None)."""
        if emissions.dim() != 3 or emissions.shape[-1] != self.num_tags:
            raise ValueError(
                f"CRF emissions must be (batch, seq, num_tags={self.num_tags}), got {tuple(emissions.shape)}; "
                f"project the encoder output to {self.num_tags} scores per position first"
            )
        batch, seq = emissions.shape[:2]
        if seq == 0:
            raise ValueError("CRF emissions have no positions (seq = 0); every sequence needs at least one tag")
        if mask is None:
            return torch.ones(batch, seq, dtype=torch.bool, device=emissions.device)
        if tuple(mask.shape) != (batch, seq):
            raise ValueError(
                f"CRF mask must be (batch, seq) = {(batch, seq)} like the emissions, got {tuple(mask.shape)}"
            )
        mask = mask.bool()
        empty = (~mask[:, 0]).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"CRF mask: sequence(s) {empty[:5]} have no real first position; every row needs at least one "
                "real position and padding only on the right"
            )
        gaps = (mask[:, 1:] & ~mask[:, :-1]).any(dim=1).nonzero().flatten().tolist()
        if gaps:
            raise ValueError(
                f"CRF mask: sequence(s) {gaps[:5]} have a real position after padding; put the padding on the right"
            )
        return mask

    # ---- training ---------------------------------------------------------------------------------------

    def score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """score(E, y) of the given tag paths, (batch,). Tags at padded positions are ignored (any value)."""
        mask = self._check(emissions, mask)
        if tuple(tags.shape) != tuple(mask.shape):
            raise ValueError(
                f"CRF tags must be (batch, seq) = {tuple(mask.shape)} like the emissions, got {tuple(tags.shape)}"
            )
        tags = torch.where(mask, tags.long(), torch.zeros_like(tags, dtype=torch.long))
        bad = mask & ((tags < 0) | (tags >= self.num_tags))
        if bad.any():
            b, t = bad.nonzero()[0].tolist()
            raise ValueError(
                f"CRF tags: sequence {b} position {t} has tag {int(tags[b, t])}, outside 0..{self.num_tags - 1}; "
                "padded positions must be masked out"
            )
        emissions = emissions.float()
        m = mask.float()
        # sum_t E[t, y_t] over real positions
        emitted = emissions.gather(-1, tags.unsqueeze(-1)).squeeze(-1)  # (batch, seq)
        total = self.start_transitions[tags[:, 0]] + (emitted * m).sum(1)
        # sum_{t>=2} A[y_{t-1}, y_t], counted where position t is real
        total = total + (self.transitions[tags[:, :-1], tags[:, 1:]] * m[:, 1:]).sum(1)
        last = mask.sum(1) - 1  # index of each row's last real position
        total = total + self.end_transitions[tags.gather(1, last.unsqueeze(1)).squeeze(1)]
        return total

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """log Z(E) by the forward recursion (module docstring), (batch,)."""
        mask = self._check(emissions, mask)
        emissions = emissions.float()
        alpha = self.start_transitions + emissions[:, 0]  # (batch, num_tags)
        for t in range(1, emissions.shape[1]):
            # (batch, from, 1) + (from, to) -> logsumexp over `from` -> (batch, to)
            step = torch.logsumexp(alpha.unsqueeze(2) + self.transitions, dim=1) + emissions[:, t]
            alpha = torch.where(mask[:, t : t + 1], step, alpha)  # padding: alpha carries over unchanged
        return torch.logsumexp(alpha + self.end_transitions, dim=1)

    def nll(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Negative log-likelihood -log p(y | E) = log Z(E) - score(E, y), averaged over the batch."""
        return (self.log_partition(emissions, mask) - self.score(emissions, tags, mask)).mean()

    # ---- inference --------------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, emissions: torch.Tensor, mask: torch.Tensor | None = None) -> list[list[int]]:
        """The highest-scoring tag path of each sequence (Viterbi), as many tags as its real positions."""
        mask = self._check(emissions, mask)
        emissions = emissions.float()
        seq = emissions.shape[1]
        delta = self.start_transitions + emissions[:, 0]  # (batch, num_tags): best score of a path ending in j
        pointers = []  # per step t >= 1: (batch, to) the best previous tag
        for t in range(1, seq):
            scores = delta.unsqueeze(2) + self.transitions  # (batch, from, to)
            best, arg = scores.max(dim=1)
            step = best + emissions[:, t]
            real = mask[:, t : t + 1]
            delta = torch.where(real, step, delta)
            # at padding, point each tag at itself so the backtrace passes through unchanged
            identity = torch.arange(self.num_tags, device=arg.device).expand_as(arg)
            pointers.append(torch.where(real, arg, identity))
        last_tag = (delta + self.end_transitions).argmax(dim=1)  # (batch,)
        path = [last_tag]
        for ptr in reversed(pointers):
            last_tag = ptr.gather(1, last_tag.unsqueeze(1)).squeeze(1)
            path.append(last_tag)
        tags = torch.stack(path[::-1], dim=1).tolist()  # (batch, seq)
        lengths = mask.sum(1).tolist()
        return [row[:n] for row, n in zip(tags, lengths)]
