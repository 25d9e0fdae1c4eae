"""Is this what the user meant to train on? Cheap checks of the text files a run reads.

The trainer reads any files as bytes, so a mistake trains without a word: gzipped shards
(the model learns compressed bytes), a binary file in the glob, the val file also among
the training shards (the val score measures memory). `check_training_text` and
`check_val_apart` catch those before a run starts; each problem is a `UserError` naming
the file and the fix. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from atom_train.common.cli import UserError

# Leading bytes of the compressed and archive formats a corpus folder is likely to hold.
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"(\xb5/\xfd": "zstd",
    b"BZh": "bzip2",
    b"PK\x03\x04": "zip",
    b"7z\xbc\xaf\x27\x1c": "7z",
}
SAMPLE_BYTES = 1 << 16
# Shards whose content is sampled (spread over the set): a multi-GB corpus of thousands of
# shards is checked in well under a second. The magic bytes of every shard are read.
MAX_SAMPLED = 32
MAX_NUL_SHARE = 0.01  # plain text has no NUL bytes
MAX_INVALID_UTF8_SHARE = 0.10  # a text in a legacy 8-bit encoding stays well below


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _invalid_utf8_bytes(data: bytes) -> int:
    """How many bytes of `data` are not part of valid UTF-8 (the sample's cut last
    character counts, at most 3 bytes: nothing next to the threshold)."""
    return len(data) - len(data.decode("utf-8", errors="ignore").encode("utf-8"))


def problem_of(path: str, sample: bytes) -> str | None:
    """Why the file with this head is not plain text, or None."""
    for magic, kind in MAGIC.items():
        if sample.startswith(magic):
            return f"{path} is {kind}-compressed"
    if not sample:
        return None
    if sample.count(0) > MAX_NUL_SHARE * len(sample):
        return f"{path} looks binary ({100 * sample.count(0) / len(sample):.0f}% NUL bytes)"
    bad = _invalid_utf8_bytes(sample)
    if bad > MAX_INVALID_UTF8_SHARE * len(sample):
        return (
            f"{path} is not UTF-8 text ({100 * bad / len(sample):.0f}% of its first "
            f"{len(sample):,} bytes are not UTF-8: binary, or another encoding)"
        )
    return None


def check_training_text(paths: Sequence[str], flag: str) -> None:
    """Refuse compressed or binary files among `paths` (the files of `flag`)."""
    step = max(len(paths) // MAX_SAMPLED, 1)
    sampled = set(range(0, len(paths), step))
    for i, path in enumerate(paths):
        head = _head(path, SAMPLE_BYTES if i in sampled else 8)
        problem = problem_of(path, head)
        if problem:
            raise UserError(
                f"{flag}: {problem}: the trainer reads files as raw bytes. Turn them into "
                "text shards with `python -m atom_train.corpus build`, or pass "
                "--allow-binary if these bytes are really what to train on"
            )


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_val_apart(train: Sequence[str], val: Sequence[str]) -> None:
    """Refuse a val file that is also a training file: the same file, or the same content
    (compared only between files of equal size, so this costs nothing in the usual case)."""
    train_real = {os.path.realpath(p): p for p in train}
    by_size: dict[int, list[str]] = {}
    for p in train:
        by_size.setdefault(os.path.getsize(p), []).append(p)
    for v in val:
        same = train_real.get(os.path.realpath(v))
        if same is None:
            twins = by_size.get(os.path.getsize(v), [])
            if twins:
                d = _digest(v)
                same = next((t for t in twins if _digest(t) == d), None)
        if same is not None:
            raise UserError(
                f"--val {v} is also a training file ({same} in --data): the val score would "
                "measure memory, not generalisation; hold it out of --data (`python -m "
                "atom_train.corpus build` splits a held-out val by document)"
            )
