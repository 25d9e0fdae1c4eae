"""Atomic, durable replacement of a file: the one mechanism every crash-safety guarantee
rests on (checkpoints, status files, exports, the corpus builder, plots).

`atomic_write()` writes a hidden temp file in the same folder, fsyncs it, optionally
verifies it, renames it over the target and fsyncs the folder. A crash at any moment
leaves the old file or the new one, never a torn one; on failure the temp file is removed.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path


def atomic_write(
    path: str | os.PathLike,
    data: bytes,
    *,
    verify: Callable[[Path], object] | None = None,
    keep_previous_as: str | os.PathLike | None = None,
    exclusive: bool = False,
    chunk_bytes: int = 1 << 20,
    chunk_delay_s: float = 0.0,
) -> Path:
    """Replace `path` by `data` atomically and durably; return `path`.

    verify(tmp): called on the written, fsynced temp file before it replaces anything (it
    raises to refuse it). keep_previous_as: an existing `path` is renamed to this name first
    (a rolling checkpoint keeps its predecessor). exclusive: never replace an existing `path`
    (FileExistsError; link() makes that race-free). chunk_bytes / chunk_delay_s: the size of
    each write() and a pause after each (tests use the pause to land a kill mid-write).

    Raises OSError (or what `verify` raises) after removing the temp file; the previous file
    is untouched."""
    path = Path(path)
    folder = path.parent
    tmp = folder / f".{path.name}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view[:chunk_bytes])
                view = view[n:]
                if chunk_delay_s:
                    time.sleep(chunk_delay_s)
            os.fsync(fd)
        finally:
            os.close(fd)
        if verify is not None:
            verify(tmp)  # what is on disk, not what we meant to write
        if exclusive:
            os.link(tmp, path)  # fails if the name exists: nothing is ever clobbered
            os.unlink(tmp)
        else:
            if keep_previous_as is not None and path.exists():
                os.replace(path, keep_previous_as)
            os.replace(tmp, path)
        fsync_dir(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj: object) -> Path:
    """`atomic_write` of `obj` as indented, key-sorted JSON with a final newline."""
    return atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temp_files(folder: str | os.PathLike, suffix: str = "") -> list[Path]:
    """Delete the temp files of atomic writes that a killed process left in `folder` (those of
    files ending in `suffix`); call it only while holding the folder's lock."""
    removed = []
    for p in Path(folder).glob(f".*{suffix}.tmp-*"):
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed
