"""The gradient noise scale (`atom_train.trainer.noise_scale`): the estimator on synthetic
gradients of known noise, its moving averages, the summary and the advice; and the probe
(`atom_train.trainer.step.NoiseProbe`) on the real model: its two gradients are those of
the streams' halves and of all of them, and taking them changes nothing the step computes.

Synthetic gradients: per-stream gradients g_i ~ N(G, Σ) in D = 40 dimensions with a known
mean G and covariance Σ = A Aᵀ; a measurement is the pair (|G_small|^2, |G_big|^2) of the
means over b_small and b_big streams. Over M = 4000 measurements the mean of each estimate
is within 4 standard errors of the truth (the standard error is measured from the same
measurements, and is below 1% of the truth here, so a bias of 4% would fail), and the ratio
of the means is within 3% of the true B_simple. Seeded: the numbers are the same each run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from atom_train.model.batched import BatchedByteTick
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel
from atom_train.trainer import noise_scale as ns
from atom_train.trainer.step import NoiseProbe, WindowStep, make_optimizer

D, M = 40, 4000


def _truth(seed: int = 0):
    """A mean gradient G and a covariance Σ = A Aᵀ (B_simple about 20 streams)."""
    rng = np.random.default_rng(seed)
    G = rng.normal(size=D)
    A = rng.normal(size=(D, D)) * 0.7
    return G, A, float(G @ G), float(np.trace(A @ A.T)), rng


def _measure(G, A, rng, sizes: list[int]) -> np.ndarray:
    """M measurements: the squared norms of the mean gradient of each consecutive subset
    of `sizes` streams, and of all of them; [M, len(sizes) + 1]."""
    B = sum(sizes)
    g = G + rng.normal(size=(M, B, D)) @ A.T  # M draws of B per-stream gradients
    out, lo = [], 0
    for b in sizes:
        part = g[:, lo : lo + b].mean(1)
        out.append((part**2).sum(1))
        lo += b
    out.append((g.mean(1) ** 2).sum(1))
    return np.stack(out, 1)


def _check_mean(values: list[float], truth: float) -> None:
    x = np.asarray(values)
    se = x.std(ddof=1) / math.sqrt(len(x))
    assert se < 0.01 * abs(truth), "the test's own resolution: tighten M"
    assert abs(x.mean() - truth) < 4 * se, (x.mean(), truth, se)


@pytest.mark.parametrize("sizes", [[16, 16], [16, 17], [8, 8, 8, 8]])
def test_the_estimates_are_unbiased_for_gaussian_gradients(sizes):
    """Halves (one process), unequal halves (an odd B) and four ranks' subsets: the mean of
    the subsets' squared norms with b_small = `harmonic_streams(sizes)`."""
    G, A, g2, tr, rng = _truth()
    m = _measure(G, A, rng, sizes)
    b_small, B = ns.harmonic_streams(sizes), sum(sizes)
    est = [ns.estimate(float(r[:-1].mean()), float(r[-1]), b_small, B) for r in m]
    _check_mean([e.grad_sq for e in est], g2)
    _check_mean([e.trace_cov for e in est], tr)
    s = ns.summarize(est, draws=200)
    assert s.b_simple == pytest.approx(tr / g2, rel=0.03)
    # The bootstrap's spread of the ratio of means: about its standard error, 1% here.
    assert s.low < s.b_simple < s.high and (s.high - s.low) < 0.06 * s.b_simple


def test_one_subset_against_the_whole_is_the_papers_estimator():
    G, A, g2, tr, rng = _truth(1)
    m = _measure(G, A, rng, [8, 24])  # |G_small|^2: the first 8 streams only
    est = [ns.estimate(float(r[0]), float(r[-1]), 8, 32) for r in m]
    _check_mean([e.grad_sq for e in est], g2)
    _check_mean([e.trace_cov for e in est], tr)


def test_the_tolerance_catches_the_bias_of_a_naive_estimate():
    """|G_big|^2 alone overestimates |G|^2 by tr(Σ)/B: the checks above would fail on it."""
    G, A, g2, _, rng = _truth()
    m = _measure(G, A, rng, [16, 16])
    with pytest.raises(AssertionError):
        _check_mean([float(r[-1]) for r in m], g2)
    with pytest.raises(ValueError):
        ns.estimate(1.0, 1.0, 32, 16)  # b_small must be the smaller


def test_moving_averages_are_of_each_estimate_not_of_the_ratio():
    ema = ns.NoiseEMA(beta=0.9)
    assert ema.b_simple is None and ema.metrics(64)["b_simple_bytes"] is None
    ema.update(ns.Estimate(2.0, 10.0), 4.0)
    # A weighted mean: the first measurement is its own average.
    assert (ema.grad_sq, ema.trace_cov, ema.b_simple) == pytest.approx((2.0, 10.0, 5.0))
    # A measurement whose |G|^2 estimate is near 0 (or negative) has a wild ratio; the
    # averages absorb it. Weights: 0.9^age x (1 - 0.9) / the previous measurement's
    # |G_big|^2 (the first: its own).
    ema.update(ns.Estimate(0.001, 10.0), 2.0)
    ema.update(ns.Estimate(-0.5, 10.0), 1.0)
    w = [0.81 * 0.1 / 4.0, 0.9 * 0.1 / 4.0, 0.1 / 2.0]
    g = (w[0] * 2.0 + w[1] * 0.001 + w[2] * -0.5) / sum(w)
    assert ema.grad_sq == pytest.approx(g)
    assert ema.trace_cov == pytest.approx(10.0)
    assert ema.b_simple == pytest.approx(10.0 / g)
    assert ema.metrics(64)["b_simple_bytes"] == pytest.approx(640.0 / g)
    ema.update(ns.Estimate(math.nan, 1.0), 1.0)  # left out
    ema.update(ns.Estimate(1.0, 1.0), 0.0)  # (no scale: left out)
    assert ema.count == 3
    assert ns.NoiseEMA.from_dict(ema.to_dict()) == ema
    assert ns.NoiseEMA.from_dict(None) == ns.NoiseEMA() == ns.NoiseEMA.from_dict({"x": 1})


@pytest.mark.parametrize("scale", [0.3, 0.7, 1.5])
def test_the_moving_averages_are_unbiased_for_a_stationary_noise_scale(scale):
    """B = 16 streams against B_simple of 2.5, 14 and 64: the ratio of the averages over M
    measurements (beta near 1: a long average, to see a bias rather than noise) is within 4
    standard errors of the truth (the ratio's standard error over the measurements, by a
    bootstrap: up to 4% at B_simple 64). Weighting each measurement by its own |G_big|^2
    instead of the previous one's would read 7% and 57% high at 14 and 64."""
    rng = np.random.default_rng(3)
    G, A = rng.normal(size=D), rng.normal(size=(D, D)) * scale
    truth = float(np.trace(A @ A.T)) / float(G @ G)
    ema = ns.NoiseEMA(beta=1 - 1 / M)
    est = []
    for r in _measure(G, A, rng, [8, 8]):
        est.append(ns.estimate(float(r[:-1].mean()), float(r[-1]), 8, 16))
        ema.update(est[-1], float(r[-1]))
    g = np.array([e.grad_sq for e in est])
    t = np.array([e.trace_cov for e in est])
    idx = np.random.default_rng(0).integers(0, M, (200, M))
    se = float((t[idx].mean(1) / g[idx].mean(1)).std())
    assert abs(ema.b_simple - truth) < 4 * se + 0.01 * truth, (ema.b_simple, truth, se)


def test_the_moving_averages_follow_a_gradient_that_shrinks():
    """|G|^2 falls 100x over the first 40 measurements (as early in training), then stays,
    with B_simple 20 at B = 32 in the end: 40 measurements later the averages read it
    within 30% (0.77 to 1.1 of it over 20 seeds); a plain moving average (every
    measurement weighted alike) still reads it less than 0.6 of it (0.40 to 0.49)."""
    rng = np.random.default_rng(0)
    G0, A = rng.normal(size=D), rng.normal(size=(D, D)) * 0.063
    tr = float(np.trace(A @ A.T))
    ema, plain = ns.NoiseEMA(), ns.NoiseEMA()
    for i in range(80):
        G = G0 * 10 ** (-min(i, 40) / 40)
        g = G + rng.normal(size=(32, D)) @ A.T
        small = ((g[:16].mean(0) ** 2).sum() + (g[16:].mean(0) ** 2).sum()) / 2
        big = float((g.mean(0) ** 2).sum())
        e = ns.estimate(float(small), big, 16, 32)
        ema.update(e, big)
        plain.update(e, 1.0)  # a constant scale: every measurement counts alike
    truth = tr / float(G @ G)
    assert ema.b_simple == pytest.approx(truth, rel=0.3)
    assert plain.b_simple < 0.6 * truth


def test_summary_without_a_signal_says_so():
    s = ns.summarize([ns.Estimate(-1.0, 5.0), ns.Estimate(0.5, 5.0)])
    assert s.b_simple is None and s.high == math.inf
    with pytest.raises(ValueError):
        ns.summarize([])
    again = ns.summarize([ns.Estimate(1.0 + i % 3, 5.0) for i in range(30)])
    assert again == ns.summarize([ns.Estimate(1.0 + i % 3, 5.0) for i in range(30)])


def test_measured_windows():
    # Every 2 steps at K = 16, episodes of 256 ticks (64 settling ticks): in each stretch of
    # 32 ticks the first full window, except within 64 ticks of a reset.
    got = [t for t in range(0, 544, 16) if ns.measured(t, 16, 16, 2, 256)]
    assert got == [64, 96, 128, 160, 192, 224, 320, 352, 384, 416, 448, 480]
    # A period of whole episodes still measures: past the settling ticks of each.
    assert [t for t in range(0, 1024, 16) if ns.measured(t, 16, 16, 16, 256)] == [64, 320, 576, 832]
    assert ns.settle_ticks(4096) == 512 and ns.settle_ticks(64) == 16
    assert not ns.measured(96, 8, 16, 2, 256)  # a window cut short
    assert not ns.measured(96, 16, 16, 0, 256)  # off


def test_advice_states_the_models_predictions():
    above = " ".join(ns.advice(B=400, K=64, b=100))
    assert "4x the noise scale" in above and "bytes are the limit" in above
    # S/S_min = 1 + b/B: 1.25 at 400, 1.5 at 200: +20% steps; E/E_min: 5 -> 3: -40% bytes.
    assert "20% more steps" in above and "40% fewer bytes" in above and "--bptt" in above
    assert "-B 50 to 200" in above and "3,200 to 12,800 bytes per step" in above
    below = " ".join(ns.advice(B=25, K=64, b=100))
    assert "steps are the limit" in below
    # 1 + 100/25 = 5 -> 1 + 100/50 = 3: 40% fewer steps; 1.25 -> 1.5: 20% more bytes.
    assert "40% fewer steps" in below and "20% more bytes" in below
    assert "near the critical batch" in ns.advice(B=100, K=64, b=100)[0]
    assert ns.steps_factor(100, 100) == ns.bytes_factor(100, 100) == 2


# ---- the probe on the real model ---------------------------------------------------------

CFG = ModelConfig(n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8, episode_length=64)
K = 8


def _window(B: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats = (torch.rand(K, B, 320, generator=g) < 0.05).float()
    tgt = torch.randint(0, 256, (K, B), generator=g, dtype=torch.uint8)
    masks = (torch.rand(K, B, generator=g) > 0.5).float()
    return feats, tgt, masks


def _warm_runtime(B: int) -> BatchedByteTick:
    """A runtime whose streams hold state (atoms, persistence) after two windows."""
    torch.manual_seed(0)
    rt = BatchedByteTick(ReferenceModel(CFG), B)
    for i in range(2):
        feats, tgt, masks = _window(B, 10 + i)
        with torch.no_grad():
            rt.run_window(feats, tgt, i * K, masks=masks)
    return rt


def _grad(rt: BatchedByteTick, lo: int, hi: int, window) -> list[torch.Tensor]:
    feats, tgt, masks = window
    sub = rt.substreams(lo, hi)
    out = sub.run_window(feats[:, lo:hi], tgt[:, lo:hi], 2 * K, masks=masks[:, lo:hi])
    params = [p for p in rt.model.parameters() if p.requires_grad]
    return [g.double() for g in torch.autograd.grad(out.loss, params)]


def _sq(gs: list[torch.Tensor]) -> float:
    return float(sum((g * g).sum() for g in gs))


@pytest.mark.parametrize("B", [6, 5])
def test_the_probe_measures_the_halves_and_the_whole(B):
    rt = _warm_runtime(B)
    window = _window(B)
    h = B // 2
    whole, a, b = _grad(rt, 0, B, window), _grad(rt, 0, h, window), _grad(rt, h, B, window)
    # Streams are independent: the whole batch's gradient is the halves' weighted mean
    # (within float32 rounding: measured 3e-7 of each tensor's norm at most).
    for gw, ga, gb in zip(whole, a, b, strict=True):
        assert (gw * B - ga * h - gb * (B - h)).norm() <= 1e-5 * (gw * B).norm()
    step = WindowStep(rt, make_optimizer(rt.model, 1e-3, 0.01), 1.0, probe=NoiseProbe(rt, B))
    feats, tgt, masks = window
    stats = step(feats, tgt, 2 * K, masks, 1e-3, measure=True)
    n = stats.noise
    assert n.b_big == B and n.b_small == pytest.approx(ns.harmonic_streams([h, B - h]))
    assert float(n.big_sq) == pytest.approx(_sq(whole), rel=1e-5)
    assert float(n.small_sq) == pytest.approx((_sq(a) + _sq(b)) / 2, rel=1e-5)
    assert step(feats, tgt, 3 * K, masks, 1e-3).noise is None  # only when asked


def _state(rt: BatchedByteTick, opt) -> dict[str, torch.Tensor]:
    out = {f"runtime/{k}": v for k, v in rt.state_dict().items()}
    out.update({f"model/{k}": v for k, v in rt.model.state_dict().items()})
    for i, st in enumerate(opt.state.values()):
        out.update({f"optim/{i}/{k}": v for k, v in st.items()})
    return out


def test_measuring_changes_nothing_the_step_computes():
    """Three windows with a measurement on each, and three without, from the same state:
    the weights, AdamW's state and the runtime state are equal bit for bit, and no random
    generator moved."""
    results = []
    for measure in (False, True):
        rt = _warm_runtime(6)
        opt = make_optimizer(rt.model, 1e-2, 0.01)
        step = WindowStep(rt, opt, 1.0, probe=NoiseProbe(rt, 6))
        rng = torch.get_rng_state()
        for i in range(3):
            feats, tgt, masks = _window(6, 20 + i)
            step(feats, tgt, (2 + i) * K, masks, 1e-2, measure=measure)
        assert torch.equal(torch.get_rng_state(), rng)
        results.append(_state(rt, opt))
    off, on = results
    assert off.keys() == on.keys()
    for k in off:
        assert torch.equal(off[k], on[k]), k


def test_the_probe_needs_two_streams_and_the_windows_masks():
    rt = BatchedByteTick(ReferenceModel(CFG), 1)
    with pytest.raises(ValueError) as e:
        NoiseProbe(rt, 1)
    assert str(e.value) == "the noise scale needs at least 2 streams to split"
    assert NoiseProbe(BatchedByteTick(ReferenceModel(CFG), 2), 2).b_small == 1.0  # 1 and 1
    rt = _warm_runtime(4)
    feats, tgt, _ = _window(4)
    with pytest.raises(ValueError) as e:
        NoiseProbe(rt, 4).before_forward(feats, tgt, 2 * K, None)
    assert str(e.value) == "the noise probe needs the window's last-atom masks"
    # The measurement reads the half batch's gradient of this window, once.
    probe = NoiseProbe(rt, 4)
    with pytest.raises(RuntimeError) as e:
        probe.after_reduce()
    assert str(e.value) == "after_reduce needs before_forward's half-batch gradient"
    step = WindowStep(rt, make_optimizer(rt.model, 1e-3, 0.01), 1.0, probe=probe)
    step(feats, tgt, 2 * K, _window(4)[2], 1e-3, measure=True)
    with pytest.raises(RuntimeError):
        probe.after_reduce()
    assert NoiseProbe(rt, 8, world_size=4).b_small == 2  # a world: B/N streams per rank


def test_a_parameter_the_window_does_not_reach_counts_as_a_zero_gradient():
    """A trainable parameter outside the window's graph (none in today's model, but a head or
    a frozen-elsewhere part would be one): the half batch's gradient holds zeros for it, and
    the measurement is the one without it, exactly."""
    measured = []
    for extra in (False, True):
        rt = _warm_runtime(6)
        if extra:
            rt.model.unreached = torch.nn.Parameter(torch.ones(3))
        step = WindowStep(rt, make_optimizer(rt.model, 1e-3, 0.01), 1.0, probe=NoiseProbe(rt, 6))
        feats, tgt, masks = _window(6)
        n = step(feats, tgt, 2 * K, masks, 1e-3, measure=True).noise
        measured.append((float(n.small_sq), float(n.big_sq)))
    assert measured[0] == measured[1]
