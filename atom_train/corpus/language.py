"""Language identification: which language a text is in, and how sure, by py3langid.

py3langid (the `language` extra) is langid.py's model, 139 languages (ISO 639-1 codes, 639-3
where there is none), shipped in its 4.6 MB wheel: offline, about 3 MB/s of text on one core. Chosen over lingua-language-detector by
measurement (docs/corpus.md): the same accuracy on documents, 0.9 points less on short
paragraphs, for a 21x smaller wheel, 9x less memory and 6x the speed.

    identify("Le fichier est ouvert dans une fenêtre.")   -> ("fr", 0.99...)
    languages()                                            -> ("ace", "af", ..., "zu")

The confidence is the identifier's probability of its answer (its scores normalised over
its languages); a document is judged on its first `SAMPLE_CHARS` characters, so that a
book costs no more than a page.
"""

from __future__ import annotations

import functools

from atom_train.corpus.extras import load

SAMPLE_CHARS = 1 << 16
# Confidence buckets of the stats: what each judged document scored.
CONFIDENCE_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.99)


@functools.cache
def _identifier(what: str = "--language"):
    langid = load("language", what)
    return langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)


def languages(what: str = "--language") -> tuple[str, ...]:
    """The ISO 639-1 codes the identifier knows, sorted."""
    return tuple(sorted(set(_identifier(what).nb_classes)))


def identify(text: str, what: str = "--language") -> tuple[str, float]:
    """(language code, confidence in [0, 1]) of `text` (its first SAMPLE_CHARS characters)."""
    lang, conf = _identifier(what).classify(text[:SAMPLE_CHARS])
    return str(lang), float(conf)


def confidence_bucket(conf: float) -> str:
    """The stats' name of the bucket `conf` falls in, e.g. "0.90-0.95"."""
    lo = 0.0
    for hi in CONFIDENCE_BUCKETS:
        if conf < hi:
            return f"{lo:.2f}-{hi:.2f}"
        lo = hi
    return f"{lo:.2f}-1.00"
