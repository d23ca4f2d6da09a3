"""Greedy and beam search against transformers' generate, n-best, and translate() over many sentences."""

from __future__ import annotations

import pytest
import torch
import transformers
from _mt_reverser import EOS, PAD, sources, train_reverser
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ctxrep.models.marian import MarianConfig, MarianMTModel
from ctxrep.translate.search import beam_search, greedy_search, translate, translate_n_best
from ctxrep.translate.tokenizer import MTTokenizer

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """A tiny model trained for a few seconds to reverse its input: half-learned, so that its outputs end at many
    lengths and beam search finds other outputs than greedy search (a random model rarely stops, or always does).
    Saved by ctxrep, read by transformers."""
    model = train_reverser(d_model=32, ffn_dim=64, steps=60)
    path = tmp_path_factory.mktemp("marian-search")
    model.save_pretrained(path)
    return path


def strip(row: list[int]) -> list[int]:
    """transformers' output row -> target ids without the start token, </s> and padding."""
    row = row[1:]
    return row[: row.index(EOS)] if EOS in row else row


def test_greedy_equals_transformers_generate(models_dir):
    ours = MarianMTModel.from_pretrained(models_dir)
    ref = transformers.MarianMTModel.from_pretrained(models_dir).eval()
    ids, mask = sources(16)
    found = greedy_search(ours, ids, mask, max_len_a=0, max_len_b=NEW_TOKENS)
    with torch.no_grad():
        expected = ref.generate(
            ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=NEW_TOKENS, bad_words_ids=[[PAD]]
        )
    expected = [strip(row) for row in expected.tolist()]
    assert found == expected
    lengths = {len(row) for row in found}
    assert len(lengths) >= 4, f"too few distinct output lengths to test stopping: {lengths}"
    assert NEW_TOKENS - 1 in lengths  # at least one reached the maximum length and had </s> forced


def test_beam_search_equals_transformers_generate(models_dir):
    ours = MarianMTModel.from_pretrained(models_dir)
    ref = transformers.MarianMTModel.from_pretrained(models_dir).eval()
    ids, mask = sources(16, seed=2)
    found = beam_search(ours, ids, mask, beam=4, length_penalty=1.0, penalty="hf", max_len_a=0, max_len_b=NEW_TOKENS)
    with torch.no_grad():
        out = ref.generate(
            ids,
            attention_mask=mask,
            num_beams=4,
            do_sample=False,
            length_penalty=1.0,
            early_stopping=True,
            max_new_tokens=NEW_TOKENS,
            bad_words_ids=[[PAD]],
            return_dict_in_generate=True,
            output_scores=True,
        )
    expected = [strip(row) for row in out.sequences.tolist()]
    assert [h[0].tokens for h in found] == expected
    assert torch.allclose(torch.tensor([h[0].score for h in found]), out.sequences_scores, atol=1e-4)
    greedy = greedy_search(ours, ids, mask, max_len_a=0, max_len_b=NEW_TOKENS)
    assert sum(h[0].tokens != g for h, g in zip(found, greedy)) >= 2  # beam search made a difference somewhere


def test_beam_search_n_best_equals_transformers_num_return_sequences(models_dir):
    ours = MarianMTModel.from_pretrained(models_dir)
    ref = transformers.MarianMTModel.from_pretrained(models_dir).eval()
    ids, mask = sources(6, seed=3)
    found = beam_search(
        ours, ids, mask, beam=5, n_best=3, length_penalty=0.5, penalty="hf", max_len_a=0, max_len_b=NEW_TOKENS
    )
    with torch.no_grad():
        out = ref.generate(
            ids,
            attention_mask=mask,
            num_beams=5,
            num_return_sequences=3,
            do_sample=False,
            length_penalty=0.5,
            early_stopping=True,
            max_new_tokens=NEW_TOKENS,
            bad_words_ids=[[PAD]],
            return_dict_in_generate=True,
            output_scores=True,
        )
    expected = [strip(row) for row in out.sequences.tolist()]
    assert [h.tokens for hyps in found for h in hyps] == expected
    scores = torch.tensor([[h.score for h in hyps] for hyps in found])
    assert torch.allclose(scores.view(-1), out.sequences_scores, atol=1e-4)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])  # best first
    assert all(len({tuple(h.tokens) for h in hyps}) == 3 for hyps in found)


def test_gnmt_penalty_scores_and_order(models_dir):
    ours = MarianMTModel.from_pretrained(models_dir)
    ids, mask = sources(6, seed=4)
    found = beam_search(
        ours, ids, mask, beam=4, n_best=4, length_penalty=0.6, penalty="gnmt", max_len_a=0, max_len_b=NEW_TOKENS
    )
    for i, hyps in enumerate(found):
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:  # the score is log P(Y </s> | X) / ((5 + |Y </s>|) / 6)^0.6, recomputed by teacher forcing
            labels = torch.tensor([h.tokens + [EOS]])
            with torch.no_grad():
                logits = ours(ids[i : i + 1], attention_mask=mask[i : i + 1], labels=labels).logits
            log_p = logits.log_softmax(-1)[0].gather(1, labels[0][:, None]).sum()
            assert h.score == pytest.approx(float(log_p) / ((5 + labels.shape[1]) / 6) ** 0.6, abs=1e-4)


def test_the_default_length_penalty_lengthens_beam_outputs_and_is_used_everywhere(models_dir):
    import inspect

    from ctxrep.cli.mt import translate as translate_command
    from ctxrep.translate.search import DEFAULT_LENGTH_PENALTY

    assert DEFAULT_LENGTH_PENALTY == 2.0  # the Multi30k sweep (benchmarks/RESULTS.md); the paper's 0.6 wrote short
    for function in (beam_search, translate_n_best, translate):
        parameters = inspect.signature(function).parameters
        assert (
            parameters["length_penalty"].default == DEFAULT_LENGTH_PENALTY and parameters["penalty"].default == "gnmt"
        )
    option = next(p for p in translate_command.params if p.name == "length_penalty")
    assert option.default == DEFAULT_LENGTH_PENALTY
    ours = MarianMTModel.from_pretrained(models_dir)
    ids, mask = sources(8, seed=5)
    default = beam_search(ours, ids, mask, beam=4, n_best=4, max_len_a=0, max_len_b=NEW_TOKENS)
    paper = beam_search(ours, ids, mask, beam=4, length_penalty=0.6, max_len_a=0, max_len_b=NEW_TOKENS)
    for i, (hyps, old) in enumerate(zip(default, paper)):
        # the finished pool does not depend on alpha; a larger alpha picks a hypothesis at least as long
        assert len(hyps[0].tokens) >= len(old[0].tokens)
        labels = torch.tensor([hyps[0].tokens + [EOS]])  # its score is log P(Y </s> | X) / ((5 + |Y </s>|) / 6)^2
        with torch.no_grad():
            logits = ours(ids[i : i + 1], attention_mask=mask[i : i + 1], labels=labels).logits
        log_p = logits.log_softmax(-1)[0].gather(1, labels[0][:, None]).sum()
        assert hyps[0].score == pytest.approx(float(log_p) / ((5 + labels.shape[1]) / 6) ** 2.0, abs=1e-4)
    assert sum(len(h[0].tokens) for h in default) > sum(len(h[0].tokens) for h in paper)


def test_beam_one_equals_greedy_and_batching_does_not_matter(models_dir):
    ours = MarianMTModel.from_pretrained(models_dir)
    ids, mask = sources(10, seed=5)
    greedy = greedy_search(ours, ids, mask, max_len_a=1.0, max_len_b=3)
    beam_one = beam_search(ours, ids, mask, beam=1, max_len_a=1.0, max_len_b=3)
    assert [h[0].tokens for h in beam_one] == greedy
    batched = beam_search(ours, ids, mask, beam=3, max_len_a=1.0, max_len_b=3)
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        alone = beam_search(ours, ids[i : i + 1, :n], None, beam=3, max_len_a=1.0, max_len_b=3)
        assert alone[0][0].tokens == batched[i][0].tokens
        assert alone[0][0].score == pytest.approx(batched[i][0].score, abs=1e-4)
        assert len(batched[i][0].tokens) + 1 <= int(1.0 * n + 3)  # the length limit relative to the source


def test_bad_search_arguments_are_refused(models_dir):
    ours = MarianMTModel.from_pretrained(models_dir)
    ids, mask = sources(2)
    with pytest.raises(ValueError, match="n_best must be between 1 and the beam size 2, got 3"):
        beam_search(ours, ids, mask, beam=2, n_best=3)
    with pytest.raises(ValueError, match=r"penalty must be one of \('gnmt', 'hf'\), got 'wu'"):
        beam_search(ours, ids, mask, penalty="wu")


# ---- translate() ------------------------------------------------------------------------------------------------

LINES = [
    "a man in a blue shirt is standing on a ladder .",
    "two dogs play in the snow .",
    "ein mann in einem blauen hemd steht auf einer leiter .",
    "zwei hunde spielen im schnee .",
]


@pytest.fixture(scope="module")
def mt_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mt")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(LINES * 5, trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "</s>", "<unk>"]))
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=0,
        eos_token_id=1,
        dropout=0.0,
    )
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias[0, 1] = 1.5
    model.save_pretrained(path)
    return path


def test_translate_returns_input_order_whatever_the_batching(mt_dir):
    model = MarianMTModel.from_pretrained(mt_dir)
    tok = MTTokenizer.from_model_dir(mt_dir)
    sentences = ["two dogs", LINES[0], "a man", LINES[1], "snow", LINES[3] + " " + LINES[1], "ladder"]
    done = []
    one_batch = translate(model, tok, sentences, beam=3, batch_tokens=10_000)
    small_batches = translate(model, tok, sentences, beam=3, batch_tokens=12, progress=done.append)
    alone = [translate(model, tok, [s], beam=3)[0] for s in sentences]
    assert one_batch == small_batches == alone
    assert sum(done) == len(sentences) and len(done) > 2
    assert all(isinstance(t, str) for t in one_batch)
    ids = tok.encode_source([sentences[0]])
    expected = tok.decode(beam_search(model, torch.tensor(ids), beam=3)[0][0].tokens)
    assert one_batch[0] == expected
    greedy = translate(model, tok, sentences, beam=1)
    assert greedy[0] == tok.decode(greedy_search(model, torch.tensor(ids))[0])
    n_best = translate_n_best(model, tok, sentences, beam=3, n_best=2)
    assert [n[0][0] for n in n_best] == one_batch and all(n[0][1] >= n[1][1] for n in n_best)


def test_translate_refuses_or_skips_long_sentences(mt_dir):
    model = MarianMTModel.from_pretrained(mt_dir)
    tok = MTTokenizer.from_model_dir(mt_dir)
    long = " ".join(LINES * 2)  # more than 32 tokens
    assert len(tok.encode_source([long])[0]) > 32
    with pytest.raises(
        ValueError,
        match=r"sentence 2 has \d+ tokens \(with </s>\), more than the model's 32 positions "
        r"\(and 1 more sentences are too long\); .*skip_long=True",
    ) as e:
        translate(model, tok, ["two dogs", "snow", long, "a man", long])
    assert "\n" not in str(e.value)
    out = translate(model, tok, ["two dogs", "snow", long, "a man", long], skip_long=True)
    assert out[2] is None and out[4] is None and all(isinstance(out[i], str) for i in (0, 1, 3))


def test_translate_refuses_a_tokenizer_of_another_model(mt_dir, models_dir):
    with pytest.raises(ValueError, match="the tokenizer's </s>/<pad> ids .* use the tokenizer the model was trained"):
        translate(MarianMTModel.from_pretrained(models_dir), MTTokenizer.from_model_dir(mt_dir), ["snow"])
