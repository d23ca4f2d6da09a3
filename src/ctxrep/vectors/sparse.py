"""Sparse lexical vectors (SPLADE; BGE-M3's sparse head) and a sparse inverted index with dot-product search.

    encoder = SparseEncoder("naver/splade-v3")            # or a sentence-transformers SparseEncoder folder
    m = encoder.embed_sentences(texts)                     # scipy.sparse.csr_matrix (texts, vocabulary), float32
    encoder.embed_queries(["who plays guitar"], prompt_name="query")  # prompt / prompt_name as Featurizer's
    encoder.embed_sparse(texts)                            # [SparseVector(indices, values)], TEI's /embed_sparse
    encoder.decode(m[0], top_k=5)                          # [("guitar", 2.31), ...]
    index = SparseIndex.build(texts, encoder); index.search("who plays guitar", k=10)

SPLADE (Formal et al. 2021, v2): each token's masked-LM logits over the vocabulary, w = log(1 + ReLU(logits)) (twice
log1p for sentence-transformers' "log1p_relu"), then the maximum (or the sum) over the text's tokens, special
tokens included, as sentence-transformers' SpladePooling. BGE-M3 (Chen et al. 2024): each token's weight
ReLU(sparse_linear(h)) on its own token id, the maximum over repeats, its special tokens (cls, eos, pad, unk) left
out. Both read every token's last hidden state from the Featurizer's hot path (`Featurizer.embed_tokens`: its
windows, batches, runtime and precision), so a sparse vector costs the dense featurization plus its own head.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ctxrep.featurize.spec import FeaturizerSpec
from ctxrep.models.folders import CheckpointError
from ctxrep.models.mlm_head import read_mlm_head
from ctxrep.models.sentence_transformers import MODULES_FILE, read_modules, read_settings, with_prompt
from ctxrep.vectors.hits import Hits

__all__ = [
    "SparseEncoder",
    "SparseIndex",
    "SparseVector",
    "SpladeSettings",
    "SpladeHead",
    "BgeM3Head",
    "SPARSE_HEADS",
    "is_sparse_folder",
]

SPARSE_LINEAR_FILE = "sparse_linear.pt"  # BGE-M3's sparse head: Linear(hidden, 1)
APPLIED_MODULES = ("Transformer", "MLMTransformer", "SpladePooling")  # a SparseEncoder folder's modules ctxrep applies


@dataclass(frozen=True)
class SparseVector:
    """One text's non-zero weights: vocabulary ids (ascending) and their values; TEI's /embed_sparse items."""

    indices: list[int]
    values: list[float]

    def to_tei(self) -> list[dict]:
        """[{"index": id, "value": weight}, ...] as text-embeddings-inference's /embed_sparse answers."""
        return [{"index": i, "value": v} for i, v in zip(self.indices, self.values)]


@dataclass(frozen=True)
class SpladeSettings:
    """sentence-transformers' SpladePooling config: pooling over tokens ("max" or "sum") and activation ("relu":
    log(1 + relu(x)); "log1p_relu": log(1 + log(1 + relu(x))))."""

    pooling_strategy: str = "max"
    activation_function: str = "relu"

    def __post_init__(self) -> None:
        if self.pooling_strategy not in ("max", "sum"):
            raise CheckpointError(f"SpladePooling pooling_strategy {self.pooling_strategy!r}: expected max or sum")
        if self.activation_function not in ("relu", "log1p_relu"):
            raise CheckpointError(
                f"SpladePooling activation_function {self.activation_function!r}: expected relu or log1p_relu"
            )

    @classmethod
    def of_folder(cls, folder: Path) -> SpladeSettings:
        """The SpladePooling module a sentence-transformers folder's modules.json lists (defaults without one)."""
        modules = read_modules(folder)
        pooling = [m for m in modules if m.kind == "SpladePooling"]
        if not pooling:
            return cls()
        others = [m.kind for m in modules if m.kind not in APPLIED_MODULES]
        if others:  # e.g. an inference-free query side (Router, SparseStaticEmbedding), CSR's SparseAutoEncoder
            raise CheckpointError(
                f"{Path(folder) / MODULES_FILE}: lists {', '.join(others)}, which ctxrep's SparseEncoder does not "
                f"apply (it applies {', '.join(APPLIED_MODULES)}); use sentence_transformers.SparseEncoder for this "
                "folder"
            )
        config = pooling[0].config or {}
        return cls(config.get("pooling_strategy", "max"), config.get("activation_function", "relu"))


class SpladeHead:
    """SPLADE: each token's masked-LM logits over the vocabulary, log(1 + ReLU) (twice log1p for "log1p_relu"),
    then the maximum (or sum) over each text's tokens (sentence-transformers' SpladePooling settings)."""

    holds = "masked-LM head (cls.predictions.* / lm_head.*: SPLADE)"

    def __init__(self, mlm_head, settings: SpladeSettings) -> None:
        self.mlm_head, self.settings = mlm_head, settings

    @classmethod
    def of_folder(cls, folder: Path, featurizer) -> SpladeHead | None:
        """The folder's masked-LM head over the featurizer's encoder (its decoder is the encoder's word
        embeddings), on the encoder's device; None when the folder has none."""
        model = featurizer.model
        head = read_mlm_head(folder, model) if hasattr(model, "embeddings") else None
        if head is None:
            return None
        return cls(head.to(next(model.parameters()).device), SpladeSettings.of_folder(folder))

    def weights(self, ids: torch.Tensor, h: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """A block of texts' token states h (tokens, hidden) -> (texts, vocab) pooled weights.

        Max pooling takes the maximum of each text's raw logits and adds the bias and the activation after it,
        on (texts, vocab) rather than (tokens, vocab): the same floats, since adding a per-id constant, ReLU and
        log1p are all non-decreasing (so is their rounding), and it spares three passes over the logits."""
        head = self.mlm_head
        h = h.to(head.bias.device)
        z = head.norm(head.activation(head.dense(h)))  # (tokens, embedding)
        if self.settings.pooling_strategy == "max":
            logits = z @ head.decoder.weight.T  # (tokens, vocab), the bias comes after the maximum
            w = torch.stack([x.amax(dim=0) for x in logits.split(sizes)]).add_(head.bias)  # (texts, vocab)
            w = w.relu_().log1p_()
            if self.settings.activation_function == "log1p_relu":
                w = w.log1p_()
        else:  # sum: each token's weight, then the sum
            w = (z @ head.decoder.weight.T).add_(head.bias).relu_().log1p_()  # (tokens, vocab)
            if self.settings.activation_function == "log1p_relu":
                w = w.log1p_()
            w = torch.stack([x.sum(dim=0) for x in w.split(sizes)])
        return w


class BgeM3Head:
    """BGE-M3's sparse head: each token's weight relu(sparse_linear(h)) on its own token id, the maximum over
    repeats, its special tokens (cls, eos, pad, unk) left out."""

    holds = f"{SPARSE_LINEAR_FILE} (BGE-M3's sparse head)"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, vocab_size: int, unused_ids: np.ndarray) -> None:
        self.weight, self.bias, self.vocab_size, self.unused_ids = weight, bias, vocab_size, unused_ids

    @classmethod
    def of_folder(cls, folder: Path, featurizer) -> BgeM3Head | None:
        """The folder's sparse_linear.pt (a Linear(hidden, 1) state dict, read with weights_only=True); None
        without it."""
        file = Path(folder) / SPARSE_LINEAR_FILE
        if not file.is_file():
            return None
        state = torch.load(file, map_location="cpu", weights_only=True)
        try:
            weight, bias = state["weight"].float(), state["bias"].float()
        except (KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{file}: expected a Linear(hidden, 1) state dict with weight and bias") from None
        vocab = featurizer.tokenizer.backend
        names = ("<s>", "</s>", "<pad>", "<unk>", "[CLS]", "[SEP]", "[PAD]", "[UNK]")  # cls, eos (sep), pad, unk
        unused = np.array(sorted({vocab.token_to_id(t) for t in names} - {None}), dtype=np.int64)
        return cls(weight, bias, int(featurizer.model.input_embeddings().shape[0]), unused)

    def weights(self, ids: torch.Tensor, h: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """A block of texts' token ids (tokens,) and states h (tokens, hidden) -> (texts, vocab) weights."""
        rows = []
        for i, x in zip(ids.split(sizes), h.split(sizes)):
            w = torch.relu(x @ self.weight.T + self.bias).squeeze(-1)  # (tokens,)
            dense = torch.zeros(self.vocab_size).scatter_reduce_(0, i, w, reduce="amax", include_self=True)
            dense[torch.from_numpy(self.unused_ids)] = 0.0
            rows.append(dense)
        return torch.stack(rows)  # (texts, vocab)


# What a folder holds -> the head that reads it: the first row whose head the folder holds wins.
SPARSE_HEADS: tuple[type[BgeM3Head] | type[SpladeHead], ...] = (BgeM3Head, SpladeHead)


def is_sparse_folder(folder: str | os.PathLike) -> bool:
    """Whether a folder is a sparse encoder by what it declares: a sentence-transformers SparseEncoder folder
    (config_sentence_transformers.json's model_type, or a SpladePooling module in modules.json). A bare
    *ForMaskedLM folder is not (BERT's own checkpoints are MLM folders); BGE-M3 is a dense model with a sparse head
    beside it (SPARSE_LINEAR_FILE)."""
    try:
        if read_settings(folder).get("model_type") == "SparseEncoder":
            return True
        return any(m.kind == "SpladePooling" for m in read_modules(folder))
    except CheckpointError:  # a malformed file: not recognisably sparse (loading it says what is wrong)
        return False


class SparseEncoder:
    """Texts -> sparse vectors over the model's vocabulary, a sibling of ctxrep.Featurizer (see the module docs).

    model: a folder or name with a masked-LM head (BertForMaskedLM / RobertaForMaskedLM-like weights, as SPLADE
    checkpoints and sentence-transformers SparseEncoder folders hold them) or BGE-M3's sparse_linear.pt; or a
    ready ctxrep.Featurizer over such a model. The head is the first row of SPARSE_HEADS the folder holds
    (`encoder.head`: SpladeHead or BgeM3Head). max_active_dims: keep only each vector's largest weights (as
    sentence-transformers' max_active_dims). Further keyword arguments go to the Featurizer (device, precision,
    backend, batch_tokens, ...); the layer is always the last and the head runs in float32.
    """

    def __init__(self, model="minilm", max_active_dims: int | None = None, **featurizer_kwargs) -> None:
        from ctxrep.featurize import Featurizer

        if max_active_dims is not None and (not isinstance(max_active_dims, int) or max_active_dims < 1):
            raise ValueError(f"max_active_dims must be a positive integer or None, got {max_active_dims!r}")
        kwargs = {"sentence_pooling": "mean"} | featurizer_kwargs  # token states only: the sentence pooling is unread
        self.featurizer = model if isinstance(model, Featurizer) else Featurizer(model, **kwargs)
        self.featurizer = self.featurizer.with_layers(-1)
        self.max_active_dims = max_active_dims
        self.prompts = self.featurizer.prompts  # config_sentence_transformers.json's, or none
        folder = self.featurizer.source.folder
        self.head = next((h for h in (row.of_folder(folder, self.featurizer) for row in SPARSE_HEADS) if h), None)
        if self.head is None:
            raise CheckpointError(
                f"{folder}: {' and '.join('no ' + r.holds for r in SPARSE_HEADS)}: sparse vectors need a SPLADE "
                "checkpoint (a *ForMaskedLM folder, e.g. naver/splade-v3) or BGE-M3"
            )

    @property
    def vocab_size(self) -> int:
        """Width of a sparse vector: the tokenizer's vocabulary."""
        return int(self.featurizer.model.input_embeddings().shape[0])

    @property
    def spec(self) -> FeaturizerSpec:
        """The dense featurizer's spec underneath (what made the token states), head "sparse"."""
        return dataclasses.replace(FeaturizerSpec.of(self.featurizer), head="sparse")

    # the Featurizer's shape questions, so that an embedding job takes either
    sentence_dim = vocab_size
    single_layer = True

    def embed_sentences(
        self,
        texts: Sequence[str | list[str]],
        batch_texts: int = 256,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ):
        """(texts, vocab_size) scipy.sparse.csr_matrix of float32 weights.

        prompt / prompt_name: text put before each text, as Featurizer.embed_sentences (given, or the folder's prompt
        of that name, else its default prompt) and sentence-transformers' SparseEncoder.encode."""
        return self._embed(texts, None, prompt, prompt_name, batch_texts)

    def embed_queries(self, texts: Sequence[str], prompt: str | None = None, prompt_name: str | None = None):
        """embed_sentences for queries: the folder's "query" prompt unless one is given (SparseEncoder.encode_query)."""
        return self._embed(texts, "query", prompt, prompt_name)

    def embed_documents(self, texts: Sequence[str], prompt: str | None = None, prompt_name: str | None = None):
        """embed_sentences for documents: the folder's "document" prompt unless one is given (encode_document)."""
        return self._embed(texts, "document", prompt, prompt_name)

    def _embed(self, texts, task: str | None, prompt: str | None, prompt_name: str | None, batch_texts: int = 256):
        import scipy.sparse

        texts = with_prompt(
            self.prompts.resolve(prompt, prompt_name, task), [texts] if isinstance(texts, str) else list(texts)
        )
        parts = [
            self._rows(self.featurizer.embed_tokens(texts[start : start + batch_texts]))
            for start in range(0, len(texts), batch_texts)
        ]
        if not parts:
            return scipy.sparse.csr_matrix((0, self.vocab_size), dtype=np.float32)
        return scipy.sparse.vstack(parts, format="csr", dtype=np.float32)

    def embed_sparse(
        self, texts: Sequence[str | list[str]], prompt: str | None = None, prompt_name: str | None = None
    ) -> list[SparseVector]:
        """One SparseVector (ids ascending, non-zero weights) per text: the function behind `ctxrep serve`'s
        /embed_sparse (TEI's schema: `vector.to_tei()`); prompt / prompt_name as embed_sentences."""
        m = self.embed_sentences(texts, prompt=prompt, prompt_name=prompt_name)
        return [
            SparseVector(
                m.indices[m.indptr[i] : m.indptr[i + 1]].tolist(), m.data[m.indptr[i] : m.indptr[i + 1]].tolist()
            )
            for i in range(m.shape[0])
        ]

    def decode(self, row, top_k: int | None = None) -> list[tuple[str, float]]:
        """A sparse row (1, vocab) or SparseVector as (token, weight) pairs, largest first."""
        if isinstance(row, SparseVector):
            ids, values = np.asarray(row.indices, np.int64), np.asarray(row.values, np.float32)
        else:
            row = row.tocsr()
            ids, values = row.indices, row.data
        order = np.argsort(-values, kind="stable")[:top_k]
        vocab = self.featurizer.tokenizer.backend
        return [(vocab.id_to_token(int(ids[i])), float(values[i])) for i in order]

    def _rows(self, token_states, block_tokens: int = 1024):
        """The (texts, vocab) csr rows of texts' TokenStates. The head runs on blocks of whole texts of about
        `block_tokens` tokens together (real tokens only, no padding), so its (tokens, vocabulary) logits stay
        bounded in memory."""
        import scipy.sparse

        lengths = np.array([len(t.ids) for t in token_states], dtype=np.int64)
        ends = np.cumsum(lengths)
        parts, first = [], 0
        with torch.inference_mode():
            while first < len(token_states):
                done = ends[first - 1] if first else 0
                last = first + max(1, int(np.searchsorted(ends[first:] - done, block_tokens, side="right")))
                block, sizes = token_states[first:last], lengths[first:last].tolist()
                h = torch.from_numpy(np.concatenate([t.states for t in block]).astype(np.float32, copy=False))
                ids = torch.from_numpy(np.concatenate([t.ids for t in block]))
                parts.append(self._csr(self.head.weights(ids, h, sizes)))
                first = last
        if not parts:
            return scipy.sparse.csr_matrix((0, self.vocab_size), dtype=np.float32)
        return parts[0] if len(parts) == 1 else scipy.sparse.vstack(parts, format="csr", dtype=np.float32)

    def _csr(self, dense: torch.Tensor):
        """A (texts, vocab) tensor of weights as a float32 csr matrix of its non-zeros (of each row's
        max_active_dims largest, when set), built from the non-zeros directly."""
        import scipy.sparse

        n, vocab = dense.shape
        if self.max_active_dims is not None and self.max_active_dims < vocab:
            top = torch.topk(dense, self.max_active_dims, dim=1)
            dense = torch.zeros_like(dense).scatter_(1, top.indices, top.values)  # (texts, k) kept, ids in order
        dense = dense.float().cpu()
        rows, cols = dense.nonzero(as_tuple=True)  # row-major: each row's ids ascending
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rows.numpy(), minlength=n), out=indptr[1:])
        return scipy.sparse.csr_matrix((dense[rows, cols].numpy(), cols.numpy(), indptr), shape=(n, vocab))


# ---- the inverted index ---------------------------------------------------------------------------------------


class SparseIndex:
    """Sparse vectors with ids and texts, searched by dot product through an inverted index: the postings of each
    vocabulary id (a CSR matrix of (vocabulary, documents)), walked only for the query's non-zero ids; exact.

    On disk: index.json (count, vocabulary size, the encoder's spec and SPLADE settings), postings.npz
    (scipy.sparse), items.jsonl ({"id", "text"} per document, in row order).
    """

    def __init__(self, vocab_size: int, encoder: SparseEncoder | None = None) -> None:
        import scipy.sparse

        self.vocab_size = int(vocab_size)
        self.encoder = encoder
        self.spec = None if encoder is None else encoder.spec  # what made the vectors
        self.max_active_dims = None if encoder is None else encoder.max_active_dims
        self.ids: list = []
        self.texts: list[str | None] = []
        self._docs = scipy.sparse.csr_matrix((0, self.vocab_size), dtype=np.float32)  # (documents, vocabulary)
        self._postings = None  # (vocabulary, documents) CSR, built on the first search after an add

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def build(cls, texts: Sequence[str], encoder: SparseEncoder, ids: Sequence | None = None) -> SparseIndex:
        """Embed `texts` with `encoder` and index them (ids default to 0, 1, 2, ...)."""
        return cls(encoder.vocab_size, encoder).add(texts, ids)

    @classmethod
    def from_vectors(cls, folder, ids: Sequence | None = None, texts: Sequence[str | None] | None = None):
        """An index over a `ctxrep embed --output sparse` folder (ids default to its 0-based text numbers; text
        queries are embedded with its recorded spec)."""
        from ctxrep.vectors.store import load_vectors

        stored = load_vectors(folder)
        if not stored.sparse:
            raise ValueError(
                f"{folder}: holds dense vectors; a sparse index needs `ctxrep embed --output sparse` output"
            )
        index = cls(stored.dim)
        index.spec = stored.spec
        return index.add_vectors(stored.array, ids, texts)

    def add(self, texts: Sequence[str], ids: Sequence | None = None) -> SparseIndex:
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.add_vectors(self._encoder().embed_documents(texts), ids, texts)  # the document prompt

    def _encoder(self) -> SparseEncoder:
        """The encoder of text queries: the one given, else rebuilt from the saved spec on first use."""
        if self.encoder is None:
            if self.spec is None:
                raise ValueError("this index does not know which model made its vectors: search it with vectors")
            self.encoder = SparseEncoder(**self.spec.featurizer_kwargs(), max_active_dims=self.max_active_dims)
        return self.encoder

    def add_vectors(self, matrix, ids: Sequence | None = None, texts: Sequence[str | None] | None = None):
        """Add a (n, vocab_size) sparse matrix with its ids (default: the next row numbers) and texts."""
        import scipy.sparse

        matrix = scipy.sparse.csr_matrix(matrix, dtype=np.float32)
        if matrix.shape[1] != self.vocab_size:
            raise ValueError(f"vectors {matrix.shape[1]} wide do not fit this index of {self.vocab_size}-wide ones")
        n = matrix.shape[0]
        ids = list(range(len(self), len(self) + n)) if ids is None else list(ids)
        texts = [None] * n if texts is None else list(texts)
        if len(ids) != n or len(texts) != n:
            raise ValueError(f"{n} vectors but {len(ids)} ids and {len(texts)} texts; give one of each per vector")
        seen = set(self.ids)
        for i in ids:
            if i in seen:
                raise ValueError(f"id {i!r} is already in the index; ids must be unique")
            seen.add(i)
        self._docs = scipy.sparse.vstack([self._docs, matrix], format="csr")
        self.ids.extend(ids)
        self.texts.extend(texts)
        self._postings = None
        return self

    def search(self, queries, k: int = 10) -> Hits | list[Hits]:
        """The k documents with the largest dot product with each query, best first: one Hits for one query (a text
        or a SparseVector), a list of Hits for a list of them or a sparse (n, vocab) matrix (a matrix of one row
        gives one Hits until 0.3, with a DeprecationWarning: then a list of one, as SentenceIndex's 2-D queries)."""
        import scipy.sparse

        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        single = isinstance(queries, (str, SparseVector))
        if scipy.sparse.issparse(queries):
            q = scipy.sparse.csr_matrix(queries, dtype=np.float32)
            if q.shape[0] == 1:
                warnings.warn(
                    "SparseIndex.search of a one-row sparse matrix gives one Hits until 0.3, then a list of one Hits "
                    "as for every 2-D batch of queries (SentenceIndex's too); for one Hits pass the text or a "
                    "SparseVector",
                    DeprecationWarning,
                    stacklevel=2,
                )
                single = True
        else:
            items = [queries] if single else list(queries)
            if items and all(isinstance(x, SparseVector) for x in items):
                q = self._matrix(items)
            elif all(isinstance(x, str) for x in items):
                q = self._encoder().embed_queries(items)
            else:
                raise TypeError(
                    "queries must be a text, a SparseVector, a list of either, or a sparse (n, vocabulary) matrix"
                )
        if q.shape[1] != self.vocab_size:
            raise ValueError(f"queries {q.shape[1]} wide do not fit this index of {self.vocab_size}-wide vectors")
        if self._postings is None:
            self._postings = self._docs.T.tocsr()  # (vocabulary, documents): one posting list per id
        scores = (q @ self._postings).toarray()  # (queries, documents): only the query's ids' postings are read
        k = min(int(k), len(self))
        out = []
        for s in scores:
            top = np.argpartition(-s, k - 1)[:k] if k < len(s) else np.arange(len(s))
            top = top[np.lexsort((top, -s[top]))]  # best first; ties by row
            out.append(Hits.from_rows(top, s[top], self.ids, self.texts))
        return out[0] if single else out

    def _matrix(self, vectors: list[SparseVector]):
        """SparseVectors as a (n, vocab_size) csr matrix."""
        import scipy.sparse

        indptr = np.cumsum([0] + [len(v.indices) for v in vectors])
        indices = np.concatenate([np.asarray(v.indices, np.int64) for v in vectors])
        values = np.concatenate([np.asarray(v.values, np.float32) for v in vectors])
        if len(indices) and (indices.min() < 0 or indices.max() >= self.vocab_size):
            raise ValueError(f"a SparseVector's ids lie outside this index's vocabulary of {self.vocab_size}")
        return scipy.sparse.csr_matrix((values, indices, indptr), shape=(len(vectors), self.vocab_size))

    def save(self, path: str | os.PathLike) -> Path:
        import scipy.sparse

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        scipy.sparse.save_npz(path / "postings.npz", self._docs)
        with open(path / "items.jsonl", "w", encoding="utf-8") as f:
            for i, t in zip(self.ids, self.texts):
                f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
        meta = {
            "format": "ctxrep-sparse-index",
            "version": 1,
            "count": len(self),
            "vocab_size": self.vocab_size,
            "spec": None if self.spec is None else self.spec.to_dict(),
            "max_active_dims": self.max_active_dims,
        }
        (path / "index.json").write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, encoder: SparseEncoder | None = None) -> SparseIndex:
        """Read a folder written by `save`; `encoder` (for text queries) is checked against the saved spec."""
        import scipy.sparse

        path = Path(path)
        try:
            meta = json.loads((path / "index.json").read_text())
            if meta.get("format") != "ctxrep-sparse-index":
                raise KeyError("format")
            docs = scipy.sparse.load_npz(path / "postings.npz").tocsr().astype(np.float32)
            items = [json.loads(line) for line in (path / "items.jsonl").read_text(encoding="utf-8").splitlines()]
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(
                f"{path}: not a sparse index written by SparseIndex.save ({type(e).__name__}: {e})"
            ) from None
        spec = FeaturizerSpec.from_dict(meta["spec"], str(path / "index.json")) if meta.get("spec") else None
        if encoder is not None and spec is not None:
            spec.check(encoder.spec, str(path), "load it without an encoder to embed queries as it was built")
        if docs.shape != (meta["count"], meta["vocab_size"]) or len(items) != meta["count"]:
            raise ValueError(
                f"{path}: index.json says {meta['count']} documents but the files disagree; build it again"
            )
        index = cls(meta["vocab_size"], encoder)
        index.spec, index.max_active_dims = spec, meta.get("max_active_dims")
        index._docs = docs
        index.ids = [item["id"] for item in items]
        index.texts = [item["text"] for item in items]
        return index
