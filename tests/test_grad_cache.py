"""Cached in-batch negatives (tasks/grad_cache.py): the gradients of a batch embedded in chunks equal the uncached
ones, dropout masks are replayed chunk for chunk, a fit with mini_batch_size trains the same model, and the settings
are checked in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from conftest import save_tiny_bert

from ctxrep.tasks.grad_cache import cached_embeddings
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.tasks.sparse_encoder import SparseSentenceEncoder

pytestmark = pytest.mark.usefixtures("one_thread")

A = ["a man plays a guitar", "a woman slices onions", "the stock market fell", "kids play in the park",
     "a dog runs on grass", "rain falls on the roof", "he reads a long book"]  # fmt: skip
B = ["someone plays music", "a person cuts vegetables", "shares dropped today", "children at a playground",
     "an animal in a field", "water on a house", "a man with a novel"]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("grad-cache")
    still = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return {
        "still": save_tiny_bert(root / "still", **still),
        "dropout": save_tiny_bert(root / "dropout", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
        "mlm": save_tiny_bert(root / "mlm", transformers.BertForMaskedLM, **still),
    }


def _gradients(encoder, mini_batch_size):
    """The encoder's parameter gradients of one mnrl batch (A, B), and the loss."""
    encoder.mini_batch_size = mini_batch_size
    module = encoder._trained_module().train()
    module.zero_grad()
    texts = sorted(set(A) | set(B))
    inputs = dict(zip(texts, encoder._inputs(texts)))
    torch.manual_seed(3)
    loss = encoder._batch_loss(list(zip(A, B)), None, inputs)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cls", [SentenceEncoder, SparseSentenceEncoder])
def test_cached_gradients_equal_the_uncached_ones(folders, cls):
    folder = folders["mlm" if cls is SparseSentenceEncoder else "still"]
    encoder = cls(str(folder), batch_size=len(A), random_state=0).fit(list(zip(A, B))[:2])  # loads, sets up
    loss, grads = _gradients(encoder, None)
    for mini in (1, 3):
        cached_loss, cached = _gradients(encoder, mini)
        assert cached_loss == pytest.approx(loss, rel=1e-5)
        assert cached.keys() == grads.keys() and len(grads) > 10
        for name, g in grads.items():
            torch.testing.assert_close(cached[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_dropout_masks_are_replayed_chunk_for_chunk(folders):
    """With dropout on, the recomputation of each chunk draws the masks of its first pass: the gradients equal those
    of embedding the same chunks one after the other with gradients kept (the same draws in the same order)."""
    encoder = SentenceEncoder(str(folders["dropout"]), batch_size=len(A), random_state=0).fit(list(zip(A, B))[:2])
    module = encoder._trained_module().train()
    records = encoder._inputs(A)

    def grads(embed):
        module.zero_grad()
        torch.manual_seed(5)
        vectors = embed(records)
        (vectors[:, 0] * torch.arange(1.0, len(A) + 1)).sum().backward()
        return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

    def chunked(items):
        return torch.cat([encoder._vectors(items[i : i + 2]) for i in range(0, len(items), 2)])

    reference, cached = grads(chunked), grads(lambda items: cached_embeddings(encoder._vectors, items, 2))
    for name, g in reference.items():
        torch.testing.assert_close(cached[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert not torch.equal(
        grads(encoder._vectors)["embeddings.word_embeddings.weight"], reference["embeddings.word_embeddings.weight"]
    )  # fmt: skip  (other masks: the check can tell)


def test_a_fit_with_mini_batches_trains_the_same_model(folders):
    X = list(zip(A, B))
    whole = SentenceEncoder(str(folders["still"]), batch_size=7, max_epochs=2, lr=1e-3, random_state=0).fit(X)
    cached = SentenceEncoder(
        str(folders["still"]), batch_size=7, mini_batch_size=2, max_epochs=2, lr=1e-3, random_state=0
    ).fit(X)
    np.testing.assert_allclose(
        [h["train_loss"] for h in cached.history_], [h["train_loss"] for h in whole.history_], rtol=1e-5
    )
    np.testing.assert_allclose(cached.encode(A), whole.encode(A), atol=1e-5)


def test_bad_mini_batch_sizes_are_refused_in_one_line(folders):
    X = list(zip(A, B))
    with pytest.raises(ValueError, match=r"mini_batch_size=8 is larger than batch_size=4.*at most batch_size"):
        SentenceEncoder(str(folders["still"]), batch_size=4, mini_batch_size=8).fit(X)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="mini_batch_size must be a positive integer or None"):
            SentenceEncoder(str(folders["still"]), batch_size=4, mini_batch_size=bad).fit(X)


def test_the_cli_takes_mini_batch_size(folders, tmp_path):
    from ctxrep.cli.sentence_encoder import train_sentence_encoder

    train = tmp_path / "pairs.tsv"
    train.write_text("text\ttext_pair\n" + "".join(f"{a}\t{b}\n" for a, b in zip(A, B)))
    args = ["--train", str(train), "--model", str(folders["still"]), "--batch-size", "4", "--mini-batch-size", "2"]
    result = CliRunner().invoke(train_sentence_encoder, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert SentenceEncoder.load(tmp_path / "out").mini_batch_size == 2
    result = CliRunner().invoke(train_sentence_encoder, [*args[:-2], "--mini-batch-size", "0", "--out", "x"])
    assert result.exit_code != 0 and "--mini-batch-size" in result.output
