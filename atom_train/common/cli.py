"""Command-line plumbing shared by every entry point. Standard library only: the supervisor
imports it without paying for torch.

- `UserError`: a mistake the user can fix. Every command prints it as one line (no
  traceback) and exits with `EXIT_USER_ERROR` (2), which also tells the supervisor that a
  relaunch cannot help.
- `say()`: one progress or warning line on stderr, with the command's prefix.
- The run folder's command-line defaults (`DEFAULT_OUTPUT_DIR`, `add_output_dir_argument`,
  `output_dir_from`): the trainer declares `--output-dir` with them and the supervisor reads a
  trainer command line with them, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from atom_train.common.atomic import atomic_write

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake the user can fix (bad flag, bad data, a run folder that does not fit): the
    message names the fix; printed as one line, exit code 2."""


def say(msg: str, prefix: str = "[atom]") -> None:
    print(f"{prefix} {msg}" if prefix else msg, file=sys.stderr, flush=True)


def reader_went_away() -> int:
    """For a command's ``except BrokenPipeError``: the reader of its output went away
    (``| head``). Stop quietly, with stdout pointed at /dev/null so that Python's final
    flush does not complain again; the exit code is 0, as for `head` itself."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def format_duration(seconds: float | None) -> str:
    """A duration for people: 4.2s, 42s, 3m05s, 1h02m, 2d03h ("-" for None)."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def user_error_exit(e: BaseException | str, prog: str | None = None) -> int:
    """Print a user error as one line (``prog: error: ...`` or ``error: ...``); return 2."""
    print(f"{prog}: error: {e}" if prog else f"error: {e}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


# Where a trainer launched by torchrun writes its exit code (rank 0): torchrun itself exits 1
# whatever its workers' codes, so the supervisor reads the trainer's code here (2 = a user
# error that a relaunch cannot fix; 0 = completed or stopped cleanly).
EXIT_CODE_FILE_ENV = "ATOM_EXIT_CODE_FILE"


def write_exit_code(code: int) -> None:
    """Record `code` in the file named by $ATOM_EXIT_CODE_FILE, if set (best effort)."""
    path = os.environ.get(EXIT_CODE_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            atomic_write(path, f"{code}\n".encode())


def read_exit_code(path: str | os.PathLike) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def positive_ints(text: str, flag: str) -> tuple[int, ...]:
    """A flag's comma-separated list of integers >= 1 ("256,1024"); UserError naming it."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} takes positive integers, got {text!r}")
    return values


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are `UserError`s: one short usage line, then the error as
    one line with a hint where one helps (no page of usage before the useful line); the
    caller's ``except UserError`` handles a bad flag like any other user error."""

    def error(self, message: str) -> NoReturn:
        print(f"usage: {self.prog} [options]   (--help: every option)", file=sys.stderr)
        raise UserError(f"{message}{_hint(message)} (see --help)")


def _hint(message: str) -> str:
    """A hint for argparse's message: stray arguments that are files mean the shell
    expanded an unquoted glob."""
    prefix = "unrecognized arguments: "
    if message.startswith(prefix):
        extra = message[len(prefix) :].split()
        if any(os.path.exists(x) for x in extra):
            return (
                ": they are files, so the shell expanded a glob: quote it, e.g. "
                "--data 'data/train-*.txt'"
            )
    return ""


# ---- the run folder on the command line ------------------------------------------------------

DEFAULT_OUTPUT_DIR = "runs/atom"


def add_output_dir_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--output-dir", default=DEFAULT_OUTPUT_DIR, help="run folder (default: %(default)s)"
    )


def output_dir_from(train_args: Sequence[str]) -> Path:
    """The run folder a trainer command line uses: its --output-dir (the last one wins, as
    in argparse), or the trainer's default. Read with the trainer's own declaration of the
    flag, and like the trainer it accepts no abbreviation."""
    p = ArgumentParser(add_help=False, allow_abbrev=False)
    add_output_dir_argument(p)
    ns, rest = p.parse_known_args(list(train_args))
    for arg in rest:
        name = arg.split("=", 1)[0]
        if len(name) > 3 and "--output-dir".startswith(name):
            # The trainer refuses abbreviations; say so before launching it.
            raise UserError(f"write --output-dir in full in the train args (got {name!r})")
    if not ns.output_dir:
        raise UserError("--output-dir in the train args is empty")
    return Path(ns.output_dir)
