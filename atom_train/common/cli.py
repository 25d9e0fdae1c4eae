"""Command-line plumbing shared by every entry point. Standard library only: the supervisor
imports it without paying for torch.

- **Messages**: every line a command writes on stderr begins with the command's name in
  brackets, ``[train] resumed from ...``; a warning is ``[train] warning: ...`` and a user
  error ``[train] error: ...`` (one line, exit code 2). `set_command` names the command
  (each ``main`` does, first), `say` / `warn` / `user_error_exit` write the lines, and this
  module is the only place that formats them, so a new command inherits the style. While a
  progress bar is on screen, `lines_above` sends the lines above it (`tqdm.write`).
- `UserError`: a mistake the user can fix. Every command prints it as one line (no
  traceback) and exits with `EXIT_USER_ERROR` (2), which also tells the supervisor that a
  relaunch cannot help.
- `ArgumentParser`: argparse whose mistakes are `UserError`s, with "did you mean" for an
  unknown flag or choice (what Python 3.14's ``suggest_on_error`` does, here for 3.11+).
- **Shared flags** (`SHARED_FLAGS`, `add_shared`): the one spelling of each option several
  commands take (``--bptt`` / ``-K``, ``-B`` / ``--streams``, ``--corpus``, ``--out``, ...).
- The run folder on the command line (`add_output_dir_argument`, `output_dir_from`): the
  trainer declares ``--output-dir`` with them and the supervisor reads a trainer command line
  with them, so the two cannot disagree. It has no default: unrelated runs never share a
  folder by accident.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from atom_train.common.atomic import atomic_write

EXIT_USER_ERROR = 2
# A run that diverged and stopped (status.json "diverged"): neither a crash to relaunch (the
# same data at the same rate diverges again) nor a user error; the supervisor passes it on.
EXIT_DIVERGED = 3


class UserError(Exception):
    """A mistake the user can fix (bad flag, bad data, a run folder that does not fit): the
    message names the fix; printed as one line, exit code 2."""


# ---- messages --------------------------------------------------------------------------------

_command = "atom"  # the running command's name (set_command); "atom" before any sets it
_write: Callable[[str], None] | None = None  # where lines go while a bar is on screen


def set_command(name: str) -> None:
    """Name the running command (``train``, ``eval``, ...): every line `say`, `warn` and
    `user_error_exit` write from now on begins with ``[name]``."""
    global _command
    _command = name


def message(text: str, kind: str | None = None, command: str | None = None) -> str:
    """One line in the commands' style: ``[command] text``, or ``[command] kind: text`` for
    a ``warning`` or an ``error``. `command`: another name than the running command's (its
    ``python -m atom_train.<name>`` form reads as <name>)."""
    name = _command if command is None else command.removeprefix("python -m atom_train.")
    return f"[{name}] {kind}: {text}" if kind else f"[{name}] {text}"


def _emit(line: str) -> None:
    if _write is not None:
        _write(line)
    else:
        print(line, file=sys.stderr)  # (stderr is line-buffered: the line goes out now)


def say(msg: str, prefix: str | None = None) -> None:
    """One progress line on stderr: ``[command] msg``. (`prefix`: a literal prefix instead of
    the command's; only the corpus builder's default log still passes one, "[corpus]", which
    is the corpus command's style.)"""
    _emit(f"{prefix} {msg}" if prefix is not None else message(msg))


def warn(msg: str) -> None:
    """One warning line on stderr: ``[command] warning: msg``."""
    _emit(message(msg, "warning"))


def user_error_exit(e: BaseException | str, command: str | None = None) -> int:
    """Print a user error as one line, ``[command] error: ...``; return 2. `command`: the
    command's name when not the running one's (its ``python -m atom_train.<name>`` form
    reads as <name>)."""
    _emit(message(str(e), "error", command))
    return EXIT_USER_ERROR


@contextlib.contextmanager
def lines_above(write: Callable[[str], None]) -> Iterator[None]:
    """While a progress bar is on screen: every line goes through `write` (``tqdm.write``),
    which prints it above the bar instead of over it."""
    global _write
    previous, _write = _write, write
    try:
        yield
    finally:
        _write = previous


def quote(path: str | os.PathLike) -> str:
    """A path as it must be typed in a suggested command (quoted when it has spaces or
    shell characters)."""
    return shlex.quote(str(path))


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


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """A count and its noun, singular or plural: ``1 thread``, ``2 threads``, ``1,024
    bytes`` (`plural`: where adding an s is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def some_of(names: Sequence[object], first: int = 2) -> str:
    """The first `first` of `names` for people, and ``...`` with how many there are when
    there are more: ``a, b`` or ``a, b, ... (4 in all)``."""
    shown = ", ".join(str(n) for n in names[:first])
    return shown + (f", ... ({len(names)} in all)" if len(names) > first else "")


# Where a trainer launched by torchrun writes its exit code (rank 0): torchrun itself exits 1
# whatever its workers' codes, so the supervisor reads the trainer's code here (2 = a user
# error that a relaunch cannot fix; 0 = completed or stopped cleanly).
EXIT_CODE_FILE_ENV = "ATOM_EXIT_CODE_FILE"
# Set by the supervisor for each launch; the trainer records it in every checkpoint it writes
# (metadata: training.launch), so the supervisor counts as its child's progress only the
# checkpoints its child wrote, never another process's in the same folder.
LAUNCH_ID_ENV = "ATOM_LAUNCH_ID"


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


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are `UserError`s: the error as one line, with "did you mean"
    for an unknown flag or choice and a hint where one helps; the caller's ``except
    UserError`` handles a bad flag like any other user error. Abbreviated flags are not
    accepted (``allow_abbrev=False`` by default): an abbreviation is a second spelling, and
    one that silently changes meaning when a flag is added."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}{self._hint(message)} (see --help)")

    def option_names(self) -> list[str]:
        """Every flag this parser and its subcommands take."""
        names: list[str] = []
        for action in self._actions:
            names += action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, ArgumentParser):
                        names += sub.option_names()
        return sorted(set(names))

    def _hint(self, message: str) -> str:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            extra = message[len(prefix) :].split()
            flags = [x.partition("=")[0] for x in extra if _looks_like_flag(x)]
            guesses = [(f, _closest(f, self.option_names())) for f in flags]
            guesses = [(f, g) for f, g in guesses if g]
            if guesses:
                if len(guesses) == 1:
                    return f" (did you mean {guesses[0][1]}?)"
                return " (did you mean " + ", ".join(f"{g} for {f}" for f, g in guesses) + "?)"
            if extra and all(os.path.isfile(x) for x in extra):
                return (
                    ": they are files, so the shell expanded a glob: quote it, e.g. "
                    "--data 'data/train-*.txt'"
                )
            return ""
        m = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if m:
            guess = _closest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
            return f" (did you mean {guess}?)" if guess else ""
        return ""


def _looks_like_flag(arg: str) -> bool:
    """An unknown argument that is a flag (``--x``, ``-x``), not a negative number."""
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def _closest(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate closest to `word` (difflib's ratio, at least 0.6), as Python 3.14's
    argparse suggests it; None when nothing is close."""
    found = difflib.get_close_matches(word, candidates)  # (the closest first)
    return found[0] if found else None


# ---- the flags several commands take: one spelling each ------------------------------------

# dest -> the flag's names, in the order --help shows them. A command that takes one of
# these options declares it with `add_shared`, so every command spells it the same way
# (tests/common/test_vocabulary.py walks every command's parser and holds this).
SHARED_FLAGS: dict[str, tuple[str, ...]] = {
    "bptt": ("--bptt", "-K"),
    "B": ("-B", "--streams"),
    "data": ("--data",),
    "corpus": ("--corpus",),
    "val": ("--val",),
    "output_dir": ("--output-dir",),
    "out": ("--out",),
    "plot": ("--plot",),
    "seed": ("--seed",),
    "threads": ("--threads",),
    "loader_threads": ("--loader-threads",),
    "device": ("--device",),
    "recurrence": ("--recurrence",),
    "transport": ("--transport",),
    "n_modes": ("--n-modes",),
    "val_bytes": ("--val-bytes",),
    "val_streams": ("--val-streams",),
    "seconds": ("--seconds",),
}
CORPUS_HELP = (
    "a corpus built by `python -m atom_train.corpus build` (its manifest names the train "
    "shards and the held-out val)"
)


def add_shared(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, dest: str, **kwargs
) -> argparse.Action:
    """Declare the shared flag `dest` with its one spelling (`SHARED_FLAGS`)."""
    return parser.add_argument(*SHARED_FLAGS[dest], dest=dest, **kwargs)


def positive_ints(text: str, flag: str) -> tuple[int, ...]:
    """A flag's comma-separated list of integers >= 1 ("256,1024"); UserError naming it."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} takes positive integers, got {text!r}")
    return values


# ---- the run folder on the command line ------------------------------------------------------

OUTPUT_DIR_HINT = (
    "name the run's folder with --output-dir, e.g. --output-dir runs/fr-b64 (a new folder "
    "starts a run; a run's folder resumes it)"
)


def add_output_dir_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    add_shared(
        parser,
        "output_dir",
        metavar="DIR",
        help="the run's folder (required: a new folder starts a run, a run's folder resumes it)",
    )


def output_dir_from(train_args: Sequence[str]) -> Path:
    """The run folder a trainer command line uses: its --output-dir (the last one wins, as
    in argparse). Read with the trainer's own declaration of the flag, and like the trainer
    it accepts no abbreviation; a command line without one is refused, as the trainer
    refuses it."""
    p = ArgumentParser(add_help=False)
    add_output_dir_argument(p)
    ns, rest = p.parse_known_args(list(train_args))
    for arg in rest:
        name = arg.partition("=")[0]
        if len(name) > 3 and "--output-dir".startswith(name):
            # The trainer refuses abbreviations; say so before launching it.
            raise UserError(f"write --output-dir in full in the train args (got {name!r})")
    if ns.output_dir is None:
        raise UserError(f"no --output-dir in the train args: {OUTPUT_DIR_HINT}")
    if not ns.output_dir:
        raise UserError("--output-dir in the train args is empty")
    return Path(ns.output_dir)
