"""A tiny synthetic parallel corpus for the MT tests: a deterministic word-substitution "language"."""

from __future__ import annotations

import random
from pathlib import Path

LEXICON = {
    "the": "der",
    "a": "ein",
    "man": "Mann",
    "woman": "Frau",
    "dog": "Hund",
    "cat": "Katze",
    "child": "Kind",
    "sees": "sieht",
    "eats": "isst",
    "likes": "mag",
    "finds": "findet",
    "red": "rote",
    "big": "grosse",
    "small": "kleine",
    "old": "alte",
    "ball": "Ball",
    "apple": "Apfel",
    "house": "Haus",
    "car": "Auto",
    "and": "und",
    "today": "heute",
    "here": "hier",
    "green": "gruene",
    "bird": "Vogel",
}
WORDS = sorted(LEXICON)


def sentence_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n pairs of 3-8 words; the target replaces each source word by its LEXICON entry."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        pairs.append((" ".join(words) + " .", " ".join(LEXICON[w] for w in words) + " ."))
    return pairs


def write_parallel(folder: Path, name: str, n: int, seed: int = 0) -> tuple[Path, Path]:
    """folder/name.en and folder/name.de with n aligned lines."""
    pairs = sentence_pairs(n, seed)
    src, tgt = folder / f"{name}.en", folder / f"{name}.de"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return src, tgt
