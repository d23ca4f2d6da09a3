"""The linear-chain CRF against brute force: every tag path of tiny sequences enumerated."""

from __future__ import annotations

import itertools

import pytest
import torch

from ctxrep.modules.crf import CRF


def _crf(num_tags: int, seed: int = 0) -> CRF:
    torch.manual_seed(seed)
    crf = CRF(num_tags)
    with torch.no_grad():  # larger than the default init, so that transitions decide some paths
        for p in crf.parameters():
            p.normal_(std=1.0)
    return crf


def _path_score(crf: CRF, emissions: torch.Tensor, path) -> float:
    """score(E, y) written out term by term for one sequence (seq, num_tags)."""
    s = crf.start_transitions[path[0]] + crf.end_transitions[path[-1]]
    s = s + sum(emissions[t, y] for t, y in enumerate(path))
    s = s + sum(crf.transitions[a, b] for a, b in itertools.pairwise(path))
    return float(s.detach())


def _brute_force(crf: CRF, emissions: torch.Tensor):
    """(log Z, best path) over all num_tags^seq paths of one sequence."""
    paths = list(itertools.product(range(crf.num_tags), repeat=emissions.shape[0]))
    scores = torch.tensor([_path_score(crf, emissions, p) for p in paths], dtype=torch.float64)
    return float(torch.logsumexp(scores, 0)), list(paths[int(scores.argmax())])


@pytest.mark.parametrize("seq", [1, 2, 4])
def test_partition_function_and_viterbi_match_enumerating_every_path(seq):
    crf = _crf(3, seed=seq)
    emissions = torch.randn(5, seq, 3)
    log_z = crf.log_partition(emissions).detach()
    decoded = crf.decode(emissions)
    for b in range(5):
        want_z, want_path = _brute_force(crf, emissions[b])
        assert float(log_z[b]) == pytest.approx(want_z, abs=1e-4)
        assert decoded[b] == want_path


def test_nll_is_minus_the_log_probability_of_the_path_averaged_over_the_batch():
    crf = _crf(3)
    emissions = torch.randn(2, 4, 3)
    tags = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]])
    want = []
    for b in range(2):
        log_z, _ = _brute_force(crf, emissions[b])
        want.append(log_z - _path_score(crf, emissions[b], tags[b].tolist()))
    assert crf.nll(emissions, tags).item() == pytest.approx(sum(want) / 2, abs=1e-4)
    # the probabilities of all paths sum to one
    paths = torch.tensor(list(itertools.product(range(3), repeat=4)))
    e = emissions[:1].expand(len(paths), -1, -1)
    total = torch.exp(crf.score(e, paths) - crf.log_partition(e)).sum()
    assert total.item() == pytest.approx(1.0, abs=1e-4)


def test_transitions_can_overrule_emissions_in_viterbi():
    crf = CRF(2)
    with torch.no_grad():
        crf.start_transitions.zero_(), crf.end_transitions.zero_()
        crf.transitions.copy_(torch.tensor([[0.0, -100.0], [0.0, 0.0]]))  # 0 -> 1 forbidden
    emissions = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # greedy: 0 then 1
    assert crf.decode(emissions) == [[1, 1]]  # 1 -> 1 scores 2, 0 -> 0 scores 1, 0 -> 1 scores -98
    emissions = torch.tensor([[[3.0, 0.0], [0.0, 1.0]]])
    assert crf.decode(emissions) == [[0, 0]]


def test_padded_sequences_score_and_decode_as_if_alone():
    crf = _crf(4)
    lengths = [5, 2, 1, 3]
    emissions = torch.randn(4, 5, 4)
    tags = torch.randint(0, 4, (4, 5))
    mask = torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]
    padded_tags = tags.masked_fill(~mask, -100)  # any value at padding, even out of range
    log_z = crf.log_partition(emissions, mask).detach()
    score = crf.score(emissions, padded_tags, mask)
    decoded = crf.decode(emissions, mask)
    for b, n in enumerate(lengths):
        alone_e, alone_t = emissions[b : b + 1, :n], tags[b : b + 1, :n]
        assert float(log_z[b]) == pytest.approx(float(crf.log_partition(alone_e)), abs=1e-5)
        assert float(score[b]) == pytest.approx(float(crf.score(alone_e, alone_t)), abs=1e-5)
        assert decoded[b] == crf.decode(alone_e)[0]
        assert len(decoded[b]) == n
        assert decoded[b] == _brute_force(crf, emissions[b, :n])[1]
    # garbage emissions at padded positions change nothing
    noisy = emissions.masked_fill(~mask.unsqueeze(-1), 1e4)
    assert torch.allclose(crf.log_partition(noisy, mask), log_z)
    assert crf.decode(noisy, mask) == decoded


def test_gradients_reach_every_parameter_and_are_the_tag_marginals():
    crf = _crf(3)
    emissions = torch.randn(1, 4, 3, requires_grad=True)
    crf.log_partition(emissions).sum().backward()
    # d log Z / d E[t, j] = p(y_t = j): a distribution over tags at every position
    marginals = emissions.grad[0]
    assert torch.allclose(marginals.sum(-1), torch.ones(4), atol=1e-5)
    assert (marginals > 0).all()
    emissions.grad = None
    crf.zero_grad()
    loss = crf.nll(emissions, torch.tensor([[0, 1, 2, 1]]))
    loss.backward()
    for name, p in crf.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert emissions.grad.abs().sum() > 0


def test_training_on_one_path_makes_viterbi_find_it():
    torch.manual_seed(0)
    crf = CRF(3)
    emissions = torch.zeros(1, 5, 3)  # no evidence from emissions: only the CRF's own scores can learn it
    target = torch.tensor([[2, 0, 0, 1, 2]])
    opt = torch.optim.SGD(crf.parameters(), lr=0.5)
    first = float(crf.nll(emissions, target))
    for _ in range(100):
        opt.zero_grad()
        loss = crf.nll(emissions, target)
        loss.backward()
        opt.step()
    assert float(loss) < first / 4
    assert crf.decode(emissions) == target.tolist()


@pytest.mark.parametrize(
    "emissions, tags, mask, message",
    [
        (torch.zeros(2, 3, 4), None, None, "must be (batch, seq, num_tags=3)"),
        (torch.zeros(2, 0, 3), None, None, "no positions"),
        (torch.zeros(2, 3, 3), None, torch.ones(2, 4), "mask must be (batch, seq) = (2, 3)"),
        (torch.zeros(2, 3, 3), None, torch.tensor([[1, 1, 0], [0, 0, 0]]), "sequence(s) [1] have no real first"),
        (torch.zeros(2, 3, 3), None, torch.tensor([[1, 0, 1], [1, 1, 1]]), "padding on the right"),
        (torch.zeros(2, 3, 3), torch.zeros(2, 2, dtype=torch.long), None, "tags must be (batch, seq) = (2, 3)"),
        (torch.zeros(2, 3, 3), torch.tensor([[0, 1, 2], [0, 3, 0]]), None, "sequence 1 position 1 has tag 3"),
    ],
)
def test_bad_input_is_refused_with_what_to_fix(emissions, tags, mask, message):
    crf = CRF(3)
    with pytest.raises(ValueError) as e:
        if tags is None:
            crf.decode(emissions, mask)
        else:
            crf.nll(emissions, tags, mask)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_zero_tags_is_refused():
    with pytest.raises(ValueError, match="at least one tag"):
        CRF(0)
