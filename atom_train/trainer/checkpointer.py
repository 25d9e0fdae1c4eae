"""A run's checkpoints: `restore_from_source` (what a launch continues from) and
`CheckpointManager` (writing rolling checkpoints, snapshots and the final one).

Every rank takes part in a save (the streams' runtime and loader states are gathered to
rank 0) and rank 0 writes; a failed write fails every rank, so none goes on alone. The
rolling checkpoint keeps its predecessor until the new one verifies on disk; snapshots are
permanent (never overwritten when a resume passes their tick again; a damaged one is moved
aside and written again); the final
checkpoint holds the optimizer state like every other, so a finished run can go on.
(What a checkpoint holds is `trainer.train_state.TrainState`'s; the container is `trainer.checkpoint_file`'s.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from atom_train.common.cli import UserError, say
from atom_train.data.loader import AtomDataError, BatchedByteStream, join_state_dicts
from atom_train.model.batched import BatchedByteTick
from atom_train.model.reference import ReferenceModel
from atom_train.trainer.checkpoint_file import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from atom_train.trainer.distributed import World, open_rank_stream, rank_runtime_state
from atom_train.trainer.divergence import GUARD_KEY, Candidate, health_of
from atom_train.trainer.plan import RunPlan
from atom_train.trainer.reporting import CKPT_SLOW_WARN, RunClock
from atom_train.trainer.rundir import (
    FINAL,
    ROLLING,
    ROLLING_PREV,
    checkpoint_metadata,
    snapshot_name,
)
from atom_train.trainer.step import make_optimizer
from atom_train.trainer.train_state import RUNTIME, TrainState, moved_loader_state, origin_of

KINDS = ("rolling", "snapshot", "final")


class CheckpointManager:
    def __init__(
        self,
        plan: RunPlan,
        state: TrainState,
        world: World,
        clock: RunClock,
        warn_once: Callable[[str, str], None],
    ) -> None:
        self.plan, self.state, self.world, self.clock = plan, state, world, clock
        self.warn_once = warn_once
        self.out = plan.out
        self.last: Path | None = None  # the newest checkpoint of this run
        self.last_time: float | None = None  # when this launch last wrote one
        self.launch_time = time.time()
        # The divergence guard (`guard.Guard`): its state, health included, is in every
        # checkpoint's metadata (`divergence.GUARD_KEY`), for a resume or a rewind to go on
        # with; None: written without it.
        self.guard = None

    @property
    def newest(self) -> tuple[Path | None, float | None]:
        return self.last, self.last_time

    def save(self, kind: str) -> Path | None:
        """A checkpoint of all B streams (`kind` in KINDS); returns its path on rank 0."""
        if kind not in KINDS:
            raise ValueError(f"unknown checkpoint kind {kind!r}")
        t0 = time.time()
        st = self.state
        runtime = self.world.gather_streams(st.runtime.state_dict())
        loaders = self.world.gather_objects(st.loader_state_dict())
        error: BaseException | None = None
        path = None
        if self.world.is_main:
            try:
                path = self._write(kind, runtime, join_state_dicts(loaders))
            except (CheckpointError, OSError) as e:
                error = e
        if self.world.agree_max([float(error is not None)])[0]:
            raise error or CheckpointError("rank 0 could not write the checkpoint")
        took = time.time() - t0
        if path is not None and kind == "rolling":
            since = t0 - (self.last_time or self.launch_time)
            # (Sub-second writes are not worth a warning, whatever the interval.)
            if took > max(CKPT_SLOW_WARN * since, 1.0):
                self.warn_once(
                    "ckpt",
                    f"writing {path.name} ({path.stat().st_size / 2**20:.1f} MiB) took "
                    f"{took:.1f} s, {100 * took / max(since, 1e-9):.0f}% of the checkpoint "
                    "interval: check the disk, or raise --ckpt-every",
                )
        self.last_time = time.time()
        return path

    def _write(self, kind: str, runtime: dict, loader_state: dict) -> Path:
        st, plan = self.state, self.plan
        self.clock.fold()  # the checkpoint records the training time up to now
        tensors = st.tensors(runtime_state=runtime, loader_state=loader_state)
        meta = st.meta(
            kind,
            config=plan.run_config,
            corpus=plan.corpus,
            total=plan.total,
            world_size=self.world.size,
            recurrence=plan.recurrence,
            transport=plan.transport,
            loader_state=loader_state,
        )
        if self.guard is not None:
            meta[GUARD_KEY] = self.guard.state_dict()
        if kind == "rolling":
            path = save_checkpoint(
                self.out / ROLLING, tensors, meta, keep_previous_as=self.out / ROLLING_PREV
            )
        elif kind == "snapshot":
            path = self.out / snapshot_name(st.counters.tick)
            if path.exists() and _keep_snapshot(path):
                return path
            save_checkpoint(path, tensors, meta, exclusive=True)
            say(f"snapshot {path.name}")
        else:
            path = save_checkpoint(self.out / FINAL, tensors, meta)
        self.last = path
        return path


def _keep_snapshot(path: Path) -> bool:
    """A resume from an older checkpoint passes a snapshot's tick again. A snapshot on disk
    that verifies is permanent and stays as it is (True); a damaged one (cut short, its
    checksum off) is renamed aside, kept for the user to look at, and the caller writes the
    snapshot again (False). Either way the line says what happened."""
    try:
        load_checkpoint(path)
    except CheckpointError as e:
        aside = _aside_name(path)
        path.rename(aside)
        reason = str(e).removeprefix(f"{path}: ")
        say(
            f"warning: {path.name} is damaged ({reason}): moved aside to {aside.name}, written again"
        )
        return False
    say(f"warning: {path.name} already exists: kept, not overwritten")
    return True


def _aside_name(path: Path, why: str = "damaged") -> Path:
    """A free name beside `path` for a checkpoint set aside, not a checkpoint name (eval and
    the resume skip it): ``NAME.damaged`` (or another `why`), then ``NAME.damaged-2``, ..."""
    aside, n = path.with_name(f"{path.name}.{why}"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{why}-{n}")
    return aside


# The suffix of a checkpoint written after a divergence began, set aside at the verdict.
GIVEN_UP = "given-up"


def rewind_candidates(out: Path) -> list[Candidate]:
    """The run's checkpoints as the divergence guard chooses among them (`divergence.
    rewind_target`): name, tick, step and the health each recorded (read from the headers,
    not verified: the rewind's load verifies its target)."""
    found = []
    for p in list_checkpoints(out):
        meta = checkpoint_metadata(p)
        training = meta.get("training") if meta else None
        try:
            tick, step = int(training["tick"]), int(training["step"])
        except (KeyError, TypeError, ValueError):
            continue
        found.append(Candidate(p.name, tick, step, health_of(meta)))
    return found


def set_aside_after(out: Path, tick: int) -> list[tuple[str, str]]:
    """Rename every checkpoint of the run written after `tick` (those of a span given up by a
    rewind, or after the last healthy one of a run that stopped diverged) to ``NAME.given-up``
    (`_aside_name`): kept for a look, out of the way of a resume, which takes the newest
    checkpoint (it would go on from the diverged state). Returns (name, new name) pairs."""
    moved = []
    for c in rewind_candidates(out):
        if c.tick > tick:
            path = out / c.name
            aside = _aside_name(path, GIVEN_UP)
            path.rename(aside)
            moved.append((c.name, aside.name))
    return sorted(moved)


def start_state(plan: RunPlan, world: World) -> tuple[TrainState, BatchedByteStream, Path | None]:
    """What a launch trains from, for the trainer and for `tune`: a new run's seeded weights
    and AdamW, this rank's share of the B streams, then whatever the plan continues from
    (`restore_from_source`); the weight decay in force is this command's. Returns the
    state, this rank's stream, and the checkpoint a resume continues from (None
    otherwise)."""
    torch.manual_seed(plan.seed)
    model = ReferenceModel(plan.config).to(plan.device)
    lo, hi = world.shard(plan.B)
    runtime = BatchedByteTick(model, hi - lo, device=plan.device, recurrence=plan.recurrence)
    state = TrainState(
        config=plan.config,
        model=model,
        optimizer=make_optimizer(model, plan.lr, plan.weight_decay),
        runtime=runtime,
        dropout_gen=torch.Generator().manual_seed(plan.seed),
        device=plan.device,
        B=plan.B,
        lr_schedule=plan.lr_schedule,
    )
    try:
        stream = open_rank_stream(
            plan.corpus,
            plan.B,
            world,
            offsets=plan.offset_seed,
            pack_mode=plan.config.pack_mode,
            threads=plan.hardware.loader_threads,
        )
    except AtomDataError as e:
        raise UserError(str(e)) from None
    resumed_from = restore_from_source(plan, state, world, stream)
    for g in state.optimizer.param_groups:  # the policy in force: this command's
        g["weight_decay"] = plan.weight_decay
    return state, stream, resumed_from


def restore_from_source(
    plan: RunPlan, state: TrainState, world: World, stream: BatchedByteStream
) -> Path | None:
    """Restore `state` (and `stream`, this rank's streams) from the plan's source: for a
    resume or fork everything (weights, m, v, runtime, RNGs, counters, loader), this rank's
    share of the streams; for an init the weights (and, asked for, AdamW's state). Returns
    the checkpoint a resume continues from (None otherwise). The state records this rank's
    loader state as the stream now has it (a new run's initial one, or the restored one)."""
    ck = plan.source
    if ck is None:
        state.loader_state = stream.snapshot()
        return None
    try:
        if plan.mode in ("resume", "fork"):
            # The checkpoint holds all B streams; this rank takes its own.
            state.restore_run(
                ck, runtime_state=rank_runtime_state(ck.group(RUNTIME), world, plan.B)
            )
            if plan.skip_ticks:  # (a rewind: past the bytes read when the run diverged)
                state.loader_state = moved_loader_state(
                    state.loader_state, plan.skip_ticks, plan.corpus.size
                )
            share = world.shard(plan.B) if world.distributed else None
            stream.load_state_dict(state.loader_state, streams=share)
            state.loader_state = stream.snapshot()
            if plan.mode == "resume":
                return ck.path
            state.origin = origin_of("fork", ck)
        else:  # init: a new run from the weights (and, asked for, AdamW's state)
            state.restore_weights(ck)
            if plan.keep_optimizer:
                state.restore_optimizer(ck)
            state.loader_state = stream.snapshot()
            state.origin = origin_of("init", ck, keep_optimizer=plan.keep_optimizer)
    except CheckpointError as e:  # (train_state's refusals name the file themselves)
        said = str(e)
        raise UserError(said if said.startswith(f"{ck.path}: ") else f"{ck.path}: {said}") from None
    except AtomDataError as e:
        raise UserError(f"cannot resume {ck.path}: {e}") from None
    return None
