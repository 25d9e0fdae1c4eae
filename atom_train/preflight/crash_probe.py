"""A trainer that crashes at once, for measuring the supervisor: ``python -m
atom_train.supervise --module atom_train.preflight.crash_probe -- --output-dir DIR``.

Each launch appends its start time (``time.monotonic()``, comparable across processes on
Linux) and attempt number to ``DIR/crash_probe.jsonl``, writes status.json as a trainer does
once it trains (so the supervisor sees a crash of a run that had started, not a trainer that
cannot start, which it would not relaunch), writes no checkpoint and exits 1: a crash that
makes no progress, which the supervisor relaunches after its back-off, doubling, until it
gives up. The pre-flight (`preflight.probes.measure_backoff`) reads the
gaps between launches: the back-off really waited, or it did not. Torch-free: a launch costs
little more than a bare interpreter start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    add_output_dir_argument,
    output_dir_from,
)
from atom_train.trainer.rundir import write_status

LAUNCHES = "crash_probe.jsonl"
ATTEMPT_ENV = "ATOM_SUPERVISE_ATTEMPT"  # (set by the supervisor for each launch)
CRASH_CODE = 1


def build_parser() -> argparse.ArgumentParser:
    """Its one flag, declared as the trainer declares it (`output_dir_from` reads it so from a
    trainer's whole command line)."""
    p = ArgumentParser(
        prog="python -m atom_train.preflight.crash_probe",
        description="A trainer that crashes at once (the pre-flight's supervisor probe).",
    )
    add_output_dir_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    t = time.monotonic()
    try:
        out = output_dir_from(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"crash_probe: error: {e}", file=sys.stderr)
        return 2
    line = {"t": t, "attempt": os.environ.get(ATTEMPT_ENV), "pid": os.getpid()}
    with open(out / LAUNCHES, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    write_status(out, "running", tick=0, crash_probe=True)
    return CRASH_CODE


if __name__ == "__main__":
    sys.exit(main())
