"""Train a subword (or word-level) tokenizer on plain-text files with the `tokenizers` library.

Three recipes, each matching the conventions of the model family it is for:

- ``"wordpiece"`` (BERT): BertNormalizer (lowercasing and accent stripping when ``lowercase``),
  BertPreTokenizer, WordPiece with ``##`` continuations, specials ``[PAD] [UNK] [CLS] [SEP] [MASK]``
  at ids 0..4, the continuation alphabet (``##a ##b ...``, sorted) next, template ``[CLS] $A [SEP]`` /
  ``[CLS] $A [SEP] $B:1 [SEP]:1``, WordPiece decoder.
- ``"bpe"`` (RoBERTa / GPT-2): byte-level BPE with ``add_prefix_space``, specials
  ``<s> <pad> </s> <unk> <mask>`` at ids 0..4, RobertaProcessing (``<s> A </s></s> B </s>``),
  ByteLevel decoder.
- ``"word"`` (ELMo's biLM softmax vocabulary, bilm-tf's vocab file): WordLevel over the ``vocab_size``
  entries ``<pad> <unk> <S> </S>`` (ids 0..3) + the most frequent words, most frequent first (the order
  the biLM's log-uniform candidate sampler assumes); words are split at whitespace and every punctuation
  character is a word of its own; no template (ELMo adds <S> and </S> itself). Optional Lowercase.

Deterministic ids: the same call on the same files writes a byte-identical tokenizer.json in any process.
The `tokenizers` WordPiece trainer numbers the continuation alphabet (``##a``, ``##b``, ...) in the order it
meets them while walking a hash map of the words, which changes from process to process, and it breaks ties
between equally frequent merges by those ids, so both the ids and the order of tied merges used to change
between runs. A first, cheap pass (no merges) collects that alphabet; the real pass then gets it as extra
leading entries in sorted order (given to the trainer as special tokens, which are numbered in the order
given, and made ordinary vocabulary entries again afterwards). The BPE trainer numbers its (byte) alphabet in
sorted order and the WordLevel trainer sorts words by (count descending, word), so those are already
deterministic; tests/test_tokenizer_training.py checks all three across processes with different hash seeds.

The text is read by `ctxrep.data.corpus` (Gutenberg header and footer removed, BOM and CRLF handled,
binary files refused) and fed to the trainer line by line. The result is ``out_dir/tokenizer.json``
(loads with `ctxrep.text.tokenizer.Tokenizer.from_model_dir` and with transformers' ``AutoTokenizer``) and
``out_dir/tokenizer_config.json`` (special-token names for transformers).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from ctxrep.data.corpus import CorpusConfig, CorpusError, iter_documents, list_text_files
from ctxrep.text.tokenizer import Tokenizer

WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# <pad> first so that id 0 is padding, as ctxrep's word-id inputs assume; <S> and </S> are bilm-tf's names.
WORD_SPECIALS = ["<pad>", "<unk>", "<S>", "</S>"]
SPECIALS = {"wordpiece": WORDPIECE_SPECIALS, "bpe": BPE_SPECIALS, "word": WORD_SPECIALS}
KINDS = ("wordpiece", "bpe", "word")
BYTE_ALPHABET_SIZE = 256


def train_tokenizer(
    files: str | Path | Sequence[str | Path],
    kind: Literal["wordpiece", "bpe", "word"],
    vocab_size: int,
    out_dir: str | Path,
    lowercase: bool = False,
    min_frequency: int = 2,
    corpus: CorpusConfig | None = None,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a tokenizer on `files` (a .txt file, a directory of them, or a list) and save it in `out_dir`.

    `lowercase`: BERT-uncased style for WordPiece (lowercase and strip accents); for BPE a Lowercase
    normalizer (RoBERTa and GPT-2 themselves are cased); for word a Lowercase normalizer.
    For ``kind="word"`` the vocabulary holds the specials and the vocab_size - 4 most frequent words that
    occur at least `min_frequency` times (fewer when the corpus has fewer).
    `corpus` says how the text files are read (Gutenberg stripping); only its reading options are used.
    Returns the saved tokenizer loaded back through `ctxrep.text.tokenizer.Tokenizer`.
    """
    _check_options(kind, vocab_size, min_frequency)
    specials = SPECIALS[kind]
    paths = list_text_files(files)
    corpus = corpus or CorpusConfig()

    lines = [0]
    continuations: list[str] = []
    if kind == "wordpiece":
        # The continuation alphabet, in sorted order, so that the real pass numbers it the same way every time.
        first_pass = _wordpiece(lowercase)
        first_pass.train_from_iterator(
            _text_batches(paths, corpus, lines), trainer=_wordpiece_trainer(len(specials) + 1, 1, specials, False)
        )
        continuations = sorted(t for t in first_pass.get_vocab() if t.startswith("##") and len(t) == 3)
        tok = _wordpiece(lowercase)
        trainer = _wordpiece_trainer(vocab_size, min_frequency, specials + continuations, show_progress)
    elif kind == "word":
        tok, trainer = _word_tokenizer(vocab_size, min_frequency, specials, lowercase, show_progress)
    else:
        tok, trainer = _bpe_tokenizer(vocab_size, min_frequency, specials, lowercase, show_progress)

    lines[0] = 0
    tok.train_from_iterator(_text_batches(paths, corpus, lines), trainer=trainer)
    if continuations:  # ordinary vocabulary entries, not added tokens (which would be matched in raw text)
        tok = _without_added_tokens(tok, set(continuations))
    if lines[0] == 0:
        raise CorpusError(
            f"{files}: the corpus is empty: {len(paths)} file(s) hold no text"
            + (" after removing Project Gutenberg headers and footers" if corpus.strip_gutenberg else "")
            + "; check the path and the files' contents"
        )
    ids = [tok.token_to_id(t) for t in specials]
    if ids != list(range(len(specials))):  # the trainers put special tokens first, in order
        raise RuntimeError(f"special tokens {specials} got ids {ids}, expected 0..{len(specials) - 1}")

    _set_post_processor(tok, kind)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(_transformers_config(kind, lowercase), indent=2) + "\n")
    return Tokenizer.from_model_dir(out)


def _check_options(kind: str, vocab_size: int, min_frequency: int) -> None:
    if kind not in KINDS:
        raise ValueError(
            f"tokenizer kind {kind!r} is not known: use 'wordpiece' (BERT), 'bpe' (RoBERTa/GPT-2) or 'word' (ELMo)"
        )
    specials = SPECIALS[kind]
    smallest = len(specials) + BYTE_ALPHABET_SIZE if kind == "bpe" else len(specials) + 1
    if vocab_size < smallest:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a {kind} tokenizer: it needs at least {smallest} entries "
            f"({len(specials)} special tokens"
            + {"bpe": " + 256 byte symbols)", "word": " + 1 word)"}.get(kind, " + 1 piece)")
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency={min_frequency} must be at least 1")


def _word_tokenizer(
    vocab_size: int, min_frequency: int, specials: list[str], lowercase: bool, show_progress: bool
) -> tuple[HFTokenizer, trainers.WordLevelTrainer]:
    """An untrained word-level tokenizer (ELMo's vocabulary) and its trainer."""
    tok = HFTokenizer(models.WordLevel(unk_token="<unk>"))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    # "said," -> "said" ","; "don't" -> "don" "'" "t": each punctuation character is its own word.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    # WordLevelTrainer keeps the vocab_size - len(specials) most frequent words, most frequent first.
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials, show_progress=show_progress
    )
    return tok, trainer


def _bpe_tokenizer(
    vocab_size: int, min_frequency: int, specials: list[str], lowercase: bool, show_progress: bool
) -> tuple[HFTokenizer, trainers.BpeTrainer]:
    """An untrained byte-level BPE tokenizer (RoBERTa / GPT-2) and its trainer."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        # <mask> eats the space before it, as in RoBERTa, so "a <mask> b" masks the word " b"'s slot.
        special_tokens=specials[:-1] + [AddedToken("<mask>", lstrip=True, special=True)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    return tok, trainer


def _set_post_processor(tok: HFTokenizer, kind: str) -> None:
    """[CLS] A [SEP] (B [SEP]) for WordPiece, <s> A </s> (</s> B </s>) for BPE; none for words."""
    if kind == "wordpiece":
        cls, sep = ("[CLS]", 2), ("[SEP]", 3)
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[cls, sep]
        )
    elif kind == "bpe":
        tok.post_processor = processors.RobertaProcessing(
            ("</s>", 2),
            ("<s>", 0),
            trim_offsets=True,
            add_prefix_space=True,  # (sep, cls)
        )


def _wordpiece(lowercase: bool) -> HFTokenizer:
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    # strip_accents=None follows `lowercase`, as in BERT's uncased and cased vocabularies.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _wordpiece_trainer(vocab_size: int, min_frequency: int, leading: list[str], show_progress: bool):
    """A WordPiece trainer whose first entries are `leading`, numbered in that order."""
    return trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=leading,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )


def _without_added_tokens(tok: HFTokenizer, contents: set[str]) -> HFTokenizer:
    """`tok` with the added tokens in `contents` turned back into plain vocabulary entries (same ids)."""
    state = json.loads(tok.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["content"] not in contents]
    return HFTokenizer.from_str(json.dumps(state))


def _text_batches(
    paths: list[Path], corpus: CorpusConfig, count: list[int], batch_lines: int = 1000
) -> Iterator[list[str]]:
    """Non-blank lines of every document, in batches (the trainer parallelises over a batch); count[0] += lines."""
    batch: list[str] = []
    for doc in iter_documents(paths, corpus):
        for line in doc.text.split("\n"):
            if line.strip():
                batch.append(line)
                count[0] += 1
                if len(batch) >= batch_lines:
                    yield batch
                    batch = []
    if batch:
        yield batch


def _transformers_config(kind: str, lowercase: bool) -> dict:
    """tokenizer_config.json: lets transformers load tokenizer.json as it is, with its special-token roles."""
    if kind == "wordpiece":
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "do_lower_case": lowercase,
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        }
    if kind == "word":
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "do_lower_case": lowercase,
            "model_input_names": ["input_ids", "attention_mask"],
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "bos_token": "<S>",
            "eos_token": "</S>",
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": True,
        "do_lower_case": lowercase,
        "model_input_names": ["input_ids", "attention_mask"],
        "bos_token": "<s>",
        "pad_token": "<pad>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "mask_token": "<mask>",
    }
