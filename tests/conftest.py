"""Shared fixtures: the packaged MiniLM model and tiny random models that transformers itself saved."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import settings
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors, trainers

from ctxrep.models.elmo import ElmoBiLM, ElmoConfig
from ctxrep.models.loading import resolve_model_path

# The fuzz tests draw the same cases on every run and machine, so CI passes or fails on the code alone;
# `make fuzz` (CTXREP_FUZZ=explore) draws fresh ones to look for new failures.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("CTXREP_FUZZ", "fixed"))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def first_pieces(enc, num_words: int) -> list[int]:
    """Each word's first piece in a `tokenizers` Encoding, skipping a bare word-start marker ("▁", "Ġ") that the
    word has more pieces after: what ctxrep's "first" pooling reads (WordPieces.pooling_spans)."""
    first = [enc.word_ids.index(w) for w in range(num_words)]
    return [
        f + 1 if enc.tokens[f] in ("\u2581", "\u0120") and f + 1 < len(enc.word_ids) and enc.word_ids[f + 1] == w else f
        for w, f in enumerate(first)
    ]


@pytest.fixture(autouse=True, scope="session")
def _threads():
    # 2 on this 2-core machine; make test sets CTXREP_TEST_THREADS=1 for each of its worker processes, as does anyone
    # running tests beside another job (threads that wait on each other crawl)
    torch.set_num_threads(int(os.environ.get("CTXREP_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return resolve_model_path("minilm")


def _copy_bert_tokenizer(dst: Path) -> None:
    src = resolve_model_path("minilm")
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, dst / name)


def _roberta_tokenizer(dst: Path) -> None:
    """A small byte-level BPE tokenizer with RoBERTa's specials, trained on a few sentences."""
    from tokenizers import ByteLevelBPETokenizer, processors

    tok = ByteLevelBPETokenizer(add_prefix_space=True)
    corpus = [
        "The quick brown fox jumps over the lazy dog.",
        "A crane lifted the steel beam.",
        "Contextual word vectors depend on the sentence around the word.",
    ] * 20
    tok.train_from_iterator(
        corpus, vocab_size=300, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    backend = tok._tokenizer
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    backend.save(str(dst / "tokenizer.json"))


def save_tiny_bert(path: Path, model_class=None, **config) -> Path:
    """A random BERT saved by transformers with MiniLM's tokenizer under seed 0: hidden 32, 2 layers, 4 heads,
    intermediate 64, 64 positions, MiniLM's vocabulary; `config` overrides (e.g. dropout), `model_class` e.g.
    transformers.BertForMaskedLM (default BertModel)."""
    torch.manual_seed(0)
    shape = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    (model_class or transformers.BertModel)(transformers.BertConfig(**(shape | config))).save_pretrained(path)
    _copy_bert_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Random bert / roberta / electra encoders saved with transformers' save_pretrained (safetensors)."""
    torch.manual_seed(0)
    common = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    out = {}
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, **common))
    out["bert"] = tmp_path_factory.mktemp("tiny-bert")
    bert.save_pretrained(out["bert"])
    _copy_bert_tokenizer(out["bert"])

    roberta_cfg = transformers.RobertaConfig(
        vocab_size=300,
        max_position_embeddings=66,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **common,
    )
    out["roberta"] = tmp_path_factory.mktemp("tiny-roberta")
    transformers.RobertaModel(roberta_cfg).save_pretrained(out["roberta"])
    _roberta_tokenizer(out["roberta"])

    electra_cfg = transformers.ElectraConfig(vocab_size=30522, embedding_size=16, max_position_embeddings=64, **common)
    out["electra"] = tmp_path_factory.mktemp("tiny-electra")
    transformers.ElectraForPreTraining(electra_cfg).save_pretrained(out["electra"])
    _copy_bert_tokenizer(out["electra"])
    return out


# ---- the other families: ELMo (word level), XLNet (specials at the end), GPT-2 (causal) ----------------------

CORPUS = [
    "The quick brown fox jumps over the lazy dog .",
    "A crane lifted the steel beam onto the roof .",
    "Contextual word vectors depend on the sentence around the word .",
    "john lives in paris , mary visited london today : good great fine nice , bad awful poor sad .",
] * 30


@pytest.fixture(scope="session")
def elmo_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = ElmoConfig(
        filters=[(1, 4), (2, 8), (3, 8)], n_highway=1, lstm_dim=24, projection_dim=8, cell_clip=3.0, proj_clip=3.0
    )
    model = ElmoBiLM(config)
    for p in model.parameters():  # random, not zero, so that context matters
        torch.nn.init.normal_(p, std=0.3)
    path = tmp_path_factory.mktemp("elmo")
    model.save_pretrained(path)
    return path


def _unigram_tokenizer(specials: list[str]) -> HFTokenizer:
    tok = HFTokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=specials, unk_token="<unk>"))
    return tok


@pytest.fixture(scope="session")
def xlnet_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("xlnet")
    tok = _unigram_tokenizer(["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"])
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    tok.post_processor = processors.TemplateProcessing(  # XLNet: A <sep> <cls>, the <cls> in segment 2
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)],
    )
    tok.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=32,
        n_layer=2,
        n_head=4,
        d_inner=64,
        pad_token_id=tok.token_to_id("<pad>"),
        dropout=0.0,
    )
    transformers.XLNetModel(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path_factory.mktemp("gpt2")
    tok = ByteLevelBPETokenizer(add_prefix_space=True)
    tok.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok._tokenizer.save(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
    )
    transformers.GPT2Model(cfg).save_pretrained(path)
    return path


# ---- families added in issue 25: XLM-R, CamemBERT, DistilBERT, MPNet, T5's encoder ---------------------------------

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def sentencepiece_tokenizer(path: Path, model_type: str, file: str, vocab_size: int = 200) -> int:
    """A small unigram SentencePiece model trained on CORPUS under the file name the family's Hub repos use, plus
    transformers' conversion of it saved beside (tokenizer.json, tokenizer_config.json) as those repos ship it;
    returns the tokenizer's vocabulary size (added tokens included)."""
    import json

    import sentencepiece

    path.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(path / "spm"),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (path / "spm.model").rename(path / file)
    (path / "spm.vocab").unlink()
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))  # replaced by the model's own
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    tok.save_pretrained(str(path))
    return len(tok)


def _roberta_like_dir(path: Path, model_type: str, model_cls) -> Path:
    n = sentencepiece_tokenizer(path, model_type, "sentencepiece.bpe.model")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=n, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, **TINY, **NO_DROPOUT
    )
    model_cls(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def xlmr_dir(tmp_path_factory) -> Path:
    """A tiny XLM-RoBERTa with a SentencePiece tokenizer (sentencepiece.bpe.model + its tokenizer.json)."""
    return _roberta_like_dir(tmp_path_factory.mktemp("xlm-roberta"), "xlm-roberta", transformers.XLMRobertaModel)


@pytest.fixture(scope="session")
def camembert_dir(tmp_path_factory) -> Path:
    """A tiny CamemBERT (its vocabulary layout: <s>NOTUSED, <pad>, </s>NOTUSED, <unk>, ..., <mask>)."""
    return _roberta_like_dir(tmp_path_factory.mktemp("camembert"), "camembert", transformers.CamembertModel)


@pytest.fixture(scope="session")
def distilbert_dir(tmp_path_factory) -> Path:
    """A tiny DistilBERT with BERT's uncased WordPiece tokenizer (MiniLM's files), as DistilBertForMaskedLM saves
    it (the MLM head's weights beside the encoder's)."""
    path = tmp_path_factory.mktemp("distilbert")
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(
        vocab_size=30522,
        max_position_embeddings=64,
        n_layers=2,
        n_heads=4,
        dim=32,
        hidden_dim=64,
        dropout=0.0,
        attention_dropout=0.0,
    )
    transformers.DistilBertForMaskedLM(config).save_pretrained(path)
    _copy_bert_tokenizer(path)
    return path


def _mpnet_tokenizer(dst: Path) -> int:
    """MPNet's tokenizer: lower-cased WordPiece with RoBERTa's specials and template (<s> A </s></s> B </s>)."""
    from tokenizers import decoders, normalizers

    tok = HFTokenizer(models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    )
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(dst / "tokenizer.json"))
    return tok.get_vocab_size()


@pytest.fixture(scope="session")
def mpnet_dir(tmp_path_factory) -> Path:
    """A tiny MPNet laid out as sentence-transformers ships all-mpnet-base-v2 (mean pooling, then Normalize)."""
    import json

    path = tmp_path_factory.mktemp("mpnet")
    n = _mpnet_tokenizer(path)
    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=n, max_position_embeddings=66, **TINY, **NO_DROPOUT)
    transformers.MPNetModel(config).save_pretrained(path)
    (path / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True})
    )
    return path


@pytest.fixture(scope="session")
def t5_dir(tmp_path_factory) -> Path:
    """A tiny T5 v1.1 encoder (gated-gelu) as T5EncoderModel saves it, with T5's SentencePiece tokenizer
    (spiece.model + its tokenizer.json: A </s>, 100 extra ids)."""
    path = tmp_path_factory.mktemp("t5")
    n = sentencepiece_tokenizer(path, "t5", "spiece.model")
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=n,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
    )
    transformers.T5EncoderModel(config).save_pretrained(path)
    return path


# ---- the slow tier: tests/slow_tests.txt (measured by tests/_slow_tests.py) --------------------------------------


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test listed in tests/slow_tests.txt `slow`: `make test-fast` runs -m "not slow"."""
    listing = Path(__file__).with_name("slow_tests.txt")
    slow = {line.strip() for line in listing.read_text().splitlines() if line.strip() and not line.startswith("#")}
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models gain nothing
    from a second intra-op thread, and on a busy machine the threads wait for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_estimator_params(tiny_models, tmp_path, mode="finetune", **kw) -> dict:
    """An estimator's parameters over the tiny random BERT (tiny_models["bert"]), quick to fit: batch 4, lr 3e-3,
    no dropout, seeded, its frozen-feature cache under tmp_path; `kw` override them."""
    params = dict(
        model=str(tiny_models["bert"]),
        mode=mode,
        batch_size=4,
        lr=3e-3,
        random_state=0,
        cache_dir=str(tmp_path / "cache"),
        lstm_size=8,
        dropout=0.0,
    )
    return params | kw


# ---- a made-up corpus for pretraining runs ------------------------------------------------------------------


def write_corpus(folder: Path, documents: int = 8, sentences: int = 60, seed: int = 0) -> Path:
    """A made-up language (Zipfian words, frequent word-to-word transitions) with enough distinct words to
    fill a 1000-entry WordPiece or BPE vocabulary; one document per file."""
    rng = random.Random(seed)
    syllables = [
        "ka",
        "lo",
        "mi",
        "tu",
        "ren",
        "sa",
        "vo",
        "pi",
        "dar",
        "en",
        "ul",
        "gor",
        "fe",
        "shi",
        "na",
        "bel",
        "tor",
        "qui",
        "as",
        "mun",
        "ze",
        "ri",
        "pol",
        "ha",
        "ost",
        "ny",
        "cle",
        "wa",
        "jo",
        "ix",
    ]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(900)})
    weights = [1.0 / (i + 1) for i in range(len(words))]
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        lines = []
        for _ in range(sentences):
            w = rng.choices(range(len(words)), weights)[0]
            out = []
            for _ in range(rng.randint(6, 14)):
                out.append(words[w])
                w = (w * 7 + 3) % len(words) if rng.random() < 0.6 else rng.choices(range(len(words)), weights)[0]
            lines.append(" ".join(out).capitalize() + ".")
        (folder / f"doc{d}.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """write_corpus's made-up language in 8 documents (tests/test_pretrain.py, test_distill.py, ...)."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "text")
