"""The checkpointer's edges (`atom_train.trainer.checkpointer`): the divergence guard's
candidates and the checkpoints it sets aside, a damaged snapshot passed again, a snapshot
that appears during its write, the guard's state and the gathered streams in what is
written, and the one-line refusals of a restore. Checkpoint files are built with
`checkpoint_file.save_checkpoint` (a few bytes each); the manager's tests build one trainer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.loader_state import same_state
from helpers.trainer_kit import args

from atom_train import train
from atom_train.common.cli import UserError
from atom_train.data.loader import AtomDataError, join_state_dicts
from atom_train.trainer import checkpointer
from atom_train.trainer.checkpoint_file import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from atom_train.trainer.divergence import GUARD_KEY, Candidate
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.rundir import ROLLING, snapshot_name
from atom_train.trainer.train_state import loader_header, saved_loader_state

_T = {"x": torch.zeros(2)}


def _ck(out: Path, name: str, tick, step=1, **meta) -> Path:
    training = {"tick": tick, "step": step} if tick is not None else None
    m = {"training": training, **meta} if training is not None else dict(meta)
    return save_checkpoint(out / name, _T, m)


def test_rewind_candidates_are_the_checkpoints_with_a_position_and_their_health(tmp_path):
    out = tmp_path
    health = {"suspect": False, "bad_steps": 0}
    _ck(out, snapshot_name(8), 8, 1)
    _ck(out, snapshot_name(16), "16", "2", **{GUARD_KEY: {"health": health}})
    _ck(out, ROLLING, 24, 3, **{GUARD_KEY: {"health": "not a mapping"}})
    _ck(out, "no-training.safetensors", None, note="x")
    _ck(out, "bad-tick.safetensors", "soon")
    _ck(out, "no-step.safetensors", None, training={"tick": 4})
    _ck(out, "null-training.safetensors", None, training=None)
    (out / "garbage.safetensors").write_bytes(b"\x00" * 40)
    got = sorted(checkpointer.rewind_candidates(out), key=lambda c: c.tick)
    assert got == [
        Candidate(snapshot_name(8), 8, 1, None),
        Candidate(snapshot_name(16), 16, 2, health),
        Candidate(ROLLING, 24, 3, None),
    ]
    assert checkpointer.rewind_candidates(out / "absent") == []


def test_checkpoints_after_a_tick_are_set_aside_under_a_free_name(tmp_path, capsys):
    out = tmp_path
    for tick in (8, 16, 24, 32):
        _ck(out, snapshot_name(tick), tick)
    _ck(out, ROLLING, 32)
    # A name already taken by an earlier rewind: the next one is -2.
    (out / f"{snapshot_name(24)}.given-up").write_bytes(b"earlier")
    moved = checkpointer.set_aside_after(out, 16)
    assert moved == [
        (ROLLING, f"{ROLLING}.given-up"),
        (snapshot_name(24), f"{snapshot_name(24)}.given-up-2"),
        (snapshot_name(32), f"{snapshot_name(32)}.given-up"),
    ]
    assert (out / f"{snapshot_name(24)}.given-up").read_bytes() == b"earlier"
    assert sorted(p.name for p in list_checkpoints(out)) == [snapshot_name(8), snapshot_name(16)]
    for _, aside in moved:  # kept whole, for a look
        assert load_checkpoint(out / aside).meta["training"]["tick"] > 16
    assert checkpointer.set_aside_after(out, 16) == []  # the tick itself stays
    assert checkpointer.set_aside_after(out, 8) == [
        (snapshot_name(16), f"{snapshot_name(16)}.given-up")
    ]
    assert capsys.readouterr().err == ""


def test_aside_names_count_up_from_two(tmp_path):
    p = tmp_path / "snapshot.safetensors"
    assert checkpointer._aside_name(p) == tmp_path / "snapshot.safetensors.damaged"
    (tmp_path / "snapshot.safetensors.damaged").touch()
    assert checkpointer._aside_name(p) == tmp_path / "snapshot.safetensors.damaged-2"
    (tmp_path / "snapshot.safetensors.damaged-2").touch()
    assert checkpointer._aside_name(p) == tmp_path / "snapshot.safetensors.damaged-3"
    assert checkpointer._aside_name(p, "x") == tmp_path / "snapshot.safetensors.x"


# ---- the manager, on one trainer ---------------------------------------------------------


@pytest.fixture
def trainer(corpus, tmp_path):
    plan = resolve_command(
        args(corpus, tmp_path / "run", 32), warn=lambda m: None, every_flag_given=True
    )
    plan.out.mkdir(parents=True, exist_ok=True)
    t = train.Trainer(plan, train.Signals())
    yield t
    t.close()


def _said(capsys) -> list[str]:
    return [line.split("] ", 1)[-1] for line in capsys.readouterr().err.splitlines()]


def test_a_damaged_snapshot_is_moved_aside_and_written_again(trainer, capsys):
    t = trainer
    snap = t.ckpts.save("snapshot")
    capsys.readouterr()
    for n, aside in ((1, ".damaged"), (2, ".damaged-2")):
        good = snap.read_bytes()
        snap.write_bytes(good[: len(good) // 2])  # cut short
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(snap)
        reason = str(e.value).removeprefix(f"{snap}: ")
        t.state.counters.step = 10 + n
        assert t.ckpts.save("snapshot") == snap
        assert _said(capsys) == [
            f"warning: {snap.name} is damaged ({reason}): moved aside to {snap.name}{aside}, "
            "written again",
            f"snapshot {snap.name}",
        ]
        assert (snap.parent / f"{snap.name}{aside}").read_bytes() == good[: len(good) // 2]
        assert load_checkpoint(snap).meta["training"]["step"] == 10 + n
        assert t.ckpts.last == snap


def test_a_snapshot_that_appears_during_its_write_is_not_overwritten(trainer, monkeypatch):
    t = trainer
    real = checkpointer.save_checkpoint

    def another_writer_first(path, *a, **k):
        Path(path).write_bytes(b"theirs")
        return real(path, *a, **k)

    monkeypatch.setattr(checkpointer, "save_checkpoint", another_writer_first)
    with pytest.raises(CheckpointError, match=r"refusing to overwrite .*snapshots are permanent"):
        t.ckpts.save("snapshot")
    assert (t.plan.out / snapshot_name(0)).read_bytes() == b"theirs"
    assert t.ckpts.last is None


def test_every_checkpoint_holds_the_guards_state_when_there_is_a_guard(trainer):
    t = trainer
    t.ckpts.guard = None  # (the trainer sets one: written without it)
    assert GUARD_KEY not in load_checkpoint(t.ckpts.save("rolling")).meta
    state = {"health": {"suspect": False}, "seen": [1, 2]}
    t.ckpts.guard = SimpleNamespace(state_dict=lambda: state)
    for kind in ("rolling", "snapshot", "final"):
        assert load_checkpoint(t.ckpts.save(kind)).meta[GUARD_KEY] == state


class _TwoRanks:
    """Rank 0 of a world of two, as the manager sees it: the gathers hand back what the
    test says the other rank held too."""

    def __init__(self, world, runtime, loaders):
        self._w, self.runtime, self.loaders = world, runtime, loaders
        self.size, self.is_main, self.distributed = 2, True, True

    def gather_streams(self, mine):
        self.gave_streams = mine
        return self.runtime

    def gather_objects(self, mine):
        self.gave_loader = mine
        return self.loaders

    def agree_max(self, values):
        return values


def test_what_is_written_is_the_gathered_streams_of_the_whole_world(trainer):
    t = trainer
    own_runtime = t.state.runtime.state_dict()
    runtime = {k: v.clone() for k, v in own_runtime.items()}
    runtime["n_atoms"] = runtime["n_atoms"] + 3  # not this rank's
    t.stream.next_window(16)
    moved = t.stream.state_dict()  # not the state's own loader state
    assert not same_state(moved, t.state.loader_state_dict())
    ranks = [t.state.loader_state_dict(), moved]  # rank 0's share, then rank 1's
    c = checkpointer.CheckpointManager(
        t.plan, t.state, _TwoRanks(t.world, runtime, ranks), t.run_clock, lambda *a: None
    )
    ck = load_checkpoint(c.save("rolling"))
    assert ck.meta["training"]["world_size"] == 2
    assert torch.equal(ck.tensors["runtime/n_atoms"], runtime["n_atoms"])
    # (what this rank gave to the gathers: its own streams' runtime and loader state)
    assert c.world.gave_streams.keys() == own_runtime.keys()
    assert all(torch.equal(c.world.gave_streams[k], v) for k, v in own_runtime.items())
    assert same_state(c.world.gave_loader, t.state.loader_state_dict())
    whole = join_state_dicts(ranks)
    assert whole["B"] == 8 and same_state(saved_loader_state(ck), whole)
    assert ck.meta["loader_state"] == loader_header(whole)


def test_the_manager_reports_slow_writes_to_the_warner_it_was_given(trainer, monkeypatch):
    """The warning goes to the manager's own warner, with the file's size in MiB and the
    write's share of the interval (a rolling write at the very moment of the last one: no
    division by zero)."""
    t = trainer
    said = []
    c = checkpointer.CheckpointManager(
        t.plan, t.state, t.world, t.run_clock, lambda k, m: said.append((k, m))
    )
    big = t.plan.out / "big.safetensors"
    with open(big, "wb") as f:
        f.truncate(3 * 2**20 + 2**19)  # 3.5 MiB, sparse
    now = [100.0]
    monkeypatch.setattr(checkpointer.time, "time", lambda: now[0])

    def write_taking(seconds):
        def write(*a):
            now[0] += seconds
            return big

        return write

    c.last_time, now[0] = 96.0, 100.0  # 4 s since the last one, a write of 3 s: 75%
    monkeypatch.setattr(c, "_write", write_taking(3.0))
    c.save("rolling")
    c.last_time = now[0]  # none since: the share of an interval of (at least) 1e-9 s
    monkeypatch.setattr(c, "_write", write_taking(2.0))
    c.save("rolling")
    tail = "of the checkpoint interval: check the disk, or raise --ckpt-every"
    assert said == [
        ("ckpt", f"writing big.safetensors (3.5 MiB) took 3.0 s, 75% {tail}"),
        ("ckpt", f"writing big.safetensors (3.5 MiB) took 2.0 s, {200 / 1e-9:.0f}% {tail}"),
    ]
    c.last_time = None  # the first of a launch: against the launch's start
    c.launch_time, now[0] = 80.0, 100.0
    monkeypatch.setattr(c, "_write", write_taking(1.5))  # 1.5 s of 20: quiet
    said.clear()
    c.save("rolling")
    assert said == [] and c.last_time == 101.5
    c.last_time, c.launch_time = None, 99.0
    c.save("rolling")
    assert [m for _, m in said] == [f"writing big.safetensors (3.5 MiB) took 1.5 s, 60% {tail}"]


# ---- restore_from_source's refusals and paths, on stand-ins ------------------------------


class _Stream:
    def __init__(self, fail=None):
        self.loaded, self.fail = [], fail

    def load_state_dict(self, state, streams=None):
        if self.fail:
            raise self.fail
        self.loaded.append((state, streams))

    def snapshot(self):
        return ("snapshot", len(self.loaded))


class _State:
    def __init__(self, fail=None):
        self.fail, self.calls, self.loader_state, self.origin = fail, [], None, None

    def restore_run(self, ck, runtime_state):
        if self.fail:
            raise self.fail
        self.calls.append(("run", runtime_state))
        self.loader_state = {"restored": True}

    def restore_weights(self, ck):
        self.calls.append(("weights",))

    def restore_optimizer(self, ck):
        self.calls.append(("optimizer",))


class _Ck:
    path = Path("/runs/a/ckpt-rolling.safetensors")
    sha256 = "ab" * 32

    def group(self, prefix):
        assert prefix == "runtime"
        n = torch.arange(4)
        return {
            "n_atoms": n,
            "e_buf": torch.zeros(4, 5, 1),
            "h_buf": torch.zeros(4, 5, 1),
        }


class _World:
    def __init__(self, size=1, rank=0):
        self.size, self.rank = size, rank

    @property
    def distributed(self):
        return self.size > 1

    def shard(self, B):
        n = B // self.size
        return self.rank * n, (self.rank + 1) * n


def _plan(mode="resume", **kw):
    base = dict(
        source=_Ck(),
        mode=mode,
        skip_ticks=0,
        B=4,
        corpus=SimpleNamespace(size=1000),
        keep_optimizer=False,
    )
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    "err, line",
    [
        (
            CheckpointError("model mismatch: n_modes 8 vs 16"),
            f"{_Ck.path}: model mismatch: n_modes 8 vs 16",
        ),
        (CheckpointError(f"{_Ck.path}: already named"), f"{_Ck.path}: already named"),
    ],
)
def test_a_refused_restore_is_one_line_naming_the_file_once(err, line):
    with pytest.raises(UserError) as e:
        checkpointer.restore_from_source(_plan(), _State(fail=err), _World(), _Stream())
    assert str(e.value) == line
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_stream_that_cannot_take_the_state_is_a_refused_resume():
    with pytest.raises(UserError) as e:
        checkpointer.restore_from_source(
            _plan(), _State(), _World(), _Stream(fail=AtomDataError("B 4 vs 8"))
        )
    assert str(e.value) == f"cannot resume {_Ck.path}: B 4 vs 8"
    assert e.value.__suppress_context__


def test_a_resume_takes_this_ranks_share_and_a_rewind_moves_the_streams_on(monkeypatch):
    moves = []

    def moved(state, ticks, size):
        moves.append((state, ticks, size))
        return {"moved": ticks}

    monkeypatch.setattr(checkpointer, "moved_loader_state", moved)
    st, stream = _State(), _Stream()
    assert checkpointer.restore_from_source(_plan(), st, _World(), stream) == _Ck.path
    assert moves == [] and stream.loaded == [({"restored": True}, None)]
    assert st.loader_state == ("snapshot", 1) and st.origin is None
    ((_, runtime),) = st.calls
    assert runtime["n_atoms"].tolist() == [0, 1, 2, 3] and runtime["e_buf"].shape == (4, 3, 1)

    st, stream = _State(), _Stream()
    plan = _plan(skip_ticks=48)
    assert checkpointer.restore_from_source(plan, st, _World(2, 1), stream) == _Ck.path
    assert moves == [({"restored": True}, 48, 1000)]
    assert stream.loaded == [({"moved": 48}, (2, 4))]  # rank 1 of 2: streams 2 and 3
    ((_, runtime),) = st.calls
    assert runtime["n_atoms"].tolist() == [2, 3]


def test_a_fork_and_an_init_return_nothing_and_record_their_origin(monkeypatch):
    monkeypatch.setattr(checkpointer, "origin_of", lambda mode, ck, **kw: (mode, ck.path, kw))
    st, stream = _State(), _Stream()
    assert checkpointer.restore_from_source(_plan("fork"), st, _World(), stream) is None
    assert st.origin == ("fork", _Ck.path, {}) and st.loader_state == ("snapshot", 1)
    for keep, calls in ((False, [("weights",)]), (True, [("weights",), ("optimizer",)])):
        st, stream = _State(), _Stream()
        plan = _plan("init", keep_optimizer=keep)
        assert checkpointer.restore_from_source(plan, st, _World(), stream) is None
        assert st.calls == calls and stream.loaded == []
        assert st.origin == ("init", _Ck.path, {"keep_optimizer": keep})
        assert st.loader_state == ("snapshot", 0)
    st, stream = _State(), _Stream()
    assert checkpointer.restore_from_source(_plan(source=None), st, _World(), stream) is None
    assert st.loader_state == ("snapshot", 0) and st.calls == []


class _OtherRank(_TwoRanks):
    """Rank 1 of two (or rank 0 when `main`), with what the ranks agree on given."""

    def __init__(self, world, failed: float, main: bool = False):
        super().__init__(world, None, [])
        self.is_main, self.failed = main, failed

    def agree_max(self, values):
        return [max(values[0], self.failed)]


def test_a_rank_other_than_0_writes_nothing_and_fails_when_rank_0_fails(trainer):
    t = trainer
    c = checkpointer.CheckpointManager(
        t.plan, t.state, _OtherRank(t.world, 0.0), t.run_clock, lambda *a: None
    )
    assert c.save("rolling") is None and c.last_time is not None
    assert list_checkpoints(t.plan.out) == []
    c = checkpointer.CheckpointManager(
        t.plan, t.state, _OtherRank(t.world, 1.0), t.run_clock, lambda *a: None
    )
    with pytest.raises(CheckpointError) as e:
        c.save("rolling")
    assert str(e.value) == "rank 0 could not write the checkpoint"
    assert c.last_time is None
    # Rank 0 wrote, another rank failed (its gather): rank 0 fails too, the same way.
    c = checkpointer.CheckpointManager(
        t.plan, t.state, _OtherRank(t.world, 1.0, main=True), t.run_clock, lambda *a: None
    )
    c.world.runtime, c.world.loaders = t.state.runtime.state_dict(), [t.stream.state_dict()]
    with pytest.raises(CheckpointError, match=r"^rank 0 could not write the checkpoint$"):
        c.save("rolling")


def _plan_of(corpus, out, *extra):
    p = resolve_command(args(corpus, out, 32, *extra), warn=print, every_flag_given=True)
    p.out.mkdir(parents=True, exist_ok=True)
    return p


def test_a_launch_starts_with_this_ranks_streams_as_the_plan_says(corpus, tmp_path, monkeypatch):
    from atom_train.trainer.distributed import World

    plan = _plan_of(corpus, tmp_path / "run", "--offset-seed", "7", "--recurrence", "autograd")
    opened, built = [], []

    class Stream:
        def snapshot(self):
            return {"initial": True}

    def open_stream(corpus_, B, world, **kw):
        opened.append((corpus_, B, world.rank, kw))
        return Stream()

    real_tick = checkpointer.BatchedByteTick

    def tick(model, n, **kw):
        built.append((n, kw))
        return real_tick(model, n, **kw)

    monkeypatch.setattr(checkpointer, "open_rank_stream", open_stream)
    monkeypatch.setattr(checkpointer, "BatchedByteTick", tick)
    state, _, resumed = checkpointer.start_state(plan, World(rank=1, size=2))
    assert resumed is None and state.loader_state == {"initial": True}
    assert opened == [
        (
            plan.corpus,
            4,
            1,
            {
                "offsets": 7,
                "pack_mode": plan.config.pack_mode,
                "threads": plan.hardware.loader_threads,
            },
        )
    ]
    assert built == [(2, {"device": plan.device, "recurrence": plan.recurrence})]  # 2 of 4
    assert plan.recurrence == "autograd"

    def refuse(*a, **k):
        raise AtomDataError("train-0.txt changed since the run began")

    monkeypatch.setattr(checkpointer, "open_rank_stream", refuse)
    with pytest.raises(UserError, match=r"^train-0\.txt changed since the run began$"):
        checkpointer.start_state(plan, World())


def test_a_resume_trains_with_this_commands_weight_decay(trainer, corpus):
    t = trainer
    t.ckpts.save("rolling")
    plan = _plan_of(corpus, t.plan.out, "--weight-decay", "0.25")
    from atom_train.trainer.distributed import World

    state, _, resumed = checkpointer.start_state(plan, World())
    assert resumed == t.plan.out / ROLLING
    assert t.plan.weight_decay == 0.01  # what the checkpoint's optimizer holds
    decay = [g["weight_decay"] for g in state.optimizer.param_groups]
    assert decay == [0.25] * len(decay) and decay
