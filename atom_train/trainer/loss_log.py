"""loss.jsonl, bounded by time, and events.jsonl: how a run's per-step record is written and
read back (the run folder's format 2; docs/checkpoints.md, "The logs"). Standard library only.

**Step lines, bounded by time** (`StepLines`). One line per optimizer step while the run
makes at most ``--loss-log-rate`` steps per second (2 by default); faster, one line per
1/rate seconds aggregates that slot's steps exactly: their count, first and last step and
tick, and the mean, min and max of ``loss``, ``train_bpb`` and ``grad_norm``. So the file
grows with the run's wall time, never faster than the rate, whatever the speed (one line per
step at 300 steps/s was 2.6 GB a day). A slot never spans a checkpoint (every checkpoint
closes the open slot first), so the file always holds every step up to the newest checkpoint,
and after a resume the steps since that checkpoint are written again (the later line wins).

**Events** (`EventLog`): ``start``, ``resume``, ``pivot``, ``fork`` and ``val`` lines go to
``events.jsonl`` (a few lines per launch: what readers look for) and then, as always, to
loss.jsonl, where they stay their own lines, in order with the steps. A folder written
before events.jsonl existed (format 1) gets it on its first launch by this code, from one
scan of its loss.jsonl; readers of a folder without it scan loss.jsonl (`read_events`).

**Readers stream**: `read_events` reads events.jsonl (or skips format 1's step lines
unparsed), `read_grad_norms` keeps only the ticks asked for, `iter_step_lines` yields one
line at a time; none holds more than a line of the file. Keys of format 1 (``bpb``,
``gnorm``, ``bytes``) read as format 2's (``train_bpb``, ``grad_norm``, ``bytes_seen``).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from atom_train.common.atomic import atomic_write
from atom_train.common.metrics import renamed
from atom_train.trainer.rundir import EVENTS, LOSS_LOG, AppendLog, NullLog

# The most loss.jsonl lines per second (--loss-log-rate's default): a week is 1.2 M lines,
# about 0.3 GB, at any step rate.
DEFAULT_RATE = 2.0
METRICS = ("loss", "train_bpb", "grad_norm")  # what an aggregate line summarises
_DIGITS = 6  # values are written rounded to 6 decimals, as ever


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, _DIGITS)


class _Slot:
    """The steps of one slot, folded as their values arrive."""

    def __init__(self, step: int, tick: int) -> None:
        self.first_step, self.first_tick = step, tick
        self.step, self.tick, self.lr = step, tick, 0.0
        self.count = 0
        self.sum = dict.fromkeys(METRICS, 0.0)
        self.min: dict[str, float | None] = dict.fromkeys(METRICS)
        self.max: dict[str, float | None] = dict.fromkeys(METRICS)
        self.values: dict[str, float | None] = {}  # the last step's (a slot of one is a step)
        self.missing: set[str] = set()  # metrics some step lacked (grad_norm: clipping off)
        self.extra: dict = {}  # the newest measurement's fields (the noise scale's)

    def fold(
        self,
        step: int,
        tick: int,
        lr: float,
        values: dict[str, float | None],
        extra: dict | None = None,
    ) -> None:
        self.step, self.tick, self.lr, self.values = step, tick, lr, values
        if extra:
            self.extra = extra
        self.count += 1
        for k in METRICS:
            v = values.get(k)
            if v is None:
                self.missing.add(k)
                continue
            self.sum[k] += v
            self.min[k] = v if self.min[k] is None else min(self.min[k], v)
            self.max[k] = v if self.max[k] is None else max(self.max[k], v)


class StepLines:
    """Optimizer steps into loss.jsonl lines, at most `rate` lines per second of wall time
    (0: a line per step). `mark()` at each step (when it is taken: the clock decides its
    slot), `write()` when its values are known (later: they wait on the device), `close()`
    to write the open slot (before a checkpoint, at the end)."""

    def __init__(
        self,
        write_json: Callable[[dict], None],
        B: int,
        rate: float = DEFAULT_RATE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write_json, self.B, self.clock = write_json, B, clock
        self.period = 1.0 / rate if rate > 0 else 0.0
        self._slot_id = 0
        self._slot_t0: float | None = None  # when the newest slot began (None: none open)
        self._open: tuple[int, _Slot] | None = None  # the slot whose values are arriving

    def mark(self) -> int:
        """The slot of the step being taken now."""
        now = self.clock()
        # (at rate 0 every step is written at once, whatever its slot)
        if self._slot_t0 is None or now - self._slot_t0 >= self.period:
            self._slot_id += 1
            self._slot_t0 = now
        return self._slot_id

    def write(
        self,
        slot: int,
        step: int,
        tick: int,
        lr: float,
        values: dict[str, float | None],
        extra: dict | None = None,
    ) -> None:
        """A step's values (``loss``, ``train_bpb``, ``grad_norm``; None: not measured), in
        step order; the slot before it is written as soon as this one begins. `extra`: a
        measurement taken at this step (the noise scale's fields), written in its line: a
        step's own, or its slot's aggregate, which holds the slot's newest measurement."""
        if self._open is not None and self._open[0] != slot:
            self._emit()
        if self._open is None:
            self._open = (slot, _Slot(step, tick))
        self._open[1].fold(step, tick, lr, values, extra)
        if self.period <= 0:
            self._emit()  # (a line per step: no slot to wait for)

    def close(self) -> None:
        """Write the open slot now; the next step begins a new one."""
        self._emit()
        self._slot_t0 = None

    def _emit(self) -> None:
        if self._open is None:
            return
        s = self._open[1]
        self._open = None
        if s.count == 1:
            v = s.values
            line = step_line(
                s.step, s.tick, self.B, s.lr, v["loss"], v["train_bpb"], v.get("grad_norm")
            )
        else:
            line = aggregate_line(s, self.B)
        self.write_json({**line, **s.extra})


# ---- the line formats (the log benchmark writes them too) ------------------------------------


def step_line(
    step: int, tick: int, B: int, lr: float, loss: float, train_bpb: float, grad_norm: float | None
) -> dict:
    """One optimizer step's line (format 2)."""
    return {
        "step": step,
        "tick": tick,
        "bytes_seen": tick * B,
        "loss": _round(loss),
        "train_bpb": _round(train_bpb),
        "lr": lr,
        "grad_norm": _round(grad_norm),
    }


def aggregate_line(s: _Slot, B: int) -> dict:
    """One slot of several steps (format 2): count, first and last step and tick, the last
    step's lr, and mean, min, max of each metric (None when a step lacked it)."""
    line: dict = {
        "step": s.step,
        "first_step": s.first_step,
        "count": s.count,
        "tick": s.tick,
        "first_tick": s.first_tick,
        "bytes_seen": s.tick * B,
        "lr": s.lr,
    }
    for k in METRICS:
        whole = k not in s.missing
        line[f"{k}_mean"] = _round(s.sum[k] / s.count) if whole else None
        line[f"{k}_min"] = _round(s.min[k]) if whole else None
        line[f"{k}_max"] = _round(s.max[k]) if whole else None
    return line


# ---- events ----------------------------------------------------------------------------------


class EventLog:
    """A run's lifecycle events: each goes to events.jsonl first (what readers read), then
    to loss.jsonl (the complete record, in order with the steps). A crash between the two
    writes leaves the event in events.jsonl only: it is the authority on events."""

    def __init__(self, folder: Path, loss_log: AppendLog | NullLog) -> None:
        self.folder, self.loss_log = folder, loss_log
        # (opened at the first event: a rerun of a finished run writes nothing; the ranks
        # other than 0 write nowhere)
        self._events: AppendLog | NullLog | None = (
            NullLog() if isinstance(loss_log, NullLog) else None
        )

    def write(self, event: dict) -> None:
        if self._events is None:
            self._events = open_events(self.folder)
        self._events.write_json(event)
        self.loss_log.write_json(event)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()


def open_events(folder: Path) -> AppendLog:
    """events.jsonl for appending; in a format-1 folder (a loss.jsonl, no events.jsonl) it is
    first made, atomically, from the events of one scan of loss.jsonl."""
    path, loss = folder / EVENTS, folder / LOSS_LOG
    if not path.exists() and loss.exists() and loss.stat().st_size:
        old = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in scan_events(loss))
        atomic_write(path, old.encode())
    return AppendLog(path)


def _parse(line: str) -> dict | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None  # a line torn by a crash
    return obj if isinstance(obj, dict) else None


def _read(path: Path):
    """A log for reading: UTF-8 whatever the locale, a byte that is not read as U+FFFD."""
    return open(path, encoding="utf-8", errors="replace")


def scan_events(loss_log: Path) -> Iterator[dict]:
    """The events of a loss.jsonl, streamed; step lines are skipped unparsed (an event line
    is the only kind that holds the key "event")."""
    with _read(loss_log) as f:
        for line in f:
            if '"event"' in line:
                obj = _parse(line)
                if obj is not None and "event" in obj:
                    yield obj


def read_events(folder: Path) -> list[dict]:
    """A run folder's events in order: its events.jsonl (format 2), or the event lines of its
    loss.jsonl (format 1); none for a folder with neither."""
    path = folder / EVENTS
    if path.exists():
        with _read(path) as f:
            return [e for e in map(_parse, f) if e is not None and "event" in e]
    loss = folder / LOSS_LOG
    return list(scan_events(loss)) if loss.exists() else []


# ---- step lines ------------------------------------------------------------------------------


def iter_step_lines(loss_log: Path) -> Iterator[dict]:
    """Every step and aggregate line of a loss.jsonl, in file order, under today's names (`metrics.renamed`); events
    and torn lines skipped. One line in memory at a time."""
    with _read(loss_log) as f:
        for line in f:
            if '"event"' in line:
                continue
            obj = _parse(line)
            if obj is not None and "tick" in obj and "step" in obj:
                yield renamed(obj)


_TICK = re.compile(r'"tick":\s*(\d+)')


def read_grad_norms(loss_log: Path, ticks: Collection[int]) -> dict[int, float]:
    """The gradient norm of the step that ended at each of `ticks` (a progress row's), where
    loss.jsonl has that step's own line (the last line for a tick wins: a resume rewrites
    the steps after its checkpoint). Only lines at those ticks are parsed and kept: memory
    grows with len(ticks), not with the file."""
    wanted = set(ticks)
    out: dict[int, float] = {}
    if not wanted or not loss_log.exists():
        return out
    with _read(loss_log) as f:
        for line in f:
            m = _TICK.search(line)
            if m is None or int(m.group(1)) not in wanted or '"event"' in line:
                continue
            obj = _parse(line)
            if obj is None or "count" in obj:
                continue  # an aggregate holds no single step's value
            g = renamed(obj).get("grad_norm")
            if isinstance(g, int | float) and math.isfinite(g):
                out[int(obj["tick"])] = float(g)
    return out


def line_bytes(line: dict) -> int:
    """A line's size in loss.jsonl (as `AppendLog.write_json` writes it)."""
    return len(json.dumps(line, separators=(",", ":"))) + 1


def typical_line_bytes(step: int, tick: int, B: int, per_slot: int) -> tuple[int, int]:
    """The size of a step line and of an aggregate line of `per_slot` steps late in a run
    (the slot's last at `step`, `tick`; tick / step ticks a window), with values of the
    written precision: what the disk projection counts per line."""
    v = {"loss": 1.234567, "train_bpb": 1.234567, "grad_norm": 0.123456}
    lr = 1.2345678901234e-3  # (a rate of as many digits as a float's repr)
    one = step_line(step, tick, B, lr, v["loss"], v["train_bpb"], v["grad_norm"])
    K = max(tick // max(step, 1), 1)
    slot = _Slot(max(step - per_slot + 1, 1), max(tick - (per_slot - 1) * K, 0))
    for _ in range(max(per_slot, 2)):
        slot.fold(step, tick, lr, v)
    return line_bytes(one), line_bytes(aggregate_line(slot, B))
