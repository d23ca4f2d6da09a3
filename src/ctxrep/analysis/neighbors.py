"""Nearest neighbours of word occurrences in context, the static contrast, and WiC by layer.

* `OccurrenceIndex`: every word occurrence of a corpus, embedded at one layer, in ctxrep's nearest-neighbour index
  (`ctxrep.vectors.index.SentenceIndex`, cosine) saved to disk with the occurrence metadata (sentence, word index)
  and the spec of its vectors. A query is a word in a
  sentence; the answer is the closest occurrences with their sentences. `read_queries` reads a file of queries
  (one a line: `SENTENCE<TAB>WORD_INDEX`, or the sentence with its word marked `[[word]]`) for `query_many`,
  which embeds them all in one call.
* The static (context-free) contrast: the model's input embedding of a word (the mean of its pieces' rows of
  the word-embedding matrix) and its nearest vocabulary words by cosine.
* WiC by layer (Pilehvar & Camacho-Collados 2019): the cosine of the two target-word vectors at each layer;
  the threshold is chosen on train (predict "same sense" when cos >= threshold) and scored on dev.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ctxrep.analysis._common import model_name, with_layers
from ctxrep.featurize import Featurizer
from ctxrep.featurize.spec import SENTENCE_ONLY, FeaturizerSpec
from ctxrep.util.files import utf8_lines
from ctxrep.vectors.index import SentenceIndex

OLD_INDEX_FILE = "index.hnsw"  # what ctxrep wrote before the occurrence index was a SentenceIndex
META_FILE = "occurrences.json"


@dataclass
class Occurrence:
    sentence: int  # index into the indexed corpus
    word: int  # word index within that sentence


@dataclass
class Neighbor:
    sentence: int
    word: int
    text: str  # the word
    similarity: float  # cosine
    context: str  # the whole sentence, words joined by spaces


def _words(sentence: str | Sequence[str]) -> list[str]:
    words = sentence.split() if isinstance(sentence, str) else list(sentence)
    if not words:
        raise ValueError("the query sentence is empty (no words)")
    return words


QUERY_MARK = ("[[", "]]")  # a query word marked in its sentence: "A [[crane]] lifted the beam ."
QUERY_FORMAT = "SENTENCE<TAB>WORD_INDEX (0-based) or the sentence with one word marked [[word]]"


@dataclass
class Query:
    """A word in a sentence to find neighbours for; `source` says where it came from ("FILE:LINE")."""

    words: list[str]
    word: int  # 0-based index into words
    source: str = "<query>"

    @property
    def target(self) -> str:
        return self.words[self.word]


def parse_query(line: str, source: str = "<query>") -> Query:
    """One query line: `SENTENCE<TAB>WORD_INDEX`, or a sentence with exactly one word marked `[[word]]`; errors
    start with `source`."""
    line = line.rstrip("\r\n")
    if "\t" in line:
        sentence, _, index = line.rpartition("\t")
        words = sentence.split()
        try:
            word = int(index.strip())
        except ValueError:
            raise ValueError(
                f"{source}: the text after the tab must be the 0-based index of the query word, got "
                f"{index.strip()!r}; expected {QUERY_FORMAT}"
            ) from None
    else:
        words = line.split()
        marked = [
            i
            for i, w in enumerate(words)
            if w.startswith(QUERY_MARK[0])
            and w.endswith(QUERY_MARK[1])
            and len(w) > len(QUERY_MARK[0]) + len(QUERY_MARK[1])
        ]
        if len(marked) != 1:
            found = "no word is" if not marked else f"{len(marked)} words are"
            raise ValueError(f"{source}: {found} marked [[like this]] and there is no tab; expected {QUERY_FORMAT}")
        word = marked[0]
        words[word] = words[word][len(QUERY_MARK[0]) : -len(QUERY_MARK[1])]
    if not words:
        raise ValueError(f"{source}: the query sentence is empty (no words); expected {QUERY_FORMAT}")
    try:
        _check_word(words, word)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    return Query(words, word, source)


def read_queries(path: str | os.PathLike) -> list[Query]:
    """Every query of a file, one a line (see `parse_query`; blank lines are skipped), each knowing its FILE:LINE.
    The whole file is checked before anything is embedded."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such queries file")
    queries = [parse_query(line, f"{path}:{n}") for n, line in utf8_lines(path) if line.strip()]
    if not queries:
        raise ValueError(f"{path}: no queries in the file; write one a line: {QUERY_FORMAT}")
    return queries


def _check_word(words: list[str], word: int) -> None:
    if not isinstance(word, int) or not 0 <= word < len(words):
        raise ValueError(
            f"word index {word!r} is outside the sentence, which has {len(words)} words "
            f"(0..{len(words) - 1}): {' '.join(words)!r}"
        )


class OccurrenceIndex:
    """The word occurrences of a corpus at one layer of one model, searchable by cosine: a
    `ctxrep.vectors.index.SentenceIndex` (ctxrep's one nearest-neighbour index: exact up to 20,000 rows, HNSW
    above) whose row r is occurrence r, with the sentences and occurrences beside it."""

    def __init__(self, index: SentenceIndex, sentences: list[list[str]], occurrences: list[Occurrence], layer: int):
        self.index = index  # cosine, ids = row numbers; index.spec: what made the vectors
        self.sentences = sentences
        self.occurrences = occurrences
        self.layer = layer

    @property
    def dim(self) -> int:
        return self.index.dim

    @property
    def model(self) -> str:
        """The model name that loads the indexed model again (a Hub name with its commit)."""
        return self.index.spec.featurizer_kwargs()["model"]

    @property
    def pooling(self) -> str:
        return self.index.spec.pooling

    @classmethod
    def build(
        cls,
        fz: Featurizer,
        sentences: Sequence[str | Sequence[str]],
        layer: int = -1,
        m: int = 16,
        ef_construction: int = 200,
    ) -> OccurrenceIndex:
        """Embed every word of `sentences` at `layer` (0 = embeddings, negative counts from the top) and index it."""
        if not sentences:
            raise ValueError("no sentences to index (empty corpus)")
        word_lists = []
        for i, s in enumerate(sentences):
            try:
                word_lists.append(_words(s))
            except ValueError:
                raise ValueError(f"sentence {i} is empty (no words)") from None
        n_layers = fz.num_layers + 1
        if not isinstance(layer, int) or not -n_layers <= layer < n_layers:
            raise ValueError(
                f"layer {layer!r} is out of range: the model has layers 0..{n_layers - 1} (0 = embeddings)"
            )
        layer %= n_layers
        view = with_layers(fz, layer)
        vectors = view.embed_words(word_lists)
        occurrences = [Occurrence(s, w) for s, v in enumerate(vectors) for w in range(len(v))]
        index = SentenceIndex.from_vectors(
            np.concatenate(vectors), spec=FeaturizerSpec.of(view), hnsw_m=m, hnsw_ef_construction=ef_construction
        )
        return cls(index, word_lists, occurrences, layer)

    def save(self, directory: str | os.PathLike) -> None:
        """Write the index (SentenceIndex.save's files) and occurrences.json (layer, sentences, occurrences)."""
        directory = Path(directory)
        self.index.save(directory)
        meta = {
            "layer": self.layer,
            "sentences": self.sentences,
            "occurrences": [[o.sentence, o.word] for o in self.occurrences],
        }
        (directory / META_FILE).write_text(json.dumps(meta) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike) -> OccurrenceIndex:
        directory = Path(directory)
        if (directory / OLD_INDEX_FILE).is_file() and not (directory / "index.json").is_file():
            raise ValueError(
                f"{directory}: an occurrence index written by an older ctxrep; build it again (ctxrep neighbors index)"
            )
        for name in ("index.json", META_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory / name}: missing; build the index first (ctxrep neighbors index)")
        try:
            meta = json.loads((directory / META_FILE).read_text())
            occurrences = [Occurrence(s, w) for s, w in meta["occurrences"]]
            sentences, layer = meta["sentences"], int(meta["layer"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{directory / META_FILE}: not an occurrence index's metadata ({e})") from None
        index = SentenceIndex.load(directory)
        if len(index) != len(occurrences) or index.spec is None:
            raise ValueError(
                f"{directory}: the index holds {len(index)} vectors but the metadata lists {len(occurrences)} "
                "occurrences (or it records no model); rebuild it"
            )
        return cls(index, sentences, occurrences, layer)

    def search(self, vector: np.ndarray, k: int = 10) -> list[Neighbor]:
        """The k occurrences closest to `vector` by cosine, closest first."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        if len(vector) != self.dim:
            raise ValueError(
                f"the index holds {self.dim}-wide vectors but the query is {len(vector)}-wide; "
                f"query with the model the index was built with ({self.model})"
            )
        hits = self.index.search(vector, k=k)
        out = []
        for row, similarity in zip(hits.rows.tolist(), hits.scores.tolist()):
            o = self.occurrences[row]
            words = self.sentences[o.sentence]
            out.append(Neighbor(o.sentence, o.word, words[o.word], float(similarity), " ".join(words)))
        return out

    def query(self, fz: Featurizer, sentence: str | Sequence[str], word: int, k: int = 10) -> list[Neighbor]:
        """The occurrences closest to word `word` (0-based) of `sentence`, embedded like the indexed corpus."""
        words = _words(sentence)
        _check_word(words, word)
        return self.query_many(fz, [Query(words, word)], k)[0]

    def query_many(self, fz: Featurizer, queries: Sequence[Query], k: int = 10) -> list[list[Neighbor]]:
        """`query` for many queries (e.g. from `read_queries`): their sentences are embedded in one call. `fz` must
        make the indexed word vectors (its model, pooling, precision, ...: SpecMismatch names what differs)."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        view = with_layers(fz, self.layer)
        fix = f"query with the settings the index was built with (model {self.model})"
        self.index.spec.check(FeaturizerSpec.of(view), "the occurrence index", fix, ignore=SENTENCE_ONLY)
        for q in queries:
            try:
                _check_word(q.words, q.word)
            except ValueError as e:
                raise ValueError(f"{q.source}: {e}") from None
        vectors = view.embed_words([q.words for q in queries])
        return [self.search(v[q.word], k) for q, v in zip(queries, vectors)]


# ---- the static contrast ------------------------------------------------------------------------


@dataclass
class StaticVocabulary:
    """The vocabulary entries that are whole words on their own, with their unit-length input embeddings."""

    words: list[str]
    vectors: np.ndarray  # (words, embedding size), rows of unit length

    @classmethod
    def from_featurizer(cls, fz: Featurizer) -> StaticVocabulary:
        table = _embedding_matrix(fz)  # first: a model without one (ELMo) has no vocabulary either
        vocab = fz.tokenizer.backend.get_vocab()
        candidates = sorted({_strip_marker(t) for t in vocab if not _is_special(t)} - {""})
        candidates = [w for w in candidates if any(c.isalnum() for c in w)]
        pieces = fz.tokenizer.encode_words([[w] for w in candidates])
        words, ids = [], []
        for w, p in zip(candidates, pieces):
            if len(p.ids) == 1:
                words.append(w)
                ids.append(p.ids[0])
        table = table[ids]
        return cls(words, table / np.linalg.norm(table, axis=1, keepdims=True).clip(1e-12))


def _strip_marker(token: str) -> str:
    if token.startswith("##"):  # WordPiece continuation: not a word start
        return ""
    return token.removeprefix("Ġ").removeprefix("▁")


def _is_special(token: str) -> bool:
    return (token.startswith("[") and token.endswith("]")) or (token.startswith("<") and token.endswith(">"))


def no_static_table_reason(fz: Featurizer) -> str | None:
    """Why `fz`'s model has no static neighbours (one line), or None when it has a token-embedding table."""
    if fz.model.input_embeddings() is not None:
        return None
    return (
        f"{fz.model.family} has no table of static word vectors (it reads characters: its layer 0 is computed "
        "from them); static neighbours need a model with a token-embedding matrix (BERT, GPT-2, ...)"
    )


def _embedding_matrix(fz: Featurizer) -> np.ndarray:
    """The model's static token-embedding table (vocabulary, dim), or a one-line error for character input."""
    reason = no_static_table_reason(fz)
    if reason is not None:
        raise ValueError(reason)
    return fz.model.input_embeddings().detach().float().numpy()


def static_vector(fz: Featurizer, word: str) -> np.ndarray:
    """The model's context-free input embedding of `word`: the mean of its pieces' word-embedding rows."""
    if not word or word.isspace() or len(word.split()) != 1:
        raise ValueError(f"expected one word without spaces, got {word!r}")
    table = _embedding_matrix(fz)
    ids = fz.tokenizer.encode_words([[word]])[0].ids
    return table[ids].mean(axis=0)


def static_neighbors(
    fz: Featurizer, word: str, k: int = 10, vocabulary: StaticVocabulary | None = None
) -> list[tuple[str, float]]:
    """The k vocabulary words whose input embeddings are closest (cosine) to `word`'s, the word itself left out."""
    _embedding_matrix(fz)  # a one-line error for a model without one, before anything is computed
    vocabulary = vocabulary or StaticVocabulary.from_featurizer(fz)
    v = static_vector(fz, word)
    sims = vocabulary.vectors @ (v / max(float(np.linalg.norm(v)), 1e-12))
    out = []
    for i in np.argsort(-sims):
        if vocabulary.words[i].lower() != word.lower():
            out.append((vocabulary.words[i], float(sims[i])))
        if len(out) == k:
            break
    return out


# ---- WiC by layer -------------------------------------------------------------------------------


@dataclass
class WicLayer:
    layer: int  # 0 = embeddings
    threshold: float  # "same sense" when cos >= threshold, chosen on train
    train_accuracy: float
    dev_accuracy: float


@dataclass
class WicResult:
    model: str
    n_train: int
    n_dev: int
    layers: list[WicLayer]

    @property
    def best(self) -> WicLayer:
        """The layer with the best train accuracy (choosing on dev would overfit it)."""
        return max(self.layers, key=lambda r: r.train_accuracy)

    def table(self) -> str:
        lines = [
            f"WiC by layer | {self.model} | threshold on {self.n_train} train pairs, scored on {self.n_dev} dev",
            f"{'layer':<7}{'threshold':>10}{'train':>8}{'dev':>8}",
        ]
        for r in self.layers:
            lines.append(f"{r.layer:<7}{r.threshold:>10.3f}{r.train_accuracy:>8.3f}{r.dev_accuracy:>8.3f}")
        return "\n".join(lines)

    def save_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def wic_cosines(fz: Featurizer, pairs: Sequence) -> np.ndarray:
    """(pairs, n_layers + 1): the cosine of the two target-word vectors at every layer.

    `pairs` have `.sentence1`, `.sentence2` (word lists) and `.idx1`, `.idx2` (e.g. `ctxrep.data.wic.WicPair`)."""
    if not pairs:
        raise ValueError("no WiC pairs (empty data)")
    for k, p in enumerate(pairs):
        for which, words, index in ((1, p.sentence1, p.idx1), (2, p.sentence2, p.idx2)):
            if not 0 <= index < len(words):
                raise ValueError(
                    f"pair {k}: word index {index} is outside sentence {which}, which has {len(words)} words"
                )
    vectors = with_layers(fz, "all").embed_words([p.sentence1 for p in pairs] + [p.sentence2 for p in pairs])
    u = torch.from_numpy(np.stack([vectors[k][p.idx1] for k, p in enumerate(pairs)]))
    v = torch.from_numpy(np.stack([vectors[len(pairs) + k][p.idx2] for k, p in enumerate(pairs)]))
    return torch.nn.functional.cosine_similarity(u, v, dim=-1).numpy()  # (pairs, layers)


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The threshold t maximising the accuracy of `score >= t` against boolean `labels`, and that accuracy."""
    order = np.argsort(scores)
    s, y = scores[order], labels[order].astype(bool)
    n = len(s)
    # Threshold just above s[i-1] (i = 0..n): the first i pairs say F, the rest say T.
    false_below = np.concatenate([[0], np.cumsum(~y)])
    true_from = np.concatenate([np.cumsum(y[::-1])[::-1], [0]])
    correct = false_below + true_from
    valid = np.ones(n + 1, dtype=bool)
    valid[1:n] = s[1:] > s[:-1]  # a threshold between equal scores does not exist
    i = int(np.argmax(np.where(valid, correct, -1)))
    threshold = s[0] - 1e-6 if i == 0 else (s[-1] + 1e-6 if i == n else (s[i - 1] + s[i]) / 2)
    return float(threshold), float(correct[i]) / n


def evaluate_wic(fz: Featurizer, train_pairs: Sequence, dev_pairs: Sequence) -> WicResult:
    """Per layer: the cosine threshold that is best on train, and its accuracy on dev."""
    for name, pairs in (("train", train_pairs), ("dev", dev_pairs)):
        if not pairs:
            raise ValueError(f"no WiC {name} pairs (empty data)")
        if any(p.label is None for p in pairs):
            raise ValueError(f"the WiC {name} pairs have no gold labels; read them with their gold file")
    train_cos, dev_cos = wic_cosines(fz, train_pairs), wic_cosines(fz, dev_pairs)
    y_train = np.array([p.label for p in train_pairs])
    y_dev = np.array([p.label for p in dev_pairs])
    layers = []
    for j in range(train_cos.shape[1]):
        threshold, train_acc = best_threshold(train_cos[:, j], y_train)
        dev_acc = float(((dev_cos[:, j] >= threshold) == y_dev).mean())
        layers.append(WicLayer(j, threshold, train_acc, dev_acc))
    return WicResult(model_name(fz), len(train_pairs), len(dev_pairs), layers)
