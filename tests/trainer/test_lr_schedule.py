"""The learning rate of each optimizer step (atom_train.trainer.lr_schedule): warm-up, then
constant or cosine, and segments started at a pivot."""

from __future__ import annotations

import math

import pytest

from atom_train.trainer.lr_schedule import LRSchedule, describe_segment, new_segment


def test_lr_warmup_then_constant_or_cosine():
    c = LRSchedule(lr=1.0, kind="constant", warmup_steps=4, end_step=20)
    assert [c.at(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = LRSchedule(lr=2.0, kind="cosine", warmup_steps=2, min_lr_ratio=0.1, end_step=12)
    assert cos.at(0) == 1.0 and cos.at(1) == 2.0 and cos.at(2) == 2.0
    assert cos.at(7) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2))))
    assert cos.at(12) == pytest.approx(0.2) and cos.at(50) == pytest.approx(0.2)


def test_lr_segment_started_at_a_pivot():
    """A pivot's segment counts from its own start step: warm-up and cosine start there."""
    seg = LRSchedule(lr=1.0, kind="cosine", warmup_steps=0, min_lr_ratio=0.0,
                     start_step=100, end_step=110)  # fmt: skip
    assert seg.at(100) == pytest.approx(1.0)
    assert seg.at(105) == pytest.approx(0.5)
    assert seg.at(110) == pytest.approx(0.0, abs=1e-12)
    warm = LRSchedule(lr=1.0, warmup_steps=2, start_step=100, end_step=110)
    assert [warm.at(s) for s in (100, 101, 102)] == [0.5, 1.0, 1.0]


def test_lr_schedule_is_json_roundtrippable():
    import dataclasses
    import json

    s = LRSchedule(lr=3e-4, kind="cosine", warmup_steps=5, min_lr_ratio=0.2, start_step=7,
                   end_step=99)  # fmt: skip
    assert LRSchedule(**json.loads(json.dumps(dataclasses.asdict(s)))) == s


def test_a_cosine_of_one_step_or_none_at_its_ends():
    one = LRSchedule(lr=1.0, kind="cosine", warmup_steps=0, min_lr_ratio=0.1, start_step=0,
                     end_step=1)  # fmt: skip
    assert one.at(0) == 1.0 and one.at(1) == pytest.approx(0.1) and one.at(5) == pytest.approx(0.1)
    # No step left to decay over (the warm-up ends where the cosine would): the rate stays.
    none = LRSchedule(lr=2.0, kind="cosine", warmup_steps=2, min_lr_ratio=0.1, start_step=0,
                      end_step=2)  # fmt: skip
    assert [none.at(s) for s in range(4)] == [1.0, 2.0, 2.0, 2.0]


def test_a_new_segment_starts_at_the_peak_or_from_the_rate_in_force():
    """--lr-restart: peak (the pivot's segment at --lr), hold (the old rate, constant) and
    decay (the old rate, cosine down to min_lr_ratio x it); a changed --lr starts hold and
    decay from it."""
    kw = dict(lr=1.0, kind="cosine", warmup_steps=0, min_lr_ratio=0.1, start_step=10,
              end_step=20, rate_now=0.1, lr_changed=False)  # fmt: skip
    peak = new_segment("peak", **kw)
    assert peak.at(10) == 1.0 and peak.at(20) == pytest.approx(0.1)
    hold = new_segment("hold", **kw)
    assert [hold.at(s) for s in (10, 15, 20, 30)] == [0.1] * 4
    decay = new_segment("decay", **kw)
    assert decay.at(10) == pytest.approx(0.1) and decay.at(20) == pytest.approx(0.01)
    assert new_segment("hold", **{**kw, "lr": 0.5, "lr_changed": True}).at(15) == 0.5
    warm = new_segment("hold", **{**kw, "warmup_steps": 2})
    assert [warm.at(s) for s in (10, 11, 12)] == [0.05, 0.1, 0.1]
    with pytest.raises(ValueError, match="unknown restart"):
        new_segment("later", **kw)
    text = describe_segment(peak, before=0.1, step=10, end_tick=2000)
    assert text == "learning rate 0.1 -> 1 now: cosine from 1 down to 0.1 at tick 2,000"
