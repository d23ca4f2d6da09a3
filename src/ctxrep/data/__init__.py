"""Readers for the data sets people bring, and the packed pretraining corpus.

    from ctxrep.data import read_conll, read_conllu, read_sst, read_glue_tsv, read_squad, read_wic, read_sts
    from ctxrep.data import read_labelled_texts, read_tagged, read_questions   # CSV / TSV / JSONL / CoNLL task files

Each name is imported on first use (`import ctxrep.data` alone loads no reader and no numpy).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    # SST trees (sst.py)
    "read_sst": "sst",
    "SSTData": "sst",
    "SSTTree": "sst",
    "parse_sst_tree": "sst",
    "iter_sst_trees": "sst",
    "sst_label": "sst",
    # CoNLL-2003 columns (conll.py) and CoNLL-U (conllu.py)
    "read_conll": "conll",
    "iter_conll": "conll",
    "ConllSentence": "conll",
    "read_conllu": "conllu",
    "iter_conllu": "conllu",
    "ConlluSentence": "conllu",
    # GLUE TSV (glue.py), SQuAD (squad.py), WiC (wic.py)
    "read_glue_tsv": "glue",
    "iter_glue_tsv": "glue",
    "GlueExample": "glue",
    "read_squad": "squad",
    "iter_squad": "squad",
    "SquadExample": "squad",
    "SquadAnswer": "squad",
    "read_wic": "wic",
    "iter_wic": "wic",
    "WicPair": "wic",
    # graded similarity: STS benchmark, GLUE STS-B, SICK (sts.py)
    "read_sts": "sts",
    "read_sick": "sts",
    "ScoredPair": "sts",
    # the user's own task files: CSV / TSV / JSONL / CoNLL columns, gzip or not (table.py)
    "read_labelled_texts": "table",
    "read_scored_texts": "table",
    "read_tagged": "table",
    "read_questions": "table",
    "read_source_target": "table",  # (source, target) pairs for seq2seq training
    "TaskData": "table",
    # a sentence encoder's training pairs / triples / scored pairs (sentence_pairs.py)
    "read_sentence_examples": "sentence_pairs",
    "read_scored_pairs": "sentence_pairs",
    # tag schemes and entity F1 (tags.py)
    "entities": "tags",
    "entity_scores": "tags",
    "iob1_to_bio": "tags",
    "bio_to_iobes": "tags",
    "Entity": "tags",
    "Scores": "tags",
    "NerScores": "tags",
    # the packed pretraining corpus (corpus.py) and its packings (packing.py)
    "pack_corpus": "corpus",
    "PackedCorpus": "corpus",
    "CorpusConfig": "corpus",
    "CorpusError": "corpus",
    "SegmentPairPacker": "packing",
    "SegmentPairConfig": "packing",
    "FullSentencesPacker": "packing",
    "FullSentencesConfig": "packing",
    "PackingError": "packing",
    # tokenizers trained on a corpus: WordPiece, byte-level BPE, word vocabularies (tokenizer_training.py)
    "train_tokenizer": "tokenizer_training",
}

__all__ = [
    "ConllSentence",
    "ConlluSentence",
    "CorpusConfig",
    "CorpusError",
    "Entity",
    "FullSentencesConfig",
    "FullSentencesPacker",
    "GlueExample",
    "NerScores",
    "PackedCorpus",
    "PackingError",
    "SSTData",
    "SSTTree",
    "ScoredPair",
    "Scores",
    "SegmentPairConfig",
    "SegmentPairPacker",
    "SquadAnswer",
    "SquadExample",
    "TaskData",
    "WicPair",
    "bio_to_iobes",
    "entities",
    "entity_scores",
    "iob1_to_bio",
    "iter_conll",
    "iter_conllu",
    "iter_glue_tsv",
    "iter_squad",
    "iter_sst_trees",
    "iter_wic",
    "pack_corpus",
    "parse_sst_tree",
    "read_conll",
    "read_conllu",
    "read_glue_tsv",
    "read_labelled_texts",
    "read_questions",
    "read_scored_pairs",
    "read_scored_texts",
    "read_sentence_examples",
    "read_sick",
    "read_source_target",
    "read_squad",
    "read_sst",
    "read_sts",
    "read_tagged",
    "read_wic",
    "sst_label",
    "train_tokenizer",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxrep.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ctxrep.data.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
