"""`model.backend.choose_backend`: what a launch computes on and why, from plain values (no
Namespace), on a CPU; the refusals and the `auto` self-check are in
tests/trainer/test_plan.py and tests/trainer/test_auto_fallback.py."""

from __future__ import annotations

import pytest
import torch

from atom_train.common.cli import UserError
from atom_train.model import field_loops
from atom_train.model.backend import Backend, choose_backend, resolve_transport
from atom_train.model.config import ModelConfig


def test_a_cpu_backend_says_what_it_chose_and_why():
    loop = "native" if field_loops.available("native", "cpu") else "fused"
    b = choose_backend("cpu", config=ModelConfig(n_modes=8), B=4, tf32=True, warn=None)
    assert b == Backend(
        torch.device("cpu"), loop, f"auto: the {loop} loop on cpu", "dense",
        "auto: dense features on cpu", tf32=False,  # (TF32 is a CUDA setting)
    )  # fmt: skip
    assert b.why()["recurrence"] == f"{loop} (auto: the {loop} loop on cpu)"
    with b.precision():  # nothing to change on a CPU
        pass
    explicit = choose_backend("cpu", "fused", transport="ids", warn=None)
    assert (explicit.recurrence, explicit.recurrence_reason) == ("fused", "--recurrence fused")
    assert (explicit.transport, explicit.transport_reason) == ("ids", "--transport ids")


def test_transport_auto_is_ids_on_cuda_and_a_bad_one_is_refused():
    assert resolve_transport("auto", torch.device("cuda", 0))[0] == "ids"
    with pytest.raises(UserError, match="--transport must be one of auto, dense, ids"):
        resolve_transport("sparse", torch.device("cpu"))


def test_available_answers_for_every_loop():
    cpu = torch.device("cpu")
    for loop in ("fused", "autograd", "compiled", "native"):
        assert field_loops.available(loop, cpu)
    assert not field_loops.available("native", torch.device("cuda", 0))
    with pytest.raises(ValueError, match="no field loop 'nope'"):
        field_loops.available("nope", cpu)
