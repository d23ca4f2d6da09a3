"""SentencePiece-only tokenizer folders (XLM-R, CamemBERT, T5, DeBERTa-v3 layouts), converted once and cached,
against transformers' own tokenizers on a few hundred sentences: accents, CJK, emoji and text that NFKC changes."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import transformers

from ctxrep.text import tokenizer_files
from ctxrep.text.tokenizer import Tokenizer, TokenizerError

WORDS = (
    "the quick brown fox jumps over lazy dog river bank loan model words vectors context sentence "
    "café naïve résumé über straße señor façade garçon Ångström crème brûlée déjà vu "
    "東京 日本 首都 中文 漢字 北京 大学 한국어 서울 "
    "🍕 🎉 👍🏽 ❤️ 🇫🇷 "
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ ﬁne ﬂow №5 ① ② x² H₂O ½ Å e\u0301t\u0301e ｶﾀｶﾅ ㍿ ™ …"
).split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 9))]
        if rng.random() < 0.3:
            words[rng.randrange(len(words))] += rng.choice([".", ",", "!", "?", "。"])
        if rng.random() < 0.2:
            words[0] = words[0].capitalize()
        out.append(" ".join(words))
    return out


CORPUS = sentences(400, seed=1)
TEST = sentences(300, seed=2)

# (model_type, the file name its repos use)
LAYOUTS = [
    ("xlm-roberta", "sentencepiece.bpe.model"),
    ("camembert", "sentencepiece.bpe.model"),
    ("t5", "spiece.model"),
    ("deberta-v2", "spm.model"),
]


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """A small unigram SentencePiece model with NFKC normalisation (SentencePiece's default rule)."""
    import sentencepiece

    d = tmp_path_factory.mktemp("spm")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(d / "m"),
        vocab_size=300,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return d / "m.model"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path / "ctxrep-cache"))
    return tmp_path / "ctxrep-cache" / "tokenizers"


def _folder(root: Path, spm: Path, model_type: str, file: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / file).write_bytes(spm.read_bytes())
    (root / "config.json").write_text(json.dumps({"model_type": model_type}))
    return root


@pytest.mark.parametrize(("model_type", "file"), LAYOUTS, ids=[m for m, _ in LAYOUTS])
def test_converted_tokenizer_matches_transformers(spm_model, cache, tmp_path, model_type, file):
    folder = _folder(tmp_path / model_type, spm_model, model_type, file)
    ours = Tokenizer.from_model_dir(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert len(list(cache.glob("*/tokenizer.json"))) == 1, "converted once, into the cache"
    assert not (folder / "tokenizer.json").exists(), "the model folder is left as it was"
    checked_words = 0
    for text in TEST:
        words = text.split()
        pieces = ours.encode_words([words])[0]
        ids, _, offset = ours.build_inputs(pieces.ids)
        enc = theirs(text)
        assert ids == enc["input_ids"], (text, ours.backend.id_to_token, pieces.tokens)
        # word ids: transformers' come from its own split of the running text; ours from text.split()
        theirs_words = [w for w in enc.word_ids() if w is not None]
        assert pieces.word_ids == theirs_words, (text, pieces.tokens)
        assert pieces.num_words == len(words) and set(pieces.word_ids) == set(range(len(words)))
        checked_words += len(words)
        # a word's pieces are those it has in running text: its first piece starts with "▁"
        for s, _ in pieces.spans():
            assert pieces.tokens[s].startswith("\u2581"), (text, pieces.tokens)
    assert checked_words > 1000
    pair = ours.build_inputs(ours.encode_words([["the", "dog"]])[0].ids, ours.encode_words([["a", "cat"]])[0].ids)[0]
    assert pair == theirs("the dog", "a cat")["input_ids"]
    assert ours.pad_token_id == theirs.pad_token_id


def test_conversion_is_cached_and_keyed_on_the_settings(spm_model, cache, tmp_path, monkeypatch):
    folder = _folder(tmp_path / "xlmr", spm_model, "xlm-roberta", "sentencepiece.bpe.model")
    first = Tokenizer.from_model_dir(folder)
    calls = []
    real = tokenizer_files.convert_sentencepiece
    monkeypatch.setattr(tokenizer_files, "convert_sentencepiece", lambda f: calls.append(f) or real(f))
    again = Tokenizer.from_model_dir(folder)
    assert calls == [] and again.backend.to_str() == first.backend.to_str()
    # other settings beside the same SentencePiece file: converted anew
    (folder / "config.json").write_text(json.dumps({"model_type": "camembert"}))
    camembert = Tokenizer.from_model_dir(folder)
    assert len(calls) == 1 and len(list(cache.glob("*/tokenizer.json"))) == 2
    assert camembert.backend.token_to_id("<pad>") == 1 and camembert.backend.token_to_id("<s>NOTUSED") == 0


def test_without_transformers_the_error_says_what_to_install(spm_model, cache, tmp_path, monkeypatch):
    folder = _folder(tmp_path / "t5", spm_model, "t5", "spiece.model")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_model_dir(folder)
    message = str(e.value)
    assert "spiece.model" in message and "pip install transformers sentencepiece protobuf" in message
    assert "\n" not in message


def test_tokenizer_json_wins_over_the_sentencepiece_file(spm_model, cache, tmp_path):
    folder = _folder(tmp_path / "both", spm_model, "xlm-roberta", "sentencepiece.bpe.model")
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    theirs.backend_tokenizer.save(str(folder / "tokenizer.json"))
    Tokenizer.from_model_dir(folder)
    assert not cache.exists(), "tokenizer.json is read directly; nothing converted"
