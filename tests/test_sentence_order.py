"""Sentence-order prediction: the pair packer, the MLM + SOP loss against transformers, saving, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from ctxrep.data.corpus import CorpusConfig, pack_corpus
from ctxrep.data.packing import PackingError, SegmentPairConfig
from ctxrep.data.tokenizer_training import train_tokenizer
from ctxrep.models.albert import AlbertConfig, AlbertModel
from ctxrep.objectives.masked_lm import MaskedLMConfig
from ctxrep.objectives.sentence_order import SentenceOrderObjective, SentenceOrderPacker, sentence_order_loss


def sentence_text(d: int, s: int) -> str:
    """Sentence s of document d, in words that name their place (d0s1w0 ...), so tests can read positions."""
    return f"D{d}s{s}w0 d{d}s{s}w1 d{d}s{s}w2."


def write_docs(folder, sentences_per_doc: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for d, n in enumerate(sentences_per_doc):
        (folder / f"doc{d:02d}.txt").write_text("\n".join(sentence_text(d, s) for s in range(n)) + "\n")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny WordPiece tokenizer in which every word of the test documents is one token."""
    text = tmp_path_factory.mktemp("sop_text")
    write_docs(text, [12] * 3)
    out = tmp_path_factory.mktemp("sop_tok")
    train_tokenizer(text, "wordpiece", 3000, out, lowercase=True, min_frequency=1)
    return out


def pack(tmp_path, tokenizer_dir, sentences_per_doc):
    write_docs(tmp_path / "text", sentences_per_doc)
    return pack_corpus(
        tmp_path / "text", tokenizer_dir, tmp_path / "packed", CorpusConfig(num_workers=1), progress=False
    )


def parse(tokens: list[str]) -> list[tuple[int, int]]:
    """(document, sentence) of each whole sentence in tokens d{d}s{s}w0 w1 w2 '.'; asserts wholeness."""
    assert len(tokens) % 4 == 0, tokens
    out = []
    for i in range(0, len(tokens), 4):
        d, s = tokens[i][1:-2].split("s")
        assert tokens[i : i + 4] == [f"d{d}s{s}w0", f"d{d}s{s}w1", f"d{d}s{s}w2", "."], tokens
        out.append((int(d), int(s)))
    return out


def test_pairs_are_consecutive_segments_of_one_document_in_or_out_of_order(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [9, 6, 9])
    tok = corpus.load_tokenizer().backend
    # 15 = [CLS] + 12 + 2 [SEP]: chunks of 3 four-token sentences, so nothing is ever truncated.
    packer = SentenceOrderPacker(corpus, SegmentPairConfig(max_length=15, short_seq_prob=0.0, seed=3))
    seen, labels = [], []
    for _ in range(packer.epoch_size()):
        x = packer.next_instance()
        assert "next_sentence_label" not in x
        label = int(x["sentence_order_label"])
        labels.append(label)
        tokens = [tok.id_to_token(int(i)) for i in x["input_ids"]]
        sep = tokens.index("[SEP]")
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) <= 15
        assert x["token_type_ids"].tolist() == [0] * (sep + 1) + [1] * (len(tokens) - sep - 1)
        first, second = parse(tokens[1:sep]), parse(tokens[sep + 1 : -1])
        assert first and second
        in_text_order = first + second if label == 0 else second + first
        d0, s0 = in_text_order[0]
        assert in_text_order == [(d0, s0 + k) for k in range(len(in_text_order))], (label, first, second)
        seen += in_text_order
    assert set(labels) == {0, 1}
    assert sorted(seen) == [(d, s) for d, n in enumerate([9, 6, 9]) for s in range(n)]  # every sentence once


def test_labels_are_half_swapped_and_one_document_is_enough(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [200])
    packer = SentenceOrderPacker(corpus, SegmentPairConfig(max_length=30, seed=0))
    batches = [packer.next_batch(50) for _ in range(8)]
    labels = np.concatenate([b["sentence_order_label"] for b in batches])
    assert 0.4 < labels.mean() < 0.6
    assert all(b["input_ids"].shape == b["attention_mask"].shape and "next_sentence_label" not in b for b in batches)
    state = packer.state_dict()
    assert state["kind"] == "sentence_order"
    again = SentenceOrderPacker(corpus, SegmentPairConfig(max_length=30, seed=0))
    again.load_state_dict(state)
    assert np.array_equal(again.next_batch(4)["input_ids"], packer.next_batch(4)["input_ids"])


def test_too_small_corpus_is_refused(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [2])
    with pytest.raises(PackingError, match="fewer than one sequence of max_length=64"):
        SentenceOrderPacker(corpus, SegmentPairConfig(max_length=64))


def test_corpus_of_one_token_documents_is_refused(tmp_path, tokenizer_dir):
    (tmp_path / "text").mkdir()
    for d in range(3):  # each document one sentence of one token: no pair has a second segment
        (tmp_path / "text" / f"doc{d}.txt").write_text(f"d{d}s0w0\n")
    corpus = pack_corpus(
        tmp_path / "text", tokenizer_dir, tmp_path / "packed", CorpusConfig(num_workers=1), progress=False
    )
    assert corpus.num_tokens == 3
    with pytest.raises(PackingError, match="no segment pair can be made .* one sentence of one token"):
        SentenceOrderPacker(corpus, SegmentPairConfig(max_length=5)).next_instance()


TINY = dict(
    vocab_size=60,
    embedding_size=8,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=32,
)


def objective(**overrides) -> SentenceOrderObjective:
    torch.manual_seed(0)
    mlm = MaskedLMConfig(mask_token_id=4, special_token_ids=(0, 1, 2, 3, 4))
    return SentenceOrderObjective(AlbertConfig(**(TINY | overrides)), mlm)


def make_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 60, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    types = torch.zeros_like(ids)
    types[:, 7:] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types * mask,
        "sentence_order_label": torch.tensor([0, 1, 1]),
    }


def test_mlm_plus_sop_loss_matches_albert_for_pretraining(tmp_path):
    obj = objective().eval()
    batch = make_batch()
    torch.manual_seed(1)
    masked, labels = obj.masker(batch["input_ids"], batch["attention_mask"])
    assert (labels != -100).any()
    out = obj.loss(masked, labels, batch["attention_mask"], batch["token_type_ids"], batch["sentence_order_label"])
    obj.save_pretrained(tmp_path)
    ref = transformers.AlbertForPreTraining.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        r = ref(
            masked,
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            labels=labels,
            sentence_order_label=batch["sentence_order_label"],
        )
    assert float(out.loss.detach()) == pytest.approx(float(r.loss), abs=1e-5)
    assert out.metrics["sop_loss"] == pytest.approx(
        float(F.cross_entropy(r.sop_logits, batch["sentence_order_label"])), abs=1e-5
    )
    assert out.num_tokens == int(batch["attention_mask"].sum())
    # The saved folder's encoder loads in transformers' AutoModel and in ctxrep with the objective's outputs.
    auto = transformers.AutoModel.from_pretrained(tmp_path).eval()
    ours = AlbertModel.from_pretrained(tmp_path)
    with torch.no_grad():
        a = obj.encoder(batch["input_ids"]).last_hidden_state
        assert torch.allclose(auto(batch["input_ids"]).last_hidden_state, a, atol=1e-5)
        assert torch.equal(ours(batch["input_ids"]).last_hidden_state, a)


def test_sentence_order_loss_known_answer_and_bad_labels():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    expected = -(torch.log_softmax(logits[0], 0)[0] + torch.log_softmax(logits[1], 0)[1]) / 2
    assert float(sentence_order_loss(logits, torch.tensor([0, 1]))) == pytest.approx(float(expected), abs=1e-6)
    with pytest.raises(ValueError, match="must be 0 \\(A then B\\) or 1 \\(swapped\\), got values \\[0, 2\\]"):
        sentence_order_loss(logits, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="one label per sequence, shape \\(2,\\), got \\(3,\\)"):
        sentence_order_loss(logits, torch.tensor([0, 1, 0]))


def test_batch_without_sentence_order_labels_is_refused():
    batch = make_batch()
    del batch["sentence_order_label"]
    with pytest.raises(ValueError, match="no sentence_order_label: mlm\\+sop trains on SentenceOrderPacker batches"):
        objective()(batch)


def test_training_decreases_the_loss_for_every_sharing():
    for share in ("all", "attention"):
        obj = objective(share=share, hidden_dropout_prob=0.0, classifier_dropout_prob=0.0)
        opt = torch.optim.AdamW(obj.parameters(), lr=3e-3)
        batch = make_batch()
        torch.manual_seed(2)
        first = None
        for _ in range(40):
            torch.manual_seed(2)  # the same mask every step: the loss must fall
            loss = obj(batch).loss
            first = float(loss.detach()) if first is None else first
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert float(loss.detach()) < 0.5 * first, share
