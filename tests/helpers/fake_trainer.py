"""A stand-in for `python -m atom_train.train` that honours the supervisor contract (tests only).

Run as `python -m fake_trainer` (with tests/ on PYTHONPATH) or as a script. Standard library
only, so a launch costs a bare interpreter start.

Contract kept (docs/architecture.md): `--output-dir DIR`; checkpoints `DIR/*.safetensors`
written atomically through dot-files (a safetensors header whose metadata holds the tick
and the supervisor's launch id, `ATOM_LAUNCH_ID`, as the trainer's does); a run resumes
from `ckpt-rolling.safetensors`; `status.json` "running" before the first window;
SIGTERM/SIGINT = checkpoint, `status.json` "stopped", exit 0; SIGUSR1 = checkpoint at the
next tick and keep going; completion = `ckpt-final.safetensors`, `status.json` "completed",
exit 0; exit 2 = usage error.

What each launch does comes from FAKE_PLAN, a comma-separated list read by launch number
(the last entry repeats): `run` (train to --ticks), `crash@N` (train, crash at tick N),
`crash` (start training, exit 1 at once), `diverge@N` (train, then at tick N stop as the
trainer's divergence guard stops a run: status.json "diverged" with its account, exit 3),
`exit3` (exit 3 with no such account), `ckpt-crash` (write a checkpoint, exit 1),
`foreign-ckpt-crash` (another process writes a checkpoint meanwhile, exit 1), `sigkill` (die
by SIGKILL), `usage` (exit 2), `exit0` (exit 0 without writing status.json), `cannot-start`
(an import error: a traceback, exit 1, before any status.json), `serve` (train until
stopped), `stubborn` (serve, ignore SIGTERM), `orphan-crash` (start a child that sleeps,
exit 1 leaving it behind).

Every launch appends events to `DIR/fake_events.jsonl` (`start`, `signal`, `checkpoint`,
`exit`, `orphan`), with `time.monotonic()` stamps comparable across processes on Linux.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from atom_train.common.cli import EXIT_DIVERGED, LAUNCH_ID_ENV
from atom_train.trainer.rundir import FINAL, ROLLING, STATUS

EVENTS = "fake_events.jsonl"


def record(out: Path, launch: int, event: str, **fields: object) -> None:
    line = {"launch": launch, "event": event, "t": time.monotonic(), **fields}
    with open(out / EVENTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_checkpoint(path: Path, tick: int, launch: str | None) -> None:
    """A checkpoint file as far as the supervisor reads one: a safetensors header (8-byte
    length, JSON) whose metadata holds the atom metadata (`training.tick`, `.launch`)."""
    atom = json.dumps({"training": {"tick": tick, "launch": launch}})
    header = json.dumps({"__metadata__": {"format": "atom.checkpoint", "atom": atom}}).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(len(header).to_bytes(8, "little") + header)
    os.replace(tmp, path)


def read_tick(path: Path) -> int:
    n = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + n])
    return json.loads(header["__metadata__"]["atom"])["training"]["tick"]


def count_launches(out: Path) -> int:
    try:
        lines = (out / EVENTS).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    return sum(json.loads(line)["event"] == "start" for line in lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", required=True, help="run directory")
    p.add_argument("--ticks", type=int, default=10, help="ticks to complete")
    p.add_argument("--ckpt-every", type=int, default=3, help="rolling checkpoint period")
    p.add_argument("--tick-seconds", type=float, default=0.01, help="time per tick")
    args = p.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    launch = count_launches(out) + 1
    plan = os.environ.get("FAKE_PLAN", "run").split(",")
    action = plan[min(launch, len(plan)) - 1]
    rolling = out / ROLLING
    tick = read_tick(rolling) if rolling.exists() else 0
    launch_id = os.environ.get(LAUNCH_ID_ENV)
    record(
        out,
        launch,
        "start",
        action=action,
        resumed_from=tick if rolling.exists() else None,
        pid=os.getpid(),
        sid=os.getsid(0),
        attempt=os.environ.get("ATOM_SUPERVISE_ATTEMPT"),
    )

    def crash(code: int = 1) -> int:
        record(out, launch, "exit", code=code)
        print(f"fake_trainer: simulated crash at tick {tick}", file=sys.stderr)
        return code

    def checkpoint(reason: str) -> None:
        write_checkpoint(rolling, tick, launch_id)
        record(out, launch, "checkpoint", tick=tick, reason=reason)

    if action == "cannot-start":  # what python prints when the trainer's imports fail
        print("Traceback (most recent call last):", file=sys.stderr)
        print('  File "<frozen runpy>", line 198, in _run_module_as_main', file=sys.stderr)
        print("ModuleNotFoundError: No module named 'fake_missing_dependency'", file=sys.stderr)
        record(out, launch, "exit", code=1)
        return 1
    if action == "usage":
        print("fake_trainer: error: no file matches 'x': check --data", file=sys.stderr)
        record(out, launch, "exit", code=2)
        return 2
    if action == "exit0":  # a broken trainer: exit 0 without writing status.json
        record(out, launch, "exit", code=0)
        return 0
    # Set up: the first window comes next (the real trainer writes this status there).
    atomic_write(out / STATUS, json.dumps({"status": "running", "tick": tick}))
    if action == "crash":
        return crash()
    if action == "exit3":
        record(out, launch, "exit", code=EXIT_DIVERGED)
        return EXIT_DIVERGED
    if action == "ckpt-crash":
        tick += 1
        checkpoint("before crash")
        return crash()
    if action == "foreign-ckpt-crash":  # another trainer's checkpoint lands meanwhile
        write_checkpoint(out / f"snapshot-{launch:012d}.safetensors", tick, "someone-else")
        return crash()
    if action == "sigkill":
        record(out, launch, "exit", code=-9)
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "orphan-crash":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        record(out, launch, "orphan", pid=child.pid)
        return crash()

    received: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda signum, frame: received.append(signum))
    crash_at = int(action.split("@")[1]) if action.startswith("crash@") else None
    diverge_at = int(action.split("@")[1]) if action.startswith("diverge@") else None
    endless = action in ("serve", "stubborn")
    while endless or tick < args.ticks:
        # Record everything that arrived before acting, so a duplicate signal is visible.
        pending = [received.pop(0) for _ in range(len(received))]
        for sig in pending:
            record(out, launch, "signal", name=signal.Signals(sig).name)
        for sig in pending:
            if sig == signal.SIGUSR1:
                checkpoint("SIGUSR1")
            elif action != "stubborn":
                checkpoint("stop")
                atomic_write(
                    out / STATUS,
                    json.dumps({"status": "stopped", "tick": tick, "checkpoint": str(rolling)}),
                )
                record(out, launch, "exit", code=0)
                return 0
        if tick == crash_at:
            return crash()
        if tick == diverge_at:
            return diverged(out, launch, tick, rolling)
        time.sleep(args.tick_seconds)
        tick += 1
        if tick % args.ckpt_every == 0:
            checkpoint("schedule")
    final = out / FINAL
    write_checkpoint(final, tick, launch_id)
    atomic_write(
        out / STATUS,
        json.dumps({"status": "completed", "tick": tick, "checkpoint": str(final)}),
    )
    record(out, launch, "exit", code=0)
    return 0


def diverged(out: Path, launch: int, tick: int, rolling: Path) -> int:
    """Stop as the trainer does when its divergence guard gives up: status.json "diverged"
    with the account of it (`divergence.stop_record`'s form, written out here), exit 3."""
    healthy = read_tick(rolling) if rolling.exists() else None
    account = {
        "verdict": {"signal": "loss_spike", "what": "loss", "step": tick, "tick": tick,
                    "began_step": (healthy or 0) + 1, "began_tick": healthy or 0,
                    "value": 9.51, "threshold": 2.594, "baseline": 2.183},
        "reason": "2 rewinds within 40 ticks already (--max-rewinds 2)",
        "rewinds": [{"tick": tick - 20, "to_tick": tick - 30, "lr": [0.04, 0.02]},
                    {"tick": tick - 10, "to_tick": tick - 30, "lr": [0.02, 0.01]}],
        "last_healthy": None if healthy is None
        else {"checkpoint": str(rolling), "tick": healthy, "step": healthy},
    }  # fmt: skip
    status = {"status": "diverged", "tick": tick, "checkpoint": str(rolling), "divergence": account}
    atomic_write(out / STATUS, json.dumps(status))
    print(f"fake_trainer: diverged at tick {tick}", file=sys.stderr)
    record(out, launch, "exit", code=EXIT_DIVERGED)
    return EXIT_DIVERGED


if __name__ == "__main__":
    sys.exit(main())
