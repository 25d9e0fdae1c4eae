"""The pre-flight's checks (`atom_train.preflight.checks`), each a pure function of
measured numbers: the thresholds, the fixes they name, and the projection of a run."""

from __future__ import annotations

import pytest
from helpers.preflight_shapes import rows, shape

from atom_train.preflight import checks as pc
from atom_train.preflight.checks import FAIL, PASS, WARN

# ---- speed -------------------------------------------------------------------------------


def test_speed_skips_the_first_interval_and_wants_a_steady_spread():
    c = pc.check_speed(rows(10.0, 100, 101, 99, 100))
    assert c.status == PASS and c.data["bytes_per_s"] == 100 and c.data["intervals"] == 4
    assert c.data["interval_s"] == pytest.approx(10.0, rel=0.02)  # 1000 bytes at ~100/s
    assert pc.check_speed(rows(10.0, 100, 150, 70, 100)).status == WARN  # spread 80%
    assert pc.check_speed(rows(10.0, 100, 100)).status == WARN  # too few intervals
    c = pc.check_speed(rows(10.0, 100, 100, 100, 100, wait=20.0))
    assert c.status == WARN and "--loader-threads" in c.fix
    assert pc.check_speed(rows(10.0)).status == FAIL  # nothing past the start
    c = pc.check_speed([], "the trainer exited 2: error: -B must be >= 1")
    assert c.status == FAIL and c.detail.endswith("error: -B must be >= 1")


def test_many_short_rows_are_merged_into_intervals_by_bytes_over_time():
    # 48 rows after the first: 12 intervals of 4 rows; a row of 1000 bytes at 50/s and one at
    # 200/s take 20 s and 5 s: their interval's rate is 2000 bytes / 25 s, not the mean rate.
    c = pc.check_speed(rows(1.0, *([50.0, 200.0] * 24)))
    assert c.data["intervals"] == pc.INTERVALS
    assert c.data["bytes_per_s"] == pytest.approx(2000 / 25)
    assert c.data["interval_s"] == pytest.approx(50.0)


# ---- the corpus ----------------------------------------------------------------------------


def reads(cold: float, warm: float, cached: float = 0.0) -> dict:
    return {"cold_bytes_per_s": cold, "warm_bytes_per_s": warm, "cached_after_drop": cached,
            "method": "m", "sequential_bytes_per_s": 5e8}  # fmt: skip


def test_corpus_cold_reads_slower_than_training_name_resident_when_it_fits():
    ok = pc.check_corpus(reads(1e8, 1e9), 1e6, 10**9, 20 * 2**30, 1.0, False)
    assert ok.status == PASS
    slow = pc.check_corpus(reads(1e6, 1e9), 1e6, 10**9, 20 * 2**30, 1.0, False)
    assert slow.status == WARN and slow.fix.startswith("--resident") and slow.data["fits_in_ram"]
    big = pc.check_corpus(reads(1e6, 1e9), 1e6, 100 * 2**30, 20 * 2**30, 1.0, False)
    assert big.status == WARN and "faster disk" in big.fix and not big.data["fits_in_ram"]
    cpu_bound = pc.check_corpus(reads(1e6, 1.2e6), 1e6, 10**9, 20 * 2**30, 1.0, False)
    assert cpu_bound.status == WARN and "--loader-threads" in cpu_bound.fix
    cached = pc.check_corpus(reads(1e6, 1e9, cached=0.9), 1e6, 10**9, 20 * 2**30, 1.0, False)
    assert cached.status == WARN and "not cold" in cached.detail
    resident = pc.check_corpus({"sequential_bytes_per_s": 5e8}, 1e6, 10**9, 2**34, 1.0, True)
    assert resident.status == PASS and "2.0s" in resident.detail  # 1 GB at 500 MB/s


# ---- memory --------------------------------------------------------------------------------


def test_the_largest_batch_is_the_line_through_the_probes():
    # 1000 MiB fixed + 2 MiB per stream: 9000 usable MiB fit 4000 streams.
    assert pc.largest_batch([(512, 2024.0), (1024, 3048.0)], 9000) == 4000
    assert pc.largest_batch([(4, 828.0), (8, 828.1)], 9000) is None  # no measurable growth
    assert pc.largest_batch([(4, 828.0)], 9000) is None


def test_memory_passes_warns_near_the_edge_and_fails_over_it():
    probes = [{"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1e6},
              {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1.5e6}]  # fmt: skip
    budget = 10_000.0  # usable: 10,000 - 512
    assert pc.check_memory("cpu", 1024, 3048.0, budget, probes).status == PASS
    edge = pc.check_memory("cuda", 1024, 9000.0, budget, probes)
    assert edge.status == WARN and edge.fix.startswith("-B ") and "reserved" in edge.detail
    over = pc.check_memory("cuda", 1024, 12_000.0, budget, probes)
    assert over.status == FAIL and over.fix.startswith("-B 4244")
    slower = [dict(probes[0]), {**probes[1], "bytes_per_s": 0.5e6}]
    c = pc.check_memory("cuda", 512, 2024.0, budget, slower)
    assert c.status == WARN and "-B at or below 512" in c.fix


# ---- the run and its files -----------------------------------------------------------------


def test_the_projection_counts_boundary_work_at_its_measured_cost():
    s = shape(snapshot_every=16_000, sample_every=32_000)
    p = pc.project_run(s, 1e6, 0.5e6, 2e6, val_s=2.0, sample_s=1.0, ckpt_s=0.5)
    assert p["bytes"] == 64_000 * 1024 and p["passes"] == pytest.approx(0.065536)
    # 32 validations (multiples of 2000; 64,000 is one), 2 samples, 32 + 1 checkpoints,
    # 4 snapshots at 16,000 ... 64,000.
    assert (p["validations"], p["samples"], p["checkpoints"], p["snapshots"]) == (32, 2, 33, 4)
    assert p["snapshot_ticks"] == [16_000, 32_000, 64_000]
    boundary = 32 * 2.0 + 2 * 1.0 + (33 + 4) * 0.5
    assert p["eta_s"] == pytest.approx(64_000 * 1024 / 1e6 + boundary)
    assert p["eta_low_s"] < p["eta_s"] < p["eta_high_s"]
    light = pc.project_run(s, 1e6, 1e6, 1e6, val_s=0.1, sample_s=0.1, ckpt_s=0.01)
    assert pc.check_run(light).status == PASS  # 3.8 s of boundary work in 69 s: 5%
    c = pc.check_run(p)  # 85 s of boundary work in 151 s, most of it validations
    assert c.status == WARN and c.fix == "raise --val-every (validations cost the most)"
    # Read more than max_passes times over: a warning in the checklist (and its JSON).
    many = dict(light, passes=403.73)
    c = pc.check_run(many, max_passes=100)
    assert c.status == WARN and "404 passes over the corpus: it will memorise it" in c.detail
    assert c.fix == "use more text or a shorter run"
    assert pc.check_run(many, max_passes=500).status == PASS
    # A resume at tick 48,000 has the rest to do.
    q = pc.project_run(shape(tick=48_000, steps=250), 1e6, 1e6, 1e6, val_s=0, sample_s=0, ckpt_s=0)
    assert q["bytes"] == 16_000 * 1024 and q["checkpoints"] == 9


def test_loss_log_lines_follow_the_rate_not_the_steps():
    day = 86_400.0
    fast = shape(steps=300 * 86_400, loss_log_rate=2.0)  # 300 steps/s for a day
    assert pc.loss_log_lines(fast, day, 10) == (2 * 86_400 + 10, True)
    assert pc.loss_log_lines(shape(steps=100, loss_log_rate=2.0), day, 1) == (100, False)
    assert pc.loss_log_lines(shape(steps=10**8, loss_log_rate=0.0), day, 1) == (10**8, False)


def sizes() -> pc.LineSizes:
    return pc.LineSizes(step_line=110, aggregate_line=300, progress_row=250, sample_line=400,
                        tensorboard_row=900)  # fmt: skip


def test_files_and_the_disk_against_free_space():
    s = shape(snapshot_every=16_000, tensorboard=True)
    p = pc.project_run(s, 1e6, 1e6, 1e6, val_s=0, sample_s=0, ckpt_s=0)
    ckpt = 100 * 2**20
    files = pc.project_files(s, p, ckpt, sizes())
    by = {f["name"].split(" ")[0]: f["bytes"] for f in files}
    # Counted by hand: the rolling pair and a write's temp file, the final checkpoint, and 4
    # snapshots (16,000 ... 64,000); 64,000 ticks at 1e6 bytes/s is a run of 65.536 s, so
    # loss.jsonl is 2 lines a second: ceil(131.072) + 33 (one more per checkpoint: 32 + the
    # final) aggregate lines of 300 B; 320 progress and TensorBoard rows (every 200 ticks).
    assert by == {
        "ckpt-rolling": 3 * ckpt, "ckpt-final": ckpt, "snapshots": 4 * ckpt,
        "loss.jsonl": (132 + 33) * 300, "progress.tsv": 320 * 250, "tb/": 320 * 900,
    }  # fmt: skip
    need = 8 * ckpt + 165 * 300 + 320 * 250 + 320 * 900  # 839,278,300 bytes
    want = int(need * pc.DISK_MARGIN) + pc.DISK_MARGIN_MIN  # the margin asked for beyond it
    ok = pc.check_disk(files, need + want + 1, "/")
    assert ok.status == PASS and ok.data["need_bytes"] == need
    # Near the edges (a snapshot of 100 MiB left out of the need would pass both):
    assert pc.check_disk(files, need + want - 1, "/").status == WARN  # a byte short of margin
    fail = pc.check_disk(files, need - 1, "/")  # a byte short of the run itself
    assert fail.status == FAIL and "snapshots" in fail.fix  # the largest item named
    assert fail.data["margin_bytes"] == -1


def test_a_log_growing_by_steps_is_flagged_with_a_log_every_for_a_row_every_10_s():
    s = shape(total=64 * 300 * 86_400, steps=300 * 86_400, log_every=200)  # a day, K = 64
    p = pc.project_run(s, 300 * 64 * 1024, 1, 1, val_s=0, sample_s=0, ckpt_s=0)
    files = pc.project_files(s, p, 2**20, sizes())
    c = pc.check_logs(files, p["eta_s"], 300 * 64, 64)
    assert c.status == WARN and c.fix == f"--log-every {300 * 64 * 10} (a progress row every ~10 s)"
    slow = shape(log_every=300 * 64 * 10, total=64 * 300 * 86_400, steps=300 * 86_400)
    files = pc.project_files(slow, pc.project_run(slow, 300 * 64 * 1024, 1, 1, val_s=0,
                             sample_s=0, ckpt_s=0), 2**20, sizes())  # fmt: skip
    assert pc.check_logs(files, 86_400, 300 * 64, 64).status == PASS


# ---- resume, checkpoints, validation -------------------------------------------------------


def test_resume_is_exact_on_a_cpu_and_a_difference_on_a_gpu_is_a_warning():
    r = {"resumed": True, "killed_at": 300, "resumed_from": 256, "ckpt_bytes": 2**20,
         "write_s": 0.2, "load_s": 0.1, "overlap": [(272, 2.5, 2.5), (288, 2.4, 2.4)]}  # fmt: skip
    assert pc.check_resume(r, exact=True).status == PASS
    assert pc.check_resume(r, exact=False).status == PASS  # (a GPU: exact too)
    noisy = {**r, "overlap": [(272, 2.5, 2.5000001)]}
    assert pc.check_resume(noisy, exact=True).status == FAIL
    warned = pc.check_resume(noisy, exact=False)
    assert (
        warned.status == WARN
        and warned.value == "diff 1e-07"
        and "not bit for bit" in warned.detail
    )
    reset = {**r, "overlap": [(272, 2.5, 5.5)]}  # the loss started over
    assert pc.check_resume(reset, exact=False).status == FAIL
    assert pc.check_resume({**r, "overlap": []}, exact=True).status == WARN
    assert pc.check_resume({"resumed": False, "error": "x"}, exact=True).status == FAIL


def test_a_checkpoint_cadence_over_a_few_percent_is_flagged_with_one_at_1_percent():
    # A 2 s write every 2,000 ticks at 20,000 ticks/s (0.1 s apart): 95% of the time.
    c = pc.check_checkpoints(2.0, 2000, 20_000.0, 64)
    assert c.status == WARN
    every = int(c.fix.split()[1])
    assert every % 64 == 0 and 2.0 / (every / 20_000 + 2.0) <= 0.0101
    assert pc.check_checkpoints(0.2, 2000, 100.0, 64).status == PASS  # 1% of 20 s
    assert pc.check_checkpoints(0.2, 0, 100.0, 64).status == WARN


def test_validation_cost_over_the_run():
    assert pc.check_validation(2.0, 10, 1000.0, True).status == PASS  # 2%
    assert pc.check_validation(2.0, 100, 1000.0, True).status == WARN  # 20%
    # The fix names the period that brings it to 5%: 2,000 x 20% / 5% = 8,000 (a value a
    # user can type, rounded up to 2 significant digits: 2,345 x 20% / 5% = 9,380 -> 9,400).
    fix = pc.check_validation(2.0, 100, 1000.0, True, val_every=2000).fix
    assert fix == "raise --val-every to 8,000 or more (5.0% of the run), or lower --val-bytes"
    assert "to 9,400 or more" in pc.check_validation(2.0, 100, 1000.0, True, val_every=2345).fix
    assert pc.check_validation(None, 10, 1000.0, True).status == WARN
    assert pc.check_validation(None, 0, 1000.0, False).status == WARN


# ---- the launch ----------------------------------------------------------------------------


def test_a_back_off_that_did_not_wait_fails():
    ok = {"gaps_s": [0.6, 1.1], "asked_s": [0.5, 1.0], "launches": 3, "exit_code": 1}
    assert pc.check_backoff(ok).status == PASS
    assert pc.check_backoff({**ok, "gaps_s": [0.05, 0.04]}).status == FAIL
    assert pc.check_backoff({**ok, "gaps_s": [0.6]}).status == FAIL  # a launch missing
    assert pc.check_backoff({**ok, "exit_code": 0}).status == FAIL
    assert pc.check_backoff({"error": "timed out"}).status == FAIL


def test_on_complete_is_said_or_its_absence_warned():
    assert pc.check_on_complete(None, None, None).status == WARN
    assert pc.check_on_complete("sudo poweroff", True, True).status == PASS
    assert pc.check_on_complete("sudo poweroff", True, False).status == WARN
    assert pc.check_on_complete("powerof", False, None).status == FAIL


def test_the_lock_and_the_signals():
    assert pc.check_lock(True, None, "runs/x").status == PASS
    assert pc.check_lock(True, "1234", "runs/x").status == FAIL
    assert pc.check_lock(False, None, "runs/x").status == FAIL
    good = {"usr1_s": 0.5, "term_s": 3.0, "term_exit": 0, "term_status": "stopped"}
    assert pc.check_signals(good).status == PASS
    assert pc.check_signals({**good, "term_exit": -15}).status == FAIL
    assert pc.check_signals({**good, "term_s": 120.0}).status == WARN
    assert pc.check_signals({**good, "usr1_s": None}).status == WARN


def test_the_screen_has_a_line_per_check_and_the_fixes_of_the_others():
    checks = [
        pc.Check("speed", PASS, "1k bytes/s", "steady"),
        pc.Check("disk", FAIL, "9 GiB of 1 GiB", "too much", "free space"),
    ]
    text = pc.render(checks, ["head"])
    assert text.splitlines() == [
        "head",
        "  PASS  speed  1k bytes/s: steady",
        "  FAIL  disk   9 GiB of 1 GiB: too much",
        "               -> free space",
        "1 fail, 0 warn, 1 pass",
    ]
