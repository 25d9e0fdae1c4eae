"""Reading a run folder's logs: progress.tsv (`read_progress`), the lifecycle events
(`read_loss_log`: events.jsonl, or a format-1 loss.jsonl's event lines; the step lines are
`trainer.loss_log`'s readers), samples.jsonl (`read_samples`), and a whole folder
(`read_run`). The plot and the TensorBoard conversion read runs through here.

Every reader is tolerant of what a long run leaves behind: a header repeated by a resume
(and new columns), a line torn by a kill, rows rewritten after a resume (the last row for a
tick wins, as the weights came from it), and metric names of runs written before the names
were settled (`atom_train.common.metrics.OLD_NAMES`: read under today's names). Standard
library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atom_train.common.cli import UserError, quote, some_of, warn
from atom_train.common.metrics import current_name
from atom_train.trainer.loss_log import read_events
from atom_train.trainer.rundir import CHECKPOINT_SUFFIX, PROGRESS, SAMPLES

REQUIRED = ("tick", "bytes_seen")


@dataclass
class Progress:
    """Columns of a progress.tsv, one value per distinct tick, sorted by tick (NaN = empty)."""

    columns: dict[str, list[float]] = field(default_factory=dict)
    skipped: int = 0  # lines that could not be parsed
    added: int = 0  # rows made from `val` events (`add_val`), not in the file

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

    def add_val(self, tick: float, bytes_seen: float, val_bpb: float) -> None:
        """A validation logged as an event (an ``--init`` run's at tick 0, before any
        progress row) as the val_bpb of its tick: on the tick's row when it has none, or on
        a row of its own (the other columns empty); a row's own val_bpb wins."""
        c = self.columns
        c.setdefault("val_bpb", [math.nan] * len(self))
        ticks = c["tick"]
        if tick in ticks:
            i = ticks.index(tick)
            if math.isnan(c["val_bpb"][i]):
                c["val_bpb"][i] = val_bpb
            return
        i = next((j for j, t in enumerate(ticks) if t > tick), len(ticks))
        values = {"tick": tick, "bytes_seen": bytes_seen, "val_bpb": val_bpb}
        for name, column in c.items():
            column.insert(i, values.get(name, math.nan))
        self.added += 1


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
            # A resumed run appends its header again; it may even add or rename columns.
            header = [current_name(f.strip()) for f in fields]
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


LAUNCHES = ("start", "resume", "fork")  # the events a launch of the trainer begins with


def run_names(folders: Sequence[Path]) -> list[str]:
    """The label of each run (plot, eval, TensorBoard's run names): its folder's name, or,
    where two of these runs share a folder name, the folders as given."""
    names = [Path(f).resolve().name for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders, strict=True)]


def last_val_record(events: Sequence[dict], tick: float | None = None) -> tuple[bool, dict | None]:
    """What the val_bpb of a run scores at `tick` (None: its end): the val record of the last
    launch that began at or before it: (known, record); record None = no validation;
    known False = the launch's event has none (a run written before they were recorded)."""
    found: tuple[bool, dict | None] = (False, None)
    for e in events:
        if e.get("event") in LAUNCHES and (tick is None or e.get("tick", 0) <= tick):
            found = ("val" in e, e.get("val"))
    return found


def val_key(record: dict | None) -> tuple | None:
    """What makes two val_bpb numbers compare: the same text (file names and sizes) scored
    with the same bytes and streams."""
    if record is None:
        return None
    sig = tuple((s.get("name"), s.get("size")) for s in record.get("signature", []))
    return sig, record.get("val_bytes"), record.get("val_streams")


def describe_val_record(record: dict | None) -> str:
    """A val record for people: the text, its size, what is scored of it."""
    if record is None:
        return "no val"
    files = record.get("files") or [s.get("name") for s in record.get("signature", [])]
    names = some_of(files)
    size, n = record.get("size") or 0, record.get("val_bytes") or 0
    streams = record.get("val_streams")
    if isinstance(streams, int) and streams > 0:
        n = n // streams * streams  # what is scored: whole ticks of every stream
    text = f"{n:,} bytes of {names} ({size:,} bytes) by {streams} streams"
    if size and n > size:
        text += f": each byte scored {n / size:.1f} times over"
    return text


def val_differences(records: dict[str, tuple[bool, dict | None]]) -> str | None:
    """One line when these runs' val_bpb score different texts or settings (then they do
    not rank), naming what each scores; None when they compare."""
    known = {name: rec for name, (ok, rec) in records.items() if ok}
    keys = {val_key(rec) for rec in known.values()}
    if len(keys) <= 1:
        return None
    parts = "; ".join(f"{name}: {describe_val_record(rec)}" for name, rec in known.items())
    return f"their val_bpb score different text or settings, so they do not rank: {parts}"


@dataclass
class Run:
    """One run folder as the plot reads it."""

    folder: Path
    name: str  # its label (`run_names`)
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
    def init(self) -> dict | None:
        """The ``start`` event of a run initialised from a checkpoint (``--init``), if so."""
        first = next((e for e in self.log.events if e.get("event") in ("start", "fork")), None)
        return first if first is not None and first.get("init") else None

    @property
    def pivots(self) -> list[dict]:
        return [e for e in self.log.events if e.get("event") == "pivot" and e.get("changes")]

    def val_record(self) -> tuple[bool, dict | None]:
        """What the run's last val_bpb scores (`last_val_record`)."""
        return last_val_record(self.log.events)

    def settings(self) -> dict[str, object]:
        """The run's B and the training policy in force at its end (the last start, fork
        or pivot event's), for telling what differs between runs."""
        out: dict[str, object] = {"B": self.B}
        for e in self.log.events:
            if isinstance(e.get("policy"), dict):
                out.update(e["policy"])
        return out

    def value_at(self, name: str, tick: int) -> float | None:
        """The column's value on the last row at or before `tick` that has one."""
        c = self.progress.columns
        best = None
        for t, v in zip(c["tick"], c.get(name, []), strict=False):
            if t <= tick and not math.isnan(v):
                best = v
        return best


def read_run(path: Path, name: str | None = None) -> Run:
    """A run folder (or its progress.tsv): UserError when it cannot be plotted. `name`: its
    label (default: the folder's name)."""
    if not path.exists():
        raise UserError(f"{path} does not exist: pass a run's --output-dir")
    if path.is_file() and path.name.endswith(CHECKPOINT_SUFFIX):
        raise UserError(
            f"{path} is a checkpoint; plot reads a run's logs: pass its run folder "
            f"({quote(path.parent)})"
        )
    tsv = path if path.is_file() else path / PROGRESS
    folder = tsv.parent
    progress = read_progress(tsv)
    if progress.skipped:
        warn(f"skipped {progress.skipped} unreadable line(s) in {tsv}")
    label = name if name is not None else folder.resolve().name
    run = Run(folder, label, progress, read_loss_log(folder))
    B = run.B  # (from the file's rows: before any is added)
    for e in run.log.events:
        # The validations outside the progress rows: drawn and converted with the others.
        if e.get("event") == "val" and isinstance(e.get("val_bpb"), int | float):
            progress.add_val(float(e["tick"]), float(e["tick"]) * B, float(e["val_bpb"]))
    return run


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
