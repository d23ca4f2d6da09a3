"""MT data, vocabulary, batches, loss, schedule, checkpoint averaging and scoring (no model needed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _mt_text import sentence_pairs, write_parallel
from safetensors.torch import save_file

from ctxrep.translate import data as mtdata
from ctxrep.translate.data import (
    DataError,
    TokenBatches,
    encode_pairs,
    plan_batches,
    read_lines,
    read_parallel,
)
from ctxrep.translate.score import score, score_files
from ctxrep.translate.tokenizer import MTTokenizer
from ctxrep.translate.train import (
    MTTrainError,
    average_state_dicts,
    inverse_sqrt,
    label_smoothed_loss,
    load_config,
)

# ------------------------------------------------------------------------------------------ reading


def test_read_parallel_keeps_line_numbers_and_counts_empty_pairs(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes(b"\xef\xbb\xbfone\r\n\ntwo\nthree\n   \n")  # BOM, CRLF, empty source, blank source
    tgt.write_text("eins\nleer\nzwei\n\nfuenf\n", encoding="utf-8")  # line 4: empty target
    corpus = read_parallel(src, tgt)
    assert corpus.src == ["one", "two"]
    assert corpus.tgt == ["eins", "zwei"]
    assert corpus.lines == [1, 3]
    assert (corpus.skipped_empty, corpus.first_empty_line) == (3, 2)


def test_invalid_utf8_names_file_and_line(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes("ok\nstill ok\ncaf\u00e9\n".encode("latin-1"))
    tgt.write_text("a\nb\nc\n", encoding="utf-8")
    with pytest.raises(
        DataError, match=rf"^{src}:3: invalid UTF-8 byte b'\\xe9' at column 4; convert the file to UTF-8"
    ):
        read_parallel(src, tgt)


@pytest.mark.parametrize("short_side", ["src", "tgt"])
def test_unequal_line_counts_say_where_the_shorter_file_ends(tmp_path, short_side):
    src, tgt = write_parallel(tmp_path, "a", 6)
    short = src if short_side == "src" else tgt
    short.write_text("".join(short.read_text().splitlines(keepends=True)[:4]), encoding="utf-8")
    long = tgt if short_side == "src" else src
    with pytest.raises(DataError, match=rf"^{short} ends at line 4 but {long} has 6 lines \(line 5 has no partner\)"):
        read_parallel(src, tgt)


def test_no_pairs_and_missing_file(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_text("\n\n")
    tgt.write_text("x\n\n")
    with pytest.raises(DataError, match=r"hold no sentence pair \(2 empty line\(s\)\)"):
        read_parallel(src, tgt)
    with pytest.raises(FileNotFoundError, match=r"nope.en: no such file"):
        read_lines(tmp_path / "nope.en")


# --------------------------------------------------------------------------------------- vocabulary

TRAIN_TOKENIZER = """
import sys
from _mt_text import sentence_pairs
from ctxrep.translate.data import train_joint_tokenizer
pairs = sentence_pairs(300)
train_joint_tokenizer([[s for s, _ in pairs], [t for _, t in pairs]], 120, sys.argv[1], kind=sys.argv[2])
"""


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_joint_vocabulary_is_identical_across_processes(tmp_path, kind):
    outs = [tmp_path / "one", tmp_path / "two"]
    for out in outs:
        subprocess.run([sys.executable, "-c", TRAIN_TOKENIZER, str(out), kind], check=True, cwd=Path(__file__).parent)
    first, second = ((o / "tokenizer.json").read_bytes() for o in outs)
    assert first == second
    spec = json.loads(first)
    assert [t["content"] for t in spec["added_tokens"]] == ["<pad>", "</s>", "<unk>"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pairs = sentence_pairs(300)
    out = tmp_path_factory.mktemp("tok")
    mtdata.train_joint_tokenizer([[s for s, _ in pairs], [t for _, t in pairs]], 120, out)
    return MTTokenizer.from_model_dir(out)


def test_tokenizer_is_joint_appends_eos_and_detokenizes(tokenizer):
    src, tgt = sentence_pairs(1)[0]
    assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2)
    for text in (src, tgt):  # both languages' words are in the one vocabulary
        ids = tokenizer.encode_source([text])[0]
        assert ids[-1] == mtdata.EOS_ID
        assert mtdata.UNK_ID not in ids
        assert tokenizer.decode(ids) == text
        assert tokenizer.encode_target([text])[0] == ids
        # the file's own template appends </s> too (transformers' AutoTokenizer reads it)
        assert tokenizer.tokenizer.encode(text).ids == ids


def test_encode_pairs_refuses_or_skips_long_lines(tmp_path, tokenizer):
    src, tgt = write_parallel(tmp_path, "a", 10)
    lines = src.read_text().splitlines()
    lines[6] = " ".join(["the big red ball"] * 20)  # line 7: far more than 16 tokens
    src.write_text("\n".join(lines) + "\n")
    lines = tgt.read_text().splitlines()
    lines[1] = ""  # line 2: skipped as empty, so numbering must still follow the file
    tgt.write_text("\n".join(lines) + "\n")
    corpus = read_parallel(src, tgt)
    with pytest.raises(
        DataError,
        match=rf"^{src}:7: \d+ tokens \(with </s>\), more than the model's 16 positions; "
        r".*--skip-long",
    ):
        encode_pairs(corpus, tokenizer, 16)
    pairs = encode_pairs(corpus, tokenizer, 16, skip_long=True)
    assert (pairs.skipped_long, pairs.first_long_line) == (1, 7)
    assert len(pairs) == 8 and 7 not in pairs.lines and 2 not in pairs.lines
    assert all(len(s) <= 16 and s[-1] == mtdata.EOS_ID for s in pairs.src)


# ------------------------------------------------------------------------------------------ batches


def _pairs(n: int = 200, seed: int = 0) -> mtdata.EncodedPairs:
    rng = np.random.default_rng(seed)
    src = [np.append(rng.integers(3, 50, rng.integers(1, 20)), mtdata.EOS_ID) for _ in range(n)]
    tgt = [np.append(rng.integers(3, 50, rng.integers(1, 20)), mtdata.EOS_ID) for _ in range(n)]
    return mtdata.EncodedPairs(src, tgt, np.arange(1, n + 1))


def test_collate_shifts_targets_right_and_masks_padding():
    src = [np.array([5, 6, 1]), np.array([7, 1])]
    tgt = [np.array([8, 1]), np.array([9, 10, 11, 1])]
    b = mtdata.collate(src, tgt, pad_id=0, decoder_start_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 1], [7, 1, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b["decoder_input_ids"].tolist() == [[0, 8, 0, 0], [0, 9, 10, 11]]
    assert b["labels"].tolist() == [[8, 1, -100, -100], [9, 10, 11, 1]]


def test_batches_respect_the_budget_cover_every_pair_once_and_pad_little():
    pairs = _pairs()
    plan = plan_batches(pairs.src_lengths, pairs.tgt_lengths, 256, np.random.default_rng(0))
    rows = np.concatenate(plan)
    assert sorted(rows.tolist()) == list(range(len(pairs)))
    longest = np.maximum(pairs.src_lengths, pairs.tgt_lengths)
    assert all(len(b) * longest[b].max() <= 256 for b in plan)
    real = pairs.tgt_lengths.sum()
    padded = sum(len(b) * pairs.tgt_lengths[b].max() for b in plan)
    assert padded / real < 1.1  # length-bucketed: under 10% of the target positions are padding


def test_batches_are_seeded_locally_and_resume_exactly():
    pairs = _pairs()
    torch.manual_seed(0)
    np.random.seed(0)
    a = TokenBatches(pairs, seed=3)
    stream = [a.next_batch(200) for _ in range(40)]  # several epochs
    assert a.epoch >= 2
    np.random.seed(1)  # the global RNGs play no part
    torch.manual_seed(1)
    b = TokenBatches(pairs, seed=3)
    for _ in range(17):
        b.next_batch(200)
    state = json.loads(json.dumps(b.state_dict()))
    c = TokenBatches(pairs, seed=3)
    c.load_state_dict(state)
    rest = [c.next_batch(200) for _ in range(23)]
    for x, y in zip(stream[17:], rest):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    other = TokenBatches(pairs, seed=4)
    assert not all(np.array_equal(x["labels"], other.next_batch(200)["labels"]) for x in stream[:1])


def test_batch_rows_are_a_multiple_of_the_processes_and_bad_budgets_are_refused():
    pairs = _pairs()
    plan = plan_batches(pairs.src_lengths, pairs.tgt_lengths, 300, np.random.default_rng(0), row_multiple=2)
    assert all(len(b) % 2 == 0 for b in plan)
    with pytest.raises(DataError, match=r"a token budget of 10 cannot hold 1 pair\(s\) of \d+ tokens; raise"):
        plan_batches(pairs.src_lengths, pairs.tgt_lengths, 10)
    state = TokenBatches(pairs).state_dict()
    with pytest.raises(DataError, match=r"written for 200 training pairs .* this data has 199"):
        TokenBatches(mtdata.EncodedPairs(pairs.src[:-1], pairs.tgt[:-1], pairs.lines[:-1])).load_state_dict(state)


# ------------------------------------------------------------------------------ loss, schedule, average


def test_label_smoothed_loss_matches_torch_and_the_formula():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    labels[1, 3:] = -100
    loss, nll, n = label_smoothed_loss(logits, labels, 0.1)
    keep = labels != -100
    assert n == int(keep.sum()) == 8
    expected = torch.nn.functional.cross_entropy(logits[keep], labels[keep], label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum"))
    # by hand for one token: (1 - eps) * -log p_y + eps / V * sum_k -log p_k
    logp = torch.log_softmax(logits[0, 0], -1)
    one, _, _ = label_smoothed_loss(logits[:1, :1], labels[:1, :1], 0.1)
    torch.testing.assert_close(one, -(0.9 * logp[labels[0, 0]] + 0.1 / 11 * logp.sum()))
    zero, nll0, _ = label_smoothed_loss(logits, labels, 0.0)
    torch.testing.assert_close(zero, nll0)


def test_inverse_sqrt_schedule_is_equation_3():
    d, w = 512, 4000
    assert inverse_sqrt(0, d, w) == pytest.approx(512**-0.5 * 1 * 4000**-1.5)  # step_num = 1
    peak = inverse_sqrt(w - 1, d, w)
    assert peak == pytest.approx((d * w) ** -0.5)
    assert max(inverse_sqrt(s, d, w) for s in range(0, 3 * w, 97)) <= peak + 1e-12
    assert inverse_sqrt(4 * w - 1, d, w) == pytest.approx(peak / 2)  # 1 / sqrt(step) after the warm-up
    with pytest.raises(MTTrainError, match="needs warmup_steps >= 1"):
        inverse_sqrt(0, d, 0)


def test_average_of_checkpoints_is_the_mean_of_the_weights(tmp_path):
    torch.manual_seed(0)
    states = [{"w": torch.randn(3, 4), "b": torch.randn(4)} for _ in range(3)]
    paths = []
    for i, s in enumerate(states):
        paths.append(tmp_path / f"s{i}.safetensors")
        save_file(s, str(paths[-1]))
    avg = average_state_dicts(paths)
    for k in ("w", "b"):
        torch.testing.assert_close(avg[k], (states[0][k] + states[1][k] + states[2][k]) / 3)
        assert avg[k].dtype == torch.float32
    save_file({"w": torch.randn(3, 5), "b": torch.randn(4)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(MTTrainError, match=r"bad.safetensors: w is \(3, 5\), \(3, 4\) in .*s0.safetensors"):
        average_state_dicts([paths[0], tmp_path / "bad.safetensors"])
    save_file({"w": torch.randn(3, 4)}, str(tmp_path / "fewer.safetensors"))
    with pytest.raises(MTTrainError, match=r"hold different tensors \(b\)"):
        average_state_dicts([paths[0], tmp_path / "fewer.safetensors"])


# ------------------------------------------------------------------------------------------- config


def test_shipped_configs_load_and_overrides_apply():
    for name in ("tiny", "multi30k-10min", "multi30k", "base"):
        c = load_config(name)
        assert c.trainer.betas == (0.9, 0.98) and c.trainer.eps == 1e-9 and c.trainer.weight_decay == 0
        assert c.training.label_smoothing == 0.1
    widths = [load_config(name).model.d_model for name in ("tiny", "multi30k-10min", "multi30k")]
    assert widths == sorted(widths) and len(set(widths)) == 3  # the ten-minute model sits between the two
    assert load_config("multi30k-10min").trainer.max_minutes == 10.0  # ended by the clock, not by max_steps
    base = load_config("base")
    assert (base.model.d_model, base.model.encoder_layers, base.model.encoder_ffn_dim) == (512, 6, 2048)
    c = load_config("tiny", [("trainer.lr", "0.5"), ("d-model", "64"), ("average_last", "3")])
    assert (c.trainer.lr, c.model.d_model, c.training.average_last) == (0.5, 64, 3)


def test_bad_configs_are_refused_with_the_field(tmp_path):
    with pytest.raises(MTTrainError, match=r"--nonsense: no config section has a key 'nonsense'"):
        load_config("tiny", [("nonsense", "1")])
    with pytest.raises(MTTrainError, match=r"--model.width: no such config field"):
        load_config("tiny", [("model.width", "1")])
    with pytest.raises(
        MTTrainError, match=r"neither a TOML file nor a shipped MT config \(base, multi30k, multi30k-10min, tiny\)"
    ):
        load_config("huge")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nwidth = 3\n")
    with pytest.raises(MTTrainError, match=r"unknown key 'width' in \[model\]"):
        load_config(bad)
    with pytest.raises(MTTrainError, match=r"label_smoothing=1.5 must be in \[0, 1\)"):
        load_config("tiny", [("label_smoothing", "1.5")])
    with pytest.raises(ValueError, match=r"--lr: expected float, got 'fast'"):
        load_config("tiny", [("lr", "fast")])


# ------------------------------------------------------------------------------------------ scoring


def test_score_matches_sacrebleu_and_prints_signatures(tmp_path):
    import sacrebleu

    refs = ["Ein Mann sieht einen Hund.", "Die Frau isst einen Apfel.", "Zwei Kinder spielen im Park."]
    hyps = ["Ein Mann sieht einen Hund.", "Die Frau isst den Apfel.", "Kinder spielen im Park."]
    s = score(hyps, refs)
    assert s.bleu == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert s.chrf == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert 0 < s.bleu < 100 and score(refs, refs).bleu == pytest.approx(100.0)
    lines = s.format().splitlines()
    assert lines[0].startswith("BLEU = ") and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in lines[0]
    assert lines[1].startswith("chrF2 = ") and "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:" in lines[1]
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("\n".join(hyps) + "\n")
    ref.write_text("\n".join(refs) + "\n")
    assert score_files(str(hyp), str(ref)).bleu == pytest.approx(s.bleu)
    ref.write_text("\n".join(refs[:2]) + "\n")
    with pytest.raises(ValueError, match=rf"{ref} ends at line 2; score needs one hypothesis per reference line"):
        score_files(str(hyp), str(ref))
    with pytest.raises(TypeError, match="lists of sentences, not one string"):
        score("a", "a")
    assert math.isfinite(s.bleu)
