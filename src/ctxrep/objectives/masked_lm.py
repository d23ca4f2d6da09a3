"""Masked language modelling (Devlin et al. 2019, sec. 3.1 Task #1; Liu et al. 2019, sec. 4.1).

Select about mask_prob of each sequence's real, non-special tokens; the model sees the selected tokens
replaced by [MASK] (80%), by a random token (10%) or unchanged (10%), and is trained with
    L_MLM = -1/|M| sum_{i in M} log p(x_i | x_masked)           (M = the selected positions)
The decoder is computed at the selected positions only: the hidden states of M are gathered first and
projected to the vocabulary afterwards, so no (batch, seq, vocab) tensor is ever built.

Selection follows BERT's create_pretraining_data: exactly max(1, round(mask_prob * n)) of a sequence's n
candidate tokens. With whole-word masking, words (all their pieces) are taken in a random order while the
total stays within that count; the first word is always taken, even if it alone is longer.

Static masking (BERT: masks made once, `dupe_factor` copies of each sequence) vs dynamic (RoBERTa: a fresh mask
every time): with `static_copies=N`, each time a sequence is seen one of its N fixed masks is chosen at random;
mask c of a sequence is drawn from a generator seeded by (seed, c, the sequence's tokens), so it is the same in
every epoch, run and process without storing anything.

The head is BERT's cls.predictions (RoBERTa's lm_head): dense, activation, LayerNorm, then a decoder whose weight
is the input word embedding matrix (tied) plus a bias per token.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.data.corpus import PackedCorpus
from ctxrep.data.packing import SegmentPairConfig, SegmentPairPacker
from ctxrep.models.bert import BertConfig, BertModel, hf_parameter_names
from ctxrep.models.folders import write_folder
from ctxrep.models.mlm_head import MaskedLMHead, head_tensors  # noqa: F401 (also imported from here)
from ctxrep.objectives.next_sentence import NextSentenceHead, next_sentence_loss
from ctxrep.objectives.output import ObjectiveOutput
from ctxrep.objectives.recipe import Built, Ingredients, Packing, PretrainError, Recipe, Shape, full_sentences
from ctxrep.text.tokenizer import Tokenizer, TokenizerError

IGNORE_INDEX = -100  # label of positions that are not predicted (F.cross_entropy's ignore_index)


@dataclass
class MaskedLMConfig:
    """How tokens are selected and corrupted.

    Of the selected tokens, replace_prob become mask_token_id, random_prob a uniformly random token, and the rest
    (1 - replace_prob - random_prob) stay unchanged. mask_token_id / special_token_ids are the tokenizer's: use
    `MaskedLMConfig.from_tokenizer(tokenizer)` to fill them in. Padding is never selected either.
    """

    mask_prob: float = 0.15
    replace_prob: float = 0.8
    random_prob: float = 0.1
    whole_word: bool = False
    static_copies: int | None = None  # None: dynamic masking (RoBERTa); N: one of N fixed masks (BERT's dupe_factor)
    seed: int = 0  # of the static masks
    mask_token_id: int | None = None
    special_token_ids: tuple[int, ...] = ()

    @property
    def keep_prob(self) -> float:
        return 1.0 - self.replace_prob - self.random_prob

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, **kwargs) -> MaskedLMConfig:
        """A config with the tokenizer's mask token and special tokens; other fields from kwargs."""
        added = tokenizer.backend.get_added_tokens_decoder()  # id -> AddedToken
        specials = tuple(sorted(i for i, tok in added.items() if tok.special))
        masks = [i for i in specials if added[i].content in ("[MASK]", "<mask>")]
        if not masks:
            raise TokenizerError(
                "the tokenizer has no special mask token ([MASK] or <mask>); masked-LM pretraining needs one: "
                "train the tokenizer with it, or set MaskedLMConfig.mask_token_id yourself"
            )
        return cls(mask_token_id=masks[0], special_token_ids=specials, **kwargs)

    def check(self, vocab_size: int) -> None:
        """Raise ValueError, naming the field, for settings that cannot work with this vocabulary."""
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {self.mask_prob}")
        if self.replace_prob < 0 or self.random_prob < 0 or self.replace_prob + self.random_prob > 1.0 + 1e-9:
            raise ValueError(
                f"replace_prob ({self.replace_prob}) and random_prob ({self.random_prob}) must be >= 0 and sum to "
                "at most 1 (the rest of the selected tokens are kept unchanged)"
            )
        if self.static_copies is not None and self.static_copies < 1:
            raise ValueError(f"static_copies must be None (dynamic masking) or at least 1, got {self.static_copies}")
        if self.mask_token_id is None:
            raise ValueError(
                "MaskedLMConfig.mask_token_id is not set; build the config with "
                "MaskedLMConfig.from_tokenizer(tokenizer)"
            )
        if not 0 <= self.mask_token_id < vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary of {vocab_size} tokens")


def word_start_table(tokenizer: Tokenizer) -> torch.Tensor:
    """(vocab,) bool: True for pieces that begin a word (and for special tokens), for whole-word masking.

    WordPiece marks continuations with '##' (its continuing_subword_prefix); byte-level BPE marks word starts with
    'Ġ' (a space), SentencePiece with '▁'.
    """
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)  # token -> id
    table = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    continuation = getattr(tokenizer.backend.model, "continuing_subword_prefix", None)
    if type(tokenizer.backend.model).__name__ == "WordPiece" and continuation:
        for token, i in vocab.items():
            table[i] = not token.startswith(continuation)
    else:
        marker = next((m for m in ("Ġ", "▁") if any(t.startswith(m) for t in vocab)), None)
        if marker is None:
            raise TokenizerError(
                "cannot tell word-initial pieces in this tokenizer (no '##' continuations, no 'Ġ' or '▁' word "
                "starts); use whole_word=False"
            )
        for token, i in vocab.items():
            table[i] = token.startswith(marker)
    for i, _tok in tokenizer.backend.get_added_tokens_decoder().items():
        table[i] = True
    return table


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    vocab_size: int,
    mask_token_id: int,
    config: MaskedLMConfig,
    generator: torch.Generator | None = None,
    word_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select and corrupt tokens; returns (masked_input_ids, labels), both (batch, seq).

    special_tokens_mask: (batch, seq), nonzero at special tokens AND padding (never selected).
    word_starts: (batch, seq) bool, True where a piece begins a word; needed when config.whole_word.
    labels hold the original token at the selected positions and -100 elsewhere. Random draws come from
    `generator` (the global torch RNG when None); the draws depend only on the batch's shape.
    config.static_copies is not used here (see MaskedLMObjective).
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    if special_tokens_mask.shape != input_ids.shape:
        raise ValueError(
            f"special_tokens_mask has shape {tuple(special_tokens_mask.shape)}, expected that of input_ids "
            f"{tuple(input_ids.shape)}"
        )
    if config.whole_word:
        if word_starts is None:
            raise ValueError("whole_word=True needs word_starts (True where a piece begins a word)")
        if word_starts.shape != input_ids.shape:
            raise ValueError(
                f"word_starts has shape {tuple(word_starts.shape)}, expected that of input_ids {tuple(input_ids.shape)}"
            )
    b, t = input_ids.shape
    device = input_ids.device
    candidates = ~special_tokens_mask.bool()  # (batch, seq)
    num_candidates = candidates.sum(1)  # (batch,)
    # BERT's create_pretraining_data: num_to_predict = max(1, round(n * masked_lm_prob)); round half to even.
    target = torch.round(num_candidates.double() * config.mask_prob).long().clamp(min=1)  # (batch,)

    # Group pieces into words: a group starts at each word-initial piece and at each non-candidate (special token,
    # padding), so no group spans one; only a group's candidates count. Token-level masking is the case where
    # every piece is its own word.
    if config.whole_word:
        starts = word_starts.bool() | ~candidates  # (batch, seq)
        starts[:, 0] = True
    else:
        starts = torch.ones_like(candidates)
    word = starts.long().cumsum(1) - 1  # (batch, seq): index of the word each piece belongs to
    size = torch.zeros(b, t, dtype=torch.long, device=device).scatter_add_(1, word, candidates.long())  # (batch, word)

    # Words in a random order (one uniform score per word); take them while the count stays within target.
    scores = torch.rand(b, t, generator=generator, device=device)  # (batch, word)
    scores = scores.masked_fill(size == 0, 2.0)  # empty slots and non-candidates sort last
    order = scores.argsort(dim=1)  # (batch, word): words in selection order
    sorted_size = size.gather(1, order)  # (batch, word)
    taken = (sorted_size.cumsum(1) <= target[:, None]) & (sorted_size > 0)  # (batch, word), in selection order
    taken[:, 0] = sorted_size[:, 0] > 0  # always at least one word
    word_taken = torch.zeros_like(taken).scatter_(1, order, taken)  # (batch, word), back to word order
    selected = candidates & word_taken.gather(1, word)  # (batch, seq)

    # Devlin et al. 2019, sec. 3.1: of the selected tokens 80% -> [MASK], 10% -> random token, 10% unchanged.
    action = torch.rand(b, t, generator=generator, device=device)  # (batch, seq)
    random_tokens = torch.randint(vocab_size, (b, t), generator=generator, device=device)  # (batch, seq)
    to_mask = selected & (action < config.replace_prob)
    to_random = selected & (action >= config.replace_prob) & (action < config.replace_prob + config.random_prob)
    masked = input_ids.masked_fill(to_mask, mask_token_id)
    masked = torch.where(to_random, random_tokens.to(input_ids.dtype), masked)
    labels = input_ids.masked_fill(~selected, IGNORE_INDEX)
    return masked, labels


class BatchMasker:
    """Turns a batch's input_ids into (masked_input_ids, labels): dynamic or static masking (see module docs)."""

    def __init__(self, config: MaskedLMConfig, vocab_size: int, word_start: torch.Tensor | None = None) -> None:
        config.check(vocab_size)
        if config.whole_word and word_start is None:
            raise ValueError(
                "whole_word=True needs the vocabulary's word-start table: pass word_start=word_start_table(tokenizer)"
            )
        if word_start is not None and word_start.shape != (vocab_size,):
            raise ValueError(
                f"word_start must have shape ({vocab_size},), one flag per token, got {tuple(word_start.shape)}"
            )
        self.config = config
        self.vocab_size = vocab_size
        self.word_start = word_start
        self.special_ids = torch.tensor(sorted(config.special_token_ids), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be (batch, seq), got {tuple(input_ids.shape)} and "
                f"{tuple(attention_mask.shape)}"
            )
        special = torch.isin(input_ids, self.special_ids.to(input_ids.device)) | ~attention_mask.bool()  # (batch, seq)
        starts = self.word_start.to(input_ids.device)[input_ids] if self.config.whole_word else None  # (batch, seq)
        c = self.config
        if c.static_copies is None:  # dynamic: a fresh mask from the global RNG
            return mask_tokens(input_ids, special, self.vocab_size, c.mask_token_id, c, None, starts)
        # Static: the global RNG picks which of the N masks; the mask itself comes from a generator seeded by
        # (seed, copy, tokens), computed on the sequence without its padding so batching does not change it.
        copies = torch.randint(c.static_copies, (input_ids.shape[0],))  # (batch,)
        masked, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE_INDEX)
        lengths = attention_mask.sum(1).tolist()
        for row, (n, copy) in enumerate(zip(lengths, copies.tolist())):
            ids = input_ids[row, :n]
            gen = torch.Generator(device=input_ids.device).manual_seed(static_mask_seed(c.seed, copy, ids))
            m, lab = mask_tokens(
                ids[None],
                special[row, :n][None],
                self.vocab_size,
                c.mask_token_id,
                c,
                gen,
                None if starts is None else starts[row, :n][None],
            )
            masked[row, :n], labels[row, :n] = m[0], lab[0]
        return masked, labels


def static_mask_seed(seed: int, copy: int, ids: torch.Tensor) -> int:
    """A 63-bit seed from (seed, copy, token ids); stable across processes and machines (blake2b, not hash())."""
    h = hashlib.blake2b(digest_size=8)
    h.update(np.array([seed, copy], dtype=np.int64).tobytes())
    h.update(ids.detach().cpu().numpy().astype(np.int64).tobytes())
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


def mlm_loss(
    head: MaskedLMHead, hidden_states: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, logits (n, vocab), targets (n,)) over the n positions whose label is not -100."""
    selected = labels != IGNORE_INDEX  # (batch, seq)
    hidden = hidden_states[selected]  # (n, hidden): gather the selected positions before the vocabulary projection
    targets = labels[selected]  # (n,)
    logits = head(hidden)  # (n, vocab)
    if targets.numel() == 0:  # nothing to predict: a zero that still reaches the graph
        return logits.sum() * 0.0, logits, targets
    return F.cross_entropy(logits.float(), targets), logits, targets


class MaskedLMObjective(nn.Module):
    """BertModel + masked-LM head (+ next-sentence head when nsp): loss = L_MLM + L_NSP (Devlin et al. 2019).

    forward(batch) reads input_ids, attention_mask, token_type_ids (optional) and, when nsp, next_sentence_label;
    masks with the global torch RNG. word_start: the (vocab,) table of `word_start_table(tokenizer)`, needed
    for whole-word masking.
    """

    def __init__(
        self, encoder_config: BertConfig, mlm: MaskedLMConfig, nsp: bool = False, word_start: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        if encoder_config.model_type == "electra":
            raise ValueError("model_type 'electra' is pretrained with ElectraObjective (replaced-token detection)")
        if nsp and encoder_config.model_type != "bert":
            raise ValueError(
                f"next-sentence prediction is BERT's objective; {encoder_config.model_type} has no NSP head "
                "(RoBERTa dropped it: Liu et al. 2019, sec. 4.2): use nsp=False"
            )
        if nsp and not encoder_config.add_pooling_layer:
            raise ValueError(
                "nsp=True classifies the pooled [CLS] vector: set add_pooling_layer=True in the BertConfig"
            )
        if encoder_config.embedding_size != encoder_config.hidden_size:
            raise ValueError(
                f"embedding_size ({encoder_config.embedding_size}) differs from hidden_size "
                f"({encoder_config.hidden_size}): transformers' {encoder_config.model_type} has no embedding projection"
            )
        self.config = encoder_config
        self.mlm = mlm
        self.nsp = nsp
        self.masker = BatchMasker(mlm, encoder_config.vocab_size, word_start)
        self.encoder = BertModel(encoder_config)
        self.head = MaskedLMHead(encoder_config, self.encoder.embeddings.word_embeddings)
        self.nsp_head = NextSentenceHead(encoder_config) if nsp else None
        # Only the head's own layers: its decoder weight is the (already initialised) word embedding matrix.
        for module in (self.head.dense, self.head.norm, self.nsp_head):
            if module is not None:
                module.apply(self.encoder._init_weights)

    def forward(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        masked, labels = self.masker(input_ids, attention_mask)
        return self.loss(masked, labels, attention_mask, batch.get("token_type_ids"), batch.get("next_sentence_label"))

    def loss(
        self,
        masked_input_ids: torch.Tensor,
        labels: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> ObjectiveOutput:
        """The loss on an already masked batch (labels: (batch, seq), -100 where not predicted)."""
        if labels.shape != masked_input_ids.shape:
            raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(masked_input_ids.shape)}")
        if self.nsp and next_sentence_label is None:
            raise ValueError(
                "the batch has no next_sentence_label, which nsp=True needs: use SegmentPairPacker batches, "
                "or nsp=False"
            )
        out = self.encoder(masked_input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        loss, logits, targets = mlm_loss(self.head, out.last_hidden_state, labels)
        nll = float(loss.detach())
        metrics = {"mlm_loss": nll, "masked_tokens": float(targets.numel())}
        if targets.numel():
            metrics["mlm_accuracy"] = float((logits.argmax(-1) == targets).float().mean())
        if self.nsp_head is not None:
            nsp_logits = self.nsp_head(out.pooler_output)  # (batch, 2)
            nsp = next_sentence_loss(nsp_logits, next_sentence_label)
            loss = loss + nsp
            metrics["nsp_loss"] = float(nsp.detach())
            metrics["nsp_accuracy"] = float((nsp_logits.argmax(-1) == next_sentence_label).float().mean())
        return ObjectiveOutput(loss=loss, num_tokens=int(attention_mask.sum()), metrics=metrics, nll=nll)

    def save_pretrained(self, path: str | Path) -> None:
        """A BertForPreTraining (nsp) / BertForMaskedLM / RobertaForMaskedLM folder: the encoder under 'bert.' or
        'roberta.', the heads under transformers' names. ctxrep.load_model loads its encoder."""
        c = self.config
        tensors = prefixed_encoder_tensors(self.encoder)
        tensors |= head_tensors(self.head, "cls.predictions" if c.model_type == "bert" else "lm_head", c.model_type)
        if self.nsp_head is not None:
            tensors |= {f"cls.seq_relationship.{p}": w for p, w in self.nsp_head.seq_relationship.state_dict().items()}
        arch = {"bert": "BertForPreTraining" if self.nsp else "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}
        write_folder(path, c.to_hf_dict() | {"architectures": [arch[c.model_type]]}, tensors)


def prefixed_encoder_tensors(encoder: BertModel) -> dict[str, torch.Tensor]:
    """The encoder's weights as a *ForMaskedLM / *ForPreTraining checkpoint stores them: '<model_type>.<hf name>'."""
    ours = encoder.state_dict()
    prefix = encoder.config.model_type + "."
    return {prefix + hf: ours[our] for hf, our in hf_parameter_names(encoder.config).items()}


# ------------------------------------------------------------------------------------------------ recipes


@dataclass
class MaskingSettings:
    """[objective] keys of the masked objectives (mlm, mlm+nsp, mlm+sop, electra; distill with an MLM teacher)."""

    mask_prob: float = 0.15
    replace_prob: float = 0.8  # of the selected tokens: [MASK]
    random_prob: float = 0.1  # ... a random token (the rest stay unchanged)
    whole_word: bool = False
    static_copies: int = 0  # 0 = dynamic masking (RoBERTa); N = one of N fixed masks per sequence (BERT)

    def masking(self, tokenizer: Tokenizer, seed: int) -> MaskedLMConfig:
        """The MaskedLMConfig of these settings with the tokenizer's mask and special tokens."""
        return MaskedLMConfig.from_tokenizer(
            tokenizer,
            mask_prob=self.mask_prob,
            replace_prob=self.replace_prob,
            random_prob=self.random_prob,
            whole_word=self.whole_word,
            static_copies=self.static_copies or None,
            seed=seed,
        )

    def word_start(self, tokenizer: Tokenizer) -> torch.Tensor | None:
        """The word-start table whole-word masking needs, else None."""
        return word_start_table(tokenizer) if self.whole_word else None


@dataclass
class SegmentPairSettings(MaskingSettings):
    """[objective] keys of the pair objectives (mlm+nsp, mlm+sop): masking and the pairs' target lengths."""

    short_seq_prob: float = 0.1  # pairs aiming at a random shorter length (BERT, ALBERT)


# [encoder] keys BertConfig takes (ALBERT's `share` aside); ELECTRA reads them but model_type.
BERT_SHAPE = tuple(f.name for f in dataclasses.fields(Shape) if f.name != "share")


def bert_config(x: Ingredients, model_type: str) -> BertConfig:
    """[encoder] onto BertConfig (BERT, RoBERTa, ELECTRA's discriminator), with the tokenizer's padding id."""
    s = x.shape
    return BertConfig(
        model_type=model_type,
        vocab_size=x.vocab_size,
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        intermediate_size=s.intermediate_size,
        hidden_act=s.hidden_act,
        hidden_dropout_prob=s.hidden_dropout_prob,
        attention_probs_dropout_prob=s.attention_probs_dropout_prob,
        max_position_embeddings=s.max_position_embeddings,
        type_vocab_size=s.type_vocab_size,
        layer_norm_eps=s.layer_norm_eps,
        initializer_range=s.initializer_range,
        pad_token_id=x.tokenizer.pad_token_id,
        embedding_size=s.embedding_size or None,
        add_pooling_layer=model_type != "electra",
    )


def _build(x: Ingredients, name: str, nsp: bool) -> Built:
    if x.shape.model_type not in ("bert", "roberta"):
        raise PretrainError(
            f"[encoder] model_type={x.shape.model_type!r} cannot be trained with {name}: use 'bert' or "
            "'roberta' (or --objective electra for ELECTRA)"
        )
    masking = x.settings.masking(x.tokenizer, x.seed)
    module = MaskedLMObjective(
        bert_config(x, x.shape.model_type), masking, nsp=nsp, word_start=x.settings.word_start(x.tokenizer)
    )
    return Built(module, module.config.max_tokens)


def build_mlm(x: Ingredients) -> Built:
    return _build(x, "mlm", nsp=False)


def build_mlm_nsp(x: Ingredients) -> Built:
    return _build(x, "mlm+nsp", nsp=True)


def segment_pairs(corpus: PackedCorpus, tokenizer: Tokenizer, plan: Packing) -> SegmentPairPacker:
    """BERT's pairs: B follows A in its document or comes from another one (next_sentence_label)."""
    config = SegmentPairConfig(plan.max_length, plan.settings.short_seq_prob, plan.seed, plan.warmup)
    return SegmentPairPacker(corpus, config, tokenizer)


# RoBERTa (and BERT without NSP): masked LM over FULL-SENTENCES rows.
MLM = Recipe(
    "mlm", build_mlm, MaskingSettings, BERT_SHAPE, tokenizer_kinds=("wordpiece", "bpe"), packing=full_sentences
)
# BERT: masked LM + next-sentence prediction over segment pairs (two documents at least on each side of the split).
MLM_NSP = Recipe(
    "mlm+nsp",
    build_mlm_nsp,
    SegmentPairSettings,
    BERT_SHAPE,
    tokenizer_kinds=("wordpiece", "bpe"),
    packing=segment_pairs,
    min_documents=2,
)
