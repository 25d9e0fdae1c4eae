"""The gradient noise scale: how many streams one optimizer step is worth.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (2018). With
G the true gradient of the loss and Σ the covariance of one example's gradient (here: one
stream's gradient over a window), the gradient of a batch of b streams has

    E |G_b|^2 = |G|^2 + tr(Σ) / b.

So the squared norms of two gradients taken on the same window over b_small and b_big
streams give unbiased estimates of both terms (the paper's appendix A.1), `estimate`:

    |G|^2  ≈ (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Σ)  ≈ (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

and the simple noise scale B_simple = tr(Σ) / |G|^2 predicts the critical batch: well below
it, doubling B nearly halves the optimizer steps to a given loss (the steps are the limit);
well above it, a larger B buys almost nothing per byte (the bytes are the limit). Under the
paper's model, training to a given loss at batch B takes S_min (1 + B_noise / B) steps and
E_min (1 + B / B_noise) examples (`steps_factor`, `bytes_factor`).

One measurement is noisy: either estimate can come out negative. Each is smoothed over the
measurements with a moving average of its own (`NoiseEMA`), and B_simple is the ratio of the
two averages: an average of per-measurement ratios would be dominated by the measurements
whose |G|^2 estimate happens to be near zero. Early in training |G|^2 falls by orders of
magnitude within a few hundred steps; a plain moving average would remember the early,
large values for a long time (on the demo corpus it read B_simple 3 where the measurements
of the last 50 steps said 35). So each measurement is weighted by the inverse of the scale of
the gradient, |G_big|^2, of the measurement before it: a measurement from when the gradient
was 30x larger counts as much as a recent one, not 30 times more. (Its own |G_big|^2 would
be a weight correlated with its own noise, and bias the ratio: by 2.5x at B = B_simple / 6
in the synthetic tests.)

The first windows after an episode reset (`settle_ticks`) are not measured: every stream
resets at once, and their gradients are large and alike across streams (on the demo corpus,
|G|^2 60x the usual on the reset's window, 5-10x on the next three, back to normal after
about 400 ticks), so they would make the average describe the reset, not the typical step.

Here one "example" is one stream's gradient over one window of K ticks, so B_simple is
counted in streams; B_simple x K is the same in bytes per step (`b_simple_bytes`), the unit
in which runs with another K compare. Pure arithmetic, standard library only: the trainer's
log, `plot` and ``tune batch`` share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The moving average's weight on the past, per measurement: the estimate averages about the
# last 1 / (1 - EMA_BETA) measurements. On the demo corpus at B = 128 one measurement's
# |G|^2 estimate spreads by 45-65% of its value and tr(Σ)'s by 17-23% (docs/tuning.md):
# the average's (1 + beta) / (1 - beta) = 39 effective measurements bring B_simple to about
# 10%. A longer average would lag more where the noise scale grows fast (early in a run).
EMA_BETA = 0.95
# Windows starting less than this many ticks after an episode reset are not measured (see
# the module docstring); at most a quarter of the episode.
SETTLE_TICKS = 512


@dataclass(frozen=True)
class Estimate:
    """One measurement's unbiased estimates (either may be negative)."""

    grad_sq: float  # |G|^2, the true gradient's squared norm
    trace_cov: float  # tr(Σ), one stream's gradient covariance

    @property
    def b_simple(self) -> float | None:
        """tr(Σ) / |G|^2 (None while |G|^2 is not positive: no meaningful ratio)."""
        return b_simple(self.grad_sq, self.trace_cov)


def estimate(g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> Estimate:
    """|G|^2 and tr(Σ) from the squared norms of two gradients of one window: |G_small|^2
    over `b_small` streams and |G_big|^2 over `b_big` (> b_small). `g_small_sq` may be the
    mean of several subsets' squared norms (the halves of a batch, the ranks of a world):
    the expectation, and so the estimate, is the same, with less spread. `b_small` need not
    be whole: for subsets of sizes b_1 and b_2, E (|G_1|^2 + |G_2|^2) / 2 = |G|^2 + tr(Σ) / b
    with 1 / b = (1 / b_1 + 1 / b_2) / 2 (`harmonic_streams`)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big (got {b_small}, {b_big})")
    grad_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace_cov = (g_small_sq - g_big_sq) / (1 / b_small - 1 / b_big)
    return Estimate(grad_sq, trace_cov)


def settle_ticks(episode_length: int) -> int:
    """Ticks after each episode reset in which no window is measured."""
    return min(SETTLE_TICKS, episode_length // 4)


def measured(tick0: int, window: int, K: int, every: int, episode_length: int) -> bool:
    """Whether the window [tick0, tick0 + window) takes a measurement, with one every
    `every` steps (0: never): in each stretch of every x K ticks from a multiple of it,
    the first window of K ticks (full windows start at multiples of K) that does not start
    within `settle_ticks` of an episode reset. A window cut short (at a checkpoint, say)
    is not measured, nor is the rest of its stretch: its streams' gradients average fewer
    ticks, so they are noisier than the others'. A function of the tick alone: a resumed run
    measures the windows an uninterrupted one would."""
    if every <= 0 or window != K:
        return False
    period = every * K
    start = tick0 - tick0 % period  # the stretch's first tick (a multiple of K)
    settle = settle_ticks(episode_length)
    into = start % episode_length
    # The first multiple of K at or past the stretch's settled start (`start` itself when the
    # stretch starts past the settling ticks). Past the stretch, no window of it is measured:
    # tick0 is within the stretch.
    first = -(-(start + max(0, settle - into)) // K) * K
    return tick0 == first


def harmonic_streams(sizes: list[int]) -> float:
    """The b_small that the mean of the squared norms of subsets of these sizes stands for."""
    return len(sizes) / sum(1 / b for b in sizes)


def b_simple(grad_sq: float, trace_cov: float) -> float | None:
    """tr(Σ) / |G|^2, or None when |G|^2 is not positive (or either is not finite)."""
    if not (math.isfinite(grad_sq) and math.isfinite(trace_cov)) or grad_sq <= 0:
        return None
    return trace_cov / grad_sq


def steps_factor(B: float, b_noise: float) -> float:
    """Optimizer steps to a given loss at batch B, in units of the fewest possible (the
    paper's S / S_min = 1 + B_noise / B)."""
    return 1 + b_noise / B


def bytes_factor(B: float, b_noise: float) -> float:
    """Bytes (examples) to a given loss at batch B, in units of the fewest possible (the
    paper's E / E_min = 1 + B / B_noise)."""
    return 1 + B / b_noise


@dataclass
class NoiseEMA:
    """Moving averages of |G|^2 and tr(Σ) over the measurements, each measurement weighted
    by EMA_BETA^age / |G_big|^2 of the measurement before it (see the module docstring):
    weighted means, so the first measurement is its own average. Saved in checkpoints
    (`to_dict`), so a resumed run logs what an uninterrupted one would."""

    beta: float = EMA_BETA
    grad_sq_sum: float = 0.0  # weighted sums, divided by `weight` when read
    trace_cov_sum: float = 0.0
    weight: float = 0.0
    last_scale: float | None = None  # |G_big|^2 of the last measurement
    count: int = 0  # measurements so far

    def update(self, e: Estimate, g_big_sq: float) -> None:
        """Add one measurement (`g_big_sq`: its |G_big|^2). A non-finite one is left out:
        it would poison every later average."""
        ok = math.isfinite(e.grad_sq) and math.isfinite(e.trace_cov)
        if not (ok and math.isfinite(g_big_sq) and g_big_sq > 0):
            return
        w = 1 / (self.last_scale if self.last_scale is not None else g_big_sq)
        b = self.beta
        self.grad_sq_sum = b * self.grad_sq_sum + (1 - b) * w * e.grad_sq
        self.trace_cov_sum = b * self.trace_cov_sum + (1 - b) * w * e.trace_cov
        self.weight = b * self.weight + (1 - b) * w
        self.last_scale = g_big_sq
        self.count += 1

    @property
    def grad_sq(self) -> float | None:
        return self.grad_sq_sum / self.weight if self.count else None

    @property
    def trace_cov(self) -> float | None:
        return self.trace_cov_sum / self.weight if self.count else None

    @property
    def b_simple(self) -> float | None:
        if not self.count:
            return None
        return b_simple(self.grad_sq_sum, self.trace_cov_sum)  # (the weights cancel)

    def metrics(self, K: int) -> dict[str, float | None]:
        """The logged values: grad_sq, trace_cov, b_simple (streams) and b_simple_bytes
        (bytes per step: b_simple x K); None before the first measurement."""
        bs = self.b_simple
        return {
            "grad_sq": self.grad_sq,
            "trace_cov": self.trace_cov,
            "b_simple": bs,
            "b_simple_bytes": None if bs is None else bs * K,
        }

    def to_dict(self) -> dict:
        return {
            "beta": self.beta,
            "grad_sq_sum": self.grad_sq_sum,
            "trace_cov_sum": self.trace_cov_sum,
            "weight": self.weight,
            "last_scale": self.last_scale,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: object) -> NoiseEMA:
        """A saved average (a checkpoint's); anything else (an older checkpoint without
        one) starts a fresh average."""
        if not isinstance(d, dict):
            return cls()
        try:
            last = d["last_scale"]
            return cls(
                beta=float(d["beta"]),
                grad_sq_sum=float(d["grad_sq_sum"]),
                trace_cov_sum=float(d["trace_cov_sum"]),
                weight=float(d["weight"]),
                last_scale=None if last is None else float(last),
                count=int(d["count"]),
            )
        except (KeyError, TypeError, ValueError):
            return cls()


# ---- reading a stretch of measurements (``python -m atom_train.tune batch``) ----------------


@dataclass(frozen=True)
class Summary:
    """The noise scale over a set of measurements: the ratio of the mean estimates, and
    the spread of that ratio over the measurements (a bootstrap interval)."""

    b_simple: float | None  # mean tr(Σ) / mean |G|^2 (None: mean |G|^2 not positive)
    low: float | None  # the interval's ends (`level`; None: not positive; inf: unbounded)
    high: float | None
    grad_sq: float  # the mean estimates
    trace_cov: float
    n: int  # measurements
    level: float


def summarize(
    estimates: list[Estimate], level: float = 0.8, draws: int = 2000, seed: int = 0
) -> Summary:
    """B_simple over `estimates` (the ratio of their means, as the moving averages do) and
    its `level` bootstrap interval: the ratio over `draws` resamplings of the measurements
    with replacement (seeded: the same input gives the same interval). A resampling whose
    mean |G|^2 is not positive (noise without a measurable signal) counts as infinite."""
    import random

    n = len(estimates)
    if n == 0:
        raise ValueError("no measurements to summarize")
    g = [e.grad_sq for e in estimates]
    t = [e.trace_cov for e in estimates]
    mean_g, mean_t = sum(g) / n, sum(t) / n
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        r = b_simple(sum(g[i] for i in idx), sum(t[i] for i in idx))
        ratios.append(math.inf if r is None else r)
    ratios.sort()
    tail = (1 - level) / 2
    low = ratios[int(tail * (draws - 1))]
    high = ratios[math.ceil((1 - tail) * (draws - 1))]
    return Summary(
        b_simple=b_simple(mean_g, mean_t),
        low=low if low > 0 else None,
        high=high,
        grad_sq=mean_g,
        trace_cov=mean_t,
        n=n,
        level=level,
    )


def recommended_range(b: float) -> tuple[float, float]:
    """The batches (streams) worth training at, for a noise scale b: [b/2, 2b]. At B = b a
    run takes twice the fewest steps and twice the fewest bytes (the paper's critical
    batch); within the range, neither is more than three times its fewest."""
    return b / 2, 2 * b


def advice(B: int, K: int, b: float) -> list[str]:
    """What a noise scale of `b` streams means for a run at -B `B`, --bptt `K`: lines for
    people, with the model's predictions (`steps_factor`, `bytes_factor`)."""
    ratio = B / b
    lo, hi = recommended_range(b)
    half_steps = steps_factor(B / 2, b) / steps_factor(B, b) - 1
    half_bytes = 1 - bytes_factor(B / 2, b) / bytes_factor(B, b)
    double_steps = 1 - steps_factor(2 * B, b) / steps_factor(B, b)
    double_bytes = bytes_factor(2 * B, b) / bytes_factor(B, b) - 1
    where = (
        f"B = {B} is {ratio:.2g}x the noise scale at this loss ({b:,.3g} streams, "
        f"{b * K:,.0f} bytes per step at K = {K})"
    )
    lines = []
    if ratio > 2:
        lines.append(
            f"{where}: the bytes are the limit, most of each step's bytes buy little. Halving "
            f"B costs {100 * half_steps:.0f}% more steps to the same loss and needs "
            f"{100 * half_bytes:.0f}% fewer bytes; a shorter --bptt also gives more steps "
            "per byte, where the model does not need the longer window"
        )
    elif ratio < 0.5:
        lines.append(
            f"{where}: the steps are the limit. Doubling B takes {100 * double_steps:.0f}% "
            f"fewer steps to the same loss for {100 * double_bytes:.0f}% more bytes: worth it "
            "where a step of 2B takes less than twice as long (a GPU that is not yet full)"
        )
    else:
        lines.append(
            f"{where}: near the critical batch, where a run takes about twice the fewest "
            f"steps and twice the fewest bytes. Halving B: {100 * half_steps:.0f}% more "
            f"steps, {100 * half_bytes:.0f}% fewer bytes; doubling it: "
            f"{100 * double_steps:.0f}% fewer steps, {100 * double_bytes:.0f}% more bytes"
        )
    lines.append(
        f"recommended: -B {_round_streams(lo)} to {_round_streams(hi)} at K = {K} (B x K = "
        f"{lo * K:,.0f} to {hi * K:,.0f} bytes per step); the noise scale grows as the loss "
        "falls: measure again later in the run (--noise-scale-every, or --from a checkpoint)"
    )
    return lines


def _round_streams(b: float) -> int:
    """A stream count for people: two significant digits, at least 1."""
    return max(1, int(float(f"{b:.2g}")))
