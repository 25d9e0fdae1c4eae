"""Is this what the user meant to train on? Cheap checks of the text files a run reads.

The trainer reads any files as bytes, so a mistake trains without a word: gzipped shards
(the model learns compressed bytes), a binary file in the glob, HTML (the model learns the
tags), the val file also among the training shards (the val score measures memory).
`check_training_text` and `check_val_apart` catch those before a run starts; each problem
is a `UserError` naming the file and the fix. (A built corpus's held-out val among --data
files is caught from its manifest, above this layer: `atom_train.trainer.text_sources`.)
Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

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
# Markup: tags make up more than this share of the sample (prose with a stray <br> stays far
# below), or the file opens as an HTML or XML document and has some tags.
MAX_TAG_SHARE = 0.20
MIN_TAG_SHARE_OF_DOCUMENT = 0.01
_TAG = re.compile(rb"<[A-Za-z/!?][^<>\n]{0,300}>")
_DOCUMENT_START = re.compile(rb"\A(\xef\xbb\xbf)?\s*(<\?xml|<!doctype\s+html|<html)", re.IGNORECASE)


class Problem(NamedTuple):
    kind: str  # compressed, binary, encoding or markup
    text: str  # what is wrong, naming the file


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _invalid_utf8_bytes(data: bytes) -> int:
    """How many bytes of `data` are not part of valid UTF-8 (the sample's cut last
    character counts, at most 3 bytes: nothing next to the threshold)."""
    return len(data) - len(data.decode("utf-8", errors="ignore").encode("utf-8"))


def tag_share(sample: bytes) -> float:
    """The share of `sample`'s bytes inside markup tags (``<p>``, ``</div>``, ``<!-- ...>``)."""
    return sum(len(m.group()) for m in _TAG.finditer(sample)) / max(len(sample), 1)


def problem_of(path: str, sample: bytes) -> Problem | None:
    """Why the file with this head is not plain text, or None."""
    for magic, kind in MAGIC.items():
        if sample.startswith(magic):
            return Problem("compressed", f"{path} is {kind}-compressed")
    if not sample:
        return None
    if sample.count(0) > MAX_NUL_SHARE * len(sample):
        share = 100 * sample.count(0) / len(sample)
        return Problem("binary", f"{path} looks binary ({share:.0f}% NUL bytes)")
    bad = _invalid_utf8_bytes(sample)
    if bad > MAX_INVALID_UTF8_SHARE * len(sample):
        return Problem(
            "encoding",
            f"{path} is not UTF-8 text ({100 * bad / len(sample):.0f}% of its first "
            f"{len(sample):,} bytes are not UTF-8: binary, or another encoding)",
        )
    tags = tag_share(sample)
    document = _DOCUMENT_START.match(sample) is not None
    if tags > MAX_TAG_SHARE or (document and tags > MIN_TAG_SHARE_OF_DOCUMENT):
        return Problem(
            "markup",
            f"{path} is HTML/XML markup (tags are {100 * tags:.0f}% of its first "
            f"{len(sample):,} bytes)",
        )
    return None


_FIX = {
    "markup": "the trainer reads files as raw bytes and would learn the tags. Turn them into "
    "text shards with `python -m atom_train.corpus build` (it strips HTML to its text), or "
    "pass --allow-binary if the markup is really what to train on",
}
_DEFAULT_FIX = (
    "the trainer reads files as raw bytes. Turn them into text shards with `python -m "
    "atom_train.corpus build`, or pass --allow-binary if these bytes are really what to "
    "train on"
)


def check_training_text(paths: Sequence[str], flag: str) -> None:
    """Refuse compressed, binary or markup files among `paths` (the files of `flag`): one
    line naming the first and how many more (with their names, up to `_NAMED_MORE`), so a
    glob with several is fixed in one go, not one file per run."""
    step = max(len(paths) // MAX_SAMPLED, 1)
    sampled = set(range(0, len(paths), step))
    problems = []
    for i, path in enumerate(paths):
        head = _head(path, SAMPLE_BYTES if i in sampled else 8)
        problem = problem_of(path, head)
        if problem:
            problems.append((path, problem))
    if not problems:
        return
    first = problems[0][1]
    more = ""
    if len(problems) > 1:
        names = [os.path.basename(p) for p, _ in problems[1 : 1 + _NAMED_MORE]]
        rest = len(problems) - 1 - len(names)
        more = f" (and {len(problems) - 1} more: {', '.join(names)}{', ...' if rest else ''})"
    kinds = {pr.kind for _, pr in problems}
    fix = _FIX.get(first.kind, _DEFAULT_FIX) if len(kinds) == 1 else _DEFAULT_FIX
    raise UserError(f"{flag}: {first.text}{more}: {fix}")


_NAMED_MORE = 5  # the other bad files named in the message (then "...")


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
