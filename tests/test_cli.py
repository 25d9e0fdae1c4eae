"""The shared command-line plumbing (atom_train.cli): user errors, atomic writes, the run
folder's flag, and that every command reports a user error as one line with exit code 2."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from atom_train import cli

REPO = Path(__file__).resolve().parents[1]


def test_atomic_write_replaces_or_keeps(tmp_path):
    p = tmp_path / "f.bin"
    cli.atomic_write(p, b"one")
    assert p.read_bytes() == b"one"
    cli.atomic_write(p, b"two", keep_previous_as=tmp_path / "f.prev")
    assert p.read_bytes() == b"two" and (tmp_path / "f.prev").read_bytes() == b"one"

    def refuse(tmp: Path) -> None:
        assert tmp.read_bytes() == b"three"  # verify sees what is on disk
        raise ValueError("no")

    with pytest.raises(ValueError):
        cli.atomic_write(p, b"three", verify=refuse)
    assert p.read_bytes() == b"two"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.bin", "f.prev"]  # no temp left
    with pytest.raises(FileExistsError):
        cli.atomic_write(p, b"four", exclusive=True)
    assert p.read_bytes() == b"two"
    cli.atomic_write_json(tmp_path / "s.json", {"b": 1, "a": [1, 2]})
    assert (tmp_path / "s.json").read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'


def test_stale_temp_files_are_removed(tmp_path):
    (tmp_path / ".x.safetensors.tmp-123").write_bytes(b"partial")
    (tmp_path / ".status.json.tmp-9").write_bytes(b"partial")
    (tmp_path / "keep.safetensors").write_bytes(b"whole")
    removed = cli.remove_stale_temp_files(tmp_path, ".safetensors")
    assert [p.name for p in removed] == [".x.safetensors.tmp-123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".status.json.tmp-9", "keep.safetensors"]


def test_output_dir_from_a_trainer_command_line():
    assert cli.output_dir_from(["--data", "x"]) == Path(cli.DEFAULT_OUTPUT_DIR)
    assert cli.output_dir_from(["--output-dir", "a", "--output-dir=b"]) == Path("b")
    with pytest.raises(cli.UserError, match="in full"):
        cli.output_dir_from(["--output-d", "a"])
    with pytest.raises(cli.UserError, match="empty"):
        cli.output_dir_from(["--output-dir="])


def test_the_trainer_declares_output_dir_with_the_shared_default():
    from atom_train.flags import build_parser

    ns = build_parser().parse_args(["--data", "x"])
    assert ns.output_dir == cli.DEFAULT_OUTPUT_DIR


def test_cli_module_is_stdlib_only():
    """The supervisor imports it: no torch, numpy or project module."""
    tree = ast.parse((REPO / "atom_train" / "cli.py").read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("atom_train.train", ["--total-ticks", "5"], "error: no training data"),
        ("atom_train.train", ["--data", "x", "--threads", "-2"], "error: --threads must be >= 1"),
        ("atom_train.train", ["--data", "x", "--nope"], "unrecognized arguments: --nope"),
        ("atom_train.chat", ["--checkpoint", "/nonexistent"], "error: /nonexistent"),
        ("atom_train.supervise", ["--backoff", "-1", "--", "x"], "error: --backoff"),
        ("atom_train.plot", ["/nonexistent"], "error: /nonexistent does not exist"),
        (
            "atom_train.eval",
            ["/nonexistent", "--data", "README.md"],
            "error: /nonexistent: no such checkpoint file or run folder",
        ),
        ("atom_train.export", ["/nonexistent"], "error: /nonexistent"),
        ("atom_train.verify", ["verify", "--bytes", "0"], "error: --bytes must be >= 1"),
    ],
)
def test_every_command_reports_a_user_error_in_one_line(module, argv, message):
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
    assert '"abi3-py311"' in (REPO / "atomdata-rs" / "Cargo.toml").read_text()
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


def test_no_module_imports_one_that_imports_it_back():
    """The package's import graph (module-level and function-level imports of atom_train
    modules) has no cycle."""
    pkg = REPO / "atom_train"
    graph: dict[str, set[str]] = {}
    for path in pkg.glob("*.py"):
        name = path.stem
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module
                if mod == "atom_train":
                    deps |= {a.name for a in node.names}
                elif mod.startswith("atom_train."):
                    deps.add(mod.split(".")[1])
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.split(".")[1] for a in node.names if a.name.startswith("atom_train.")
                }
        graph[name] = {d for d in deps if (pkg / f"{d}.py").exists() and d != name}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, start]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = [c for m in sorted(graph) if (c := cycle_from(m))]
    assert not cycles, cycles[0]
