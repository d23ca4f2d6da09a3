"""Fine-tuning any encoder-decoder on a user's (source, target) file through the one Trainer, with the ROUGE / BLEU /
chrF report, `ctxrep seq2seq train` / `generate`, and the bad files' one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from ctxrep.cli import main
from ctxrep.translate.score import rouge

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread

WORDS = "the dog cat bird runs sleeps sings today often here".split()


@pytest.fixture(scope="module")
def bart_folder(tmp_path_factory):
    """A tiny random BART (transformers' layout) with a byte-level BPE tokenizer.json in BART's template."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("bart")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainers.BpeTrainer(vocab_size=280, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=24,
        dropout=0.0,
    )
    transformers.BartForConditionalGeneration(config).save_pretrained(path)
    return path


def pairs_file(path, n: int, seed: int) -> None:
    """A CSV of (source, target) = (words, the same words): a copy task a tiny model learns in a few steps."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        words = [
            WORDS[int(i)]
            for i in torch.randint(0, len(WORDS), (int(torch.randint(3, 7, (1,), generator=g)),), generator=g)
        ]
        rows.append(f"{' '.join(words)},{' '.join(words)}")
    path.write_text("source,target\n" + "\n".join(rows) + "\n")


def test_rouge_known_answer():
    scores = rouge(["the cat sat"], ["the cat sat down"])  # 3 of 3 unigrams, 3 of 4: F = 2 * 1 * 0.75 / 1.75
    assert scores["rouge1"] == pytest.approx(100 * 6 / 7) and scores["rouge2"] == pytest.approx(80.0)
    assert rouge(["running dogs"], ["the dogs run"])["rouge1"] == pytest.approx(100 * 0.8)  # stemmed: run, dog


def test_train_reports_rouge_bleu_chrf_and_generates(bart_folder, tmp_path):
    import transformers

    pairs_file(tmp_path / "train.csv", 64, seed=0)
    pairs_file(tmp_path / "dev.csv", 8, seed=1)
    args = ["seq2seq", "train", "--model", bart_folder, "--train", tmp_path / "train.csv", "--valid"]
    args += [tmp_path / "dev.csv", "--out", tmp_path / "run", "--max-steps", 200, "--lr", 3e-3, "--batch-tokens", 256]
    args += ["--eval-sentences", 8, "--no-progress", "--label-smoothing", 0, "--warmup-steps", 10]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert "ROUGE-1" in result.output and "BLEU" in result.output and "chrF" in result.output
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 1.0, losses
    report = next(r for r in reversed(records) if "eval_rouge1" in r)
    for key in ("eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_rougeLsum", "eval_bleu", "eval_chrf"):
        assert 0.0 <= report[key] <= 100.0
    assert report["eval_rouge1"] > 50  # the copy task is learned, roughly
    ref = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "run").eval()  # transformers loads it
    assert (tmp_path / "run" / "tokenizer.json").is_file() and ref.config.d_model == 32
    (tmp_path / "in.txt").write_text("the dog runs\n\nthe bird sings\n")
    out = CliRunner().invoke(
        main, ["seq2seq", "generate", "--model", str(tmp_path / "run"), "--input", str(tmp_path / "in.txt")]
    )
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert len(lines) == 3 and lines[1] == "" and lines[0] and lines[2]


def one_line_error(args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_a_missing_target_and_a_target_longer_than_the_positions_are_one_line(bart_folder, tmp_path):
    (tmp_path / "missing.jsonl").write_text('{"source": "the dog", "target": "the dog"}\n{"source": "the cat"}\n')
    base = ["seq2seq", "train", "--model", bart_folder, "--out", tmp_path / "run", "--no-progress", "--train"]
    message = one_line_error([*base, tmp_path / "missing.jsonl"])
    assert "missing.jsonl:2: no field 'target'" in message and "--target-column" in message
    (tmp_path / "long.csv").write_text("source,target\nthe dog,the dog\nthe cat," + " ".join(WORDS * 4) + "\n")
    message = one_line_error([*base, tmp_path / "long.csv"])
    assert "long.csv:3:" in message and "more than the model's 24 positions" in message
