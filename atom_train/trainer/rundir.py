"""The run folder: the names of its files, its lock, its append-only logs and its status.

Files (see docs/architecture.md): ``.lock`` (flock held by the one trainer using the folder),
``progress.tsv``, ``loss.jsonl`` (the steps, bounded by time, and the events; append-only for
the life of the run), ``events.jsonl`` (the events alone), ``samples.jsonl``,
``status.json``, and the checkpoints (`is_checkpoint_name`). The folder's format is
`RUN_FORMAT` (recorded in status.json and in each launch's first event).
Standard library only: the supervisor reads the folder without loading torch.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from atom_train.common.atomic import atomic_write_json, remove_stale_temp_files
from atom_train.common.cli import UserError

# ---- the names of a run folder's files (defined here only) ---------------------------------

# The run folder's format: 1 = loss.jsonl with one line per step (bpb, gnorm, bytes) and the
# events; 2 = loss.jsonl bounded by time (train_bpb, grad_norm, bytes_seen; aggregate lines),
# events.jsonl, progress.tsv's grad_norm column (docs/checkpoints.md, "The logs").
RUN_FORMAT = 2
LOSS_LOG = "loss.jsonl"
EVENTS = "events.jsonl"
PROGRESS = "progress.tsv"
SAMPLES = "samples.jsonl"
STATUS = "status.json"
LOCK = ".lock"
TB_DIR = "tb"  # TensorBoard's event files: the default of the trainer's --tensorboard
CHECKPOINT_SUFFIX = ".safetensors"
ROLLING = "ckpt-rolling" + CHECKPOINT_SUFFIX
ROLLING_PREV = "ckpt-rolling.prev" + CHECKPOINT_SUFFIX
FINAL = "ckpt-final" + CHECKPOINT_SUFFIX
SNAPSHOT_RE = re.compile(r"^snapshot-(\d+)\.safetensors$")


def snapshot_name(tick: int) -> str:
    return f"snapshot-{tick:012d}{CHECKPOINT_SUFFIX}"


def is_checkpoint_name(name: str) -> bool:
    """A checkpoint file's name (rolling, its predecessor, final, snapshots, and copies a
    user put there): any visible ``*.safetensors`` (hidden names are temp files)."""
    return name.endswith(CHECKPOINT_SUFFIX) and not name.startswith(".")


PROGRESS_COLUMNS = (
    "tick",
    "bytes_seen",
    "loss",
    "byte_ce_bpb",
    "val_ce_bpb",
    "lr",
    "grad_norm",  # the row's step's gradient norm before clipping (empty: clipping off)
    "leak",
    "bytes_per_s",  # the interval's training throughput (boundary work left out)
    "elapsed_s",
    # Where the interval's wall time went (only the long measurement counts).
    "bytes_per_s_run",  # since this launch began, everything included: the long-run rate
    "loader_wait_pct",  # share of wall time the step waited for its window (CUDA: the GPU's)
    "loader_busy_pct",  # share of wall time the loader thread worked (fill, masks, state)
    "compute_s",  # forward + backward
    "optimizer_s",  # gradient reduction, clipping, AdamW
    "boundary_s",  # validation + samples + checkpoint writes
    "val_s",
    "sample_s",
    "ckpt_s",
    "peak_rss_mb",  # the process's peak resident memory (the largest over ranks)
    "peak_device_mb",  # CUDA: torch's peak allocation
    "eta_s",  # time to finish at the long-run rate
)


class RunDirError(UserError):
    """The run folder cannot be used (locked by another trainer, not writable)."""


class RunLock:
    """An exclusive flock on ``<run_dir>/.lock``; the holder's pid is written inside.

    The kernel drops the lock when the process dies, however it dies, so a crashed trainer
    never leaves a stale lock behind.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(
                f"cannot create {self.path} ({e.strerror}): make the output folder writable "
                "or choose another --output-dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"another trainer (pid {holder}) is using {self.path.parent}: stop it first, "
                "or choose another --output-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def lock_holder(run_dir: Path) -> str | None:
    """The pid of the trainer holding `run_dir`'s lock now, or None (the folder is free);
    asked without creating or changing anything there."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return None  # no lock file: no trainer ever took it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # (drops the lock if this call took it)
    return None


def check_writable(run_dir: Path) -> None:
    """Fail early, with the fix, if the run folder cannot take files."""
    probe = run_dir / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise RunDirError(
            f"output folder {run_dir} is not writable ({e.strerror}): fix its permissions "
            "or free space, or choose another --output-dir"
        ) from None


def open_run_dir(out: Path, say: Callable[[str], None]) -> RunLock:
    """Create the run folder and take its lock, before anything is written there; check it
    takes files; remove the temp files of atomic writes (checkpoints, status.json) a killed
    trainer left: with the lock held, no other writer can own one."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output folder {out} ({e.strerror})") from None
    lock = RunLock(out)
    lock.acquire()
    try:
        check_writable(out)
    except UserError:
        lock.release()
        raise
    for p in remove_stale_temp_files(out):
        if CHECKPOINT_SUFFIX in p.name:
            say(f"removed {p.name}, left by a checkpoint write that was interrupted")
    return lock


class AppendLog:
    """A file that is only ever appended to, one whole line per write() call.

    O_APPEND plus one write per line means a kill -9 cannot interleave or tear lines written
    earlier; if the previous process died in the middle of a line, the next open adds the
    missing newline instead of truncating anything.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(self._fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    @property
    def empty(self) -> bool:
        return os.fstat(self._fd).st_size == 0

    def write_line(self, line: str) -> None:
        os.write(self._fd, (line.rstrip("\n") + "\n").encode())

    def write_json(self, obj: dict) -> None:
        self.write_line(json.dumps(obj, sort_keys=False, separators=(",", ":")))

    def close(self) -> None:
        os.close(self._fd)


class NullLog:
    """Where the ranks other than 0 write their logs: nowhere (rank 0 owns the run folder)."""

    empty = False

    def write_line(self, line: str) -> None:
        pass

    def write_json(self, obj: dict) -> None:
        pass

    def row(self, **values: object) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressTable(AppendLog):
    """progress.tsv: a header line before each launch's first row, then one row per log
    interval. (At each launch, not once: a folder written by another version may have other
    columns, and readers take each row by the header above it. Before the first row, not at
    the start: a launch that logs nothing, e.g. the rerun of a finished run, appends nothing.)"""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._header_due = True

    def row(self, **values: object) -> None:
        if self._header_due:
            self.write_line("\t".join(PROGRESS_COLUMNS))
            self._header_due = False
        cells = []
        for col in PROGRESS_COLUMNS:
            v = values.get(col)
            if v is None:
                cells.append("")
            elif isinstance(v, float):
                cells.append(f"{v:.6g}")
            else:
                cells.append(str(v))
        self.write_line("\t".join(cells))


def write_status(run_dir: Path, status: str, **fields: object) -> None:
    """status.json: the state and `fields`; every time in epoch seconds (``time``, ``*_at``,
    ``*_time``) also as local ISO-8601 (``<name>_iso``), for people."""
    out = {"status": status, "pid": os.getpid(), "time": time.time(), **fields}
    for k, v in list(out.items()):
        if (k == "time" or k.endswith(("_at", "_time"))) and isinstance(v, (int, float)):
            out[f"{k}_iso"] = iso_time(v)
    atomic_write_json(run_dir / STATUS, out)


def iso_time(t: float) -> str:
    """Epoch seconds as local ISO-8601 with the UTC offset (2026-12-01T14:03:07+01:00)."""
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
