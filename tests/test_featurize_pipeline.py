"""The featurizer's host pipeline: rows as whole arrays, raw-text sentence rows, every token's state (embed_tokens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from ctxrep import Featurizer
from ctxrep.text.inputs import EncoderInput, Rows, collate

LONG = " ".join(f"word{i % 7} crane lifted beams" for i in range(12))  # 60 words, over 100 pieces


def _old_collate(records, pad_id):
    """The per-row reference: one row at a time into padded tensors."""
    n = max(len(r.input_ids) for r in records)
    ids = torch.full((len(records), n), pad_id)
    types = torch.zeros((len(records), n), dtype=torch.long)
    mask = torch.zeros((len(records), n), dtype=torch.long)
    for i, r in enumerate(records):
        ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids)
        types[i, : len(r.input_ids)] = torch.tensor(r.token_type_ids)
        mask[i, : len(r.input_ids)] = 1
    return ids, types, mask


def test_rows_collate_as_the_row_by_row_reference_in_any_order():
    fz = Featurizer("minilm")
    records = [
        EncoderInput(0, [101, 7, 8, 102], [0, 0, 0, 0], 0),
        EncoderInput(1, [101, 9, 102, 5, 6, 102], [0, 0, 0, 1, 1, 1], 0),
        EncoderInput(2, [101, 102], [0, 0], 0),
    ]
    weights = [np.full(len(r.input_ids), k + 1.0, np.float32) for k, r in enumerate(records)]
    rows = Rows.from_records(records, weights)
    for order in ([0, 1, 2], [2, 0], [1]):
        batch, w = rows.collate(np.array(order), fz.tokenizer)
        ids, types, mask = _old_collate([records[i] for i in order], fz.tokenizer.pad_token_id)
        assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["token_type_ids"], types)
        assert torch.equal(batch["attention_mask"], mask)
        np.testing.assert_array_equal(w, mask.numpy() * np.array([[i + 1.0] for i in order]))
    assert torch.equal(collate(records, fz.tokenizer)["input_ids"], _old_collate(records, 0)[0])


def test_single_text_rows_are_the_templates_inputs(xlnet_dir):
    """Special tokens added with array operations equal SpecialTemplate.build_inputs (BERT: [CLS] A [SEP];
    XLNet: A <sep> <cls>, the classification token last)."""
    for name in ("minilm", xlnet_dir):
        tok = Featurizer(name).tokenizer
        pieces = [[5, 6, 7], [8], [9, 10]]
        rows = Rows.single_texts(
            tok.template, np.array(sum(pieces, []), np.int64), np.array([3, 1, 2]), np.array([4, 5, 6])
        )
        built = [tok.build_inputs(p) for p in pieces]
        assert rows.ids.tolist() == sum((b[0] for b in built), [])
        assert rows.types.tolist() == sum((b[1] for b in built), [])
        assert rows.text.tolist() == [4, 5, 6]
        assert rows.cls_position.tolist() == [tok.template.cls_index % len(b[0]) for b in built]


def test_sentence_rows_tokenize_the_raw_text_as_sentence_transformers(minilm_path):
    """A string is tokenized whole (as sentence-transformers does), not word by word: the model's sentence vector
    equals transformers' tokenizer + model on the raw string, odd spacing and a word that gives no pieces included."""
    texts = ["Unbelievably,   the newscaster\tbroke in!", "a \u200b b"]  # \u200b: a word with no pieces
    fz = Featurizer(minilm_path, sentence_pooling="model")
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = transformers.AutoModel.from_pretrained(minilm_path).eval()
    with torch.no_grad():
        ref = [torch.nn.functional.normalize(model(**tok(t, return_tensors="pt"))[0][0].mean(0), dim=0) for t in texts]
    np.testing.assert_allclose(fz.embed_sentences(texts), torch.stack(ref).numpy(), atol=1e-5)


def test_embed_tokens_are_the_models_states_with_special_tokens(minilm_path):
    fz = Featurizer(minilm_path, layers=[0, -1])
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = transformers.AutoModel.from_pretrained(minilm_path).eval()
    texts = ["The vase broke .", ["Pre", "tokenized", "words"]]
    out = fz.embed_tokens(texts)
    for text, (ids, states) in zip(texts, out, strict=True):
        enc = tok(text, is_split_into_words=not isinstance(text, str), return_tensors="pt")
        with torch.no_grad():
            hs = model(**enc, output_hidden_states=True).hidden_states
        assert ids.tolist() == enc["input_ids"][0].tolist()
        assert states.shape == (len(ids), 2, 384) and states.dtype == np.float32
        np.testing.assert_allclose(states[:, 1], hs[-1][0].numpy(), atol=1e-5)
        np.testing.assert_allclose(states[:, 0], hs[0][0].numpy(), atol=1e-5)
    # the model's own pooling is the mean of these states, normalised
    pooled = Featurizer(minilm_path, sentence_pooling="model").embed_sentences(texts)
    means = np.stack([s[:, 1].mean(0) for _, s in out])
    np.testing.assert_allclose(pooled, means / np.linalg.norm(means, axis=1, keepdims=True), atol=1e-5)


def test_embed_tokens_of_a_long_text_are_one_sequence_from_the_owning_windows(minilm_path):
    fz = Featurizer(minilm_path, max_length=24)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = transformers.AutoModel.from_pretrained(minilm_path).eval()
    ((ids, states),) = fz.embed_tokens([LONG])
    whole = tok(LONG)["input_ids"]
    assert ids.tolist() == whole and states.shape == (len(whole), 384)  # [CLS] every piece once [SEP]
    words = LONG.split()
    windows = fz.plan.single(0, fz.tokenizer.encode_words([words])[0])
    assert len(windows) > 2
    with torch.no_grad():
        first = model(input_ids=torch.tensor([windows[0].input_ids]))[0][0]
        last = model(input_ids=torch.tensor([windows[-1].input_ids]))[0][0]
    _, s, e = windows[0].words[0]  # the first word is the first window's
    np.testing.assert_allclose(states[:e], first[:e].numpy(), atol=1e-5)  # [CLS] and the first word's pieces
    np.testing.assert_allclose(states[-1], last[-1].numpy(), atol=1e-5)  # [SEP] from the last window


def test_embed_tokens_bad_input_names_the_text():
    fz = Featurizer("minilm")
    with pytest.raises(ValueError, match="text 1 is empty"):
        fz.embed_tokens(["fine", "   "])
    with pytest.raises(TypeError, match="text 0: expected a string or a list of word strings"):
        fz.embed_tokens([3])


# ---- late chunking: embed_sentences(chunks=...) ---------------------------------------------------------------------

DOC = "The crane lifted the beam. It was heavy! Then the workers went home."


def test_sentence_spans():
    from ctxrep.featurize import sentence_spans

    assert [DOC[a:b] for a, b in sentence_spans(DOC)] == [
        "The crane lifted the beam.",
        "It was heavy!",
        "Then the workers went home.",
    ]
    assert sentence_spans("  no end  ") == [(2, 8)]
    text = "e.g. this... and U.S. that"  # the rule is plain: any run of . ! ? before white space ends a sentence
    assert [text[a:b] for a, b in sentence_spans(text)] == ["e.g.", "this...", "and U.S.", "that"]


def test_late_chunks_are_means_of_the_whole_documents_token_states(minilm_path):
    """Each chunk's vector is the mean of its tokens' states from one forward pass over the whole document
    (transformers by hand), normalised as the folder's pooling is; not the vector of the chunk embedded alone."""
    fz = Featurizer(minilm_path, sentence_pooling="model")
    tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = transformers.AutoModel.from_pretrained(minilm_path).eval()
    enc = tok(DOC, return_offsets_mapping=True, return_tensors="pt")
    starts = enc.pop("offset_mapping")[0, 1:-1, 0].numpy()  # each piece's first character
    with torch.no_grad():
        states = model(**enc)[0][0, 1:-1].numpy()  # the pieces' states, no [CLS] / [SEP]
    (by_sentence,) = fz.embed_sentences([DOC], chunks="sentences")
    spans = [(0, 26), (27, 40), (41, 68)]
    (by_spans,) = fz.embed_sentences([DOC], chunks=[spans])
    assert by_sentence.shape == (3, 384)
    np.testing.assert_allclose(by_spans, by_sentence, atol=1e-6)
    for (a, b), vector in zip(spans, by_sentence):
        inside = (starts >= a) & (starts < b)
        mean = states[inside].mean(0)
        np.testing.assert_allclose(vector, mean / np.linalg.norm(mean), atol=1e-5)
    alone = fz.embed_sentences([DOC[a:b] for a, b in spans])
    assert np.all(np.abs((alone * by_sentence).sum(1)) < 0.999)  # the document's context changes them
    (by_tokens,) = Featurizer(minilm_path, sentence_pooling="mean").embed_sentences([DOC], chunks=4)
    n = len(starts)
    assert by_tokens.shape == (-(-n // 4), 384)
    np.testing.assert_allclose(by_tokens[-1], states[4 * (len(by_tokens) - 1) :].mean(0), atol=1e-5)


def test_late_chunks_of_a_long_document_take_every_window(minilm_path):
    fz = Featurizer(minilm_path, max_length=24, sentence_pooling="mean")
    text = ". ".join(f"Sentence {i} about a crane" for i in range(10)) + "."
    chunks = fz.embed_sentences([text, text], chunks="sentences")
    ((_, states),) = fz.embed_tokens([text])
    assert [c.shape for c in chunks] == [(10, 384), (10, 384)]
    first = len(fz.tokenizer.encode_texts([text[: text.index(".") + 1]])[0])  # the first sentence's pieces
    np.testing.assert_allclose(chunks[0][0], states[1 : 1 + first].mean(0), atol=1e-6)


def test_plain_chunks_are_each_chunk_embedded_alone(minilm_path):
    """late_chunking=False: the same chunks, each chunk's text embedded alone with the model's sentence pooling
    (Jina's naive chunking); late chunks (the default) differ from them where the document's context matters."""
    fz = Featurizer(minilm_path, sentence_pooling="model")
    spans = [(0, 26), (27, 40), (41, 68)]
    alone = fz.embed_sentences([DOC[a:b] for a, b in spans])
    (plain,) = fz.embed_sentences([DOC], chunks="sentences", late_chunking=False)
    (plain_spans,) = fz.embed_sentences([DOC], chunks=[spans], late_chunking=False)
    (late,) = fz.embed_sentences([DOC], chunks="sentences")
    np.testing.assert_allclose(plain, alone, atol=1e-6)
    np.testing.assert_allclose(plain_spans, alone, atol=1e-6)
    assert late.shape == plain.shape == (3, 384)
    assert np.all((late * plain).sum(1) < 0.999)  # "It was heavy!" alone is not the crane's beam
    # N tokens: the characters from a chunk's first token to the next chunk's, the same chunks as the late ones
    (by_tokens,) = fz.embed_sentences([DOC], chunks=4, late_chunking=False)
    (late_tokens,) = fz.embed_sentences([DOC], chunks=4)
    starts = [*fz.tokenizer.char_offsets([DOC])[0].tolist(), len(DOC)]
    texts = [DOC[starts[k] : starts[min(k + 4, len(starts) - 1)]].strip() for k in range(0, len(starts) - 1, 4)]
    np.testing.assert_allclose(by_tokens, fz.embed_sentences(texts), atol=1e-6)
    assert by_tokens.shape == late_tokens.shape
    # they take prompts and dimensions as embed_sentences does; word lists go by the words starting in a chunk
    (prompted,) = fz.embed_sentences([DOC], chunks="sentences", late_chunking=False, prompt="query: ", dimensions=64)
    np.testing.assert_allclose(
        prompted, fz.embed_sentences([DOC[a:b] for a, b in spans], prompt="query: ", dimensions=64), atol=1e-6
    )
    words = ["the", "crane", "lifted", "unbelievably", "heavy", "beams"]
    (by_words,) = fz.embed_sentences([words], chunks=3, late_chunking=False)
    n = len(fz.tokenizer.encode_words([words])[0].ids)
    assert len(by_words) == -(-n // 3)
    assert fz.embed_sentences([], chunks=2, late_chunking=False) == []


def test_late_chunks_bad_input():
    fz = Featurizer("minilm")
    with pytest.raises(ValueError, match="text 0: chunk 1 \\(30, 40\\) holds no token"):
        fz.embed_sentences(["short text"], chunks=[[(0, 5), (30, 40)]])
    with pytest.raises(ValueError, match="got 2 texts but chunk spans for 1"):
        fz.embed_sentences(["a", "b"], chunks=[[(0, 1)]])
    with pytest.raises(ValueError, match="text 0: chunks by characters .* need a string"):
        fz.embed_sentences([["pre", "split"]], chunks="sentences")
    with pytest.raises(ValueError, match="leave text_pairs out"):
        fz.embed_sentences(["a"], ["b"], chunks=2)
    with pytest.raises(ValueError, match="at least 1"):
        fz.embed_sentences(["a"], chunks=0)
    with pytest.raises(ValueError, match="chunks must be 'sentences'"):
        fz.embed_sentences(["a"], chunks="paragraphs")
    with pytest.raises(ValueError, match="chunks must be 'sentences'"):
        fz.embed_sentences(["a"], chunks="paragraphs", late_chunking=False)
    with pytest.raises(ValueError, match="late chunks take no prompt.*late_chunking=False"):
        fz.embed_sentences(["a b"], chunks=1, prompt="query: ")
    with pytest.raises(ValueError, match="text 0: chunk 1 \\(30, 40\\) holds no token"):
        fz.embed_sentences(["short text"], chunks=[[(0, 5), (30, 40)]], late_chunking=False)


def test_cut_texts_name_the_texts_a_window_cut(minilm_path):
    """Windows cut nothing; a word longer than a whole window is the one cut, and the call says which texts."""
    fz = Featurizer(minilm_path, max_length=8, sentence_pooling="model")  # windows of 6 pieces
    long_word = "pneumonoultramicroscopicsilicovolcanoconiosis"  # more than 6 pieces
    texts = ["a short text", f"one {long_word} here", " ".join(["crane"] * 20)]  # the third: windowed, not cut
    with pytest.warns(UserWarning, match="text 1: word 1 has .* subword pieces, more than a window"):
        fz.embed_words(texts)
    assert fz.cut_texts == [1]
    with pytest.warns(UserWarning):
        fz.embed_sentences(texts)
    assert fz.cut_texts == [1]
    fz.embed_sentences(texts[::2])
    assert fz.cut_texts == []
    with pytest.raises(ValueError, match="pair 0 is .* tokens long, more than the model's 8; sentence pairs are not"):
        fz.embed_words(["a b c d"], ["e f g h"])


def test_embed_ids_gives_the_sentence_vectors_of_the_texts_the_ids_come_from(minilm_path):
    texts = ["The vase broke .", "Unbelievably, the newscaster broke into the broadcast!", LONG]
    for pooling in ("model", "cls"):
        fz = Featurizer(minilm_path, sentence_pooling=pooling, max_length=64)  # LONG takes several windows
        ids = [fz.tokenizer.encode_texts([t])[0] for t in texts]
        np.testing.assert_allclose(fz.embed_ids(ids), fz.embed_sentences(texts), atol=1e-5)
    with pytest.raises(ValueError, match="ids 1: expected 1 or more token ids in 0..30521"):
        fz.embed_ids([[5, 6], [40000]])
    with pytest.raises(ValueError, match="embed_ids pools tokens without words: it needs sentence_pooling='model'"):
        Featurizer(minilm_path, sentence_pooling="mean").embed_ids([[5, 6]])


def test_token_pooler_pools_a_batch_as_its_rows_one_at_a_time():
    """TokenPooler.add works on whole batch arrays: a batch with two windows of one text, padding, and rows out of
    number order pools as the rows added one by one in number order (every mode; last-token reads the text's
    last-numbered window)."""
    from ctxrep.models.sentence_transformers import SentencePooling, TokenPooler

    rng = np.random.default_rng(0)
    pooling = SentencePooling(("mean", "max", "cls", "mean_sqrt_len", "lasttoken"), normalize=False, dim=4)
    selected = torch.from_numpy(rng.standard_normal((2, 5, 6, 4)).astype(np.float32))  # (layers, batch, seq, hidden)
    texts, numbers, cls = np.array([0, 1, 0, 2, 1]), np.array([3, 1, 4, 0, 2]), np.array([0, 0, 0, 5, 0])
    lengths = np.array([6, 3, 4, 6, 5])
    weights = (rng.random((5, 6)) + 0.5).astype(np.float32) * (np.arange(6) < lengths[:, None])  # 0 at padding
    weights[2, 1] = 0.0  # a position another window answers for
    whole = TokenPooler(pooling, 3, 2, 4)
    whole.add(selected, texts, weights, cls, numbers)
    one_by_one = TokenPooler(pooling, 3, 2, 4)
    for r in np.argsort(numbers):
        n = lengths[r]
        one_by_one.add(
            selected[:, r : r + 1, :n], texts[r : r + 1], weights[r : r + 1, :n], cls[r : r + 1], [numbers[r]]
        )
    np.testing.assert_allclose(whole.result(), one_by_one.result(), rtol=1e-6, atol=1e-7)
    assert whole.last_row.tolist() == [4, 2, 0]


def _budget_batches_one_at_a_time(lengths, budget):
    """The reference greedy cut: one sequence at a time, a new batch when the next would pass the budget."""
    sizes, size, longest = [], 0, 0
    for n in lengths:
        if size and max(longest, n) * (size + 1) > budget:
            sizes.append(size)
            size, longest = 0, 0
        size += 1
        longest = max(longest, n)
    return sizes + [size] if size else sizes


def test_token_budget_batches_cut_as_one_sequence_at_a_time():
    """The array search per batch (ascending lengths) cuts where the greedy loop does: zero lengths, sequences
    longer than the budget, and unsorted lengths (the loop itself) included."""
    from ctxrep.text.inputs import token_budget_batches

    rng = np.random.default_rng(0)
    for _ in range(500):
        lengths = rng.integers(0, rng.choice([2, 6, 60, 700]), size=rng.integers(0, 200)).tolist()
        budget = int(rng.choice([1, 7, 64, 2048]))
        for order in (sorted(lengths), lengths):
            assert token_budget_batches(order, budget) == _budget_batches_one_at_a_time(order, budget)
