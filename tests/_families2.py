"""Tiny DeBERTa-v3 and ModernBERT folders laid out as their Hub repositories are (the matrix and hub tests use
them): the model saved by transformers, and each family's own kind of tokenizer files.

    DeBERTa-v3 (microsoft/deberta-v3-base): config.json, pytorch_model.bin (DebertaV2ForMaskedLM's keys: the
        encoder under "deberta.", the MLM head, an unused absolute position table), spm.model (SentencePiece
        unigram; no tokenizer.json), tokenizer_config.json
    ModernBERT (answerdotai/ModernBERT-base): config.json in transformers 4.48's format, model.safetensors
        (ModernBertForMaskedLM's keys under "model."), tokenizer.json (byte-level BPE, no prefix space,
        [CLS] A [SEP]), tokenizer_config.json, special_tokens_map.json
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "the dog runs today .",
    "a cat sleeps often .",
    "this bird runs often .",
    "the child sleeps today .",
    "good great fine nice bad awful poor sad",
    "john lives in paris , mary visited london today",
    "what is the capital ? where was the meeting ?",
    "the weather is nice . paris is the capital of france .",
    "the meeting was in london . the bank approved my loan , the bank gave a loan , the bank of the river",
    "and so on . Héllo wörld, ça va? 東京 🙂",
]

DEBERTA_SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # ids 0-3 as in deberta-v3's spm.model


def deberta_config(vocab_size: int) -> transformers.DebertaV2Config:
    """deberta-v3-base's config.json, shrunk: log buckets, shared keys, LayerNorm-ed relative table."""
    return transformers.DebertaV2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        relative_attention=True,
        position_buckets=8,
        max_relative_positions=-1,
        pos_att_type="p2c|c2p",
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        legacy=False,
    )


def deberta_tokenizer_json(path: Path) -> int:
    """A unigram tokenizer.json with DeBERTa's specials and template; returns the vocabulary size."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        CORPUS * 5, trainers.UnigramTrainer(vocab_size=150, special_tokens=DEBERTA_SPECIALS, unk_token="[UNK]")
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(path / "tokenizer.json"))
    return tok.get_vocab_size()


def deberta_spm(path: Path) -> int:
    """spm.model as DeBERTa-v3 ships it (SentencePiece unigram, [PAD] [CLS] [SEP] [UNK] at 0-3, [MASK] added by
    the tokenizer) and its tokenizer_config.json; returns the vocabulary size transformers' tokenizer reports."""
    import sentencepiece as spm

    text = path / "corpus.txt"
    text.write_text("\n".join(CORPUS * 5) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(path / "spm"),
        vocab_size=80,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="[PAD]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        unk_piece="[UNK]",
        character_coverage=1.0,
        minloglevel=2,
    )
    text.unlink()
    (path / "spm.vocab").unlink()
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "do_lower_case": False,
                "bos_token": "[CLS]",
                "eos_token": "[SEP]",
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "mask_token": "[MASK]",
                "split_by_punct": False,
                "vocab_type": "spm",
                "tokenizer_class": "DebertaV2Tokenizer",
            }
        )
    )
    return len(transformers.AutoTokenizer.from_pretrained(path))


def deberta_dir(path: Path, spm_model: bool = False) -> Path:
    """A tiny DeBERTa-v3: with spm.model as on the Hub, or with a tokenizer.json (no conversion needed)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = deberta_spm(path) if spm_model else deberta_tokenizer_json(path)
    torch.manual_seed(0)
    config = deberta_config(vocab)
    mlm = transformers.DebertaV2ForMaskedLM(config).eval()
    state = {k: v.clone().contiguous() for k, v in mlm.state_dict().items()}
    state["deberta.embeddings.position_embeddings.weight"] = torch.randn(64, 32)  # v3 checkpoints carry one
    config.save_pretrained(path)
    torch.save(state, path / "pytorch_model.bin")
    return path


MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def modernbert_tokenizer(path: Path) -> int:
    """ModernBERT's kind of tokenizer.json: byte-level BPE without a prefix space, [CLS] A [SEP] (pairs
    [CLS] A [SEP] B [SEP]); its tokenizer_config.json and special_tokens_map.json. Returns the vocabulary size."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS * 5,
        trainers.BpeTrainer(
            vocab_size=300,
            min_frequency=1,
            special_tokens=MODERNBERT_SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(path / "tokenizer.json"))
    specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]"}
    specials["unk_token"] = "[UNK]"
    (path / "special_tokens_map.json").write_text(json.dumps(specials))
    (path / "tokenizer_config.json").write_text(
        json.dumps(specials | {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64})
    )
    return tok.get_vocab_size()


def modernbert_dir(path: Path) -> Path:
    """A tiny ModernBERT: 3 layers (global, local, local), a window of +-2, saved as ModernBertForMaskedLM with
    config.json rewritten into the published (transformers 4.48) format."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = modernbert_tokenizer(path)
    ids = Tokenizer.from_file(str(path / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        local_attention=4,
        global_attn_every_n_layers=3,
        pad_token_id=ids.token_to_id("[PAD]"),
        bos_token_id=ids.token_to_id("[CLS]"),
        cls_token_id=ids.token_to_id("[CLS]"),
        eos_token_id=ids.token_to_id("[SEP]"),
        sep_token_id=ids.token_to_id("[SEP]"),
    )
    transformers.ModernBertForMaskedLM(config).save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("layer_types", None)
    cfg.pop("rope_parameters", None)
    cfg |= dict(global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path
