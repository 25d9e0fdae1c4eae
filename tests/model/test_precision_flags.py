"""torch's process-wide precision settings are put back after each test (the autouse fixture
`conftest.keep_precision_flags`), and `torch_flags` restores every one of them.

The first two tests are a pair, in this order: the first changes the settings as `--tf32`
and its kin do; the second fails unless the fixture put them back in between.
"""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from helpers.torch_flags import precision_flags, restore_precision_flags

from atom_train.model.precision import set_tf32_matmuls

AT_IMPORT = precision_flags()  # collected before any test runs


def _turn_everything_down() -> None:
    set_tf32_matmuls(True)  # what the trainer's --tf32 does
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


def test_a_test_may_turn_on_tf32():
    _turn_everything_down()
    assert precision_flags() != AT_IMPORT


def test_the_next_test_starts_with_the_settings_of_the_process():
    assert precision_flags() == AT_IMPORT
    assert torch.get_float32_matmul_precision() == AT_IMPORT["float32_matmul_precision"]


# Each changes one setting the way a user or a library might (some through the legacy API,
# some through the per-backend one: torch refuses to read a legacy flag once they disagree).
CHANGES = [
    lambda: set_tf32_matmuls(True),
    lambda: torch.set_float32_matmul_precision("medium"),
    lambda: torch.set_float32_matmul_precision("high"),
    lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    lambda: setattr(torch.backends.cudnn, "allow_tf32", False),
    lambda: setattr(torch.backends, "fp32_precision", "tf32"),
    lambda: setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee"),
    lambda: setattr(torch.backends.cudnn.rnn, "fp32_precision", "ieee"),
    lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
    lambda: setattr(torch.backends.mkldnn, "fp32_precision", "bf16"),
    lambda: setattr(torch.backends.cudnn, "deterministic", True),
    lambda: setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False),
]


@pytest.mark.parametrize("seed", range(40))
def test_any_sequence_of_changes_is_undone(seed):
    rng = random.Random(seed)
    before = precision_flags()
    for _ in range(rng.randint(1, 6)):
        # (A combination this torch refuses is skipped; a setting it lacks is a failure:
        # test_each_change_changes_a_setting_and_is_undone shows each one applies.)
        with contextlib.suppress(RuntimeError):
            rng.choice(CHANGES)()
    restore_precision_flags(before)
    assert precision_flags() == before
    # The legacy getters read again, with the values they had.
    assert torch.get_float32_matmul_precision() == before["float32_matmul_precision"]
    assert torch.backends.cuda.matmul.allow_tf32 == before["cuda.matmul.allow_tf32"]
    assert torch.backends.cudnn.allow_tf32 == before["cudnn.allow_tf32"]


@pytest.mark.parametrize("i", range(len(CHANGES)))
def test_each_change_changes_a_setting_and_is_undone(i):
    """Each change of CHANGES applies on this torch and changes what `precision_flags`
    reads, so that the sequences above exercise real changes, not no-ops."""
    before = precision_flags()
    CHANGES[i]()
    assert precision_flags() != before, "the change changed no setting"
    restore_precision_flags(before)
    assert precision_flags() == before
