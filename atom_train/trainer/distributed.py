"""Data-parallel streams (docs/design.md#several-processes), launched by ``torchrun``.

Streams are independent, so a world of N processes runs the B streams one process would,
B/N each: rank r owns streams [r·B/N, (r+1)·B/N), at exactly the offsets a single process
gives them, with the same last-atom masks (each rank draws the global B masks and takes its
columns). After each window's backward the gradients are averaged across ranks with **one
all-reduce of a flat buffer** (not DDP: the field model's forward is not a module call that
DDP could hook, and one ~300 KB buffer per window is all there is to move), so every rank
takes the optimizer step a single process would, and the weights stay identical.

Collectives run on two groups: gradients on the training device's backend (nccl on CUDA,
gloo on CPU), and everything else (the stop/checkpoint decision at each window boundary, the
per-step statistics at log ticks, gathering the streams' state for a checkpoint) on a gloo
group of CPU tensors. Every collective has a timeout (`--dist-timeout`), so a crashed rank
ends the job instead of hanging it.

Placement (`open_rank_stream`, `rank_runtime_state`): which streams a rank owns, where they
start, and its share of a checkpoint's all-streams runtime state (the loader takes its share
of a saved loader state itself: `load_state_dict(state, streams=world.shard(B))`).

Only rank 0 writes into the run folder (logs, status, lock, checkpoints); checkpoints hold
all B streams in the single-process layout, so a run resumes on any world size dividing B.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from atom_train.common.cli import EXIT_USER_ERROR, UserError, user_error_exit
from atom_train.data.loader import BatchedByteStream, ByteCorpus, stream_offsets

# A world of one: no process group, every collective is the identity.
_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str | None = None  # the gradients' backend; None for a world of one
    _control: Any = field(default=None, repr=False)  # the gloo group for CPU collectives

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shard(self, B: int) -> tuple[int, int]:
        """The streams [lo, hi) this rank owns."""
        n = B // self.size
        return self.rank * n, (self.rank + 1) * n

    # ---- collectives (identity in a world of one) ----

    def average_grads(self, params: list[torch.Tensor]) -> None:
        """Average the parameters' gradients across ranks, in place, in one all-reduce."""
        if not self.distributed:
            return
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in params if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.size)
        torch._foreach_copy_(grads, _unflatten_dense_tensors(flat, grads))

    def agree_max(self, values: list[float]) -> list[float]:
        """The element-wise maximum of `values` over the ranks (CPU, control group)."""
        if not self.distributed:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._control)
        return t.tolist()

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of a (small) tensor over the ranks, returned on the CPU."""
        t = t.detach().to("cpu", torch.float64)
        if not self.distributed:
            return t
        import torch.distributed as dist

        dist.all_reduce(t, group=self._control)
        return t / self.size

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` (a JSON-like value), in rank order, on rank 0 (None elsewhere)."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self._control)
        return out if self.is_main else None

    def gather_streams(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Concatenate every rank's per-stream CPU tensors along dim 0 (streams), in rank
        order, on rank 0 (None elsewhere). Dim 1 of 3-dim tensors (the atom buffers, trimmed
        to each rank's live prefix) is zero-padded to the longest first."""
        if not self.distributed:
            return tensors
        import torch.distributed as dist

        out = {}
        for k in sorted(tensors):
            t = tensors[k].contiguous()
            if t.dim() == 3:
                L = int(self.agree_max([float(t.shape[1])])[0])  # (the longest pads by 0)
                t = torch.cat([t, t.new_zeros(t.shape[0], L - t.shape[1], t.shape[2])], 1)
            parts = [torch.empty_like(t) for _ in range(self.size)]
            dist.all_gather(parts, t, group=self._control)
            out[k] = torch.cat(parts)
        return out if self.is_main else None

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self._control)

    def close(self, clean: bool) -> None:
        """Leave the process group. After a clean run every rank first meets the others, so
        that none tears down its connections while a peer still has an operation in flight
        (gloo aborts the process when a connection closes under it)."""
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                if clean:
                    dist.barrier(group=self._control)
                dist.destroy_process_group()


def launched_by_torchrun() -> bool:
    return all(v in os.environ for v in _ENV_VARS)


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank's process with `code` once its run has closed everything (its
    files written and closed, the process group destroyed: `World.close`): flush stdout and
    stderr and exit without the interpreter's finalization. Gloo's C++ worker threads can
    outlive the process group by a moment, and one still holding a tensor when the
    interpreter tears down aborts the process (SIGABRT, "terminate called without an active
    exception"): a run that completed, reported by torchrun as a crashed rank. Nothing of
    the run is left to finalization (no atexit handler, no open file), so skipping it loses
    nothing."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def world_from_env() -> World:
    """This process's place in the world, from torchrun's environment (no collective)."""
    if not launched_by_torchrun():
        return World()
    return World(
        rank=int(os.environ["RANK"]),
        size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
    )


def check_world(world: World, B: int, device: str) -> None:
    """Refusals every rank reaches alike, before any collective (so none hangs)."""
    if B % world.size:
        raise UserError(
            f"-B {B} is not divisible by the world size {world.size}: each rank runs B/N "
            f"streams; use a -B that {world.size} divides, or another --nproc-per-node"
        )
    if device == "cuda" and world.distributed:
        n = torch.cuda.device_count()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world.size))
        if n < per_node:
            raise UserError(
                f"--device cuda with {per_node} ranks on this node but torch sees {n} CUDA "
                "device(s): use --nproc-per-node <= the GPU count"
            )


# How long a rank that leaves a refusal to its node's first rank waits to be stopped.
QUIET_RANK_WAIT_S = 60.0


def refuse(
    e: UserError, world: World, stopped: Callable[[], bool], wait_s: float = QUIET_RANK_WAIT_S
) -> int:
    """End a rank on a user error; returns the exit code (2).

    A refusal every rank meets (`check_world`, the plan) is said once per node, by its first
    rank. The others wait until torchrun stops them (`stopped()`), which it does once the
    speaker has exited: a rank that exited first would have torchrun kill the speaker, still
    importing torch on a busy machine, before its line is out, and the world would end with
    no word of why. A rank still waiting after `wait_s` says the error itself (it was its
    own, e.g. the corpus changed under its loader, while the speaker trains on)."""
    if world.local_rank == 0:
        return user_error_exit(e)
    deadline = time.monotonic() + wait_s
    while not (done := stopped()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if done:
        return EXIT_USER_ERROR
    return user_error_exit(f"rank {world.rank}: {e}")


def init_world(world: World, device: str, timeout_s: float) -> World:
    """Join the process group (gloo on CPU, nccl on CUDA, LOCAL_RANK picks the GPU) and make
    the gloo control group. Every collective fails after `timeout_s` instead of hanging."""
    if not world.distributed:
        return world
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(backend=backend, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    world.backend = backend
    world._control = control
    return world


def open_rank_stream(
    corpus: ByteCorpus,
    B: int,
    world: World,
    *,
    offsets: int | None,
    pack_mode: str,
    threads: int | None,
) -> BatchedByteStream:
    """This rank's streams [lo, hi) of the run's B, at exactly the offsets a single process
    with B streams gives them (`offsets`: a seed for random offsets, or None for even
    spacing, resolved over all B: the loader's None is "even")."""
    lo, hi = world.shard(B)
    where: int | list[int] | None = offsets
    if world.distributed:
        where = stream_offsets(corpus, B, offsets)[lo:hi]
    return BatchedByteStream(corpus, hi - lo, pack_mode=pack_mode, offsets=where, threads=threads)


def rank_runtime_state(state: dict[str, torch.Tensor], world: World, B: int) -> dict:
    """This rank's share of an all-streams runtime state (a checkpoint's)."""
    return slice_runtime_state(state, *world.shard(B))


def slice_runtime_state(state: dict[str, torch.Tensor], lo: int, hi: int) -> dict:
    """The runtime tensors of streams [lo, hi) (atom buffers trimmed to their live prefix)."""
    out = {k: v[lo:hi].contiguous() for k, v in state.items()}
    L = int(out["n_atoms"].max()) if out["n_atoms"].numel() else 0
    for k in ("e_buf", "h_buf"):
        out[k] = out[k][:, :L].contiguous()
    return out
