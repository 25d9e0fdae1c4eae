"""Writing and restoring a run's checkpoints (`atom_train.trainer.checkpointer`), on a trainer built
from a plan, before it trains."""

from __future__ import annotations

import pytest
from helpers.trainer_kit import args

from atom_train import train
from atom_train.trainer.checkpoint_file import load_checkpoint
from atom_train.trainer.plan import resolve_run
from atom_train.trainer.rundir import ROLLING, ROLLING_PREV, snapshot_name


def _trainer(argv: list[str]) -> train.Trainer:
    plan = resolve_run(train.build_parser().parse_args(argv), warn=lambda m: None)
    plan.out.mkdir(parents=True, exist_ok=True)
    return train.Trainer(plan, train.Signals())


def test_a_snapshot_is_permanent_and_rolling_keeps_its_predecessor(corpus, tmp_path, capsys):
    t = _trainer(args(corpus, tmp_path / "run", 32))
    try:
        snap = t.ckpts.save("snapshot")
        assert snap.name == snapshot_name(0)
        before = snap.read_bytes()
        t.state.counters.step = 99  # a later state at the same tick must not replace it
        assert t.ckpts.save("snapshot") == snap and snap.read_bytes() == before
        assert "already exists: kept, not overwritten" in capsys.readouterr().err
        first = t.ckpts.save("rolling")
        t.ckpts.save("rolling")
        assert first.name == ROLLING and (tmp_path / "run" / ROLLING_PREV).exists()
        assert t.ckpts.last == first and t.ckpts.last_time is not None
        assert load_checkpoint(first).meta["training"]["step"] == 99
        with pytest.raises(ValueError, match="unknown checkpoint kind"):
            t.ckpts.save("weekly")
    finally:
        t.close()


def test_a_resume_restores_what_was_saved(corpus, tmp_path):
    out = tmp_path / "run"
    t = _trainer(args(corpus, out, 32))
    t.state.counters.tick, t.state.counters.step = 16, 1
    path = t.ckpts.save("rolling")
    t.close()
    again = _trainer(args(corpus, out, 32))
    try:
        assert again.plan.mode == "resume" and again.ckpts.last == path
        assert (again.state.counters.tick, again.state.counters.step) == (16, 1)
        assert again.state.loader_state == load_checkpoint(path).meta["loader_state"]
    finally:
        again.close()


def test_a_resume_puts_the_streams_where_they_were(corpus, tmp_path):
    """The loader after a resume reads on from where the saved streams were: its real
    positions and its next window, not only the state the checkpoint recorded."""
    out = tmp_path / "run"
    t = _trainer(args(corpus, out, 32))
    try:
        start = list(t.stream.positions)
        t.stream.next_window(16)
        t.state.counters.tick, t.state.counters.step = 16, 1
        t.state.loader_state = t.stream.state_dict()
        path = t.ckpts.save("rolling")
        expected_next = t.stream.next_window(16)
        size = t.stream.corpus.size
        assert list(load_checkpoint(path).meta["loader_state"]["positions"]) == [
            (p + 16) % size for p in start
        ]
    finally:
        t.close()
    again = _trainer(args(corpus, out, 32))
    try:
        assert list(again.stream.positions) == [(p + 16) % size for p in start]
        got = again.stream.next_window(16)
        for a, b in zip(got, expected_next, strict=True):
            assert (a == b).all()
    finally:
        again.close()
