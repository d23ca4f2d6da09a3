"""A tiny sentence-transformers folder with prompts, saved by sentence-transformers itself (tests that compare
ctxrep's reading of such a folder, prompts included, with the library's)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers


def prompted_st_folder(
    root: Path, tokenizer_from: Path, prompts: dict[str, str], default_prompt_name: str | None = None
) -> Path:
    """`root`/st: a random 2-layer, 32-wide, 64-position BERT (seed 0) with `tokenizer_from`'s tokenizer, mean
    pooling, Normalize and `prompts`."""
    import sentence_transformers as st
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    bert = root / "bert"
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(bert)
    transformers.AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(bert)
    folder = root / "st"
    modules = [Transformer(str(bert)), Pooling(32, pooling_mode="mean"), Normalize()]
    model = st.SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt_name)
    model.save(str(folder))
    return folder
