"""Rerankers: cross-encoder scores equal sentence-transformers' CrossEncoder.predict on tiny random folders that
sentence-transformers itself saved; the rerank API's ordering, top_n and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from ctxrep.models.folders import CheckpointError
from ctxrep.rerank import QWEN3_RERANKER as QWEN3
from ctxrep.rerank import CrossEncoderReranker, YesNoTemplate, load_reranker
from ctxrep.vectors.hits import Hits
from tests.conftest import TOKENIZER_FILES, _roberta_tokenizer

st = pytest.importorskip("sentence_transformers")

QUERY = "where did the fox jump ?"
DOCS = [
    "The quick brown fox jumps over the lazy dog .",
    "A crane lifted the steel beam onto the roof .",
    "Contextual word vectors depend on the sentence around the word .",
    "the fox jumped over the dog , twice , and then it ran away into the woods behind the house",
    "dog",
]
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _save_cross_encoder(model: torch.nn.Module, tokenizer_from: Path, path: Path, **kwargs) -> Path:
    """Save a random *ForSequenceClassification as sentence-transformers' CrossEncoder writes it."""
    model.save_pretrained(path / "hf")
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, path / "hf" / name)
    ce = st.CrossEncoder(str(path / "hf"), max_length=64, **kwargs)  # the tiny models' 64 positions
    ce.save(str(path / "ce"))
    return path / "ce"


@pytest.fixture(scope="module")
def bert_ce(tmp_path_factory, minilm_path) -> Path:
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, num_labels=1, **TINY, **NO_DROPOUT)
    model = transformers.BertForSequenceClassification(config)
    return _save_cross_encoder(model, minilm_path, tmp_path_factory.mktemp("bert-ce"))


def _st_scores(folder: Path, pairs, **kwargs) -> np.ndarray:
    return st.CrossEncoder(str(folder)).predict(pairs, batch_size=2, **kwargs)


def test_bert_cross_encoder_matches_sentence_transformers(bert_ce):
    pairs = [(QUERY, d) for d in DOCS]
    ours = CrossEncoderReranker(bert_ce, batch_tokens=64).predict(pairs)
    theirs = _st_scores(bert_ce, pairs)
    assert ours.shape == (len(DOCS),)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    assert ((ours > 0) & (ours < 1)).all()  # sigmoid for one label


def test_rerank_orders_by_score_and_keeps_top_n(bert_ce):
    reranker = load_reranker(bert_ce)
    scores = reranker.predict([(QUERY, d) for d in DOCS])
    ranked = reranker.rerank(QUERY, DOCS)
    assert isinstance(ranked, Hits)
    assert ranked.ids == list(np.argsort(-scores, kind="stable")) == ranked.rows.tolist()
    assert ranked.texts == [DOCS[i] for i in ranked.ids]
    np.testing.assert_allclose(ranked.scores, np.sort(scores)[::-1], rtol=1e-6)
    assert reranker.rerank(QUERY, DOCS, top_n=2).ids == ranked.ids[:2]
    assert len(reranker.rerank(QUERY, DOCS, top_n=50)) == len(DOCS)


def test_truncated_pairs_match_sentence_transformers(bert_ce):
    long_doc = " ".join(["the fox jumped over the lazy dog again"] * 20)  # far past the 64 positions
    pairs = [(QUERY, long_doc), (QUERY, "dog"), (long_doc, "dog")]
    reranker = CrossEncoderReranker(bert_ce)
    ours = reranker.predict(pairs)
    np.testing.assert_allclose(ours, _st_scores(bert_ce, pairs), atol=1e-5, rtol=0)
    # the cut pairs are named, with the pieces each lost: 160 document pieces + the query's 6 + 3 specials - 64
    query, doc = (len(reranker.tokenizer.encode_texts([t])[0]) for t in (QUERY, long_doc))
    assert reranker.cut_texts == [0, 2]
    assert reranker.cut_pieces == [query + doc + 3 - 64, doc + 1 + 3 - 64]
    reranker.rerank(QUERY, ["dog", long_doc])
    assert reranker.cut_texts == [1]  # each call says its own


@pytest.mark.parametrize("family", ["roberta", "electra", "distilbert"])
def test_other_heads_match_sentence_transformers(family, tmp_path, minilm_path):
    torch.manual_seed(2)
    tokenizer_from = minilm_path
    if family == "roberta":
        tokenizer_from = tmp_path / "tok"
        tokenizer_from.mkdir()
        _roberta_tokenizer(tokenizer_from)
        config = transformers.RobertaConfig(
            vocab_size=300, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
            eos_token_id=2, num_labels=1, **TINY, **NO_DROPOUT,
        )  # fmt: skip
        model = transformers.RobertaForSequenceClassification(config)
    elif family == "electra":
        config = transformers.ElectraConfig(
            vocab_size=30522, embedding_size=16, max_position_embeddings=64, num_labels=1, **TINY, **NO_DROPOUT
        )
        model = transformers.ElectraForSequenceClassification(config)
    else:
        config = transformers.DistilBertConfig(
            vocab_size=30522, max_position_embeddings=64, n_layers=2, n_heads=4, dim=32, hidden_dim=64, dropout=0.0,
            attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=1,
        )  # fmt: skip
        model = transformers.DistilBertForSequenceClassification(config)
    folder = _save_cross_encoder(model, tokenizer_from, tmp_path)
    pairs = [(QUERY, d) for d in DOCS + ["the  fox\njumped ,twice"]]  # spaces and a newline kept as in the text
    np.testing.assert_allclose(CrossEncoderReranker(folder).predict(pairs), _st_scores(folder, pairs), atol=1e-5)


def _modernbert_ce(path: Path, pooling: str) -> torch.nn.Module:
    from tests._families2 import modernbert_tokenizer

    vocab = modernbert_tokenizer(path)
    config = transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=3, pad_token_id=3, bos_token_id=1,
        cls_token_id=1, eos_token_id=2, sep_token_id=2, num_labels=1, classifier_pooling=pooling,
        classifier_activation="silu",
    )  # fmt: skip
    model = transformers.ModernBertForSequenceClassification(config)
    with torch.no_grad():  # the head's LayerNorm away from its identity start, so that it matters
        model.head.norm.weight.normal_(1.0, 0.3)
    return model


@pytest.mark.parametrize("family", ["deberta-v2", "modernbert-cls", "modernbert-mean"])
def test_deberta_and_modernbert_heads_match_sentence_transformers(family, tmp_path):
    from tests._families2 import deberta_config, deberta_tokenizer_json

    torch.manual_seed(5)
    tokenizer_from = tmp_path / "tok"
    tokenizer_from.mkdir()
    if family == "deberta-v2":
        config = deberta_config(deberta_tokenizer_json(tokenizer_from))
        config.num_labels, config.pooler_hidden_act = 1, "tanh"
        model = transformers.DebertaV2ForSequenceClassification(config)
    else:
        model = _modernbert_ce(tokenizer_from, family.split("-")[1])
    folder = _save_cross_encoder(model, tokenizer_from, tmp_path)
    pairs = [(QUERY, d) for d in DOCS]
    np.testing.assert_allclose(CrossEncoderReranker(folder).predict(pairs), _st_scores(folder, pairs), atol=1e-5)


def test_several_labels_give_identity_scores_and_refuse_rerank(tmp_path, minilm_path):
    torch.manual_seed(3)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, num_labels=3, **TINY, **NO_DROPOUT)
    folder = _save_cross_encoder(transformers.BertForSequenceClassification(config), minilm_path, tmp_path)
    pairs = [(QUERY, d) for d in DOCS[:3]]
    ours = CrossEncoderReranker(folder).predict(pairs)
    assert ours.shape == (3, 3)
    np.testing.assert_allclose(ours, _st_scores(folder, pairs), atol=1e-5)
    with pytest.raises(ValueError, match="3 labels; rerank needs one relevance score"):
        CrossEncoderReranker(folder).rerank(QUERY, DOCS)


@pytest.mark.parametrize("where", ["config_sentence_transformers.json", "config.json"])
def test_identity_activation_from_the_folder(bert_ce, tmp_path, where):
    """sentence-transformers 6 saves activation_fn in config_sentence_transformers.json, 4-5 in config.json."""
    folder = tmp_path / "identity"
    shutil.copytree(bert_ce, folder)
    if where == "config.json":  # as a folder of sentence-transformers 4-5: no activation_fn in the settings file
        st_file = folder / "config_sentence_transformers.json"
        st_file.write_text(json.dumps(json.loads(st_file.read_text()) | {"activation_fn": None}))
    file = folder / where
    settings = json.loads(file.read_text())
    if where == "config.json":
        settings["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    else:
        settings["activation_fn"] = "torch.nn.modules.linear.Identity"
    file.write_text(json.dumps(settings))
    pairs = [(QUERY, d) for d in DOCS]
    logits = CrossEncoderReranker(folder).predict(pairs)
    np.testing.assert_allclose(logits, _st_scores(folder, pairs), atol=1e-5)
    np.testing.assert_allclose(CrossEncoderReranker(bert_ce).predict(pairs), 1 / (1 + np.exp(-logits)), atol=1e-6)
    if where == "config.json":
        settings["sentence_transformers"] = {"activation_fn": "mypackage.Custom"}
    else:
        settings["activation_fn"] = "mypackage.Custom"
    file.write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match="activation_fn 'mypackage.Custom' is not one ctxrep applies"):
        CrossEncoderReranker(folder)


def test_prompts_match_sentence_transformers(bert_ce, tmp_path):
    folder = tmp_path / "prompts"
    shutil.copytree(bert_ce, folder)
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    settings["prompts"] = {"query": "query : ", "web": "search the web :"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    pairs = [(QUERY, d) for d in DOCS]
    reranker = CrossEncoderReranker(folder)
    np.testing.assert_allclose(
        reranker.predict(pairs, prompt_name="query"), _st_scores(folder, pairs, prompt_name="query"), atol=1e-5
    )
    np.testing.assert_allclose(
        reranker.predict(pairs, prompt="find : "), _st_scores(folder, pairs, prompt="find : "), atol=1e-5
    )
    with pytest.raises(ValueError, match=r"unknown prompt name 'passage': .* declares the prompts 'query', 'web'"):
        reranker.rerank(QUERY, DOCS, prompt_name="passage")


def test_bad_input_is_refused_in_one_line(bert_ce, tiny_models):
    reranker = CrossEncoderReranker(bert_ce)
    with pytest.raises(ValueError, match="documents is empty"):
        reranker.rerank(QUERY, [])
    with pytest.raises(ValueError, match="top_n must be a positive integer"):
        reranker.rerank(QUERY, DOCS, top_n=0)
    with pytest.raises(ValueError, match="document 1 is empty"):
        reranker.rerank(QUERY, ["a dog", "  "])
    with pytest.raises(TypeError, match="got a single string"):
        reranker.rerank(QUERY, "a dog")
    with pytest.raises(ValueError, match="query must be a non-empty string"):
        reranker.rerank("", DOCS)
    with pytest.raises(CheckpointError, match="architectures says BertModel, which is not a cross-encoder"):
        load_reranker(tiny_models["bert"])


def test_cli_prints_the_documents_best_first(bert_ce, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main

    docs = tmp_path / "docs.txt"
    docs.write_text(DOCS[0] + "\n\n" + "\n".join(DOCS[1:]) + "\n")  # an empty line is skipped, numbers kept
    result = CliRunner().invoke(
        main, ["rerank", "--model", str(bert_ce), "--query", QUERY, "--documents", str(docs), "--top-n", "3"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "query\trank\tscore\tid\tline\tdocument" and len(lines) == 4
    expected = CrossEncoderReranker(bert_ce).rerank(QUERY, DOCS, top_n=3)
    line_of = [1, 3, 4, 5, 6]
    for at, (row, i, score) in enumerate(zip(lines[1:], expected.ids, expected.scores.tolist())):
        query, rank, shown, id_, line, doc = row.split("\t")
        assert (query, rank, id_) == ("0", str(at), str(i))  # query numbers, ranks and ids count from 0
        assert (int(line), doc) == (line_of[i], DOCS[i]) and abs(float(shown) - score) < 1e-6  # lines from 1
    assert "cut" not in result.stderr  # nothing was cut
    bad = CliRunner().invoke(
        main, ["rerank", "--model", str(bert_ce), "--query", QUERY, "--documents", str(docs), "--top-n", "0"]
    )
    assert bad.exit_code == 1 and "error: top_n must be a positive integer" in bad.output


def test_cli_reranks_a_file_of_queries_with_one_model_load(bert_ce, tmp_path, monkeypatch):
    """`ctxrep rerank --queries FILE`: one block of rows per query, numbered from 0, each the reranker's own
    ranking, and the model loaded once."""
    from click.testing import CliRunner

    import ctxrep.rerank
    from ctxrep.cli import main

    loads = []
    load = ctxrep.rerank.load_reranker
    monkeypatch.setattr(ctxrep.rerank, "load_reranker", lambda *a, **k: loads.append(a) or load(*a, **k))
    docs, queries = tmp_path / "docs.txt", tmp_path / "queries.txt"
    docs.write_text("\n".join(DOCS) + "\n")
    asked = [QUERY, "a dog in the park", "stock prices"]
    queries.write_text("\n".join(asked) + "\n")
    args = ["rerank", "--model", str(bert_ce), "--queries", str(queries), "--documents", str(docs), "--top-n", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert len(loads) == 1
    rows = [line.split("\t") for line in result.stdout.strip().splitlines()[1:]]
    reranker = CrossEncoderReranker(bert_ce)
    expected = [(str(q), str(r), str(i)) for q, query in enumerate(asked)
                for r, i in enumerate(reranker.rerank(query, DOCS, top_n=2).ids)]  # fmt: skip
    assert [(q, r, i) for q, r, _, i, _, _ in rows] == expected
    (tmp_path / "none.txt").write_text("")
    empty = CliRunner().invoke(main, [*args[:4], str(tmp_path / "none.txt"), *args[5:]])
    assert empty.exit_code == 1 and "none.txt: no texts in the file" in empty.output
    assert len(loads) == 1  # refused before the model loads


def test_cli_says_which_documents_it_cut(bert_ce, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main

    long_doc = " ".join(["the fox jumped over the lazy dog again"] * 20)  # past the 64 positions: cut
    docs = tmp_path / "docs.txt"
    docs.write_text(f"{DOCS[0]}\n\n{long_doc}\n{DOCS[1]}\n{long_doc}\n")
    result = CliRunner().invoke(main, ["rerank", "--model", str(bert_ce), "--query", QUERY, "--documents", str(docs)])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 5  # the table alone on stdout
    assert result.stderr.strip().splitlines() == [
        "ctxrep rerank: 2 of 4 documents were cut to fit the reranker's 64 tokens (lines 3, 5)"
    ]


# ---- LLM rerankers (Qwen3-Reranker style) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_reranker(tmp_path_factory) -> Path:
    """A tiny random Qwen3ForCausalLM with a Qwen-style tokenizer that knows the chat markers and "yes" / "no"."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from tests._decoders import hf_model, qwen_tokenizer

    path = tmp_path_factory.mktemp("qwen3-reranker")
    qwen_tokenizer(path)
    tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>")])
    tok.add_tokens(["yes", "no"])
    tok.save(str(path / "tokenizer.json"))
    hf_model(
        "qwen3", tok.get_vocab_size(), seed=4, causal_lm=True, tie_word_embeddings=False, max_position_embeddings=512
    ).save_pretrained(path)
    return path


def _model_card_scores(folder: Path, pairs, instruction: str, max_length: int = 512) -> np.ndarray:
    """Qwen3-Reranker's model card, with transformers: left padding, the last position's yes / no logits."""
    from ctxrep.rerank import QWEN3_RERANKER as t

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), pad_token="<|endoftext|>", padding_side="left"
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prefix = tok.encode(t.prefix, add_special_tokens=False)
    suffix = tok.encode(t.suffix, add_special_tokens=False)
    bodies = [t.body.format(instruction=instruction, query=q, document=d) for q, d in pairs]
    inputs = tok(
        bodies, padding=False, truncation="longest_first", return_attention_mask=False, add_special_tokens=False,
        max_length=max_length - len(prefix) - len(suffix),
    )  # fmt: skip
    inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
    inputs = tok.pad(inputs, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[:, -1, :]
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    two = torch.stack([logits[:, no], logits[:, yes]], dim=1)
    return torch.nn.functional.log_softmax(two, dim=1)[:, 1].exp().numpy()


def test_llm_reranker_matches_the_model_card(qwen3_reranker):
    from ctxrep.rerank import LLMReranker

    reranker = load_reranker(qwen3_reranker, batch_tokens=200)  # several batches
    assert isinstance(reranker, LLMReranker)
    pairs = [(QUERY, d) for d in DOCS]
    ours = reranker.predict(pairs)
    np.testing.assert_allclose(ours, _model_card_scores(qwen3_reranker, pairs, QWEN3.instruction), atol=1e-5)
    custom = reranker.predict(pairs, prompt="Find the sentence about animals")
    np.testing.assert_allclose(
        custom, _model_card_scores(qwen3_reranker, pairs, "Find the sentence about animals"), atol=1e-5
    )
    ranked = reranker.rerank(QUERY, DOCS, top_n=3)
    assert ranked.ids == list(np.argsort(-ours, kind="stable")[:3])


def test_llm_reranker_cuts_a_long_document_to_the_positions(qwen3_reranker):
    long_doc = " ".join(["the fox jumped over the lazy dog again"] * 60)  # past the 512 positions
    pairs = [(QUERY, long_doc), (QUERY, DOCS[0])]
    reranker = load_reranker(qwen3_reranker)
    body = QWEN3.body.format(instruction=QWEN3.instruction, query=QUERY, document=long_doc)
    assert reranker.tokenizer.encode_texts([body])[1][0] > reranker.room  # the body is cut
    ours = reranker.predict(pairs)
    np.testing.assert_allclose(ours, _model_card_scores(qwen3_reranker, pairs, QWEN3.instruction), atol=1e-5)
    n = reranker.tokenizer.encode_texts([body])[1][0]
    assert reranker.cut_texts == [0] and reranker.cut_pieces == [n - reranker.room]  # the cut is said
    reranker.predict(pairs[1:])
    assert reranker.cut_texts == [] and reranker.cut_pieces == []


def test_llm_reranker_needs_an_lm_head_and_answer_tokens(qwen3_reranker, tmp_path, tiny_models):
    from ctxrep.rerank import LLMReranker

    with pytest.raises(CheckpointError, match="has no LM head to read yes/no logits from"):
        LLMReranker(tiny_models["bert"])
    with pytest.raises(CheckpointError, match="the tokenizer has no 'oui' token"):
        LLMReranker(qwen3_reranker, template=YesNoTemplate(QWEN3.prefix, QWEN3.body, QWEN3.suffix, "x", yes="oui"))


def test_search_rerank_keeps_the_rerankers_k_best(bert_ce, tmp_path, tiny_models):
    from click.testing import CliRunner

    from ctxrep.cli import main

    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DOCS) + "\n")
    built = CliRunner().invoke(
        main,
        ["index", "build", "--input", str(docs), "--out", str(tmp_path / "ix"), "--model", str(tiny_models["bert"])],
    )
    assert built.exit_code == 0, built.output
    args = ["search", "--index", str(tmp_path / "ix"), "--query", QUERY, "-k", "3"]
    result = CliRunner().invoke(main, [*args, "--rerank", str(bert_ce), "--rerank-depth", "5"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.strip().splitlines()[1:]]
    expected = CrossEncoderReranker(bert_ce).rerank(QUERY, DOCS, top_n=3)  # depth 5 = every document
    assert [(int(r[3]), r[4]) for r in rows] == [(i, DOCS[i]) for i in expected.ids]
    np.testing.assert_allclose([float(r[2]) for r in rows], expected.scores, atol=1e-4)


def test_search_rerank_says_which_hits_it_cut_and_takes_a_prompt(bert_ce, tmp_path, tiny_models):
    """ctxrep search --rerank: one line on standard error names, per query, the ids of the hits whose (query,
    document) pair the reranker cut to fit; --rerank-prompt-name reaches the reranker."""
    from click.testing import CliRunner

    from ctxrep.cli import main

    long_doc = " ".join(["the fox jumped over the lazy dog again"] * 20)  # past the 64 positions: cut
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join([*DOCS, long_doc, long_doc + " twice"]) + "\n")  # ids 0..6; 5 and 6 are cut
    built = CliRunner().invoke(
        main,
        ["index", "build", "--input", str(docs), "--out", str(tmp_path / "ix"), "--model", str(tiny_models["bert"])],
    )
    assert built.exit_code == 0, built.output
    args = ["search", "--index", str(tmp_path / "ix"), "--query", QUERY, "--query", "dog", "-k", "2"]
    result = CliRunner().invoke(main, [*args, "--rerank", str(bert_ce), "--rerank-depth", "7"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 5  # the table alone on stdout
    (line,) = result.stderr.strip().splitlines()
    head = "ctxrep search: the reranker cut 4 (query, document) pairs to fit its 64 tokens: "
    assert line.startswith(head)
    per_query = [part.split(": ") for part in line[len(head) :].split("; ")]
    assert [(q, sorted(ids.split(", "))) for q, ids in per_query] == [("query 0", ["5", "6"]), ("query 1", ["5", "6"])]
    named = CliRunner().invoke(main, [*args, "--rerank", str(bert_ce), "--rerank-prompt-name", "passage"])
    assert named.exit_code == 1 and "unknown prompt name 'passage'" in named.output  # it reached the reranker
    bad = CliRunner().invoke(main, [*args, "--rerank-prompt", "query : "])
    assert bad.exit_code == 1 and "--rerank-prompt(-name) applies with --rerank MODEL" in bad.output


def test_rerank_hits_says_which_hits_it_cut(bert_ce):
    from ctxrep.rerank import rerank_hits
    from ctxrep.vectors.index import Hits

    long_doc = " ".join(["the fox jumped over the lazy dog again"] * 20)  # past the 64 positions
    texts = [DOCS[0], long_doc, DOCS[1]]
    hits = Hits(["a", "b", "c"], texts, np.zeros(3, np.float32), np.arange(3))
    reranker = CrossEncoderReranker(bert_ce)
    rerank_hits(reranker, QUERY, hits, k=1)
    assert [hits.ids[i] for i in reranker.cut_texts] == ["b"]  # positions in the hits as given, whatever k keeps
    empty = Hits([], [], np.zeros(0, np.float32), np.zeros(0, np.int64))
    rerank_hits(reranker, QUERY, empty)
    assert reranker.cut_texts == []  # this call's, not the last one's


def test_a_pytorch_model_bin_folder_scores_the_same(bert_ce, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "bin"
    shutil.copytree(bert_ce, folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    pairs = [(QUERY, d) for d in DOCS]
    np.testing.assert_allclose(
        CrossEncoderReranker(folder).predict(pairs), CrossEncoderReranker(bert_ce).predict(pairs), atol=1e-6
    )


def test_llm_reranker_through_the_cli_and_both_server_routes(qwen3_reranker, tiny_models, tmp_path):
    """The front ends take an LLM reranker as they take a cross-encoder: same scores as its own rerank."""
    import httpx
    from _serve_helpers import ServerThread
    from click.testing import CliRunner

    from ctxrep import Featurizer
    from ctxrep.cli import main
    from ctxrep.rerank import LLMReranker
    from ctxrep.serve.app import build_app
    from ctxrep.serve.service import EmbeddingService, ServeConfig, make_service

    reranker = load_reranker(qwen3_reranker)
    expected = reranker.rerank(QUERY, DOCS, top_n=3)
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DOCS) + "\n")
    result = CliRunner().invoke(
        main, ["rerank", "--model", str(qwen3_reranker), "--query", QUERY, "--documents", str(docs), "--top-n", "3"]
    )
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.strip().splitlines()[1:]]
    assert [(int(line) - 1, float(score)) for _, _, score, _, line, _ in rows] == [
        (i, pytest.approx(score, abs=1e-4)) for i, score in zip(expected.ids, expected.scores.tolist())
    ]
    service = EmbeddingService(
        Featurizer(tiny_models["bert"]), "tiny", ServeConfig(max_texts=8), reranker=reranker, reranker_name="qwen3"
    )
    with ServerThread(build_app(service)) as s:
        cohere = httpx.post(f"{s.url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 3})
        tei = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS})
    alone = make_service(str(qwen3_reranker))  # `ctxrep serve --model LLM_RERANKER`: served as a reranker
    assert isinstance(alone.reranker, LLMReranker) and alone.fz is None
    with ServerThread(build_app(alone)) as s:
        served = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=60)
    assert [x["index"] for x in served.json()] == reranker.rerank(QUERY, DOCS).ids
    assert cohere.status_code == 200 and tei.status_code == 200, (cohere.text, tei.text)
    got = [(x["index"], x["relevance_score"]) for x in cohere.json()["results"]]
    assert got == [(i, pytest.approx(score, abs=1e-6)) for i, score in zip(expected.ids, expected.scores.tolist())]
    assert sorted((x["index"], x["score"]) for x in tei.json())[0] == (
        0,
        pytest.approx(reranker.predict([(QUERY, DOCS[0])])[0], abs=1e-6),
    )
