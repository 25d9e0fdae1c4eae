"""The step bench: the trainer window reports the loader thread's own share of the time
apart from the step's wait; `--max-mem-gb`: a B fits when its reserved memory plus what the
device holds outside torch's allocator leaves the safety margin free, and a probe that
times out or fails stops the search and is reported as what it was, not as "does not fit".
(The probes' subprocesses are replaced by a model of a GPU here.)"""

from __future__ import annotations

import argparse

import pytest

from atom_train.bench import command as bench
from atom_train.bench.step import measure_step
from atom_train.common.measure import SAFETY_MARGIN

CONTEXT_MB = 600.0  # CUDA context, cuBLAS workspace, Triton's kernels: outside the allocator


def gpu_probe(timeout_from: int | None = None, crash_at: int | None = None):
    """A fake `run_in_subprocess`: the step at B allocates B MiB and reserves 1.25 B MiB."""

    def probe(config, timeout):
        b = config["B"]
        if timeout_from is not None and b >= timeout_from:
            return {**config, "error": f"timed out after {timeout:.0f} s"}
        if b == crash_at:
            return {**config, "error": "Segmentation fault"}
        if 1.25 * b + CONTEXT_MB > 40 * 1024:  # the device itself has 40 GiB
            return {**config, "error": "torch.OutOfMemoryError: CUDA out of memory."}
        return {
            **config,
            "peak_device_mb": float(b),
            "peak_device_reserved_mb": 1.25 * b,
            "device_outside_allocator_mb": CONTEXT_MB,
            "peak_rss_mb": 3000.0,
        }

    return probe


def args(gb: float) -> argparse.Namespace:
    return argparse.Namespace(
        max_mem_gb=gb, B=[1024], seconds=1.0, n_modes=32, device="cuda",
        recurrence="auto", transport="auto", threads=[1],
    )  # fmt: skip


def test_the_largest_b_counts_reserved_memory_the_context_and_the_margin(monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_in_subprocess", gpu_probe())
    m = bench.max_batch(args(16), 64, timeout=10)
    usable = 16 * 1024 * (1 - SAFETY_MARGIN)
    assert m["usable_mb"] == pytest.approx(usable) and m["stopped_by"] is None
    b = m["largest_B"]
    # Fits with what it reserved and the context, within the margin (the allocated peak
    # alone, b MiB, would have claimed a B about 25% larger), bisected to within 10%.
    assert 1.25 * b + CONTEXT_MB <= usable < 1.25 * (b * 1.1) + CONTEXT_MB
    assert all(p["outcome"] in ("fits", "too big") for p in m["probes"])
    assert "does not fit" in capsys.readouterr().out


def test_out_of_memory_is_too_big_but_a_timeout_stops_the_search_as_a_timeout(monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_in_subprocess", gpu_probe(timeout_from=4096))
    m = bench.max_batch(args(80), 64, timeout=10)
    assert m["largest_B"] < 4096 and m["stopped_by"][0].startswith("timeout at B=4096")
    outcomes = {p["B"]: p["outcome"] for p in m["probes"]}
    assert outcomes[2048] == "fits" and outcomes[4096] == "timeout"
    out = capsys.readouterr().out
    assert "B=4096: timeout" in out and "B=4096: does not fit" not in out

    monkeypatch.setattr(bench, "run_in_subprocess", gpu_probe(crash_at=2048))
    m = bench.max_batch(args(80), 64, timeout=10)
    assert m["stopped_by"][0].startswith("error at B=2048: Segmentation fault")

    # Past the device's own memory the step runs out of memory: that is "too big".
    r = gpu_probe()({"B": 40_000}, 10)
    assert bench.probe_outcome(r, 1e9) == "too big"


def test_the_trainer_window_reports_the_loaders_own_share_apart_from_the_wait():
    r = measure_step(
        {"mode": "trainer", "B": 8, "K": 16, "seconds": 0.3, "corpus_mb": 1, "intervals": 1}
    )
    assert 0 < r["loader_share"] < 1 and 0 <= r["step_wait_share"] < 1
    assert "loader_wait_share" not in r  # the old figure, GPU time on CUDA, is gone


def test_the_json_holds_every_finished_configuration_whatever_cuts_the_bench(monkeypatch, tmp_path):
    """The JSON is rewritten after every configuration, so a bench killed in its third
    configuration leaves the first two; --timeout is each configuration's bound."""
    import json

    timeouts = []

    def probe(config, timeout):
        timeouts.append(timeout)
        if len(timeouts) == 3:
            raise KeyboardInterrupt  # the bench is cut here
        return {**config, "bytes_per_s": 1e6, "peak_rss_mb": 100.0}

    monkeypatch.setattr(bench, "run_in_subprocess", probe)
    out, png = tmp_path / "b" / "bench.json", tmp_path / "b" / "bench.png"
    argv = ["step", "-B", "8,16", "--threads", "1", "--seconds", "1", "--timeout", "40"]
    with pytest.raises(KeyboardInterrupt):
        bench.main([*argv, "--out", str(out), "--plot", str(png)])
    rows = json.loads(out.read_text())["results"]
    assert [(r["mode"], r["B"]) for r in rows] == [("isolated", 8), ("trainer", 8)]
    assert timeouts == [40, 40, 40]
    # A bound shorter than the measurement itself: one line, exit 2.
    assert bench.main([*argv[:-2], "--timeout", "1", "--out", str(out)]) == 2


def test_the_log_benchmark_writes_both_formats_and_times_a_reader(tmp_path, monkeypatch):
    """`bench logs`: format 1 has a line per step, format 2 (the trainer's writer at 2
    lines/s) a line per half-second slot; both hold the same events, which the planner's
    reader finds in a fresh process with its time and memory."""
    from atom_train.bench import logs
    from atom_train.trainer.loss_log import iter_step_lines, read_events

    steps, per_s = 30_000, 300.0  # 100 s of a run
    one, two = tmp_path / "1", tmp_path / "2"
    one.mkdir(), two.mkdir()
    logs.write_format_1(one, steps, per_s, 1024, 64)
    w = logs.write_format_2(two, steps, per_s, 1024, 64, rate=2.0, ckpt_every_s=30.0)
    assert w["write_us_per_step"] > 0
    lines1, lines2 = (
        list(iter_step_lines(one / "loss.jsonl")),
        list(iter_step_lines(two / "loss.jsonl")),
    )
    assert len(lines1) == steps and lines1[-1]["train_bpb"] > 0  # (read as the new names)
    assert 200 <= len(lines2) <= 200 + 4  # 2 a second, and the slots 3 checkpoints closed
    assert sum(x.get("count", 1) for x in lines2) == steps
    assert read_events(one) == read_events(two) == [{"event": "start", "tick": 0, "B": 1024}]
    logs._progress(two, steps, per_s, 64, 1024, 10.0, logs.PROGRESS_COLUMNS)
    got = logs.run_reader("events (the planner)", two, tmp_path / "s", None, 8.0, 300)
    assert got["found"] == 1 and got["peak_rss_mb"] >= got["base_rss_mb"] > 0, got
    # Another checkout's readers run in that checkout: a folder given relative to here is
    # still found (it found nothing, in no time, when the path was passed as given).
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    repo = str(Path(logs.__file__).resolve().parents[2])
    got = logs.run_reader("plot (read_run)", Path("2"), Path("s"), repo, 8.0, 300)
    assert "error" not in got and got["found"] > 1, got


def test_the_figure_has_a_tick_at_every_b_measured_and_says_1_thread(tmp_path):
    """bench.png as drawn, from three measured B of each kind: a tick at each (the log axis
    alone would label 10 and 100 only), "1 thread" / "2 threads", legends on no line."""
    from helpers.figure_reading import legend_on_a_line, tick_labels

    results = []
    for B, rate in ((24, 2e5), (96, 6e5), (384, 1.5e6)):
        results.append({"kind": "step", "mode": "trainer", "B": B, "threads": 1,
                        "bytes_per_s": rate})  # fmt: skip
        results.append({"kind": "loader", "impl": "rust", "B": B, "threads": 2,
                        "bytes_per_s": 30 * rate})  # fmt: skip
    fig = bench.figure(results)
    loader, step = fig.axes
    for ax in (loader, step):
        assert tick_labels(ax, "x") == [(24, "24"), (96, "96"), (384, "384")]
        assert legend_on_a_line(ax) == []
    assert [t.get_text() for t in loader.get_legend().get_texts()] == ["Rust dense, 2 threads"]
    assert "trainer, 1 thread" in [t.get_text() for t in step.get_legend().get_texts()]
    png = tmp_path / "bench.png"
    bench.plot(results, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("failure", [None, "at 4 streams (checked at 4): dU is 1.0e-04 off"])
def test_the_trainer_mode_chooses_the_backend_and_self_checks_as_the_trainer(
    corpus, tmp_path, monkeypatch, failure
):
    """`bench step`'s own set-up (`_setup`: the isolated mode, --split, --count-ops; the
    trainer mode trains on the trainer's plan itself, the last test here) makes the trainer's
    backend choice for the run's model and B (`model.backend.choose_backend`): an `auto` that
    chose Triton (as on CUDA) is proven first by the same self-check (the same launches: B
    and the noise probe's half batch), and kept or passed over alike. (The check itself is
    recorded, not run: its own tests are in tests/trainer/test_auto_fallback.py.)"""
    from helpers.trainer_kit import args

    from atom_train.bench import step as bench_step
    from atom_train.model import backend, loop_check
    from atom_train.trainer.plan import resolve_command

    resolve = backend.resolve_recurrence

    def on_cuda(name, device, config=None, warn=None):
        return "triton" if name == "auto" else resolve(name, device, config, warn)

    checks = []

    def check(device, c, B, **kw):
        checks.append((device, c, B, kw))
        return loop_check.LoopCheck(failure, 1e-7, 2e-7, 1.5, 0.1, B, 8, (B, *kw["also"]))

    monkeypatch.setattr(backend, "resolve_recurrence", on_cuda)
    monkeypatch.setattr(loop_check, "check_triton_loop", check)
    argv = args(corpus, tmp_path / "run", 32, "--noise-scale-every", "4")
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    cfg = {
        **bench_step.DEFAULTS,
        "mode": "trainer",
        "B": plan.B,
        "K": 16,
        "model_config": plan.config.to_dict(),
        "noise_scale_every": 4,
    }
    su = bench_step._setup(cfg)
    assert len(checks) == 2 and checks[0] == checks[1]  # the trainer's check, then bench's
    assert checks[0][2:] == (4, {**checks[0][3], "also": (2,)})
    assert su.backend == plan.backend
    assert su.recurrence == ("triton" if failure is None else "fused")
    assert su.step.runtime.recurrence == su.recurrence
    why = "auto: Triton, proven" if failure is None else "auto: the Triton loop's self-check failed"
    assert su.backend.recurrence_reason.startswith(why)


def test_the_trainer_mode_is_the_trainers_plan_its_backend_choice_and_self_check(
    corpus, tmp_path, monkeypatch
):
    """`bench step`'s trainer mode trains by the trainer's loop on the trainer's plan of its
    configuration (`trainer.loop.scratch_plan`): the plan calls `choose_backend` with the
    same arguments as the trainer's for the equivalent command line, runs the same Triton
    self-check (an `auto` that picked Triton, as on CUDA; it fails here, so both fall back to
    the fused loop, which a CPU runs) and bench reports that choice and its reason."""
    from helpers.trainer_kit import args

    from atom_train.model import backend, loop_check
    from atom_train.trainer import plan as planner

    resolve = backend.resolve_recurrence

    def on_cuda(name, device, config=None, warn=None):
        return "triton" if name == "auto" else resolve(name, device, config, warn)

    checks, choices = [], []

    def check(device, c, B, **kw):
        checks.append((device, c, B, kw))
        failure = "at 4 streams (checked at 4): dU is 1.0e-04 off"
        return loop_check.LoopCheck(failure, 1e-7, 2e-7, 1.5, 0.1, B, 8, (B, *kw["also"]))

    choose = planner.choose_backend

    def spy(*a, **kw):
        choices.append((a, {k: v for k, v in kw.items() if k != "warn"}))
        return choose(*a, **kw)

    monkeypatch.setattr(backend, "resolve_recurrence", on_cuda)
    monkeypatch.setattr(loop_check, "check_triton_loop", check)
    monkeypatch.setattr(planner, "choose_backend", spy)
    argv = args(corpus, tmp_path / "run", 32, "--noise-scale-every", "4")
    plan = planner.resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    r = measure_step(
        {
            "mode": "trainer", "B": plan.B, "K": 16, "model_config": plan.config.to_dict(),
            "noise_scale_every": 4, "threads": 1, "loader_threads": 1,
            "data": [str(corpus / "train-*.txt")], "seconds": 0.2, "intervals": 1,
        }
    )  # fmt: skip
    assert len(choices) == 2 and choices[0] == choices[1]  # the trainer's, then bench's
    assert choices[0][1]["B"] == 4 and choices[0][1]["also"] == (2,)
    assert len(checks) == 2 and checks[0] == checks[1]
    assert (r["recurrence"], r["recurrence_reason"], r["transport"]) == (
        plan.recurrence, plan.recurrence_reason, plan.transport,
    )  # fmt: skip
    assert r["recurrence"] == "fused"
    assert r["recurrence_reason"].startswith("auto: the Triton loop's self-check failed")
    assert r["noise_windows"] >= 2 and r["bytes_per_s"] > 0  # (its warm-up windows measure)
