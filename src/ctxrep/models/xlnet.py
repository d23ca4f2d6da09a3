"""XLNet (Yang et al. 2019) on the Transformer-XL backbone (Dai et al. 2019).

What is different from BERT, in the order the forward pass meets it:
- no absolute position embeddings: every attention score gets a relative-position term computed from
  sinusoidal encodings of the distance i - j and two learned biases (Dai et al. 2019, sec. 3.3);
- a relative segment term: only "same segment or not" is encoded (Yang et al. 2019, sec. 2.5);
- segment-level recurrence: each layer may also attend to cached hidden states of the previous segment
  (`mems`, Dai et al. 2019 sec. 3.2), which are always visible;
- two-stream attention (Yang et al. 2019, sec. 2.3): a content stream h that sees its own token and a
  query stream g that starts from a learned `mask_emb` and sees the position, not the token. `perm_mask`
  says who may see whom (the factorization order); `target_mapping` says which positions the query stream
  predicts. Without `target_mapping` only the content stream runs (fine-tuning / featurizing).

Post-LayerNorm exactly as the reference: x = LN(x + Attn(x)); x = LN(x + FFN(x)); no embedding LayerNorm.

Padding: a content-stream batch without `mems` (featurizing, fine-tuning) whose padding is at least `unpad_from` of
its (batch, seq) grid runs unpadded (modules/unpadding.py): embeddings, the q / k / v and output projections, norms
and feed-forwards on the (tokens, d_model) rows of real tokens, re-padded only around the attention product, whose
relative positions, segment terms and masks stay those of the padded grid (so left padding, as XLNet's tokenizer
pads, works as right padding, as collate pads). The same hidden states at real tokens, 0 at padding, and so are the
returned `mems` (the padded run's hold the padding tokens' states there). With target_mapping (two streams:
pretraining) or mems it runs padded.

Reads top to bottom: config, attention, feed-forward, layer, encoder, LM head, then the loader and saver for
the Hugging Face folder format. Tensors are batch-first, (batch, seq, dim), everywhere, mems included
(transformers keeps XLNet's original (seq, batch, dim) inside and for `mems`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models import folders
from ctxrep.models.encoder import Encoder, check_student_layers, student_widths
from ctxrep.models.folders import CheckpointError
from ctxrep.models.outputs import EncoderOutput
from ctxrep.modules.activations import ACTIVATIONS, check_activation
from ctxrep.modules.init_weights import normal_init
from ctxrep.modules.unpadding import UNPAD_FROM, Unpadding

logger = logging.getLogger(__name__)

ATTN_TYPES = ("bi", "uni")  # "bi": XLNet; "uni": Transformer-XL's causal attention


@dataclass
class XLNetConfig:
    """Everything needed to rebuild the network; field names are those of transformers' config.json."""

    vocab_size: int = 32000
    d_model: int = 1024
    n_layer: int = 24
    n_head: int = 16
    d_inner: int = 4096
    d_head: int | None = None  # always d_model // n_head; None means derive it
    ff_activation: str = "gelu"
    attn_type: str = "bi"
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    mem_len: int | None = 512  # hidden states kept per layer for the next segment; None or 0: keep all
    reuse_len: int | None = None  # only the first reuse_len tokens of a segment go into the memory
    bi_data: bool = False  # second half of the batch uses negated (backward) relative positions
    clamp_len: int = -1  # relative distances beyond +-clamp_len share one encoding; -1: no clamping
    same_length: bool = False  # "uni" only: every token attends to the same number of keys
    pad_token_id: int = 5
    bos_token_id: int = 1
    eos_token_id: int = 2

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_head {self.n_head}")
        if self.d_head is None:
            self.d_head = self.d_model // self.n_head
        if self.d_head != self.d_model // self.n_head:
            raise ValueError(f"d_head {self.d_head} must equal d_model // n_head = {self.d_model // self.n_head}")
        if self.attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type must be one of {ATTN_TYPES}, got {self.attn_type!r}")
        check_activation("ff_activation", self.ff_activation)

    @classmethod
    def from_hf_dict(cls, d: dict) -> XLNetConfig:
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if "vocab_size" not in kwargs and "n_token" in d:  # the name in the original XLNet release
            kwargs["vocab_size"] = d["n_token"]
        for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if kwargs.get(k) is None:
                kwargs.pop(k, None)
        return cls(**kwargs)

    def to_hf_dict(self, architecture: str = "XLNetModel") -> dict:
        return asdict(self) | {"model_type": "xlnet", "architectures": [architecture], "tie_word_embeddings": True}

    def student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> XLNetConfig:
        """A distillation student's config: len(layers) layers; narrower (d_model, d_inner) when hidden_size is."""
        h, inner = student_widths(self.d_model, self.n_head, self.d_inner, hidden_size, intermediate_size)
        return replace(self, n_layer=len(layers), d_model=h, d_inner=inner, d_head=h // self.n_head)


@dataclass
class XLNetOutput(EncoderOutput):
    """EncoderOutput plus what only XLNet has. All tensors batch-first.

    last_hidden_state, hidden_states, attentions: the content stream, as for every ctxrep encoder:
        hidden_states[0] is the word embedding, hidden_states[i] the output of layer i, (batch, seq, d_model);
        attentions[i] is (batch, heads, seq, mem + seq).
    query_*: the query stream, only when target_mapping is given: (batch, num_predict, d_model) per layer and
        attention (batch, heads, num_predict, mem + seq).
    mems: per layer, the hidden states to pass as `mems` with the next segment, (batch, mem, d_model).

    transformers differs here: with target_mapping its last_hidden_state is the query stream and its
    hidden_states interleave the two streams (h0, g0, h1, g1, ...); ctxrep keeps them in separate fields.
    """

    query_last_hidden_state: torch.Tensor | None = None
    query_hidden_states: tuple[torch.Tensor, ...] | None = None
    query_attentions: tuple[torch.Tensor, ...] | None = None
    mems: list[torch.Tensor] | None = None


class RelativeAttention(nn.Module):
    """Two-stream multi-head attention with relative position and segment terms.

    Score of query i for key j (Dai et al. 2019 sec. 3.3, with XLNet's segment term, Yang et al. 2019 sec. 2.5):
        a_ij = [ (q_i + u)^T k_j  +  (q_i + v)^T W_r R_{i-j}  +  (q_i + b)^T s_ij ] / sqrt(d_head)
    u = r_w_bias, v = r_r_bias, b = r_s_bias, R = sinusoidal encoding of the distance i - j,
    s_ij = seg_embed[0] if i and j are in the same segment else seg_embed[1].
    Both streams use the same projections; keys and values always come from the content stream (and mems).
    """

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        d, n, dh = config.d_model, config.n_head, config.d_head
        self.scale = dh**-0.5
        # Projections stored as (d_model, heads, head_dim), the checkpoint's layout.
        self.q = nn.Parameter(torch.empty(d, n, dh))
        self.k = nn.Parameter(torch.empty(d, n, dh))
        self.v = nn.Parameter(torch.empty(d, n, dh))
        self.o = nn.Parameter(torch.empty(d, n, dh))
        self.r = nn.Parameter(torch.empty(d, n, dh))
        self.r_w_bias = nn.Parameter(torch.empty(n, dh))
        self.r_r_bias = nn.Parameter(torch.empty(n, dh))
        self.r_s_bias = nn.Parameter(torch.empty(n, dh))
        self.seg_embed = nn.Parameter(torch.empty(2, n, dh))
        self.layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def scores_to_output(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_r: torch.Tensor,
        rel_index: torch.Tensor,
        seg_diff: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (batch, qlen, heads, head_dim); k, v: (batch, klen, heads, head_dim);
        k_r: (batch or 1, num_distances, heads, head_dim), one row per relative distance;
        rel_index: (qlen, klen), which row of k_r holds the distance of (i, j);
        seg_diff: (batch, qlen, klen), 1 where i and j are in different segments;
        mask: (batch, qlen, klen), True = may not attend.
        """
        b, i, n, _ = q.shape
        j = k.shape[1]
        content = torch.einsum("bind,bjnd->bnij", q + self.r_w_bias, k)  # (batch, heads, qlen, klen)
        # Position term for every (query, distance) pair, then pick each key's distance.
        position = torch.einsum("bind,bpnd->bnip", q + self.r_r_bias, k_r)  # (batch, heads, qlen, num_distances)
        position = position.gather(3, rel_index.expand(b, n, i, j))  # (batch, heads, qlen, klen)
        scores = content + position
        if seg_diff is not None:
            # Score against "same segment" and "different segment", then pick per key.
            segment = torch.einsum("bind,snd->bnis", q + self.r_s_bias, self.seg_embed)  # (batch, heads, qlen, 2)
            scores = scores + segment.gather(3, seg_diff[:, None].expand(b, n, i, j))  # (batch, heads, qlen, klen)
        scores = scores * self.scale
        if mask is not None:
            # The most negative finite value (the reference subtracts 1e30): a row with every key hidden
            # becomes a uniform distribution, as in the reference, not NaN.
            scores = scores.masked_fill(mask[:, None], torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        out = torch.einsum("bnij,bjnd->bind", self.dropout(probs), v)  # (batch, qlen, heads, head_dim)
        return out, probs

    def project_out(self, x: torch.Tensor, attended: torch.Tensor, unpadding: Unpadding | None = None) -> torch.Tensor:
        """Post-norm residual: LN(x + attended W_o). With `unpadding`, x is (tokens, d_model) and only the real
        tokens' rows of attended (batch, qlen, heads, head_dim) are projected."""
        if unpadding is not None:
            out = torch.einsum("ind,hnd->ih", unpadding.unpad(attended), self.o)  # (tokens, d_model)
        else:
            out = torch.einsum("bind,hnd->bih", attended, self.o)  # (batch, qlen, d_model)
        return self.layer_norm(x + self.dropout(out))

    def forward(
        self,
        h: torch.Tensor,
        g: torch.Tensor | None,
        mask_h: torch.Tensor | None,
        mask_g: torch.Tensor | None,
        pos_emb: torch.Tensor,
        rel_index: torch.Tensor,
        seg_diff: torch.Tensor | None,
        mem: torch.Tensor | None,
        target_mapping: torch.Tensor | None,
        unpadding: Unpadding | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """h: (batch, seq, d_model); g: (batch, num_predict, d_model) or None; mem: (batch, mlen, d_model) or None.
        With `unpadding` (no g, no mem), h is (tokens, d_model): q, k, v are projected from the real tokens and
        re-padded (zeros, which mask_h hides from every real query) for the scores."""
        if unpadding is not None:
            q_h, k, v = (unpadding.pad(torch.einsum("jh,hnd->jnd", h, w)) for w in (self.q, self.k, self.v))
        else:
            keys = h if mem is None else torch.cat([mem, h], dim=1)  # (batch, mlen + seq, d_model)
            k = torch.einsum("bjh,hnd->bjnd", keys, self.k)  # (batch, klen, heads, head_dim)
            v = torch.einsum("bjh,hnd->bjnd", keys, self.v)  # (batch, klen, heads, head_dim)
            q_h = torch.einsum("bih,hnd->bind", h, self.q)  # (batch, seq, heads, head_dim)
        k_r = torch.einsum("bph,hnd->bpnd", pos_emb, self.r)  # (batch or 1, num_distances, heads, head_dim)

        # Content stream: h_i attends to what mask_h allows, always including itself.
        out_h, probs_h = self.scores_to_output(q_h, k, v, k_r, rel_index, seg_diff, mask_h)
        h_new = self.project_out(h, out_h, unpadding)
        if g is None:
            return h_new, None, probs_h, None

        # Query stream: put each prediction's query at its position (target_mapping), attend with mask_g,
        # which hides the position's own token, then gather the results back per prediction.
        q_g = torch.einsum("bmh,hnd->bmnd", g, self.q)  # (batch, num_predict, heads, head_dim)
        q_g = torch.einsum("bmnd,bmi->bind", q_g, target_mapping)  # (batch, seq, heads, head_dim)
        out_g, probs_g = self.scores_to_output(q_g, k, v, k_r, rel_index, seg_diff, mask_g)
        out_g = torch.einsum("bind,bmi->bmnd", out_g, target_mapping)  # (batch, num_predict, heads, head_dim)
        probs_g = torch.einsum("bnij,bmi->bnmj", probs_g, target_mapping)  # (batch, heads, num_predict, klen)
        g_new = self.project_out(g, out_g)
        return h_new, g_new, probs_h, probs_g


class FeedForward(nn.Module):
    """Post-norm residual feed-forward: LN(x + W_2 act(W_1 x))."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.layer_1 = nn.Linear(config.d_model, config.d_inner)
        self.layer_2 = nn.Linear(config.d_inner, config.d_model)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.activation = ACTIVATIONS[config.ff_activation]
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(self.layer_2(self.dropout(self.activation(self.layer_1(x)))))
        return self.layer_norm(x + y)


class XLNetLayer(nn.Module):
    """One block; both streams share the attention weights and the feed-forward."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.attention = RelativeAttention(config)
        self.ff = FeedForward(config)

    def forward(self, h, g, mask_h, mask_g, pos_emb, rel_index, seg_diff, mem, target_mapping, unpadding=None):
        """As RelativeAttention; h: (batch, seq, d_model), or (tokens, d_model) with `unpadding`."""
        h, g, probs_h, probs_g = self.attention(
            h, g, mask_h, mask_g, pos_emb, rel_index, seg_diff, mem, target_mapping, unpadding
        )
        h = self.ff(h)
        if g is not None:
            g = self.ff(g)
        return h, g, probs_h, probs_g


class XLNetModel(Encoder):
    """The encoder. `forward` takes transformers' XLNetModel arguments; outputs are batch-first (see XLNetOutput)."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, config.d_model))  # query stream input: "a position, no token"
        self.layers = nn.ModuleList(XLNetLayer(config) for _ in range(config.n_layer))
        self.dropout = nn.Dropout(config.dropout)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        normal_init(module, std)
        if isinstance(module, RelativeAttention):
            for p in (module.q, module.k, module.v, module.o, module.r):
                nn.init.normal_(p, std=std)
            for p in (module.r_w_bias, module.r_r_bias, module.r_s_bias, module.seg_embed):
                nn.init.normal_(p, std=std)
        elif isinstance(module, XLNetModel):
            nn.init.normal_(module.mask_emb, std=std)

    # ---- the encoder interface (models/encoder.py) ----
    config_fields = {"num_layers": "n_layer", "num_heads": "n_head", "hidden_size": "d_model"}
    embedding_table = "word_embedding"
    family = "xlnet"
    # the projections LoRA adapts by default (Encoder.adapter_targets): the feed-forward's; attention's q, k, v, o
    # are raw (d_model, heads, head_dim) parameter tensors, as in the checkpoint, not nn.Linear modules
    adapter_targets = ("ff.layer_1", "ff.layer_2")
    # Relative positions have no table to run out of; windows of 512 pieces (XLNet's pretraining length) keep
    # memory bounded and inputs in the length range the model was trained on.
    WINDOW = 512

    @property
    def max_tokens(self) -> int:
        return self.WINDOW

    # Encoder.unpadding (content stream, no mems): BERT's share; benchmarks/unpad.py (XLNet-base, 8 x 128, 1 thread):
    # 1.08x at 10% padding
    unpad_from = UNPAD_FROM

    def layer_of(self, name: str) -> int:
        """word_embedding and mask_emb (the query stream's input) 0; layers.i.* i + 1."""
        parts = name.split(".")
        if parts[0] in ("word_embedding", "mask_emb"):
            return 0
        if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) < self.num_layers:
            return int(parts[1]) + 1
        raise self.unknown_parameter(name)

    can_distill = True

    def init_student(
        self, layers: Sequence[int], hidden_size: int | None = None, intermediate_size: int | None = None
    ) -> XLNetModel:
        """A student XLNetModel (XLNetConfig.student): of this width, word_embedding, mask_emb and layers[j] as
        layer j copied; narrower, freshly initialised (the global torch RNG)."""
        layers = check_student_layers(layers, self.num_layers)
        student = XLNetModel(self.config.student(layers, hidden_size, intermediate_size))
        if student.config.d_model == self.config.d_model:
            student.word_embedding.load_state_dict(self.word_embedding.state_dict())
            with torch.no_grad():
                student.mask_emb.copy_(self.mask_emb)
            for j, i in enumerate(layers):
                student.layers[j].load_state_dict(self.layers[i].state_dict())
        return student.train(self.training)

    # ---- masks and positions --------------------------------------------------------------------

    def attention_masks(
        self,
        batch: int,
        qlen: int,
        mlen: int,
        attention_mask: torch.Tensor | None,
        perm_mask: torch.Tensor | None,
        device: torch.device,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(content-stream mask, query-stream mask), each (batch, qlen, mlen + qlen), True = may not attend.

        The query stream obeys perm_mask and padding; the content stream the same except that it always sees
        its own token (the one difference between the two streams of sec. 2.3: z<=t versus z<t).
        Memory positions are always visible (except to the right of the diagonal for attn_type "uni").
        """
        klen = mlen + qlen
        hidden = None
        if self.config.attn_type == "uni":
            i = torch.arange(qlen, device=device)[:, None]
            j = torch.arange(klen, device=device)[None, :]
            causal = j > mlen + i  # (qlen, klen): future tokens
            if self.config.same_length:
                causal = causal | (j < i)  # every token sees exactly mlen + 1 keys
            hidden = causal.expand(batch, qlen, klen)
        data = None
        if attention_mask is not None:
            data = ~attention_mask.bool()[:, None, :].expand(batch, qlen, qlen)  # (batch, qlen, qlen): padded keys
        if perm_mask is not None:
            data = perm_mask.bool() if data is None else data | perm_mask.bool()
        if data is not None:
            data = F.pad(data, (mlen, 0), value=False)  # (batch, qlen, klen): memory is visible
            hidden = data if hidden is None else hidden | data
        if hidden is None:
            return None, None
        itself = F.pad(torch.eye(qlen, dtype=torch.bool, device=device), (mlen, 0), value=False)  # (qlen, klen)
        return hidden & ~itself, hidden

    def relative_positions(
        self, batch: int, qlen: int, klen: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sinusoidal encodings of every distance from klen down to -qlen + 1 and, for each (query i, key j),
        the row holding distance (mlen + i) - j.

        Returns pos_emb (batch or 1, klen + qlen, d_model) and rel_index (qlen, klen).
        R_d = [sin(d * f_k), cos(d * f_k)], f_k = 1 / 10000^(2k / d_model) (Vaswani et al. 2017, sec. 3.5).
        """
        d = self.config.d_model
        distances = torch.arange(klen, -qlen, -1, device=device).float()  # row p holds distance klen - p
        clamp = self.config.clamp_len
        inv_freq = 1.0 / torch.pow(10000, torch.arange(0, d, 2, device=device).float() / d)  # (d_model / 2,)

        def encode(dist: torch.Tensor) -> torch.Tensor:
            if clamp > 0:
                dist = dist.clamp(-clamp, clamp)
            angles = dist[:, None] * inv_freq[None, :]  # (num_distances, d_model / 2)
            return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (num_distances, d_model)

        if self.config.bi_data:
            # First half of the batch reads left to right, second half right to left (negated distances).
            if batch % 2:
                raise ValueError(
                    f"bi_data=True splits the batch into a forward and a backward half, but the batch has {batch} "
                    "sequences; pass an even batch or set bi_data=False in the config"
                )
            fwd, bwd = encode(distances), encode(-distances)
            pos_emb = torch.cat([fwd.expand(batch // 2, -1, -1), bwd.expand(batch // 2, -1, -1)])  # (batch, P, d)
        else:
            pos_emb = encode(distances)[None]  # (1, P, d_model)
        i = torch.arange(qlen, device=device)[:, None]
        j = torch.arange(klen, device=device)[None, :]
        # distance (mlen + i) - j sits at row p = klen - distance = qlen - i + j
        rel_index = qlen - i + j  # (qlen, klen)
        return self.dropout(pos_emb.to(self.word_embedding.weight.dtype)), rel_index  # computed in float32

    def update_mems(self, h: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        """Memory for the next segment (Dai et al. 2019 sec. 3.2: [SG(h_{tau-1}) ; h_tau], no gradient)."""
        if self.config.reuse_len:
            h = h[:, : self.config.reuse_len]
        mem = h if prev is None else torch.cat([prev, h], dim=1)  # (batch, mlen + seq, d_model)
        if self.config.mem_len:
            mem = mem[:, -self.config.mem_len :]
        return mem.detach()

    # ---- forward ---------------------------------------------------------------------------------

    def _check_inputs(self, input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        for name, x, shape in (
            ("attention_mask", attention_mask, (b, t)),
            ("token_type_ids", token_type_ids, (b, t)),
            ("perm_mask", perm_mask, (b, t, t)),
        ):
            if x is not None and tuple(x.shape) != shape:
                raise ValueError(f"{name} must have shape {shape} to match input_ids, got {tuple(x.shape)}")
        if target_mapping is not None and (
            target_mapping.dim() != 3 or target_mapping.shape[0] != b or target_mapping.shape[2] != t
        ):
            raise ValueError(
                f"target_mapping must have shape (batch={b}, num_predict, seq={t}), got {tuple(target_mapping.shape)}"
            )
        if mems is not None:
            if len(mems) != self.config.n_layer:
                raise ValueError(
                    f"mems must hold one tensor per layer ({self.config.n_layer}), got {len(mems)}; "
                    "pass the `mems` returned by the previous call unchanged"
                )
            for i, m in enumerate(mems):
                if m.dim() != 3 or (m.shape[0], m.shape[2]) != (b, self.config.d_model) or m.shape != mems[0].shape:
                    raise ValueError(
                        f"mems[{i}] must have shape (batch={b}, mem_len, d_model={self.config.d_model}) like every "
                        f"other layer's, got {tuple(m.shape)}; ctxrep's mems are batch-first (transformers' are "
                        "(mem_len, batch, d_model): transpose(0, 1) them)"
                    )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        num_layers: int | None = None,
        padded: bool = False,
    ) -> XLNetOutput:
        """input_ids, attention_mask (1 = real token), token_type_ids: (batch, seq);
        perm_mask: (batch, seq, seq), perm_mask[b, i, j] = 1: i may not attend to j;
        target_mapping: (batch, num_predict, seq), one-hot row per prediction; mems: from the previous segment.
        `num_layers` stops after that many layers.

        A content-stream batch without mems and with much padding (`Encoder.unpadding`) runs unpadded: its hidden
        states (and the mems it returns) are those of the padded run at real tokens and 0 at padding.
        """
        self._check_inputs(input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems)
        b, t = input_ids.shape
        device = input_ids.device
        mlen = mems[0].shape[1] if mems else 0
        klen = mlen + t
        dtype = self.word_embedding.weight.dtype

        mask_h, mask_g = self.attention_masks(b, t, mlen, attention_mask, perm_mask, device)
        pos_emb, rel_index = self.relative_positions(b, t, klen, device)
        seg_diff = None
        if token_type_ids is not None:
            # Memory counts as segment 0, as in the reference implementation.
            key_types = F.pad(token_type_ids, (mlen, 0), value=0)  # (batch, klen)
            seg_diff = (token_type_ids[:, :, None] != key_types[:, None, :]).long()  # (batch, seq, klen)

        # Masks, positions and segments above are on the padded grid; only the content stream's per-token work
        # is unpadded, and only without a memory or a query stream (which read the padded grid).
        unpadding = self.unpadding(attention_mask, padded) if target_mapping is None and not mems else None
        if unpadding is not None:
            input_ids = unpadding.select(input_ids)  # (tokens,)
        h = self.dropout(self.word_embedding(input_ids))  # (batch, seq, d_model) or (tokens, d_model)
        g = None
        if target_mapping is not None:
            target_mapping = target_mapping.to(dtype)
            g = self.dropout(self.mask_emb.expand(b, target_mapping.shape[1], -1))  # (batch, num_predict, d_model)

        hidden_states, query_states, attentions, query_attentions = [h], [g], [], []
        for i, layer in enumerate(self.layers[: num_layers if num_layers is not None else len(self.layers)]):
            mem = mems[i] if mems else None
            h, g, probs_h, probs_g = layer(
                h, g, mask_h, mask_g, pos_emb, rel_index, seg_diff, mem, target_mapping, unpadding
            )
            hidden_states.append(h)
            query_states.append(g)
            attentions.append(probs_h)
            query_attentions.append(probs_g)
        if unpadding is not None:  # every layer's input is also its memory: pad them all
            hidden_states = [unpadding.pad(x) for x in hidden_states]  # each (batch, seq, d_model)
            h = hidden_states[-1]
        # each layer caches its input
        new_mems = [self.update_mems(x, mems[i] if mems else None) for i, x in enumerate(hidden_states[:-1])]

        two_streams = target_mapping is not None
        return XLNetOutput(
            last_hidden_state=self.dropout(h),
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            query_last_hidden_state=self.dropout(g) if two_streams else None,
            query_hidden_states=tuple(query_states) if output_hidden_states and two_streams else None,
            query_attentions=tuple(query_attentions) if output_attentions and two_streams else None,
            mems=new_mems,
        )

    # ---- Hugging Face folder format: the Encoder base's loader and saver over these declarations ----------
    # An XLNetModel folder, or XLNetLMHeadModel etc. (the encoder under 'transformer.'; heads are not loaded).

    config_class = XLNetConfig
    checkpoint = folders.CheckpointLayout(
        ("xlnet",),
        what="an XLNet encoder",
        prefix="transformer.",
        head_prefixes=(
            "lm_loss.",
            "sequence_summary.",
            "logits_proj.",
            "classifier.",
            "qa_outputs.",
            "start_logits.",
            "end_logits.",
            "answer_class.",
        ),
        hint="Check that config.json (n_layer, d_model, n_head, vocab_size, d_inner) matches the weights",
    )

    def checkpoint_names(self) -> dict[str, str]:
        return hf_parameter_names(self.config)

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """The Encoder base's loading of weights named as in transformers, with or without 'transformer.'."""
        super().load_hf_state_dict(_strip_prefix(state), source)


@dataclass
class XLNetLMOutput:
    """logits: (batch, num_predict, vocab) with target_mapping, else (batch, seq, vocab); loss when labels given.
    The other fields are those of XLNetOutput."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    query_hidden_states: tuple[torch.Tensor, ...] | None = None
    query_attentions: tuple[torch.Tensor, ...] | None = None


class XLNetLMHeadModel(nn.Module):
    """The encoder plus the pre-training head: logits = x E^T + b, E the (tied) word embedding.

    x is the query stream when target_mapping is given (Yang et al. 2019 sec. 2.3:
    p(x_zt = x | x_z<t) proportional to exp(e(x)^T g_zt)), else the content stream. The loss is the mean cross-entropy over labels != -100.
    """

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = XLNetModel(config)
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size))

    @property
    def num_layers(self) -> int:
        return self.transformer.num_layers

    @property
    def hidden_size(self) -> int:
        return self.transformer.hidden_size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> XLNetLMOutput:
        """labels: (batch, num_predict) with target_mapping, else (batch, seq); -100 = no loss."""
        out = self.transformer(
            input_ids,
            attention_mask,
            token_type_ids,
            perm_mask,
            target_mapping,
            mems,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        x = out.query_last_hidden_state if target_mapping is not None else out.last_hidden_state
        logits = F.linear(x, self.transformer.word_embedding.weight, self.lm_bias)  # (batch, n, vocab)
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:2]:
                raise ValueError(
                    f"labels must have shape {tuple(logits.shape[:2])} (one per "
                    f"{'prediction in target_mapping' if target_mapping is not None else 'token'}), "
                    f"got {tuple(labels.shape)}"
                )
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return XLNetLMOutput(
            loss=loss,
            logits=logits,
            mems=out.mems,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            query_hidden_states=out.query_hidden_states,
            query_attentions=out.query_attentions,
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> XLNetLMHeadModel:
        path = Path(path)
        config, state = _read_folder(path)
        model = cls(config)
        model.load_hf_state_dict(state, source=str(path))
        model.eval()
        return model

    def load_hf_state_dict(self, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        state = _strip_prefix(state)
        if "lm_loss.bias" not in state:
            raise CheckpointError(
                f"{source}: cannot load as XLNetLMHeadModel: the checkpoint has no LM head (lm_loss.bias); it holds "
                "an encoder only: load it with XLNetModel.from_pretrained"
            )
        # The head's weight is the word embedding (tied); older checkpoints store a copy of it.
        head_weight = state.pop("lm_loss.weight", None)
        if head_weight is not None and "word_embedding.weight" in state:
            emb = state["word_embedding.weight"]
            if head_weight.shape != emb.shape or not torch.equal(head_weight, emb):
                raise CheckpointError(
                    f"{source}: lm_loss.weight differs from word_embedding.weight, but XLNet's LM head is tied to "
                    "the word embedding; this checkpoint has an untied head that ctxrep cannot represent"
                )
        names = _lm_parameter_names(self.config)
        layout = XLNetModel.checkpoint
        folders.load_named_weights(
            self, state, names, source, "an XLNet LM head model", outside=layout.head_prefixes, hint=layout.hint
        )

    def save_pretrained(self, path: str | Path) -> None:
        """Write config.json + model.safetensors that transformers' XLNetLMHeadModel loads (and XLNetModel)."""
        names = {"transformer." + hf: "transformer." + our for hf, our in hf_parameter_names(self.config).items()}
        names["lm_loss.bias"] = "lm_bias"
        folders.write_folder(path, self.config.to_hf_dict("XLNetLMHeadModel"), folders.named_tensors(self, names))


# ---- name maps and file helpers -----------------------------------------------------------------


def hf_parameter_names(config: XLNetConfig) -> dict[str, str]:
    """transformers' XLNetModel name -> ctxrep's name, for every weight of the encoder."""
    names = {"word_embedding.weight": "word_embedding.weight", "mask_emb": "mask_emb"}
    attention = (
        "q",
        "k",
        "v",
        "o",
        "r",
        "r_r_bias",
        "r_s_bias",
        "r_w_bias",
        "seg_embed",
        "layer_norm.weight",
        "layer_norm.bias",
    )
    ff = ("layer_norm.weight", "layer_norm.bias", "layer_1.weight", "layer_1.bias", "layer_2.weight", "layer_2.bias")
    for i in range(config.n_layer):
        names |= {f"layer.{i}.rel_attn.{p}": f"layers.{i}.attention.{p}" for p in attention}
        names |= {f"layer.{i}.ff.{p}": f"layers.{i}.ff.{p}" for p in ff}
    return names


def _lm_parameter_names(config: XLNetConfig) -> dict[str, str]:
    """Names after stripping 'transformer.': the encoder's, plus the head's bias (its weight is tied)."""
    names = {hf: "transformer." + our for hf, our in hf_parameter_names(config).items()}
    return names | {"lm_loss.bias": "lm_bias"}


def _strip_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """XLNetLMHeadModel etc. store the encoder under 'transformer.'; XLNetModel under ''."""
    return folders.without_prefix(state, "transformer.")


def _read_folder(path: Path) -> tuple[XLNetConfig, dict[str, torch.Tensor]]:
    hf_config = folders.read_config(path, XLNetModel.checkpoint.model_types)
    with folders.config_errors(path):
        config = XLNetConfig.from_hf_dict(hf_config)
    return config, folders.read_state_dict(path)
