"""The collectives of a world of ranks (`atom_train.distributed.World`), in process: two
ranks forked from the test, joined by gloo on the loopback, each checking what every
collective returns against values worked out by hand. (The trainer under torchrun, end to
end, is tests/scenarios/test_distributed.py.)"""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback

import pytest
import torch
from helpers.loader_state import same_state

from atom_train.common.cli import UserError
from atom_train.data.loader import BatchedByteStream, ByteCorpus, join_state_dicts
from atom_train.trainer import distributed
from atom_train.trainer.distributed import World

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not available"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, size: int, port: int) -> dict | str:
    """One rank: join, run every collective, return what it saw (or its traceback)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
           "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank)}  # fmt: skip
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        world = distributed.init_world(distributed.world_from_env(), "cpu", timeout_s=60)
        seen = {"rank": world.rank, "size": world.size, "backend": world.backend}
        seen["shard"] = world.shard(8)
        # Rank r's gradients are (r + 1) times [1, 2, 3] and [[4]]; a parameter without a
        # gradient is left alone.
        a, b, none = (torch.zeros(3, requires_grad=True), torch.zeros(1, 1, requires_grad=True),
                      torch.zeros(2, requires_grad=True))  # fmt: skip
        a.grad = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
        b.grad = torch.tensor([[4.0]]) * (rank + 1)
        world.average_grads([a, none, b])
        seen["grads"] = (a.grad.tolist(), b.grad.tolist(), none.grad)
        seen["mean"] = world.mean(torch.tensor([rank + 1.0, 10.0 * rank])).tolist()
        seen["max"] = world.agree_max([float(rank), -float(rank), 7.0])
        seen["objects"] = world.gather_objects({"r": rank})
        # Per-stream tensors: two streams a rank; rank r has 2r + 1 live atoms of 3 values.
        streams = {
            "n": torch.tensor([rank, rank]),
            "buf": torch.full((2, 2 * rank + 1, 3), float(rank + 1)),
        }
        gathered = world.gather_streams(streams)
        seen["streams"] = None if gathered is None else {k: v.tolist() for k, v in gathered.items()}
        world.barrier()
        world.close(clean=True)
        seen["still_joined"] = torch.distributed.is_initialized()
        return seen
    except BaseException:
        return traceback.format_exc()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _child_rank(rank: int, size: int, port: int, results) -> None:
    results.put(_rank(rank, size, port))


@pytest.fixture(scope="module")
def two_ranks() -> dict[int, dict]:
    """Rank 0 in this process (so that what it runs is seen here), rank 1 forked."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    port = _free_port()
    child = ctx.Process(target=_child_rank, args=(1, 2, port, results))
    child.start()
    try:
        seen = {0: _rank(0, 2, port), 1: results.get(timeout=120)}
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    for r, s in seen.items():
        assert isinstance(s, dict), f"rank {r} failed:\n{s}"
    return seen


def test_two_ranks_join_with_their_place(two_ranks):
    assert [(s["rank"], s["size"], s["backend"]) for _, s in sorted(two_ranks.items())] == [
        (0, 2, "gloo"),
        (1, 2, "gloo"),
    ]
    assert not any(s["still_joined"] for s in two_ranks.values())  # close() left the group
    assert two_ranks[0]["shard"] == (0, 4) and two_ranks[1]["shard"] == (4, 8)


def test_gradients_are_averaged_not_summed(two_ranks):
    for s in two_ranks.values():
        assert s["grads"] == ([1.5, 3.0, 4.5], [[6.0]], None)


def test_the_small_collectives(two_ranks):
    for s in two_ranks.values():
        assert s["mean"] == [1.5, 5.0]
        assert s["max"] == [1.0, 0.0, 7.0]
    assert two_ranks[0]["objects"] == [{"r": 0}, {"r": 1}] and two_ranks[1]["objects"] is None


def test_streams_gather_in_rank_order_padded_to_the_longest(two_ranks):
    assert two_ranks[1]["streams"] is None
    first = [[1.0] * 3, [0.0] * 3, [0.0] * 3]  # rank 0's one atom, padded to rank 1's three
    second = [[2.0] * 3] * 3
    assert two_ranks[0]["streams"] == {"n": [0, 0, 1, 1], "buf": [first, first, second, second]}


def test_a_world_of_one_is_the_identity():
    world = World()
    assert not world.distributed and world.is_main and world.shard(8) == (0, 8)
    a = torch.zeros(2, requires_grad=True)
    a.grad = torch.tensor([1.0, 2.0])
    world.average_grads([a])
    assert a.grad.tolist() == [1.0, 2.0]
    assert world.mean(torch.tensor([3.0])).tolist() == [3.0]
    assert world.agree_max([1.0, -2.0]) == [1.0, -2.0]
    assert world.gather_objects("x") == ["x"]
    t = {"n": torch.tensor([1])}
    assert world.gather_streams(t) is t
    assert distributed.init_world(world, "cpu", 1.0) is world
    world.barrier()
    world.close(clean=True)


def test_the_world_comes_from_torchruns_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert not distributed.launched_by_torchrun() and distributed.world_from_env() == World()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert not distributed.launched_by_torchrun()  # all three or none
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.launched_by_torchrun()
    w = distributed.world_from_env()
    assert (w.rank, w.size, w.local_rank, w.is_main, w.distributed) == (3, 4, 1, False, True)
    assert w.shard(8) == (6, 8)


def test_refusals_every_rank_reaches_alike(monkeypatch):
    with pytest.raises(UserError, match="-B 6 is not divisible by the world size 4") as e:
        distributed.check_world(World(rank=0, size=4), 6, "cpu")
    assert "use a -B that 4 divides" in str(e.value)
    distributed.check_world(World(rank=0, size=4), 8, "cpu")
    distributed.check_world(World(), 5, "cuda")  # one process: nothing to check here
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(UserError) as e:
        distributed.check_world(World(rank=1, size=4), 8, "cuda")
    assert str(e.value) == (
        "--device cuda with 2 ranks on this node but torch sees 1 CUDA device(s): use "
        "--nproc-per-node <= the GPU count"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    distributed.check_world(World(rank=1, size=4), 8, "cuda")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(UserError, match="4 ranks on this node"):  # default: the world size
        distributed.check_world(World(rank=1, size=4), 8, "cuda")


def test_a_refusal_is_said_once_per_node_and_a_ranks_own_after_the_wait(capsys):
    e = UserError("-B 5 is not divisible by the world size 2")
    # A node's first rank says it at once.
    assert distributed.refuse(e, World(rank=2, size=4, local_rank=0), lambda: False) == 2
    assert capsys.readouterr().err.count("error: -B 5 is not divisible") == 1
    # The others wait, silent, until stopped (torchrun stops them once the speaker has ended).
    polls = iter([False, False, True])
    assert distributed.refuse(e, World(rank=1, size=4, local_rank=1), lambda: next(polls)) == 2
    assert capsys.readouterr().err == ""
    # Never stopped: the error was that rank's own, so it says it, naming itself.
    assert distributed.refuse(e, World(rank=3, size=4, local_rank=1), lambda: False, 0.1) == 2
    err = capsys.readouterr().err
    assert err.count("error: rank 3: -B 5 is not divisible") == 1, err


def test_the_ranks_loader_states_join_into_the_single_process_state_and_slice_back(tmp_path):
    """What a checkpoint of a world of 2 records of the loader is what one process with all
    B streams would record; each rank loads its own share of it back; and a rank's streams
    start where a single process's would, without building all B of them."""
    (tmp_path / "c.txt").write_bytes(b"Un petit texte pour les flux. " * 40)
    corpus = ByteCorpus(str(tmp_path / "c.txt"))
    single = BatchedByteStream(corpus, 4, offsets=3)
    worlds = [World(rank=r, size=2) for r in range(2)]
    ranks = [distributed.open_rank_stream(corpus, 4, w, offsets=3, pack_mode="utf8", threads=1)
             for w in worlds]  # fmt: skip
    assert [p for s in ranks for p in s.positions] == single.positions
    for s in (*ranks, single):
        s.next_window(9)
    joined = join_state_dicts([s.state_dict() for s in ranks])
    assert same_state(joined, single.state_dict())
    for w, s in zip(worlds, ranks, strict=True):
        again = BatchedByteStream(corpus, 2)
        again.load_state_dict(joined, streams=w.shard(4))
        assert again.positions == s.positions


def test_runtime_states_slice_by_rank_with_the_atom_buffers_trimmed():
    state = {
        "z": torch.arange(8.0).reshape(4, 2),
        "n_atoms": torch.tensor([1, 3, 2, 0]),
        "e_buf": torch.arange(4 * 5 * 2.0).reshape(4, 5, 2),
        "h_buf": -torch.arange(4 * 5 * 2.0).reshape(4, 5, 2),
    }
    first = distributed.rank_runtime_state(state, World(rank=0, size=2), 4)
    second = distributed.slice_runtime_state(state, 2, 4)
    assert first["z"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert first["n_atoms"].tolist() == [1, 3] and second["n_atoms"].tolist() == [2, 0]
    assert first["e_buf"].shape == (2, 3, 2) and second["h_buf"].shape == (2, 2, 2)
    assert torch.equal(first["e_buf"], state["e_buf"][:2, :3])
    assert torch.equal(second["h_buf"], state["h_buf"][2:, :2])
    assert all(t.is_contiguous() for t in first.values())
    empty = distributed.slice_runtime_state(state, 4, 4)
    assert empty["e_buf"].shape == (0, 0, 2)


def test_a_ranks_streams_start_where_one_process_puts_them(tmp_path):
    from atom_train.data.loader import BatchedByteStream, ByteCorpus

    (tmp_path / "a.txt").write_bytes(bytes(range(256)) * 40)
    corpus = ByteCorpus(str(tmp_path / "a.txt"))
    for offsets in (None, 7):
        where = "even" if offsets is None else offsets
        everyone = BatchedByteStream(corpus, 8, offsets=where).positions
        for r in range(4):
            s = distributed.open_rank_stream(corpus, 8, World(rank=r, size=4), offsets=offsets,
                                             pack_mode="plain", threads=1)  # fmt: skip
            assert list(s.positions) == list(everyone[2 * r : 2 * r + 2])
            assert s.B == 2 and s.pack_mode == "plain"
        one = distributed.open_rank_stream(corpus, 8, World(), offsets=offsets, pack_mode="utf8",
                                           threads=None)  # fmt: skip
        assert list(one.positions) == list(everyone)


def test_joining_passes_the_timeout_the_backend_and_the_gpu(monkeypatch):
    """What init_world asks of torch.distributed, recorded: the collective timeout given as
    --dist-timeout (not torch's default), gloo on the CPU with no control group, nccl on
    CUDA with LOCAL_RANK's GPU and a gloo control group under the same timeout."""
    import datetime

    import torch.distributed as dist

    calls: list = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(dist, "new_group", lambda **kw: calls.append(("group", kw)) or "ctl")
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("device", i)))
    t = datetime.timedelta(seconds=7.5)

    cpu = distributed.init_world(World(rank=1, size=2, local_rank=1), "cpu", 7.5)
    assert calls == [("init", {"backend": "gloo", "timeout": t})]
    assert (cpu.backend, cpu._control) == ("gloo", None)

    calls.clear()
    gpu = distributed.init_world(World(rank=1, size=2, local_rank=1), "cuda", 7.5)
    assert calls == [
        ("device", 1),
        ("init", {"backend": "nccl", "timeout": t}),
        ("group", {"backend": "gloo", "timeout": t}),
    ]
    assert (gpu.backend, gpu._control) == ("nccl", "ctl")
