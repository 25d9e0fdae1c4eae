"""Train a field language model on B byte streams in lockstep: ``python -m atom_train.train``.

Bytes consumed = ticks x B. ``--output-dir RUN`` alone (or the same command again) resumes
from the newest valid checkpoint in RUN (weights, AdamW state, RNGs, loader positions and
contexts, field and atom state) with every flag in force, so a killed run loses at most the
work since its last checkpoint. Every flag and its class: docs/flags.md.

Examples::

    # a CPU smoke run on a corpus built from your text (python -m atom_train.corpus build):
    # its train shards, and its held-out val for validation
    python -m atom_train.train --corpus data/fr -B 32 --total-ticks 20000 --output-dir runs/smoke

    # text files as they are: --data for training, --val for validation (never among --data)
    python -m atom_train.train --data 'notes/*.txt' --val notes-val.txt -B 32 \\
        --total-ticks 20000 --output-dir runs/notes

    # a long GPU run: 512 streams, rolling checkpoint every 2000 ticks, a permanent
    # snapshot every 100k ticks (run it under `python -m atom_train.supervise --`)
    python -m atom_train.train --corpus data/fr \\
        -B 512 --bptt 64 --device cuda --tf32 --total-bytes 5e9 \\
        --ckpt-every 2000 --snapshot-every 100000 --output-dir runs/fr-b512

    # a run's lifecycle (docs/checkpoints.md):
    # resume: the run folder alone; pivot: the same with other policy flags
    python -m atom_train.train --output-dir runs/fr-b512
    python -m atom_train.train --output-dir runs/fr-b512 --lr 1e-3
    # fork: an audit branch continuing exactly from a checkpoint, in a new folder
    python -m atom_train.train ... --fork runs/fr-b512/snapshot-000000100000.safetensors \\
        --output-dir runs/fr-b512-audit --lr 5e-4
    # init: a new run (another corpus, another B) from a checkpoint's weights (and AdamW state)
    python -m atom_train.train --init runs/fr-b512/ckpt-final.safetensors --keep-optimizer \\
        --corpus data/other --output-dir runs/other

--output-dir is required: every run names its folder, so unrelated runs never share one.

Signals: SIGTERM or SIGINT = finish the current window, write a checkpoint, exit 0. SIGUSR1 =
write a checkpoint at the next window boundary and keep training.

Divergence (docs/divergence.md): a run whose loss diverges is rewound to its last healthy
checkpoint with a lower rate (--on-divergence rewind, the default), within this launch; one
that cannot be rewound stops as "diverged".

Exit codes: 0 = completed or stopped cleanly (see status.json), 2 = user error (nothing to
retry), 3 = diverged (status.json "diverged": the supervisor does not relaunch it), anything
else = crash (the supervisor relaunches).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

from atom_train.common.cli import (
    EXIT_DIVERGED,
    OUTPUT_DIR_HINT,
    UserError,
    say,
    set_command,
    write_exit_code,
)
from atom_train.common.measure import StepClock
from atom_train.data.loader import AtomDataError
from atom_train.model.lockstep import crossed
from atom_train.model.sampling import sample_text
from atom_train.model.scoring import validate
from atom_train.trainer import fault_points
from atom_train.trainer.checkpoint_file import CheckpointError
from atom_train.trainer.checkpointer import (
    CheckpointManager,
    rewind_candidates,
    set_aside_after,
)
from atom_train.trainer.distributed import (
    World,
    check_world,
    exit_rank,
    init_world,
    launched_by_torchrun,
    refuse,
    world_from_env,
)
from atom_train.trainer.divergence import (
    DIVERGED,
    GUARD_KEY,
    Response,
    describe_settings,
    respond,
    rewinds_since_pivot,
    stop_record,
)
from atom_train.trainer.flags import build_parser as _build_parser
from atom_train.trainer.guard import Guard
from atom_train.trainer.loop import LoopHooks, WindowLoop
from atom_train.trainer.loss_log import read_events
from atom_train.trainer.plan import Rewind, RunPlan, resolve_run
from atom_train.trainer.prefetch import Window
from atom_train.trainer.reporting import Interval, Reporter, RunClock, StepLog
from atom_train.trainer.run_config import Lifecycle, RunConfig, lifecycle_argv
from atom_train.trainer.run_config import parse as parse_command
from atom_train.trainer.rundir import open_run_dir
from atom_train.trainer.step import StepStats

_STOP_CODES = {None: 0, "SIGTERM": 1, "SIGINT": 2}  # for the collective stop decision
_STOP_NAMES = {v: k for k, v in _STOP_CODES.items()}
# A divergence's response as the ranks agree on it (the most severe one wins).
_SEVERITY = {"warn": 0, "rewind": 1, "stop": 2}
_NO_VAL = -1.0  # (a val_bpb is never negative: "no validation to feed the guard")


def build_parser() -> argparse.ArgumentParser:
    """The trainer's command line (declared in `atom_train.trainer.flags`), with this module's
    examples as its epilog."""
    parts = __doc__.split("\n\n")
    return _build_parser(description=parts[0], epilog="\n\n".join(parts[1:]))


class Signals:
    """Handlers only set flags; the trainer acts on them at the next window boundary."""

    def __init__(self) -> None:
        self.stop: str | None = None
        self.checkpoint = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_stop(self, signum, frame) -> None:
        self.stop = signal.Signals(signum).name

    def _on_usr1(self, signum, frame) -> None:
        self.checkpoint = True


class Trainer(LoopHooks):
    """One launch of a run (on one rank of a world): built from its `RunPlan`, then `run()`.

    `run()` drives the one training loop (`trainer.loop.WindowLoop`, which owns the set-up:
    state, step, masks, prefetcher, precision) with this trainer as its hooks:
    `train_window` (the step itself), `after_window` (logs, validation, samples, progress),
    `at_boundary` (the divergence guard, snapshots, checkpoints and signals, at the window
    boundaries where they fall), `at_end` (the guard's last word before the final
    checkpoint). The parts: `Reporter` (what the user sees), `CheckpointManager` (writing
    checkpoints), `scoring` (validation and samples)."""

    def __init__(self, plan: RunPlan, signals: Signals, world: World | None = None) -> None:
        self.plan, self.signals = plan, signals
        self.world = world or World()
        self.out = plan.out
        # Under torchrun the gradients' all-reduce is timed apart from the optimizer.
        phases = ("compute", "allreduce", "optimizer") if self.world.distributed else None
        self.clock = StepClock(plan.device, phases or StepClock.PHASES)
        # The loop and its set-up (precision, state, step, masks, prefetcher): trainer/loop.py;
        # this trainer is its hooks.
        self.loop = WindowLoop(plan, self.world, clock=self.clock)
        self.state, self.stream = self.loop.state, self.loop.stream
        self.step = self.loop.step
        c = self.state.counters
        self.report = Reporter(plan, self.world, c)
        self.step_log = StepLog(
            self.report.loss_log, plan.B, self.world, plan.loss_log_rate, c.noise
        )
        self.run_clock = RunClock(c)
        self.ckpts = CheckpointManager(plan, self.state, self.world, self.run_clock, self.warn)
        self.ckpts.last = self.loop.resumed_from
        self.interval = Interval(self.run_clock.t_start, c.tick)
        self.val_bpb: float | None = None  # the validation since the last progress row
        self.faults = fault_points.installed  # unarmed but in the tests (trainer/fault_points.py)
        # guard: the divergence guard, built from the plan, continuing the detector of the
        # checkpoint this launch goes on from; fed by the step log's flushes and by each
        # validation (rank 0's, shared with every rank at the next boundary: `val_unfed`).
        self.guard = _guard_of(plan)
        self.step_log.guard = self.ckpts.guard = self.guard
        self.val_unfed: float | None = None
        self.divergence: dict | None = None  # a diverged stop's `stop_record`

    def say(self, msg: str) -> None:
        self.report.say(msg)

    def warn(self, key: str, msg: str) -> None:
        self.report.warn_once(key, msg)

    def status(self, status: str, **fields: object) -> None:
        self.report.status(status, self.state.counters, self.ckpts.newest, **fields)

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> str | Response | None:
        """Train to the last tick; returns the signal that stopped the run, the divergence
        guard's rewind or stop (a `Response`), or None."""
        plan, c = self.plan, self.state.counters
        if plan.mode == "init" and plan.val is not None and self.world.is_main:
            # How the weights transfer to this run's text, before any step.
            with self._timed("val"):
                c.val_bpb = self.validate()
            self.report.val_event(c.tick, c.val_bpb, "the --init weights, before training")
        try:
            stopped = self.loop.run(self)  # the hooks below
        finally:
            self.report.close_bar()
        if stopped is not None:
            return stopped
        self.finish()
        return None

    # ---- the loop's hooks (trainer/loop.py) -------------------------------------------------

    def train_window(self, w: Window, lr: float) -> StepStats:
        """The step (`WindowLoop.train_window`): forward, backward, (all-reduce,) clip, AdamW;
        the state moves to the window's end. Nothing here reads a device value."""
        self.interval.waited_s += w.waited_s
        self.interval.loader_busy_s += w.loader_busy_s
        return self.loop.train_window(w, lr, self)

    def after_backward(self, w: Window) -> None:
        if self.faults.nan_gradients(w.tick0, w.K):  # (a test's planted NaN)
            for p in self.state.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))

    def at_boundary(self, prev: int) -> str | Response | None:
        return self.boundary(prev)

    def at_end(self) -> Response | None:
        """guard: the last validation and steps judged before the final checkpoint."""
        val, pending = self.world.agree_max([self._val_for_guard(), float(self.guard.pending())])
        return self.judge(val, pending)

    def after_window(self, w: Window, lr: float, stats: StepStats) -> None:
        """Per-step log, validation and samples where they fall, progress rows, the bar."""
        plan, c, per = self.plan, self.state.counters, self.plan.periods
        prev = w.tick0
        self.step_log.add(c.step, c.tick, w.K, lr, stats, self.ckpts.last)
        # (A dying trainer has written its log lines; in a world, flushing is a collective.)
        self.faults.window_end(
            c.tick,
            self.world.rank,
            lambda: (
                None if self.world.distributed else self.step_log.flush(self.ckpts.last, close=True)
            ),
        )
        last = c.tick == plan.total
        main = self.world.is_main
        if plan.val is not None and (crossed(prev, c.tick, per.val) or last) and main:
            # Rank 0 validates; the others wait in the next all-reduce.
            with self._timed("val"):
                self.val_bpb = c.val_bpb = self.validate()
            self.val_unfed = self.val_bpb  # guard: fed at the boundary, on every rank
            self.say(f"tick {c.tick}: val_bpb {self.val_bpb:.4f}")
        if per.sample and crossed(prev, c.tick, per.sample) and main:
            with self._timed("sample"):
                text = sample_text(
                    self.state.model, plan.config, plan.sample.prompt, plan.sample.bytes
                )
            self.report.sample(c.tick, text)
        if crossed(prev, c.tick, per.log) or last:
            self.log_row(lr)
        else:
            self.report.status_due(c, self.ckpts.newest)
        self.report.advance(c.tick - prev)

    def log_row(self, lr: float) -> None:
        self.step_log.flush(self.ckpts.last)
        c = self.state.counters
        self.report.row(
            c,
            self.interval,
            self.step_log,
            lr=lr,
            leak=float(self.state.model.leak().detach().mean()),
            phases=self.clock.read(),
            elapsed_s=self.run_clock.elapsed(),
            val_bpb=self.val_bpb,
            ckpt=self.ckpts.newest,
        )
        self.interval = Interval(time.time(), c.tick)
        self.val_bpb = None

    def validate(self) -> float:
        """Bits/byte on the fixed val slice (`scoring.validate`)."""
        return validate(self.state.model, self.plan)

    def boundary(self, prev: int) -> str | Response | None:
        """The divergence guard's verdict, snapshots, rolling checkpoints (periodic, SIGUSR1,
        before a stop) and the stop, decided together by all ranks (a signal seen by one rank
        acts on every rank at the same window boundary, so none waits in a collective the
        others skipped)."""
        per, c, sig = self.plan.periods, self.state.counters, self.signals
        stop_code, usr1, val, pending = self.world.agree_max(
            [
                _STOP_CODES[sig.stop],
                float(sig.checkpoint),
                self._val_for_guard(),
                float(self.guard.pending()),
            ]
        )
        outcome = self.judge(val, pending)  # guard: a rewind or a stop ends the launch here
        if outcome is not None:
            return outcome
        stop = _STOP_NAMES[int(stop_code)]
        # Windows are cut at multiples of both periods, so "crossed" means "landed on".
        if crossed(prev, c.tick, per.snapshot):
            self.save("snapshot")  # (the checkpointer says what it did)
        if crossed(prev, c.tick, per.ckpt) or usr1 or stop:
            if usr1:
                self.say(f"SIGUSR1: checkpoint at tick {c.tick}")
            sig.checkpoint = False
            self.save("rolling")
        if self.guard.pending():  # guard: found by a checkpoint's flush (the same on every rank)
            outcome = self.judge(_NO_VAL, 1.0)
            if outcome is not None:
                return outcome
        return stop

    # ---- the divergence guard ---------------------------------------------------------------

    def _val_for_guard(self) -> float:
        """Rank 0's validation since the last boundary, as the ranks agree on it (NaN as
        +inf: both are non-finite to the guard; `_NO_VAL`: none)."""
        v, self.val_unfed = self.val_unfed, None
        if v is None:
            return _NO_VAL
        return v if v == v else float("inf")

    def judge(self, val: float, pending: float) -> Response | None:
        """guard: feed the validation the ranks agreed on (`val`, `_NO_VAL`: none), then act
        on a verdict if any rank has one (`pending`): None to train on (no verdict, or
        ``--on-divergence warn``), or the rewind or stop that ends this launch."""
        c = self.state.counters
        if val != _NO_VAL:
            self.guard.feed_val(c.step, c.tick, val)
        if not (pending or self.guard.pending()):
            return None
        return self.diverging()

    def diverging(self) -> Response | None:
        """A verdict: what the policy does about it (`divergence.respond`), given the run's
        rewinds since the last pivot a person made (its events) and its checkpoints on disk.
        Every rank reads the same folder and decides; the ranks agree before rank 0 writes.
        The steps up to the verdict are in loss.jsonl first (they stay there: a rewind's
        event marks the span given up)."""
        c, out = self.state.counters, self.out
        self.step_log.flush(self.ckpts.last, close=True)
        verdict = self.guard.take()
        if verdict is None:  # (another rank's: the same values, so this cannot happen)
            raise RuntimeError(f"a rank found a divergence at tick {c.tick} that this one did not")
        lr = self.state.lr_schedule.at(max(c.step - 1, 0))  # the rate of the last step
        r = respond(
            verdict,
            self.guard.policy,
            rewinds_since_pivot(read_events(out)),
            rewind_candidates(out),
            lr,
        )
        tick = -1.0 if r.target is None else float(r.target.tick)
        severity, most, least = self.world.agree_max([_SEVERITY[r.action], tick, -tick])
        if severity != _SEVERITY[r.action] or most != -least:
            raise RuntimeError(
                f"the ranks disagree on the divergence at tick {c.tick}: {r.action} here"
            )
        now, moved = time.time(), []
        if r.action == "warn":
            self.report.events.write(
                {"event": "divergence", "tick": c.tick, "step": c.step,
                 "verdict": verdict.to_dict(), "action": "warn", "time": now}
            )  # fmt: skip
            self.warn(
                f"divergence-{verdict.signal}",
                f"divergence guard: {verdict.describe()}; training on ({r.reason})",
            )
            return None
        if r.action == "rewind":
            # The span given up and the bytes skipped run to where the trainer is, past the
            # verdict's step by the detection lag: the streams have read that far.
            t, (lr_was, lr_now) = r.target, r.lr
            r = dataclasses.replace(r, skip_ticks=c.tick - t.tick)
            event = r.rewind_event(now)
            event.update(tick=c.tick, step=c.step, given_up=[t.tick, c.tick])
            if self.world.is_main:
                self.report.events.write(event)
                moved = set_aside_after(out, t.tick)
            self.say(
                f"divergence: {verdict.describe()}; rewind {len(r.rewinds)} of at most "
                f"{self.guard.policy.max_rewinds}: back to {t.name} (tick {t.tick:,}), lr "
                f"{lr_was:.3g} -> {lr_now:.3g}, every stream {r.skip_ticks:,} bytes further; "
                f"ticks {t.tick:,}-{c.tick:,} given up (their steps stay in loss.jsonl)"
            )
        else:
            path = None if r.target is None else str(out / r.target.name)
            self.divergence = stop_record(r, path)
            if self.world.is_main:
                self.report.events.write(
                    {"event": DIVERGED, "tick": c.tick, "step": c.step, **self.divergence,
                     "time": now}
                )  # fmt: skip
                # (so that a rerun, at a lower rate, resumes from the last healthy one)
                moved = set_aside_after(out, r.target.tick) if r.target is not None else []
        if self.world.is_main and moved:
            self.say(
                "set aside, written after the last healthy checkpoint: "
                + ", ".join(f"{a} -> {b}" for a, b in moved)
            )
        self.world.barrier()  # (rank 0 has set them aside before any rank plans again)
        return r

    def rewind_of(self, r: Response) -> Rewind:
        """The next launch a rewind makes, in this process: the run resumed from its target
        under the policy in force, the rate lowered, the streams moved on."""
        return Rewind(
            checkpoint=self.out / r.target.name,
            lr=r.lr[1],
            skip_ticks=r.skip_ticks,
            in_force=self.plan.run_config,
            total=self.plan.total,
            auto=r.pivot_fields(),
        )

    def finish(self) -> None:
        """The end of the run: a last snapshot if one falls here, and the final checkpoint."""
        per, c = self.plan.periods, self.state.counters
        if per.snapshot and c.tick % per.snapshot == 0:
            self.save("snapshot")  # (the checkpointer says what it did)
        self.save("final")

    def save(self, kind: str) -> Path | None:
        """A checkpoint (every rank takes part; rank 0 writes), after loss.jsonl has every
        step it covers; timed as boundary work. guard: none while a verdict waits (the state
        may hold the start of a divergence), and no rolling one while the run is suspect (it
        would be written over the last healthy one); the step values are the same on every
        rank, so every rank skips it."""
        with self._timed("ckpt"):
            self.step_log.flush(self.ckpts.last, close=True)
            tick = self.state.counters.tick
            if self.guard.pending() or (kind == "rolling" and not self.guard.may_rotate(tick)):
                newest = self.ckpts.last.name if self.ckpts.last is not None else "none yet"
                why = "has a verdict" if self.guard.pending() else "finds the run suspect"
                self.say(
                    f"tick {tick}: no {kind} checkpoint: the divergence guard {why}; the "
                    f"newest stays {newest}"
                )
                return None
            return self.ckpts.save(kind)

    @contextlib.contextmanager
    def _timed(self, kind: str):
        """Boundary work: timed on its own, and left out of the training throughput."""
        t0 = time.time()
        try:
            yield
        finally:
            self.interval.boundary[kind] += time.time() - t0

    def close(self) -> None:
        self.report.close()
        self.loop.close()


def _guard_of(plan: RunPlan) -> Guard:
    """The run's divergence guard: its detector as the checkpoint this launch continues from
    recorded it (a resume's, a fork's or a rewind's), or fresh."""
    ck = plan.source
    state = ck.meta.get(GUARD_KEY) if ck is not None and plan.mode in ("resume", "fork") else None
    try:
        return Guard.from_plan(plan.run_config, plan.config.episode_length, state)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{ck.path}: {e}") from None


def _os_error_message(e: OSError, out: Path) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return f"cannot write in {out}{where}: {e.strerror or e}: free space or fix permissions"


def train(
    config: RunConfig,
    lifecycle: Lifecycle,
    signals: Signals,
    world: World,
    given: frozenset[str] | None = None,
) -> int:
    """Lock the run folder (rank 0), plan, build, train; returns the exit code (user errors
    raise). `given`: the flags the command line gave (the others are in force from the run).

    The lock comes first: a second trainer on a busy folder is told so at once, not about
    its data or flags (which it would check against a run another process is changing). A
    folder this launch created is removed again when the plan refuses the command line."""
    if not lifecycle.output_dir:
        raise UserError(f"no --output-dir: {OUTPUT_DIR_HINT}")
    out = Path(lifecycle.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir {out} is a file, not a folder: choose another --output-dir")
    lock = open_run_dir(out, say=say) if world.is_main else None
    try:
        check_world(world, config.schedule.B, config.hardware.device)
        local_rank = world.local_rank if world.distributed else None
        plan = resolve_run(
            config,
            lifecycle,
            warn=say if world.is_main else (lambda m: None),
            local_rank=local_rank,
            given=given,
        )
    except BaseException:
        if lock is not None:
            lock.release(remove_new_folder=True)
        raise
    try:
        if world.is_main:
            for note in plan.notes:
                say(note)
        init_world(world, config.hardware.device, plan.hardware.dist_timeout)
        while True:
            result = _train_locked(plan, signals, world)
            if not isinstance(result, Rewind):
                return result
            # guard: the rewind is a resume of its target, planned as any (an automatic pivot)
            plan = resolve_run(
                config,
                lifecycle,
                warn=say if world.is_main else (lambda m: None),
                local_rank=local_rank,
                given=given,
                rewind=result,
            )
    finally:
        if lock is not None:
            lock.release()


def _train_locked(plan: RunPlan, signals: Signals, world: World) -> int | Rewind:
    """One launch of the plan: its exit code, or the rewind (`Rewind`) that the divergence
    guard decided, for `train` to plan and launch next."""
    world.barrier()  # rank 0 has made the run folder and holds its lock
    trainer = Trainer(plan, signals, world)
    c = trainer.state.counters
    try:
        if c.tick >= plan.total:  # nothing to do: nothing is appended to the run's logs
            trainer.report.end("complete", c, trainer.ckpts.newest)
            return 0
        trainer.report.start_events(c)
        g, per = trainer.guard, plan.periods
        trainer.say(describe_settings(g.thresholds, g.policy, per.log, plan.window_schedule.K))
        trainer.status("running")
        try:
            stopped = trainer.run()
        except AtomDataError as e:
            # The corpus changed under the running loader (a shard truncated, replaced, ...).
            with contextlib.suppress(OSError):
                trainer.status("failed", error=str(e))
            raise UserError(f"{e}; newest checkpoint: {trainer.ckpts.last}") from None
        except (CheckpointError, OSError) as e:
            # Disk full, output folder gone read-only, ...: nothing already on disk is lost
            # (checkpoints are replaced only by verified ones); the supervisor may retry.
            msg = str(e) if isinstance(e, CheckpointError) else _os_error_message(e, plan.out)
            with contextlib.suppress(OSError):
                trainer.report.end("failed", c, trainer.ckpts.newest, error=msg)
            return 1
    finally:
        trainer.close()
    if isinstance(stopped, Response):
        if stopped.action == "rewind":
            return trainer.rewind_of(stopped)
        healthy = trainer.divergence["last_healthy"]  # (status.json names it, not a set-aside)
        ckpt = (Path(healthy["checkpoint"]), None) if healthy else trainer.ckpts.newest
        trainer.report.end(DIVERGED, c, ckpt, divergence=trainer.divergence)
        return EXIT_DIVERGED
    trainer.report.end("stopped" if stopped else "completed", c, trainer.ckpts.newest, stopped)
    return 0


def train_run(
    config: RunConfig,
    output_dir: str | os.PathLike,
    *,
    fork: str | os.PathLike | None = None,
    init: str | os.PathLike | None = None,
    keep_optimizer: bool = False,
    revert_ok: bool = False,
) -> int:
    """Train from Python: exactly what ``python -m atom_train.train`` runs with the command
    line of `config` (`RunConfig.to_argv`: its values that differ from the defaults are the
    flags given) and of the lifecycle arguments; returns the command's exit status (0: the
    run completed or stopped cleanly at a signal, 2: a user error, printed as the command
    prints it). In a folder with a run, it resumes that run, as the command does: a value of
    `config` that is a default is not given, so the run's own value stays in force.

        import atom_train as atom

        cfg = atom.RunConfig().replace(data=["data/demo/train-*.txt"], B=8, total_ticks=2048)
        atom.train_run(cfg, output_dir="runs/notebook")

    Ctrl-C (SIGINT) ends it as it ends the command: the window finishes, a checkpoint is
    written, and the status is 0."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"train_run takes a RunConfig, not {type(config).__name__}")
    lifecycle = Lifecycle(
        output_dir=os.fspath(output_dir),
        fork=None if fork is None else os.fspath(fork),
        init=None if init is None else os.fspath(init),
        keep_optimizer=keep_optimizer,
        revert_ok=revert_ok,
    )
    return main(config.to_argv() + lifecycle_argv(lifecycle))


def main(argv: list[str] | None = None) -> int:
    world = world_from_env()
    fault_points.installed.start(world.rank)  # (a test's late rank)
    signals = Signals()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    signals.install()  # early, so a stop during set-up is honoured at the first boundary
    code = 1
    set_command("train")
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        config, lifecycle, given = parse_command(argv, build_parser())
        code = train(config, lifecycle, signals, world, given=given)
    except UserError as e:
        code = refuse(e, world, lambda: signals.stop is not None)
    finally:
        # The exit code first: once the ranks part (a diverged stop exits 3 on every rank),
        # torchrun stops the ranks still running as soon as one has left.
        if world.is_main:
            write_exit_code(code)
        world.close(clean=code in (0, EXIT_DIVERGED))
        for s, h in handlers.items():  # leave the caller's handlers as they were
            signal.signal(s, h)
    return code


if __name__ == "__main__":
    exit_code = main()
    if launched_by_torchrun():
        exit_rank(exit_code)  # (no interpreter finalization: see exit_rank)
    sys.exit(exit_code)
