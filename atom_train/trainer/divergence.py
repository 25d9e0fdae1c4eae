"""The divergence guard: whether a run is diverging, judged from values the trainer already
has on the host, and what to do about it. Pure, standard library only: the trainer feeds
it, the supervisor words its stop, `scripts/divergence_replay.py` replays runs through it
(docs/divergence.md).

**What it reads.** Each optimizer step's ``loss``, ``train_bpb`` and ``grad_norm`` as the
step log reads them from the device, in batches (at each progress row, before each
checkpoint, at the end: no host read of its own), and each validation's ``val_bpb``.

**The rules** (`SIGNALS`); each that fires gives a `Verdict`:

- ``nonfinite``: a loss, train_bpb, gradient norm or val_bpb that is NaN or infinite;
- ``ceiling``: ``train_bpb`` above `CEILING_BPB` (1.5 x a uniform guess over the 256 byte
  values) for ``--spike-steps`` steps in a row, or a ``val_bpb`` above it: no model that
  has learnt anything is there, whatever its history (a run that diverges from its first
  steps has no history to compare with);
- ``loss_spike``: the loss above a robust running baseline, the median of the last
  ``--spike-window`` judged steps' losses plus ``--loss-spike`` times their spread (the
  median absolute deviation x 1.4826: the standard deviation, for normal noise), and at
  least `LOSS_FLOOR` x the median above it, for ``--spike-steps`` judged steps in a row. A
  falling loss stays below its own running median; a step of noise is not several in a row;
- ``grad_spike``: the same on the logarithm of the gradient norm before clipping (a norm
  moves by factors), ``--grad-spike`` spreads and at least a factor `GRAD_FLOOR`;
- ``val_regression``: ``val_bpb`` above the run's best by more than ``--val-regression``
  bits/byte at ``--val-regression-count`` validations in a row.
- ``overfitting``: the same rise of the val while the train loss (its baseline's median) is no
  higher than when the best val was taken: the run is memorising its training text, which
  no rewind or lower rate mends. Said once per rise (``warn`` whatever the policy: the run
  trains on, and keeps its checkpoints); a rise with the train loss up is a regression.

**Judged steps.** Every stream's state resets every ``--episode-length`` ticks, by design:
the loss of the windows after a reset is high and their gradient large (+1.9 nats and 60x
the usual |G|^2 on the first window on the demo corpus, back to normal after about 400
ticks). The spike rules neither judge nor keep in their baselines a window that starts
within `noise_scale.settle_ticks` of a reset (512 ticks with the default episode, at most a
quarter of it), and judge once their baseline holds `MIN_HISTORY` steps; the non-finite and
ceiling rules judge every step.

**Where a divergence began.** A step's loss and gradient are those of the weights before
its update, so a *clean* step (judged, and no rule found it above its threshold) vouches for
the state at its window's start, and the divergence began with its own update: the last
clean step is `Verdict.began_step` and its window's first tick `Verdict.began_tick` (step 1
and tick 0 before any: the fresh state). A checkpoint at or before that tick was written
before the divergence began, and is the only kind a rewind goes back to (`rewind_target`).
A val regression began after the last validation that was not regressed.

**Lag.** A step is judged when its values reach the host: at the first progress row or
checkpoint at or after it. A spike rule fires on its ``--spike-steps``-th bad step, so the
trainer takes at most ``spike_steps - 1 + P`` steps from the first bad one to the one after
which the verdict is known, P being the most steps between two reads
(`steps_between_reads`: ceil(--log-every / K) where K divides the episode length).

**State.** `Detector.state_dict` is a small JSON-safe dict (`STATE_VERSION`): the baselines'
last values, the bad steps in a row of each rule, the last clean step, the best val and the
regressed validations in a row, with `Detector.health` (the summary a checkpoint and
status.json show: healthy or suspect, the baselines, the last losses). Every checkpoint
records it (`GUARD_KEY`), so a resume, or a rewind to that checkpoint, continues the
detector exactly. The rewinds a run has made are not in it (a rewind restores it): they are
the run's ``rewind`` events (`rewinds_since_pivot`).

**After a verdict** (`respond`): ``--on-divergence rewind`` (the default) goes back to the
newest checkpoint written before the divergence began, with the rate lowered by
``--rewind-lr-factor`` and the streams moved past the bytes read since that checkpoint (a
`Response` says which, by how much, and the ``rewind`` event and automatic pivot it is
recorded as), at most ``--max-rewinds`` times within ``--rewind-span`` ticks; past that,
with no checkpoint to go back to, or with ``stop``, the run stops as ``diverged``
(exit code `common.cli.EXIT_DIVERGED`, 3; `stop_record` for status.json, `describe_stop`
for its line); ``warn`` says what fired and trains on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from atom_train.trainer.noise_scale import settle_ticks

STATE_VERSION = 1
SIGNALS = ("nonfinite", "ceiling", "loss_spike", "grad_spike", "val_regression", "overfitting")
ACTIONS = ("rewind", "stop", "warn")
GUARD_KEY = "guard"  # a checkpoint's metadata key for `Detector.state_dict`
DIVERGED = "diverged"  # status.json's state of a run that stopped diverged

# 8 bits/byte is a uniform guess over the 256 byte values. Fresh weights score about 8.4 and
# the first steps of a healthy run at a high rate up to 9.4 (-B 8 --bptt 16 --lr 4e-2 on the
# demo corpus); past 1.5 x uniform a model has learnt nothing and is unlearning (--lr 1
# there sits at 9-20 bits/byte after its first steps, --lr 10 in the thousands).
UNIFORM_BPB = 8.0
CEILING_BPB = 1.5 * UNIFORM_BPB
# A spike rule judges once its baseline holds this many steps (the median and spread of fewer
# are too rough to compare with).
MIN_HISTORY = 16
# The least margin above the baseline, whatever its spread (where the spread is tiny, at a
# large B, moving by a few of them is not diverging): a tenth of the median loss, a factor 4
# on the gradient norm. A rule fires only past both its thresholds; on the healthy runs
# measured (docs/divergence.md) the worst stretches at -B 8 passed the floors (the loss 0.29
# x its median above it, the norm 7 x its median) at 3.3-3.8 spreads, under --loss-spike
# and --grad-spike; at B >= 32 they stayed under both.
LOSS_FLOOR = 0.1
GRAD_FLOOR = 4.0
MAD_TO_SIGMA = 1.4826  # the standard deviation of normal noise per median absolute deviation


@dataclass(frozen=True)
class Thresholds:
    """The rules' thresholds (the flags of the "divergence guard" group; the defaults were
    measured on this project's runs: docs/divergence.md)."""

    window: int = 64  # --spike-window: the steps of the spike rules' baselines
    steps: int = 3  # --spike-steps: bad steps in a row that fire a spike or ceiling rule
    loss_mads: float = 8.0  # --loss-spike: spreads above the median loss
    grad_mads: float = 8.0  # --grad-spike: spreads above the median log gradient norm
    val_margin: float = 0.25  # --val-regression: bits/byte above the best val
    val_count: int = 2  # --val-regression-count: regressed validations in a row
    episode_length: int = 4096  # the model's: where the streams reset

    @property
    def settle(self) -> int:
        """Ticks after a reset whose windows the spike rules do not judge."""
        return settle_ticks(self.episode_length)

    @classmethod
    def from_args(cls, args: object, episode_length: int) -> Thresholds:
        """The thresholds of a parsed command line (the flag table's destinations)."""
        return cls(
            window=args.spike_window,
            steps=args.spike_steps,
            loss_mads=args.loss_spike,
            grad_mads=args.grad_spike,
            val_margin=args.val_regression,
            val_count=args.val_regression_count,
            episode_length=episode_length,
        )


@dataclass(frozen=True)
class Verdict:
    """A rule fired: `signal` (one of `SIGNALS`) on `what` (loss, train_bpb, grad_norm or
    val_bpb) at `step` / `tick` (the end of the step's window, or the validation's), with
    the `value` judged, the `threshold` it passed and the `baseline` it was compared with
    (None where the rule has none). The divergence began at `began_step`, whose window
    starts at `began_tick`."""

    signal: str
    what: str
    step: int
    tick: int
    began_step: int
    began_tick: int
    value: float
    threshold: float
    baseline: float | None = None

    def to_dict(self) -> dict:
        return {
            "signal": self.signal,
            "what": self.what,
            "step": self.step,
            "tick": self.tick,
            "began_step": self.began_step,
            "began_tick": self.began_tick,
            "value": _json_number(self.value),
            "threshold": _json_number(self.threshold),
            "baseline": None if self.baseline is None else _json_number(self.baseline),
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Verdict:
        return cls(
            signal=str(d["signal"]),
            what=str(d["what"]),
            step=int(d["step"]),
            tick=int(d["tick"]),
            began_step=int(d["began_step"]),
            began_tick=int(d["began_tick"]),
            value=float(d["value"]),  # (float("nan") reads JSON's stand-in back)
            threshold=float(d["threshold"]),
            baseline=None if d.get("baseline") is None else float(d["baseline"]),
        )

    def describe(self) -> str:
        """One clause: what fired, where, and where it began."""
        v, limit = _fmt(self.value), _fmt(self.threshold)
        if self.signal == "nonfinite":
            head = f"{self.what} is {v}"
        elif self.signal == "ceiling":
            head = f"{self.what} {v} > {limit} bits/byte (1.5 x a uniform guess)"
        elif self.signal == "val_regression":
            head = f"val_bpb {v} > {limit} (the run's best {_fmt(self.baseline)} + the margin)"
        elif self.signal == "overfitting":
            head = (
                f"val_bpb {v} > {limit} (the run's best {_fmt(self.baseline)} + the margin) "
                "while the train loss is no higher than at that best"
            )
        else:
            head = f"{self.what} {v} > {limit} (its running median {_fmt(self.baseline)})"
        return (
            f"{self.signal.replace('_', ' ')}, {head}, at tick {self.tick:,} (step "
            f"{self.step:,}); it began at tick {self.began_tick:,}"
        )


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.3e}"


def _json_number(x: float) -> float | str:
    """A float as JSON holds it (NaN and the infinities by name: JSON has no such numbers)."""
    return x if math.isfinite(x) else str(x)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class _SpikeRule:
    """One spike rule: its baseline's last values (on its scale: the loss as it is, the
    gradient norm by its logarithm) and its bad steps in a row."""

    log: bool
    history: list[float] = field(default_factory=list)
    run: int = 0  # bad judged steps in a row
    armed: bool = True  # False once it fired, until a step it finds clean (warn trains on)

    def baseline(self) -> tuple[float, float] | None:
        """(median, spread) of the history, or None while it is shorter than MIN_HISTORY."""
        if len(self.history) < MIN_HISTORY:
            return None
        med = _median(self.history)
        return med, MAD_TO_SIGMA * _median([abs(x - med) for x in self.history])

    def judge(self, x: float, mads: float, steps: int, window: int) -> tuple[str, float, float]:
        """Judge one step's value, then keep it in the baseline: ("unjudged" | "clean" |
        "bad" | "fire", the threshold, the median), the last two on the value's scale (nan
        while there is no baseline)."""
        y = math.log(max(x, 1e-300)) if self.log else x
        base = self.baseline()
        self.history.append(y)
        del self.history[:-window]
        if base is None:
            return "unjudged", math.nan, math.nan
        med, spread = base
        floor = math.log(GRAD_FLOOR) if self.log else LOSS_FLOOR * abs(med)
        limit = med + max(mads * spread, floor)
        back = math.exp if self.log else float
        if y <= limit:
            self.run, self.armed = 0, True
            return "clean", back(limit), back(med)
        self.run += 1
        if self.run < steps or not self.armed:
            return "bad", back(limit), back(med)
        self.armed = False
        return "fire", back(limit), back(med)

    def to_dict(self) -> dict:
        return {"history": list(self.history), "run": self.run, "armed": self.armed}

    def load(self, d: Mapping, window: int) -> None:
        # (a shorter --spike-window on this launch keeps the newest values)
        self.history = [float(x) for x in d["history"]][-window:]
        self.run, self.armed = int(d["run"]), bool(d["armed"])


class Detector:
    """The guard's judgement, fed in order step by step (`feed_step`, or a flush's batch with
    `feed_steps`) and validation by validation (`feed_val`): a `Verdict` where a rule fires.
    `Detector(thresholds, state)` continues from a `state_dict()`."""

    def __init__(self, thresholds: Thresholds, state: Mapping | None = None) -> None:
        self.t = thresholds
        self.loss = _SpikeRule(log=False)
        self.grad = _SpikeRule(log=True)
        self.ceiling_run = 0  # steps in a row above the ceiling
        # The newest state the rules found healthy, as (the step after it, its tick): a
        # step's loss and gradient are those of the weights before its update, so a clean
        # step vouches for the state at its window's start. (1, 0): the fresh state.
        self.clean = (1, 0)
        self.last = (0, 0)  # (step, tick) of the last step fed
        self.best_val: float | None = None
        self.good_val = (1, 0)  # as `clean`, for the last validation that was not regressed
        self.val_run = 0  # regressed validations in a row
        # The loss baseline's median when the best val was taken, and whether the val's rise
        # since is memorising (the train loss no higher than then), said once.
        self.best_val_loss: float | None = None
        self.memorising = False
        if state is not None:
            self.load_state_dict(state)

    def judged(self, tick: int, K: int) -> bool:
        """Whether the spike rules judge the window of K ticks ending at `tick` (not one that
        starts within the settling ticks after an episode reset)."""
        return (tick - K) % self.t.episode_length >= self.t.settle

    def feed_step(
        self, step: int, tick: int, K: int, loss: float, train_bpb: float, grad_norm: float | None
    ) -> Verdict | None:
        """One optimizer step's values (its window: the K ticks ending at `tick`); grad_norm
        None: not measured (clipping off)."""
        t, (began_step, began_tick) = self.t, self.clean
        self.last = (step, tick)

        def verdict(signal: str, what: str, value: float, limit: float, base=None) -> Verdict:
            return Verdict(signal, what, step, tick, began_step, began_tick, value, limit, base)

        for what, x in (("loss", loss), ("train_bpb", train_bpb), ("grad_norm", grad_norm)):
            if x is not None and not math.isfinite(x):
                # (no baseline keeps it; the rules' runs start over)
                self.loss.run = self.grad.run = self.ceiling_run = 0
                return verdict("nonfinite", what, x, math.inf)
        fired: Verdict | None = None
        bad = train_bpb > CEILING_BPB
        if bad:
            self.ceiling_run += 1
            if self.ceiling_run == t.steps:  # (once per stretch above it)
                fired = verdict("ceiling", "train_bpb", train_bpb, CEILING_BPB)
        else:
            self.ceiling_run = 0
        if not self.judged(tick, K):
            return fired
        rules = [(self.loss, "loss_spike", "loss", loss, t.loss_mads)]
        if grad_norm is not None:
            rules.append((self.grad, "grad_spike", "grad_norm", grad_norm, t.grad_mads))
        for rule, signal, what, x, mads in rules:
            result, limit, med = rule.judge(x, mads, t.steps, t.window)
            bad = bad or result in ("bad", "fire")
            if result == "fire" and fired is None:
                fired = verdict(signal, what, x, limit, med)
        if not bad:
            self.clean = (step, tick - K)
        return fired

    def feed_steps(self, rows: Iterable[Sequence]) -> list[Verdict]:
        """`feed_step` for each (step, tick, K, loss, train_bpb, grad_norm) of a batch, in
        order: its verdicts."""
        return [v for v in (self.feed_step(*row) for row in rows) if v is not None]

    def feed_val(self, step: int, tick: int, val_bpb: float) -> Verdict | None:
        """One validation's val_bpb, taken after the step `step` ending at `tick`."""
        t, (good_step, good_tick) = self.t, self.good_val

        def verdict(signal: str, limit: float, base=None) -> Verdict:
            return Verdict(signal, "val_bpb", step, tick, good_step, good_tick, val_bpb,
                           limit, base)  # fmt: skip

        if not math.isfinite(val_bpb):
            return verdict("nonfinite", math.inf)
        if val_bpb > CEILING_BPB:
            return verdict("ceiling", CEILING_BPB)
        loss_now = self.loss.baseline()
        if self.best_val is not None and val_bpb > self.best_val + t.val_margin:
            self.val_run += 1
            if self.val_run != t.val_count:  # (once per stretch of regressed validations)
                return None
            if (
                loss_now is not None
                and self.best_val_loss is not None
                and loss_now[0] <= self.best_val_loss
            ):  # the train loss no higher than at the best val: memorising, not diverging
                self.val_run = 0
                if self.memorising:
                    return None
                self.memorising = True
                return verdict("overfitting", self.best_val + t.val_margin, self.best_val)
            return verdict("val_regression", self.best_val + t.val_margin, self.best_val)
        self.val_run, self.memorising = 0, False
        self.good_val = (step + 1, tick)  # (a validation scores the weights at its tick)
        if self.best_val is None or val_bpb < self.best_val:
            self.best_val = val_bpb
            self.best_val_loss = None if loss_now is None else loss_now[0]
        return None

    # ---- state ------------------------------------------------------------------------------

    def vouches_for(self, tick: int) -> bool:
        """Whether a checkpoint written at `tick` is vouched for: a clean step came after it
        (a step's loss judges the weights at its window's start). The newest vouched
        checkpoint is the one never to be written over (the rolling file is rotated into
        its predecessor only when vouched for)."""
        return tick <= self.clean[1]

    def suspect(self) -> bool:
        """A rule has bad steps (or regressed validations) in a row that it has not ruled on
        yet: a checkpoint written now may hold the start of a divergence."""
        return bool(self.loss.run or self.grad.run or self.ceiling_run or self.val_run)

    def health(self) -> dict:
        """The run's health as a checkpoint and status.json show it: ``state`` (healthy or
        suspect), the last step fed and the last clean one, the baselines (the loss's median
        and spread, the gradient norm's median), the last losses judged and the best val."""
        loss, grad = self.loss.baseline(), self.grad.baseline()
        return {
            "state": "suspect" if self.suspect() else "healthy",
            "step": self.last[0],
            "tick": self.last[1],
            "clean_step": self.clean[0],
            "clean_tick": self.clean[1],
            "loss_median": None if loss is None else loss[0],
            "loss_spread": None if loss is None else loss[1],
            "grad_norm_median": None if grad is None else math.exp(grad[0]),
            "last_losses": self.loss.history[-8:],
            "best_val_bpb": self.best_val,
        }

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "loss": self.loss.to_dict(),
            "grad": self.grad.to_dict(),
            "ceiling_run": self.ceiling_run,
            "clean": list(self.clean),
            "last": list(self.last),
            "best_val": self.best_val,
            "good_val": list(self.good_val),
            "val_run": self.val_run,
            "best_val_loss": self.best_val_loss,
            "memorising": self.memorising,
            "health": self.health(),  # (for readers of the checkpoint; not read back)
        }

    def load_state_dict(self, state: Mapping) -> None:
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"the divergence guard's state has version {version!r}; this atom reads "
                f"version {STATE_VERSION}: upgrade atom"
            )
        w = self.t.window
        self.loss.load(state["loss"], w)
        self.grad.load(state["grad"], w)
        self.ceiling_run = int(state["ceiling_run"])
        self.clean = (int(state["clean"][0]), int(state["clean"][1]))
        self.last = (int(state["last"][0]), int(state["last"][1]))
        self.best_val = None if state["best_val"] is None else float(state["best_val"])
        self.good_val = (int(state["good_val"][0]), int(state["good_val"][1]))
        self.val_run = int(state["val_run"])
        loss = state.get("best_val_loss")  # (a state written before these two: their defaults)
        self.best_val_loss = None if loss is None else float(loss)
        self.memorising = bool(state.get("memorising", False))


def describe_settings(t: Thresholds, policy: Policy, log_every: int, K: int) -> str:
    """The guard's settings in one line (the pre-flight's and the start banner's), with the
    most steps from the first bad step to a verdict at this --log-every and K."""
    lag = detection_lag_steps(t.steps, log_every, K, t.episode_length)
    if policy.action == "rewind":
        span = f"{policy.span:,} ticks" if policy.span > 0 else "the run"
        act = (
            f"rewind (at most {policy.max_rewinds} within {span}, the rate x "
            f"{policy.lr_factor:g} each time)"
        )
    else:
        act = policy.action
    return (
        f"divergence guard: {act}; loss spike {t.loss_mads:g} spreads and grad_norm spike "
        f"{t.grad_mads:g} over the last {t.window} steps, {t.steps} in a row; train_bpb "
        f"above {CEILING_BPB:g}; val_bpb {t.val_margin:g} above its best "
        f"{t.val_count} times in a row; a verdict within {lag} steps of the first bad one "
        f"(--log-every {log_every}, K {max(K, 1)})"
    )


def health_of(meta: Mapping) -> Mapping | None:
    """The health a checkpoint's metadata recorded when it was written (None: written without
    the guard)."""
    state = meta.get(GUARD_KEY)
    health = state.get("health") if isinstance(state, Mapping) else None
    return health if isinstance(health, Mapping) else None


def steps_between_reads(log_every: int, K: int, episode_length: int) -> int:
    """The most optimizer steps between two reads of the step values: progress rows come at
    the first window end at or after each multiple of `log_every` ticks, and windows end at
    the multiples of K (and of the episode length, when K does not divide it); checkpoints
    read them too, which only shortens a gap. With --log-every 0 (rows only at the end) the
    step log still reads every 1,024 steps (`reporting.MAX_PENDING_STEPS`)."""
    K = max(K, 1)
    if log_every <= 0:
        return 1024
    extra = 0 if episode_length % K == 0 else log_every // episode_length + 1
    return min(-(-log_every // K) + extra, 1024)


def detection_lag_steps(spike_steps: int, log_every: int, K: int, episode_length: int) -> int:
    """The most steps the trainer takes from the first bad step to the one after which the
    guard has its verdict, both counted: a spike rule fires on its `spike_steps`-th bad step,
    and the values reach the host at the next read (`steps_between_reads`)."""
    return spike_steps - 1 + steps_between_reads(log_every, K, episode_length)


# ---- what a verdict leads to -------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """What the run does about a verdict (the flags ``--on-divergence``, ``--max-rewinds``,
    ``--rewind-span``, ``--rewind-lr-factor``)."""

    action: str = "rewind"  # one of ACTIONS
    max_rewinds: int = 3
    span: int = 0  # ticks within which rewinds count (0: the whole run since its last pivot)
    lr_factor: float = 0.5

    @classmethod
    def from_args(cls, args: object, ckpt_every: int | None = None) -> Policy:
        """From the guard's flag values in `args` (a parsed command line, or a RunConfig's
        guard section with the run's `ckpt_every`)."""
        span = args.rewind_span
        if span is None:  # (the default: ten checkpoint periods)
            span = REWIND_SPAN_PERIODS * (args.ckpt_every if ckpt_every is None else ckpt_every)
        return cls(args.on_divergence, args.max_rewinds, span, args.rewind_lr_factor)


# --rewind-span's default, in checkpoint periods: a rewind goes back at least to the last
# checkpoint; divergences that keep coming back within ten periods say the damping fails.
REWIND_SPAN_PERIODS = 10


@dataclass(frozen=True)
class Candidate:
    """A checkpoint a rewind may go back to: its file name, tick and step, and the health it
    recorded (`health_of`; None: written without the guard)."""

    name: str
    tick: int
    step: int
    health: Mapping | None = None


def rewind_target(candidates: Iterable[Candidate], verdict: Verdict) -> Candidate | None:
    """The newest checkpoint written before the divergence began (at or before
    `verdict.began_tick`) that was not written while a rule saw bad steps (health
    ``suspect``): the last healthy checkpoint. Between two of the same tick, a snapshot
    (never overwritten) before a rolling file. None: there is none."""
    fit = [
        c
        for c in candidates
        if c.tick <= verdict.began_tick and (c.health is None or c.health.get("state") == "healthy")
    ]
    if not fit:
        return None
    return max(fit, key=lambda c: (c.tick, c.name.startswith("snapshot-"), c.name))


def rewinds_since_pivot(events: Iterable[Mapping]) -> list[Mapping]:
    """The run's ``rewind`` events since the last pivot a person made (one that lowered the
    rate, say, after a stop): what `respond` counts against ``--max-rewinds``."""
    out: list[Mapping] = []
    for e in events:
        kind = e.get("event")
        if kind == "pivot" and not e.get("auto"):
            out = []
        elif kind == "rewind":
            out.append(e)
    return out


@dataclass(frozen=True)
class Response:
    """What the run does about `verdict`: ``rewind`` to `target` with the rate `lr` (before,
    after) and every stream moved `skip_ticks` bytes further than the checkpoint's position
    (past the bytes it read between the checkpoint and the verdict), ``stop`` (diverged:
    `reason` says why; `target` is then the last healthy checkpoint, if any) or ``warn``.
    `rewinds`: the run's rewinds counted (this one included, for a rewind)."""

    action: str
    verdict: Verdict
    reason: str
    target: Candidate | None = None
    lr: tuple[float, float] | None = None
    skip_ticks: int = 0
    rewinds: tuple[Mapping, ...] = ()

    def rewind_event(self, time: float) -> dict:
        """The ``rewind`` event (events.jsonl and loss.jsonl, at the verdict): the span given
        up (from the target's tick to the verdict's: its steps stay in loss.jsonl), the
        checkpoint gone back to, the verdict, the new rate and the bytes skipped."""
        assert self.action == "rewind" and self.target is not None and self.lr is not None
        return {
            "event": "rewind",
            "tick": self.verdict.tick,
            "step": self.verdict.step,
            "given_up": [self.target.tick, self.verdict.tick],
            "checkpoint": self.target.name,
            "to_tick": self.target.tick,
            "to_step": self.target.step,
            "verdict": self.verdict.to_dict(),
            "lr": list(self.lr),
            "skip_ticks": self.skip_ticks,
            "rewind": len(self.rewinds),
            "time": time,
        }

    def pivot_fields(self) -> dict:
        """What the automatic pivot at the target's tick adds to a pivot event of the usual
        form (``changes``, ``policy``): ``auto`` (what made it) and the bytes skipped."""
        return {"auto": "rewind", "skip_ticks": self.skip_ticks}


def respond(
    verdict: Verdict,
    policy: Policy,
    rewinds: Sequence[Mapping],
    candidates: Iterable[Candidate],
    lr: float,
) -> Response:
    """The response to `verdict` under `policy`, given the run's rewinds so far
    (`rewinds_since_pivot`), the checkpoints on disk and `lr`, the rate it diverged at (the
    schedule's at `verdict.began_step`)."""
    target = rewind_target(candidates, verdict)
    if verdict.signal == "overfitting":  # (no rate or rewind fixes it: more text does)
        reason = "memorising its training text, not diverging: use more text or a shorter run"
        return Response("warn", verdict, reason, target)
    if policy.action == "warn" and verdict.signal != "nonfinite":
        return Response("warn", verdict, "--on-divergence warn", target)
    if policy.action == "warn":  # (a NaN gradient makes AdamW's m and v NaN: nothing trains on)
        reason = "a non-finite value cannot be trained on (--on-divergence warn)"
        return Response("stop", verdict, reason, target, rewinds=tuple(rewinds))
    if policy.action == "stop":
        return Response("stop", verdict, "--on-divergence stop", target, rewinds=tuple(rewinds))
    recent = tuple(
        r for r in rewinds if policy.span <= 0 or verdict.tick - int(r.get("tick", 0)) < policy.span
    )
    if len(recent) >= policy.max_rewinds:
        within = f" within {policy.span:,} ticks" if policy.span > 0 else ""
        reason = (
            f"{len(recent)} rewind{'s' if len(recent) != 1 else ''}{within} already "
            f"(--max-rewinds {policy.max_rewinds})"
        )
        return Response("stop", verdict, reason, target, rewinds=tuple(rewinds))
    if target is None:
        reason = f"no checkpoint was written before tick {verdict.began_tick:,}, where it began"
        if verdict.began_tick == 0:
            reason = "it diverged from its first steps: no checkpoint was written before"
        return Response("stop", verdict, reason, None, rewinds=tuple(rewinds))
    return Response(
        "rewind",
        verdict,
        f"rewind {len(rewinds) + 1}",
        target,
        lr=(lr, lr * policy.lr_factor),
        skip_ticks=verdict.tick - target.tick,
        rewinds=(*rewinds, {"tick": verdict.tick, "to_tick": target.tick}),
    )


def stop_record(response: Response, checkpoint_path: str | None = None) -> dict:
    """status.json's ``divergence`` of a run that stops diverged: the verdict, why it stops,
    the rewinds tried (each: the tick it fired at, the tick gone back to, the rates) and the
    last healthy checkpoint (`checkpoint_path`: the target's path, as status.json names
    checkpoints)."""
    t = response.target
    return {
        "verdict": response.verdict.to_dict(),
        "reason": response.reason,
        "rewinds": [
            {k: r[k] for k in ("tick", "to_tick", "lr") if k in r} for r in response.rewinds
        ],
        "last_healthy": None
        if t is None
        else {"checkpoint": checkpoint_path or t.name, "tick": t.tick, "step": t.step},
    }


def describe_stop(record: Mapping) -> str:
    """The line that ends a diverged run (the trainer's, and the supervisor's from
    status.json): what diverged and when, what was tried, why it stopped, the last healthy
    checkpoint and the fix."""
    verdict = Verdict.from_dict(record["verdict"])
    tried = record.get("rewinds") or []
    if tried:
        steps = []
        for r in tried:
            rate = r.get("lr")
            lowered = f", lr {_fmt(rate[0])} -> {_fmt(rate[1])}" if rate else ""
            steps.append(f"tick {int(r['tick']):,} back to {int(r['to_tick']):,}{lowered}")
        what = f"tried {len(tried)} rewind{'s' if len(tried) != 1 else ''} ({'; '.join(steps)})"
    else:
        what = "no rewind tried"
    healthy = record.get("last_healthy")
    if healthy:
        where = (
            f"last healthy checkpoint: {healthy['checkpoint']} (tick {int(healthy['tick']):,}); "
            "lower --lr (python -m atom_train.tune lr measures one for this -B and K) and "
            "rerun to resume from it"
        )
    else:
        where = (
            "no healthy checkpoint: start again with a lower --lr (python -m atom_train.tune "
            "lr measures one for this -B and K)"
        )
    return f"diverged: {verdict.describe()}; {what}; stopped: {record['reason']}; {where}"
