"""BLEU and chrF through sacreBLEU, on detokenized text, with sacreBLEU's signatures.

    s = score(hypotheses, references)      # lists of detokenized sentences, one reference per hypothesis
    print(s.format())                      # BLEU = 35.12 66.1/41.3/27.9/19.0 (BP = ...) ... nrefs:1|case:mixed|...

The defaults are sacreBLEU's own (Post 2018, "A Call for Clarity in Reporting BLEU Scores"): BLEU with the 13a
tokenizer, cased, exponential smoothing; chrF with character 6-grams and beta 2. The signature printed next to
each number says exactly that, so a score can be compared with published ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Scores:
    bleu: float
    chrf: float
    bleu_text: str  # "BLEU = 35.12 66.1/41.3/27.9/19.0 (BP = 1.000 ratio = 1.004 hyp_len = ... ref_len = ...)"
    chrf_text: str
    bleu_signature: str  # "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x"
    chrf_signature: str
    sentences: int

    def format(self) -> str:
        """Two lines, each starting with the metric's name and ending with its signature."""
        return f"{self.bleu_text} | {self.bleu_signature}\n{self.chrf_text} | {self.chrf_signature}"

    def as_dict(self) -> dict[str, float]:
        return {"bleu": self.bleu, "chrf": self.chrf}


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """Corpus BLEU and chrF of `hypotheses` against one reference each (both detokenized)."""
    from sacrebleu.metrics import BLEU, CHRF

    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("score() takes lists of sentences, not one string; wrap a single sentence in a list")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; score needs one reference per "
            "hypothesis, in the same order"
        )
    if not references:
        raise ValueError("nothing to score: no hypotheses and no references")
    hyps, refs = [h.strip() for h in hypotheses], [[r.strip() for r in references]]
    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(hyps, refs), chrf.corpus_score(hyps, refs)
    return Scores(b.score, c.score, str(b), str(c), str(bleu.get_signature()), str(chrf.get_signature()), len(hyps))


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def rouge(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1, -2, -L and -Lsum (Lin 2004) F-measures x 100, the mean over sentence pairs, through Google's
    rouge-score with its Porter stemmer (the summarisation papers' and Hugging Face evaluate's setting); Lsum splits
    sentences at newlines."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise ImportError(
            "ROUGE needs the rouge-score package: pip install 'ctxrep[seq2seq]' (or rouge-score)"
        ) from None
    if len(hypotheses) != len(references) or not references:
        raise ValueError(f"{len(hypotheses)} hypotheses and {len(references)} references: give one reference each")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for h, r in zip(hypotheses, references):
        for name, value in scorer.score(r, h).items():
            totals[name] += value.fmeasure
    return {name: 100 * total / len(references) for name, total in totals.items()}


def score_files(hyp: str, ref: str) -> Scores:
    """score() on two UTF-8 files of one sentence per line (line counts must match)."""
    from ctxrep.translate.data import read_lines

    hyps, refs = read_lines(hyp), read_lines(ref)
    if len(hyps) != len(refs):
        short, n = (hyp, len(hyps)) if len(hyps) < len(refs) else (ref, len(refs))
        raise ValueError(
            f"{hyp} has {len(hyps)} lines and {ref} has {len(refs)}: {short} ends at line {n}; score needs one "
            "hypothesis per reference line"
        )
    return score(hyps, refs)
