"""TensorBoard event files for a run: the trainer's ``--tensorboard [DIR]`` (live) and
``python -m atom_train.plot RUN --tensorboard DIR`` (a finished run, converted).

Both write the same thing, through the ``tensorboard`` package's writer (via
`torch.utils.tensorboard`; an optional dependency: ``pip install 'atom-train[tensorboard]'``):

- at each progress row, the row's numbers under the tags of `TAGS`: ``<group>/<name>``, the
  name being progress.tsv's column (`atom_train.common.metrics`: train/loss,
  train/train_bpb, val/val_bpb, train/grad_norm, train/lr, speed/bytes_per_s, time/...,
  memory/..., noise/b_simple and the noise scale's other estimates);
- the chat samples as text (``samples``);
- a marker (text under ``lifecycle/pivot`` or ``lifecycle/fork``) naming what changed.

**The step axis is bytes seen** (tick x B): the axis of progress.tsv's plot, of
`atom_train.eval`, and the one on which runs of different B compare.

A resume appends to the same folder without duplicating steps: each launch starts its event
file with TensorBoard's restart marker at the first step it will write (the checkpoint's
bytes seen + 1), and TensorBoard's reader drops what an earlier launch wrote from that step
on (rows logged after the checkpoint by a launch that then died), exactly as progress.tsv's
"the last row for a tick wins". A new run (no checkpoint yet) marks step 0: it starts over.
Rows are flushed as they are written, so what a killed trainer logged before its last
checkpoint is on disk. Only rank 0 writes (the `Reporter` holds the only log).
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Mapping
from pathlib import Path

from atom_train.common.cli import UserError
from atom_train.common.metrics import METRICS, tag
from atom_train.trainer.rundir import PROGRESS_COLUMNS, TB_DIR

IN_RUN = "RUN/tb"  # the flag's value when given without DIR (resolved by `log_dir`)
INSTALL = "pip install 'atom-train[tensorboard]'"

# progress.tsv column -> TensorBoard tag (every column but the axes: tick, bytes seen).
TAGS = {name: tag(name) for name in PROGRESS_COLUMNS if METRICS[name].group is not None}
SAMPLES_TAG = "samples"
MARKER_TAG = "lifecycle/{kind}"


def check_available(flag: str = "--tensorboard") -> None:
    """UserError (one line, with the install command) when the package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(f"{flag} needs the tensorboard package: {INSTALL}")


def log_dir(value: str | None, out: Path) -> Path | None:
    """The folder the trainer's ``--tensorboard [DIR]`` means (None: not given, or ``''``,
    which turns it off, e.g. on a resume of a run that had it), checked before anything
    runs."""
    if value is None or value == "":
        return None
    check_available()
    return out / TB_DIR if value == IN_RUN else Path(value)


def purge_step(mode: str, tick: int, B: int) -> int:
    """The first step this launch writes (see the module docstring): after the checkpoint
    it continues (resume, fork), or 0 for a run that starts at tick 0."""
    return tick * B + 1 if mode in ("resume", "fork") else 0


# TensorBoard reads a folder's event files in name order, and a name begins with the whole
# second its writer was made ("events.out.tfevents.<seconds>.<host>.<pid>..."): a launch that
# starts in the same second as the one before it (a crash at start-up, a quick relaunch)
# could sort before it, and the earlier launch's restart marker would then hide the later
# launch's rows. So a writer is made only once the clock is past the newest file's second.
_EVENTS_PREFIX = "events.out.tfevents."


def _after_the_newest_event_file(folder: Path) -> None:
    newest = -1
    for p in folder.glob(_EVENTS_PREFIX + "*") if folder.is_dir() else ():
        stamp = p.name[len(_EVENTS_PREFIX) :].split(".", 1)[0]
        if stamp.isdigit():
            newest = max(newest, int(stamp))
    wait = newest + 1 - time.time()
    if wait > 0:
        time.sleep(min(wait, 1.0))  # (at most a second: the newest file's is the latest)


class TensorBoardLog:
    """One launch's event file in `folder` (created if needed)."""

    def __init__(self, folder: Path, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        _after_the_newest_event_file(folder)
        self.writer = SummaryWriter(str(folder), purge_step=first_step)

    def row(self, step: int, values: Mapping[str, object], wall_time: float | None = None) -> None:
        """One progress row's numbers (None or NaN: no value this row), then flushed."""
        for column, name in TAGS.items():
            v = values.get(column)
            if isinstance(v, int | float) and math.isfinite(v):
                self.writer.add_scalar(name, float(v), step, walltime=wall_time)
        self.writer.flush()

    def text(self, tag: str, step: int, text: str, wall_time: float | None = None) -> None:
        self.writer.add_text(tag, text, step, walltime=wall_time)
        self.writer.flush()

    def sample(self, step: int, prompt: str, text: str, wall_time: float | None = None) -> None:
        # Indented four spaces: TensorBoard renders text as Markdown, and a sample is raw
        # text (a '#' or '*' in it must not become a heading or emphasis).
        body = "\n".join("    " + line for line in (prompt + text).splitlines())
        self.text(SAMPLES_TAG, step, body, wall_time)

    def marker(
        self,
        kind: str,
        step: int,
        changes: dict,
        source: str | None = None,
        wall_time: float | None = None,
    ) -> None:
        """A lifecycle event (``pivot``, ``fork`` of `source`) at `step`, saying what
        changed (loss.jsonl's ``changes``: flag -> [old, new])."""
        from atom_train.trainer.run_logs import describe_changes

        text = describe_changes(changes) or "no policy change"
        if source is not None:
            text = f"fork of {source}: {text}"
        self.text(MARKER_TAG.format(kind=kind), step, text, wall_time)

    def close(self) -> None:
        self.writer.close()


def convert_run(run, folder: Path) -> Path:
    """Write a run folder's progress.tsv rows, gradient norms, samples and lifecycle markers
    (`atom_train.trainer.run_logs.Run`) into `folder` as one TensorBoard run; returns
    `folder`. Writing again into the same folder replaces what is there (the restart marker
    at step 0). The gradient norm of a row is its ``grad_norm`` column, or for rows written
    before that column (run folder format 1) the loss.jsonl line of the row's step, read
    for those ticks only (`loss_log.read_grad_norms`: memory grows with the rows, not with
    the steps)."""
    from atom_train.trainer.loss_log import read_grad_norms
    from atom_train.trainer.run_logs import read_samples
    from atom_train.trainer.rundir import LOSS_LOG

    B = run.B
    p = run.progress
    ticks = [int(t) for t in p.columns["tick"]]
    column = p.columns.get("grad_norm", [math.nan] * len(ticks))
    older = [t for t, g in zip(ticks, column, strict=True) if math.isnan(g)]
    from_log = read_grad_norms(run.folder / LOSS_LOG, older) if older else {}
    events = run.log.events
    # progress.tsv has no clock time: the run's first launch plus its training time.
    t0 = next((e["time"] for e in events if isinstance(e.get("time"), int | float)), None)
    tb = TensorBoardLog(folder, first_step=0)
    try:
        for i, tick in enumerate(ticks):
            row = p.row(i)
            elapsed = row.get("elapsed_s", math.nan)
            wall = t0 + elapsed if t0 is not None and not math.isnan(elapsed) else None
            if math.isnan(row.get("grad_norm", math.nan)) and tick in from_log:
                # A run from before progress.tsv had the column: the row's step's norm.
                row["grad_norm"] = from_log[tick]
            tb.row(tick * B, row, wall_time=wall)
        for s in read_samples(run.folder):
            tb.sample(int(s["tick"]) * B, str(s.get("prompt", "")), str(s["sample"]), s.get("time"))
        for e in events:
            if e.get("event") in ("pivot", "fork") and isinstance(e.get("changes"), dict):
                source = e.get("source") if e["event"] == "fork" else None
                tb.marker(e["event"], int(e["tick"]) * B, e["changes"], source, e.get("time"))
    finally:
        tb.close()
    return folder
