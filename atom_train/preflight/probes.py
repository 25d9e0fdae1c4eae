"""The pre-flight's measurements (`python -m atom_train.preflight`): each runs the real thing,
for a bounded time, in a scratch folder beside the planned run folder, and returns numbers
for `preflight.checks`.

- `corpus_reads`: the loader reading the shards at the run's B and K, cold (the shards'
  pages dropped from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)``, checked with
  ``mincore``) and then warm; and a cold sequential read (what ``--resident`` costs);
- `memory_probe`: ``python -m atom_train.bench.step --mode trainer`` at a given B (the
  trainer's window with its loader and prefetch, in a fresh process: its peak memory);
- `exercise_trainer`: the planned command itself (``python -m atom_train.train``, in the
  scratch folder): its progress rows (the speed), a second trainer refused by the lock,
  SIGUSR1, SIGKILL, a resume and the loss after it, SIGTERM;
- `checkpoint_io`: loading (cold) and writing a checkpoint of the run's size;
- `measure_backoff`: the supervisor as a subprocess, with a trainer that crashes at once
  (`preflight.crash_probe`), and the gaps between its launches;
- `on_complete_probe`, `machine`: what runs at the end, and this machine's memory and disk.

Limits of the cold read: DONTNEED drops only clean pages that no process maps (a trainer
running on the same shards keeps them cached; the fraction left is measured and reported),
and not the caches below the kernel (a disk's or RAID controller's own cache, a network
filesystem's server), so on those a "cold" rate can be optimistic.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from atom_train.preflight.crash_probe import LAUNCHES
from atom_train.trainer.checkpoint_file import (
    CheckpointError,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)
from atom_train.trainer.plan import RunPlan
from atom_train.trainer.run_config import Lifecycle, lifecycle_argv
from atom_train.trainer.run_logs import read_progress
from atom_train.trainer.rundir import (
    PROGRESS,
    ROLLING,
    SAMPLES,
    STATUS,
    TB_DIR,
    RunDirError,
    RunLock,
)
from atom_train.trainer.tensorboard_log import IN_RUN as TB_IN_RUN

# ---- the machine -----------------------------------------------------------------------------


def meminfo() -> dict[str, int]:
    """/proc/meminfo's MemTotal and MemAvailable, in bytes (Linux; empty elsewhere)."""
    out = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def free_space(path: Path) -> tuple[int, str]:
    """Free bytes (for an unprivileged writer) of the filesystem `path` will be on, and its
    mount point (the nearest existing folder above `path` is asked: it need not exist)."""
    p = path.absolute()
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    mount = p
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return st.f_bavail * st.f_frsize, str(mount)


def machine(plan: RunPlan) -> dict:
    mem = meminfo()
    info = {
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "mem_total_bytes": mem.get("MemTotal"),
        "mem_available_bytes": mem.get("MemAvailable"),
        "device": str(plan.device),
    }
    if plan.device.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(plan.device)
        info.update(
            gpu=torch.cuda.get_device_name(plan.device),
            gpu_total_bytes=total,
            gpu_free_bytes=free,
        )
    info["free_bytes"], info["filesystem"] = free_space(plan.out)
    return info


# ---- the page cache --------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_PROT_READ, _MAP_SHARED = 1, 1
_MAP_FAILED = ctypes.c_void_p(-1).value


def drop_from_cache(paths: list[str | Path]) -> None:
    """Ask the kernel to drop the files' clean, unmapped pages from the page cache."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_fraction(paths: list[str | Path]) -> float | None:
    """The share of the files' pages in the page cache now (mincore on a fresh mapping,
    which touches no page); None where it cannot be asked."""
    page = os.sysconf("SC_PAGE_SIZE")
    cached = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
            if addr in (None, _MAP_FAILED):
                return None
            try:
                n = (size + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if _libc.mincore(addr, size, vec) != 0:
                    return None
                cached += sum(b & 1 for b in bytes(vec))
                total += n
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return cached / total if total else None


def sequential_read_rate(paths: list[str | Path], max_bytes: int, seconds: float) -> float | None:
    """Bytes/s of a plain sequential read of the shards from their start, cold (what
    --resident's copy into RAM costs), for at most `max_bytes` or `seconds`."""
    drop_from_cache(paths)
    buf = bytearray(8 << 20)
    n, t0 = 0, time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n < max_bytes and time.perf_counter() - t0 < seconds:
                got = f.readinto(buf)
                if not got:
                    break
                n += got
        if n >= max_bytes or time.perf_counter() - t0 >= seconds:
            break
    dt = time.perf_counter() - t0
    drop_from_cache(paths)
    return n / dt if n and dt > 0 else None


def corpus_reads(plan: RunPlan, seconds: float) -> dict:
    """The loader at the run's B, K, pack mode, offsets, transport and loader threads,
    reading the shards cold (page cache dropped) for about `seconds` (at most one pass over
    the corpus), then the same windows again warm; bytes/s = ticks x B per second, as the
    trainer counts."""
    from atom_train.data.loader import BatchedByteStream, ByteCorpus

    shards = list(plan.corpus.shards)
    K = plan.window_schedule.K
    offsets = "even" if plan.offset_seed is None else plan.offset_seed
    threads = plan.hardware.loader_threads

    def stream():
        s = BatchedByteStream(
            ByteCorpus(shards), plan.B, pack_mode=plan.config.pack_mode, offsets=offsets,
            threads=threads,
        )  # fmt: skip
        return s.next_window_ids if plan.transport == "ids" else s.next_window

    out: dict = {
        "method": "posix_fadvise DONTNEED on the shards, checked with mincore",
        "B": plan.B,
        "K": K,
    }
    out["sequential_bytes_per_s"] = sequential_read_rate(shards, 256 << 20, seconds / 2)
    drop_from_cache(shards)
    out["cached_after_drop"] = cached_fraction(shards)
    read = stream()
    # At most one pass: the streams' second pass over a small corpus would read it warm.
    most = max(2, plan.corpus.size // (K * plan.B))
    windows, t0 = 0, time.perf_counter()
    while windows < 2 or (windows < most and time.perf_counter() - t0 < seconds):
        read(K)
        windows += 1
    cold = time.perf_counter() - t0
    read = stream()
    t0 = time.perf_counter()
    for _ in range(windows):
        read(K)
    warm = time.perf_counter() - t0
    n = windows * K * plan.B
    out.update(
        windows=windows,
        cold_bytes_per_s=n / cold,
        warm_bytes_per_s=n / warm,
        # What the disk served for the streams' pattern: the cold time beyond the warm.
        disk_s=max(cold - warm, 0.0),
    )
    return out


# ---- memory ----------------------------------------------------------------------------------


def memory_probe(plan: RunPlan, B: int, seconds: float, timeout: float) -> dict:
    """The trainer's window (loader, prefetch, step) at B streams with the run's model, K,
    device, field loop, transport and noise-scale probe (its half batch on the warm-up
    windows, so its memory is in the peak), in a fresh process (`atom_train.bench.step
    --mode trainer`): its peak memory (CUDA: reserved plus what the probe's process holds
    outside the allocator; CPU: peak RSS) and bytes/s. A probe that runs out of memory says
    so. On CUDA what the device held before the probe started (this process's own context
    and cache, other processes) is not the probe's: the budget it is held to is the free
    memory seen from here, which already leaves it out, so it is counted once."""
    import torch

    cmd = [
        sys.executable, "-m", "atom_train.bench.step", "--mode", "trainer",
        "-B", str(B), "-K", str(plan.window_schedule.K), "--device", plan.device.type,
        "--threads", str(plan.hardware.threads or torch.get_num_threads()),
        "--loader-threads", str(plan.hardware.loader_threads or os.cpu_count() or 1),
        "--recurrence", plan.recurrence, "--transport", plan.transport,
        "--seconds", f"{seconds:g}", "--model-config", json.dumps(plan.config.to_dict()),
        "--noise-scale-every", str(plan.noise_every),
        *(x for shard in plan.corpus.shards for x in ("--data", shard)),
    ]  # fmt: skip
    held_before = 0.0
    if plan.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(plan.device)
        held_before = (total - free) / 2**20
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"B": B, "error": f"timed out after {timeout:.0f} s"}
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        oom = "out of memory" in proc.stderr.lower() or proc.returncode == -signal.SIGKILL
        return {"B": B, "error": tail[0], "out_of_memory": oom, "wall_s": wall}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r.get("peak_device_reserved_mb") is not None:
        outside = r.get("device_outside_allocator_mb", 0.0)  # (everyone's, the probe's too)
        mem = r["peak_device_reserved_mb"] + max(outside - held_before, 0.0)
    else:
        mem = r.get("peak_rss_mb")
    return {
        "B": B,
        "memory_mb": mem,
        **({"held_before_mb": held_before} if plan.device.type == "cuda" else {}),
        "noise_windows": r.get("noise_windows"),
        "bytes_per_s": r.get("bytes_per_s"),
        "wall_s": wall,
        "startup_s": max(wall - r.get("measured_s", 0.0) - r.get("warmup_s", 0.0), 0.0),
    }


# ---- the trainer, for real -------------------------------------------------------------------


def scratch_argv(plan: RunPlan, out: Path, overrides: dict[str, object]) -> list[str]:
    """The planned run as a new run's command line in `out`: its configuration in force (the
    plan's `run_config`: a resume's values come from its checkpoint, the model config is the
    run's), its length in ticks, no other lifecycle flag, and `overrides` (dest -> value)
    applied."""
    c = plan.run_config.replace(total_ticks=plan.total, total_bytes=None, **overrides)
    if c.data.corpus:
        c = c.replace(data=None)  # (--corpus names the shards)
    if plan.val is None:
        c = c.replace(val="")  # off, even where --corpus would bring its val
    if c.logging.tensorboard:
        c = c.replace(tensorboard=TB_IN_RUN)  # in the scratch run's folder
    return c.to_argv(every=True) + lifecycle_argv(Lifecycle(output_dir=str(out)))


class TrainerProcess:
    """`python -m atom_train.train ARGV` in its own session (so SIGKILL takes its whole
    process group), output to `log`: the probes drive the trainer itself (and so its one
    loop, trainer/loop.py), not a loop of their own."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:  # (the child has its own copy of the descriptor)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "atom_train.train", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.t0 = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def last_line(self) -> str:
        lines = [x for x in self.output().splitlines() if x.strip()]
        return lines[-1] if lines else "no output"


MIN_ROWS = 5  # progress rows in the measured launch: the first (the start) + 4 to compare


def wait_until(cond: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    """Poll `cond` until it holds (True) or `timeout` seconds pass (False)."""
    end = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(poll)


def _status(run: Path) -> str | None:
    try:
        return json.loads((run / STATUS).read_text()).get("status")
    except (OSError, ValueError):
        return None


def _ckpt_tick(run: Path) -> int | None:
    try:
        return int(read_metadata(run / ROLLING)["training"]["tick"])
    except (CheckpointError, KeyError, TypeError, ValueError, OSError):
        return None


def progress_rows(run: Path) -> list[dict]:
    """progress.tsv's rows (the last one for a tick wins), or none yet."""
    from atom_train.common.cli import UserError

    try:
        p = read_progress(run / PROGRESS)
    except UserError:
        return []
    return [p.row(i) for i in range(len(p))]


def loss_lines(run: Path) -> list[dict]:
    """The scratch run's loss.jsonl (small: seconds of a run), every line parsed."""
    out = []
    with contextlib.suppress(OSError), open(run / "loss.jsonl", encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _last_step_tick(run: Path) -> int:
    ticks = [x["tick"] for x in loss_lines(run) if "event" not in x and "tick" in x]
    return max(ticks, default=0)


def compare_resume(lines: list[dict]) -> dict:
    """The killed launch's step lines against the resumed launch's at the same ticks (the
    steps after the checkpoint, done twice). Lines before the last ``resume`` event are the
    killed launch's."""
    cut = max((i for i, x in enumerate(lines) if x.get("event") == "resume"), default=None)
    if cut is None:
        return {"resumed": False, "error": "no resume event in loss.jsonl"}
    before = {x["tick"]: x["loss"] for x in lines[:cut] if "event" not in x and "loss" in x}
    after = {x["tick"]: x["loss"] for x in lines[cut + 1 :] if "event" not in x and "loss" in x}
    overlap = sorted(before.keys() & after.keys())
    return {
        "resumed": True,
        "resumed_from": lines[cut].get("tick"),
        "killed_at": max(before, default=0),
        "overlap": [(t, before[t], after[t]) for t in overlap],
    }


def _has_event(run: Path, kind: str, after: int = 0) -> bool:
    return any(x.get("event") == kind for x in loss_lines(run)[after:])


# A start that takes longer than this (imports, the model, a resident corpus) is a failure.
START_TIMEOUT_S = 300.0


def exercise_trainer(
    plan: RunPlan, scratch: Path, budget_s: float, ticks_per_s: float, say
) -> dict:
    """The planned command in `scratch`/run for about `budget_s` once it runs (the starts
    come on top): launch A with checkpoints, a validation and a sample falling inside its
    time and progress rows every ~1/60 of it; a second trainer is refused by the lock;
    SIGUSR1 after its first checkpoint, midway; SIGKILL at its end, once it has logged steps
    past its newest checkpoint; launch B resumes and is stopped by SIGTERM once it has redone
    those steps. Each stage waits for what it needs (rows, a checkpoint), up to twice its
    share of the time: a slow machine takes longer rather than measuring nothing."""
    run = scratch / "run"
    K = plan.window_schedule.K
    t_a = 0.75 * budget_s  # A's time once it runs; B redoes at most ~1/5 of it

    windows = ticks_per_s * t_a / K  # A's windows, as the probe's rate expects them

    def every(share: float, least: int) -> int:
        """A period of `share` of A's windows, at least `least` windows (on a machine far
        slower than expected, a validation at every window would be all A does)."""
        return K * max(least, math.ceil(windows * share))

    settings = {
        # Rows often (merged into intervals afterwards): a machine ten times slower than the
        # probe said still logs a few.
        "log_every": every(1 / 60, 1),
        "ckpt_every": every(0.2, 2),
        "snapshot_every": 0,
        "val_every": every(0.4, 4),
        "sample_every": every(0.5, 4) if plan.periods.sample else 0,
        "loss_log_rate": 0.0,  # a line per step: the resume is compared step by step
        # The divergence guard says what it sees but does not rewind: a rewind (the scratch
        # run memorising a small corpus can set off the val rule, depending on how far the
        # machine's speed lets it get between validations) moves the streams and lowers the
        # rate, and the redone steps would differ from the killed launch's for that reason.
        "on_divergence": "warn",
    }
    argv = scratch_argv(plan, run, settings)
    out: dict = {"settings": settings, "argv": argv}
    say(f"the trainer, as planned, in {run} (~{budget_s:.0f} s once it runs)")
    a = TrainerProcess(argv, scratch / "trainer-1.log")
    b: TrainerProcess | None = None
    try:
        if not wait_until(lambda: _status(run) == "running" or not a.alive, START_TIMEOUT_S):
            return {**out, "error": f"the trainer did not start in {START_TIMEOUT_S:.0f} s"}
        if not a.alive:
            return {**out, "error": f"the trainer exited {a.proc.returncode}: {a.last_line()}"}
        t_run = time.monotonic()
        out["start_s"] = t_run - a.t0
        # The lock: a second trainer on a folder in use is refused.
        lock = RunLock(run)
        try:
            lock.acquire()
            lock.release()
            out["second_refused"] = False
        except RunDirError:
            out["second_refused"] = True
        # SIGUSR1 midway, after the first checkpoint: one more, and training goes on.
        wait_until(
            lambda: (
                not a.alive
                or (_ckpt_tick(run) is not None and time.monotonic() >= t_run + 0.55 * t_a)
            ),
            2 * t_a,
        )
        before = _ckpt_tick(run)
        t_usr1 = time.monotonic()
        a.send(signal.SIGUSR1)
        if (
            wait_until(
                lambda: (
                    not a.alive
                    or ("SIGUSR1: checkpoint at tick" in a.output() and _ckpt_tick(run) != before)
                ),
                max(60.0, t_a),
            )
            and a.alive
        ):
            out["usr1_s"] = time.monotonic() - t_usr1

        # The end of A: its time, enough rows, and steps logged past its newest checkpoint,
        # seen with A frozen (SIGSTOP) before the kill: a checkpoint renamed between a
        # check and the kill (its steps were logged just before) would leave B, resuming from
        # it, no step of A's to redo.
        def ended() -> bool:
            return (
                time.monotonic() >= t_run + t_a
                and len(progress_rows(run)) >= MIN_ROWS
                and _last_step_tick(run) > (_ckpt_tick(run) or 0)
            )

        end = time.monotonic() + 2 * t_a
        while True:
            wait_until(lambda: not a.alive or ended(), max(end - time.monotonic(), 0.0))
            a.send(signal.SIGSTOP)
            if not a.alive or ended() or time.monotonic() >= end:
                break
            a.send(signal.SIGCONT)
        out["rows"] = progress_rows(run)
        if not a.alive:
            return {**out, "error": f"the trainer ended first (exit {a.proc.returncode}, "
                    f"status {_status(run)!r}): {a.last_line()}"}  # fmt: skip
        a.kill()
        a.wait(30)
        killed_at = _last_step_tick(run)
        n_lines = len(loss_lines(run))
        # B: the same command resumes; SIGTERM once it redid A's steps after the checkpoint.
        b = TrainerProcess(argv, scratch / "trainer-2.log")
        if not wait_until(
            lambda: not b.alive or _has_event(run, "resume", n_lines), START_TIMEOUT_S
        ):
            return {**out, "error": f"the resumed trainer did not start in {START_TIMEOUT_S:.0f} s"}
        out["resume_start_s"] = time.monotonic() - b.t0

        def redone() -> bool:
            pairs = compare_resume(loss_lines(run)).get("overlap") or [(0,)]
            return pairs[-1][0] >= killed_at

        wait_until(lambda: not b.alive or redone(), max(60.0, t_a))
        t_term = time.monotonic()
        b.send(signal.SIGTERM)
        code = b.wait(max(120.0, t_a))
        out.update(
            term_s=time.monotonic() - t_term,
            term_exit=code,
            term_status=_status(run),
            resume={**compare_resume(loss_lines(run)), "killed_at": killed_at},
        )
        return out
    finally:
        for t in (a, b):
            if t is not None and t.alive:
                t.kill()
                t.wait(30)


def run_sizes(run: Path) -> dict:
    """Bytes per line of the scratch run's logs, and its checkpoint's size."""
    rows = progress_rows(run)
    sizes: dict = {"rows": len(rows)}
    with contextlib.suppress(OSError):
        sizes["ckpt_bytes"] = (run / ROLLING).stat().st_size
    with contextlib.suppress(OSError):
        text = (run / PROGRESS).read_text()
        body = [x for x in text.splitlines() if x and not x.startswith("tick\t")]
        sizes["progress_row"] = math.ceil(sum(len(x) + 1 for x in body) / max(len(body), 1))
    with contextlib.suppress(OSError):
        lines = (run / SAMPLES).read_text().splitlines()
        if lines:
            sizes["sample_line"] = math.ceil(sum(len(x.encode()) + 1 for x in lines) / len(lines))
    tb = run / TB_DIR
    if tb.is_dir() and rows:
        sizes["tensorboard_row"] = math.ceil(
            sum(p.stat().st_size for p in tb.rglob("*") if p.is_file()) / len(rows)
        )
    return sizes


def checkpoint_io(path: Path, scratch: Path) -> dict:
    """Load a checkpoint of the run's size cold (page cache dropped) and write it again
    through the trainer's own writer (serialise, fsync, read back and verify, rename)."""
    drop_from_cache([path])
    t0 = time.perf_counter()
    ck = load_checkpoint(path)
    load_s = time.perf_counter() - t0
    probe = scratch / "io-probe.safetensors"
    t0 = time.perf_counter()
    save_checkpoint(probe, ck.tensors, ck.meta)
    write_s = time.perf_counter() - t0
    size = probe.stat().st_size
    probe.unlink()
    return {"ckpt_bytes": size, "load_s": load_s, "write_s": write_s}


# ---- the launch --------------------------------------------------------------------------------

BACKOFF = (0.5, 1.0)  # the probe's back-off: 0.5 s, doubling to 1 s; then it gives up


def measure_backoff(scratch: Path, timeout: float = 60.0) -> dict:
    """The supervisor (``python -m atom_train.supervise``, started as `nohup` starts it:
    SIGHUP ignored, its own session, no terminal) with a trainer that crashes at once
    (`preflight.crash_probe`); a SIGUSR1 arrives during its first back-off. Returns the gaps
    between launches and the back-offs asked for."""
    folder = scratch / "supervisor"
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "atom_train.supervise", "--module", "atom_train.preflight.crash_probe",
        "--backoff", str(BACKOFF[0]), "--max-backoff", str(BACKOFF[1]),
        "--max-failures", str(len(BACKOFF) + 1), "--", "--output-dir", str(folder),
    ]  # fmt: skip
    launches = folder / LAUNCHES

    def starts() -> list[float]:
        try:
            return [json.loads(x)["t"] for x in launches.read_text().splitlines() if x.strip()]
        except (OSError, ValueError, KeyError):
            return []

    with open(folder / "supervisor.out", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        )  # fmt: skip
        try:
            if wait_until(lambda: len(starts()) >= 1 or proc.poll() is not None, timeout, 0.01):
                time.sleep(BACKOFF[0] / 3)  # inside the first back-off
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGUSR1)
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"the supervisor did not finish in {timeout:.0f} s"}
        finally:
            if proc.poll() is None:  # (timed out, or the pre-flight itself was stopped)
                proc.kill()
                proc.wait()
    t = starts()
    return {
        "launches": len(t),
        "gaps_s": [b - a for a, b in itertools.pairwise(t)],
        "asked_s": list(BACKOFF),
        "exit_code": code,
    }


def on_complete_probe(cmd: str | None) -> tuple[bool | None, bool | None]:
    """Whether --on-complete's program is on PATH, and, when it starts with sudo, whether
    sudo runs without a password (``sudo -n true``); nothing of the command itself runs."""
    if not cmd:
        return None, None
    try:
        words = shlex.split(cmd)
    except ValueError:
        return False, None
    if not words:
        return False, None
    program = words[0]
    found = shutil.which(program) is not None or program in ("exec", "true", "false", ":")
    sudo_ok = None
    if program == "sudo" and found:
        try:
            sudo_ok = (
                subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=10).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            sudo_ok = False
    return found, sudo_ok
