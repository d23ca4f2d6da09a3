"""Cross-attention alignments (translate/attention.py): pooling to words, layers and heads, greedy or given targets,
the PNG and the HTML page, and the errors of `ctxrep mt attention`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.image import imread
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import ctxrep
from ctxrep.models.marian import MarianConfig, MarianMTModel
from ctxrep.translate.attention import (
    Alignment,
    _split_ids,
    _split_text,
    alignment_html,
    alignment_png,
    cross_attention,
    pool_to_words,
    write_attention,
)
from ctxrep.translate.search import greedy_search, translate
from ctxrep.translate.tokenizer import MTTokenizer

LINES = [
    "a man in a blue shirt is standing on a ladder .",
    "two dogs play in the snow .",
    "ein mann in einem blauen hemd steht auf einer leiter .",
    "zwei hunde spielen im schnee .",
]
SOURCE = "a man in a blue shirt is standing on a ladder ."
TARGET = "zwei hunde spielen im schnee ."


@pytest.fixture(scope="module")
def mt_dir(tmp_path_factory):
    """A 2+2-layer model with 2 heads and a 60-piece BPE vocabulary (most words are several pieces, some begin
    with a bare "▁" piece), trained for a second to translate LINES[0:2] into LINES[2:4], so that its greedy
    output is a sentence of words and not a random run to the length limit."""
    path = tmp_path_factory.mktemp("mt-attention")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(LINES * 5, trainers.BpeTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"]))
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        dropout=0.0,
    )
    model = MarianMTModel(config)
    mt = MTTokenizer.from_model_dir(path)
    pairs = list(zip(mt.encode_source(LINES[:2]), mt.encode_target(LINES[2:])))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(80):
        loss = sum(model(torch.tensor([s]), labels=torch.tensor([t])).loss for s, t in pairs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def translator(mt_dir):
    return MarianMTModel.from_pretrained(mt_dir), MTTokenizer.from_model_dir(mt_dir)


def piece_attention(model, tokenizer, source: str, target: str) -> torch.Tensor:
    """The model's own cross_attentions for the pair: (layers, heads, target pieces incl. </s>, source pieces)."""
    src = torch.tensor(tokenizer.encode_source([source]))
    labels = torch.tensor(tokenizer.encode_target([target]))
    with torch.no_grad():
        out = model(src, labels=labels, output_attentions=True)
    return torch.stack([a[0] for a in out.cross_attentions])


def word_pieces(tokenizer, text: str) -> list[int]:
    """How many pieces each whitespace word of `text` is, encoded alone (</s> not counted)."""
    return [len(ids) - 1 for ids in tokenizer.encode_source(text.split())]


@pytest.mark.parametrize("layer, head", [(-1, None), (0, 1), (1, 0)])
def test_teacher_forced_weights_are_the_models_cross_attention_pooled_to_words(translator, layer, head):
    model, tok = translator
    a = cross_attention(model, tok, SOURCE, TARGET, layer=layer, head=head)
    probs = piece_attention(model, tok, SOURCE, TARGET)[layer]  # (heads, target pieces, source pieces)
    pieces = (probs.mean(0) if head is None else probs[head]).double().numpy()

    src_counts, tgt_counts = word_pieces(tok, SOURCE), word_pieces(tok, TARGET)
    assert max(src_counts) >= 3 and max(tgt_counts) >= 3  # the pooling is really tested on multi-piece words
    assert sum(src_counts) + 1 == pieces.shape[1] and sum(tgt_counts) + 1 == pieces.shape[0]
    src_spans = np.split(np.arange(pieces.shape[1]), np.cumsum(src_counts))  # the last span: </s>
    tgt_spans = np.split(np.arange(pieces.shape[0]), np.cumsum(tgt_counts))
    expected = np.array([[pieces[np.ix_(t, s)].sum(axis=1).mean() for s in src_spans] for t in tgt_spans])

    assert a.source_words == SOURCE.split() + ["</s>"]
    assert a.target_words == TARGET.split() + ["</s>"]
    assert a.weights.shape == (len(TARGET.split()) + 1, len(SOURCE.split()) + 1)
    np.testing.assert_allclose(a.weights, expected, atol=1e-6)
    np.testing.assert_allclose(a.weights.sum(axis=1), 1.0, atol=1e-5)
    assert a.teacher_forced and a.layer == layer % 2 and a.head == head and a.num_layers == 2


def test_greedy_target_is_the_models_translation_and_rows_sum_to_one(translator):
    model, tok = translator
    a = cross_attention(model, tok, SOURCE)
    translation = translate(model, tok, [SOURCE], beam=1)[0]
    assert translation == LINES[2]  # what the fixture's model learnt: a sentence of multi-piece words
    assert a.target_words == translation.split() + ["</s>"]
    assert not a.teacher_forced
    np.testing.assert_allclose(a.weights.sum(axis=1), 1.0, atol=1e-5)
    # The translation re-encodes to the pieces the model generated, so teacher-forcing it must give the same
    # weights: the words found by decoding the generated pieces are those found by encoding the words alone.
    assert (
        tok.encode_target([translation])[0][:-1] == greedy_search(model, torch.tensor(tok.encode_source([SOURCE])))[0]
    )
    np.testing.assert_allclose(cross_attention(model, tok, SOURCE, translation).weights, a.weights, atol=1e-6)


def test_words_from_decoded_pieces_agree_with_words_encoded_alone(translator):
    """The two ways of finding a word's pieces: encoding each word alone (given sentences), and decoding growing
    prefixes (generated ids). A bare "▁" piece (as in "on" = "▁", "o", "n") belongs to the word after it."""
    _, tok = translator
    for text in (SOURCE, TARGET, "two dogs standing on the ladder ."):
        encoded = _split_text(tok.encode_target, text, tok.eos_id)
        decoded = _split_ids(tok, tok.encode_target([text])[0][:-1])
        assert encoded is not None
        assert encoded.words == decoded.words == text.split() + ["</s>"]
        assert encoded.word_of == decoded.word_of
    on = tok.tokenizer.encode("on", add_special_tokens=False).tokens
    assert on[0] == "\u2581" and len(on) > 1  # the fixture's vocabulary has the case


def test_pool_to_words_sums_source_pieces_and_averages_target_pieces():
    pieces = np.array([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]])  # (target pieces, source pieces)
    words = pool_to_words(pieces, source_word_of=[0, 0, 1], target_word_of=[0, 1, 1])
    np.testing.assert_allclose(words, [[0.3, 0.7], [(0.6 + 0.75) / 2, (0.4 + 0.25) / 2]])


def test_png_is_written_with_a_size_that_fits_thirty_words(translator, tmp_path):
    model, tok = translator
    long_source = " ".join((SOURCE.split() * 3)[:30])
    a = cross_attention(model, tok, long_source, TARGET + " " + TARGET)
    assert len(a.source_words) == 31
    out = tmp_path / "align.png"
    alignment_png(a, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(out).shape
    assert width >= 31 * 25 and height >= 13 * 25  # at least 25 pixels per word: labels do not overlap


def test_html_page_escapes_user_text(translator, tmp_path):
    model, tok = translator
    evil = "<script>alert(1)</script> a man & 'dogs'"
    alignments = [
        cross_attention(model, tok, evil, '<img src=x onerror="alert(2)"> zwei'),
        cross_attention(model, tok, SOURCE),
    ]
    page = alignment_html(alignments, tmp_path / "align.html").read_text(encoding="utf-8")
    assert "<script" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in page
    assert page.count('<img src="data:image/png;base64,') == 2
    assert page.count("<section>") == 2 and "http" not in page.split("<body>")[1]  # nothing fetched from elsewhere


def test_model_without_cross_attention_is_a_one_line_error(minilm_path, tmp_path):
    bert = ctxrep.load_model(minilm_path)
    with pytest.raises(ValueError, match="a bert model has no decoder and so no cross-attention") as e:
        cross_attention(bert, None, "a man")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="holds a 'bert' model, not an encoder-decoder") as e:
        write_attention(minilm_path, "a man", tmp_path / "a.png")
    assert "\n" not in str(e.value)


def test_write_attention_writes_png_or_html_and_refuses_bad_arguments(mt_dir, tmp_path):
    a = write_attention(mt_dir, SOURCE, tmp_path / "out" / "a.png", target=TARGET, layer=0, head=1)
    assert isinstance(a, Alignment) and (tmp_path / "out" / "a.png").read_bytes()[:4] == b"\x89PNG"
    write_attention(mt_dir, SOURCE, tmp_path / "a.html")
    assert "<section>" in (tmp_path / "a.html").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match=r"a.pdf: the file name must end with .png or .html"):
        write_attention(mt_dir, SOURCE, tmp_path / "a.pdf")
    with pytest.raises(ValueError, match=r"layer 2 is out of range: the model has 2 decoder layers \(0..1, or -2..-1"):
        write_attention(mt_dir, SOURCE, tmp_path / "b.png", layer=2)
    with pytest.raises(ValueError, match=r"head -3 is out of range: the model has 2 decoder heads"):
        write_attention(mt_dir, SOURCE, tmp_path / "b.png", head=-3)
    with pytest.raises(ValueError, match="the source sentence is empty"):
        write_attention(mt_dir, "  ", tmp_path / "b.png")
    with pytest.raises(
        ValueError, match=r"the source has \d+ tokens \(with </s>\), more than the model's 64 positions"
    ):
        write_attention(mt_dir, " ".join(LINES * 3), tmp_path / "b.png")
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        write_attention(tmp_path / "missing", SOURCE, tmp_path / "b.png")
    assert not (tmp_path / "b.png").exists()


# ---- an OPUS-MT folder (SentencePiece pieces, <pad> last) ------------------------------------------------------

OPUS_LINES = [
    "A man in a blue shirt is standing on a ladder.",
    "Two dogs play in the snow.",
    "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    "Zwei Hunde spielen im Schnee.",
]


@pytest.fixture(scope="module")
def opus_dir(tmp_path_factory):
    """source.spm / target.spm (tiny unigram models trained here), vocab.json with <pad> last, a random model."""
    import json

    import sentencepiece as spm

    path = tmp_path_factory.mktemp("opus-attention")
    pieces = []
    for side, lines in (("source", OPUS_LINES[:2] * 8), ("target", OPUS_LINES[2:] * 8)):
        (path / f"{side}.txt").write_text("\n".join(lines) + "\n")
        spm.SentencePieceTrainer.train(
            input=str(path / f"{side}.txt"),
            model_prefix=str(path / side),
            vocab_size=40,
            model_type="unigram",
            character_coverage=1.0,
            hard_vocab_limit=False,
            minloglevel=2,
        )
        (path / f"{side}.model").rename(path / f"{side}.spm")
        sp = spm.SentencePieceProcessor(model_file=str(path / f"{side}.spm"))
        pieces += [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]  # after <unk> <s> </s>
    vocab = {"</s>": 0, "<unk>": 1, ">>de<<": 2}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        dropout=0.0,
    )
    MarianMTModel(config).save_pretrained(path)
    return path


def test_opus_sentencepiece_words_are_the_pieces_between_word_starts(opus_dir):
    tok = MTTokenizer.from_model_dir(opus_dir)
    source, target = ">>de<< " + OPUS_LINES[0], OPUS_LINES[2]
    src = _split_text(tok.encode_source, source, tok.eos_id)
    tgt = _split_text(tok.encode_target, target, tok.eos_id)
    assert src is not None and tgt is not None
    # SentencePiece's own word starts: a piece beginning with "▁" (and the language code, a token of its own)
    pieces = [">>de<<"] + tok.source_spm.encode(OPUS_LINES[0], out_type=str)
    starts = np.cumsum([p == ">>de<<" or p.startswith("\u2581") for p in pieces]) - 1
    assert src.word_of == [*starts.tolist(), len(source.split())]
    assert src.words == source.split() + ["</s>"] and max(np.bincount(starts)) >= 3
    assert _split_ids(tok, tgt.ids[:-1]).word_of == tgt.word_of  # decoding prefixes finds the same target words
    model = MarianMTModel.from_pretrained(opus_dir)
    a = cross_attention(model, tok, source, target)
    assert a.source_words[0] == ">>de<<" and a.target_words == target.split() + ["</s>"]
    np.testing.assert_allclose(a.weights.sum(axis=1), 1.0, atol=1e-5)
