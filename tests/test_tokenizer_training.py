"""Tokenizer training: BERT WordPiece and RoBERTa byte-level BPE conventions, loading, bad input."""

from __future__ import annotations

import json

import pytest

from ctxrep.data.corpus import CorpusError
from ctxrep.data.tokenizer_training import train_tokenizer
from ctxrep.text.tokenizer import Tokenizer

BODY = (
    "The cat sat on the mat. The dog sat on the log.\n"
    "A cat and a dog met on the mat, and the cat ran.\n\n"
    "The Cat was happy. The Dog was not happy at all.\n"
)


def write_gutenberg(path, body: str = BODY * 20, header_word: str = "zyxxy") -> None:
    """A file as Project Gutenberg ships it: BOM, CRLF, header and licence footer around the text."""
    header = f"The Project Gutenberg eBook {header_word} {header_word} {header_word}\n" * 30
    text = (
        header
        + "*** START OF THE PROJECT GUTENBERG EBOOK TEST ***\n"
        + body
        + "*** END OF THE PROJECT GUTENBERG EBOOK TEST ***\n"
        + f"{header_word} licence {header_word}\n" * 30
    )
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "book.txt"
    write_gutenberg(path)
    return path


@pytest.fixture(scope="module")
def wordpiece_dir(tmp_path_factory, corpus_file):
    out = tmp_path_factory.mktemp("wp")
    train_tokenizer(corpus_file, "wordpiece", 200, out, lowercase=True, min_frequency=1)
    return out


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory, corpus_file):
    out = tmp_path_factory.mktemp("bpe")
    train_tokenizer(corpus_file, "bpe", 300, out, min_frequency=1)
    return out


def test_wordpiece_follows_bert_conventions(wordpiece_dir):
    tok = Tokenizer.from_model_dir(wordpiece_dir)
    vocab = tok.backend.get_vocab()
    assert [vocab[t] for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]] == [0, 1, 2, 3, 4]
    t = tok.template
    # [CLS] A [SEP] / [CLS] A [SEP] B [SEP], with B and its [SEP] of type 1.
    assert (t.prefix, t.single_suffix, t.middle, t.suffix) == ([2], [3], [3], [3])
    assert (t.prefix_types, t.middle_types, t.suffix_types, t.type_a, t.type_b) == ([0], [0], [1], 0, 1)
    assert tok.pad_token_id == 0 and tok.unk_token == "[UNK]"
    enc = tok.backend.encode("The CAT sat on the mat.")
    assert enc.tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert tok.backend.decode(enc.ids) == "the cat sat on the mat."
    # The Gutenberg header and footer were not trained on: their word is not in the vocabulary.
    assert "zyxxy" not in vocab and "licence" not in vocab
    config = json.loads((wordpiece_dir / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True and config["mask_token"] == "[MASK]"


def test_wordpiece_cased_keeps_case(tmp_path, corpus_file):
    tok = train_tokenizer(corpus_file, "wordpiece", 200, tmp_path, lowercase=False, min_frequency=1)
    assert tok.backend.encode("The", add_special_tokens=False).tokens == ["The"]
    assert tok.backend.encode("the", add_special_tokens=False).tokens == ["the"]


def test_bpe_follows_roberta_conventions(bpe_dir):
    tok = Tokenizer.from_model_dir(bpe_dir)
    vocab = tok.backend.get_vocab()
    assert [vocab[t] for t in ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]] == [0, 1, 2, 3, 4]
    t = tok.template
    # <s> A </s> / <s> A </s></s> B </s>, all of type 0.
    assert (t.prefix, t.single_suffix, t.middle, t.suffix) == ([0], [2], [2, 2], [2])
    assert (t.type_a, t.type_b) == (0, 0)
    assert tok.pad_token_id == 1
    # add_prefix_space: the first word is encoded like any other word.
    first = tok.backend.encode("cat", add_special_tokens=False).ids
    inner = tok.backend.encode("a cat", add_special_tokens=False).ids
    assert inner[-len(first) :] == first
    # Byte level: characters never seen in training still round-trip exactly.
    text = "naïve café ☃ 東京"
    enc = tok.backend.encode(text)
    assert vocab["<unk>"] not in enc.ids
    assert tok.backend.decode(enc.ids) == " " + text  # the added prefix space comes back


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_transformers_loads_the_same_tokenizer(kind, wordpiece_dir, bpe_dir):
    transformers = pytest.importorskip("transformers")
    folder = wordpiece_dir if kind == "wordpiece" else bpe_dir
    ours = Tokenizer.from_model_dir(folder)
    auto = transformers.AutoTokenizer.from_pretrained(str(folder))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    text, pair = "The cat sat on the mat.", "A dog, a log!"
    expected = ours.backend.encode(text, pair)
    for hf in (auto, fast):
        got = hf(text, pair)
        assert got["input_ids"] == expected.ids
    if kind == "wordpiece":  # BERT models take token_type_ids; RoBERTa ones do not
        assert auto(text, pair)["token_type_ids"] == expected.type_ids
    else:
        assert "token_type_ids" not in auto(text, pair)
    assert auto.mask_token_id == 4 and auto.pad_token_id == ours.pad_token_id
    assert auto.cls_token_id == ours.template.prefix[0]


def test_unknown_kind_is_refused(tmp_path, corpus_file):
    with pytest.raises(ValueError, match="'sentencepiece' is not known: use 'wordpiece'"):
        train_tokenizer(corpus_file, "sentencepiece", 200, tmp_path)


def test_bpe_vocab_smaller_than_byte_alphabet_is_refused(tmp_path, corpus_file):
    with pytest.raises(ValueError, match=r"vocab_size=100 is too small for a bpe tokenizer: it needs at least 261"):
        train_tokenizer(corpus_file, "bpe", 100, tmp_path)


def test_empty_corpus_is_refused(tmp_path):
    book = tmp_path / "empty.txt"
    write_gutenberg(book, body="\n\n   \n")
    with pytest.raises(CorpusError, match="the corpus is empty: 1 file.* after removing Project Gutenberg"):
        train_tokenizer(book, "wordpiece", 200, tmp_path / "out")


def test_binary_file_is_refused_with_its_name(tmp_path):
    (tmp_path / "good.txt").write_text("Some text.\n")
    (tmp_path / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(CorpusError, match=r"image\.txt: NUL byte at byte offset 8 \(line 3\)"):
        train_tokenizer(tmp_path, "wordpiece", 200, tmp_path / "out")


@pytest.fixture(scope="module")
def word_dir(tmp_path_factory, corpus_file):
    out = tmp_path_factory.mktemp("word")
    train_tokenizer(corpus_file, "word", 12, out)
    return out


def test_word_level_keeps_the_most_frequent_words_after_the_elmo_specials(word_dir):
    tok = Tokenizer.from_model_dir(word_dir)
    vocab = tok.backend.get_vocab()
    assert [vocab[t] for t in ["<pad>", "<unk>", "<S>", "</S>"]] == [0, 1, 2, 3]
    assert len(vocab) == 12 and tok.pad_token_id == 0 and tok.unk_token == "<unk>"
    # Per copy of BODY: "." 5 times, "The" and "the" 4, "cat" and "on" 3, six words 2: most frequent first
    # (ties in the trainer's order), cased, and only 8 of the 2-or-more words fit.
    assert vocab["."] == 4 and {vocab["The"], vocab["the"]} == {5, 6} and {vocab["cat"], vocab["on"]} == {7, 8}
    assert "log" not in vocab and "Cat" not in vocab
    assert "zyxxy" not in vocab  # the Gutenberg header was not trained on
    # Whitespace and every punctuation character split words; words outside the vocabulary are <unk>.
    enc = tok.backend.encode("the cat,on the zebra.")  # "," is not in the 12 words
    assert enc.tokens == ["the", "cat", "<unk>", "on", "the", "<unk>", "."]
    # No template: ELMo adds its own <S> and </S>.
    assert tok.template.prefix == [] and tok.template.single_suffix == []
    config = json.loads((word_dir / "tokenizer_config.json").read_text())
    assert config["unk_token"] == "<unk>" and config["bos_token"] == "<S>" and config["eos_token"] == "</S>"


def test_word_level_lowercase(tmp_path, corpus_file):
    tok = train_tokenizer(corpus_file, "word", 40, tmp_path, lowercase=True)
    assert tok.backend.encode("The CAT").tokens == ["the", "cat"]
    assert "The" not in tok.backend.get_vocab()


def test_word_level_vocab_without_room_for_a_word_is_refused(tmp_path, corpus_file):
    with pytest.raises(
        ValueError, match=r"vocab_size=4 is too small for a word tokenizer: it needs at least 5 .*1 word"
    ):
        train_tokenizer(corpus_file, "word", 4, tmp_path)


# ---- the same call writes the same file, in any process ----------------------------------------------

TRAIN_IN_A_SUBPROCESS = """
import sys
from ctxrep.data.tokenizer_training import train_tokenizer
train_tokenizer(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], lowercase=True, min_frequency=2)
"""


def write_many_words(folder, words: int = 600, lines: int = 400) -> None:
    """Made-up words over a 30-letter alphabet (accents included): enough letters that the order in which a
    trainer meets them shows in the ids, and many equally frequent merges."""
    import random

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyzéüøç"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(words)]
    folder.mkdir()
    text = "\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 12))) + "." for _ in range(lines))
    (folder / "words.txt").write_text(text + "\n")


@pytest.mark.parametrize("kind, size", [("wordpiece", 400), ("bpe", 400), ("word", 300)])
def test_the_same_call_writes_a_byte_identical_tokenizer_in_other_processes(kind, size, tmp_path):
    import os
    import subprocess
    import sys

    write_many_words(tmp_path / "text")
    files = []
    for hash_seed in ("1", "2"):  # Python's hash seed differs; the Rust trainers' hash maps differ per process anyway
        out = tmp_path / f"{kind}-{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", TRAIN_IN_A_SUBPROCESS, str(tmp_path / "text"), kind, str(size), str(out)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        files.append((out / "tokenizer.json").read_bytes())
    assert files[0] == files[1]
    vocab = json.loads(files[0])["model"]["vocab"]
    assert len(vocab) == size


def test_wordpiece_numbers_its_continuation_alphabet_in_sorted_order_as_plain_entries(wordpiece_dir):
    state = json.loads((wordpiece_dir / "tokenizer.json").read_text())
    vocab = state["model"]["vocab"]
    continuations = sorted(t for t in vocab if t.startswith("##") and len(t) == 3)
    assert continuations and [vocab[t] for t in continuations] == list(range(5, 5 + len(continuations)))
    assert [t["content"] for t in state["added_tokens"]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer.from_model_dir(wordpiece_dir)
    tokens = tok.backend.encode("##a cat", add_special_tokens=False).tokens  # "##a" in text is not that entry
    assert "##a" not in tokens and tokens[-2:] == ["a", "cat"]
