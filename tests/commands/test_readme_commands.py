"""Every command the README shows still runs as it says: each `python -m atom_train.<command>`
(and `atomdata-rs`) answers `--help`, and the README's Python example runs as written on a
tiny trained run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO
from helpers.trainer_kit import run

README = (REPO / "README.md").read_text()
COMMANDS = sorted(set(re.findall(r"python -m (atom_train(?:\.[a-z_]+)+)", README)))


def test_the_readme_shows_every_command():
    """The list below is read from the README; it must at least hold the entry points."""
    for command in ("train", "supervise", "chat", "eval", "plot", "tune", "export", "corpus",
                    "bench", "demo_corpus", "preflight"):  # fmt: skip
        assert f"atom_train.{command}" in COMMANDS, command


@pytest.mark.parametrize("module", COMMANDS)
def test_each_readme_command_answers_help(module):
    r = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:"), r.stdout[:200]


def test_the_loader_check_answers_help():
    exe = REPO / ".venv" / "bin" / "atomdata-rs"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "atom_train.data.verify"]
    r = subprocess.run([*cmd, "verify", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_the_readme_python_example_runs(corpus, tmp_path):
    """The "From Python" block, with the demo's paths replaced by a tiny run's."""
    section = README.split("### From Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = tmp_path / "run"
    assert run(corpus, out, 32) == 0
    code = code.replace('"runs/demo"', repr(str(out)))
    code = code.replace('"data/demo/val.txt"', repr(str(corpus / "val.txt")))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\d+\.\d{3} bits/byte$", r.stdout, re.M), r.stdout


def test_the_readme_training_example_runs(corpus, tmp_path):
    """The "From Python" training block, on the tests' corpus and in a temporary folder: it
    trains its 256 ticks and reads the final checkpoint's tick back."""
    section = README.split("### From Python", 1)[1]
    code = section.split("```python\n", 2)[2].split("```", 1)[0]
    assert "train_run" in code
    code = code.replace('"data/demo/train-*.txt"', repr(str(corpus / "train-*.txt")))
    code = code.replace('"runs/notebook', '"' + str(tmp_path / "nb"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "256", r.stdout
