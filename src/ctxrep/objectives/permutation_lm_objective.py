"""XLNet's permutation language modelling as a trainer objective (Yang et al. 2019, sec. 2.2-2.3).

For each sequence a factorization order z is sampled (`sample_permutation_lm_batch`: special tokens first,
then the context, then the last 1/K of the order as targets), and the query stream predicts the targets:
    L = -1/|T| sum_{t in T} log p(x_{z_t} | x_{z_<t})        (T = the targets of the whole batch)
The order only shapes perm_mask and target_mapping; the input is never permuted. Draws use the global
torch RNG, so the trainer's exact resume covers them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ctxrep.models.xlnet import XLNetConfig, XLNetLMHeadModel
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.permutation_lm import PermutationLMConfig, sample_permutation_lm_batch
from ctxrep.objectives.recipe import CORE_SHAPE, Built, Ingredients, Recipe, full_sentences


class PermutationLMObjective(nn.Module):
    """XLNetLMHeadModel (head tied to the word embeddings) trained on permutation LM.

    special_token_ids: the tokenizer's special tokens (<sep>, <cls>, ...), never predicted and seen by all.
    """

    def __init__(self, config: XLNetConfig, plm: PermutationLMConfig, special_token_ids: tuple[int, ...] = ()) -> None:
        super().__init__()
        if plm.k < 1:
            raise ValueError(f"k={plm.k} must be at least 1 (predict the last 1/k of each factorization order)")
        self.config = config
        self.plm = plm
        self.model = XLNetLMHeadModel(config)
        self.register_buffer("special_ids", torch.tensor(sorted(special_token_ids), dtype=torch.long), persistent=False)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        """batch: input_ids (batch, seq) and attention_mask (batch, seq), padded on the right."""
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        special = torch.isin(input_ids, self.special_ids)  # (batch, seq)
        sampled = sample_permutation_lm_batch(input_ids, self.plm, attention_mask, special)
        out = self.model(**sampled.model_inputs())
        predicted = sampled.labels != -100  # (batch, num_predict)
        metrics = {"plm_loss": float(out.loss.detach()), "predicted_tokens": float(predicted.sum())}
        if bool(predicted.any()):
            hits = out.logits.argmax(-1) == sampled.labels  # (batch, num_predict)
            metrics["plm_accuracy"] = float(hits[predicted].float().mean())
        return ObjectiveOutput(
            loss=out.loss, num_tokens=int(attention_mask.sum()), metrics=metrics, nll=metrics["plm_loss"]
        )

    def save_pretrained(self, path: str | Path) -> None:
        """An XLNetLMHeadModel folder (transformers' AutoModel and ctxrep.load_model load the encoder)."""
        self.model.save_pretrained(path)


# ------------------------------------------------------------------------------------------------- recipe

XLNET_SPECIALS = ("<sep>", "<cls>")


def add_xlnet_template(out: Path) -> None:
    """Give a trained byte-level BPE tokenizer XLNet's specials and template: A <sep> <cls>, A <sep> B <sep> <cls>."""
    from tokenizers import AddedToken, processors
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True) for s in XLNET_SPECIALS])
    sep, cls = (tok.token_to_id(s) for s in XLNET_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)],
    )
    tok.save(str(out / "tokenizer.json"))
    settings_file = out / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    settings.update(sep_token="<sep>", cls_token="<cls>", model_input_names=["input_ids", "attention_mask"])
    settings_file.write_text(json.dumps(settings, indent=2) + "\n")


def xlnet_config(x: Ingredients) -> XLNetConfig:
    """[encoder] onto XLNetConfig (relative positions: no max_position_embeddings), with <s> and </s>."""
    s, backend = x.shape, x.tokenizer.backend
    return XLNetConfig(
        vocab_size=x.vocab_size,
        d_model=s.hidden_size,
        n_layer=s.num_hidden_layers,
        n_head=s.num_attention_heads,
        d_inner=s.intermediate_size,
        ff_activation=s.hidden_act,
        dropout=s.hidden_dropout_prob,
        initializer_range=s.initializer_range,
        layer_norm_eps=s.layer_norm_eps,
        pad_token_id=x.tokenizer.pad_token_id,
        bos_token_id=backend.token_to_id("<s>"),
        eos_token_id=backend.token_to_id("</s>"),
    )


def build_plm(x: Ingredients) -> Built:
    added = x.tokenizer.backend.get_added_tokens_decoder()
    special_ids = tuple(sorted(i for i, t in added.items() if t.special))
    return Built(PermutationLMObjective(xlnet_config(x), x.settings, special_ids), None)  # relative: any length


# XLNet: permutation LM over FULL-SENTENCES rows; byte-level BPE with XLNet's <sep> <cls> template.
PLM = Recipe(
    "plm",
    build_plm,
    PermutationLMConfig,
    (*CORE_SHAPE, "hidden_act", "layer_norm_eps"),
    tokenizer_kinds=("bpe",),
    tokenizer_template=add_xlnet_template,
    template_tokens=len(XLNET_SPECIALS),
    packing=full_sentences,
)
