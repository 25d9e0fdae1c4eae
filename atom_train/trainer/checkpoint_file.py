"""The checkpoint file: one self-describing safetensors file, written atomically, checksummed.

A checkpoint file is a plain safetensors file (no pickle: loading one never runs code). Its
header metadata holds

- ``format`` = ``atom.checkpoint`` and ``format_version`` (2; a file without the key is 1;
  every version up to this one is read, docs/checkpoints.md has their history),
- ``payload_sha256``: SHA-256 over the metadata JSON and every tensor (name, dtype, shape,
  bytes) in name order, so a flipped bit or a truncated file is detected on load,
- ``atom``: the JSON metadata (model config, provenance, training position, loader state,
  the run config, versions, ...; see docs/checkpoints.md).

Writes go through `atom_train.common.atomic.atomic_write`: a hidden temp file in the same folder,
fsynced, read back and verified, then renamed into place, and the folder fsynced: a crash at any moment leaves either the old
file or the new one, never a torn one. On any failure (disk full, unwritable folder) the temp
file is removed, the previous checkpoint is untouched, and `CheckpointError` says so.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from atom_train.common.atomic import atomic_write
from atom_train.trainer import fault_points
from atom_train.trainer.rundir import (  # noqa: F401  (the names are part of this module's API)
    CHECKPOINT_SUFFIX,
    FINAL,
    ROLLING,
    ROLLING_PREV,
    SNAPSHOT_RE,
    is_checkpoint_name,
    snapshot_name,
)

FORMAT = "atom.checkpoint"
FORMAT_VERSION = 2
SUFFIX = CHECKPOINT_SUFFIX

_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint could not be written, or a file is not a valid atom checkpoint."""


@dataclass
class Checkpoint:
    path: Path
    meta: dict
    tensors: dict[str, torch.Tensor]
    sha256: str = ""  # the payload checksum: names this exact content (fork events cite it)

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors named ``prefix/...``, with the prefix stripped."""
        p = prefix + "/"
        return {k[len(p) :]: v for k, v in self.tensors.items() if k.startswith(p)}


def payload_digest(meta_json: str, tensors: dict[str, torch.Tensor]) -> str:
    """The checksum of a checkpoint's content (`tensors` on the CPU: `_serialize` moves them
    there, and safetensors loads them there)."""
    h = hashlib.sha256()
    h.update(meta_json.encode())
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _serialize(tensors: dict[str, torch.Tensor], meta: dict) -> bytes:
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    meta_json = json.dumps(meta, sort_keys=True)
    header = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "payload_sha256": payload_digest(meta_json, tensors),
        "atom": meta_json,
    }
    return st_save(tensors, metadata=header)


HEAD_BYTES = 64  # what `_other_format` reads of a file


def _looks_like_text(head: bytes) -> bool:
    """UTF-8 text without control characters (a safetensors file starts with its header's
    length as 8 binary bytes, never text)."""
    try:
        text = head.decode()  # (bytes decode as UTF-8, strictly, whatever the locale)
    except UnicodeDecodeError:
        text = head[:-3].decode(errors="replace")  # (a character cut at the end)
        if "\ufffd" in text:
            return False
    return bool(text) and all(c.isprintable() or c in "\t\r\n" for c in text)


def _other_format(head: bytes, size: int, path: Path) -> str | None:
    """What a file that is not a checkpoint is (from its `head`, its first `HEAD_BYTES`, and
    its size), when that can be told: a text file (a corpus shard, notes), or another file of
    this project: an export (`atom_train.export`: int32 step, int32 n, then 3 x n float32;
    a file shorter than 8 bytes has no n > 0 of its size)."""
    if _looks_like_text(head):
        return (
            f"{path} is a text file, not a checkpoint: give a checkpoint (*.safetensors, "
            "written by python -m atom_train.train) or a run folder"
        )
    n = int.from_bytes(head[4:8], "little", signed=True)
    if n > 0 and size == 8 + 12 * n:
        return (
            f"{path} is an export (raw weights + AdamW moments, written by "
            "atom_train.export), not a checkpoint: give the .safetensors checkpoint it was "
            f"exported from (its sidecar {path.name}.json names it)"
        )
    return None


def _parse(data: bytes, path: Path) -> Checkpoint:
    """Decode and verify checkpoint bytes; raise CheckpointError naming the problem."""
    other = _other_format(data[:HEAD_BYTES], len(data), path)
    if other:
        raise CheckpointError(other)
    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt (safetensors says: {e})") from None
    header = _header_metadata(data)
    _check_format(header, path)
    meta_json = header.get("atom")
    if meta_json is None or "payload_sha256" not in header:
        raise CheckpointError(f"{path}: no atom metadata or checksum in the header")
    if payload_digest(meta_json, tensors) != header["payload_sha256"]:
        raise CheckpointError(f"{path}: checksum mismatch (the file is corrupt)")
    return Checkpoint(
        path=path, meta=json.loads(meta_json), tensors=tensors, sha256=header["payload_sha256"]
    )


def _header_metadata(data: bytes) -> dict[str, str]:
    """The header metadata of a file safetensors has parsed (`_parse`: it refuses a file too
    short for its header, or whose header is not a JSON object, before this runs)."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]).get("__metadata__") or {}


def _check_format(header: dict[str, str], path: Path) -> None:
    if header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not an atom checkpoint (format {header.get('format')!r}, expected {FORMAT!r})"
        )
    raw = header.get("format_version", "1")
    try:
        version = int(raw)
    except ValueError:
        raise CheckpointError(f"{path}: malformed format_version {raw!r} in the header") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version} is newer than this atom "
            f"understands ({FORMAT_VERSION}): upgrade atom"
        )


def read_metadata(path: str | os.PathLike) -> dict:
    """The JSON metadata of a checkpoint, from its header only (fast; not verified)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        try:
            with open(path, "rb") as f:
                other = _other_format(f.read(HEAD_BYTES), path.stat().st_size, path)
        except OSError:
            other = None
        raise CheckpointError(other or f"{path}: not a readable checkpoint ({e})") from None
    _check_format(header, path)
    try:
        return json.loads(header["atom"])
    except (KeyError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: no atom metadata in the header") from None


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify a checkpoint; CheckpointError if missing, corrupt or of another format."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"{path} is a folder: give a checkpoint file, or use latest_valid_checkpoint()"
        )
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    return _parse(data, path)


def save_checkpoint(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    meta: dict,
    *,
    keep_previous_as: str | os.PathLike | None = None,
    exclusive: bool = False,
) -> Path:
    """Write a checkpoint atomically (`atom_train.common.atomic.atomic_write`) and verify it on disk
    before it replaces anything.

    keep_previous_as: if ``path`` exists, it is renamed to this name once the new file has been
    written and verified (the rolling checkpoint keeps its predecessor).
    exclusive: never replace an existing ``path`` (snapshots); raises CheckpointError instead.
    """
    path = Path(path)
    if exclusive and path.exists():
        raise CheckpointError(f"refusing to overwrite {path}: snapshots are permanent")
    data = _serialize(tensors, meta)
    slow = fault_points.installed.checkpoint_write_delay()  # (a test's slow disk)
    try:
        atomic_write(
            path,
            data,
            verify=lambda tmp: _parse(tmp.read_bytes(), tmp),
            keep_previous_as=keep_previous_as,
            exclusive=exclusive,
            chunk_bytes=len(data) // 8 if slow else _CHUNK,  # (a header alone is over 8 bytes)
            chunk_delay_s=slow,
        )
    except FileExistsError:
        raise CheckpointError(f"refusing to overwrite {path}: snapshots are permanent") from None
    except (OSError, CheckpointError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        hint = ""
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            hint = ": free some space (or move --output-dir) and resume"
        elif isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            hint = ": make the output folder writable and resume"
        prev = f"; the previous checkpoint {path.name} is intact" if path.exists() else ""
        raise CheckpointError(f"could not write checkpoint {path} ({reason}){hint}{prev}") from e
    return path


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """All checkpoint files in a run folder (hidden temp files excluded), unsorted."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return [p for p in run_dir.glob("*" + SUFFIX) if is_checkpoint_name(p.name)]


def latest_valid_checkpoint(
    run_dir: str | os.PathLike, warn: Callable[[str], None] | None = None
) -> Checkpoint | None:
    """The newest checkpoint in ``run_dir`` (by training tick) whose checksum verifies.

    Files that fail to read or verify are skipped with a warning naming them; None when the
    folder holds no valid checkpoint.
    """
    candidates = []
    for p in list_checkpoints(run_dir):
        try:
            meta = read_metadata(p)
            tick = int(meta["training"]["tick"])
        except CheckpointError as e:
            if warn:
                warn(f"skipping checkpoint {e}")
            continue
        except (KeyError, TypeError, ValueError):
            if warn:
                warn(f"skipping checkpoint {p}: no training tick in its metadata")
            continue
        candidates.append((tick, p.stat().st_mtime_ns, p))
    for _, _, p in sorted(candidates, reverse=True):
        try:
            return load_checkpoint(p)
        except CheckpointError as e:
            if warn:
                warn(f"skipping checkpoint {e}")
    return None
