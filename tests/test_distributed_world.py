"""The collectives of a world of ranks (`atom_train.distributed.World`), in process: two
ranks forked from the test, joined by gloo on the loopback, each checking what every
collective returns against values worked out by hand. (The trainer under torchrun, end to
end, is tests/test_distributed.py.)"""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback

import pytest
import torch

from atom_train import distributed
from atom_train.distributed import World

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
        # Per-stream tensors: one stream a rank; rank r has r + 1 live atoms.
        streams = {
            "n": torch.tensor([rank]),
            "buf": torch.full((1, rank + 1, 2), float(rank + 1)),
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
    assert two_ranks[0]["streams"] == {
        "n": [0, 1],
        "buf": [[[1.0, 1.0], [0.0, 0.0]], [[2.0, 2.0], [2.0, 2.0]]],
    }


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
