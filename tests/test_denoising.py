"""BART's denoising and T5's span corruption: statistics of the noise, known answers, T5's reference helper, the
label shift transformers uses, and both recipes trained by `ctxrep pretrain` into folders transformers loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ctxrep.cli.pretrain import pretrain
from ctxrep.objectives.denoising import (
    DenoisingSettings,
    NoiseVocabulary,
    infill,
    noise_row,
    permute_sentences,
    span_lengths,
)
from ctxrep.objectives.span_corruption import corrupt, input_and_target_lengths, random_spans_noise_mask

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread

MASK, VOCAB = 4, 200
# ids 0-4 special (<s> <pad> </s> <unk> <mask>); even ids begin a word, odd ids continue one
WORDS = NoiseVocabulary(MASK, 5, VOCAB, np.arange(VOCAB) % 2 == 0, np.arange(VOCAB) < 5)


def document(rng: np.random.Generator, words: int) -> tuple[np.ndarray, np.ndarray]:
    """<s> w ... w </s>: `words` words of 1-3 pieces, in sentences of 5-15 words; (ids, each token's sentence)."""
    ids, sentence, s, left = [0], [-1], 0, rng.integers(5, 16)
    for _ in range(words):
        pieces = rng.integers(1, 4)
        ids += [int(rng.integers(3, VOCAB // 2)) * 2] + [int(rng.integers(3, VOCAB // 2)) * 2 + 1] * (pieces - 1)
        sentence += [s] * pieces
        left -= 1
        if left == 0:
            s, left = s + 1, rng.integers(5, 16)
    return np.array(ids + [2]), np.array(sentence + [-1])


def test_masked_share_of_word_starts_is_the_ratio_over_10000_documents():
    rng = np.random.default_rng(0)
    settings = DenoisingSettings()
    masked = starts = 0
    for _ in range(10_000):
        row, _ = document(rng, int(rng.integers(100, 300)))
        _, _, hit = infill(row, settings, WORDS, rng)
        masked += int(hit.sum())
        starts += int(WORDS.word_start[row[1:-1]].sum())
    assert abs(masked / starts - settings.mask_ratio) < 0.01, masked / starts


def test_span_lengths_follow_poisson_and_fill_the_budget():
    rng = np.random.default_rng(1)
    drawn = []
    for _ in range(4_000):
        lengths = span_lengths(200, 0.3, 3.5, rng)
        assert lengths.sum() == 60  # ceil(0.3 x 200) words, the last span trimmed to the budget
        drawn += lengths[:-1].tolist()  # the trimmed one left out
    counts = np.bincount(drawn, minlength=15)[:15] / len(drawn)
    poisson = np.array([math.exp(-3.5) * 3.5**k / math.factorial(k) for k in range(15)])
    assert np.abs(counts - poisson).max() < 0.01, (counts, poisson)


def test_infilling_known_answer():
    """Spans become one <mask> each (replace_length 1), a zero-length span inserts one, <s> and </s> stay."""
    rng = np.random.default_rng(3)
    row = np.array([0, 10, 11, 12, 14, 15, 16, 18, 20, 2])  # words: [10 11] [12] [14 15] [16] [18] [20]
    settings = DenoisingSettings(mask_ratio=0.5, mask_random=0.0)
    out, masked, hit = infill(row, settings, WORDS, rng)
    assert out[0] == 0 and out[-1] == 2 and int(hit.sum()) == 3  # ceil(0.5 x 6) words
    kept = row[~masked]
    assert [t for t in out if t != MASK] == kept.tolist()  # the unmasked tokens in order, nothing else
    assert (out == MASK).sum() >= 1


def test_permutation_keeps_every_token_and_moves_sentences():
    rng = np.random.default_rng(4)
    moved = 0
    for _ in range(200):
        row, sentence = document(rng, 60)
        out = permute_sentences(row, sentence, 1.0, rng)
        assert sorted(out.tolist()) == sorted(row.tolist()) and out[0] == 0 and out[-1] == 2
        moved += not np.array_equal(out, row)
    assert moved > 150
    row, _ = document(rng, 60)
    assert np.array_equal(permute_sentences(row, np.full(len(row), 0), 1.0, rng), row)  # one sentence: as it was


def test_the_released_runs_defaults_rotate_nothing():
    """fairseq's task default --rotate 0.5 is not what bart-base / large ran with: the defaults leave <s> first."""
    s = DenoisingSettings()
    assert (s.mask_ratio, s.poisson_lambda, s.mask_random, s.permute_sentences, s.rotate, s.insert) == (
        0.3,
        3.5,
        0.1,
        1.0,
        0.0,
        0.0,
    )
    rng = np.random.default_rng(5)
    row, sentence = document(rng, 40)
    assert noise_row(row, sentence, DenoisingSettings(insert=0.1), WORDS, rng)[0] == 0


# ---- T5 ----------------------------------------------------------------------------------------------------------


def reference_noise_mask(length, noise_density, mean_noise_span_length):
    """transformers' examples/flax/language-modeling/run_t5_mlm_flax.py, random_spans_noise_mask, as written there."""
    orig_length = length
    num_noise_tokens = int(np.round(length * noise_density))
    num_nonnoise_tokens = length - num_noise_tokens
    num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
    num_noise_spans = int(np.round(min(num_noise_tokens, num_nonnoise_tokens) / mean_noise_span_length))
    num_noise_spans = max(num_noise_spans, 1)
    num_nonnoise_tokens = length - num_noise_tokens

    def _random_segmentation(num_items, num_segments):
        mask_indices = np.arange(num_items - 1) < (num_segments - 1)
        np.random.shuffle(mask_indices)
        first_in_segment = np.pad(mask_indices, [[1, 0]])
        segment_id = np.cumsum(first_in_segment)
        _, segment_length = np.unique(segment_id, return_counts=True)
        return segment_length

    noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans)
    nonnoise_span_lengths = _random_segmentation(num_nonnoise_tokens, num_noise_spans)
    interleaved_span_lengths = np.reshape(
        np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [num_noise_spans * 2]
    )
    span_starts = np.cumsum(interleaved_span_lengths)[:-1]
    span_start_indicator = np.zeros((length,), dtype=np.int8)
    span_start_indicator[span_starts] = True
    span_num = np.cumsum(span_start_indicator)
    is_noise = np.equal(span_num % 2, 1)
    return is_noise[:orig_length]


def reference_filter(input_ids, mask_indices, vocab_size, eos):
    """run_t5_mlm_flax.py's create_sentinel_ids and filter_input_ids, as written there (len(tokenizer) = vocab_size)."""
    start_indices = mask_indices - np.roll(mask_indices, 1, axis=-1) * mask_indices
    start_indices[:, 0] = mask_indices[:, 0]
    sentinel_ids = np.where(start_indices != 0, np.cumsum(start_indices, axis=-1), start_indices)
    sentinel_ids = np.where(sentinel_ids != 0, (vocab_size - sentinel_ids), 0)
    sentinel_ids -= mask_indices - start_indices
    input_ids_full = np.where(sentinel_ids != 0, sentinel_ids, input_ids)
    input_ids = input_ids_full[input_ids_full >= 0].reshape((input_ids.shape[0], -1))
    return np.concatenate([input_ids, np.full((input_ids.shape[0], 1), eos, dtype=np.int64)], axis=-1)


def test_t5_lengths_are_t5s():
    assert input_and_target_lengths(512, 0.15, 3.0) == (568, 114)
    assert input_and_target_lengths(64, 0.15, 3.0) == (70, 14)  # 10 noise tokens in 3 spans: 60 + 3 + 1, 10 + 3 + 1


@pytest.mark.parametrize("seed", range(5))
def test_noise_mask_inputs_targets_and_sentinel_order_equal_the_reference_helper(seed):
    length = 568
    np.random.seed(seed)
    expected = reference_noise_mask(length, 0.15, 3.0)
    ours = random_spans_noise_mask(length, 0.15, 3.0, np.random.RandomState(seed))
    assert np.array_equal(ours, expected)
    row = np.random.default_rng(seed).integers(5, 900, size=length)
    inputs, targets = corrupt(row, ours, 1000, 1)
    mask = ours[None].astype(np.int8)
    assert inputs.tolist() == reference_filter(row[None], mask, 1000, 1)[0].tolist()
    assert targets.tolist() == reference_filter(row[None], 1 - mask, 1000, 1)[0].tolist()
    assert (len(inputs), len(targets)) == (512, 114)
    sentinels = [t for t in targets if t >= 900]
    assert sentinels == list(range(999, 999 - len(sentinels), -1))  # <extra_id_0> = vocab - 1, counting down


def test_span_corruption_known_answer():
    """Raffel et al.'s figure 2: "Thank you <X> me to your party <Y> week ." / "<X> for inviting <Y> last <Z>"."""
    words = "Thank you for inviting me to your party last week .".split()
    row = np.arange(len(words)) + 10
    noise = np.array([w in ("for", "inviting", "last") for w in words])
    inputs, targets = corrupt(row, noise, 100, 1)
    name = {i + 10: w for i, w in enumerate(words)} | {99: "<X>", 98: "<Y>", 97: "<Z>", 1: "</s>"}
    assert " ".join(name[int(t)] for t in inputs) == "Thank you <X> me to your party <Y> week . </s>"
    assert " ".join(name[int(t)] for t in targets) == "<X> for inviting <Y> last <Z> </s>"


# ---- the recipes through `ctxrep pretrain` ----------------------------------------------------------------------


def train(corpus: Path, out: Path, objective: str, *extra) -> None:
    args = ["--objective", objective, "--config", "tiny", "--corpus", corpus, "--out", out, "--no-progress", *extra]
    result = CliRunner().invoke(pretrain, [str(a) for a in args])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("objective, model_type", [("denoising", "bart"), ("span-corruption", "t5")])
def test_recipe_trains_and_transformers_loads_the_model(objective, model_type, corpus, tmp_path):
    import transformers

    import ctxrep

    out = tmp_path / objective
    train(corpus, out, objective, "--max-steps", 30, "--trainer.log_every", 5)
    losses = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.1, losses
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    model = ctxrep.load_model(out)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    ids = torch.tensor([[5, 17, 42, 99, 2]])
    dec = torch.tensor([[model.config.decoder_start_token_id, 17, 42]])
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, decoder_input_ids=dec).logits,
            ref(input_ids=ids, decoder_input_ids=dec).logits,
            atol=1e-4,
            rtol=1e-4,
        )
    vectors = ctxrep.Featurizer(out, layers="all").embed_words([["kalo", "mitu", "ren"]])
    assert vectors[0].shape == (3, model.num_layers + 1, 64) and np.isfinite(vectors[0]).all()


def test_denoising_batches_shift_labels_as_transformers_and_resume_the_same_noise(corpus, tmp_path):
    import transformers

    from ctxrep.train.pretrain import prepare_run
    from ctxrep.train.pretrain_config import load_config

    run = prepare_run("denoising", load_config("tiny", [], "denoising"), corpus, tmp_path / "run", progress=False)
    tok = run.train_data.tokenizer
    first = run.train_data.next_batch(4)
    state = run.train_data.state_dict()
    second = run.train_data.next_batch(4)
    run.train_data.load_state_dict(state)
    again = run.train_data.next_batch(4)
    assert all(np.array_equal(second[k], again[k]) for k in second)  # resumed: the same rows and the same noise
    labels = torch.from_numpy(first["labels"])
    assert not np.array_equal(
        first["input_ids"][:, : labels.shape[1]], first["labels"][:, : first["input_ids"].shape[1]]
    )
    model = run.objective.model
    expected = transformers.models.bart.modeling_bart.shift_tokens_right(labels, model.config.pad_token_id, 2)
    assert torch.equal(model.shift_right(labels), expected) and model.config.decoder_start_token_id == 2
    assert (first["input_ids"] == tok.backend.token_to_id("<mask>")).any()


def test_a_corpus_without_sentence_ends_warns_that_permutation_does_nothing(tmp_path):
    from ctxrep.train.pretrain import prepare_run
    from ctxrep.train.pretrain_config import load_config

    text = tmp_path / "one-sentence-documents"
    text.mkdir()
    for i in range(12):
        (text / f"{i}.txt").write_text(" ".join(f"kalo mitu ren sava{j % 7} pi vo" for j in range(30 + i)) + "\n")
    config = load_config("tiny", [("tokenizer.vocab_size", "280")], "denoising")
    with pytest.warns(UserWarning, match="no document has more than one sentence, so permute_sentences=1.0 shuffles"):
        prepare_run("denoising", config, text, tmp_path / "run", progress=False)


def test_a_corpus_too_short_for_one_sample_is_one_line(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("kalo mitu .\n")
    args = [
        "--objective",
        "denoising",
        "--config",
        "tiny",
        "--corpus",
        text,
        "--out",
        tmp_path / "out",
        "--no-progress",
    ]
    extra = ["--tokenizer.vocab_size", "261", "--data.eval_fraction", "0"]
    result = CliRunner().invoke(pretrain, [str(a) for a in args] + extra)
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "corpus: the corpus has 12 tokens, fewer than one sequence of max_length=64" in lines[0]
