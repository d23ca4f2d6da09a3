"""Sparse vectors (issue 34, item 1): SPLADE over a masked-LM head and BGE-M3's sparse_linear, equal to
sentence-transformers' SparseEncoder on a tiny random folder; the inverted index's dot-product search."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from ctxrep.featurize.spec import SpecMismatch
from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import resolve_model_path
from ctxrep.vectors.hits import Hits
from ctxrep.vectors.sparse import (
    SPARSE_HEADS,
    BgeM3Head,
    SparseEncoder,
    SparseIndex,
    SparseVector,
    SpladeHead,
    SpladeSettings,
    is_sparse_folder,
)

TEXTS = [
    "A man is playing a guitar .",
    "Stocks fell sharply on Monday , and the market never recovered .",
    "The cat sleeps on the sofa .",
    "guitar guitar guitar",
]


def _mlm_folder(path: Path, model_type: str = "bert") -> Path:
    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if model_type == "bert":
        model = transformers.BertForMaskedLM(
            transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, **common)
        )
    else:
        config = transformers.RobertaConfig(vocab_size=30522, max_position_embeddings=66, **common)
        model = transformers.RobertaForMaskedLM(config)
    with torch.no_grad():  # a bias that spreads the weights, so that many ids are non-zero
        for name, p in model.named_parameters():
            if name.endswith("predictions.bias") or name == "lm_head.bias":
                p.normal_(0.0, 1.0)
    model.save_pretrained(path)
    src = resolve_model_path("minilm")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(src / name, path / name)
    return path


@pytest.fixture(scope="module")
def splade_folder(tmp_path_factory) -> Path:
    """A sentence-transformers SparseEncoder folder (MLMTransformer + SpladePooling max), written by ST itself."""
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    mlm = _mlm_folder(tmp_path_factory.mktemp("mlm"))
    out = tmp_path_factory.mktemp("splade")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        STSparseEncoder(modules=[MLMTransformer(str(mlm)), SpladePooling("max")], device="cpu").save(str(out))
    return out


def _reference(folder: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SparseEncoder as STSparseEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = STSparseEncoder(str(folder), device="cpu")
        return st.encode(texts, convert_to_tensor=True).to_dense().numpy()


def test_splade_folder_equals_sentence_transformers(splade_folder):
    encoder = SparseEncoder(splade_folder)
    assert encoder.head.settings == SpladeSettings("max", "relu") and encoder.vocab_size == 30522
    m = encoder.embed_sentences(TEXTS)
    assert m.shape == (len(TEXTS), 30522) and m.dtype == np.float32
    expected = _reference(splade_folder, TEXTS)
    np.testing.assert_allclose(m.toarray(), expected, atol=1e-5)
    assert (m.toarray() > 0).sum() == (expected > 0).sum()  # the same support
    states = encoder.featurizer.embed_tokens(TEXTS)  # blocks of one text each (and empty input) change nothing
    # beyond the float rounding of a product of another shape (bit-equal on AVX-512 VNNI, not under AVX2's kernels)
    np.testing.assert_allclose(encoder._rows(states, block_tokens=1).toarray(), m.toarray(), atol=1e-6)
    assert encoder._rows([]).shape == (0, 30522)
    # the server's form: ids ascending, the same weights
    v = encoder.embed_sparse(TEXTS[:1])[0]
    assert isinstance(v, SparseVector) and v.indices == sorted(v.indices)
    np.testing.assert_allclose(v.values, expected[0, v.indices], atol=1e-5)
    assert v.to_tei()[0] == {"index": v.indices[0], "value": v.values[0]}
    top = encoder.decode(m[0], top_k=3)
    assert len(top) == 3 and top[0][1] == pytest.approx(expected[0].max(), abs=1e-5)


def test_sum_pooling_log1p_relu_and_max_active_dims(splade_folder, tmp_path):
    folder = tmp_path / "sum"
    shutil.copytree(splade_folder, folder)
    (folder / "1_SpladePooling" / "config.json").write_text(
        json.dumps({"pooling_strategy": "sum", "activation_function": "log1p_relu", "embedding_dimension": None})
    )
    np.testing.assert_allclose(
        SparseEncoder(folder).embed_sentences(TEXTS).toarray(), _reference(folder, TEXTS), atol=1e-5
    )
    top = SparseEncoder(splade_folder, max_active_dims=7).embed_sentences(TEXTS).toarray()
    full = _reference(splade_folder, TEXTS)
    assert ((top > 0).sum(axis=1) == 7).all()
    for row, ref in zip(top, full):  # the 7 largest weights of each full vector
        np.testing.assert_allclose(np.sort(row[row > 0]), np.sort(ref)[-7:], atol=1e-5)


PROMPTS = {"query": "query: ", "document": "passage: ", "instruct": "Instruct: find the topic\nQuery:"}


def _with_prompts(folder: Path, dest: Path, default: str | None = "instruct") -> Path:
    """A copy of `folder` whose config_sentence_transformers.json declares PROMPTS (default prompt: `default`)."""
    shutil.copytree(folder, dest)
    settings = json.loads((dest / "config_sentence_transformers.json").read_text())
    settings |= {"prompts": PROMPTS, "default_prompt_name": default}
    (dest / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return dest


def test_prompts_equal_sentence_transformers_encode_query_and_document(splade_folder, tmp_path):
    from sentence_transformers import SparseEncoder as STSparseEncoder

    folder = _with_prompts(splade_folder, tmp_path / "prompts")
    encoder = SparseEncoder(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = STSparseEncoder(str(folder), device="cpu")
    dense = lambda m: m.toarray()  # noqa: E731
    st_dense = lambda t: t.to_dense().numpy()  # noqa: E731
    cases = [  # (ours, theirs): no prompt given (the default / the task's), a name, a text, an empty text
        (encoder.embed_sentences(TEXTS), st.encode(TEXTS)),
        (encoder.embed_queries(TEXTS), st.encode_query(TEXTS)),
        (encoder.embed_documents(TEXTS), st.encode_document(TEXTS)),
        (encoder.embed_queries(TEXTS, prompt_name="instruct"), st.encode_query(TEXTS, prompt_name="instruct")),
        (encoder.embed_documents(TEXTS, prompt="title: none | "), st.encode_document(TEXTS, prompt="title: none | ")),
        (encoder.embed_sentences(TEXTS, prompt=""), st.encode(TEXTS, prompt="")),
    ]
    for ours, theirs in cases:
        np.testing.assert_allclose(dense(ours), st_dense(theirs), atol=1e-5)
    # the prompts change the vectors (the checks above are not vacuous), and the server's form takes them too
    assert np.abs(dense(cases[1][0]) - dense(cases[2][0])).max() > 1e-3
    v = encoder.embed_sparse(TEXTS[:1], prompt_name="query")[0]
    np.testing.assert_allclose(v.values, dense(cases[1][0])[0, v.indices], atol=1e-6)
    with pytest.raises(ValueError, match=r"^unknown prompt name 'nope': .* declares the prompts 'query', 'document', "):
        encoder.embed_queries(TEXTS, prompt_name="nope")
    with pytest.raises(ValueError, match="give prompt or prompt_name, not both"):
        encoder.embed_sparse(TEXTS, prompt="x", prompt_name="query")


def test_a_plain_roberta_mlm_folder_long_texts_and_errors(tmp_path, tiny_models):
    folder = _mlm_folder(tmp_path / "rob", "roberta")
    encoder = SparseEncoder(folder)
    model = transformers.RobertaForMaskedLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(TEXTS[1], return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[0]
    expected = torch.log1p(torch.relu(logits)).amax(dim=0).numpy()
    np.testing.assert_allclose(encoder.embed_sentences([TEXTS[1]]).toarray()[0], expected, atol=1e-5)
    long = " ".join(["word"] * 150)  # longer than the 64 positions: windowed, never truncated
    assert encoder.embed_sentences([long]).nnz > 0
    with pytest.raises(CheckpointError, match="no masked-LM head .* sparse vectors need a SPLADE checkpoint"):
        SparseEncoder(tiny_models["bert"])
    with pytest.raises(ValueError, match="max_active_dims must be a positive integer"):
        SparseEncoder(folder, max_active_dims=0)


def test_modules_ctxrep_does_not_apply_are_refused(splade_folder, tmp_path):
    folder = tmp_path / "router"
    shutil.copytree(splade_folder, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Router", "type": "sentence_transformers.base.modules.Router"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="lists Router, which ctxrep's SparseEncoder does not apply"):
        SparseEncoder(folder)


def test_bge_m3_sparse_linear(tmp_path):
    folder = _mlm_folder(tmp_path / "m3")
    torch.manual_seed(1)
    linear = torch.nn.Linear(32, 1)
    torch.save(linear.state_dict(), folder / "sparse_linear.pt")
    encoder = SparseEncoder(folder)
    assert isinstance(encoder.head, BgeM3Head)  # the folder holds an MLM head too: the table's first row wins
    model = transformers.BertModel.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(TEXTS[3], return_tensors="pt")
    with torch.no_grad():
        weights = torch.relu(linear(model(**batch).last_hidden_state[0])).squeeze(-1)
    expected: dict[int, float] = {}  # FlagEmbedding's _process_token_weights: max per id, specials left out
    for i, w in zip(batch["input_ids"][0].tolist(), weights.tolist()):
        if i not in (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id) and w > 0:
            expected[i] = max(expected.get(i, 0.0), w)
    got = encoder.embed_sparse([TEXTS[3]])[0]
    assert got.indices == sorted(expected)
    np.testing.assert_allclose(got.values, [expected[i] for i in got.indices], atol=1e-5)


def test_sparse_index_dot_product_search_round_trip(splade_folder, tmp_path):
    encoder = SparseEncoder(splade_folder)
    index = SparseIndex.build(TEXTS, encoder)
    hits = index.search(TEXTS[2], k=2)
    docs, q = encoder.embed_sentences(TEXTS).toarray(), encoder.embed_sentences([TEXTS[2]]).toarray()[0]
    order = np.argsort(-(docs @ q))[:2]
    assert hits.ids == order.tolist() and hits.texts == [TEXTS[i] for i in order]
    np.testing.assert_allclose(hits.scores, (docs @ q)[order], rtol=1e-5)
    index.save(tmp_path / "sx")
    back = SparseIndex.load(tmp_path / "sx")  # text queries rebuild the encoder from the saved spec
    again = back.search([TEXTS[2], TEXTS[0]], k=2)
    assert again[0].ids == hits.ids
    np.testing.assert_allclose(again[0].scores, hits.scores, rtol=1e-5)
    with pytest.raises(ValueError, match="id 0 is already in the index"):
        back.add_vectors(encoder.embed_sentences(TEXTS[:1]), ids=[0])
    with pytest.raises(SpecMismatch, match="max_length 64 != 32"):  # other windows: other vectors
        SparseIndex.load(tmp_path / "sx", encoder=SparseEncoder(splade_folder, max_length=32))
    with pytest.raises(ValueError, match="not a sparse index"):
        SparseIndex.load(tmp_path)


def test_cli_index_build_sparse_and_search(splade_folder, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main

    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n")
    runner = CliRunner()
    args = ["index", "build", "--input", str(tmp_path / "t.txt"), "--model", str(splade_folder), "--sparse"]
    out = runner.invoke(main, args + ["--out", str(tmp_path / "sx")])
    assert out.exit_code == 0, out.output
    assert "indexed 4 texts (sparse vectors)" in out.output
    out = runner.invoke(main, ["search", "--index", str(tmp_path / "sx"), "--query", TEXTS[2], "-k", "2"])
    assert out.exit_code == 0, out.output
    expected = SparseIndex.build(TEXTS, SparseEncoder(splade_folder)).search(TEXTS[2], k=2)
    rows = [line.split("\t") for line in out.output.strip().splitlines()[1:]]
    assert [int(r[3]) for r in rows] == expected.ids and [r[4] for r in rows] == expected.texts
    out = runner.invoke(main, args + ["--late-interaction", "--out", str(tmp_path / "x")])
    assert out.exit_code == 1 and "give --sparse or --late-interaction, not both" in out.output
    out = runner.invoke(main, args + ["--layers", "0", "--out", str(tmp_path / "x")])
    assert out.exit_code == 1 and "--sparse reads the last layer" in out.output


def test_embed_output_sparse_round_trips_through_load_vectors(splade_folder, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main
    from ctxrep.vectors.store import load_vectors

    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n")
    args = ["embed", "--input", str(tmp_path / "t.txt"), "--model", str(splade_folder), "--level", "sentence"]
    out = CliRunner().invoke(main, args + ["--output", "sparse", "--shard-size", "3", "--out", str(tmp_path / "o")])
    assert out.exit_code == 0, out.output
    encoder = SparseEncoder(splade_folder)
    vectors = load_vectors(tmp_path / "o", expect=encoder)
    assert vectors.sparse and len(vectors) == 4 and vectors.row_shape == (30522,) and vectors.spec.head == "sparse"
    expected = encoder.embed_sentences([t.split() for t in TEXTS]).toarray()  # embed reads words
    np.testing.assert_allclose(vectors.array.toarray(), expected, atol=1e-6)
    np.testing.assert_allclose(vectors[3].toarray()[0], expected[3], atol=1e-6)  # the second shard
    with pytest.raises(SpecMismatch, match="head 'sparse' != 'dense'"):
        vectors.check(encoder.featurizer)
    # indexed without embedding again: the same hits as embedding the texts
    build = ["index", "build", "--sparse", "--vectors", str(tmp_path / "o"), "--input", str(tmp_path / "t.txt")]
    out = CliRunner().invoke(main, build + ["--out", str(tmp_path / "sx")])
    assert out.exit_code == 0, out.output
    index = SparseIndex.load(tmp_path / "sx")
    assert index.ids == [0, 1, 2, 3] and index.texts == TEXTS and index.spec == vectors.spec
    q = encoder.embed_sparse([TEXTS[0]])[0]  # one SparseVector: one Hits
    expected_hits = SparseIndex(encoder.vocab_size).add_vectors(expected).search(q, k=2)
    assert index.search(q, k=2).ids == expected_hits.ids
    from ctxrep.vectors.index import SentenceIndex, SentenceIndexError

    with pytest.raises(SentenceIndexError, match="holds sparse vectors"):
        SentenceIndex.from_vectors(tmp_path / "o")
    out = CliRunner().invoke(main, args[:-2] + ["--output", "sparse", "--out", str(tmp_path / "w")])
    assert out.exit_code == 1 and "--output sparse writes one sparse vector per text" in out.output


def test_the_sparse_heads_table_reads_what_the_folder_holds(splade_folder, tmp_path):
    """One head class per kind of sparse head, behind the one SparseEncoder: the first row of SPARSE_HEADS whose
    head the folder holds (BGE-M3's sparse_linear.pt, then a masked-LM head). `is_sparse_folder` tells a
    sentence-transformers SparseEncoder folder from a bare masked-LM one (BERT's own checkpoints are MLM folders)."""
    assert SPARSE_HEADS == (BgeM3Head, SpladeHead)
    assert isinstance(SparseEncoder(splade_folder).head, SpladeHead)
    plain = _mlm_folder(tmp_path / "mlm")
    assert is_sparse_folder(splade_folder) and not is_sparse_folder(plain)
    assert isinstance(SparseEncoder(plain).head, SpladeHead)  # read as SPLADE when asked for sparse vectors
    (plain / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SparseEncoder"}))
    assert is_sparse_folder(plain)
    (plain / "modules.json").write_text("{not json")
    (plain / "config_sentence_transformers.json").unlink()
    assert not is_sparse_folder(plain)  # unreadable: not recognisably sparse (loading it says what is wrong)
    torch.save({"weight": torch.zeros(1, 32)}, tmp_path / "m3.pt")
    m3 = _mlm_folder(tmp_path / "m3")
    shutil.copy(tmp_path / "m3.pt", m3 / "sparse_linear.pt")
    with pytest.raises(CheckpointError, match="sparse_linear.pt: expected a Linear\\(hidden, 1\\) state dict"):
        SparseEncoder(m3)


def test_sparse_index_answers_as_every_index(splade_folder):
    """SparseIndex.search follows SentenceIndex's convention: one Hits for one query (a text or a SparseVector), a
    list of Hits for a list of them or an (n, vocab) matrix; a one-row matrix gives one Hits until 0.3, with a
    DeprecationWarning."""
    encoder = SparseEncoder(splade_folder)
    index = SparseIndex.build(TEXTS, encoder)
    vectors = encoder.embed_sparse(TEXTS[:2])
    one = index.search(vectors[0], k=2)
    assert isinstance(one, Hits) and one.ids == index.search(TEXTS[0], k=2).ids
    assert one.scores.dtype == np.float32 and one.rows.dtype == np.int64
    several = index.search(vectors, k=2)
    assert isinstance(several, list) and [h.ids for h in several] == [h.ids for h in index.search(TEXTS[:2], k=2)]
    matrix = encoder.embed_sentences(TEXTS[:2])
    assert [h.ids for h in index.search(matrix, k=2)] == [h.ids for h in several]
    with pytest.warns(DeprecationWarning, match="one-row sparse matrix gives one Hits until 0.3"):
        old = index.search(matrix[:1], k=2)
    assert isinstance(old, Hits) and old.ids == one.ids
    with pytest.raises(TypeError, match="queries must be a text, a SparseVector, a list of either"):
        index.search([TEXTS[0], vectors[0]], k=2)
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        index.search(TEXTS[0], k=0)
    with pytest.raises(ValueError, match="ids lie outside this index's vocabulary of 30522"):
        index.search(SparseVector([40000], [1.0]), k=1)
