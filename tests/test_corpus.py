"""Corpus reading, sentence splitting, packing to disk, and the BERT / RoBERTa sequence packers."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors

from ctxrep.data import corpus as corpus_module
from ctxrep.data.corpus import (
    CorpusConfig,
    CorpusError,
    PackedCorpus,
    iter_documents,
    list_text_files,
    pack_corpus,
    read_text,
    split_sentences,
    strip_gutenberg,
)
from ctxrep.data.packing import (
    FullSentencesConfig,
    FullSentencesPacker,
    PackingError,
    SegmentPairConfig,
    SegmentPairPacker,
    ShortSequenceWarmup,
)
from ctxrep.data.tokenizer_training import train_tokenizer

# ------------------------------------------------------------------------------------------- reading


def test_read_text_drops_bom_and_crlf(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"\xef\xbb\xbfFirst line.\r\nSecond line.\r\n\r\nOld mac\rend")
    assert read_text(f) == "First line.\nSecond line.\n\nOld mac\nend"


def test_strip_gutenberg_keeps_only_the_text_between_markers():
    text = (
        "The Project Gutenberg eBook of X\nlicence words\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n"
        "Chapter 1.\nIt begins.\n"
        "    *** END OF THE PROJECT GUTENBERG EBOOK X ***\n"
        "Full licence text.\n"
    )
    assert strip_gutenberg(text) == "\nChapter 1.\nIt begins.\n"
    squeezed = "***START OF THIS PROJECT GUTENBERG EBOOK\nBody\n***END OF THIS PROJECT GUTENBERG EBOOK"
    assert strip_gutenberg(squeezed) == "\nBody\n"
    assert strip_gutenberg("No markers here.\n") == "No markers here.\n"


def test_nul_byte_is_refused_with_file_offset_and_line(tmp_path):
    f = tmp_path / "data.txt"
    f.write_bytes(b"line one\nline\x00two\n")
    with pytest.raises(CorpusError, match=r"data\.txt: NUL byte at byte offset 13 \(line 2\).*binary file"):
        read_text(f)


def test_invalid_utf8_is_refused_with_file_offset_and_line(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("ok\nno\nna\xefve caf\xe9\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin1\.txt: invalid UTF-8 at byte offset 8 \(line 3\).*iconv"):
        read_text(f)


def test_list_text_files_and_its_errors(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("b")
    (tmp_path / "sub" / "a.txt").write_text("a")
    (tmp_path / "notes.md").write_text("not text")
    assert list_text_files(tmp_path) == [tmp_path / "b.txt", tmp_path / "sub" / "a.txt"]
    with pytest.raises(CorpusError, match="missing: no such file or directory"):
        list_text_files(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="empty: directory holds no .txt files"):
        list_text_files(tmp_path / "empty")


def test_documents_by_file_or_by_blank_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("One doc.\nSame doc.\n\n\n  \nSecond doc.\n\nThird doc.\n")
    by_file = list(iter_documents([f], CorpusConfig(document_boundary="file")))
    assert [d.text for d in by_file] == ["One doc.\nSame doc.\n\n\n  \nSecond doc.\n\nThird doc."]
    by_block = list(iter_documents([f], CorpusConfig(document_boundary="blank_line")))
    assert [(d.index, d.text) for d in by_block] == [(0, "One doc.\nSame doc."), (1, "Second doc."), (2, "Third doc.")]
    with pytest.raises(CorpusError, match="document_boundary='line' is not known: use 'file' or 'blank_line'"):
        list(iter_documents([f], CorpusConfig(document_boundary="line")))


def test_split_sentences_known_answer():
    text = (
        "Mr. Smith went to Washington. He arrived late! Did he? \u201cYes.\u201d She said\n"
        "so. It was e.g. fine, said J. R. Tolkien. 3 men came.\n"
        "\n"
        "A new paragraph without a full stop\n"
        "and a wrapped line"
    )
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.",
        "He arrived late!",
        "Did he?",
        "\u201cYes.\u201d",
        "She said so.",
        "It was e.g. fine, said J. R. Tolkien.",
        "3 men came.",
        "A new paragraph without a full stop and a wrapped line",
    ]
    assert split_sentences("it ends. and goes on lower case.") == ["it ends. and goes on lower case."]


# ------------------------------------------------------------------------------------------- packing


def sentence_text(d: int, s: int, words: int = 3) -> str:
    """Sentence s of document d: words that name their own place (d0s1w0 ...), so tests can read positions."""
    ws = [f"d{d}s{s}w{j}" for j in range(words)]
    return " ".join([ws[0].upper()] + ws[1:]) + "."


def write_docs(folder, sentences_per_doc: list[int], words: int = 3) -> None:
    """One file per document (Gutenberg-framed for the first one), sentences wrapped over lines."""
    folder.mkdir(parents=True, exist_ok=True)
    for d, n in enumerate(sentences_per_doc):
        body = "\n".join(sentence_text(d, s, words) for s in range(n)) + "\n"
        if d == 0:
            start, end = "*** START OF THE PROJECT GUTENBERG EBOOK T ***", "*** END OF THE PROJECT GUTENBERG EBOOK T"
            body = f"Header\n{start}\n{body}{end}\nLicence\n"
        (folder / f"doc{d:02d}.txt").write_bytes(b"\xef\xbb\xbf" + body.replace("\n", "\r\n").encode())


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny uncased WordPiece tokenizer in which every word of the test documents is one token."""
    text = tmp_path_factory.mktemp("tok_text")
    write_docs(text, [30] * 12)
    out = tmp_path_factory.mktemp("tok")
    tok = train_tokenizer(text, "wordpiece", 3000, out, lowercase=True, min_frequency=1)
    for d, s in [(0, 0), (11, 29), (5, 7)]:
        assert len(tok.backend.encode(sentence_text(d, s), add_special_tokens=False).ids) == 4
    return out


def pack(tmp_path, tokenizer_dir, sentences_per_doc, words=3, **options) -> PackedCorpus:
    write_docs(tmp_path / "text", sentences_per_doc, words)
    config = CorpusConfig(num_workers=options.pop("num_workers", 1), **options)
    return pack_corpus(tmp_path / "text", tokenizer_dir, tmp_path / "packed", config, progress=False)


def test_pack_corpus_known_answer(tmp_path, tokenizer_dir):
    packed = pack(tmp_path, tokenizer_dir, [2, 1, 3])
    assert (packed.num_documents, packed.num_sentences, packed.num_tokens) == (3, 6, 24)
    assert packed.tokens.dtype == np.uint16 and isinstance(packed.tokens, np.memmap)
    assert packed.document_offsets.tolist() == [0, 2, 3, 6]
    assert packed.sentence_offsets.tolist() == [0, 4, 8, 12, 16, 20, 24]
    tok = packed.load_tokenizer().backend
    assert [tok.id_to_token(int(i)) for i in packed.sentence(4)] == ["d2s1w0", "d2s1w1", "d2s1w2", "."]
    assert [tok.id_to_token(int(i)) for i in packed.document(1)] == ["d1s0w0", "d1s0w1", "d1s0w2", "."]
    assert [len(s) for s in packed.document_sentences(2)] == [4, 4, 4]
    manifest = json.loads((tmp_path / "packed" / "manifest.json").read_text())
    assert manifest["counts"] == {"documents": 3, "sentences": 6, "tokens": 24}
    assert manifest["dtype"] == "uint16"
    assert [s["path"].rsplit("/", 1)[1] for s in manifest["sources"]] == ["doc00.txt", "doc01.txt", "doc02.txt"]
    first = tmp_path / "text" / "doc00.txt"
    assert manifest["sources"][0]["size"] == first.stat().st_size
    assert manifest["sources"][0]["mtime_ns"] == first.stat().st_mtime_ns
    assert manifest["tokenizer_sha256"] == hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()
    reopened = PackedCorpus.open(tmp_path / "packed")
    assert np.array_equal(reopened.tokens, packed.tokens)


def test_pack_corpus_reuses_packed_files_until_the_input_changes(tmp_path, tokenizer_dir, monkeypatch):
    pack(tmp_path, tokenizer_dir, [2, 1])
    real_run = corpus_module._run_tasks

    def must_not_run(*args, **kwargs):
        raise AssertionError("the corpus was tokenized again")

    monkeypatch.setattr(corpus_module, "_run_tasks", must_not_run)
    config = CorpusConfig(num_workers=1)
    again = pack_corpus(tmp_path / "text", tokenizer_dir, tmp_path / "packed", config, progress=False)
    assert again.num_sentences == 3
    monkeypatch.setattr(corpus_module, "_run_tasks", real_run)
    with open(tmp_path / "text" / "doc01.txt", "a") as f:
        f.write("Another one here.\n")
    changed = pack_corpus(tmp_path / "text", tokenizer_dir, tmp_path / "packed", config, progress=False)
    assert changed.num_sentences == 4
    by_block_config = CorpusConfig(num_workers=1, document_boundary="blank_line")
    by_block = pack_corpus(tmp_path / "text", tokenizer_dir, tmp_path / "packed", by_block_config, progress=False)
    assert by_block.num_documents == 2


def test_worker_processes_give_the_same_packing(tmp_path, tokenizer_dir):
    one = pack(tmp_path / "one", tokenizer_dir, [5, 3, 8, 1], chunk_chars=40)
    two = pack(tmp_path / "two", tokenizer_dir, [5, 3, 8, 1], chunk_chars=40, num_workers=2)
    assert np.array_equal(one.tokens, two.tokens)
    assert np.array_equal(one.sentence_offsets, two.sentence_offsets)
    assert one.document_offsets.tolist() == two.document_offsets.tolist() == [0, 5, 8, 16, 17]


def test_documents_that_tokenize_to_nothing_are_dropped(tmp_path, tokenizer_dir):
    (tmp_path / "t").mkdir()
    # BertNormalizer removes control characters: the middle block gives no tokens.
    (tmp_path / "t" / "a.txt").write_text("D0s0w0 d0s0w1.\n\n\x07 \x07\n\nD1s0w0.\n")
    config = CorpusConfig(num_workers=1, document_boundary="blank_line")
    packed = pack_corpus(tmp_path / "t", tokenizer_dir, tmp_path / "p", config, progress=False)
    assert packed.document_offsets.tolist() == [0, 1, 2]
    assert packed.sentence_offsets.tolist() == [0, 3, 5]


def test_large_vocabulary_packs_to_int32(tmp_path):
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i + 4 for i in range(70_000)}}
    tok = HFTokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "a.txt").write_text("w69999 w3 w65536 unknown\n")
    config = CorpusConfig(num_workers=1)
    packed = pack_corpus(tmp_path / "a.txt", tmp_path / "tok", tmp_path / "p", config, progress=False)
    assert packed.tokens.dtype == np.int32
    assert packed.tokens.tolist() == [70003, 7, 65540, 1]


def test_empty_corpus_is_refused(tmp_path, tokenizer_dir):
    (tmp_path / "t").mkdir()
    start, end = "*** START OF THE PROJECT GUTENBERG EBOOK A ***", "*** END OF THE PROJECT GUTENBERG EBOOK A ***"
    (tmp_path / "t" / "a.txt").write_text(f"Licence\n{start}\n\n  \n{end}\nLicence\n")
    (tmp_path / "t" / "b.txt").write_text("")
    with pytest.raises(CorpusError, match=r"the corpus is empty: 2 file\(s\) hold no text after removing Project"):
        pack_corpus(tmp_path / "t", tokenizer_dir, tmp_path / "p", CorpusConfig(num_workers=1), progress=False)


def test_missing_tokenizer_and_damaged_pack_are_explained(tmp_path, tokenizer_dir):
    write_docs(tmp_path / "text", [1])
    with pytest.raises(CorpusError, match="tokenizer.json: no such tokenizer file; train one with"):
        pack_corpus(tmp_path / "text", tmp_path, tmp_path / "p", progress=False)
    with pytest.raises(CorpusError, match="no manifest.json; this is not a packed corpus"):
        PackedCorpus.open(tmp_path)
    pack(tmp_path, tokenizer_dir, [2])
    with open(tmp_path / "packed" / "tokens.bin", "r+b") as f:
        f.truncate(6)
    with pytest.raises(CorpusError, match="packed files do not match manifest.json.*pack the corpus again"):
        PackedCorpus.open(tmp_path / "packed")


# ------------------------------------------------------------------------------------- sequence packers


def parse(tokens: list[str]) -> list[tuple[int, int]]:
    """(document, sentence) of each whole sentence in a run of tokens d{d}s{s}w0 w1 w2 '.'; asserts wholeness."""
    assert len(tokens) % 4 == 0, tokens
    out = []
    for i in range(0, len(tokens), 4):
        d, s = tokens[i][1:-2].split("s")
        assert tokens[i : i + 4] == [f"d{d}s{s}w0", f"d{d}s{s}w1", f"d{d}s{s}w2", "."], tokens
        out.append((int(d), int(s)))
    return out


def test_segment_pairs_known_answer(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [6, 6, 6, 6])
    tok = corpus.load_tokenizer().backend
    # 15 = [CLS] + 12 + 2 [SEP]: chunks of 3 four-token sentences, so nothing is ever truncated.
    packer = SegmentPairPacker(corpus, SegmentPairConfig(max_length=15, short_seq_prob=0.0, seed=3))
    seen, labels = [], []
    for _ in range(packer.epoch_size()):
        x = packer.next_instance()
        labels.append(int(x["next_sentence_label"]))
        tokens = [tok.id_to_token(int(i)) for i in x["input_ids"]]
        sep = tokens.index("[SEP]")
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) <= 15
        assert x["token_type_ids"].tolist() == [0] * (sep + 1) + [1] * (len(tokens) - sep - 1)
        assert sep > 1 and len(tokens) - sep > 2  # neither segment is empty
        if x["next_sentence_label"] == 0:  # B continues A: together, consecutive sentences of one document
            both = parse(tokens[1:sep] + tokens[sep + 1 : -1])
            assert all(s == both[0][1] + k and d == both[0][0] for k, (d, s) in enumerate(both))
            seen += both
        else:
            a, b = parse(tokens[1:sep]), parse(tokens[sep + 1 : -1])
            assert all(s == a[0][1] + k and d == a[0][0] for k, (d, s) in enumerate(a))
            assert all(s == b[0][1] + k and d == b[0][0] for k, (d, s) in enumerate(b))
            assert b[0][0] != a[0][0]  # B from another document
            seen += a
    assert set(labels) == {0, 1}
    # Over one epoch every sentence is used exactly once as A or as a true continuation.
    assert sorted(seen) == [(d, s) for d in range(4) for s in range(6)]


def test_next_sentence_labels_are_half_random(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [12] * 10)
    packer = SegmentPairPacker(corpus, SegmentPairConfig(max_length=30, seed=0))
    labels = np.concatenate([packer.next_batch(100)["next_sentence_label"] for _ in range(20)])
    assert 0.45 < labels.mean() < 0.55


def test_no_sequence_exceeds_max_length_with_truncation_and_warmup(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [7, 1, 9, 4], words=9)  # longer sentences
    warmup = ShortSequenceWarmup(max_length=16, steps=5)
    nsp = SegmentPairPacker(corpus, SegmentPairConfig(max_length=40, short_seq_prob=0.5, warmup=warmup))
    full = FullSentencesPacker(corpus, FullSentencesConfig(max_length=40, warmup=warmup))
    for packer in (nsp, full):
        widths = []
        for step in range(30):
            batch = packer.next_batch(4)
            limit = 16 if step < 5 else 40
            assert batch["input_ids"].shape[1] <= limit
            assert (batch["attention_mask"].sum(1) >= 3).all()
            widths.append(batch["input_ids"].shape[1])
        assert max(widths[5:]) > 16  # the long phase does use long sequences


def test_truncation_cuts_the_longer_segment_from_either_end(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [6, 6, 6])
    tok = corpus.load_tokenizer().backend
    # 7 = 4 tokens of text: every pair of four-token sentences loses 4 tokens.
    packer = SegmentPairPacker(corpus, SegmentPairConfig(max_length=7, short_seq_prob=0.0))
    front_cuts = back_cuts = 0
    for _ in range(100):
        tokens = [tok.id_to_token(int(i)) for i in packer.next_instance()["input_ids"]]
        assert len(tokens) == 7 and tokens.count("[SEP]") == 2
        sep = tokens.index("[SEP]")
        for segment in (tokens[1:sep], tokens[sep + 1 : -1]):
            assert segment  # never cut to nothing
            front_cuts += not segment[0].endswith("w0")
            back_cuts += segment[-1] != "."
    assert front_cuts > 20 and back_cuts > 20


def test_full_sentences_known_answer_crosses_documents(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [1, 1, 1, 1])
    tok = corpus.load_tokenizer().backend
    # 11 = [CLS] + 4 + [SEP] separator + 4 + [SEP]: exactly two one-sentence documents per sequence.
    packer = FullSentencesPacker(corpus, FullSentencesConfig(max_length=11, seed=1))
    assert packer.epoch_size() == 2
    docs = []
    for _ in range(2):
        x = packer.next_instance()
        assert set(x) == {"input_ids"}
        tokens = [tok.id_to_token(int(i)) for i in x["input_ids"]]
        assert len(tokens) == 11 and tokens[0] == "[CLS]" and tokens[5] == "[SEP]" and tokens[10] == "[SEP]"
        docs += parse(tokens[1:5]) + parse(tokens[6:10])
    assert sorted(docs) == [(0, 0), (1, 0), (2, 0), (3, 0)]


def test_full_sentences_cover_the_corpus_in_order(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [5, 2, 7, 1, 3])
    tok = corpus.load_tokenizer().backend
    packer = FullSentencesPacker(corpus, FullSentencesConfig(max_length=22, seed=0))  # 20 tokens of text
    seen, crossed = [], 0
    for _ in range(packer.epoch_size()):
        tokens = [tok.id_to_token(int(i)) for i in packer.next_instance()["input_ids"]]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) <= 22
        runs = " ".join(tokens[1:-1]).split(" [SEP] ")
        crossed += len(runs) > 1
        for run in runs:
            sentences = parse(run.split(" "))
            assert all(d == sentences[0][0] and s == sentences[0][1] + k for k, (d, s) in enumerate(sentences))
            seen += sentences
    assert sorted(seen) == [(d, s) for d, n in enumerate([5, 2, 7, 1, 3]) for s in range(n)]
    assert crossed > 0


def test_long_sentence_is_cut_into_full_sequences(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [1, 1], words=11)  # two long sentences
    packer = FullSentencesPacker(corpus, FullSentencesConfig(max_length=7))  # five tokens of text
    lengths = sorted(len(packer.next_instance()["input_ids"]) for _ in range(packer.epoch_size()))
    expected = []
    for n in corpus.sentence_lengths().tolist():
        assert n > 5
        expected += [7] * (n // 5) + ([n % 5 + 2] if n % 5 else [])
    assert lengths == sorted(expected)


@pytest.mark.parametrize("kind", ["segment_pair", "full_sentences"])
def test_resume_gives_the_same_next_batches(tmp_path, tokenizer_dir, kind):
    corpus = pack(tmp_path, tokenizer_dir, [6, 3, 8, 5])

    def make(seed=7):
        warmup = ShortSequenceWarmup(max_length=12, steps=4)
        if kind == "segment_pair":
            return SegmentPairPacker(corpus, SegmentPairConfig(max_length=20, seed=seed, warmup=warmup))
        return FullSentencesPacker(corpus, FullSentencesConfig(max_length=20, seed=seed, warmup=warmup))

    for stop in (2, 4, 9):  # inside the warm-up, at its end, after several epochs
        run = make()
        for _ in range(stop):
            run.next_batch(3)
        state = json.loads(json.dumps(run.state_dict()))
        expected = [run.next_batch(3) for _ in range(3)]
        resumed = make()
        resumed.load_state_dict(state)
        for want in expected:
            got = resumed.next_batch(3)
            assert got.keys() == want.keys()
            for name in want:
                assert np.array_equal(got[name], want[name]), (stop, name)
    assert state["epoch"] > 0  # the last stop crossed epoch boundaries
    assert not np.array_equal(make(seed=8).next_batch(3)["input_ids"], make().next_batch(3)["input_ids"])


def test_corpus_smaller_than_one_sequence_is_refused(tmp_path, tokenizer_dir):
    corpus = pack(tmp_path, tokenizer_dir, [2, 1])  # 12 tokens
    with pytest.raises(PackingError, match=r"the corpus has 12 tokens, fewer than one sequence of max_length=128"):
        FullSentencesPacker(corpus, FullSentencesConfig(max_length=128))
    with pytest.raises(PackingError, match=r"the corpus has 12 tokens, fewer than one sequence of max_length=64"):
        SegmentPairPacker(corpus, SegmentPairConfig(max_length=64))


def test_bad_packing_options_and_states_are_refused(tmp_path, tokenizer_dir):
    single = pack(tmp_path / "one", tokenizer_dir, [5])
    with pytest.raises(PackingError, match="needs at least 2 documents.*has 1; add files, or pack with"):
        SegmentPairPacker(single, SegmentPairConfig(max_length=8))
    corpus = pack(tmp_path / "two", tokenizer_dir, [5, 5])
    with pytest.raises(PackingError, match="max_length=4 leaves fewer than 2 tokens once the 3 special tokens"):
        SegmentPairPacker(corpus, SegmentPairConfig(max_length=4))
    with pytest.raises(PackingError, match="short_seq_prob=1.5 must be between 0 and 1"):
        SegmentPairPacker(corpus, SegmentPairConfig(max_length=16, short_seq_prob=1.5))
    full = FullSentencesPacker(corpus, FullSentencesConfig(max_length=16))
    nsp = SegmentPairPacker(corpus, SegmentPairConfig(max_length=16))
    with pytest.raises(PackingError, match="packer state is for 'segment_pair' packing, not 'full_sentences'"):
        full.load_state_dict(nsp.state_dict())
    foreign = FullSentencesPacker(single, FullSentencesConfig(max_length=16)).state_dict()
    with pytest.raises(PackingError, match="packer state was saved on another corpus"):
        full.load_state_dict(foreign)
    with pytest.raises(PackingError, match="batch_size=0 must be at least 1"):
        full.next_batch(0)
