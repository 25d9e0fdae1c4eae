"""The training loop: the one place where windows are trained, for every caller.

`WindowLoop` is built from a `RunPlan` (and a `World`): it owns a launch's set-up — the
process-wide precision (TF32 with --tf32 on CUDA, restored by `close`), the threads, the
state the launch trains from (`start_state`: a new run's seeded weights, or the checkpoint
it continues), the step (`WindowStep`, with the noise probe where measured), the
last-atom masks (`MaskDrawer`) and the prefetcher (`WindowPrefetcher`). `run(hooks)`
trains window after window: the rate (`lr_at`), the step (forward, backward, the gradient
reduction across ranks, clip, AdamW, with the noise measurement where due), the window
released to the prefetcher, the counters moved to the window's end, then the hooks; it
ends at the plan's last tick or where a hook says stop, and closes the prefetcher in all
cases.

The callers differ only in their hooks (`LoopHooks`): the trainer's (`train.Trainer`:
logs, validation, checkpoints, signals, the divergence guard, at window boundaries agreed
by all ranks), tune's short runs (`tune.short_run`: a callback per step, nothing written:
the loop itself does no run-folder I/O), the step bench's trainer mode (`bench.step`: the
loader's share and the step's wait of each window, the windows at its own pace through
`windows`, on `scratch_plan`), a notebook's (any `LoopHooks`). With the default hooks the
loop is exactly the trainer's run without its logs and checkpoints.

`scratch_plan(config, total_ticks=...)`: the trainer's plan of a new run of a `RunConfig`
with no run folder (what bench, which may not import the run planner, trains on).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Generator

import torch

from atom_train.common.cli import say
from atom_train.trainer import noise_scale
from atom_train.trainer.checkpointer import start_state
from atom_train.trainer.distributed import World
from atom_train.trainer.plan import RunPlan, resolve_run
from atom_train.trainer.prefetch import MaskDrawer, Window, WindowPrefetcher
from atom_train.trainer.run_config import Lifecycle, RunConfig
from atom_train.trainer.step import NoiseProbe, StepStats, WindowStep


def scratch_plan(
    config: RunConfig, *, total_ticks: int, warn: Callable[[str], None] = say
) -> RunPlan:
    """The trainer's plan (`trainer.plan.resolve_run`) of a new run of `config` to tick
    `total_ticks`, with no run folder: nothing is read or written but the corpora, which are
    opened (and checked, as the trainer checks them); the backend is the trainer's choice
    (`model.backend.choose_backend`: the Triton fit check, an ``auto`` that picked Triton
    proven by its self-check). The checkpoint, snapshot, validation and log periods are the
    config's (a caller that wants none sets them to 0; windows are cut at the first two).
    `warn`: where the plan's warnings go. A model with fields no flag sets (another feature
    version, an unimplemented option) is no new run's: ValueError."""
    config = config.replace(total_ticks=total_ticks, total_bytes=None)
    with tempfile.TemporaryDirectory(prefix="atom-scratch-") as tmp:
        # (a folder that is not there: a new run, and never made)
        plan = resolve_run(config, Lifecycle(output_dir=os.path.join(tmp, "run")), warn=warn)
    if plan.config != config.model:
        differ = sorted(
            k for k, v in plan.config.to_dict().items() if v != getattr(config.model, k)
        )
        raise ValueError(f"a new run's model is set by its flags; these fields are not: {differ}")
    return plan


class LoopHooks:
    """What a caller does around the loop's windows; every hook here does nothing.

    - `train_window(w, lr)`: the window's step (`WindowLoop.train_window`), which a caller
      may wrap (count it, time it); `self.loop` is the loop running these hooks.
    - `after_backward(w)`: the gradients are in .grad, before their reduction and AdamW.
    - `after_window(w, lr, stats)`: the step is applied and the counters are at the
      window's end; anything but None stops the loop (`run` returns it).
    - `at_boundary(prev)`: a window boundary before the last tick (`prev`: the window's
      first tick); anything but None stops the loop (`run` returns it).
    - `at_end()`: the plan's last tick is reached; `run` returns what it returns."""

    loop: WindowLoop  # (set by `WindowLoop.run`)

    def train_window(self, w: Window, lr: float) -> StepStats:
        return self.loop.train_window(w, lr, self)

    def after_backward(self, w: Window) -> None:
        pass

    def after_window(self, w: Window, lr: float, stats: StepStats) -> object:
        return None

    def at_boundary(self, prev: int) -> object:
        return None

    def at_end(self) -> object:
        return None


class _NoClock:
    def start(self) -> None:
        pass

    def mark(self) -> None:
        pass


class WindowLoop:
    """A launch of `plan` on this rank of `world`: its set-up, then `run(hooks)`.

    `lr_at(i)`: the rate of this loop's i-th window (from 0); by default the run's schedule
    at the step the counters are at. `noise_every`: the noise-scale period (by default the
    plan's --noise-scale-every). `clock`: a `StepClock` timing each window's phases
    (compute, [allreduce,] optimizer), or none."""

    def __init__(
        self,
        plan: RunPlan,
        world: World | None = None,
        *,
        lr_at: Callable[[int], float] | None = None,
        noise_every: int | None = None,
        clock=None,
    ) -> None:
        self.plan = plan
        self.world = world or World()
        if plan.hardware.threads:
            torch.set_num_threads(plan.hardware.threads)
        # Process-wide precision flags are this launch's: restored by close().
        self._restore = contextlib.ExitStack()
        # (the readout's, TF32 with --tf32 on CUDA: the field loops force IEEE fp32 themselves)
        self._restore.enter_context(plan.backend.precision())
        self.state, self.stream, self.resumed_from = start_state(plan, self.world)
        self.noise_every = plan.noise_every if noise_every is None else noise_every
        runtime = self.state.runtime
        params = list(self.state.model.parameters())
        probe = NoiseProbe(runtime, plan.B, self.world.size) if self.noise_every else None
        self.step = WindowStep(
            runtime,
            self.state.optimizer,
            plan.grad_clip,
            reduce_grads=(lambda: self.world.average_grads(params))
            if self.world.distributed
            else None,
            probe=probe,
        )
        self.lr_at = lr_at or (lambda i: self.state.lr_schedule.at(self.state.counters.step))
        self.clock = clock or _NoClock()

    @property
    def model(self) -> torch.nn.Module:
        return self.state.model

    def prefetcher(self) -> WindowPrefetcher:
        """The windows of this rank's streams from the counters' tick to the plan's last,
        cut as the plan's schedule cuts them, with their last-atom masks."""
        plan, sched = self.plan, self.plan.window_schedule
        lo, hi = self.world.shard(plan.B)
        drawer = MaskDrawer(self.state.dropout_gen, plan.config.last_atom_dropout, plan.B, lo, hi)
        return WindowPrefetcher(
            self.stream,
            self.state.counters.tick,
            plan.total,
            sched.cut,
            max_K=sched.K,
            device=plan.device,
            compact=plan.transport == "ids",
            masks=drawer,
        )

    def run(self, hooks: LoopHooks | None = None) -> object:
        """Train to the plan's last tick, or until a hook says stop; returns what the hook
        that stopped it returned (`at_end`'s at the last tick)."""
        windows = self.windows(hooks)
        while True:
            try:
                next(windows)
            except StopIteration as done:
                return done.value

    def windows(self, hooks: LoopHooks | None = None) -> Generator[Window, None, object]:
        """`run`, one window at a time, for a caller that sets the pace (the step bench's
        trainer mode times `next` calls): yields each window once it is trained and its
        `after_window` hook has run (its `at_boundary` runs at the next `next`); returns
        (``StopIteration.value``) what `run` returns. The prefetcher is closed when the
        generator ends, is closed (`close()`: a caller that stops early) or raises."""
        hooks = hooks or LoopHooks()
        hooks.loop = self
        c, total = self.state.counters, self.plan.total
        pf = self.prefetcher()
        i = 0
        try:
            while c.tick < total:
                w = pf.get()
                assert w.tick0 == c.tick, (w.tick0, c.tick)
                prev = c.tick
                lr = self.lr_at(i)
                stats = hooks.train_window(w, lr)
                pf.release(w)
                i += 1
                stop = hooks.after_window(w, lr, stats)
                if stop is not None:
                    return stop
                yield w
                if c.tick >= total:
                    break
                stop = hooks.at_boundary(prev)
                if stop is not None:
                    return stop
            return hooks.at_end()
        finally:
            pf.close()

    def train_window(self, w: Window, lr: float, hooks: LoopHooks) -> StepStats:
        """The step: forward, backward, (all-reduce,) clip, AdamW; the state moves to the
        window's end. Nothing here reads a device value."""
        step, clock = self.step, self.clock
        step.set_lr(lr)
        clock.start()
        measure = self.measures(w)
        out = step.forward_backward(w.feats, w.tgt, w.tick0, w.masks, measure=measure)
        hooks.after_backward(w)
        clock.mark()
        if self.world.distributed:
            step.reduce()
            clock.mark()
        elif measure:
            step.reduce()  # (no ranks: only the measurement's reading of the gradients)
        grad_norm = step.apply()
        clock.mark()
        st, c = self.state, self.state.counters
        c.tick, c.step = w.tick0 + w.K, c.step + 1
        # (a snapshot: the state dict is made only when a checkpoint is written)
        st.loader_state, st.dropout_state = w.loader_snapshot, w.dropout_state
        return StepStats(
            loss=out.loss.detach(),
            byte_ce=out.byte_ce,
            grad_norm=grad_norm,
            noise=step.take_noise(),
        )

    def measures(self, w: Window) -> bool:
        """Whether this window takes a noise-scale measurement (--noise-scale-every); a
        subclass may measure more windows (the step bench measures its warm-up ones, so the
        probe's memory is in its peak)."""
        K, episode = self.plan.window_schedule.K, self.plan.config.episode_length
        return noise_scale.measured(w.tick0, w.K, K, self.noise_every, episode)

    def close(self) -> None:
        """The process-wide precision as it was before this launch."""
        self._restore.close()
