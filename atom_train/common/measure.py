"""Measuring speed and memory honestly: shared by the benchmarks and the trainer.

A lesson from long runs: a short benchmark and a long run are different measurements. So a
measurement here always says how long it measured, is cut into repeated intervals whose
spread is reported (a wide spread means the figure is not to be trusted yet), and memory is
the process's peak (VmHWM) or what the device held (torch's peak allocation and reservation,
and the memory outside torch's allocator), never a guess.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

# An interval spread (max - min) / median above this is flagged as wide.
WIDE_SPREAD = 0.25
# The share of a memory budget a measured configuration must leave free, and its floor in
# MiB: a long run's allocator fragments more than a short probe's (the bench's --max-mem-gb
# and the pre-flight's memory check).
SAFETY_MARGIN, SAFETY_MARGIN_MIN_MB = 0.05, 512


def usable_memory_mb(budget_mb: float) -> float:
    """What a measured configuration may use of `budget_mb`: the safety margin left free."""
    return budget_mb - max(SAFETY_MARGIN * budget_mb, SAFETY_MARGIN_MIN_MB)


def _status_mb(key: str) -> float | None:
    """A memory line of /proc/self/status (Linux), in MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB. VmHWM, because ru_maxrss survives exec:
    a child would report its parent's peak."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_peak_mb(device) -> float | None:
    """torch's peak allocated memory on a CUDA device in MiB (None elsewhere)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def device_memory_mb(device) -> dict[str, float] | None:
    """What a CUDA device holds for this process, in MiB (None elsewhere): ``peak_reserved``
    (the most torch's caching allocator held from the device: allocated tensors plus its
    cached blocks; a budget must cover this, not the allocated peak) and
    ``outside_allocator`` (what the device holds beyond that allocator now: the CUDA
    context, library workspaces and handles, loaded kernel modules such as Triton's; read
    as used - reserved, so on a GPU shared with other processes it counts theirs too)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    return {
        "peak_reserved": torch.cuda.max_memory_reserved(device) / 2**20,
        "outside_allocator": max(0, total - free - reserved) / 2**20,
    }


def spread_of(rates: list[float]) -> float:
    """(max - min) / median of per-interval rates (0 for fewer than two)."""
    if len(rates) < 2:
        return 0.0
    med = statistics.median(rates)
    return (max(rates) - min(rates)) / med if med > 0 else float("inf")


def measure(
    work: Callable[[], int],
    seconds: float,
    *,
    warmup_calls: int = 1,
    warmup_s: float = 0.0,
    intervals: int = 5,
    sync: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Call `work()` (which returns the bytes it processed) repeatedly: first `warmup_calls`
    calls and at least `warmup_s` seconds untimed, then for `seconds`, cut into `intervals`
    intervals of equal length (each at least one call). `sync` (e.g. a CUDA synchronize)
    runs at every interval boundary so queued device work is counted where it ran.

    Returns bytes_per_s (over the whole measurement), the per-interval bytes_per_s_min /
    _median / _max and their spread, wide_spread, measured_s, warmup_s, calls, cpu_s and
    bytes_per_cpu_s (process CPU time, all threads)."""
    sync = sync or (lambda: None)
    t0 = time.perf_counter()
    calls = 0
    while calls < warmup_calls or time.perf_counter() - t0 < warmup_s:
        work()
        calls += 1
    sync()
    warm = time.perf_counter() - t0
    per = seconds / max(1, intervals)
    rates, total_bytes, calls = [], 0, 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(max(1, intervals)):
        i0, n = time.perf_counter(), 0
        while True:
            n += work()
            calls += 1
            if time.perf_counter() - i0 >= per:
                break
        sync()
        rates.append(n / (time.perf_counter() - i0))
        total_bytes += n
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    spread = spread_of(rates)
    return {
        "bytes_per_s": total_bytes / wall,
        "bytes_per_s_min": min(rates),
        "bytes_per_s_median": statistics.median(rates),
        "bytes_per_s_max": max(rates),
        "spread": spread,
        "wide_spread": spread > WIDE_SPREAD,
        "intervals": len(rates),
        "measured_s": wall,
        "warmup_s": warm,
        "calls": calls,
        "bytes_measured": total_bytes,
        "cpu_s": cpu,
        "bytes_per_cpu_s": total_bytes / cpu if cpu > 0 else float("nan"),
    }


class StepClock:
    """The phases of each training window (by default compute = forward + backward, then
    optimizer; a distributed trainer times the all-reduce apart: compute, allreduce,
    optimizer), timed without stalling the device: perf_counter on a CPU, CUDA events on a
    GPU, whose times are read only by `read()` (at log ticks, where the trainer reads device
    values anyway). A window is `start()`, then one `mark()` at the end of each phase.

    On a GPU a window's events are folded into the sums as soon as the GPU has passed them
    (`Event.query()`, which does not wait), at the start of each window: the events held stay
    the few windows the GPU is behind, however long the interval between two reads. (Should
    the host ever run `MAX_PENDING` windows ahead, it waits for the GPU there.)"""

    PHASES = ("compute", "optimizer")
    MAX_PENDING = 64

    def __init__(self, device, phases: tuple[str, ...] = PHASES) -> None:
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.phases = tuple(phases)
        self._marks: list[list] = []  # per window not yet folded: [start, after each phase]
        self._sums = dict.fromkeys(self.phases, 0.0)

    def _now(self):
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self._fold(wait=len(self._marks) >= self.MAX_PENDING)
        self._marks.append([self._now()])

    def mark(self) -> None:
        """End of the current phase of the current window."""
        self._marks[-1].append(self._now())

    @property
    def pending(self) -> int:
        """Windows whose marks are held, not yet folded into the sums."""
        return len(self._marks)

    def _fold(self, wait: bool) -> None:
        """Add the finished windows' phases to the sums and drop their marks (wait: for the
        device to finish them all; else only those it has finished, in order)."""
        done = 0
        for marks in self._marks:
            if len(marks) <= len(self.phases):
                break  # the window in progress
            if self.cuda:
                if wait:
                    marks[-1].synchronize()
                elif not marks[-1].query():  # events complete in stream order
                    break
            for name, a, b in zip(self.phases, marks, marks[1:], strict=False):
                self._sums[name] += a.elapsed_time(b) / 1000 if self.cuda else b - a
            done += 1
        del self._marks[:done]

    def read(self) -> dict[str, float]:
        """Seconds per phase summed over the windows since the last read."""
        self._fold(wait=True)
        out, self._sums = self._sums, dict.fromkeys(self.phases, 0.0)
        return out
