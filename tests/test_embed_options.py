"""`ctxrep embed` options of sentence vectors: --dimensions, --prompt / --prompt-name (equal to sentence-transformers'
encode on a tiny folder it saved; recorded in the manifest's settings and spec), and the texts a window cut (count,
text numbers and lines in the manifest, one line on stderr). Bad options are one line before the model runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _st_helpers import prompted_st_folder
from click.testing import CliRunner

import ctxrep
from ctxrep.cli import main
from ctxrep.embed import corpus
from ctxrep.embed.corpus import EmbedJob, SentenceVectors, ShardFolder, WordVectors, embed_corpus

st = pytest.importorskip("sentence_transformers")

TEXTS = [
    "A crane caught a fish .",
    "Unbelievably , the newscaster broke into the broadcast !",
    "Dawn broke .",
    "the quick brown fox jumps over the lazy dog while the crane lifted the steel beam",
    "an " + "x," * 45 + " word",  # one word of 90 pieces: more than the 64-position window, so it is cut
    " ".join(["fox"] * 100),  # windowed, not cut
]
PROMPTS = {"query": "query : ", "document": "", "classification": "classify the text :"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, minilm_path) -> Path:
    """A sentence-transformers folder over a 32-wide, 64-position BERT: mean pooling, Normalize, three prompts."""
    return prompted_st_folder(tmp_path_factory.mktemp("prompted"), minilm_path, PROMPTS, default_prompt_name="query")


@pytest.fixture()
def src(tmp_path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def _embed(folder, src, out, *options):
    args = ["embed", "--model", str(folder), "--input", str(src), "--out", str(out), "--level", "sentence"]
    return CliRunner().invoke(main, [*args, "--shard-size", "4", *options])


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize(
    ("options", "encode", "prompt"),
    [
        (["--dimensions", "16", "--prompt-name", "classification"], {"prompt_name": "classification"}, PROMPTS["classification"]),
        (["--prompt", "passage : "], {"prompt": "passage : "}, "passage : "),
        ([], {}, "query : "),  # the folder's default prompt, as sentence-transformers applies it
    ],
)  # fmt: skip
def test_dimensions_and_prompts_equal_sentence_transformers(folder, src, tmp_path, options, encode, prompt):
    out = tmp_path / "out"
    result = _embed(folder, src, out, *options)
    assert result.exit_code == 0, result.output
    dimensions = int(options[1]) if "--dimensions" in options else None
    model = st.SentenceTransformer(str(folder), truncate_dim=dimensions)
    theirs = model.encode(TEXTS[:4], normalize_embeddings=True, **encode)  # the texts it does not cut or window
    vectors = ctxrep.load_vectors(out)
    assert vectors.row_shape == (dimensions or 32,)
    np.testing.assert_allclose(vectors.array[:4], theirs, atol=1e-5)
    manifest = _manifest(out)
    assert manifest["row_shape"] == [dimensions or 32]
    assert manifest["spec"]["dimensions"] == dimensions and manifest["spec"]["prompt"] == prompt
    for flag in options[::2]:  # recorded once, in the spec (a prompt name as its text), not again in the settings
        assert flag.removeprefix("--").replace("-", "_") not in manifest["settings"]
    assert vectors.spec.dimensions == dimensions  # the manifest's spec loads back


def test_a_run_with_other_dimensions_or_prompt_is_refused_in_that_folder(folder, src, tmp_path):
    out = tmp_path / "out"
    assert _embed(folder, src, out, "--dimensions", "16").exit_code == 0
    for other, field in ((["--dimensions", "8"], "dimensions"), (["--dimensions", "16", "--prompt", "q: "], "prompt")):
        result = _embed(folder, src, out, *other)
        assert result.exit_code != 0
        assert f"holds the output of a different run (differs in: {field})" in result.output


def test_texts_a_window_cut_are_in_the_manifest_and_said_once(folder, src, tmp_path):
    out = tmp_path / "out"
    result = _embed(folder, src, out)
    assert result.exit_code == 0, result.output
    assert _manifest(out)["cut"] == {"count": 1, "texts": [4], "lines": [5]}  # windowed text 5 is not cut
    second = _manifest(out)["shards"][1]
    assert (second["cut_texts"], second["cut_lines"]) == ([4], [5])
    notes = [line for line in result.output.splitlines() if "cut:" in line]
    assert len(notes) == 1 and notes[0].startswith("note: 1 text cut: a word longer than a whole window")
    plain = tmp_path / "plain"
    plain_src = tmp_path / "plain.txt"
    plain_src.write_text("\n".join(TEXTS[:4]) + "\n")
    result = _embed(folder, plain_src, plain)
    assert _manifest(plain)["cut"] == {"count": 0, "texts": [], "lines": []}
    assert "cut:" not in result.output


def test_word_vectors_record_the_cut_too(folder, src, tmp_path):
    job = EmbedJob(str(src), ShardFolder(str(tmp_path / "w"), 4), vectors=WordVectors(), model=str(folder))
    embed_corpus(job, show_progress=False, log=lambda m: None)
    assert _manifest(tmp_path / "w")["cut"]["texts"] == [4]


def test_bad_options_are_one_line_before_the_model_loads(folder, src, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(corpus.EmbedJob, "featurizer", no_model)
    cases = [
        (["--prompt-name", "passage"], "--prompt-name: unknown prompt name 'passage': "),
        (["--prompt", "q: ", "--prompt-name", "query"], "give --prompt (a text) or --prompt-name"),
        (["--dimensions", "0"], "--dimensions must be a positive integer, got 0"),
        (
            ["--dimensions", "8", "--level", "word"],
            "--dimensions applies to dense sentence vectors: add --level sentence",
        ),
        (["--prompt", "q: ", "--output", "sparse"], "from the last layer: leave out --prompt"),
    ]
    for options, message in cases:
        out = tmp_path / "out"
        result = _embed(folder, src, out, *options)
        assert result.exit_code != 0, options
        assert message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (out / "manifest.json").exists()
    assert (
        "declares the prompts 'classification', 'document', 'query'"
        in _embed(folder, src, tmp_path / "o", "--prompt-name", "passage").output
    )


def test_dimensions_wider_than_the_model_is_one_line_before_any_text_runs(folder, src, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "write_shard", lambda *a, **k: pytest.fail("a shard was embedded"))
    result = _embed(folder, src, tmp_path / "out", "--dimensions", "33")
    assert result.exit_code != 0
    assert "--dimensions 33 is more than" in result.output and "32-wide sentence vectors" in result.output
    assert "give at most 32" in result.output and len(result.output.strip().splitlines()) == 1


def test_engine_ray_same_bytes_options_cut_and_quiet_terminal(folder, src, tmp_path):
    """The one Ray test (a local Ray starts in the subprocess, ~20 s): `ctxrep embed --engine ray` with --dimensions
    and a text that is cut writes the same bytes as one process with the same torch threads (each actor call is
    one whole shard, as one process embeds it), records the cut, and keeps Ray's output in OUT/ray.log: the
    terminal holds ctxrep's lines only."""
    pytest.importorskip("ray")
    import os
    import subprocess
    import sys

    one = tmp_path / "one"
    options = ["--dimensions", "16", "--prompt-name", "classification", "--threads", "1"]
    assert _embed(folder, src, one, *options).exit_code == 0
    out = tmp_path / "ray"
    args = ["embed", "--model", str(folder), "--input", str(src), "--out", str(out), "--level", "sentence"]
    args += ["--shard-size", "4", *options, "--engine", "ray", "--workers", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", "from ctxrep.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(ctxrep.load_vectors(out).array, ctxrep.load_vectors(one).array)
    assert _manifest(out)["cut"] == _manifest(one)["cut"] == {"count": 1, "texts": [4], "lines": [5]}
    assert _manifest(out)["row_shape"] == [16]
    terminal = result.stderr.splitlines()
    ours = ("Ray's own output: ", "embedding ", "embed (ray)", "note: 1 text cut", "warning: ")
    assert terminal and all(line.startswith(ours) for line in terminal), terminal
    assert "streaming_executor" in (out / "ray.log").read_text()


def test_worker_processes_write_what_one_process_writes(folder, src, tmp_path):
    """--workers 2: the options, the spec and the cut reach the spawned workers (each shard as one process's)."""
    kwargs = {"model": str(folder), "vectors": SentenceVectors(dimensions=8, prompt_name="document"), "threads": 1}
    one, two = tmp_path / "one", tmp_path / "two"
    embed_corpus(EmbedJob(str(src), ShardFolder(str(one), 2), **kwargs), show_progress=False, log=lambda m: None)
    embed_corpus(
        EmbedJob(str(src), ShardFolder(str(two), 2), **kwargs), workers=2, show_progress=False, log=lambda m: None
    )
    np.testing.assert_array_equal(ctxrep.load_vectors(two).array, ctxrep.load_vectors(one).array)
    for key in ("cut", "spec", "row_shape", "settings"):
        assert _manifest(two)[key] == _manifest(one)[key], key
    assert _manifest(two)["spec"]["dimensions"] == 8 and _manifest(two)["spec"]["prompt"] is None  # "" : no prompt
    assert _manifest(two)["cut"]["texts"] == [4]
