"""Near-duplicate documents: MinHash signatures (rensa) and LSH banding over them.

The same page with another footer or date, a licence header on every file: documents whose
word 5-gram sets overlap by at least a threshold (Jaccard similarity, estimated from
`NUM_PERM` MinHash values). Signatures are computed by rensa (the `neardup` extra, a Rust
MinHash: 8x faster than datasketch on the demo corpus) while pass 1 reads each document,
piece by piece, and spooled to disk (512 bytes a document). The LSH index is built here,
band by band, from those files with numpy: the libraries' in-memory indexes hold every
signature and its band keys (rensa's: 1,385 bytes a document, measured), 17 times the
builder's whole budget of 80 bytes a document; banding from disk needs about 100 at its
peak (measured, docs/corpus.md).

Of each group of near duplicates (linked pair by pair) the document with the smallest
content hash stays (the output is independent of the input order); the others are dropped
and counted.

    signer = Signer(); signer.add(piece_text); ...; signer.digest(content_hash)  # pass 1
    near_duplicates(jobs, rows, sig_paths, threshold)                         # layout
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from atom_train.corpus.extras import load

NUM_PERM = 128
SHINGLE_WORDS = 5
SEED = 0x61746F6D  # fixed: signatures, and so the output, are the same on every machine
SIG_BYTES = NUM_PERM * 4
_WORD = re.compile(r"\w+")
_WORD_END = re.compile(r"\w+$")
_CHUNK = 1 << 13  # signature rows read at a time (4 MiB)
_PAIRS = 1 << 12  # candidate pairs checked at a time (4 MiB of signatures)


def _rensa():
    return load("neardup")


def bands(threshold: float, num_perm: int = NUM_PERM) -> tuple[int, int]:
    """(bands, rows): the LSH banding with the most rows per band (the fewest chance
    candidates) under which a pair at `threshold` is a candidate with probability >= 0.97."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        b = num_perm // rows
        if 1 - (1 - threshold**rows) ** b >= 0.97:
            best = (b, rows)
    return best


class Signer:
    """The MinHash signature of one document, fed in pieces (pieces may cut a word: its
    head waits for the next piece)."""

    def __init__(self) -> None:
        self._m = _rensa().RMinHash(num_perm=NUM_PERM, seed=SEED)
        self._words: list[str] = []  # the last SHINGLE_WORDS - 1 words: shingles span pieces
        self._head = ""  # a word the piece ended in
        self._shingles = 0

    def add(self, text: str) -> None:
        text = (self._head + text).lower()
        m = _WORD_END.search(text)
        self._head = m.group() if m else ""
        words = self._words + _WORD.findall(text[: m.start()] if m else text)
        n = SHINGLE_WORDS
        if len(words) >= n:
            self._m.update([" ".join(words[i : i + n]) for i in range(len(words) - n + 1)])
            self._shingles += len(words) - n + 1
        self._words = words[-(n - 1) :]

    def digest(self, content_hash: bytes) -> bytes:
        """The signature (NUM_PERM little-endian uint32). A document of fewer than
        SHINGLE_WORDS words is its words; one without words is its content hash, so it is
        near nothing but itself."""
        if self._head:
            self._words.append(self._head)
        if not self._shingles:
            self._m.update([" ".join(self._words) if self._words else content_hash.hex()])
        return np.asarray(self._m.digest(), dtype="<u4").tobytes()


def _band_keys(sig: np.ndarray) -> np.ndarray:
    """One 64-bit key per row of a band of signature values (collisions only add
    candidates, which are checked)."""
    key = np.zeros(len(sig), np.uint64)
    for c in range(sig.shape[1]):  # a column at a time: 8 bytes a document of temporaries
        key *= np.uint64(0x100000001B3)
        key += sig[:, c]
        key += np.uint64(1)
    return key


class _Signatures:
    """Signature rows of documents, read from the per-job files in pieces: not mapped, so
    that the files' pages never count as the builder's memory."""

    def __init__(self, jobs: np.ndarray, rows: np.ndarray, paths: Sequence[Path]) -> None:
        self.jobs, self.rows, self.paths = jobs, rows, paths
        self.by_job = np.argsort(jobs, kind="stable")
        self.starts = np.searchsorted(jobs[self.by_job], np.arange(len(paths) + 1))

    def columns(self, lo: int, hi: int) -> np.ndarray:
        """Columns [lo, hi) of every document's signature, in position order."""
        out = np.empty((len(self.jobs), hi - lo), np.uint32)
        for k, path in enumerate(self.paths):
            pos = self.by_job[self.starts[k] : self.starts[k + 1]]
            if not len(pos):
                continue
            with open(path, "rb") as f:
                for first in range(0, int(self.rows[pos].max()) + 1, _CHUNK):
                    block = np.fromfile(f, dtype="<u4", count=_CHUNK * NUM_PERM)
                    block = block.reshape(-1, NUM_PERM)
                    here = pos[(self.rows[pos] >= first) & (self.rows[pos] < first + len(block))]
                    out[here] = block[self.rows[here] - first, lo:hi]
        return out

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The whole signatures of `positions`, a row (512 bytes) at a time. (Mapped, the
        files' pages would count as the builder's memory: the kernel maps the pages
        around each one read, so random rows bring in most of a file.)"""
        out = np.empty((len(positions), NUM_PERM), np.uint32)
        jobs, rows = self.jobs[positions].tolist(), self.rows[positions].tolist()
        fds: dict[int, int] = {}
        try:
            for i, (k, row) in enumerate(zip(jobs, rows, strict=True)):
                fd = fds.get(k)
                if fd is None:
                    fd = fds[k] = os.open(self.paths[k], os.O_RDONLY)
                out[i] = np.frombuffer(os.pread(fd, SIG_BYTES, row * SIG_BYTES), "<u4")
        finally:
            for fd in fds.values():
                os.close(fd)
        return out


def _flatten(parent: np.ndarray) -> np.ndarray:
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            return up
        parent = up


def _root(parent: np.ndarray, i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def near_duplicates(
    jobs: np.ndarray, rows: np.ndarray, sig_paths: Sequence[Path], threshold: float
) -> tuple[np.ndarray, list[tuple[int, int, float]]]:
    """(drop mask, examples) over documents given in hash order by their scan job and row in
    that job's signature file. Each group of documents linked, directly or through others,
    by an estimated similarity >= `threshold` keeps its first (smallest hash); `examples`
    are (dropped, a document it is near, their similarity) of the first few dropped, as
    positions."""
    n = len(jobs)
    parent = np.arange(n, dtype=np.int64)
    if n < 2:
        return np.zeros(n, bool), []
    sigs = _Signatures(jobs, rows, sig_paths)
    b, r = bands(threshold)
    for band in range(b):
        parent[:] = _flatten(parent)  # so that pairs already grouped are skipped unread
        keys = _band_keys(sigs.columns(band * r, (band + 1) * r))
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        same = np.flatnonzero(keys[1:] == keys[:-1])
        del keys
        # Candidates: neighbours in the band's sort order with equal keys.
        for start in range(0, len(same), _PAIRS):
            i = same[start : start + _PAIRS]
            a, c = order[i], order[i + 1]
            new = parent[a] != parent[c]
            a, c = a[new], c[new]
            sim = (sigs.take(a) == sigs.take(c)).mean(axis=1)
            for x, y in zip(a[sim >= threshold].tolist(), c[sim >= threshold].tolist(),
                            strict=True):  # fmt: skip
                rx, ry = _root(parent, x), _root(parent, y)
                if rx != ry:  # the smaller position (hash) is the root: it stays
                    parent[max(rx, ry)] = min(rx, ry)
    parent = _flatten(parent)  # every document points at its group's first
    drop = parent != np.arange(n)
    examples = []
    for d in np.flatnonzero(drop)[:5].tolist():
        # A group is linked pair by pair: show a document d is itself near (not
        # necessarily the one its group keeps).
        mine = sigs.take(np.array([d]))[0]
        members = np.flatnonzero(parent == parent[d])
        members = members[members != d]
        for start in range(0, len(members), _PAIRS):
            chunk = members[start : start + _PAIRS]
            sim = (sigs.take(chunk) == mine).mean(axis=1)
            hit = np.flatnonzero(sim >= threshold)
            if len(hit):
                examples.append((d, int(chunk[hit[0]]), float(sim[hit[0]])))
                break
    return drop, examples
