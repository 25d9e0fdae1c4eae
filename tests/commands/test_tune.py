"""`python -m atom_train.tune lr`: the sweep's rates are geometric and reach both bounds, a
divergence stops it, each rule reads the right point off a known curve, a run is the
trainer's own run (the same val to the last bit), bad flags are one line, and the JSON and
PNG are written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.trainer_kit import TINY
from helpers.trainer_kit import run as train_run

from atom_train import tune
from atom_train.trainer import noise_scale

# The trainer tests' tiny model (B 4, K 16, episodes of 64 ticks), without the trainer's
# log and val periods and its loss.jsonl rate (no meaning here).
_DROP = {"--log-every", "--val-every", "--loss-log-rate"}
TUNE_TINY = [x for i, x in enumerate(TINY) if x not in _DROP and TINY[i - 1] not in _DROP]
VAL = ["--val-bytes", "512", "--val-streams", "4"]


def _tune(capsys, corpus: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    argv = ["lr", "--data", str(corpus / "train-*.txt"), *TUNE_TINY, "--out", str(out), *extra]
    code = tune.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- the pure parts ----------------------------------------------------------------------------


def test_sweep_rates_are_geometric_from_min_to_max_exactly():
    lrs = tune.sweep_lrs(1e-4, 1.0, 41)
    assert lrs[0] == 1e-4 and lrs[-1] == 1.0 and len(lrs) == 41
    ratios = np.array(lrs[1:]) / np.array(lrs[:-1])
    assert np.allclose(ratios, 10 ** (4 / 40), rtol=1e-12)
    with pytest.raises(ValueError):
        tune.sweep_lrs(1e-4, 1.0, 1)


def test_divergence_rule():
    assert not tune.diverged([], 1.5)
    assert tune.diverged([3.0, math.nan], 1.5)  # not finite: at once
    assert tune.diverged([3.0, math.inf], 1.5)
    rising = [6.0, 5.0, 4.0, 3.0, 2.0, 2.5, 3.1]
    assert tune.diverged(rising, 1.5)  # 3.1 > 1.5 x 2.0
    assert not tune.diverged(rising[:-1], 1.5)
    assert not tune.diverged([2.0, 9.0], 1.5)  # the first steps are never a divergence
    avg = tune.running_average([1.0, 1.0, 1.0], 0.9)
    assert avg == pytest.approx([1.0, 1.0, 1.0])  # bias-corrected: no pull towards 0


def test_centred_average_has_no_lag():
    ramp = [float(i) for i in range(20)]
    assert tune.centred_average(ramp, 5)[2:-2] == pytest.approx(ramp[2:-2])
    assert tune.smoothing_width(100) == 11 and tune.smoothing_width(10) == 3


def _synthetic_curve(noise: float = 0.0):
    """A sweep's loss against x = log10(lr): a fall centred at x = -2.5 (its steepest point),
    a floor, then a rise from x = -1.2: the lowest loss sits just before -1.2."""
    lrs = tune.sweep_lrs(1e-4, 1.0, 101)
    x = np.log10(lrs)
    loss = 3.0 - np.tanh((x + 2.5) / 0.3) + 4.0 * np.clip(x + 1.2, 0, None) ** 2
    loss += noise * np.random.default_rng(0).standard_normal(len(x))
    return lrs, loss


def test_each_rule_picks_its_point_on_a_known_curve():
    lrs, loss = _synthetic_curve()
    best = int(np.argmin(loss))
    steep = tune.suggest(lrs, loss, "steepest")
    assert abs(math.log10(steep.lr) + 2.5) <= 0.04 + 1e-9  # within one step of 10^-2.5
    assert steep.lr == lrs[steep.index]
    third = tune.suggest(lrs, loss, "minimum")  # the default: a third
    assert third.lr == pytest.approx(lrs[best] / 3)
    m10 = tune.suggest(lrs, loss, "minimum", fraction=0.1)  # fastai's classic rule
    assert m10.lr == pytest.approx(lrs[best] / 10)
    assert abs(math.log10(m10.lr) + 2.2) < 0.1  # the floor's end, -1.2, less one decade
    assert abs(math.log10(lrs[m10.index] / m10.lr)) <= 0.02  # the nearest step
    valley = tune.suggest(lrs, loss, "valley")
    assert abs(valley.index - best / 2) <= 2  # fastai: halfway along the fall to the lowest
    with pytest.raises(ValueError):
        tune.suggest(lrs, loss, "median")


def test_the_rules_read_a_noisy_curve_once_smoothed():
    lrs, loss = _synthetic_curve(noise=0.05)
    smoothed = tune.centred_average(loss, tune.smoothing_width(len(loss)))
    steep = tune.suggest(lrs, smoothed, "steepest")
    assert abs(math.log10(steep.lr) + 2.5) < 0.15
    # Not finite after a divergence: those points are left out.
    cut = np.array(smoothed)
    cut[-10:] = np.nan
    assert tune.suggest(lrs, cut, "minimum").index < len(lrs) - 10


def test_steps_after_an_episode_reset_are_left_out_of_the_curve():
    assert tune.settle_ticks(4096) == 128 and tune.settle_ticks(64) == 16
    assert [tune.settling(t, 64, 16) for t in (0, 16, 64, 80, 100)] == [
        True,
        False,
        True,
        False,
        False,
    ]


def test_run_grid_and_rates_on_the_command_line():
    assert tune.run_grid(0.0123) == [0.00308, 0.00615, 0.0123, 0.0246, 0.0492]
    assert tune.parse_lrs("4e-2, 1e-2,2e-2") == [0.01, 0.02, 0.04]
    assert tune.ticks_for_steps(10, 16, 64) == 160
    assert tune.ticks_for_steps(5, 48, 64) == 144  # cut at 48, 64 (a reset), 96, 128, 144


# ---- the command -------------------------------------------------------------------------------


def test_a_sweep_reaches_max_lr_and_writes_its_outputs(corpus, tmp_path, capsys):
    out = tmp_path / "t" / "sweep.json"
    code, stdout, err = _tune(
        capsys, corpus, out, "--steps", "24", "--min-lr", "1e-4", "--max-lr", "1e-2"
    )
    assert code == 0, err
    r = json.loads(out.read_text())
    sw = r["sweep"]
    assert sw["lr"] == tune.sweep_lrs(1e-4, 1e-2, 24)  # every step taken, both bounds hit
    assert sw["lr"][0] == 1e-4 and sw["lr"][-1] == 1e-2
    assert len(sw["loss"]) == 24 and all(math.isfinite(x) for x in sw["loss"])
    assert sw["stopped"].startswith("reached --max-lr")
    # Windows starting within 16 ticks of a reset (ticks 0, 64, ...: every 4th step) are
    # trained on but left out of the curve.
    assert [s is None for s in sw["smoothed"]] == [i % 4 == 0 for i in range(24)]
    chosen = sw["suggestions"][sw["rule"]]
    assert r["recommended_lr"] == chosen["lr"] and 1e-4 <= chosen["lr"] <= 1e-2
    assert chosen["lr"] == pytest.approx(sw["lowest_loss_lr"] / 3)
    assert (r["B"], r["K"], r["steps"], r["ticks"]) == (4, 16, 24, 384)
    png = out.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "recommended for -B 4 --bptt 16: --lr" in stdout
    assert "steepest" in stdout and "valley" in stdout and "minimum" in stdout
    assert sw["rule"] == "minimum" and sw["fraction"] == pytest.approx(1 / 3)


def test_a_divergence_stops_the_sweep(corpus, tmp_path, capsys):
    out = tmp_path / "div.json"
    code, stdout, err = _tune(
        capsys, corpus, out, "--steps", "40", "--min-lr", "1e-2", "--max-lr", "1e4"
    )
    assert code == 0, err
    sw = json.loads(out.read_text())["sweep"]
    assert sw["stopped"].startswith("diverged at step")
    assert 5 < len(sw["lr"]) < 40  # stopped early
    assert sw["lr"] == tune.sweep_lrs(1e-2, 1e4, 40)[: len(sw["lr"])]
    assert "diverged at step" in stdout


def test_a_run_is_the_trainers_run_to_the_last_bit(corpus, tmp_path, capsys):
    """--runs at one rate: the val equals the trainer's own val after the same steps with
    the same flags (cosine, warm-up), exactly."""
    policy = ["--lr-schedule", "cosine", "--warmup-steps", "2", "--seed", "3"]
    val = ["--val", str(corpus / "val.txt"), *VAL]
    out = tmp_path / "runs.json"
    code, stdout, err = _tune(capsys, corpus, out, "--runs", "2e-2", "--steps", "8", *policy, *val)
    assert code == 0, err
    r = json.loads(out.read_text())
    assert r["sweep"] is None and len(r["runs"]) == 1
    assert r["runs"][0]["steps"] == 8 and r["recommended_lr"] == 2e-2
    run_dir = tmp_path / "trainer"
    assert (
        train_run(corpus, run_dir, 8 * 16, "--lr", "2e-2", "--ckpt-every", "0", *policy, *val) == 0
    )
    logged = json.loads((run_dir / "status.json").read_text())["val_bpb"]
    assert r["runs"][0]["val_bpb"] == logged
    assert "best" in stdout


def test_a_rate_the_divergence_guard_fires_on_is_never_recommended(corpus, tmp_path, capsys):
    """--runs 2e-2,10: the guard judges each short run as the trainer would (the same rules
    on each step's loss, train_bpb and gradient norm); at 10 it fires (train_bpb in the
    thousands within two steps: the ceiling rule), so 2e-2 is recommended, whatever 10's val."""
    val = ["--val", str(corpus / "val.txt"), *VAL]
    out = tmp_path / "guard.json"
    code, stdout, err = _tune(capsys, corpus, out, "--runs", "2e-2,10", "--steps", "8", *val)
    assert code == 0, err
    r = json.loads(out.read_text())
    held, fired = r["runs"]
    assert (held["lr"], held["guard"]) == (2e-2, None)
    assert fired["lr"] == 10 and fired["guard"] is not None
    assert r["recommended_lr"] == 2e-2
    assert "the divergence guard fired: not a candidate" in stdout
    assert "lr 10: val" in err and "the divergence guard fired:" in err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--min-lr", "1", "--max-lr", "0.1"], "--min-lr (1) must be below --max-lr"),
        (["--runs", "abc", "--val", "v.txt"], "--runs takes learning rates"),
        (["--runs"], "--runs scores each run on held-out text: pass --val"),
        (["--steps", "2"], "--steps must be at least 3"),
        (["--fraction", "2"], "--fraction must be at most 1"),
        (["--rule", "median"], "invalid choice: 'median'"),
        (["--max-lr", "-1"], "must be a positive number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["-B", "0"], "-B must be >= 1"),
        (["--n-modes", "x"], "invalid int value"),
    ],
)
def test_bad_flags_say_one_line(corpus, tmp_path, capsys, extra, says):
    code, _, err = _tune(capsys, corpus, tmp_path / "x.json", *extra)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("[tune] error: ")
    assert says in lines[-1]
    assert len(lines) == 1 and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_no_data_and_no_command_are_one_line(tmp_path, capsys):
    assert tune.main(["lr", "-B", "4"]) == 2
    assert "no training data" in capsys.readouterr().err
    assert tune.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and "required" in err[-1]
    assert tune.main(["lr", "--data", str(tmp_path / "none-*.txt")]) == 2
    assert "no file matches" in capsys.readouterr().err


# ---- tune batch: the gradient noise scale --------------------------------------------------


def _batch(capsys, *argv: str) -> tuple[int, str, str]:
    code = tune.main(["batch", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_batch_measures_a_stretch_and_writes_its_outputs(corpus, tmp_path, capsys):
    out = tmp_path / "b" / "batch.json"
    data = ["--data", str(corpus / "train-*.txt"), *TUNE_TINY]
    code, stdout, err = _batch(capsys, *data, "--steps", "12", "--out", str(out))
    assert code == 0, err
    r = json.loads(out.read_text())
    ms = r["measurements"]
    # Every window but the first of each episode (64 ticks: 16 settling ticks).
    assert [m["tick"] for m in ms] == [t for t in range(0, 192, 16) if t % 64]
    for m in ms:
        e = noise_scale.estimate(m["grad_sq_small"], m["grad_sq_big"], 2, 4)
        assert (m["grad_sq"], m["trace_cov"]) == pytest.approx((e.grad_sq, e.trace_cov))
    used = ms[len(ms) // 2 :]  # the stretch's second half
    s = r["summary"]
    assert s["measurements"] == len(used) and s["first_step"] == used[0]["step"]
    ratio = sum(m["trace_cov"] for m in used) / sum(m["grad_sq"] for m in used)
    assert s["b_simple"] == pytest.approx(ratio)
    assert s["b_simple_bytes"] == pytest.approx(16 * ratio)
    assert (r["B"], r["K"], r["from"], r["start_step"]) == (4, 16, None, 0)
    assert "b_simple" in stdout and "interval over the measurements" in stdout
    assert "recommended: -B" in stdout
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batch_from_a_checkpoint_is_the_runs_own_continuation(corpus, tmp_path, capsys):
    """--from a run's checkpoint measures exactly what the trainer measures when it goes on
    from there with --noise-scale-every 1: the same windows, the same squared norms."""
    run_dir = tmp_path / "run"
    assert train_run(corpus, run_dir, 64) == 0
    out = tmp_path / "from.json"
    code, stdout, err = _batch(capsys, "--from", str(run_dir), "--steps", "8", "--out", str(out))
    assert code == 0, err
    r = json.loads(out.read_text())
    assert r["start_step"] == 4 and r["lr"] == 2e-3 and "tick 64" in stdout
    got = {m["step"]: (m["grad_sq_small"], m["grad_sq_big"]) for m in r["measurements"]}
    assert train_run(corpus, run_dir, 64 + 8 * 16, "--noise-scale-every", "1") == 0
    logged = {
        s["step"]: (s["grad_sq_small"], s["grad_sq_big"])
        for s in map(json.loads, (run_dir / "loss.jsonl").read_text().splitlines())
        if "grad_sq_small" in s and s["step"] > 4
    }
    assert got == logged and len(got) == 6  # (steps 5 and 9 start an episode)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["-B", "4"], "no training data: pass --data GLOB or --corpus DIR (or --from CKPT"),
        (["--from", "{tmp}/none"], "--from: "),
        (["--data", "{corpus}/train-*.txt", "--steps", "2"], "--steps must be at least 4"),
        (["--data", "{corpus}/train-*.txt", "--every", "0"], "--every must be at least 1"),
        (["--data", "{corpus}/train-*.txt", "-B", "1"], "needs -B 2 or more"),
        (["--data", "{corpus}/train-*.txt", "--lr-schedule", "cosine"], "unrecognized"),
    ],
)
def test_batch_bad_input_is_one_line(corpus, tmp_path, capsys, argv, says):
    argv = [a.format(corpus=corpus, tmp=tmp_path) for a in argv]
    code, _, err = _batch(capsys, *argv, "--out", str(tmp_path / "x.json"))
    assert code == 2
    lines = err.strip().splitlines()
    assert says in lines[-1] and len(lines) <= 2 and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_batch_from_a_run_keeps_its_streams(corpus, tmp_path, capsys):
    assert train_run(corpus, tmp_path / "run", 32) == 0
    code, _, err = _batch(capsys, "--from", str(tmp_path / "run"), "-B", "8")
    assert code == 2 and "holds a run of -B 4" in err


def test_the_lr_figure_names_its_shards_and_the_launch_says_1_thread(tmp_path, capsys, monkeypatch):
    """`tune lr` on 4 shards, as run, its figure read as drawn: the title names 2 of them and
    says there are more, the LR axis (1e-3 to 1e-1) reads plain numbers, no legend covers a
    line; the launch line says "1 thread"."""
    from helpers.figure_reading import legend_on_a_line, tick_labels

    from atom_train.common import figures
    from atom_train.data.synthetic import synthetic_text

    for i in range(4):
        (tmp_path / f"train-{i}.txt").write_bytes(synthetic_text(6_000, seed=i))
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: drawn.append(fig))
    sweep = ["--steps", "12", "--min-lr", "1e-3", "--max-lr", "1e-1"]
    code, _, err = _tune(capsys, tmp_path, tmp_path / "lr.json", *sweep)
    assert code == 0, err
    assert ", 1 thread\n" in err and "1 threads" not in err
    (fig,) = drawn
    shards = sorted(str(p) for p in tmp_path.glob("train-*.txt"))
    assert fig._suptitle.get_text().endswith(f"{shards[0]}, {shards[1]}, ... (4 in all)")
    (ax,) = fig.axes
    assert [t for _, t in tick_labels(ax, "x")] == ["0.001", "0.01", "0.1"]
    assert legend_on_a_line(ax) == []


def test_the_noise_figure_reads_plain_numbers_and_its_legend_covers_no_line():
    """`tune batch`'s figure from measurements between 2 and 60 streams at -B 64 (the -B line
    along its top): plain numbers on its log axis (not 2×10^0 ... 6×10^1), the legend on no
    line."""
    from helpers.figure_reading import legend_on_a_line, tick_labels

    found = []
    for i in range(20):
        b = 2 + 3 * i  # each measurement's ratio trace_cov / grad_sq: 2 ... 59
        found.append(tune.Measurement(i + 1, 16 * i, 1e-3, 3.0, 1.0, 2, 1.0, 4, 1.0, b, b))
    used = found[10:]
    summ = noise_scale.summarize([noise_scale.Estimate(m.grad_sq, m.trace_cov) for m in used])
    fig = tune.batch_figure(found, used, summ, 64, "t")
    ax = fig.axes[0]
    labels = [t for _, t in tick_labels(ax, "y")]
    assert labels == ["2", "3", "4", "6", "10", "20", "30", "40", "60"]
    assert legend_on_a_line(ax) == []
