"""What the decoder looks at: encoder-decoder (cross-) attention over the source words, as an alignment heatmap.

The view of Bahdanau et al. (2015, fig. 3) and of the Transformer paper's tutorials: one row per target word, one
column per source word, each row the attention distribution of the step that produced that target word.

    alignment = cross_attention(model, tokenizer, "A man is sleeping.")              # the model's greedy output
    alignment = cross_attention(model, tokenizer, "A man is sleeping.", "Ein Mann schläft.")   # teacher-forced
    alignment_png(alignment, "align.png")
    alignment_html([alignment, ...], "align.html")

How the numbers are made, for target position t (the step whose output is target piece t, </s> last) and source
piece s: P[t, s] is `cross_attentions[layer][0, head, t, s]` of one teacher-forced forward pass (decoder input:
the start token, then the target pieces but the last), or its mean over the heads. Pieces become words as in the
usual alignment views (e.g. Clark et al. 2019 for self-attention): the columns of a source word's pieces are
summed (attention to a word is attention to any of its pieces), the rows of a target word's pieces are averaged
(each piece is one query), so every row still sums to 1 over the source words. The source's </s> and the target's
</s> are words of their own: models put much attention on the source </s>, and leaving it out would hide it.

Words are the whitespace-separated words of the sentence as given; a given sentence's pieces are found by
encoding each word alone, which gives the sentence's own pieces with both kinds of MT tokenizer (Metaspace and
SentencePiece pieces never cross a space). The words of a greedy translation are those of its detokenized text:
target piece t belongs to the last word of the text its first t + 1 pieces decode to (a piece that adds no
visible character, such as a bare "▁", to the word of the next piece that does).
"""

from __future__ import annotations

import base64
import html
import io
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ctxrep.translate.tokenizer import MTTokenizer

logger = logging.getLogger(__name__)

EOS_WORD = "</s>"


@dataclass
class Alignment:
    """Cross-attention of one sentence pair, pooled to words.

    weights: (target words, source words), row i the attention of the step that produced target_words[i]; each
    row sums to 1. layer: the decoder layer (0-based, of num_layers); head: the head, or None for the mean over
    the heads. teacher_forced: the target was given (True) or is the model's greedy translation (False)."""

    source_words: list[str]
    target_words: list[str]
    weights: np.ndarray
    layer: int = -1
    num_layers: int = 0
    head: int | None = None
    teacher_forced: bool = True

    def describe(self) -> str:
        """e.g. 'decoder layer 6 of 6, mean of the heads, greedy translation'."""
        heads = "mean of the heads" if self.head is None else f"head {self.head}"
        target = "given target (teacher-forced)" if self.teacher_forced else "greedy translation"
        return f"decoder layer {self.layer + 1} of {self.num_layers}, {heads}, {target}"


# ---- pieces to words --------------------------------------------------------------------------------------------


@dataclass
class _Split:
    """One side of a pair: its ids (</s> last), its words (</s> last) and the word index of each id."""

    ids: list[int]
    words: list[str]
    word_of: list[int]


def _split_text(encode: Callable[[Sequence[str]], list[list[int]]], text: str, eos_id: int) -> _Split | None:
    """The sentence's ids as `encode` gives them, mapped to its whitespace words by encoding each word alone;
    None when the words' pieces do not add up to the sentence's (then the caller decodes prefixes instead).
    A word that encodes to no piece at all (a character the normaliser removes) is left out."""
    ids = encode([text])[0]
    words = text.split()
    per_word = [row[:-1] if row and row[-1] == eos_id else row for row in encode(words)] if words else []
    if [i for row in per_word for i in row] + [eos_id] != ids:
        return None
    kept = [(w, row) for w, row in zip(words, per_word) if row]
    word_of = [k for k, (_, row) in enumerate(kept) for _ in row] + [len(kept)]
    return _Split(ids, [w for w, _ in kept] + [EOS_WORD], word_of)


def _split_ids(tokenizer: MTTokenizer, ids: Sequence[int]) -> _Split:
    """Target ids (without </s>) mapped to the words of their detokenized text. Piece t belongs to the last word
    of decode(ids[: t + 1]) when it adds visible characters to decode(ids[: t]); a piece that adds none (a bare
    word-start piece such as "▁", or an <unk> that decodes to nothing) belongs to the word of the next piece
    that does (the last word at the end)."""
    ids = list(ids)
    texts = [p.rstrip() for p in tokenizer.decode_batch([ids[: t + 1] for t in range(len(ids))])] if ids else []
    words = texts[-1].split() if texts else []
    if ids and not words:
        words = ["<unk>"]  # every piece decodes to nothing: show one placeholder word rather than none
    word_of: list[int | None] = [
        len(text.split()) - 1 if text != (texts[t - 1] if t else "") else None for t, text in enumerate(texts)
    ]
    following = len(words) - 1
    for t in reversed(range(len(word_of))):  # pieces that add nothing take the word of the next one that does
        if word_of[t] is None:
            word_of[t] = following
        following = word_of[t]
    word_of = [min(max(w, 0), len(words) - 1) for w in word_of]
    return _Split(ids + [tokenizer.eos_id], words + [EOS_WORD], word_of + [len(words)])


def _split(tokenizer: MTTokenizer, text: str, side: str) -> _Split:
    encode = tokenizer.encode_source if side == "source" else tokenizer.encode_target
    found = _split_text(encode, text, tokenizer.eos_id)
    if found is None:
        logger.warning(
            "the %s's words do not encode to its own pieces one by one; words are read from the "
            "detokenized pieces instead",
            side,
        )
        found = _split_ids(tokenizer, encode([text])[0][:-1])
    return found


def pool_to_words(
    piece_weights: np.ndarray, source_word_of: Sequence[int], target_word_of: Sequence[int]
) -> np.ndarray:
    """(target pieces, source pieces) -> (target words, source words): columns summed within a source word, rows
    averaged within a target word. word_of lists give each piece's word index (0, 0, 1, 2, 2, ...)."""
    n_src, n_tgt = max(source_word_of) + 1, max(target_word_of) + 1
    to_source = np.zeros((len(source_word_of), n_src))  # (source pieces, source words): 1 where a piece is in a word
    to_source[np.arange(len(source_word_of)), source_word_of] = 1.0
    to_target = np.zeros((n_tgt, len(target_word_of)))  # (target words, target pieces): the mean over the pieces
    to_target[target_word_of, np.arange(len(target_word_of))] = 1.0
    to_target /= to_target.sum(axis=1, keepdims=True)
    return to_target @ piece_weights @ to_source


# ---- the model --------------------------------------------------------------------------------------------------


def require_cross_attention(model: torch.nn.Module) -> None:
    """A one-line error for a model without a decoder attending to a source (an encoder such as BERT)."""
    if not (callable(getattr(model, "decode", None)) and callable(getattr(model, "init_cache", None))):
        family = getattr(model, "family", type(model).__name__)
        raise ValueError(  # noqa: TRY004 (a user-fixable input: the CLI reports ValueErrors)
            f"a {family} model has no decoder and so no cross-attention over a source sentence; pass a translation "
            "model (a folder written by `ctxrep mt train`, or a Marian / OPUS-MT folder)"
        )


def _index(value: int | None, count: int, what: str) -> int | None:
    if value is None:
        return None
    if not -count <= value < count:
        raise ValueError(
            f"{what} {value} is out of range: the model has {count} decoder {what}s "
            f"(0..{count - 1}, or -{count}..-1 from the last)"
        )
    return value % count


def cross_attention(
    model: torch.nn.Module,
    tokenizer: MTTokenizer,
    source: str,
    target: str | None = None,
    layer: int = -1,
    head: int | None = None,
) -> Alignment:
    """The decoder's attention over the source words (module docstring) at decoder `layer` (default the last;
    negative counts from the end), for one `head` or the mean over the heads (None). `target`: a translation to
    teacher-force; None: the model's greedy translation of `source`."""
    from ctxrep.translate.search import greedy_search

    require_cross_attention(model)
    c = model.config
    if tokenizer.eos_id != c.eos_token_id or tokenizer.pad_id != c.pad_token_id:
        raise ValueError(
            f"the tokenizer's </s>/<pad> ids ({tokenizer.eos_id}, {tokenizer.pad_id}) differ from the model's "
            f"eos_token_id/pad_token_id ({c.eos_token_id}, {c.pad_token_id}); use the tokenizer the model was trained with"
        )
    num_layers = len(model.decoder.layers)
    layer = _index(layer, num_layers, "layer")
    head = _index(head, c.decoder_attention_heads, "head")
    if not source.strip():
        raise ValueError("the source sentence is empty; pass the sentence whose translation you want to inspect")
    if target is not None and not target.strip():
        raise ValueError("the target sentence is empty; pass a translation, or no target to use the model's own")
    src = _split(tokenizer, source, "source")
    limit = model.max_tokens
    if len(src.ids) > limit:
        raise ValueError(
            f"the source has {len(src.ids)} tokens (with </s>), more than the model's {limit} positions; "
            "shorten or split the sentence"
        )
    device = next(model.parameters()).device
    input_ids = torch.tensor([src.ids], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            if target is None:
                tgt = _split_ids(tokenizer, greedy_search(model, input_ids)[0])
            else:
                tgt = _split(tokenizer, target, "target")
                if len(tgt.ids) > limit:
                    raise ValueError(
                        f"the target has {len(tgt.ids)} tokens (with </s>), more than the model's "
                        f"{limit} positions; shorten the translation"
                    )
            decoder_input_ids = torch.tensor([[c.decoder_start_token_id] + tgt.ids[:-1]], device=device)
            out = model(input_ids, decoder_input_ids=decoder_input_ids, output_attentions=True)
    finally:
        model.train(was_training)
    probs = out.cross_attentions[layer][0].float()  # (heads, target pieces, source pieces)
    pieces = probs.mean(dim=0) if head is None else probs[head]  # (target pieces, source pieces)
    weights = pool_to_words(pieces.cpu().double().numpy(), src.word_of, tgt.word_of)
    return Alignment(src.words, tgt.words, weights, layer, num_layers, head, teacher_forced=target is not None)


# ---- pictures ---------------------------------------------------------------------------------------------------


def _label(word: str) -> str:
    return word.replace("$", r"\$")  # a '$' would start matplotlib's mathtext


def alignment_png(alignment: Alignment, path: str | os.PathLike | io.IOBase) -> None:
    """The heatmap: source words along the top, target words down the side, darker = more attention.
    Sized so that the labels of 30-word sentences stay readable (about 0.3 inch per word)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = np.asarray(alignment.weights, dtype=float)
    n_tgt, n_src = w.shape
    if (n_tgt, n_src) != (len(alignment.target_words), len(alignment.source_words)):
        raise ValueError(
            f"weights have shape {w.shape} but there are {len(alignment.target_words)} target and "
            f"{len(alignment.source_words)} source words; build the Alignment with cross_attention"
        )
    longest = max(len(x) for x in alignment.source_words + alignment.target_words)
    margin = 0.6 + 0.075 * min(longest, 25)  # room for the longest label, in inches
    width = min(24.0, margin + 0.32 * n_src + 1.4)
    height = min(24.0, margin + 0.32 * n_tgt + 0.8)
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    image = ax.imshow(w, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticks(range(n_src), [_label(x) for x in alignment.source_words], rotation=90, fontsize=9)
    ax.set_yticks(range(n_tgt), [_label(x) for x in alignment.target_words], fontsize=9)
    ax.set_xticks(np.arange(n_src + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n_tgt + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="#dddddd", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.set_title(alignment.describe(), fontsize=9, y=-0.02, va="top")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="attention")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _png_uri(alignment: Alignment) -> str:
    buffer = io.BytesIO()
    alignment_png(alignment, buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _cell(value: float) -> str:
    grey = round(255 * (1.0 - value))  # white 0 .. black 1, as in the PNG
    ink = "#fff" if value > 0.5 else "#000"
    return f'<td style="background:rgb({grey},{grey},{grey});color:{ink}">{value:.2f}</td>'


def alignment_section(alignment: Alignment, title: str = "") -> str:
    """One alignment as an HTML fragment (heading, the sentences, the PNG inline, the numbers as a shaded
    table); every piece of user text is escaped, so any page can embed it."""
    source = " ".join(
        alignment.source_words[:-1] if alignment.source_words[-1:] == [EOS_WORD] else alignment.source_words
    )
    target = " ".join(
        alignment.target_words[:-1] if alignment.target_words[-1:] == [EOS_WORD] else alignment.target_words
    )
    header = "<tr><th></th>" + "".join(f"<th>{html.escape(x)}</th>" for x in alignment.source_words) + "</tr>"
    rows = "".join(
        f"<tr><th>{html.escape(word)}</th>" + "".join(_cell(float(v)) for v in row) + "</tr>"
        for word, row in zip(alignment.target_words, np.asarray(alignment.weights))
    )
    return (
        f"<section><h2>{html.escape(title)}</h2>"
        f"<p>source: <q>{html.escape(source)}</q><br>target: <q>{html.escape(target)}</q><br>"
        f"{html.escape(alignment.describe())}</p>"
        f'<img src="{_png_uri(alignment)}" alt="{html.escape("cross-attention of: " + source)}">'
        f"<details><summary>numbers</summary><table>{header}{rows}</table></details></section>"
    )


def alignment_html(alignments: Alignment | Sequence[Alignment], path: str | os.PathLike) -> Path:
    """A self-contained page (no scripts, no external files: PNGs as data URIs) with one section per alignment."""
    if isinstance(alignments, Alignment):
        alignments = [alignments]
    if not alignments:
        raise ValueError("no alignments to write; pass at least one from cross_attention")
    body = "\n".join(alignment_section(a, f"Sentence {i + 1}") for i, a in enumerate(alignments))
    path = Path(path)
    path.write_text(_PAGE.format(body=body), encoding="utf-8")
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ctxrep: cross-attention</title>
<style>
body {{ font-family: sans-serif; max-width: 1400px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.8em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 4px; text-align: right; }}
img {{ max-width: 100%; }}
</style>
</head>
<body>
<h1>Cross-attention: what the decoder looks at in the source</h1>
<p>Rows: target words; columns: source words; each row sums to 1 (sum over a source word's subword pieces,
mean over a target word's pieces).</p>
{body}
</body>
</html>
"""


# ---- the command ------------------------------------------------------------------------------------------------


def write_attention(
    model_dir: str | os.PathLike,
    source: str,
    out: str | os.PathLike,
    target: str | None = None,
    layer: int = -1,
    head: int | None = None,
) -> Alignment:
    """`ctxrep mt attention`: load the model folder, compute the alignment, write `out` (.png or .html)."""
    from ctxrep.translate.train import load_translator

    suffix = Path(out).suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise ValueError(f"--out {out}: the file name must end with .png or .html (the format to write)")
    model, tokenizer = load_translator(model_dir)
    alignment = cross_attention(model, tokenizer, source, target, layer, head)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".png":
        alignment_png(alignment, out)
    else:
        alignment_html([alignment], out)
    return alignment
