"""What a training run tells its user: the per-step log, progress rows, status.json, the start
events, one-off warnings and the progress bar.

- `StepLog`: loss.jsonl's per-step lines, kept on the device until they are read;
- `Interval`: where one log interval's wall time went;
- `RunClock`: the run's training time across launches (saved in every checkpoint);
- `Reporter`: the run folder's logs (rank 0; the other ranks write nowhere), the start
  events (``start``, ``resume``, ``pivot``, ``fork``), progress rows, status.json, the bar.

It decides nothing about training: the trainer calls it with the numbers. Every number it
writes or prints is named by `atom_train.common.metrics` (the same key in loss.jsonl,
progress.tsv, status.json, TensorBoard and the printed lines).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from pathlib import Path

import torch

from atom_train.common.cli import format_duration, lines_above, quote, say, warn
from atom_train.common.measure import device_peak_mb, peak_rss_mb
from atom_train.model.scoring import describe_val
from atom_train.trainer.distributed import World
from atom_train.trainer.divergence import DIVERGED, describe_stop
from atom_train.trainer.loss_log import DEFAULT_RATE, EventLog, StepLines
from atom_train.trainer.lr_schedule import describe_segment
from atom_train.trainer.noise_scale import NoiseEMA, estimate
from atom_train.trainer.plan import RunPlan
from atom_train.trainer.run_logs import describe_changes
from atom_train.trainer.rundir import (
    LOSS_LOG,
    PROGRESS,
    RUN_FORMAT,
    SAMPLES,
    AppendLog,
    NullLog,
    ProgressTable,
    write_status,
)
from atom_train.trainer.step import StepStats
from atom_train.trainer.tensorboard_log import TensorBoardLog, purge_step
from atom_train.trainer.train_state import Counters, saved_lr_schedule

LOG2E = 1.0 / math.log(2.0)

# The step waiting for its windows more than this share of an interval's wall time, while
# the loader thread's own work took more than LOADER_BUSY_WARN of it, is reported (once).
LOADER_WAIT_WARN = 0.05
LOADER_BUSY_WARN = 0.5
# A checkpoint write taking more than this share of the checkpoint interval is reported.
CKPT_SLOW_WARN = 0.10
# The per-step values wait on the device at most this many steps (a long run with rare log
# ticks, or --log-every 0, would otherwise hold three device tensors per window without end).
MAX_PENDING_STEPS = 1024
# status.json is rewritten at the first window boundary this many seconds after the last
# write, whatever --log-every says (a monitor reads where the run is from it).
STATUS_EVERY_S = 5.0


class StepLog:
    """loss.jsonl's step lines, kept on the device until they are needed.

    A step's loss, byte CE and gradient norm are device tensors; reading each on the host
    would stall the GPU once per window. They wait here and are read in one transfer at a
    log tick, before a checkpoint, at the end, and after `MAX_PENDING_STEPS` steps (memory
    stays bounded), which is also where a non-finite loss is caught. Each step's slot of
    loss.jsonl is decided when it is taken (`loss_log.StepLines`: a line per step up to
    --loss-log-rate lines per second, aggregates above it); a checkpoint closes the open
    slot (`flush(close=True)`), so loss.jsonl always holds every step up to the newest
    checkpoint. In a world of N ranks each rank's loss is the mean over its streams; the
    logged loss is their mean (the mean over all B streams); the gradient norm is already
    the global one. Every rank flushes at the same steps (the flush is a collective)."""

    def __init__(
        self,
        log: AppendLog | NullLog,
        B: int,
        world: World,
        rate: float = DEFAULT_RATE,
        noise: NoiseEMA | None = None,
    ) -> None:
        self.world = world
        self.lines = StepLines(log.write_json, B, rate)
        # step, tick, K, lr, the values on the device, its loss.jsonl slot
        self.pending: list[tuple[int, int, int, float, StepStats, int]] = []
        self.loss_ticks = self.ce_ticks = 0.0  # sums weighted by K since the last summary
        self.ticks = 0
        self.grad_norm_sum, self.grad_norms = 0.0, 0  # the steps' norms since the summary
        # The noise scale's moving averages (the run's: `Counters.noise`), fed at each flush.
        self.noise = noise if noise is not None else NoiseEMA()
        # The divergence guard (`guard.Guard`), fed each flushed step; None: a non-finite
        # loss raises FloatingPointError as before.
        self.guard = None

    def add(
        self, step: int, tick: int, K: int, lr: float, stats: StepStats, newest: Path | None
    ) -> None:
        self.pending.append((step, tick, K, lr, stats, self.lines.mark()))
        if len(self.pending) >= MAX_PENDING_STEPS:
            self.flush(newest)

    def flush(self, newest_checkpoint: Path | None, close: bool = False) -> None:
        """Read the pending steps and write their lines; `close`: also the open slot's (a
        checkpoint follows, or the run ends)."""
        if self.pending:
            rows = []
            for *_, s, _ in self.pending:  # (the norm is the global one already)
                rows += [
                    s.loss,
                    s.byte_ce,
                    s.grad_norm if s.grad_norm is not None else s.loss.new_zeros(()),
                ]
            values = self.world.mean(torch.stack(rows)).view(-1, 3).tolist()  # one transfer
            # The noise measurements, in float64 (|G_small|^2 - |G_big|^2 is a small
            # difference), averaged over the ranks: each rank's |G_small|^2 is its own
            # streams' (`NoiseProbe`).
            splits = [s.noise for *_, s, _ in self.pending if s.noise is not None]
            noise = iter(())
            if splits:
                flat = torch.stack([x for n in splits for x in (n.small_sq, n.big_sq)])
                noise = iter(self.world.mean(flat).view(-1, 2).tolist())
            if self.guard is not None:  # guard: the values already on the host
                self.guard.feed_steps(
                    (step, tick, K, loss, ce * LOG2E, None if s.grad_norm is None else norm)
                    for (step, tick, K, _, s, _), (loss, ce, norm) in zip(
                        self.pending, values, strict=True
                    )
                )
            for (step, tick, K, lr, s, slot), (loss, ce, norm_value) in zip(
                self.pending, values, strict=True
            ):
                if self.guard is None and not math.isfinite(loss):
                    raise FloatingPointError(
                        f"loss is {loss} at tick {tick}: lower --lr or check the data; resume "
                        f"from {newest_checkpoint}"
                    )
                bpb = ce * LOG2E
                norm = None if s.grad_norm is None else norm_value
                measured = None
                if s.noise is not None:
                    measured = self._measured(next(noise), s.noise.b_small, s.noise.b_big, K)
                self.lines.write(
                    slot,
                    step,
                    tick,
                    lr,
                    {"loss": loss, "train_bpb": bpb, "grad_norm": norm},
                    measured,
                )
                self.loss_ticks += loss * K
                self.ce_ticks += bpb * K
                self.ticks += K
                if norm is not None:
                    self.grad_norm_sum += norm
                    self.grad_norms += 1
            self.pending.clear()
        if close:
            self.lines.close()

    def _measured(self, sq: list[float], b_small: float, b_big: int, K: int) -> dict:
        """A measured step's loss.jsonl fields: the measurement as taken (|G_small|^2 over
        `streams_small` streams, |G_big|^2 over all B, exact), then the moving averages
        after it (`NoiseEMA.metrics`)."""
        small, big = sq
        self.noise.update(estimate(small, big, b_small, b_big), big)
        fields: dict = {"grad_sq_small": small, "streams_small": b_small, "grad_sq_big": big}
        for k, v in self.noise.metrics(K).items():
            fields[k] = None if v is None else float(f"{v:.6g}")
        return fields

    def summary(self) -> tuple[float, float, float | None]:
        """Since the last summary: the mean loss and train_bpb (weighted by ticks), and the
        mean gradient norm of the steps (None: not computed, e.g. no clipping)."""
        n = max(self.ticks, 1)
        norm = self.grad_norm_sum / self.grad_norms if self.grad_norms else None
        out = (self.loss_ticks / n, self.ce_ticks / n, norm)
        self.loss_ticks = self.ce_ticks = self.grad_norm_sum = 0.0
        self.ticks = self.grad_norms = 0
        return out


class Interval:
    """Where one log interval's wall time went (progress.tsv's timing columns)."""

    def __init__(self, now: float, tick: int) -> None:
        self.t0, self.tick0 = now, tick
        self.waited_s = 0.0  # the step's waits for its window (on CUDA: the GPU's time)
        self.loader_busy_s = 0.0  # the loader thread's own work (fill, masks, state)
        self.boundary = {"val": 0.0, "sample": 0.0, "ckpt": 0.0}

    @property
    def boundary_s(self) -> float:
        return sum(self.boundary.values())


class RunClock:
    """The run's training wall time: earlier launches' (`Counters.elapsed_s`, restored from
    the checkpoint) plus this launch's since the last `fold`."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.t_start = time.time()

    def elapsed(self) -> float:
        return self.counters.elapsed_s + (time.time() - self.t_start)

    def fold(self) -> None:
        """Move the time since the last fold into the counters (before a checkpoint)."""
        self.counters.elapsed_s, self.t_start = self.elapsed(), time.time()


class Reporter:
    """The run folder's logs and what the user sees (see the module docstring)."""

    def __init__(self, plan: RunPlan, world: World, counters: Counters) -> None:
        self.plan, self.world, self.out = plan, world, plan.out
        main = world.is_main
        self.loss_log = AppendLog(self.out / LOSS_LOG) if main else NullLog()
        self.events = EventLog(self.out, self.loss_log)
        self.progress = ProgressTable(self.out / PROGRESS) if main else NullLog()
        self.samples = AppendLog(self.out / SAMPLES) if main else NullLog()
        self.bar = _progress_bar(counters.tick, plan.total) if main else None
        # While the bar is on screen, every line goes above it (tqdm.write), not over it.
        self._above = contextlib.ExitStack()
        if self.bar is not None:
            from tqdm import tqdm

            self._above.enter_context(lines_above(lambda line: tqdm.write(line, sys.stderr)))
        self.launch = (time.time(), counters.tick)  # this launch's start: the long-run rate
        self.status_time = 0.0  # when status.json was last written
        self.warned: set[str] = set()  # one-off warnings already given
        # TensorBoard (rank 0, with --tensorboard); its step axis is bytes seen.
        self.tb = (
            TensorBoardLog(plan.tensorboard, purge_step(plan.mode, counters.tick, plan.B))
            if main and plan.tensorboard is not None
            else None
        )

    def say(self, msg: str) -> None:
        if self.world.is_main:
            say(msg)

    def warn_once(self, key: str, msg: str) -> None:
        if key not in self.warned and self.world.is_main:
            self.warned.add(key)
            warn(msg)

    def eta_s(self, tick: int) -> float | None:
        """Seconds to the last tick at this launch's long-run rate (everything included);
        None before this launch has trained a window."""
        t_launch, tick_launch = self.launch
        if tick <= tick_launch:
            return None
        rate = (tick - tick_launch) / max(time.time() - t_launch, 1e-9)  # ticks per second
        return (self.plan.total - tick) / rate

    # ---- events at the start --------------------------------------------------------------

    def start_events(self, c: Counters) -> None:
        """The launch's events in loss.jsonl (resume [+ pivot], fork, or start) and lines."""
        plan, now = self.plan, time.time()
        ck = plan.source
        world = {"world_size": self.world.size} if self.world.distributed else {}
        ignored = {"ignored": plan.ignored} if plan.ignored else {}
        # Each launch chooses its loop again (auto proves Triton on the device it runs on).
        loop = {"recurrence": plan.recurrence, "recurrence_reason": plan.recurrence_reason}
        val = {"val": self._val_record()}  # what this launch's val_bpb scores (plot, eval)
        if plan.mode == "resume":
            event = {
                "event": "resume",
                "tick": c.tick,
                "step": c.step,
                "checkpoint": ck.path.name,
                "time": now,
                **loop,
                **val,
                "run_format": RUN_FORMAT,
                **world,
            }
            if plan.extended:
                event["total_ticks"] = plan.extended
            if plan.other_changes:
                event["changed"] = plan.other_changes
            event.update(ignored)
            self.events.write(event)
            self.say(f"resumed from {ck.path} at tick {c.tick} ({c.tick * plan.B:,} bytes)")
            self._say_changes("changed since the last launch", plan.other_changes)
            if plan.pivot:
                self.events.write(
                    {
                        "event": "pivot",
                        "tick": c.tick,
                        "step": c.step,
                        "changes": plan.changes,
                        "policy": plan.policy(),
                        "time": now,
                        **(plan.auto or {}),  # (a rewind's: auto, skip_ticks)
                    }
                )
                auto = ""
                if plan.auto is not None:
                    auto = (
                        f" (automatic: {plan.auto.get('auto')}, every stream moved "
                        f"{plan.skip_ticks:,} bytes further)"
                    )
                what = describe_changes(plan.changes) or "the policy in force"
                self.say(f"pivot at tick {c.tick}: {what}{auto}")
                self._say_lr_segment(c.step)
                if self.tb is not None:
                    self.tb.marker("pivot", c.tick * plan.B, plan.changes)
        elif plan.mode == "fork":
            self.events.write(
                {
                    "event": "fork",
                    "tick": c.tick,
                    "step": c.step,
                    "source": str(ck.path),
                    "source_tick": c.tick,
                    "source_sha256": ck.sha256,
                    "changes": plan.changes,
                    "policy": plan.policy(),
                    "B": plan.B,
                    "time": now,
                    **loop,
                    "run_format": RUN_FORMAT,
                    **({"changed": plan.other_changes} if plan.other_changes else {}),
                    **val,
                    **world,
                    **ignored,
                }
            )
            self.say(f"forked {ck.path} at tick {c.tick} into {self.out}")
            if self.tb is not None:
                self.tb.marker("fork", c.tick * plan.B, plan.changes, source=str(ck.path))
            self._say_changes("the branch's policy differs from its source", plan.changes)
            self._say_lr_segment(c.step)
            self._say_changes("and how it runs", plan.other_changes)
        else:
            if ck is not None:
                tr = ck.meta.get("training", {})
                kept = f", AdamW m, v and step {tr.get('step')}" if plan.keep_optimizer else ""
                self.say(
                    f"initialised from {ck.path} (tick {tr.get('tick')} of its run, "
                    f"B {tr.get('B')}): its weights{kept}; a new run from tick 0"
                )
            self.events.write(
                {
                    "event": "start",
                    "tick": 0,
                    "time": now,
                    "init": None if ck is None else str(ck.path),
                    "init_tick": None if ck is None else ck.meta["training"].get("tick"),
                    "keep_optimizer": plan.keep_optimizer if ck is not None else None,
                    "B": plan.B,
                    "policy": plan.policy(),
                    **loop,
                    **val,
                    "run_format": RUN_FORMAT,
                    **world,
                }
            )
        where = (
            f", {self.world.size} ranks ({self.world.backend})" if self.world.distributed else ""
        )
        self.say(
            f"recurrence {plan.recurrence} ({plan.recurrence_reason}), transport {plan.transport}, "
            f"device {plan.device}, "
            f"B {plan.B}, K {plan.window_schedule.K}{where}"
        )
        self.say(self._data_line(c))
        if plan.val is not None:
            v = plan.val
            self.say(describe_val(v.corpus, v.bytes, v.streams))
        self.say(
            "loss = byte CE (nats) + length CE + 0.05 (1 - cos(field, persistence)); "
            "train_bpb and val_bpb = byte CE / ln 2 (bits/byte); the state resets every "
            f"{plan.config.episode_length:,} ticks (an episode): the loss jumps there, by design"
        )

    def _val_record(self) -> dict | None:
        """The text and settings this launch validates with (`run_logs.val_record`)."""
        v = self.plan.val
        if v is None:
            return None
        return {
            "files": [str(Path(f).resolve()) for f in v.corpus.shards],
            "signature": v.corpus.signature,
            "size": v.corpus.size,
            "val_bytes": v.bytes,
            "val_streams": v.streams,
        }

    def _say_lr_segment(self, step: int) -> None:
        """When this launch starts a new learning-rate segment (a pivot or fork that changed
        an LR flag): the rate before and now, the peak and where it ends; at a jump back to
        the peak, how to continue from the rate in force instead."""
        plan = self.plan
        saved = saved_lr_schedule(plan.source.meta)
        new = plan.lr_schedule
        if saved is None or new == dataclasses.replace(saved, end_step=new.end_step):
            return  # the segment in force continues (perhaps stretched to the new end)
        before = saved.at(step)
        if plan.auto is not None and "lr" in plan.changes:  # (a rewind: the rate in force then)
            before = plan.changes["lr"][0]
        line = describe_segment(new, before, step, plan.total)
        if plan.run_config.optimizer.lr_restart == "peak" and new.at(step) > before * (1 + 1e-9):
            line += (
                f" (--lr-restart peak; to continue from {before:.3g} instead: --lr-restart "
                "hold, constant, or decay, a cosine from it)"
            )
        self.say(line)

    def _say_changes(self, what: str, changes: dict[str, list]) -> None:
        if changes:
            self.say(f"{what}: {describe_changes(changes)}")

    def _data_line(self, c: Counters) -> str:
        plan = self.plan
        corpus, total_bytes = plan.corpus, plan.total * plan.B
        n = len(corpus.shards)
        return (
            f"data: {n} shard{'s' if n != 1 else ''}, {corpus.size:,} bytes; the run reads "
            f"{total_bytes:,} bytes ({plan.passes(plan.total):.2f} passes), "
            f"{c.tick * plan.B:,} so far"
        )

    # ---- progress ---------------------------------------------------------------------------

    def row(
        self,
        c: Counters,
        iv: Interval,
        step_log: StepLog,
        *,
        lr: float,
        leak: float,
        phases: dict[str, float],
        elapsed_s: float,
        val_bpb: float | None,
        ckpt: tuple[Path | None, float | None],
    ) -> None:
        """One progress.tsv row: the interval's loss, throughput and where its time went;
        status.json, the bar (or a line), and the loader warning."""
        plan = self.plan
        loss, bpb, grad_norm = step_log.summary()
        now = time.time()
        wall = max(now - iv.t0, 1e-9)
        n_bytes = (c.tick - iv.tick0) * plan.B
        bps = n_bytes / max(wall - iv.boundary_s, 1e-9)  # training only
        t_launch, tick_launch = self.launch
        run_bps = (c.tick - tick_launch) * plan.B / max(now - t_launch, 1e-9)
        eta_s = self.eta_s(c.tick)
        rss = self.world.agree_max([peak_rss_mb()])[0]
        wait, busy = iv.waited_s / wall, iv.loader_busy_s / wall
        # The step's wait is the GPU's time on CUDA, the loader's on a CPU: named for it.
        on_gpu = plan.device.type == "cuda"
        values = dict(
            tick=c.tick,
            bytes_seen=c.tick * plan.B,
            loss=loss,
            train_bpb=bpb,
            val_bpb=val_bpb,
            grad_norm=grad_norm,
            lr=lr,
            leak=leak,
            bytes_per_s=bps,
            elapsed_s=elapsed_s,
            bytes_per_s_run=run_bps,
            loader_wait_pct=None if on_gpu else 100 * wait,
            gpu_wait_pct=100 * wait if on_gpu else None,
            loader_busy_pct=100 * busy,
            compute_s=phases["compute"],
            allreduce_s=phases.get("allreduce"),
            optimizer_s=phases["optimizer"],
            boundary_s=iv.boundary_s,
            val_s=iv.boundary["val"] or None,
            sample_s=iv.boundary["sample"] or None,
            ckpt_s=iv.boundary["ckpt"] or None,
            peak_rss_mb=rss,
            peak_device_mb=device_peak_mb(plan.device),
            eta_s=eta_s,
            **self._noise(c),
        )
        self.progress.row(**values)
        if self.tb is not None:
            self.tb.row(c.tick * plan.B, values)
        # The step waiting for its window is the loader's fault only when the loader was busy
        # most of that time (on CUDA the wait is mostly the GPU finishing earlier windows).
        loader_bound = wait > LOADER_WAIT_WARN and busy > LOADER_BUSY_WARN
        if loader_bound and c.tick - iv.tick0 >= plan.window_schedule.K * 4:
            self.warn_once(
                "loader",
                f"the step waited for its windows {100 * wait:.0f}% of the time over ticks "
                f"{iv.tick0}-{c.tick}, and the loader was busy {100 * busy:.0f}% of it: try "
                "--resident (a corpus on a slow disk) or more --loader-threads",
            )
        self.status("running", c, ckpt)
        bs = values.get("b_simple")
        if self.bar is None:
            norm = "" if grad_norm is None else f" grad_norm {grad_norm:.3f}"
            noise = "" if bs is None else f" b_simple {bs:.3g}"
            self.say(
                f"tick {c.tick}/{plan.total} loss {loss:.4f} train_bpb {bpb:.4f}{norm} "
                f"bytes_per_s {bps:,.0f}{noise} eta_s {format_duration(eta_s)}"
            )
        else:
            # tqdm's own estimate of the remaining time is left out of the bar: this one
            # (the launch's long-run rate, checkpoints and validation included) is the ETA.
            last_time = ckpt[1]
            self.bar.set_postfix(
                loss=f"{loss:.3f}",
                train_bpb=f"{bpb:.3f}",
                lr=f"{lr:.3g}",
                **({"b_simple": f"{bs:.3g}"} if bs is not None else {}),
                eta_s=format_duration(eta_s),
                checkpoint_time=(
                    time.strftime("%H:%M:%S", time.localtime(last_time)) if last_time else "-"
                ),
            )

    def _noise(self, c: Counters) -> dict[str, float | None]:
        """The noise scale's moving averages (`noise_scale.NoiseEMA.metrics`), when this
        launch measures it; nothing otherwise (a run's averages from an earlier launch
        would be shown as if current)."""
        if not self.plan.noise_every:
            return {}
        return c.noise.metrics(self.plan.window_schedule.K)

    def val_event(self, tick: int, bpb: float, why: str) -> None:
        """A validation outside the progress rows (an init's at tick 0), in loss.jsonl."""
        self.events.write(
            {"event": "val", "tick": tick, "val_bpb": bpb, "why": why, "time": time.time()}
        )
        self.say(f"tick {tick}: val_bpb {bpb:.4f} ({why})")
        if self.tb is not None:
            self.tb.row(tick * self.plan.B, {"val_bpb": bpb})

    def advance(self, ticks: int) -> None:
        if self.bar is not None:
            self.bar.update(ticks)

    def sample(self, tick: int, text: str) -> None:
        self.samples.write_json(
            {"tick": tick, "prompt": self.plan.sample.prompt, "sample": text, "time": time.time()}
        )
        if self.tb is not None:
            self.tb.sample(tick * self.plan.B, self.plan.sample.prompt, text)

    def status_due(self, c: Counters, ckpt: tuple[Path | None, float | None]) -> None:
        """status.json at a window boundary, when `STATUS_EVERY_S` have passed since the last
        write (so it follows the run whatever --log-every is)."""
        if self.world.is_main and time.time() - self.status_time >= STATUS_EVERY_S:
            self.status("running", c, ckpt)

    def status(
        self, status: str, c: Counters, ckpt: tuple[Path | None, float | None], **fields: object
    ) -> None:
        """status.json (rank 0): the state, where the run is, the policy in force, the
        newest checkpoint and when it was written, and while it runs, the estimated time to
        finish (a stopped, completed or failed run has none)."""
        if not self.world.is_main:
            return
        self.status_time = now = time.time()
        eta_s = self.eta_s(c.tick) if status == "running" else None
        eta = {"eta_s": eta_s, "eta_at": now + eta_s} if eta_s is not None else {}
        write_status(
            self.out,
            status,
            tick=c.tick,
            total_ticks=self.plan.total,
            checkpoint=str(ckpt[0]),
            checkpoint_time=ckpt[1],
            # (a val of an earlier launch is stale when this one does not validate)
            val_bpb=c.val_bpb if self.plan.val is not None else None,
            passes=self.plan.passes(c.tick),
            planned_passes=self.plan.passes(self.plan.total),
            policy=self.plan.policy(),
            recurrence=self.plan.recurrence,
            recurrence_reason=self.plan.recurrence_reason,
            world_size=self.world.size,
            **self._noise(c),
            run_format=RUN_FORMAT,
            **eta,
            **fields,
        )

    def end(
        self,
        how: str,
        c: Counters,
        ckpt: tuple[Path | None, float | None],
        stopped_by: str | None = None,
        error: str | None = None,
        divergence: dict | None = None,
    ) -> None:
        """The launch's last status.json and line: ``completed``, ``stopped`` (by a signal),
        ``failed`` (an I/O error: the checkpoints on disk are intact), ``diverged`` (the
        divergence guard stopped it: `divergence` is its `divergence.stop_record`), or
        ``complete`` (nothing to do: a rerun of a finished run)."""
        newest = ckpt[0]
        if how == "complete":
            self.status("completed", c, ckpt)
            self.say(
                f"already complete at tick {c.tick} ({newest}; the last tick asked for is "
                f"{self.plan.total}): raise --total-ticks to train further"
            )
        elif how == "failed":  # (said first: on a full disk the status write fails too)
            self.say(f"error: {error}; newest checkpoint: {newest}; rerun to resume from it")
            self.status("failed", c, ckpt, error=error)
        elif how == DIVERGED:  # (the line last: what diverged, what was tried, the fix)
            self.status(DIVERGED, c, ckpt, divergence=divergence)
            self.say(describe_stop(divergence))
        elif how == "stopped":
            self.status("stopped", c, ckpt, signal=stopped_by)
            self.say(
                f"stopped by {stopped_by} at tick {c.tick}; checkpoint: {newest}; rerun with "
                f"--output-dir {quote(self.out)} to resume"
            )
        else:
            self.status("completed", c, ckpt)
            self.say(
                f"completed at tick {c.tick} ({c.tick * self.plan.B:,} bytes); final "
                f"checkpoint: {newest}"
            )

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._above.close()

    def close(self) -> None:
        self.close_bar()
        for log in (self.events, self.loss_log, self.progress, self.samples):
            log.close()
        if self.tb is not None:
            self.tb.close()


def _progress_bar(start: int, total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    # One ETA: the bar's own estimate of the remaining time ({remaining}) is left out; the
    # postfix's eta_s is the run's (the launch's long-run rate, boundary work included).
    return tqdm(
        total=total,
        initial=start,
        unit="tick",
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]",
    )
