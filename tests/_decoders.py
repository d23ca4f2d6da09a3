"""Tiny decoder LLM folders (Qwen3, Qwen2, Llama, Mistral, Gemma 3, EmbeddingGemma) as transformers saves them, with a
Qwen-style byte-level BPE tokenizer (a regex split, then bytes; no prefix space; <|endoftext|> appended): shared by
tests/test_decoders.py and tests/test_matrix.py. Built offline from random weights."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Qwen2 / Qwen3's tokenizer.json pre-tokenizer pattern (GPT-4's, with single digits).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS = "<|endoftext|>"
TEXT = [
    "The quick brown fox jumps over the lazy dog .",
    "A crane lifted the steel beam onto the roof .",
    "john lives in paris , mary visited london today : good great fine nice , bad awful poor sad .",
    "café naïve 東京 タワー 🙂 emoji , the dog runs today often .",
] * 20

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
# model_type -> (transformers model class, config class, config keys beyond TINY)
FAMILIES = {
    "qwen3": ("Qwen3Model", "Qwen3Config", dict(head_dim=16, max_position_embeddings=128)),
    "qwen2": ("Qwen2Model", "Qwen2Config", dict(max_position_embeddings=128)),
    "llama": ("LlamaModel", "LlamaConfig", dict(max_position_embeddings=128)),
    "mistral": ("MistralModel", "MistralConfig", dict(max_position_embeddings=128, sliding_window=5)),
    "gemma3_text": (
        "Gemma3TextModel",
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            max_position_embeddings=128,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=12,
        ),
    ),
}


def qwen_tokenizer(path: Path, vocab_size: int = 400) -> int:
    """tokenizer.json in Qwen's layout, trained on TEXT; returns the vocabulary size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        TEXT,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS}:0", pair=f"$A:0 $B:1 {EOS}:1", special_tokens=[(EOS, tok.token_to_id(EOS))]
    )
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return tok.get_vocab_size()


def hf_config(model_type: str, vocab_size: int = 400, **extra):
    _, config_class, keys = FAMILIES[model_type]
    return getattr(transformers, config_class)(vocab_size=vocab_size, **TINY, **(keys | extra))


def hf_model(model_type: str, vocab_size: int = 400, seed: int = 0, causal_lm: bool = False, **extra):
    """A random transformers model of the family (norm gains randomised too, so that they matter in parity)."""
    model_class = FAMILIES[model_type][0]
    if causal_lm:
        model_class = (
            "Gemma3ForCausalLM" if model_type == "gemma3_text" else model_class.replace("Model", "ForCausalLM")
        )
    config = hf_config(model_type, vocab_size, **extra)
    config._attn_implementation = "eager"  # attention maps come back from eager only
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if model_type == "gemma3_text" else 1.0, 0.3)
    return model


def tiny_folder(path: Path, model_type: str, **extra) -> Path:
    """A folder with the tokenizer and a random model of the family, as transformers saves them."""
    vocab = qwen_tokenizer(path)
    hf_model(model_type, vocab, **extra).save_pretrained(path)
    return path
