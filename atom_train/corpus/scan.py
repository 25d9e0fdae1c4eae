"""The corpus builder's first pass: read, clean and spool every document, keep 24 bytes each.

A job is a group of input files (or, in the builder's own process, a document source). For
each document it cleans the pieces (`corpus.normalize.clean_piece`), strips blank lines at the
document's start and white space at its end (so the builder can put exactly one seam between
documents), applies the length and language filters, and appends the kept text to the job's
spool file. What stays in memory is one `RECORD` per kept document: a 16-byte BLAKE2b hash
of its text and its size. The builder sorts those records to de-duplicate, pick val and lay
out shards, and then copies each document's bytes out of the spool (the second pass).

A job's files, all under the build folder: `NNNNNN.txt` (the spooled text), `NNNNNN.rec`
(the records, in spool order) and `NNNNNN.json` (counts and the inputs it read), written
last: a job whose .json is there is complete and is not redone when a build resumes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from atom_train.common.atomic import atomic_write
from atom_train.corpus.inputs import InputError, InputFile, iter_pieces
from atom_train.corpus.language import LANGUAGES, function_word_counts, reads_as_counts
from atom_train.corpus.normalize import FLAG_NAMES, CleanOptions, clean_piece

# Per kept document: its content hash, read as two big-endian words so that sorting the
# words sorts the hashes bytewise on every machine, and its size in bytes.
RECORD = np.dtype([("h0", ">u8"), ("h1", ">u8"), ("size", "<i8")])
HASH_BYTES = 16
DROP_REASONS = ("empty", "too_short", "invalid_utf8", "language")
SPOOL_FLUSH_BYTES = 4 << 20
MAX_SKIP_MESSAGES = 20  # the first few skipped inputs are enough to see what went wrong
# Blank lines at the start of a document: dropped, the first line's indentation kept.
_LEADING_BLANK_LINES = re.compile(rb"(?:[ \t\r\f\v]*\n)+")


def content_hash(data: bytes) -> bytes:
    """The 16-byte hash that identifies a text (de-duplication, val choice, order)."""
    return hashlib.blake2b(data, digest_size=HASH_BYTES).digest()


@dataclass(frozen=True)
class ScanOptions:
    split_on: str = "file"
    text_field: str = "text"
    clean: CleanOptions = field(default_factory=CleanOptions)
    min_chars: int = 1
    language: str | None = None
    on_error: str = "stop"  # or "skip"


@dataclass
class ScanCounts:
    """What a job saw. `changed` counts kept documents that a cleaning step changed."""

    documents_read: int = 0
    documents_kept: int = 0
    bytes_read: int = 0  # input bytes after decompression (JSONL: whole lines)
    bytes_kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    changed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FLAG_NAMES.values(), 0))
    skipped_files: int = 0
    skipped_records: int = 0
    skip_messages: list[str] = field(default_factory=list)

    def add(self, other: ScanCounts) -> None:
        for name, value in asdict(other).items():
            mine = getattr(self, name)
            if isinstance(mine, dict):
                for k, v in value.items():
                    mine[k] = mine.get(k, 0) + v
            elif isinstance(mine, list):
                mine.extend(value[: MAX_SKIP_MESSAGES - len(mine)])
            else:
                setattr(self, name, mine + value)

    def skipped(self, message: str) -> None:
        if len(self.skip_messages) < MAX_SKIP_MESSAGES:
            self.skip_messages.append(message)


@dataclass(frozen=True)
class JobPaths:
    text: Path
    records: Path
    done: Path

    @classmethod
    def of(cls, folder: Path, job: int) -> JobPaths:
        stem = folder / f"{job:06d}"
        return cls(stem.with_suffix(".txt"), stem.with_suffix(".rec"), stem.with_suffix(".json"))


class Spool:
    """An append-only file with a buffer, that can be cut back to an earlier length (a
    document dropped after its first pieces were written)."""

    def __init__(self, path: Path) -> None:
        self._f = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._buf = bytearray()
        self._flushed = 0

    def tell(self) -> int:
        return self._flushed + len(self._buf)

    def write(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= SPOOL_FLUSH_BYTES:
            self._f.write(self._buf)
            self._flushed += len(self._buf)
            self._buf.clear()

    def truncate(self, size: int) -> None:
        if size >= self._flushed:
            del self._buf[size - self._flushed :]
            return
        self._buf.clear()
        self._f.flush()
        self._f.truncate(size)
        self._f.seek(size)
        self._flushed = size

    def close(self) -> None:
        self._f.write(self._buf)
        self._buf.clear()
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


class DocumentAssembler:
    """Turns the pieces of one document after another into spooled text and records."""

    def __init__(self, spool: Spool, options: ScanOptions, counts: ScanCounts) -> None:
        self.spool = spool
        self.options = options
        self.counts = counts
        self.records = bytearray()
        self._lang = options.language
        self.begin()

    def begin(self) -> None:
        self._start = self.spool.tell()
        self._hash = hashlib.blake2b(digest_size=HASH_BYTES)
        self._chars = 0
        self._flags = 0
        self._pending = b""  # white space that is only kept if more text follows
        self._started = False
        self._invalid = False
        self._words = [0] * len(LANGUAGES) if self._lang else None

    def add(self, piece: bytes | str) -> None:
        if self._invalid:
            return
        cleaned = clean_piece(piece, self.options.clean)
        if cleaned is None:
            self._invalid = True
            return
        text, data, flags = cleaned
        self._flags |= flags
        body = data.rstrip()
        if not body:
            # White space is kept only if text follows (it may be the first line's indent).
            self._pending += data
            return
        tail = len(data) - len(body)
        head = self._pending + body if self._pending else body
        lead = 0
        if not self._started:
            self._started = True
            m = _LEADING_BLANK_LINES.match(head)
            if m:
                lead = m.end()
                head = head[lead:]
        self._write(head)
        # Pending, trailing and leading white space is ASCII: one byte, one character.
        self._chars += len(self._pending) + len(text) - tail - lead
        self._pending = data[len(data) - tail :] if tail else b""
        if self._words is not None:
            for i, c in enumerate(function_word_counts(text)):
                self._words[i] += c

    def _write(self, data: bytes) -> None:
        self.spool.write(data)
        self._hash.update(data)

    def end(self) -> None:
        """Keep or drop the document assembled since `begin`, then begin the next one."""
        c = self.counts
        c.documents_read += 1
        reason = None
        if self._invalid:
            reason = "invalid_utf8"
        elif self._chars == 0:
            reason = "empty"
        elif self._chars < self.options.min_chars:
            reason = "too_short"
        elif self._words is not None and not reads_as_counts(self._words, self._lang or ""):
            reason = "language"
        if reason is None:
            size = self.spool.tell() - self._start
            self.records += self._hash.digest() + size.to_bytes(8, "little")
            c.documents_kept += 1
            c.bytes_kept += size
            if self._flags:
                for bit, name in FLAG_NAMES.items():
                    if self._flags & bit:
                        c.changed[name] += 1
        else:
            self.spool.truncate(self._start)
            c.dropped[reason] += 1
        self.begin()

    def rollback(self, size: int, n_records: int) -> None:
        """Forget everything after spool length `size` and the first `n_records` records."""
        self.spool.truncate(size)
        del self.records[n_records * RECORD.itemsize :]
        self.begin()


def _finish(job: int, paths: JobPaths, spool: Spool, asm: DocumentAssembler,
            counts: ScanCounts, inputs: list[dict], **extra) -> dict:  # fmt: skip
    spool.close()
    atomic_write(paths.records, bytes(asm.records))
    done = {"job": job, "inputs": inputs, "counts": asdict(counts), **extra}
    atomic_write(paths.done, (json.dumps(done, sort_keys=True) + "\n").encode())
    return done


def scan_files(job: tuple[int, list[InputFile], Path, ScanOptions]) -> dict:
    """Pass 1 over a group of input files (a pool task). Returns the job's .json content, or
    {"error": message} when a file fails and `on_error` is "stop"."""
    index, files, folder, options = job
    paths = JobPaths.of(folder, index)
    counts = ScanCounts()
    spool = Spool(paths.text)
    asm = DocumentAssembler(spool, options, counts)
    skip = options.on_error == "skip"

    def bad_record(message: str) -> None:
        if not skip:
            raise InputError(message)
        counts.skipped_records += 1
        counts.skipped(message)

    for f in files:
        # Where this file starts, to forget it whole if it fails and is skipped.
        mark, n_records = spool.tell(), len(asm.records) // RECORD.itemsize
        before = copy.deepcopy(counts)
        try:
            read = [0]
            pieces = iter_pieces(f, split_on=options.split_on, text_field=options.text_field,
                                 bad_record=bad_record, progress=read)  # fmt: skip
            for piece, ends in pieces:
                asm.add(piece)
                if ends:
                    asm.end()
            counts.bytes_read += read[0]
        except InputError as e:
            if not skip:
                spool.close()
                return {"error": str(e)}
            # The whole file is skipped: what it gave before the error goes too.
            asm.rollback(mark, n_records)
            vars(counts).update(vars(before))  # in place: the assembler holds `counts`
            counts.skipped_files += 1
            counts.skipped(str(e))
    return _finish(index, paths, spool, asm, counts, [f.describe() for f in files])


def scan_texts(
    texts: Iterable[str], index: int, folder: Path, options: ScanOptions, report: Callable[[], dict]
) -> dict:
    """Pass 1 over documents given as strings (a document source), in this process;
    `report()`, called after the last one, is kept with the job."""
    paths = JobPaths.of(folder, index)
    counts = ScanCounts()
    spool = Spool(paths.text)
    asm = DocumentAssembler(spool, options, counts)
    for text in texts:
        counts.bytes_read += len(text.encode("utf-8", "surrogatepass"))
        asm.add(text)
        asm.end()
    return _finish(index, paths, spool, asm, counts, [], report=report())


def load_records(folder: Path, job: int) -> np.ndarray:
    return np.fromfile(JobPaths.of(folder, job).records, dtype=RECORD)
