"""The Triton field loop (`atom_train.model.field_triton.TritonFieldLoop`) against `FusedFieldLoop`.

Without a GPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set below
before the module is imported) on CPU tensors; with one they run compiled on CUDA and are
compared with the fused loop on the CPU. The interpreter checks the arithmetic, not what
only the compiler enforces (dot shapes, registers): tests/commands/test_kernel_report.py does that.

Inputs are the model's kind (tests/helpers/field_cases.py): the RMS cap fires (asserted),
episode resets inside the window, one stream with zero drive and zero field, where |y| = 0
and phase sync is skipped, the conventions FusedFieldLoop fixes.
Every output (Zs, Es, g, E) and every gradient (U, z, keep, a, Cr, Ci; a random upstream
gradient on Zs) is compared.

Tolerances (values are O(1)), with the worst measured under the interpreter over the cases
below (n = 8 to 128, both blocks the launcher can choose):
- float64: outputs max |a - b| <= 1e-10; gradients ||a - b|| <= 1e-10 ||b||, per tensor.
  Measured: outputs 2.0e-15, gradients 1.2e-15.
- float32: against the float64 fused loop on the same window (on the CPU; on CUDA at the
  trainer's launches, on the device), every output and gradient within ERROR_RATIO = 8
  times the float32 fused loop's own error there (the error model of
  atom_train.model.loop_check, `judge_float32`; docs/gpu_box.md). Measured under the
  interpreter: at most 1.4 times over 30 windows, 1.52 on this test's own. A gradient 1e-4 off, the RMS cap's gradient dropped
  where it fires, the field turned over where phase sync is skipped, and phase sync's
  gradient taken where it is skipped each fail it (`test_a_planted_bug_fails_...`).
- Two backward runs: bit-identical (no atomics; the partial sums are finished by one torch
  sum).
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    # Read by @triton.jit when atom_train.model.field_triton is imported (inside the tests).
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

import triton
import triton.language as tl
from helpers import REPO as ROOT
from helpers.field_cases import MAX_RMS, check32
from helpers.field_cases import check as _check
from helpers.field_cases import inputs as _inputs
from helpers.field_cases import run as _run

from atom_train.model import field_kernels
from atom_train.model.config import FieldConsts
from atom_train.model.field_loops import FusedFieldLoop


def _module():
    """atom_train.model.field_triton with kernels that can run here: compiled on CUDA, else under
    the interpreter (reloaded if something imported it before TRITON_INTERPRET was set)."""
    ft = importlib.import_module("atom_train.model.field_triton")
    if not torch.cuda.is_available() and not ft.INTERPRETED:
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("no CUDA and TRITON_INTERPRET is set to something other than 1")
        importlib.reload(importlib.import_module("atom_train.model.field_kernels"))  # the kernels
        ft = importlib.reload(ft)
    return ft


def _device(ft) -> str:
    return "cuda" if torch.cuda.is_available() and not ft.INTERPRETED else "cpu"


# (K, B, n, scalar keep, resets, strided U, streams per program: None = the launcher's).
# Under the interpreter the launcher sees the default GPU's 132 SMs and picks 8 streams a
# program at these B; the cases marked 16 force the other block it can choose (B = 19: two
# programs, the second one partial). n = 64 and 128 are the sizes past the old cliff.
CASES = {
    "K40-B5-n8-mode-keep": (40, 5, 8, False, [t % 23 == 7 for t in range(40)], False, None),
    "K40-B3-n32-scalar-keep": (40, 3, 32, True, [t % 20 == 0 for t in range(40)], False, None),
    "K8-B19-n32-mode-keep-strided": (8, 19, 32, False, [t == 5 for t in range(8)], True, None),
    "K6-B19-n32-block16": (6, 19, 32, False, [t == 3 for t in range(6)], False, 16),
    "K6-B19-n16-block16-scalar-keep": (6, 19, 16, True, [t == 2 for t in range(6)], False, 16),
    "K1-B19-n8-scalar-keep": (1, 19, 8, True, [False], False, None),
    "K1-B16-n32-reset": (1, 16, 32, False, [True], False, None),
    "K12-B5-n8-irregular-resets": (
        12,
        5,
        8,
        True,
        [t in (2, 3, 9) for t in range(12)],
        False,
        None,
    ),
    "K10-B5-n64-mode-keep": (10, 5, 64, False, [t == 7 for t in range(10)], False, None),
    "K4-B5-n128-scalar-keep": (4, 5, 128, True, [t == 2 for t in range(4)], False, None),
}


def _force_block(ft, monkeypatch, block):
    """Make the launcher choose `block` streams a program (and its warps for it)."""
    if block is not None:
        from atom_train.model.field_kernels import warps_for

        monkeypatch.setattr(ft, "launch_plan", lambda B, n, sm: (block, warps_for(block, n)))


# The one float64 case of a GPU's first contact (gpu_check.sh): per-mode leak with its
# gradient, U strided as the batched tick makes it, a reset inside.
FIRST_CONTACT_F64 = "K8-B19-n32-mode-keep-strided"


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        pytest.param(
            case,
            dtype,
            id=f"{name}-{case}",
            marks=[pytest.mark.first_contact] if (case, name) == (FIRST_CONTACT_F64, "f64") else [],
        )
        for name, dtype in (("f64", torch.float64), ("f32", torch.float32))
        for case in CASES
    ],
)
def test_matches_fused(case, dtype, monkeypatch):
    """Outputs and gradients equal FusedFieldLoop's (tolerances in the module docstring)."""
    ft = _module()
    K, B, n, scalar_keep, resets, strided, block = CASES[case]
    _force_block(ft, monkeypatch, block)
    args, gZ = _inputs(K, B, n, scalar_keep, resets)
    ref_outs, ref_grads = _run(FusedFieldLoop, args, gZ, dtype)
    outs, grads = _run(ft.TritonFieldLoop, args, gZ, dtype, _device(ft), strided)
    if K > 1:  # the cap fired on some tick (and not on every one)
        rms = ref_outs[0].norm(dim=2) / math.sqrt(n)
        capped = (rms > MAX_RMS * (1 - 1e-5)).float().mean().item()
        assert 0 < capped < 1, capped
    if dtype == torch.float64:
        _check(outs, grads, ref_outs, ref_grads, dtype)
    else:
        check32(outs, grads, args, gZ)


# The kernels a training run launches, specialized as it specializes them: the default model
# (n = 32, a scalar leak without gradient, the default constants), U a column slice of the
# drive matmul's rows (2n + atom_dim wide), periodic resets, B a multiple of 16, at the two
# blocks the launcher picks on an H100/H200 (B = 1024: 8 streams a program; 4096: 16). On
# CUDA at those B and K = 64 (the bench's and the trainer's own binaries: a GPU's first
# contact compiles these), the fused references on the device too (float64 and float32:
# milliseconds there, where the CPU takes 16-28 s); under the interpreter the same blocks at
# B = 16 and 32, K = 8.
TRAINER_LAUNCHES = {1024: 8, 4096: 16}


def _at_the_trainers_launch(ft, B, monkeypatch):
    """The Triton loop at the trainer's launch of B streams (see TRAINER_LAUNCHES), judged
    against the fused loop on the same device (loop_check.judge_against_fused)."""
    from atom_train.model.config import ModelConfig
    from atom_train.model.loop_check import judge_against_fused, loop_results, sample_loop_inputs

    dev = _device(ft)
    config = ModelConfig()
    c = FieldConsts.of(config)
    if dev == "cpu":
        _force_block(ft, monkeypatch, TRAINER_LAUNCHES[B])
        B, K = 2 * TRAINER_LAUNCHES[B], 8
    else:
        K = 64
        assert ft.launch_plan(B, c.n, ft.sm_count(torch.device(dev)))[0] in (8, 16)
    width = 2 * config.n_modes + config.atom_dim
    args, grad_of = sample_loop_inputs(K, B, c, dev, u_width=width, seed=3)
    assert not args[0].is_contiguous()  # (U as the trainer passes it)
    resets = tuple(t % 40 == 20 for t in range(K))  # the lockstep schedule's kind
    gZ = torch.randn(K, B, 2 * c.n, generator=torch.Generator().manual_seed(4))
    got = loop_results(ft.TritonFieldLoop.apply, args, resets, c, gZ, grad_of)
    return judge_against_fused(got, args, resets, c, gZ, grad_of)


@pytest.mark.first_contact
@pytest.mark.parametrize("B", list(TRAINER_LAUNCHES))
def test_matches_fused_at_the_trainers_launches(B, monkeypatch, record_property):
    j = _at_the_trainers_launch(_module(), B, monkeypatch)
    # What the device measured, for the record (gpu_check's summary lists it).
    record_property("error_ratio", round(j.ratio, 3))
    record_property("fused_error", max(ref for _, ref in j.errors.values()))
    assert j.failure is None, j.failure


# Bugs a review could miss, each planted in the kernels' source (one line): every one must
# fail both the parity test above and the self-check (`check_triton_loop`).
PLANTED = {
    # every gradient of U 1e-4 too large
    "gradient-1e-4-off": ("* gt, mask=m2)", "* gt * 1.0001, mask=m2)", 2),
    # the RMS cap's projection dropped from the gradient where the cap fires
    "rms-cap-branch": (
        "capc = tl.where(norm > CAP, _div(sig * sig * sig, CAP * CAP, F64), 0.0)",
        "capc = tl.where(norm > CAP, 0.0, 0.0)",
        1,
    ),
    # where phase sync is skipped, the field turned over instead of left as it is
    "phase-sync-branch": (
        "q0 = tl.where(on, _div(sr, rc, F64), 1.0)[:, None]",
        "q0 = tl.where(on, _div(sr, rc, F64), -1.0)[:, None]",
        1,
    ),
    # phase sync's gradient taken where it was skipped
    "phase-sync-gradient": ("onv = rho2 > PSM * PSM", "onv = rho2 > 0.0", 1),
}


def _plant(ft, monkeypatch, tmp_path, old, new, count):
    """The launcher's kernels replaced by those of a copy of field_kernels' source with `old`
    replaced by `new` (`count` times): imported from a file, under the interpreter."""
    import importlib.util
    import inspect

    from atom_train.model import field_kernels

    src = inspect.getsource(field_kernels)
    assert src.count(old) == count, old
    path = tmp_path / "planted_field_kernels.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location("planted_field_kernels", path)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    monkeypatch.setattr(ft, "field_fwd_kernel", planted.field_fwd_kernel)
    monkeypatch.setattr(ft, "field_bwd_kernel", planted.field_bwd_kernel)


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_fails_the_parity_test_and_the_self_check(bug, monkeypatch, tmp_path):
    from atom_train.model.config import ModelConfig
    from atom_train.model.loop_check import check_triton_loop

    ft = _module()
    if not ft.INTERPRETED:
        pytest.skip("planted into the interpreted kernels (the CPU's proof)")
    _plant(ft, monkeypatch, tmp_path, *PLANTED[bug])
    j = _at_the_trainers_launch(ft, 1024, monkeypatch)
    assert j.failure is not None and "from the float64 loop's" in j.failure
    small = FieldConsts.of(ModelConfig(n_modes=8))  # (the check with the learnable leak)
    check = check_triton_loop(
        torch.device("cpu"), small, 4, per_mode_keep=True, keep_grad=True, u_width=24
    )
    assert check.failure is not None and "from the float64 loop's" in check.failure
    print(f"{bug}: parity: {j.failure}; self-check: {check.failure}")


@triton.jit
def _gain_steps(R, S, n, RATE: tl.constexpr, LOG2_T: tl.constexpr, FLOOR: tl.constexpr):
    """field_kernels._gain_step of each r' in R, into S."""
    i = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    m = i < n
    r = tl.load(R + i, mask=m, other=1.0)
    tl.store(S + i, field_kernels._gain_step(r, RATE, LOG2_T, FLOOR), mask=m)


@pytest.mark.parametrize(("rate", "target"), [(0.01, 1.0), (0.01, 0.8), (0.05, 1.0)])
def test_the_gain_step_is_rounded_once_near_one(rate, target):
    """The controller's step (field_kernels._gain_step), in ulps of the step, against the
    float64 step of the same float32 r' (on the device the kernels run on: a GPU's own
    arithmetic there, numpy's under the interpreter). Bounds from the error model of the
    step (docs/gpu_box.md): one rounding (0.5 ulp), the polynomial's few roundings of
    expm1(y) <= |y| < 0.35, the exponent's roundings and log2's approximation times the rate
    (|x| 2^-22 each); where the step is below 1 an ulp is half as large. Near 1 (|y| < 0.02,
    the defaults' steady state) <= 0.75 ulp; where the polynomial serves <= 2 ulp; beyond
    (a large rate far from the target: Triton's exp2, within 2 ulp on a GPU, plus the
    exponent's roundings) <= 4 ulp. Measured under the interpreter: 0.52, 1.01, 1.46."""
    ft = _module()
    dev = _device(ft)
    r = torch.cat([torch.logspace(-8, math.log10(4.0), 8000), torch.tensor([1e-6, 4.0])]).float()
    log2_t = math.log2(target)
    out = torch.empty(r.numel(), device=dev)
    _gain_steps[(triton.cdiv(r.numel(), 1024),)](r.to(dev), out, r.numel(), rate, log2_t, 1e-6)
    x = rate * (log2_t - torch.log2(r.double().clamp(min=1e-6)))
    exact = torch.exp2(x)
    ulp = torch.exp2(torch.floor(torch.log2(exact)) - 23)
    err = (out.cpu().double() - exact).abs() / ulp
    y = (x * math.log(2)).abs()
    near, poly = y < 0.02, y < 0.35
    worst = [float(err[m].max()) for m in (near, poly, y >= 0)]
    assert near.sum() > 100 and worst[0] <= 0.75 and worst[1] <= 2.0 and worst[2] <= 4.0, worst
    print(f"rate {rate}, target {target}: near 1, polynomial, all: {worst} ulp")


def test_launch_plan():
    """Every SM busy where B allows: 8 streams a program until 16 would not cost more SM
    time; 16 only while the tiles are small; warps from the tile size."""
    from atom_train.model.field_kernels import launch_plan as plan

    assert plan(1024, 32, 132) == (8, 4)  # 128 programs on 132 SMs (16 would use 64)
    assert plan(4096, 32, 132) == (16, 8)  # 256 programs: 132 + 124, or one wave of 2/SM
    assert plan(2048, 32, 132) == (16, 8)  # a tie (one wave of 128 vs two of 132 + 124)
    assert plan(16384, 32, 132) == (16, 8)
    assert plan(256, 32, 132) == (8, 4)
    assert plan(4096, 16, 132) == (16, 8)
    for n in (64, 128):  # 8 streams fill 8 warps
        assert plan(4096, n, 132) == (8, 8)
    assert plan(3, 8, 1) == (8, 4)
    assert plan(32, 8, 1) == (16, 8)
    with pytest.raises(ValueError):
        plan(0, 32, 132)


def test_reset_pattern():
    """The reset flags travel as (first, period) where they are periodic, else as a table."""
    ft = _module()
    assert ft._reset_pattern((False,) * 5) == (5, 5, False)
    assert ft._reset_pattern((False, True, False, False, True, False, False)) == (1, 3, False)
    assert ft._reset_pattern((True,)) == (0, 1, False)
    assert ft._reset_pattern((False, False, True, False)) == (2, 4, False)
    assert ft._reset_pattern((True, True, False, True))[2]


def test_backward_deterministic_and_needs_input_grad():
    """Two backward runs are bit-identical (B = 19: two programs' partial sums); with keep
    and z not requiring gradients the rest still matches the fused loop."""
    ft = _module()
    args, gZ = _inputs(4, 19, 8, False, [t == 2 for t in range(4)], seed=1)
    dev = _device(ft)
    first = _run(ft.TritonFieldLoop, args, gZ, torch.float32, dev)
    second = _run(ft.TritonFieldLoop, args, gZ, torch.float32, dev)
    for a, b in zip(first[0] + first[1], second[0] + second[1], strict=True):
        assert torch.equal(a, b)
    some = (0, 3, 4, 5, 6)  # U, ar, ai, Cr, Ci
    outs, grads = _run(ft.TritonFieldLoop, args, gZ, torch.float32, dev, grad_of=some)
    check32(outs, grads, args, gZ, some)


def test_registered_and_available():
    ft = _module()
    from atom_train.model.field_loops import LOOPS

    assert ft.triton_available(_device(ft))
    args, _ = _inputs(2, 3, 8, True, [False, False])
    dev = _device(ft)
    a = [x.to(dev, torch.float32) if isinstance(x, torch.Tensor) else x for x in args]
    with torch.no_grad():
        outs = [x.cpu() for x in LOOPS["triton"](*a)]
    check32(outs, [], args, None, grad_of=())


def test_cpu_without_interpreter_says_what_to_do():
    """On CPU tensors without TRITON_INTERPRET the loop refuses with the fix in the message."""
    code = """
import torch
from atom_train.model.config import FieldConsts
from atom_train.model import field_triton as ft
assert not ft.INTERPRETED and not ft.triton_available("cpu") and not ft.triton_available()
K, B, n = 2, 3, 8
args = (torch.zeros(K, B, 2 * n), torch.zeros(B, 2 * n), torch.tensor(0.9), torch.zeros(n),
        torch.zeros(n), torch.zeros(n, n), torch.zeros(n, n), torch.ones(B), torch.zeros(B),
        (False,) * K,
        FieldConsts(n=n, dt=1.0, max_rms=4.0, log_target=0.0, amp_rate=0.01))
try:
    ft.TritonFieldLoop.apply(*args)
except RuntimeError as e:
    print(e)
else:
    raise SystemExit("no error")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "needs a CUDA device" in r.stdout
    assert "TRITON_INTERPRET=1" in r.stdout and "--recurrence fused" in r.stdout


def test_launches_run_under_the_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device, not on the tensors': both launches run
    inside `on_device_of(U)`, which makes U's device current (cuda:1 while cuda:0 is)."""
    import contextlib
    import types

    ft = _module()
    assert ft.on_device_of(torch.zeros(1)).__class__ is contextlib.nullcontext
    ctx = ft.on_device_of(types.SimpleNamespace(device=torch.device("cuda", 1)))
    assert isinstance(ctx, torch.cuda.device) and ctx.idx == 1  # (entered only on a GPU)
    seen = []

    def recording(x):
        seen.append(x.device)
        return contextlib.nullcontext()

    monkeypatch.setattr(ft, "on_device_of", recording)
    args, gZ = _inputs(2, 3, 8, True, [False, False])
    dev = _device(ft)
    _run(ft.TritonFieldLoop, args, gZ, torch.float32, dev)
    assert seen == [torch.device(dev)] * 2  # the forward's launch and the backward's


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_second_gpus_tensors_run_on_the_second_gpu():
    ft = _module()
    args, gZ = _inputs(4, 5, 8, True, [False] * 4)
    assert torch.cuda.current_device() == 0
    outs, grads = _run(ft.TritonFieldLoop, args, gZ, torch.float32, "cuda:1")
    check32(outs, grads, args, gZ)
