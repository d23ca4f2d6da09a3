"""Hypothesis fuzzing of every reader of users' files (issue 33 item 8): the table reader (CSV, TSV, JSONL, CoNLL
columns, SQuAD-style JSONL), CoNLL-2003 and CoNLL-U, sentence pairs, the STS layouts and util.files.utf8_lines.

Two properties each: on any bytes a reader either reads or raises a ValueError that names the file (never another
exception: no crash); on files written from generated rows, rows in = rows out, or a ValueError naming the file and
the line of the row it refuses (no silent drop). Bounded: a few dozen examples per property."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ctxrep.data import table
from ctxrep.data.conll import iter_conll
from ctxrep.data.conllu import iter_conllu
from ctxrep.data.sentence_pairs import read_scored_pairs, read_sentence_examples
from ctxrep.data.sts import read_sts
from ctxrep.tasks.kinds import NAMES, Reading, kind
from ctxrep.util.files import utf8_lines

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# text with the characters that break readers: separators, quotes, line breaks, NUL, a BOM, non-ASCII
TRICKY = st.text(alphabet=st.sampled_from(list("ab ,\t\"'\n\r\x00\ufeffé字{}[]:#-")), max_size=12)
WORDS = st.text(alphabet=st.sampled_from(list("abcé字,\"'-")), min_size=1, max_size=6)  # one word: no whitespace
SENTENCE = st.lists(WORDS, min_size=1, max_size=4).map(" ".join)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _named_error(error: ValueError, path: Path) -> int | None:
    """The line an error names (None when it names the file only); fails unless it names `path`."""
    message = str(error)
    assert message.startswith(str(path)), message
    found = re.match(re.escape(str(path)) + r":(\d+)", message)
    return int(found.group(1)) if found else None


# ---- any bytes: read or a ValueError naming the file --------------------------------------------------------

READERS = {
    "table.csv": lambda p: table.read_labelled_texts(p),
    "table.tsv": lambda p: table.read_scored_texts(p, text_pair_column="text_pair"),
    "table.jsonl": lambda p: table.read_labelled_texts(p),
    "numbers.csv": lambda p: table.read_labelled_texts(p, 1, 2, header=False),
    "tags.conll": lambda p: table.read_tagged(p),
    "tags.jsonl": lambda p: table.read_tagged(p, "words", "tags"),
    "span.jsonl": lambda p: table.read_questions(p),
    "pairs.csv": lambda p: read_sentence_examples(p),
    "scored.tsv": lambda p: read_scored_pairs(p),
    "sts.txt": lambda p: read_sts(p),
    "conll.txt": lambda p: list(iter_conll((t for _, t in utf8_lines(p)), source=str(p))),
    "conllu.txt": lambda p: list(iter_conllu((t for _, t in utf8_lines(p)), source=str(p))),
}


@pytest.mark.parametrize("name", sorted(READERS))
@FUZZ
@given(data=st.one_of(st.binary(max_size=200), TRICKY.map(str.encode)), compress=st.booleans())
def test_any_bytes_are_read_or_refused_naming_the_file(folder, name, data, compress):
    path = folder / name
    path.write_bytes(gzip.compress(data) if compress else data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # span questions without answers are left out with a warning
        try:
            READERS[name](path)
        except ValueError as e:
            _named_error(e, path)


# ---- generated rows: rows in = rows out, or the refused row's line ------------------------------------------


def _csv_text(rows: list[list[str]]) -> tuple[str, list[int]]:
    """CSV text (header first) and each data row's first line, as the csv module writes them."""
    out, starts, line = io.StringIO(), [], 2
    writer = csv.writer(out, lineterminator="\r\n")  # Python 3.11 quotes a lone "\r" only when it is in the terminator
    writer.writerow(["text", "label"])
    for row in rows:
        before = out.tell()
        writer.writerow(row)
        starts.append(line)
        line += out.getvalue()[before:].count("\n")
    return out.getvalue(), starts


@FUZZ
@given(rows=st.lists(st.tuples(TRICKY, TRICKY).map(list), min_size=1, max_size=6))
def test_csv_rows_in_equal_rows_out_or_the_line_is_named(folder, rows):
    text, starts = _csv_text(rows)
    path = folder / "rows.csv"
    path.write_text(text, encoding="utf-8", newline="")
    try:
        data = table.read_labelled_texts(path)
    except ValueError as e:
        line = _named_error(e, path)
        assert line is None or 1 <= line <= text.count("\n") + 1, str(e)
        return
    assert len(data.X) == len(rows), (rows, data.X)  # no row dropped or added
    assert data.lines == starts
    assert [x for x in data.X] == [r[0] for r in rows]


@FUZZ
@given(rows=st.lists(st.tuples(SENTENCE, SENTENCE, st.sampled_from(["1", "2.5", "x"])), min_size=1, max_size=6))
def test_tsv_pairs_without_a_header_keep_every_row(folder, rows):
    path = folder / "rows.tsv"
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    data = table.read_labelled_texts(path, 1, 3, text_pair_column=2, header=False)
    assert data.X == [(a, b) for a, b, _ in rows] and data.lines == list(range(1, len(rows) + 1))
    try:
        scores = table.read_scored_texts(path, 1, 3, text_pair_column=2, header=False)
    except ValueError as e:
        first_bad = next(i for i, r in enumerate(rows, start=1) if r[2] == "x")
        assert _named_error(e, path) == first_bad
        return
    assert scores.y == [float(r[2]) for r in rows]


@FUZZ
@given(records=st.lists(st.fixed_dictionaries({"text": TRICKY, "label": st.sampled_from(["a", "b"])}), max_size=6))
def test_jsonl_records_in_equal_records_out_or_the_line_is_named(folder, records):
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    try:
        data = table.read_labelled_texts(path)
    except ValueError as e:
        line = _named_error(e, path)
        blank = [i for i, r in enumerate(records, start=1) if not r["text"].split()]
        assert (line is None and not records) or line == blank[0], (str(e), records)
        return
    assert data.X == [r["text"] for r in records] and data.lines == list(range(1, len(records) + 1))


TAGGED = st.lists(st.lists(st.tuples(WORDS, st.sampled_from(["O", "B-PER", "I-LOC"])), min_size=1, max_size=4))


@FUZZ
@given(sentences=TAGGED.filter(bool), separator=st.sampled_from([" ", "\t"]))
def test_conll_sentences_in_equal_sentences_out(folder, sentences, separator):
    text = "\n\n".join("\n".join(f"{w}{separator}{t}" for w, t in s) for s in sentences) + "\n"
    path = folder / "tags.conll"
    path.write_text(text, encoding="utf-8")
    data = table.read_tagged(path)
    assert data.X == [[w for w, _ in s] for s in sentences] and data.y == [[t for _, t in s] for s in sentences]
    streamed = list(iter_conll(text.splitlines(), source="x"))
    assert [s.words for s in streamed] == data.X and [s.tags for s in streamed] == data.y


@FUZZ
@given(sentences=TAGGED.filter(bool))
def test_conllu_sentences_in_equal_sentences_out(sentences):
    lines = []
    for s in sentences:
        lines += (
            ["# sent_id = x"] + [f"{i}\t{w}\t{w}\t{t}\t_\t_\t0\troot\t_\t_" for i, (w, t) in enumerate(s, 1)] + [""]
        )
    read = list(iter_conllu(lines, source="x"))
    assert [r.words for r in read] == [[w for w, _ in s] for s in sentences]
    assert [r.upos for r in read] == [[t for _, t in s] for s in sentences]


@FUZZ
@given(
    rows=st.lists(st.tuples(SENTENCE, SENTENCE, st.floats(0, 5, allow_nan=False)), min_size=1, max_size=6),
    layout=st.sampled_from(["sts-benchmark", "glue-stsb", "sick"]),
)
def test_sts_pairs_in_equal_pairs_out_in_every_layout(folder, rows, layout):
    if layout == "sts-benchmark":
        text = "".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows))
    elif layout == "glue-stsb":
        text = "index\tsentence1\tsentence2\tscore\n" + "".join(
            f"{i}\t{a}\t{b}\t{s}\n" for i, (a, b, s) in enumerate(rows)
        )
    else:
        text = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        text += "".join(f"{i}\t{a}\t{b}\t{s}\tNEUTRAL\n" for i, (a, b, s) in enumerate(rows))
    path = folder / "sts.txt"
    path.write_text(text, encoding="utf-8")
    pairs = read_sts(path)
    assert [(p.text_a, p.text_b, p.score) for p in pairs] == [(a.strip(), b.strip(), s) for a, b, s in rows]
    assert read_scored_pairs(path).X == [(a.strip(), b.strip()) for a, b, _ in rows]


@FUZZ
@given(rows=st.lists(st.tuples(TRICKY, TRICKY).map(list), min_size=1, max_size=6))
@example(rows=[[":", ":\r"]])  # a field ending in "\r" at a line's end: quoted, so not a CRLF
def test_sentence_pairs_in_equal_pairs_out_or_the_line_is_named(folder, rows):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # with "\n", ':\r' at a line's end would be written as CRLF
    writer.writerows([["text", "text_pair"], *rows])
    path = folder / "pairs.csv"
    path.write_text(out.getvalue(), encoding="utf-8", newline="")
    try:
        data = read_sentence_examples(path)
    except ValueError as e:
        assert _named_error(e, path) is not None, str(e)
        return
    assert data.X == [tuple(r) for r in rows]


@FUZZ
@given(text=st.text(max_size=60), bom=st.booleans(), compress=st.booleans())
def test_utf8_lines_give_back_the_text_line_by_line(folder, text, bom, compress):
    data = ("\ufeff" if bom else "").encode() + text.encode("utf-8")
    path = folder / "lines.txt"
    path.write_bytes(gzip.compress(data) if compress else data)
    lines = list(utf8_lines(path, keep_ends=True))
    assert "".join(t for _, t in lines) == text and [n for n, _ in lines] == list(range(1, len(lines) + 1))
    assert all(t.endswith("\n") for _, t in lines[:-1])


@FUZZ
@given(prefix=st.text(alphabet="ab\n", max_size=10), bad=st.sampled_from([b"\xff", b"\xc3(", b"\xe2\x82"]))
def test_invalid_utf8_names_the_line_and_column(folder, prefix, bad):
    path = folder / "bad.txt"
    path.write_bytes(prefix.encode() + bad + b"z\n")
    with pytest.raises(ValueError) as caught:
        list(utf8_lines(path))
    line = prefix.count("\n") + 1
    assert str(caught.value).startswith(f"{path}:{line}:"), str(caught.value)


# ---- every task kind's readers (training files and prediction input), through the table of kinds -------------


@pytest.mark.parametrize("labelled", [True, False], ids=["training", "prediction"])
@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(data=st.one_of(st.binary(max_size=120), TRICKY.map(str.encode)))
def test_every_kind_reads_any_bytes_or_refuses_naming_the_file(folder, name, labelled, data):
    suffix = {"wic": ".data.txt", "squad": ".json", "span": ".jsonl", "sick-r": ".txt"}.get(name, ".tsv")
    path = folder / f"kind-{name}{suffix}"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            kind(name).read_file(path, Reading(labelled=labelled))
        except ValueError as e:
            _named_error(e, path)
