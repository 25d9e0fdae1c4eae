"""What a run tells its user (`atom_train.trainer.reporting`): the per-step log held on the device
and read in bounded batches, the run clock across launches."""

from __future__ import annotations

import json
import math

import pytest
import torch

from atom_train.trainer import reporting
from atom_train.trainer.distributed import World
from atom_train.trainer.reporting import RunClock, StepLog
from atom_train.trainer.rundir import AppendLog
from atom_train.trainer.step import StepStats
from atom_train.trainer.train_state import Counters


def _stats(loss: float, ce: float = 1.0, grad_norm: float | None = 0.5) -> StepStats:
    return StepStats(
        loss=torch.tensor(loss),
        byte_ce=torch.tensor(ce),
        grad_norm=None if grad_norm is None else torch.tensor(grad_norm),
    )


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_step_log_writes_each_step_with_its_tick_bytes_and_bits(tmp_path):
    log = AppendLog(tmp_path / "loss.jsonl")
    sl = StepLog(log, B=4, world=World(), rate=0)
    sl.add(1, 16, 16, 1e-3, _stats(2.0, ce=math.log(2)), None)
    sl.add(2, 32, 16, 1e-3, _stats(4.0, ce=2 * math.log(2), grad_norm=None), None)
    sl.add(3, 48, 16, 1e-3, _stats(3.0, ce=math.log(2), grad_norm=1.5), None)
    assert not (tmp_path / "loss.jsonl").read_text(), "nothing is read before a flush"
    sl.flush(None)
    rows = _lines(tmp_path / "loss.jsonl")
    assert [(r["step"], r["tick"], r["bytes_seen"]) for r in rows] == [
        (1, 16, 64),
        (2, 32, 128),
        (3, 48, 192),
    ]
    assert [r["train_bpb"] for r in rows] == [1.0, 2.0, 1.0]  # nats -> bits
    assert [r["grad_norm"] for r in rows] == [0.5, None, 1.5]
    # The metric names only (common.metrics), never an old one.
    assert set(rows[0]) == {"step", "tick", "bytes_seen", "loss", "train_bpb", "lr", "grad_norm"}
    # Tick-weighted means since the last summary (the values were float32 tensors), and the
    # mean norm of the steps that computed one.
    assert sl.summary() == pytest.approx((3.0, 4 / 3, 1.0), rel=1e-6)
    assert sl.summary() == (0.0, 0.0, None)


def test_step_log_memory_is_bounded_without_log_ticks(tmp_path, monkeypatch):
    """--log-every 0 (or rare log ticks) on a long run: the pending device values are read
    every MAX_PENDING_STEPS steps, not kept for the whole run."""
    monkeypatch.setattr(reporting, "MAX_PENDING_STEPS", 8)
    sl = StepLog(AppendLog(tmp_path / "loss.jsonl"), B=1, world=World(), rate=0)
    for step in range(1, 21):
        sl.add(step, step, 1, 1e-3, _stats(1.0), None)
        assert len(sl.pending) < 8
    assert len(_lines(tmp_path / "loss.jsonl")) == 16
    sl.flush(None)
    assert [r["step"] for r in _lines(tmp_path / "loss.jsonl")] == list(range(1, 21))


def test_a_non_finite_loss_stops_the_run_naming_the_checkpoint(tmp_path):
    sl = StepLog(AppendLog(tmp_path / "loss.jsonl"), B=1, world=World())
    sl.add(1, 1, 1, 1e-3, _stats(float("nan")), None)
    with pytest.raises(FloatingPointError, match="resume from runs/x/ckpt-rolling"):
        sl.flush("runs/x/ckpt-rolling.safetensors")


def test_run_clock_adds_this_launch_to_earlier_ones(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(reporting.time, "time", lambda: now[0])
    c = Counters(elapsed_s=50.0)
    clock = RunClock(c)
    now[0] += 10
    assert clock.elapsed() == 60.0
    clock.fold()
    assert c.elapsed_s == 60.0
    now[0] += 5
    assert clock.elapsed() == 65.0


def test_step_log_above_the_rate_writes_one_exact_aggregate_per_slot(tmp_path):
    """Steps faster than --loss-log-rate: one line per slot of 1/rate seconds, with the
    slot's exact count, mean, min and max; a checkpoint (close) ends the open slot, so the
    steps it covers are on disk before it."""
    now = [0.0]
    sl = StepLog(AppendLog(tmp_path / "loss.jsonl"), B=2, world=World(), rate=2.0)
    sl.lines.clock = lambda: now[0]
    losses = [3.0, 1.0, 2.0, 6.0, 5.0]
    for step, loss in enumerate(losses, 1):  # 4 steps a second: two per half-second slot
        sl.add(step, 8 * step, 8, 1e-3, _stats(loss, grad_norm=loss / 10), None)
        now[0] += 0.25
    sl.flush(None)  # a progress row: the open slot (step 5) stays open
    lines = _lines(tmp_path / "loss.jsonl")
    assert [(x["first_step"], x["step"], x["count"]) for x in lines] == [(1, 2, 2), (3, 4, 2)]
    assert lines[1]["loss_mean"] == 4.0 and (lines[1]["loss_min"], lines[1]["loss_max"]) == (2, 6)
    assert lines[0]["grad_norm_max"] == pytest.approx(0.3)
    assert lines[1]["bytes_seen"] == 32 * 2 and lines[1]["first_tick"] == 24
    sl.flush(None, close=True)  # a checkpoint: step 5 alone in its slot, a plain step line
    last = _lines(tmp_path / "loss.jsonl")[-1]
    assert last["step"] == 5 and "count" not in last and last["loss"] == 5.0
    # The next step, at once after the checkpoint, begins a new slot.
    sl.add(6, 48, 8, 1e-3, _stats(7.0), None)
    sl.flush(None, close=True)
    assert _lines(tmp_path / "loss.jsonl")[-1]["step"] == 6
