"""The corpus builder's first pass: read, clean and spool every document, keep 24 bytes each.

A job is a group of input files (or, in the builder's own process, a document source). For
each document it cleans the pieces (`corpus.normalize.clean_piece`), strips blank lines at the
document's start and white space at its end (so the builder can put exactly one seam between
documents), applies the length and language filters, and appends the kept text to the job's
spool file (and, for --near-dup, its MinHash signature to the job's signature file). What
stays in memory is one `RECORD` per kept document: a 16-byte BLAKE2b hash of its text and
its size. The builder sorts those records to de-duplicate, pick val and lay out shards, and
then copies each document's bytes out of the spool (the second pass).

A job's files, all under the build folder: `NNNNNN.txt` (the spooled text), `NNNNNN.rec`
(the records, in spool order), `NNNNNN.sig` (signatures, in the same order; --near-dup
only) and `NNNNNN.json` (counts and the inputs it read), written last: a job whose .json is
there is complete and is not redone when a build resumes.
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
from atom_train.corpus.inputs import InputError, InputFile, NotText, iter_pieces
from atom_train.corpus.language import SAMPLE_CHARS, confidence_bucket, identify
from atom_train.corpus.neardup import SIG_BYTES, Signer
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
    language: tuple[str, ...] | None = None  # keep documents identified as one of these
    language_threshold: float = 0.5  # ... with at least this confidence
    on_error: str = "stop"  # or "skip"
    on_binary: str = "skip"  # or "fail"
    signatures: bool = False  # MinHash signatures for --near-dup


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
    skipped_binary: dict[str, int] = field(default_factory=dict)  # files that are not text
    skip_messages: list[str] = field(default_factory=list)
    # --language: what the identifier said of each document judged, and how sure it was.
    language_detected: dict[str, int] = field(default_factory=dict)
    language_confidence: dict[str, int] = field(default_factory=dict)

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
    signatures: Path
    done: Path

    @classmethod
    def of(cls, folder: Path, job: int) -> JobPaths:
        stem = folder / f"{job:06d}"
        return cls(*(stem.with_suffix(s) for s in (".txt", ".rec", ".sig", ".json")))


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

    def __init__(
        self, spool: Spool, options: ScanOptions, counts: ScanCounts, sigs: Spool | None = None
    ) -> None:
        self.spool = spool
        self.options = options
        self.counts = counts
        self.records = bytearray()
        self.sigs = sigs  # the signature file, when options.signatures
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
        self._sample: list[str] | None = [] if self._lang else None  # the text identified
        self._sampled = 0
        self._signer = Signer() if self.sigs is not None else None

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
        head = self._pending + body
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
        self._pending = data[len(data) - tail :]  # (b"" when there is no tail)
        if self._sample is not None and self._sampled < SAMPLE_CHARS:
            self._sample.append(text[: SAMPLE_CHARS - self._sampled])
            self._sampled += len(self._sample[-1])
        if self._signer is not None:
            self._signer.add(text)

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
        elif self._sample is not None and not self._language_ok("".join(self._sample)):
            reason = "language"
        if reason is None:
            size = self.spool.tell() - self._start
            digest = self._hash.digest()
            self.records += digest + size.to_bytes(8, "little")
            if self._signer is not None:  # (one exactly when there is a signature file)
                self.sigs.write(self._signer.digest(digest))
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

    def _language_ok(self, sample: str) -> bool:
        lang, conf = identify(sample)
        c = self.counts
        c.language_detected[lang] = c.language_detected.get(lang, 0) + 1
        bucket = confidence_bucket(conf)
        c.language_confidence[bucket] = c.language_confidence.get(bucket, 0) + 1
        return lang in (self._lang or ()) and conf >= self.options.language_threshold

    def rollback(self, size: int, n_records: int) -> None:
        """Forget everything after spool length `size` and the first `n_records` records."""
        self.spool.truncate(size)
        del self.records[n_records * RECORD.itemsize :]
        if self.sigs is not None:
            self.sigs.truncate(n_records * SIG_BYTES)
        self.begin()


def _finish(job: int, paths: JobPaths, spool: Spool, asm: DocumentAssembler,
            counts: ScanCounts, inputs: list[dict], **extra) -> dict:  # fmt: skip
    spool.close()
    if asm.sigs is not None:
        asm.sigs.close()
    atomic_write(paths.records, bytes(asm.records))
    done = {"job": job, "inputs": inputs, "counts": asdict(counts), **extra}
    atomic_write(paths.done, (json.dumps(done, sort_keys=True) + "\n").encode())
    return done


def scan_files(job: tuple[int, list[InputFile], Path, ScanOptions]) -> dict:
    """Pass 1 over a group of input files (a pool task). Returns the job's .json content, or
    {"error": message} when a file fails and `on_error` is "stop"."""
    index, files, folder, options, forced = job
    paths = JobPaths.of(folder, index)
    counts = ScanCounts()
    spool = Spool(paths.text)
    asm = DocumentAssembler(spool, options, counts, _signatures(paths, options))
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
                                 bad_record=bad_record, progress=read, forced=forced)  # fmt: skip
            for piece, ends in pieces:
                asm.add(piece)
                if ends:
                    asm.end()
            counts.bytes_read += read[0]
        except NotText as e:  # found before the file gave anything
            if options.on_binary == "fail":
                spool.close()
                return {"error": f"{e}: remove it from the inputs, or build with "
                        "--on-binary skip (the default) to skip and count such files"}  # fmt: skip
            counts.skipped_binary[e.reason] = counts.skipped_binary.get(e.reason, 0) + 1
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
    asm = DocumentAssembler(spool, options, counts, _signatures(paths, options))
    for text in texts:
        counts.bytes_read += len(text.encode("utf-8", "surrogatepass"))
        asm.add(text)
        asm.end()
    return _finish(index, paths, spool, asm, counts, [], report=report())


def _signatures(paths: JobPaths, options: ScanOptions) -> Spool | None:
    return Spool(paths.signatures) if options.signatures else None


def load_records(folder: Path, job: int) -> np.ndarray:
    return np.fromfile(JobPaths.of(folder, job).records, dtype=RECORD)
