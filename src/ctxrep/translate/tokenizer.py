"""The tokenizer of an encoder-decoder's folder: text -> ids ending with </s>, ids -> text.

Three kinds of folder:
  tokenizer.json                 a `tokenizers` tokenizer: the joint source/target subword vocabulary that
                                 `ctxrep mt train` trains (translate/data.py), with <pad>, </s>, <unk>
  source.spm, target.spm,        an OPUS-MT (Marian) folder: two SentencePiece models, read with the
  vocab.json [target_vocab.json] `sentencepiece` package, and one vocabulary mapping their pieces to the model's
                                 ids (a second one for models with separate vocabularies)
  a pretrained encoder-decoder's  BART, mBART, T5, mT5: the folder's own tokenizer (tokenizer.json or a SentencePiece
  own tokenizer (FolderTokenizer) model, through ctxrep.text.tokenizer) with its special-token template around each
                                 text ("<s> A </s>", "A </s>"): what the model was pretrained to read
Each gives the ids transformers' tokenizers give for the same folder (MarianTokenizer for OPUS-MT).

    tok = MTTokenizer.from_model_dir("opus-mt-en-de")
    ids = tok.encode_source(["A man is sleeping."])   # [[..., eos_id]]
    tok.decode(ids[0])                                  # special tokens dropped, pieces detokenized
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ctxrep.text.tokenizer import TokenizerError

OPUS_FILES = ("source.spm", "target.spm", "vocab.json")


class MTTokenizer:
    """What translation needs from a tokenizer; `from_model_dir` picks the implementation for a folder."""

    pad_id: int
    eos_id: int
    unk_id: int
    vocab_size: int  # source side (the whole vocabulary when it is shared)
    target_vocab_size: int

    @staticmethod
    def from_model_dir(path: str | Path, template: bool = False) -> MTTokenizer:
        """`template` (a pretrained encoder-decoder that reads its tokenizer's special tokens: the model's
        `reads_template`): the folder's own tokenizer (FolderTokenizer). Else tokenizer.json if the folder has one,
        else the OPUS-MT files; a one-line error if neither."""
        path = Path(path)
        if template:
            return FolderTokenizer(path)
        if (path / "tokenizer.json").is_file():
            return JointTokenizer(path / "tokenizer.json")
        present = [name for name in OPUS_FILES if (path / name).is_file()]
        if present:
            missing = [name for name in OPUS_FILES if name not in present]
            if missing:
                raise TokenizerError(
                    f"{path}: an OPUS-MT tokenizer needs {', '.join(OPUS_FILES)}, but {', '.join(missing)} is missing; "
                    "copy it from the model's original folder"
                )
            return OpusTokenizer(path)
        raise TokenizerError(
            f"{path}: no MT tokenizer: expected tokenizer.json, or source.spm + target.spm + vocab.json (OPUS-MT); "
            "copy the tokenizer files the model was trained with into the folder"
        )

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        """Source sentences -> ids, each ending with </s>."""
        raise NotImplementedError

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences -> ids, each ending with </s> (the labels of training)."""
        raise NotImplementedError

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Target ids -> detokenized text; pad, </s> and <unk> are dropped (as transformers' skip_special_tokens)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_batch([ids])[0]


class JointTokenizer(MTTokenizer):
    """A `tokenizers` tokenizer.json with <pad>, </s> and <unk>; one vocabulary for both sides."""

    def __init__(self, file: Path, backend=None) -> None:
        from tokenizers import Tokenizer

        if backend is None:
            try:
                backend = Tokenizer.from_file(str(file))
            except Exception as e:  # tokenizers raises a bare Exception for a malformed file
                raise TokenizerError(f"{file}: cannot read it as a tokenizers tokenizer.json ({e})") from e
        self.tokenizer = backend
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        ids = {}
        for name, token in (("pad", "<pad>"), ("eos", "</s>"), ("unk", "<unk>")):
            ids[name] = self.tokenizer.token_to_id(token)
            if ids[name] is None:
                raise TokenizerError(
                    f"{file}: the vocabulary has no {token} token, which translation needs; "
                    "train the tokenizer with <pad>, </s> and <unk> as special tokens"
                )
        self.pad_id, self.eos_id, self.unk_id = ids["pad"], ids["eos"], ids["unk"]
        self.vocab_size = self.target_vocab_size = self.tokenizer.get_vocab_size()

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        # Without the post-processor, then </s>: the same ids whatever template the file carries.
        return [e.ids + [self.eos_id] for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    encode_target = encode_source

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.decode_batch([list(map(int, row)) for row in ids], skip_special_tokens=True)


class FolderTokenizer(JointTokenizer):
    """A pretrained encoder-decoder's own tokenizer (BART, T5, ...): tokenizer.json or a SentencePiece model read by
    ctxrep.text.tokenizer, its special-token template around every text, as transformers' tokenizer encodes it (and
    labels: text_target=)."""

    def __init__(self, path: Path) -> None:
        from ctxrep.text.tokenizer import Tokenizer

        folder = Tokenizer.from_model_dir(path)
        super().__init__(path, backend=folder.backend)
        self.template = folder.template

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [self.template.build_inputs(list(e.ids))[0] for e in encodings]

    encode_target = encode_source


class OpusTokenizer(MTTokenizer):
    """An OPUS-MT folder, as transformers' MarianTokenizer reads it: SentencePiece pieces looked up in vocab.json
    (a piece missing from it is <unk>); a leading language code such as ">>de<<" is one token of its own."""

    def __init__(self, path: Path) -> None:
        import sentencepiece

        self.source_spm = _load_spm(sentencepiece, path / "source.spm")
        self.target_spm = _load_spm(sentencepiece, path / "target.spm")
        self.source_vocab = _load_vocab(path / "vocab.json")
        separate = (path / "target_vocab.json").is_file()
        self.target_vocab = _load_vocab(path / "target_vocab.json") if separate else self.source_vocab
        self.target_pieces = {i: piece for piece, i in self.target_vocab.items()}
        for token in ("<pad>", "</s>", "<unk>"):
            if token not in self.source_vocab:
                raise TokenizerError(f"{path / 'vocab.json'}: has no {token} entry; an OPUS-MT vocabulary needs it")
        self.pad_id = self.source_vocab["<pad>"]
        self.eos_id = self.source_vocab["</s>"]
        self.unk_id = self.source_vocab["<unk>"]
        self.vocab_size = len(self.source_vocab)
        self.target_vocab_size = len(self.target_vocab)
        self.special_ids = {self.pad_id, self.eos_id, self.unk_id}

    def _encode(self, texts: Sequence[str], spm, vocab: dict[str, int]) -> list[list[int]]:
        unk = vocab.get("<unk>", self.unk_id)
        eos = vocab.get("</s>", self.eos_id)
        out = []
        for text in texts:
            code = []
            if text.startswith(">>") and (end := text.find("<<")) != -1:  # a target-language token (">>de<<")
                code, text = [text[: end + 2]], text[end + 2 :]
            pieces = code + spm.encode(text, out_type=str)
            out.append([vocab.get(p, unk) for p in pieces] + [eos])
        return out

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        return self._encode(texts, self.source_spm, self.source_vocab)

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        return self._encode(texts, self.target_spm, self.target_vocab)

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        out = []
        for row in ids:
            pieces = [self.target_pieces.get(int(i), "<unk>") for i in row if int(i) not in self.special_ids]
            out.append(self.target_spm.decode_pieces(pieces).replace("\u2581", " ").strip())
        return out


def _load_spm(sentencepiece, file: Path):
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(str(file))
    except (OSError, RuntimeError) as e:
        raise TokenizerError(f"{file}: not a SentencePiece model ({e})") from e
    return processor


def _load_vocab(file: Path) -> dict[str, int]:
    try:
        vocab = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: not a JSON vocabulary ({e})") from e
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise TokenizerError(f"{file}: expected a JSON object mapping pieces to integer ids")
    return vocab
