"""`ctxrep embed --output-precision int8|uint8|binary|ubinary`: the shards hold sentence-transformers'
quantize_embeddings codes of the float run's vectors, bit for bit, on the ranges the manifest records (the first
shard's, or --calibration's); the reader gives codes + ranges back; resume refuses another precision; index build
reads int8 folders and refuses binary ones; bad combinations are one line naming the flag."""

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
from ctxrep.vectors.quantize import dequantize, quantize

st_quant = pytest.importorskip("sentence_transformers.util.quantization")

TEXTS = [
    "A crane caught a fish .",
    "Unbelievably , the newscaster broke into the broadcast !",
    "Dawn broke .",
    "the quick brown fox jumps over the lazy dog",
    "a crane lifted the steel beam",
    "Fish swim in the river .",
    "the news came at dawn",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, minilm_path) -> Path:
    """A sentence-transformers folder over a 32-wide, 64-position BERT (mean pooling, Normalize)."""
    return prompted_st_folder(tmp_path_factory.mktemp("q"), minilm_path, {})


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


@pytest.fixture(scope="module")
def floats(folder, src, tmp_path_factory) -> np.ndarray:
    """The float32 run's vectors (shards of 3 texts, as every run here)."""
    out = tmp_path_factory.mktemp("f") / "out"
    result = _embed(folder, src, out)
    assert result.exit_code == 0, result.output
    return ctxrep.load_vectors(out).array


def _embed(folder, src, out, *options):
    args = ["embed", "--model", str(folder), "--input", str(src), "--out", str(out), "--level", "sentence"]
    return CliRunner().invoke(main, [*args, "--shard-size", "3", *options])


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize(("precision", "storage"), [("int8", "safetensors"), ("uint8", "npy")])
def test_int8_codes_are_quantize_embeddings_of_the_float_run_on_the_first_shards_ranges(
    folder, src, floats, tmp_path, precision, storage
):
    out = tmp_path / "out"
    result = _embed(folder, src, out, "--output-precision", precision, "--shard-format", storage)
    assert result.exit_code == 0, result.output
    assert f"32 wide {precision} codes" in result.output
    vectors = ctxrep.load_vectors(out)
    assert vectors.precision == precision and vectors.array.dtype == np.dtype(precision)
    manifest = _manifest(out)
    assert manifest["settings"]["output_precision"] == precision and manifest["dim"] == 32
    assert manifest["quantization"]["calibration"] == {"source": "shard 0", "texts": 3}
    # the ranges are the first shard's, as quantize_embeddings takes them from the embeddings it is given
    np.testing.assert_array_equal(vectors.ranges, quantize(floats[:3], precision).ranges)
    np.testing.assert_array_equal(vectors[0], st_quant.quantize_embeddings(floats[:3], precision=precision)[0])
    theirs = st_quant.quantize_embeddings(floats, precision=precision, ranges=vectors.ranges)
    np.testing.assert_array_equal(vectors.array, theirs)  # every shard on the recorded grid, bit for bit
    q = vectors.quantized()
    np.testing.assert_array_equal(q.codes, quantize(floats, precision, ranges=vectors.ranges).codes)
    back = dequantize(q)
    np.testing.assert_allclose(back, st_quant._dequantize_embeddings(q.codes, precision, q.ranges), atol=1e-7)
    assert np.abs(back[:3] - floats[:3]).max() <= (vectors.ranges[1] - vectors.ranges[0]).max() / 255 + 1e-6


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
def test_binary_codes_are_packed_signs_without_ranges(folder, src, floats, tmp_path, precision):
    out = tmp_path / "out"
    result = _embed(folder, src, out, "--output-precision", precision)
    assert result.exit_code == 0, result.output
    assert f"32 wide as {precision} codes, 4 bytes a row" in result.output
    vectors = ctxrep.load_vectors(out)
    assert vectors.row_shape == (4,) and vectors.dim == 32 and vectors.ranges is None
    np.testing.assert_array_equal(vectors.array, st_quant.quantize_embeddings(floats, precision=precision))
    assert "ranges" not in _manifest(out)["quantization"]


def test_calibration_file_gives_the_ranges_and_a_resume_keeps_them(folder, src, floats, tmp_path):
    sample = tmp_path / "sample.npy"
    np.save(sample, floats[2:6])
    out = tmp_path / "out"
    assert _embed(folder, src, out, "--output-precision", "int8", "--calibration", str(sample)).exit_code == 0
    vectors = ctxrep.load_vectors(out)
    theirs = st_quant.quantize_embeddings(floats, precision="int8", calibration_embeddings=floats[2:6])
    np.testing.assert_array_equal(vectors.array, theirs)
    assert _manifest(out)["quantization"]["calibration"]["vectors"] == 4
    # an earlier run's folder is a calibration too: the same ranges, the same codes
    again = tmp_path / "again"
    assert _embed(folder, src, again, "--output-precision", "int8", "--calibration", str(out)).exit_code == 0
    np.testing.assert_array_equal(ctxrep.load_vectors(again).array, theirs)
    # an unfinished folder resumes on its recorded ranges; other ranges are refused in one line
    manifest = _manifest(again)
    manifest.update(shards=manifest["shards"][:1], complete=False)
    (again / "manifest.json").write_text(json.dumps(manifest))
    np.save(sample, floats[:2])
    result = _embed(folder, src, again, "--output-precision", "int8", "--calibration", str(sample))
    assert result.exit_code != 0 and "other ranges than the ones" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert _embed(folder, src, again, "--output-precision", "int8").exit_code == 0
    np.testing.assert_array_equal(ctxrep.load_vectors(again).array, theirs)


def test_resume_refuses_another_precision(folder, src, tmp_path):
    out = tmp_path / "out"
    assert _embed(folder, src, out, "--output-precision", "int8").exit_code == 0
    for options in ([], ["--output-precision", "binary"]):
        result = _embed(folder, src, out, *options)
        assert result.exit_code != 0
        assert "holds the output of a different run (differs in: output_precision)" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_index_build_reads_int8_codes_and_refuses_binary_in_one_line(folder, src, floats, tmp_path):
    out8, outb = tmp_path / "int8", tmp_path / "ubinary"
    assert _embed(folder, src, out8, "--output-precision", "int8").exit_code == 0
    assert _embed(folder, src, outb, "--output-precision", "ubinary").exit_code == 0
    result = CliRunner().invoke(main, ["index", "build", "--vectors", str(out8), "--out", str(tmp_path / "ix")])
    assert result.exit_code == 0, result.output
    assert "holds int8 codes: indexing their dequantized vectors" in result.output
    ix = ctxrep.SentenceIndex.load(tmp_path / "ix")
    expected = dequantize(ctxrep.load_vectors(out8).quantized())  # the codes' grid points, unit length (cosine)
    np.testing.assert_allclose(ix.vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-6)
    assert ix.ids == list(range(len(TEXTS)))
    result = CliRunner().invoke(main, ["index", "build", "--vectors", str(outb), "--out", str(tmp_path / "ixb")])
    assert result.exit_code != 0
    assert "holds ubinary codes (embed --output-precision ubinary)" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    # the library reads the folders the same way (it read int8 codes as floats before)
    np.testing.assert_allclose(ctxrep.SentenceIndex.from_vectors(out8).vectors, ix.vectors, atol=1e-6)
    with pytest.raises(ValueError, match="holds ubinary codes"):
        ctxrep.SentenceIndex.from_vectors(outb)


def test_bad_combinations_are_one_line_naming_the_flag_before_the_model_loads(folder, src, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus.EmbedJob, "featurizer", lambda *a, **k: pytest.fail("the model was loaded"))
    sample = tmp_path / "s.npy"
    np.save(sample, np.zeros((2, 32), np.float32))
    cases = [
        (
            ["--output-precision", "int8", "--level", "word"],
            "--output-precision applies to dense sentence vectors: add",
        ),
        (["--output-precision", "binary", "--output", "sparse"], "from the last layer: leave out --output-precision"),
        (["--output-precision", "uint8", "--layers", "all"], "give one --layers"),
        (["--calibration", str(sample)], "--calibration gives int8 / uint8 ranges: add --output-precision int8"),
        (["--output-precision", "binary", "--calibration", str(sample)], "--calibration gives int8 / uint8 ranges"),
        (["--output-precision", "int16"], "Invalid value for '--output-precision'"),
        (["--output-precision", "int8", "--engine", "ray"], "--output-precision int8 is written by --engine local"),
    ]
    for options, message in cases:
        out = tmp_path / "out"
        result = _embed(folder, src, out, *options)
        assert result.exit_code != 0, options
        assert message in result.output, result.output
        if "Invalid value" not in message:  # click's own usage error is three lines
            assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (out / "manifest.json").exists()


def test_several_workers_need_fixed_ranges_and_then_write_the_same_codes(folder, src, floats, tmp_path):
    result = _embed(folder, src, tmp_path / "out", "--output-precision", "int8", "--workers", "2")
    assert result.exit_code != 0
    assert "--output-precision int8 with several worker processes needs its ranges" in result.output
    assert "--calibration FILE" in result.output and len(result.output.strip().splitlines()) == 1
    sample = tmp_path / "sample.npy"
    np.save(sample, floats)
    args = ("--output-precision", "int8", "--calibration", str(sample), "--threads", "1")
    result = _embed(folder, src, tmp_path / "two", *args, "--workers", "2")
    assert result.exit_code == 0, result.output
    theirs = st_quant.quantize_embeddings(floats, precision="int8")  # calibrated on all of them
    np.testing.assert_array_equal(ctxrep.load_vectors(tmp_path / "two").array, theirs)
