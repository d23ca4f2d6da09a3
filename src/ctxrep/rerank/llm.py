"""LLM rerankers (Qwen3-Reranker style): a causal LM judges whether a document meets a query, and the score is its
probability of answering "yes" rather than "no" at the position after the prompt:

    ids   = tokens(prefix) + tokens(body.format(instruction, query, document)) + tokens(suffix)
    score = softmax([logit_no, logit_yes])[1] = sigmoid(logit_yes - logit_no)

at the last token's final hidden state h: logit_t = lm_head_t . h, computed for the two tokens only through the
encoder's `lm_logits(h, token_ids)` (any family with an LM head answers it). sentence-transformers' LogitScore
computes the same log-odds (logit_yes - logit_no) and its CrossEncoder applies the sigmoid. The prompt is
Qwen3-Reranker's chat template as its model card writes it (QWEN3_RERANKER); the body is cut from its end to fit
the model's positions (after each call, `cut_texts` names the pairs so cut and `cut_pieces` how many pieces each
lost). Padding side does not matter: each row is read at its own last token.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ctxrep.models.folders import CheckpointError
from ctxrep.models.loading import LoadedEncoder, load_encoder
from ctxrep.models.sentence_transformers import Prompts, read_prompts
from ctxrep.rerank.ranking import BetweenBatches, Reranker, length_batches
from ctxrep.runtime.hardware import default_batch_tokens
from ctxrep.text.inputs import EncoderInput, collate


@dataclass(frozen=True)
class YesNoTemplate:
    """How a (query, document) pair becomes the LM's prompt, and the two answer tokens."""

    prefix: str
    body: str  # with {instruction}, {query}, {document}
    suffix: str
    instruction: str  # when the call gives none
    yes: str = "yes"
    no: str = "no"


# Qwen3-Reranker's model card (Qwen/Qwen3-Reranker-0.6B, "Transformers Usage").
QWEN3_RERANKER = YesNoTemplate(
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    body="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)


class LLMReranker(Reranker):
    """Scores (query, document) pairs with a causal LM's yes/no logits (see the module docstring).

    model: a folder or name `ctxrep.load_encoder` resolves, whose encoder answers `lm_logits` (a ...ForCausalLM
    folder, or tied embeddings). instruction: the task line (default: the template's); the call's prompt /
    prompt_name, when given, replaces it (the folder's prompts are read from config_sentence_transformers.json).
    between_batches: None, or a function called between two batches (ranking.BetweenBatches; ctxrep serve's turns).
    Set it on a copy.
    After each call, `cut_texts` lists the pairs (indices in that call; a document's index in `rerank`) whose body
    was cut from its end to fit max_length, and `cut_pieces` the pieces each of them lost, in the same order.
    """

    between_batches: BetweenBatches | None = None

    def __init__(
        self,
        model: str | os.PathLike | LoadedEncoder,
        template: YesNoTemplate = QWEN3_RERANKER,
        instruction: str | None = None,
        max_length: int | None = None,
        batch_tokens: int | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        loaded = model if isinstance(model, LoadedEncoder) else load_encoder(model)
        self.model, self.tokenizer, self.folder = loaded.model, loaded.tokenizer, loaded.folder
        if self.tokenizer.word_level:
            raise CheckpointError(f"{self.folder}: {self.model.family} reads whole words; it cannot be an LLM reranker")
        self.template = template
        self.instruction = instruction if instruction is not None else template.instruction
        ids = []
        for token in (template.yes, template.no):
            i = self.tokenizer.backend.token_to_id(token)
            if i is None:
                raise CheckpointError(
                    f"{self.folder}: the tokenizer has no {token!r} token, which the reranker's score reads; give a "
                    "template whose yes / no are single tokens of this vocabulary"
                )
            ids.append(i)
        self.answer_ids = ids  # [yes, no]
        try:  # the encoder answers lm_logits when it has a causal LM head (models/encoder.py); ask once, here
            weight = next(self.model.parameters())
            self.model.lm_logits(torch.zeros(1, self.model.hidden_size, dtype=weight.dtype, device=weight.device), ids)
        except ValueError as e:
            raise CheckpointError(
                f"{self.folder}: a {self.model.family} model has no LM head to read yes/no logits from ({e}); an "
                "LLM reranker needs a causal LM (e.g. a Qwen3 ...ForCausalLM folder)"
            ) from e
        if device is not None:
            self.model.to(device)
        self.prefix_ids = self._ids(template.prefix)
        self.suffix_ids = self._ids(template.suffix)
        self.max_length = min(max_length or self.model.max_tokens, self.model.max_tokens)
        room = self.max_length - len(self.prefix_ids) - len(self.suffix_ids)
        if room < 1:
            raise ValueError(f"max_length={self.max_length} leaves no room for the pair between the prompt's parts")
        self.room = room
        self.prompts: Prompts = read_prompts(self.folder)
        self.batch_tokens = batch_tokens or default_batch_tokens(
            self.device, self.model.hidden_size, self.model.num_layers
        )
        self.cut_texts: list[int] = []  # the pairs of the last call whose body was cut, by index in that call
        self.cut_pieces: list[int] = []  # the pieces each of them lost

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _ids(self, text: str) -> list[int]:
        ids, _ = self.tokenizer.encode_texts([text])  # no special tokens
        return ids.tolist()

    def _instruction(self, prompt: str | None, prompt_name: str | None) -> str:
        if prompt is None and prompt_name is None and self.prompts.default_name is None:
            return self.instruction
        return self.prompts.resolve(prompt, prompt_name)

    def predict(
        self, pairs: Sequence[tuple[str, str]], prompt: str | None = None, prompt_name: str | None = None
    ) -> np.ndarray:
        """P(yes) for each (query, document) pair, in their order."""
        instruction = self._instruction(prompt, prompt_name)
        pairs = list(pairs)
        bodies = []
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                raise TypeError(f"pair {i}: expected a (query, document) pair of strings")
            bodies.append(self.template.body.format(instruction=instruction, query=pair[0], document=pair[1]))
        self.cut_texts, self.cut_pieces = [], []
        if not bodies:
            return np.zeros(0, np.float32)
        ids, lengths = self.tokenizer.encode_texts(bodies)
        starts = np.cumsum(lengths) - lengths
        self.cut_texts = [i for i, n in enumerate(lengths.tolist()) if n > self.room]
        self.cut_pieces = [int(lengths[i]) - self.room for i in self.cut_texts]
        records = []
        for i, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
            row = self.prefix_ids + ids[s : s + min(n, self.room)].tolist() + self.suffix_ids
            records.append(EncoderInput(i, row, [0] * len(row), len(row) - 1))
        scores = torch.zeros(len(records))
        lengths = [len(r) for r in records]
        with torch.inference_mode():
            for rows in length_batches(lengths, self.batch_tokens, self.between_batches):
                batch = {k: v.to(self.device) for k, v in collate([records[r] for r in rows], self.tokenizer).items()}
                hidden = self.model.encode(batch, num_layers=None).last_hidden_state  # (batch, seq, hidden)
                last = torch.tensor([len(records[r]) - 1 for r in rows], device=hidden.device)
                logits = self.model.lm_logits(hidden[torch.arange(len(rows)), last], self.answer_ids).float()
                scores[rows] = torch.sigmoid(logits[:, 0] - logits[:, 1]).cpu()  # (batch,) P(yes)
        return scores.numpy()
