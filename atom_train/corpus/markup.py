"""Markup to plain text: web pages (trafilatura), and Debian's documentation: HTML and GNOME
Mallard pages, man pages (troff), LyX documents.

Each converter takes the decoded source and returns normalized text (`normalize_text`).

- `web_html_to_text`: the main text of a web page by trafilatura (the `html` extra; the
  extractor of datatrove), which tells an article from the navigation, cookie banners,
  related links, comments and footers around it. One block per line. The corpus builder's
  HTML reader.
- `html_to_text`, `troff_to_text`, `lyx_to_text`: paragraphs separated by a blank line,
  list items on their own lines; written for documentation as Debian
  ships it (DocBook, texinfo, asciidoc, LibreOffice help, man(7), LyX manuals), for the
  demo corpus; not full implementations of any of these formats, what each drops is said
  in its docstring. On Debian's HTML pages `html_to_text` keeps what trafilatura drops
  (DocBook headings, menu paths, admonitions: docs/corpus.md has the measurement).

    web_html_to_text(decode_bytes(data, html_charset(data)))
    html_to_text(decode_bytes(data, html_charset(data)))
    troff_to_text(decode_bytes(data, troff_charset(data)))
    lyx_to_text(decode_bytes(data))
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from html.parser import HTMLParser

from atom_train.corpus.extras import load
from atom_train.corpus.normalize import normalize_text


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


_HTML_CHARSET = re.compile(rb"""(?:charset|encoding)\s*=\s*["']?\s*([-\w.:]+)""", re.I)
_COOKIE = re.compile(rb"coding[:=]\s*([-\w.]+)")


# --------------------------------------------------------------------------------------------
# Web pages -> main text (trafilatura)
# --------------------------------------------------------------------------------------------


@functools.cache
def _trafilatura():
    trafilatura = load("html")
    # It logs a warning for every page without a main text; the builder counts those.
    logging.getLogger("trafilatura").setLevel(logging.ERROR)
    return trafilatura


def web_html_to_text(source: str) -> str:
    """The main text of a web page as trafilatura writes it: a block (heading, paragraph,
    list item "- ...", table row "| a | b |", code line) per line; navigation, banners,
    comments, related links and footers dropped; "" when the page has no main text. Needs
    the `html` extra."""
    text = _trafilatura().extract(source, include_comments=False) or ""
    # The rule under a table's head row ("|---|---|") is drawing, not text.
    return normalize_text(_TABLE_RULE.sub("", text))


_TABLE_RULE = re.compile(r"^\|(?:-+\|)+$", re.M)


# --------------------------------------------------------------------------------------------
# Debian's HTML -> text
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
    """The encoding an HTML or XML page declares in its first 4 KiB (meta charset, XML
    declaration), or None."""
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


def troff_charset(data: bytes) -> str | None:
    """The encoding a man page declares in an Emacs-style cookie on its first lines
    (`.\\" -*- coding: ISO-8859-1 -*-`), or None."""
    m = _COOKIE.search(data[:200])
    return m.group(1).decode("ascii", "replace") if m else None
