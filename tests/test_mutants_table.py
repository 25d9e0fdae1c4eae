"""`make mutants`' table and its --since mode (scripts/mutants.py), held by tests: every part
names a module, tests and functions that exist (a module or function moved or renamed would
otherwise be mutated against nothing, or not at all), and --since finds the functions a
change touches."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys

from helpers import REPO

_spec = importlib.util.spec_from_file_location("mutants", REPO / "scripts" / "mutants.py")
mutants = sys.modules["mutants"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutants)


def _mutable(module: str) -> set[str]:
    """What mutmut mutates in a module: its functions and its classes' methods (`Class`,
    `Class.method`), not those with a decorator other than staticmethod or classmethod."""
    found = set()

    def plain(f) -> bool:
        names = [d.id for d in f.decorator_list if isinstance(d, ast.Name)]
        return len(f.decorator_list) == 0 or names in (["staticmethod"], ["classmethod"])

    for node in ast.parse((REPO / module).read_text()).body:
        if isinstance(node, ast.FunctionDef) and plain(node):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            methods = {f"{node.name}.{m.name}" for m in node.body
                       if isinstance(m, ast.FunctionDef) and plain(m)}  # fmt: skip
            found |= methods | ({node.name} if methods else set())
    return found


def test_every_part_names_a_module_tests_and_functions_that_exist():
    assert len(mutants.PYTHON) >= 20
    for name, (module, tests, functions) in mutants.PYTHON.items():
        assert (REPO / module).is_file(), f"{name}: {module}"
        for t in tests:
            path, _, test = t.partition("::")
            assert (REPO / path).is_file(), f"{name}: {path}"
            if test:
                assert f"\ndef {test}(" in (REPO / path).read_text(), f"{name}: {t}"
        missing = set(functions or ()) - _mutable(module)
        assert not missing, f"{name}: {module} has no mutable {sorted(missing)}"


def test_mutant_names_for_functions_methods_and_classes():
    got = mutants.mutant_patterns(
        "atom_train/trainer/step.py", ["NoiseProbe", "NoiseProbe.after_reduce", "harmonic"]
    )
    assert got == [
        "atom_train.trainer.step.xǁNoiseProbeǁ*__mutmut_*",
        "atom_train.trainer.step.xǁNoiseProbeǁafter_reduce__mutmut_*",
        "atom_train.trainer.step.x_harmonic__mutmut_*",
    ]
    assert mutants.mutant_patterns("atom_train/trainer/step.py", None) == []


def test_since_finds_the_functions_a_change_touches(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)  # fmt: skip

    code = [
        "def a():", "    return 1", "", "",
        "def b():", "    x = 2", "    return x", "", "",
        "class C:", "    def m(self):", "        return 3", "",
        "    def n(self):", "        y = 4", "        return y",
    ]  # fmt: skip
    (tmp_path / "m.py").write_text("\n".join(code) + "\n")
    git("init", "-q")
    git("add", "m.py")
    git("commit", "-qm", "base")
    assert mutants.changed_functions("m.py", "HEAD", tmp_path) == []
    edited = list(code)
    edited[5] = "    x = 20"  # b's body
    edited[11] = "        pass"  # C.m's
    (tmp_path / "m.py").write_text("\n".join(edited) + "\n")
    assert mutants.changed_functions("m.py", "HEAD", tmp_path) == ["b", "C.m"]
    # Lines only removed (no line of the new file differs): the function they were in.
    (tmp_path / "m.py").write_text("\n".join(code[:14] + code[15:]) + "\n")  # n's first line
    assert mutants.changed_functions("m.py", "HEAD", tmp_path) == ["C.n"]
    (tmp_path / "new.py").write_text("def f():\n    pass\n")  # a file HEAD has not: all new
    assert mutants.changed_functions("new.py", "HEAD", tmp_path) == ["f"]
    # What a part mutates of the change: all of it, or the functions and classes it lists.
    assert mutants.in_scope(["b", "C.m"], None) == ["b", "C.m"]
    assert mutants.in_scope(["b", "C.m"], ["C"]) == ["C.m"]
    assert mutants.in_scope(["b", "C.m"], ["a"]) == []
