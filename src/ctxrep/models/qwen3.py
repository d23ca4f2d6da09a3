"""Qwen3 (Yang et al. 2025, "Qwen3 Technical Report", sec. 2): the Llama network (models/llama.py) with an RMSNorm
over each attention head's query and key before the rotary turn (QK-norm, in place of Qwen2's q/k/v biases),
grouped-query attention, SwiGLU and rotary positions (theta 1,000,000). Qwen3-Embedding (0.6B / 4B / 8B) and
Qwen3-Reranker are Qwen3 folders: the embedding models as the bare decoder, the rerankers with their LM head
(`lm_logits` of the "yes" and "no" tokens).

Sliding windows follow Qwen2's rule (models/qwen2.py); the published models do not use them. Loading and saving
are LlamaModel's.
"""

from __future__ import annotations

from ctxrep.models.llama import LlamaModel
from ctxrep.models.qwen2 import qwen_layer_types


def qwen3_layout(d: dict) -> dict:
    bias = bool(d.get("attention_bias", False))
    return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True} | qwen_layer_types(d)


class Qwen3Model(LlamaModel):
    MODEL_TYPES = ("qwen3",)
    layout = staticmethod(qwen3_layout)
