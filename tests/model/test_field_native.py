"""The native field loop (`atom_train.model.field_native.NativeFieldLoop`, Rust) against
`FusedFieldLoop`: every output (Zs, Es, g, E) and every gradient (U, z, keep, a, Cr, Ci; a
random upstream gradient on Zs), at n = 8 to 64, B across several blocks of 16 streams with
a partial last one, scalar and per-mode keep (the learnable leak), resets inside the window,
a window cut by an episode end, a silent stream and U as a strided view; property tests over
random shapes and schedules; determinism. The single-stream reference holds it through the
batched tick (tests/model/test_batched.py); the Rust crate's own tests hold it to a plain
reference and finite differences (atomfield-rs/src/tests.rs).

Tolerances (values are O(1)):
- float64: outputs max |a - b| <= 1e-12; gradients ||a - b|| <= 1e-12 ||b|| per tensor (the
  two implement the same arithmetic; only the order of sums differs).
  Measured over CASES: outputs 1.6e-15, gradients 1.9e-15.
- float32: against the float64 fused loop on the same window, every output and gradient
  within ERROR_RATIO = 8 times the float32 fused loop's own error there (the error model of
  atom_train.model.loop_check, `judge_float32`: errors relative, per stream where a tensor
  has a row per stream). Measured over CASES: the native loop's errors at most 4.1 times
  the fused loop's (its parameter gradients, summed in another grouping), the fused loop's
  own 4e-8 to 1e-6, so a gradient 1e-5 off fails in every float32 case (planted:
  `test_a_gradient_1e-5_off_fails_every_float32_case`).
- Determinism: two runs are bit-identical, and so are runs with 1, 2 and 3 threads (the
  streams' blocks do not depend on the thread count, and their partial sums are added in
  block order).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.field_cases import MAX_RMS, check, check32, inputs, judge32, references, run
from hypothesis import given, settings
from hypothesis import strategies as st

from atom_train.model.config import FieldConsts
from atom_train.model.field_loops import LOOPS, FusedFieldLoop
from atom_train.model.field_native import NativeFieldLoop, native_kernel
from atom_train.model.loop_check import GRADIENTS, OUTPUTS, judge_float32

TIGHT64 = (1e-12, 1e-12, 0.0)

# (K, B, n, scalar keep, resets, strided U). B = 37: three blocks of 16 streams, the last
# one partial; B = 5 and 1: one partial block.
CASES = {
    "K24-B37-n16-mode-keep": (24, 37, 16, False, [t % 10 == 3 for t in range(24)], False),
    "K40-B19-n32-scalar-keep-reset-at-0": (40, 19, 32, True, [t % 20 == 0 for t in range(40)], False),
    "K8-B19-n32-mode-keep-strided": (8, 19, 32, False, [t == 5 for t in range(8)], True),
    "K10-B33-n64-mode-keep": (10, 33, 64, False, [t == 7 for t in range(10)], False),
    "K12-B5-n8-irregular-resets": (12, 5, 8, True, [t in (2, 3, 9) for t in range(12)], False),
    "K1-B16-n32-reset": (1, 16, 32, False, [True], False),
    "K6-B1-n12-scalar-keep": (6, 1, 12, True, [False] * 6, False),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_fused(case, dtype):
    K, B, n, scalar_keep, resets, strided = CASES[case]
    args, gZ = inputs(K, B, n, scalar_keep, resets)
    ref_outs, ref_grads = run(FusedFieldLoop, args, gZ, dtype)
    outs, grads = run(NativeFieldLoop, args, gZ, dtype, strided=strided)
    if K > 1:  # the cap fired on some tick (and not on every one)
        rms = ref_outs[0].norm(dim=2) / math.sqrt(n)
        capped = (rms > MAX_RMS * (1 - 1e-5)).float().mean().item()
        assert 0 < capped < 1, capped
    if dtype == torch.float64:
        check(outs, grads, ref_outs, ref_grads, dtype, TIGHT64)
    else:
        check32(outs, grads, args, gZ)


@pytest.mark.parametrize("case", list(CASES))
def test_a_gradient_1e_5_off_fails_every_float32_case(case):
    """The float32 bound is tight enough to see a realistic bug: each gradient of the native
    loop, made 1e-5 relative too large (one at a time), fails the judgement of every case."""
    K, B, n, scalar_keep, resets, strided = CASES[case]
    args, gZ = inputs(K, B, n, scalar_keep, resets)
    outs, grads = run(NativeFieldLoop, args, gZ, torch.float32, strided=strided)
    refs = references(args, gZ)
    assert judge32(outs, grads, args, gZ, refs=refs).failure is None
    for i in range(len(grads)):
        if (i == 2 and scalar_keep) or not grads[i].any():
            continue  # (one cancelling sum; a gradient that is 0: the reset at tick 0 cuts z)
        biased = [g * (1 + 1e-5) if j == i else g for j, g in enumerate(grads)]
        failure = judge32(outs, biased, args, gZ, refs=refs).failure
        assert failure is not None and "float64 loop's" in failure, (i, failure)


def _two_windows(loop, args, gZ, dtype, K1):
    """The first K1 ticks as one window, the rest as the next, chained as the batched tick
    chains them (z, g and E carried; z with its gradient); the gradients of the whole."""
    U, z, keep, ar, ai, Cr, Ci, g, E, resets, c = args
    ins = [x.to(dtype).requires_grad_() for x in (U, z, keep, ar, ai, Cr, Ci)]
    U_, z_, keep_, ar_, ai_, Cr_, Ci_ = ins
    g, E = g.to(dtype), E.to(dtype)
    Zs1, Es1, g1, E1 = loop.apply(U_[:K1], z_, keep_, ar_, ai_, Cr_, Ci_, g, E, resets[:K1], c)
    Zs2, Es2, g2, E2 = loop.apply(
        U_[K1:], Zs1[-1], keep_, ar_, ai_, Cr_, Ci_, g1, E1, resets[K1:], c
    )
    Zs = torch.cat([Zs1, Zs2])
    grads = torch.autograd.grad(Zs, ins, gZ.to(dtype))
    outs = [Zs, torch.cat([Es1, Es2]), g2, E2]
    return [o.detach() for o in outs], list(grads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_a_window_cut_by_an_episode_end(dtype):
    """The lockstep schedule cuts a window where an episode ends: a short window, then one
    that starts with the reset. Chained with the gradient through the carried field, the two
    match the fused loop's (and the reset cuts the gradient to the first window's past)."""
    K, K1 = 20, 7
    resets = [t == K1 for t in range(K)]
    args, gZ = inputs(K, 21, 16, False, resets, seed=3)
    ref_outs, ref_grads = _two_windows(FusedFieldLoop, args, gZ, dtype, K1)
    outs, grads = _two_windows(NativeFieldLoop, args, gZ, dtype, K1)
    if dtype == torch.float64:
        check(outs, grads, ref_outs, ref_grads, dtype, TIGHT64)
    else:  # (against the chained fused loop in float64; one float32 reference)
        truth = _two_windows(FusedFieldLoop, args, gZ, torch.float64, K1)
        names = [*OUTPUTS, *GRADIENTS]
        j = judge_float32(
            dict(zip(names, outs + grads, strict=True)),
            [dict(zip(names, ref_outs + ref_grads, strict=True))],
            dict(zip(names, truth[0] + truth[1], strict=True)),
        )
        assert j.failure is None, j.failure
    # A gradient on the second window's fields only: nothing reaches the field entering the
    # first window (the reset between them cuts it), exactly.
    gZ2 = gZ.clone()
    gZ2[:K1] = 0
    _, grads = _two_windows(NativeFieldLoop, args, gZ2, dtype, K1)
    assert torch.count_nonzero(grads[1]) == 0 and torch.count_nonzero(grads[0][K1:]) > 0


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    K=st.integers(1, 12),
    B=st.integers(1, 40),
    n=st.integers(1, 20),
    scalar_keep=st.booleans(),
    resets=st.lists(st.booleans(), min_size=12, max_size=12),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_shapes_and_schedules(K, B, n, scalar_keep, resets, seed):
    """Any K, B (full and partial blocks), n (not a multiple of a vector register), keep
    and reset schedule: float64 outputs and gradients as the fused loop's (1e-10: random
    windows include ill-conditioned phase syncs, where rounding is amplified)."""
    args, gZ = inputs(K, B, n, scalar_keep, resets[:K], seed=seed)
    ref = run(FusedFieldLoop, args, gZ, torch.float64)
    got = run(NativeFieldLoop, args, gZ, torch.float64)
    check(*got, *ref, torch.float64)


def _all(outs_grads) -> list[torch.Tensor]:
    outs, grads = outs_grads
    return [*outs, *grads]


def test_bit_identical_across_runs_and_thread_counts():
    """The same bits from run to run and with 1, 2 or 3 threads (B = 70: five blocks)."""
    args, gZ = inputs(12, 70, 32, False, [t == 4 for t in range(12)], seed=5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        base = _all(run(NativeFieldLoop, args, gZ, torch.float32))
        again = _all(run(NativeFieldLoop, args, gZ, torch.float32))
        runs = {}
        for threads in (2, 3):
            torch.set_num_threads(threads)
            runs[threads] = _all(run(NativeFieldLoop, args, gZ, torch.float32))
    finally:
        torch.set_num_threads(before)
    for other in (again, runs[2], runs[3]):
        for a, b in zip(base, other, strict=True):
            assert torch.equal(a, b)


def test_only_the_gradients_asked_for():
    """With keep and z not requiring gradients the rest still matches the fused loop, and
    the loop runs under no_grad (scoring) with the same outputs."""
    args, gZ = inputs(6, 19, 8, False, [t == 2 for t in range(6)], seed=1)
    some = (0, 3, 4, 5, 6)  # U, ar, ai, Cr, Ci
    got = run(NativeFieldLoop, args, gZ, torch.float32, grad_of=some)
    check32(*got, args, gZ, some)
    with torch.no_grad():
        outs = NativeFieldLoop.apply(*[x.float() if torch.is_tensor(x) else x for x in args])
    for a, b in zip(outs, got[0], strict=True):
        assert torch.equal(a, b)  # the forward is the same with and without the graph


def test_registered_with_its_kernel():
    args, _ = inputs(2, 3, 8, True, [False, False])
    a = [x.float() if torch.is_tensor(x) else x for x in args]
    with torch.no_grad():
        outs = [x.detach() for x in LOOPS["native"](*a)]
    check32(outs, [], args, None, grad_of=())
    assert native_kernel() in ("avx512", "avx2", "portable")


def test_wrong_device_or_dtype_says_what_to_do():
    args, _ = inputs(2, 3, 4, True, [False, False])
    mixed = [x.float() if torch.is_tensor(x) else x for x in args]
    mixed[0] = mixed[0].double()
    with pytest.raises(TypeError, match="float32 \\(or float64\\) tensors of one dtype"):
        NativeFieldLoop.apply(*mixed)
    meta = [x.float().to("meta") if torch.is_tensor(x) else x for x in args]
    with pytest.raises(RuntimeError, match="runs on the CPU, got a tensor on meta"):
        NativeFieldLoop.apply(*meta)


def test_the_constants_cross_as_the_models_one_fieldconsts():
    """The native loop reads the model's FieldConsts itself, by attribute: the object's
    fields (but n) are the crate's constants, in its order, each one read (a gain ceiling
    under the gains the loop reaches caps them there); anything else is refused, naming
    what it lacks."""
    import dataclasses

    from atom_train import _atomdata
    from atom_train.model.field_native import AtomFieldError

    names = [f.name for f in dataclasses.fields(FieldConsts) if f.name != "n"]
    assert names == _atomdata.FIELD_CONSTS
    args, _ = inputs(6, 3, 8, True, [False] * 6)
    a = [x.float() if torch.is_tensor(x) else x for x in args]
    *arrays, c = a
    with torch.no_grad():
        g_free = NativeFieldLoop.apply(*arrays, c)[2]
        g_capped = NativeFieldLoop.apply(*arrays, dataclasses.replace(c, gain_max=0.6))[2]
    assert g_free.max() > 0.6 and g_capped.max() <= 0.6
    as_dict = {k: getattr(c, k) for k in names}
    with pytest.raises(AtomFieldError, match=r"the model's FieldConsts .* with a float dt"):
        NativeFieldLoop.apply(*arrays, as_dict)
