"""Decoders as decoders in the tools (issue 42, item 6): `ctxrep info` names a decoder and its attention and proposes
last-token pooling for a causal one; sentence_pooling="lasttoken" (the Featurizer's table and every command that
chooses a pooling) equals transformers' last hidden state at the last token; and `Featurizer.tokenize().word_ids`
follow the word pooling's one rule for a bare word-start marker ("Ġ", "▁") before punctuation and emoji."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from _decoders import tiny_folder
from click.testing import CliRunner

from ctxrep import Featurizer
from ctxrep.cli import main

TEXTS = ["The quick brown fox jumps .", "A crane lifted the steel beam onto the roof .", "café 🙂 dog"]
WORDS = ["a", "—", "😀", "dog", ",", "!", "—"]  # bare markers before "—" and "😀" in both tokenizers below


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("qwen3"), "qwen3")


def test_info_names_a_decoder_and_its_attention_and_proposes_last_token_pooling(qwen3, tmp_path, tiny_models, gpt2_dir):
    causal = CliRunner().invoke(main, ["info", str(qwen3)])
    assert causal.exit_code == 0, causal.output
    assert "family           qwen3 decoder (causal attention: each token reads the tokens before it)" in causal.output
    assert "choose sentence_pooling='lasttoken' (--sentence-pooling lasttoken)" in causal.output
    bidirectional = tiny_folder(tmp_path / "gemma", "gemma3_text", use_bidirectional_attention=True)
    both_ways = CliRunner().invoke(main, ["info", str(bidirectional)])
    assert "family           gemma3_text decoder (bidirectional attention)" in both_ways.output
    assert "choose sentence_pooling='mean' or 'cls'" in both_ways.output
    gpt2 = CliRunner().invoke(main, ["info", str(gpt2_dir)])
    assert "gpt2 decoder (causal attention" in gpt2.output
    bert = CliRunner().invoke(main, ["info", str(tiny_models["bert"])])
    assert "family           bert encoder" in bert.output and "'mean' or 'cls'" in bert.output


def test_lasttoken_pooling_is_the_last_hidden_state_at_the_last_token(qwen3):
    """Qwen3-Embedding's pooling: the end-of-text token the tokenizer appends, read in the last layer."""
    fz = Featurizer(str(qwen3), sentence_pooling="lasttoken")
    assert fz.sentence_dim == 32
    got = fz.embed_sentences(TEXTS)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen3 / "tokenizer.json"))
    model = transformers.AutoModel.from_pretrained(str(qwen3)).eval()
    for text, vector in zip(TEXTS, got):
        batch = tokenizer(text, return_tensors="pt")
        assert tokenizer.convert_ids_to_tokens(batch["input_ids"][0])[-1] == "<|endoftext|>"
        with torch.no_grad():
            expected = model(**batch).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(vector, expected, atol=1e-5)


def test_every_command_that_chooses_a_pooling_takes_lasttoken(qwen3, tmp_path):
    for command in (["embed"], ["index", "build"], ["serve"]):
        shown = CliRunner().invoke(main, [*command, "--help"]).output
        assert "lasttoken" in shown, command
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    args = ["embed", "--model", str(qwen3), "--input", str(tmp_path / "in.txt"), "--level", "sentence"]
    done = CliRunner().invoke(main, [*args, "--sentence-pooling", "lasttoken", "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    from ctxrep import load_vectors

    expected = Featurizer(str(qwen3), sentence_pooling="lasttoken").embed_sentences(TEXTS)
    np.testing.assert_allclose(load_vectors(tmp_path / "out").array, expected, atol=1e-6)


@pytest.mark.parametrize("which", ["qwen3", "xlmr"])
def test_word_ids_follow_the_word_poolings_rule_for_a_bare_space_piece(which, qwen3, xlmr_dir):
    """Each word's first piece by `tokenize().word_ids`, read from `embed_tokens`' states, is the vector
    pooling="first" gives, for "—" and "😀" whose pieces start with a bare "Ġ" (byte-level BPE) or "▁"
    (SentencePiece); the bare marker belongs to no word (None)."""
    fz = Featurizer(str({"qwen3": qwen3, "xlmr": xlmr_dir}[which]), pooling="first")
    alignment = fz.tokenize([WORDS])[0]
    bare = [i for i, t in enumerate(alignment.tokens) if t in ("\u0120", "\u2581") and alignment.word_ids[i] is None]
    assert bare, alignment.tokens  # the case this test is about
    assert len(alignment.word_ids) == len(alignment.tokens)
    offset = len(fz.tokenizer.template.prefix)
    long = WORDS * 40  # past the window: the windowed path (WindowPlan over pooling_spans) follows the same rule
    for words in (WORDS, long):
        alignment = fz.tokenize([words])[0]
        states = fz.embed_tokens([words])[0].states  # the same pieces: a word list is tokenized word by word
        firsts = [alignment.word_ids.index(w) for w in range(len(words))]
        np.testing.assert_allclose(states[[offset + f for f in firsts]], fz.embed_words([words])[0], atol=1e-5)
    assert len(fz.tokenize([long])[0].tokens) > fz.plan.window_size
