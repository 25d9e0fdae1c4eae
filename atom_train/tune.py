"""Choose the learning rate and the batch from evidence: ``python -m atom_train.tune lr|batch``.

``tune batch`` measures the gradient noise scale for a -B and K (``tune batch --help``, and
`BATCH_DOC` below). ``tune lr --data GLOB -B B`` measures the learning rate:

Two cheap methods, both on the trainer's own pieces (the run plan, the loader and its
prefetcher, the last-atom masks, `WindowStep`: forward, backward, clip, AdamW) and its own
validation (`scoring.score_text`), for the -B and --bptt (K) given:

- **the sweep** (an LR range test, as fastai's ``lr_find`` and Lightning's tuner run it): one
  short run from fresh weights whose learning rate grows geometrically at every optimizer
  step from --min-lr to --max-lr; it stops early when the loss diverges (its running average
  exceeds --stop-factor x its lowest value, or is not finite). The suggestion is read off
  the loss against the LR, smoothed without lag (a centred moving average), by --rule:
  ``minimum`` (the default: --fraction, 1/3, of the LR of the lowest loss; fastai's classic
  rule takes a tenth), ``steepest`` (the steepest descent of the loss against log LR,
  Lightning's rule) or ``valley`` (fastai's default: the middle of the longest descending
  stretch). Every rule is printed. On this model, from fresh weights, the loss falls
  fastest in the first steps whatever the rate, which draws ``steepest`` and ``valley`` to
  rates far too low (docs/tuning.md); a third of the lowest loss's rate matched the best of
  the short runs on the demo corpus;
- **runs** (``--runs``): a few short runs from the same fresh weights, one per learning rate,
  each with the same number of optimizer steps (--steps) and the trainer's schedule flags
  (--lr-schedule, --warmup-steps, --min-lr-ratio), scored by val bits/byte (--val needed).
  ``--runs`` alone runs the sweep first, then the LRs 1/4, 1/2, 1, 2 and 4 x its suggestion;
  ``--runs 1e-2,2e-2,4e-2`` runs those LRs only. The recommendation is the LR of the best val.

A run here is exactly what the trainer computes for the same flags: the same plan, the same
weights, streams and masks, the same steps (a test holds a run's val equal to the trainer's
to the last bit). Nothing is written but the results: a table and the recommendation on
stdout, the numbers as JSON (--out) and a PNG of loss (sweep) and val (runs) against the LR
(--plot).

Examples::

    # the sweep on the demo corpus, for the demo's B and K (about a minute on 2 cores)
    python -m atom_train.tune lr --corpus data/demo -B 128 -K 64 --threads 2

    # sweep, then five short runs around its suggestion, scored on the corpus's val (a few
    # minutes)
    python -m atom_train.tune lr --corpus data/demo -B 128 -K 64 --threads 2 --runs \\
        --steps 150 --lr-schedule cosine --warmup-steps 20

    # a grid of your own at 150 steps each, on text files, JSON and plot where you say
    python -m atom_train.tune lr --data 'notes/*.txt' --val notes-val.txt -B 512 \\
        --runs 1e-2,2e-2,4e-2,8e-2 --steps 150 --out runs/tune/notes-b512.json

    # a GPU model: every model and hardware flag of the trainer applies
    python -m atom_train.tune lr --corpus data/fr -B 1024 --device cuda --n-modes 64 --tf32

Outputs: --out (default runs/tune/lr-B<B>-K<K>.json) and --plot (default: --out with .png).
A short run favours a larger LR than a long one needs at its end: use the result with a
decaying schedule (``--lr-schedule cosine``) and a short warm-up, as the examples above.

Exit status: 0 = done; 2 = a user error (a bad flag, no data, --runs without val text), one
line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from atom_train.common.atomic import atomic_write
from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    counted,
    say,
    set_command,
    some_of,
    user_error_exit,
)
from atom_train.model import scoring
from atom_train.model.lockstep import window_cut
from atom_train.model.reference import ReferenceModel
from atom_train.trainer import flags, noise_scale
from atom_train.trainer.checkpoint_file import CheckpointError
from atom_train.trainer.divergence import Detector, Thresholds, Verdict
from atom_train.trainer.loop import LoopHooks, WindowLoop, scratch_plan
from atom_train.trainer.lr_schedule import LRSchedule
from atom_train.trainer.plan import RunPlan, resolve_run
from atom_train.trainer.prefetch import Window
from atom_train.trainer.reporting import LOG2E
from atom_train.trainer.run_config import Lifecycle, RunConfig
from atom_train.trainer.step import StepStats
from atom_train.trainer.train_state import open_checkpoint, run_config_of, saved_lr_schedule

PROG = "python -m atom_train.tune"
RULES = ("minimum", "steepest", "valley")
DEFAULT_RULE = "minimum"
DEFAULT_FRACTION = 1 / 3  # the minimum rule's share of the lowest loss's rate
RUN_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)  # --runs alone: these x the sweep's suggestion
DEFAULT_OUT_DIR = Path("runs/tune")

# The trainer's flags that mean the same here (declared once, in atom_train.trainer.flags): the data,
# the streams and K, the optimizer and its schedule (--runs), validation, the hardware, and
# every model config field. The rest (length, periods, lifecycle) have no meaning here.
_TRAINER_FLAGS = (
    "data", "corpus", "val", "resident", "allow_binary", "offset_seed", "loader_threads", "transport",
    "B", "bptt", "weight_decay", "grad_clip", "lr_schedule", "warmup_steps", "min_lr_ratio",
    "seed", "val_bytes", "val_streams", "device", "threads", "tf32", "recurrence",
)  # fmt: skip


# `tune batch`: the trainer's flags that mean the same there (no validation, no LR schedule:
# a stretch trains at one rate after the warm-up).
_BATCH_FLAGS = (
    "data", "corpus", "resident", "allow_binary", "offset_seed", "loader_threads", "transport",
    "B", "bptt", "lr", "weight_decay", "grad_clip", "warmup_steps", "seed", "device", "threads",
    "tf32", "recurrence",
)  # fmt: skip


# ---- the pure parts: the sweep's rates, smoothing, divergence, the suggestion rules ------------


def sweep_lrs(min_lr: float, max_lr: float, steps: int) -> list[float]:
    """The sweep's rate at each step: geometric from `min_lr` (step 0) to `max_lr` (the last
    step), exactly at both ends."""
    if steps < 2:
        raise ValueError(f"a sweep needs at least 2 steps, got {steps}")
    ratio = max_lr / min_lr
    lrs = [min_lr * ratio ** (i / (steps - 1)) for i in range(steps)]
    lrs[-1] = max_lr
    return lrs


def running_average(losses: Sequence[float], beta: float) -> list[float]:
    """The bias-corrected exponential moving average (fastai's and Lightning's smoothing):
    causal, so the sweep can stop on it while it runs."""
    out, avg = [], 0.0
    for i, x in enumerate(losses):
        avg = beta * avg + (1 - beta) * x
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def diverged(running: Sequence[float], factor: float, min_steps: int = 5) -> bool:
    """The sweep diverges when its running average is not finite, or (after `min_steps`
    steps) exceeds `factor` x its lowest value so far."""
    if not running:
        return False
    last = running[-1]
    if not math.isfinite(last):
        return True
    return len(running) > min_steps and last > factor * min(running)


# The state of every stream is reset at each episode start (by design): the loss of the
# windows in the first ticks after a reset is high whatever the rate (about +1.9 nats for the
# first 64 ticks and +0.5 for the next 64 with the default model). The sweep trains on them
# but leaves them out of the curve it reads.
SETTLE_TICKS = 128


def settle_ticks(episode_length: int) -> int:
    """Ticks after a reset whose windows the sweep's curve leaves out."""
    return min(SETTLE_TICKS, episode_length // 4)


def settling(tick0: int, episode_length: int, settle: int) -> bool:
    """A window that starts within `settle` ticks of an episode reset (tick 0 included)."""
    return tick0 % episode_length < settle


def centred_average(losses: Sequence[float], width: int) -> list[float]:
    """Each point the mean of the `width` points centred on it (fewer at the ends): smoothing
    without the lag of a running average, for reading the suggestion off a finished sweep."""
    half = max(width, 1) // 2
    x = np.asarray(losses, dtype=np.float64)
    n = len(x)
    return [float(x[max(0, i - half) : min(n, i + half + 1)].mean()) for i in range(n)]


def smoothing_width(n: int) -> int:
    """The centred average's width for a sweep of n steps: a tenth of it, odd, at least 3."""
    w = max(3, round(n / 10))
    return w if w % 2 else w + 1


@dataclass(frozen=True)
class Suggestion:
    rule: str
    lr: float
    index: int  # the sweep's step at (or nearest to) the suggested rate
    why: str


RULE_TEXT = {
    "minimum": "--fraction x the LR of the lowest smoothed loss",
    "steepest": "steepest descent of the smoothed loss against log LR",
    "valley": "the middle of the longest descending stretch of the smoothed loss",
}


def suggest(
    lrs: Sequence[float],
    smoothed: Sequence[float],
    rule: str,
    fraction: float = DEFAULT_FRACTION,
) -> Suggestion:
    """The learning rate `rule` reads off a sweep (`lrs` increasing, `smoothed` the loss at
    each, already smoothed; `fraction`: the minimum rule's). Non-finite losses (a
    divergence) are left out."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}: one of {', '.join(RULES)}")
    loss = np.asarray(smoothed, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(loss))
    if len(finite) < 3:
        raise ValueError("a sweep needs at least 3 finite losses to suggest a rate")
    n = int(finite[-1]) + 1  # up to the last finite point
    lr = np.asarray(lrs[:n], dtype=np.float64)
    loss = loss[:n]
    best = int(np.nanargmin(loss))
    if rule == "minimum":
        target = float(lr[best]) * fraction
        index = int(np.argmin(np.abs(np.log(lr) - math.log(target))))
        why = f"{fraction:.3g} x the LR of the lowest smoothed loss ({lr[best]:.3g})"
        return Suggestion(rule, target, index, why)
    if rule == "steepest":
        # The descending part only (up to the lowest loss), after the first tenth of the
        # steps (where the loss falls because any step helps fresh weights).
        lo = min(max(1, n // 10), max(best - 1, 0))
        hi = max(best, lo + 1)
        seg = slice(lo, hi + 1)
        slope = np.gradient(loss[seg], np.log10(lr[seg]))
        index = lo + int(np.argmin(slope))
        why = f"{RULE_TEXT[rule]} ({slope.min():.3f} per decade)"
        return Suggestion(rule, float(lr[index]), index, why)
    # valley (fastai's `valley`): the longest decreasing subsequence (by index: its points
    # need not be adjacent), then the point a third plus a sixth of the way along it.
    lds = [1] * n
    max_start = max_end = 0
    for i in range(1, n):
        for j in range(i):
            if loss[i] < loss[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
            if lds[max_end] < lds[i]:
                max_end = i
                max_start = max_end - lds[max_end]
    sections = (max_end - max_start) / 3
    index = min(max_start + int(sections) + int(sections / 2), n - 1)
    why = f"{RULE_TEXT[rule]} (steps {max_start}-{max_end})"
    return Suggestion(rule, float(lr[index]), index, why)


def run_grid(suggested: float, factors: Sequence[float] = RUN_FACTORS) -> list[float]:
    """--runs alone: the rates around the sweep's suggestion (3 significant digits)."""
    return [float(f"{suggested * f:.3g}") for f in factors]


def parse_lrs(text: str) -> list[float]:
    """--runs 1e-2,2e-2,...: positive, finite, distinct; sorted."""
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(
            f"--runs takes learning rates separated by commas, e.g. --runs 1e-2,2e-2,4e-2 "
            f"(got {text!r})"
        ) from None
    if not lrs or any(not (math.isfinite(x) and x > 0) for x in lrs):
        raise UserError(f"--runs: every learning rate must be a positive number (got {text!r})")
    return sorted(set(lrs))


# ---- a short run on the trainer's pieces -------------------------------------------------------


def ticks_for_steps(steps: int, K: int, episode_length: int, start: int = 0) -> int:
    """The last tick of `steps` windows from tick `start` (cut at multiples of K and of the
    episode length, as the trainer cuts them with no checkpoint period)."""
    t = start
    for _ in range(steps):
        t = window_cut(t, t + K, [K, episode_length])
    return t


def plan_for(a: argparse.Namespace, steps: int, lr: float) -> RunPlan:
    """The trainer's plan of a new run of `steps` optimizer steps with the trainer's flags
    that `a` holds (the trainer's defaults for the others) and the rate `lr` (no
    checkpoints, logs or periods: nothing is written)."""
    dests = (*_TRAINER_FLAGS, *_BATCH_FLAGS, *flags.dests("model"))
    config = RunConfig.from_args({d: getattr(a, d) for d in dests if hasattr(a, d)})
    bptt = max(config.schedule.bptt, 1)
    config = config.replace(
        lr=lr, ckpt_every=0, snapshot_every=0, val_every=0, log_every=0,
        noise_scale_every=0,  # (a stretch measures through `short_run`'s own argument)
    )  # fmt: skip
    plan = scratch_plan(config, total_ticks=steps * bptt, warn=say)  # (a first guess: cut below)
    total = ticks_for_steps(steps, plan.window_schedule.K, plan.config.episode_length)
    plan.total = total
    plan.window_schedule = dataclasses.replace(plan.window_schedule, total=total)
    plan.lr_schedule = dataclasses.replace(plan.lr_schedule, end_step=steps)
    plan.run_config = plan.run_config.replace(total_ticks=total)
    return plan


StepHook = Callable[[int, int, float, StepStats], bool]  # (step, first tick, lr, stats) -> go on?


def short_run(
    plan: RunPlan, lr_at: Callable[[int], float], on_step: StepHook, measure_every: int = 0
):
    """Train as the trainer does (the one loop, `trainer.loop.WindowLoop`): a new run's seeded
    weights, streams and masks, or for a plan that forks a checkpoint, exactly that run's
    continuation (weights, AdamW's state, streams, runtime state, masks); the trainer's
    `WindowStep`; the rate of this stretch's step i (from 0) being `lr_at(i)`; until the
    plan's last tick or until `on_step` says stop. With `measure_every`, the trainer's
    noise-scale measurements (--noise-scale-every: `noise_scale.measured`) in the steps'
    stats. `on_step` gets each step's stats on the device: a loss it reads costs one host
    read. Returns the model."""
    loop = WindowLoop(plan, lr_at=lr_at, noise_every=measure_every)
    try:
        loop.run(_StepHook(on_step))
    finally:
        loop.close()
    return loop.model


class _StepHook(LoopHooks):
    """`short_run`'s hooks: `on_step` after each window; nothing written."""

    def __init__(self, on_step: StepHook) -> None:
        self.on_step, self.i = on_step, 0

    def after_window(self, w: Window, lr: float, stats: StepStats) -> object:
        go_on = self.on_step(self.i, w.tick0, lr, stats)
        self.i += 1
        return None if go_on else "stopped"


def validate(model: ReferenceModel, plan: RunPlan) -> float:
    """Bits/byte on the val slice: exactly the trainer's validation (`Trainer.validate`)."""
    with plan.backend.precision():  # (the trainer's: TF32 with --tf32 on CUDA)
        return scoring.validate(model, plan)


# ---- the two methods -------------------------------------------------------------------------


@dataclass
class Sweep:
    lrs: list[float]  # the rate of each step taken
    losses: list[float]  # each step's loss (the trainer's: byte CE + length CE + persistence)
    running: list[float]  # the running average the stop rule watched
    smoothed: list[float]  # the centred average the rules read (nan: a step left out)
    counted: list[bool]  # False: a window just after an episode reset, left out
    lowest: int  # the step of the lowest smoothed loss
    planned_steps: int
    stopped: str  # why it ended
    suggestions: dict[str, Suggestion]
    rule: str
    seconds: float

    @property
    def suggestion(self) -> Suggestion:
        return self.suggestions[self.rule]


def run_sweep(plan: RunPlan, a: argparse.Namespace) -> Sweep:
    planned = sweep_lrs(a.min_lr, a.max_lr, a.steps)
    lrs: list[float] = []
    losses: list[float] = []
    running: list[float] = []
    counted: list[bool] = []
    episode = plan.config.episode_length
    settle = settle_ticks(episode)
    stopped = [f"reached --max-lr {a.max_lr:g} after {a.steps} steps"]
    every = max(1, a.steps // 10)
    t0 = time.perf_counter()

    def on_step(i: int, tick0: int, lr: float, stats: StepStats) -> bool:
        loss = float(stats.loss)  # one host read per step: the sweep watches it
        lrs.append(lr)
        losses.append(loss)
        counted.append(not settling(tick0, episode, settle))
        running[:] = running_average(losses, a.smooth)
        if (i + 1) % every == 0:
            say(f"sweep step {i + 1}/{a.steps}: lr {lr:.3g}, loss {loss:.4f}")
        if diverged(running, a.stop_factor):
            low = min(running)
            stopped[0] = (
                f"diverged at step {i + 1} (lr {lr:.3g}): running loss {running[-1]:.4g} > "
                f"{a.stop_factor:g} x its lowest {low:.4g}"
            )
            return False
        return True

    short_run(plan, lambda i: planned[i], on_step)
    seconds = time.perf_counter() - t0
    idx = [i for i, c in enumerate(counted) if c]
    if len(idx) < 3:
        raise UserError(
            f"the sweep {stopped[0]}, before it could suggest anything: lower --min-lr "
            f"(now {a.min_lr:g}) or --max-lr ({a.max_lr:g}), or give more --steps"
        )
    kept = centred_average([losses[i] for i in idx], smoothing_width(len(idx)))
    smoothed = [math.nan] * len(losses)
    for i, v in zip(idx, kept, strict=True):
        smoothed[i] = v
    suggestions = {}
    for r in RULES:
        s = suggest([lrs[i] for i in idx], kept, r, a.fraction)
        suggestions[r] = dataclasses.replace(s, index=idx[s.index])
    return Sweep(
        lrs,
        losses,
        running,
        smoothed,
        counted,
        idx[int(np.argmin(kept))],
        a.steps,
        stopped[0],
        suggestions,
        a.rule,
        seconds,
    )


@dataclass
class RunResult:
    lr: float
    val_bpb: float
    train_loss: float  # mean loss of the last tenth of the steps
    steps: int
    seconds: float
    guard: str | None = None  # the divergence guard's verdict on the run (None: it held)


def guard_thresholds(a: argparse.Namespace, episode_length: int) -> Thresholds:
    """The divergence guard's thresholds a training run with these flags would have (the
    guard flags given to tune, else their defaults)."""
    if all(hasattr(a, d) for d in ("spike_window", "spike_steps", "loss_spike", "grad_spike")):
        return Thresholds.from_args(a, episode_length)
    return Thresholds(episode_length=episode_length)


def run_grid_runs(
    plan: RunPlan, lrs: Sequence[float], steps: int, thresholds: Thresholds | None = None
) -> list[RunResult]:
    """Each rate's short run, judged by the divergence guard as the trainer judges it (the
    same rules on the same values: each step's loss, train_bpb and gradient norm): a run the
    guard fires on is not a candidate (a real run at that rate would be rewound)."""
    t = thresholds or Thresholds(episode_length=plan.config.episode_length)
    results = []
    for k, lr in enumerate(lrs):
        schedule = dataclasses.replace(plan.lr_schedule, lr=lr)
        losses: list[float] = []
        detector = Detector(t)
        fired: list[Verdict] = []
        t0 = time.perf_counter()

        def on_step(
            i: int, tick0: int, rate: float, stats: StepStats, losses=losses, d=detector, f=fired
        ) -> bool:
            losses.append(float(stats.loss))
            K = plan.window_schedule.K
            norm = None if stats.grad_norm is None else float(stats.grad_norm)
            bpb = float(stats.byte_ce) * LOG2E
            v = d.feed_step(i + 1, tick0 + K, K, losses[-1], bpb, norm)
            if v is not None and not f:
                f.append(v)
            return math.isfinite(losses[-1])  # a diverged run stops (its val is not finite)

        model = short_run(plan, schedule.at, on_step)
        val = validate(model, plan) if all(map(math.isfinite, losses)) else math.inf
        tail = losses[-max(1, len(losses) // 10) :]
        verdict = fired[0].describe() if fired else None
        r = RunResult(lr, val, float(np.mean(tail)), len(losses), time.perf_counter() - t0)
        r.guard = verdict
        results.append(r)
        held = "" if verdict is None else f"; the divergence guard fired: {verdict}"
        say(
            f"run {k + 1}/{len(lrs)}: lr {lr:.3g}: val {val:.4f} bits/byte after {r.steps} "
            f"steps ({r.seconds:.0f} s){held}"
        )
    return results


def candidates(results: Sequence[RunResult]) -> list[RunResult]:
    """The runs a rate may be recommended from: a finite val, and the guard held."""
    return [r for r in results if math.isfinite(r.val_bpb) and r.guard is None]


# ---- output ----------------------------------------------------------------------------------


def sweep_table(sw: Sweep, rows: int = 16) -> str:
    n = len(sw.lrs)
    marks = {s.index: s.rule for s in sw.suggestions.values()}
    keep = sorted({*range(0, n, max(1, n // rows)), n - 1, *marks})
    lines = [f"{'step':>5}  {'lr':>9}  {'loss':>7}  {'smoothed':>8}"]
    for i in keep:
        tag = ""
        rules = [s.rule for s in sw.suggestions.values() if s.index == i]
        if rules:
            tag = "  <- " + ", ".join(rules)
        if not sw.counted[i]:
            tag = "  (after a reset: left out)"
        sm = f"{sw.smoothed[i]:>8.4f}" if sw.counted[i] else f"{'-':>8}"
        lines.append(f"{i + 1:>5}  {sw.lrs[i]:>9.3g}  {sw.losses[i]:>7.4f}  {sm}{tag}")
    return "\n".join(lines)


def runs_table(results: Sequence[RunResult], best: RunResult) -> str:
    lines = [f"{'lr':>9}  {'val bits/byte':>13}  {'train loss':>10}  {'seconds':>7}"]
    for r in results:
        mark = "  <- best" if r is best else ""
        if r.guard is not None:
            mark = "  (the divergence guard fired: not a candidate)"
        lines.append(
            f"{r.lr:>9.3g}  {r.val_bpb:>13.4f}  {r.train_loss:>10.4f}  {r.seconds:>7.0f}{mark}"
        )
    return "\n".join(lines)


def figure(
    sw: Sweep | None,
    results: Sequence[RunResult] | None,
    best: RunResult | None,
    title: str,
    schedule: str = "",
):
    """The sweep's loss (left) and the runs' val (right) against the LR, the suggestion
    and the best run marked; `model.lockstep` names the runs' LR schedule."""
    from atom_train.common.figures import finish, log_scale, pyplot

    plt = pyplot()
    panels = [p for p in (sw, results) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.4), squeeze=False)
    axes = list(axes[0])
    xlim = None
    if sw is not None:
        ax = axes.pop(0)
        ax.plot(sw.lrs, sw.losses, color="0.75", lw=0.8, label="loss per step")
        out = [i for i, c in enumerate(sw.counted) if not c]
        if out:
            ax.plot(
                [sw.lrs[i] for i in out],
                [sw.losses[i] for i in out],
                "+",
                color="0.5",
                label="after a reset (left out)",
            )
        kept = [i for i, c in enumerate(sw.counted) if c]
        ax.plot(
            [sw.lrs[i] for i in kept],
            [sw.smoothed[i] for i in kept],
            color="C0",
            lw=1.8,
            label="smoothed (centred)",
        )
        low = sw.lowest
        ax.plot(
            [sw.lrs[low]],
            [sw.smoothed[low]],
            "v",
            color="C2",
            ms=8,
            label=f"lowest loss: {sw.lrs[low]:.2g}",
        )
        for s in sw.suggestions.values():
            chosen = s.rule == sw.rule
            ax.plot(
                [sw.lrs[s.index]],
                [sw.smoothed[s.index]],
                "o" if chosen else "x",
                color="C3" if chosen else "0.3",
                ms=9 if chosen else 6,
                label=f"{s.rule}: {s.lr:.2g}" + (" (suggested)" if chosen else ""),
            )
        ax.axvline(sw.suggestion.lr, color="C3", ls="--", lw=1)
        log_scale(ax, "x")
        ax.set_xlabel("learning rate (grows every step)")
        ax.set_ylabel("training loss")
        lo = float(np.nanmin(sw.smoothed))
        hi = float(np.nanmax(sw.smoothed[: max(3, len(sw.losses) // 5)]))
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
        ax.set_title(f"LR sweep, {len(sw.lrs)} steps")
        xlim = ax.get_xlim()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if results:
        ax = axes.pop(0)
        ok = [r for r in results if math.isfinite(r.val_bpb)]
        ax.plot([r.lr for r in ok], [r.val_bpb for r in ok], "o-", color="C0")
        ax.plot([best.lr], [best.val_bpb], "o", color="C3", ms=10, label=f"best: {best.lr:.3g}")
        ax.axvline(best.lr, color="C3", ls="--", lw=1)
        log_scale(ax, "x")
        ax.set_xlabel("learning rate")
        if xlim is not None:  # the same axis as the sweep's, to read one against the other
            ax.set_xlim(*xlim)
        ax.set_ylabel("val bits/byte")
        ax.set_title(
            f"short runs, {results[0].steps} steps each" + (f", {schedule}" * bool(schedule))
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return finish(fig)


def _default_out(a: argparse.Namespace) -> Path:
    return DEFAULT_OUT_DIR / f"lr-B{a.B}-K{a.bptt}.json"


# ---- tune batch: the gradient noise scale ----------------------------------------------------

BATCH_STEPS = 100


@dataclass
class Measurement:
    """One noise-scale measurement of a stretch (a window of K ticks)."""

    step: int  # the run's optimizer step that took it (as loss.jsonl counts: from 1)
    tick: int  # the window's first tick
    lr: float
    train_bpb: float  # the window's byte CE, bits/byte
    grad_sq_small: float  # |G_small|^2: the mean over the subsets of streams
    streams_small: float
    grad_sq_big: float  # |G_big|^2: all B streams
    streams_big: int
    grad_sq: float  # this measurement's estimates (`noise_scale.estimate`)
    trace_cov: float
    b_simple_ema: float | None  # the moving averages' ratio after it, as the trainer logs


def _given(a: argparse.Namespace) -> frozenset[str]:
    """The trainer flags the batch command line gave (the parser leaves the others out)."""
    dests = {*_BATCH_FLAGS, *(f.name for f in flags.model_flag_fields())}
    return frozenset(d for d in vars(a) if d in dests)


def check_batch(a: argparse.Namespace) -> None:
    given = _given(a)
    if a.from_ckpt is None and not ({"data", "corpus"} & given):
        raise UserError(
            "no training data: pass --data GLOB or --corpus DIR (or --from CKPT: a run's "
            "checkpoint, to measure where that run is)"
        )
    if a.steps < 4:
        raise UserError(f"--steps must be at least 4 (got {a.steps})")
    if a.every < 1:
        raise UserError(f"--every must be at least 1 (got {a.every})")
    for path in (a.out, a.plot):
        if path is not None and path.exists() and path.is_dir():
            raise UserError(f"{path} is a folder: give a file name")


def batch_plan(a: argparse.Namespace) -> tuple[RunPlan, float, int, str]:
    """The stretch's plan, its rate, the run's step it starts after, and where it starts
    (for people). From fresh weights: the trainer's new run of --steps steps with these
    flags, at --lr after --warmup-steps (the rate of a run's beginning; no decay). --from
    CKPT: the run's exact continuation (a fork), its flags in force unless given here,
    --steps steps at the rate the run had reached (or --lr), held."""
    given = _given(a)
    if a.from_ckpt is None:
        plan = plan_for(a, a.steps, a.lr if "lr" in given else flags.BY_DEST["lr"].default)
        return plan, plan.lr, 0, "fresh weights"
    try:
        ck = open_checkpoint(a.from_ckpt)
    except CheckpointError as e:
        raise UserError(f"--from: {e}") from None
    tr, saved = ck.meta.get("training", {}), run_config_of(ck.meta)
    if "B" in given and tr.get("B") != a.B:
        raise UserError(
            f"--from {ck.path} holds a run of -B {tr.get('B')}: a stretch from it runs those "
            f"streams; drop -B (or measure -B {a.B} from fresh weights, without --from)"
        )
    tick, step = int(tr["tick"]), int(tr["step"])
    K = max(a.bptt if "bptt" in given else int(saved.schedule.bptt), 1)
    episode = int(ck.meta["model_config"]["episode_length"])
    fixed = {
        "val": "",  # (no validation here)
        "ckpt_every": 0, "snapshot_every": 0, "val_every": 0, "log_every": 0, "sample_every": 0,
        "noise_scale_every": 0,  # (measured through `short_run`'s own argument)
        "total_ticks": ticks_for_steps(a.steps, K, episode, start=tick),
    }  # fmt: skip
    config = RunConfig.from_args({d: getattr(a, d) for d in given}).replace(**fixed)
    with tempfile.TemporaryDirectory(prefix="atom-tune-") as empty:
        # (a new folder for the fork; nothing is written in it)
        life = Lifecycle(output_dir=empty, fork=str(ck.path))
        plan = resolve_run(config, life, given | set(fixed), warn=say)
    if "lr" in given:
        lr = a.lr
    else:
        sched = saved_lr_schedule(ck.meta)
        lr = sched.at(step) if sched is not None else float(saved.optimizer.lr)
    plan.lr_schedule = LRSchedule(lr)
    return plan, lr, step, f"{ck.path} (tick {tick:,}, step {step:,})"


def run_batch(a: argparse.Namespace) -> dict:
    check_batch(a)
    if getattr(a, "threads", None):
        torch.set_num_threads(a.threads)
    plan, lr, step0, origin = batch_plan(a)
    B, K = plan.B, plan.window_schedule.K
    if B < 2:
        raise UserError(
            f"tune batch compares the gradients of each half of the streams with that of all "
            f"of them: it needs -B 2 or more (got -B {B})"
        )
    out = a.out or DEFAULT_OUT_DIR / f"batch-B{B}-K{K}.json"
    plot_to = a.plot or out.with_suffix(".png")
    for path in (out, plot_to):
        path.parent.mkdir(parents=True, exist_ok=True)
    h = B // 2
    say(
        f"-B {B}, K {K}: {a.steps} steps from {origin} at lr {lr:.3g}; a measurement every "
        f"{counted(a.every, 'step')} on the full windows: the gradients of streams 0-{h - 1}, "
        f"of {h}-{B - 1} and of all {B}; device {plan.device}, "
        f"{counted(torch.get_num_threads(), 'thread')}"
    )
    ema = noise_scale.NoiseEMA()
    found: list[Measurement] = []
    every = max(1, a.steps // 10)
    t0 = time.perf_counter()

    def on_step(i: int, tick0: int, rate: float, stats: StepStats) -> bool:
        loss = float(stats.loss)
        n = stats.noise
        if n is not None:
            small, big = float(n.small_sq), float(n.big_sq)
            e = noise_scale.estimate(small, big, n.b_small, n.b_big)
            ema.update(e, big)
            bpb = float(stats.byte_ce) / math.log(2)
            found.append(
                Measurement(
                    step0 + i + 1, tick0, rate, bpb, small, n.b_small, big, n.b_big,
                    e.grad_sq, e.trace_cov, ema.b_simple,
                )
            )  # fmt: skip
        if (i + 1) % every == 0:
            bs = ema.b_simple
            say(
                f"step {i + 1}/{a.steps}: loss {loss:.4f}, b_simple "
                + (f"{bs:.3g}" if bs is not None else "-")
                + f" (moving average of {ema.count})"
            )
        return math.isfinite(loss)

    short_run(plan, lambda i: lr, on_step, measure_every=a.every)
    seconds = time.perf_counter() - t0
    if len(found) < 4:
        raise UserError(
            f"only {counted(len(found), 'measurement')} in {a.steps} steps: give more --steps (or a "
            "smaller --every)"
        )
    used = found[len(found) // 2 :]  # the stretch's second half: the estimate has settled
    summ = noise_scale.summarize(
        [noise_scale.Estimate(m.grad_sq, m.trace_cov) for m in used], level=BATCH_LEVEL
    )
    bpb = sum(m.train_bpb for m in used) / len(used)
    lines = batch_report(B, K, summ, ema, used, bpb, origin, seconds)
    for line in lines:
        print(line)
    result = {
        "command": "batch",
        "B": B,
        "K": K,
        "bytes_per_step": B * K,
        "from": None if a.from_ckpt is None else str(plan.source.path),
        "start_step": step0,
        "steps": a.steps,
        "every": a.every,
        "lr": lr,
        "data": plan.corpus.shards,
        "device": str(plan.device),
        "recurrence": plan.recurrence,
        "threads": torch.get_num_threads(),
        "model_config": plan.config.to_dict(),
        "seconds": seconds,
        "summary": {
            "measurements": summ.n,
            "first_step": used[0].step,
            "last_step": used[-1].step,
            "train_bpb": bpb,
            "grad_sq": summ.grad_sq,
            "trace_cov": summ.trace_cov,
            "b_simple": summ.b_simple,
            "b_simple_low": summ.low,
            "b_simple_high": summ.high,
            "level": summ.level,
            "b_simple_bytes": None if summ.b_simple is None else summ.b_simple * K,
            "b_simple_ema": ema.b_simple,
        },
        "report": lines,
        "measurements": [dataclasses.asdict(m) for m in found],
    }
    atomic_write(out, (json.dumps(_finite_json(result), indent=1) + "\n").encode())
    from atom_train.common.figures import save_figure

    title = f"-B {B}, K {K} ({B * K:,} bytes/step), from {origin}"
    save_figure(batch_figure(found, used, summ, B, title), plot_to)
    say(f"wrote {out} and {plot_to}")
    return result


BATCH_LEVEL = 0.8  # the interval printed: the middle 80% of the bootstrap's ratios


def batch_report(
    B: int,
    K: int,
    summ: noise_scale.Summary,
    ema: noise_scale.NoiseEMA,
    used: list[Measurement],
    bpb: float,
    origin: str,
    seconds: float,
) -> list[str]:
    """What `tune batch` prints: the estimate, its spread, and what it means for this run."""
    head = (
        f"noise scale: -B {B}, K {K}, from {origin}; {summ.n} measurements of steps "
        f"{used[0].step}-{used[-1].step} (train {bpb:.3f} bits/byte), {seconds:.0f} s"
    )
    if summ.b_simple is None:
        return [
            head,
            f"  the mean |G|^2 estimate is not positive ({summ.grad_sq:.3g}): the gradient is "
            "lost in its noise at this B; give more --steps, or measure at a larger -B",
        ]

    def show(x: float | None) -> str:
        return "-" if x is None else ("inf" if math.isinf(x) else f"{x:,.3g}")

    b = summ.b_simple
    lines = [
        head,
        f"  b_simple {b:,.3g} streams ({100 * summ.level:.0f}% interval over the measurements: "
        f"{show(summ.low)} to {show(summ.high)}); b_simple_bytes {b * K:,.0f} "
        f"(bytes per step at K = {K})",
        f"  grad_sq {summ.grad_sq:.4g}, trace_cov {summ.trace_cov:.4g} (means); the moving "
        f"average the trainer logs ended at b_simple {show(ema.b_simple)}",
    ]
    if b <= 0:
        lines.append("  tr(Σ) came out negative: too few measurements; give more --steps")
        return lines
    lines += ["  " + x for x in noise_scale.advice(B, K, b)]
    return lines


def batch_figure(found: list[Measurement], used: list[Measurement], summ, B: int, title: str):
    """The noise scale over the stretch's steps (each measurement's ratio, the moving
    averages' ratio, the summary and its interval, and B), and the training CE below."""
    from atom_train.common.figures import finish, log_scale, pyplot

    plt = pyplot()
    fig, (ax, ax_ce) = plt.subplots(
        2, 1, figsize=(8.5, 6.4), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]}
    )
    steps = [m.step for m in found]
    single = [(m.step, m.trace_cov / m.grad_sq) for m in found if m.grad_sq > 0 and m.trace_cov > 0]
    if single:
        ax.plot(*zip(*single, strict=True), ".", color="0.6", ms=4, label="one measurement")
    ema = [(m.step, m.b_simple_ema) for m in found if m.b_simple_ema and m.b_simple_ema > 0]
    if ema:
        ax.plot(*zip(*ema, strict=True), color="C0", lw=1.8, label="moving averages' ratio")
    if summ.b_simple is not None and summ.b_simple > 0:
        x0, x1 = used[0].step, used[-1].step
        lo = summ.low if summ.low is not None else summ.b_simple
        hi = summ.high if summ.high is not None and math.isfinite(summ.high) else summ.b_simple
        ax.fill_between([x0, x1], [lo, lo], [hi, hi], color="C1", alpha=0.25, lw=0)
        ax.plot(
            [x0, x1],
            [summ.b_simple] * 2,
            color="C1",
            lw=2,
            label=f"b_simple {summ.b_simple:,.3g} ({100 * summ.level:.0f}% interval)",
        )
    ax.axhline(B, color="C3", ls="--", lw=1, label=f"-B {B}")
    log_scale(ax, "y")
    ax.set_ylabel("noise scale b_simple (streams)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax_ce.plot(steps, [m.train_bpb for m in found], color="C2", lw=1)
    ax_ce.set_ylabel("train bits/byte")
    ax_ce.set_xlabel("optimizer step (measured windows)")
    ax_ce.grid(True, alpha=0.3)
    return finish(fig)


# ---- the command line ------------------------------------------------------------------------


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number (got {text})")
    return v


def _add_trainer_flag(group, f: flags.Flag, absent: bool = False) -> None:
    """The trainer's declaration of `f` (names, type, default, help), as `flags.build_parser`
    makes it. `absent`: a flag not given is left out of the parsed namespace (how `tune
    batch` tells a --from run's flags from the ones given)."""
    kwargs = dict(f.kwargs)
    text = f.help
    if f.cls != "model" and f.default is not None and "action" not in kwargs:
        text += f" (default: {f.default})" if absent else " (default: %(default)s)"
    if absent:
        kwargs["default"] = argparse.SUPPRESS
    group.add_argument(*f.names, dest=f.dest, help=text, **kwargs)


BATCH_DOC = """Measure the gradient noise scale for a -B and K: ``python -m atom_train.tune batch``.

A short stretch of training (--steps optimizer steps) on the trainer's own pieces, from fresh
weights or from a run's checkpoint (--from CKPT: that run's exact continuation, its flags in
force), measuring on every full window (--every) the gradient over each half of the B streams
and over all of them: the trainer's --noise-scale-every measurement. From the measurements of
the stretch's second half it prints the noise scale b_simple = tr(Σ) / |G|^2 (the ratio of the
mean estimates) with its spread over the measurements (an 80% bootstrap interval), what it
means for this B and K (steps-limited below it, bytes-limited above), and the recommended B
(and B x K) range; JSON (--out) and a PNG of the estimate over the steps (--plot).

Examples::

    # early in a run: a stretch from fresh weights at the demo's settings (about a minute)
    python -m atom_train.tune batch --corpus data/demo -B 128 -K 64 --lr 4e-2 \\
        --warmup-steps 50 --threads 2

    # where a run is now: from its newest checkpoint (its data, B, K and rate)
    python -m atom_train.tune batch --from runs/demo --threads 2

Outputs: --out (default runs/tune/batch-B<B>-K<K>.json) and --plot (default: --out with .png).

Exit status: 0 = done; 2 = a user error (no data, a bad flag, an unreadable checkpoint), one
line on stderr."""


def build_parser() -> argparse.ArgumentParser:
    parts = __doc__.split("\n\n")
    p = ArgumentParser(
        prog=PROG,
        description=parts[0],
        epilog="\n\n".join(parts[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    sub.required = True
    lr = sub.add_parser(
        "lr",
        help="the learning rate for a -B and K: a sweep, and/or short runs",
        description=parts[0],
        epilog="\n\n".join(parts[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = lr.add_argument_group("the sweep and the runs")
    # fmt: off
    g.add_argument("--min-lr", type=_positive, default=1e-4, metavar="LR",
                   help="the sweep's first rate (default: %(default)s)")
    g.add_argument("--max-lr", type=_positive, default=1.0, metavar="LR",
                   help="the sweep's last rate (default: %(default)s)")
    g.add_argument("--steps", type=int, default=100, metavar="N",
                   help="optimizer steps of the sweep, and of each run (default: %(default)s)")
    g.add_argument("--rule", choices=RULES, default=DEFAULT_RULE,
                   help="how the sweep's suggestion is read: " + "; ".join(
                       f"{k} = {v}" for k, v in RULE_TEXT.items()) + " (default: %(default)s)")
    g.add_argument("--fraction", type=_positive, default=DEFAULT_FRACTION, metavar="F",
                   help="the minimum rule's share of the lowest loss's rate (default: 1/3; "
                   "fastai's classic rule: 0.1)")
    g.add_argument("--smooth", type=float, default=0.9, metavar="BETA",
                   help="the running average the stop rule watches: avg = BETA avg + (1 - "
                   "BETA) loss, bias-corrected (default: %(default)s)")
    g.add_argument("--stop-factor", type=_positive, default=1.5, metavar="F",
                   help="stop the sweep when the running average exceeds F x its lowest value "
                   "(default: %(default)s)")
    g.add_argument("--runs", nargs="?", const="auto", default=None, metavar="LR,LR,...",
                   help="also short runs scored by val bits/byte (needs --val): alone, at 1/4, "
                   "1/2, 1, 2, 4 x the sweep's suggestion; with rates, at those (no sweep)")
    g.add_argument("--out", type=Path, default=None, metavar="FILE.json",
                   help="the results (default: runs/tune/lr-B<B>-K<K>.json)")
    g.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="the plot (default: --out with .png)")
    # fmt: on
    model_flags = [f for f in flags.FLAGS if f.cls == "model"]
    _trainer_groups(lr, [*(flags.BY_DEST[d] for d in _TRAINER_FLAGS), *model_flags])

    bparts = BATCH_DOC.split("\n\n")
    batch = sub.add_parser(
        "batch",
        help="the gradient noise scale for a -B and K: how many streams a step is worth",
        description="\n\n".join(bparts[:2]),
        epilog="\n\n".join(bparts[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    g = batch.add_argument_group("the stretch")
    # fmt: off
    g.add_argument("--from", dest="from_ckpt", metavar="CKPT", default=None,
                   help="continue a run from this checkpoint (or a run folder's newest): its "
                   "data, B, K and rate unless given here")
    g.add_argument("--steps", type=int, default=BATCH_STEPS, metavar="N",
                   help="optimizer steps of the stretch (default: %(default)s)")
    g.add_argument("--every", type=int, default=1, metavar="N",
                   help="a measurement every N steps (default: %(default)s)")
    g.add_argument("--out", type=Path, default=None, metavar="FILE.json",
                   help="the results (default: runs/tune/batch-B<B>-K<K>.json)")
    g.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="the plot (default: --out with .png)")
    # fmt: on
    _trainer_groups(batch, [*(flags.BY_DEST[d] for d in _BATCH_FLAGS), *model_flags], True)
    return p


def _trainer_groups(parser, chosen: list[flags.Flag], absent: bool = False) -> None:
    """The trainer's flags `chosen`, in its --help sections."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in chosen:
        if f.group not in groups:
            groups[f.group] = parser.add_argument_group(
                f"{f.group} (the trainer's flags)", flags.GROUP_HELP.get(f.group)
            )
        _add_trainer_flag(groups[f.group], f, absent)


def check(a: argparse.Namespace) -> None:
    """Refuse what no sweep can use (one line each, naming the flag)."""
    if not a.data and not a.corpus:
        raise UserError(
            "no training data: pass --corpus DIR (a built corpus) or --data GLOB (a file, "
            "folder/*.txt, ...)"
        )
    if a.steps < 3:
        raise UserError(f"--steps must be at least 3 (got {a.steps})")
    if a.min_lr >= a.max_lr:
        raise UserError(f"--min-lr ({a.min_lr:g}) must be below --max-lr ({a.max_lr:g})")
    if not 0 <= a.smooth < 1:
        raise UserError(f"--smooth must be in [0, 1) (got {a.smooth})")
    if a.fraction > 1:
        raise UserError(f"--fraction must be at most 1 (got {a.fraction:g})")
    if a.stop_factor <= 1:
        raise UserError(f"--stop-factor must be above 1 (got {a.stop_factor})")
    if a.runs is not None and not a.val and not a.corpus:
        raise UserError(
            "--runs scores each run on held-out text: pass --val GLOB (or --corpus DIR: its val)"
        )
    if a.runs not in (None, "auto"):
        parse_lrs(a.runs)
    for path in (a.out, a.plot):
        if path is not None and path.exists() and path.is_dir():
            raise UserError(f"{path} is a folder: give a file name")


def run(a: argparse.Namespace) -> dict:
    check(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    plan = plan_for(a, a.steps, a.min_lr)  # (each step's rate is set explicitly)
    if a.runs is not None and plan.val is None:
        raise UserError(
            f"--runs scores each run on held-out text, and --corpus {a.corpus} has no val: pass --val GLOB"
        )
    K = plan.window_schedule.K
    out = a.out or _default_out(a)
    plot_to = a.plot or out.with_suffix(".png")
    for path in (out, plot_to):
        path.parent.mkdir(parents=True, exist_ok=True)
    say(
        f"-B {plan.B}, K {K}: {plan.B * K:,} bytes per step, {a.steps} steps per run "
        f"({plan.total:,} ticks, {plan.total * plan.B:,} bytes); device {plan.device}, "
        f"{plan.recurrence} loop, {counted(torch.get_num_threads(), 'thread')}"
    )
    sw = None
    if a.runs in (None, "auto"):
        sw = run_sweep(plan, a)
        say(f"sweep: {sw.stopped} ({sw.seconds:.0f} s)")
    results = best = None
    if a.runs is not None:
        lrs = run_grid(sw.suggestion.lr) if a.runs == "auto" else parse_lrs(a.runs)
        thresholds = guard_thresholds(a, plan.config.episode_length)
        results = run_grid_runs(plan, lrs, a.steps, thresholds)
        ok = candidates(results)
        if not ok:
            raise UserError(
                f"every run diverged or set off the divergence guard "
                f"({', '.join(f'{x:g}' for x in lrs)}): lower --runs"
            )
        best = min(ok, key=lambda r: r.val_bpb)

    where = f"-B {plan.B} --bptt {K}"
    if sw is not None:
        print(
            f"LR sweep: {where}, lr {a.min_lr:g} -> {a.max_lr:g} over {a.steps} steps; {sw.stopped}"
        )
        print(sweep_table(sw))
        for s in sw.suggestions.values():
            mark = "  (suggested: --rule)" if s.rule == sw.rule else ""
            print(f"  {s.rule:>8}: lr {s.lr:.3g}  ({s.why}){mark}")
    if results is not None:
        print(
            f"short runs: {where}, {a.steps} steps each, {a.lr_schedule} schedule, "
            f"{a.warmup_steps} warm-up steps; val on {plan.val.bytes:,} bytes"
        )
        print(runs_table(results, best))
        edge = best is results[0] or best is results[-1]
        if edge and len(results) > 2:
            print("  note: the best is at the edge of the grid: extend --runs past it")
    if best is not None:
        lr, how = best.lr, f"the best val of the runs ({best.val_bpb:.4f} bits/byte)"
    else:
        lr, how = sw.suggestion.lr, f"the sweep's {sw.rule} rule"
    print(f"recommended for {where}: --lr {lr:.3g}  ({how})")
    result = {
        "command": "lr",
        "B": plan.B,
        "K": K,
        "bytes_per_step": plan.B * K,
        "steps": a.steps,
        "ticks": plan.total,
        "data": plan.corpus.shards,
        "val": None if plan.val is None else plan.val.corpus.shards,
        "val_bytes": None if plan.val is None else plan.val.bytes,
        "device": str(plan.device),
        "recurrence": plan.recurrence,
        "threads": torch.get_num_threads(),
        "model_config": plan.config.to_dict(),
        "optimizer": {
            "weight_decay": plan.weight_decay,
            "grad_clip": plan.grad_clip,
            "lr_schedule": a.lr_schedule,
            "warmup_steps": a.warmup_steps,
            "min_lr_ratio": a.min_lr_ratio,
        },
        "recommended_lr": lr,
        "recommended_by": how,
        "sweep": None,
        "runs": None,
    }
    if sw is not None:
        result["sweep"] = {
            "min_lr": a.min_lr,
            "max_lr": a.max_lr,
            "smooth": a.smooth,
            "stop_factor": a.stop_factor,
            "fraction": a.fraction,
            "smoothing_width": smoothing_width(a.steps),
            "stopped": sw.stopped,
            "seconds": sw.seconds,
            "rule": sw.rule,
            "suggestions": {k: dataclasses.asdict(s) for k, s in sw.suggestions.items()},
            "lowest_loss_lr": sw.lrs[sw.lowest],
            "lr": sw.lrs,
            "loss": sw.losses,
            "running": sw.running,
            "smoothed": sw.smoothed,
        }
    if results is not None:
        result["runs"] = [dataclasses.asdict(r) for r in results]
    atomic_write(out, (json.dumps(_finite_json(result), indent=1) + "\n").encode())
    from atom_train.common.figures import save_figure

    title = f"-B {plan.B}, K {K} ({plan.B * K:,} bytes/step), {some_of(plan.corpus.shards)}"
    schedule = f"{a.lr_schedule}, {a.warmup_steps} warm-up steps"
    save_figure(figure(sw, results, best, title, schedule), plot_to)
    say(f"wrote {out} and {plot_to}")
    return result


def _finite_json(x):
    """JSON has no inf or nan: they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite_json(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    set_command("tune")
    try:
        a = build_parser().parse_args(argv)
        run_batch(a) if a.command == "batch" else run(a)
    except UserError as e:
        return user_error_exit(e)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
