"""Fixtures the planner's tests share (tests/trainer/test_plan.py and test_plan_refusals.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.trainer_kit import run


@pytest.fixture(scope="module")
def done(corpus, tmp_path_factory) -> Path:
    """A finished run of 32 ticks (final checkpoint at 32, rolling at 16); planning never
    writes into it (a module that needs another run defines its own `done`)."""
    out = tmp_path_factory.mktemp("done")
    assert run(corpus, out, 32, "--ckpt-every", "16") == 0
    return out
