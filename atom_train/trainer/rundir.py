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


# A checkpoint is a safetensors file: its header (an 8-byte little-endian length, then JSON)
# holds the metadata as text, so the standard library reads it (the supervisor does).
MAX_HEADER_BYTES = 100 << 20


def checkpoint_metadata(path: Path) -> dict | None:
    """The atom metadata of a checkpoint file, read from its header with the standard
    library (not verified: `checkpoint_file.load_checkpoint` verifies); None if unreadable."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= MAX_HEADER_BYTES:
                return None
            header = json.loads(f.read(n))
        meta = json.loads(header["__metadata__"]["atom"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if isinstance(meta, dict) else None


def checkpoint_launch(path: Path) -> str | None:
    """The launch that wrote a checkpoint (`cli.LAUNCH_ID_ENV` of its trainer), or None."""
    meta = checkpoint_metadata(path)
    training = meta.get("training") if meta else None
    launch = training.get("launch") if isinstance(training, dict) else None
    return launch if isinstance(launch, str) else None


def snapshot_name(tick: int) -> str:
    return f"snapshot-{tick:012d}{CHECKPOINT_SUFFIX}"


def is_checkpoint_name(name: str) -> bool:
    """A checkpoint file's name (rolling, its predecessor, final, snapshots, and copies a
    user put there): any visible ``*.safetensors`` (hidden names are temp files)."""
    return name.endswith(CHECKPOINT_SUFFIX) and not name.startswith(".")


# The columns are metric names (`atom_train.common.metrics`): the same keys as loss.jsonl,
# status.json and TensorBoard. (Runs written before the names were settled have
# byte_ce_bpb and val_ce_bpb, and no grad_norm: the readers accept them.)
PROGRESS_COLUMNS = (
    "tick",
    "bytes_seen",
    "loss",
    "train_bpb",  # the interval's mean byte CE of training, bits/byte
    "val_bpb",  # empty on rows without validation
    "grad_norm",  # the interval's mean gradient norm before clipping
    "lr",
    "leak",
    "bytes_per_s",  # the interval's training throughput (boundary work left out)
    "elapsed_s",
    # Where the interval's wall time went (only the long measurement counts).
    "bytes_per_s_run",  # since this launch began, everything included: the long-run rate
    # The share of wall time the step waited for its prefetched window, named for what it is:
    # on a CPU the loader's time; on CUDA the GPU's (a buffer is refilled only once the GPU
    # has run the windows queued before it). Each is empty on the other kind of device.
    "loader_wait_pct",
    "gpu_wait_pct",
    "loader_busy_pct",  # share of wall time the loader thread worked (fill, masks, state)
    "compute_s",  # forward + backward
    "allreduce_s",  # the gradients' all-reduce across ranks (torchrun only; else empty)
    "optimizer_s",  # clipping, AdamW
    "boundary_s",  # validation + samples + checkpoint writes
    "val_s",
    "sample_s",
    "ckpt_s",
    "peak_rss_mb",  # the process's peak resident memory (the largest over ranks)
    "peak_device_mb",  # CUDA: torch's peak allocation
    "eta_s",  # time to finish at the long-run rate
    # The gradient noise scale's moving averages (--noise-scale-every; empty when off).
    "grad_sq",  # |G|^2, the true gradient's squared norm
    "trace_cov",  # tr(Σ), one stream's gradient covariance
    "b_simple",  # tr(Σ) / |G|^2: the noise scale, in streams
    "b_simple_bytes",  # the same in bytes per step: b_simple x K
)


class RunDirError(UserError):
    """The run folder cannot be used (locked by another trainer, not writable)."""


class RunLock:
    """An exclusive flock on ``<run_dir>/.lock``; the holder's pid is written inside.

    The kernel drops the lock when the process dies, however it dies, so a crashed trainer
    never leaves a stale lock behind.
    """

    def __init__(self, run_dir: Path, created: bool = False) -> None:
        self.path = run_dir / LOCK
        self.created = created  # the folder was made for this launch (open_run_dir)
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

    def release(self, remove_new_folder: bool = False) -> None:
        """Drop the lock. `remove_new_folder`: the launch was refused before it wrote
        anything, so a folder made for it goes again (a typo leaves no empty run behind)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
            if remove_new_folder and self.created:
                with contextlib.suppress(OSError):
                    self.path.unlink()
                    self.path.parent.rmdir()  # only if nothing else is in it


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
    """Create the run folder and take its lock, before anything is read or written there;
    check it takes files; remove the temp files of atomic writes (checkpoints, status.json)
    a killed trainer left: with the lock held, no other writer can own one."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output folder {out} ({e.strerror})") from None
    lock = RunLock(out, created)
    lock.acquire()
    try:
        check_writable(out)
    except UserError:
        lock.release(remove_new_folder=True)
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
    """progress.tsv: a header line, then one row per log interval. A launch whose columns
    differ from the file's last header (a run resumed by another version) writes its header
    again: readers take each row by the header above it. The header goes before the launch's
    first row, not at its start: a launch that logs nothing (the rerun of a finished run)
    appends nothing."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._header_due = self.empty or _last_header(path) != "\t".join(PROGRESS_COLUMNS)

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


def _last_header(path: Path) -> str | None:
    """The last header line of a progress.tsv (the lines that begin with ``tick``)."""
    last = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("tick\t"):
                last = line.rstrip("\r\n")
    return last


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
