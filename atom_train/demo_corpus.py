"""Build a French plain-text demo corpus from Debian documentation packages.

The demo needs real French text without a download from the open internet. Debian ships
its documentation translated into French (manuals, man pages, help systems); this module
fetches those packages with `apt-get download`, reads them with `dpkg-deb --fsys-tarfile`
(no root needed, nothing is installed or unpacked to disk), strips HTML, man pages (troff)
and LyX manuals to plain UTF-8 text, keeps French paragraphs, deduplicates, and writes
training shards plus one held-out val shard:

    OUT/train-000.txt, train-001.txt, ...   training text (paragraphs, blank-line separated)
    OUT/val.txt                             held-out documents, never in a train shard
    OUT/MANIFEST.json                       packages and versions, figures, sha256 per file

The same packages give byte-identical output: members are read in sorted order, documents
are ordered by a hash of their name, and nothing depends on time or locale. A complete
output (MANIFEST valid, every file present with its sha256) is reused as is; `--force`
rebuilds. The .deb files are cached under `--cache` (default: OUT/../.debs).

Examples:
    python -m atom_train.demo_corpus --out data/demo
    python -m atom_train.demo_corpus --out data/demo --max-mib 8 --force
    python -m atom_train.demo_corpus --out data/demo --packages manpages-fr,debian-reference-fr
    python -m atom_train.demo_corpus --out data/demo --packages default,debian-handbook
    python -m atom_train.demo_corpus --list-packages

Without apt (not Debian or Ubuntu) it stops with exit status 2 and says so: train on your
own UTF-8 text with `python -m atom_train.train --data 'my_texts/*.txt' ...` instead.
"""

from __future__ import annotations

import argparse
import codecs
import functools
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from html.parser import HTMLParser
from pathlib import Path

from atom_train.cli import UserError, atomic_write, user_error_exit

MANIFEST_FORMAT = "atom-demo-corpus"
MANIFEST_VERSION = 1
# Bump when extraction or cleaning changes, so a cached corpus built by older rules is rebuilt.
EXTRACTOR_VERSION = 1

MIB = 1 << 20


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


class DemoCorpusError(UserError):
    """A user-facing failure; the message says what to do next."""


# --------------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackageSpec:
    """Which members of a package are documents. Globs match the member path (no leading ./)."""

    name: str
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    note: str = ""


_MAN_GLOBS = ("usr/share/man/fr/man*/*",)


def _spec(name: str, *include: str, exclude: tuple[str, ...] = (), note: str = "") -> PackageSpec:
    return PackageSpec(name, include, exclude, note)


# Ordered by the French text each gives after filtering and deduplication, measured on
# Debian 12 (docs/demo_corpus.md has the figures); earlier packages win ties in dedup.
PACKAGES: dict[str, PackageSpec] = {
    s.name: s
    for s in (
        _spec("libreoffice-help-fr", "usr/share/libreoffice/help/fr/*.html",
              note="LibreOffice help: 2,500 short how-to pages"),
        _spec("manpages-fr-dev", *_MAN_GLOBS, note="man pages, sections 2-3 (C library)"),
        _spec("manpages-fr", *_MAN_GLOBS, note="man pages, sections 1, 4-8"),
        _spec("lilypond-doc-html-fr", "usr/share/doc/lilypond/html/*.fr.html",
              # The big-page files repeat the split pages; index pages are lists of names.
              exclude=("*-big-page.fr.html", "*/lilypond-index.fr.html", "*/index_toc.fr.html"),
              note="LilyPond manuals (music engraving)"),
        _spec("gimp-help-fr", "usr/share/gimp/2.0/help/fr/*.html",
              note="GIMP manual (partly untranslated: English paragraphs are dropped); 52 MB"),
        _spec("lyx-common", "usr/share/lyx/doc/fr/*.lyx", note="LyX manuals (LyX format)"),
        _spec("debian-reference-fr", "usr/share/debian-reference/*.fr.html",
              note="Debian Reference"),
        _spec("harden-doc", "usr/share/doc/harden-doc/html/fr-FR/*.html",
              note="Securing Debian Manual (French part of a multilingual package)"),
        _spec("grisbi-common", "usr/share/doc/grisbi/fr/*.html",
              note="Grisbi (personal finance) user manual"),
        _spec("gnome-user-docs", "usr/share/help/fr/*.page",
              note="GNOME help (Mallard pages; French part)"),
        _spec("developers-reference-fr", "usr/share/developers-reference/fr/*.html",
              exclude=("*/developers-reference.html",),  # the split pages, on one page
              note="Debian Developer's Reference"),
        _spec("aptitude-doc-fr", "usr/share/doc/aptitude/html/fr/*.html",
              note="aptitude manual"),
        _spec("maint-guide-fr", "usr/share/doc/maint-guide-fr/html/*.html",
              note="Debian New Maintainers' Guide"),
        _spec("debian-faq-fr", "usr/share/doc/debian/FAQ/fr/*.html", note="Debian FAQ"),
        _spec("texworks-help-fr", "usr/share/texworks-help/fr/*.html", note="TeXworks help"),
        # Not in the default set: large downloads for little French text.
        _spec("debian-handbook", "usr/share/doc/debian-handbook/html/fr-FR/*.html",
              note="extra: Debian Administrator's Handbook, partly translated; 35 MB"),
        _spec("installation-guide-amd64", "usr/share/doc/installation-guide-amd64/fr/*.html",
              note="extra: Debian installation guide; 18 MB"),
        _spec("tuxpaint-data", "usr/share/doc/tuxpaint-data/fr_FR.UTF-8/html/*.html",
              note="extra: Tux Paint documentation; 8 MB"),
        _spec("debian-edu-doc-fr", "usr/share/doc/debian-edu-doc-fr/*bookworm-manual.html",
              note="extra: Debian Edu manual; 10 MB"),
        _spec("debian-history", "usr/share/doc/debian-history/docs/*.fr.html",
              note="extra: a brief history of Debian"),
    )
}  # fmt: skip
DEFAULT_PACKAGES = tuple(name for name, s in PACKAGES.items() if not s.note.startswith("extra:"))


# --------------------------------------------------------------------------------------------
# Text normalisation
# --------------------------------------------------------------------------------------------

# Spaces a reader does not see as different; a byte model should not have to learn them.
_SPACE_CHARS = dict.fromkeys(map(ord, "\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006"), " ")
_SPACE_CHARS.update(dict.fromkeys(map(ord, "\u2007\u2008\u2009\u200a\u202f\u205f\u3000\t"), " "))
# Invisible characters: soft hyphen, zero-width (non-)joiners, BOM, word joiner.
_SPACE_CHARS.update(dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"), None))
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
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


_COOKIE = re.compile(rb"coding[:=]\s*([-\w.]+)")
_HTML_CHARSET = re.compile(rb"""(?:charset|encoding)\s*=\s*["']?\s*([-\w.:]+)""", re.I)


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


# --------------------------------------------------------------------------------------------
# HTML -> text
# --------------------------------------------------------------------------------------------

_SKIP_TAGS = _names(
    "script style head nav pre noscript template svg math textarea select button form iframe "
    "object header footer aside "
    # Mallard (GNOME help .page files): metadata, link lists, editor comments, terminal output.
    "info links comment screen media"
)
# class or id tokens of navigation, tables of contents, footers and bug-report boxes in the
# generators used by Debian docs (DocBook XSL, texinfo, LibreOffice help, asciidoc).
_SKIP_NAMES = _names(
    "navheader navfooter nav_table navigation nav breadcrumb breadcrumbs toc toc2 toctitle "
    "footer footer_version footer_report languages reportbug sidebar menu tocframe "
    "search header banner screen programlisting synopsis literallayout headerlink"
)
_BLOCK_TAGS = _names(
    "p div h1 h2 h3 h4 h5 h6 ul ol dl table blockquote section article main figure "
    "figcaption caption center address details summary fieldset legend hr body html "
    "title subtitle page note steps terms tree item"
)
_LINE_TAGS = _names("li dt dd tr br")
# A class or id skips only a container that is reliably closed: skipping an unclosed <p> or a
# void <input class="search"> would swallow the rest of the page.
_SKIPPABLE_CONTAINERS = _names("div span a table ul ol dl section nav aside header footer form")
_WS = re.compile(r"\s+")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_tag: str | None = None
        self._skip_depth = 0

    def _skipped(self, tag: str, attrs: list[tuple[str, str | None]]) -> bool:
        if tag in _SKIP_TAGS:
            return True
        if tag not in _SKIPPABLE_CONTAINERS:
            return False  # e.g. asciidoc puts "toc2" on <body>: a layout hint, not a TOC
        for key, value in attrs:
            if key in ("class", "id") and value and not _SKIP_NAMES.isdisjoint(value.split()):
                return True
            if key == "role" and value == "navigation":
                return True
        return False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is not None:
            # Count nested elements of the skipped kind so the right end tag ends the skip.
            if tag == self._skip_tag:
                self._skip_depth += 1
            return
        if self._skipped(tag, attrs):
            self._skip_tag, self._skip_depth = tag, 1
            return
        if tag in _BLOCK_TAGS:
            self.parts.append("\n\n")
        elif tag in _LINE_TAGS:
            self.parts.append("\n")
            if tag == "li":
                self.parts.append("- ")
        elif tag in ("td", "th"):
            self.parts.append(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # <br/>, <hr/>, <img/>: void elements never start a skip that needs an end tag.
        if self._skip_tag is None and tag in ("br", "hr"):
            self.parts.append("\n" if tag == "br" else "\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if tag in _BLOCK_TAGS:
            self.parts.append("\n\n")
        elif tag in _LINE_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._skip_tag is None:
            # Outside <pre> a run of whitespace (newlines included) renders as one space.
            self.parts.append(_WS.sub(" ", data))


def html_to_text(source: str) -> str:
    """Plain text of an HTML page: paragraphs separated by a blank line, list items on lines.

    Dropped: <head>, scripts, styles, <pre> (code), forms, and navigation / table-of-contents
    / footer blocks (by tag, class or id). Entities are decoded. Result is normalized.
    """
    parser = _TextExtractor()
    parser.feed(source)
    parser.close()
    return normalize_text("".join(parser.parts))


def html_charset(data: bytes) -> str | None:
    m = _HTML_CHARSET.search(data[:4096])
    return m.group(1).decode("ascii", "replace") if m else None


# --------------------------------------------------------------------------------------------
# troff (man pages) -> text
# --------------------------------------------------------------------------------------------

_GLYPHS = {
    "em": "—", "en": "–", "hy": "-", "mi": "-", "bu": "•", "co": "©", "rg": "®", "tm": "™",
    "aq": "'", "dq": '"', "oq": "‘", "cq": "’", "lq": "“", "rq": "”", "Fo": "«", "Fc": "»",
    "fo": "‹", "fc": "›", "bq": "‚", "Bq": "„", "ga": "`", "ti": "~", "ha": "^", "rs": "\\",
    "sl": "/", "mu": "×", "di": "÷", "de": "°", "+-": "±", "->": "→", "<-": "←", "<>": "↔",
    "=>": "⇒", "<=": "≤", ">=": "≥", "!=": "≠", "==": "≡", "~=": "≈", "eu": "€", "Eu": "€",
    "sc": "§", "ps": "¶", "ss": "ß", "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "dg": "†",
    "dd": "‡", "ct": "¢", "Po": "£", "Ye": "¥", "lB": "[", "rB": "]", "lC": "{", "rC": "}",
    "la": "⟨", "ra": "⟩", "ba": "|", "br": "│", "ul": "_", "ru": "_", "at": "@", "sh": "#",
    "Do": "$", "pl": "+", "eq": "=", "no": "¬", "12": "½", "14": "¼", "34": "¾", "mc": "µ",
    "aa": "´", "fi": "fi", "fl": "fl", "ff": "ff", "%0": "‰", "sq": "□", "ci": "○",
    "lh": "☜", "rh": "☞", "OK": "✓", "tno": "¬", "ts": "ς", "*a": "α", "*b": "β", "*p": "π",
    "*m": "μ", "*l": "λ", "*s": "σ", "*S": "Σ", "if": "∞", "sr": "√", "pc": "·", "md": "⋅",
    "lA": "⇐", "rA": "⇒", "uA": "⇑", "dA": "⇓", "ua": "↑", "da": "↓", "tf": "∴", "3d": "∴",
}  # fmt: skip
# \('e, \(`a, \(^o, \(:u, \(,c, \(~n: accent + letter, composed with a combining mark.
_ACCENTS = {
    "'": "\u0301",
    "`": "\u0300",
    "^": "\u0302",
    ":": "\u0308",
    ",": "\u0327",
    "~": "\u0303",
}
_STRINGS = {"lq": "“", "rq": "”", "R": "®", "Tm": "™", "S": "", "Lq": "“", "Rq": "”"}

_ESCAPE = re.compile(
    r"""\\(?:
        \((?P<two>..)
      | \[(?P<long>[^\]]*)\]
      | \*(?:\((?P<str2>..)|\[(?P<strl>[^\]]*)\]|(?P<str1>.))
      | [fFmMn](?:\(..|\[[^\]]*\]|.)
      | s(?:[-+]?\(\d\d|[-+]?\[[^\]]*\]|\([-+]?\d\d|[-+]?'[^']*'|[-+]?\d)
      | N'(?P<num>\d+)'
      | [hvwlLoDbxXSRZAC](?P<q>['"|]).*?(?P=q)
      | [kgyz$].
      | (?P<one>.)
    )""",
    re.X,
)
_ONE = {
    "-": "-", " ": " ", "~": " ", "0": " ", "e": "\\", "E": "\\", "\\": "\\", ".": ".",
    "'": "'", "`": "`", "&": "", "|": "", "^": "", ",": "", "/": "", "%": "", ":": "",
    "c": "", "d": "", "u": "", "r": "", "p": "", "a": "", "t": " ", "{": "", "}": "",
    '"': "", "!": "", "?": "",
}  # fmt: skip


def _glyph(name: str) -> str:
    if name in _GLYPHS:
        return _GLYPHS[name]
    if len(name) == 2 and name[0] in _ACCENTS and name[1].isalpha():
        return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    m = re.fullmatch(r"u([0-9A-Fa-f]{4,6})((?:_[0-9A-Fa-f]{4,6})*)", name)
    if m:
        cps = [m.group(1), *m.group(2).split("_")[1:]]
        return unicodedata.normalize("NFC", "".join(chr(int(c, 16)) for c in cps))
    m = re.fullmatch(r"char(\d+)", name)
    if m:
        return chr(int(m.group(1)))
    if len(name) == 3 and name[0] in "'`^:,~" and name[1] == " ":  # \[' e] style
        return _glyph(name[0] + name[2])
    return ""


def _unescape(text: str, strings: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group("two") is not None:
            return _glyph(m.group("two"))
        if m.group("long") is not None:
            return _glyph(m.group("long"))
        name = m.group("str2") or m.group("strl") or m.group("str1")
        if name is not None:
            return strings.get(name, _STRINGS.get(name, ""))
        if m.group("num") is not None:
            return chr(int(m.group("num")))
        one = m.group("one")
        if one is not None:
            return _ONE.get(one, one)
        return ""

    return _ESCAPE.sub(sub, text)


def _split_args(line: str) -> list[str]:
    """troff macro arguments: blank-separated, "double quoted" with "" for a quote."""
    args: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        if line[i] == '"':
            i += 1
            buf = []
            while i < n:
                if line[i] == '"':
                    if i + 1 < n and line[i + 1] == '"':
                        buf.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                buf.append(line[i])
                i += 1
            args.append("".join(buf))
        else:
            j = i
            while j < n and line[j] not in " \t":
                j += 2 if line[j] == "\\" else 1
            args.append(line[i:j])
            i = j
    return args


# Sections that are credits or licence boilerplate repeated on every page.
_MAN_SKIP_SECTIONS = frozenset({"TRADUCTION", "TRADUCTEURS", "COLOPHON", "COPYRIGHT"})
# Verbatim or layout regions: (start, end) requests; their content is not prose.
_MAN_BLOCKS = {"nf": "fi", "EX": "EE", "TS": "TE", "EQ": "EN", "PS": "PE", "de": "..", "ig": ".."}
_MAN_FONT_ALT = _names("BR BI IB IR RB RI SB")
_MAN_FONT = _names("B I SM SS")
_MAN_PARA = _names("PP LP P sp TP IP HP TQ Pp Lp")


def troff_to_text(source: str) -> str:
    """Plain text of a man(7) page: headings and filled paragraphs, verbatim blocks dropped.

    Not a troff implementation: enough of man(7) and common requests for Debian's French
    pages. mdoc pages and `.so` redirections give "" (the caller skips them).
    """
    lines = source.replace("\r\n", "\n").split("\n")
    if any(line.startswith((".Dd", ".Sh ")) for line in lines[:200]):
        return ""  # mdoc(7): a handful of pages, not worth a second macro set
    if any(line.startswith(".so ") for line in lines[:20]) and len(lines) < 20:
        return ""
    strings: dict[str, str] = {}
    out: list[str] = []
    para: list[str] = []  # pieces of the current filled line
    block_end: str | None = None
    in_skipped_section = False
    cond_depth = 0
    tag_pending = False  # .TP: the next text line is the tag, on its own line
    join_next = False  # \c at end of line: no space before the next piece

    def flush_line() -> None:
        nonlocal join_next
        if para:
            out.append("".join(para).strip())
            para.clear()
        join_next = False

    def paragraph() -> None:
        flush_line()
        if out and out[-1] != "":
            out.append("")

    def emit(text: str) -> None:
        nonlocal tag_pending, join_next
        if in_skipped_section or not text.strip():
            return
        if para and not join_next:
            para.append(" ")
        para.append(text)
        join_next = False
        if tag_pending:
            flush_line()
            tag_pending = False

    for raw in lines:
        if cond_depth:
            cond_depth += raw.count("\\{") - raw.count("\\}")
            cond_depth = max(cond_depth, 0)
            continue
        if block_end is not None:
            stripped = raw.strip()
            if (block_end == ".." and stripped == "..") or (
                block_end != ".." and re.match(r"[.']\s*" + re.escape(block_end) + r"\b", raw)
            ):
                block_end = None
            continue
        if raw.startswith(('.\\"', "'\\\"", '\\"', ".\\#")):
            continue
        # An inline comment ends the line (but not an escaped backslash before it).
        cut = re.search(r'(?<!\\)(?:\\\\)*\\"', raw)
        line = raw[: cut.start() + (len(cut.group()) - 2)] if cut else raw
        if line.startswith((".", "'")):
            body = line[1:].lstrip()
            m = re.match(r"(\S+)\s*(.*)", body)
            if not m:
                continue
            name, rest = m.group(1), m.group(2)
            if name in ("ie", "if", "el", "while"):
                if "\\{" in rest:
                    cond_depth = max(rest.count("\\{") - rest.count("\\}"), 0)
                continue
            if name in _MAN_BLOCKS:
                paragraph()
                block_end = _MAN_BLOCKS[name]
                continue
            if name in ("SH", "SS"):
                paragraph()
                title = _unescape(" ".join(_split_args(rest)), strings).strip()
                if name == "SH":
                    in_skipped_section = title.upper() in _MAN_SKIP_SECTIONS
                if not in_skipped_section and title:
                    out.extend([title, ""])
                # A heading with no argument takes the next line as its text.
                tag_pending = not title
                continue
            if name in _MAN_PARA:
                paragraph()
                tag_pending = name in ("TP", "TQ")
                if name == "IP":
                    args = _split_args(rest)
                    tag = _unescape(args[0], strings).strip() if args else ""
                    if tag:
                        emit(tag)
                        if len(tag) > 3:  # a label on its own line; a bullet starts the text
                            flush_line()
                continue
            if name == "br":
                flush_line()
                continue
            if name in _MAN_FONT_ALT:
                emit("".join(_unescape(a, strings) for a in _split_args(rest)))
                continue
            if name in _MAN_FONT:
                emit(_unescape(" ".join(_split_args(rest)), strings))
                continue
            if name in ("UR", "MT"):
                continue  # the link text follows; the address itself is not prose
            if name in ("UE", "ME"):
                if rest and not in_skipped_section:
                    para.append(_unescape(" ".join(_split_args(rest)), strings))
                continue
            if name == "ds":
                sm = re.match(r"(\S+)\s?\"?(.*)", rest)
                if sm:
                    strings[sm.group(1)] = _unescape(sm.group(2), strings)
                continue
            if name in ("SY", "OP"):
                emit(_unescape(" ".join(_split_args(rest)), strings))
                continue
            continue  # every other request (.TH, .RS, .in, .ad, .ft, ...) is layout
        if not line.strip():
            paragraph()
            continue
        ends_with_c = line.rstrip().endswith("\\c")
        emit(_unescape(line, strings))
        join_next = ends_with_c
    flush_line()
    return normalize_text("\n".join(out))


# --------------------------------------------------------------------------------------------
# LyX documents -> text
# --------------------------------------------------------------------------------------------

# Insets whose text is part of the sentence; every other inset (formulas, graphics, notes,
# footnotes, tables, cross-references, raw LaTeX, floats) is dropped with its content.
_LYX_INLINE_INSETS = frozenset({"Flex", "Text", "Box"})
_LYX_SPECIAL = {
    "LyX": "LyX", "TeX": "TeX", "LaTeX": "LaTeX", "LaTeX2e": "LaTeX2e", "ldots": "…",
    "menuseparator": " > ", "breakableslash": "/", "slash": "/", "nobreakdash": "-",
}  # fmt: skip
_LYX_INLINE = re.compile(r"\\SpecialChar\s+(\S+)|\\backslash")


def _lyx_inline(m: re.Match[str]) -> str:
    return "\\" if m.group(1) is None else _LYX_SPECIAL.get(m.group(1), "")


# Quotes inset code: style letter (e = English, c/f = French, ...), side (l/r), single/double.
_LYX_QUOTES = {"ld": "« ", "rd": " »", "ls": "‹ ", "rs": " ›"}
_LYX_QUOTES_EN = {"ld": "“", "rd": "”", "ls": "‘", "rs": "’"}
# Layouts that hold code or document metadata rather than prose.
_LYX_SKIP_LAYOUTS = frozenset({"LyX-Code", "Verbatim", "Address", "Right_Address"})


def lyx_to_text(source: str) -> str:
    """Plain text of a LyX document: one paragraph per layout, insets mostly dropped.

    LyX writes a paragraph as text lines that concatenate (a continuation line starts with
    its space) interleaved with `\\command` lines; a literal backslash is `\\backslash`.
    """
    out: list[str] = []
    buf: list[str] = []
    skip_depth = 0  # > 0 inside a dropped inset (nested insets counted)
    inline_depth = 0
    in_header = False
    in_params = False  # between an inline inset's \begin_inset and its first layout
    layout = ""

    def end_paragraph() -> None:
        text = "".join(buf).strip()
        buf.clear()
        if text and layout not in _LYX_SKIP_LAYOUTS:
            prefix = "- " if layout in ("Itemize", "Enumerate") else ""
            out.extend([prefix + text, ""])

    for line in source.replace("\r\n", "\n").split("\n"):
        if in_header:
            in_header = line != "\\end_header"
            continue
        if line.startswith("\\begin_inset"):
            kind = line.split()[1] if len(line.split()) > 1 else ""
            if skip_depth:
                skip_depth += 1
            elif kind in _LYX_INLINE_INSETS:
                inline_depth += 1
                in_params = True
            elif kind == "Quotes":
                code = line.split()[2] if len(line.split()) > 2 else ""
                table = _LYX_QUOTES_EN if code.startswith("e") else _LYX_QUOTES
                buf.append(table.get(code[1:3], '"'))
                skip_depth = 1
            elif kind == "Newline":
                buf.append("\n")
                skip_depth = 1
            elif kind == "space":
                buf.append(" ")
                skip_depth = 1
            else:
                skip_depth = 1
            continue
        if line.startswith("\\end_inset"):
            if skip_depth:
                skip_depth -= 1
            elif inline_depth:
                inline_depth -= 1
            continue
        if skip_depth:
            continue
        if in_params:
            # "status collapsed", "position t", ...: settings of the inset, not text.
            if not line.startswith("\\begin_layout"):
                continue
            in_params = False
        if line.startswith("\\begin_header"):
            in_header = True
        elif line.startswith("\\begin_layout"):
            if not inline_depth:
                end_paragraph()
                layout = line[len("\\begin_layout") :].strip()
        elif line.startswith("\\end_layout"):
            if not inline_depth:
                end_paragraph()
                layout = ""
        elif line.startswith("\\") and not line.startswith(("\\backslash", "\\SpecialChar")):
            continue  # font, language and paragraph settings
        elif layout:  # text outside a layout is file metadata
            # \SpecialChar and \backslash end a text line or stand alone on one.
            buf.append(_LYX_INLINE.sub(_lyx_inline, line))
    end_paragraph()
    return normalize_text("\n".join(out))


# --------------------------------------------------------------------------------------------
# Language filter and deduplication
# --------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-zàâäçéèêëîïôöùûüÿœæ]+")
_FR_WORDS = _names(
    "le la les des du de un une et est sont pour dans que qui pas sur avec par vous ce cette "
    "au aux il elle nous ne se sa son ses leur être peut plus cela été ou où si mais"
)
_EN_WORDS = _names(
    "the and of to is are that for with this be you it by can from which will your when was "
    "have has these not they in"
)


def is_french(paragraph: str) -> bool:
    """False for a paragraph that reads as English (untranslated pages in French packages).

    Counts common function words; text with none (commands, names, numbers) passes: the
    letter-share rule in `clean_document` deals with that.
    """
    fr = en = 0
    for w in _WORD.findall(paragraph.lower()):
        if w in _FR_WORDS:
            fr += 1
        elif w in _EN_WORDS:
            en += 1
    return not (en >= 2 and en > fr)


def _letter_share(text: str) -> float:
    letters = sum(1 for c in text if c.isalpha())
    visible = sum(1 for c in text if not c.isspace())
    return letters / visible if visible else 0.0


@dataclass
class Deduper:
    """Drops a paragraph seen before, anywhere in the corpus (first occurrence wins).

    Short paragraphs (headings such as "DESCRIPTION", list labels) are never dropped: they
    carry the structure of each document. Keys are whitespace-folded digests.
    """

    min_chars: int = 48
    seen: set[bytes] = field(default_factory=set)
    dropped: int = 0

    def is_new(self, paragraph: str) -> bool:
        if len(paragraph) < self.min_chars:
            return True
        key = hashlib.blake2b(" ".join(paragraph.split()).encode(), digest_size=16).digest()
        if key in self.seen:
            self.dropped += 1
            return False
        self.seen.add(key)
        return True


def clean_document(text: str, dedup: Deduper, min_chars: int = 300) -> str:
    """The document's new French paragraphs, or "" when too little is left to be worth it.

    A paragraph is kept when it is French (`is_french`), mostly letters (not a table of
    numbers or a code fragment), and not a repeat (`dedup`). The document is kept when its
    long (deduplicated) paragraphs reach `min_chars`, so a page of headings alone is dropped.
    """
    kept: list[str] = []
    substance = 0
    for para in text.split("\n\n"):
        para = para.strip()
        if not para or not is_french(para) or _letter_share(para) < 0.6:
            continue
        if not dedup.is_new(para):
            continue
        kept.append(para)
        if len(para) >= dedup.min_chars:
            substance += len(para)
    if substance < min_chars:
        return ""
    return "\n\n".join(kept)


# --------------------------------------------------------------------------------------------
# Reading packages
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    package: str
    path: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.package}/{self.path}"

    @property
    def order(self) -> bytes:
        # Documents are shuffled by a digest of their name: stable across runs and
        # independent of the other packages, and it mixes the domains within every shard.
        return hashlib.sha256(self.key.encode()).digest()


def member_to_text(path: str, data: bytes) -> str:
    """Plain text of one package member, by type ("" for a type we do not read)."""
    if path.endswith(".gz"):
        data = gzip.decompress(data)
        path = path[:-3]
    if path.endswith((".html", ".htm", ".xhtml", ".page")):
        return html_to_text(decode_bytes(data, html_charset(data)))
    if path.endswith(".lyx"):
        return lyx_to_text(decode_bytes(data))
    if "/man/" in path:
        m = _COOKIE.search(data[:200])
        return troff_to_text(decode_bytes(data, m.group(1).decode() if m else None))
    return ""


def iter_members(deb: Path, spec: PackageSpec) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of the package's regular files matching `spec`, sorted by path."""
    proc = subprocess.Popen(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    wanted: list[tuple[str, bytes]] = []
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for info in tar:
                path = info.name.removeprefix("./")
                if not info.isfile() or not any(fnmatchcase(path, g) for g in spec.include):
                    continue
                if any(fnmatchcase(path, g) for g in spec.exclude):
                    continue
                f = tar.extractfile(info)
                if f is not None:
                    wanted.append((path, f.read()))
        # Read the tar padding too, so dpkg-deb does not die of a broken pipe.
        while proc.stdout.read(MIB):
            pass
    except tarfile.TarError as e:
        proc.kill()
        raise DemoCorpusError(f"{deb}: not a readable .deb ({e}); delete it and rerun") from None
    finally:
        proc.stdout.close()
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        rc = proc.wait()
    if rc != 0:
        raise DemoCorpusError(f"dpkg-deb failed on {deb}: {stderr.strip()}; delete it and rerun")
    yield from sorted(wanted)


def deb_field(deb: Path, name: str) -> str:
    out = subprocess.run(
        ["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise DemoCorpusError(f"{deb}: not a readable .deb ({out.stderr.strip()}); delete it")
    return out.stdout.strip()


# --------------------------------------------------------------------------------------------
# Downloading
# --------------------------------------------------------------------------------------------

_NO_APT_HINT = (
    "This demo corpus is built from Debian packages and needs a Debian or Ubuntu system "
    "(apt-get and dpkg-deb). Train on your own UTF-8 text instead: "
    "python -m atom_train.train --data 'my_texts/*.txt' ..."
)


def _dpkg_compare(a: str, b: str) -> int:
    if a == b:
        return 0
    lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode
    return -1 if lt == 0 else 1


def cached_deb(cache: Path, package: str) -> Path | None:
    """The newest cached .deb of `package`, or None."""
    found = sorted(cache.glob(f"{package}_*.deb"))
    if not found:
        return None
    if len(found) == 1 or shutil.which("dpkg") is None:
        return found[-1]
    versions = {deb_field(p, "Version"): p for p in found}
    newest = max(versions, key=functools.cmp_to_key(_dpkg_compare))
    return versions[newest]


def _apt_download(package: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", package],
        cwd=cache,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def fetch_debs(packages: Iterable[str], cache: Path, log=print) -> dict[str, Path]:
    """Path of each package's .deb, from the cache or `apt-get download`.

    A package that apt cannot find even with fresh lists is skipped with a warning (not
    every release has all of them); stale or missing package lists are refreshed when we
    are root and explained otherwise; no apt at all is an error that names the way out.
    """
    packages = list(packages)
    cache.mkdir(parents=True, exist_ok=True)
    debs: dict[str, Path] = {}
    missing = []
    for p in packages:
        hit = cached_deb(cache, p)
        if hit is not None:
            debs[p] = hit
        else:
            missing.append(p)
    if not missing:
        return debs
    if shutil.which("apt-get") is None:
        raise DemoCorpusError(f"apt-get not found on PATH. {_NO_APT_HINT}")
    updated = False
    skipped: list[str] = []
    lists_hint = False
    for p in missing:
        log(f"  apt-get download {p}")
        res = _apt_download(p, cache)
        if res.returncode != 0 and _lists_problem(res.stderr) and not updated and _is_root():
            # Stale lists name versions the mirror no longer has (404); missing lists know
            # no package at all. As root we can refresh them, once.
            log("  apt cannot fetch it; refreshing the package lists: apt-get update (as root)")
            upd = subprocess.run(
                ["apt-get", "update"], capture_output=True, text=True, check=False, timeout=1800
            )
            updated = True
            if upd.returncode != 0:
                raise DemoCorpusError(
                    f"apt-get update failed: {_first_error(upd.stderr)}\n"
                    "Check the network or the apt proxy settings, or train on your own text "
                    "with --data."
                )
            res = _apt_download(p, cache)
        if res.returncode != 0:
            err = _first_error(res.stderr)
            if _network_problem(res.stderr):
                raise DemoCorpusError(
                    f"apt-get download {p} failed: {err}\nCannot reach the Debian mirror: "
                    "check the network or the apt proxy settings, or train on your own text "
                    "with --data."
                )
            lists_hint = lists_hint or (_lists_problem(res.stderr) and not _is_root())
            log(f"  warning: skipping {p}: {err}")
            skipped.append(p)
            continue
        hit = cached_deb(cache, p)
        if hit is None:
            log(f"  warning: skipping {p}: apt-get reported success but no .deb appeared")
            skipped.append(p)
            continue
        debs[p] = hit
    hint = (
        "apt's package lists look missing or out of date: run `sudo apt-get update` and rerun."
        if lists_hint
        else ""
    )
    if not debs:
        raise DemoCorpusError(
            f"none of the packages could be downloaded ({', '.join(skipped)}). "
            + (hint + " Or: " if hint else "")
            + _NO_APT_HINT
        )
    if hint:
        log(f"  note: {hint}")
    return debs


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.startswith("E:")]
    return lines[0] if lines else (stderr.strip().splitlines() or ["unknown error"])[-1]


def _lists_problem(stderr: str) -> bool:
    return any(
        s in stderr
        for s in ("Unable to locate package", "has no installation candidate", "404", "Not Found")
    )


def _network_problem(stderr: str) -> bool:
    return any(
        s in stderr
        for s in ("Temporary failure resolving", "Could not connect", "Connection failed",
                  "Could not resolve", "Network is unreachable", "timed out")
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def non_ascii_share(data: bytes) -> float:
    if not data:
        return 0.0
    ascii_bytes = len(data.decode("latin-1").encode("ascii", "ignore"))
    return (len(data) - ascii_bytes) / len(data)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def split_documents(
    docs: list[Document], val_bytes: int, max_train_bytes: int | None
) -> tuple[list[Document], list[Document]]:
    """(train, val) in the deterministic shuffled order.

    Val takes documents from the front of the order until it holds `val_bytes`, or a tenth of
    the text when that is less (a small corpus keeps most of it for training); documents
    larger than a quarter of that target are left to train so that val spans many documents.
    Train takes the rest until `max_train_bytes` (None: no cap).
    """
    ordered = sorted(docs, key=lambda d: (d.order, d.key))
    sizes = {d.key: len(d.text.encode()) + 2 for d in ordered}
    total = sum(sizes.values())
    if max_train_bytes is not None:
        total = min(total, max_train_bytes)
    target = min(val_bytes, total // 10)
    val: list[Document] = []
    train: list[Document] = []
    v = t = 0
    for d in ordered:
        size = sizes[d.key]
        if v < target and size <= max(target // 4, 1):
            val.append(d)
            v += size
        elif max_train_bytes is None or t + size <= max_train_bytes:
            train.append(d)
            t += size
    if not val and train:
        val.append(train.pop(0))  # every document is large: val gets the first one
    return train, val


def render(docs: Iterable[Document]) -> bytes:
    """Documents as text, each followed by a blank line (also at the end of a shard, so the
    loader's circular concatenation of the shards keeps one blank line between documents)."""
    return "".join(d.text + "\n\n" for d in docs).encode()


def shard_documents(docs: list[Document], shard_bytes: int) -> list[list[Document]]:
    """Consecutive groups of documents: as few shards as keep each near `shard_bytes` or
    under, all about the same size (a document is never split)."""
    sizes = [len(d.text.encode()) + 2 for d in docs]
    total = sum(sizes)
    n = max(1, -(-total // shard_bytes))
    shards: list[list[Document]] = [[] for _ in range(n)]
    start = 0
    for d, size in zip(docs, sizes, strict=True):
        # A document goes to the shard where it starts: shard k holds [k, k+1) * total / n.
        shards[min(n - 1, start * n // total)].append(d)
        start += size
    return [s for s in shards if s]


def write_shards(
    out: Path, train: list[Document], val: list[Document], shard_bytes: int
) -> list[dict]:
    """Write train-NNN.txt and val.txt; returns their manifest entries (train first)."""
    entries = []
    groups = [(f"train-{i:03d}.txt", "train", g) for i, g in enumerate(shard_documents(train,
              shard_bytes))]  # fmt: skip
    groups.append(("val.txt", "val", val))
    for name, split, group in groups:
        data = render(group)
        atomic_write(out / name, data)
        entries.append(
            {
                "file": name,
                "split": split,
                "documents": len(group),
                "bytes": len(data),
                "non_ascii_share": round(non_ascii_share(data), 6),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    return entries


def check_manifest(out: Path, options: dict) -> str | None:
    """None when OUT holds a complete corpus built with `options`, else why not."""
    path = out / "MANIFEST.json"
    if not path.is_file():
        return "no MANIFEST.json"
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"MANIFEST.json unreadable ({e})"
    if not isinstance(man, dict) or man.get("format") != MANIFEST_FORMAT:
        return "MANIFEST.json is not a demo-corpus manifest"
    if man.get("version") != MANIFEST_VERSION:
        return f"manifest version {man.get('version')} != {MANIFEST_VERSION}"
    if man.get("options") != options:
        return "built with other options"
    files = man.get("files")
    if not isinstance(files, list) or not files:
        return "manifest lists no files"
    for entry in files:
        try:
            f = out / entry["file"]
            if not f.is_file() or f.stat().st_size != entry["bytes"]:
                return f"{entry['file']} missing or wrong size"
            if _sha256_file(f) != entry["sha256"]:
                return f"{entry['file']} does not match its sha256"
        except (KeyError, TypeError):
            return "manifest entry malformed"
    return None


@dataclass
class PackageReport:
    name: str
    version: str
    deb: str
    deb_sha256: str
    members: int = 0
    documents: int = 0
    raw_text_bytes: int = 0  # after stripping, before language filter and dedup
    text_bytes: int = 0  # after filter and dedup

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def extract(
    debs: dict[str, Path], packages: list[str], log=print
) -> tuple[list[Document], list[PackageReport]]:
    """Documents of every package, cleaned and deduplicated in package order."""
    dedup = Deduper()
    docs: list[Document] = []
    reports = []
    for name in packages:
        if name not in debs:
            continue
        deb = debs[name]
        rep = PackageReport(name, deb_field(deb, "Version"), deb.name, _sha256_file(deb))
        t0 = time.monotonic()
        for path, data in iter_members(deb, PACKAGES[name]):
            rep.members += 1
            text = member_to_text(path, data)
            if not text:
                continue
            rep.raw_text_bytes += len(text.encode())
            text = clean_document(text, dedup)
            if text:
                docs.append(Document(name, path, text))
                rep.documents += 1
                rep.text_bytes += len(text.encode()) + 2
        reports.append(rep)
        log(
            f"  {name} {rep.version}: {rep.members} files -> {rep.documents} documents, "
            f"{rep.text_bytes / MIB:.1f} MiB kept of {rep.raw_text_bytes / MIB:.1f} MiB "
            f"stripped ({time.monotonic() - t0:.1f} s)"
        )
    return docs, reports


def build(
    out: Path,
    cache: Path,
    packages: list[str],
    max_bytes: int | None,
    shard_bytes: int,
    val_bytes: int,
    force: bool = False,
    log=print,
) -> dict:
    """Build (or reuse) the corpus in `out`; returns the manifest."""
    options = {
        "packages": packages,
        "max_train_bytes": max_bytes,
        "shard_bytes": shard_bytes,
        "val_bytes": val_bytes,
        "extractor_version": EXTRACTOR_VERSION,
    }
    why = check_manifest(out, options)
    if why is None and not force:
        man = json.loads((out / "MANIFEST.json").read_text(encoding="utf-8"))
        log(f"{out}: complete demo corpus already there (MANIFEST.json verified); --force rebuilds")
        return man
    if shutil.which("dpkg-deb") is None:
        raise DemoCorpusError(f"dpkg-deb not found on PATH. {_NO_APT_HINT}")
    log(f"building the French demo corpus in {out} ({'--force' if why is None else why})")
    t0 = time.monotonic()
    log(f"fetching {len(packages)} packages into {cache}")
    debs = fetch_debs(packages, cache, log=log)
    log("extracting text")
    docs, reports = extract(debs, packages, log=log)
    train, val = split_documents(docs, val_bytes, max_bytes)
    if not train or not val:
        raise DemoCorpusError(
            "too little text was extracted to make a train and a val shard; "
            "add packages with --packages or raise --max-mib"
        )
    out.mkdir(parents=True, exist_ok=True)
    # The manifest goes last: its presence is what marks the corpus complete.
    (out / "MANIFEST.json").unlink(missing_ok=True)
    for stale in out.glob("train-*.txt"):
        stale.unlink()
    files = write_shards(out, train, val, shard_bytes)
    train_bytes = sum(f["bytes"] for f in files if f["split"] == "train")
    total = sum(f["bytes"] for f in files)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "options": options,
        "packages": [r.to_dict() for r in reports],
        "files": files,
        "train_bytes": train_bytes,
        "val_bytes": total - train_bytes,
        "documents": {"train": len(train), "val": len(val)},
        "non_ascii_share": round(sum(f["non_ascii_share"] * f["bytes"] for f in files) / total, 6),
    }
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    atomic_write(out / "MANIFEST.json", text.encode("utf-8"))
    log(f"done in {time.monotonic() - t0:.0f} s")
    return manifest


def summary(out: Path, manifest: dict) -> str:
    lines = []
    for f in manifest["files"]:
        lines.append(
            f"  {out / f['file']}: {f['bytes']:,} bytes, {f['documents']} documents, "
            f"{100 * f['non_ascii_share']:.2f}% non-ASCII bytes"
        )
    lines.append(
        f"  total: train {manifest['train_bytes']:,} bytes + val {manifest['val_bytes']:,} "
        f"bytes, {100 * manifest['non_ascii_share']:.2f}% non-ASCII bytes, from "
        + ", ".join(f"{p['name']} {p['version']}" for p in manifest["packages"])
    )
    train_glob = out / "train-*.txt"
    lines.append(f"  train with: --data '{train_glob}' --val '{out / 'val.txt'}'")
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m atom_train.demo_corpus",
        description="Build a French plain-text demo corpus from Debian documentation packages "
        "(apt-get download + dpkg-deb; no root needed when apt's package lists exist).",
        epilog="Without apt, pass your own text to the trainer: "
        "python -m atom_train.train --data 'my_texts/*.txt'.",
    )
    ap.add_argument("--out", default="data/demo", help="output folder (default: data/demo)")
    ap.add_argument(
        "--cache",
        default=None,
        help="folder for downloaded .deb files (default: the folder .debs beside --out)",
    )
    ap.add_argument(
        "--packages",
        default="default",
        help="comma-separated Debian packages to read, in priority order; 'default' stands "
        "for the default set, e.g. 'default,debian-handbook' (see --list-packages)",
    )
    ap.add_argument(
        "--max-mib",
        type=float,
        default=40.0,
        help="cap on training text in MiB; 0 = no cap (default: 40)",
    )
    ap.add_argument(
        "--shard-mib", type=float, default=8.0, help="size of a training shard in MiB (default: 8)"
    )
    ap.add_argument(
        "--val-kib",
        type=int,
        default=512,
        help="size of the held-out val.txt in KiB (default: 512)",
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT is complete")
    ap.add_argument("--list-packages", action="store_true", help="list the known packages and exit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.list_packages:
        for spec in PACKAGES.values():
            mark = "*" if spec.name in DEFAULT_PACKAGES else " "
            print(f"{mark} {spec.name:26s} {spec.note}")
        print("* = in the default set")
        return 0
    packages: list[str] = []
    for p in (p.strip() for p in args.packages.split(",")):
        for name in DEFAULT_PACKAGES if p == "default" else [p] if p else []:
            if name not in packages:
                packages.append(name)
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown or not packages:
        return user_error_exit(
            f"unknown package(s) {', '.join(unknown) or '(none given)'} in --packages; "
            f"known: {', '.join(PACKAGES)}"
        )
    if args.shard_mib <= 0 or args.val_kib <= 0 or args.max_mib < 0:
        return user_error_exit("--shard-mib and --val-kib must be > 0, --max-mib >= 0")
    out = Path(args.out)
    cache = Path(args.cache) if args.cache else out.parent / ".debs"
    try:
        manifest = build(
            out,
            cache,
            packages,
            max_bytes=int(args.max_mib * MIB) if args.max_mib else None,
            shard_bytes=int(args.shard_mib * MIB),
            val_bytes=args.val_kib * 1024,
            force=args.force,
        )
    except DemoCorpusError as e:
        return user_error_exit(e)
    except OSError as e:
        return user_error_exit(f"{e}; check that --out and --cache are writable")
    print(summary(out, manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
