"""modules/unpadding.py: the rule on the mask and the moves between layouts (every family's use of it is checked by
tests/test_matrix.py::test_unpadded_batches)."""

import numpy as np
import torch

from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding, unpadding_for

MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])  # 5 of 12 positions are padding


def test_the_rule_reads_the_share_of_padding():
    assert unpadding_for(MASK, 0.4).index.tolist() == [0, 1, 2, 3, 4, 5, 8]
    assert unpadding_for(MASK, 0.5) is None  # 42% padding is below the share
    assert unpadding_for(MASK, None) is None and unpadding_for(None, 0.0) is None
    assert unpadding_for(torch.ones(2, 3), 0.0) is None  # nothing to skip
    assert unpadding_for(torch.zeros(2, 3), 0.0) is None  # no real token


def test_padded_runs_give_the_padded_runs_outputs_at_padding():
    """`Encoder.encode(batch, padded=True)` and `Featurizer.run_rows(..., padded=True)` (ColBERT's [MASK] query
    expansion reads positions whose attention_mask is 0): the padded run's outputs at every position, padding
    included, where the family's rule would unpad this batch and leave 0 there."""
    from ctxrep.featurize import Featurizer
    from ctxrep.featurize.rows import sentence_rows

    fz = Featurizer("minilm", layers="all", sentence_pooling="cls")
    m = fz.model.eval()
    texts = ["a", "a crane lifted the steel beam onto the roof of the tall building", "two words"]
    rows = sentence_rows(fz.tokenizer, fz.plan, texts, False).rows
    order = np.argsort(rows.lengths, kind="stable")  # run_rows' order; the three rows make one batch
    batch = rows.collate(order, fz.tokenizer)[0]
    real = batch["attention_mask"].bool()
    assert m.unpadding(batch["attention_mask"]) is not None  # the rule unpads this batch (59% padding)
    assert m.unpadding(batch["attention_mask"], padded=True) is None
    with torch.inference_mode():
        default, forced = m.encode(batch), m.encode(batch, padded=True)
        m.unpad_from = None  # this family's padded run
        reference = m.encode(batch)
        m.unpad_from = UNPAD_FROM
    for a, b, c in zip(reference.hidden_states, forced.hidden_states, default.hidden_states, strict=True):
        assert torch.equal(b, a)  # every position, padding included
        assert (c[~real] == 0).all() and (a[~real] != 0).any()
        torch.testing.assert_close(c[real], a[real], atol=1e-5, rtol=1e-4)
    seen = {}

    def consume(selected, batch_rows, weights):
        seen[padded] = (selected.clone(), batch_rows.copy())

    for padded in (False, True):
        fz.run_rows(rows, consume, padded=padded)
    states, batch_rows = seen[True]
    assert batch_rows.tolist() == order.tolist()
    # (layers, batch, seq, hidden), padding included; the runtime may run a pre-packed copy (runtime.hardware)
    torch.testing.assert_close(states, torch.stack(reference.hidden_states), atol=1e-5, rtol=1e-4)
    assert (seen[False][0][:, ~real] == 0).all()


def test_pad_and_unpad_are_inverse_on_real_tokens():
    unpadding = Unpadding.of(MASK.bool())
    x = torch.arange(12.0).view(3, 4)[..., None].expand(3, 4, 2)  # (batch, seq, 2), a strided view
    packed = unpadding.unpad(x)
    assert packed.shape == (7, 2) and torch.equal(unpadding.select(x.contiguous()), packed)
    back = unpadding.pad(packed)
    assert torch.equal(back[MASK.bool()], x[MASK.bool()]) and (back[~MASK.bool()] == 0).all()
    states = unpadding.pad_states([packed, packed + 1], output_hidden_states=False)
    assert len(states) == 1 and torch.equal(states[0][MASK.bool()], (packed + 1))
