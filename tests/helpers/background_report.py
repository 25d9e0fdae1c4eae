"""The kernel report that tests/commands/test_kernel_report.py checks, compiled in the
background while the other tests run.

The report is about two minutes of CPU (30 sm_90 compiles) and needs nothing from the other
tests, which keep only ~1.2 of this machine's 2 cores busy on average (pytest here: 17 min
of user time in 15 min). So when that module is selected, conftest starts the report as the
session begins, at the lowest CPU priority (nice 19: it takes only what the tests leave
idle), and runs the module's tests last; its fixture then collects the report, usually
already done. Run alone (``pytest tests/commands/test_kernel_report.py``) it is the same
report, just not overlapped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import IO

from helpers.trainer_kit import REPO

MODULE = "test_kernel_report.py"
REPORT_ARGS = ["--variants", "quick", "-B", "1024,4096", "--json"]


@dataclass
class _Running:
    proc: subprocess.Popen
    out: IO[bytes]
    err: IO[bytes]


_running: _Running | None = None


def selected(nodeid: str) -> bool:
    """Whether a collected test belongs to the module that reads the report."""
    return nodeid.split("::", 1)[0].endswith(MODULE)


def start() -> None:
    """Start the report (once per session), niced, its output into temporary files."""
    global _running
    if _running is not None:
        return
    # Compiled for the GPU, not interpreted: the report never runs a kernel.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Open past this call: stop() closes them when the session ends.
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "atom_train.kernel_report", *REPORT_ARGS],
        cwd=REPO,
        env=env,
        stdout=out,
        stderr=err,
        preexec_fn=lambda: os.nice(19),
        start_new_session=True,  # its own group: stop() ends its compiler processes too
    )
    _running = _Running(proc, out, err)


def result(timeout_s: float = 900) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the report, started now if it was not."""
    start()
    assert _running is not None
    code = _running.proc.wait(timeout=timeout_s)
    texts = []
    for f in (_running.out, _running.err):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    return code, texts[0], texts[1]


def stop() -> None:
    """End a report still compiling (the session ended first: a failure with -x, Ctrl-C)."""
    global _running
    if _running is None:
        return
    if _running.proc.poll() is None:
        os.killpg(_running.proc.pid, signal.SIGKILL)
        _running.proc.wait()
    _running.out.close()
    _running.err.close()
    _running = None
