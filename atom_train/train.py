"""Train a field language model on B byte streams in lockstep: ``python -m atom_train.train``.

Bytes consumed = ticks x B. Rerunning the same command resumes from the newest valid
checkpoint in --output-dir (weights, AdamW state, RNGs, loader positions and contexts, field
and atom state), so a killed run loses at most the work since its last checkpoint.

Examples::

    # a CPU smoke run on your own text
    python -m atom_train.train --data 'data/fr/*.txt' --val data/fr/val.txt -B 32 \\
        --total-ticks 20000 --output-dir runs/smoke

    # a long GPU run: 512 streams, rolling checkpoint every 2000 ticks, a permanent
    # snapshot every 100k ticks (run it under `python -m atom_train.supervise --`)
    python -m atom_train.train --data 'data/fr/train-*.txt' --val 'data/fr/val.txt' \\
        -B 512 --bptt 64 --device cuda --tf32 --total-bytes 5e9 \\
        --ckpt-every 2000 --snapshot-every 100000 --output-dir runs/fr-b512

    # a run's lifecycle (docs/checkpoints.md):
    # resume: the same command again; pivot: the same command with other policy flags
    python -m atom_train.train ... --output-dir runs/fr-b512 --lr 1e-3
    # fork: an audit branch continuing exactly from a checkpoint, in a new folder
    python -m atom_train.train ... --fork runs/fr-b512/snapshot-000000100000.safetensors \\
        --output-dir runs/fr-b512-audit --lr 5e-4
    # init: a new run (another corpus, another B) from a checkpoint's weights (and AdamW state)
    python -m atom_train.train --init runs/fr-b512/ckpt-final.safetensors --keep-optimizer \\
        --data 'other/*.txt' --output-dir runs/other

Signals: SIGTERM or SIGINT = finish the current window, write a checkpoint, exit 0. SIGUSR1 =
write a checkpoint at the next window boundary and keep training.

Exit codes: 0 = completed or stopped cleanly (see status.json), 2 = user error (nothing to
retry), anything else = crash (the supervisor relaunches).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from atom_train.batched import BatchedByteTick
from atom_train.checkpoint import (
    FINAL,
    ROLLING,
    ROLLING_PREV,
    CheckpointError,
    remove_stale_temp_files,
    save_checkpoint,
    snapshot_name,
)
from atom_train.cli import (
    EXIT_USER_ERROR,
    UserError,
    add_output_dir_argument,
    say,
    user_error_exit,
    write_exit_code,
)
from atom_train.data import AtomDataError, BatchedByteStream
from atom_train.distributed import (
    World,
    check_world,
    init_world,
    join_loader_states,
    slice_loader_state,
    slice_runtime_state,
    world_from_env,
)
from atom_train.field_loops import RECURRENCES, set_tf32_matmuls
from atom_train.measure import StepClock, device_peak_mb, peak_rss_mb
from atom_train.model import AtomNativeModel
from atom_train.prefetch import MaskDrawer, Window, WindowPrefetcher
from atom_train.run_plan import RunPlan, model_flag_fields, resolve_run
from atom_train.run_state import RUNTIME, TrainState, origin_of
from atom_train.rundir import (
    AppendLog,
    NullLog,
    ProgressTable,
    RunLock,
    check_writable,
    write_status,
)
from atom_train.schedule import crossed, window_cut
from atom_train.train_step import StepStats, WindowStep, make_optimizer

LOG2E = 1.0 / math.log(2.0)

# Test hooks (never set outside tests): crash hard at a tick, optionally only once.
_CRASH_AT_ENV = "ATOM_TEST_CRASH_AT_TICK"
_CRASH_MARKER_ENV = "ATOM_TEST_CRASH_MARKER"
_CRASH_RANK_ENV = "ATOM_TEST_CRASH_RANK"  # only this rank crashes
_CRASH_SIGNAL_ENV = "ATOM_TEST_CRASH_SIGNAL"  # "KILL": die of SIGKILL, as by kill -9


# ----------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m atom_train.train",
        allow_abbrev=False,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        action="append",
        metavar="GLOB",
        help="training text: a file, folder glob or list of globs (repeatable); all shards are "
        "read as one circular byte string",
    )
    g.add_argument("--val", metavar="GLOB", help="held-out text for validation (not in --data)")
    g.add_argument("--resident", action="store_true", help="copy the corpus into RAM")
    g.add_argument(
        "--offset-seed",
        type=int,
        default=None,
        help="start the B streams at seeded random offsets (default: evenly spaced)",
    )
    g.add_argument(
        "--loader-threads", type=int, default=None, help="loader threads (default: all cores)"
    )
    g.add_argument(
        "--transport",
        choices=("auto", "dense", "ids"),
        default="auto",
        help="how features reach the model: dense 320 floats per byte, or 17 feature ids per "
        "byte summed into the input layers on the device (auto: ids on CUDA, dense on CPU)",
    )

    g = p.add_argument_group("schedule")
    g.add_argument("-B", "--streams", dest="B", type=int, default=64, help="streams in lockstep")
    g.add_argument(
        "--bptt",
        type=int,
        default=64,
        metavar="K",
        help="BPTT window in ticks (0 = no BPTT: a window of one tick)",
    )
    g.add_argument("--total-ticks", type=int, help="train until this tick (bytes = ticks x B)")
    g.add_argument("--total-bytes", type=float, help="train until ticks x B reaches this")
    g.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    g.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0 = off)")
    g.add_argument(
        "--warmup-steps", type=int, default=0, help="linear learning-rate warm-up (optimizer steps)"
    )
    g.add_argument(
        "--lr-schedule",
        choices=("constant", "cosine"),
        default="constant",
        help="after warm-up: constant, or cosine decay to --min-lr-ratio x lr at the last tick",
    )
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="floor of the cosine decay")
    g.add_argument("--seed", type=int, default=0, help="seed of the last-atom dropout masks")

    g = p.add_argument_group("checkpoints and logs")
    add_output_dir_argument(g)
    g.add_argument("--ckpt-every", type=int, default=2000, help="rolling checkpoint period (ticks)")
    g.add_argument(
        "--snapshot-every",
        type=int,
        default=0,
        help="permanent numbered snapshot period (ticks; 0 = none)",
    )
    g.add_argument("--val-every", type=int, default=2000, help="validation period (ticks)")
    g.add_argument(
        "--val-bytes",
        type=int,
        default=65536,
        help="size of the fixed validation slice (bytes, read by --val-streams streams)",
    )
    g.add_argument("--val-streams", type=int, default=64, help="streams reading the val slice")
    g.add_argument("--sample-every", type=int, default=0, help="chat sample period (ticks; 0=off)")
    g.add_argument("--sample-prompt", default="Bonjour", help="prompt of the chat samples")
    g.add_argument("--sample-bytes", type=int, default=200, help="length of a chat sample")
    g.add_argument("--log-every", type=int, default=200, help="progress.tsv row period (ticks)")

    g = p.add_argument_group(
        "a run's lifecycle",
        "rerun the same command to resume; rerun with other policy flags (lr, schedule, "
        "clipping, periods, --bptt, length) to pivot; see docs/checkpoints.md",
    )
    g.add_argument(
        "--fork",
        metavar="CKPT",
        help="an audit branch: a NEW run folder (--output-dir) that continues exactly from this "
        "checkpoint (weights, m, v, loader, state, RNGs, tick); policy flags may differ",
    )
    g.add_argument(
        "--init",
        metavar="CKPT",
        help="start a NEW run at tick 0, on any data, from this checkpoint's weights (fresh "
        "optimizer unless --keep-optimizer)",
    )
    g.add_argument(
        "--keep-optimizer",
        action="store_true",
        help="with --init: keep the checkpoint's AdamW m, v and step (no restart spike)",
    )

    g = p.add_argument_group(
        "hardware",
        "several processes: launch with torchrun (--nproc-per-node N; several nodes through "
        "torchrun's rendezvous flags): rank r trains streams [r·B/N, (r+1)·B/N)",
    )
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="training device")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument(
        "--dist-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="under torchrun: a collective waiting longer than S seconds (a rank crashed or "
        "hangs) ends the job instead of hanging it (default: %(default)s)",
    )
    g.add_argument(
        "--tf32",
        action="store_true",
        help="allow TF32 in the readout matmuls on CUDA (the field loop stays IEEE fp32)",
    )
    g.add_argument(
        "--recurrence",
        choices=("auto", *RECURRENCES),
        default="auto",
        help="the field loop: triton (one kernel per window; CUDA), fused (hand-written "
        "backward), compiled (torch.compile of the fused steps; a C++ compiler on CPU), "
        "autograd (the readable cross-check); auto = triton on CUDA, fused elsewhere",
    )

    g = p.add_argument_group(
        "model",
        "model config (defaults: SPEC §3); on a resumed run they must match the checkpoint",
    )
    for f in model_flag_fields():
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.type in (bool, "bool"):
            g.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"model: {f.name} (default {default})",
            )
        else:
            typ = {"int": int, "float": float, "str": str}.get(str(f.type), type(default))
            g.add_argument(
                flag, type=typ, default=None, help=f"model: {f.name} (default {default})"
            )
    return p


# ----------------------------------------------------------------------------------------


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


def _say(msg: str) -> None:
    say(msg, prefix="[atom]")


class StepLog:
    """loss.jsonl's per-step lines, kept on the device until they are needed.

    A step's loss, byte CE and gradient norm are device tensors; reading each on the host
    would stall the GPU once per window. They wait here and are read in one transfer at a
    log tick, before a checkpoint and at the end (so loss.jsonl always holds every step up to
    the newest checkpoint), which is also where a non-finite loss is caught. In a world of N
    ranks each rank's loss is the mean over its streams; the logged loss is their mean (the
    mean over all B streams); the gradient norm is already the global one."""

    def __init__(self, log: AppendLog | NullLog, B: int, world: World) -> None:
        self.log, self.B, self.world = log, B, world
        self.pending: list[tuple[int, int, int, float, StepStats]] = []  # step, tick, K, lr
        self.loss_ticks = self.ce_ticks = 0.0  # sums weighted by K since the last summary
        self.ticks = 0

    def add(self, step: int, tick: int, K: int, lr: float, stats: StepStats) -> None:
        self.pending.append((step, tick, K, lr, stats))

    def flush(self, newest_checkpoint: Path | None) -> None:
        if not self.pending:
            return
        rows = []
        for _, _, _, _, s in self.pending:  # (the norm is the global one already)
            rows += [s.loss, s.byte_ce, s.gnorm if s.gnorm is not None else s.loss.new_zeros(())]
        values = self.world.mean(torch.stack(rows)).view(-1, 3).tolist()  # one transfer
        for (step, tick, K, lr, s), (loss, ce, gnorm) in zip(self.pending, values, strict=True):
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"loss is {loss} at tick {tick}: lower --lr or check the data; resume "
                    f"from {newest_checkpoint}"
                )
            bpb = ce * LOG2E
            self.log.write_json(
                {
                    "step": step,
                    "tick": tick,
                    "bytes": tick * self.B,
                    "loss": round(loss, 6),
                    "bpb": round(bpb, 6),
                    "lr": lr,
                    "gnorm": None if s.gnorm is None else round(gnorm, 6),
                }
            )
            self.loss_ticks += loss * K
            self.ce_ticks += bpb * K
            self.ticks += K
        self.pending.clear()

    def summary(self) -> tuple[float, float]:
        """Mean loss and byte CE (bits/byte) over the ticks since the last summary."""
        n = max(self.ticks, 1)
        out = (self.loss_ticks / n, self.ce_ticks / n)
        self.loss_ticks = self.ce_ticks = 0.0
        self.ticks = 0
        return out


# Loader waits above this share of an interval's wall time are reported (once).
LOADER_WAIT_WARN = 0.05
# A checkpoint write taking more than this share of the checkpoint interval is reported.
CKPT_SLOW_WARN = 0.10
_STOP_CODES = {None: 0, "SIGTERM": 1, "SIGINT": 2}  # for the collective stop decision
_STOP_NAMES = {v: k for k, v in _STOP_CODES.items()}


class Interval:
    """Where one log interval's wall time went (progress.tsv's timing columns)."""

    def __init__(self, now: float, tick: int) -> None:
        self.t0, self.tick0 = now, tick
        self.waited_s = 0.0
        self.boundary = {"val": 0.0, "sample": 0.0, "ckpt": 0.0}

    @property
    def boundary_s(self) -> float:
        return sum(self.boundary.values())


class Trainer:
    """One launch of a run (on one rank of a world): built from its `RunPlan`, then `run()`.

    `run()` is a loop of named steps: `train_window` (the step itself), `after_window`
    (counters, logs, progress), `boundary` (validation, samples, snapshots, checkpoints and
    signals, at the window boundaries where they fall)."""

    def __init__(self, plan: RunPlan, signals: Signals, world: World | None = None) -> None:
        a = plan.args
        self.plan, self.args, self.out = plan, a, plan.out
        self.signals = signals
        self.world = world or World()
        self.device = plan.device
        self.B, self.total = plan.B, plan.total
        self.lo, self.hi = self.world.shard(self.B)  # this rank's streams
        B_local = self.hi - self.lo
        if a.threads:
            torch.set_num_threads(a.threads)
        if self.device.type == "cuda" and a.tf32:
            set_tf32_matmuls(True)  # the readout's: the field loops force IEEE fp32
        torch.manual_seed(a.seed)
        model = AtomNativeModel(plan.config).to(self.device)
        runtime = BatchedByteTick(model, B_local, device=self.device, recurrence=plan.recurrence)
        self.state = TrainState(
            config=plan.config,
            model=model,
            optimizer=make_optimizer(model, a.lr, a.weight_decay),
            runtime=runtime,
            dropout_gen=torch.Generator().manual_seed(a.seed),
            device=self.device,
            B=self.B,
            lr_schedule=plan.lr_schedule,
        )
        self.stream = self._open_stream(B_local)
        self.last_ckpt: Path | None = None
        self._restore_from_source()
        for g in self.state.optimizer.param_groups:  # the policy in force: this command's
            g["weight_decay"] = a.weight_decay
        params = list(model.parameters())
        self.step = WindowStep(
            runtime,
            self.state.optimizer,
            a.grad_clip,
            reduce_grads=(lambda: self.world.average_grads(params))
            if self.world.distributed
            else None,
        )
        main = self.world.is_main
        self.loss_log = AppendLog(self.out / "loss.jsonl") if main else NullLog()
        self.progress = ProgressTable(self.out / "progress.tsv") if main else NullLog()
        self.samples = AppendLog(self.out / "samples.jsonl") if main else NullLog()
        self.step_log = StepLog(self.loss_log, self.B, self.world)
        self.bar = _progress_bar(self.state.counters.tick, self.total) if main else None
        now = time.time()
        self.t_start = now  # the elapsed-time clock (restarts at each checkpoint)
        self.launch = (now, self.state.counters.tick)  # this launch's start: long-run rate
        self.crash_at = int(os.environ.get(_CRASH_AT_ENV, "-1"))
        self.clock = StepClock(self.device)
        self.interval = Interval(now, self.state.counters.tick)
        self.val_ce: float | None = None  # the validation since the last progress row
        self.last_ckpt_time: float | None = None
        self.eta_s: float | None = None
        self.warned: set[str] = set()  # one-off warnings already given

    def _open_stream(self, B_local: int) -> BatchedByteStream:
        """This rank's streams, at exactly the offsets a single process with B streams gives
        them (`--offset-seed` or even spacing, resolved over all B)."""
        a, plan = self.args, self.plan
        offsets = "even" if a.offset_seed is None else a.offset_seed
        try:
            if self.world.distributed:
                everyone = BatchedByteStream(plan.corpus, self.B, offsets=offsets, threads=1)
                offsets = everyone.positions[self.lo : self.hi]
            return BatchedByteStream(
                plan.corpus,
                B_local,
                pack_mode=plan.config.pack_mode,
                offsets=offsets,
                threads=a.loader_threads,
            )
        except AtomDataError as e:
            raise UserError(str(e)) from None

    def _restore_from_source(self) -> None:
        plan, st = self.plan, self.state
        ck = plan.source
        if ck is None:
            st.loader_state = self.stream.state_dict()
            return
        try:
            if plan.mode in ("resume", "fork"):
                # The checkpoint holds all B streams; this rank takes its own.
                runtime = slice_runtime_state(ck.group(RUNTIME), self.lo, self.hi)
                st.restore_run(ck, runtime_state=runtime)
                st.loader_state = slice_loader_state(st.loader_state, self.lo, self.hi)
                self.stream.load_state_dict(st.loader_state)
                if plan.mode == "resume":
                    self.last_ckpt = ck.path
                else:
                    st.origin = origin_of("fork", ck)
            else:  # init: a new run from the weights (and, asked for, AdamW's state)
                st.restore_weights(ck)
                if plan.keep_optimizer:
                    st.restore_optimizer(ck)
                st.loader_state = self.stream.state_dict()
                st.origin = origin_of("init", ck, keep_optimizer=plan.keep_optimizer)
        except CheckpointError as e:
            raise UserError(f"{ck.path}: {e}") from None
        except AtomDataError as e:
            raise UserError(f"cannot resume {ck.path}: {e}") from None

    # ---- events at the start --------------------------------------------------------------

    def write_start_events(self) -> None:
        plan, c, now = self.plan, self.state.counters, time.time()
        ck = plan.source
        world = {"world_size": self.world.size} if self.world.distributed else {}
        if plan.mode == "resume":
            event = {
                "event": "resume",
                "tick": c.tick,
                "step": c.step,
                "checkpoint": ck.path.name,
                "time": now,
                **world,
            }
            if plan.extended:
                event["total_ticks"] = plan.extended
            if plan.other_changes:
                event["changed"] = plan.other_changes
            self.loss_log.write_json(event)
            self.say(f"resumed from {ck.path} at tick {c.tick} ({c.tick * self.B:,} bytes)")
            if plan.pivot:
                self.loss_log.write_json(
                    {
                        "event": "pivot",
                        "tick": c.tick,
                        "step": c.step,
                        "changes": plan.changes,
                        "policy": plan.policy(),
                        "time": now,
                    }
                )
                moved = ", ".join(f"{k} {o!r} -> {n!r}" for k, (o, n) in plan.changes.items())
                self.say(f"pivot at tick {c.tick}: {moved}")
        elif plan.mode == "fork":
            self.loss_log.write_json(
                {
                    "event": "fork",
                    "tick": c.tick,
                    "step": c.step,
                    "source": str(ck.path),
                    "source_tick": c.tick,
                    "source_sha256": ck.sha256,
                    "changes": plan.changes,
                    "policy": plan.policy(),
                    "B": self.B,
                    "time": now,
                    **world,
                }
            )
            self.say(f"forked {ck.path} at tick {c.tick} into {self.out}")
        else:
            init = plan.source
            self.loss_log.write_json(
                {
                    "event": "start",
                    "tick": 0,
                    "time": now,
                    "init": None if init is None else str(init.path),
                    "keep_optimizer": plan.keep_optimizer if init is not None else None,
                    "B": self.B,
                    "policy": plan.policy(),
                    **world,
                }
            )
        where = (
            f", {self.world.size} ranks ({self.world.backend})" if self.world.distributed else ""
        )
        self.say(
            f"recurrence {plan.recurrence}, transport {plan.transport}, device {self.device}, "
            f"B {self.B}, K {plan.window_schedule.K}{where}"
        )

    def say(self, msg: str) -> None:
        if self.world.is_main:
            _say(msg)

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> str | None:
        """Train to the last tick; returns the signal that stopped the run, or None."""
        c = self.state.counters
        sched = self.plan.window_schedule
        drawer = MaskDrawer(
            self.state.dropout_gen, self.plan.config.last_atom_dropout, self.B, self.lo, self.hi
        )
        pf = WindowPrefetcher(
            self.stream,
            c.tick,
            self.total,
            sched.cut,
            max_K=sched.K,
            device=self.device,
            compact=self.plan.transport == "ids",
            masks=drawer,
        )
        try:
            while c.tick < self.total:
                w = pf.get()
                assert w.tick0 == c.tick, (w.tick0, c.tick)
                prev = c.tick
                lr = self.state.lr_schedule.at(c.step)
                stats = self.train_window(w, lr)
                pf.release(w)
                self.after_window(w, lr, stats)
                if c.tick == self.total:
                    break
                stopped = self.boundary(prev)
                if stopped:
                    return stopped
        finally:
            pf.close()
            if self.bar is not None:
                self.bar.close()
        self.finish()
        return None

    def train_window(self, w: Window, lr: float) -> StepStats:
        """The step: forward, backward, (all-reduce,) clip, AdamW; the state moves to the
        window's end. Nothing here reads a device value."""
        self.interval.waited_s += w.waited_s
        self.step.set_lr(lr)
        self.clock.start()
        out = self.step.forward_backward(w.feats, w.tgt, w.tick0, w.masks)
        self.clock.mark()
        gnorm = self.step.update()
        self.clock.mark()
        st, c = self.state, self.state.counters
        c.tick, c.step = w.tick0 + w.K, c.step + 1
        st.loader_state, st.dropout_state = w.loader_state, w.dropout_state
        return StepStats(loss=out.loss.detach(), byte_ce=out.byte_ce, gnorm=gnorm)

    def after_window(self, w: Window, lr: float, stats: StepStats) -> None:
        """Per-step log, validation and samples where they fall, progress rows, the bar."""
        a, c = self.args, self.state.counters
        prev = w.tick0
        self.step_log.add(c.step, c.tick, w.K, lr, stats)
        if 0 <= self.crash_at <= c.tick:
            self._test_crash()
        last = c.tick == self.total
        val_due = self.plan.val_corpus is not None and (crossed(prev, c.tick, a.val_every) or last)
        if val_due and self.world.is_main:  # rank 0 validates; the others wait in the all-reduce
            with self._timed("val"):
                self.val_ce = c.val_ce_bpb = self.validate()
            self.say(f"tick {c.tick}: val {self.val_ce:.4f} bits/byte")
        if a.sample_every and crossed(prev, c.tick, a.sample_every) and self.world.is_main:
            with self._timed("sample"):
                text = self.sample()
            self.samples.write_json(
                {"tick": c.tick, "prompt": a.sample_prompt, "sample": text, "time": time.time()}
            )
        if crossed(prev, c.tick, a.log_every) or last:
            self.log_row(lr)
        if self.bar is not None:
            self.bar.update(c.tick - prev)

    def log_row(self, lr: float) -> None:
        """One progress.tsv row: the interval's loss, throughput and where its time went."""
        c, iv = self.state.counters, self.interval
        self.step_log.flush(self.last_ckpt)
        loss, bpb = self.step_log.summary()
        phases = self.clock.read()
        now = time.time()
        wall = max(now - iv.t0, 1e-9)
        n_bytes = (c.tick - iv.tick0) * self.B
        bps = n_bytes / max(wall - iv.boundary_s, 1e-9)  # training only, as before
        t_launch, tick_launch = self.launch
        run_bps = (c.tick - tick_launch) * self.B / max(now - t_launch, 1e-9)
        self.eta_s = (self.total - c.tick) * self.B / max(run_bps, 1e-9)
        rss = self.world.agree_max([peak_rss_mb()])[0]
        wait = iv.waited_s / wall
        self.progress.row(
            tick=c.tick,
            bytes_seen=c.tick * self.B,
            loss=loss,
            byte_ce_bpb=bpb,
            val_ce_bpb=self.val_ce,
            lr=lr,
            leak=float(self.state.model.leak().detach().mean()),
            bytes_per_s=bps,
            elapsed_s=self._elapsed(),
            bytes_per_s_run=run_bps,
            loader_wait_pct=100 * wait,
            compute_s=phases["compute"],
            optimizer_s=phases["optimizer"],
            boundary_s=iv.boundary_s,
            val_s=iv.boundary["val"] or None,
            sample_s=iv.boundary["sample"] or None,
            ckpt_s=iv.boundary["ckpt"] or None,
            peak_rss_mb=rss,
            peak_device_mb=device_peak_mb(self.device),
            eta_s=self.eta_s,
        )
        if wait > LOADER_WAIT_WARN and c.tick - iv.tick0 >= self.plan.window_schedule.K * 4:
            self.warn_once(
                "loader",
                f"the step waited for the loader {100 * wait:.0f}% of the time over ticks "
                f"{iv.tick0}-{c.tick}: try --resident (a corpus on a slow disk) or more "
                "--loader-threads",
            )
        self.status("running")
        if self.bar is None:
            self.say(
                f"tick {c.tick}/{self.total} loss {loss:.4f} ce {bpb:.4f} bits/byte  "
                f"{bps:,.0f} bytes/s  eta {_duration(self.eta_s)}"
            )
        else:
            ckpt = (
                time.strftime("%H:%M:%S", time.localtime(self.last_ckpt_time))
                if (self.last_ckpt_time)
                else "-"
            )
            self.bar.set_postfix(
                loss=f"{loss:.3f}",
                bpb=f"{bpb:.3f}",
                lr=f"{lr:.3g}",
                eta=_duration(self.eta_s),
                ckpt=ckpt,
            )
        self.interval = Interval(now, c.tick)
        self.val_ce = None

    def boundary(self, prev: int) -> str | None:
        """Snapshots, rolling checkpoints (periodic, SIGUSR1, before a stop) and the stop,
        decided together by all ranks (a signal seen by one rank acts on every rank at the
        same window boundary, so none waits in a collective the others skipped)."""
        a, c, sig = self.args, self.state.counters, self.signals
        stop_code, usr1 = self.world.agree_max([_STOP_CODES[sig.stop], float(sig.checkpoint)])
        stop = _STOP_NAMES[int(stop_code)]
        # Windows are cut at multiples of both periods, so "crossed" means "landed on".
        if crossed(prev, c.tick, a.snapshot_every):
            self.say(f"snapshot {self.save('snapshot').name}")
        if crossed(prev, c.tick, a.ckpt_every) or usr1 or stop:
            if usr1:
                self.say(f"SIGUSR1: checkpoint at tick {c.tick}")
            sig.checkpoint = False
            self.save("rolling")
        return stop

    def finish(self) -> None:
        """The end of the run: a last snapshot if one falls here, and the final checkpoint."""
        a, c = self.args, self.state.counters
        if a.snapshot_every and c.tick % a.snapshot_every == 0:
            self.say(f"snapshot {self.save('snapshot').name}")
        self.save("final")

    def warn_once(self, key: str, msg: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.say(f"warning: {msg}")

    def status(self, status: str, **fields: object) -> None:
        """status.json (rank 0): the state, where the run is, the policy in force, the rate
        and the estimated time to finish, the newest checkpoint and when it was written."""
        if not self.world.is_main:
            return
        c = self.state.counters
        eta = {"eta_s": self.eta_s, "eta_at": time.time() + self.eta_s} if self.eta_s else {}
        write_status(
            self.out,
            status,
            tick=c.tick,
            total_ticks=self.total,
            checkpoint=str(self.last_ckpt),
            checkpoint_time=self.last_ckpt_time,
            val_ce_bpb=c.val_ce_bpb,
            policy=self.plan.policy(),
            world_size=self.world.size,
            **eta,
            **fields,
        )

    # ---- checkpoints ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _timed(self, kind: str):
        """Boundary work: timed on its own, and left out of the training throughput."""
        t0 = time.time()
        try:
            yield
        finally:
            self.interval.boundary[kind] += time.time() - t0

    def save(self, kind: str) -> Path | None:
        """A checkpoint of all B streams: every rank takes part (the streams' state is
        gathered to rank 0), rank 0 writes; a failed write fails every rank."""
        with self._timed("ckpt"):
            t0 = time.time()
            self.step_log.flush(self.last_ckpt)  # loss.jsonl holds every step it covers
            st = self.state
            runtime = self.world.gather_streams(st.runtime.state_dict())
            loaders = self.world.gather_objects(st.loader_state)
            error: BaseException | None = None
            path = None
            if self.world.is_main:
                try:
                    path = self._write_checkpoint(kind, runtime, join_loader_states(loaders))
                except (CheckpointError, OSError) as e:
                    error = e
            if self.world.agree_max([float(error is not None)])[0]:
                raise error or CheckpointError("rank 0 could not write the checkpoint")
            took = time.time() - t0
        if path is not None and kind == "rolling":
            since = t0 - (self.last_ckpt_time or self.launch[0])
            # (Sub-second writes are not worth a warning, whatever the interval.)
            if took > max(CKPT_SLOW_WARN * since, 1.0):
                self.warn_once(
                    "ckpt",
                    f"writing {path.name} ({path.stat().st_size / 2**20:.1f} MiB) took "
                    f"{took:.1f} s, {100 * took / max(since, 1e-9):.0f}% of the checkpoint "
                    "interval: check the disk, or raise --ckpt-every",
                )
        self.last_ckpt_time = time.time()
        return path

    def _write_checkpoint(self, kind: str, runtime: dict, loader_state: dict) -> Path:
        st, c = self.state, self.state.counters
        c.elapsed_s, self.t_start = self._elapsed(), time.time()  # the clock restarts here
        tensors = st.tensors(runtime_state=runtime)
        meta = st.meta(
            kind,
            args=dict(vars(self.args)),
            corpus=self.plan.corpus,
            total=self.total,
            world_size=self.world.size,
            recurrence=self.plan.recurrence,
            transport=self.plan.transport,
        )
        meta["loader_state"] = loader_state
        if kind == "rolling":
            path = save_checkpoint(
                self.out / ROLLING, tensors, meta, keep_previous_as=self.out / ROLLING_PREV
            )
        elif kind == "snapshot":
            path = self.out / snapshot_name(c.tick)
            if path.exists():
                # A resume from an older checkpoint passes this tick again: the snapshot
                # already on disk is permanent and stays as it is.
                _say(f"warning: {path.name} already exists: kept, not overwritten")
                return path
            save_checkpoint(path, tensors, meta, exclusive=True)
        else:
            path = save_checkpoint(self.out / FINAL, tensors, meta)
        self.last_ckpt = path
        return path

    def _elapsed(self) -> float:
        return self.state.counters.elapsed_s + (time.time() - self.t_start)

    # ---- validation and samples ---------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> float:
        """Mean byte CE (bits/byte) on the fixed val slice, from fresh state (no RNG used)."""
        a, plan = self.args, self.plan
        Bv = a.val_streams
        ticks = a.val_bytes // Bv
        stream = BatchedByteStream(plan.val_corpus, Bv, pack_mode=plan.config.pack_mode)
        model = self.state.model
        bt = BatchedByteTick(model, Bv, device=self.device, recurrence=plan.recurrence)
        K = plan.window_schedule.K
        total_ce, t = 0.0, 0
        model.eval()
        try:
            while t < ticks:
                end = window_cut(t, ticks, [K, plan.config.episode_length])
                _, feats, tgt = stream.next_window(end - t)
                out = bt.run_window(
                    torch.from_numpy(feats).to(self.device),
                    torch.from_numpy(tgt).to(self.device),
                    t,
                    training=False,
                )
                total_ce += out.byte_ce * (end - t)
                t = end
        finally:
            model.train()
        return float(total_ce) / ticks * LOG2E

    def sample(self) -> str:
        from atom_train.generate import generate

        a = self.args
        cpu_model = AtomNativeModel(self.plan.config)
        cpu_model.load_state_dict({k: v.cpu() for k, v in self.state.model.state_dict().items()})
        out = generate(
            cpu_model,
            a.sample_prompt.encode(),
            max_bytes=a.sample_bytes,
            temperature=0.8,
            top_k=40,
            seed=0,
        )
        return out.decode("utf-8", errors="replace")

    def close(self) -> None:
        for log in (self.loss_log, self.progress, self.samples):
            log.close()

    def _test_crash(self) -> None:
        rank = os.environ.get(_CRASH_RANK_ENV)
        if rank is not None and int(rank) != self.world.rank:
            return
        marker = os.environ.get(_CRASH_MARKER_ENV)
        if marker:
            if os.path.exists(marker):
                return
            Path(marker).write_text(str(self.state.counters.tick))
        if not self.world.distributed:  # (a flush is a collective: the other ranks go on)
            self.step_log.flush(self.last_ckpt)
        print(
            f"[atom] test hook: rank {self.world.rank} crashing at tick {self.state.counters.tick}",
            file=sys.stderr,
            flush=True,
        )
        if os.environ.get(_CRASH_SIGNAL_ENV) == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(17)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def _os_error_message(e: OSError, out: Path) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return f"cannot write in {out}{where}: {e.strerror or e}: free space or fix permissions"


def _progress_bar(start: int, total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="tick", dynamic_ncols=True)


def _setup_dir(out: Path) -> RunLock:
    """Create the run folder and take its lock (before anything is written there)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output folder {out} ({e.strerror})") from None
    lock = RunLock(out)
    lock.acquire()
    try:
        check_writable(out)
    except UserError:
        lock.release()
        raise
    for p in remove_stale_temp_files(out):
        _say(f"removed {p.name}, left by a checkpoint write that was interrupted")
    return lock


def train(args: argparse.Namespace, signals: Signals, world: World) -> int:
    """Plan, lock (rank 0), build, train; returns the exit code (user errors raise)."""
    check_world(world, args.B, args.device)
    plan = resolve_run(args, warn=_say if world.is_main else (lambda m: None))
    if world.is_main:
        for note in plan.notes:
            _say(note)
    init_world(world, args.device, args.dist_timeout)
    lock = _setup_dir(plan.out) if world.is_main else None
    try:
        return _train_locked(plan, signals, world)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(plan: RunPlan, signals: Signals, world: World) -> int:
    out = plan.out
    world.barrier()  # rank 0 has made the run folder and holds its lock
    trainer = Trainer(plan, signals, world)
    c = trainer.state.counters
    try:
        trainer.write_start_events()
        if c.tick >= plan.total:
            trainer.status("completed")
            trainer.say(
                f"already complete at tick {c.tick} ({trainer.last_ckpt}); raise --total-ticks "
                "to train further"
            )
            return 0
        trainer.status("running")
        try:
            stopped = trainer.run()
        except AtomDataError as e:
            # The corpus changed under the running loader (a shard truncated, replaced, ...).
            with contextlib.suppress(OSError):
                trainer.status("failed", error=str(e))
            raise UserError(f"{e}; newest checkpoint: {trainer.last_ckpt}") from None
        except (CheckpointError, OSError) as e:
            # Disk full, output folder gone read-only, ...: nothing already on disk is lost
            # (checkpoints are replaced only by verified ones); the supervisor may retry.
            msg = str(e) if isinstance(e, CheckpointError) else _os_error_message(e, out)
            with contextlib.suppress(OSError):
                trainer.status("failed", error=msg)
            trainer.say(
                f"error: {msg}; newest checkpoint: {trainer.last_ckpt}; rerun to resume from it"
            )
            return 1
    finally:
        trainer.close()
    if stopped:
        trainer.status("stopped", signal=stopped)
        trainer.say(
            f"stopped by {stopped} at tick {c.tick}; checkpoint: {trainer.last_ckpt}; rerun "
            "the same command to resume"
        )
    else:
        trainer.status("completed")
        trainer.say(
            f"completed at tick {c.tick} ({c.tick * plan.B:,} bytes); final checkpoint: "
            f"{trainer.last_ckpt}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    world = world_from_env()
    signals = Signals()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    signals.install()  # early, so a stop during set-up is honoured at the first boundary
    code = 1
    try:
        code = train(args, signals, world)
    except UserError as e:
        # Every rank meets the same refusal; rank 0 (and each node's first rank) says it.
        code = user_error_exit(e) if world.local_rank == 0 else EXIT_USER_ERROR
    finally:
        world.close(clean=code == 0)
        for s, h in handlers.items():  # leave the caller's handlers as they were
            signal.signal(s, h)
        if world.is_main:
            write_exit_code(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
