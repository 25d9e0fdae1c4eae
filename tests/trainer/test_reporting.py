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
    sl = StepLog(log, B=4, world=World())
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
    sl = StepLog(AppendLog(tmp_path / "loss.jsonl"), B=1, world=World())
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
