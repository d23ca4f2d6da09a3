"""ONE search for every encoder-decoder: greedy and beam search on BART and T5 equal transformers' generate (the same
length-penalty convention; BART forces </s> at the maximum length, T5 ends a hypothesis there without it), n-best,
int8, and translate() over a BART / T5 folder with its own tokenizer."""

from __future__ import annotations

import pytest
import torch
import transformers
from _mt_reverser import EOS, PAD, VOCAB, sources

from ctxrep.models.bart import BartConfig, BartForConditionalGeneration
from ctxrep.models.t5 import T5Config, T5ForConditionalGeneration
from ctxrep.translate.search import beam_search, greedy_search, quantize_translator

NEW_TOKENS = 7
TRAINING = {"bart": (1e-2, 150), "t5": (3e-3, 150)}  # (lr, steps): outputs of many lengths at one thread


def reverser(family: str):
    """A 2 + 2 layer model trained for a few seconds to reverse its input (half-learned: its outputs end at many
    lengths, and beam search finds other outputs than greedy search)."""
    torch.manual_seed(0)
    if family == "bart":
        model = BartForConditionalGeneration(
            BartConfig(
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
                pad_token_id=PAD,
                eos_token_id=EOS,
                bos_token_id=EOS,
                decoder_start_token_id=EOS,
                forced_eos_token_id=EOS,
                dropout=0.0,
            )
        )
    else:
        model = T5ForConditionalGeneration(
            T5Config(
                vocab_size=VOCAB,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=16,
                feed_forward_proj="gated-gelu",
                tie_word_embeddings=False,
                pad_token_id=PAD,
                eos_token_id=EOS,
                dropout_rate=0.0,
            )
        )
    lr, steps = TRAINING[family]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        ids, mask = sources(16, seed=100 + step)
        labels = ids.clone()
        for i, n in enumerate(mask.sum(dim=1).tolist()):
            labels[i, : n - 1] = ids[i, : n - 1].flip(0)
        loss = model(ids, attention_mask=mask, labels=labels.masked_fill(mask == 0, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module", params=["bart", "t5"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"{request.param}-search")
    reverser(request.param).save_pretrained(path)
    return path


def load(folder):
    import ctxrep

    ours = ctxrep.load_model(folder)
    ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    return ours, ref


def strip(row: list[int], start: bool = True) -> list[int]:
    """transformers' output row -> target ids without the start token, </s> and padding."""
    row = row[1:] if start else row
    return row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD]


def test_greedy_equals_transformers_generate(folder):
    ours, ref = load(folder)
    ids, mask = sources(16)
    found = greedy_search(ours, ids, mask, max_len_a=0, max_len_b=NEW_TOKENS)
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert found == [strip(row) for row in expected.tolist()]
    lengths = {len(row) for row in found}
    assert len(lengths) >= 3, f"too few distinct output lengths to test stopping: {lengths}"
    # at the limit: BART forces </s> (NEW_TOKENS - 1 tokens before it), T5 stops with its last token
    assert (NEW_TOKENS - 1 if ours.forces_eos else NEW_TOKENS) in lengths


@pytest.mark.parametrize("beam, n_best, alpha", [(4, 1, 1.0), (5, 3, 0.5)])
def test_beam_search_equals_transformers_generate(folder, beam, n_best, alpha):
    ours, ref = load(folder)
    ids, mask = sources(12, seed=2)
    found = beam_search(
        ours,
        ids,
        mask,
        beam=beam,
        n_best=n_best,
        length_penalty=alpha,
        penalty="hf",
        max_len_a=0,
        max_len_b=NEW_TOKENS,
    )
    with torch.no_grad():
        out = ref.generate(
            ids,
            attention_mask=mask,
            num_beams=beam,
            num_return_sequences=n_best,
            do_sample=False,
            length_penalty=alpha,
            early_stopping=True,
            max_new_tokens=NEW_TOKENS,
            return_dict_in_generate=True,
            output_scores=True,
        )
    expected = [strip(row) for row in out.sequences.tolist()]
    assert [h.tokens for hyps in found for h in hyps] == expected
    scores = torch.tensor([h.score for hyps in found for h in hyps])
    assert torch.allclose(scores, out.sequences_scores, atol=1e-4)
    greedy = greedy_search(ours, ids, mask, max_len_a=0, max_len_b=NEW_TOKENS)
    assert sum(hyps[0].tokens != g for hyps, g in zip(found, greedy)) >= 1  # beam search made a difference


def test_int8_search_follows_the_float_search(folder):
    ours, _ = load(folder)
    ids, mask = sources(8, seed=7)
    float_out = greedy_search(ours, ids, mask, max_len_a=0, max_len_b=NEW_TOKENS)
    int8_out = greedy_search(quantize_translator(ours), ids, mask, max_len_a=0, max_len_b=NEW_TOKENS)
    same = sum(a == b for a, b in zip(float_out, int8_out))
    assert same >= len(float_out) // 2, (float_out, int8_out)


LINES = ["a man in a blue shirt is standing on a ladder .", "two dogs play in the snow .", "the dog runs today ."]


@pytest.fixture(scope="module")
def bart_with_tokenizer(tmp_path_factory):
    """A tiny random BART with a byte-level BPE tokenizer.json in BART's template (<s> A </s>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("bart-tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tok.train_from_iterator(LINES * 5, trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    model = BartForConditionalGeneration(
        BartConfig(
            vocab_size=tok.get_vocab_size(),
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=32,
            init_std=0.5,
        )
    )
    with torch.no_grad():
        model.final_logits_bias[0, 2] = 2.0  # </s> likely: outputs of several lengths
    model.save_pretrained(path)
    return path


def test_translate_and_mt_translate_take_a_bart_folder(bart_with_tokenizer, tmp_path):
    from click.testing import CliRunner

    from ctxrep.cli import main
    from ctxrep.translate.search import translate
    from ctxrep.translate.train import load_translator

    model, tok = load_translator(bart_with_tokenizer)
    ids = tok.encode_source(LINES)
    assert all(row[0] == 0 and row[-1] == 2 for row in ids)  # the folder's template: <s> ... </s>
    out = translate(model, tok, LINES, beam=1)
    assert len({len(t.split()) for t in out}) > 1 and all(out)  # not all empty, of several lengths
    ref = transformers.BartForConditionalGeneration.from_pretrained(bart_with_tokenizer).eval()
    for line, row, text in zip(LINES, ids, out):
        with torch.no_grad():
            expected = ref.generate(
                torch.tensor([row]), num_beams=1, do_sample=False, max_new_tokens=int(1.2 * len(row)) + 10
            )
        assert text == tok.decode([t for t in expected[0].tolist()[1:] if t not in (0, 1, 2)]), line
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    result = CliRunner().invoke(
        main,
        ["mt", "translate", "--model", str(bart_with_tokenizer), "--input", str(tmp_path / "in.txt"), "--beam", "1"],
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == out


def test_mt_attention_draws_a_bart_folders_cross_attention(bart_with_tokenizer, tmp_path):
    """`ctxrep mt attention` (the decoder's cross-attention over the source words) takes a BART folder too."""
    from click.testing import CliRunner

    from ctxrep.cli import main

    args = [
        "mt",
        "attention",
        "--model",
        str(bart_with_tokenizer),
        "--source",
        LINES[1],
        "--out",
        str(tmp_path / "a.html"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a.html").read_text().count("<img") >= 1
