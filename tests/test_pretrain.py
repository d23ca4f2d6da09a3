"""`ctxrep pretrain` and `ctxrep tokenizer train`: every objective trains from the command line on a tiny
corpus and its folder loads in ctxrep and transformers; resume, held-out split, configs, bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import ctxrep
from ctxrep.cli.pretrain import pretrain
from ctxrep.cli.tokenizer import tokenizer as tokenizer_group
from ctxrep.data.corpus import CorpusConfig, pack_corpus
from ctxrep.objectives.recipes import OBJECTIVES
from ctxrep.text.tokenizer import Tokenizer
from ctxrep.train.config import parse_overrides
from ctxrep.train.pretrain import split_held_out
from ctxrep.train.pretrain_config import (
    CONFIG_DIR,
    SECTIONS,
    TRAINS_TOKENIZER,
    DataSection,
    PretrainError,
    load_config,
    readers,
    reading_table,
)
from ctxrep.train.trainer import Trainer

SENTENCES = ["Kalo mitu ren sava.", "Dar ulgor feshi na bel torqui."]


def run(command, args):
    return CliRunner().invoke(command, [str(a) for a in args])


def train(corpus: Path, out: Path, objective: str, *extra, exit_code: int = 0) -> None:
    """exit_code: 130 where the run is interrupted (Ctrl-C: the checkpoint is saved, the command says how to resume)."""
    args = ["--objective", objective, "--config", "tiny", "--corpus", corpus, "--out", out, "--no-progress", *extra]
    result = run(pretrain, args)
    assert result.exit_code == exit_code, result.output


def fails(args, *fragments: str, command=pretrain) -> str:
    result = run(command, args)
    assert result.exit_code == 1, result.output
    message = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(message) == 1 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in message[0], message[0]
    return message[0]


def logged_losses(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    for r in records:
        if "loss" in r:
            assert {"step", "loss", "lr", "tokens_per_s"} <= set(r) and r["tokens_per_s"] > 0
    return [r["loss"] for r in records if "loss" in r]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


@pytest.fixture(scope="module")
def mlm_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "mlm"
    train(corpus, out, "mlm", "--max-steps", 20)
    return out


# ------------------------------------------------------------------------------ every objective


HF_CLASS = {
    "mlm": "AutoModel",
    "mlm+nsp": "AutoModel",
    "mlm+sop": "AutoModel",
    "electra": "AutoModel",
    "clm": "AutoModelForCausalLM",
    "plm": "AutoModel",
}
MODEL_TYPE = {
    "mlm": "bert",
    "mlm+nsp": "bert",
    "mlm+sop": "albert",
    "electra": "electra",
    "clm": "gpt2",
    "plm": "xlnet",
}


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "mlm+sop", "electra", "clm", "plm"])
def test_objective_trains_from_the_cli_and_loads_everywhere(objective, corpus, tmp_path):
    import transformers

    out = tmp_path / "run"
    train(corpus, out, objective, "--max-steps", 30, "--trainer.log_every", 5)
    losses = logged_losses(out)
    assert len(losses) == 7  # step 1 (the trainer logs every run's first step), then every 5 steps
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.1, losses
    assert (out / "corpus" / "manifest.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE[objective]
    assert json.loads((out / "pretrain.json").read_text())["objective"] == objective

    tok = Tokenizer.from_model_dir(out)
    assert tok.vocab_size == 1000
    model = ctxrep.load_model(out)
    ids = torch.tensor([tok.build_inputs(tok.backend.encode(SENTENCES[0], add_special_tokens=False).ids)[0]])
    with torch.no_grad():
        ours = model(ids).last_hidden_state
        hf_model = getattr(transformers, HF_CLASS[objective]).from_pretrained(out).eval()
        hf_out = hf_model(ids, output_hidden_states=True)
    # A causal-LM output has no last_hidden_state; its last hidden state is after the final LayerNorm, as ours.
    theirs = hf_out.hidden_states[-1] if objective == "clm" else hf_out.last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok(SENTENCES[0])["input_ids"] == ids[0].tolist()

    vectors = ctxrep.Featurizer(out).embed_sentences(SENTENCES)
    assert vectors.shape == (2, 64) and np.isfinite(vectors).all()


def test_mlm_sop_reads_albert_sharing_and_factorised_embeddings(corpus, mlm_run, tmp_path):
    out = tmp_path / "albert"
    train(corpus, out, "mlm+sop", "--max-steps", 2, "--tokenizer", mlm_run, "--share", "ffn", "--embedding_size", 32)
    config = json.loads((out / "config.json").read_text())
    assert (config["ctxrep_share"], config["embedding_size"], config["hidden_size"]) == ("ffn", 32, 64)
    model = ctxrep.load_model(out)
    assert model.config.share == "ffn" and model.input_embeddings().shape == (1000, 32)
    record = json.loads((out / "pretrain.json").read_text())["settings"]
    assert record["encoder"]["share"] == "ffn" and record["objective"]["short_seq_prob"] == 0.1
    assert "model_type" not in record["encoder"]
    sop = json.loads((out / "log.jsonl").read_text().splitlines()[0])  # the training record
    assert 0.0 <= sop["sop_accuracy"] <= 1.0 and sop["sop_loss"] > 0


def test_albert_embedding_size_defaults_to_128_at_most(corpus, mlm_run, tmp_path):
    from ctxrep.data.corpus import PackedCorpus
    from ctxrep.train.pretrain import build_run

    tok = Tokenizer.from_model_dir(mlm_run)
    packed = PackedCorpus.open(mlm_run / "corpus")
    for hidden, expected in ((64, 64), (256, 128)):
        config = load_config("tiny", [("hidden_size", str(hidden))], "mlm+sop")
        run_ = build_run("mlm+sop", config, packed, tok)
        assert run_.objective.config.embedding_size == expected
        assert type(run_.train_data).__name__ == "SentenceOrderPacker"


def test_plm_tokenizer_follows_xlnets_template(corpus, tmp_path):
    out = tmp_path / "plm"
    train(corpus, out, "plm", "--max-steps", 2)
    tok = Tokenizer.from_model_dir(out)
    sep, cls = tok.backend.token_to_id("<sep>"), tok.backend.token_to_id("<cls>")
    enc = tok.backend.encode("kalo mitu", "ren sava")
    assert enc.ids[-1] == cls and enc.ids.count(sep) == 2 and enc.ids[0] != cls
    assert enc.type_ids[-1] == 2
    assert tok.template.cls_index == -1


# ----------------------------------------------------------------------------------------- resume


def test_resumed_run_ends_where_an_uninterrupted_one_does(corpus, mlm_run, tmp_path, monkeypatch):
    out = tmp_path / "resumed"
    with monkeypatch.context() as m:  # as if Ctrl-C were pressed during step 10 of 20
        m.setattr(Trainer, "_should_stop", lambda self: self.step == 10)
        train(
            corpus, out, "mlm", "--max-steps", 20, exit_code=130
        )  # its own tokenizer: the same as mlm_run's, byte for byte
    assert (out / "tokenizer.json").read_bytes() == (mlm_run / "tokenizer.json").read_bytes()
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 10
    train(corpus, out, "mlm", "--max-steps", 20, "--resume")
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert max(steps) == 20 and steps == sorted(steps)
    resumed, straight = load_file(out / "model.safetensors"), load_file(mlm_run / "model.safetensors")
    assert resumed.keys() == straight.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], atol=0, rtol=0, msg=name)


def test_resume_with_another_objective_is_refused(corpus, mlm_run):
    args = ["--objective", "clm", "--config", "tiny", "--corpus", corpus, "--out", mlm_run, "--resume"]
    fails(args, "holds a mlm run, not clm", "--objective mlm")


def test_a_fresh_run_does_not_overwrite_a_checkpoint(corpus, mlm_run):
    args = ["--objective", "mlm", "--config", "tiny", "--corpus", corpus, "--out", mlm_run]
    fails(args, "already holds a checkpoint", "--resume")
    assert json.loads((mlm_run / "pretrain.json").read_text())["objective"] == "mlm"


def test_resume_needs_a_run(corpus, tmp_path):
    args = ["--objective", "mlm", "--config", "tiny", "--corpus", corpus, "--out", tmp_path / "none", "--resume"]
    fails(args, "nothing to resume")


# -------------------------------------------------------------------------------------- bad input


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n")
    fails(
        ["--objective", "mlm", "--config", "tiny", "--corpus", tmp_path / "empty.txt", "--out", tmp_path / "o"],
        "corpus is empty",
    )


def test_binary_corpus(tmp_path):
    (tmp_path / "data.txt").write_bytes(b"some text\x00\x01\x02 more")
    fails(
        ["--objective", "clm", "--config", "tiny", "--corpus", tmp_path / "data.txt", "--out", tmp_path / "o"],
        "data.txt",
        "NUL",
    )


def test_corpus_smaller_than_one_sequence(mlm_run, tmp_path):
    (tmp_path / "short.txt").write_text("Kalo mitu ren sava.\n")
    args = [
        "--objective",
        "mlm",
        "--config",
        "tiny",
        "--corpus",
        tmp_path / "short.txt",
        "--out",
        tmp_path / "o",
        "--tokenizer",
        mlm_run,
        "--data.eval_fraction",
        0,
    ]
    fails(args, "fewer than one sequence", "max_length=64")


def test_tokenizer_and_model_vocabulary_sizes_must_match(corpus, mlm_run, tmp_path):
    args = [
        "--objective",
        "mlm",
        "--config",
        "tiny",
        "--corpus",
        corpus,
        "--out",
        tmp_path / "o",
        "--tokenizer",
        mlm_run / "tokenizer.json",
        "--tokenizer.vocab_size",
        1200,
    ]
    fails(args, "has 1000 entries", "vocab_size is 1200", "tiny.toml")


def test_corpus_too_small_to_hold_out_an_evaluation_slice(mlm_run, tmp_path):
    line = "Kalo mitu ren sava dar ulgor feshi na bel torqui.\n"
    per_line = len(Tokenizer.from_model_dir(mlm_run).backend.encode(line, add_special_tokens=False).ids)
    lines = -(-100 // per_line)  # about 100 tokens: more than one 64-token sequence, less than two
    (tmp_path / "small.txt").write_text(line * lines)
    args = [
        "--objective",
        "mlm",
        "--config",
        "tiny",
        "--corpus",
        tmp_path / "small.txt",
        "--out",
        tmp_path / "o",
        "--tokenizer",
        mlm_run,
    ]
    fails(args, "too small to hold out", "--data.eval_fraction 0")


def test_unknown_config_key_names_the_key_and_the_file(corpus, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((CONFIG_DIR / "tiny.toml").read_text().replace("hidden_size = 64", "hiden_size = 64"))
    fails(
        ["--objective", "mlm", "--config", bad, "--corpus", corpus, "--out", tmp_path / "o"],
        "unknown key 'hiden_size'",
        "[encoder]",
        str(bad),
    )


@pytest.mark.parametrize(
    "override, message",
    [
        (["--trainer.lrr", "1"], "[trainer] in"),
        (["--no_such_field", "1"], "no config section has a key 'no_such_field'"),
        (["--trainer.lr", "fast"], "expected float, got 'fast'"),
        (["--decoder.layers", "3"], "unknown section 'decoder'"),
        (["--trainer.lr"], "needs a value"),
    ],
)
def test_bad_overrides(corpus, tmp_path, override, message):
    fails(["--objective", "mlm", "--config", "tiny", "--corpus", corpus, "--out", tmp_path / "o", *override], message)


def test_unknown_config_name_lists_the_shipped_ones(corpus, tmp_path):
    fails(
        ["--objective", "mlm", "--config", "huge", "--corpus", corpus, "--out", tmp_path / "o"],
        "'huge'",
        "bert-base",
        "electra-small",
        "roberta-base",
        "small",
        "tiny",
    )


def test_sequence_longer_than_the_positions(corpus, tmp_path):
    args = ["--objective", "mlm", "--config", "tiny", "--corpus", corpus, "--out", tmp_path / "o", "--max_length", 128]
    fails(args, "max_length=128 is longer than the model's 64 positions")


# ----------------------------------------------------------------------------------------- configs


def test_shipped_configs_load_with_their_published_shapes():
    small = load_config("small")
    e, t = small.encoder, small.trainer
    assert (e.hidden_size, e.num_hidden_layers, e.num_attention_heads, e.intermediate_size) == (256, 4, 4, 1024)
    assert (small.data.max_length, t.batch_size, small.tokenizer.vocab_size) == (128, 32, 30522)
    assert "elmo" in small.raw and "elmo" in load_config("tiny").raw
    base = load_config("bert-base").encoder
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads, base.intermediate_size) == (
        768,
        12,
        12,
        3072,
    )
    roberta = load_config("roberta-base")
    assert roberta.encoder.max_position_embeddings == 514 and roberta.tokenizer.vocab_size == 50265
    assert roberta.trainer.betas == (0.9, 0.98)
    electra = load_config("electra-small")
    assert (electra.encoder.hidden_size, electra.encoder.embedding_size, electra.encoder.num_hidden_layers) == (
        256,
        128,
        12,
    )


def test_overrides_are_typed_and_reach_every_section():
    config = load_config(
        "tiny",
        [
            ("trainer.lr", "3e-3"),
            ("batch_size", "16"),
            ("betas", "[0.9, 0.98]"),
            ("lowercase", "false"),
            ("elmo.lstm.dim", "64"),
            ("trainer.warmup_steps", "2"),
        ],
    )
    assert config.trainer.lr == 3e-3 and config.trainer.batch_size == 16 and config.trainer.betas == (0.9, 0.98)
    assert config.tokenizer.lowercase is False and config.trainer.warmup_steps == 2
    assert config.raw["elmo"]["lstm"]["dim"] == 64
    with pytest.raises(PretrainError, match="\\[elmo\\] has no key 'lstm.nope'"):
        load_config("tiny", [("elmo.lstm.nope", "1")])


def test_no_two_sections_share_a_key_name_so_a_bare_override_is_never_ambiguous():
    names = [f for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    assert len({f.name for f in names}) == len(names)


def test_parse_overrides_accepts_both_spellings():
    assert parse_overrides(["--trainer.lr", "1e-3", "--k=7"]) == [("trainer.lr", "1e-3"), ("k", "7")]
    with pytest.raises(ValueError, match="unexpected argument 'stray'"):
        parse_overrides(["stray"])


# --------------------------------------------------------------------------------- held-out split


def test_held_out_split_is_the_tail_and_keeps_every_sentence(corpus, mlm_run):
    packed = pack_corpus(corpus, mlm_run, mlm_run / "corpus", CorpusConfig(num_workers=1), progress=False)
    train_part, held_out = split_held_out(packed, DataSection(max_length=64, eval_fraction=0.1), min_documents=2)
    assert train_part.num_tokens + held_out.num_tokens == packed.num_tokens
    # eval_fraction is a share of the sentences: 48 of 480, grown here to 61 to reach into a second document
    assert held_out.num_sentences == 61 and held_out.num_documents == 2
    assert split_held_out(packed, DataSection(max_length=64, eval_fraction=0.1))[1].num_sentences == 48
    assert held_out.num_documents >= 2 and train_part.num_documents >= 2
    assert train_part.num_sentences + held_out.num_sentences == packed.num_sentences
    np.testing.assert_array_equal(
        held_out.sentence(held_out.num_sentences - 1), packed.sentence(packed.num_sentences - 1)
    )
    np.testing.assert_array_equal(held_out.sentence(0), packed.sentence(train_part.num_sentences))
    assert split_held_out(packed, DataSection(eval_fraction=0.0)) == (packed, None)


# ------------------------------------------------------------------------- one schema, one meaning


def test_bilm_runs_through_the_same_pipeline(corpus, tmp_path):
    out = tmp_path / "elmo"
    train(corpus, out, "bilm", "--max-steps", 6, "--tokenizer.vocab_size", 400, "--elmo.lstm.dim", 64)
    assert (out / "options.json").is_file() and (out / "vocab.txt").is_file()
    assert (out / "corpus" / "manifest.json").is_file() and (out / "tokenizer.json").is_file()
    record = json.loads((out / "pretrain.json").read_text())
    assert record["settings"]["elmo"]["lstm"]["dim"] == 64 and "encoder" not in record["settings"]
    assert set(record["settings"]["objective"]) == {"softmax", "num_samples", "dropout"}
    assert record["settings"]["data"]["strip_gutenberg"] is True
    assert len(logged_losses(out)) == 3  # steps 1, 5 and 6
    vocab = (out / "vocab.txt").read_text().splitlines()
    assert len(vocab) == 400 and vocab[:4] == ["<pad>", "<unk>", "<S>", "</S>"]


def test_pretrain_json_records_what_the_objective_read(mlm_run):
    settings = json.loads((mlm_run / "pretrain.json").read_text())["settings"]
    assert set(settings) == {"encoder", "tokenizer", "data", "objective", "trainer"}
    assert set(settings["objective"]) == {"mask_prob", "replace_prob", "random_prob", "whole_word", "static_copies"}
    assert settings["encoder"]["max_position_embeddings"] == 64 and settings["tokenizer"]["kind"] == ""


@pytest.mark.parametrize(
    "objective, override, message",
    [
        (
            "bilm",
            ["--encoder.hidden_size", "32"],
            "[encoder] hidden_size is read by mlm, mlm+nsp, mlm+sop, electra, clm, plm, denoising, span-corruption, not by bilm",
        ),
        ("mlm", ["--elmo.lstm.dim", "16"], "[elmo] lstm.dim is read by bilm, not by mlm"),
        (
            "clm",
            ["--mask_prob", "0.2"],
            "[objective] mask_prob is read by mlm, mlm+nsp, mlm+sop, electra, distill, not by clm",
        ),
        ("plm", ["--max_position_embeddings", "128"], "--objective clm"),
        ("mlm", ["--short_seq_prob", "0.2"], "read by mlm+nsp, mlm+sop, not by mlm"),
        ("mlm", ["--share", "none"], "[encoder] share is read by mlm+sop, not by mlm"),
    ],
)
def test_an_override_the_objective_does_not_read_is_refused(corpus, tmp_path, objective, override, message):
    args = ["--objective", objective, "--config", "tiny", "--corpus", corpus, "--out", tmp_path / "o", *override]
    fails(args, message)


@pytest.mark.parametrize(
    "replace, message",
    [
        (("[data]\n", "[data]\nseed = 3\n"), "[data] seed is now [trainer] seed"),
        (("[data]\n", "[data]\nshort_seq_prob = 0.2\n"), "[data] short_seq_prob is now [objective] short_seq_prob"),
        (("[elmo.lstm]\n", "[elmo.lstm]\nsize = 3\n"), "unknown key(s) size in [elmo.lstm]"),
        (("[elmo]  #", "[elmo]\nnum_samples = 10  #"), "[elmo] num_samples is now [objective] num_samples"),
        (("[objective]\n", "[objective]\nmask_probability = 0.2\n"), "unknown key 'mask_probability' in [objective]"),
    ],
)
def test_a_key_no_objective_reads_names_the_key_and_the_file(corpus, tmp_path, replace, message):
    bad = tmp_path / "bad.toml"
    text = (CONFIG_DIR / "tiny.toml").read_text()
    assert replace[0] in text
    bad.write_text(text.replace(replace[0], replace[1], 1))
    fails(["--objective", "bilm", "--config", bad, "--corpus", corpus, "--out", tmp_path / "o"], message, str(bad))


@pytest.mark.parametrize("objective, kind", [("clm", "wordpiece"), ("bilm", "bpe"), ("mlm", "word")])
def test_a_tokenizer_kind_the_objective_cannot_train_is_refused(corpus, tmp_path, objective, kind):
    args = [
        "--objective",
        objective,
        "--config",
        "tiny",
        "--corpus",
        corpus,
        "--out",
        tmp_path / "o",
        "--tokenizer.kind",
        kind,
    ]
    fails(args, f"kind={kind!r}", f"{objective} trains a")


def test_bilm_refuses_a_subword_tokenizer(corpus, mlm_run, tmp_path):
    args = [
        "--objective",
        "bilm",
        "--config",
        "tiny",
        "--corpus",
        corpus,
        "--out",
        tmp_path / "o",
        "--tokenizer",
        mlm_run,
    ]
    fails(args, "not word-level", "--kind word")


def test_the_reading_table_covers_every_key_and_every_key_has_a_reader():
    table = reading_table()
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert readers(section, f.name), (section, f.name)
            if section != "trainer":
                assert f"| [{section}] {f.name} |" in table
    assert readers("data", "eval_fraction") == OBJECTIVES and readers("elmo", "lstm.dim") == ("bilm",)

    def row(key: str, *who: str) -> str:
        return f"| {key} | " + " | ".join("x" if o in who else "" for o in OBJECTIVES) + " |"

    assert row("[objective] softmax", "bilm") in table
    assert row("[encoder] share", "mlm+sop") in table
    assert row("[objective] short_seq_prob", "mlm+nsp", "mlm+sop") in table
    assert row("[objective] mask_prob", "mlm", "mlm+nsp", "mlm+sop", "electra", "distill") in table
    assert row("[distill] teacher", "distill") in table and row("[tokenizer] vocab_size", *TRAINS_TOKENIZER) in table
    assert "distill" not in TRAINS_TOKENIZER and "distill" not in readers("encoder", "hidden_size")


# ------------------------------------------------------------------ the same command, the same model

RUN_IN_A_SUBPROCESS = """
import sys
from ctxrep.cli import main
main(sys.argv[1:])
"""


def test_two_identical_runs_in_two_processes_train_the_same_model(corpus, tmp_path):
    finals = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OMP_NUM_THREADS": "1"}
        args = [
            "pretrain",
            "--objective",
            "mlm",
            "--config",
            "tiny",
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--max-steps",
            "20",
            "--no-progress",
        ]
        command = [sys.executable, "-c", RUN_IN_A_SUBPROCESS, *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        finals.append((logged_losses(out)[-1], (out / "tokenizer.json").read_bytes()))
    assert finals[0][1] == finals[1][1]
    assert finals[0][0] == finals[1][0]


# ------------------------------------------------------------------------------------ tokenizer CLI


@pytest.mark.parametrize("kind, size", [("wordpiece", 300), ("bpe", 400)])
def test_tokenizer_train_cli(corpus, tmp_path, kind, size):
    result = run(
        tokenizer_group,
        [
            "train",
            corpus / "doc0.txt",
            corpus / "doc1.txt",
            "--kind",
            kind,
            "--vocab-size",
            size,
            "--out",
            tmp_path / "tok",
            "--lowercase",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{size} entries" in result.output
    tok = Tokenizer.from_model_dir(tmp_path / "tok")
    assert tok.vocab_size == size and (tmp_path / "tok" / "tokenizer_config.json").is_file()


def test_tokenizer_train_cli_bad_input(tmp_path):
    (tmp_path / "a.txt").write_text("Kalo mitu.\n")
    fails(
        ["train", tmp_path / "a.txt", "--kind", "bpe", "--vocab-size", 100, "--out", tmp_path / "tok"],
        "vocab_size=100 is too small",
        command=tokenizer_group,
    )
    fails(
        ["train", tmp_path / "missing.txt", "--kind", "wordpiece", "--vocab-size", 100, "--out", tmp_path / "t"],
        "no such file",
        command=tokenizer_group,
    )


def test_the_cli_offers_every_recipe_of_the_table():
    from ctxrep.objectives.recipes import RECIPES

    option = next(p for p in pretrain.params if p.name == "objective")
    assert tuple(option.type.choices) == tuple(RECIPES) == OBJECTIVES


@pytest.mark.parametrize("progress", [True, False])
def test_progress_flag_draws_or_silences_the_training_bar(corpus, tmp_path, capfd, progress):
    from ctxrep.train.pretrain import pretrain as run_pretraining
    from ctxrep.train.pretrain_config import load_config

    run_pretraining(
        "mlm", load_config("tiny", objective="mlm"), corpus, tmp_path / "out", max_steps=2, progress=progress
    )
    err = capfd.readouterr().err
    assert ("train:" in err) == progress, err[-500:]
