"""load_vectors reads `ctxrep embed` output back, memory-mapped, text by text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ctxrep.cli.embed import embed, load_shards
from ctxrep.vectors.store import Vectors, VectorsError, load_vectors

LINES = ["The vase broke .", "Dawn broke .", "", "A crane lifted the beam", "We broke even ."]


def _embed(tmp_path, model, *args, name="out") -> str:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n")
    out = tmp_path / name
    result = CliRunner().invoke(
        embed,
        ["--model", str(model), "--input", str(src), "--out", str(out), "--skip-empty", "--shard-size", "2", *args],
    )
    assert result.exit_code == 0, result.output
    return str(out)


@pytest.mark.parametrize("storage", ["safetensors", "npy"])
def test_word_vectors_per_text_match_the_shards_and_are_mapped(tmp_path, tiny_models, storage):
    out = _embed(tmp_path, tiny_models["bert"], "--shard-format", storage)
    all_rows, index = load_shards(out)
    vectors = load_vectors(out)
    texts = [line.split() for line in LINES if line]
    assert len(vectors) == 4 and vectors.num_rows == len(all_rows) == sum(map(len, texts))
    assert vectors.level == "word" and vectors.dim == all_rows.shape[1] == 32
    row = 0
    for i, words in enumerate(texts):
        array = vectors[i]
        assert isinstance(array, np.memmap) and not array.flags.writeable
        assert array.shape == (len(words), 32)
        np.testing.assert_array_equal(array, all_rows[row : row + len(words)])
        assert vectors.words(i) == words
        row += len(words)
    assert [vectors.line(i) for i in range(4)] == [1, 2, 4, 5]  # the empty line 3 was skipped
    np.testing.assert_array_equal(vectors[-1], vectors[3])
    assert [a.shape[0] for a in vectors] == [4, 3, 5, 4]
    idx = vectors.index()
    assert len(idx) == len(index)
    assert idx.line.tolist() == [r["line"] for r in index] and idx.word.tolist() == [r["word"] for r in index]
    assert idx.text.tolist() == [r["text"] for r in index] and idx.token == [r["token"] for r in index]
    np.testing.assert_array_equal(vectors.array, all_rows)


def test_sentence_vectors_of_all_layers(tmp_path, tiny_models):
    out = _embed(tmp_path, tiny_models["bert"], "--level", "sentence", "--layers", "all", "--shard-format", "npy")
    all_rows, _ = load_shards(out)
    vectors = load_vectors(out)
    assert len(vectors) == 4 and vectors[0].shape == (3, 32)  # embeddings + 2 layers
    for i in range(4):
        np.testing.assert_array_equal(vectors[i], all_rows[i])
    assert vectors.line(3) == 5
    with pytest.raises(VectorsError, match="holds sentence vectors, which keep no words"):
        vectors.words(0)


def test_out_of_range_and_bad_index(tmp_path, tiny_models):
    vectors = load_vectors(_embed(tmp_path, tiny_models["bert"]))
    with pytest.raises(IndexError, match="text 4 out of range: .* holds 4 texts"):
        vectors[4]
    with pytest.raises(TypeError, match="integer text number, got str"):
        vectors["a"]


def test_unfinished_run_warns_and_reads_its_complete_shards(tmp_path, tiny_models):
    out = _embed(tmp_path, tiny_models["bert"])
    manifest_file = tmp_path / "out" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["complete"] = False
    manifest["shards"] = manifest["shards"][:1]
    manifest_file.write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="unfinished `ctxrep embed` run .*run the same command again"):
        vectors = load_vectors(out)
    assert len(vectors) == 2 and vectors.words(1) == ["Dawn", "broke", "."]


def test_folders_that_are_not_embed_output_are_refused_in_one_line(tmp_path, tiny_models):
    with pytest.raises(VectorsError, match="no such folder"):
        load_vectors(tmp_path / "absent")
    with pytest.raises(VectorsError, match=r"not the output of `ctxrep embed` \(no manifest.json\)"):
        load_vectors(tiny_models["bert"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"shards": []}')
    with pytest.raises(VectorsError, match="not a manifest written by `ctxrep embed`"):
        load_vectors(bad)

    out = _embed(tmp_path, tiny_models["bert"])
    (tmp_path / "out" / "shard-00001.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    vectors = load_vectors(out)
    vectors[0]  # shard 0 is fine
    with pytest.raises(VectorsError, match="shard-00001.safetensors: not a safetensors shard"):
        vectors[2]
    (tmp_path / "out" / "index-00000.tsv").unlink()
    with pytest.raises(VectorsError) as e:
        load_vectors(out)
    assert "index-00000.tsv: listed in" in str(e.value) and "\n" not in str(e.value)


def test_vectors_is_the_returned_type(tmp_path, tiny_models):
    out = _embed(tmp_path, tiny_models["bert"])
    assert isinstance(load_vectors(out), Vectors) and "texts=4" in repr(load_vectors(out))
