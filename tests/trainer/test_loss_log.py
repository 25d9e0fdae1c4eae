"""loss.jsonl bounded by time, events.jsonl, and readers that stream
(`atom_train.trainer.loss_log`): the lines a run writes at any step rate, exact aggregates,
the events file (and its making from a format-1 folder), and readers whose memory does not
grow with the file."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tracemalloc

import pytest
from helpers import REPO

from atom_train.trainer import loss_log
from atom_train.trainer.loss_log import (
    EventLog,
    StepLines,
    iter_step_lines,
    read_events,
    read_grad_norms,
)
from atom_train.trainer.rundir import EVENTS, LOSS_LOG, AppendLog, NullLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(lines: StepLines, clock: Clock, steps: int, per_s: float, seed: int = 0):
    """`steps` steps at `per_s` steps per second; returns each step's values."""
    rng = random.Random(seed)
    raw = []
    for step in range(1, steps + 1):
        slot = lines.mark()
        v = {"loss": rng.uniform(1, 3), "train_bpb": rng.uniform(1, 4), "grad_norm": rng.random()}
        lines.write(slot, step, 64 * step, 1e-3, v)
        raw.append(v)
        clock.now += 1.0 / per_s
    lines.close()
    return raw


def test_a_line_per_step_below_the_rate_and_per_slot_above_it():
    for per_s, rate, most in ((1.5, 2.0, None), (300.0, 2.0, 2 * 100 + 1)):
        out: list[dict] = []
        clock = Clock()
        raw = _run(StepLines(out.append, 1024, rate, clock), clock, int(per_s * 100), per_s)
        if most is None:  # slower than the rate: every step its own line
            assert [x["step"] for x in out] == list(range(1, len(raw) + 1))
            assert all("count" not in x for x in out)
            continue
        # 30,000 steps in 100 s at 2 lines/s: about 200 lines, each step in exactly one.
        assert len(out) <= most
        assert sum(x.get("count", 1) for x in out) == len(raw)
        first = [x.get("first_step", x["step"]) for x in out]
        assert first[0] == 1 and first[1:] == [x["step"] + 1 for x in out[:-1]]
        for x in out:
            got = raw[x["first_step"] - 1 : x["step"]]
            for k in ("loss", "train_bpb", "grad_norm"):
                vals = [v[k] for v in got]
                assert x[f"{k}_mean"] == pytest.approx(sum(vals) / len(vals), abs=1e-6)
                assert x[f"{k}_min"] == round(min(vals), 6)
                assert x[f"{k}_max"] == round(max(vals), 6)
            assert x["bytes_seen"] == x["tick"] * 1024


def test_rate_zero_is_a_line_per_step_at_any_speed():
    out: list[dict] = []
    clock = Clock()
    _run(StepLines(out.append, 1, 0.0, clock), clock, 500, 1e6)
    assert [x["step"] for x in out] == list(range(1, 501))
    # Each step's line is written with its values (no slot waits for the next step), with
    # the step's own measurement (the noise scale's fields) and without a gradient norm
    # when there is none (clipping off).
    lines = StepLines(out.append, 1, 0.0, Clock())
    v = {"loss": 1.5, "train_bpb": 2.0, "grad_norm": None}
    lines.write(lines.mark(), 501, 501, 1e-3, v, {"grad_sq_small": 0.25, "streams_small": 2})
    assert out[-1] == {"step": 501, "tick": 501, "bytes_seen": 501, "loss": 1.5,
                       "train_bpb": 2.0, "lr": 1e-3, "grad_norm": None, "grad_sq_small": 0.25,
                       "streams_small": 2}  # fmt: skip


def test_a_slot_is_one_over_the_rate_a_step_at_its_end_begins_the_next():
    out: list[dict] = []
    clock = Clock()
    lines = StepLines(out.append, 1, 2.0, clock)  # slots of 0.5 s
    for step, t in ((1, 0.0), (2, 0.25), (3, 0.5), (4, 0.75)):
        clock.now = t
        extra = {"grad_sq_small": float(step)} if step in (1, 3) else None  # measured there
        lines.write(lines.mark(), step, step, 1e-3 * step, {"loss": 1.0, "train_bpb": 1.0,
                    "grad_norm": 1.0}, extra)  # fmt: skip
    lines.close()
    assert [(x["first_step"], x["step"]) for x in out] == [(1, 2), (3, 4)]
    # An aggregate holds its last step's lr and its slot's newest measurement.
    assert [(x["lr"], x["grad_sq_small"]) for x in out] == [(2e-3, 1.0), (4e-3, 3.0)]


def test_a_step_without_a_gradient_norm_leaves_the_aggregate_without_one():
    out: list[dict] = []
    lines = StepLines(out.append, 1, 2.0, Clock())  # the clock stands still: one slot
    for step, g in ((1, 0.5), (2, None)):
        lines.write(lines.mark(), step, step, 1e-3, {"loss": 1.0, "train_bpb": 1.0, "grad_norm": g})
    lines.close()
    (agg,) = out
    assert agg["count"] == 2 and agg["loss_mean"] == 1.0
    assert agg["grad_norm_mean"] is agg["grad_norm_min"] is agg["grad_norm_max"] is None
    # A metric a step lacks leaves the others whole (train_bpb missing, grad_norm after it).
    lines.write(lines.mark(), 3, 3, 1e-3, {"loss": 1.0, "train_bpb": None, "grad_norm": 0.5})
    lines.write(lines.mark(), 4, 4, 1e-3, {"loss": 2.0, "train_bpb": 1.0, "grad_norm": 0.25})
    lines.close()
    assert out[-1]["train_bpb_mean"] is None and out[-1]["loss_mean"] == 1.5
    assert (out[-1]["grad_norm_min"], out[-1]["grad_norm_max"]) == (0.25, 0.5)
    assert out[-1]["grad_norm_mean"] == 0.375


# ---- events ------------------------------------------------------------------------------


def test_events_go_to_both_files_and_are_read_from_the_events_file(tmp_path, monkeypatch):
    loss = AppendLog(tmp_path / LOSS_LOG)
    events = EventLog(tmp_path, loss)
    events.write({"event": "start", "tick": 0})
    loss.write_json({"step": 1, "tick": 64, "loss": 1.0})
    events.write({"event": "resume", "tick": 0})
    events.close()
    loss.close()
    kinds = [json.loads(x).get("event") for x in (tmp_path / LOSS_LOG).read_text().splitlines()]
    assert kinds == ["start", None, "resume"]
    # With events.jsonl there, loss.jsonl is not even opened.
    monkeypatch.setattr(loss_log, "scan_events", lambda *a: pytest.fail("scanned loss.jsonl"))
    assert [e["event"] for e in read_events(tmp_path)] == ["start", "resume"]


def test_a_format_1_folder_gets_its_events_file_from_one_scan(tmp_path):
    old = [
        {"event": "start", "tick": 0},
        {"step": 1, "tick": 64, "bytes": 64, "loss": 2.0, "bpb": 2.5, "gnorm": 0.5},
        {"event": "pivot", "tick": 64, "changes": {"lr": [0.002, 0.001]}},
    ]
    (tmp_path / LOSS_LOG).write_text("".join(json.dumps(x) + "\n" for x in old))
    assert [e["event"] for e in read_events(tmp_path)] == ["start", "pivot"]  # scanned
    loss = AppendLog(tmp_path / LOSS_LOG)
    EventLog(tmp_path, loss).write({"event": "resume", "tick": 64})
    assert [e["event"] for e in read_events(tmp_path)] == ["start", "pivot", "resume"]
    assert (tmp_path / EVENTS).exists()


def test_the_events_file_made_from_a_format_1_folder_is_written_as_a_run_writes_it(tmp_path):
    old = [{"event": "start", "tick": 0, "B": 4}, {"step": 1, "tick": 16, "loss": 2.0}]
    (tmp_path / LOSS_LOG).write_text("".join(json.dumps(x) + "\n" for x in old))
    EventLog(tmp_path, AppendLog(tmp_path / LOSS_LOG)).write({"event": "resume", "tick": 16})
    assert (tmp_path / EVENTS).read_text() == (
        '{"event":"start","tick":0,"B":4}\n{"event":"resume","tick":16}\n'
    )  # (compact, as AppendLog writes every line)


def test_events_jsonl_is_the_authority_it_is_never_made_again_from_loss_jsonl(tmp_path):
    """A crash between the two writes of an event leaves it in events.jsonl only: opening
    the log again keeps it (events.jsonl is not rebuilt from loss.jsonl)."""
    (tmp_path / LOSS_LOG).write_text(json.dumps({"event": "start", "tick": 0}) + "\n")
    (tmp_path / EVENTS).write_text(
        json.dumps({"event": "start", "tick": 0}) + "\n"
        + json.dumps({"event": "resume", "tick": 32}) + "\n"
    )  # fmt: skip
    EventLog(tmp_path, AppendLog(tmp_path / LOSS_LOG)).write({"event": "resume", "tick": 48})
    assert [(e["event"], e["tick"]) for e in read_events(tmp_path)] == [
        ("start", 0), ("resume", 32), ("resume", 48)
    ]  # fmt: skip
    # A folder with neither file has no events, and gets an events file at its first.
    empty = tmp_path / "new"
    empty.mkdir()
    assert read_events(empty) == []
    EventLog(empty, AppendLog(empty / LOSS_LOG)).write({"event": "start", "tick": 0})
    assert read_events(empty) == [{"event": "start", "tick": 0}]


def test_a_rerun_that_writes_no_event_makes_no_events_file(tmp_path):
    (tmp_path / LOSS_LOG).write_text(json.dumps({"event": "start", "tick": 0}) + "\n")
    EventLog(tmp_path, AppendLog(tmp_path / LOSS_LOG)).close()
    assert not (tmp_path / EVENTS).exists()
    EventLog(tmp_path, NullLog()).write({"event": "start"})  # another rank: nowhere
    assert not (tmp_path / EVENTS).exists()


def test_format_1_events_are_found_without_parsing_step_lines(tmp_path, monkeypatch):
    lines = [{"event": "start", "tick": 0}] + [
        {"step": s, "tick": s, "loss": 1.0, "gnorm": 0.1} for s in range(1, 2001)
    ]
    (tmp_path / LOSS_LOG).write_text("".join(json.dumps(x) + "\n" for x in lines))
    parsed = []
    real = json.loads
    monkeypatch.setattr(loss_log.json, "loads", lambda s: parsed.append(s) or real(s))
    assert len(read_events(tmp_path)) == 1
    assert len(parsed) == 1


_READ_EVENTS = """
import json, locale, sys
from pathlib import Path
from atom_train.trainer.loss_log import read_events
print(json.dumps([locale.getpreferredencoding(False), *(read_events(Path(p)) for p in sys.argv[1:])]))
"""


def test_events_are_read_as_written_under_any_locale(tmp_path):
    """A run folder read where the locale's encoding is not UTF-8 (here the C locale's
    ASCII, Python's UTF-8 mode off): its events' text, a path with accents among it, reads
    as it was written, from events.jsonl and from a format-1 loss.jsonl."""
    events = [{"event": "start", "tick": 0, "val": {"files": ["/données/été/val.txt"]}}]
    text = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events)
    new, old = tmp_path / "new", tmp_path / "old"
    for folder, name in ((new, EVENTS), (old, LOSS_LOG)):
        folder.mkdir()
        (folder / name).write_text(text, encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    out = subprocess.run([sys.executable, "-c", _READ_EVENTS, str(new), str(old)], cwd=REPO,
                         env=env, capture_output=True, text=True, check=True)  # fmt: skip
    encoding, *read = json.loads(out.stdout)
    if encoding.lower().replace("-", "") == "utf8":
        pytest.skip("this Python reads the C locale as UTF-8")
    assert read == [events, events]


# ---- step lines, streamed ----------------------------------------------------------------


def test_grad_norms_of_old_and_new_lines_for_the_ticks_asked_only(tmp_path):
    path = tmp_path / LOSS_LOG
    rows = [
        {"event": "start", "tick": 0, "source_tick": 16},
        {"step": 1, "tick": 16, "loss": 1.0, "gnorm": 0.5},  # format 1
        {"step": 2, "tick": 32, "loss": 1.0, "grad_norm": 0.25},  # format 2
        {"step": 4, "first_step": 3, "count": 2, "tick": 64, "first_tick": 48},  # aggregate
        {"event": "resume", "tick": 32, "step": 2, "checkpoint": "ckpt-rolling.safetensors"},
        {"step": 2, "tick": 32, "loss": 1.0, "grad_norm": 0.75},  # a resume rewrote step 2
        {"step": 5, "tick": 80, "loss": 1.0, "grad_norm": None},  # clipping off: none
        {"step": 6, "tick": 96, "loss": float("nan"), "grad_norm": float("nan")},  # diverged
        '{"step": 7, "tick": 112, "gr',  # torn by a kill
    ]
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in rows))
    assert read_grad_norms(path, [16, 32, 64, 80, 96, 112, 999]) == {16: 0.5, 32: 0.75}
    assert read_grad_norms(path, [32]) == {32: 0.75}
    assert read_grad_norms(tmp_path / "none.jsonl", [16]) == {}  # no file yet
    steps = list(iter_step_lines(path))
    assert [s["step"] for s in steps] == [1, 2, 4, 2, 5, 6]  # the resume event is no step
    assert steps[0]["grad_norm"] == 0.5  # format 1's gnorm read as grad_norm


def test_readers_pass_over_bytes_that_are_not_utf8_and_lines_that_are_not_records(tmp_path):
    """A line torn inside a character by a kill (or a disk that returned garbage), a line
    that is JSON but no record (a number, a list, a string): every reader goes on."""
    good = [{"event": "start", "tick": 0, "prompt": "Où est la fenêtre ?"},
            {"step": 1, "tick": 16, "loss": 1.0, "grad_norm": 0.5}]  # fmt: skip
    junk = [b'{"step": 2, "tick": 32, "prompt": "\xc3', b"7", b"[1, 2]", b'"event"',
            b'{"event": "resume", "ti', b"\xff\xfe\x00garbage"]  # fmt: skip
    data = b"".join(json.dumps(x, ensure_ascii=False).encode() + b"\n" for x in good)
    data += b"".join(x + b"\n" for x in junk)
    (tmp_path / LOSS_LOG).write_bytes(data)
    assert read_events(tmp_path) == good[:1]  # (a format-1 folder: loss.jsonl scanned)
    assert read_grad_norms(tmp_path / LOSS_LOG, [16, 32]) == {16: 0.5}
    assert list(iter_step_lines(tmp_path / LOSS_LOG)) == good[1:]
    (tmp_path / EVENTS).write_bytes(data)  # the same, as events.jsonl
    assert read_events(tmp_path) == good[:1]


def _write_steps(path, n: int) -> None:
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "tick": 0}) + "\n")
        for s in range(1, n + 1):
            f.write(json.dumps({"step": s, "tick": 64 * s, "loss": 1.0, "gnorm": s / n}) + "\n")


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_readers_memory_does_not_grow_with_the_file(tmp_path):
    """A 4x longer loss.jsonl: the readers hold what they were asked for (the events, the
    grad norms of given ticks, one line at a time), not the file: their peak Python memory
    stays within a small constant of the shorter file's."""
    small, big = tmp_path / "small", tmp_path / "big"
    for folder, n in ((small, 20_000), (big, 80_000)):
        folder.mkdir()
        _write_steps(folder / LOSS_LOG, n)
    ticks = [64 * s for s in range(100, 20_000, 1000)]  # the same 20 rows in both

    def readers(folder):
        def run():
            assert len(read_events(folder)) == 1
            assert len(read_grad_norms(folder / LOSS_LOG, ticks)) == len(ticks)
            assert sum(1 for _ in iter_step_lines(folder / LOSS_LOG)) > 0

        return run

    peak_small, peak_big = _peak_bytes(readers(small)), _peak_bytes(readers(big))
    assert peak_big < peak_small + 64 * 1024, (peak_small, peak_big)
    # A reader that kept every line would hold megabytes here.
    assert peak_big < 1 << 20


# ---- the trainer writes them -------------------------------------------------------------


def test_a_run_above_the_rate_logs_every_step_once_and_its_events_apart(
    corpus, tmp_path, monkeypatch
):
    """The trainer at --loss-log-rate 0.2 (a slot of 5 s) on a clock that reads a step every
    2 s: slots of 3 steps, every checkpoint (every 64 ticks: 4 windows) closing the open
    one, so every step is in exactly one line, and none spans a checkpoint; after a resume
    the next launch's slots start afresh. The aggregates are exact: the mean, min and max of
    the steps' own values (a line-per-step run of the same steps); the events are in
    events.jsonl as in loss.jsonl."""
    from functools import partial

    from helpers.trainer_kit import run

    from atom_train.trainer import reporting

    per_step = tmp_path / "per-step"
    assert run(corpus, per_step, 192, "--ckpt-every", "64") == 0
    own = {x["step"]: x for x in map(json.loads, (per_step / LOSS_LOG).read_text().splitlines())
           if "event" not in x}  # fmt: skip
    # (that run's own lines against its progress rows, written apart: a row every window,
    # to 6 significant digits)
    rows = (per_step / "progress.tsv").read_text().splitlines()
    table = [dict(zip(rows[0].split("\t"), r.split("\t"), strict=True)) for r in rows[1:]]
    assert [int(r["tick"]) for r in table] == [x["tick"] for x in own.values()]
    for r, x in zip(table, own.values(), strict=True):
        for k in ("loss", "train_bpb", "grad_norm", "lr"):
            assert float(r[k]) == pytest.approx(x[k], rel=1e-5), (k, x)
    clock = Clock()

    def two_seconds_a_step() -> float:
        clock.now += 2.0
        return clock.now

    monkeypatch.setattr(reporting, "StepLines", partial(StepLines, clock=two_seconds_a_step))
    fast = ["--loss-log-rate", "0.2", "--ckpt-every", "64"]
    out = tmp_path / "run"
    assert run(corpus, out, 96, *fast) == 0
    assert run(corpus, out, 192, *fast) == 0
    lines = [json.loads(x) for x in (out / LOSS_LOG).read_text().splitlines()]
    cut = next(i for i, x in enumerate(lines) if x.get("event") == "resume")

    # Steps at 2, 4, 6, ... s: a slot opens at its first step and takes the steps less than
    # 5 s after it; the checkpoints at ticks 64 (step 4), 96 (the end), 128 (step 8), 192.
    def spans(part: list[dict]) -> list[tuple]:
        return [(x.get("first_step", x["step"]), x["step"], x.get("count")) for x in part
                if "event" not in x]  # fmt: skip

    assert spans(lines[:cut]) == [(1, 3, 3), (4, 4, None), (5, 6, 2)]
    assert spans(lines[cut:]) == [(7, 8, 2), (9, 11, 3), (12, 12, None)]
    for x in lines:
        if "event" in x:
            continue
        got = [own[s] for s in range(x.get("first_step", x["step"]), x["step"] + 1)]
        assert x["tick"] == got[-1]["tick"] and x["bytes_seen"] == 4 * x["tick"]
        if "count" not in x:
            assert x == got[0]
            continue
        assert x["first_tick"] == got[0]["tick"] and x["lr"] == got[-1]["lr"]
        for k in ("loss", "train_bpb", "grad_norm"):
            vals = [g[k] for g in got]  # (rounded to 6 decimals, as the aggregate is)
            assert x[f"{k}_mean"] == pytest.approx(sum(vals) / len(vals), abs=1e-6)
            assert (x[f"{k}_min"], x[f"{k}_max"]) == (min(vals), max(vals))
    in_log = [x for x in lines if "event" in x]
    assert read_events(out) == in_log and [e["event"] for e in in_log] == ["start", "resume"]
    assert in_log[0]["run_format"] == 2


def test_the_checkpoints_page_has_no_cut_sentence_and_names_the_val_event_rightly():
    """docs/checkpoints.md: the status.json item ends its sentence; `val` events are the
    validations outside the progress rows, which is what the trainer writes as events."""
    import inspect

    from helpers import REPO

    from atom_train.trainer import reporting

    doc = (REPO / "docs" / "checkpoints.md").read_text()
    item = doc.split("- `status.json`: ", 1)[1].split("\n- ", 1)[0]
    assert item.rstrip().endswith(".") and "`completed`" in item and "`failed`" in item
    assert "`val` for a validation outside the" in doc
    assert '"event": "val"' in inspect.getsource(reporting.Reporter.val_event)


@pytest.mark.parametrize(
    "step, K, per_slot",
    [(10**6, 64, 150), (1000, 16, 10), (5, 64, 2),
     # where the slot's first step or tick has a digit fewer than its last, or one more
     # step or window would change its digits: 100 and 99, ticks 1280 and 704, 960, 1024,
     # and with K = 1, 100
     (149, 64, 50), (148, 64, 50), (20, 64, 10), (24, 64, 10), (25, 64, 10), (109, 1, 10)],
)  # fmt: skip
def test_the_typical_line_sizes_are_those_of_the_lines_written_there(step, K, per_slot):
    """What the pre-flight's disk projection counts per loss.jsonl line: a step line and an
    aggregate of `per_slot` steps ending at `step` (tick K x step, B 1024), values written to
    6 decimals, are the sizes of the lines StepLines writes there (as AppendLog writes them:
    compact JSON and a newline)."""
    v = {"loss": 1.234567, "train_bpb": 2.345678, "grad_norm": 0.123456}
    lr = 1.2345678901234e-3
    written: list[dict] = []
    per_step = StepLines(written.append, 1024, 0.0, Clock())
    per_step.write(per_step.mark(), step, K * step, lr, v)
    slots = StepLines(written.append, 1024, 2.0, Clock())  # (the clock stands still: one slot)
    for s in range(step - per_slot + 1, step + 1):
        slots.write(slots.mark(), s, K * s, lr, v)
    slots.close()
    one, agg = (len(json.dumps(x, separators=(",", ":"))) + 1 for x in written)
    assert written[1]["count"] == per_slot
    assert loss_log.typical_line_bytes(step, K * step, 1024, per_slot) == (one, agg)
    assert loss_log.line_bytes(written[0]) == one
