"""A sentence-transformers folder's module list has one reader and one writer (models/sentence_transformers.py:
read_modules, read_settings, write_modules): what each of ctxrep's writers saves is read back as the same modules,
a folder sentence-transformers saved reads and rewrites to the same files, stale module folders go, and a malformed
list is refused in one line by every reader."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from _st_helpers import prompted_st_folder

from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import resolve_model_path
from ctxrep.models.sentence_transformers import (
    MODULES_FILE,
    SETTINGS_FILE,
    Module,
    read_modules,
    read_sentence_pooling,
    read_settings,
    write_modules,
)
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.tasks.sparse_encoder import SparseSentenceEncoder
from ctxrep.vectors.late_interaction import MultiVectorSettings
from ctxrep.vectors.sparse import SpladeSettings

ST = "sentence_transformers.models."
PAIRS = [("apple river", "the apple near the river ."), ("guitar tiger", "a guitar with a tiger ."), ("x", "y")] * 3


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory) -> Path:
    """A random BertForMaskedLM (hidden 32, MiniLM's tokenizer): a start for both writers."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("mlm")
    transformers.BertForMaskedLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(resolve_model_path("minilm") / name, path / name)
    return path


def test_written_modules_read_back_the_same(tmp_path):
    modules = [
        Module(ST + "Transformer", "", {"max_seq_length": 64, "do_lower_case": False}),
        Module(ST + "Pooling", "1_Pooling", {"word_embedding_dimension": 32, "pooling_mode": "mean"}),
        Module(ST + "Normalize", "2_Normalize"),
    ]
    settings = {"similarity_fn_name": "cosine", "prompts": {"query": "query: "}}
    write_modules(tmp_path, modules, settings)
    assert read_modules(tmp_path) == tuple(modules) and read_settings(tmp_path) == settings
    # sentence-transformers' layout: the Transformer's config in sentence_bert_config.json, the others' in config.json
    assert json.loads((tmp_path / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    assert (tmp_path / "1_Pooling" / "config.json").is_file() and not any((tmp_path / "2_Normalize").iterdir())
    assert (tmp_path / MODULES_FILE).read_text() == json.dumps(
        [{"idx": i, "name": str(i), "path": m.path, "type": m.type} for i, m in enumerate(modules)], indent=2
    ) + "\n"


def test_a_module_folder_the_new_list_drops_is_removed_and_nothing_else(tmp_path):
    normalize = Module(ST + "Normalize", "2_Normalize")
    pooling = Module(ST + "Pooling", "1_Pooling", {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True})
    write_modules(tmp_path, [Module(ST + "Transformer"), pooling, normalize], {})
    (tmp_path / "notes").mkdir()  # not a module: left alone
    write_modules(tmp_path, [Module(ST + "Transformer"), pooling], {})
    assert not (tmp_path / "2_Normalize").exists() and (tmp_path / "notes").is_dir()
    assert [m.kind for m in read_modules(tmp_path)] == ["Transformer", "Pooling"]


@pytest.mark.parametrize("writer", ["dense", "dense-normalized", "sparse"])
def test_each_writers_folder_reads_back_with_the_same_modules(mlm_folder, tmp_path, writer):
    if writer == "sparse":
        est = SparseSentenceEncoder(str(mlm_folder), batch_size=8, max_steps=1, random_state=0)
    else:
        est = SentenceEncoder(str(mlm_folder), normalize=writer == "dense-normalized", max_steps=1, batch_size=4)
    folder = est.fit(PAIRS).save(tmp_path / writer)
    expected = est._modules(min(est.max_length, est.backbone_.model.max_tokens))
    assert read_modules(folder) == tuple(expected)
    assert read_settings(folder) == est._settings()
    if writer == "sparse":
        assert SpladeSettings.of_folder(folder) == SpladeSettings("max", "relu")
        assert read_settings(folder)["model_type"] == "SparseEncoder"
    else:
        pooling = read_sentence_pooling(folder)
        assert pooling.modes == ("mean",) and pooling.normalize == (writer == "dense-normalized")
    assert MultiVectorSettings.of_folder(folder) == MultiVectorSettings()  # no MultiVectorMask: a plain folder


def test_a_folder_sentence_transformers_saved_reads_and_rewrites_to_the_same_files(tmp_path, minilm_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = prompted_st_folder(tmp_path, minilm_path, {"query": "query: "}, "query")
    modules, settings = read_modules(folder), read_settings(folder)
    assert [m.kind for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert modules[1].config["embedding_dimension"] == 32  # sentence-transformers 6's name
    assert settings["prompts"]["query"] == "query: " and settings["default_prompt_name"] == "query"
    copy = tmp_path / "copy"
    write_modules(copy, modules, settings)
    assert read_modules(copy) == modules and read_settings(copy) == settings
    for m in modules:
        if m.config is not None:
            file = Path(m.path) / m.config_file_name
            assert json.loads((copy / file).read_text()) == json.loads((folder / file).read_text()), file


@pytest.mark.parametrize(
    "read", [read_modules, read_sentence_pooling, SpladeSettings.of_folder, MultiVectorSettings.of_folder]
)
@pytest.mark.parametrize(("content", "message"), [("[{", "not valid JSON"), ('[{"path": ""}]', 'no "type"')])
def test_a_malformed_module_list_is_one_line_from_every_reader(tmp_path, read, content, message):
    (tmp_path / MODULES_FILE).write_text(content)
    (tmp_path / SETTINGS_FILE).write_text("{}")
    with pytest.raises(CheckpointError, match=message) as e:
        read(tmp_path)
    assert MODULES_FILE in str(e.value) and "\n" not in str(e.value)
