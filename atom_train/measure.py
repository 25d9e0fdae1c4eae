"""Measuring speed and memory honestly: shared by the benchmarks and the trainer.

Seed 004's lesson: a short benchmark and a long run are different measurements. So a
measurement here always says how long it measured, is cut into repeated intervals whose
spread is reported (a wide spread means the figure is not to be trusted yet), and memory is
the process's peak (VmHWM) or the device's peak allocation, never a guess.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

# An interval spread (max - min) / median above this is flagged as wide.
WIDE_SPREAD = 0.25


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
        "bytes": total_bytes,
        "cpu_s": cpu,
        "bytes_per_cpu_s": total_bytes / cpu if cpu > 0 else float("nan"),
    }


class StepClock:
    """The phases of each training window (compute = forward + backward, optimizer), timed
    without stalling the device: perf_counter on a CPU, CUDA events on a GPU, whose times are
    read only by `read()` (at log ticks, where the trainer reads device values anyway)."""

    PHASES = ("compute", "optimizer")

    def __init__(self, device) -> None:
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self._marks: list[list] = []  # per window: [start, after compute, after optimizer]

    def _now(self):
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self._marks.append([self._now()])

    def mark(self) -> None:
        """End of the current phase of the current window."""
        self._marks[-1].append(self._now())

    def read(self) -> dict[str, float]:
        """Seconds per phase summed over the windows since the last read."""
        out = dict.fromkeys(self.PHASES, 0.0)
        if self.cuda and self._marks:
            self._marks[-1][-1].synchronize()
        for marks in self._marks:
            for name, a, b in zip(self.PHASES, marks, marks[1:], strict=False):
                out[name] += a.elapsed_time(b) / 1000 if self.cuda else b - a
        self._marks.clear()
        return out
