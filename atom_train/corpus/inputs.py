"""The corpus builder's inputs: which files, how to decompress them, where documents start.

- `find_inputs(patterns)`: files, folders (recursive, hidden names skipped) and globs, as
  `InputFile`s sorted by absolute path, each with its compression and format (by suffix:
  `.gz`, `.bz2`, `.xz`, `.zst`; then `.jsonl` / `.ndjson`, `.html` / `.htm` / `.xhtml`,
  anything else plain text).
- `open_input(f)`: a binary stream of the decompressed bytes (`.zst` needs the optional
  `zstandard` package).
- `iter_pieces(stream, f, ...)`: the documents of a file as pieces of bytes, each piece
  saying whether it ends its document. A document is the whole file (`split_on="file"`), a
  paragraph block between blank lines (`split_on="blank-lines"`), or a JSONL record (the
  string in its `text_field`). A long document comes in pieces of about `PIECE_BYTES`, cut
  before a newline (or between two ASCII characters in a line longer than that), where no
  cleaning step can see the cut: memory stays bounded whatever a file holds. HTML is the
  exception: a page is read whole and its main text taken by trafilatura
  (`corpus.markup.web_html_to_text`, the `html` extra).
- `sniff(head)`: what the first bytes of a file say it is, whatever its name: a binary
  format (an image, a PDF, an archive, an executable, anything with NUL bytes), XML that is
  not a web page (an EPUB's container.xml and content.opf), a lone MIME type (an EPUB's
  `mimetype`), an HTML page, or text. `iter_pieces` raises `NotText` for the first three,
  before it gives anything.

Every problem with one file is an `InputError` whose message names the file (and the line
of a JSONL record); the builder stops on it or skips and counts it. `NotText` is one: the
builder skips and counts it by reason (`--on-binary skip`, the default) or stops.
"""

from __future__ import annotations

import bz2
import contextlib
import glob
import gzip
import io
import json
import lzma
import os
import re
import unicodedata
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import BinaryIO

from atom_train.common.cli import UserError
from atom_train.corpus.extras import hint, load
from atom_train.corpus.markup import html_charset, web_html_to_text
from atom_train.corpus.normalize import decode_bytes

PIECE_BYTES = 1 << 20
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}
FORMATS = ("auto", "text", "jsonl", "html")
SPLIT_CHOICES = ("file", "blank-lines")
_FORMAT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".html": "html", ".htm": "html",
                    ".xhtml": "html"}  # fmt: skip
ON_BINARY_CHOICES = ("skip", "fail")
# A blank line: a line end followed by lines of only spaces and tabs (CRLF files included).
_BLANK_LINES = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")


class InputError(UserError):
    """One input file cannot be read as asked; the message names the file (and line)."""


class NotText(InputError):
    """An input file is not text (`reason`: what it is, a key of `NOT_TEXT`)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# What the first bytes of a file say it is: (magic, reason). Formats a folder of documents
# holds besides its text: images, PDFs, archives (zip: also EPUB, docx, odt), fonts, media,
# executables, databases.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF87a", "gif"),
    (b"GIF89a", "gif"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"), (b"BM", None),
    (b"%PDF-", "pdf"), (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"),
    (b"BZh", None), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07", "rar"), (b"\x7fELF", "elf"),
    (b"MZ", None), (b"wOFF", "font"), (b"wOF2", "font"), (b"OTTO", "font"),
    (b"\x00\x01\x00\x00\x00", "font"), (b"ID3", "audio"), (b"OggS", "audio"),
    (b"fLaC", "audio"), (b"SQLite format 3\x00", "sqlite"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "ms-office"),
)  # fmt: skip
# Two-letter magics that plain text can start with ("BM", "MZ", "BZh") count only with a
# NUL byte or invalid UTF-8 in the head, which `_binary_text` catches anyway.
NOT_TEXT = {
    "png": "a PNG image", "jpeg": "a JPEG image", "gif": "a GIF image", "tiff": "a TIFF image",
    "webp": "a WebP image", "pdf": "a PDF", "zip": "a zip archive (or EPUB, docx, odt)",
    "gzip": "gzip data without a .gz name", "xz": "xz data without a .xz name",
    "zstd": "zstd data without a .zst name", "7z": "a 7z archive", "rar": "a RAR archive",
    "elf": "an executable", "font": "a font", "audio": "audio", "video": "video",
    "sqlite": "an SQLite database", "ms-office": "an MS Office file",
    "nul_bytes": "binary (NUL bytes)", "not_utf8": "binary (mostly bytes that are not text)",
    "xml": "XML that is not a web page (metadata)", "mime_type": "a MIME type alone (metadata)",
}  # fmt: skip
SNIFF_BYTES = 8192
_MIME_TYPE = re.compile(rb"\s*(?:application|image|text|audio|video|font)/[\w.+-]+\s*")
_XML_DECL = re.compile(rb"\s*(?:\xef\xbb\xbf)?\s*<\?xml\b")
_HTML_ROOT = re.compile(rb"<(?:!doctype\s+html|html)\b", re.I)


def _binary_text(head: bytes) -> str | None:
    """The reason `head` is not text ("nul_bytes", "not_utf8"), or None when it is."""
    if b"\x00" in head:
        return "nul_bytes"
    if len(head) < 64:  # too little to tell bad text from data: --invalid-utf8 decides
        return None
    text = head.decode("utf-8", "replace")
    # The head may end inside a character: one U+FFFD there is the cut, not the file.
    bad = text.count("\ufffd") - text[-1:].count("\ufffd")
    # Legacy 8-bit text (latin-1, cp1252) is invalid UTF-8 in a few percent of its
    # characters; compressed or encrypted data in about half of them.
    return "not_utf8" if bad > len(text) // 4 else None


def _head(stream: BinaryIO) -> bytes:
    """The first SNIFF_BYTES (or fewer) of a stream, without consuming them."""
    peek = getattr(stream, "peek", None)
    if peek is not None:  # every stream open_input returns: a file or a decompressor
        return peek(SNIFF_BYTES)[:SNIFF_BYTES]
    start = stream.tell()
    head = stream.read(SNIFF_BYTES)
    stream.seek(start)
    return head


def sniff(head: bytes, size: int | None = None) -> str:
    """What the first bytes of a file (`size`: the whole file's, when known) say it is: a
    reason of `NOT_TEXT`, "html" or "text"."""
    if head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"AVI ", b"WAVE"):
        return {b"WEBP": "webp", b"AVI ": "video", b"WAVE": "audio"}[head[8:12]]
    if head[4:8] == b"ftyp":
        return "video"
    binary = _binary_text(head)
    for magic, reason in _MAGIC:
        if head.startswith(magic) and (reason is not None or binary):
            return reason or binary or "nul_bytes"
    if binary:
        return binary
    if size is not None and size <= 256 and _MIME_TYPE.fullmatch(head):
        return "mime_type"
    if _HTML_ROOT.search(head[:1024]):
        return "html"
    if _XML_DECL.match(head):
        return "xml"
    return "text"


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute (symlinks not resolved: their names carry the format)
    size: int
    mtime_ns: int
    compression: str | None
    format: str  # "text", "jsonl" or "html"

    def describe(self) -> dict:
        """What the manifest records, and what a rerun compares, of this input."""
        return {"path": self.path, "bytes": self.size, "mtime_ns": self.mtime_ns}


def detect(path: str, fmt: str = "auto") -> tuple[str | None, str]:
    """(compression, format) of a file name; `fmt` other than "auto" forces the format."""
    name = path.lower()
    compression = None
    for suffix, kind in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = kind, name[: -len(suffix)]
            break
    if fmt == "auto":
        fmt = _FORMAT_SUFFIXES.get(os.path.splitext(name)[1], "text")
    return compression, fmt


def _walk(folder: Path, name_glob: str) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(
            Path(root) / f
            for f in sorted(files)
            if not f.startswith(".") and fnmatchcase(f, name_glob)
        )
    return found


def find_inputs(
    patterns: Sequence[str], *, exclude: Path | None = None, name_glob: str = "*", fmt: str = "auto"
) -> list[InputFile]:
    """The files the patterns name, sorted by absolute path, each file once.

    A folder gives its files recursively (names starting with "." skipped, `name_glob`
    applied to the file names); a glob ("**" recursive) gives its matches; files under
    `exclude` (the output folder) are never inputs. A pattern that matches nothing is a
    `UserError`.
    """
    skip = exclude.resolve() if exclude is not None else None
    found: dict[str, Path] = {}
    for pattern in patterns:
        p = Path(pattern)
        if p.is_dir():
            files = _walk(p, name_glob)
        elif p.is_file():
            files = [p]
        else:
            files = []
            for m in sorted(glob.glob(pattern, recursive=True)):
                mp = Path(m)
                files.extend(_walk(mp, name_glob) if mp.is_dir() else [mp])
        if not files:
            raise UserError(
                f"no file matches {pattern!r} (cwd {os.getcwd()}): check the INPUT paths"
            )
        for f in files:
            r = f.resolve()
            if skip is not None and r.is_relative_to(skip):
                continue
            # One entry per file, under its smallest name (order-independent), and that
            # name, not the symlink's target, says the format: a dataset cache links
            # "train.jsonl.gz" to a blob named by its hash.
            name = str(f.absolute())
            found[str(r)] = min(found.get(str(r), name), name)
    inputs = []
    for path in sorted(found.values()):
        try:
            st = os.stat(path)
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror}): check the INPUT paths") from None
        compression, kind = detect(path, fmt)
        inputs.append(InputFile(path, st.st_size, st.st_mtime_ns, compression, kind))
    if not inputs:
        raise UserError(f"no input files (all of {list(patterns)} lie inside the output folder)")
    return inputs


def _zstandard():
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def require_codecs(inputs: Sequence[InputFile]) -> None:
    """Fail before any work when an input needs a package that is not installed (an HTML
    page found by its content, not its name, fails when it is read)."""
    zst = next((f for f in inputs if f.compression == "zstd"), None)
    if zst is not None:
        load("zstd", f"{zst.path} is zstd-compressed and")
    page = next((f for f in inputs if f.format == "html"), None)
    if page is not None:
        load("html", f"{page.path} is HTML and")


def decompression_errors() -> tuple[type[BaseException], ...]:
    """What a damaged compressed stream raises while it is read."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)
    zstandard = _zstandard()
    if zstandard is not None:
        errors += (zstandard.ZstdError,)
    return errors


def open_input(f: InputFile) -> BinaryIO:
    """The decompressed bytes of `f` as a buffered binary stream (an `InputError` if the file
    cannot be opened)."""
    try:
        raw = open(f.path, "rb")  # noqa: SIM115 (returned to the caller, who closes it)
    except OSError as e:
        raise InputError(f"{f.path}: cannot read ({e.strerror})") from None
    if f.compression is None:
        return raw
    if f.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if f.compression == "bz2":
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if f.compression == "xz":
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    zstandard = _zstandard()
    if zstandard is None:
        raw.close()
        raise InputError(
            f"{f.path} is zstd-compressed and the zstandard package is missing: {hint('zstd')}"
        )
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    return io.BufferedReader(reader, PIECE_BYTES)  # type: ignore[arg-type]


@contextlib.contextmanager
def reading(f: InputFile, where: Callable[[], str]) -> Iterator[BinaryIO]:
    """`open_input(f)`, turning a decompression or read error into an `InputError` that names
    the file and `where()` (e.g. the line reached)."""
    stream = open_input(f)
    try:
        yield stream
    except decompression_errors() as e:
        what = f"corrupt {f.compression} data" if f.compression else "read error"
        raise InputError(f"{f.path}: {where()}: {what} ({e})") from None
    finally:
        with contextlib.suppress(Exception):
            stream.close()


def safe_cut(buf: bytes) -> int:
    """Where a long piece may be cut (0 < cut < len(buf)), or 0 when nowhere: before the
    last newline (and before its CR); else before the last printable ASCII character; else
    before the last character that neither composes with the one before it nor is a
    combining mark, with no control character or invalid byte on either side.
    Newline, CRLF, UTF-8 decoding (invalid bytes included) and NFC/NFKC are all blind to a
    cut there: cleaning the two parts gives the cleaning of the whole."""
    i = buf.rfind(b"\n", 1)
    if i > 0:
        if buf[i - 1] == 0x0D:
            i -= 1
        if i > 0:
            return i
    # A printable ASCII character (or tab) is never a mark, never the second half of a
    # composition and never removed, so NFC does not reach across a cut before it.
    for j in range(len(buf) - 1, 0, -1):
        if 0x20 <= buf[j] < 0x7F or buf[j] == 0x09:
            return j
    tail = buf[-(1 << 16) :]
    text = tail.decode("utf-8", "surrogateescape")
    pos = len(buf) - len(tail) + len(text.encode("utf-8", "surrogateescape"))
    for k in range(len(text) - 1, 0, -1):
        a, b = text[k - 1], text[k]
        pos -= len(b.encode("utf-8", "surrogateescape"))
        if "\udc80" <= a <= "\udcff" or "\udc80" <= b <= "\udcff":
            continue  # next to an invalid byte: the replacement could depend on the cut
        if unicodedata.category(a) == "Cc" or unicodedata.category(b) == "Cc":
            continue  # a control character may be removed, joining its neighbours
        if unicodedata.combining(b) == 0 and all(
            unicodedata.normalize(form, a + b)
            == unicodedata.normalize(form, a) + unicodedata.normalize(form, b)
            for form in ("NFC", "NFKC")
        ):
            return pos if pos > 0 else 0
    return 0


def _text_pieces(
    stream: BinaryIO, split_on: str, progress: list[int]
) -> Iterator[tuple[bytes, bool]]:
    blank_lines = split_on == "blank-lines"
    carry = b""
    open_doc = False  # a head of the current document was handed over: its end must follow
    while True:
        chunk = stream.read(PIECE_BYTES)
        progress[0] += len(chunk)
        buf = carry + chunk if carry else chunk
        carry = buf
        if blank_lines:
            runs = [m.span() for m in _BLANK_LINES.finditer(buf)]
            if chunk and runs and not buf[runs[-1][1] :].strip(b" \t\r\f\v"):
                runs.pop()  # the last blank run may go on in the next chunk: decide then
            start = 0
            for a, b in runs:
                part = buf[start:a]
                # Blank runs at the start of a file give empty parts: not documents.
                if open_doc or part.strip():
                    yield part, True
                open_doc = False
                start = b
            carry = buf[start:]
        if not chunk:
            if open_doc or not blank_lines or carry.strip():
                yield carry, True  # in file mode an empty file is an (empty) document
            return
        if len(carry) > PIECE_BYTES:
            # A document longer than a piece: hand over its head, keep the tail (and in
            # blank-lines mode all trailing white space: a blank run may be starting there).
            head = carry.rstrip(b" \t\r\f\v\n") if blank_lines else carry
            cut = safe_cut(head)
            if cut:
                yield carry[:cut], False
                carry = carry[cut:]
                open_doc = True


_JSON = json.JSONDecoder()


def _jsonl_pieces(
    stream: BinaryIO,
    f: InputFile,
    field: str,
    bad_record: Callable[[str], None],
    line_no: list[int],
    progress: list[int],
) -> Iterator[tuple[str, bool]]:
    decode = _JSON.decode
    for n, line in enumerate(stream, 1):
        line_no[0] = n
        progress[0] += len(line)
        if line.isspace():
            continue
        try:
            try:
                obj = decode(line.decode("utf-8"))
            except UnicodeDecodeError:
                # Bad bytes become lone surrogates that clean_piece treats as invalid UTF-8.
                obj = decode(line.decode("utf-8", "surrogateescape"))
        except ValueError as e:
            # (a JSONDecodeError's msg leaves out where: "Invalid control character at")
            msg = getattr(e, "msg", str(e)).removesuffix(" at")
            col = getattr(e, "colno", None)
            bad_record(f"{f.path}: line {n}: not JSON ({msg}{f' at column {col}' if col else ''})")
            continue
        text = obj.get(field) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            if not isinstance(obj, dict):
                why = f"a JSON {type(obj).__name__}, not an object"
            elif field not in obj:
                keys = ", ".join(list(obj)[:8]) or "none"
                why = f"no field {field!r} (fields: {keys}); set --text-field"
            else:
                why = f"field {field!r} is {type(text).__name__}, not a string"
            bad_record(f"{f.path}: line {n}: {why}")
            continue
        yield text, True


def iter_pieces(
    f: InputFile,
    *,
    split_on: str = "file",
    text_field: str = "text",
    bad_record: Callable[[str], None],
    progress: list[int] | None = None,
    forced: str | None = None,
) -> Iterator[tuple[bytes | str, bool]]:
    """(piece, ends_document) of every document of `f`, in file order (see the module); a
    JSONL record's piece is the decoded str (the cleaning need not decode it again).

    `bad_record(message)` is called for a JSONL line that is not JSON or lacks the field
    (it raises to stop, or returns to skip the record). Read and decompression errors are
    `InputError`s naming the file and the line (JSONL) or the byte offset reached.
    `progress[0]` grows by the decompressed bytes read. A file that is not text (`sniff`) is
    a `NotText` before any piece; with `forced` (the format the user chose for every input)
    XML and lone MIME types are read as that format, and a page is HTML only by its name.
    """
    line_no = [0]
    progress = progress if progress is not None else [0]

    def where() -> str:
        if f.format == "jsonl":
            return f"line {line_no[0] + 1}"
        return f"after {progress[0]:,} bytes"

    with reading(f, where) as stream:
        fmt = f.format
        head = _head(stream)
        kind = sniff(head, f.size if f.compression is None else None)
        if kind in NOT_TEXT and (forced is None or kind not in ("xml", "mime_type")):
            raise NotText(f"{f.path}: {NOT_TEXT[kind]}, not text", kind)
        if kind == "html" and forced is None and fmt == "text":
            fmt = "html"  # a page with another name: .txt, .php, no suffix
        if fmt == "jsonl":
            yield from _jsonl_pieces(stream, f, text_field, bad_record, line_no, progress)
        elif fmt == "html":
            data = stream.read()
            progress[0] += len(data)
            try:
                text = web_html_to_text(decode_bytes(data, html_charset(data)))
            except UserError as e:  # the extra is missing: a page found by its content
                raise InputError(f"{f.path}: {e}") from None
            if split_on == "blank-lines":
                for part in text.split("\n"):  # one block per line
                    yield part.encode("utf-8"), True
            else:
                yield text.encode("utf-8"), True
        else:
            yield from _text_pieces(stream, split_on, progress)
