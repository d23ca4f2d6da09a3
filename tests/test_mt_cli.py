"""`ctxrep mt` end to end on a synthetic word-substitution language: train, resume, average, translate, score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _mt_text import write_parallel
from click.testing import CliRunner
from safetensors.torch import load_file

import ctxrep
from ctxrep.cli.mt import mt
from ctxrep.models.marian import MarianMTModel
from ctxrep.translate.train import SNAPSHOT_DIR, average_state_dicts, inverse_sqrt


def _invoke(*args: str, input: str | bytes | None = None):
    return CliRunner().invoke(mt, [str(a) for a in args], input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("mt-text")
    src, tgt = write_parallel(folder, "train", 300)
    valid_src, valid_tgt = write_parallel(folder, "valid", 30, seed=1)
    return {"src": src, "tgt": tgt, "valid_src": valid_src, "valid_tgt": valid_tgt, "folder": folder}


def _train_args(corpus, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--config",
        "tiny",
        "--src",
        corpus["src"],
        "--tgt",
        corpus["tgt"],
        "--valid-src",
        corpus["valid_src"],
        "--valid-tgt",
        corpus["valid_tgt"],
        "--out",
        out,
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mt-run") / "model"
    result = _invoke(*_train_args(corpus, out, "--max-steps", "30"))
    assert result.exit_code == 0, result.output
    assert "step 30: loss" in result.output and "valid BLEU" in result.output
    return out


def test_train_writes_a_marian_folder_that_transformers_loads(trained, corpus):
    import transformers

    for name in ("config.json", "model.safetensors", "tokenizer.json", "log.jsonl", "checkpoint"):
        assert (trained / name).exists(), name
    records = [json.loads(line) for line in (trained / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 1.0  # it learns
    for r in (r for r in records if "lr" in r):  # the Trainer ran the paper's schedule (tiny: 0.2 x eq. 3)
        assert r["lr"] == pytest.approx(0.2 * inverse_sqrt(r["step"] - 1, d_model=32, warmup_steps=10))
    final = records[-1]
    assert final["step"] == 30 and {"eval_loss", "eval_nll", "eval_bleu", "eval_chrf"} <= set(final)

    ours = ctxrep.load_model(trained)
    assert isinstance(ours, MarianMTModel)
    theirs = transformers.MarianMTModel.from_pretrained(trained).eval()
    ids = torch.tensor([[5, 6, 7, 1], [8, 9, 1, 0]])
    mask = (ids != 0).long()
    dec = torch.tensor([[0, 5, 6], [0, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, attention_mask=mask, decoder_input_ids=dec).logits,
            theirs(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
            atol=1e-4,
            rtol=1e-4,
        )


def test_saved_model_is_the_mean_of_the_last_snapshots(trained):
    snapshots = sorted((trained / SNAPSHOT_DIR).glob("step-*.safetensors"))
    assert [p.name for p in snapshots] == ["step-0000020.safetensors", "step-0000030.safetensors"]  # average_last 2
    expected = {
        k: (a + b) / 2
        for (k, a), b in zip(*(load_file(str(p)).items() for p in snapshots[:1]), load_file(str(snapshots[1])).values())
    }
    model = MarianMTModel.from_pretrained(trained)
    state = model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, atol=1e-7, rtol=0)
    last = load_file(str(snapshots[1]))
    assert not torch.equal(state["shared.weight"], last["shared.weight"])  # the average, not the last weights
    for name, value in average_state_dicts(snapshots).items():
        torch.testing.assert_close(state[name], value)


def test_train_no_progress_is_a_flag_as_pretrains(corpus, tmp_path):
    """`--no-progress` was read as a config override wanting a value; it is pretrain's flag now."""
    shown = _invoke(*_train_args(corpus, tmp_path / "shown", "--max-steps", "2"))
    assert "train: 2/2 steps (100%)" in shown.stderr  # the progress line a log gets
    result = _invoke(*_train_args(corpus, tmp_path / "quiet", "--max-steps", "2", "--no-progress"))
    assert result.exit_code == 0, result.output
    assert "step 2: loss" in result.output and "steps/s" not in result.stderr  # no progress


def test_resume_ends_where_an_uninterrupted_run_ends(corpus, tmp_path):
    dropout = ("--model.dropout", "0.2")  # so that the restored RNG matters
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert _invoke(*_train_args(corpus, whole, "--max-steps", "25", *dropout)).exit_code == 0
    assert _invoke(*_train_args(corpus, split, "--max-steps", "12", *dropout)).exit_code == 0
    result = _invoke(*_train_args(corpus, split, "--max-steps", "25", "--resume", *dropout))
    assert result.exit_code == 0, result.output
    a = load_file(str(whole / "checkpoint" / "model.safetensors"))
    b = load_file(str(split / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (whole / "model.safetensors").read_bytes() == (split / "model.safetensors").read_bytes()

    def losses(run: Path) -> dict[int, float]:
        """Mean training loss per log window, for the windows that do not span the stop at step 12."""
        records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if "loss" in r and r["step"] in (5, 10, 20, 25)}

    assert losses(split) == losses(whole) and len(losses(whole)) == 4


def test_translate_file_and_stdin_then_score(trained, corpus, tmp_path):
    hyp = tmp_path / "hyp.de"
    result = _invoke("translate", "--model", trained, "--input", corpus["valid_src"], "--out", hyp, "--beam", "2")
    assert result.exit_code == 0, result.output
    lines = hyp.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 30 and all(lines)
    result = _invoke("score", "--hyp", hyp, "--ref", corpus["valid_tgt"])
    assert result.exit_code == 0
    assert result.stdout.startswith("BLEU = ") and "tok:13a" in result.stdout
    assert "\nchrF2 = " in result.stdout

    text = corpus["valid_src"].read_text(encoding="utf-8").splitlines()
    piped = _invoke(
        "translate",
        "--model",
        trained,
        "--beam",
        "2",
        "--no-progress",
        input="\n".join(text[:3] + [""] + text[3:5]) + "\n",
    )
    assert piped.exit_code == 0, piped.output
    assert piped.stdout.splitlines() == lines[:3] + [""] + lines[3:5]  # an empty line stays an empty line

    nbest = _invoke(
        "translate", "--model", trained, "--input", corpus["valid_src"], "--beam", "3", "--n-best", "3", "--no-progress"
    )
    rows = [line.split(" ||| ") for line in nbest.stdout.splitlines()]
    assert len(rows) == 90 and [int(r[0]) for r in rows[:6]] == [0, 0, 0, 1, 1, 1]
    assert all(float(rows[i][2]) >= float(rows[i + 1][2]) for i in (0, 1))  # best first


def test_translate_search_options_reach_the_search(trained, corpus):
    from ctxrep.translate.search import translate
    from ctxrep.translate.train import load_translator

    model, tokenizer = load_translator(trained)
    sources = corpus["valid_src"].read_text(encoding="utf-8").splitlines()
    for options, kwargs in (
        (["--penalty", "hf", "--length-penalty", "1.0"], dict(penalty="hf", length_penalty=1.0)),
        (["--max-len-a", "0", "--max-len-b", "2"], dict(max_len_a=0.0, max_len_b=2)),
    ):
        result = _invoke(
            "translate", "--model", trained, "--input", corpus["valid_src"], "--beam", "3", "--no-progress", *options
        )
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == translate(model, tokenizer, sources, beam=3, **kwargs)
    short = _invoke(
        "translate",
        "--model",
        trained,
        "--input",
        corpus["valid_src"],
        "--beam",
        "1",
        "--no-progress",
        "--max-len-a",
        "0",
        "--max-len-b",
        "2",
    )
    assert max(len(tokenizer.encode_source([line])[0]) for line in short.stdout.splitlines()) <= 3  # 1 word + </s>
    bad = _invoke("translate", "--model", trained, "--input", corpus["valid_src"], "--penalty", "fairseq")
    assert bad.exit_code != 0 and "'fairseq' is not one of 'gnmt', 'hf'" in bad.output


def test_translate_progress_bar_only_when_asked_or_on_a_terminal(trained, corpus, tmp_path):
    plain = _invoke("translate", "--model", trained, "--input", corpus["valid_src"], "--beam", "2")
    assert plain.exit_code == 0, plain.output
    assert plain.stderr == ""  # CliRunner's stderr is no terminal: no bar by default
    assert len(plain.stdout.splitlines()) == 30
    asked = _invoke("translate", "--model", trained, "--input", corpus["valid_src"], "--beam", "2", "--progress")
    assert asked.exit_code == 0, asked.output
    assert "translate" in asked.stderr and "30/30" in asked.stderr
    assert asked.stdout == plain.stdout  # the bar never reaches the translations

    # A terminal on stderr (a pseudo-terminal here): the bar by default, and --no-progress turns it off.
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    def stderr_on_a_terminal(*extra: str) -> str:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
        args = [
            sys.executable,
            "-c",
            "from ctxrep.cli import main; main()",
            "mt",
            "translate",
            "--model",
            str(trained),
            "--input",
            str(corpus["valid_src"]),
            "--out",
            str(tmp_path / "hyp.de"),
            "--beam",
            "2",
            *extra,
        ]
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        os.close(leader)
        assert process.wait(timeout=300) == 0, seen.decode(errors="replace")
        return seen.decode(errors="replace")

    assert "30/30" in stderr_on_a_terminal()
    assert "30/30" not in stderr_on_a_terminal("--no-progress")
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8") == plain.stdout


def test_attention_command_writes_the_alignment_png_or_html(trained, corpus, tmp_path):
    source = corpus["valid_src"].read_text(encoding="utf-8").splitlines()[0]
    target = corpus["valid_tgt"].read_text(encoding="utf-8").splitlines()[0]
    result = _invoke("attention", "--model", trained, "--source", source, "--out", tmp_path / "a.png")
    assert result.exit_code == 0, result.output
    words = len(source.split()) + 1  # and </s>
    assert result.stdout.startswith(f"wrote {tmp_path / 'a.png'}: ")
    assert (
        f" target x {words} source words, decoder layer 2 of 2, mean of the heads, greedy translation" in result.stdout
    )
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    result = _invoke(
        "attention",
        "--model",
        trained,
        "--source",
        source,
        "--target",
        target,
        "--layer",
        "0",
        "--head",
        "1",
        "--out",
        tmp_path / "page.html",
    )
    assert result.exit_code == 0, result.output
    n = len(target.split()) + 1
    assert f": {n} target x {words} source words, decoder layer 1 of 2, head 1, given target (teacher-forced)" in (
        result.stdout
    )
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and all(w in page for w in target.split())

    msg = _error(_invoke("attention", "--model", trained, "--source", source, "--out", tmp_path / "a.pdf"))
    assert "a.pdf: the file name must end with .png or .html" in msg
    msg = _error(
        _invoke("attention", "--model", trained, "--source", source, "--layer", "2", "--out", tmp_path / "b.png")
    )
    assert "layer 2 is out of range: the model has 2 decoder layers" in msg
    msg = _error(_invoke("attention", "--model", tmp_path / "missing", "--source", source, "--out", tmp_path / "b.png"))
    assert "no such model folder" in msg
    assert not (tmp_path / "b.png").exists()


def test_translate_refuses_or_skips_long_lines(trained, tmp_path):
    source = tmp_path / "long.en"
    source.write_text("the dog sees a ball .\n" + "the big red ball " * 40 + "\nthe cat .\n", encoding="utf-8")
    result = _invoke("translate", "--model", trained, "--input", source, "--no-progress")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"error: {source}:2: ")
    assert "more than the model's 64 positions; split the sentence, or pass --skip-long" in result.stderr
    result = _invoke("translate", "--model", trained, "--input", source, "--skip-long", "--no-progress")
    assert result.exit_code == 0
    out = result.stdout.splitlines()
    assert len(out) == 3 and out[0] and out[1] == "" and out[2]
    assert f"skipped 1 line(s) longer than 64 tokens (the first at {source}:2)" in result.stderr


def test_skip_long_leaves_long_validation_pairs_out_of_the_loss_and_the_bleu(corpus, tmp_path, caplog):
    lines = corpus["valid_src"].read_text().splitlines()
    lines[2] = " ".join(["the big red ball"] * 30)  # 121 tokens > 64 positions, among the 20 BLEU sentences
    long = tmp_path / "valid.en"
    long.write_text("\n".join(lines) + "\n")
    args = [long if a == corpus["valid_src"] else a for a in _train_args(corpus, tmp_path / "run", "--max-steps", "2")]
    result = _invoke(*args, "--skip-long")
    assert result.exit_code == 0, result.output
    assert "valid BLEU" in result.output  # the validation ran to its end, BLEU included
    assert f"{long}: skipped 1 pair(s) longer than 64 tokens (the first at line 3)" in caplog.text
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert "eval_bleu" in records[-1]


def test_the_docs_translation_api_runs_as_written(trained):
    page = (Path(__file__).resolve().parents[1] / "docs" / "translate.md").read_text(encoding="utf-8")
    section = page.split("## Translate from Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "load_translator(" in code and "translate(model, tokenizer" in code
    names: dict = {}
    exec(code.replace('"runs/en-de"', repr(str(trained))), names)  # the example's folder: the tiny trained model
    found = names["translate_n_best"](names["model"], names["tokenizer"], names["sentences"], n_best=3)
    assert len(found) == 2 and all(len(hyps) == 3 and hyps[0][1] >= hyps[1][1] for hyps in found)


def _error(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_bad_training_input_gets_one_line_errors(corpus, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("".join(corpus["tgt"].read_text().splitlines(keepends=True)[:250]))
    args = _train_args(corpus, tmp_path / "a", "--max-steps", "2")
    msg = _error(_invoke(*[short if a == corpus["tgt"] else a for a in args]))
    assert f"{short} ends at line 250 but {corpus['src']} has 300 lines (line 251 has no partner)" in msg

    latin = tmp_path / "latin.en"
    latin.write_bytes(corpus["src"].read_bytes().replace(b"man", "m\u00e4n".encode("latin-1"), 1))
    number = corpus["src"].read_text().split("man")[0].count("\n") + 1
    msg = _error(_invoke(*[latin if a == corpus["src"] else a for a in args]))
    assert msg.startswith(f"error: {latin}:{number}: invalid UTF-8")

    long = tmp_path / "long.en"
    lines = corpus["src"].read_text().splitlines()
    lines[41] = " ".join(["the big red ball"] * 30)
    long.write_text("\n".join(lines) + "\n")
    msg = _error(_invoke(*[long if a == corpus["src"] else a for a in args]))
    assert f"{long}:42: " in msg and "more than the model's 64 positions" in msg and "--skip-long" in msg
    result = _invoke(*[long if a == corpus["src"] else a for a in args], "--skip-long")
    assert result.exit_code == 0, result.output

    msg = _error(_invoke(*_train_args(corpus, tmp_path / "b", "--resume")))
    assert "nothing to resume" in msg
    msg = _error(_invoke(*_train_args(corpus, tmp_path / "c", "--trainer.speed", "3")))
    assert "--trainer.speed: no such config field" in msg


def test_bad_model_folders_and_files_get_one_line_errors(trained, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((trained / name).read_bytes())
    source = tmp_path / "in.en"
    source.write_text("the dog .\n")
    msg = _error(_invoke("translate", "--model", bare, "--input", source))
    assert f"{bare}: no MT tokenizer" in msg

    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (other / "tokenizer.json").write_bytes((trained / "tokenizer.json").read_bytes())
    msg = _error(_invoke("translate", "--model", other, "--input", source))
    assert "bert" in msg and "marian" in msg

    msg = _error(_invoke("translate", "--model", trained, "--input", source, "--beam", "2", "--n-best", "3"))
    assert "--beam 2 --n-best 3: need 1 <= n-best <= beam" in msg

    ref = tmp_path / "ref.de"
    ref.write_text("der Hund .\nein Hund .\n")
    msg = _error(_invoke("score", "--hyp", source, "--ref", ref))
    assert f"{source} ends at line 1" in msg
    msg = _error(_invoke("score", "--hyp", tmp_path / "missing.txt", "--ref", ref))
    assert "missing.txt: no such file" in msg


def test_train_with_its_output_in_a_file_writes_plain_lines(corpus, tmp_path):
    """`ctxrep mt train > log 2>&1`: no carriage-return bar redraws, a bounded number of lines, steps counted."""
    import os
    import subprocess
    import sys

    log = tmp_path / "train.log"
    args = [str(a) for a in _train_args(corpus, tmp_path / "model", "--max-steps", "8")]
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-c", "from ctxrep.cli import main; main()", "mt", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=600,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "\x1b" not in text
    assert len(text.splitlines()) <= 30, text
    assert "train: 8/8 steps (100%)" in text, text
