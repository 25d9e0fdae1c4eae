"""Supervisor for the trainer: relaunch after a crash, forward signals, stop cleanly.

Usage::

    python -m atom_train.supervise [options] -- <train args>

Examples::

    # Train under supervision; everything after `--` goes to `python -m atom_train.train`.
    python -m atom_train.supervise -- --corpus data/fr -B 256 --output-dir runs/fr1

    # Power the box off when training completes (not after a stop or a give-up).
    python -m atom_train.supervise --on-complete 'sudo poweroff' -- --corpus data/fr \\
        --output-dir runs/fr1

    # Several processes: torchrun with 4 ranks on this node (B/4 streams each); a crash of
    # any rank ends the world, and the relaunch restarts it from the last checkpoint.
    python -m atom_train.supervise --nproc-per-node 4 -- --corpus data/fr -B 1024 \\
        --device cuda --output-dir runs/fr4

    # Operate a running supervisor (it forwards to the trainer):
    kill -USR1 "$(cat runs/fr1/supervisor.pid)"   # checkpoint at the next window, keep going
    kill -TERM "$(cat runs/fr1/supervisor.pid)"   # checkpoint, stop, do not relaunch

Behaviour (the trainer's contract is in docs/architecture.md, the runbook in
docs/supervisor.md):

- The trainer runs as ``<this python> -m <--module> <train args>`` in its own session, so a
  terminal Ctrl-C reaches only the supervisor, which forwards it once as SIGTERM.
- SIGTERM, SIGINT and SIGHUP (unless ignored, e.g. under nohup) are forwarded as SIGTERM; the
  supervisor then waits for the trainer and never relaunches. A third stop signal kills a
  trainer that does not stop (SIGKILL). SIGUSR1 is forwarded as is.
- The trainer's stderr passes through the supervisor (a pseudo-terminal when the
  supervisor's stderr is one, so the progress bar still shows), which keeps its last lines:
  every end of a trainer is logged with its last error line.
- A trainer that **cannot start** (it ends, other than cleanly or with exit code 2, within
  `CANNOT_START_S` and before its first window, i.e. without writing status.json: an import
  error, a missing module, a broken environment) ends the supervision at once, exit 1, with
  its error line: the same command would fail the same way, so it is fixed, then rerun.
- A **crash** (any other exit code than 0 and 2, or death by a signal, once training ran) is
  relaunched after a backoff that doubles from --backoff to --max-backoff and resets whenever
  the launch wrote a new checkpoint; after --max-failures crashes in a row that wrote no new
  checkpoint it gives up. Only checkpoints the supervisor's own child wrote count (each
  launch has an id, `ATOM_LAUNCH_ID`, that the trainer records in its checkpoints): another
  process writing in the folder never resets the count. Exit code 2 from the trainer (a user
  error) is passed through without a relaunch.
- Exit 0 with status.json "completed" runs --on-complete (once); "stopped" ends supervision.
- A run that **diverged** (the trainer's exit code 3, status.json "diverged": its divergence
  guard gave up, docs/divergence.md) is not relaunched (the same data at the same rate
  diverges again) and runs no --on-complete: the supervisor says what diverged, when, what
  was tried and which checkpoint is the last healthy one, and exits 3.
- With --nproc-per-node N the trainer is ``python -m torch.distributed.run
  --nproc-per-node N [--torchrun-arg ...] -m <--module> <train args>``: stop signals go to
  torchrun (which forwards SIGTERM to every rank), SIGUSR1 to the ranks themselves (torchrun
  would die of it), and the exit code that counts is rank 0's (torchrun reports 1 for any
  failure), read from ``<output dir>/.trainer-exit-code``.
- Each event is a timestamped line on stderr and in ``<output dir>/supervisor.log``;
  ``<output dir>/supervisor.pid`` holds the supervisor's pid while it runs.
- If the supervisor itself dies (even by SIGKILL), the trainer receives SIGTERM (Linux).

Exit codes: 0 = training completed, or stopped cleanly on request; 1 = gave up after repeated
crashes, the trainer cannot start, did not stop cleanly, or --on-complete failed; 2 = a usage error (of the
supervisor, or the trainer's exit code 2 passed through); 3 = the run diverged (the trainer's
exit code 3 passed through). POSIX only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import datetime
import fcntl
import importlib.util
import json
import os
import re
import secrets
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

from atom_train.common.cli import (
    EXIT_CODE_FILE_ENV,
    EXIT_DIVERGED,
    EXIT_USER_ERROR,
    LAUNCH_ID_ENV,
    ArgumentParser,
    UserError,
    format_duration,
    message,
    output_dir_from,
    read_exit_code,
    set_command,
    user_error_exit,
)
from atom_train.trainer.divergence import DIVERGED, describe_stop
from atom_train.trainer.rundir import STATUS, checkpoint_launch, is_checkpoint_name

DEFAULT_MODULE = "atom_train.train"
LOG_NAME = "supervisor.log"
EXIT_CODE_NAME = ".trainer-exit-code"
PID_NAME = "supervisor.pid"
STATUS_NAME = STATUS
USAGE_ERROR = EXIT_USER_ERROR  # the trainer's "relaunching cannot help" exit code
FORCE_KILL_AFTER = 3  # the n-th stop signal kills a trainer that has not stopped
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Environment given to the trainer (informational: which launch this is, and who runs it).
ENV_ATTEMPT = "ATOM_SUPERVISE_ATTEMPT"
ENV_SUPERVISOR_PID = "ATOM_SUPERVISOR_PID"
# A trainer that ends this soon after its launch, before its first window (no status.json
# written), cannot start: the supervision ends (see the module docstring).
CANNOT_START_S = 60.0
TAIL_BYTES = 16384  # the end of the trainer's stderr kept for its last error line


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m atom_train.supervise",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] -- <train args>",
        description=(
            "Run the trainer, relaunch it after a crash (with a backoff that really waits),\n"
            "forward SIGTERM/SIGINT/SIGUSR1 to it, and never relaunch after a clean stop.\n"
            "Everything after `--` is passed to the trainer. Events are logged to stderr and\n"
            "to <output dir>/supervisor.log; <output dir>/supervisor.pid holds our pid."
        ),
        epilog=(
            "exit codes: 0 training completed, or stopped cleanly on request\n"
            "            1 gave up after repeated crashes, the trainer cannot start, unclean "
            "stop,\n              --on-complete failed\n"
            "            2 usage error (also the trainer's exit code 2, passed through)\n"
            "            3 the run diverged (the trainer's exit code 3, passed through)\n"
            "example:    python -m atom_train.supervise -- --corpus data/fr "
            "--output-dir runs/fr1"
        ),
    )
    p.add_argument(
        "--module",
        default=DEFAULT_MODULE,
        help="module to run as `<this python> -m MODULE <train args>` (default: %(default)s)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait before the first relaunch; doubles with each crash in a row that wrote no "
        "new checkpoint (default: %(default)s)",
    )
    p.add_argument(
        "--max-backoff",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="upper bound of the backoff (default: %(default)s)",
    )
    p.add_argument(
        "--max-failures",
        type=int,
        default=5,
        metavar="N",
        help="give up after N crashes in a row that wrote no new checkpoint; a crash that "
        "wrote one resets the count (default: %(default)s)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="launch the trainer with torchrun (`python -m torch.distributed.run`), N ranks "
        "on this node; a relaunch restarts the whole world from the last checkpoint",
    )
    p.add_argument(
        "--torchrun-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra torchrun flag, repeatable, e.g. --torchrun-arg=--nnodes=2 "
        "--torchrun-arg=--rdzv-endpoint=host:29400 (needs --nproc-per-node)",
    )
    p.add_argument(
        "--on-complete",
        metavar="CMD",
        help="shell command run once after training completes (not after a stop), e.g. "
        "'sudo poweroff'; it sees ATOM_STATUS, ATOM_TICK, ATOM_CHECKPOINT, ATOM_OUTPUT_DIR",
    )
    return p


def parse_command_line(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split `[options] -- <train args>` and validate the supervisor's options."""
    if "--" in argv:
        split = argv.index("--")
        ns = build_parser().parse_args(argv[:split])  # --help prints and exits 0 here
        train_args = argv[split + 1 :]
    else:
        ns, unknown = build_parser().parse_known_args(argv)
        hint = f" (got {unknown[0]!r}, which looks like a train arg)" if unknown else ""
        raise UserError(
            f"missing `--` before the train args{hint}: python -m atom_train.supervise "
            "[options] -- --corpus data/fr --output-dir runs/fr1 ..."
        )
    if not train_args:
        raise UserError("no train args after `--` (e.g. -- --corpus data/fr --output-dir runs/fr1)")
    if ns.backoff < 0:
        raise UserError(f"--backoff must be >= 0, got {ns.backoff}")
    if ns.max_backoff < ns.backoff:
        raise UserError(f"--max-backoff ({ns.max_backoff}) must be >= --backoff ({ns.backoff})")
    if ns.max_failures < 1:
        raise UserError(f"--max-failures must be >= 1, got {ns.max_failures}")
    if ns.nproc_per_node is not None and ns.nproc_per_node < 1:
        raise UserError(f"--nproc-per-node must be >= 1, got {ns.nproc_per_node}")
    if ns.torchrun_arg and ns.nproc_per_node is None:
        raise UserError("--torchrun-arg needs --nproc-per-node")
    try:
        found = importlib.util.find_spec(ns.module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UserError(f"no module named {ns.module!r}: check --module (and the environment)")
    return ns, train_args


def checkpoint_set(run_dir: Path) -> frozenset[tuple[str, int, int]]:
    """(name, size, mtime_ns) of the non-hidden checkpoints: a change = a new checkpoint."""
    found = set()
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return frozenset()
    for entry in entries:
        if not is_checkpoint_name(entry.name):
            continue
        try:
            st = entry.stat()
        except OSError:  # renamed away while we looked
            continue
        found.add((entry.name, st.st_size, st.st_mtime_ns))
    return frozenset(found)


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux: /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_status(path: Path, before: tuple[int, int, int] | None) -> dict | None:
    """status.json if the trainer wrote it during this launch, else None."""
    if _file_stamp(path) in (before, None):
        return None
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def _divergence_line(status: dict | None) -> str | None:
    """What a diverged run's status.json says of it (`divergence.describe_stop`), or None."""
    record = status.get("divergence") if status else None
    if not isinstance(record, dict):
        return None
    try:
        return describe_stop(record)
    except (KeyError, TypeError, ValueError):
        return None


_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# The trainer's routine lines: its progress rows (`trainer.reporting`: "[train] tick T/N
# loss ...") and progress-bar redraws ("  40%|###  | ..."): never the reason it ended.
_ROUTINE = re.compile(r"^(\[train\] tick \d+/\d+ loss |\d+%\|)")


def last_error_line(tail: bytes) -> str | None:
    """The last line of text a trainer wrote on stderr (a traceback's last line is the
    error), without terminal escapes, progress-bar redraws and progress rows (a trainer
    killed without a word has a progress row last: the line above it is the one that
    says something); None if it wrote nothing else."""
    text = _ESCAPES.sub("", tail.decode("utf-8", errors="replace"))
    for line in reversed(re.split(r"[\r\n]+", text)):
        line = line.strip()
        if line and not _ROUTINE.match(line):
            return line if len(line) <= 300 else line[:297] + "..."
    return None


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = " (the OOM killer, or kill -9?)" if returncode == -signal.SIGKILL else ""
    return f"killed by {name}{hint}"


def _stderr_destination() -> str | None:
    """Where our stderr (and so the trainer's output) goes, if it is a file (Linux)."""
    try:
        target = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    return target if os.path.isfile(target) else None


def _make_pdeathsig_setup(parent_pid: int):
    """A preexec_fn that makes the kernel send the child SIGTERM if the supervisor dies.

    Without it, a supervisor killed by SIGKILL (or the OOM killer) would leave the trainer
    running unsupervised; with it, the trainer checkpoints and stops as on any SIGTERM.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def setup() -> None:  # runs in the child between fork and exec: keep it tiny
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the supervisor died before prctl took effect
            os._exit(1)

    return setup


class _PidFile:
    """supervisor.pid, held under flock so two supervisors cannot share a run dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(self.fd, 32).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise UserError(
                f"another supervisor (pid {other}) is running on {path.parent}: stop it first, "
                "or use another --output-dir"
            ) from None
        # A pid left in the file: the supervisor before us ended without removing it (killed
        # by SIGKILL, the OOM killer, the machine going down), so it could log nothing.
        self.left_by = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)


@dataclass(frozen=True)
class Decision:
    """What to do after a trainer ended: ``complete`` (run --on-complete), ``end`` (exit
    with `code`) or ``relaunch`` (after `delay` seconds). `message` is the log line, with
    ``{where}`` (tick and checkpoint) and ``{logs}`` (where the logs are) to fill in;
    ``{status}`` (status.json's path); `failures` is the new count of crashes in a row
    without a new checkpoint."""

    action: str
    message: str
    code: int = 0
    delay: float = 0.0
    failures: int = 0


def decide(
    returncode: int,
    state: str | None,
    *,
    stopping: bool,
    new_checkpoint: bool,
    failures: int,
    max_failures: int,
    backoff: float,
    max_backoff: float,
    cannot_start: bool = False,
    divergence: str | None = None,
) -> Decision:
    """The supervisor's rule, as a pure function of how the trainer ended (`returncode`,
    its status.json `state`), whether a stop was requested, whether the launch wrote a new
    checkpoint, whether it ended before it could start training (`cannot_start`), and the
    crashes in a row so far. ``{error}`` in a message is the trainer's last error line;
    `divergence`, the line of a diverged run's stop (`divergence.describe_stop` of its
    status.json)."""
    if returncode == EXIT_DIVERGED or state == DIVERGED:
        # (before a stop request: a run that diverged says so, however it was asked to end)
        said = divergence or (
            f"diverged ({_describe_exit(returncode)}), and {{status}} holds no account of it"
        )
        return Decision(
            "end",
            f"the run {said}; it stopped at {{where}}; not relaunching: the same data at the "
            "same rate diverges again; no --on-complete; {logs}",
            code=EXIT_DIVERGED,
        )
    if stopping:
        if returncode == 0:
            if state == "completed":
                return Decision(
                    "end",
                    "training completed ({where}); a stop was requested, so --on-complete is "
                    "skipped",
                )
            return Decision("end", "trainer stopped cleanly ({where}); not relaunching")
        return Decision(
            "end",
            f"trainer did not stop cleanly ({_describe_exit(returncode)}); not relaunching "
            "because a stop was requested; {logs}",
            code=1,
        )
    if returncode == 0:
        if state == "completed":
            return Decision("complete", "training completed ({where})")
        if state == "stopped":
            return Decision(
                "end",
                "trainer stopped cleanly ({where}) after a signal sent to it directly; not "
                "relaunching",
            )
        return Decision(
            "end",
            "trainer exited 0 but {status} is missing, not rewritten, or says "
            f"{state!r}: cannot tell whether training completed; not relaunching; {{logs}}",
            code=1,
        )
    if returncode == USAGE_ERROR:
        return Decision(
            "end",
            "trainer exited 2 (a usage error: bad flag, data or config, or the output dir is "
            "locked by another trainer): {error}; relaunching cannot help; {logs}",
            code=USAGE_ERROR,
        )
    if cannot_start and not new_checkpoint:
        return Decision(
            "end",
            f"the trainer cannot start ({_describe_exit(returncode)} {{elapsed}} after its "
            "launch, before its first window): {error}; not relaunching: the same command "
            "would fail the same way; fix it, then rerun the same command; {logs}",
            code=1,
            failures=failures,
        )
    failures = 0 if new_checkpoint else failures + 1
    if failures >= max_failures:
        return Decision(
            "end",
            f"giving up: {failures} crashes in a row wrote no new checkpoint (last: "
            f"{_describe_exit(returncode)}: {{error}}); fix the cause, then rerun the same "
            "command to resume; {logs}",
            code=1,
            failures=failures,
        )
    delay = min(backoff * 2 ** max(failures - 1, 0), max_backoff)
    if failures:
        count = f"crash {failures} of {max_failures} in a row without a new checkpoint"
    else:
        count = "crash after a new checkpoint (failure count reset)"
    return Decision(
        "relaunch",
        f"the trainer crashed: {{error}}; {count}; relaunching in {delay:g}s",
        delay=delay,
        failures=failures,
    )


class Supervisor:
    def __init__(self, ns: argparse.Namespace, train_args: list[str], run_dir: Path) -> None:
        self.ns = ns
        self.train_args = train_args
        self.run_dir = run_dir.absolute()  # absolute in logs: read later, from elsewhere
        self.log_path = self.run_dir / LOG_NAME
        self.status_path = self.run_dir / STATUS_NAME
        self.torchrun = ns.nproc_per_node is not None
        launcher = [sys.executable, "-m"]
        if self.torchrun:
            launcher += [
                "torch.distributed.run",
                f"--nproc-per-node={ns.nproc_per_node}",
                *ns.torchrun_arg,
                "-m",
            ]
        self.cmd = [*launcher, ns.module, *train_args]
        # torchrun exits 1 whatever its workers did: rank 0 writes its exit code here.
        self.exit_code_path = self.run_dir / EXIT_CODE_NAME
        self.signals: collections.deque[int] = collections.deque()
        self.stop_signals = 0  # stop signals received so far
        self.proc: subprocess.Popen | None = None
        self.proc_is_trainer = False
        self.child_err: int | None = None  # our end of the trainer's stderr
        self.tail = bytearray()  # the end of what the trainer wrote there
        self.launch_id = ""
        self._log_broken = False
        self._wake_r = self._wake_w = -1
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup_fd = -1

    # -- logging ---------------------------------------------------------------------------

    def log(self, text: str) -> None:
        """One event: ``[supervise] <time> <text>`` on stderr and in supervisor.log."""
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        line = message(f"{stamp} {text}")
        print(line, file=sys.stderr, flush=True)
        try:
            with open(self.log_path, "a", encoding="utf-8") as f:  # reopened: survives rotation
                f.write(line + "\n")
        except OSError as e:
            if not self._log_broken:  # a full disk must not kill the supervisor
                self._log_broken = True
                print(
                    message(f"cannot write {self.log_path}: {e}", "warning"),
                    file=sys.stderr,
                    flush=True,
                )

    def where_logs_are(self) -> str:
        where = f"supervisor log: {self.log_path}"
        dest = _stderr_destination()
        if dest is not None:
            where += f"; trainer output: {dest}"
        return where

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only records; the main loop acts on it (and the wakeup fd interrupts its select).
        self.signals.append(signum)

    def install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (*STOP_SIGNALS, signal.SIGUSR1, signal.SIGCHLD):
            old = signal.getsignal(sig)
            if sig in (signal.SIGINT, signal.SIGHUP) and old == signal.SIG_IGN:
                continue  # started with it ignored (nohup, `&`): respect that
            self._old_handlers[sig] = old
            signal.signal(sig, self._on_signal)

    def restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    @property
    def stopping(self) -> bool:
        return self.stop_signals > 0

    def _drain_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _handle_signals(self) -> None:
        """Act on the signals received since the last call (forward them to the child)."""
        while self.signals:
            sig = self.signals.popleft()
            if sig == signal.SIGCHLD:
                continue  # only a wakeup
            name = signal.Signals(sig).name
            proc = self.proc
            what = "trainer" if self.proc_is_trainer else "--on-complete command"
            if sig == signal.SIGUSR1:
                if proc is not None and self.proc_is_trainer:
                    # torchrun does not forward SIGUSR1 (it would die of it): the ranks get
                    # it directly, and decide together at the next window boundary.
                    for pid in _children(proc.pid) if self.torchrun else [proc.pid]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGUSR1)
                    self.log(
                        f"received SIGUSR1: forwarded to the trainer (pid {proc.pid}); it "
                        "writes a checkpoint at the next window boundary and keeps going"
                    )
                else:
                    self.log("received SIGUSR1 while no trainer is running: ignored")
                continue
            self.stop_signals += 1
            if proc is None:
                self.log(f"received {name}: stopping (no trainer is running)")
            elif self.stop_signals == 1:
                os.kill(proc.pid, signal.SIGTERM)
                self.log(
                    f"received {name}: forwarded SIGTERM to the {what} (pid {proc.pid}); "
                    "waiting for it to checkpoint and exit; will not relaunch"
                )
            elif self.stop_signals < FORCE_KILL_AFTER:
                left = FORCE_KILL_AFTER - self.stop_signals
                self.log(
                    f"received {name}: already stopping, waiting for the {what} (pid "
                    f"{proc.pid}); {left} more stop signal(s) kill it without a checkpoint"
                )
            else:
                self.log(f"received {name}: killing the {what} (pid {proc.pid}) with SIGKILL")
                self._kill_group(proc.pid, signal.SIGKILL)

    def _kill_group(self, pid: int, sig: int) -> None:
        if self.proc_is_trainer:  # the trainer leads its own process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _wait_for(self, seconds: float | None) -> None:
        """Block until a signal arrives (or SIGCHLD), at most `seconds`; meanwhile pass on
        what the trainer writes to its stderr."""
        fds = [self._wake_r] + ([self.child_err] if self.child_err is not None else [])
        ready, _, _ = select.select(fds, [], [], seconds)
        if self.child_err is not None and self.child_err in ready:
            self._pump()

    def _pump(self) -> bool:
        """Pass on one read of the trainer's stderr (kept in `tail` too); False at its end."""
        try:
            data = os.read(self.child_err, 65536)
        except OSError:  # EIO: a pseudo-terminal whose other side closed
            data = b""
        if not data:
            os.close(self.child_err)
            self.child_err = None
            return False
        with contextlib.suppress(OSError):
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), data)
        self.tail += data
        del self.tail[:-TAIL_BYTES]
        return True

    def _drain(self, seconds: float = 2.0) -> None:
        """After the trainer ended: pass on what is left of its stderr (a process it left
        behind may hold the pipe: wait at most `seconds`)."""
        deadline = time.monotonic() + seconds
        while self.child_err is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.child_err], [], [], left)[0]:
                os.close(self.child_err)
                self.child_err = None
                return
            self._pump()

    def wait_child(self, proc: subprocess.Popen) -> int:
        """Wait for `proc`, forwarding signals meanwhile; returns its returncode."""
        while True:
            self._drain_wakeup()
            self._handle_signals()
            # WNOWAIT: see the exit without reaping, so the pid (and the process group) cannot
            # be reused while we clean up; forwarding before this point cannot hit a stranger.
            try:
                exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                exited = True
            if exited:
                break
            self._wait_for(30.0)  # the timeout is only a safety net; SIGCHLD wakes us
        if self.proc_is_trainer:
            # Kill whatever the trainer left in its group (e.g. loader workers), so a relaunch
            # finds the GPU memory and the output-dir lock free.
            self._kill_group(proc.pid, signal.SIGKILL)
            self._drain()
        return proc.wait()

    def sleep(self, seconds: float) -> bool:
        """Wait `seconds` for real; False as soon as a stop signal arrives."""
        deadline = time.monotonic() + seconds
        while True:
            self._drain_wakeup()
            self._handle_signals()
            if self.stopping:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            self._wait_for(remaining)

    # -- the loop --------------------------------------------------------------------------

    def launch(self, attempt: int) -> subprocess.Popen:
        env = dict(os.environ)
        if self.torchrun:
            with contextlib.suppress(OSError):
                self.exit_code_path.unlink()
            env[EXIT_CODE_FILE_ENV] = str(self.exit_code_path)
        env[ENV_ATTEMPT] = str(attempt)
        env[ENV_SUPERVISOR_PID] = str(os.getpid())
        self.launch_id = f"{os.getpid()}-{attempt}-{secrets.token_hex(4)}"
        env[LAUNCH_ID_ENV] = self.launch_id
        read_end, write_end = _stderr_channel()
        self.tail.clear()
        try:
            proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stderr=write_end,
                env=env,
                start_new_session=True,  # terminal signals reach only the supervisor
                preexec_fn=_make_pdeathsig_setup(os.getpid()),
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self.child_err = read_end
        self.log(f"launch attempt {attempt} (pid {proc.pid}): {shlex.join(self.cmd)}")
        return proc

    def own_checkpoints(self, changed: list[str]) -> list[str]:
        """Of the checkpoints that changed during a launch, those its trainer wrote."""
        return [n for n in changed if checkpoint_launch(self.run_dir / n) == self.launch_id]

    def run(self) -> int:
        ns = self.ns
        self.log(
            f"supervising {ns.module} in {self.run_dir} (supervisor pid {os.getpid()}; "
            f"backoff {ns.backoff:g}s doubling to {ns.max_backoff:g}s; gives up after "
            f"{ns.max_failures} crashes in a row without a new checkpoint)"
        )
        failures = 0  # crashes in a row that wrote no new checkpoint
        attempt = 0
        while True:
            self._drain_wakeup()
            self._handle_signals()
            if self.stopping:
                self.log("stopped before launching the trainer")
                return 0
            attempt += 1
            before = checkpoint_set(self.run_dir)
            status_before = _file_stamp(self.status_path)
            started = time.monotonic()
            self.proc_is_trainer = True
            try:
                self.proc = self.launch(attempt)
            except OSError as e:
                self.log(f"cannot start the trainer: {e}; {self.where_logs_are()}")
                return 1
            returncode = self.wait_child(self.proc)
            if self.torchrun:
                code = read_exit_code(self.exit_code_path)
                if code is not None:
                    returncode = code  # what rank 0 said, not torchrun's summary
            self.proc = None
            seconds = time.monotonic() - started
            elapsed = format_duration(seconds)
            after = checkpoint_set(self.run_dir)
            changed = sorted(
                {name for name, _, _ in after ^ before if (self.run_dir / name).exists()}
            )
            own = self.own_checkpoints(changed)
            new_ckpt = f"yes ({', '.join(own[:3])})" if own else "no"
            others = sorted(set(changed) - set(own))
            if others:
                new_ckpt += f"; written by another process, not counted: {', '.join(others[:3])}"
            self.log(
                f"trainer (attempt {attempt}) ended after {elapsed}: "
                f"{_describe_exit(returncode)}; new checkpoint: {new_ckpt}"
            )
            status = _read_status(self.status_path, status_before)
            state = status.get("status") if status else None
            where = (
                f"tick {status.get('tick')}, checkpoint {status.get('checkpoint')}"
                if status
                else "no status.json written"
            )

            d = decide(
                returncode,
                state,
                stopping=self.stopping,
                new_checkpoint=bool(own),
                failures=failures,
                max_failures=ns.max_failures,
                backoff=ns.backoff,
                max_backoff=ns.max_backoff,
                # (ended soon, before its first window: it never wrote status.json)
                cannot_start=status is None and seconds < CANNOT_START_S,
                divergence=_divergence_line(status),
            )
            failures = d.failures
            error = last_error_line(bytes(self.tail)) or "it wrote no error message"
            fill = {
                "{where}": where,
                "{logs}": self.where_logs_are(),
                "{status}": str(self.status_path),
                "{elapsed}": elapsed,
                "{error}": error,
            }
            message = d.message
            for key, value in fill.items():
                message = message.replace(key, value)
            self.log(message)
            if d.action == "complete":
                return self.on_complete(status)
            if d.action == "end":
                return d.code
            if not self.sleep(d.delay):
                self.log("stop requested during the backoff: not relaunching")
                return 0

    def on_complete(self, status: dict) -> int:
        cmd = self.ns.on_complete
        if not cmd:
            return 0
        env = dict(os.environ)
        env.update(
            ATOM_STATUS=str(status.get("status", "")),
            ATOM_TICK=str(status.get("tick", "")),
            ATOM_CHECKPOINT=str(status.get("checkpoint", "")),
            ATOM_OUTPUT_DIR=str(self.run_dir),
        )
        self.log(f"running --on-complete: {cmd}")
        self.proc_is_trainer = False
        try:
            # In our own process group, so it can prompt on the terminal (sudo).
            self.proc = subprocess.Popen(cmd, shell=True, env=env)
        except OSError as e:
            self.log(f"--on-complete could not start: {e}")
            return 1
        returncode = self.wait_child(self.proc)
        self.proc = None
        if returncode != 0:
            self.log(
                f"--on-complete failed ({_describe_exit(returncode)}); training itself "
                f"completed; {self.where_logs_are()}"
            )
            return 1
        self.log("--on-complete finished")
        return 0


def _stderr_channel() -> tuple[int, int]:
    """(read end, write end) for the trainer's stderr: a pseudo-terminal of our terminal's
    size when our stderr is a terminal (the trainer then draws its progress bar), else a
    pipe."""
    if os.isatty(sys.stderr.fileno()):
        import pty

        master, slave = pty.openpty()
        with contextlib.suppress(OSError):
            size = fcntl.ioctl(
                sys.stderr.fileno(), termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0)
            )
            fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        return master, slave
    return os.pipe()


def main(argv: list[str] | None = None) -> int:
    set_command("supervise")
    argv = sys.argv[1:] if argv is None else argv
    try:
        ns, train_args = parse_command_line(argv)
        run_dir = output_dir_from(train_args)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the output dir {run_dir}: {e.strerror}") from None
        pid_file = _PidFile(run_dir / PID_NAME)
    except (UserError, OSError) as e:
        return user_error_exit(e)
    sup = Supervisor(ns, train_args, run_dir)
    sup.install_signals()
    try:
        if pid_file.left_by is not None:
            sup.log(
                f"the previous supervisor (pid {pid_file.left_by}) ended without logging its "
                "end: killed by SIGKILL (kill -9, the OOM killer) or the machine went down; "
                "its trainer was sent SIGTERM (it checkpoints and stops)"
            )
        return sup.run()
    finally:
        sup.restore_signals()
        pid_file.remove()


if __name__ == "__main__":
    sys.exit(main())
