"""NER tag schemes and entity-level scoring with the semantics of the CoNLL `conlleval` script.

A tag is "O" or a prefix and an entity type, e.g. "B-PER". Prefixes: B (begin), I (inside),
E (end), S (single). IOB1 (CoNLL-2003) uses I everywhere and B only between two adjacent entities
of the same type; BIO (IOB2) starts every entity with B; IOBES also marks ends and singletons.

Entities are decoded as conlleval decodes them, whatever the scheme:
  - an entity ends after an E or S tag, before a B, S or O tag, and wherever the type changes;
  - an entity starts at a B or S tag, at an I or E tag that follows O, E or S, and wherever the
    type changes. So an I- tag with no entity to continue starts a new entity ("O I-PER" is a
    one-word PER), and "B-PER I-LOC" is two entities.
The converters below go through this decoding, so they never change which entities a sequence holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# the tag schemes a TokenTagger scores entities by (auto: read from the training tags; none: no entities, per-tag)
TAG_SCHEMES = ("auto", "iob1", "bio", "iobes", "none")


@dataclass(frozen=True)
class Entity:
    type: str
    start: int  # index of the first word
    end: int  # index one past the last word


def _split_tag(tag: str, index: int) -> tuple[str, str]:
    """("B", "PER") for "B-PER"; ("O", "") for "O"."""
    if tag == "O":
        return "O", ""
    prefix, dash, type_ = tag.partition("-")
    if not dash or prefix not in ("B", "I", "E", "S") or not type_:
        raise ValueError(
            f"tag {index + 1} is {tag!r}; expected 'O' or one of B-, I-, E-, S- followed by an "
            "entity type, e.g. 'B-PER'"
        )
    return prefix, type_


def entities(tags: Sequence[str]) -> list[Entity]:
    """The entities in one sentence's tags, decoded with conlleval's rules (see the module doc)."""
    found: list[Entity] = []
    start = None
    prev_prefix, prev_type = "O", ""
    for i, tag in enumerate([*tags, "O"]):  # the final "O" closes an entity that runs to the end
        prefix, type_ = _split_tag(tag, i)
        ends = prev_prefix in ("E", "S") or (prev_prefix != "O" and (prefix in ("B", "S", "O") or type_ != prev_type))
        starts = prefix in ("B", "S") or (prefix != "O" and (prev_prefix in ("O", "E", "S") or type_ != prev_type))
        if ends and start is not None:
            found.append(Entity(prev_type, start, i))
            start = None
        if starts:
            start = i
        prev_prefix, prev_type = prefix, type_
    return found


def iob1_to_bio(tags: Sequence[str]) -> list[str]:
    """IOB1 -> BIO (IOB2): every entity starts with B-. Example: I-PER I-PER B-PER -> B-PER I-PER B-PER."""
    out = ["O"] * len(tags)
    for e in entities(tags):
        out[e.start : e.end] = [f"B-{e.type}"] + [f"I-{e.type}"] * (e.end - e.start - 1)
    return out


def bio_to_iobes(tags: Sequence[str]) -> list[str]:
    """BIO -> IOBES: one-word entities become S-, last words E-. Example: B-PER I-PER B-LOC -> B-PER E-PER S-LOC.

    An I- tag that starts an entity is read as B- first (conlleval's rule), so IOB1 input works too.
    """
    out = ["O"] * len(tags)
    for e in entities(tags):
        if e.end - e.start == 1:
            out[e.start] = f"S-{e.type}"
        else:
            n_inside = e.end - e.start - 2
            out[e.start : e.end] = [f"B-{e.type}"] + [f"I-{e.type}"] * n_inside + [f"E-{e.type}"]
    return out


@dataclass
class Scores:
    """Entity-level precision, recall and F1 (fractions in [0, 1], not conlleval's percentages)."""

    correct: int  # predicted entities whose type, start and end all match a gold entity
    predicted: int
    gold: int

    @property
    def precision(self) -> float:
        return self.correct / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.correct / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


@dataclass
class NerScores:
    overall: Scores
    by_type: dict[str, Scores] = field(default_factory=dict)


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> NerScores:
    """Score predicted tag sequences against gold ones, sentence by sentence, like conlleval.

    `gold` and `predicted` hold one tag sequence per sentence, in the same order and lengths.
    """
    if len(gold) != len(predicted):
        raise ValueError(
            f"got {len(gold)} gold sentences but {len(predicted)} predicted ones; "
            "pass one predicted tag sequence per gold sentence"
        )
    overall = Scores(0, 0, 0)
    by_type: dict[str, Scores] = {}
    for n, (gold_tags, pred_tags) in enumerate(zip(gold, predicted), start=1):
        if len(gold_tags) != len(pred_tags):
            raise ValueError(
                f"sentence {n}: {len(gold_tags)} gold tags but {len(pred_tags)} predicted tags; "
                "predict exactly one tag per word"
            )
        try:
            gold_entities = set(entities(gold_tags))
            pred_entities = set(entities(pred_tags))
        except ValueError as e:
            raise ValueError(f"sentence {n}: {e}") from None
        for e in gold_entities:
            by_type.setdefault(e.type, Scores(0, 0, 0)).gold += 1
        for e in pred_entities:
            scores = by_type.setdefault(e.type, Scores(0, 0, 0))
            scores.predicted += 1
            scores.correct += e in gold_entities
        overall.gold += len(gold_entities)
        overall.predicted += len(pred_entities)
        overall.correct += len(gold_entities & pred_entities)
    return NerScores(overall, dict(sorted(by_type.items())))
