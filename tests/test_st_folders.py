"""Sentence vectors as sentence-transformers 6 folders define them, against sentence-transformers' own encode on tiny
random folders it saved: last-token pooling (right padding on BERT, left padding on a Qwen3 decoder), Dense modules
(EmbeddingGemma's 2_Dense, 3_Dense), Normalize, and the folder's prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from ctxrep import Featurizer
from ctxrep.models.folders import CheckpointError
from ctxrep.models.sentence_transformers import read_prompts, read_sentence_pooling

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

TEXTS = [
    "A crane caught a fish .",
    "Unbelievably , the newscaster broke into the broadcast !",
    "Dawn broke .",
    "the quick brown fox jumps over the lazy dog while the crane lifted the steel beam",
]
PROMPTS = {"query": "query : ", "document": "", "classification": "classify the text :"}


def _bert(path: Path, minilm_path: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(minilm_path).save_pretrained(path)
    return path


def _save(modules: list, path: Path, **kwargs) -> Path:
    st.SentenceTransformer(modules=modules, **kwargs).save(str(path))
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory, minilm_path) -> Path:
    return _bert(tmp_path_factory.mktemp("bert"), minilm_path)


def _parity(folder: Path, texts=TEXTS, atol: float = 1e-5, **encode) -> np.ndarray:
    theirs = st.SentenceTransformer(str(folder)).encode(texts, batch_size=3, **encode)
    ours = Featurizer(folder, sentence_pooling="model", batch_tokens=64).embed_sentences(texts, **encode)
    np.testing.assert_allclose(ours, theirs, atol=atol)
    return ours


def test_last_token_pooling_right_padding(bert, tmp_path):
    folder = _save([Transformer(str(bert)), Pooling(32, pooling_mode="lasttoken")], tmp_path / "st")
    assert read_sentence_pooling(folder).modes == ("lasttoken",)
    ours = _parity(folder)
    reference = transformers.AutoModel.from_pretrained(bert).eval()
    tok = transformers.AutoTokenizer.from_pretrained(bert)
    with torch.no_grad():  # the last token is [SEP]: its state, one text at a time
        alone = reference(**tok(TEXTS[2], return_tensors="pt")).last_hidden_state[0, -1].numpy()
    np.testing.assert_allclose(ours[2], alone, atol=1e-5)


def test_dense_modules_then_normalize_as_embeddinggemma(bert, tmp_path):
    modules = [
        Transformer(str(bert)),
        Pooling(32, pooling_mode="mean"),
        Dense(32, 48, bias=False, activation_function=torch.nn.Identity()),
        Dense(48, 24, bias=True, activation_function=torch.nn.Tanh()),
        Normalize(),
    ]
    folder = _save(modules, tmp_path / "st")
    pooling = read_sentence_pooling(folder)
    assert len(pooling.dense) == 2 and pooling.width == 24 and pooling.normalize
    fz = Featurizer(folder, sentence_pooling="model")
    assert fz.sentence_dim == 24
    ours = _parity(folder)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_several_modes_in_the_configs_order(bert, tmp_path):
    folder = _save([Transformer(str(bert)), Pooling(32, pooling_mode=("lasttoken", "max", "mean"))], tmp_path / "st")
    assert read_sentence_pooling(folder).modes == ("lasttoken", "max", "mean")
    _parity(folder)


def test_dense_that_does_not_fit_is_refused(bert, tmp_path):
    modules = [Transformer(str(bert)), Pooling(32, pooling_mode="mean"), Dense(32, 8), Normalize()]
    folder = _save(modules, tmp_path / "st")
    config = json.loads((folder / "2_Dense" / "config.json").read_text())
    (folder / "2_Dense" / "config.json").write_text(json.dumps(config | {"in_features": 16}))
    with pytest.raises(
        CheckpointError, match=r"expected linear.weight of shape \(8, 16\) .* found linear.weight \(8, 32\)"
    ):
        read_sentence_pooling(folder)


def test_prompts_are_read_by_name(bert, tmp_path):
    folder = _save(
        [Transformer(str(bert)), Pooling(32, pooling_mode="mean")],
        tmp_path / "st",
        prompts=PROMPTS,
        default_prompt_name="query",
    )
    prompts = read_prompts(folder)
    assert prompts.resolve() == "query : " and prompts.resolve(prompt_name="document") == ""
    assert prompts.resolve(prompt="passage: ") == "passage: "
    with pytest.raises(
        ValueError,
        match=r"unknown prompt name 'passage': .* declares the prompts 'classification', 'document', 'query'",
    ):
        prompts.resolve(prompt_name="passage")
    assert read_prompts(bert).resolve() == ""  # a folder without config_sentence_transformers.json: no prompt


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_token_pooling_on_a_qwen3_decoder_padded_on_either_side(tmp_path, side):
    """Qwen3-Embedding's layout: the decoder, last-token pooling (its <|endoftext|>), Normalize; sentence-transformers
    pads on the tokenizer's side, ctxrep reads each row at its own last token."""
    from tests._decoders import tiny_folder

    decoder = tiny_folder(tmp_path / "qwen3", "qwen3")
    transformer = Transformer(str(decoder), processor_kwargs={"padding_side": side})
    transformer.tokenizer.padding_side = side
    if transformer.tokenizer.pad_token is None:
        transformer.tokenizer.pad_token = "<|endoftext|>"
    folder = _save([transformer, Pooling(32, pooling_mode="lasttoken"), Normalize()], tmp_path / "st")
    model = st.SentenceTransformer(str(folder))
    assert model.tokenizer.padding_side == side
    theirs = model.encode(TEXTS, batch_size=4)
    ours = Featurizer(folder, sentence_pooling="model").embed_sentences(TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


QWEN3_EMBEDDING_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": "",
}  # Qwen3-Embedding's config_sentence_transformers.json: a newline, no space after "Query:"


def test_qwen3_embedding_prompts_with_last_token_pooling_and_left_padding(tmp_path):
    """Qwen3-Embedding as published: the decoder padded on the left, last-token pooling, Normalize, and its query
    prompt put before each text with nothing between; documents take none."""
    from tests._decoders import tiny_folder

    decoder = tiny_folder(tmp_path / "qwen3", "qwen3")
    transformer = Transformer(str(decoder), processor_kwargs={"padding_side": "left"})
    transformer.tokenizer.padding_side = "left"
    transformer.tokenizer.pad_token = "<|endoftext|>"
    modules = [transformer, Pooling(32, pooling_mode="lasttoken"), Normalize()]
    folder = _save(modules, tmp_path / "st", prompts=QWEN3_EMBEDDING_PROMPTS)
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["prompts"] == QWEN3_EMBEDDING_PROMPTS
    model = st.SentenceTransformer(str(folder))
    assert model.tokenizer.padding_side == "left"
    fz = Featurizer(folder, sentence_pooling="model")
    queries = fz.embed_sentences(TEXTS, prompt_name="query")
    np.testing.assert_allclose(queries, model.encode(TEXTS, batch_size=3, prompt_name="query"), atol=1e-5)
    documents = fz.embed_sentences(TEXTS, prompt_name="document")
    np.testing.assert_allclose(documents, model.encode(TEXTS, batch_size=3, prompt_name="document"), atol=1e-5)
    np.testing.assert_allclose(documents, fz.embed_sentences(TEXTS), atol=1e-6)  # no default prompt: none
    by_hand = fz.embed_sentences([QWEN3_EMBEDDING_PROMPTS["query"] + t for t in TEXTS])
    np.testing.assert_allclose(queries, by_hand, atol=1e-5)  # the prompt, then the text: no space put between
    assert not np.allclose(queries, documents, atol=1e-3)


def test_prompt_before_texts_and_its_positions(minilm_path):
    from ctxrep.models.sentence_transformers import prompt_positions, with_prompt
    from ctxrep.text.tokenizer import Tokenizer

    assert with_prompt("query : ", ["a dog", ["pre", "split"]]) == ["query : a dog", ["query", ":", "pre", "split"]]
    assert with_prompt("", ["a dog"]) == ["a dog"]
    tok = Tokenizer.from_model_dir(minilm_path)
    hf = transformers.AutoTokenizer.from_pretrained(minilm_path)
    ids = hf("query : ")["input_ids"]  # [CLS] query : [SEP]: sentence-transformers drops the trailing [SEP]
    assert prompt_positions(tok, "query : ") == len(ids) - 1 == 3
    assert prompt_positions(tok, "") == 0


# ---- prompts and dimensions on the Featurizer's sentence path --------------------------------------------------


@pytest.fixture(scope="module")
def prompted(bert, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prompted") / "st"
    modules = [Transformer(str(bert)), Pooling(32, pooling_mode="mean"), Normalize()]
    return _save(modules, folder, prompts=PROMPTS, default_prompt_name="query")


@pytest.mark.parametrize(
    "encode", [{}, {"prompt_name": "classification"}, {"prompt_name": "document"}, {"prompt": "passage : "}]
)
def test_prompts_match_sentence_transformers_encode(prompted, encode):
    _parity(prompted, **encode)  # {}: the folder's default prompt ("query : "), as sentence-transformers applies it


@pytest.mark.parametrize("include_prompt", [False, True])
def test_include_prompt_as_sentence_transformers(bert, tmp_path, include_prompt):
    modules = [Transformer(str(bert)), Pooling(32, pooling_mode=("mean", "max"), include_prompt=include_prompt)]
    folder = _save(modules, tmp_path / "st", prompts=PROMPTS)
    assert read_sentence_pooling(folder).include_prompt == include_prompt
    ours = _parity(folder, prompt_name="classification")
    plain = Featurizer(folder, sentence_pooling="model").embed_sentences(TEXTS, prompt="")
    assert not np.allclose(ours, plain, atol=1e-3)  # the prompt changes every token's state either way


def test_unknown_prompt_name_is_one_line(prompted):
    fz = Featurizer(prompted, sentence_pooling="model")
    with pytest.raises(ValueError, match=r"unknown prompt name 'passage': .* declares the prompts") as e:
        fz.embed_sentences(TEXTS, prompt_name="passage")
    assert "\n" not in str(e.value)


def test_dimensions_truncate_then_renormalise_as_sentence_transformers(prompted):
    theirs = st.SentenceTransformer(str(prompted), truncate_dim=16).encode(TEXTS, normalize_embeddings=True)
    ours = Featurizer(prompted, sentence_pooling="model").embed_sentences(TEXTS, dimensions=16)
    assert ours.shape == (len(TEXTS), 16)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    with pytest.raises(ValueError, match="dimensions=33 is more than this model's 32-wide sentence vectors"):
        Featurizer(prompted, sentence_pooling="model").embed_sentences(TEXTS, dimensions=33)


def test_last_token_of_a_long_text_is_its_last_windows(bert, tmp_path):
    """A text longer than one window: the last token is the [SEP] of its last window (cut as the featurizer cuts
    it), whatever order the length-sorted batches run the windows in."""
    from ctxrep.text.inputs import split_windows

    folder = _save([Transformer(str(bert)), Pooling(32, pooling_mode="lasttoken")], tmp_path / "st")
    words = ("the quick brown fox jumps over the lazy dog while a crane lifts the beam " * 8).split()
    fz = Featurizer(folder, sentence_pooling="model", batch_tokens=128)
    ours = fz.embed_sentences([" ".join(words), "Dawn broke ."])
    tok = transformers.AutoTokenizer.from_pretrained(bert)
    enc = tok(words, is_split_into_words=True, add_special_tokens=False)
    word_ids = enc.word_ids()
    spans = [(word_ids.index(w), len(word_ids) - word_ids[::-1].index(w)) for w in range(len(words))]
    cuts = split_windows(spans, fz.plan.window_size, fz.plan.stride)
    assert len(cuts) > 2
    p0, p1, _ = cuts[-1]
    row = torch.tensor([[tok.cls_token_id, *enc["input_ids"][p0:p1], tok.sep_token_id]])
    with torch.no_grad():
        last = transformers.AutoModel.from_pretrained(bert).eval()(input_ids=row).last_hidden_state[0, -1]
    np.testing.assert_allclose(ours[0], last.numpy(), atol=1e-5)


def test_embeddinggemma_layout_matches_sentence_transformers(tmp_path):
    """EmbeddingGemma: a bidirectional Gemma 3 decoder, mean pooling, two bias-free Dense projections (up, then
    down, identity activations), Normalize; with its query prompt."""
    from tests._decoders import tiny_folder

    decoder = tiny_folder(tmp_path / "gemma", "gemma3_text", use_bidirectional_attention=True)
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|endoftext|>"}  # not Gemma's SentencePiece
    (decoder / "tokenizer_config.json").write_text(json.dumps(settings))
    transformer = Transformer(str(decoder))
    modules = [
        transformer,
        Pooling(32, pooling_mode="mean"),
        Dense(32, 64, bias=False, activation_function=torch.nn.Identity()),
        Dense(64, 24, bias=False, activation_function=torch.nn.Identity()),
        Normalize(),
    ]
    folder = _save(modules, tmp_path / "st", prompts={"query": "task: search result | query: ", "document": ""})
    assert Featurizer(folder, sentence_pooling="model").sentence_dim == 24
    _parity(folder)
    _parity(folder, prompt_name="query")
