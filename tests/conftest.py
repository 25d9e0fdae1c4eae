"""Shared test fixtures: shard files on disk, the oracle's view of a circular corpus, and
torch's precision settings put back after every test.

Without a GPU, Triton kernels run under Triton's interpreter (on CPU tensors, through numpy).
TRITON_INTERPRET is read when a kernel is decorated, i.e. when atom_train.model.field_triton is
first imported, so it is set here, before any test module imports anything.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from helpers import faults
from helpers.torch_flags import kept_precision_flags
from hypothesis import settings

from atom_train.data.atomizer import HORIZON, Atomizer

# A session started in the background by a shell without job control (`make test &`, a
# CI step) inherits SIGINT ignored, and so would every process the tests start: the tests
# that Ctrl-C a trainer, a build or a pytest would see it ignored. The tests start from the
# defaults a terminal gives (a handled signal is reset to the default across exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite's fault injection (helpers/faults.py): armed by ATOM_TEST_* variables, in this
# process and, through helpers/inject/sitecustomize.py on PYTHONPATH, in every Python
# process a test starts (a trainer, torchrun's ranks, the supervisor's children).
faults.install()
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parent / "helpers" / "inject")]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

# Property tests draw the same examples on every run by default ("ci": derandomized, no
# example database), so a run passes or fails on the code alone; HYPOTHESIS_PROFILE=random
# draws new ones each run, to search further locally (docs/testing.md). Each test's
# @settings(max_examples=...) is its size in both. Loaded here, before the test modules are
# imported: their @settings take the profile loaded at that moment as their defaults.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("random", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def circular_oracle(data: bytes, offset: int, k: int, pack_mode: str = "utf8"):
    """(cur u8[K], feats f32[K, 320], tgt u8[K]) of the circular string `data` from `offset`,
    by the Python Atomizer: the 64 bytes before `offset` (circularly) warm up the context."""
    n = len(data)
    window = bytes(data[(offset - HORIZON + j) % n] for j in range(HORIZON + k + 1))
    feats = Atomizer(pack_mode).encode_bytes(window[: HORIZON + k])[HORIZON:]
    cur = np.frombuffer(window[HORIZON:-1], np.uint8)
    tgt = np.frombuffer(window[HORIZON + 1 :], np.uint8)
    return cur, feats, tgt


def pytest_runtest_logreport(report):
    """With ATOM_TEST_LOG=PATH, one JSON line per test as it finishes (scripts/gpu_check.sh):
    the JUnit file is written only when pytest ends, so a run killed at its time bound would
    otherwise leave no result at all. With when it finished (the summary tells a failure
    before a part's bound from one at it) and what the test recorded (record_property: the
    parity tests' measured error ratios). One write() per line, appended: a kill cannot tear
    the lines before."""
    path = os.environ.get("ATOM_TEST_LOG")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    # (a setup or a teardown reported here failed or skipped)
    failed_around = "skipped" if report.skipped else "error"
    outcome = report.outcome if report.when == "call" else failed_around
    why = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        why = str(report.longrepr[2])
    elif report.failed:
        why = (report.longreprtext.strip().splitlines() or [""])[-1]
    module, _, name = report.nodeid.partition("::")
    line = {
        "test": f"{Path(module).stem}::{name}",
        "outcome": outcome,
        "why": why[:160],
        "seconds": round(report.duration, 3),
        "finished": round(report.start + report.duration, 3),  # (epoch seconds)
        **({"properties": dict(report.user_properties)} if report.user_properties else {}),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@pytest.fixture(scope="session")
def oracle() -> Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The `circular_oracle` function, as a fixture."""
    return circular_oracle


@pytest.fixture
def write_shards(tmp_path: Path) -> Callable[..., str]:
    """`write_shards([b"...", b"..."], name="s")` writes shards `s-000`, `s-001`, ... under
    tmp_path and returns a glob that matches exactly them."""

    def write(shards: Sequence[bytes], name: str = "shard") -> str:
        for i, data in enumerate(shards):
            (tmp_path / f"{name}-{i:03d}").write_bytes(data)
        return str(tmp_path / f"{name}-[0-9][0-9][0-9]")

    return write


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """The trainer tests' corpus (trainer_kit.make_corpus): two shards of synthetic French
    and a val.txt; read-only, shared by every test file that trains. (The loader tests have
    their own `corpus` fixtures, which take precedence in their files.)"""
    from helpers.trainer_kit import make_corpus

    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def torch_one_thread():
    """Model tests run many small ops: extra threads only add overhead (and noise)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def sigint_stays_pytests():
    """Every trainer a test runs in this process leaves SIGINT to pytest, and its signal
    handlers go when the test ends (trainer_kit.sigint_stays_pytests: a Ctrl-C or
    gpu_check.sh's bound stops the session, never a trainer whose test then fails). Only
    where the trainer is imported (by the test modules, at collection): the kernels' tests
    run where the native loader is not installed, and the trainer imports it."""
    if "atom_train.train" not in sys.modules:
        yield
        return
    from helpers.trainer_kit import sigint_stays_pytests as kept

    with kept():
        yield


@pytest.fixture(autouse=True)
def keep_precision_flags():
    """torch's process-wide precision settings after each test as before it: a test that
    turns TF32 on (the trainer with --tf32 in process) does not turn it on for the next."""
    with kept_precision_flags():
        yield
