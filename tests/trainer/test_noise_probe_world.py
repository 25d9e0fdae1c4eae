"""The noise probe (`atom_train.trainer.step.NoiseProbe`) in a world of several ranks, in
process: each rank's |G_r|^2 is its gradient's before the all-reduce, |G_big|^2 the averaged
gradient's after it, b_small = B / N streams; stand-in gradients of known norms (the all-reduce
is the test setting .grad to the average), so the figures are exact."""

from __future__ import annotations

import pytest
import torch

from atom_train.model.batched import BatchedByteTick
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel
from atom_train.trainer.step import NoiseProbe

CFG = ModelConfig(n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8, episode_length=64)


def _set_grads(probe: NoiseProbe, value: float, skip: int | None = None) -> int:
    """Every parameter's .grad filled with `value` (parameter `skip` without one); returns
    how many numbers carry it."""
    n = 0
    for i, p in enumerate(probe.params):
        if i == skip:
            p.grad = None
            continue
        p.grad = torch.full_like(p, value)
        n += p.numel()
    return n


@pytest.mark.parametrize("world, b_small", [(4, 1.5), (2, 3.0)])  # 6 streams over the ranks
def test_a_ranks_measurement_is_its_own_gradient_before_the_all_reduce_and_the_average_after(
    world, b_small
):
    rt = BatchedByteTick(ReferenceModel(CFG), 6)
    probe = NoiseProbe(rt, 6, world_size=world)
    assert probe.b_small == b_small
    # No half-batch pass in a world: nothing to do before the forward, masks or none.
    assert probe.before_forward(torch.zeros(1), torch.zeros(1), 0, None) is None
    n = _set_grads(probe, 2.0, skip=0)  # (a parameter without a gradient counts as zero)
    probe.before_reduce()
    _set_grads(probe, 0.5, skip=0)  # the all-reduce's average
    m = probe.after_reduce()
    assert (m.b_small, m.b_big) == (b_small, 6)
    assert float(m.small_sq) == 4.0 * n and float(m.big_sq) == 0.25 * n
    assert m.small_sq.dtype == torch.float64 and m.big_sq.dtype == torch.float64
    # The next window's measurement starts again from its own rank's gradient.
    n = _set_grads(probe, 3.0)
    probe.before_reduce()
    _set_grads(probe, 1.0)
    m = probe.after_reduce()
    assert float(m.small_sq) == 9.0 * n and float(m.big_sq) == 1.0 * n


def test_a_ranks_measurement_needs_its_gradient_before_the_all_reduce():
    probe = NoiseProbe(BatchedByteTick(ReferenceModel(CFG), 6), 6, world_size=2)
    _set_grads(probe, 1.0)
    with pytest.raises(RuntimeError) as e:
        probe.after_reduce()
    assert str(e.value) == "after_reduce needs before_reduce's gradient of this window"
    probe.before_reduce()
    probe.after_reduce()
    with pytest.raises(RuntimeError):  # (each window's, once)
        probe.after_reduce()
