"""A built corpus folder and its `manifest.json`: reading, checking, describing.

    DIR/train-000.txt, train-001.txt, ...   train shards (documents, each followed by a seam)
    DIR/val.txt                             held-out documents (absent when val is empty)
    DIR/manifest.json                       written last: its presence marks the corpus done

The manifest (JSON, keys sorted, nothing that depends on time or machine):

    format "atom-corpus", version 1, tool / tool_version / cleaning_version,
    options     every build option that shapes the output
    inputs      [{path, bytes, mtime_ns}] sorted by path; source: a document source's
                identity and report, or null
    train       [{file, bytes, documents, non_ascii_bytes, sha256}] in shard order
    val         the same for val.txt, or null
    counts      documents_read, documents_kept, train_documents, val_documents,
                duplicates, seams, dropped {reason: n}, changed {step: n}, skipped
                {files, records, binary {reason: n}}, bytes; with --language, language
                {detected {code: n}, confidence {bucket: n}}; with --near-dup,
                near_duplicates {threshold, dropped, examples}

`open_corpus_dir(path)` is what a trainer calls for `--corpus DIR`: it refuses a folder
without a manifest, a manifest of an unknown version, and a shard whose size or content
(SHA-256) changed, each with a `UserError` that names the fix. This module is standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from atom_train.common.cli import UserError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "atom-corpus"
MANIFEST_VERSION = 1
VAL_NAME = "val.txt"
_BUILD_HINT = "python -m atom_train.corpus build INPUT... --out"


@dataclass(frozen=True)
class CorpusDir:
    """A checked corpus folder: train shard paths in order, the val path or None."""

    root: Path
    train: tuple[Path, ...]
    val: Path | None
    manifest: dict

    @property
    def train_bytes(self) -> int:
        return sum(e["bytes"] for e in self.manifest["train"])

    @property
    def val_bytes(self) -> int:
        val = self.manifest["val"]
        return val["bytes"] if val else 0


def read_manifest(root: str | Path) -> dict:
    """The manifest of corpus folder `root`; a `UserError` naming the fix when there is none,
    it is unreadable, or its format or version is not this one."""
    root = Path(root)
    path = root / MANIFEST_NAME
    if root.is_file():
        raise UserError(
            f"{root} is a file, not a corpus folder: give the folder a build wrote "
            f"(`{_BUILD_HINT} DIR`), or read the file as it is with --data {root}"
        )
    if not root.is_dir():
        raise UserError(f"{root}: no such folder: build a corpus with `{_BUILD_HINT} {root}`")
    if not path.is_file():
        raise UserError(
            f"{root} has no {MANIFEST_NAME}, so it is not a finished corpus: build one with "
            f"`{_BUILD_HINT} {root}` (an interrupted build resumes when rerun)"
        )
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(
            f"{path} is unreadable ({e}): rebuild with `{_BUILD_HINT} {root} --force`"
        ) from None
    if not isinstance(man, dict) or man.get("format") != MANIFEST_FORMAT:
        raise UserError(f"{path} is not a corpus manifest (format {MANIFEST_FORMAT!r} expected)")
    if man.get("version") != MANIFEST_VERSION:
        raise UserError(
            f"{path} has format version {man.get('version')}, this atom reads version "
            f"{MANIFEST_VERSION}: rebuild it with this atom (`{_BUILD_HINT} {root} --force`)"
        )
    return man


def files_of(man: dict) -> list[dict]:
    """The manifest's file entries: train shards in order, then val."""
    return [*man["train"], *([man["val"]] if man.get("val") else [])]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_problems(root: Path, man: dict, *, quick: bool) -> list[str]:
    """One line per file that is missing, has another size or (unless quick) another
    SHA-256 than the manifest says, in manifest order; [] when the corpus is intact. The
    files of the right size are hashed in parallel, one thread per core (hashlib releases
    the GIL: the hash runs at the disk's or the page cache's speed)."""
    problems: dict[int, str] = {}
    to_hash: list[tuple[int, dict]] = []
    for i, entry in enumerate(files_of(man)):
        try:
            size = (root / entry["file"]).stat().st_size
        except OSError:
            problems[i] = f"{entry['file']}: missing"
            continue
        if size != entry["bytes"]:
            problems[i] = f"{entry['file']}: {size:,} bytes, the manifest says {entry['bytes']:,}"
        elif not quick:
            to_hash.append((i, entry))
    if to_hash:
        workers = min(len(to_hash), os.cpu_count() or 1)
        with ThreadPoolExecutor(workers) as pool:
            digests = pool.map(lambda e: sha256_file(root / e[1]["file"]), to_hash)
            for (i, entry), digest in zip(to_hash, digests, strict=True):
                if digest != entry["sha256"]:
                    problems[i] = (
                        f"{entry['file']}: content differs from its sha256 in the manifest"
                    )
    return [problems[i] for i in sorted(problems)]


def open_corpus_dir(path: str | Path) -> CorpusDir:
    """The train shards and val file of a built corpus, checked against its manifest: every
    file's size and SHA-256, at every launch (docs/corpus.md, "Checked at every launch",
    has the cost: about a second per 2 GB in the page cache, the disk's read speed
    otherwise). Raises `UserError` naming the fix when the folder is not a finished corpus
    or a file changed."""
    root = Path(path)
    man = read_manifest(root)
    problems = file_problems(root, man, quick=False)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(
            f"{root}: {problems[0]}{more}: the corpus changed after it was built; rebuild it "
            f"(`{_BUILD_HINT} {root} --force`) or restore the files "
            f"(`python -m atom_train.corpus check {root}` lists the differences)"
        )
    train = tuple(root / e["file"] for e in man["train"])
    val = root / man["val"]["file"] if man.get("val") else None
    return CorpusDir(root, train, val, man)


def summary(root: Path, man: dict) -> str:
    """The human-readable figures of a corpus (what `corpus stats` prints)."""
    c = man["counts"]
    lines = []
    for e in files_of(man):
        share = e["non_ascii_bytes"] / e["bytes"] if e["bytes"] else 0.0
        lines.append(
            f"  {e['file']}: {e['bytes']:,} bytes, {e['documents']:,} documents, "
            f"{100 * share:.2f}% non-ASCII bytes"
        )
    train_bytes = sum(e["bytes"] for e in man["train"])
    val_bytes = man["val"]["bytes"] if man.get("val") else 0
    dropped = ", ".join(f"{k} {v:,}" for k, v in sorted(c["dropped"].items()) if v) or "none"
    changed = ", ".join(f"{k} {v:,}" for k, v in sorted(c["changed"].items()) if v) or "none"
    skipped = c["skipped"]
    binary = skipped.get("binary") or {}
    lines += [
        f"  train: {len(man['train'])} shards, {train_bytes:,} bytes, "
        f"{c['train_documents']:,} documents; val: {val_bytes:,} bytes, "
        f"{c['val_documents']:,} documents",
        f"  documents: {c['documents_read']:,} read, {c['documents_kept']:,} kept, "
        f"{c['duplicates']:,} duplicates removed; dropped: {dropped}",
        f"  cleaned (kept documents changed): {changed}; seams: {c['seams']:,}",
        f"  read {c['bytes_read']:,} bytes of text from {len(man['inputs'])} input files"
        + (f" and {man['source']['identity'].get('name', 'a document source')}" if man.get("source") else "")
        + (f"; skipped {skipped['files']} files, {skipped['records']} records" if skipped["files"] or skipped["records"] else ""),
    ]  # fmt: skip
    if binary:
        lines.append(
            "  skipped, not text: " + ", ".join(f"{k} {v:,}" for k, v in sorted(binary.items()))
        )
    lang = c.get("language")
    if lang:
        top = ", ".join(f"{k} {v:,}" for k, v in list(lang["detected"].items())[:8])
        conf = ", ".join(f"{k} {v:,}" for k, v in lang["confidence"].items())
        lines.append(f"  language identified (documents): {top}; confidence: {conf}")
    near = c.get("near_duplicates")
    if near:
        lines.append(
            f"  near duplicates (similarity >= {near['threshold']}): {near['dropped']:,} dropped"
        )
        lines += [
            f"    {e['similarity']:.2f}: {e['dropped'][:70]!r} ~ {e['near'][:70]!r}"
            for e in near["examples"]
        ]
    return "\n".join(lines)
