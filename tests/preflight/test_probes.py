"""The pre-flight's measurements (`atom_train.preflight.probes`) that run something
real but small: the planned command rebuilt for the scratch folder, the page cache, the
supervisor's back-off with a crashing trainer, the resume comparison, --on-complete."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from helpers.trainer_kit import TINY

from atom_train import train
from atom_train.corpus.command import main as corpus_main
from atom_train.preflight import checks as pc
from atom_train.preflight import crash_probe, probes
from atom_train.trainer.plan import resolve_command


def plan_of(argv: list[str]):
    return resolve_command(argv, warn=lambda m: None)


def test_the_scratch_command_is_the_planned_run_in_another_folder(corpus, tmp_path):
    planned = [
        "--data", str(corpus / "train-*.txt"), "--val", str(corpus / "val.txt"),
        "--total-bytes", "2e4", "--lr", "3e-3", "--sample-every", "640", "--tensorboard",
        "--output-dir", str(tmp_path / "run"), *TINY,
    ]  # fmt: skip
    plan = plan_of(planned)
    argv = probes.scratch_argv(plan, tmp_path / "scratch", {"ckpt_every": 48, "val_every": 96})
    again = plan_of(argv)
    assert again.out == tmp_path / "scratch" and again.mode == "new"
    assert again.config == plan.config and again.B == plan.B and again.total == plan.total == 5000
    assert again.corpus.shards == plan.corpus.shards and again.lr == 3e-3
    assert again.val.corpus.shards == plan.val.corpus.shards
    assert (again.periods.ckpt, again.periods.val, again.periods.sample) == (48, 96, 640)
    assert again.tensorboard == tmp_path / "scratch" / "tb"  # its own, in the scratch run
    assert again.loss_log_rate == plan.loss_log_rate


def test_a_resumed_runs_flags_come_from_its_checkpoint_and_a_built_corpus_stays_one(
    corpus, tmp_path
):
    built = tmp_path / "built"
    inputs = [str(corpus / "train-0.txt"), str(corpus / "train-1.txt")]
    assert corpus_main(["build", *inputs, "--out", str(built), "--val-bytes", "0"]) == 0
    # A run on the built corpus, with --no-learnable-leak (a model flag turned off).
    out = tmp_path / "run"
    tiny = [x for x in TINY if x != "--learnable-leak"]
    argv = ["--corpus", str(built), "--total-ticks", "32", "--output-dir", str(out), *tiny]
    assert train.main(argv) == 0
    plan = plan_of(["--output-dir", str(out), "--total-ticks", "64"])  # a resume, flags in force
    assert plan.mode == "resume" and not plan.config.learnable_leak
    scratch = probes.scratch_argv(plan, tmp_path / "s", {})
    assert "--corpus" in scratch and "--data" not in scratch and "--no-learnable-leak" in scratch
    again = plan_of(scratch)
    assert again.config == plan.config and again.corpus.shards == plan.corpus.shards
    assert again.val is None and again.total == 64


def test_dropping_the_page_cache_is_seen_by_mincore(tmp_path):
    path = tmp_path / "shard.txt"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())  # (dirty pages cannot be dropped)
    path.read_bytes()
    assert probes.cached_fraction([path]) == 1.0
    probes.drop_from_cache([path])
    after = probes.cached_fraction([path])
    if after == 1.0:
        pytest.skip("this filesystem keeps the pages (tmpfs?)")
    assert after < 0.5


def test_the_supervisors_back_off_is_measured_with_a_crashing_trainer(tmp_path):
    scratch = tmp_path / "scratch" / "new"  # (made, with its parents)
    b = probes.measure_backoff(scratch, timeout=60)
    assert b["launches"] == 3 and b["exit_code"] == 1  # gave up after 3 crashes in a row
    assert b["asked_s"] == [0.5, 1.0]
    starts = [json.loads(x)["t"] for x in (scratch / "supervisor" / crash_probe.LAUNCHES)
              .read_text().splitlines()]  # fmt: skip
    assert b["gaps_s"] == [starts[1] - starts[0], starts[2] - starts[1]]  # between launches
    for gap, asked in zip(b["gaps_s"], b["asked_s"], strict=True):
        assert gap >= asked  # waited, though a SIGUSR1 came during the first wait
    log = (scratch / "supervisor" / "supervisor.log").read_text()
    assert "backoff 0.5s doubling to 1s; gives up after 3 crashes in a row" in log
    # The SIGUSR1 came during the first back-off: after it began, before the second launch.
    lines = log.splitlines()
    at = [next(i for i, x in enumerate(lines) if text in x) for text in (
        "relaunching in 0.5s", "received SIGUSR1 while no trainer is running: ignored",
        "launch attempt 2",
    )]  # fmt: skip
    assert at == sorted(at), lines
    assert "giving up" in log
    # The supervisor's own output (stdout and stderr) is kept beside its log.
    out = (scratch / "supervisor" / "supervisor.out").read_text()
    assert "[supervise]" in out and "giving up" in out


def test_the_crash_probe_records_its_launch_and_crashes(tmp_path, monkeypatch):
    monkeypatch.setenv(crash_probe.ATTEMPT_ENV, "3")
    assert crash_probe.main(["--output-dir", str(tmp_path)]) == 1
    (line,) = (tmp_path / crash_probe.LAUNCHES).read_text().splitlines()
    assert json.loads(line)["attempt"] == "3"


def test_the_resume_comparison_reads_the_killed_and_the_resumed_launch():
    """The killed launch logged ticks 48 and 64 after its checkpoint at 32; the resumed one
    redid them with other losses (a resume that went wrong): each pair is (tick, the killed
    launch's loss, the resumed launch's), and the check fails on their difference."""
    lines = [
        {"event": "start", "tick": 0},
        {"step": 1, "tick": 16, "loss": 3.0},
        {"step": 2, "tick": 32, "loss": 2.9},
        {"step": 3, "tick": 48, "loss": 2.8},  # after the checkpoint at 32: done again
        {"step": 4, "tick": 64, "loss": 2.75},
        {"event": "resume", "tick": 32},
        {"step": 3, "tick": 48, "loss": 2.85},
        {"step": 4, "tick": 64, "loss": 2.7},
        {"step": 5, "tick": 80, "loss": 2.6},
    ]
    r = probes.compare_resume(lines)
    assert r["resumed"] and r["resumed_from"] == 32 and r["killed_at"] == 64
    assert r["overlap"] == [(48, 2.8, 2.85), (64, 2.75, 2.7)]
    check = pc.check_resume(r, exact=True)
    assert check.status == pc.FAIL and check.data["max_loss_diff"] == pytest.approx(0.05)
    # The resume done right: the same losses again, and the check passes, "exact".
    right = lines[:6] + [{**x, "loss": {48: 2.8, 64: 2.75}.get(x["tick"], 2.6)} for x in lines[6:]]
    assert pc.check_resume(probes.compare_resume(right), exact=True).value == "exact"
    assert probes.compare_resume(lines[:5])["resumed"] is False


def _fake_sudo(folder, code: int) -> None:
    """A `sudo` on PATH that records its arguments and exits `code`."""
    folder.mkdir()
    sudo = folder / "sudo"
    sudo.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{folder}/calls"\nexit {code}\n')
    sudo.chmod(0o755)


def test_on_complete_probe_finds_the_program_and_asks_sudo_without_a_password(
    tmp_path, monkeypatch
):
    assert probes.on_complete_probe(None) == (None, None)
    assert probes.on_complete_probe("true && echo done") == (True, None)
    assert probes.on_complete_probe("no-such-program-here --now")[0] is False
    # sudo asked with -n (never a prompt), and only `true` run: a sudo that lets it, one that
    # wants a password, and none on PATH.
    for code, ok in ((0, True), (1, False)):
        folder = tmp_path / f"exit-{code}"
        _fake_sudo(folder, code)
        monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
        assert probes.on_complete_probe("sudo poweroff") == (True, ok)
        assert (folder / "calls").read_text() == "-n true\n"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert probes.on_complete_probe("sudo poweroff") == (False, None)


def test_free_space_is_asked_of_the_nearest_existing_folder(tmp_path, monkeypatch):
    asked = []

    def statvfs(path):  # fragments of 4 KiB (blocks of 8): 10 free, 3 of them for anyone
        asked.append(path)
        return os.statvfs_result((8192, 4096, 100, 10, 3, 50, 20, 20, 0, 255))

    monkeypatch.setattr(probes.os, "statvfs", statvfs)
    free, mount = probes.free_space(tmp_path / "not" / "yet")
    assert asked == [tmp_path] and free == 3 * 4096  # f_bavail x f_frsize: what a user may write
    assert not (tmp_path / "not").exists()
    # The mount point: the longest of the kernel's mount points that holds the folder.
    if sys.platform == "linux":
        with open("/proc/self/mountinfo") as f:
            points = [Path(x.split()[4].replace("\\040", " ")) for x in f]
        holding = [m for m in points if tmp_path.is_relative_to(m)]
        assert Path(mount) == max(holding, key=lambda m: len(m.parts))


def test_meminfo_reads_the_kernels_figures():
    if sys.platform != "linux":
        pytest.skip("/proc/meminfo is Linux's")
    with open("/proc/meminfo") as f:
        kib = {k: int(v.split()[0]) for k, _, v in (x.partition(":") for x in f)}
    mem = probes.meminfo()
    assert mem.keys() == {"MemTotal", "MemAvailable"}
    assert mem["MemTotal"] == kib["MemTotal"] * 1024  # (fixed at boot)
    assert 0 < mem["MemAvailable"] <= mem["MemTotal"]


def test_the_cuda_memory_probe_runs_the_noise_probe_and_counts_what_was_there_once(
    corpus, tmp_path, monkeypatch
):
    """On CUDA the probe's memory is its reserved peak plus what its own process holds
    outside the allocator: the device's use before it started (this process's context, other
    processes: already out of the free memory the budget is) is taken out of the outside
    figure it reports, so it is counted once. Its command runs the run's noise probe. (The
    device faked: the arithmetic and the command, on a CPU.)"""
    import subprocess

    import torch

    plan = plan_of(["--data", str(corpus / "train-*.txt"), "--output-dir", str(tmp_path), "--total-ticks", "64",
                    "--noise-scale-every", "7", *TINY])  # fmt: skip
    plan = dataclasses.replace(plan, device=torch.device("cuda", 0))
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (140 * gib, 141 * gib))
    ran = []

    def child(cmd, **kwargs):  # reserved 1000 MiB; outside: our 1024 MiB and its own 300
        ran.append(cmd)
        row = {"peak_device_reserved_mb": 1000.0, "device_outside_allocator_mb": 1324.0}
        return subprocess.CompletedProcess(cmd, 0, json.dumps(row | {"noise_windows": 2}), "")

    monkeypatch.setattr(probes.subprocess, "run", child)
    r = probes.memory_probe(plan, plan.B, 1.0, timeout=60)
    assert r["memory_mb"] == 1000.0 + 300.0 and r["held_before_mb"] == 1024.0
    cmd = ran[0]
    assert cmd[cmd.index("--noise-scale-every") + 1] == "7" and r["noise_windows"] == 2
