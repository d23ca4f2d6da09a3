"""The friction points of issue 31 with users' own files, each as it was met (every test here fails on d6c1d1b):
a file of pairs trained as single texts, a first row taken silently as a header, an STS model that would not take new
pairs, column numbers counted two ways, defaults below the measured recipe, --dev tied to the training format, no
--limit and no way to evaluate a saved sentence encoder."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.data import table
from ctxrep.tasks.sentence_encoder import SentenceEncoder

PAIRS = [
    ("a man plays a guitar", "someone plays the guitar"),
    ("a woman cuts an onion", "an onion is cut"),
    ("stocks fell on monday", "markets dropped"),
    ("the cat sleeps", "a cat is asleep"),
    ("two dogs run", "dogs are running"),
    ("the train left late", "the train was late"),
]
SCORES = [4.8, 4.2, 3.9, 4.5, 1.0, 0.5]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---- train-sentence-encoder: pairs train as pairs ------------------------------------------------------------


def test_a_file_of_pairs_trains_on_pairs_not_silently_simcse(tiny_models, tmp_path):
    train = tmp_path / "pairs.csv"
    train.write_text("text,text_pair\n" + "".join(f"{a},{b}\n" for a, b in PAIRS))
    args = ["train-sentence-encoder", "--model", tiny_models["bert"], "--train", train, "--batch-size", "3"]
    result = _run(args + ["--out", tmp_path / "m"])
    assert result.exit_code == 0, result.output
    assert "trained on 6 examples (mnrl," in result.output
    result = _run(args + ["--out", tmp_path / "m2", "--loss", "simcse"])
    assert result.exit_code == 1
    assert "--loss simcse reads one text per example, but 2 text columns are read" in result.output
    assert "--loss mnrl" in result.output


def test_a_column_left_unread_is_named_not_dropped(tiny_models, tmp_path):
    train = tmp_path / "qa.tsv"
    train.write_text("text\tanswer\n" + "".join(f"{a}\t{b}\n" for a, b in PAIRS))
    args = ["train-sentence-encoder", "--model", tiny_models["bert"], "--train", train, "--out", tmp_path / "m"]
    result = _run(args)
    assert result.exit_code == 1
    assert "only one text column is read, but the file has other columns ('answer')" in result.output
    assert "--text-pair-column" in result.output and "--loss simcse" in result.output
    result = _run(args + ["--text-pair-column", "answer", "--batch-size", "3"])
    assert result.exit_code == 0 and "(mnrl," in result.output, result.output


def test_dev_reads_any_layout_and_limit_keeps_the_first_examples(tiny_models, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"a": a, "b": b, "s": s}) + "\n" for (a, b), s in zip(PAIRS, SCORES)))
    dev = tmp_path / "sts-dev.csv"  # the STS benchmark's layout: tab-separated, no header, whatever the name
    dev.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, ((a, b), s) in enumerate(zip(PAIRS, SCORES))))
    result = _run(
        ["train-sentence-encoder", "--model", tiny_models["bert"], "--train", train, "--dev", dev]
        + ["--text-column", "a", "--text-pair-column", "b", "--score-column", "s", "--limit", "4"]
        + ["--batch-size", "2", "--out", tmp_path / "m"]
    )
    assert result.exit_code == 0, result.output
    assert "trained on 4 examples (cosent, 2 steps, dev Spearman" in result.output


def test_evaluate_sentence_encoder_prints_the_sts_scores_of_a_saved_model(tiny_models, tmp_path):
    enc = SentenceEncoder(str(tiny_models["bert"]), loss="cosine", max_steps=1, batch_size=6, random_state=0)
    enc.fit(PAIRS, SCORES).save(tmp_path / "enc")
    data = tmp_path / "test.tsv"
    data.write_text("text\ttext_pair\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for (a, b), s in zip(PAIRS, SCORES)))
    result = _run(["evaluate-sentence-encoder", tmp_path / "enc", "--data", data])
    assert result.exit_code == 0, result.output
    expected = SentenceEncoder.load(tmp_path / "enc").evaluate(PAIRS, SCORES)
    assert f"Spearman {expected['spearman']:.2f}, Pearson {expected['pearson']:.2f} (6 pairs)" in result.output
    result = _run(["evaluate-sentence-encoder", tmp_path / "enc", "--data", data, "--limit", "3"])
    assert "(3 pairs)" in result.output, result.output


# ---- the header rule and column numbers --------------------------------------------------------------------


def _pair_model(tiny_models, tmp_path, task="pair"):
    train = tmp_path / "train.csv"
    train.write_text("text,text_pair,label\n" + "".join(f"{a},{b},{i % 2}\n" for i, (a, b) in enumerate(PAIRS)))
    out = tmp_path / "run"
    result = _run(
        ["finetune", "--task", task, "--train", train, "--dev", train, "--model", tiny_models["bert"], "--out", out]
        + ["--max-epochs", "1", "--batch-size", "3"]
    )
    assert result.exit_code == 0, result.output
    return out / "model"


def test_a_first_row_that_could_be_data_is_never_taken_as_a_header_silently(tiny_models, tmp_path):
    model = _pair_model(tiny_models, tmp_path)
    new = tmp_path / "new.csv"
    new.write_text("".join(f"{a},{b}\n" for a, b in PAIRS[:3]))  # no header: 3 pairs
    args = ["predict", "--model", model, "--input", new, "--out", tmp_path / "p.csv"]
    args += ["--text-column", "1", "--text-pair-column", "2"]
    result = _run(args)
    assert result.exit_code == 1
    assert "the first row could be a header or an example; say which with --header" in result.output
    assert "--no-header" in result.output
    result = _run(args + ["--no-header"])
    assert result.exit_code == 0, result.output
    rows = _csv_rows(tmp_path / "p.csv")
    assert [(r["line"], r["text"]) for r in rows] == [("1", PAIRS[0][0]), ("2", PAIRS[1][0]), ("3", PAIRS[2][0])]
    result = _run(args + ["--header"])  # the user says the first row names the columns: 2 examples, said so
    assert result.exit_code == 0 and "wrote 2 predictions" in result.output, result.output


def test_column_numbers_count_from_one_as_embed_counts_them(tmp_path):
    from ctxrep.embed.corpus import read_records

    path = tmp_path / "t.csv"
    path.write_text("id,sentence,label\n7,the second column,x\n")
    assert table.read_labelled_texts(path, 2, 3, header=True).X == ["the second column"]
    assert table.read_labelled_texts(path, -2, -1, header=True).X == ["the second column"]
    (record,) = read_records(io.BytesIO(path.read_bytes()), "t.csv", "csv", "2", False, header=True)
    assert record.words == ["the", "second", "column"]
    with pytest.raises(ValueError, match=r"--text-column 0: columns are numbered from 1"):
        table.read_labelled_texts(path, 0, 3, header=True)
    helps = [_run([*command, "--help"]).output for command in (["finetune"], ["predict"], ["train-sentence-encoder"])]
    assert all("counted from 1" in " ".join(h.split()) for h in helps)


# ---- an STS model takes new pairs alone -------------------------------------------------------------------


def test_an_stsb_model_predicts_a_two_column_file_of_new_pairs(tiny_models, tmp_path):
    sts = tmp_path / "sts-train.csv"
    sts.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, ((a, b), s) in enumerate(zip(PAIRS, SCORES))))
    out = tmp_path / "run"
    result = _run(
        ["finetune", "--task", "stsb", "--train", sts, "--dev", sts, "--model", tiny_models["bert"], "--out", out]
        + ["--max-epochs", "1"]
    )
    assert result.exit_code == 0, result.output
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS[:3]))
    args = ["predict", "--model", out / "model", "--input", pairs, "--out", tmp_path / "p.csv"]
    result = _run(args)
    assert result.exit_code == 1 and "--no-header" in result.output, result.output
    result = _run(args + ["--no-header"])
    assert result.exit_code == 0, result.output
    rows = _csv_rows(tmp_path / "p.csv")
    assert [(r["text"], r["text_pair"]) for r in rows] == PAIRS[:3]
    from ctxrep.tasks import load

    expected = load(out / "model").predict(PAIRS[:3])
    assert [float(r["score"]) for r in rows] == pytest.approx(expected.tolist(), abs=1e-6)
    named = tmp_path / "named.tsv"
    named.write_text("text\ttext_pair\n" + "".join(f"{a}\t{b}\n" for a, b in PAIRS[:3]))
    result = _run(["predict", "--model", out / "model", "--input", named, "--out", tmp_path / "q.csv"])
    assert result.exit_code == 0 and "wrote 3 predictions" in result.output, result.output


# ---- defaults: the measured recipe -------------------------------------------------------------------------


def test_finetune_regress_defaults_to_the_measured_cross_encoder_recipe(tiny_models, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("text,text_pair,label\n" + "".join(f"{a},{b},{s}\n" for (a, b), s in zip(PAIRS, SCORES)))
    result = _run(
        ["finetune", "--task", "regress", "--train", train, "--dev", train, "--text-pair-column", "text_pair"]
        + ["--model", tiny_models["bert"], "--out", tmp_path / "run", "--max-steps", "1"]
    )
    assert result.exit_code == 0, result.output
    params = json.loads((tmp_path / "run" / "metrics.json").read_text())["params"]
    assert (params["lr"], params["max_epochs"], params["batch_size"]) == (1e-4, 4, 16)
