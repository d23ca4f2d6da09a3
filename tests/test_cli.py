"""The command line: embed (formats, index alignment, resume, bad input), demo, info."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import ctxrep.embed.corpus as embed_module
from ctxrep import Featurizer
from ctxrep.cli import main
from ctxrep.cli.embed import load_shards


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input)


@pytest.fixture(scope="module")
def fz():
    return Featurizer("minilm", layers=-1)


LINES = ["The vase broke .", "Dawn broke .", "", "A crane lifted the beam", "We broke even ."]


def test_embed_text_words_index_points_at_input_lines(tmp_path, fz):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n")
    result = run(["embed", "--input", str(src), "--out", str(tmp_path / "out"), "--skip-empty", "--shard-size", "2"])
    assert result.exit_code == 0, result.output
    vectors, index = load_shards(tmp_path / "out")
    texts = [t for t in LINES if t]
    expected = fz.embed_words(texts)
    assert vectors.shape == (sum(len(t.split()) for t in texts), 384)
    np.testing.assert_allclose(vectors, np.concatenate(expected), atol=1e-5)
    # every row names its true input line (the empty line 3 is skipped, not shifted over)
    assert [r["line"] for r in index if r["word"] == 0] == [1, 2, 4, 5]
    assert [r["token"] for r in index if r["line"] == 4] == "A crane lifted the beam".split()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) == 2


def test_embed_jsonl_sentences_all_layers_npy(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "body": "Dawn broke ."}\n{"id": 2, "body": ["Pre", "split"]}\n')
    out = tmp_path / "out"
    result = run(
        [
            "embed",
            "--input",
            str(src),
            "--out",
            str(out),
            "--format",
            "jsonl",
            "--text-field",
            "body",
            "--level",
            "sentence",
            "--layers",
            "all",
            "--shard-format",
            "npy",
        ]
    )
    assert result.exit_code == 0, result.output
    vectors, index = load_shards(out)
    assert vectors.shape == (2, 7, 384)
    assert [r["line"] for r in index] == [1, 2]


def test_embed_conll_columns(tmp_path, fz):
    src = tmp_path / "in.conll"
    src.write_text("EU NNP B-NP I-ORG\nrejects VBZ B-VP O\n\n-DOCSTART- -X- O O\n\nPeter NNP B-NP I-PER\n")
    out = tmp_path / "out"
    result = run(["embed", "--input", str(src), "--out", str(out), "--format", "conll"])
    assert result.exit_code == 0, result.output
    vectors, index = load_shards(out)
    assert [(r["line"], r["token"]) for r in index] == [(1, "EU"), (1, "rejects"), (6, "Peter")]
    expected = fz.embed_words([["EU", "rejects"], ["Peter"]])
    np.testing.assert_allclose(vectors, np.concatenate(expected), atol=1e-5)


def test_embed_stdin(tmp_path):
    result = run(["embed", "--input", "-", "--out", str(tmp_path / "o"), "--level", "sentence"], input="a b\nc\n")
    assert result.exit_code == 0, result.output
    assert load_shards(tmp_path / "o")[0].shape == (2, 384)


def test_interrupted_embed_resumes_after_the_last_complete_shard(tmp_path, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(f"sentence number {i} is here" for i in range(7)) + "\n")
    full = tmp_path / "full"
    assert run(["embed", "--input", str(src), "--out", str(full), "--shard-size", "2"]).exit_code == 0

    real_write = embed_module.write_shard
    calls = []

    def write_then_crash(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the third shard is being written
        calls.append(1)
        return real_write(*args, **kwargs)

    part = tmp_path / "part"
    monkeypatch.setattr(embed_module, "write_shard", write_then_crash)
    result = run(["embed", "--input", str(src), "--out", str(part), "--shard-size", "2"])
    assert result.exit_code != 0
    assert not json.loads((part / "manifest.json").read_text())["complete"]
    monkeypatch.setattr(embed_module, "write_shard", real_write)

    embedded = []
    real_embed = Featurizer.embed_words
    monkeypatch.setattr(
        Featurizer, "embed_words", lambda self, t, **k: embedded.append(len(t)) or real_embed(self, t, **k)
    )
    result = run(["embed", "--input", str(src), "--out", str(part), "--shard-size", "2"])
    assert result.exit_code == 0, result.output
    assert "resuming after 4 texts" in result.output
    assert embedded == [2, 1], "only the texts after the complete shards are embedded again, a shard at a time"
    a, ia = load_shards(full)
    b, ib = load_shards(part)
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert ia == ib
    again = run(["embed", "--input", str(src), "--out", str(part), "--shard-size", "2"])
    assert "already complete" in again.output


def test_embed_refuses_to_mix_runs_in_one_directory(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    assert run(["embed", "--input", str(src), "--out", str(tmp_path / "o")]).exit_code == 0
    result = run(["embed", "--input", str(src), "--out", str(tmp_path / "o"), "--layers", "0"])
    assert result.exit_code == 1
    assert "holds the output of a different run (differs in: layers)" in result.output


def test_embed_streams_with_bounded_memory(tmp_path, monkeypatch):
    """Records are read lazily: a shard is embedded before the rest of the input is read."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"line {i}\n" for i in range(9)))
    read_so_far = []
    real_records = embed_module.read_records

    def spy(*args, **kwargs):
        for r in real_records(*args, **kwargs):
            read_so_far.append(r.line)
            yield r

    seen_at_embed = []
    real_embed = Featurizer.embed_words
    monkeypatch.setattr(embed_module, "read_records", spy)
    monkeypatch.setattr(
        Featurizer,
        "embed_words",
        lambda self, t, **k: seen_at_embed.append(len(read_so_far)) or real_embed(self, t, **k),
    )
    assert run(["embed", "--input", str(src), "--out", str(tmp_path / "o"), "--shard-size", "3"]).exit_code == 0
    assert seen_at_embed == [3, 6, 9]


@pytest.mark.parametrize(
    "content, args, message",
    [
        (b"fine\n\nmore\n", [], "in.txt:2: empty or whitespace-only text"),
        (b"fine\n  \t \n", [], "in.txt:2: empty or whitespace-only text"),
        (b"ok\nbad \xff byte\n", [], "in.txt:2: invalid UTF-8 byte b'\\xff' at column 5"),
        (b'{"text": "a"}\n{oops\n', ["--format", "jsonl"], "in.txt:2: invalid JSON at column 2"),
        (b'{"body": "a"}\n', ["--format", "jsonl"], "in.txt:1: no field 'text' in the JSON object"),
        (b"EU NNP I-ORG\nrejects VBZ\n", ["--format", "conll"], "in.txt:2:"),
    ],
)
def test_embed_bad_input_gives_one_line_error(tmp_path, content, args, message):
    src = tmp_path / "in.txt"
    src.write_bytes(content)
    result = run(["embed", "--input", str(src), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 1
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_unknown_model_and_corrupt_weights(tmp_path, tiny_models):
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    result = run(["embed", "--model", "no/such/model", "--input", str(src), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "unknown model 'no/such/model'" in result.output
    assert len(result.output.strip().splitlines()) == 1
    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["bert"], broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    result = run(["info", str(broken)])
    assert result.exit_code == 1 and "corrupt or unreadable safetensors file" in result.output
    assert len(result.output.strip().splitlines()) == 1
    missing = run(["embed", "--input", str(tmp_path / "absent.txt"), "--out", str(tmp_path / "o")])
    assert missing.exit_code == 1 and "absent.txt" in missing.output


def test_info_describes_the_model():
    result = run(["info", "minilm"])
    assert result.exit_code == 0, result.output
    for expected in (
        "family           bert encoder",
        "layers           6 (+ the input layer = layer 0)",
        "hidden size      384",
        "attention heads  12",
        "max tokens       512 per window",
        "22,713,216",
        "WordPiece, 30,522 entries",
        "special tokens   [CLS] A [SEP]",
    ):
        assert expected in result.output, result.output


@pytest.mark.parametrize("prefix", ["elmo:", ""])
def test_info_and_embed_take_an_elmo_folder_with_or_without_the_prefix(elmo_dir, tmp_path, prefix):
    result = run(["info", f"{prefix}{elmo_dir}"])
    assert result.exit_code == 0, result.output
    for expected in (
        "family           elmo encoder",
        f"folder           {elmo_dir}\n",
        "options.json, weights.hdf5",
        "attention heads  none (ELMo is a biLSTM: it has no attention heads)",
        "tokenizer        words (characters): each word is read as up to 50 characters",
        "special tokens   none",
    ):
        assert expected in result.output, result.output
    src = tmp_path / "in.txt"
    src.write_text("a crane flew\nover the lake\n")
    result = run(["embed", "--model", f"{prefix}{elmo_dir}", "--input", str(src), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    vectors, rows = load_shards(tmp_path / "o")
    assert vectors.shape == (6, 16) and len(rows) == 6


def test_demo_prints_both_tables_and_the_conclusion():
    result = run(["demo"])
    assert result.exit_code == 0, result.output
    assert result.output.count("Sandy broke the law .") == 2
    assert '"crane", layer 6' in result.output
    assert "depends on the context" in result.output


def test_predict_has_one_option_for_every_prediction_column_of_the_kinds_table():
    """predict's column list is built from tasks/kinds.py's rows; each entry must have its --option (and no column
    option may be left out of the list, or predict would pass it on as an unknown keyword)."""
    from ctxrep.cli.predict import COLUMN_OPTIONS, predict
    from ctxrep.tasks.kinds import KINDS

    assert COLUMN_OPTIONS
    others = {"model_dir", "input_path", "out", "task", "device"}
    assert {p.name for p in predict.params} - others == set(COLUMN_OPTIONS)
    every = {name for row in KINDS.values() for name in row.predict_columns()}
    assert set(COLUMN_OPTIONS) <= every
