"""Bytes to clean text: decoding, Unicode normalisation, one kind of newline, no control
characters.

Two users, two strengths:

- `clean_piece(data, options)`: what the corpus builder applies to every document, each
  step a choice in `CleanOptions` and reported as a flag, so the build can count what it
  changed. It keeps the text's layout (spaces, indentation, blank lines).
- `normalize_text(text)`: the stronger normaliser of text extracted from markup
  (`corpus.markup`): plain spaces, stripped lines, at most one blank line in a row.

Control characters, everywhere in this module: C0 except tab, newline and carriage return
(which newline normalisation handles), DEL, and C1 (U+0080-U+009F).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from dataclasses import dataclass

# ---- control characters ------------------------------------------------------------------

_C0_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
# In UTF-8 a C1 character is 0xC2 followed by 0x80-0x9F; searching the bytes for 0xC2 first
# is fast, and most text that has 0xC2 (no-break space, « ») has no C1 at all.
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")
_C1 = re.compile(r"[\x80-\x9f]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # the three sets above, on str


# ---- decoding ---------------------------------------------------------------------------


def decode_bytes(data: bytes, declared: str | None = None) -> str:
    """Decode to str: UTF-8 when valid, else the declared encoding, else cp1252 (never fails).

    Old man pages are latin-1 and old HTML is often windows-1252 while claiming latin-1;
    cp1252 is a superset of latin-1 for printable text, and bytes it cannot map fall back to
    latin-1, so every input gives valid text.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if declared:
        try:
            # Pages that say latin-1 are usually windows-1252 (curly quotes in 0x80-0x9f).
            if codecs.lookup(declared).name == "iso8859-1":
                declared = "cp1252"
        except LookupError:
            declared = None
    for enc in (declared, "cp1252"):
        if not enc:
            continue
        try:
            return data.decode(enc)
        except (UnicodeDecodeError, LookupError):
            continue
    return data.decode("latin-1")


# ---- the builder's cleaning -------------------------------------------------------------

INVALID_UTF8_CHOICES = ("replace", "drop", "cp1252")
UNICODE_CHOICES = ("NFC", "NFKC", "none")
NEWLINE_CHOICES = ("lf", "keep")
CONTROL_CHOICES = ("drop", "keep")

# What `clean_piece` changed, as bits (a document's flags are the OR of its pieces').
INVALID_UTF8 = 1
NEWLINES = 2
UNICODE = 4
CONTROL = 8
FLAG_NAMES = {
    INVALID_UTF8: "invalid_utf8",
    NEWLINES: "newlines",
    UNICODE: "unicode",
    CONTROL: "control",
}


@dataclass(frozen=True)
class CleanOptions:
    """invalid_utf8: "replace" (U+FFFD), "drop" (the whole document), or "cp1252" (read the
    piece as windows-1252, latin-1 where that fails: legacy files). unicode: a normal form or
    "none". newlines: "lf" turns CRLF and lone CR into LF, "keep" leaves them. control:
    "drop" removes control characters, "keep" leaves them."""

    invalid_utf8: str = "replace"
    unicode: str = "NFC"
    newlines: str = "lf"
    control: str = "drop"


def _surrogates_to_bytes(text: str) -> bytes:
    """UTF-8 of a str with lone surrogates (bad bytes kept by surrogateescape, or "\\ud800"
    escapes in JSON), as the invalid bytes they stand for, so the invalid-UTF-8 choice
    applies to them like to any other."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def clean_piece(piece: bytes | str, options: CleanOptions) -> tuple[str, bytes, int] | None:
    """(text, its UTF-8 bytes, flags of what changed), or None when the piece is not valid
    UTF-8 and `options.invalid_utf8` is "drop". A str piece (already decoded) is cleaned
    like its UTF-8 bytes.

    A piece is a whole document or a part of one cut at a line end (or between two ASCII
    characters): every step here is local to such a piece, so cleaning the parts gives the
    same text as cleaning the whole. The work happens on bytes where it can (CR and C0 are
    single bytes in UTF-8), so valid, clean text costs a few scans.
    """
    text: str | None = None
    if isinstance(piece, str):
        try:
            data = piece.encode("utf-8")
            text = piece
        except UnicodeEncodeError:
            data = _surrogates_to_bytes(piece)
    else:
        data = piece
    flags = 0
    if options.newlines == "lf" and b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        flags |= NEWLINES
        text = None
    drop_control = options.control == "drop"
    if drop_control:
        kept = data.translate(None, _C0_BYTES)
        if len(kept) != len(data):
            data = kept
            flags |= CONTROL
            text = None
    reencode = False
    if text is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            flags |= INVALID_UTF8
            if options.invalid_utf8 == "drop":
                return None
            if options.invalid_utf8 == "cp1252":
                text = decode_bytes(data)
            else:
                text = data.decode("utf-8", "replace")
            reencode = True
            if drop_control and _C1.search(text):  # latin-1 fallback bytes 0x80-0x9f
                text = _C1.sub("", text)
                flags |= CONTROL
    if not reencode and drop_control and b"\xc2" in data and _C1_UTF8.search(data):
        text = _C1.sub("", text)
        flags |= CONTROL
        reencode = True
    if options.unicode != "none" and not text.isascii():
        normal = unicodedata.normalize(options.unicode, text)
        # normalize() returns its argument when the quick check passes: no comparison then.
        if normal is not text and normal != text:
            text = normal
            flags |= UNICODE
            reencode = True
    return text, (text.encode("utf-8") if reencode else data), flags


# ---- the markup normaliser --------------------------------------------------------------

# Spaces a reader does not see as different; a byte model should not have to learn them.
_SPACE_CHARS = dict.fromkeys(map(ord, "\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006"), " ")
_SPACE_CHARS.update(dict.fromkeys(map(ord, "\u2007\u2008\u2009\u200a\u202f\u205f\u3000\t"), " "))
# Invisible characters: soft hyphen, zero-width (non-)joiners, BOM, word joiner.
_SPACE_CHARS.update(dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"), None))
_MULTISPACE = re.compile(r" {2,}")


def normalize_text(text: str) -> str:
    """NFC, plain spaces, no control characters, stripped lines, at most one blank line."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").translate(_SPACE_CHARS)
    text = _CONTROL.sub("", text)
    lines = [_MULTISPACE.sub(" ", line).strip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)
