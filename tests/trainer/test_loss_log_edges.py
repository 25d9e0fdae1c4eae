"""The loss log's readers on lines a run does not write today but a reader must not take
for a step's own (`atom_train.trainer.loss_log.read_grad_norms`): an event or an aggregate
at a tick asked for, whatever fields it holds."""

from __future__ import annotations

import json

from atom_train.trainer.loss_log import read_grad_norms
from atom_train.trainer.rundir import LOSS_LOG


def test_only_a_steps_own_line_gives_its_gradient_norm(tmp_path):
    path = tmp_path / LOSS_LOG
    rows = [
        {"step": 1, "tick": 16, "loss": 1.0, "grad_norm": 0.5},
        # Later lines at the same tick (the last line for a tick wins) that are no step's:
        {"event": "divergence", "tick": 16, "step": 1, "grad_norm": 9.0},
        {"step": 1, "first_step": 1, "count": 2, "tick": 16, "grad_norm": 7.0},
        {"step": 2, "tick": 32, "loss": 1.0, "gnorm": 0.25},  # format 1
        {"event": "val", "tick": 32, "gnorm": 8.0},
        {"step": 2, "first_step": 1, "count": 2, "tick": 32, "gnorm": 6.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_grad_norms(path, [16, 32]) == {16: 0.5, 32: 0.25}
    assert read_grad_norms(path, [16]) == {16: 0.5}
