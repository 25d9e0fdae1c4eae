"""Synthetic French-like text: deterministic test corpora and benchmark inputs.

`synthetic_text(n, seed)` gives words, punctuation, sentence capitals, accents (multi-byte
UTF-8) and newlines, the same bytes for the same seed; `write_synthetic_corpus` writes a large
one to disk in blocks (the writer's memory stays small).
"""

from __future__ import annotations

import random
from pathlib import Path

_WORDS = [
    "le",
    "la",
    "les",
    "un",
    "une",
    "des",
    "et",
    "est",
    "dans",
    "pour",
    "que",
    "qui",
    "sur",
    "avec",
    "pas",
    "plus",
    "son",
    "sa",
    "ses",
    "au",
    "aux",
    "chat",
    "maison",
    "temps",
    "jour",
    "monde",
    "vie",
    "homme",
    "femme",
    "enfant",
    "main",
    "pays",
    "ville",
    "travail",
    "année",
    "été",
    "être",
    "avoir",
    "faire",
    "dire",
    "aller",
    "voir",
    "savoir",
    "pouvoir",
    "vouloir",
    "venir",
    "prendre",
    "très",
    "bien",
    "où",
    "déjà",
    "après",
    "même",
    "français",
    "élève",
    "côté",
    "fenêtre",
]


def synthetic_text(n_bytes: int, seed: int = 0) -> bytes:
    """Deterministic French-looking text (words, punctuation, capitals, accents, newlines)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    sentence_start = True
    while size < n_bytes:
        w = rng.choice(_WORDS)
        if sentence_start:
            w = w[:1].upper() + w[1:]
        sentence_start = False
        r = rng.random()
        if r < 0.08:
            w += ". " if rng.random() < 0.8 else ".\n"
            sentence_start = True
        elif r < 0.14:
            w += ", "
        else:
            w += " "
        out.append(w)
        size += len(w.encode())
    return "".join(out).encode()[:n_bytes]


def write_synthetic_corpus(path: str | Path, n_bytes: int, seed: int = 0) -> None:
    """Write `n_bytes` of synthetic text to `path`, in 1 MiB blocks of `synthetic_text`."""
    block = 1 << 20
    with open(path, "wb") as f:
        for i, start in enumerate(range(0, n_bytes, block)):
            f.write(synthetic_text(min(block, n_bytes - start), seed=seed * 100_003 + i))
