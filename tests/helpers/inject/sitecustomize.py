"""Put on PYTHONPATH by the test suite (tests/conftest.py): every Python process the tests
start installs the suite's fault injection (tests/helpers/faults.py) into the trainer's test
points, so a test arms a subprocess trainer through its environment. Outside the tests this
file is never on the path."""

import importlib.util
from pathlib import Path

try:
    _spec = importlib.util.spec_from_file_location(
        "atom_test_faults", Path(__file__).resolve().parent.parent / "faults.py"
    )
    _faults = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_faults)
    _faults.install()
except ImportError:  # a Python without atom_train (a side venv): nothing to arm
    pass
