"""What each collective of a world of several ranks asks of torch.distributed, recorded in
one process (`torch.distributed`'s calls replaced by stand-ins that play a peer rank): the
group each one runs on (the control group for everything but the gradients), the dtype and
device of what it carries, what the rank returns, and what leaving the group does. (The
values of a real two-rank world are tests/trainer/test_distributed_world.py.)"""

from __future__ import annotations

import pytest
import torch

from atom_train.trainer import distributed
from atom_train.trainer.distributed import World

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not available"
)

CONTROL = object()  # the control group a world was given (what NCCL worlds have)
BIG = float(2**24 + 1)  # the first integer float32 cannot hold: float64 carries it exactly


class _Peer:
    """torch.distributed's collectives, recorded, in a world where the peer rank holds
    what `peer` gives for this rank's tensor (by default the same)."""

    def __init__(self, monkeypatch, peer=lambda t: t.clone(), initialized: bool = True):
        import torch.distributed as dist

        self.calls: list[tuple] = []
        self.peer = peer
        sum_op = dist.ReduceOp.SUM

        def all_reduce(t, op=sum_op, group=None):
            self.calls.append(("all_reduce", op, group, t.dtype, t.device.type))
            other = self.peer(t)
            t.copy_(torch.maximum(t, other) if op == dist.ReduceOp.MAX else t + other)

        def all_gather_object(out, obj, group=None):
            self.calls.append(("all_gather_object", len(out), group))
            out[:] = [obj, {"peer": obj}]

        def all_gather(parts, t, group=None):
            self.calls.append(("all_gather", len(parts), tuple(t.shape), group))
            for i, p in enumerate(parts):
                p.copy_(t + i)

        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
        monkeypatch.setattr(dist, "all_gather", all_gather)
        monkeypatch.setattr(
            dist, "barrier", lambda group=None: self.calls.append(("barrier", group))
        )
        monkeypatch.setattr(dist, "destroy_process_group", lambda: self.calls.append(("destroy",)))
        monkeypatch.setattr(dist, "is_initialized", lambda: initialized)


def _world(rank: int = 0) -> World:
    return World(rank=rank, size=2, local_rank=rank, backend="nccl", _control=CONTROL)


def test_the_gradients_go_on_the_default_group_the_rest_on_the_control_group(monkeypatch):
    import torch.distributed as dist

    peer = _Peer(monkeypatch)
    w = _world()
    a = torch.zeros(2, requires_grad=True)
    a.grad = torch.tensor([1.0, 3.0])
    w.average_grads([a])
    w.agree_max([1.0])
    w.mean(torch.tensor([1.0]))
    w.gather_objects("x")
    w.gather_streams({"n": torch.tensor([1])})
    w.barrier()
    w.close(clean=True)
    SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX
    assert peer.calls == [
        ("all_reduce", SUM, None, torch.float32, "cpu"),  # the gradients' own backend
        ("all_reduce", MAX, CONTROL, torch.float64, "cpu"),
        ("all_reduce", SUM, CONTROL, torch.float64, "cpu"),
        ("all_gather_object", 2, CONTROL),
        ("all_gather", 2, (1,), CONTROL),
        ("barrier", CONTROL),
        ("barrier", CONTROL),  # a clean close meets the others first
        ("destroy",),
    ]


def test_the_gradients_average_into_each_parameters_own_shape(monkeypatch):
    # The peer's gradients are 3 times this rank's: the average is twice them.
    _Peer(monkeypatch, peer=lambda t: 3 * t)
    a, b, c = (torch.zeros(2, 2, requires_grad=True), torch.zeros(1, requires_grad=True),
               torch.zeros(3, requires_grad=True))  # fmt: skip
    a.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    c.grad = torch.tensor([5.0, 6.0, 7.0])
    _world().average_grads([a, b, c])
    assert a.grad.tolist() == [[2.0, 4.0], [6.0, 8.0]]
    assert b.grad is None
    assert c.grad.tolist() == [10.0, 12.0, 14.0]


def test_the_maximum_is_agreed_in_float64(monkeypatch):
    _Peer(monkeypatch, peer=lambda t: t - 1)  # the peer's values are all smaller
    got = _world().agree_max([BIG, -BIG, 0.5])
    assert got == [BIG, -BIG, 0.5] and all(type(x) is float for x in got)
    _Peer(monkeypatch, peer=lambda t: t + 2)  # and now larger
    assert _world(1).agree_max([BIG, 0.0]) == [BIG + 2, 2.0]


def test_the_mean_is_of_float64_on_the_cpu_and_detached(monkeypatch):
    _Peer(monkeypatch, peer=lambda t: t + 2)
    # Atom counts (int64) past float32's integers: their mean is exact.
    m = _world().mean(torch.tensor([2**24 + 1, 4]))
    assert m.dtype == torch.float64 and m.tolist() == [BIG + 1, 5.0]
    loss = torch.tensor([1.5], requires_grad=True) * 2
    m = _world().mean(loss)
    assert m.tolist() == [4.0] and not m.requires_grad
    # A world of one: the same cast, no collective.
    one = World().mean(torch.tensor([2**24 + 1]))
    assert one.dtype == torch.float64 and one.tolist() == [BIG]
    assert not World().mean(loss).requires_grad


class _OnDevice:
    """A tensor on a device that records where it is asked to go."""

    def __init__(self, moves: list):
        self.moves = moves

    def detach(self):
        self.moves.append("detach")
        return self

    def to(self, *args):
        self.moves.append(args)
        return torch.tensor([1.0], dtype=torch.float64)


def test_the_mean_is_taken_on_the_cpu_whatever_the_device(monkeypatch):
    _Peer(monkeypatch)
    for w in (World(), _world()):
        moves: list = []
        w.mean(_OnDevice(moves))
        assert moves == ["detach", ("cpu", torch.float64)]


def test_objects_are_gathered_in_rank_order_on_rank_0_only(monkeypatch):
    peer = _Peer(monkeypatch)
    assert _world(0).gather_objects({"r": 0}) == [{"r": 0}, {"peer": {"r": 0}}]
    assert _world(1).gather_objects({"r": 1}) is None
    assert [c[:2] for c in peer.calls] == [("all_gather_object", 2)] * 2


def test_stream_buffers_are_padded_to_the_longest_before_the_gather(monkeypatch):
    # The peer's buffers are 3 atoms long: this rank's 1 is padded to 3 with zeros.
    peer = _Peer(monkeypatch, peer=lambda t: torch.full_like(t, 3.0))
    buf = torch.full((2, 1, 2), 5.0)
    got = _world().gather_streams({"n": torch.tensor([1, 1]), "buf": buf, "a": torch.ones(2, 1)})
    assert list(got) == ["a", "buf", "n"]  # in key order, the same on every rank
    assert [c for c in peer.calls if c[0] == "all_gather"] == [
        ("all_gather", 2, (2, 1), CONTROL),
        ("all_gather", 2, (2, 3, 2), CONTROL),
        ("all_gather", 2, (2,), CONTROL),
    ]
    rank0 = [[5.0, 5.0], [0.0, 0.0], [0.0, 0.0]]
    rank1 = [[6.0, 6.0], [1.0, 1.0], [1.0, 1.0]]  # (the stand-in's peer: this rank's + 1)
    assert got["buf"].tolist() == [rank0, rank0, rank1, rank1]
    assert got["n"].tolist() == [1, 1, 2, 2] and got["a"].tolist() == [[1.0], [1.0], [2.0], [2.0]]
    # The longest rank pads nothing; rank 1 returns nothing.
    _Peer(monkeypatch, peer=lambda t: torch.zeros_like(t))
    assert _world().gather_streams({"buf": buf})["buf"].shape == (4, 1, 2)
    assert _world(1).gather_streams({"buf": buf}) is None


def test_leaving_the_group_meets_the_others_only_after_a_clean_run(monkeypatch):
    peer = _Peer(monkeypatch)
    _world().close(clean=False)
    assert peer.calls == [("destroy",)]
    peer = _Peer(monkeypatch, initialized=False)  # already gone: nothing to leave
    _world().close(clean=True)
    assert peer.calls == []
    World().close(clean=True)
    World().barrier()
    assert peer.calls == []


class _Stream:
    def __init__(self, corpus, B, **kw):
        self.args = (corpus, B, kw)


def test_a_ranks_stream_gets_the_runs_loader_options(monkeypatch, tmp_path):
    from atom_train.data.loader import ByteCorpus, stream_offsets

    (tmp_path / "a.txt").write_bytes(bytes(range(256)) * 8)
    corpus = ByteCorpus(str(tmp_path / "a.txt"))
    monkeypatch.setattr(distributed, "BatchedByteStream", _Stream)
    one = distributed.open_rank_stream(corpus, 4, World(), offsets=None, pack_mode="plain",
                                       threads=3)  # fmt: skip
    assert one.args[1:] == (4, {"pack_mode": "plain", "offsets": one.args[2]["offsets"],
                                "threads": 3})  # fmt: skip
    assert stream_offsets(corpus, 4, one.args[2]["offsets"]) == stream_offsets(corpus, 4, "even")
    r1 = distributed.open_rank_stream(corpus, 4, World(rank=1, size=2), offsets=None,
                                      pack_mode="utf8", threads=2)  # fmt: skip
    assert r1.args == (corpus, 2, {"pack_mode": "utf8", "threads": 2,
                                   "offsets": stream_offsets(corpus, 4, "even")[2:4]})  # fmt: skip
    seeded = distributed.open_rank_stream(corpus, 4, World(), offsets=5, pack_mode="utf8",
                                          threads=None)  # fmt: skip
    assert seeded.args == (corpus, 4, {"pack_mode": "utf8", "offsets": 5, "threads": None})


class _Time:
    """A clock that moves only when slept on, by 1/20 s a sleep (exact in binary)."""

    def __init__(self):
        self.sleeps = []

    def monotonic(self):
        return 100.0 + len(self.sleeps) / 20

    def sleep(self, s):
        self.sleeps.append(s)


def test_a_quiet_rank_polls_every_50_ms_until_stopped_or_its_wait_ends(monkeypatch, capsys):
    from atom_train.common.cli import UserError

    e = UserError("the corpus changed")
    clock = _Time()
    monkeypatch.setattr(distributed, "time", clock)
    polls = iter([False] * 3 + [True])
    assert distributed.refuse(e, World(rank=1, size=2, local_rank=1), lambda: next(polls)) == 2
    assert clock.sleeps == [0.05] * 3 and capsys.readouterr().err == ""
    clock.sleeps.clear()
    assert distributed.refuse(e, World(rank=1, size=2, local_rank=1), lambda: False, 1.0) == 2
    assert len(clock.sleeps) == 20 and set(clock.sleeps) == {0.05}
    assert capsys.readouterr().err.count("rank 1: the corpus changed") == 1
    # The default wait is a minute.
    clock.sleeps.clear()
    distributed.refuse(e, World(rank=1, size=2, local_rank=1), lambda: False)
    assert len(clock.sleeps) == 1200


class _Out:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def flush(self):
        self.log.append(("flush", self.name))


def test_a_rank_exits_with_its_code_after_flushing_both_streams(monkeypatch):
    log: list = []

    class Exited(BaseException):
        pass

    def _exit(code):
        log.append(("exit", code))
        raise Exited

    monkeypatch.setattr(distributed.sys, "stdout", _Out(log, "out"))
    monkeypatch.setattr(distributed.sys, "stderr", _Out(log, "err"))
    monkeypatch.setattr(distributed.os, "_exit", _exit)
    with pytest.raises(Exited):
        distributed.exit_rank(3)
    assert log == [("flush", "out"), ("flush", "err"), ("exit", 3)]
