"""Parity checks shared by the family test files: every hidden state and attention map against transformers."""

from __future__ import annotations

import torch

TOL = 1e-5


def padded_batch(vocab_size: int, lengths: list[int], pad_id: int, seed: int = 0, low: int = 3):
    """(input_ids, attention_mask), right-padded with pad_id; token ids drawn from [low, vocab_size)."""
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.full((len(lengths), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), t), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(low, vocab_size, (n,), generator=g)
        mask[i, :n] = 1
    return ids, mask


def assert_matches(ours, theirs, attention_mask: torch.Tensor, tol: float = TOL) -> None:
    """Every hidden state and every attention map within `tol` at the real (unpadded) positions; same counts."""
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    keep = attention_mask.bool()
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        diff = (a - b).abs()[keep].max().item()
        assert diff < tol, f"hidden state {i}: max |diff| {diff:.2e}"
    assert theirs.attentions is not None and len(ours.attentions) == len(theirs.attentions)
    q = keep[:, None, :, None]  # real queries
    for i, (a, b) in enumerate(zip(ours.attentions, theirs.attentions)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        diff = (a - b).abs().masked_select(q).max().item()
        assert diff < tol, f"attention {i}: max |diff| {diff:.2e}"
        if (~keep).any():  # padding keys get no attention
            assert a.masked_select(~keep[:, None, None, :]).abs().max().item() < 1e-6


TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a crane lifted the steel beam onto the roof",
    "contextual word vectors depend on the sentence around the word",
]


def assert_featurizer_matches_transformers(folder, model_class=None, texts=TEXTS, tol: float = TOL) -> None:
    """The whole pipeline: ctxrep's Featurizer (its tokenizer, special tokens, positions, batching with padding)
    gives every layer's vector of each word's last piece as transformers does on the raw text, tokenized by
    transformers' own tokenizer for the folder (word ids from its own split of the text)."""
    import numpy as np
    import transformers

    from ctxrep import Featurizer

    vecs = Featurizer(str(folder), layers="all", pooling="last", compile=False).embed_words(list(texts))
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ref = (model_class or transformers.AutoModel).from_pretrained(str(folder)).eval()
    for text, v in zip(texts, vecs):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            hs = ref(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_hidden_states=True)
        words = enc.word_ids()
        last = [max(i for i, w in enumerate(words) if w == k) for k in range(len(text.split()))]
        want = torch.stack(hs.hidden_states, dim=1)[0, :, last].transpose(0, 1).numpy()  # (words, layers, hidden)
        np.testing.assert_allclose(v, want, atol=tol)
