"""ctxrep.data exports its readers at package level, lazily."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import ctxrep.data

DATA_DIR = Path(ctxrep.data.__file__).parent


def test_readers_import_from_the_package(tmp_path):
    from ctxrep.data import (
        read_conll,
        read_conllu,
        read_glue_tsv,
        read_squad,
        read_sst,
        read_wic,
    )

    assert read_conllu is importlib.import_module("ctxrep.data.conllu").read_conllu
    assert all(callable(f) for f in (read_glue_tsv, read_squad, read_sst, read_wic))
    path = tmp_path / "ner.conll"
    path.write_text("EU B-ORG\nrejects O\nGerman B-MISC\n\nPeter B-PER\n")
    sentences = read_conll(path)
    assert [s.words for s in sentences] == [["EU", "rejects", "German"], ["Peter"]]
    assert sentences[0].tags == ["B-ORG", "O", "B-MISC"]


def test_every_exported_name_is_the_module_object():
    for name in ctxrep.data.__all__:
        module = importlib.import_module(f"ctxrep.data.{ctxrep.data._EXPORTS[name]}")
        assert getattr(ctxrep.data, name) is getattr(module, name), name
    assert sorted(ctxrep.data.__all__) == sorted(ctxrep.data._EXPORTS)
    assert set(ctxrep.data.__all__) <= set(dir(ctxrep.data))


def test_every_public_reader_in_the_folder_is_exported():
    """A new data/*.py with a `read_*` / `iter_*` function must be added to the package exports."""
    public = set()
    for file in DATA_DIR.glob("*.py"):
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith(("read_", "iter_")):
                public.add(node.name)
    public -= {"iter_utf8_lines", "iter_documents", "read_text"}  # helpers, not data set readers
    assert {"read_sst", "read_conll", "read_conllu", "read_glue_tsv", "read_squad", "read_wic"} <= public
    assert public - set(ctxrep.data.__all__) == set()


def test_unknown_name_says_so():
    with pytest.raises(AttributeError, match="ctxrep.data.*read_imdb"):
        ctxrep.data.read_imdb  # noqa: B018
    with pytest.raises(ImportError):
        from ctxrep.data import read_imdb  # noqa: F401


def test_importing_the_package_loads_no_reader():
    code = "import sys, ctxrep.data; print(sorted(m for m in sys.modules if m.startswith('ctxrep.data.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
