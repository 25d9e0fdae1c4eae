"""The text a command reads, as the user names it: ``--data`` files and built corpus folders
(``--corpus DIR``), checked where they enter every command (train, tune, eval, bench,
verify).

- `open_built_corpus`: ``--corpus DIR`` is a corpus built by ``python -m atom_train.corpus
  build`` (its manifest names the train shards and the held-out val); a folder of raw text
  is told how to build one *next to it* (a build into its own input folder is refused).
- `check_held_out`: a built corpus's val file among the ``--data`` files (``--data
  'data/fr/*.txt'`` over a built folder matches its val.txt too) is refused with the
  ``--corpus`` fix: the manifest marks it held out, and training on it makes every val
  score measure memory. `eval` may score the val alone, but not mixed with the train shards.

Standard library only (the manifest is JSON).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from atom_train.common.cli import UserError, quote
from atom_train.corpus.manifest import MANIFEST_NAME, CorpusDir, open_corpus_dir, read_manifest


def open_built_corpus(path: str | os.PathLike, flag: str = "--corpus") -> CorpusDir:
    """The built corpus in `path` (`corpus.manifest.open_corpus_dir`), or a `UserError`
    that names the fix; for a folder of raw text (no manifest, no shards of a build): build
    a corpus from it into a new folder, or read its files with --data."""
    root = Path(path)
    if root.is_dir() and not (root / MANIFEST_NAME).exists() and not any(root.glob("train-*")):
        built = root.with_name(root.resolve().name + "-corpus")
        raise UserError(
            f"{flag} {root}: no {MANIFEST_NAME}, so it is not a corpus built by `python -m "
            f"atom_train.corpus build`. Build one from its text into a new folder: `python -m "
            f"atom_train.corpus build {quote(root)} --out {quote(built)}`, then pass "
            f"{flag} {quote(built)}; or read its files as they are with --data "
            f"{quote(str(root / '*.txt'))}"
        )
    return open_corpus_dir(root)


def _held_out(folder: Path, cache: dict[Path, tuple[str, set[str]] | None]):
    """(val file name, train file names) of the built corpus in `folder`, or None."""
    if folder not in cache:
        cache[folder] = None
        if (folder / MANIFEST_NAME).is_file():
            try:
                man = read_manifest(folder)
            except UserError:
                return None  # another tool's manifest.json, or a damaged one: not a corpus
            if man.get("val"):
                train = {e["file"] for e in man.get("train", [])}
                cache[folder] = (man["val"]["file"], train)
    return cache[folder]


def check_held_out(paths: Sequence[str], flag: str = "--data", *, val_alone_ok: bool = False):
    """Refuse a built corpus's held-out val among `paths` (the files `flag` matched), naming
    the corpus and the ``--corpus`` fix. `val_alone_ok` (eval): the val may be scored, just
    not together with that corpus's train shards."""
    cache: dict[Path, tuple[str, set[str]] | None] = {}
    by_folder: dict[Path, list[str]] = {}
    for p in paths:
        real = Path(os.path.realpath(p))
        by_folder.setdefault(real.parent, []).append(real.name)
    for folder, names in by_folder.items():
        held = _held_out(folder, cache)
        if held is None or held[0] not in names:
            continue
        val_name, train = held
        val = folder / val_name
        if not val_alone_ok:
            raise UserError(
                f"{flag} matches {val}, the held-out val of the corpus built in {folder} (its "
                f"{MANIFEST_NAME} says so): training on it makes every val score measure "
                f"memory. Use --corpus {quote(folder)} (its train shards, and its val for "
                "validation), or name the train shards alone, e.g. "
                f"{flag} {quote(str(folder / 'train-*.txt'))}"
            )
        if train & set(names):
            raise UserError(
                f"{flag} matches both the train shards and the held-out val ({val}) of the "
                f"corpus built in {folder}: a score of both mixes memory and generalisation. "
                f"Score the val with --corpus {quote(folder)}, or the shards alone with "
                f"{flag} {quote(str(folder / 'train-*.txt'))}"
            )
