"""Multi-vector late interaction (issue 34, item 2): token vectors equal to sentence-transformers'
MultiVectorEncoder on a tiny random folder it wrote; MaxSim; the candidate-then-rescore index."""

from __future__ import annotations

import json
import shutil
import string
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from ctxrep.featurize.spec import SpecMismatch
from ctxrep.models.folders import CheckpointError
from ctxrep.vectors.late_interaction import LateInteractionIndex, MultiVectorEncoder, maxsim, maxsim_scores

QUERIES = ["Who plays a guitar?", "What happened to stocks on Monday"]
DOCS = [
    "A man, plays a guitar.",
    "Stocks fell sharply on Monday; the market never recovered!",
    "The cat sleeps on the sofa.",
    "A woman slices an onion (quickly).",
]


@pytest.fixture(scope="module")
def mve_folder(tiny_models, tmp_path_factory) -> Path:
    """A sentence-transformers MultiVectorEncoder folder (Transformer, Dense 32 -> 16, punctuation mask,
    Normalize), written by sentence-transformers itself."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("mve")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dense = Dense(32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
        modules = [
            Transformer(str(tiny_models["bert"])),
            dense,
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ]
        STMultiVectorEncoder(modules=modules, device="cpu").save(str(out))
    return out


def _reference(folder: Path):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = STMultiVectorEncoder(str(folder), device="cpu")
        q = [t.numpy() for t in st.encode_query(QUERIES, convert_to_numpy=False)]
        d = [t.numpy() for t in st.encode_document(DOCS, convert_to_numpy=False)]
        return q, d, st.similarity(st.encode_query(QUERIES), st.encode_document(DOCS)).numpy()


def test_token_vectors_and_maxsim_equal_sentence_transformers(mve_folder):
    encoder = MultiVectorEncoder(mve_folder)
    assert encoder.dim == 16 and len(encoder.settings.dense) == 1 and encoder.settings.skiplist_tasks == ("document",)
    q, d = encoder.embed_queries(QUERIES), encoder.embed_documents(DOCS)
    ref_q, ref_d, ref_scores = _reference(mve_folder)
    assert [len(x) for x in q] == [len(x) for x in ref_q] and [len(x) for x in d] == [len(x) for x in ref_d]
    for ours, theirs in zip(q + d, ref_q + ref_d):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(d[0], axis=1), 1.0, rtol=1e-6)
    # punctuation is dropped from documents only: "A man, plays a guitar." keeps [CLS] ... [SEP] minus ", ."
    assert len(d[0]) == len(encoder.featurizer.embed_tokens([DOCS[0]])[0].ids) - 2
    np.testing.assert_allclose(maxsim_scores(q, d), ref_scores, rtol=1e-5, atol=1e-5)
    assert maxsim(q[0], d[0]) == pytest.approx(float((q[0] @ d[0].T).max(axis=1).sum()), rel=1e-6)


def test_prompts_equal_sentence_transformers(mve_folder, tmp_path):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    folder = tmp_path / "prompts"
    shutil.copytree(mve_folder, folder)
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    prompts = {"query": "query: ", "document": "passage: ", "instruct": "Instruct: find the topic\nQuery:"}
    settings |= {"prompts": prompts, "default_prompt_name": "instruct"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    encoder = MultiVectorEncoder(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = STMultiVectorEncoder(str(folder), device="cpu")
    q_kw, d_kw = {"convert_to_numpy": False}, {"convert_to_numpy": False}
    cases = [  # (ours, theirs): the task's prompt, a name, a text, an empty text
        (encoder.embed_queries(QUERIES), st.encode_query(QUERIES, **q_kw)),
        (encoder.embed_documents(DOCS), st.encode_document(DOCS, **d_kw)),
        (
            encoder.embed_queries(QUERIES, prompt_name="instruct"),
            st.encode_query(QUERIES, prompt_name="instruct", **q_kw),
        ),
        (
            encoder.embed_documents(DOCS, prompt="title: none | "),
            st.encode_document(DOCS, prompt="title: none | ", **d_kw),
        ),
        (encoder.embed_queries(QUERIES, prompt=""), st.encode_query(QUERIES, prompt="", **q_kw)),
    ]
    for ours, theirs in cases:
        assert [len(x) for x in ours] == [len(x) for x in theirs]
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b.numpy(), atol=1e-5)
    assert len(cases[0][0][0]) == len(cases[4][0][0]) + 2  # "query: " is two more tokens, so the prompt was applied
    with pytest.raises(ValueError, match=r"^unknown prompt name 'nope': .* declares the prompts 'query', 'document', "):
        encoder.embed_documents(DOCS, prompt_name="nope")


def test_a_plain_model_gives_normalised_states_with_colberts_skiplist(tiny_models):
    encoder = MultiVectorEncoder(tiny_models["bert"])
    assert encoder.dim == 32 and encoder.settings.dense == ()
    states = encoder.featurizer.embed_tokens([DOCS[0]])[0]
    keep = ~np.isin(states.ids, encoder.skiplist_ids)
    assert keep.sum() == len(states.ids) - 2  # "," and "."
    expected = states.states[keep] / np.linalg.norm(states.states[keep], axis=1, keepdims=True)
    np.testing.assert_allclose(encoder.embed_documents([DOCS[0]])[0], expected, rtol=1e-5, atol=1e-6)
    assert len(encoder.embed_queries([DOCS[0]])[0]) == len(states.ids)  # queries keep their punctuation


def test_folders_ctxrep_does_not_apply_are_refused(mve_folder, tmp_path):
    expand = tmp_path / "expand"
    shutil.copytree(mve_folder, expand)
    config = json.loads((expand / "sentence_bert_config.json").read_text())
    (expand / "sentence_bert_config.json").write_text(json.dumps(config | {"query_length": 32}))
    with pytest.raises(CheckpointError, match="sets query_length .* which ctxrep does not apply"):
        MultiVectorEncoder(expand)
    pylate = tmp_path / "pylate"
    shutil.copytree(mve_folder, pylate)
    settings = json.loads((pylate / "config_sentence_transformers.json").read_text())
    (pylate / "config_sentence_transformers.json").write_text(json.dumps(settings | {"query_prefix": "[unused0]"}))
    with pytest.raises(CheckpointError, match=r"^.*a PyLate <= 3 folder \(query_prefix: .*sentence_transformers.Mu"):
        MultiVectorEncoder(pylate)


def _hf_colbert_folder(path: Path, **meta) -> Path:
    """A Stanford-NLP ColBERT checkpoint as colbert-ir/colbertv2.0 holds one, tiny and random: a BertModel's
    weights (bert.*) and the projection linear.weight (16, 32) in one state dict, config.json architectures
    HF_ColBERT, artifact.metadata with ColBERTv2's settings updated by `meta` (None: no artifact.metadata); the
    packaged MiniLM's BERT vocabulary."""
    import transformers
    from safetensors.torch import save_file

    from ctxrep.models.loading import resolve_model_path

    path.mkdir()
    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=128, **common)
    state = {f"bert.{k}": v.contiguous() for k, v in transformers.BertModel(config, False).state_dict().items()}
    state["linear.weight"] = torch.randn(16, 32) / 32**0.5
    save_file(state, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config.to_dict() | {"architectures": ["HF_ColBERT"]}))
    if meta.get("none") is None:
        settings = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 32, "doc_maxlen": 180}
        settings |= {"mask_punctuation": True, "dim": 16, "similarity": "cosine"}
        (path / "artifact.metadata").write_text(json.dumps(settings | meta))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(resolve_model_path("minilm") / name, path / name)
    return path


LONG_QUERY = "who sang the song that played on every radio station in the summer of the year " * 3  # > 32 tokens
LONG_DOC = "The market never recovered, and stocks fell again; investors sold everything they had. " * 3


def _colbert_parity(folder: Path) -> MultiVectorEncoder:
    """ctxrep's query and document vectors and MaxSim scores equal sentence-transformers' for the folder."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    queries, docs = QUERIES + [LONG_QUERY], DOCS + [LONG_DOC]
    encoder = MultiVectorEncoder(folder)
    q = encoder.embed_queries(queries)
    q_cut = encoder.cut_texts
    d = encoder.embed_documents(docs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = STMultiVectorEncoder(str(folder), device="cpu")
        ref_q = [t.numpy() for t in st.encode_query(queries, convert_to_numpy=False)]
        ref_d = [t.numpy() for t in st.encode_document(docs, convert_to_numpy=False)]
        ref_scores = st.similarity(st.encode_query(queries), st.encode_document(docs)).numpy()
    assert [len(x) for x in q] == [len(x) for x in ref_q] and [len(x) for x in d] == [len(x) for x in ref_d]
    for ours, theirs in zip(q + d, ref_q + ref_d):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(maxsim_scores(q, d), ref_scores, rtol=1e-5, atol=1e-5)
    assert q_cut == [2]  # the long query was cut at query_maxlen
    return encoder


def test_a_stanford_colbert_checkpoint_gives_sentence_transformers_vectors(tmp_path):
    """HF_ColBERT (colbertv2.0's layout): the projection linear.weight without bias, [unused0] / [unused1] after
    [CLS], queries cut at and padded with [MASK] to 32 tokens that attention skips but MaxSim scores, documents
    cut at doc_maxlen with punctuation dropped: sentence-transformers 6.2's vectors within 1e-5, and the document
    side checked by hand against transformers' BertModel as ColBERT's DocTokenizer builds its input."""
    import transformers
    from safetensors.torch import load_file

    folder = _hf_colbert_folder(tmp_path / "colbertv2", doc_maxlen=24)
    encoder = _colbert_parity(folder)
    assert encoder.dim == 16 and encoder.settings.colbert.query_maxlen == 32
    assert [len(q) for q in encoder.embed_queries(QUERIES)] == [32, 32]  # the expansion
    encoder.embed_documents(DOCS + [LONG_DOC])
    assert encoder.cut_texts == [4]  # the long document was cut at doc_maxlen 24, and said so
    bert = transformers.BertModel.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok("A man, plays a guitar.")["input_ids"]
    ids = ids[:1] + tok.convert_tokens_to_ids(["[unused1]"]) + ids[1:]  # ColBERT's document marker after [CLS]
    with torch.no_grad():
        h = bert(torch.tensor([ids])).last_hidden_state[0] @ load_file(folder / "model.safetensors")["linear.weight"].T
    keep = [i not in tok.convert_tokens_to_ids([",", "."]) for i in ids]  # ColBERT's punctuation mask
    expected = torch.nn.functional.normalize(h[keep], dim=-1).numpy()
    np.testing.assert_allclose(encoder.embed_documents([DOCS[0]])[0], expected, atol=1e-5)


@pytest.mark.parametrize("meta", [{"none": True}, {"attend_to_mask_tokens": True, "mask_punctuation": False}])
def test_stanford_colbert_defaults_and_settings_equal_sentence_transformers(tmp_path, meta):
    """No artifact.metadata: ColBERTv2's defaults; attention over the [MASK] padding and no punctuation mask."""
    encoder = _colbert_parity(_hf_colbert_folder(tmp_path / "colbert", **meta))
    assert encoder.settings.colbert.attend_to_mask_tokens == bool(meta.get("attend_to_mask_tokens"))


def test_stanford_colbert_settings_ctxrep_cannot_apply_are_refused(tmp_path):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    folder = _hf_colbert_folder(tmp_path / "l2", similarity="l2")
    with pytest.raises(CheckpointError, match=r"artifact.metadata: similarity 'l2': ctxrep scores MaxSim with the"):
        MultiVectorEncoder(folder)
    marker = _hf_colbert_folder(tmp_path / "q", query_token_id="[Q]")
    with pytest.raises(CheckpointError, match=r"ColBERT's query_token_id '\[Q\]' is not a token of its tokenizer"):
        MultiVectorEncoder(marker)
    with warnings.catch_warnings():  # sentence-transformers' save keeps the expansion in sentence_bert_config.json
        warnings.simplefilter("ignore")
        STMultiVectorEncoder(str(_hf_colbert_folder(tmp_path / "cb")), device="cpu").save(str(tmp_path / "saved"))
    with pytest.raises(CheckpointError, match="sets query_expansion, document_length .* which ctxrep does not apply"):
        MultiVectorEncoder(tmp_path / "saved")


def test_index_finds_candidates_by_tokens_and_rescores_exactly(mve_folder, tmp_path):
    encoder = MultiVectorEncoder(mve_folder)
    index = LateInteractionIndex.build(DOCS, encoder)
    q, d = encoder.embed_queries(QUERIES), encoder.embed_documents(DOCS)
    exact = maxsim_scores(q, d)
    hits = index.search(QUERIES, k=3, candidates=1000)  # every token a candidate: the exact ranking
    for h, s in zip(hits, exact):
        order = np.lexsort((np.arange(len(s)), -s))[:3]
        assert h.ids == order.tolist() and h.texts == [DOCS[i] for i in order]
        np.testing.assert_allclose(h.scores, s[order], rtol=1e-5)
    one = index.search(q[1], k=3, candidates=1000)  # a query given as its token vectors
    assert one.ids == hits[1].ids
    few = index.search(QUERIES[0], k=4, candidates=1)  # only the documents of each query token's best match
    assert len(few) <= 4 and few.ids[0] == hits[0].ids[0]
    index.save(tmp_path / "li")
    back = LateInteractionIndex.load(tmp_path / "li")  # text queries rebuild the encoder from the spec
    again = back.search(QUERIES[1], k=3, candidates=1000)
    assert again.ids == hits[1].ids
    np.testing.assert_allclose(again.scores, hits[1].scores, rtol=1e-5)
    with pytest.raises(SpecMismatch, match="max_length 64 != 16"):
        LateInteractionIndex.load(tmp_path / "li", encoder=MultiVectorEncoder(mve_folder, max_length=16))
    with pytest.raises(ValueError, match="id 0 is already in the index"):
        back.add_vectors(d[:1], ids=[0])


def test_cli_index_build_late_interaction_and_search(mve_folder, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main

    (tmp_path / "d.txt").write_text("\n".join(DOCS) + "\n")
    runner = CliRunner()
    args = ["index", "build", "--input", str(tmp_path / "d.txt"), "--model", str(mve_folder), "--late-interaction"]
    out = runner.invoke(main, args + ["--out", str(tmp_path / "lx")])
    assert out.exit_code == 0, out.output
    search = ["search", "--index", str(tmp_path / "lx"), "--query", QUERIES[1], "-k", "2", "--candidates", "1000"]
    out = runner.invoke(main, search)
    assert out.exit_code == 0, out.output
    expected = LateInteractionIndex.build(DOCS, MultiVectorEncoder(mve_folder)).search(QUERIES[1], k=2)
    rows = [line.split("\t") for line in out.output.strip().splitlines()[1:]]
    assert [int(r[3]) for r in rows] == expected.ids
    np.testing.assert_allclose([float(r[2]) for r in rows], expected.scores, atol=1e-4)
    assert runner.invoke(main, search + ["--late-interaction"]).output == out.output  # the flag names the kind
    out = runner.invoke(main, search + ["--sparse"])
    assert out.exit_code == 1 and "holds a LateInteractionIndex, not the index --sparse asks for" in out.output
    out = runner.invoke(main, args + ["--vectors", str(tmp_path), "--out", str(tmp_path / "x")])
    assert out.exit_code == 1 and "--late-interaction embeds the texts of --input" in out.output
