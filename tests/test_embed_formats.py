"""`ctxrep embed` input formats: CSV / TSV columns, --text-column (and its alias --text-field), gzip input,
advice when plain text looks structured, and an error for an empty input (a warning with --allow-empty)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.cli.embed import embed, load_shards

TEXTS = ["The vase broke .", "Dawn broke , slowly .", "A crane lifted the beam"]


@pytest.fixture(scope="module")
def model(tiny_models):
    return str(tiny_models["bert"])


def run(model, src, out, *args, input=None):
    return CliRunner().invoke(embed, ["--model", model, "--input", str(src), "--out", str(out), *args], input=input)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model):
    """The three texts embedded from a plain text file: what every other format must give."""
    tmp = tmp_path_factory.mktemp("ref")
    (tmp / "in.txt").write_text("\n".join(TEXTS) + "\n")
    result = run(model, tmp / "in.txt", tmp / "out")
    assert result.exit_code == 0, result.output
    return load_shards(tmp / "out")


def _same_vectors(out, reference, lines):
    vectors, index = load_shards(out)
    np.testing.assert_array_equal(vectors, reference[0])
    assert [r["token"] for r in index] == [r["token"] for r in reference[1]]
    assert sorted({(r["text"], r["line"]) for r in index}) == list(enumerate(lines))


def test_csv_by_column_name_with_quoted_commas_and_newlines(tmp_path, model, reference):
    src = tmp_path / "in.csv"
    # the second record's text holds a comma and is quoted; the first record's note spans two lines
    src.write_text(
        'id,text,note\n1,The vase broke .,"two\nlines"\n2,"Dawn broke , slowly .",x\n3,A crane lifted the beam,\n'
    )
    result = run(model, src, tmp_path / "out", "--format", "csv", "--text-column", "text")
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "out", reference, [2, 4, 5])  # the line where each record starts


def test_tsv_by_column_number_and_the_text_field_alias(tmp_path, model, reference):
    src = tmp_path / "in.tsv"
    src.write_text("label\tsentence\n" + "".join(f"pos\t{t}\n" for t in TEXTS))
    result = run(model, src, tmp_path / "a", "--format", "tsv", "--text-column", "2", "--header")
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "a", reference, [2, 3, 4])
    result = run(model, src, tmp_path / "b", "--format", "tsv", "--text-field", "sentence")
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "b", reference, [2, 3, 4])


def test_jsonl_text_column(tmp_path, model, reference):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(TEXTS)))
    result = run(model, src, tmp_path / "out", "--format", "jsonl", "--text-column", "body")
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "out", reference, [1, 2, 3])


def test_gzip_input_is_read_as_is_from_a_file_and_from_stdin(tmp_path, model, reference):
    src = tmp_path / "in.txt.gz"
    src.write_bytes(gzip.compress(("\n".join(TEXTS) + "\n").encode()))
    result = run(model, src, tmp_path / "file")
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "file", reference, [1, 2, 3])
    tsv_gz = gzip.compress(("text\n" + "\n".join(TEXTS) + "\n").encode())
    result = run(model, "-", tmp_path / "stdin", "--format", "tsv", input=tsv_gz)
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "stdin", reference, [2, 3, 4])


@pytest.mark.parametrize(
    "first_line, advice",
    [
        ("id,text,label", "looks like a CSV header (id, text, label); to read it as such pass --format csv"),
        ("label\ttext", "looks like a TSV header (label, text); to read it as such pass --format tsv"),
        ('{"text": "a b"}', "looks like JSON Lines; to read it as such pass --format jsonl --text-column FIELD"),
    ],
)
def test_plain_text_that_looks_structured_gets_advice_on_stderr(tmp_path, model, first_line, advice):
    src = tmp_path / "in.txt"
    src.write_text(f"{first_line}\nsome words here\n")
    result = run(model, src, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert f"warning: {src}:1: this {advice}" in result.stderr
    assert advice not in result.stdout


def test_ordinary_text_with_commas_and_tabs_gets_no_advice(tmp_path, model):
    src = tmp_path / "in.txt"
    src.write_text("Well, the vase broke, again.\nDawn\tbroke\n")
    result = run(model, src, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr


@pytest.mark.parametrize(
    "content, args, what",
    [
        (b"", [], "it holds no texts"),
        (b"\n\n  \n", ["--skip-empty"], "all its texts were empty and skipped"),
        (b"id,text\n", ["--format", "csv"], "it holds no texts"),
        (gzip.compress(b"", mtime=0), [], "it holds no texts"),
    ],
)
def test_an_empty_input_is_an_error_unless_allowed(tmp_path, model, content, args, what):
    """The same exit status as every command's empty input (index build, search --queries, rerank): 1 and one line;
    --allow-empty writes the empty folder with a warning."""
    src = tmp_path / "in.txt"
    src.write_bytes(content)
    result = run(model, src, tmp_path / "out", *args)
    assert result.exit_code == 1, result.output
    assert f"error: {src}: nothing to embed: {what}; check the input file and --format (or give --allow-empty" in (
        result.stderr
    )
    allowed = run(model, src, tmp_path / "out", *args, "--allow-empty")
    assert allowed.exit_code == 0, allowed.output
    assert f"warning: {src}: nothing to embed: {what}; check the input file and --format" in allowed.stderr
    if "--skip-empty" not in args:  # index build reads the same file: the same status (one rule across commands)
        index_build = ["index", "build", "--input", str(src), "--model", model, "--out", str(tmp_path / "ix"), *args]
        assert CliRunner().invoke(main, index_build).exit_code == result.exit_code


@pytest.mark.parametrize(
    "content, args, message",
    [
        (
            b"id,body\n1,a b\n",
            ["--format", "csv"],
            "in.csv:1: no column 'text' in the header (columns: id, body); name the column with --text-column",
        ),
        (b"id\ttext\n1\ta b\n", ["--format", "csv"], "(is the file tab-separated? give --format tsv)"),
        (b"id,text\n1,a b\n2\n", ["--format", "csv"], "in.csv:3: 1 field(s) but the header has 2"),
        (b"id,text\n1,a b\n2,  \n", ["--format", "csv"], "in.csv:3: empty text in column 'text'"),
        (b"id,text\n1,a b\n\n", ["--format", "csv"], "in.csv:3: empty line"),
        (
            b"a b\n",
            ["--format", "text", "--text-column", "body"],
            "--text-column applies to --format jsonl, csv, tsv or parquet, not text",
        ),
        (
            b'{"body": "a"}\n',
            ["--format", "jsonl"],
            "in.csv:1: no field 'text' in the JSON object (fields: body); name the field with --text-column",
        ),
    ],
)
def test_bad_table_input_gives_one_line_error(tmp_path, model, content, args, message):
    src = tmp_path / "in.csv"
    src.write_bytes(content)
    result = run(model, src, tmp_path / "out", *args)
    assert result.exit_code == 1
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_csv_blank_lines_skipped_keep_true_line_numbers(tmp_path, model):
    src = tmp_path / "in.csv"
    src.write_text("text\nThe vase broke .\n\n  \nDawn broke .\n")
    result = run(model, src, tmp_path / "out", "--format", "csv", "--skip-empty")
    assert result.exit_code == 0, result.output
    _, index = load_shards(tmp_path / "out")
    assert sorted({(r["text"], r["line"]) for r in index}) == [(0, 2), (1, 5)]


def test_quantize_int8_gives_close_vectors_and_is_part_of_the_run_spec(tmp_path, model, reference):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    result = run(model, tmp_path / "in.txt", tmp_path / "out", "--quantize", "int8", "--no-compile")
    assert result.exit_code == 0, result.output
    vectors, _ = load_shards(tmp_path / "out")
    ref = reference[0]
    cosine = (vectors * ref).sum(-1) / (np.linalg.norm(vectors, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert vectors.shape == ref.shape and cosine.mean() > 0.95 and not np.array_equal(vectors, ref)
    again = run(model, tmp_path / "in.txt", tmp_path / "out")  # float32 into an int8 run's folder: refused
    assert again.exit_code == 1 and "differs in: precision" in again.output, again.output


@pytest.mark.parametrize("name", ["in.csv", "in.tsv", "in.jsonl", "in.ndjson", "in.csv.gz", "IN.TSV.GZ"])
def test_without_format_the_file_name_says_it(tmp_path, model, reference, name):
    """Issue 42: `--input X.csv` (.tsv, .jsonl, with or without .gz) needs no --format: the file name says it, read
    as `ctxrep index build` and `finetune` read it (ctxrep.data.table.detect_format); the manifest records it."""
    import csv
    import io

    fmt = {"csv": "csv", "tsv": "tsv", "jsonl": "jsonl", "ndjson": "jsonl"}[name.lower().split(".")[1]]
    if fmt == "jsonl":
        content = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS))
        lines = [1, 2, 3]
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer, delimiter="," if fmt == "csv" else "\t", lineterminator="\n")
        writer.writerows([["id", "text"], *[[i, t] for i, t in enumerate(TEXTS)]])
        content, lines = buffer.getvalue(), [2, 3, 4]
    src = tmp_path / name
    data = content.encode()
    src.write_bytes(gzip.compress(data, mtime=0) if name.lower().endswith(".gz") else data)
    result = run(model, src, tmp_path / "out")
    assert result.exit_code == 0, result.output
    _same_vectors(tmp_path / "out", reference, lines)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["settings"]["format"] == fmt
    # a name that says nothing (or standard input) is plain text, and --format still decides over the name
    (tmp_path / "in.dat").write_text("\n".join(TEXTS) + "\n")
    assert run(model, tmp_path / "in.dat", tmp_path / "dat").exit_code == 0
    assert json.loads((tmp_path / "dat" / "manifest.json").read_text())["settings"]["format"] == "text"
    if fmt == "csv":
        result = run(model, src, tmp_path / "as-text", "--format", "text")
        assert result.exit_code == 0 and len(load_shards(tmp_path / "as-text")[0]) > len(reference[0])  # the header
