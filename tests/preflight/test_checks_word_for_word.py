"""The pre-flight's checks word for word (`atom_train.preflight.checks`): every branch of
every check, and each threshold on both of its sides, as the whole `Check` the checklist
prints and the JSON records (status, number, what was measured, the fix, the figures).
Exact: each check is a pure function of numbers, so its text and figures are too (the floats
are compared exactly: they are computed the same way on every machine)."""

from __future__ import annotations

import pytest
from helpers.preflight_shapes import rows, shape

from atom_train.preflight import checks as pc


def reads(cold: float, warm: float, cached: float = 0.0) -> dict:
    return {"cold_bytes_per_s": cold, "warm_bytes_per_s": warm, "cached_after_drop": cached,
            "method": "m", "sequential_bytes_per_s": 5e8}  # fmt: skip


def _cases():
    gib, mib = 2**30, 2**20
    good_rows = rows(10.0, 100, 101, 99, 100)
    probes = [{"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1e6},
              {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1.5e6}]  # fmt: skip
    flat = [{"B": 4, "memory_mb": 828.0, "bytes_per_s": 1e6},
            {"B": 8, "memory_mb": 828.1, "bytes_per_s": 2e6}]  # fmt: skip
    r = {"resumed": True, "killed_at": 3000, "resumed_from": 2560, "ckpt_bytes": 3 * mib,
         "write_s": 0.25, "load_s": 0.125, "overlap": [(2572, 2.5, 2.5), (2588, 2.4, 2.4)]}  # fmt: skip
    ok = {"gaps_s": [0.6, 1.1], "asked_s": [0.5, 1.0], "launches": 3, "exit_code": 1,
          "run_backoff": "1 s doubling to 60 s"}  # fmt: skip
    sig = {"usr1_s": 0.5, "term_s": 3.0, "term_exit": 0, "term_status": "stopped"}
    files = [
        {"name": "ckpt-rolling (+ .prev)", "bytes": 3 * gib, "how": "3 x 1.0 GiB"},
        {"name": "loss.jsonl", "bytes": 5 * mib, "how": "lines"},
        {"name": "progress.tsv", "bytes": 0, "how": "none"},
        {"name": "snapshots", "bytes": 2 * 2**40, "how": "2 x 1.00 TiB"},
        {"name": "samples.jsonl", "bytes": 3000, "how": "3 x 1000 B"},
    ]
    need = sum(f["bytes"] for f in files)
    want = int(need * pc.DISK_MARGIN) + pc.DISK_MARGIN_MIN

    def logs(name: str, per_day: float) -> list[dict]:
        small = [{"name": n, "bytes": 1000, "how": ""} for n in
                 ("loss.jsonl", "progress.tsv", "samples.jsonl", "tb/ (TensorBoard)")]  # fmt: skip
        return [{"name": "ckpt-final", "bytes": 10 * gib, "how": ""}, *[
            dict(f, bytes=per_day) if f["name"].startswith(name) else f for f in small]]  # fmt: skip

    s = shape(snapshot_every=16_000, sample_every=32_000)
    heavy = pc.project_run(s, 1e6, 0.5e6, 2e6, val_s=2.0, sample_s=1.0, ckpt_s=0.5)
    light = pc.project_run(s, 1e6, 1e6, 1e6, val_s=0.1, sample_s=0.1, ckpt_s=0.01)
    unmeasured = pc.project_run(shape(), 3e9, 2e9, 4e9, val_s=0, sample_s=0, ckpt_s=0)
    ckpts = pc.project_run(shape(ckpt_every=64), 1e6, 1e6, 1e6, val_s=0, sample_s=0, ckpt_s=0.2)
    tenth = dict(unmeasured, eta_s=100.0, boundary_s=10.0)
    return {
        "run: pass": lambda: pc.check_run(light),
        "run: boundary work": lambda: pc.check_run(heavy),
        "run: checkpoints cost the most": lambda: pc.check_run(ckpts),
        "run: boundary work of 10%": lambda: pc.check_run(tenth),
        "run: val cost not measured": lambda: pc.check_run(unmeasured),
        "run: memorises": lambda: pc.check_run(dict(light, passes=403.73), max_passes=100),
        "run: memorises and boundary work": lambda: pc.check_run(
            dict(heavy, passes=101.0), max_passes=100
        ),
        "run: 100 passes of 100": lambda: pc.check_run(dict(light, passes=100.0), max_passes=100),
        "speed: steady": lambda: pc.check_speed(good_rows),
        "speed: three intervals is steady": lambda: pc.check_speed(rows(10.0, 100, 100, 100)),
        "speed: too few": lambda: pc.check_speed(rows(10.0, 1e6, 2e6)),
        "speed: one interval": lambda: pc.check_speed(rows(10.0, 2e9)),
        "speed: not steady": lambda: pc.check_speed(rows(10.0, 100, 150, 70, 100)),
        "speed: a spread of 25% is steady": lambda: pc.check_speed(rows(1.0, 90, 100, 115)),
        "speed: the loader waits": lambda: pc.check_speed(rows(10.0, 100, 100, 100, wait=20.0)),
        "speed: a wait of 5% is fine": lambda: pc.check_speed(rows(10.0, 100, 100, 100, wait=5.0)),
        "speed: nothing": lambda: pc.check_speed(rows(10.0)),
        "speed: nothing, an error": lambda: pc.check_speed([], "the trainer exited 2"),
        "corpus: keeps up": lambda: pc.check_corpus(
            reads(1e8, 1e9), 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: cold reads at 1.5x": lambda: pc.check_corpus(
            reads(1.5e6, 1e9), 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: slow disk, fits": lambda: pc.check_corpus(
            reads(1e6, 1e9), 1e6, 10**9, 20 * gib, 2.5, False
        ),
        "corpus: slow disk, fits at 80%": lambda: pc.check_corpus(
            reads(1e6, 1e9), 1e6, 8 * gib, 10 * gib, 1.25, False
        ),
        "corpus: slow disk, too big": lambda: pc.check_corpus(
            reads(1e6, 1e9), 1e6, 100 * gib, 20 * gib, 1.0, False
        ),
        "corpus: no RAM left": lambda: pc.check_corpus(
            reads(1e6, 1e9), 1e6, 1000, -5.0, 1.0, False
        ),
        "corpus: loader-bound": lambda: pc.check_corpus(
            reads(1e6, 1.2e6), 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: warm at 1.5x": lambda: pc.check_corpus(
            reads(1e8, 1.5e6), 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: stayed cached": lambda: pc.check_corpus(
            reads(1e8, 1e9, cached=0.9), 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: half cached": lambda: pc.check_corpus(
            reads(1e8, 1e9, cached=0.5), 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: no method": lambda: pc.check_corpus(
            {"cold_bytes_per_s": 1e8, "warm_bytes_per_s": 1e9}, 1e6, 10**9, 20 * gib, 1.0, False
        ),
        "corpus: not measured": lambda: pc.check_corpus({}, 1e6, 10**9, 20 * gib, 1.0, False),
        "corpus: warm not measured": lambda: pc.check_corpus(
            {"cold_bytes_per_s": 1e8, "error": "the loader failed"},
            1e6,
            10**9,
            20 * gib,
            1.0,
            False,
        ),
        "corpus: resident": lambda: pc.check_corpus(
            {"sequential_bytes_per_s": 5e8}, 1e6, 10**9, 2**34, 1.0, True
        ),
        "corpus: resident, not read": lambda: pc.check_corpus({}, 1e6, 10**9, 2**34, 1.0, True),
        "memory: pass": lambda: pc.check_memory("cpu", 1024, 3048.0, 10_000.0, probes),
        "memory: at 85%": lambda: pc.check_memory("cpu", 1024, 0.85 * 9488, 10_000.0, probes),
        "memory: edge": lambda: pc.check_memory("cuda", 1024, 9000.0, 10_000.0, probes),
        "memory: edge, flat": lambda: pc.check_memory("cuda", 1000, 9000.0, 10_000.0, flat),
        "memory: full": lambda: pc.check_memory("cpu", 1024, 9488.0, 10_000.0, probes),
        "memory: over": lambda: pc.check_memory("cuda", 1024, 12_000.0, 10_000.0, probes),
        "memory: over, flat": lambda: pc.check_memory("cpu", 1000, 12_000.0, 10_000.0, flat),
        "memory: over, B 1": lambda: pc.check_memory("cpu", 1, 12_000.0, 10_000.0, []),
        "memory: no budget": lambda: pc.check_memory("cpu", 8, 10.0, 100.0, []),
        "memory: slower": lambda: pc.check_memory(
            "cuda", 512, 2024.0, 10_000.0, [probes[0], {**probes[1], "bytes_per_s": 0.5e6}]
        ),
        "memory: as fast": lambda: pc.check_memory(
            "cuda", 512, 2024.0, 10_000.0, [probes[0], {**probes[1], "bytes_per_s": 1e6}]
        ),
        "memory: a smaller B after": lambda: pc.check_memory(
            "cuda", 512, 2024.0, 10_000.0, [probes[1], {**probes[0], "bytes_per_s": 0.5e6}]
        ),
        "memory: a probe unmeasured": lambda: pc.check_memory(
            "cuda",
            512,
            2024.0,
            10_000.0,
            [probes[0], {"B": 1024, "memory_mb": None, "bytes_per_s": 0.5e6}],
        ),
        "memory: a probe without a rate": lambda: pc.check_memory(
            "cuda",
            512,
            2024.0,
            10_000.0,
            [probes[0], {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": None}],
        ),
        "memory: not measured": lambda: pc.check_memory("cuda", 512, None, 10_000.0, probes),
        "disk: pass": lambda: pc.check_disk(files, need + want + 1, "/data"),
        "disk: thin": lambda: pc.check_disk(files, need + want - 1, "/data"),
        "disk: all of it": lambda: pc.check_disk(files, need, "/data"),
        "disk: short": lambda: pc.check_disk(files, need - 1, "/data"),
        "disk: small": lambda: pc.check_disk(files[1:3], 600 * 1024, "/tmp"),
        "logs: pass": lambda: pc.check_logs(logs("loss", 1000), 86_400.0, 1000.0, 64),
        "logs: a GiB a day": lambda: pc.check_logs(logs("loss", gib), 86_400.0, 1000.0, 64),
        "logs: loss.jsonl": lambda: pc.check_logs(logs("loss", 3 * gib), 2 * 86_400.0, 1000.0, 64),
        "logs: progress.tsv": lambda: pc.check_logs(
            logs("progress", 2 * gib), 86_400.0, 1000.0, 64
        ),
        "logs: tb": lambda: pc.check_logs(logs("tb/", 2 * gib), 43_200.0, 1000.0, 64),
        "logs: samples": lambda: pc.check_logs(logs("samples", 2 * gib), 86_400.0, 1000.0, 64),
        "logs: a run of no time": lambda: pc.check_logs(logs("loss", 1), 0.0, 1000.0, 64),
        "resume: exact": lambda: pc.check_resume(r, exact=True),
        "resume: exact on a gpu": lambda: pc.check_resume(r, exact=False),
        "resume: a difference on a cpu": lambda: pc.check_resume(
            {**r, "overlap": [(2572, 2.5, 2.5000001)]}, exact=True
        ),
        "resume: a difference on a gpu": lambda: pc.check_resume(
            {**r, "overlap": [(2572, 2.5, 2.5000001), (2588, -2.4, -2.4)]}, exact=False
        ),
        "resume: at the tolerance": lambda: pc.check_resume(
            {**r, "overlap": [(2572, -1000.0, -1001.0), (2588, 250.0, 250.0)]}, exact=False
        ),
        "resume: over it": lambda: pc.check_resume(
            {**r, "overlap": [(2572, 2.5, 5.5)]}, exact=False
        ),
        "resume: nothing redone": lambda: pc.check_resume({**r, "overlap": []}, exact=True),
        "resume: no overlap key": lambda: pc.check_resume(
            {k: v for k, v in r.items() if k != "overlap"}, exact=True
        ),
        "resume: did not resume": lambda: pc.check_resume(
            {"resumed": False, "error": "the trainer exited 1"}, exact=True
        ),
        "resume: did not resume, no error": lambda: pc.check_resume(
            {"ckpt_bytes": 2 * mib, "write_s": 1.5, "load_s": 0.5}, exact=True
        ),
        "checkpoints: costly": lambda: pc.check_checkpoints(2.0, 2000, 20_000.0, 64),
        "checkpoints: cheap": lambda: pc.check_checkpoints(0.2, 2000, 100.0, 64),
        "checkpoints: 3%": lambda: pc.check_checkpoints(3.0, 9700, 100.0, 64),
        "checkpoints: off": lambda: pc.check_checkpoints(0.2, 0, 100.0, 64),
        "checkpoints: off, slow": lambda: pc.check_checkpoints(0.2, -1, 0.01, 64),
        "checkpoints: no rate": lambda: pc.check_checkpoints(0.5, 64, 0.0, 64),
        "validation: cheap": lambda: pc.check_validation(2.0, 10, 1000.0, True),
        "validation: 10%": lambda: pc.check_validation(2.0, 50, 1000.0, True, val_every=500),
        "validation: costly": lambda: pc.check_validation(2.0, 100, 1000.0, True),
        "validation: costly, its period": lambda: pc.check_validation(
            2.0, 100, 1000.0, True, val_every=2000
        ),
        "validation: costly, 2,345": lambda: pc.check_validation(
            2.0, 100, 1000.0, True, val_every=2345
        ),
        "validation: costly, 7": lambda: pc.check_validation(0.5, 1000, 1000.0, True, val_every=7),
        "validation: costly, 64": lambda: pc.check_validation(1.5, 100, 1000.0, True, val_every=64),
        "validation: costly, 99,999": lambda: pc.check_validation(
            3.0, 100, 1000.0, True, val_every=99_999
        ),
        "validation: no time": lambda: pc.check_validation(2.0, 1, 0.0, True),
        "validation: not run": lambda: pc.check_validation(None, 10, 1000.0, True),
        "validation: off": lambda: pc.check_validation(None, 0, 1000.0, False),
        "supervisor: pass": lambda: pc.check_backoff(ok),
        "supervisor: on time": lambda: pc.check_backoff({**ok, "gaps_s": [0.5, 1.0]}),
        "supervisor: short": lambda: pc.check_backoff({**ok, "gaps_s": [0.6, 0.04]}),
        "supervisor: a launch missing": lambda: pc.check_backoff({**ok, "gaps_s": [0.6]}),
        "supervisor: no launch": lambda: pc.check_backoff({**ok, "gaps_s": []}),
        "supervisor: did not give up": lambda: pc.check_backoff({**ok, "exit_code": 0}),
        "supervisor: error": lambda: pc.check_backoff({"error": "timed out"}),
        "supervisor: nothing known": lambda: pc.check_backoff({}),
        "on-complete: none": lambda: pc.check_on_complete(None, None, None),
        "on-complete: empty": lambda: pc.check_on_complete("", True, True),
        "on-complete: pass": lambda: pc.check_on_complete("sudo poweroff", True, True),
        "on-complete: not known": lambda: pc.check_on_complete("sudo poweroff", None, None),
        "on-complete: password": lambda: pc.check_on_complete("sudo poweroff", True, False),
        "on-complete: no program": lambda: pc.check_on_complete("powerof", False, False),
        "lock: pass": lambda: pc.check_lock(True, None, "runs/x"),
        "lock: held": lambda: pc.check_lock(True, "1234", "runs/x"),
        "lock: held, not tried": lambda: pc.check_lock(None, "1234", "runs/x"),
        "lock: broken": lambda: pc.check_lock(False, None, "runs/x"),
        "lock: not tried": lambda: pc.check_lock(None, None, "runs/x"),
        "signals: pass": lambda: pc.check_signals(sig),
        "signals: a minute": lambda: pc.check_signals({**sig, "term_s": 60.0}),
        "signals: long": lambda: pc.check_signals({**sig, "term_s": 120.0}),
        "signals: exit": lambda: pc.check_signals({**sig, "term_exit": -15}),
        "signals: status": lambda: pc.check_signals({**sig, "term_status": "running"}),
        "signals: no usr1": lambda: pc.check_signals({**sig, "usr1_s": None}),
        "signals: no term": lambda: pc.check_signals({"usr1_s": 0.25}),
        "signals: none": lambda: pc.check_signals({}),
    }


EXPECTED = {
    "run: pass": {
        "name": "run",
        "status": "pass",
        "value": "ETA 1m09s",
        "detail": "1m09s (1m09s to 1m09s): 65.5M bytes = 0.07 passes, 1,000 steps, 32 "
        "validations of 0.10 s, 4 snapshots (ticks 16,000, 32,000, ... 64,000); "
        "boundary work 3.8s",
        "fix": None,
        "data": {
            "eta_s": 69.306,
            "eta_low_s": 69.306,
            "eta_high_s": 69.306,
            "training_s": 65.536,
            "boundary_s": 3.7700000000000005,
            "boundary_parts_s": {
                "validations": 3.2,
                "samples": 0.2,
                "checkpoints": 0.33,
                "snapshots": 0.04,
            },
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 0.065536,
            "validations": 32,
            "val_s_each": 0.1,
            "samples": 2,
            "checkpoints": 33,
            "snapshots": 4,
            "snapshot_ticks": [16000, 32000, 64000],
        },
    },
    "run: boundary work": {
        "name": "run",
        "status": "warn",
        "value": "ETA 2m30s",
        "detail": "2m30s (1m57s to 3m36s): 65.5M bytes = 0.07 passes, 1,000 "
        "steps, 32 validations of 2.00 s, 4 snapshots (ticks 16,000, "
        "32,000, ... 64,000); boundary work 1m24s; boundary work is 56% "
        "of it (validations 1m04s, samples 2.0s, checkpoints 16s, "
        "snapshots 2.0s)",
        "fix": "raise --val-every (validations cost the most)",
        "data": {
            "eta_s": 150.036,
            "eta_low_s": 117.268,
            "eta_high_s": 215.572,
            "training_s": 65.536,
            "boundary_s": 84.5,
            "boundary_parts_s": {
                "validations": 64.0,
                "samples": 2.0,
                "checkpoints": 16.5,
                "snapshots": 2.0,
            },
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 0.065536,
            "validations": 32,
            "val_s_each": 2.0,
            "samples": 2,
            "checkpoints": 33,
            "snapshots": 4,
            "snapshot_ticks": [16000, 32000, 64000],
        },
    },
    "run: checkpoints cost the most": {
        "name": "run",
        "status": "warn",
        "value": "ETA 4m26s",
        "detail": "4m26s (4m26s to 4m26s): 65.5M bytes = 0.07 passes, "
        "1,000 steps, 32 validations (cost not measured); "
        "boundary work 3m20s; boundary work is 75% of it "
        "(checkpoints 3m20s)",
        "fix": "raise --ckpt-every (checkpoints cost the most)",
        "data": {
            "eta_s": 265.736,
            "eta_low_s": 265.736,
            "eta_high_s": 265.736,
            "training_s": 65.536,
            "boundary_s": 200.20000000000002,
            "boundary_parts_s": {
                "validations": 0,
                "samples": 0,
                "checkpoints": 200.20000000000002,
                "snapshots": 0.0,
            },
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 0.065536,
            "validations": 32,
            "val_s_each": 0,
            "samples": 0,
            "checkpoints": 1001,
            "snapshots": 0,
            "snapshot_ticks": [],
        },
    },
    "run: boundary work of 10%": {
        "name": "run",
        "status": "pass",
        "value": "ETA 1m40s",
        "detail": "1m40s (0.0s to 0.0s): 65.5M bytes = 0.07 passes, 1,000 "
        "steps, 32 validations (cost not measured); boundary "
        "work 10s",
        "fix": None,
        "data": {
            "eta_s": 100.0,
            "eta_low_s": 0.016384,
            "eta_high_s": 0.032768,
            "training_s": 0.021845333333333335,
            "boundary_s": 10.0,
            "boundary_parts_s": {"validations": 0, "samples": 0, "checkpoints": 0, "snapshots": 0},
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 0.065536,
            "validations": 32,
            "val_s_each": 0,
            "samples": 0,
            "checkpoints": 33,
            "snapshots": 0,
            "snapshot_ticks": [],
        },
    },
    "run: val cost not measured": {
        "name": "run",
        "status": "pass",
        "value": "ETA 0.0s",
        "detail": "0.0s (0.0s to 0.0s): 65.5M bytes = 0.07 passes, 1,000 "
        "steps, 32 validations (cost not measured); boundary "
        "work 0.0s",
        "fix": None,
        "data": {
            "eta_s": 0.021845333333333335,
            "eta_low_s": 0.016384,
            "eta_high_s": 0.032768,
            "training_s": 0.021845333333333335,
            "boundary_s": 0,
            "boundary_parts_s": {"validations": 0, "samples": 0, "checkpoints": 0, "snapshots": 0},
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 0.065536,
            "validations": 32,
            "val_s_each": 0,
            "samples": 0,
            "checkpoints": 33,
            "snapshots": 0,
            "snapshot_ticks": [],
        },
    },
    "run: memorises": {
        "name": "run",
        "status": "warn",
        "value": "ETA 1m09s",
        "detail": "1m09s (1m09s to 1m09s): 65.5M bytes = 403.73 passes, 1,000 steps, "
        "32 validations of 0.10 s, 4 snapshots (ticks 16,000, 32,000, ... "
        "64,000); boundary work 3.8s; 404 passes over the corpus: it will "
        "memorise it",
        "fix": "use more text or a shorter run",
        "data": {
            "eta_s": 69.306,
            "eta_low_s": 69.306,
            "eta_high_s": 69.306,
            "training_s": 65.536,
            "boundary_s": 3.7700000000000005,
            "boundary_parts_s": {
                "validations": 3.2,
                "samples": 0.2,
                "checkpoints": 0.33,
                "snapshots": 0.04,
            },
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 403.73,
            "validations": 32,
            "val_s_each": 0.1,
            "samples": 2,
            "checkpoints": 33,
            "snapshots": 4,
            "snapshot_ticks": [16000, 32000, 64000],
        },
    },
    "run: memorises and boundary work": {
        "name": "run",
        "status": "warn",
        "value": "ETA 2m30s",
        "detail": "2m30s (1m57s to 3m36s): 65.5M bytes = 101.00 "
        "passes, 1,000 steps, 32 validations of 2.00 s, 4 "
        "snapshots (ticks 16,000, 32,000, ... 64,000); "
        "boundary work 1m24s; 101 passes over the corpus: "
        "it will memorise it; boundary work is 56% of it "
        "(validations 1m04s, samples 2.0s, checkpoints "
        "16s, snapshots 2.0s)",
        "fix": "use more text or a shorter run; raise --val-every (validations cost the most)",
        "data": {
            "eta_s": 150.036,
            "eta_low_s": 117.268,
            "eta_high_s": 215.572,
            "training_s": 65.536,
            "boundary_s": 84.5,
            "boundary_parts_s": {
                "validations": 64.0,
                "samples": 2.0,
                "checkpoints": 16.5,
                "snapshots": 2.0,
            },
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 101.0,
            "validations": 32,
            "val_s_each": 2.0,
            "samples": 2,
            "checkpoints": 33,
            "snapshots": 4,
            "snapshot_ticks": [16000, 32000, 64000],
        },
    },
    "run: 100 passes of 100": {
        "name": "run",
        "status": "pass",
        "value": "ETA 1m09s",
        "detail": "1m09s (1m09s to 1m09s): 65.5M bytes = 100.00 passes, 1,000 "
        "steps, 32 validations of 0.10 s, 4 snapshots (ticks "
        "16,000, 32,000, ... 64,000); boundary work 3.8s",
        "fix": None,
        "data": {
            "eta_s": 69.306,
            "eta_low_s": 69.306,
            "eta_high_s": 69.306,
            "training_s": 65.536,
            "boundary_s": 3.7700000000000005,
            "boundary_parts_s": {
                "validations": 3.2,
                "samples": 0.2,
                "checkpoints": 0.33,
                "snapshots": 0.04,
            },
            "bytes": 65536000,
            "ticks": 64000,
            "steps": 1000,
            "passes": 100.0,
            "validations": 32,
            "val_s_each": 0.1,
            "samples": 2,
            "checkpoints": 33,
            "snapshots": 4,
            "snapshot_ticks": [16000, 32000, 64000],
        },
    },
    "speed: steady": {
        "name": "speed",
        "status": "pass",
        "value": "100 bytes/s",
        "detail": "the trainer's window over 4 intervals of ~10s: 99 bytes/s to 101 "
        "bytes/s (spread 2.0%); the step waited for its window 0.0% of the "
        "time, steady",
        "fix": None,
        "data": {
            "bytes_per_s": 100.0,
            "bytes_per_s_min": 99.0,
            "bytes_per_s_max": 101.0,
            "spread": 0.02,
            "intervals": 4,
            "interval_s": 10.000500050005,
            "loader_wait_pct": 0.0,
        },
    },
    "speed: three intervals is steady": {
        "name": "speed",
        "status": "pass",
        "value": "100 bytes/s",
        "detail": "the trainer's window over 3 intervals of ~10s: "
        "100 bytes/s to 100 bytes/s (spread 0.0%); the "
        "step waited for its window 0.0% of the time, "
        "steady",
        "fix": None,
        "data": {
            "bytes_per_s": 100.0,
            "bytes_per_s_min": 100.0,
            "bytes_per_s_max": 100.0,
            "spread": 0.0,
            "intervals": 3,
            "interval_s": 10.0,
            "loader_wait_pct": 0.0,
        },
    },
    "speed: too few": {
        "name": "speed",
        "status": "warn",
        "value": "1.5M bytes/s",
        "detail": "the trainer's window over 2 intervals of ~0.0s: 1M bytes/s to 2M "
        "bytes/s (spread 67%); the step waited for its window 0.0% of the "
        "time; too few intervals to call it steady",
        "fix": "measure longer: --minutes M",
        "data": {
            "bytes_per_s": 1500000.0,
            "bytes_per_s_min": 1000000.0,
            "bytes_per_s_max": 2000000.0,
            "spread": 0.6666666666666666,
            "intervals": 2,
            "interval_s": 0.00075,
            "loader_wait_pct": 0.0,
        },
    },
    "speed: one interval": {
        "name": "speed",
        "status": "warn",
        "value": "2G bytes/s",
        "detail": "the trainer's window over 1 intervals of ~0.0s: 2G bytes/s to "
        "2G bytes/s (spread 0.0%); the step waited for its window 0.0% "
        "of the time; too few intervals to call it steady",
        "fix": "measure longer: --minutes M",
        "data": {
            "bytes_per_s": 2000000000.0,
            "bytes_per_s_min": 2000000000.0,
            "bytes_per_s_max": 2000000000.0,
            "spread": 0.0,
            "intervals": 1,
            "interval_s": 5e-07,
            "loader_wait_pct": 0.0,
        },
    },
    "speed: not steady": {
        "name": "speed",
        "status": "warn",
        "value": "100 bytes/s",
        "detail": "the trainer's window over 4 intervals of ~10s: 70 bytes/s to "
        "150 bytes/s (spread 80%); the step waited for its window 0.0% "
        "of the time; not steady",
        "fix": "measure longer (--minutes M), on an otherwise idle machine",
        "data": {
            "bytes_per_s": 100.0,
            "bytes_per_s_min": 70.0,
            "bytes_per_s_max": 150.0,
            "spread": 0.8,
            "intervals": 4,
            "interval_s": 10.238095238095239,
            "loader_wait_pct": 0.0,
        },
    },
    "speed: a spread of 25% is steady": {
        "name": "speed",
        "status": "pass",
        "value": "100 bytes/s",
        "detail": "the trainer's window over 3 intervals of ~9.9s: "
        "90 bytes/s to 115 bytes/s (spread 25%); the step "
        "waited for its window 0.0% of the time, steady",
        "fix": None,
        "data": {
            "bytes_per_s": 100.0,
            "bytes_per_s_min": 90.0,
            "bytes_per_s_max": 115.0,
            "spread": 0.25,
            "intervals": 3,
            "interval_s": 9.935587761674718,
            "loader_wait_pct": 0.0,
        },
    },
    "speed: the loader waits": {
        "name": "speed",
        "status": "warn",
        "value": "100 bytes/s",
        "detail": "the trainer's window over 3 intervals of ~10s: 100 "
        "bytes/s to 100 bytes/s (spread 0.0%); the step waited for "
        "its window 20.0% of the time",
        "fix": "the loader holds the step back: more --loader-threads, or --resident",
        "data": {
            "bytes_per_s": 100.0,
            "bytes_per_s_min": 100.0,
            "bytes_per_s_max": 100.0,
            "spread": 0.0,
            "intervals": 3,
            "interval_s": 10.0,
            "loader_wait_pct": 20.0,
        },
    },
    "speed: a wait of 5% is fine": {
        "name": "speed",
        "status": "pass",
        "value": "100 bytes/s",
        "detail": "the trainer's window over 3 intervals of ~10s: 100 "
        "bytes/s to 100 bytes/s (spread 0.0%); the step waited "
        "for its window 5.0% of the time, steady",
        "fix": None,
        "data": {
            "bytes_per_s": 100.0,
            "bytes_per_s_min": 100.0,
            "bytes_per_s_max": 100.0,
            "spread": 0.0,
            "intervals": 3,
            "interval_s": 10.0,
            "loader_wait_pct": 5.0,
        },
    },
    "speed: nothing": {
        "name": "speed",
        "status": "fail",
        "value": "-",
        "detail": "the pre-flight's trainer logged no interval past its first",
        "fix": "give it more time (--minutes), or see the trainer's log in the "
        "scratch folder (--keep-scratch)",
        "data": {},
    },
    "speed: nothing, an error": {
        "name": "speed",
        "status": "fail",
        "value": "-",
        "detail": "the pre-flight's trainer logged no interval past its "
        "first: the trainer exited 2",
        "fix": "give it more time (--minutes), or see the trainer's log in "
        "the scratch folder (--keep-scratch)",
        "data": {},
    },
    "corpus: keeps up": {
        "name": "corpus",
        "status": "pass",
        "value": "cold 100M bytes/s",
        "detail": "the loader at the run's B and K: cold 100M bytes/s (page cache "
        "dropped: m), warm 1G bytes/s, training 1M bytes/s; the corpus "
        "(953.7 MiB) fits in RAM (20.0 GiB left beside training); the "
        "disk keeps up",
        "fix": None,
        "data": {
            "cold_bytes_per_s": 100000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: cold reads at 1.5x": {
        "name": "corpus",
        "status": "pass",
        "value": "cold 1.5M bytes/s",
        "detail": "the loader at the run's B and K: cold 1.5M bytes/s "
        "(page cache dropped: m), warm 1G bytes/s, training 1M "
        "bytes/s; the corpus (953.7 MiB) fits in RAM (20.0 GiB "
        "left beside training); the disk keeps up",
        "fix": None,
        "data": {
            "cold_bytes_per_s": 1500000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: slow disk, fits": {
        "name": "corpus",
        "status": "warn",
        "value": "cold 1M bytes/s",
        "detail": "the loader at the run's B and K: cold 1M bytes/s (page "
        "cache dropped: m), warm 1G bytes/s, training 1M bytes/s; "
        "the corpus (953.7 MiB) fits in RAM (20.0 GiB left beside "
        "training); the disk would hold the step back",
        "fix": "--resident: the corpus fits in RAM (a copy at each launch), "
        "or a first pass at the disk's rate (2.50 passes planned)",
        "data": {
            "cold_bytes_per_s": 1000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: slow disk, fits at 80%": {
        "name": "corpus",
        "status": "warn",
        "value": "cold 1M bytes/s",
        "detail": "the loader at the run's B and K: cold 1M bytes/s "
        "(page cache dropped: m), warm 1G bytes/s, training "
        "1M bytes/s; the corpus (8.0 GiB) fits in RAM (10.0 "
        "GiB left beside training); the disk would hold the "
        "step back",
        "fix": "--resident: the corpus fits in RAM (a copy at each "
        "launch), or a first pass at the disk's rate (1.25 "
        "passes planned)",
        "data": {
            "cold_bytes_per_s": 1000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 8589934592,
            "ram_left_bytes": 10737418240,
            "fits_in_ram": True,
        },
    },
    "corpus: slow disk, too big": {
        "name": "corpus",
        "status": "warn",
        "value": "cold 1M bytes/s",
        "detail": "the loader at the run's B and K: cold 1M bytes/s (page "
        "cache dropped: m), warm 1G bytes/s, training 1M "
        "bytes/s; the corpus (100.0 GiB) does not fit in RAM "
        "(20.0 GiB left beside training); the disk would hold "
        "the step back",
        "fix": "every pass reads at the disk's rate: move the corpus to a faster disk (SSD)",
        "data": {
            "cold_bytes_per_s": 1000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 107374182400,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": False,
        },
    },
    "corpus: no RAM left": {
        "name": "corpus",
        "status": "warn",
        "value": "cold 1M bytes/s",
        "detail": "the loader at the run's B and K: cold 1M bytes/s (page cache "
        "dropped: m), warm 1G bytes/s, training 1M bytes/s; the corpus "
        "(1 KiB) does not fit in RAM (0 KiB left beside training); the "
        "disk would hold the step back",
        "fix": "every pass reads at the disk's rate: move the corpus to a faster disk (SSD)",
        "data": {
            "cold_bytes_per_s": 1000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000,
            "ram_left_bytes": -5.0,
            "fits_in_ram": False,
        },
    },
    "corpus: loader-bound": {
        "name": "corpus",
        "status": "warn",
        "value": "cold 1M bytes/s",
        "detail": "the loader at the run's B and K: cold 1M bytes/s (page cache "
        "dropped: m), warm 1.2M bytes/s, training 1M bytes/s; the "
        "corpus (953.7 MiB) fits in RAM (20.0 GiB left beside "
        "training); even from RAM the loader barely keeps up",
        "fix": "more --loader-threads (or a smaller -B per loader thread)",
        "data": {
            "cold_bytes_per_s": 1000000.0,
            "warm_bytes_per_s": 1200000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: warm at 1.5x": {
        "name": "corpus",
        "status": "pass",
        "value": "cold 100M bytes/s",
        "detail": "the loader at the run's B and K: cold 100M bytes/s (page "
        "cache dropped: m), warm 1.5M bytes/s, training 1M bytes/s; "
        "the corpus (953.7 MiB) fits in RAM (20.0 GiB left beside "
        "training); the disk keeps up",
        "fix": None,
        "data": {
            "cold_bytes_per_s": 100000000.0,
            "warm_bytes_per_s": 1500000.0,
            "cached_after_drop": 0.0,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: stayed cached": {
        "name": "corpus",
        "status": "warn",
        "value": "cold 100M bytes/s",
        "detail": "the loader at the run's B and K: cold 100M bytes/s (page "
        "cache dropped: m), warm 1G bytes/s, training 1M bytes/s; "
        "the corpus (953.7 MiB) fits in RAM (20.0 GiB left beside "
        "training); 90% of its pages stayed cached (mapped or dirty "
        "elsewhere): the cold figure is not cold",
        "fix": "rerun when no other process maps the shards",
        "data": {
            "cold_bytes_per_s": 100000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.9,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: half cached": {
        "name": "corpus",
        "status": "pass",
        "value": "cold 100M bytes/s",
        "detail": "the loader at the run's B and K: cold 100M bytes/s (page "
        "cache dropped: m), warm 1G bytes/s, training 1M bytes/s; the "
        "corpus (953.7 MiB) fits in RAM (20.0 GiB left beside "
        "training); the disk keeps up",
        "fix": None,
        "data": {
            "cold_bytes_per_s": 100000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "cached_after_drop": 0.5,
            "method": "m",
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: no method": {
        "name": "corpus",
        "status": "pass",
        "value": "cold 100M bytes/s",
        "detail": "the loader at the run's B and K: cold 100M bytes/s (page cache "
        "dropped: ?), warm 1G bytes/s, training 1M bytes/s; the corpus "
        "(953.7 MiB) fits in RAM (20.0 GiB left beside training); the "
        "disk keeps up",
        "fix": None,
        "data": {
            "cold_bytes_per_s": 100000000.0,
            "warm_bytes_per_s": 1000000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: not measured": {
        "name": "corpus",
        "status": "warn",
        "value": "-",
        "detail": "the shards' read rate was not measured: no time left",
        "fix": "give the pre-flight more time (--minutes)",
        "data": {"corpus_bytes": 1000000000, "ram_left_bytes": 21474836480, "fits_in_ram": True},
    },
    "corpus: warm not measured": {
        "name": "corpus",
        "status": "warn",
        "value": "-",
        "detail": "the shards' read rate was not measured: the loader failed",
        "fix": "give the pre-flight more time (--minutes)",
        "data": {
            "cold_bytes_per_s": 100000000.0,
            "error": "the loader failed",
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 21474836480,
            "fits_in_ram": True,
        },
    },
    "corpus: resident": {
        "name": "corpus",
        "status": "pass",
        "value": "resident",
        "detail": "--resident: the corpus is copied into RAM at each launch (2.0s "
        "at 500M bytes/s read cold); the corpus (953.7 MiB) fits in RAM "
        "(16.0 GiB left beside training)",
        "fix": None,
        "data": {
            "sequential_bytes_per_s": 500000000.0,
            "corpus_bytes": 1000000000,
            "ram_left_bytes": 17179869184,
            "fits_in_ram": True,
        },
    },
    "corpus: resident, not read": {
        "name": "corpus",
        "status": "pass",
        "value": "resident",
        "detail": "--resident: the corpus is copied into RAM at each "
        "launch (- at 0 bytes/s read cold); the corpus (953.7 "
        "MiB) fits in RAM (16.0 GiB left beside training)",
        "fix": None,
        "data": {"corpus_bytes": 1000000000, "ram_left_bytes": 17179869184, "fits_in_ram": True},
    },
    "memory: pass": {
        "name": "memory",
        "status": "pass",
        "value": "3,048 MiB",
        "detail": "peak RSS 3,048 MiB of 9,488 usable (32%); the largest B that fits: "
        "~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: 3048 MiB, 1.5M "
        "bytes/s)",
        "fix": None,
        "data": {
            "used_mb": 3048.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
            ],
            "memory": "peak RSS",
        },
    },
    "memory: at 85%": {
        "name": "memory",
        "status": "pass",
        "value": "8,065 MiB",
        "detail": "peak RSS 8,065 MiB of 9,488 usable (85%); the largest B that fits: "
        "~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: 3048 MiB, 1.5M "
        "bytes/s)",
        "fix": None,
        "data": {
            "used_mb": 8064.8,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
            ],
            "memory": "peak RSS",
        },
    },
    "memory: edge": {
        "name": "memory",
        "status": "warn",
        "value": "9,000 MiB",
        "detail": "reserved on the GPU 9,000 MiB of 9,488 usable (95%); the largest B "
        "that fits: ~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: 3048 "
        "MiB, 1.5M bytes/s); near the edge: allocator pressure slows a long "
        "run",
        "fix": "-B 3395 (or halve --bptt)",
        "data": {
            "used_mb": 9000.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: edge, flat": {
        "name": "memory",
        "status": "warn",
        "value": "9,000 MiB",
        "detail": "reserved on the GPU 9,000 MiB of 9,488 usable (95%); memory "
        "hardly grows from B to 2B here, so no largest B is estimated "
        "(at B 4: 828 MiB, 1M bytes/s) (at B 8: 828 MiB, 2M bytes/s); "
        "near the edge: allocator pressure slows a long run",
        "fix": "-B 800 (or halve --bptt)",
        "data": {
            "used_mb": 9000.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": None,
            "probes": [
                {"B": 4, "memory_mb": 828.0, "bytes_per_s": 1000000.0},
                {"B": 8, "memory_mb": 828.1, "bytes_per_s": 2000000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: full": {
        "name": "memory",
        "status": "warn",
        "value": "9,488 MiB",
        "detail": "peak RSS 9,488 MiB of 9,488 usable (100%); the largest B that fits: "
        "~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: 3048 MiB, 1.5M "
        "bytes/s); near the edge: allocator pressure slows a long run",
        "fix": "-B 3395 (or halve --bptt)",
        "data": {
            "used_mb": 9488.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
            ],
            "memory": "peak RSS",
        },
    },
    "memory: over": {
        "name": "memory",
        "status": "fail",
        "value": "12,000 MiB",
        "detail": "reserved on the GPU 12,000 MiB of 9,488 usable (126%); the largest B "
        "that fits: ~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: 3048 "
        "MiB, 1.5M bytes/s)",
        "fix": "-B 4244 (or halve --bptt: memory grows with B x K)",
        "data": {
            "used_mb": 12000.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: over, flat": {
        "name": "memory",
        "status": "fail",
        "value": "12,000 MiB",
        "detail": "peak RSS 12,000 MiB of 9,488 usable (126%); memory hardly "
        "grows from B to 2B here, so no largest B is estimated (at B 4: "
        "828 MiB, 1M bytes/s) (at B 8: 828 MiB, 2M bytes/s)",
        "fix": "-B 500 (or halve --bptt: memory grows with B x K)",
        "data": {
            "used_mb": 12000.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": None,
            "probes": [
                {"B": 4, "memory_mb": 828.0, "bytes_per_s": 1000000.0},
                {"B": 8, "memory_mb": 828.1, "bytes_per_s": 2000000.0},
            ],
            "memory": "peak RSS",
        },
    },
    "memory: over, B 1": {
        "name": "memory",
        "status": "fail",
        "value": "12,000 MiB",
        "detail": "peak RSS 12,000 MiB of 9,488 usable (126%); memory hardly grows "
        "from B to 2B here, so no largest B is estimated",
        "fix": "-B 1 (or halve --bptt: memory grows with B x K)",
        "data": {
            "used_mb": 12000.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": None,
            "probes": [],
            "memory": "peak RSS",
        },
    },
    "memory: no budget": {
        "name": "memory",
        "status": "fail",
        "value": "10 MiB",
        "detail": "peak RSS 10 MiB of -412 usable (inf%); memory hardly grows from "
        "B to 2B here, so no largest B is estimated",
        "fix": "-B 4 (or halve --bptt: memory grows with B x K)",
        "data": {
            "used_mb": 10.0,
            "budget_mb": 100.0,
            "usable_mb": -412.0,
            "largest_B": None,
            "probes": [],
            "memory": "peak RSS",
        },
    },
    "memory: slower": {
        "name": "memory",
        "status": "warn",
        "value": "2,024 MiB",
        "detail": "reserved on the GPU 2,024 MiB of 9,488 usable (21%); the largest B "
        "that fits: ~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: "
        "3048 MiB, 500k bytes/s); B 1024 is slower than B 512 here",
        "fix": "keep -B at or below 512 on this machine",
        "data": {
            "used_mb": 2024.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 500000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: as fast": {
        "name": "memory",
        "status": "pass",
        "value": "2,024 MiB",
        "detail": "reserved on the GPU 2,024 MiB of 9,488 usable (21%); the largest "
        "B that fits: ~4,244 (at B 512: 2024 MiB, 1M bytes/s) (at B 1024: "
        "3048 MiB, 1M bytes/s)",
        "fix": None,
        "data": {
            "used_mb": 2024.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1000000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: a smaller B after": {
        "name": "memory",
        "status": "pass",
        "value": "2,024 MiB",
        "detail": "reserved on the GPU 2,024 MiB of 9,488 usable (21%); "
        "the largest B that fits: ~4,244 (at B 1024: 3048 MiB, "
        "1.5M bytes/s) (at B 512: 2024 MiB, 500k bytes/s)",
        "fix": None,
        "data": {
            "used_mb": 2024.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 500000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: a probe unmeasured": {
        "name": "memory",
        "status": "warn",
        "value": "2,024 MiB",
        "detail": "reserved on the GPU 2,024 MiB of 9,488 usable (21%); "
        "memory hardly grows from B to 2B here, so no largest B "
        "is estimated (at B 512: 2024 MiB, 1M bytes/s); B 1024 "
        "is slower than B 512 here",
        "fix": "keep -B at or below 512 on this machine",
        "data": {
            "used_mb": 2024.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": None,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": None, "bytes_per_s": 500000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: a probe without a rate": {
        "name": "memory",
        "status": "pass",
        "value": "2,024 MiB",
        "detail": "reserved on the GPU 2,024 MiB of 9,488 usable "
        "(21%); the largest B that fits: ~4,244 (at B 512: "
        "2024 MiB, 1M bytes/s)",
        "fix": None,
        "data": {
            "used_mb": 2024.0,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": None},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "memory: not measured": {
        "name": "memory",
        "status": "warn",
        "value": "-",
        "detail": "reserved on the GPU was not measured",
        "fix": "see the scratch folder's logs (--keep-scratch)",
        "data": {
            "used_mb": None,
            "budget_mb": 10000.0,
            "usable_mb": 9488.0,
            "largest_B": 4244,
            "probes": [
                {"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1000000.0},
                {"B": 1024, "memory_mb": 3048.0, "bytes_per_s": 1500000.0},
            ],
            "memory": "reserved on the GPU",
        },
    },
    "disk: pass": {
        "name": "disk",
        "status": "pass",
        "value": "2.00 TiB of 2.20 TiB",
        "detail": "the run writes 2.00 TiB (ckpt-rolling 3.0 GiB, loss.jsonl 5.0 MiB, "
        "snapshots 2.00 TiB, samples.jsonl 3 KiB); 2.20 TiB free on /data; "
        "206.1 GiB to spare",
        "fix": None,
        "data": {
            "need_bytes": 2202249726904,
            "free_bytes": 2423548441419,
            "margin_bytes": 221298714515,
            "files": [
                {"name": "ckpt-rolling (+ .prev)", "bytes": 3221225472, "how": "3 x 1.0 GiB"},
                {"name": "loss.jsonl", "bytes": 5242880, "how": "lines"},
                {"name": "progress.tsv", "bytes": 0, "how": "none"},
                {"name": "snapshots", "bytes": 2199023255552, "how": "2 x 1.00 TiB"},
                {"name": "samples.jsonl", "bytes": 3000, "how": "3 x 1000 B"},
            ],
        },
    },
    "disk: thin": {
        "name": "disk",
        "status": "warn",
        "value": "2.00 TiB of 2.20 TiB",
        "detail": "the run writes 2.00 TiB (ckpt-rolling 3.0 GiB, loss.jsonl 5.0 MiB, "
        "snapshots 2.00 TiB, samples.jsonl 3 KiB); 2.20 TiB free on /data; only "
        "206.1 GiB to spare",
        "fix": "free space, or write less: snapshots is the largest (2 x 1.00 TiB)",
        "data": {
            "need_bytes": 2202249726904,
            "free_bytes": 2423548441417,
            "margin_bytes": 221298714513,
            "files": [
                {"name": "ckpt-rolling (+ .prev)", "bytes": 3221225472, "how": "3 x 1.0 GiB"},
                {"name": "loss.jsonl", "bytes": 5242880, "how": "lines"},
                {"name": "progress.tsv", "bytes": 0, "how": "none"},
                {"name": "snapshots", "bytes": 2199023255552, "how": "2 x 1.00 TiB"},
                {"name": "samples.jsonl", "bytes": 3000, "how": "3 x 1000 B"},
            ],
        },
    },
    "disk: all of it": {
        "name": "disk",
        "status": "warn",
        "value": "2.00 TiB of 2.00 TiB",
        "detail": "the run writes 2.00 TiB (ckpt-rolling 3.0 GiB, loss.jsonl 5.0 "
        "MiB, snapshots 2.00 TiB, samples.jsonl 3 KiB); 2.00 TiB free on "
        "/data; only 0 KiB to spare",
        "fix": "free space, or write less: snapshots is the largest (2 x 1.00 TiB)",
        "data": {
            "need_bytes": 2202249726904,
            "free_bytes": 2202249726904,
            "margin_bytes": 0,
            "files": [
                {"name": "ckpt-rolling (+ .prev)", "bytes": 3221225472, "how": "3 x 1.0 GiB"},
                {"name": "loss.jsonl", "bytes": 5242880, "how": "lines"},
                {"name": "progress.tsv", "bytes": 0, "how": "none"},
                {"name": "snapshots", "bytes": 2199023255552, "how": "2 x 1.00 TiB"},
                {"name": "samples.jsonl", "bytes": 3000, "how": "3 x 1000 B"},
            ],
        },
    },
    "disk: short": {
        "name": "disk",
        "status": "fail",
        "value": "2.00 TiB of 2.00 TiB",
        "detail": "the run writes 2.00 TiB (ckpt-rolling 3.0 GiB, loss.jsonl 5.0 MiB, "
        "snapshots 2.00 TiB, samples.jsonl 3 KiB); 2.00 TiB free on /data",
        "fix": "free 206.1 GiB, or write less: snapshots is the largest (2 x 1.00 TiB)",
        "data": {
            "need_bytes": 2202249726904,
            "free_bytes": 2202249726903,
            "margin_bytes": -1,
            "files": [
                {"name": "ckpt-rolling (+ .prev)", "bytes": 3221225472, "how": "3 x 1.0 GiB"},
                {"name": "loss.jsonl", "bytes": 5242880, "how": "lines"},
                {"name": "progress.tsv", "bytes": 0, "how": "none"},
                {"name": "snapshots", "bytes": 2199023255552, "how": "2 x 1.00 TiB"},
                {"name": "samples.jsonl", "bytes": 3000, "how": "3 x 1000 B"},
            ],
        },
    },
    "disk: small": {
        "name": "disk",
        "status": "fail",
        "value": "5.0 MiB of 600 KiB",
        "detail": "the run writes 5.0 MiB (loss.jsonl 5.0 MiB); 600 KiB free on /tmp",
        "fix": "free 1.0 GiB, or write less: loss.jsonl is the largest (lines)",
        "data": {
            "need_bytes": 5242880,
            "free_bytes": 614400,
            "margin_bytes": -4628480,
            "files": [
                {"name": "loss.jsonl", "bytes": 5242880, "how": "lines"},
                {"name": "progress.tsv", "bytes": 0, "how": "none"},
            ],
        },
    },
    "logs: pass": {
        "name": "logs",
        "status": "pass",
        "value": "4 KiB/day",
        "detail": "loss.jsonl 1 KiB/day, progress.tsv 1 KiB/day, samples.jsonl 1 KiB/day, "
        "tb/ 1 KiB/day",
        "fix": None,
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 1000.0,
                "progress.tsv": 1000.0,
                "samples.jsonl": 1000.0,
                "tb/": 1000.0,
            }
        },
    },
    "logs: a GiB a day": {
        "name": "logs",
        "status": "pass",
        "value": "1.0 GiB/day",
        "detail": "loss.jsonl 1.0 GiB/day, progress.tsv 1 KiB/day, samples.jsonl 1 "
        "KiB/day, tb/ 1 KiB/day",
        "fix": None,
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 1073741824.0,
                "progress.tsv": 1000.0,
                "samples.jsonl": 1000.0,
                "tb/": 1000.0,
            }
        },
    },
    "logs: loss.jsonl": {
        "name": "logs",
        "status": "warn",
        "value": "1.5 GiB/day",
        "detail": "loss.jsonl 1.5 GiB/day, progress.tsv 0 KiB/day, samples.jsonl 0 "
        "KiB/day, tb/ 0 KiB/day; loss.jsonl grows by steps, not by time",
        "fix": "--loss-log-rate 2 (at most 2 lines a second)",
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 1610612736.0,
                "progress.tsv": 500.0,
                "samples.jsonl": 500.0,
                "tb/": 500.0,
            }
        },
    },
    "logs: progress.tsv": {
        "name": "logs",
        "status": "warn",
        "value": "2.0 GiB/day",
        "detail": "loss.jsonl 1 KiB/day, progress.tsv 2.0 GiB/day, samples.jsonl "
        "1 KiB/day, tb/ 1 KiB/day; progress.tsv grows by steps, not by "
        "time",
        "fix": "--log-every 10048 (a progress row every ~10 s)",
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 1000.0,
                "progress.tsv": 2147483648.0,
                "samples.jsonl": 1000.0,
                "tb/": 1000.0,
            }
        },
    },
    "logs: tb": {
        "name": "logs",
        "status": "warn",
        "value": "4.0 GiB/day",
        "detail": "loss.jsonl 2 KiB/day, progress.tsv 2 KiB/day, samples.jsonl 2 KiB/day, "
        "tb/ 4.0 GiB/day; tb/ grows by steps, not by time",
        "fix": "--log-every 10048 (a progress row every ~10 s)",
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 2000.0,
                "progress.tsv": 2000.0,
                "samples.jsonl": 2000.0,
                "tb/": 4294967296.0,
            }
        },
    },
    "logs: samples": {
        "name": "logs",
        "status": "warn",
        "value": "2.0 GiB/day",
        "detail": "loss.jsonl 1 KiB/day, progress.tsv 1 KiB/day, samples.jsonl 2.0 "
        "GiB/day, tb/ 1 KiB/day; samples.jsonl grows by steps, not by time",
        "fix": "raise --sample-every",
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 1000.0,
                "progress.tsv": 1000.0,
                "samples.jsonl": 2147483648.0,
                "tb/": 1000.0,
            }
        },
    },
    "logs: a run of no time": {
        "name": "logs",
        "status": "warn",
        "value": "2.73 TiB/day",
        "detail": "loss.jsonl 953.7 MiB/day, progress.tsv 931.3 GiB/day, "
        "samples.jsonl 931.3 GiB/day, tb/ 931.3 GiB/day; "
        "progress.tsv grows by steps, not by time",
        "fix": "--log-every 10048 (a progress row every ~10 s)",
        "data": {
            "bytes_per_day": {
                "loss.jsonl": 999999999.9999999,
                "progress.tsv": 999999999999.9999,
                "samples.jsonl": 999999999999.9999,
                "tb/": 999999999999.9999,
            }
        },
    },
    "resume: exact": {
        "name": "resume",
        "status": "pass",
        "value": "exact",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; killed -9 at "
        "tick 3,000, resumed from tick 2,560: the loss continues (identical "
        "over the 2 steps redone)",
        "fix": None,
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [(2572, 2.5, 2.5), (2588, 2.4, 2.4)],
            "max_loss_diff": 0.0,
        },
    },
    "resume: exact on a gpu": {
        "name": "resume",
        "status": "pass",
        "value": "exact",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; killed "
        "-9 at tick 3,000, resumed from tick 2,560: the loss "
        "continues (identical over the 2 steps redone)",
        "fix": None,
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [(2572, 2.5, 2.5), (2588, 2.4, 2.4)],
            "max_loss_diff": 0.0,
        },
    },
    "resume: a difference on a cpu": {
        "name": "resume",
        "status": "fail",
        "value": "diff 1e-07",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; "
        "killed -9 at tick 3,000, resumed from tick 2,560: "
        "the redone steps' loss differs by 1e-07",
        "fix": "the resume is not exact: report it with the scratch folder (--keep-scratch)",
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [(2572, 2.5, 2.5000001)],
            "max_loss_diff": 9.999999983634211e-08,
        },
    },
    "resume: a difference on a gpu": {
        "name": "resume",
        "status": "warn",
        "value": "diff 1e-07",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; "
        "killed -9 at tick 3,000, resumed from tick 2,560: "
        "the loss continues (within 1e-07 over the 2 steps "
        "redone): not bit for bit, as it is in the tests on "
        "this device",
        "fix": "report it with the scratch folder (--keep-scratch): the resume should be exact",
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [(2572, 2.5, 2.5000001), (2588, -2.4, -2.4)],
            "max_loss_diff": 9.999999983634211e-08,
        },
    },
    "resume: at the tolerance": {
        "name": "resume",
        "status": "warn",
        "value": "diff 1",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; "
        "killed -9 at tick 3,000, resumed from tick 2,560: the "
        "loss continues (within 1 over the 2 steps redone): not "
        "bit for bit, as it is in the tests on this device",
        "fix": "report it with the scratch folder (--keep-scratch): the resume should be exact",
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [(2572, -1000.0, -1001.0), (2588, 250.0, 250.0)],
            "max_loss_diff": 1.0,
        },
    },
    "resume: over it": {
        "name": "resume",
        "status": "fail",
        "value": "diff 3",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; killed -9 at "
        "tick 3,000, resumed from tick 2,560: the redone steps' loss "
        "differs by 3",
        "fix": "the resume is not exact: report it with the scratch folder (--keep-scratch)",
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [(2572, 2.5, 5.5)],
            "max_loss_diff": 3.0,
        },
    },
    "resume: nothing redone": {
        "name": "resume",
        "status": "warn",
        "value": "resumed",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; killed "
        "-9 at tick 3,000, resumed from tick 2,560, but no step was "
        "redone to compare",
        "fix": "give it more time (--minutes)",
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
            "overlap": [],
        },
    },
    "resume: no overlap key": {
        "name": "resume",
        "status": "warn",
        "value": "resumed",
        "detail": "checkpoint 3.0 MiB: write 0.25 s, load 0.12 s cold; killed "
        "-9 at tick 3,000, resumed from tick 2,560, but no step was "
        "redone to compare",
        "fix": "give it more time (--minutes)",
        "data": {
            "resumed": True,
            "killed_at": 3000,
            "resumed_from": 2560,
            "ckpt_bytes": 3145728,
            "write_s": 0.25,
            "load_s": 0.125,
        },
    },
    "resume: did not resume": {
        "name": "resume",
        "status": "fail",
        "value": "-",
        "detail": "checkpoint 0 KiB: write nan s, load nan s cold; the killed "
        "run did not resume: the trainer exited 1",
        "fix": "see the trainer's log in the scratch folder (--keep-scratch)",
        "data": {"resumed": False, "error": "the trainer exited 1"},
    },
    "resume: did not resume, no error": {
        "name": "resume",
        "status": "fail",
        "value": "-",
        "detail": "checkpoint 2.0 MiB: write 1.50 s, load 0.50 s "
        "cold; the killed run did not resume: ?",
        "fix": "see the trainer's log in the scratch folder (--keep-scratch)",
        "data": {"ckpt_bytes": 2097152, "write_s": 1.5, "load_s": 0.5},
    },
    "checkpoints: costly": {
        "name": "checkpoints",
        "status": "warn",
        "value": "95%",
        "detail": "a 2.00 s write every 2,000 ticks (~0.1s): 95% of the time",
        "fix": "--ckpt-every 3960000 (1% of the time)",
        "data": {
            "write_s": 2.0,
            "ckpt_every": 2000,
            "ticks_per_s": 20000.0,
            "interval_s": 0.1,
            "share": 0.9523809523809523,
        },
    },
    "checkpoints: cheap": {
        "name": "checkpoints",
        "status": "pass",
        "value": "1.0%",
        "detail": "a 0.20 s write every 2,000 ticks (~20s): 1.0% of the time",
        "fix": None,
        "data": {
            "write_s": 0.2,
            "ckpt_every": 2000,
            "ticks_per_s": 100.0,
            "interval_s": 20.0,
            "share": 0.009900990099009901,
        },
    },
    "checkpoints: 3%": {
        "name": "checkpoints",
        "status": "pass",
        "value": "3.0%",
        "detail": "a 3.00 s write every 9,700 ticks (~1m37s): 3.0% of the time",
        "fix": None,
        "data": {
            "write_s": 3.0,
            "ckpt_every": 9700,
            "ticks_per_s": 100.0,
            "interval_s": 97.0,
            "share": 0.03,
        },
    },
    "checkpoints: off": {
        "name": "checkpoints",
        "status": "warn",
        "value": "off",
        "detail": "--ckpt-every 0: checkpoints only at the end and on signals; a "
        "crash loses everything since the start",
        "fix": "--ckpt-every 60032 (every ~10 minutes)",
        "data": {"write_s": 0.2, "ckpt_every": 0, "ticks_per_s": 100.0},
    },
    "checkpoints: off, slow": {
        "name": "checkpoints",
        "status": "warn",
        "value": "off",
        "detail": "--ckpt-every 0: checkpoints only at the end and on "
        "signals; a crash loses everything since the start",
        "fix": "--ckpt-every 64 (every ~10 minutes)",
        "data": {"write_s": 0.2, "ckpt_every": -1, "ticks_per_s": 0.01},
    },
    "checkpoints: no rate": {
        "name": "checkpoints",
        "status": "pass",
        "value": "0.0%",
        "detail": "a 0.50 s write every 64 ticks (~740740d17h): 0.0% of the time",
        "fix": None,
        "data": {
            "write_s": 0.5,
            "ckpt_every": 64,
            "ticks_per_s": 0.0,
            "interval_s": 63999999999.99999,
            "share": 7.812499999938965e-12,
        },
    },
    "validation: cheap": {
        "name": "validation",
        "status": "pass",
        "value": "2.00 s",
        "detail": "2.00 s per evaluation x 10 = 2.0% of the run",
        "fix": None,
        "data": {"val_s_each": 2.0, "validations": 10, "share": 0.02},
    },
    "validation: 10%": {
        "name": "validation",
        "status": "pass",
        "value": "2.00 s",
        "detail": "2.00 s per evaluation x 50 = 10% of the run",
        "fix": None,
        "data": {"val_s_each": 2.0, "validations": 50, "share": 0.1},
    },
    "validation: costly": {
        "name": "validation",
        "status": "warn",
        "value": "2.00 s",
        "detail": "2.00 s per evaluation x 100 = 20% of the run",
        "fix": "raise --val-every (or lower --val-bytes)",
        "data": {"val_s_each": 2.0, "validations": 100, "share": 0.2},
    },
    "validation: costly, its period": {
        "name": "validation",
        "status": "warn",
        "value": "2.00 s",
        "detail": "2.00 s per evaluation x 100 = 20% of the run",
        "fix": "raise --val-every to 8,000 or more (5.0% of the run), or lower --val-bytes",
        "data": {"val_s_each": 2.0, "validations": 100, "share": 0.2},
    },
    "validation: costly, 2,345": {
        "name": "validation",
        "status": "warn",
        "value": "2.00 s",
        "detail": "2.00 s per evaluation x 100 = 20% of the run",
        "fix": "raise --val-every to 9,400 or more (5.0% of the run), or lower --val-bytes",
        "data": {"val_s_each": 2.0, "validations": 100, "share": 0.2},
    },
    "validation: costly, 7": {
        "name": "validation",
        "status": "warn",
        "value": "0.50 s",
        "detail": "0.50 s per evaluation x 1,000 = 50% of the run",
        "fix": "raise --val-every to 70 or more (5.0% of the run), or lower --val-bytes",
        "data": {"val_s_each": 0.5, "validations": 1000, "share": 0.5},
    },
    "validation: costly, 64": {
        "name": "validation",
        "status": "warn",
        "value": "1.50 s",
        "detail": "1.50 s per evaluation x 100 = 15% of the run",
        "fix": "raise --val-every to 200 or more (5.0% of the run), or lower --val-bytes",
        "data": {"val_s_each": 1.5, "validations": 100, "share": 0.15},
    },
    "validation: costly, 99,999": {
        "name": "validation",
        "status": "warn",
        "value": "3.00 s",
        "detail": "3.00 s per evaluation x 100 = 30% of the run",
        "fix": "raise --val-every to 600,000 or more (5.0% of the run), or lower --val-bytes",
        "data": {"val_s_each": 3.0, "validations": 100, "share": 0.3},
    },
    "validation: no time": {
        "name": "validation",
        "status": "warn",
        "value": "2.00 s",
        "detail": "2.00 s per evaluation x 1 = 200000000000% of the run",
        "fix": "raise --val-every (or lower --val-bytes)",
        "data": {"val_s_each": 2.0, "validations": 1, "share": 1999999999.9999998},
    },
    "validation: not run": {
        "name": "validation",
        "status": "warn",
        "value": "-",
        "detail": "no validation ran in the pre-flight's time",
        "fix": "give it more time (--minutes)",
        "data": {},
    },
    "validation: off": {
        "name": "validation",
        "status": "warn",
        "value": "off",
        "detail": "no --val: the run reports no held-out bits/byte",
        "fix": "--val GLOB (held-out text), or --corpus DIR with a val",
        "data": {},
    },
    "supervisor: pass": {
        "name": "supervisor",
        "status": "pass",
        "value": "0.60 s, 1.10 s",
        "detail": "the back-off waited 0.60 s, 1.10 s (asked 0.5 s, 1 s; a SIGUSR1 "
        "came during the first wait), gave up after 3 crashes (exit 1); "
        "the run's: 1 s doubling to 60 s",
        "fix": None,
        "data": {
            "gaps_s": [0.6, 1.1],
            "asked_s": [0.5, 1.0],
            "launches": 3,
            "exit_code": 1,
            "run_backoff": "1 s doubling to 60 s",
        },
    },
    "supervisor: on time": {
        "name": "supervisor",
        "status": "pass",
        "value": "0.50 s, 1.00 s",
        "detail": "the back-off waited 0.50 s, 1.00 s (asked 0.5 s, 1 s; a "
        "SIGUSR1 came during the first wait), gave up after 3 crashes "
        "(exit 1); the run's: 1 s doubling to 60 s",
        "fix": None,
        "data": {
            "gaps_s": [0.5, 1.0],
            "asked_s": [0.5, 1.0],
            "launches": 3,
            "exit_code": 1,
            "run_backoff": "1 s doubling to 60 s",
        },
    },
    "supervisor: short": {
        "name": "supervisor",
        "status": "fail",
        "value": "0.60 s, 0.04 s",
        "detail": "the back-off waited 0.60 s, 0.04 s (asked 0.5 s, 1 s; a SIGUSR1 "
        "came during the first wait), gave up after 3 crashes (exit 1); "
        "the run's: 1 s doubling to 60 s; the back-off did not wait",
        "fix": "do not launch under this supervisor: report it with supervisor.log",
        "data": {
            "gaps_s": [0.6, 0.04],
            "asked_s": [0.5, 1.0],
            "launches": 3,
            "exit_code": 1,
            "run_backoff": "1 s doubling to 60 s",
        },
    },
    "supervisor: a launch missing": {
        "name": "supervisor",
        "status": "fail",
        "value": "0.60 s",
        "detail": "the back-off waited 0.60 s (asked 0.5 s, 1 s; a "
        "SIGUSR1 came during the first wait), gave up after 3 "
        "crashes (exit 1); the run's: 1 s doubling to 60 s; "
        "the back-off did not wait",
        "fix": "do not launch under this supervisor: report it with supervisor.log",
        "data": {
            "gaps_s": [0.6],
            "asked_s": [0.5, 1.0],
            "launches": 3,
            "exit_code": 1,
            "run_backoff": "1 s doubling to 60 s",
        },
    },
    "supervisor: no launch": {
        "name": "supervisor",
        "status": "fail",
        "value": "-",
        "detail": "the back-off waited  (asked 0.5 s, 1 s; a SIGUSR1 came "
        "during the first wait), gave up after 3 crashes (exit 1); "
        "the run's: 1 s doubling to 60 s; the back-off did not wait",
        "fix": "do not launch under this supervisor: report it with supervisor.log",
        "data": {
            "gaps_s": [],
            "asked_s": [0.5, 1.0],
            "launches": 3,
            "exit_code": 1,
            "run_backoff": "1 s doubling to 60 s",
        },
    },
    "supervisor: did not give up": {
        "name": "supervisor",
        "status": "fail",
        "value": "0.60 s, 1.10 s",
        "detail": "the back-off waited 0.60 s, 1.10 s (asked 0.5 s, 1 s; "
        "a SIGUSR1 came during the first wait), gave up after "
        "3 crashes (exit 0); the run's: 1 s doubling to 60 s; "
        "it did not give up as it should",
        "fix": "report it with supervisor.log (--keep-scratch)",
        "data": {
            "gaps_s": [0.6, 1.1],
            "asked_s": [0.5, 1.0],
            "launches": 3,
            "exit_code": 0,
            "run_backoff": "1 s doubling to 60 s",
        },
    },
    "supervisor: error": {
        "name": "supervisor",
        "status": "fail",
        "value": "-",
        "detail": "the supervisor could not be measured: timed out",
        "fix": "see the supervisor's log in the scratch folder (--keep-scratch)",
        "data": {"error": "timed out"},
    },
    "supervisor: nothing known": {
        "name": "supervisor",
        "status": "fail",
        "value": "",
        "detail": "the back-off waited  (asked ; a SIGUSR1 came during the "
        "first wait), gave up after None crashes (exit None); "
        "the run's: ?; it did not give up as it should",
        "fix": "report it with supervisor.log (--keep-scratch)",
        "data": {},
    },
    "on-complete: none": {
        "name": "on-complete",
        "status": "warn",
        "value": "none",
        "detail": "nothing runs when training completes: the box idles (and bills) "
        "until someone looks",
        "fix": "launch with scripts/train.sh --on-complete 'sudo poweroff' -- ... "
        "(and pass it here)",
        "data": {"on_complete": None, "program_found": None, "sudo_without_password": None},
    },
    "on-complete: empty": {
        "name": "on-complete",
        "status": "warn",
        "value": "none",
        "detail": "nothing runs when training completes: the box idles (and "
        "bills) until someone looks",
        "fix": "launch with scripts/train.sh --on-complete 'sudo poweroff' -- ... "
        "(and pass it here)",
        "data": {"on_complete": "", "program_found": True, "sudo_without_password": True},
    },
    "on-complete: pass": {
        "name": "on-complete",
        "status": "pass",
        "value": "sudo poweroff",
        "detail": "after training completes (not after a stop) the supervisor runs 'sudo poweroff'",
        "fix": None,
        "data": {
            "on_complete": "sudo poweroff",
            "program_found": True,
            "sudo_without_password": True,
        },
    },
    "on-complete: not known": {
        "name": "on-complete",
        "status": "pass",
        "value": "sudo poweroff",
        "detail": "after training completes (not after a stop) the supervisor runs 'sudo poweroff'",
        "fix": None,
        "data": {
            "on_complete": "sudo poweroff",
            "program_found": None,
            "sudo_without_password": None,
        },
    },
    "on-complete: password": {
        "name": "on-complete",
        "status": "warn",
        "value": "sudo poweroff",
        "detail": "--on-complete 'sudo poweroff': sudo asks for a password, "
        "which a detached run cannot type",
        "fix": "allow it without a password (sudoers: NOPASSWD for that command)",
        "data": {
            "on_complete": "sudo poweroff",
            "program_found": True,
            "sudo_without_password": False,
        },
    },
    "on-complete: no program": {
        "name": "on-complete",
        "status": "fail",
        "value": "powerof",
        "detail": "--on-complete 'powerof': its program is not on PATH",
        "fix": "fix the command (it runs with sh -c)",
        "data": {"on_complete": "powerof", "program_found": False, "sudo_without_password": False},
    },
    "lock: pass": {
        "name": "lock",
        "status": "pass",
        "value": "held",
        "detail": "runs/x is free; a second trainer on a folder in use is refused (flock)",
        "fix": None,
        "data": {"planned_folder_locked_by": None, "second_trainer_refused": True},
    },
    "lock: held": {
        "name": "lock",
        "status": "fail",
        "value": "pid 1234",
        "detail": "a trainer (pid 1234) is using runs/x now",
        "fix": "stop it first (kill -TERM), or choose another --output-dir",
        "data": {"planned_folder_locked_by": "1234", "second_trainer_refused": True},
    },
    "lock: held, not tried": {
        "name": "lock",
        "status": "fail",
        "value": "pid 1234",
        "detail": "a trainer (pid 1234) is using runs/x now",
        "fix": "stop it first (kill -TERM), or choose another --output-dir",
        "data": {"planned_folder_locked_by": "1234", "second_trainer_refused": None},
    },
    "lock: broken": {
        "name": "lock",
        "status": "fail",
        "value": "not held",
        "detail": "a second trainer got the lock of a folder in use: flock does not "
        "work on this filesystem",
        "fix": "put --output-dir on a local filesystem",
        "data": {"planned_folder_locked_by": None, "second_trainer_refused": False},
    },
    "lock: not tried": {
        "name": "lock",
        "status": "warn",
        "value": "-",
        "detail": "the lock was not tried (the trainer did not start in time)",
        "fix": "give it more time (--minutes)",
        "data": {"planned_folder_locked_by": None, "second_trainer_refused": None},
    },
    "signals: pass": {
        "name": "signals",
        "status": "pass",
        "value": "stop 3.0 s",
        "detail": "SIGUSR1: a checkpoint 0.5 s later, training went on; SIGTERM: "
        "checkpoint and exit 0 in 3.0 s (status 'stopped')",
        "fix": None,
        "data": {"usr1_s": 0.5, "term_s": 3.0, "term_exit": 0, "term_status": "stopped"},
    },
    "signals: a minute": {
        "name": "signals",
        "status": "pass",
        "value": "stop 60.0 s",
        "detail": "SIGUSR1: a checkpoint 0.5 s later, training went on; SIGTERM: "
        "checkpoint and exit 0 in 60.0 s (status 'stopped')",
        "fix": None,
        "data": {"usr1_s": 0.5, "term_s": 60.0, "term_exit": 0, "term_status": "stopped"},
    },
    "signals: long": {
        "name": "signals",
        "status": "warn",
        "value": "stop 120 s",
        "detail": "SIGUSR1: a checkpoint 0.5 s later, training went on; SIGTERM: "
        "checkpoint and exit 0 in 120.0 s (status 'stopped'); longer than a "
        "shutdown waits (systemd: 90 s)",
        "fix": "raise the shutdown timeout (TimeoutStopSec), or a smaller -B or --bptt",
        "data": {"usr1_s": 0.5, "term_s": 120.0, "term_exit": 0, "term_status": "stopped"},
    },
    "signals: exit": {
        "name": "signals",
        "status": "fail",
        "value": "exit -15",
        "detail": "SIGUSR1: a checkpoint 0.5 s later, training went on; SIGTERM: "
        "checkpoint and exit -15 in 3.0 s (status 'stopped')",
        "fix": "see the trainer's log in the scratch folder (--keep-scratch)",
        "data": {"usr1_s": 0.5, "term_s": 3.0, "term_exit": -15, "term_status": "stopped"},
    },
    "signals: status": {
        "name": "signals",
        "status": "fail",
        "value": "exit 0",
        "detail": "SIGUSR1: a checkpoint 0.5 s later, training went on; SIGTERM: "
        "checkpoint and exit 0 in 3.0 s (status 'running')",
        "fix": "see the trainer's log in the scratch folder (--keep-scratch)",
        "data": {"usr1_s": 0.5, "term_s": 3.0, "term_exit": 0, "term_status": "running"},
    },
    "signals: no usr1": {
        "name": "signals",
        "status": "warn",
        "value": "-",
        "detail": "SIGTERM: checkpoint and exit 0 in 3.0 s (status 'stopped'); not "
        "all signals were tried in time",
        "fix": "give it more time (--minutes)",
        "data": {"usr1_s": None, "term_s": 3.0, "term_exit": 0, "term_status": "stopped"},
    },
    "signals: no term": {
        "name": "signals",
        "status": "warn",
        "value": "-",
        "detail": "SIGUSR1: a checkpoint 0.2 s later, training went on; not all "
        "signals were tried in time",
        "fix": "give it more time (--minutes)",
        "data": {"usr1_s": 0.25},
    },
    "signals: none": {
        "name": "signals",
        "status": "warn",
        "value": "-",
        "detail": "no signal was sent; not all signals were tried in time",
        "fix": "give it more time (--minutes)",
        "data": {},
    },
}


def test_every_case_has_its_expected_check():
    assert list(_cases()) == list(EXPECTED)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_each_check_word_for_word(case):
    assert _cases()[case]().to_json() == EXPECTED[case]


# ---- what the checks are made of -----------------------------------------------------------


def test_sizes_rates_and_shares_at_their_unit_edges():
    sizes = (2**40, 2**40 - 1, 3 * 2**40, 2**30, 2**30 - 1, 5 * 2**30, 2**20, 2**20 - 1,
             7 * 2**20, 1536, 0)  # fmt: skip
    assert [pc._mib(n) for n in sizes] == [
        "1.00 TiB", "1024.0 GiB", "3.00 TiB", "1.0 GiB", "1024.0 MiB", "5.0 GiB", "1.0 MiB",
        "1024 KiB", "7.0 MiB", "2 KiB", "0 KiB",
    ]  # fmt: skip
    numbers = (1e12, 2.5e12, 999e9, 1e9, 1e6, 1e3, 999, -1500, 0.5)
    assert [pc._sig(x) for x in numbers] == [
        "1T", "2.5T", "999G", "1G", "1M", "1k", "999", "-1.5k", "0.5",
    ]  # fmt: skip
    shares = (0.1, 0.0999, 0.05, 0.5, 1.1, 0.001)
    assert [pc._pct(x) for x in shares] == ["10%", "10.0%", "5.0%", "50%", "110%", "0.1%"]


def test_a_runs_multiples_and_periods_count_whole_multiples_in_what_is_left():
    s = shape(tick=100, total=1000, steps=14)
    # Multiples of 64 in (100, 1000]: 128 ... 960.
    assert [s.multiples(e) for e in (64, 1, 500, 0, -5)] == [14, 900, 2, 0, 0]
    # At each multiple (at most one a step), and once more at the last tick unless it is one.
    assert [s.at_period(e) for e in (64, 1, 500, 0)] == [15, 14, 2, 1]


def test_the_projection_of_a_resume_without_validation_word_for_word():
    s = shape(tick=20_000, steps=700, snapshot_every=15_000, val=False, corpus_bytes=1,
              sample_every=10_000)  # fmt: skip
    # 44,000 ticks x 1,024 streams at 0.5 bytes/s (2e6 at best, 0.25 at worst); 4 samples of
    # 1 s, 22 + 1 checkpoints and 3 snapshots (30,000, 45,000, 60,000) of 0.5 s each.
    assert pc.project_run(s, 0.5, 0.25, 2e6, val_s=2.0, sample_s=1.0, ckpt_s=0.5) == {
        "eta_s": 90_112_017.0,
        "eta_low_s": 39.528,
        "eta_high_s": 180_224_017.0,
        "training_s": 90_112_000.0,
        "boundary_s": 17.0,
        "boundary_parts_s": {
            "validations": 0.0,
            "samples": 4.0,
            "checkpoints": 11.5,
            "snapshots": 1.5,
        },
        "bytes": 45_056_000,
        "ticks": 44_000,
        "steps": 700,
        "passes": 45_056_000.0,  # (a corpus of 1 byte)
        "validations": 0,
        "val_s_each": 2.0,
        "samples": 4,
        "checkpoints": 23,
        "snapshots": 3,
        "snapshot_ticks": [30_000, 45_000, 60_000],
    }


def test_the_files_of_a_run_word_for_word():
    sizes = pc.LineSizes(step_line=110, aggregate_line=300, progress_row=250, sample_line=400,
                         tensorboard_row=900)  # fmt: skip
    s = shape(snapshot_every=16_000, sample_every=32_000, tensorboard=True)
    p = pc.project_run(s, 1e6, 1e6, 1e6, val_s=0, sample_s=0, ckpt_s=0)
    assert pc.project_files(s, p, 100 * 2**20, sizes) == [
        {"name": "ckpt-rolling (+ .prev, + the temp file of a write)", "bytes": 314_572_800,
         "how": "3 x 100.0 MiB"},
        {"name": "ckpt-final", "bytes": 104_857_600, "how": "1 x 100.0 MiB"},
        {"name": "snapshots", "bytes": 419_430_400, "how": "4 x 100.0 MiB"},
        {"name": "loss.jsonl", "bytes": 49_500, "how": "165 aggregate lines x 300 B"},
        {"name": "progress.tsv", "bytes": 80_000, "how": "320 rows x 250 B"},
        {"name": "samples.jsonl", "bytes": 800, "how": "2 x 400 B"},
        {"name": "tb/ (TensorBoard)", "bytes": 288_000, "how": "320 rows x 900 B"},
    ]  # fmt: skip
    # --loss-log-rate 0: a line per step; no samples, no TensorBoard.
    s = shape(loss_log_rate=0.0)
    p = pc.project_run(s, 1e6, 1e6, 1e6, val_s=0, sample_s=0, ckpt_s=0)
    assert pc.project_files(s, p, 3 * 2**30, sizes) == [
        {"name": "ckpt-rolling (+ .prev, + the temp file of a write)", "bytes": 9_663_676_416,
         "how": "3 x 3.0 GiB"},
        {"name": "ckpt-final", "bytes": 3_221_225_472, "how": "1 x 3.0 GiB"},
        {"name": "snapshots", "bytes": 0, "how": "0 x 3.0 GiB"},
        {"name": "loss.jsonl", "bytes": 110_000, "how": "1,000 lines x 110 B"},
        {"name": "progress.tsv", "bytes": 80_000, "how": "320 rows x 250 B"},
    ]  # fmt: skip


def test_loss_log_lines_at_a_rate_of_one_and_at_the_rate_exactly():
    # 200 steps in 100 s at 1 line a second: 100 lines, and one per checkpoint (3).
    assert pc.loss_log_lines(shape(steps=200, loss_log_rate=1.0), 100.0, 3) == (103, True)
    # 200 steps in 100 s at 2 lines a second: every step its own line.
    assert pc.loss_log_lines(shape(steps=200, loss_log_rate=2.0), 100.0, 3) == (200, False)


def test_intervals_count_only_rows_with_a_rate_and_bytes_done():
    got = pc.steady_intervals(
        [
            {"bytes_seen": 0},
            {"bytes_per_s": 0.5, "bytes_seen": 1},  # 1 byte at 0.5 bytes/s: 2 s
            {"bytes_per_s": 0, "bytes_seen": 5},  # no rate
            {"bytes_per_s": None, "bytes_seen": 9},  # no rate
            {"bytes_per_s": 100, "bytes_seen": 9},  # no bytes done
            {"bytes_per_s": 100},  # (no count: 0, less than before)
            {"bytes_per_s": 100},  # (0 bytes done)
            {"bytes_per_s": 200, "bytes_seen": 400},  # 400 bytes at 200/s: 2 s
        ]
    )
    assert got == [(0.5, 2.0), (200.0, 2.0)]
    assert pc.steady_rates(rows(1.0, 50.0, 200.0)) == [50.0, 200.0]


def test_the_largest_batch_at_the_edges_of_growth_and_slope():
    # Growth of exactly 16 MiB is measurable: 84 MiB + 16 per stream fit 57 in 1,000.
    assert pc.largest_batch([(1, 100.0), (2, 116.0)], 1000) == 57
    # Below 2% of the largest (20 MiB of 1,000) is noise, even above 16 MiB.
    assert pc.largest_batch([(1, 982.0), (2, 1000.0)], 5000) is None
    assert pc.largest_batch([(1, 100.0), (2, 200.0), (3, 100.0)], 5000) is None  # no slope
    assert pc.largest_batch([(0, 100.0), (100, 150.0)], 1000) == 1800  # half a MiB a stream
    assert pc.largest_batch([(512, 2024.0), (1024, 3048.0)], 500) == 0  # not even one


def test_a_validation_period_of_one_is_raised_to_a_single_digit():
    fix = pc.check_validation(2.0, 100, 1000.0, True, val_every=1).fix
    assert fix == "raise --val-every to 4 or more (5.0% of the run), or lower --val-bytes"


def test_the_screen_shows_the_fix_of_a_warn_or_fail_only_and_counts_each_status():
    checks = [
        pc.Check("a", pc.FAIL, "1", "one", "fix a"),
        pc.Check("bb", pc.WARN, "2", "two"),  # (no fix)
        pc.Check("c", pc.PASS, "3", "three", "not shown"),
        pc.Check("d", pc.FAIL, "4", "four", "fix d"),
        pc.Check("e", pc.PASS, "5", "five"),
    ]
    assert pc.render(checks, []).splitlines() == [
        "  FAIL  a   1: one",
        "            -> fix a",
        "  WARN  bb  2: two",
        "  PASS  c   3: three",
        "  FAIL  d   4: four",
        "            -> fix d",
        "  PASS  e   5: five",
        "2 fail, 1 warn, 2 pass",
    ]


# ---- each threshold's other side -------------------------------------------------------------


def test_the_loader_wait_is_the_mean_past_the_first_row_and_zero_when_not_logged():
    waits = [50.0, 9.0, 1.0, 2.0]  # (the first row's, the start's, left out)
    logged = [{"bytes_per_s": 100.0, "loader_wait_pct": w, "bytes_seen": 1000 * (i + 1)}
              for i, w in enumerate(waits)]  # fmt: skip
    c = pc.check_speed(logged)
    assert c.status == pc.PASS and c.data["loader_wait_pct"] == 4.0
    assert "the step waited for its window 4.0% of the time, steady" in c.detail
    unlogged = [{"bytes_per_s": 100.0, "bytes_seen": 1000 * (i + 1)} for i in range(4)]
    c = pc.check_speed(unlogged)
    assert c.status == pc.PASS and c.data["loader_wait_pct"] == 0.0
    assert "waited for its window 0.0% of the time" in c.detail


def test_memory_against_a_budget_of_nothing_or_almost_nothing_usable():
    none = pc.check_memory("cpu", 8, 10.0, 512.0, [])  # 512 MiB: all of it the margin
    assert (none.status, none.detail) == (pc.FAIL, "peak RSS 10 MiB of 0 usable (inf%); "
        "memory hardly grows from B to 2B here, so no largest B is estimated")  # fmt: skip
    one = pc.check_memory("cpu", 8, 0.5, 513.0, [])  # 1 MiB usable, half of it used
    assert (one.status, one.detail) == (pc.PASS, "peak RSS 0 MiB of 1 usable (50%); "
        "memory hardly grows from B to 2B here, so no largest B is estimated")  # fmt: skip


def test_a_probe_at_the_same_b_is_not_a_larger_b_that_is_slower():
    probes = [{"B": 512, "memory_mb": 2024.0, "bytes_per_s": 1e6},
              {"B": 512, "memory_mb": 2030.0, "bytes_per_s": 0.5e6}]  # fmt: skip
    c = pc.check_memory("cpu", 512, 2024.0, 10_000.0, probes)
    assert c.status == pc.PASS and c.fix is None


def test_the_disk_at_its_margin_exactly_and_a_file_of_one_byte():
    files = [{"name": "ckpt-final", "bytes": 10 * 2**30, "how": "1 x 10.0 GiB"}]
    # need 10 GiB; the margin asked for: 10% of it and 1 GiB, 2 GiB: exactly what is free.
    c = pc.check_disk(files, 12 * 2**30, "/")
    assert c.status == pc.PASS and c.data["margin_bytes"] == 2 * 2**30
    files = [{"name": "ckpt-final", "bytes": 2**20, "how": "1 x 1.0 MiB"},
             {"name": "samples.jsonl", "bytes": 1, "how": "1 x 1 B"},
             {"name": "snapshots", "bytes": 0, "how": "0 x 1.0 MiB"}]  # fmt: skip
    c = pc.check_disk(files, 100 * 2**30, "/")
    assert c.detail == (
        "the run writes 1.0 MiB (ckpt-final 1.0 MiB, samples.jsonl 0 KiB); 100.0 GiB free on /; "
        "100.0 GiB to spare"
    )  # (a file of one byte is listed; one of none is not)


def test_a_resume_off_by_more_than_a_thousandth_of_the_loss_fails_on_a_gpu():
    r = {"resumed": True, "killed_at": 3000, "resumed_from": 2560, "ckpt_bytes": 3 * 2**20,
         "write_s": 0.25, "load_s": 0.125, "overlap": [(2572, 2.5, 2.6)]}  # fmt: skip
    c = pc.check_resume(r, exact=False)  # 0.1 apart: 4% of the loss
    assert (c.status, c.value) == (pc.FAIL, "diff 0.1")


def test_a_checkpoint_every_tick_is_a_cadence_not_off():
    c = pc.check_checkpoints(0.001, 1, 1000.0, 64)
    assert (c.status, c.value, c.fix) == (pc.WARN, "50%", "--ckpt-every 128 (1% of the time)")
    assert c.detail == "a 0.00 s write every 1 ticks (~0.0s): 50% of the time"


def test_boundary_work_in_a_run_under_a_second_is_its_share_of_it():
    p = pc.project_run(shape(), 3e9, 2e9, 4e9, val_s=0, sample_s=0, ckpt_s=0)
    p = dict(p, eta_s=0.5, boundary_s=0.1, boundary_parts_s={
        "validations": 0.1, "samples": 0.0, "checkpoints": 0.0, "snapshots": 0.0})  # fmt: skip
    c = pc.check_run(p)  # 0.1 s of 0.5 s: 20%
    assert c.status == pc.WARN and c.fix == "raise --val-every (validations cost the most)"
    assert c.detail.endswith("; boundary work is 20% of it (validations 0.1s)")
