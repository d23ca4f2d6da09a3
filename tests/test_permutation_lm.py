"""Permutation LM: the paper's example order, partial-prediction arithmetic, spans, padding, a few training steps."""

from __future__ import annotations

import math

import pytest
import torch

from ctxrep.models.xlnet import XLNetConfig, XLNetLMHeadModel, XLNetModel
from ctxrep.objectives.permutation_lm import (
    PermutationLMConfig,
    num_targets,
    perm_mask_from_ranks,
    sample_permutation_lm_batch,
)

TINY = dict(vocab_size=20, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0, mem_len=None)

# The order the figures of Yang et al. 2019 use: factorization order 3 -> 2 -> 4 -> 1 over positions 1..4.
# ranks[i] = step of position i + 1 in the order (0-based positions here).
PAPER_RANKS = torch.tensor([[3, 1, 0, 2]])
# Which (1-based) positions each position may see: the query stream sees z_<t, the content stream z_<=t.
PAPER_QUERY = {1: {2, 3, 4}, 2: {3}, 3: set(), 4: {2, 3}}
PAPER_CONTENT = {1: {1, 2, 3, 4}, 2: {2, 3}, 3: {3}, 4: {2, 3, 4}}


def visible_sets(allowed: torch.Tensor) -> dict[int, set[int]]:
    """allowed: (4, 4) bool -> {position: positions it may see}, 1-based as in the paper."""
    return {i + 1: {j + 1 for j in range(4) if allowed[i, j]} for i in range(4)}


def test_paper_example_perm_mask():
    perm_mask = perm_mask_from_ranks(PAPER_RANKS, torch.ones(1, 4))
    assert perm_mask.shape == (1, 4, 4)
    assert visible_sets(perm_mask[0] == 0) == PAPER_QUERY
    # The content stream also sees its own token: XLNetModel opens the diagonal.
    assert visible_sets((perm_mask[0] == 0) | torch.eye(4, dtype=torch.bool)) == PAPER_CONTENT


def test_paper_example_inside_the_model():
    """With a memory (so position 3, first in the order, has something to attend to), the attention
    probabilities over the segment are zero exactly where the paper's figure has no arrow."""
    torch.manual_seed(0)
    model = XLNetModel(XLNetConfig(**TINY)).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    perm_mask = perm_mask_from_ranks(PAPER_RANKS, torch.ones(1, 4))
    target_mapping = torch.eye(4)[None]  # predict every position, prediction m at position m
    with torch.no_grad():
        mems = model(torch.tensor([[9, 10, 11]])).mems
        out = model(ids, perm_mask=perm_mask, target_mapping=target_mapping, mems=mems, output_attentions=True)
    for probs_h, probs_g in zip(out.attentions, out.query_attentions, strict=True):
        assert probs_h.shape == probs_g.shape == (1, 4, 4, 3 + 4)  # (batch, heads, 4 queries, mem + seq keys)
        assert (probs_h[..., :3] > 0).all() and (probs_g[..., :3] > 0).all()  # the memory is always visible
        assert visible_sets((probs_h[0, :, :, 3:] > 0).all(0)) == PAPER_CONTENT
        assert visible_sets((probs_g[0, :, :, 3:] > 0).all(0)) == PAPER_QUERY
        assert ((probs_h[0, :, :, 3:] > 0) == (probs_h[0, :1, :, 3:] > 0)).all()  # same pattern in every head
        assert ((probs_g[0, :, :, 3:] > 0) == (probs_g[0, :1, :, 3:] > 0)).all()


def test_paper_example_no_information_leaks():
    """Position 1 comes last in the order: changing its token changes only its own content state.

    With a memory, as in the paper's figure. Without one, position 3's query stream has nothing to see and,
    as in transformers, attends uniformly to every key (hence num_targets always leaves some context).
    """
    torch.manual_seed(0)
    model = XLNetModel(XLNetConfig(**TINY)).eval()
    perm_mask = perm_mask_from_ranks(PAPER_RANKS, torch.ones(1, 4))
    with torch.no_grad():
        mems = model(torch.tensor([[9, 10, 11]])).mems
    kw = dict(perm_mask=perm_mask, target_mapping=torch.eye(4)[None], mems=mems)
    with torch.no_grad():
        a = model(torch.tensor([[5, 6, 7, 8]]), **kw)
        b = model(torch.tensor([[12, 6, 7, 8]]), **kw)
        c = model(torch.tensor([[5, 6, 13, 8]]), **kw)  # position 3 comes first: everyone sees it
    torch.testing.assert_close(a.query_last_hidden_state, b.query_last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(a.last_hidden_state[:, 1:], b.last_hidden_state[:, 1:], rtol=0, atol=0)
    assert (a.last_hidden_state[:, 0] - b.last_hidden_state[:, 0]).abs().max() > 1e-3
    # Changing position 3 changes every content state and the query states of 1, 2 and 4, but not its own.
    assert ((a.last_hidden_state - c.last_hidden_state).abs().amax(-1) > 1e-3).all()
    moved = (a.query_last_hidden_state - c.query_last_hidden_state).abs().amax(-1)[0] > 1e-3
    assert moved.tolist() == [True, True, False, True]


@pytest.mark.parametrize("span", [False, True])
@pytest.mark.parametrize("k", [6, 7, 2])
def test_partial_prediction_arithmetic(k, span):
    g = torch.Generator().manual_seed(k)
    b, t = 6, 40
    ids = torch.randint(10, 100, (b, t), generator=g)
    attention_mask = torch.ones(b, t, dtype=torch.long)
    lengths = [40, 37, 30, 13, 7, 2]
    for row, n in enumerate(lengths):
        attention_mask[row, : t - n] = 0  # left padding, as XLNet
    special = torch.zeros(b, t, dtype=torch.long)
    special[:, -2:] = 1  # <sep> <cls> at the end
    config = PermutationLMConfig(k=k, span_prediction=span)
    batch = sample_permutation_lm_batch(ids, config, attention_mask, special, generator=g)

    is_target = batch.target_mapping.sum(1) > 0  # (batch, seq)
    assert (batch.target_mapping.sum(2) <= 1).all() and (batch.target_mapping.sum(1) <= 1).all()  # one-hot
    for row, n in enumerate(lengths):
        real = attention_mask[row].bool()
        predictable = real & ~special[row].bool()
        count = int(is_target[row].sum())
        # ceil(n / K) of the n predictable tokens (n - 2 here), and at least one context token.
        assert count == min(math.ceil((n - 2) / k), n - 1) == num_targets(n - 2, n, k)
        assert not (is_target[row] & ~predictable).any()  # never padding, never special tokens
        # The targets are the last ones in the order; the ranks of real tokens are a permutation.
        ranks = batch.ranks[row]
        assert sorted(ranks[real].tolist()) == list(range(n)) and (ranks[~real] == -1).all()
        if count:
            assert ranks[is_target[row]].min() > ranks[real & ~is_target[row]].max()
            assert set(ranks[is_target[row]].tolist()) == set(range(n - count, n))
        if predictable.any():
            assert ranks[special[row].bool()].max() < ranks[predictable].min()  # specials first: seen by all
        # Labels are the target tokens, left to right, then -100.
        positions = is_target[row].nonzero().flatten()
        assert batch.labels[row, :count].tolist() == ids[row, positions].tolist()
        assert (batch.labels[row, count:] == -100).all()
        # perm_mask: a target sees exactly the tokens before it in the order; context never sees a target;
        # nobody sees padding.
        visible = batch.perm_mask[row] == 0
        for i in positions.tolist():
            assert visible[i].tolist() == ((ranks < ranks[i]) & real).tolist()
        context = (real & ~is_target[row]).nonzero().flatten()
        assert not visible[context][:, is_target[row]].any()
        assert visible[context][:, real & ~is_target[row]].all()  # bidirectional context (the release's choice)
        assert not visible[:, ~real].any()


def test_strict_order_for_the_context():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (3, 12), generator=g)
    config = PermutationLMConfig(k=3, bidirectional_context=False)
    batch = sample_permutation_lm_batch(ids, config, generator=g)
    expected = (batch.ranks[:, None, :] >= batch.ranks[:, :, None]).float()  # query stream: strictly earlier
    assert torch.equal(batch.perm_mask, expected)


def test_span_prediction_picks_consecutive_tokens():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (64, 60), generator=g)
    runs = []
    for span in (True, False):
        batch = sample_permutation_lm_batch(ids, PermutationLMConfig(k=6, span_prediction=span), generator=g)
        is_target = batch.target_mapping.sum(1) > 0
        assert (is_target.sum(1) == 10).all()  # ceil(60 / 6) either way
        runs.append(int((is_target[:, 1:] & is_target[:, :-1]).sum()))  # adjacent target pairs
    # With spans of 1..5 tokens (mean about 2.2), over half the targets have a target neighbour;
    # at random (10 of 60) about one in six does.
    assert runs[0] > 2 * runs[1]


def test_bad_arguments_are_named():
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"k must be at least 1"):
        sample_permutation_lm_batch(ids, PermutationLMConfig(k=0))
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \(2, 5\)"):
        sample_permutation_lm_batch(ids, attention_mask=torch.ones(5))
    with pytest.raises(ValueError, match=r"input_ids must be \(batch, seq\)"):
        sample_permutation_lm_batch(ids[0])


def test_a_sequence_of_one_token_has_no_target():
    ids = torch.tensor([[0, 0, 7]])
    batch = sample_permutation_lm_batch(ids, attention_mask=torch.tensor([[0, 0, 1]]))
    assert batch.target_mapping.shape == (1, 0, 3) and batch.labels.shape == (1, 0)


def test_training_steps_reduce_the_loss():
    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(**TINY)).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 20, (4, 12), generator=g)
    ids[:, -2:] = torch.tensor([4, 3])  # <sep> <cls>
    attention_mask = torch.ones_like(ids)
    attention_mask[2, :3] = 0
    special = torch.zeros_like(ids)
    special[:, -2:] = 1
    batch = sample_permutation_lm_batch(ids, PermutationLMConfig(k=3), attention_mask, special, generator=g)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(30):
        loss = model(**batch.model_inputs()).loss
        assert torch.isfinite(loss), f"step {step}: loss {loss}"
        optimizer.zero_grad()
        loss.backward()
        if step == 0:  # the prediction comes from the query stream, which starts at mask_emb
            assert model.transformer.mask_emb.grad.abs().sum() > 0
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(20), rel=0.3)
    assert losses[-1] < 0.5 * losses[0], losses
