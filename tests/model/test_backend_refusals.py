"""`model.backend.resolve_device` and `resolve_recurrence`, called directly: the device and
loop refusals word for word, the index a CUDA device is given, and what `auto` picks and
says on each device (CUDA and the loops' availability are stood in for: only the device's
type and `field_loops.available`'s answer are read)."""

from __future__ import annotations

import pytest
import torch

from atom_train.common.cli import UserError
from atom_train.model import field_loops
from atom_train.model.backend import resolve_device, resolve_recurrence
from atom_train.model.config import ModelConfig

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


@pytest.fixture
def loops(monkeypatch):
    """`loops(triton=..., native=...)`: which loops `field_loops.available` says can run (the
    torch loops always; native only on a CPU, as the extension has it)."""

    def set_to(triton: bool = False, native: bool = True) -> None:
        def available(loop: str, device) -> bool:
            if loop == "triton":
                return triton
            if loop == "native":
                return native and torch.device(device).type == "cpu"
            return loop in field_loops.LOOPS

        monkeypatch.setattr(field_loops, "available", available)

    return set_to


def test_cuda_without_a_cuda_device_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        for local_rank in (None, 0, 3):
            with pytest.raises(UserError) as e:
                resolve_device(device, local_rank)
            assert str(e.value) == "--device cuda but torch sees no CUDA device: use --device cpu"


def test_a_cuda_device_gets_local_ranks_index_under_torchrun_else_the_current_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert resolve_device("cuda", 3) == torch.device("cuda", 3)
    assert resolve_device("cuda:1", 0) == torch.device("cuda", 0)  # (LOCAL_RANK's GPU)
    assert resolve_device("cuda") == torch.device("cuda", 2)  # torch's current device
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 2)


def test_a_cpu_is_the_cpu_whatever_the_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for local_rank in (None, 0, 1):
        for device in ("cpu", "cpu:0", CPU):
            got = resolve_device(device, local_rank)
            assert got == CPU and got.index is None, (device, local_rank, got)


def test_an_unknown_loop_is_refused_naming_every_loop(loops):
    loops()
    for name in ("nope", "", "Auto", "FUSED"):
        with pytest.raises(UserError) as e:
            resolve_recurrence(name, CPU)
        assert str(e.value) == (
            "--recurrence must be auto or one of fused, autograd, compiled, triton, native"
        )


def test_triton_where_it_cannot_run_is_refused_with_the_fix(loops):
    loops(triton=False)
    for device in (CPU, CUDA):
        with pytest.raises(UserError) as e:
            resolve_recurrence("triton", device, ModelConfig(n_modes=8), [].append)
        assert str(e.value) == (
            "--recurrence triton needs Triton and a CUDA device (--device cuda; on a CPU only "
            "under TRITON_INTERPRET=1, for tests): use --recurrence fused"
        )


def test_native_off_the_cpu_or_in_a_build_without_it_is_refused_with_the_fix(loops):
    loops(native=True)
    with pytest.raises(UserError) as e:
        resolve_recurrence("native", CUDA, None, [].append)
    assert str(e.value) == (
        "--recurrence native runs on the CPU, not cuda: use --device cpu, or --recurrence auto"
    )
    assert resolve_recurrence("native", CPU, None, [].append) == "native"
    loops(native=False)
    with pytest.raises(UserError) as e:
        resolve_recurrence("native", CPU, None, [].append)
    assert str(e.value) == (
        "--recurrence native needs the native field loop, which this build of the extension "
        "lacks: rebuild it (make setup), or use --recurrence fused"
    )


def test_an_explicit_loop_is_that_loop_and_says_nothing(loops):
    loops(triton=True)
    for device in (CPU, CUDA):
        for name in ("fused", "autograd", "compiled"):
            said: list[str] = []
            assert resolve_recurrence(name, device, ModelConfig(n_modes=300), said.append) == name
            assert said == []
    said = []
    assert resolve_recurrence("triton", CUDA, ModelConfig(n_modes=32), said.append) == "triton"
    assert resolve_recurrence("triton", CUDA, None, said.append) == "triton"  # (no fit check)
    assert said == []


def test_auto_on_cuda_is_triton_where_it_runs_and_fits_else_fused_said(loops):
    loops(triton=True)
    said: list[str] = []
    assert resolve_recurrence("auto", CUDA, ModelConfig(n_modes=128), said.append) == "triton"
    assert resolve_recurrence("auto", CUDA, None, said.append) == "triton"  # (no fit check)
    assert said == []
    assert resolve_recurrence("auto", CUDA, ModelConfig(n_modes=300), said.append) == "fused"
    assert said == [
        "--recurrence auto: the fused loop, not Triton: n = 300: the Triton kernels were "
        "compiled up to n = 256, and already spill 2160 bytes a thread there"
    ]
    assert resolve_recurrence("auto", CUDA, ModelConfig(n_modes=300), None) == "fused"  # (quiet)
    loops(triton=False)
    said = []
    assert resolve_recurrence("auto", CUDA, ModelConfig(n_modes=8), said.append) == "fused"
    assert said == []  # (no Triton: nothing passed over that could run)


def test_an_explicit_triton_for_a_model_it_does_not_fit_runs_warned(loops):
    loops(triton=True)
    said: list[str] = []
    assert resolve_recurrence("triton", CUDA, ModelConfig(n_modes=200), said.append) == "triton"
    assert said == [
        "warning: --recurrence triton: n = 200: the Triton kernels spill 100 (forward) and "
        "2160 (backward) bytes a thread to local memory, above the 1024 bytes they are allowed "
        "(Triton 3.9, sm_90); it runs, slower than it could"
    ]
    assert resolve_recurrence("triton", CUDA, ModelConfig(n_modes=200), None) == "triton"


def test_auto_on_a_cpu_is_native_where_the_build_has_it_else_fused_said(loops):
    loops(triton=True, native=True)  # (Triton under the interpreter: auto still goes native)
    said: list[str] = []
    assert resolve_recurrence("auto", CPU, ModelConfig(n_modes=300), said.append) == "native"
    assert said == []
    loops(triton=False, native=False)
    assert resolve_recurrence("auto", CPU, ModelConfig(n_modes=8), said.append) == "fused"
    assert said == [
        "--recurrence auto: the fused loop, not the native one: this build of the extension "
        "has none (rebuild it: make setup)"
    ]
    assert resolve_recurrence("auto", CPU, None, None) == "fused"  # (quiet)


def test_auto_on_another_device_is_fused(loops):
    loops(triton=True, native=True)
    said: list[str] = []
    assert resolve_recurrence("auto", torch.device("meta"), None, said.append) == "fused"
    assert said == []


def test_the_loops_availability_is_asked_for_this_device():
    # The real `field_loops.available`, asked of the device given (under the interpreter,
    # TRITON_INTERPRET=1 as in the tests, Triton runs anywhere; without it, on CUDA only).
    if field_loops.available("triton", CPU):
        assert resolve_recurrence("triton", CPU, None, [].append) == "triton"
    else:
        with pytest.raises(UserError, match="--recurrence triton needs Triton and a CUDA"):
            resolve_recurrence("triton", CPU, None, [].append)
    said: list[str] = []
    auto = "triton" if field_loops.available("triton", CUDA) else "fused"
    assert resolve_recurrence("auto", CUDA, None, said.append) == auto and said == []


def test_the_fit_is_judged_for_the_kernels_the_config_runs(loops, monkeypatch):
    """A learnable leak runs the kernels' per-mode-leak variant, with spills of its own: the
    fit reads that variant's row (here a stand-in table where only it spills too much)."""
    from atom_train.model import field_triton

    loops(triton=True)
    table = dict(field_triton.MEASURED_SPILLS)
    table[128] = {False: (0, 8), True: (0, 4096)}
    monkeypatch.setattr(field_triton, "MEASURED_SPILLS", table)
    said: list[str] = []
    plain, leaky = ModelConfig(n_modes=128), ModelConfig(n_modes=128, learnable_leak=True)
    assert resolve_recurrence("auto", CUDA, plain, said.append) == "triton"
    assert said == []
    assert resolve_recurrence("auto", CUDA, leaky, said.append) == "fused"
    assert said == [
        "--recurrence auto: the fused loop, not Triton: n = 128: the Triton kernels spill 0 "
        "(forward) and 4096 (backward) bytes a thread to local memory, above the 1024 bytes "
        "they are allowed (Triton 3.9, sm_90)"
    ]
