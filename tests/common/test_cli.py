"""The shared command-line plumbing (atom_train.common.cli): user errors, the run
folder's flag, and that every command reports a user error as one line with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from atom_train.common import cli


def test_output_dir_from_a_trainer_command_line():
    with pytest.raises(cli.UserError, match="no --output-dir in the train args: name the run"):
        cli.output_dir_from(["--data", "x"])
    assert cli.output_dir_from(["--output-dir", "a", "--output-dir=b"]) == Path("b")
    with pytest.raises(cli.UserError, match="in full"):
        cli.output_dir_from(["--output-d", "a"])
    with pytest.raises(cli.UserError, match="empty"):
        cli.output_dir_from(["--output-dir="])


def test_the_trainer_declares_output_dir_without_a_default():
    """No folder shared by unrelated runs: the trainer (and the supervisor reading its
    command line) has no default --output-dir; a command line without one is refused."""
    from atom_train.trainer.flags import build_parser

    ns = build_parser().parse_args(["--data", "x"])
    assert ns.output_dir is None


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (
            "atom_train.train",
            ["--total-ticks", "5", "--output-dir", "{tmp}/r"],
            "error: no training data",
        ),
        (
            "atom_train.train",
            ["--data", "x", "--threads", "-2", "--output-dir", "{tmp}/r"],
            "error: --threads must be >= 1",
        ),
        ("atom_train.train", ["--data", "x", "--nope"], "unrecognized arguments: --nope"),
        ("atom_train.train", ["--data", "x"], "error: no --output-dir: name the run's folder"),
        ("atom_train.chat", ["--checkpoint", "/nonexistent"], "error: /nonexistent"),
        ("atom_train.supervise", ["--backoff", "-1", "--", "x"], "error: --backoff"),
        ("atom_train.plot", ["/nonexistent"], "error: /nonexistent does not exist"),
        (
            "atom_train.eval",
            ["/nonexistent", "--data", "README.md"],
            "error: /nonexistent: no such checkpoint file or run folder",
        ),
        ("atom_train.export", ["/nonexistent"], "error: /nonexistent"),
        ("atom_train.data.verify", ["verify", "--bytes", "0"], "error: --bytes must be >= 1"),
    ],
)
def test_every_command_reports_a_user_error_in_one_line(module, argv, message, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == cli.EXIT_USER_ERROR, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], r.stderr


def test_the_minimum_python_is_declared_the_same_everywhere():
    """scripts/list_deps.py (run by make setup) needs tomllib, new in 3.11: pyproject's
    requires-python, ruff's target and the wheel's abi3 floor must all say 3.11."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"
    assert '"abi3-py311"' in (REPO / "atom-py" / "Cargo.toml").read_text()
    assert "import tomllib" in (REPO / "scripts" / "list_deps.py").read_text()
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "list_deps.py"),
            str(REPO / "pyproject.toml"),
            "dev",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "torch>=2.1" in r.stdout.split() and "maturin>=1.9,<2" in r.stdout.split()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (4.24, "4.2s"),
        (42.4, "42s"),
        (185, "3m05s"),
        (3725, "1h02m"),
        (2 * 86400 + 3 * 3600 + 5, "2d03h"),
    ],
)
def test_one_duration_format_for_every_command(seconds, text):
    assert cli.format_duration(seconds) == text


def test_counts_and_lists_for_people():
    from atom_train.common.cli import counted, some_of

    assert [counted(n, "thread") for n in (0, 1, 2)] == ["0 threads", "1 thread", "2 threads"]
    assert counted(1024, "byte") == "1,024 bytes" and counted(2, "pass", "passes") == "2 passes"
    assert some_of(["a", "b"]) == "a, b" and some_of(["a"]) == "a"
    assert some_of(["a", "b", "c", "d"]) == "a, b, ... (4 in all)"
    assert some_of(["a", "b", "c", "d"], 3) == "a, b, c, ... (4 in all)"
