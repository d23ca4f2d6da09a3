"""What the documentation's examples run on (tests/test_docs_examples.py; docs/examples.md says the rules): small
stand-in input files under the names the pages use, and a Hugging Face cache whose Hub names are tiny random folders,
so that a block naming `cross-encoder/ms-marco-MiniLM-L6-v2` runs as written, offline, in a second."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import torch
import transformers

from tests._mt_text import write_parallel
from tests._serve_helpers import tiny_cross_encoder, tiny_splade

SENTENCES = [
    "A crane caught a fish in the river .",
    "A crane lifted the steel beam onto the roof .",
    "Dawn broke over the quiet harbour .",
    "The vase broke when it fell off the shelf .",
    "How do I reset my password ?",
    "Where is my invoice for last month ?",
    "Can I change my e-mail address ?",
    "Stocks fell sharply after the announcement .",
    "A man plays a guitar on the street .",
    "Two dogs play in the snow .",
]

# CoNLL-2003 columns: word, part of speech, chunk, entity
NER = [
    [("John", "NNP", "B-NP", "B-PER"), ("lives", "VBZ", "B-VP", "O"), ("in", "IN", "B-PP", "O"),
     ("Paris", "NNP", "B-NP", "B-LOC"), (".", ".", "O", "O")],
    [("Mary", "NNP", "B-NP", "B-PER"), ("visited", "VBD", "B-VP", "O"), ("London", "NNP", "B-NP", "B-LOC"),
     ("today", "NN", "B-NP", "O"), (".", ".", "O", "O")],
    [("Acme", "NNP", "B-NP", "B-ORG"), ("hired", "VBD", "B-VP", "O"), ("Smith", "NNP", "B-NP", "B-PER"),
     (".", ".", "O", "O")],
]  # fmt: skip

# Universal Dependencies: (word, UPOS, head, relation)
UD = [
    [("The", "DET", 2, "det"), ("vase", "NOUN", 3, "nsubj"), ("broke", "VERB", 0, "root"), (".", "PUNCT", 3, "punct")],
    [("A", "DET", 2, "det"), ("crane", "NOUN", 3, "nsubj"), ("lifted", "VERB", 0, "root"), ("the", "DET", 5, "det"),
     ("beam", "NOUN", 3, "obj"), (".", "PUNCT", 3, "punct")],
    [("Dogs", "NOUN", 2, "nsubj"), ("play", "VERB", 0, "root"), ("in", "ADP", 4, "case"), ("snow", "NOUN", 2, "obl"),
     (".", "PUNCT", 2, "punct")],
]  # fmt: skip

POSITIVE = ["good", "great", "fine", "nice", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "poor", "sad", "dull", "weak"]


def _sst_tree(words: list[str], label: int) -> str:
    """A right-branching SST tree: every inner node and the root take `label`, each word 2 (neutral) or the label."""
    tree = f"({label} {words[-1]})"
    for word in reversed(words[:-1]):
        tree = f"({label} ({label if word in POSITIVE + NEGATIVE else 2} {word}) {tree})"
    return tree


def _reviews(n: int, offset: int = 0) -> list[tuple[str, int]]:
    rows = []
    for i in range(offset, offset + n):
        good = i % 2 == 0
        words = POSITIVE if good else NEGATIVE
        rows.append((f"the film was {words[i % 6]} and {words[(i + 1) % 6]}", 1 if good else 0))
    return rows


def _sts_rows(n: int, offset: int = 0) -> list[tuple[str, str, float]]:
    rows = []
    for i in range(offset, offset + n):
        a = SENTENCES[i % len(SENTENCES)]
        same = i % 2 == 0
        b = a.replace(" .", " today .") if same else SENTENCES[(i + 3) % len(SENTENCES)]
        rows.append((a, b, 4.6 if same else 0.4))
    return rows


def _corpus_lines(n: int) -> list[str]:
    """Sentences over 1,200 made-up words, each used several times: enough distinct words and pieces for the
    `tiny` pretraining config's 1,000-entry tokenizers (wordpiece, BPE and ELMo's word vocabulary)."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "da", "fu", "gre", "bli", "sto"]
    words = [a + b + c for a in syllables for b in syllables for c in syllables][:1200]
    return [" ".join(words[(i * 10 + j) % len(words)] for j in range(10)).capitalize() + " ." for i in range(n)]


def write_inputs(root: Path) -> Path:
    """Every input file a page's example reads, under the name the page uses."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "texts.txt").write_text("\n".join(SENTENCES[:6]) + "\n")
    (root / "corpus.txt").write_text("\n".join(SENTENCES * 3) + "\n")
    (root / "questions.txt").write_text("how do I reset my password\nwhere is my order\n")
    (root / "queries.txt").write_text("A [[crane]] lifted the beam .\nThe vase [[broke]] .\n")
    (root / "faq.txt").write_text("\n".join(SENTENCES[4:7]) + "\n")
    (root / "docs.txt").write_text("\n".join(SENTENCES) + "\n")
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": i, "body": s}) + "\n" for i, s in enumerate(SENTENCES)))
    for name, sentences in (("ner.conll", NER), ("ner-dev.conll", NER[:2])):
        blocks = ["\n".join(" ".join(token) for token in sentence) for sentence in sentences * 4]
        (root / name).write_text("-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks) + "\n")
    ud = []
    for k, sentence in enumerate(UD * 8):
        rows = [
            f"{i + 1}\t{w}\t{w.lower()}\t{pos}\t_\t_\t{head}\t{rel}\t_\t_"
            for i, (w, pos, head, rel) in enumerate(sentence)
        ]
        ud.append(f"# sent_id = {k}\n" + "\n".join(rows))
    (root / "en_ewt-ud-dev.conllu").write_text("\n\n".join(ud) + "\n\n")
    for name, rows in (("reviews.csv", _reviews(16)), ("dev.csv", _reviews(6, 16))):
        (root / name).write_text("review,stars\n" + "".join(f"{t},{y}\n" for t, y in rows))
    with gzip.open(root / "reviews.csv.gz", "wt") as f:
        f.write((root / "reviews.csv").read_text())
    for name, rows in (("train.txt", _reviews(16)), ("dev.txt", _reviews(6, 16))):
        (root / name).write_text("".join(_sst_tree(t.split(), 4 if y else 0) + "\n" for t, y in rows))
    for name, rows in (("sts-train.csv", _sts_rows(16)), ("sts-dev.csv", _sts_rows(8, 16))):  # STS benchmark layout
        lines = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(rows)]
        (root / name).write_text("\n".join(lines) + "\n")
    (root / "new-pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b, _ in _sts_rows(3, 30)))
    pairs = [(SENTENCES[4], "Forgot your password ? Reset it here ."), (SENTENCES[5], "Invoices are under Billing .")]
    pairs += [(SENTENCES[6], "Change your e-mail in Settings ."), (SENTENCES[8], "Someone plays the guitar .")]
    (root / "pairs.tsv").write_text("text\ttext_pair\n" + "".join(f"{q}\t{d}\n" for q, d in pairs))
    (root / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
    (root / "books").mkdir(exist_ok=True)
    lines = _corpus_lines(960)
    (root / "books" / "one.txt").write_text("\n".join(lines[:480]) + "\n")
    (root / "books" / "two.txt").write_text("\n".join(lines[480:]) + "\n")
    rows = [(s, " ".join(s.split()[:4])) for s in SENTENCES]  # (article, its first words): a stand-in summary
    (root / "summaries.csv").write_text("article,summary\n" + "".join(f'"{a}","{b}"\n' for a, b in rows))
    write_parallel(root, "train", 48)
    write_parallel(root, "val", 8, seed=1)
    return root


# ---- Hub names -> tiny random folders ---------------------------------------------------------------------------


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(src / name, dst / name)


def _qwen3_embedding(folder: Path) -> Path:
    """A tiny random Qwen3 saved by sentence-transformers with Qwen3-Embedding's modules (last-token pooling,
    Normalize) and its prompts."""
    import sentence_transformers as st
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from tests._decoders import tiny_folder

    qwen = tiny_folder(folder.parent / (folder.name + "-qwen3"), "qwen3")
    prompts = {"query": "Instruct: Given a web search query, retrieve relevant passages\nQuery:", "document": ""}
    modules = [Transformer(str(qwen)), Pooling(32, pooling_mode="lasttoken"), Normalize()]
    st.SentenceTransformer(modules=modules, prompts=prompts).save(str(folder))
    return folder


def _bert(folder: Path, minilm: Path) -> Path:
    """A random 4-layer, 32-wide BERT with MiniLM's (uncased) vocabulary."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(folder)
    _copy_tokenizer(minilm, folder)
    return folder


def _bart(folder: Path) -> Path:
    """A tiny random BART with a byte-level BPE tokenizer.json in BART's template (<s> A </s>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok.train_from_iterator(SENTENCES * 5, trainers.BpeTrainer(vocab_size=400, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=tok.get_vocab_size(), d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BartForConditionalGeneration(config).save_pretrained(folder)
    return folder


def _colbert(folder: Path) -> Path:
    from tests.test_late_interaction import _hf_colbert_folder

    return _hf_colbert_folder(folder)


# The Hub names the pages use, each with what stands in for it (a reader runs the real model; the tests run a tiny
# random one of the same layout). A Hub name missing here fails its block: the cache is offline.
STAND_INS = {
    "bert-base-cased": lambda folder, minilm: _bert(folder, minilm),
    "cross-encoder/ms-marco-MiniLM-L6-v2": lambda folder, minilm: tiny_cross_encoder(folder, minilm),
    "naver/splade-v3": lambda folder, minilm: tiny_splade(folder, minilm),
    "Qwen/Qwen3-Embedding-0.6B": lambda folder, minilm: _qwen3_embedding(folder),
    "colbert-ir/colbertv2.0": lambda folder, minilm: _colbert(folder),
    "facebook/bart-base": lambda folder, minilm: _bart(folder),
}

REVISION = "0" * 40


def hub_cache(root: Path, minilm: Path) -> Path:
    """A Hugging Face hub cache (HF_HUB_CACHE's layout: models--ORG--NAME/refs/main, snapshots/REVISION/) holding
    a stand-in folder for each name in STAND_INS."""
    for name, build in STAND_INS.items():
        repo = root / ("models--" + name.replace("/", "--"))
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(REVISION)
        folder = repo / "snapshots" / REVISION
        folder.parent.mkdir(parents=True)
        built = build(folder, minilm)
        assert built == folder and (folder / "config.json").is_file(), f"the stand-in for {name} is not a model folder"
    return root
