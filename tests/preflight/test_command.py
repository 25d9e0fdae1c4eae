"""`python -m atom_train.preflight`: the whole command on a tiny CPU run (every check
measured for real, in a scratch folder it removes), its JSON, and the one-line refusals."""

from __future__ import annotations

import json
import math
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO
from helpers.trainer_kit import TINY

from atom_train.preflight import checks as pc
from atom_train.preflight import command as preflight
from atom_train.trainer.plan import resolve_command

CHECKS = [
    "speed", "corpus", "memory", "disk", "logs", "resume", "checkpoints", "validation",
    "supervisor", "on-complete", "lock", "signals", "run",
]  # fmt: skip


# The planned run validates (at the trainer's default period) and writes loss.jsonl at the
# default rate: TINY's test settings for those are left out.
DROP = {"--val-every", "--loss-log-rate"}


def planned(corpus, out) -> list[str]:
    return [
        "--data", str(corpus / "train-*.txt"), "--val", str(corpus / "val.txt"),
        "--val-bytes", "1024", "--val-streams", "4", "--sample-every", "2048",
        "--total-ticks", "800000", "--snapshot-every", "160000", "--output-dir", str(out),
        *[x for i, x in enumerate(TINY) if x not in DROP and TINY[i - 1] not in DROP],
    ]  # fmt: skip


def test_the_preflight_of_a_tiny_run(corpus, tmp_path):
    out, report = tmp_path / "run", tmp_path / "preflight.json"
    cmd = [
        sys.executable, "-m", "atom_train.preflight", "--minutes", "0.5", "--json", str(report),
        "--on-complete", "true", "--", *planned(corpus, out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    screen = proc.stdout.splitlines()
    assert screen[0].startswith("pre-flight of: python -m atom_train.train --data")
    assert screen[4].startswith("  divergence guard: rewind (at most 3 within ")  # the run's
    names = [line.split()[1] for line in screen if line.startswith(("  PASS", "  WARN", "  FAIL"))]
    assert names == CHECKS
    assert screen[-1].startswith("0 fail")
    r = json.loads(report.read_text())
    assert r["format"] == "atom.preflight" and [c["name"] for c in r["checks"]] == CHECKS
    by = {c["name"]: c for c in r["checks"]}
    # Measured for real: the kill -9 and the resume, exact on a CPU; the supervisor waited.
    resume = {k: v for k, v in by["resume"].items() if k != "data"}
    assert by["resume"]["status"] == "pass" and by["resume"]["value"] == "exact", resume
    assert by["resume"]["data"]["overlap"], "steps were redone and compared"
    assert by["supervisor"]["status"] == "pass"
    assert by["lock"]["status"] == "pass" and by["signals"]["status"] == "pass"
    assert by["on-complete"]["status"] == "pass"
    # The speed and the validation's cost, from the rows the trainer wrote (how many there
    # are depends on this machine's speed; what the checks make of them does not).
    rows = r["measured"]["trainer"]["rows"]
    assert by["speed"]["data"]["intervals"] == min(pc.INTERVALS, len(rows) - 1)
    vals = [x["val_s"] for x in rows if not math.isnan(x["val_bpb"])]
    if vals:  # (a validation is due at 40% of the time the probe expected the launch to take)
        assert by["validation"]["data"]["val_s_each"] == pytest.approx(statistics.fmean(vals))
    else:
        assert by["validation"]["detail"] == "no validation ran in the pre-flight's time"
    assert by["run"]["data"]["steps"] == 800_000 // 16
    # The disk: every file the run writes, to the byte; the 5 snapshots (ticks 160,000 ...
    # 800,000) and the 3 rolling files (the pair and a write's temp file) at the size of the
    # checkpoint the pre-flight wrote.
    ckpt = r["measured"]["checkpoint_io"]["ckpt_bytes"]
    files = {f["name"].split(" ")[0]: f["bytes"] for f in by["disk"]["data"]["files"]}
    assert {"ckpt-rolling", "loss.jsonl", "progress.tsv", "samples.jsonl"} <= set(files)
    assert files["snapshots"] == 5 * ckpt and files["ckpt-rolling"] == 3 * ckpt
    assert by["disk"]["data"]["need_bytes"] == sum(files.values())
    assert by["run"]["data"]["snapshot_ticks"] == [160_000, 320_000, 800_000]
    # 800,000 ticks x 4 streams over 24,000 bytes: 133 passes, in the checklist and its JSON.
    assert by["run"]["status"] == "warn"
    assert by["run"]["fix"].startswith("use more text or a shorter run")
    assert "133 passes over the corpus: it will memorise it" in by["run"]["detail"]
    run_line = next(line for line in screen if line.startswith("  WARN  run"))
    assert "133 passes over the corpus: it will memorise it" in run_line
    # The scratch folder is gone, and the planned folder was never made.
    assert not (tmp_path / "run.preflight").exists() and not out.exists()


def test_the_run_is_projected_from_the_numbers_of_its_plan(corpus, tmp_path):
    """The planned run's shape: every number the projection counts with (a snapshot period
    lost here would drop the snapshots from the disk's need)."""
    argv = [*planned(corpus, tmp_path / "run"), "--ckpt-every", "4000", "--val-every", "8000"]
    plan = resolve_command(argv, warn=lambda m: None)
    size = sum(p.stat().st_size for p in corpus.glob("train-*.txt"))
    assert preflight.shape_of(plan) == pc.RunShape(
        B=4, K=16, tick=0, total=800_000, steps=800_000 // 16, corpus_bytes=size,
        ckpt_every=4000, snapshot_every=160_000, val_every=8000, sample_every=2048,
        log_every=16, val=True, tensorboard=False, loss_log_rate=2.0, resident=False,
    )  # fmt: skip


def _one_line_exit_2(argv: list[str], capsys, expected: str) -> None:
    assert preflight.main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[preflight] error:")]
    assert len(err) == 1 and expected in err[0], err


def test_a_folder_in_use_is_refused_before_anything_is_measured(corpus, tmp_path, capsys):
    """The launch would be refused on the lock, so the pre-flight says so first: one line,
    exit 2, no scratch folder (it used to measure for its whole time, then fail the lock)."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(out / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode())\n"
         "print('locked', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        _one_line_exit_2(
            ["--minutes", "5", "--", *planned(corpus, out)], capsys,
            f"another trainer (pid {holder.pid}) is using {out}: stop it first",
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "run.preflight").exists()


def test_bad_input_is_one_line_and_exit_2(corpus, tmp_path, capsys):
    run = planned(corpus, tmp_path / "run")
    _one_line_exit_2(run, capsys, "missing `--`")
    _one_line_exit_2(["--minutes", "0", "--", *run], capsys, "--minutes must be a positive")
    _one_line_exit_2(["--"], capsys, "no trainer flags")
    _one_line_exit_2(["--", *run, "-B", "0"], capsys, "-B must be >= 1")
    _one_line_exit_2(["--", *run, "--bogus"], capsys, "unrecognized arguments: --bogus")
    _one_line_exit_2(["--json", str(tmp_path / "no" / "x.json"), "--", *run], capsys, "--json")
    (tmp_path / "run.preflight").mkdir()  # someone else's folder by that name
    _one_line_exit_2(["--", *run], capsys, "is not a pre-flight's scratch folder")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_cuda_without_a_gpu_is_refused_with_one_line(corpus, tmp_path, capsys):
    run = planned(corpus, tmp_path / "run")
    _one_line_exit_2(["--", *run, "--device", "cuda"], capsys, "--device cuda but torch sees no")
    assert not (tmp_path / "run.preflight").exists()


def test_sigterm_stops_it_leaving_no_trainer_and_no_scratch_folder(corpus, tmp_path):
    out = tmp_path / "run"
    scratch = tmp_path / "run.preflight"
    cmd = [
        sys.executable,
        "-m",
        "atom_train.preflight",
        "--minutes",
        "5",
        "--",
        *planned(corpus, out),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lock = scratch / "run" / ".lock"
    deadline = time.monotonic() + 300
    while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    trainer = int(lock.read_text())  # the scratch trainer, running
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "stopped: the scratch trainers are killed" in output
    assert not scratch.exists() and not out.exists()
    time.sleep(0.5)
    status = Path(f"/proc/{trainer}/status")
    assert not status.exists() or "zombie" in status.read_text()  # (gone, or not yet reaped)
