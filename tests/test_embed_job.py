"""The embedding job as types (issue 40, item 4): `EmbedJob` holds an `EmbedInput`, a `ShardFolder` and one output
variant (`WordVectors`, `SentenceVectors`, `SparseVectors`), each checking only its own options; what a flag does
not apply to is refused in one line naming it. The manifest's settings are those the flat job wrote, so its folders
resume; the flat keywords and attributes still work for a release, with a DeprecationWarning."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.embed import corpus
from ctxrep.embed.corpus import (
    EmbedInput,
    EmbedJob,
    Record,
    SentenceVectors,
    ShardFolder,
    SparseVectors,
    WordVectors,
    embed_corpus,
    embed_shard,
    load_shards,
    vector_row_shape,
    vectors_of,
)
from ctxrep.embed.ray_engine import embed_with_ray
from ctxrep.embed.run import legacy_vector_settings

TEXTS = ["the vase broke .", "dawn broke , slowly . then it rained .", "a crane lifted the beam", "one more"]


@pytest.fixture()
def src(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def _settings(job: EmbedJob) -> dict:
    return {k: v for k, v in job.settings().items() if k not in ("input", "size", "mtime_ns")}


# ---- each variant checks its own options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: SentenceVectors(output_precision="int8", layers="all"),
            "--output-precision int8 quantizes sentence vectors of one layer: give one --layers (or mix)",
        ),
        (lambda: SentenceVectors(output_precision="int16"), "--output-precision must be one of float32, int8"),
        (lambda: SentenceVectors(calibration="r.npy"), "--calibration gives int8 / uint8 ranges: add --output-pre"),
        (lambda: SentenceVectors(late_chunking=False), "--no-late-chunking applies to --chunks: add --chunks"),
        (lambda: SentenceVectors(chunks=0), "--chunks must be 'sentences' or a positive number of tokens, got 0"),
        (lambda: SentenceVectors(chunks=8, dimensions=4), "--dimensions: late chunks index the whole text's tokens"),
        (lambda: SentenceVectors(dimensions=True), "--dimensions must be a positive integer, got True"),
        (lambda: SentenceVectors(prompt="q: ", prompt_name="query"), "give --prompt (a text) or --prompt-name"),
        (lambda: ShardFolder("o", shard_size=0), "--shard-size must be at least 1, got 0"),
        (lambda: ShardFolder("o", storage="zarr"), "--shard-format must be one of safetensors, npy, got 'zarr'"),
        (lambda: EmbedInput("in.txt", format="xml"), "--format must be one of text, jsonl, csv, tsv, conll, parquet"),
        (lambda: EmbedInput("-", format="parquet"), "--format parquet reads a file, not standard input"),
        (lambda: EmbedInput("in.txt", header=True), "--header / --no-header apply to --format csv or tsv, not text"),
        (lambda: EmbedInput("in.txt", text_column="body"), "--text-column applies to --format jsonl, csv, tsv or"),
    ],
)
def test_each_part_refuses_its_own_bad_options_in_one_line(make, message):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        make()
    assert "\n" not in str(e.value)


def test_the_input_format_is_read_from_the_file_name_as_index_build_and_finetune_read_it(tmp_path):
    """Issue 42: no --format needed for X.csv / .tsv / .jsonl / .conll (gzip-compressed or not): data.table's
    detect_format, the one reader of file names; any other name, and standard input, is plain text."""
    for name, fmt in [("a.csv", "csv"), ("a.TSV.gz", "tsv"), ("a.tab", "tsv"), ("a.ndjson", "jsonl"),
                      ("a.jsonl.gz", "jsonl"), ("a.conllu", "conll"), ("a.txt", "text"), ("a", "text"), ("-", "text"),
                      ("a.txt.gz", "text")]:  # fmt: skip
        path = name if name == "-" else tmp_path / name
        assert EmbedInput(path).format == fmt, name
    assert EmbedInput(tmp_path / "a.csv", "text").format == "text"  # --format decides over the name


def test_options_a_variant_does_not_take_cannot_be_written():
    assert SentenceVectors(chunks="8").chunks == 8 and SentenceVectors(layers="0,2").layers == [0, 2]
    with pytest.raises(TypeError):
        WordVectors(dimensions=8)
    with pytest.raises(TypeError):
        SparseVectors(layers=3)
    assert SparseVectors().featurizer_options() == {"layers": -1, "pooling": "mean", "sentence_pooling": "mean"}
    with pytest.raises(ValueError, match=r"^--output sparse writes safetensors shards: leave out --shard-format npy$"):
        EmbedJob("in.txt", ShardFolder("o", storage="npy"), vectors=SparseVectors())
    with pytest.raises(TypeError, match="vectors must be WordVectors, SentenceVectors or SparseVectors, got str"):
        EmbedJob("in.txt", "o", vectors="sentence")


@pytest.mark.parametrize(
    ("level", "output", "options", "message"),
    [
        ("word", "sparse", {}, "--output sparse writes one sparse vector per text from the last layer: add --level"),
        ("word", "dense", {"dimensions": 8}, "--dimensions applies to dense sentence vectors: add --level sentence"),
        ("word", "dense", {"sentence_pooling": "cls", "late_chunking": False}, "--sentence-pooling, --no-late-chunk"),
        (
            "sentence",
            "sparse",
            {"layers": 3, "pooling": "first"},
            "per text from the last layer: leave out --layers, --pooling",
        ),
        ("paragraph", "dense", {}, "level must be 'word' or 'sentence', got 'paragraph'"),
        ("word", "colbert", {}, "output must be 'dense' or 'sparse', got 'colbert'"),
    ],
)
def test_the_flags_choose_one_variant_and_it_refuses_the_others(level, output, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        vectors_of(level, output, options)


def test_the_flags_build_the_variant_they_name():
    assert vectors_of() == WordVectors()
    assert vectors_of("word", "dense", {"layers": "all", "pooling": "first"}) == WordVectors("all", "first")
    assert vectors_of("sentence", "dense", {"dimensions": 8}) == SentenceVectors(dimensions=8)
    assert vectors_of("sentence", "sparse") == SparseVectors()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--sentence-pooling", "cls"], "--sentence-pooling applies to dense sentence vectors: add --level sentence"),
        (["--level", "sentence", "--output", "sparse", "--pooling", "first"], "the last layer: leave out --pooling"),
        (["--level", "sentence", "--output", "sparse", "--shard-format", "npy"], "--output sparse writes safetensors"),
    ],
)
def test_the_command_refuses_a_flag_the_chosen_vectors_do_not_take(src, tmp_path, monkeypatch, options, message):
    monkeypatch.setattr(corpus.EmbedJob, "featurizer", lambda *a, **k: pytest.fail("the model was loaded"))
    result = CliRunner().invoke(main, ["embed", "--input", str(src), "--out", str(tmp_path / "o"), *options])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_a_flag_left_at_its_default_is_not_refused(src, tmp_path, tiny_models):
    model = str(tiny_models["bert"])
    args = ["embed", "--model", model, "--input", str(src), "--out", str(tmp_path / "o"), "--level", "sentence"]
    result = CliRunner().invoke(main, [*args, "--pooling", "first", "--shard-size", "3"])  # sentence vectors take it
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "o" / "manifest.json").read_text())["spec"]
    assert spec["pooling"] == "first"


# ---- the manifest: the settings the flat job wrote ----------------------------------------------------------------


def test_the_settings_are_those_the_flat_job_recorded(src, tmp_path):
    base = {"format": "text", "text_field": "text", "shard_size": 2000, "storage": "safetensors", "skip_empty": False}
    assert _settings(EmbedJob(src, tmp_path)) == {**base, "level": "word"}
    job = EmbedJob(src, tmp_path, vectors=SentenceVectors(chunks="sentences", output_precision="int8"))
    assert _settings(job) == {
        **base,
        "level": "sentence",
        "chunks": "sentences",
        "late_chunking": True,
        "output_precision": "int8",
    }
    assert _settings(EmbedJob(src, ShardFolder(tmp_path, 3), vectors=SparseVectors())) == {
        **base,
        "level": "sentence",
        "shard_size": 3,
    }
    table = tmp_path / "in.tsv"
    table.write_text("a\tb\n")
    job = EmbedJob(EmbedInput(table, text_column="2", header=False, skip_empty=True), tmp_path)
    assert _settings(job) == {**base, "format": "tsv", "text_field": "2", "header": False, "skip_empty": True} | {
        "level": "word"
    }
    # the vector settings a manifest of before issue 31 kept in `settings`, as that version wrote them
    job = EmbedJob(src, tmp_path, vectors=SentenceVectors(layers=3, dimensions=8, prompt="q: "), quantize="int8")
    assert legacy_vector_settings(job) == {
        "model": "minilm",
        "layers": "3",
        "pooling": "mean",
        "sentence_pooling": "auto",
        "quantize": "int8",
        "dimensions": 8,
        "prompt": "q: ",
    }
    assert legacy_vector_settings(EmbedJob(src, tmp_path, vectors=SparseVectors()))["output"] == "sparse"


def test_a_word_folder_resumes_whatever_sentence_pooling_it_recorded(src, tmp_path, tiny_models):
    """Word vectors never read the sentence pooling: a folder whose spec records another (written with --level word
    --sentence-pooling cls, which the command now refuses) resumes instead of being refused on it."""
    model = str(tiny_models["bert"])
    full, part = tmp_path / "full", tmp_path / "part"
    embed_corpus(EmbedJob(src, ShardFolder(full, 2), model=model), show_progress=False)
    embed_corpus(EmbedJob(src, ShardFolder(part, 2), model=model), show_progress=False)
    manifest = json.loads((part / "manifest.json").read_text())
    manifest["spec"]["sentence_pooling"] = "cls"
    last = manifest["shards"].pop()
    (part / last["file"]).unlink()
    manifest["complete"] = False
    (part / "manifest.json").write_text(json.dumps(manifest))
    logs = []
    summary = embed_corpus(EmbedJob(src, ShardFolder(part, 2), model=model), show_progress=False, log=logs.append)
    assert "resuming after 2 texts in 1 complete shards" in logs and summary.shards == 2
    assert (part / "shard-00001.safetensors").read_bytes() == (full / "shard-00001.safetensors").read_bytes()
    with pytest.raises(ValueError, match=r"differs in: pooling\)"):  # what word vectors do read is still compared
        embed_corpus(EmbedJob(src, ShardFolder(part, 2), vectors=WordVectors(pooling="first"), model=model))


def test_ray_refuses_what_only_the_local_engine_writes_before_ray_starts(src, tmp_path, monkeypatch):
    """Sparse vectors were handed to Ray's dense embedder before (a sparse spec over dense rows): now refused."""
    monkeypatch.setattr("ctxrep.embed.ray_engine._require_ray", lambda: pytest.fail("Ray was started"))
    for vectors, flag in [
        (SparseVectors(), "--output sparse"),
        (SentenceVectors(chunks=4), "--chunks"),
        (SentenceVectors(output_precision="binary"), "--output-precision binary"),
    ]:
        with pytest.raises(ValueError, match=f"^{flag} is written by --engine local"):
            embed_with_ray(EmbedJob(src, tmp_path / "o", vectors=vectors))


# ---- the flat EmbedJob of before: deprecated, still working --------------------------------------------------------


def test_the_flat_keywords_warn_and_build_the_same_job(src, tmp_path):
    with pytest.warns(DeprecationWarning, match=r"EmbedJob\(level=, shard_size=, dimensions=\) is deprecated"):
        old = EmbedJob(str(src), str(tmp_path), level="sentence", shard_size=3, dimensions=8)
    assert old == EmbedJob(src, ShardFolder(tmp_path, 3), vectors=SentenceVectors(dimensions=8))
    with pytest.warns(DeprecationWarning):
        old = EmbedJob(input_path=str(src), out_dir=str(tmp_path), fmt="text", text_field="text", layers="all")
    assert old == EmbedJob(EmbedInput(src, "text"), tmp_path, vectors=WordVectors("all"))
    with pytest.warns(DeprecationWarning):  # what the flat job took and never read is dropped, as it was
        assert EmbedJob(src, tmp_path, level="word", sentence_pooling="cls").vectors == WordVectors()
    with pytest.warns(DeprecationWarning):
        old = EmbedJob(src, tmp_path, level="sentence", output="sparse", pooling="first", layers="-1")
    assert old.vectors == SparseVectors()
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="--dimensions applies to dense sentence"):
        EmbedJob(src, tmp_path, dimensions=8)
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="in one place"):
        EmbedJob(EmbedInput(src), tmp_path, fmt="text")
    with pytest.raises(TypeError, match="unexpected keyword argument 'levels'"):
        EmbedJob(src, tmp_path, levels="word")
    job = EmbedJob(src, ShardFolder(tmp_path, 3), vectors=SentenceVectors(dimensions=8, chunks=4, late_chunking=False))
    for name, value in [("level", "sentence"), ("shard_size", 3), ("dimensions", 8), ("output", "dense"),
                        ("input_path", str(src)), ("out_dir", str(tmp_path)), ("fmt", "text"), ("chunks", 4),
                        ("late_chunking", False), ("source", str(src)), ("prompt", None)]:  # fmt: skip
        with pytest.warns(DeprecationWarning, match=f"EmbedJob.{name} is deprecated: read job."):
            assert getattr(job, name) == value, name
    with pytest.warns(DeprecationWarning):
        assert EmbedJob(src, tmp_path).dimensions is None and EmbedJob(src, tmp_path).sentence_pooling == "auto"
    with pytest.raises(AttributeError):
        job.colour  # noqa: B018


def test_the_flat_job_writes_the_same_bytes_as_the_typed_one(src, tmp_path, tiny_models):
    model = str(tiny_models["bert"])
    typed = EmbedJob(src, ShardFolder(tmp_path / "typed", 3), vectors=SentenceVectors(chunks=4), model=model)
    embed_corpus(typed, show_progress=False)
    with pytest.warns(DeprecationWarning):
        flat = EmbedJob(str(src), str(tmp_path / "flat"), model=model, level="sentence", shard_size=3, chunks="4")
    embed_corpus(flat, show_progress=False)
    for name in ("shard-00000.safetensors", "shard-00001.safetensors", "index-00000.tsv", "index-00001.tsv"):
        assert (tmp_path / "flat" / name).read_bytes() == (tmp_path / "typed" / name).read_bytes(), name
    # embed_shard / vector_row_shape with a level string: deprecated, the variant's rows
    fz = typed.featurizer()
    records = [Record(t.split(), n + 1) for n, t in enumerate(TEXTS)]
    with pytest.warns(DeprecationWarning, match="a level string"):
        rows, index = embed_shard(fz, records, 0, "sentence", {"chunks": 4})
    np.testing.assert_array_equal(rows, load_shards(tmp_path / "typed")[0])
    assert index == SentenceVectors(chunks=4).rows(fz, records, 0)[1]
    with pytest.warns(DeprecationWarning, match="vector_row_shape"):
        assert vector_row_shape(fz, "sentence", 16) == (16,) == SentenceVectors(dimensions=16).row_shape(fz)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the typed calls warn nothing
        embed_shard(fz, records, 0, WordVectors())
