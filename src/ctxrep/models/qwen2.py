"""Qwen2 (Yang et al. 2024, "Qwen2 Technical Report"): the Llama network (models/llama.py) with biases on the
query, key and value projections (none on the output projection), SwiGLU, RMSNorm, rotary positions (theta
1,000,000) and grouped-query attention. gte-Qwen2-instruct and many embedding models are Qwen2 folders.

Sliding windows: with use_sliding_window, the layers from max_window_layers up attend within sliding_window tokens
(transformers' rule); the published models leave it off. Everything else, loading and saving included, is
LlamaModel's.
"""

from __future__ import annotations

from ctxrep.models.llama import FULL, SLIDING, LlamaModel


def qwen_layer_types(d: dict) -> dict:
    """Qwen2 / Qwen3's windows: layer_types as saved by transformers 5, else from use_sliding_window and
    max_window_layers; sliding_window only when used."""
    window = d.get("sliding_window") if d.get("use_sliding_window") else None
    n = d.get("num_hidden_layers", 32)
    types = d.get("layer_types") or [
        SLIDING if window and i >= d.get("max_window_layers", 28) else FULL for i in range(n)
    ]
    return {"sliding_window": window if SLIDING in types else None, "layer_types": types}


def qwen2_layout(d: dict) -> dict:
    return {"qkv_bias": True, "o_bias": False, "qk_norm": False} | qwen_layer_types(d)


class Qwen2Model(LlamaModel):
    MODEL_TYPES = ("qwen2",)
    layout = staticmethod(qwen2_layout)
