"""One reader of users' table files (issue 31, item 3): `ctxrep embed`, `ctxrep index build` and `ctxrep finetune`
read CSV / TSV / JSONL through ctxrep.data.table, with one column rule (a header name, or a number counted from 1,
-1 the last; JSONL: a field name) and one header rule (a named column means a header; with every column a number
the reader refuses to guess until --header or --no-header says which). No row is dropped without being read as the
header."""

from __future__ import annotations

import gzip
import io
import json

import pytest
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.embed.corpus import load_shards, read_records
from ctxrep.tasks.kinds import Reading, kind
from ctxrep.vectors.index import SentenceIndex, read_texts

TEXTS = ["the vase broke", "dawn broke slowly", "a crane lifted the beam"]
HEADERLESS = "".join(f"{i},{t},pos\n" for i, t in enumerate(TEXTS))  # id, text, label: no header row
WITH_HEADER = "id,sentence,label\n" + HEADERLESS


def _run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _embedded_texts(out) -> tuple[list[str], list[int]]:
    """The texts of a `ctxrep embed --level word` folder (one index row per word) and the line each came from."""
    _, index = load_shards(out)
    words: dict[int, list[str]] = {}
    lines: dict[int, int] = {}
    for row in index:
        words.setdefault(int(row["text"]), []).append(row["token"])
        lines[int(row["text"])] = int(row["line"])
    return [" ".join(words[k]) for k in sorted(words)], [lines[k] for k in sorted(lines)]


def _embed(model, src, out, *args):
    return _run(["embed", "--model", model, "--input", src, "--out", out, "--format", "csv", *args])


def _index(model, src, out, *args):
    return _run(["index", "build", "--model", model, "--input", src, "--out", out, *args])


# ---- a headerless file with numbered columns is refused, naming the flags -----------------------------------


def test_numbered_columns_without_header_flag_are_refused_by_embed_and_index_build(tiny_models, tmp_path):
    src = tmp_path / "t.csv"
    src.write_text(HEADERLESS)
    model = tiny_models["bert"]
    for result in (
        _embed(model, src, tmp_path / "e", "--text-column", "2"),
        _index(model, src, tmp_path / "i", "--text-column", "2"),
        _index(model, src, tmp_path / "j", "--text-column", "2", "--id-column", "1"),
    ):
        assert result.exit_code == 1
        message = " ".join(result.output.split())
        assert "the first row could be a header or an example; say which with --header" in message, message
        assert "--no-header (it is the first example)" in message
    assert not (tmp_path / "e").exists()  # refused before the output folder is touched


def test_header_flags_are_refused_where_there_is_no_header(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    with pytest.raises(ValueError, match="--header / --no-header apply to CSV and TSV files; a text file has no"):
        read_texts(src, None, header=False)
    result = _run(["embed", "--input", src, "--out", tmp_path / "o", "--no-header"])
    assert result.exit_code == 1
    assert "--header / --no-header apply to --format csv or tsv, not text" in result.output
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    with pytest.raises(ValueError, match="--header / --no-header are for CSV and TSV; a JSON Lines record names"):
        read_texts(jsonl, None, header=True)


# ---- --no-header keeps every row; a named column reads the header ------------------------------------------


def test_no_header_keeps_every_row_in_embed_and_index_build(tiny_models, tmp_path):
    src = tmp_path / "t.csv"
    src.write_text(HEADERLESS)
    model = tiny_models["bert"]
    result = _embed(model, src, tmp_path / "e", "--text-column", "2", "--no-header")
    assert result.exit_code == 0, result.output
    texts, lines = _embedded_texts(tmp_path / "e")
    assert texts == TEXTS and lines == [1, 2, 3]  # rows in = rows out
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["settings"]["header"] is False
    result = _embed(model, src, tmp_path / "e", "--text-column", "2", "--header")  # other rows: not resumed
    assert result.exit_code == 1 and "holds the output of a different run (differs in: header)" in result.output
    result = _index(model, src, tmp_path / "i", "--text-column", "-2", "--id-column", "1", "--no-header")
    assert result.exit_code == 0, result.output
    ix = SentenceIndex.load(tmp_path / "i")
    assert ix.texts == TEXTS and ix.ids == ["0", "1", "2"]


def test_a_named_column_reads_the_header_in_embed_and_index_build(tiny_models, tmp_path):
    src = tmp_path / "t.csv"
    src.write_text(WITH_HEADER)
    model = tiny_models["bert"]
    result = _embed(model, src, tmp_path / "e", "--text-column", "sentence")
    assert result.exit_code == 0, result.output
    assert _embedded_texts(tmp_path / "e") == (TEXTS, [2, 3, 4])
    result = _index(model, src, tmp_path / "i", "--text-column", "sentence", "--id-column", "1")
    assert result.exit_code == 0, result.output  # a named column decides the header for the numbered one too
    ix = SentenceIndex.load(tmp_path / "i")
    assert ix.texts == TEXTS and ix.ids == ["0", "1", "2"]
    result = _embed(model, src, tmp_path / "n", "--text-column", "sentence", "--no-header")
    assert result.exit_code == 1
    assert "'sentence' is a name, but with --no-header the columns have no names; give its number (1 to 3)" in (
        " ".join(result.output.split())
    )


def test_embed_reads_a_gzip_headerless_tsv_from_stdin_with_no_header(tmp_path):
    data = gzip.compress("".join(f"{i}\t{t}\n" for i, t in enumerate(TEXTS)).encode())
    records = list(read_records(gzip.GzipFile(fileobj=io.BytesIO(data)), "<stdin>", "tsv", "-1", False, header=False))
    assert [" ".join(r.words) for r in records] == TEXTS and [r.line for r in records] == [1, 2, 3]
    with pytest.raises(ValueError, match=r"<stdin>:1: the columns are given by number \(--text-column -1\)"):
        list(read_records(io.BytesIO(data), "<stdin>", "tsv", "-1", False))


def test_embed_blank_lines_and_bad_rows_name_file_and_line(tmp_path):
    text = "id,sentence\n0,the vase broke\n\n1,dawn broke slowly,extra\n"
    src = io.BytesIO(text.encode())
    with pytest.raises(ValueError, match=r"^in.csv:3: empty line; remove it, or pass --skip-empty"):
        list(read_records(src, "in.csv", "csv", "sentence", False))
    src = io.BytesIO(text.encode())
    with pytest.raises(ValueError, match=r"^in.csv:4: 3 field\(s\) but the header has 2; quote fields"):
        list(read_records(src, "in.csv", "csv", "sentence", True))


# ---- the same file gives the same texts in embed, index build and finetune ----------------------------------


@pytest.mark.parametrize(
    "content, suffix, columns",
    [
        (HEADERLESS, ".csv", {"text_column": "2", "header": False}),
        (WITH_HEADER, ".csv", {"text_column": "2", "header": True}),
        (WITH_HEADER, ".csv", {"text_column": "sentence"}),
        (WITH_HEADER.replace(",", "\t"), ".tsv", {"text_column": "-2", "header": True}),
        (
            "".join(json.dumps({"sentence": t, "label": "pos"}) + "\n" for t in TEXTS),
            ".jsonl",
            {"text_column": "sentence"},
        ),
    ],
)
def test_the_same_file_gives_the_same_texts_in_embed_index_build_and_finetune(
    tiny_models, tmp_path, content, suffix, columns
):
    src = tmp_path / f"t{suffix}"
    src.write_text(content)
    fmt = suffix[1:]
    flags = ["--text-column", columns["text_column"], "--format", fmt]
    if "header" in columns:
        flags.append("--header" if columns["header"] else "--no-header")
    model = tiny_models["bert"]

    embed_args = ["embed", "--model", model, "--input", src, "--out", tmp_path / "e", *flags]
    result = _run(embed_args)
    assert result.exit_code == 0, result.output
    embedded, lines = _embedded_texts(tmp_path / "e")

    result = _index(model, src, tmp_path / "i", *flags)
    assert result.exit_code == 0, result.output
    indexed = SentenceIndex.load(tmp_path / "i").texts

    # finetune's reader: the classify row of the task-kind table, with the settings its CLI passes
    label = "3" if "header" in columns else "label"
    data = kind("classify").read_file(src, Reading({**columns, "label_column": label, "format": fmt}))

    assert embedded == indexed == data.X == TEXTS
    assert lines == data.lines
    assert data.y == ["pos"] * 3


def test_help_states_the_column_and_header_rules():
    for command in (["embed"], ["index", "build"]):
        text = " ".join(_run([*command, "--help"]).output.split())
        assert "counted from 1 (-1: the last)" in text, command
        assert "--header / --no-header" in text and "a column given by name means --header" in text, command


def test_embed_reads_a_table_one_row_at_a_time():
    """A corpus of millions of rows is never loaded whole: the first record comes after the first rows are read."""
    read = []

    def stream():
        yield b"id,sentence\n"
        for i in range(100_000):
            read.append(i)
            yield f"{i},text number {i}\n".encode()

    records = read_records(stream(), "big.csv", "csv", "sentence", False)
    first = next(records)
    assert first.words == ["text", "number", "0"] and first.line == 2
    assert len(read) < 10


def test_parquet_columns_count_from_one_too(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "sentence": TEXTS}), src)
    for column in ("sentence", "2", "-1"):
        with open(src, "rb") as f:
            assert [" ".join(r.words) for r in read_records(f, "t.parquet", "parquet", column, False)] == TEXTS
    with open(src, "rb") as f, pytest.raises(ValueError, match=r"t.parquet: --text-column 3 is out of range: the file"):
        list(read_records(f, "t.parquet", "parquet", "3", False))
