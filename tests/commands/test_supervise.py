"""The supervisor (`python -m atom_train.supervise`) against a fake trainer.

`tests/helpers/fake_trainer.py` keeps the trainer's contract (exit codes, status.json, checkpoints,
signals) and crashes or exits as FAKE_PLAN tells it, one entry per launch; it records what it
saw in `fake_events.jsonl`. Every test runs real processes and real signals; timing asserts
are only ever "waited at least X" (or "did not wait out a 60 s backoff").
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
from helpers import REPO, TESTS

from atom_train.common.cli import UserError, output_dir_from

TIMEOUT = 60  # generous: the machine is shared; every test normally takes a second or two


def env_for(plan: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(TESTS), str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["FAKE_PLAN"] = plan
    return env


def default_stop_signals() -> None:
    """In the child, before exec: SIGINT, SIGTERM and SIGHUP at their defaults. A test run
    launched in the background (`make test &`, nohup) has SIGINT ignored, children inherit
    that, and the supervisor rightly keeps an ignored signal ignored: its "Ctrl-C" test would
    then wait forever. Users' shells give it the defaults; so do the tests."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def command(out: Path, *sup_args: str, train: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "atom_train.supervise",
        "--module",
        "helpers.fake_trainer",
        *sup_args,
        "--",
        "--output-dir",
        str(out),
        *train,
    ]


def run_supervisor(
    tmp_path: Path, plan: str, *sup_args: str, train: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(tmp_path / "run", *sup_args, train=train),
        cwd=tmp_path,
        env=env_for(plan),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=default_stop_signals,
    )


def start_supervisor(
    tmp_path: Path, plan: str, *sup_args: str, via_script: bool = False
) -> subprocess.Popen:
    cmd = command(tmp_path / "run", *sup_args)
    env = env_for(plan)
    if via_script:  # the runbook wrapper, with this interpreter
        cmd = [str(REPO / "scripts" / "train.sh"), *cmd[3:]]
        env["ATOM_PYTHON"] = sys.executable
    # Its own session, like a shell job: a "Ctrl-C" is then SIGINT to its process group.
    with open(tmp_path / "supervisor.stderr", "wb") as err:
        return subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            preexec_fn=default_stop_signals,
        )


def stderr_of(tmp_path: Path) -> str:
    return (tmp_path / "supervisor.stderr").read_text()


def events(out: Path, kind: str | None = None) -> list[dict]:
    try:
        lines = (out / "fake_events.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    found = [json.loads(line) for line in lines]
    return [e for e in found if kind is None or e["event"] == kind]


def wait_until(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def log_of(out: Path) -> str:
    return (out / "supervisor.log").read_text()


def status_of(out: Path) -> dict:
    return json.loads((out / "status.json").read_text())


def gaps(out: Path) -> list[float]:
    """Seconds between each launch's exit and the next launch's start."""
    exits = [e["t"] for e in events(out, "exit")]
    starts = [e["t"] for e in events(out, "start")]
    return [start - end for end, start in zip(exits, starts[1:], strict=False)]


def test_relaunch_after_crash_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_supervisor(
        tmp_path, "crash@5,run", "--backoff", "0.3", train=("--ticks", "8", "--ckpt-every", "2")
    )
    assert r.returncode == 0, r.stderr
    starts = events(out, "start")
    assert [s["resumed_from"] for s in starts] == [None, 4]
    assert [s["attempt"] for s in starts] == ["1", "2"]
    assert gaps(out)[0] >= 0.3
    assert status_of(out)["status"] == "completed"
    log = log_of(out)
    assert "launch attempt 2" in log
    assert "exit code 1; new checkpoint: yes (ckpt-rolling.safetensors)" in log
    # The crash is told with the trainer's last error line (its stderr passes through).
    assert "the trainer crashed: fake_trainer: simulated crash at tick 5;" in log
    assert "fake_trainer: simulated crash at tick 5" in r.stderr.splitlines()
    assert "training completed" in log
    # The log file holds the same event lines as stderr.
    ours = [line for line in r.stderr.splitlines() if line.startswith("[supervise] ")]
    assert log.splitlines() == ours


def test_death_by_signal_is_a_crash_and_leftovers_are_killed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_supervisor(tmp_path, "orphan-crash,sigkill,run", "--backoff", "0.05")
    assert r.returncode == 0, r.stderr
    assert len(events(out, "start")) == 3
    assert "killed by SIGKILL" in log_of(out)
    # The first trainer left a child in its process group: the supervisor killed it.
    orphan = events(out, "orphan")[0]["pid"]
    stat = Path(f"/proc/{orphan}/stat")
    wait_until(
        lambda: not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX",
        "the crashed trainer's leftover child to be killed",
        timeout=10,
    )


def test_gives_up_after_five_crashes_without_checkpoint_and_backoff_waits(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    r = run_supervisor(tmp_path, "crash", "--backoff", "0.2", "--max-backoff", "0.5")
    assert r.returncode == 1
    assert len(events(out, "start")) == 5  # the default --max-failures
    for gap, backoff in zip(gaps(out), [0.2, 0.4, 0.5, 0.5], strict=True):
        assert gap >= backoff
    last = r.stderr.strip().splitlines()[-1]
    assert "giving up: 5 crashes in a row wrote no new checkpoint" in last
    assert str(out / "supervisor.log") in last
    assert "crash 4 of 5 in a row without a new checkpoint; relaunching in 0.5s" in log_of(out)


def test_a_crash_that_writes_a_checkpoint_resets_the_count(tmp_path: Path) -> None:
    out = tmp_path / "run"
    plan = "crash,crash,ckpt-crash,crash"
    r = run_supervisor(tmp_path, plan, "--backoff", "0.05", "--max-failures", "3")
    assert r.returncode == 1
    # 2 failures, a reset, then 3 more: without the reset it would stop after launch 3.
    assert len(events(out, "start")) == 6
    assert "failure count reset" in log_of(out)


@pytest.mark.parametrize(
    "how", ["SIGTERM to supervisor", "Ctrl-C to its group", "kill trainer", "SIGTERM to train.sh"]
)
def test_clean_stop_is_never_relaunched(tmp_path: Path, how: str) -> None:
    out = tmp_path / "run"
    proc = start_supervisor(
        tmp_path,
        "serve",
        "--on-complete",
        "touch completed.marker",
        via_script=how.endswith("train.sh"),
    )
    try:
        wait_until(lambda: events(out, "start"), "the trainer to start")
        trainer = events(out, "start")[0]
        assert trainer["sid"] != os.getsid(proc.pid)  # its own session: Ctrl-C skips it
        assert (out / "supervisor.pid").read_text().strip() == str(proc.pid)
        # A second supervisor on the same run dir refuses before launching anything.
        second = run_supervisor(tmp_path, "run")
        assert second.returncode == 2
        assert "another supervisor" in second.stderr
        if how.startswith("SIGTERM"):  # kill, systemctl stop: forwarded (train.sh execs)
            os.kill(proc.pid, signal.SIGTERM)
        elif how == "Ctrl-C to its group":  # forwarded once, as SIGTERM
            os.killpg(proc.pid, signal.SIGINT)
        else:  # an operator stops the trainer itself: exit 0 "stopped" is final too
            os.kill(trainer["pid"], signal.SIGTERM)
        assert finish(proc) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [e["name"] for e in events(out, "signal")] == ["SIGTERM"]
    assert len(events(out, "start")) == 1
    assert status_of(out)["status"] == "stopped"
    assert "not relaunching" in log_of(out)
    assert not (tmp_path / "completed.marker").exists()
    assert not (out / "supervisor.pid").exists()


def test_sigusr1_is_forwarded_and_training_continues(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_supervisor(tmp_path, "serve")
    try:
        wait_until(lambda: events(out, "start"), "the trainer to start")
        os.kill(proc.pid, signal.SIGUSR1)
        wait_until(
            lambda: any(e["reason"] == "SIGUSR1" for e in events(out, "checkpoint")),
            "the trainer to checkpoint on SIGUSR1",
        )
        assert proc.poll() is None
        assert not events(out, "exit")
        os.kill(proc.pid, signal.SIGTERM)
        assert finish(proc) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [e["name"] for e in events(out, "signal")] == ["SIGUSR1", "SIGTERM"]
    assert len(events(out, "start")) == 1
    assert "received SIGUSR1: forwarded to the trainer" in log_of(out)


def test_a_trainer_that_cannot_start_ends_the_supervision_at_once(tmp_path: Path) -> None:
    """An import error (an exit within seconds, before any window) is no crash: no relaunch,
    and the supervisor says which it was with the trainer's own error line."""
    out = tmp_path / "run"
    r = run_supervisor(tmp_path, "cannot-start,run", "--backoff", "0.05")
    assert r.returncode == 1
    assert len(events(out, "start")) == 1  # not relaunched
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("[supervise] ") and "the trainer cannot start (exit code 1" in last
    assert "No module named 'fake_missing_dependency'" in last
    assert "not relaunching" in last and str(out / "supervisor.log") in last
    # The trainer's traceback itself went through to the supervisor's stderr.
    assert "Traceback (most recent call last):" in r.stderr


def test_a_checkpoint_another_process_wrote_is_not_the_childs_progress(tmp_path: Path) -> None:
    """Checkpoints appear during each launch, written by another process (they carry another
    launch id): the failure count is not reset, so the supervisor gives up as usual."""
    out = tmp_path / "run"
    r = run_supervisor(tmp_path, "foreign-ckpt-crash", "--backoff", "0.05", "--max-failures", "3")
    assert r.returncode == 1
    assert len(events(out, "start")) == 3
    assert len(list(out.glob("snapshot-*.safetensors"))) == 3
    log = log_of(out)
    assert "new checkpoint: no; written by another process, not counted: snapshot-" in log
    assert "failure count reset" not in log
    assert "giving up: 3 crashes in a row wrote no new checkpoint" in log


def test_exit_code_2_is_passed_through_without_relaunch(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_supervisor(tmp_path, "usage", "--backoff", "0.05")
    assert r.returncode == 2
    assert len(events(out, "start")) == 1
    assert "relaunching cannot help" in r.stderr.strip().splitlines()[-1]


def test_on_complete_runs_once_after_completion(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = 'printf "%s %s\\n" "$ATOM_STATUS" "$ATOM_CHECKPOINT" >> completed.marker'
    r = run_supervisor(tmp_path, "crash@4,run", "--backoff", "0.05", "--on-complete", cmd)
    assert r.returncode == 0, r.stderr
    marker = (tmp_path / "completed.marker").read_text()
    assert marker == f"completed {out / 'ckpt-final.safetensors'}\n"


def test_failing_on_complete_is_reported(tmp_path: Path) -> None:
    r = run_supervisor(tmp_path, "run", "--on-complete", "exit 7")
    assert r.returncode == 1
    assert "--on-complete failed (exit code 7)" in r.stderr


def test_a_diverged_run_is_not_relaunched_and_runs_no_on_complete(tmp_path: Path) -> None:
    """A run whose divergence guard gave up (exit 3, status.json "diverged"): one launch,
    no --on-complete, exit 3, and a last line that says what diverged, when, what was tried
    and which checkpoint is the last healthy one (from status.json's account)."""
    out = tmp_path / "run"
    train = ("--ticks", "60", "--ckpt-every", "3")
    r = run_supervisor(
        tmp_path, "diverge@40,run", "--backoff", "0", "--on-complete", "touch x", train=train
    )
    assert r.returncode == 3, r.stderr
    assert len(events(out, "start")) == 1
    assert not (tmp_path / "x").exists()
    assert status_of(out)["status"] == "diverged"
    last = r.stderr.strip().splitlines()[-1]
    assert last == log_of(out).splitlines()[-1]
    rolling = out / "ckpt-rolling.safetensors"
    said = last.split(" ", 2)[2]  # after "[supervise] <time>"
    assert said == (
        "the run diverged: loss spike, loss 9.51 > 2.594 (its running median 2.183), at tick "
        "40 (step 40); it began at tick 39; tried 2 rewinds (tick 20 back to 10, lr 0.04 -> "
        "0.02; tick 30 back to 10, lr 0.02 -> 0.01); stopped: 2 rewinds within 40 ticks "
        f"already (--max-rewinds 2); last healthy checkpoint: {rolling} (tick 39); lower --lr "
        "(python -m atom_train.tune lr measures one for this -B and K) and rerun to resume "
        f"from it; it stopped at tick 40, checkpoint {rolling}; not relaunching: the same "
        "data at the same rate diverges again; no --on-complete; supervisor log: "
        f"{out / 'supervisor.log'}"
    )


def test_exit_3_is_a_divergence_even_without_its_account(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_supervisor(tmp_path, "exit3,run", "--backoff", "0")
    assert r.returncode == 3, r.stderr
    assert len(events(out, "start")) == 1
    assert (
        f"the run diverged (exit code 3), and {out / 'status.json'} holds no account of it; "
        "it stopped at tick 0, checkpoint None; not relaunching"
    ) in r.stderr.strip().splitlines()[-1]


def test_exit_0_without_a_fresh_status_is_not_taken_for_completion(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run_supervisor(tmp_path, "run").returncode == 0
    assert status_of(out)["status"] == "completed"
    # The next launch exits 0 without writing status.json: the old "completed" is stale.
    r = run_supervisor(tmp_path, "run,exit0", "--on-complete", "touch completed.marker")
    assert r.returncode == 1
    assert "cannot tell whether training completed" in r.stderr
    assert not (tmp_path / "completed.marker").exists()


def test_stop_during_backoff_ends_without_relaunch(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # A backoff far longer than finish()'s timeout: the supervisor ends by itself only if it
    # does not wait it out (no clock is read here).
    proc = start_supervisor(tmp_path, "crash", "--backoff", "3600", "--max-backoff", "3600")
    try:
        wait_until(lambda: "relaunching in 3600s" in stderr_of(tmp_path), "the backoff")
        os.kill(proc.pid, signal.SIGTERM)
        assert finish(proc) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert len(events(out, "start")) == 1
    assert "stop requested during the backoff: not relaunching" in log_of(out)


def test_third_stop_signal_kills_a_trainer_that_does_not_stop(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_supervisor(tmp_path, "stubborn")
    try:
        wait_until(lambda: events(out, "start"), "the trainer to start")
        for n, expect in enumerate(["forwarded SIGTERM", "already stopping", "SIGKILL"]):
            os.kill(proc.pid, signal.SIGTERM)
            wait_until(lambda e=expect: e in stderr_of(tmp_path), f"stop signal {n + 1}")
            time.sleep(0.3)  # lets the trainer record a (wrongly) forwarded second SIGTERM
        assert finish(proc) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [e["name"] for e in events(out, "signal")] == ["SIGTERM"]  # forwarded only once
    assert len(events(out, "start")) == 1
    assert "trainer did not stop cleanly (killed by SIGKILL" in log_of(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_killed_supervisor_stops_the_trainer_cleanly_and_can_be_rerun(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_supervisor(tmp_path, "serve")
    try:
        wait_until(lambda: events(out, "start"), "the trainer to start")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=TIMEOUT)
        wait_until(lambda: events(out, "exit"), "the orphaned trainer to stop")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [e["name"] for e in events(out, "signal")] == ["SIGTERM"]
    assert status_of(out)["status"] == "stopped"
    # The stale supervisor.pid does not block the next supervisor, which resumes.
    r = run_supervisor(tmp_path, "run")
    assert r.returncode == 0, r.stderr
    assert events(out, "start")[-1]["resumed_from"] is not None
    assert status_of(out)["status"] == "completed"
    # ... and says, in supervisor.log and on its stderr, that the one before it was killed.
    trace = (
        f"the previous supervisor (pid {proc.pid}) ended without logging its end: killed by SIGKILL"
    )
    assert trace in log_of(out) and trace in r.stderr
    assert run_supervisor(tmp_path, "run").returncode == 0  # (a clean end leaves no trace)
    assert log_of(out).count("the previous supervisor") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "missing `--`"),
        (["--data", "x.txt"], "missing `--` before the train args (got '--data'"),
        (["--"], "no train args"),
        (["--backoff", "-1", "--", "--data", "x"], "--backoff must be >= 0"),
        (["--max-failures", "0", "--", "--data", "x"], "--max-failures must be >= 1"),
        (["--bogus", "--", "--data", "x"], "unrecognized arguments: --bogus"),
        (["--module", "no_such_module_xyz", "--", "--data", "x"], "no module named"),
        (["--", "--output", "d"], "write --output-dir in full"),
        (["--", "--data", "x"], "no --output-dir in the train args: name the run's folder"),
        (["--backof", "1", "--", "--data", "x"], "(did you mean --backoff?)"),
    ],
)
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, argv: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "atom_train.supervise", *argv],
        cwd=tmp_path,
        env=env_for("run"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("[supervise] error: ")
    assert message in lines[0]
    assert not list(tmp_path.iterdir())  # nothing was launched or created


def test_output_dir_is_found_as_the_trainer_would_parse_it() -> None:
    with pytest.raises(UserError, match="no --output-dir"):
        output_dir_from(["--data", "x"])  # no default folder shared by unrelated runs
    assert output_dir_from(["--output-dir", "a", "--data", "x"]) == Path("a")
    assert output_dir_from(["--output-dir=b"]) == Path("b")
    assert output_dir_from(["--output-dir", "a", "--output-dir=c"]) == Path("c")
    with pytest.raises(UserError):
        output_dir_from(["--output-dir"])


# ---- the decision after a trainer ends (a pure function: no process needed) ----------------


def _decide(returncode, state, stopping=False, new_checkpoint=False, failures=0):
    from atom_train.supervise import decide

    return decide(
        returncode,
        state,
        stopping=stopping,
        new_checkpoint=new_checkpoint,
        failures=failures,
        max_failures=5,
        backoff=1.0,
        max_backoff=8.0,
    )


@pytest.mark.parametrize(
    ("returncode", "state", "stopping", "action", "code"),
    [
        (0, "completed", False, "complete", 0),
        (0, "stopped", False, "end", 0),  # a signal sent to the trainer directly
        (0, None, False, "end", 1),  # exit 0 without a fresh status.json: cannot tell
        (0, "running", False, "end", 1),
        (2, "failed", False, "end", 2),  # a user error: a relaunch cannot help
        (0, "completed", True, "end", 0),  # --on-complete skipped after a stop request
        (0, "stopped", True, "end", 0),
        (1, "running", True, "end", 1),  # asked to stop, did not stop cleanly
        (1, "running", False, "relaunch", 0),
        (-9, None, False, "relaunch", 0),  # killed (OOM killer, kill -9): a crash
        (3, "diverged", False, "end", 3),  # diverged: the same rate diverges again
        (3, "diverged", True, "end", 3),  # (said as a divergence, whatever the stop)
        (3, "running", False, "end", 3),  # exit 3 without the account: still no relaunch
        (0, "diverged", False, "end", 3),  # never taken for a completion
    ],
)
def test_decision_after_the_trainer_ends(returncode, state, stopping, action, code):
    d = _decide(returncode, state, stopping=stopping)
    assert (d.action, d.code) == (action, code), d.message


def test_backoff_doubles_to_its_cap_and_a_checkpoint_resets_it():
    delays, failures = [], 0
    for _ in range(4):
        d = _decide(1, "running", failures=failures)
        delays.append(d.delay)
        failures = d.failures
    assert delays == [1.0, 2.0, 4.0, 8.0] and failures == 4
    d = _decide(1, "running", new_checkpoint=True, failures=failures)
    assert d.action == "relaunch" and d.failures == 0 and d.delay == 1.0
    assert "failure count reset" in d.message
    d = _decide(1, "running", failures=4)
    assert d.action == "end" and d.code == 1 and d.message.startswith("giving up: 5 crashes")


# ---- what feeds the decision, in process (make mutants mutates these) ----------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "x"], "missing `--` before the train args (got '--data', which looks like"),
        ([], "missing `--` before the train args: python -m atom_train.supervise"),
        (["--"], "no train args after `--`"),
        (["--backoff", "-1", "--", "x"], "--backoff must be >= 0, got -1.0"),
        (["--backoff", "5", "--max-backoff", "2", "--", "x"], "--max-backoff (2.0) must be >= "),
        (["--max-failures", "0", "--", "x"], "--max-failures must be >= 1, got 0"),
        (["--nproc-per-node", "0", "--", "x"], "--nproc-per-node must be >= 1, got 0"),
        (["--torchrun-arg=--foo", "--", "x"], "--torchrun-arg needs --nproc-per-node"),
        (["--module", "no_such_module_xyz", "--", "x"], "no module named 'no_such_module_xyz'"),
    ],
)
def test_the_command_line_is_refused_with_the_fix(argv, message):
    from atom_train.supervise import parse_command_line

    with pytest.raises(UserError) as e:
        parse_command_line(argv)
    assert message in str(e.value), str(e.value)


def test_a_good_command_line_splits_at_the_double_dash():
    from atom_train.supervise import parse_command_line

    ns, train_args = parse_command_line(["--backoff", "2", "--", "--data", "x", "--", "y"])
    assert ns.backoff == 2.0 and train_args == ["--data", "x", "--", "y"]
    ns, _ = parse_command_line(["--backoff", "2", "--max-backoff", "2", "--", "x"])
    assert ns.max_backoff == 2.0
    # The smallest values each option takes.
    ns, _ = parse_command_line(
        ["--backoff", "0", "--max-failures", "1", "--nproc-per-node", "1", "--", "x"]
    )
    assert (ns.backoff, ns.max_failures, ns.nproc_per_node) == (0.0, 1, 1)


def test_the_command_lines_refusals_word_for_word():
    from atom_train.supervise import parse_command_line

    for argv, message in [
        ([], "missing `--` before the train args: python -m atom_train.supervise [options] "
             "-- --corpus data/fr --output-dir runs/fr1 ..."),
        (["--"], "no train args after `--` (e.g. -- --corpus data/fr --output-dir runs/fr1)"),
        (["--torchrun-arg=--x", "--", "y"], "--torchrun-arg needs --nproc-per-node"),
    ]:  # fmt: skip
        with pytest.raises(UserError) as e:
            parse_command_line(argv)
        assert str(e.value) == message


def test_an_exit_is_described_by_its_code_or_signal():
    from atom_train.supervise import _describe_exit

    assert _describe_exit(0) == "exit code 0" and _describe_exit(17) == "exit code 17"
    assert _describe_exit(-9) == "killed by SIGKILL (the OOM killer, or kill -9?)"
    assert _describe_exit(-15) == "killed by SIGTERM"
    assert _describe_exit(-200) == "killed by signal 200"


def test_status_counts_only_when_written_during_this_launch(tmp_path):
    from atom_train.supervise import _file_stamp, _read_status

    status = tmp_path / "status.json"
    assert _read_status(status, None) is None  # no file
    status.write_text('{"status": "completed"}')
    before = _file_stamp(status)
    assert _read_status(status, before) is None  # the previous launch's
    status.unlink()
    status.write_text('{"status": "stopped"}')  # rewritten: a new file
    assert _read_status(status, before) == {"status": "stopped"}
    for text in ("not json", "[1, 2]"):
        status.unlink()
        status.write_text(text)
        assert _read_status(status, None) is None


def test_the_checkpoint_set_names_sizes_and_times_only_checkpoints(tmp_path):
    from atom_train.supervise import checkpoint_set

    assert checkpoint_set(tmp_path / "missing") == frozenset()
    (tmp_path / "ckpt-rolling.safetensors").write_bytes(b"abc")
    (tmp_path / ".ckpt-rolling.safetensors.tmp-1").write_bytes(b"partial")
    (tmp_path / "status.json").write_text("{}")
    st = (tmp_path / "ckpt-rolling.safetensors").stat()
    assert checkpoint_set(tmp_path) == {("ckpt-rolling.safetensors", 3, st.st_mtime_ns)}


@pytest.mark.parametrize(
    ("returncode", "state", "stopping", "message"),
    [
        (0, "completed", False, "training completed ({where})"),
        (0, "stopped", False, "trainer stopped cleanly ({where}) after a signal sent to it "
                              "directly; not relaunching"),
        (0, "running", False, "trainer exited 0 but {status} is missing, not rewritten, or says "
                              "'running': cannot tell whether training completed; not "
                              "relaunching; {logs}"),
        (2, "failed", False, "trainer exited 2 (a usage error: bad flag, data or config, or the "
                             "output dir is locked by another trainer): {error}; relaunching "
                             "cannot help; {logs}"),
        (0, "completed", True, "training completed ({where}); a stop was requested, so "
                               "--on-complete is skipped"),
        (0, "stopped", True, "trainer stopped cleanly ({where}); not relaunching"),
        (-15, "running", True, "trainer did not stop cleanly (killed by SIGTERM); not "
                               "relaunching because a stop was requested; {logs}"),
        (1, "running", False, "the trainer crashed: {error}; crash 1 of 5 in a row without a "
                              "new checkpoint; relaunching in 1s"),
    ],
)  # fmt: skip
def test_each_decision_says_what_happened_and_what_follows(returncode, state, stopping, message):
    """The words the supervisor logs for each outcome (its placeholders are filled in by the
    caller: {where}, {status}, {logs})."""
    assert _decide(returncode, state, stopping=stopping).message == message


def test_giving_up_names_the_count_and_the_last_exit():
    d = _decide(-9, None, failures=4)
    assert d.action == "end" and d.code == 1 and d.failures == 5
    assert d.message == (
        "giving up: 5 crashes in a row wrote no new checkpoint (last: killed by SIGKILL (the "
        "OOM killer, or kill -9?): {error}); fix the cause, then rerun the same command to "
        "resume; {logs}"
    )


def test_a_crash_after_a_new_checkpoint_says_the_count_was_reset():
    d = _decide(1, "running", new_checkpoint=True, failures=3)
    assert d.message == (
        "the trainer crashed: {error}; crash after a new checkpoint (failure count reset); "
        "relaunching in 1s"
    )


def test_the_checkpoint_set_looks_past_other_files(tmp_path, monkeypatch):
    """Whatever order the folder lists its entries in, every checkpoint is seen."""
    from atom_train import supervise

    for name in ("status.json", "ckpt-final.safetensors", ".x.tmp-1"):
        (tmp_path / name).write_bytes(b"x")
    real = supervise.os.scandir
    monkeypatch.setattr(
        supervise.os, "scandir", lambda d: sorted(real(d), key=lambda e: e.name != "status.json")
    )
    assert [name for name, _, _ in supervise.checkpoint_set(tmp_path)] == ["ckpt-final.safetensors"]


def test_the_checkpoint_set_skips_a_checkpoint_renamed_away_while_it_looked(tmp_path, monkeypatch):
    """A checkpoint listed and then renamed away (the trainer's rotation) before its size is
    read is skipped; the ones after it in the listing are still seen."""
    from atom_train import supervise

    for name in ("ckpt-rolling.safetensors", "ckpt-final.safetensors"):
        (tmp_path / name).write_bytes(b"xy")
    real = supervise.os.scandir

    def listing(d):
        entries = sorted(real(d), key=lambda e: e.name != "ckpt-rolling.safetensors")
        (tmp_path / "ckpt-rolling.safetensors").unlink()  # (gone after the listing)
        return entries

    monkeypatch.setattr(supervise.os, "scandir", listing)
    assert [(n, size) for n, size, _ in supervise.checkpoint_set(tmp_path)] == [
        ("ckpt-final.safetensors", 2)
    ]


def test_a_trainer_that_cannot_start_is_not_relaunched_unless_it_wrote_a_checkpoint():
    from atom_train.supervise import decide

    kw = dict(stopping=False, failures=0, max_failures=5, backoff=1.0, max_backoff=8.0)
    d = decide(1, None, new_checkpoint=False, cannot_start=True, **kw)
    assert (d.action, d.code) == ("end", 1) and "cannot start" in d.message
    # (a launch that wrote a checkpoint of its own did start, whatever else it says)
    assert decide(1, None, new_checkpoint=True, cannot_start=True, **kw).action == "relaunch"
    # A user error stays a user error, however soon it comes.
    assert decide(2, None, new_checkpoint=False, cannot_start=True, **kw).code == 2


def test_the_last_error_line_is_the_text_a_trainer_wrote_last():
    from atom_train.supervise import last_error_line

    tail = b"[train] tick 16\r\n 50%|\x1b[32m###\x1b[0m| 8/16\rKeyError: 'x'\r\n\r\n"
    assert last_error_line(tail) == "KeyError: 'x'"
    # A trainer killed without a word: its last line is a progress row, not the reason.
    tail = (b"[train] warning: the loader waited 40% of the time\n"
            b"[train] tick 40000/150000 loss 2.1 train_bpb 3.0 bytes_per_s 9,000 eta_s 2h\n"
            b" 27%|##7       | 40000/150000\r")  # fmt: skip
    assert last_error_line(tail) == "[train] warning: the loader waited 40% of the time"
    assert last_error_line(b"[train] tick 40000/150000 loss 2.1\n") is None
    assert last_error_line(b"") is None
