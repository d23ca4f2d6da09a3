"""`ctxrep embed --chunks sentences|N [--no-late-chunking]`: one row per chunk of each text, the text's number and the
chunk's number in the index, equal to Featurizer.embed_sentences(chunks=...); bad combinations are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ctxrep
from ctxrep.cli import main
from ctxrep.embed import corpus

TEXTS = [
    "A crane caught a fish . Then it flew away over the river .",
    "Dawn broke .",
    "the quick brown fox jumps over the lazy dog ! the dog slept on .",
    "one more text here",
]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


@pytest.fixture(scope="module")
def fz(tiny_models):
    return ctxrep.Featurizer(str(tiny_models["bert"]), sentence_pooling="mean")


def _embed(model, src, out, *options):
    args = ["embed", "--model", str(model), "--input", str(src), "--out", str(out), "--level", "sentence"]
    return CliRunner().invoke(main, [*args, "--shard-size", "3", "--sentence-pooling", "mean", *options])


@pytest.mark.parametrize(
    ("options", "chunks", "late"),
    [(["--chunks", "sentences"], "sentences", True), (["--chunks", "4", "--no-late-chunking"], 4, False)],
)
def test_one_row_per_chunk_equal_to_embed_sentences(tiny_models, fz, src, tmp_path, options, chunks, late):
    out = tmp_path / "out"
    result = _embed(tiny_models["bert"], src, out, *options)
    assert result.exit_code == 0, result.output
    vectors = ctxrep.load_vectors(out)
    texts = TEXTS if chunks == "sentences" else [t.split() for t in TEXTS]
    theirs = fz.embed_sentences(texts, chunks=chunks, late_chunking=late)
    assert len(vectors) == len(TEXTS) and vectors.chunked
    for i, expected in enumerate(theirs):
        np.testing.assert_allclose(vectors[i], expected, atol=1e-5)
    index = vectors.index()
    assert index.text.tolist() == [t for t, e in enumerate(theirs) for _ in range(len(e))]
    assert index.word.tolist() == [c for e in theirs for c in range(len(e))]
    if chunks == "sentences":
        assert [len(e) for e in theirs] == [2, 1, 2, 1]
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["chunks"] == chunks and settings["late_chunking"] == late
    again = _embed(tiny_models["bert"], src, out, "--chunks", "5")  # resume refuses other chunks
    assert again.exit_code != 0 and "differs in: chunks" in again.output


def test_bad_combinations_are_one_line_before_the_model_loads(tiny_models, src, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus.EmbedJob, "featurizer", lambda *a, **k: pytest.fail("the model was loaded"))
    cases = [
        (
            ["--chunks", "sentences", "--level", "word"],
            "--sentence-pooling, --chunks apply to dense sentence vectors: add --level sentence",
        ),
        (["--chunks", "0"], "--chunks must be 'sentences' or a positive number of tokens, got 0"),
        (["--chunks", "paragraphs"], "--chunks must be 'sentences' or a positive number"),
        (["--no-late-chunking"], "--no-late-chunking applies to --chunks"),
        (["--chunks", "8", "--dimensions", "4"], "--dimensions: late chunks index the whole text's tokens"),
        (["--chunks", "8", "--engine", "ray"], "--chunks is written by --engine local"),
    ]
    for options, message in cases:
        out = tmp_path / "out"
        result = _embed(tiny_models["bert"], src, out, *options)
        assert result.exit_code != 0, options
        assert message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (out / "manifest.json").exists()
