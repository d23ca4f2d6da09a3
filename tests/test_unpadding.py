"""modules/unpadding.py: the rule on the mask and the moves between layouts (every family's use of it is checked by
tests/test_matrix.py::test_unpadded_batches)."""

import torch

from ctxrep.modules.unpadding import Unpadding, outputs_at_padding, unpadding_for

MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])  # 5 of 12 positions are padding


def test_the_rule_reads_the_share_of_padding():
    assert unpadding_for(MASK, 0.4).index.tolist() == [0, 1, 2, 3, 4, 5, 8]
    assert unpadding_for(MASK, 0.5) is None  # 42% padding is below the share
    assert unpadding_for(MASK, None) is None and unpadding_for(None, 0.0) is None
    assert unpadding_for(torch.ones(2, 3), 0.0) is None  # nothing to skip
    assert unpadding_for(torch.zeros(2, 3), 0.0) is None  # no real token


def test_outputs_at_padding_runs_every_batch_padded_until_it_ends():
    with outputs_at_padding():
        assert unpadding_for(MASK, 0.0) is None
        with outputs_at_padding():
            assert unpadding_for(MASK, 0.0) is None
        assert unpadding_for(MASK, 0.0) is None  # the inner block's end does not end the outer one
    assert unpadding_for(MASK, 0.0) is not None


def test_pad_and_unpad_are_inverse_on_real_tokens():
    unpadding = Unpadding.of(MASK.bool())
    x = torch.arange(12.0).view(3, 4)[..., None].expand(3, 4, 2)  # (batch, seq, 2), a strided view
    packed = unpadding.unpad(x)
    assert packed.shape == (7, 2) and torch.equal(unpadding.select(x.contiguous()), packed)
    back = unpadding.pad(packed)
    assert torch.equal(back[MASK.bool()], x[MASK.bool()]) and (back[~MASK.bool()] == 0).all()
    states = unpadding.pad_states([packed, packed + 1], output_hidden_states=False)
    assert len(states) == 1 and torch.equal(states[0][MASK.bool()], (packed + 1))
