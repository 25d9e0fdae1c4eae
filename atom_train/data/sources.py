"""Opening the text a command reads, and checking a saved loader state against it.

`open_corpus`: ``--data`` globs to a `ByteCorpus`, every problem a `UserError` naming the
flag used; `check_loader_state`: a checkpoint's saved loader state against the corpus it
resumes on.

The trainer's plan, eval and bench open their corpora here. (A built corpus's folder is
recognised by its manifest's file name; the manifest itself is read by the corpus layer, a
sibling of this one: `atom_train.corpus.manifest`, whose `MANIFEST_NAME` a test holds equal
to `BUILT_MANIFEST`.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from atom_train.common.cli import UserError, quote
from atom_train.data.loader import AtomDataError, ByteCorpus, check_state_dict

# The file that marks a folder as a corpus built by `python -m atom_train.corpus build`.
BUILT_MANIFEST = "manifest.json"


def open_corpus(globs: list[str] | str, flag: str, resident: bool) -> ByteCorpus:
    """The corpus of `globs` (`flag`'s value: files, globs), memory-mapped (or read into
    memory: `resident`). A built corpus's folder is refused with the ``--corpus`` fix; the
    loader's refusals name `flag`."""
    for g in [globs] if isinstance(globs, str) else globs:
        if (Path(g) / BUILT_MANIFEST).is_file():
            # (the loader would say "a directory: pass its files", which would take its val)
            raise UserError(
                f"{flag} {g} is a corpus built by `python -m atom_train.corpus build`: use "
                f"--corpus {quote(g)} (its train shards, and its val for validation)"
            )
    try:
        return ByteCorpus(globs, resident=resident)
    except AtomDataError as e:
        # The loader's messages name --data, the usual caller; name the flag actually used.
        raise UserError(str(e).replace("check --data", f"check {flag}")) from None


def check_loader_state(
    state: dict[str, Any],
    corpus: ByteCorpus,
    B: int,
    pack_mode: str,
    checkpoint: str | os.PathLike,
) -> None:
    """The loader state saved in `checkpoint` fits this corpus: its metadata (signature, B,
    pack mode, feature version), as the loader checks it (no stream is made; the positions
    are checked when the stream loads them). A misfit is a `UserError` with the fix (a new
    run from the checkpoint's weights)."""
    try:
        check_state_dict(state, corpus, B, pack_mode=pack_mode)
    except AtomDataError as e:
        raise UserError(
            f"cannot resume {checkpoint}: {e}. To train these weights on this data, start a "
            f"new run with --init {quote(checkpoint)} --output-dir NEW"
        ) from None
