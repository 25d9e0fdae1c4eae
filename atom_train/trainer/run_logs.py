"""Reading a run folder's logs: progress.tsv (`read_progress`), the lifecycle events
(`read_loss_log`: events.jsonl, or a format-1 loss.jsonl's event lines; the step lines are
`trainer.loss_log`'s readers), samples.jsonl (`read_samples`), and a whole folder
(`read_run`). The plot and the TensorBoard conversion read runs through here.

Every reader is tolerant of what a long run leaves behind: a header repeated by a resume
(and new columns), a line torn by a kill, rows rewritten after a resume (the last row for a
tick wins, as the weights came from it). Standard library only.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from atom_train.common.cli import UserError
from atom_train.trainer.loss_log import read_events
from atom_train.trainer.rundir import PROGRESS, SAMPLES

REQUIRED = ("tick", "bytes_seen")


@dataclass
class Progress:
    """Columns of a progress.tsv, one value per distinct tick, sorted by tick (NaN = empty)."""

    columns: dict[str, list[float]] = field(default_factory=dict)
    skipped: int = 0  # lines that could not be parsed

    def __len__(self) -> int:
        return len(self.columns.get("tick", []))

    def get(self, name: str) -> list[float] | None:
        values = self.columns.get(name)
        if values is None or all(math.isnan(v) for v in values):
            return None
        return values

    def points(self, name: str) -> list[tuple[float, float]]:
        """(bytes seen, value) of the rows where `name` has a value."""
        y = self.columns.get(name, [])
        x = self.columns["bytes_seen"]
        return [(a, b) for a, b in zip(x, y, strict=False) if not math.isnan(b)]

    def row(self, i: int) -> dict[str, float]:
        return {name: values[i] for name, values in self.columns.items()}


def _number(text: str) -> float:
    text = text.strip()
    return float(text) if text else math.nan


def read_progress(path: Path) -> Progress:
    """Parse progress.tsv, a line at a time (the rows are kept, the file's text is not);
    raises UserError when it holds no usable row."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return _parse_progress(f, path)
    except FileNotFoundError:
        raise UserError(f"{path} not found: is this a run's --output-dir?") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None


def _parse_progress(lines, path: Path) -> Progress:
    header: list[str] | None = None
    rows: dict[float, dict[str, float]] = {}
    names: list[str] = []
    skipped = 0
    seen_text = False
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        seen_text = True
        fields = line.rstrip("\r").split("\t")
        if fields[0].strip() == "tick":
            # A resumed run appends its header again; it may even add columns.
            header = [f.strip() for f in fields]
            names.extend(n for n in header if n not in names)
            continue
        if header is None or len(fields) != len(header):
            skipped += 1
            continue
        try:
            values = {n: _number(v) for n, v in zip(header, fields, strict=True)}
        except ValueError:
            skipped += 1
            continue
        if math.isnan(values["tick"]) or math.isnan(values.get("bytes_seen", math.nan)):
            skipped += 1
            continue
        rows[values["tick"]] = values  # a repeated tick (resume): the last one wins
    if not seen_text:
        raise UserError(f"{path} is empty: the run has not logged a step yet (see --log-every)")
    if header is None:
        raise UserError(
            f"{path} has no header line ('tick<TAB>bytes_seen<TAB>...'): "
            "not a progress.tsv written by atom_train.train"
        )
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise UserError(f"{path}: header lacks column(s) {', '.join(missing)}")
    if not rows:
        raise UserError(f"{path} has a header but no readable row ({skipped} unreadable lines)")
    ticks = sorted(rows)
    columns = {n: [rows[t].get(n, math.nan) for t in ticks] for n in names}
    return Progress(columns, skipped)


# ---- a run folder's logs -----------------------------------------------------------------


@dataclass
class LossLog:
    """What a run's logs say beyond progress.tsv: the lifecycle events (``start``,
    ``resume``, ``pivot``, ``fork``, ``val``) in order."""

    events: list[dict] = field(default_factory=list)


def read_loss_log(folder: Path) -> LossLog:
    """A run folder's events (`loss_log.read_events`: events.jsonl, or for a folder of format
    1 the event lines of its loss.jsonl, its step lines skipped unparsed); none for a folder
    without logs (a progress.tsv passed alone)."""
    try:
        return LossLog(read_events(folder))
    except OSError as e:
        raise UserError(f"cannot read the logs in {folder}: {e}") from None


def describe_changes(changes: dict) -> str:
    """Changed flags ({flag: [old, new]}), for people: ``lr 0.002 -> 0.001, bptt 64 -> 32``;
    an empty or missing value (a flag turned off, e.g. ``--val ''``) reads ``(none)``."""

    def show(v: object) -> str:
        return "(none)" if v in ("", None) else str(v)

    return ", ".join(f"{k} {show(old)} -> {show(new)}" for k, (old, new) in changes.items())


@dataclass
class Run:
    """One run folder as the plot reads it."""

    folder: Path
    name: str  # its label: the folder's name
    progress: Progress
    log: LossLog

    @property
    def B(self) -> int:
        """Streams: bytes seen per tick (the same on every row of one run)."""
        c = self.progress.columns
        for tick, seen in zip(c["tick"], c["bytes_seen"], strict=True):
            if tick > 0:
                return round(seen / tick)
        return 1

    @property
    def fork(self) -> dict | None:
        """The ``fork`` event this run began with, if it is a fork."""
        first = next((e for e in self.log.events if e.get("event") in ("start", "fork")), None)
        return first if first is not None and first["event"] == "fork" else None

    @property
    def pivots(self) -> list[dict]:
        return [e for e in self.log.events if e.get("event") == "pivot" and e.get("changes")]

    def value_at(self, name: str, tick: int) -> float | None:
        """The column's value on the last row at or before `tick` that has one."""
        c = self.progress.columns
        best = None
        for t, v in zip(c["tick"], c.get(name, []), strict=False):
            if t <= tick and not math.isnan(v):
                best = v
        return best


def read_run(path: Path) -> Run:
    """A run folder (or its progress.tsv): UserError when it cannot be plotted."""
    if not path.exists():
        raise UserError(f"{path} does not exist: pass a run's --output-dir")
    tsv = path if path.is_file() else path / PROGRESS
    folder = tsv.parent
    progress = read_progress(tsv)
    if progress.skipped:
        print(f"warning: skipped {progress.skipped} unreadable line(s) in {tsv}", file=sys.stderr)
    return Run(folder, folder.resolve().name, progress, read_loss_log(folder))


def read_samples(folder: Path) -> list[dict]:
    """samples.jsonl's samples (tick, prompt, sample, time); torn lines skipped."""
    out = []
    try:
        lines = (folder / SAMPLES).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "tick" in obj and "sample" in obj:
            out.append(obj)
    return out
