"""The noise scale's arithmetic (`atom_train.trainer.noise_scale`) on numbers worked by hand:
the estimator, the windows measured, the ratio's edge cases, what a moving average saves, the
summary's interval (seeded: the same numbers every run) and the advice word for word, each
threshold on both sides. Exact: these are a few float operations on exact binary values."""

from __future__ import annotations

import math
import random

import pytest

from atom_train.trainer import noise_scale as ns


def test_the_estimates_of_one_measurement():
    # |G|^2 = (32 x 2 - 16 x 3) / 16 = 1; tr(Σ) = (3 - 2) / (1/16 - 1/32) = 32.
    assert ns.estimate(3.0, 2.0, 16, 32) == ns.Estimate(1.0, 32.0)
    assert ns.estimate(3.0, 2.0, 16, 32).b_simple == 32.0
    # (b_small need not be whole: (2 x 1.5 - 0.5 x 2) / 1.5 and (2 - 1.5) / (1/0.5 - 1/2))
    assert ns.estimate(2.0, 1.5, 0.5, 2) == ns.Estimate(4 / 3, 1 / 3)
    for b_small, b_big in ((0, 32), (-1, 32), (32, 32), (33, 32)):
        with pytest.raises(ValueError) as e:
            ns.estimate(1.0, 1.0, b_small, b_big)
        assert str(e.value) == f"need 0 < b_small < b_big (got {b_small}, {b_big})"


def test_the_streams_a_mean_of_subsets_stands_for():
    assert ns.harmonic_streams([4, 4, 2]) == 3.0  # 3 / (1/4 + 1/4 + 1/2)
    assert ns.harmonic_streams([8]) == 8.0


def test_the_settling_ticks_are_a_quarter_episode_in_whole_ticks():
    assert ns.settle_ticks(66) == 16 and isinstance(ns.settle_ticks(66), int)
    assert ns.settle_ticks(4096) == 512 == ns.settle_ticks(10**6)


def test_measured_windows_past_settling_ticks_that_are_not_a_multiple_of_k():
    # Episodes of 100 ticks (25 settling), K = 16, every 4 steps (stretches of 64 ticks): in a
    # stretch that starts within 25 ticks of a reset, the first multiple of 16 past them.
    got = [t for t in range(0, 700, 16) if ns.measured(t, 16, 16, 4, 100)]
    assert got == [32, 64, 128, 192, 256, 336, 384, 448, 528, 576, 640]
    # Every step: every full window past the settling ticks (64 of an episode of 256).
    assert [t for t in range(0, 160, 16) if ns.measured(t, 16, 16, 1, 256)] == [64, 80, 96, 112,
                                                                               128, 144]  # fmt: skip


def test_the_ratio_wants_a_positive_finite_gradient_and_a_finite_trace():
    assert ns.b_simple(2.0, 6.0) == 3.0
    assert ns.b_simple(0.5, 1.0) == 2.0  # (|G|^2 below 1 is fine)
    assert ns.b_simple(2.0, -1.0) == -0.5  # (the trace's noise can be negative too)
    for g, t in ((0.0, 1.0), (-1.0, 5.0), (math.inf, 1.0), (1.0, math.inf), (math.nan, 1.0),
                 (1.0, math.nan)):  # fmt: skip
        assert ns.b_simple(g, t) is None, (g, t)


def test_what_a_moving_average_saves_and_logs():
    ema = ns.NoiseEMA(beta=0.75)
    ema.update(ns.Estimate(2.0, 10.0), 4.0)  # weight (1 - 0.75) / 4 = 1/16
    assert ema.to_dict() == {"beta": 0.75, "grad_sq_sum": 0.125, "trace_cov_sum": 0.625,
                             "weight": 0.0625, "last_scale": 4.0, "count": 1}  # fmt: skip
    assert ema.metrics(64) == {
        "grad_sq": 2.0, "trace_cov": 10.0, "b_simple": 5.0, "b_simple_bytes": 320.0,
    }  # fmt: skip
    assert ns.NoiseEMA().metrics(64) == {
        "grad_sq": None, "trace_cov": None, "b_simple": None, "b_simple_bytes": None,
    }  # fmt: skip
    saved = {"beta": 0.9, "grad_sq_sum": 1.0, "trace_cov_sum": 2.0, "weight": 0.5,
             "last_scale": None, "count": 3}  # fmt: skip
    assert ns.NoiseEMA.from_dict(saved) == ns.NoiseEMA(0.9, 1.0, 2.0, 0.5, None, 3)


def test_the_summary_of_a_few_measurements_word_for_word():
    est = [ns.Estimate(1.0 + i % 3, 0.5 + i % 2) for i in range(10)]
    # mean |G|^2 1.9, mean tr(Σ) 1.0; the 80% interval of 2,000 resamplings, seeded with 0.
    assert ns.summarize(est) == ns.Summary(
        b_simple=1.0 / 1.9, low=0.4, high=0.6875, grad_sq=1.9, trace_cov=1.0, n=10, level=0.8
    )
    # An interval whose low end is 0 (a resampling of only the traces of 0) has no low end.
    s = ns.summarize([ns.Estimate(1.0, 0.0), ns.Estimate(2.0, 0.0), ns.Estimate(1.0, 1.0)])
    assert (s.b_simple, s.low, s.high, s.n) == (0.25, None, 2 / 3, 3)
    with pytest.raises(ValueError) as e:
        ns.summarize([])
    assert str(e.value) == "no measurements to summarize"


RECOMMENDED_100 = (
    "recommended: -B 50 to 200 at K = 64 (B x K = 3,200 to 12,800 bytes per step); the noise "
    "scale grows as the loss falls: measure again later in the run (--noise-scale-every, or "
    "--from a checkpoint)"
)


@pytest.mark.parametrize(
    "B, first",
    [
        (220, "B = 220 is 2.2x the noise scale at this loss (100 streams, 6,400 bytes per step at "
              "K = 64): the bytes are the limit, most of each step's bytes buy little. Halving B "
              "costs 31% more steps to the same loss and needs 34% fewer bytes; a shorter --bptt "
              "also gives more steps per byte, where the model does not need the longer window"),
        (300, "B = 300 is 3x the noise scale at this loss (100 streams, 6,400 bytes per step at "
              "K = 64): the bytes are the limit, most of each step's bytes buy little. Halving B "
              "costs 25% more steps to the same loss and needs 38% fewer bytes; a shorter --bptt "
              "also gives more steps per byte, where the model does not need the longer window"),
        (200, "B = 200 is 2x the noise scale at this loss (100 streams, 6,400 bytes per step at "
              "K = 64): near the critical batch, where a run takes about twice the fewest steps "
              "and twice the fewest bytes. Halving B: 33% more steps, 33% fewer bytes; doubling "
              "it: 17% fewer steps, 67% more bytes"),
        (50, "B = 50 is 0.5x the noise scale at this loss (100 streams, 6,400 bytes per step at "
             "K = 64): near the critical batch, where a run takes about twice the fewest steps "
             "and twice the fewest bytes. Halving B: 67% more steps, 17% fewer bytes; doubling "
             "it: 33% fewer steps, 33% more bytes"),
        (48, "B = 48 is 0.48x the noise scale at this loss (100 streams, 6,400 bytes per step at "
             "K = 64): the steps are the limit. Doubling B takes 34% fewer steps to the same "
             "loss for 32% more bytes: worth it where a step of 2B takes less than twice as long "
             "(a GPU that is not yet full)"),
        (30, "B = 30 is 0.3x the noise scale at this loss (100 streams, 6,400 bytes per step at "
             "K = 64): the steps are the limit. Doubling B takes 38% fewer steps to the same "
             "loss for 23% more bytes: worth it where a step of 2B takes less than twice as long "
             "(a GPU that is not yet full)"),
    ],
)  # fmt: skip
def test_the_advice_word_for_word(B, first):
    # S/S_min = 1 + b/B, E/E_min = 1 + B/b: at B = 220, halving it gives 1 + 100/110 against
    # 1 + 100/220 (31% more steps) and 2.1 against 3.2 (34% fewer bytes); the percentages are
    # chosen where a figure 1% off would round differently.
    assert ns.advice(B, 64, 100) == [first, RECOMMENDED_100]


def test_the_advice_for_a_noise_scale_under_one_stream_recommends_at_least_one():
    assert ns.advice(3, 16, 0.3)[1] == (
        "recommended: -B 1 to 1 at K = 16 (B x K = 2 to 10 bytes per step); the noise scale "
        "grows as the loss falls: measure again later in the run (--noise-scale-every, or "
        "--from a checkpoint)"
    )


def resampled_ratios(est: list[ns.Estimate], draws: int) -> list[float]:
    """The summary's resamplings by their definition: `draws` times, len(est) indices drawn
    with replacement by random.Random(0).randrange; each the ratio of its sums, sorted."""
    rng, n = random.Random(0), len(est)
    out = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        out.append(sum(est[i].trace_cov for i in idx) / sum(est[i].grad_sq for i in idx))
    return sorted(out)


@pytest.mark.parametrize("draws", [None, 10, 12])  # None: the default, 2,000 resamplings
def test_the_interval_is_two_order_statistics_of_the_resamplings(draws):
    """The 80% interval's ends are the resampled ratios at positions floor(0.1 (draws - 1))
    and ceil(0.9 (draws - 1)) of the sorted draws; at 10 and 12 draws a position one off
    (draws + 1 or draws - 2 in place of draws - 1) picks another ratio (all are distinct);
    at the default, 2,001 resamplings would give other ends."""
    est = [ns.Estimate(1.0 + i, 0.25 * (i * i % 7 + 1)) for i in range(12)]
    ratios = resampled_ratios(est, draws or 2000)
    if draws:  # (so that a position off shows)
        assert len(set(ratios)) == len(ratios)
    k = len(ratios) - 1
    s = ns.summarize(est) if draws is None else ns.summarize(est, draws=draws)
    assert (s.low, s.high) == (ratios[math.floor(0.1 * k)], ratios[math.ceil(0.9 * k)])
