"""The GPU fast path, proven on the CPU: the trainer with --recurrence triton (the kernels
under Triton's interpreter, see conftest.py) against --recurrence fused, exact resume with
triton, and the number of operators one training window dispatches per recurrence.

Tolerance (trainer): after 6 AdamW steps every tensor of the final checkpoint is within
||a - b|| <= 1e-4 ||b|| + 1e-6 of the fused run's (the loops agree to ~1e-6 per window in
float32, tests/model/test_field_triton.py; the optimizer carries that forward); the loader state,
the step counts and the RNG states are identical. Resume with triton is bit-identical.

Operator budgets: one window at B = 64, K = 64 on the path as it runs on CUDA (the byte CE
in one chunk, feature ids), counted with torch.profiler (atom_train.bench.step.
count_window_ops): top-level aten operators, the Triton launches counted apart. The triton
path's budget is the issue's goal, 300 (measured: see docs/performance.md); the fused and
autograd loops have budgets at their measured counts plus 5%, so a regression shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")

from helpers.trainer_kit import assert_close_state, assert_same_state, run

from atom_train.bench.step import count_window_ops
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.train_state import run_config_of

SHORT = ["--ckpt-every", "48", "--val-every", "0"]


@pytest.fixture(scope="module")
def triton_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("triton")
    assert run(corpus, out, 96, *SHORT, "--recurrence", "triton") == 0
    return out


def test_the_trainer_with_triton_trains_like_fused(corpus, triton_run, tmp_path):
    fused = tmp_path / "fused"
    assert run(corpus, fused, 96, *SHORT, "--recurrence", "fused") == 0
    ca, cb = load_checkpoint(triton_run / FINAL), load_checkpoint(fused / FINAL)
    assert run_config_of(ca.meta).value("recurrence") == "triton"
    assert run_config_of(cb.meta).value("recurrence") == "fused"
    assert ca.meta["training"]["step"] == 6
    assert_close_state(triton_run / FINAL, fused / FINAL, 1e-4, 1e-6)


def test_exact_resume_with_triton(corpus, triton_run, tmp_path):
    out = tmp_path / "run"
    assert run(corpus, out, 48, *SHORT, "--recurrence", "triton") == 0
    assert run(corpus, out, 96, *SHORT, "--recurrence", "triton") == 0
    assert_same_state(out / FINAL, triton_run / FINAL)


# Budgets (K = 64, as on CUDA); measured: triton 292, fused 10,702, autograd 22,869. The
# counts do not depend on B (fused: 10,701 at B = 8 and at B = 64 when first measured, 10,702
# at B = 8 now; triton: 292 at B = 4 and 16), so they are counted at B = 4: under the interpreter the Triton kernels' time grows
# with B (B = 64 took 139 s here, B = 16 49 s, B = 4 33 s).
BUDGETS = {"triton": 300, "fused": 11_250, "autograd": 24_000}


@pytest.mark.parametrize("recurrence", list(BUDGETS))
def test_operators_per_window(recurrence):
    r = count_window_ops({"B": 4, "K": 64, "recurrence": recurrence, "as_on": "cuda", "threads": 1})
    print(f"{recurrence}: {r['aten']} aten operators, {r['triton']} Triton launches per window")
    assert r["aten"] <= BUDGETS[recurrence], r
    assert r["triton"] == (2 if recurrence == "triton" else 0), r
