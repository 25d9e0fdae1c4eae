"""The pre-flight's probes (`atom_train.preflight.probes`) at their edges: the resume
comparison word for word, the page-cache count on a stand-in for mincore (which pages the
kernel reports is its own affair: here each page's answer is given), what drops a file from
the cache, the mount point and /proc/meminfo where they cannot be asked, --on-complete's
program and sudo, a supervisor that does not finish in time, and the scratch command's
flags (a val turned off, TensorBoard's folder, switches, several --data, the lifecycle)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.trainer_kit import TINY

from atom_train.corpus.command import main as corpus_main
from atom_train.preflight import probes
from atom_train.trainer.plan import resolve_command


def plan_of(argv: list[str]):
    return resolve_command(argv, warn=lambda m: None)


# ---- the resume comparison -------------------------------------------------------------------


def test_the_resume_comparison_word_for_word():
    assert probes.compare_resume([{"step": 1, "tick": 16, "loss": 3.0}]) == {
        "resumed": False,
        "error": "no resume event in loss.jsonl",
    }
    # Events (even those with a loss) and steps without one are not steps' losses; the
    # killed launch's last step (56) was not logged again by the resumed one (64).
    lines = [
        {"step": 1, "tick": 40},  # (no loss)
        {"step": 2, "tick": 48, "loss": 2.8},
        {"event": "val", "tick": 48, "loss": 9.0},
        {"step": 3, "tick": 56, "loss": 2.7},
        {"event": "resume", "tick": 32},
        {"step": 3, "tick": 40},
        {"step": 2, "tick": 48, "loss": 2.85},
        {"event": "val", "tick": 48, "loss": 8.0},
        {"step": 4, "tick": 64, "loss": 2.6},
    ]
    assert probes.compare_resume(lines) == {
        "resumed": True,
        "resumed_from": 32,
        "killed_at": 56,
        "overlap": [(48, 2.8, 2.85)],
    }
    # Killed before it logged a step: nothing to compare, killed at tick 0.
    first = [{"event": "resume", "tick": 32}, {"step": 1, "tick": 48, "loss": 2.0}]
    assert probes.compare_resume(first) == {
        "resumed": True,
        "resumed_from": 32,
        "killed_at": 0,
        "overlap": [],
    }


# ---- the page cache --------------------------------------------------------------------------

_LIBC = probes._libc  # (the real one, which the stand-in maps and unmaps with)


class _Mincore:
    """`probes._libc` with mincore answering each page from `answers` (one list a file, in
    order: the kernel's byte a page, whose low bit alone says "resident"), and every munmap
    recorded beside every mmap."""

    def __init__(self, answers: list[list[int]], result: int = 0):
        self.answers, self.result = list(answers), result
        self.mapped: list[tuple[int, int]] = []
        self.unmapped: list[tuple[int, int]] = []
        self.pages: list[int] = []

    def mmap(self, *args):
        addr = _LIBC.mmap(*args)
        self.mapped.append((addr, args[1]))
        return addr

    def mincore(self, addr, size, vec):
        self.pages.append(len(vec))
        answer = self.answers.pop(0)
        for i in range(len(vec)):
            vec[i] = answer[i]
        return self.result

    def munmap(self, addr, size):
        self.unmapped.append((addr, size))
        return _LIBC.munmap(addr, size)


def test_the_cached_share_counts_pages_by_their_low_bit_over_every_file(tmp_path, monkeypatch):
    page = os.sysconf("SC_PAGE_SIZE")
    a, empty, b = tmp_path / "a", tmp_path / "empty", tmp_path / "b"
    a.write_bytes(b"x" * (3 * page + 1))  # 4 pages, the last of 1 byte
    empty.write_bytes(b"")  # (no page: left out)
    b.write_bytes(b"y" * page)
    libc = _Mincore([[1, 2, 3, 0], [2]])  # a: pages 0 and 2 resident; b: none (bit 1 only)
    monkeypatch.setattr(probes, "_libc", libc)
    assert probes.cached_fraction([a, empty, b]) == 2 / 5
    assert libc.pages == [4, 1]
    assert libc.unmapped == libc.mapped and len(libc.mapped) == 2  # each mapping undone
    # mincore refused: no share, and the mapping is still undone.
    libc = _Mincore([[1, 1, 1, 1]], result=-1)
    monkeypatch.setattr(probes, "_libc", libc)
    assert probes.cached_fraction([a, b]) is None
    assert libc.unmapped == libc.mapped and len(libc.mapped) == 1


def test_small_and_empty_files_in_the_cached_share(tmp_path):
    page = os.sysconf("SC_PAGE_SIZE")
    files = []
    for name, size in (("empty", 0), ("one", 1), ("small", 100), ("page+1", page + 1)):
        files.append(tmp_path / name)
        files[-1].write_bytes(b"z" * size)  # (just written: in the page cache)
    assert probes.cached_fraction(files) == 1.0
    assert probes.cached_fraction([files[1]]) == 1.0  # a file of one byte is one page
    assert probes.cached_fraction([files[0]]) is None  # no page at all: no share


def test_dropping_from_the_cache_asks_for_each_whole_file(tmp_path, monkeypatch):
    asked = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: asked.append(a[1:]) or real(*a))
    paths = [tmp_path / "a", tmp_path / "b"]
    for p in paths:
        p.write_bytes(b"x" * 10_000)
    probes.drop_from_cache(paths)
    # offset 0, length 0: from the start to the end of the file
    assert asked == [(0, 0, os.POSIX_FADV_DONTNEED)] * 2


# ---- the machine -----------------------------------------------------------------------------


def test_the_mount_point_is_the_nearest_one_above(tmp_path, monkeypatch):
    mounted = tmp_path / "disk"
    (mounted / "runs").mkdir(parents=True)
    monkeypatch.setattr(probes.os.path, "ismount", lambda p: Path(p) in (mounted, Path("/")))
    _, mount = probes.free_space(mounted / "runs" / "new")
    assert mount == str(mounted)


def test_meminfo_is_empty_where_proc_cannot_be_read(monkeypatch):
    def unreadable(path, *a, **kw):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(probes, "open", unreadable, raising=False)
    assert probes.meminfo() == {}


# ---- --on-complete ---------------------------------------------------------------------------


def test_shell_builtins_need_no_program_and_a_bad_command_is_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # nothing on PATH
    for cmd in ("exec sudo poweroff", "true", "false", ": nothing"):
        assert probes.on_complete_probe(cmd) == (True, None), cmd
    assert probes.on_complete_probe("poweroff") == (False, None)
    assert probes.on_complete_probe("sudo 'poweroff") == (False, None)  # (a quote not closed)
    assert probes.on_complete_probe("   ") == (False, None)  # (no word)


def _sudo_on_path(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    sudo = folder / "sudo"
    sudo.write_text('#!/bin/sh\necho "[sudo] password for you:"\necho "sorry" >&2\nexit 1\n')
    sudo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")


def test_sudos_own_words_stay_out_of_the_pre_flights_output(tmp_path, monkeypatch, capfd):
    _sudo_on_path(tmp_path, monkeypatch)
    capfd.readouterr()
    assert probes.on_complete_probe("sudo poweroff") == (True, False)
    assert capfd.readouterr() == ("", "")


def test_a_sudo_that_waits_or_cannot_start_is_a_no(tmp_path, monkeypatch):
    _sudo_on_path(tmp_path, monkeypatch)

    def waits(cmd, **kw):  # a sudo that would wait for a password for ever
        if kw.get("timeout") is None:
            raise AssertionError("no timeout: the pre-flight would wait with it")
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(probes.subprocess, "run", waits)
    assert probes.on_complete_probe("sudo poweroff") == (True, False)

    def cannot_start(cmd, **kw):
        raise PermissionError(13, "Permission denied", cmd[0])

    monkeypatch.setattr(probes.subprocess, "run", cannot_start)
    assert probes.on_complete_probe("sudo poweroff") == (True, False)


# ---- the supervisor --------------------------------------------------------------------------


def _processes_naming(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path("/proc", pid, "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(pid))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_supervisor_that_does_not_finish_in_time_is_an_error_and_is_stopped(tmp_path):
    (tmp_path / "supervisor").mkdir()  # (a scratch folder used before)
    assert probes.measure_backoff(tmp_path, timeout=0.01) == {
        "error": "the supervisor did not finish in 0 s"
    }
    assert _processes_naming(str(tmp_path / "supervisor")) == []  # killed, not left running


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_supervisor_is_started_as_nohup_starts_it(tmp_path, monkeypatch):
    """The probe's supervisor, read from /proc the moment it starts: SIGHUP ignored, a session
    of its own (no terminal to lose), stdin on /dev/null."""
    seen = {}
    real = subprocess.Popen

    def popen(cmd, **kw):
        p = real(cmd, **kw)  # (returns once the child has exec'd)
        status = Path(f"/proc/{p.pid}/status").read_text()
        ignored = int(
            next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16
        )
        seen.update(sighup_ignored=bool(ignored & (1 << (signal.SIGHUP - 1))),
                    own_session=os.getsid(p.pid) == p.pid,
                    stdin=os.readlink(f"/proc/{p.pid}/fd/0"))  # fmt: skip
        return p

    monkeypatch.setattr(probes.subprocess, "Popen", popen)
    saved, (r, w) = os.dup(0), os.pipe()
    os.dup2(r, 0)  # (this process's stdin a pipe, so that an inherited one would show)
    try:
        assert "error" in probes.measure_backoff(tmp_path, timeout=0.01)  # (stopped at once)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, r, w):
            os.close(fd)
    assert seen == {"sighup_ignored": True, "own_session": True, "stdin": "/dev/null"}


# ---- the scratch command ---------------------------------------------------------------------


def test_the_scratch_command_keeps_a_val_turned_off_on_a_corpus_with_one(corpus, tmp_path):
    built = tmp_path / "built"
    inputs = [str(corpus / "train-0.txt"), str(corpus / "train-1.txt")]
    assert corpus_main(["build", *inputs, "--out", str(built), "--val-bytes", "2000"]) == 0
    plan = plan_of(["--corpus", str(built), "--val", "", "--total-ticks", "64",
                    "--output-dir", str(tmp_path / "run"), *TINY])  # fmt: skip
    assert plan.val is None
    argv = probes.scratch_argv(plan, tmp_path / "s", {})
    assert argv[argv.index("--val") + 1] == ""
    assert plan_of(argv).val is None
    with_val = plan_of(["--corpus", str(built), "--total-ticks", "64",
                        "--output-dir", str(tmp_path / "run2"), *TINY])  # fmt: skip
    assert with_val.val is not None
    assert plan_of(probes.scratch_argv(with_val, tmp_path / "s2", {})).val is not None


def test_the_scratch_commands_switches_lists_and_tensorboard(corpus, tmp_path):
    planned = [
        "--data", str(corpus / "train-0.txt"), "--data", str(corpus / "train-1.txt"),
        "--val", "", "--total-ticks", "64", "--resident", "--tensorboard", str(tmp_path / "tb"),
        "--output-dir", str(tmp_path / "run"), *TINY,
    ]  # fmt: skip
    plan = plan_of(planned)
    argv = probes.scratch_argv(plan, tmp_path / "scratch", {})
    data = [argv[i + 1] for i, x in enumerate(argv) if x == "--data"]
    assert data == [str(corpus / "train-0.txt"), str(corpus / "train-1.txt")]
    assert "--resident" in argv and "--tf32" not in argv  # on, and off
    again = plan_of(argv)
    assert again.corpus.shards == plan.corpus.shards
    assert again.tensorboard == tmp_path / "scratch" / "tb"  # not the planned run's folder
    assert argv[-2:] != ["--tensorboard", str(tmp_path / "tb")]
    assert str(tmp_path / "tb") not in argv


def test_the_scratch_command_leaves_the_lifecycle_flags_out(corpus, tmp_path):
    planned = ["--data", str(corpus / "train-*.txt"), "--val", "", "--total-ticks", "64",
               "--revert-ok", "--output-dir", str(tmp_path / "run"), *TINY]  # fmt: skip
    plan = plan_of(planned)
    assert plan.lifecycle.revert_ok is True
    argv = probes.scratch_argv(plan, tmp_path / "scratch", {})
    assert "--revert-ok" not in argv  # (a lifecycle flag: the scratch run is a new run)
    assert argv[argv.index("--output-dir") + 1] == str(tmp_path / "scratch")
