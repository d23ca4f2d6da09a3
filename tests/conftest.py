"""Shared fixtures: the packaged MiniLM model and tiny random models that transformers itself saved."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ctxrep.models.loading import resolve_model_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


@pytest.fixture(autouse=True, scope="session")
def _threads():
    torch.set_num_threads(2)


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
    corpus = ["The quick brown fox jumps over the lazy dog.", "A crane lifted the steel beam.",
              "Contextual word vectors depend on the sentence around the word."] * 20  # fmt: skip
    tok.train_from_iterator(corpus, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])  # fmt: skip
    backend = tok._tokenizer
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    backend.save(str(dst / "tokenizer.json"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Random bert / roberta / electra encoders saved with transformers' save_pretrained (safetensors)."""
    import transformers

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    out = {}
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, **common))
    out["bert"] = tmp_path_factory.mktemp("tiny-bert")
    bert.save_pretrained(out["bert"])
    _copy_bert_tokenizer(out["bert"])

    roberta_cfg = transformers.RobertaConfig(vocab_size=300, max_position_embeddings=66, type_vocab_size=1,
                                             pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)  # fmt: skip
    out["roberta"] = tmp_path_factory.mktemp("tiny-roberta")
    transformers.RobertaModel(roberta_cfg).save_pretrained(out["roberta"])
    _roberta_tokenizer(out["roberta"])

    electra_cfg = transformers.ElectraConfig(vocab_size=30522, embedding_size=16, max_position_embeddings=64, **common)
    out["electra"] = tmp_path_factory.mktemp("tiny-electra")
    transformers.ElectraForPreTraining(electra_cfg).save_pretrained(out["electra"])
    _copy_bert_tokenizer(out["electra"])
    return out
