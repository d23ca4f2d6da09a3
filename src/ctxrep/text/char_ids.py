"""ELMo's character ids: a word as [begin-of-word, its UTF-8 bytes, end-of-word, padding...] (bilm-tf's
UnicodeCharsVocabulary), the tokenizer side of a word-level encoder. `ctxrep.text.tokenizer.WordTokenizer` and
`ctxrep.text.inputs.collate` read words through it; models/elmo.py adds the sentence boundaries <S> and </S>.

    batch_to_ids([["The", "cat"]])  ->  (1 sentence, 2 words, 50 characters), 0 = a padding word
"""

from __future__ import annotations

import warnings

import torch

# bilm-tf `data.py` UnicodeCharsVocabulary: ids 0-255 are UTF-8 bytes, then five special characters.
BOS_CHAR = 256  # <begin sentence>
EOS_CHAR = 257  # <end sentence>
BOW_CHAR = 258  # <begin word>
EOW_CHAR = 259  # <end word>
PAD_CHAR = 260  # <padding> inside a word
MAX_CHARACTERS_PER_TOKEN = 50


def word_char_ids(word_bytes: bytes, max_chars: int) -> list[int]:
    """[bow, byte_1, ..., eow, pad, ...] + 1: bilm-tf's Batcher adds one so that 0 can mean "no word"."""
    ids = [BOW_CHAR, *word_bytes, EOW_CHAR] + [PAD_CHAR] * (max_chars - len(word_bytes) - 2)
    return [i + 1 for i in ids]


def boundary_char_ids(special: int, max_chars: int) -> list[int]:
    """<S> and </S> are words whose single character is BOS_CHAR / EOS_CHAR (bilm-tf `_make_bos_eos`), + 1."""
    ids = [BOW_CHAR, special, EOW_CHAR] + [PAD_CHAR] * (max_chars - 3)
    return [i + 1 for i in ids]


def batch_to_ids(sentences: list[list[str]], max_characters_per_token: int = MAX_CHARACTERS_PER_TOKEN) -> torch.Tensor:
    """Tokenised sentences -> character ids (batch, max_words, max_characters_per_token), 0 = padding word.

    Each word becomes [begin-of-word, its UTF-8 bytes, end-of-word, padding...], every id shifted up by one.
    Words longer than max_characters_per_token - 2 bytes are truncated (with a warning naming them).
    The sentence-boundary tokens <S> and </S> are not included: ElmoBiLM adds them itself. A word spelled
    "<S>" or "</S>" gets the boundary token's ids, as in bilm-tf's vocabulary lookup and AllenNLP's mapper.
    """
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise TypeError(
            f"batch_to_ids expects a list of tokenised sentences (lists of str), got {type(sentences).__name__}"
        )
    if not sentences:
        raise ValueError("batch_to_ids got an empty batch: pass at least one sentence")
    max_bytes = max_characters_per_token - 2
    truncated = []
    rows = []
    for s, sentence in enumerate(sentences):
        if isinstance(sentence, str) or not isinstance(sentence, (list, tuple)):
            raise TypeError(f"sentence {s} is a {type(sentence).__name__}; each sentence must be a list of str tokens")
        if not sentence:
            raise ValueError(
                f"sentence {s} is empty: ELMo needs at least one word per sentence; drop it from the batch"
            )
        row = []
        for w, word in enumerate(sentence):
            if not isinstance(word, str) or not word:
                raise ValueError(f"sentence {s}, word {w}: expected a non-empty str, got {word!r}")
            if word in ("<S>", "</S>"):
                row.append(boundary_char_ids(BOS_CHAR if word == "<S>" else EOS_CHAR, max_characters_per_token))
                continue
            data = word.encode("utf-8")
            if len(data) > max_bytes:
                truncated.append(word)
                data = data[:max_bytes]
            row.append(word_char_ids(data, max_characters_per_token))
        rows.append(row)
    if truncated:
        shown = ", ".join(repr(w) for w in truncated[:10])
        if len(truncated) > 10:
            shown += f" and {len(truncated) - 10} more"
        warnings.warn(
            f"{len(truncated)} word(s) longer than {max_bytes} UTF-8 bytes were truncated to their first "
            f"{max_bytes} bytes (ELMo reads at most {max_characters_per_token} characters per token "
            f"including begin/end-of-word): {shown}",
            stacklevel=2,
        )
    ids = torch.zeros(len(rows), max(len(r) for r in rows), max_characters_per_token, dtype=torch.long)
    for s, row in enumerate(rows):
        ids[s, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids
