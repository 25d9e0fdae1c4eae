"""Data-parallel streams under torchrun (CPU, gloo, 2 processes): a world of 2 with B/2
streams each is one process with B streams; checkpoints move between world sizes; signals,
crashes and bad input end cleanly.

Tolerance: a world of N averages N per-rank gradient means where one process takes one mean
over all B streams, so the float32 sums run in another order. After 6 windows every tensor
of the final checkpoint is within ||a - b|| <= 1e-5 ||b|| + 1e-7 of the single process's,
and each step's logged loss within 1e-5 (both measured to be ~1e-7 here); the loader state
(the positions of all B streams, and its header) is identical. Between runs on the same world size
the computation is the same, and the results are compared bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.trainer_kit import (
    REPO,
    args,
    assert_close_state,
    assert_same_state,
    run,
    steps,
    wait_for_steps,
)

from atom_train.trainer.checkpoint_file import FINAL, ROLLING, load_checkpoint

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not available"
)
REL, FLOOR, LOSS = 1e-5, 1e-7, 1e-5
TIMEOUT = ["--dist-timeout", "20"]


def torchrun(n: int, argv: list[str], env: dict | None = None, wait: bool = True, **kw):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={n}",
        "-m",
        "atom_train.train",
        *argv,
        *TIMEOUT,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if not wait:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **kw,
        )
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def supervised(options: list[str], train_args: list[str]) -> list[str]:
    """The supervisor over torchrun with 2 ranks: `options` for it, `train_args` after --."""
    return [
        sys.executable,
        "-m",
        "atom_train.supervise",
        *options,
        "--nproc-per-node",
        "2",
        "--",
        *train_args,
        *TIMEOUT,
    ]


def losses(out: Path) -> dict[int, float]:
    return {s["step"]: s["loss"] for s in steps(out)}


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory) -> Path:
    """One process, B = 4, 96 ticks (6 windows), checkpoints at 48."""
    out = tmp_path_factory.mktemp("w1")
    assert run(corpus, out, 96, "--ckpt-every", "48") == 0
    return out


@pytest.fixture(scope="module")
def world2(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("w2")
    r = torchrun(2, args(corpus, out, 96, "--ckpt-every", "48"))
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_a_world_of_two_is_one_process_with_all_streams(single, world2):
    assert_close_state(world2 / FINAL, single / FINAL, REL, FLOOR)
    l1, l2 = losses(single), losses(world2)
    assert l1.keys() == l2.keys() == set(range(1, 7))
    assert all(abs(l1[k] - l2[k]) <= LOSS for k in l1), (l1, l2)
    ck = load_checkpoint(world2 / FINAL)
    assert ck.meta["training"]["world_size"] == 2 and ck.meta["training"]["B"] == 4
    assert ck.tensors["runtime/z"].shape[0] == 4  # all B streams, as one process writes them
    # Only rank 0 wrote into the run folder.
    start = json.loads((world2 / "loss.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["world_size"] == 2
    assert len([x for x in (world2 / "loss.jsonl").read_text().splitlines() if '"step"' in x]) == 6
    # The gradients' all-reduce is timed apart from the optimizer (a process alone has none).
    rows = (world2 / "progress.tsv").read_text().splitlines()
    header = rows[0].split("\t")
    for row in rows[1:]:
        cells = dict(zip(header, row.split("\t"), strict=True))
        assert float(cells["allreduce_s"]) > 0 and float(cells["optimizer_s"]) > 0


def test_a_world_of_two_has_the_gradient_of_one_process(single, world2):
    """The ranks average their gradients: each rank's norm before clipping (logged as grad_norm)
    is the single process's. Summing them would double it, and the clipping at --grad-clip
    1.0 hides that from the weights; the logged norm does not."""
    g1 = {s["step"]: s["grad_norm"] for s in steps(single)}
    g2 = {s["step"]: s["grad_norm"] for s in steps(world2)}
    assert g1.keys() == g2.keys() == set(range(1, 7))
    assert all(g1[k] > 1.0 for k in g1), g1  # so the clipping does act on every step
    assert all(g2[k] == pytest.approx(g1[k], rel=1e-4) for k in g1), (g1, g2)


def test_under_torchrun_the_ranks_are_the_noise_scales_split(corpus, world2, tmp_path):
    """With --noise-scale-every, two ranks take each rank's gradient (its 2 streams) as the
    small batch: free, since the all-reduce averages them anyway. That is the same split as
    one process's halves (streams 0-1 and 2-3), so the squared norms agree within the
    float32 rounding of the gradients (the order of the sums differs: 1e-5 relative); and
    the run is bit for bit the run without it."""
    noise = ["--ckpt-every", "48", "--noise-scale-every", "2"]
    out2 = tmp_path / "w2"
    r = torchrun(2, args(corpus, out2, 96, *noise))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_state(out2 / FINAL, world2 / FINAL)
    out1 = tmp_path / "w1"
    assert run(corpus, out1, 96, *noise) == 0
    two = [s for s in steps(out2) if "grad_sq_small" in s]
    one = [s for s in steps(out1) if "grad_sq_small" in s]
    assert [s["step"] for s in two] == [s["step"] for s in one] == [2, 3, 6]
    for a, b in zip(two, one, strict=True):
        assert a["streams_small"] == b["streams_small"] == 2
        for k in ("grad_sq_small", "grad_sq_big"):
            assert a[k] == pytest.approx(b[k], rel=1e-5), k


def test_resume_on_the_same_world_size_is_exact(corpus, world2, tmp_path):
    out = tmp_path / "run"
    r = torchrun(2, args(corpus, out, 48, "--ckpt-every", "48"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = torchrun(2, args(corpus, out, 96, "--ckpt-every", "48"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_state(out / FINAL, world2 / FINAL)


def test_checkpoints_move_between_world_sizes(corpus, single, tmp_path):
    # 2 -> 1: saved by two ranks, resumed by one process.
    a = tmp_path / "two-then-one"
    assert torchrun(2, args(corpus, a, 48, "--ckpt-every", "48")).returncode == 0
    assert run(corpus, a, 96, "--ckpt-every", "48") == 0
    assert_close_state(a / FINAL, single / FINAL, REL, FLOOR)
    # 1 -> 2: saved by one process, resumed by two ranks.
    b = tmp_path / "one-then-two"
    assert run(corpus, b, 48, "--ckpt-every", "48") == 0
    r = torchrun(2, args(corpus, b, 96, "--ckpt-every", "48"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_close_state(b / FINAL, single / FINAL, REL, FLOOR)
    resume = [json.loads(x) for x in (b / "loss.jsonl").read_text().splitlines() if "resume" in x]
    assert resume[0]["world_size"] == 2


def test_sigterm_to_torchrun_stops_every_rank_with_a_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    proc = torchrun(2, args(corpus, out, 100_000, "--ckpt-every", "0"), wait=False)
    try:
        wait_for_steps(out, 3, proc, timeout=120)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "stopped" and status["signal"] == "SIGTERM", output
    tick = load_checkpoint(out / ROLLING).meta["training"]["tick"]
    assert tick == status["tick"] == steps(out)[-1]["tick"]
    # torchrun ends itself on the signal it was sent (SignalException, exit 1) after its
    # ranks stopped: rank 0 says so once, and no rank failed (the one traceback is torchrun's).
    assert proc.returncode == 1 and "SignalException" in output, output[-3000:]
    assert output.count(f"stopped by SIGTERM at tick {tick}") == 1, output[-3000:]
    assert output.count("Traceback") == 1 and "exitcode" not in output, output[-3000:]
    # The stopped run resumes (on one process, even).
    assert run(corpus, out, tick + 32, "--ckpt-every", "0") == 0


def test_a_killed_rank_ends_the_job_and_the_supervisor_finishes_the_run(corpus, single, tmp_path):
    out = tmp_path / "run"
    marker = tmp_path / "killed-once"
    cmd = supervised(["--backoff", "0.2"], args(corpus, out, 96, "--ckpt-every", "48"))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ATOM_TEST_CRASH_AT_TICK": "64",
        "ATOM_TEST_CRASH_RANK": "1",
        "ATOM_TEST_CRASH_SIGNAL": "KILL",
        "ATOM_TEST_CRASH_MARKER": str(marker),
    }
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert marker.read_text() == "64"
    assert "killed by" in r.stderr or "exit code" in r.stderr
    assert "launch attempt 2" in r.stderr and "training completed" in r.stderr
    assert "launch attempt 3" not in r.stderr  # one crash, one relaunch
    assert_close_state(out / FINAL, single / FINAL, REL, FLOOR)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-B", "5"], "-B 5 is not divisible by the world size 2"),
        (["--device", "cuda"], "CUDA device"),
    ],
)
def test_bad_input_is_one_clear_error_and_exit_2(corpus, tmp_path, extra, message):
    if "cuda" in extra and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has enough GPUs")
    out = tmp_path / "run"
    # Rank 0 starts 3 s late, as when it is still importing torch on a busy machine while
    # rank 1 already meets the refusal: rank 1 must not end the world before rank 0 says it.
    late = {"ATOM_TEST_START_DELAY": "0:3"}
    r = torchrun(2, [*args(corpus, out, 32), *extra], env=late)  # a hang: torchrun()'s timeout
    assert r.returncode != 0
    errors = [x for x in r.stderr.splitlines() if x.startswith("[train] error:")]
    assert len(errors) == 1 and message in errors[0], r.stderr  # rank 0's line, once
    assert "exitcode  : 2" in r.stderr  # every rank's, in torchrun's failure summary
    assert "atom_train/" not in r.stderr, "no traceback from the trainer (torchrun prints its own)"
    # Under the supervisor, the world's user error is the supervisor's exit code 2.
    cmd = supervised([], [*args(corpus, out, 32), *extra])
    env = {**os.environ, **late}
    s = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert s.returncode == 2, s.stderr[-2000:]
    assert "relaunching cannot help" in s.stderr


def test_sigusr1_through_the_supervisor_checkpoints_every_rank_and_goes_on(corpus, tmp_path):
    out = tmp_path / "run"
    cmd = supervised([], args(corpus, out, 100_000, "--ckpt-every", "0"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_steps(out, 2, proc, timeout=120)
        assert not (out / ROLLING).exists()
        proc.send_signal(signal.SIGUSR1)  # the supervisor sends it to both ranks
        t0 = time.time()
        while not (out / ROLLING).exists() and time.time() - t0 < 60:
            time.sleep(0.05)
        tick = load_checkpoint(out / ROLLING).meta["training"]["tick"]
        wait_for_steps(out, len(steps(out)) + 2, proc, timeout=60)
        assert proc.poll() is None, "SIGUSR1 must not stop training"
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    assert "SIGUSR1: checkpoint at tick" in output
    assert proc.returncode == 0, output[-2000:]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "stopped" and status["tick"] > tick


def test_under_torchrun_every_rank_rewinds_then_stops_as_diverged(corpus, tmp_path):
    """A pivot onto --lr 10 under torchrun: both ranks see the verdict at the same boundary
    (the values are reduced before the guard reads them), go back to the same checkpoint
    with the rate lowered, and stop together as diverged after --max-rewinds 1: exit 3 from
    the job, the healthy checkpoint untouched, the events of a single process's guard."""
    import hashlib

    from atom_train.common.cli import EXIT_CODE_FILE_ENV, EXIT_DIVERGED, read_exit_code
    from atom_train.trainer.loss_log import read_events

    out = tmp_path / "w2"
    r = torchrun(2, args(corpus, out, 160, "--lr", "0.01", "--ckpt-every", "80"))
    assert r.returncode == 0, r.stdout + r.stderr
    before = hashlib.sha256((out / FINAL).read_bytes()).hexdigest()
    pivot = ["--lr", "10", "--ckpt-every", "80", "--max-rewinds", "1"]
    code_file = tmp_path / "exit_code"
    r = torchrun(2, args(corpus, out, 480, *pivot), env={EXIT_CODE_FILE_ENV: str(code_file)})
    assert r.returncode != 0, r.stdout + r.stderr
    assert read_exit_code(code_file) == EXIT_DIVERGED  # (rank 0's; torchrun's own is 1)
    assert "exitcode  : 3" in r.stderr, r.stderr
    assert hashlib.sha256((out / FINAL).read_bytes()).hexdigest() == before
    ev = [e["event"] for e in read_events(out)]
    assert ev[-5:] == ["pivot", "rewind", "resume", "pivot", "diverged"], ev
    st = json.loads((out / "status.json").read_text())
    assert st["status"] == "diverged" and st["policy"]["lr"] == 5.0
    assert "completed" not in r.stdout + r.stderr
