"""A cheap language filter: does a text read as French (or English) by its function words?

Counts the commonest short words of each known language. A text is rejected for language L
when another language's words number at least 2 and outnumber L's; text with no function
words at all (commands, names, numbers, tables) passes, so this only catches text that is
clearly in another language (the untranslated English pages of a French manual). The counts
of two texts add up, so a long document can be judged piece by piece.

    reads_as("Le fichier est ouvert dans une fenêtre.", "fr")        -> True
    reads_as("The file is opened in a window and read.", "fr")       -> False
"""

from __future__ import annotations

import re

_FUNCTION_WORDS = {
    "fr": "le la les des du de un une et est sont pour dans que qui pas sur avec par vous ce "
    "cette au aux il elle nous ne se sa son ses leur être peut plus cela été ou où si mais",
    "en": "the and of to is are that for with this be you it by can from which will your when "
    "was have has these not they in",
}
LANGUAGES = tuple(_FUNCTION_WORDS)
_INDEX = {w: i for i, lang in enumerate(LANGUAGES) for w in _FUNCTION_WORDS[lang].split()}
_WORD = re.compile(r"[a-zàâäçéèêëîïôöùûüÿœæ]+")


def function_word_counts(text: str) -> list[int]:
    """How many function words of each language in `LANGUAGES` the text holds."""
    counts = [0] * len(LANGUAGES)
    index = _INDEX
    for w in _WORD.findall(text.lower()):
        i = index.get(w)
        if i is not None:
            counts[i] += 1
    return counts


def reads_as_counts(counts: list[int], language: str) -> bool:
    """`reads_as` from `function_word_counts` (summed over the pieces of a text)."""
    own = counts[LANGUAGES.index(language)]
    other = max((c for lang, c in zip(LANGUAGES, counts, strict=True) if lang != language),
                default=0)  # fmt: skip
    return not (other >= 2 and other > own)


def reads_as(text: str, language: str) -> bool:
    """False when `text` reads as another known language than `language` (see the module)."""
    return reads_as_counts(function_word_counts(text), language)
