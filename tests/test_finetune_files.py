"""`ctxrep finetune --task classify|pair|tag|span` on the user's own CSV / TSV / JSONL / CoNLL files (gzip read as
is), the readers behind it (ctxrep.data.table), --max-steps and --crf, and errors that name the file, the line and
an option that exists."""

from __future__ import annotations

import gzip
import json
import re

import click
import pytest
from click.testing import CliRunner

from ctxrep.cli.finetune import finetune
from ctxrep.data import table

CSV = 'text,label\n"good, great fine",pos\n"bad awful\npoor sad",neg\n' + "good nice,pos\nbad sad,neg\n" * 5
TSV = "s1\ts2\ty\n" + "the cat\tgood great\tyes\nthe dog\tbad awful\tno\n" * 6
CONLL = "-DOCSTART- -X- O\n\n" + "John NNP B-PER\nlives VBZ O\nin IN O\nParis NNP B-LOC\n\n" * 6
CONTEXT = "the meeting was in london yesterday ."
SPAN = [
    {
        "question": "where was the meeting ?",
        "context": CONTEXT,
        "answers": {"text": ["london"], "answer_start": [CONTEXT.index("london")]},
    },
    {
        "question": "when was the meeting ?",
        "context": CONTEXT,
        "answers": [{"text": "yesterday", "answer_start": CONTEXT.index("yesterday")}],
    },
] * 4


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def write(path, text: str, compress: bool = False):
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def run(tiny_models, tmp_path, args: list[str]):
    base = [
        "--model",
        str(tiny_models["bert"]),
        "--batch-size",
        "4",
        "--lr",
        "3e-3",
        "--no-progress",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
    ]
    return CliRunner().invoke(finetune, args + base)


# every option of the command, --help included (click adds it)
OPTIONS = {opt for p in finetune.get_params(click.Context(finetune)) for opt in (*p.opts, *p.secondary_opts)}


def advice_options(message: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z-]*", message))


# ---- the four file tasks end to end ----------------------------------------------------------------------


def test_classify_csv_with_a_gzipped_dev_file_and_max_steps(tiny_models, tmp_path):
    train = write(tmp_path / "train.csv", CSV)
    dev = write(tmp_path / "dev.csv.gz", CSV, compress=True)
    result = run(
        tiny_models,
        tmp_path,
        ["--task", "classify", "--train", str(train), "--dev", str(dev), "--max-steps", "4", "--max-epochs", "1"],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["train_examples"] == metrics["dev_examples"] == 12 and metrics["score_name"] == "accuracy"
    assert [h["steps"] for h in metrics["history"]] == [3, 4]  # 12 examples / 4 = 3 steps an epoch; 4 in all
    assert metrics["params"]["max_steps"] == 4 and "macro f1" in result.output


def test_pair_tsv_with_named_columns(tiny_models, tmp_path):
    train = write(tmp_path / "train.tsv", TSV)
    args = [
        "--task",
        "pair",
        "--train",
        str(train),
        "--dev",
        str(train),
        "--text-column",
        "s1",
        "--text-pair-column",
        "s2",
        "--label-column",
        "y",
        "--max-epochs",
        "8",
    ]
    result = run(tiny_models, tmp_path, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["score"] == 1.0
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["estimator"] == "SequenceClassifier" and config["state"]["pairs"] is True


def test_tag_gzipped_conll_with_column_options_and_a_crf(tiny_models, tmp_path):
    train = write(tmp_path / "train.iob.gz", CONLL, compress=True)
    args = [
        "--task",
        "tag",
        "--train",
        str(train),
        "--dev",
        str(train),
        "--word-column",
        "1",
        "--tag-column",
        "-1",
        "--crf",
        "--max-epochs",
        "12",
        "--lr",
        "1e-2",
    ]
    result = run(tiny_models, tmp_path, args)
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["score_name"] == "entity_f1" and metrics["score"] == 1.0 and "PER" in result.output
    assert metrics["params"]["crf"] is True


def test_tag_jsonl_lists_and_token_accuracy_for_pos_tags(tiny_models, tmp_path):
    lines = [{"tokens": ["the", "cat", "runs"], "pos": ["DET", "NOUN", "VERB"]}] * 8
    train = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    args = [
        "--task",
        "tag",
        "--train",
        str(train),
        "--dev",
        str(train),
        "--word-column",
        "tokens",
        "--tag-column",
        "pos",
        "--max-epochs",
        "3",
    ]
    result = run(tiny_models, tmp_path, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["score_name"] == "accuracy"


def test_span_squad_style_jsonl(tiny_models, tmp_path):
    rows = SPAN + [{"question": "who ?", "context": CONTEXT, "answers": {"text": [], "answer_start": []}}]
    train = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match="left out 1 question"):
        data = table.read_questions(train)
    assert data.X[0] == (SPAN[0]["question"], CONTEXT) and data.y[:2] == [[("london", 19)], [("yesterday", 26)]]
    with pytest.warns(UserWarning, match="left out 1 question"):
        result = run(
            tiny_models, tmp_path, ["--task", "span", "--train", str(train), "--dev", str(train), "--max-epochs", "1"]
        )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["score_name"] == "f1"


# ---- the readers ---------------------------------------------------------------------------------------


def test_readers_read_csv_quoting_tsv_jsonl_and_conllu(tmp_path):
    data = table.read_labelled_texts(write(tmp_path / "a.csv", CSV))
    assert data.X[:2] == ["good, great fine", "bad awful\npoor sad"] and data.y[:2] == ["pos", "neg"]
    assert data.lines[:3] == [2, 3, 5]  # the quoted field spans lines 3-4
    tsv = write(tmp_path / "a.tsv", 'a\t"b\tc\n"x\t"y\t1\n')
    data = table.read_labelled_texts(tsv, 1, -1, text_pair_column=2, header=True)  # columns counted from 1
    assert data.X == [('"x', '"y')] and data.y == ["1"]  # TSV: quotes are ordinary text
    data = table.read_labelled_texts(write(tmp_path / "a.jsonl", '{"text": "hi there", "label": 3}\n\n'))
    assert data.X == ["hi there"] and data.y == [3]
    conllu = "# sent_id = 1\n1-2\tdon't\t_\t_\n1\tdo\tdo\tAUX\n2\tn't\tnot\tPART\n3\tgo\tgo\tVERB\n\n"
    data = table.read_tagged(write(tmp_path / "a.conllu", conllu), word_column=2, tag_column=4)
    assert data.X == [["do", "n't", "go"]] and data.y == [["AUX", "PART", "VERB"]] and data.lines == [3]
    data = table.read_tagged(write(tmp_path / "eng.train", CONLL))  # no suffix: CoNLL columns
    assert len(data.X) == 6 and data.X[0] == ["John", "lives", "in", "Paris"] and data.lines[:2] == [3, 8]


@pytest.mark.parametrize(
    ("name", "text", "call", "message"),
    [
        (
            "a.csv",
            "sentence,label\nhi,pos\n",
            lambda p: table.read_labelled_texts(p),
            r"a\.csv:1: no column 'text' in the header \(columns: sentence, label\); name the column with --text-column",
        ),
        (
            "a.csv",
            "text,label\nhi,pos\n,neg\n",
            lambda p: table.read_labelled_texts(p),
            r"a\.csv:3: the 'text' column \(--text-column\) is empty",
        ),
        (
            "a.csv",
            "text,label\nhi,pos\nho\n",
            lambda p: table.read_labelled_texts(p),
            r"a\.csv:3: 1 field\(s\) but the header has 2; quote fields that hold commas",
        ),
        (
            "a.csv",
            "text,label\nhi,\n",
            lambda p: table.read_labelled_texts(p),
            r"a\.csv:2: the label column 'label' \(--label-column\) is empty",
        ),
        (
            "a.csv",
            "text,label\nhi,pos\n",
            lambda p: table.read_labelled_texts(p, label_column=5),
            r"a\.csv:1: --label-column 5 is out of range: the header has 2 column\(s\)",
        ),
        (
            "a.jsonl",
            '{"text": "a", "label": 1}\n{"text": "b", "label": "1"}\n',
            lambda p: table.read_labelled_texts(p),
            r"a\.jsonl:2: a str label, but line 1 has a float one",
        ),
        (
            "a.jsonl",
            '{"text": "a", "label": 1}\n{"text": "b" "label": 1}\n',
            lambda p: table.read_labelled_texts(p),
            r"a\.jsonl:2: invalid JSON at column 14: Expecting .,. delimiter",
        ),
        (
            "a.jsonl",
            '{"sentence": "a", "label": 1}\n',
            lambda p: table.read_labelled_texts(p),
            r"a\.jsonl:1: no field 'text' in the JSON object \(fields: sentence, label\); name the field with --text-column",
        ),
        (
            "a.txt",
            "hello\n",
            lambda p: table.read_labelled_texts(p),
            r"a\.txt: cannot tell the format from the file name; give --format",
        ),
        ("a.csv", "text,label\n", lambda p: table.read_labelled_texts(p), r"a\.csv: no examples in the file"),
        (
            "a.conll",
            "EU B-ORG\nrejects\n",
            lambda p: table.read_tagged(p, tag_column=2),
            r"a\.conll:2: the row has 1 column\(s\) but --tag-column is 2",
        ),
        (
            "a.conll",
            "EU B-ORG\n",
            lambda p: table.read_tagged(p, tag_column="ner"),
            r"a\.conll: --tag-column 'ner' is a name, but a CoNLL-style file has no header",
        ),
        ("a.csv", "w,t\n", lambda p: table.read_tagged(p), r"a\.csv: --task tag reads CoNLL-style column files"),
        (
            "a.jsonl",
            '{"tokens": ["a", "b"], "tags": ["O"]}\n',
            lambda p: table.read_tagged(p, "tokens", "tags"),
            r"a\.jsonl:1: 2 words but 1 tags",
        ),
        (
            "a.jsonl",
            json.dumps(SPAN[0] | {"answers": {"text": ["paris"], "answer_start": [19]}}) + "\n",
            lambda p: table.read_questions(p),
            r"a\.jsonl:1: answer 1 is 'paris' but the context at character 19 reads 'londo'; fix answer_start",
        ),
        (
            "a.json",
            '{\n  "version": "v2.0",\n  "data": []\n}\n',
            lambda p: table.read_questions(p),
            r"a\.json:1: this looks like one indented JSON document, not JSON Lines.*--task squad",
        ),
        (
            "a.jsonl",
            json.dumps({"version": "v2.0", "data": []}) + "\n",
            lambda p: table.read_questions(p),
            r"a\.jsonl:1: this is a SQuAD JSON document, not JSONL; read it with --task squad",
        ),
        ("a.csv", "text,label\n\xe9,pos\n", None, r"a\.csv:2: invalid UTF-8 byte"),
    ],
)
def test_reader_errors_name_the_file_the_line_and_an_option_that_exists(tmp_path, name, text, call, message):
    path = tmp_path / name
    if call is None:  # latin-1 bytes
        path.write_bytes(text.encode("latin-1"))
        call = table.read_labelled_texts
    else:
        path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        call(path)
    assert advice_options(str(error.value)) <= OPTIONS


def test_a_damaged_gzip_file_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress(CSV.encode())[:30])
    with pytest.raises(ValueError, match=r"a\.csv\.gz: the gzip stream is damaged"):
        table.read_labelled_texts(path)


# ---- the command line: every error names a real option -------------------------------------------------------


def test_cli_errors_name_the_file_and_line_and_only_options_that_exist(tiny_models, tmp_path):
    good = write(tmp_path / "train.csv", CSV)
    dev = write(tmp_path / "dev.csv", "text,label\ngood,pos\nmeh,neutral\n")
    jsonl = write(tmp_path / "t.jsonl", '{"sentence": "x", "label": 1}\n')
    cases = [
        (
            ["--task", "classify", "--train", str(good), "--dev", str(dev)],
            r"dev\.csv:3: label 'neutral' does not occur in .*train\.csv",
        ),
        (
            ["--task", "classify", "--train", str(jsonl), "--dev", str(jsonl)],
            r"t\.jsonl:1: no field 'text'.*--text-column",
        ),
        (
            ["--task", "classify", "--train", str(good), "--dev", str(good), "--text-pair-column", "b"],
            r"--task classify does not read --text-pair-column.*use --task pair",
        ),
        (
            ["--task", "classify", "--train", str(good), "--dev", str(good), "--word-column", "0"],
            r"--task classify does not read --word-column; it reads --format, --header, --text-column, --label-column",
        ),
        (
            ["--task", "sst2", "--train", str(good), "--dev", str(good), "--text-column", "x"],
            r"--task sst2 reads its own format, so --text-column does not apply; column settings are for --task "
            r"classify, pair, regress, tag, span, wic",
        ),
        (["--task", "classify", "--train", str(good), "--dev", str(good), "--crf"], r"--crf and --tag-scheme are for"),
        (["--task", "tag", "--train", str(good), "--dev", str(good)], r"train\.csv: --task tag reads CoNLL-style"),
        (["--task", "span", "--train", str(good), "--dev", str(good)], r"train\.csv: --task span reads JSONL"),
        (
            ["--task", "classify", "--train", str(tmp_path / "missing.csv"), "--dev", str(good)],
            r"missing\.csv: no such file",
        ),
    ]
    for args, message in cases:
        result = run(tiny_models, tmp_path, args + ["--max-epochs", "1"])
        assert result.exit_code != 0, args
        assert re.search(message, result.output), (message, result.output)
        named = advice_options(result.output)
        assert named <= OPTIONS, (named - OPTIONS, result.output)
