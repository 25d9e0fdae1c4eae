"""The package's layers (docs/architecture.md), held by tests: imports point one way, no
command imports another, no cycle, the torch-free modules load without torch, and the
architecture page's generated part matches the code. `python -m pytest tests -k layer`.

The rules live in scripts/layers.py (one home: the check, the page and these tests read it).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

_spec = importlib.util.spec_from_file_location("layers", REPO / "scripts" / "layers.py")
layers = sys.modules["layers"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)


def test_layer_rules_hold_in_the_package():
    modules = layers.scan()
    assert len(modules) > 50  # the whole package was read, not an empty folder
    assert layers.violations(modules) == []


def _planted(tmp_path, edits: dict[str, str]):
    """A copy of the package's sources with `edits` (path -> a line appended) applied."""
    shutil.copytree(
        REPO / "atom_train",
        tmp_path / "atom_train",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    for rel, line in edits.items():
        p = tmp_path / "atom_train" / rel
        p.write_text(p.read_text() + "\n" + line + "\n")
    return layers.violations(layers.scan(tmp_path))


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        # a lower layer importing a higher one, even inside a function
        (
            {"common/cli.py": "def f():\n    from atom_train.trainer import plan"},
            "atom_train.common.cli (common) imports atom_train.trainer.plan (trainer): a layer above",
        ),
        (
            {"model/batched.py": "from atom_train.trainer.step import WindowStep"},
            "atom_train.model.batched (model) imports atom_train.trainer.step (trainer): a layer above",
        ),
        # siblings
        (
            {"data/text_checks.py": "from atom_train.corpus import manifest"},
            "atom_train.data.text_checks (data) imports atom_train.corpus.manifest (corpus): sibling layers",
        ),
        # a command importing another command
        (
            {"eval.py": "from atom_train.plot import summary"},
            "atom_train.eval imports atom_train.plot: a command",
        ),
        (
            {"trainer/reporting.py": "import atom_train.supervise"},
            "atom_train.trainer.reporting (trainer) imports atom_train.supervise (commands): a layer above",
        ),
        # a command that plans no run importing the run planner (for a device, a corpus)
        (
            {"eval.py": "from atom_train.trainer.plan import resolve_run"},
            "atom_train.eval imports atom_train.trainer.plan: the run planner",
        ),
        (
            {"bench/step.py": "def f():\n    from atom_train.trainer import plan"},
            "atom_train.bench.step imports atom_train.trainer.plan: the run planner",
        ),
        (
            {"chat.py": "import atom_train.trainer.plan"},
            "atom_train.chat imports atom_train.trainer.plan: the run planner",
        ),
        # a cycle inside one layer
        (
            {"model/config.py": "from atom_train.model.reference import ReferenceModel"},
            "an import cycle",
        ),
        # the standard-library-only rule
        ({"common/cli.py": "import numpy"}, "must use the standard library only"),
    ],
)
def test_layer_check_catches_a_planted_violation(tmp_path, edits, expected):
    """The checker is evidence only if it can fail: each planted import is reported."""
    found = _planted(tmp_path, edits)
    assert any(expected in line for line in found), found


def test_layer_architecture_page_is_generated_from_the_code():
    assert layers.doc_is_current(REPO / "docs" / "architecture.md", layers.scan()), (
        "docs/architecture.md is stale: run python scripts/layers.py --write"
    )


@pytest.mark.parametrize("module", layers.TORCH_FREE)
def test_layer_torch_free_modules_load_without_torch(module):
    """Imported in a fresh interpreter (the supervisor, the kernel report's side
    environment, the corpus builder and plotting run without torch)."""
    code = f"import sys, {module}\nassert 'torch' not in sys.modules\n"
    if module in layers.STDLIB_ONLY or module == "atom_train":
        code += "assert 'numpy' not in sys.modules\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_layer_public_api_names_resolve_lazily():
    """`import atom_train` loads nothing heavy; each exported name comes from its owner."""
    code = (
        "import sys, atom_train\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
        "assert set(atom_train.__all__) == {'__version__', *atom_train._EXPORTS}\n"
        "for name in atom_train.__all__:\n"
        "    getattr(atom_train, name)\n"
        "from atom_train.model.reference import ReferenceModel\n"
        "assert atom_train.ReferenceModel is ReferenceModel\n"
        "try:\n"
        "    atom_train.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "has no attribute 'no_such_name'" in r.stdout
