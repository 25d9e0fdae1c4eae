"""A stand-in for `python -m atom_train.train` that honours the supervisor contract (tests only).

Run as `python -m fake_trainer` (with tests/ on PYTHONPATH) or as a script. Standard library
only, so a launch costs a bare interpreter start.

Contract kept (docs/architecture.md): `--output-dir DIR`; checkpoints `DIR/*.safetensors`
written atomically through dot-files (contents: JSON `{"tick": t}`); a run resumes from
`ckpt-rolling.safetensors`; SIGTERM/SIGINT = checkpoint, `status.json` "stopped", exit 0;
SIGUSR1 = checkpoint at the next tick and keep going; completion = `ckpt-final.safetensors`,
`status.json` "completed", exit 0; exit 2 = usage error.

What each launch does comes from FAKE_PLAN, a comma-separated list read by launch number
(the last entry repeats): `run` (train to --ticks), `crash@N` (train, crash at tick N),
`crash` (exit 1 at once), `ckpt-crash` (write a checkpoint, exit 1), `sigkill` (die by
SIGKILL), `usage` (exit 2), `exit0` (exit 0 without writing status.json), `serve` (train until stopped), `stubborn` (serve, ignore SIGTERM),
`orphan-crash` (start a child that sleeps, exit 1 leaving it behind).

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


def count_launches(out: Path) -> int:
    try:
        lines = (out / EVENTS).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    return sum(json.loads(line)["event"] == "start" for line in lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", default="runs/atom", help="run directory")
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
    tick = json.loads(rolling.read_text())["tick"] if rolling.exists() else 0
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
        atomic_write(rolling, json.dumps({"tick": tick}))
        record(out, launch, "checkpoint", tick=tick, reason=reason)

    if action == "usage":
        print("fake_trainer: error: no file matches 'x': check --data", file=sys.stderr)
        record(out, launch, "exit", code=2)
        return 2
    if action == "crash":
        return crash()
    if action == "ckpt-crash":
        tick += 1
        checkpoint("before crash")
        return crash()
    if action == "exit0":  # a broken trainer: exit 0 without writing status.json
        record(out, launch, "exit", code=0)
        return 0
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
        time.sleep(args.tick_seconds)
        tick += 1
        if tick % args.ckpt_every == 0:
            checkpoint("schedule")
    final = out / FINAL
    atomic_write(final, json.dumps({"tick": tick}))
    atomic_write(
        out / STATUS,
        json.dumps({"status": "completed", "tick": tick, "checkpoint": str(final)}),
    )
    record(out, launch, "exit", code=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
