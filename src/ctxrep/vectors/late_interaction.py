"""Multi-vector late interaction (ColBERT, Khattab & Zaharia 2020): one unit vector per token, MaxSim scoring, and
an index that finds candidates by token vectors and rescores them exactly.

    encoder = MultiVectorEncoder("folder/")          # a sentence-transformers MultiVectorEncoder folder, or any model
    q = encoder.embed_queries(["who plays guitar"])   # [(tokens, dim) float32], rows of unit length
    d = encoder.embed_documents(texts)
    maxsim(q[0], d[0])                                # sum over query tokens of the best document-token cosine
    index = LateInteractionIndex.build(texts, encoder); index.search("who plays guitar", k=10)

A token's vector: the encoder's last hidden state (`Featurizer.embed_tokens`: the Featurizer's windows, batches,
runtime and precision), through the folder's Dense projections (token_embeddings -> token_embeddings, as
sentence-transformers' MultiVectorEncoder lists them), L2-normalised. Tokens of the folder's skiplist (its
MultiVectorMask: ColBERT's punctuation) are dropped from the tasks it names (documents by default), special tokens
kept, as sentence-transformers does. A model without MultiVectorEncoder modules gives its normalised hidden states
with ColBERT's punctuation skiplist on documents (the raw material of late interaction, no trained projection).
The folder's "query" / "document" prompts are put before the texts unless a call gives prompt= or prompt_name=.

A Stanford-NLP ColBERT checkpoint (config.json architectures HF_ColBERT, as colbert-ir/colbertv2.0: BERT weights
and the bias-free projection `linear.weight` in one state dict, settings in artifact.metadata, ColBERTv2's
defaults where it is silent) is run as ColBERT runs it: its marker ([unused0] for queries, [unused1] for
documents) after [CLS]; queries cut at query_maxlen and padded to it with [MASK] tokens that attention skips
(unless attend_to_mask_tokens) and whose vectors are kept (query expansion); documents cut at doc_maxlen (the cut
texts' indices in `cut_texts`, as the Featurizer reports its cuts) with the punctuation skiplist. These are the
vectors sentence-transformers' MultiVectorEncoder gives for the folder. Query expansion / fixed lengths in a
sentence-transformers folder (sentence_bert_config.json) and PyLate <= 3 folders are refused with a one-line
reason naming sentence_transformers.MultiVectorEncoder, which loads them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctxrep.featurize.spec import FeaturizerSpec
from ctxrep.models.folders import CheckpointError, read_state_dict
from ctxrep.models.sentence_transformers import (
    MODULES_FILE,
    SETTINGS_FILE,
    DenseLayer,
    read_dense,
    read_modules,
    read_settings,
    with_prompt,
)
from ctxrep.text.inputs import Rows, check_texts
from ctxrep.util.arrays import normalize_rows
from ctxrep.vectors.hits import Hits

__all__ = [
    "ColBERTSettings",
    "LateInteractionIndex",
    "MultiVectorEncoder",
    "MultiVectorSettings",
    "maxsim",
    "maxsim_scores",
]

COLBERT_SKIPLIST = tuple(string.punctuation)  # ColBERT's mask_punctuation
EXPANSION_KEYS = ("query_expansion", "query_length", "document_length")  # Transformer knobs ctxrep does not apply


@dataclass(frozen=True)
class ColBERTSettings:
    """How a Stanford-NLP ColBERT checkpoint tokenizes (artifact.metadata; ColBERTv2's defaults where it is silent)."""

    query_marker: str = "[unused0]"  # ColBERT's [Q], put after [CLS]
    document_marker: str = "[unused1]"  # [D]
    query_maxlen: int = 32  # queries are cut at, and padded with [MASK] to, this many tokens
    doc_maxlen: int = 180  # documents are cut at this many tokens
    attend_to_mask_tokens: bool = False  # whether attention reads the [MASK] padding of queries
    mask_punctuation: bool = True  # punctuation dropped from documents

    @classmethod
    def of_folder(cls, folder: Path) -> ColBERTSettings | None:
        """The settings of an HF_ColBERT folder (config.json architectures); None for any other folder."""
        folder = Path(folder)
        try:
            architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            return None
        if "HF_ColBERT" not in architectures:
            return None
        try:
            meta = json.loads((folder / "artifact.metadata").read_text())
        except FileNotFoundError:
            meta = {}
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{folder / 'artifact.metadata'}: not readable JSON ({e})") from e
        if meta.get("similarity", "cosine") != "cosine":
            raise CheckpointError(
                f"{folder / 'artifact.metadata'}: similarity {meta['similarity']!r}: ctxrep scores MaxSim with the "
                "dot product of unit vectors (ColBERT's 'cosine') only"
            )
        d = cls()
        return cls(
            meta.get("query_token_id") or d.query_marker,
            meta.get("doc_token_id") or d.document_marker,
            int(meta.get("query_maxlen") or d.query_maxlen),
            int(meta.get("doc_maxlen") or d.doc_maxlen),
            bool(meta.get("attend_to_mask_tokens", d.attend_to_mask_tokens)),
            bool(meta.get("mask_punctuation", d.mask_punctuation)),
        )


def colbert_projection(folder: Path) -> DenseLayer:
    """An HF_ColBERT folder's `linear.weight` (dim, hidden) as a bias-free Dense layer."""
    folder = Path(folder)
    file = folder / "model.safetensors"
    if file.is_file():
        from safetensors import safe_open

        with safe_open(file, framework="pt") as f:  # one tensor, not the whole encoder again
            weight = f.get_tensor("linear.weight") if "linear.weight" in f.keys() else None
    else:
        weight = read_state_dict(folder).get("linear.weight")
    if weight is None:
        raise CheckpointError(f"{folder}: an HF_ColBERT checkpoint without its projection linear.weight")
    return DenseLayer(weight.float(), None, lambda v: v)


@dataclass(frozen=True)
class MultiVectorSettings:
    """What a folder declares after its encoder: Dense projections (in order), the skiplist and the tasks it
    applies to (MultiVectorMask), and whether token vectors are normalised."""

    dense: tuple[DenseLayer, ...] = ()
    skiplist_words: tuple[str, ...] = COLBERT_SKIPLIST
    skiplist_tasks: tuple[str, ...] = ("document",)
    normalize: bool = True
    colbert: ColBERTSettings | None = None  # a Stanford-NLP ColBERT checkpoint's markers, lengths and expansion

    @classmethod
    def of_folder(cls, folder: Path) -> MultiVectorSettings:
        """The modules.json of a sentence-transformers MultiVectorEncoder folder, or an HF_ColBERT checkpoint's
        projection and artifact.metadata; the defaults above without either."""
        folder = Path(folder)
        colbert = ColBERTSettings.of_folder(folder)
        if colbert is not None:
            skiplist = COLBERT_SKIPLIST if colbert.mask_punctuation else ()
            return cls((colbert_projection(folder),), skiplist, ("document",), True, colbert)
        prefixes = [k for k in ("query_prefix", "document_prefix") if read_settings(folder).get(k)]
        if prefixes:  # PyLate <= 3: prefix tokens sentence-transformers registers on the tokenizer when it loads
            raise CheckpointError(
                f"{folder / SETTINGS_FILE}: a PyLate <= 3 folder ({', '.join(prefixes)}: marker tokens, and query "
                "expansion unless do_query_expansion is false), which ctxrep does not read: use "
                f"sentence_transformers.MultiVectorEncoder({str(folder)!r}) (>= 6.2 reads PyLate folders); ctxrep "
                "reads the folder its save() writes only where that sets no query_expansion / query_length / "
                "document_length"
            )
        modules = read_modules(folder)
        if "MultiVectorMask" not in [m.kind for m in modules]:
            return cls()  # no modules.json, or a single-vector folder: its token states, as for a plain model
        for m in (m for m in modules if m.kind in ("Transformer", "MLMTransformer")):
            knobs = m.config or {}
            used = [k for k in EXPANSION_KEYS if knobs.get(k) not in (None, False)]
            if used:
                raise CheckpointError(
                    f"{folder / m.path / m.config_file_name}: sets {', '.join(used)} (query expansion / fixed "
                    "lengths), which ctxrep does not apply; use sentence_transformers.MultiVectorEncoder for this folder"
                )
        dense, skiplist, tasks, normalize = [], (), ("document",), False
        for m in modules:
            path = folder / m.path
            if m.kind == "Dense":
                dense.append(read_dense(path))
            elif m.kind == "MultiVectorMask":
                mask = m.config or {}
                skiplist = tuple(mask.get("skiplist_words") or ())
                tasks = mask.get("skiplist_tasks") or ["document"]
                tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
                if mask.get("keep_only_token_ids") is not None:
                    raise CheckpointError(f"{path}: keep_only_token_ids (image patches) is not applied by ctxrep")
            elif m.kind == "Normalize":
                normalize = True
            elif m.kind not in ("Transformer", "MLMTransformer"):
                raise CheckpointError(
                    f"{folder / MODULES_FILE}: module {m.kind} is not one ctxrep applies to token vectors"
                )
        return cls(tuple(dense), skiplist, tasks, normalize)


class MultiVectorEncoder:
    """Texts -> one vector per token (see the module docs), a sibling of ctxrep.Featurizer.

    model: a folder or name (a sentence-transformers MultiVectorEncoder folder, or any encoder), or a ready
    ctxrep.Featurizer. Further keyword arguments go to the Featurizer (device, precision, backend, ...); the layer
    is always the last, the projections run in float32.
    """

    def __init__(self, model="minilm", **featurizer_kwargs) -> None:
        from ctxrep.featurize import Featurizer

        # token states only: the sentence pooling is never read ("mean" spares the folder's modules a warning)
        fz = (
            model
            if isinstance(model, Featurizer)
            else Featurizer(model, **({"sentence_pooling": "mean"} | featurizer_kwargs))
        )
        self.featurizer = fz.with_layers(-1)
        folder = self.featurizer.source.folder
        self.settings = MultiVectorSettings.of_folder(folder)
        self.prompts = self.featurizer.prompts  # config_sentence_transformers.json's, or none
        vocab = self.featurizer.tokenizer.backend
        ids = [vocab.token_to_id(w) for w in self.settings.skiplist_words]  # words that are no token: dropped
        self.skiplist_ids = np.array(sorted({i for i in ids if i is not None}), dtype=np.int64)
        self.cut_texts: list[int] = []  # the texts (indices in the last call) cut at ColBERT's query / doc maxlen
        self.markers = self.expansion_id = None
        if self.settings.colbert is not None:
            self.markers, self.expansion_id = colbert_token_ids(self.settings.colbert, vocab, folder)

    @property
    def dim(self) -> int:
        """Width of one token vector."""
        return self.settings.dense[-1].weight.shape[0] if self.settings.dense else self.featurizer.model.hidden_size

    @property
    def spec(self) -> FeaturizerSpec:
        """The dense featurizer's spec underneath (what made the token states), head "multi-vector"."""
        return dataclasses.replace(FeaturizerSpec.of(self.featurizer), head="multi-vector")

    def embed_queries(
        self, texts: Sequence[str], prompt: str | None = None, prompt_name: str | None = None
    ) -> list[np.ndarray]:
        """One (tokens, dim) float32 array per query. prompt / prompt_name: text put before each query, as
        Featurizer.embed_sentences; the folder's "query" prompt when neither is given (encode_query)."""
        return self._embed(texts, "query", prompt, prompt_name)

    def embed_documents(
        self, texts: Sequence[str], prompt: str | None = None, prompt_name: str | None = None
    ) -> list[np.ndarray]:
        """One (tokens, dim) float32 array per document, skiplisted tokens dropped; the folder's "document" prompt
        unless prompt / prompt_name gives one (encode_document)."""
        return self._embed(texts, "document", prompt, prompt_name)

    def _embed(self, texts: Sequence[str], task: str, prompt: str | None, prompt_name: str | None) -> list[np.ndarray]:
        import torch

        texts = [texts] if isinstance(texts, str) else list(texts)
        texts = with_prompt(self.prompts.resolve(prompt, prompt_name, task), texts)
        skip = task in self.settings.skiplist_tasks and len(self.skiplist_ids) > 0
        if self.settings.colbert is not None:
            token_states = self._colbert_states(texts, task)
        else:
            token_states = self.featurizer.embed_tokens(texts)
            self.cut_texts = self.featurizer.cut_texts
        out = []
        for ids, states in token_states:
            v = torch.from_numpy(np.ascontiguousarray(states, dtype=np.float32))
            for layer in self.settings.dense:
                v = layer(v)
            v = v.numpy()
            if skip:
                v = v[~np.isin(ids, self.skiplist_ids)]
            out.append(normalize_rows(v) if self.settings.normalize else np.ascontiguousarray(v, np.float32))
        return out

    def _colbert_states(self, texts: list[str], task: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids, last hidden states) per text as Stanford-NLP ColBERT makes them: [CLS] marker pieces [SEP], cut at
        the task's maxlen; queries padded with [MASK] to query_maxlen (see ExpandedRows). The Featurizer's batches
        and runtime."""
        check_texts(texts)
        colbert, fz = self.settings.colbert, self.featurizer
        query = task == "query"
        maxlen = min(colbert.query_maxlen if query else colbert.doc_maxlen, fz.max_length)
        room = maxlen - fz.tokenizer.template.num_special(pair=False) - 1  # the marker takes one more
        ids, lengths = fz.tokenizer.encode_texts(texts)
        starts = np.cumsum(lengths) - lengths
        kept = np.minimum(lengths, room)
        marker = self.markers[0 if query else 1]
        pieces = [np.concatenate([[marker], ids[s : s + k]]) for s, k in zip(starts.tolist(), kept.tolist())]
        rows = Rows.single_texts(
            fz.tokenizer.template, np.concatenate(pieces).astype(np.int64), kept + 1, np.arange(len(texts))
        )
        if query:
            rows = ExpandedRows(
                rows.ids,
                rows.types,
                rows.lengths,
                rows.text,
                rows.cls_position,
                width=maxlen,
                fill=self.expansion_id,
                attend=colbert.attend_to_mask_tokens,
            )
        out: list = [None] * len(texts)  # one row per text: row r is text r

        def consume(selected, batch_rows, _weights):
            for r, row in enumerate(batch_rows.tolist()):
                n = maxlen if query else int(rows.lengths[row])  # queries keep their [MASK] positions
                row_ids = rows.ids[rows.starts[row] : rows.starts[row] + rows.lengths[row]]
                if query:
                    row_ids = np.concatenate([row_ids, np.full(n - len(row_ids), self.expansion_id, np.int64)])
                out[row] = (row_ids, selected[0, r, :n].numpy())

        # queries: the [MASK] positions' vectors are scored though attention skips them: run padded
        fz.run_rows(rows, consume, padded=query)
        self.cut_texts = np.flatnonzero(lengths > room).tolist()
        return out


def colbert_token_ids(colbert: ColBERTSettings, vocab, folder) -> tuple[tuple[int, int], int]:
    """The ids of the query and document markers and of the [MASK] token that expands queries."""
    markers = []
    for what, token in (("query_token_id", colbert.query_marker), ("doc_token_id", colbert.document_marker)):
        i = vocab.token_to_id(token)
        if i is None:
            raise CheckpointError(f"{folder}: ColBERT's {what} {token!r} is not a token of its tokenizer")
        markers.append(i)
    mask = next((i for i in map(vocab.token_to_id, ("[MASK]", "<mask>")) if i is not None), None)
    if mask is None:
        raise CheckpointError(f"{folder}: its tokenizer has no [MASK] / <mask> token to expand ColBERT's queries with")
    return (markers[0], markers[1]), mask


@dataclass
class ExpandedRows(Rows):
    """Queries as ColBERT encodes them: each row right-padded to `width` with the `fill` ([MASK]) token, whose
    positions attention skips (attention_mask 0) unless `attend`; their output vectors are scored all the same."""

    width: int = 0
    fill: int = 0
    attend: bool = False

    def collate(self, rows: np.ndarray, tokenizer):
        import torch

        batch, weights = super().collate(rows, tokenizer)
        pad = self.width - batch["input_ids"].shape[1]
        batch = {k: torch.nn.functional.pad(v, (0, pad)) for k, v in batch.items()}
        expansion = batch["attention_mask"] == 0
        batch["input_ids"] = batch["input_ids"].masked_fill(expansion, self.fill)
        if self.attend:
            batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
        return batch, None if weights is None else np.pad(weights, ((0, 0), (0, pad)))


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's late interaction: sum over the query's tokens of the best dot product with a document token."""
    if len(query) == 0 or len(document) == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).sum())


def maxsim_scores(queries: Sequence[np.ndarray], documents: Sequence[np.ndarray]) -> np.ndarray:
    """(queries, documents) MaxSim scores (sentence-transformers' MultiVectorEncoder.similarity)."""
    return np.array([[maxsim(q, d) for d in documents] for q in queries], dtype=np.float32).reshape(
        len(queries), len(documents)
    )


class LateInteractionIndex:
    """Documents as token vectors: candidates found by each query token's nearest document tokens (ctxrep's
    nearest-neighbour index, `SentenceIndex`, over every document token: exact up to 20,000 tokens, HNSW above),
    then rescored exactly by MaxSim.

    candidates: document tokens each query token retrieves (ColBERT's ncandidates idea); a document none of the
    query's tokens retrieves is not scored. On disk: the token index (SentenceIndex's files, ids = token rows),
    documents.jsonl ({"id", "text", "tokens"} per document, in order) and late_interaction.json (the spec).
    """

    def __init__(self, dim: int, encoder: MultiVectorEncoder | None = None, spec: FeaturizerSpec | None = None):
        from ctxrep.vectors.index import SentenceIndex

        self.encoder = encoder
        self.spec = spec if spec is not None else (encoder.spec if encoder is not None else None)
        self.tokens = SentenceIndex(dim, metric="dot")  # every document token, in document order
        self.ids: list = []
        self.texts: list[str | None] = []
        self.starts = np.zeros(1, np.int64)  # document j's tokens are rows starts[j]:starts[j + 1]
        self.candidates = 64  # the default of `search`

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def build(cls, texts: Sequence[str], encoder: MultiVectorEncoder, ids: Sequence | None = None):
        return cls(encoder.dim, encoder).add(texts, ids)

    def _encoder(self) -> MultiVectorEncoder:
        if self.encoder is None:
            if self.spec is None:
                raise ValueError("this index does not know which model made its vectors: search it with vectors")
            self.encoder = MultiVectorEncoder(**self.spec.featurizer_kwargs())
        return self.encoder

    def add(self, texts: Sequence[str], ids: Sequence | None = None) -> LateInteractionIndex:
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.add_vectors(self._encoder().embed_documents(texts), ids, texts)

    def add_vectors(self, documents: Sequence[np.ndarray], ids: Sequence | None = None, texts=None):
        """Add documents given as (tokens, dim) arrays, with ids (default: the next row numbers) and texts."""
        n = len(documents)
        ids = list(range(len(self), len(self) + n)) if ids is None else list(ids)
        texts = [None] * n if texts is None else list(texts)
        if len(ids) != n or len(texts) != n:
            raise ValueError(f"{n} documents but {len(ids)} ids and {len(texts)} texts; give one of each per document")
        seen = set(self.ids)
        for i in ids:
            if i in seen:
                raise ValueError(f"id {i!r} is already in the index; ids must be unique")
            seen.add(i)
        sizes = np.array([len(d) for d in documents], dtype=np.int64)
        if n:
            self.tokens.add_vectors(
                np.concatenate([np.asarray(d, np.float32).reshape(-1, self.tokens.dim) for d in documents])
            )
        self.starts = np.concatenate([self.starts, self.starts[-1] + np.cumsum(sizes)])
        self.ids.extend(ids)
        self.texts.extend(texts)
        return self

    def document(self, j: int) -> np.ndarray:
        """Document j's token vectors (tokens, dim)."""
        return self.tokens.vectors[self.starts[j] : self.starts[j + 1]]

    def search(self, queries, k: int = 10, candidates: int | None = None) -> Hits | list[Hits]:
        """The k documents with the best MaxSim score for each query, best first: one Hits for one query (a text, or
        its (tokens, dim) token vectors), a list of Hits for a list of them. candidates: default `self.candidates`."""
        candidates = self.candidates if candidates is None else candidates
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        single = isinstance(queries, str) or (isinstance(queries, np.ndarray) and queries.ndim == 2)
        if isinstance(queries, str) or (not single and len(queries) and isinstance(queries[0], str)):
            q_list = self._encoder().embed_queries([queries] if single else list(queries))
        else:
            q_list = [queries] if single else list(queries)
        doc_of_row = np.repeat(np.arange(len(self)), np.diff(self.starts))  # (tokens,) each token's document
        vectors = self.tokens.vectors
        out = []
        for q in q_list:
            if len(self.tokens) == 0 or len(q) == 0:
                out.append(Hits.empty())
                continue
            q = np.asarray(q, np.float32)
            near = self.tokens.search(q, k=min(candidates, len(self.tokens)))
            found = np.unique(doc_of_row[np.concatenate([h.rows for h in near])])  # candidate documents
            sizes = self.starts[found + 1] - self.starts[found]
            first = np.cumsum(sizes) - sizes  # each candidate's first column below
            rows = np.repeat(self.starts[found] - first, sizes) + np.arange(sizes.sum())  # their token rows
            sims = q @ vectors[rows].T  # (query tokens, candidate tokens)
            scores = np.maximum.reduceat(sims, first, axis=1).sum(axis=0)  # MaxSim of each candidate
            order = np.lexsort((found, -scores))[:k]
            best = found[order]
            out.append(Hits.from_rows(best, scores[order], self.ids, self.texts))
        return out[0] if single else out

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        self.tokens.save(path)
        with open(path / "documents.jsonl", "w", encoding="utf-8") as f:
            for i, t, n in zip(self.ids, self.texts, np.diff(self.starts).tolist()):
                f.write(json.dumps({"id": i, "text": t, "tokens": n}, ensure_ascii=False) + "\n")
        meta = {
            "format": "ctxrep-late-interaction",
            "version": 1,
            "spec": None if self.spec is None else self.spec.to_dict(),
        }
        (path / "late_interaction.json").write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, encoder: MultiVectorEncoder | None = None) -> LateInteractionIndex:
        """Read a folder written by `save`; `encoder` (for text queries) is checked against the saved spec."""
        from ctxrep.vectors.index import SentenceIndex

        path = Path(path)
        try:
            meta = json.loads((path / "late_interaction.json").read_text())
            docs = [json.loads(line) for line in (path / "documents.jsonl").read_text(encoding="utf-8").splitlines()]
        except (OSError, ValueError) as e:
            raise ValueError(
                f"{path}: not a late-interaction index ({type(e).__name__}: {e}); build it again"
            ) from None
        spec = FeaturizerSpec.from_dict(meta["spec"], str(path)) if meta.get("spec") else None
        if encoder is not None and spec is not None:
            spec.check(encoder.spec, str(path), "load it without an encoder to embed queries as it was built")
        tokens = SentenceIndex.load(path)
        index = cls(tokens.dim, encoder, spec)
        index.tokens = tokens
        index.ids = [d["id"] for d in docs]
        index.texts = [d["text"] for d in docs]
        index.starts = np.concatenate([[0], np.cumsum([d["tokens"] for d in docs])]).astype(np.int64)
        if index.starts[-1] != len(tokens):
            raise ValueError(f"{path}: documents.jsonl lists {index.starts[-1]} tokens, the index holds {len(tokens)}")
        return index
