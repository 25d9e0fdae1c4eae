"""Writing and restoring a run's checkpoints (`atom_train.trainer.checkpointer`), on a trainer built
from a plan, before it trains."""

from __future__ import annotations

import pytest
import torch
from helpers.loader_state import same_state
from helpers.trainer_kit import args

from atom_train import train
from atom_train.trainer import checkpointer
from atom_train.trainer.checkpoint_file import CheckpointError, load_checkpoint
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.rundir import FINAL, ROLLING, ROLLING_PREV, snapshot_name
from atom_train.trainer.train_state import (
    LOADER_POSITIONS,
    optimizer_moments,
    run_config_of,
    saved_loader_state,
)


def _trainer(argv: list[str]) -> train.Trainer:
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    plan.out.mkdir(parents=True, exist_ok=True)
    return train.Trainer(plan, train.Signals())


def test_a_snapshot_is_permanent_and_rolling_keeps_its_predecessor(corpus, tmp_path, capsys):
    t = _trainer(args(corpus, tmp_path / "run", 32))
    try:
        snap = t.ckpts.save("snapshot")
        assert snap.name == snapshot_name(0)
        assert f"snapshot {snap.name}" in capsys.readouterr().err
        before = snap.read_bytes()
        t.state.counters.step = 99  # a later state at the same tick must not replace it
        assert t.ckpts.save("snapshot") == snap and snap.read_bytes() == before
        err = capsys.readouterr().err  # ... and no line says it was written
        assert (
            f"warning: {snap.name} already exists: kept, not overwritten\n" == err.split("] ", 1)[1]
        )
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
        assert same_state(
            again.state.loader_state_dict(), saved_loader_state(load_checkpoint(path))
        )
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
        assert load_checkpoint(path).tensors[LOADER_POSITIONS].tolist() == [
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


def test_a_resume_at_16384_streams_puts_every_stream_where_it_was(corpus, tmp_path):
    """At B = 16,384 (a large run's B): the checkpoint holds the 16,384 positions as a
    tensor, and a resume from it reads on exactly as the saved loader would have, stream
    for stream (each context rebuilt from the 64 bytes before its position)."""
    B = 16_384
    out = tmp_path / "run"
    argv = args(corpus, out, 64, "-B", str(B), "--bptt", "4", "--transport", "ids")
    t = _trainer(argv)
    try:
        t.stream.next_window_ids(4)  # (away from the initial offsets)
        t.state.counters.tick, t.state.counters.step = 4, 1
        t.state.loader_state = t.stream.snapshot()
        path = t.ckpts.save("rolling")
        expected = [a.copy() for a in t.stream.next_window_ids(4)]
    finally:
        t.close()
    ck = load_checkpoint(path)
    assert ck.meta["loader_state"]["B"] == B and ck.tensors[LOADER_POSITIONS].shape == (B,)
    again = _trainer(argv)
    try:
        assert again.plan.mode == "resume"
        got = again.stream.next_window_ids(4)
        for a, b in zip(got, expected, strict=True):
            assert a.tobytes() == b.tobytes()
    finally:
        again.close()


# ---- what the mutation check found unheld (make mutants, docs/testing.md) ------------------


def test_each_kind_is_written_where_it_belongs_with_what_the_plan_says(corpus, tmp_path):
    out = tmp_path / "run"
    t = _trainer(args(corpus, out, 32))
    try:
        t.state.counters.tick, t.state.counters.step = 16, 1
        t.state.loader_state = t.stream.state_dict()
        paths = {kind: t.ckpts.save(kind) for kind in ("rolling", "snapshot", "final")}
        assert paths == {
            "rolling": out / ROLLING,
            "snapshot": out / snapshot_name(16),
            "final": out / FINAL,
        }
        assert t.ckpts.last == out / FINAL
        for kind, path in paths.items():
            c = load_checkpoint(path)
            assert c.meta["kind"] == kind
            assert run_config_of(c.meta) == t.plan.run_config and "args" not in c.meta
            assert same_state(saved_loader_state(c), t.stream.state_dict())
            training = c.meta["training"]
            assert (training["tick"], training["step"], training["total_ticks"]) == (16, 1, 32)
            assert training["world_size"] == 1
            assert training["recurrence"] == t.plan.recurrence
            assert training["transport"] == t.plan.transport
            state = t.state.model.state_dict()
            assert all(torch.equal(c.tensors[f"model/{k}"], v) for k, v in state.items())
            assert c.meta["optimizer"]["name"] == "AdamW"  # the final one too
    finally:
        t.close()


def test_a_failed_write_fails_the_save_and_is_not_counted_as_written(corpus, tmp_path, monkeypatch):
    t = _trainer(args(corpus, tmp_path / "run", 32))
    try:
        for err in (CheckpointError("disk on fire"), OSError(5, "I/O error")):

            def fail(*a, err=err, **k):
                raise err

            monkeypatch.setattr(checkpointer, "save_checkpoint", fail)
            with pytest.raises(type(err)) as e:
                t.ckpts.save("rolling")
            assert e.value is err
            assert t.ckpts.last is None and t.ckpts.last_time is None
    finally:
        t.close()


def test_a_slow_rolling_write_is_reported_once_with_its_share_of_the_interval(
    corpus, tmp_path, monkeypatch
):
    """A rolling checkpoint that takes more than 10% of the time since the last one (and over
    a second) is said, with its size, time and share; quick ones are not."""
    t = _trainer(args(corpus, tmp_path / "run", 32))
    said: list[tuple[str, str]] = []
    t.ckpts.warn_once = lambda key, message: said.append((key, message))
    now = [1000.0]
    monkeypatch.setattr(checkpointer.time, "time", lambda: now[0])
    real_write = t.ckpts._write

    def write_taking(seconds: float):
        def write(*a):
            path = real_write(*a)
            now[0] += seconds
            return path

        return write

    try:
        t.ckpts.last_time = 980.0  # the last checkpoint, 20 s ago
        monkeypatch.setattr(t.ckpts, "_write", write_taking(1.5))  # 7.5% of 20 s: quiet
        t.ckpts.save("rolling")
        assert said == [] and t.ckpts.last_time == 1001.5
        now[0] = 1011.5  # 10 s later, a write of 3 s: 30% of the interval
        monkeypatch.setattr(t.ckpts, "_write", write_taking(3.0))
        path = t.ckpts.save("rolling")
        size = path.stat().st_size / 2**20
        assert said == [
            (
                "ckpt",
                f"writing {ROLLING} ({size:.1f} MiB) took 3.0 s, 30% of the checkpoint interval: "
                "check the disk, or raise --ckpt-every",
            )
        ]
        said.clear()
        # At the bounds: 1.5 s (over one second) at 37.5%, then exactly 10% (not over it).
        t.ckpts.last_time, now[0] = 1000.0, 1004.0
        monkeypatch.setattr(t.ckpts, "_write", write_taking(1.5))
        t.ckpts.save("rolling")
        assert [m for _, m in said] == [
            f"writing {ROLLING} ({size:.1f} MiB) took 1.5 s, 38% of the checkpoint interval: "
            "check the disk, or raise --ckpt-every"
        ]
        said.clear()
        t.ckpts.last_time, now[0] = 1000.0, 1030.0
        monkeypatch.setattr(t.ckpts, "_write", write_taking(3.0))
        t.ckpts.save("rolling")
        assert said == []
        t.ckpts.last_time, now[0] = 1014.0, 1014.2  # 0.2 s after the last one
        monkeypatch.setattr(t.ckpts, "_write", write_taking(0.9))  # sub-second: never said
        t.ckpts.save("rolling")
        monkeypatch.setattr(t.ckpts, "_write", write_taking(30.0))
        t.ckpts.save("snapshot")  # only rolling checkpoints are timed against the interval
        assert said == []
    finally:
        t.close()


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A run trained for one window (AdamW has moments), final checkpoint at tick 16."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert train.main(args(corpus, out, 16, "--ckpt-every", "16")) == 0
    return out / FINAL


def test_a_fork_restores_everything_and_names_its_source(corpus, trained, tmp_path):
    src = load_checkpoint(trained)
    t = _trainer(args(corpus, tmp_path / "fork", 32, "--fork", str(trained)))
    try:
        assert t.state.origin == {
            "mode": "fork",
            "source": str(trained),
            "source_sha256": src.sha256,
            "source_tick": 16,
        }
        assert (t.state.counters.tick, t.state.counters.step) == (16, 1)
        runtime = t.state.runtime.state_dict()
        assert all(torch.equal(runtime[k], v) for k, v in src.group("runtime").items())
        assert t.stream.positions == src.tensors[LOADER_POSITIONS].tolist()
        assert same_state(t.state.loader_state_dict(), saved_loader_state(src))
        assert_optimizer_is(t, optimizer_moments(src))
    finally:
        t.close()


@pytest.mark.parametrize("keep", [True, False])
def test_an_init_takes_the_weights_and_on_request_the_optimizer(corpus, trained, tmp_path, keep):
    src = load_checkpoint(trained)
    extra = ["--keep-optimizer"] if keep else []
    t = _trainer(args(corpus, tmp_path / "init", 32, "--init", str(trained), *extra))
    try:
        assert t.state.origin == {
            "mode": "init",
            "source": str(trained),
            "source_sha256": src.sha256,
            "source_tick": 16,
            "keep_optimizer": keep,
        }
        assert t.state.counters.tick == 0
        weights = t.state.model.state_dict()
        assert all(torch.equal(weights[k], v) for k, v in src.group("model").items())
        assert same_state(t.state.loader_state_dict(), t.stream.state_dict())  # a new run's
        assert t.stream.positions != src.tensors[LOADER_POSITIONS].tolist()
        if keep:
            assert_optimizer_is(t, optimizer_moments(src))
        else:
            assert all(not t.state.optimizer.state[p] for p in t.state.model.parameters())
    finally:
        t.close()


def assert_optimizer_is(t, saved: dict) -> None:
    opt = t.state.optimizer
    names = dict(t.state.model.named_parameters())
    assert set(saved) == set(names)
    for name, p in names.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key].cpu(), saved[name][key]), (name, key)
