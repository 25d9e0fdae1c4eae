"""Windows of the field loop's inputs, and how two loops are run and compared: shared by the
tests that hold a loop to `FusedFieldLoop` (tests/model/test_field_triton.py,
tests/model/test_field_native.py).

Inputs are the model's kind: drives 0.25 + N(0, 0.28^2) on the real parts and N(0, 0.28^2)
on the imaginary ones (`reset_parameters`'s drive bias and input-layer scale), a field of
N(0, 0.5^2) around the same coherent 0.25 (the sum of the modes away from 0, as the drive
keeps it: a random field with a sum near 0 makes a window ill-conditioned, its float32
errors up to 1.4e-6 where these are at most 5e-7), decay rates
log-spaced over [0.05, 0.5], small frequencies and coupling; max_rms 0.9 so that the RMS cap
fires; one stream with zero drive and zero field, where |y| = 0 and phase sync is skipped,
the conventions FusedFieldLoop fixes; one with zero drive and a field so small that its
modes sum below the phase-sync threshold (sync skipped on a live field).

Float64 results are held to the fused loop's by a fixed bound (`check`); float32 ones to the
float64 fused loop's within ERROR_RATIO times the float32 fused loop's own error on the same
window (`check32`: the error model of atom_train.model.loop_check, judge_float32).
"""

from __future__ import annotations

import math

import torch

from atom_train.model.config import PHASE_SYNC_MIN, FieldConsts
from atom_train.model.field_loops import available
from atom_train.model.loop_check import GRADIENTS, OUTPUTS, fused_references, judge_float32

MAX_RMS = 0.9


def inputs(K, B, n, scalar_keep, resets, seed=0):
    """Float64 inputs (U, z, keep, ar, ai, Cr, Ci, g, E, resets, c) and an upstream gradient."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64

    def normal(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def uniform(*shape, bound):
        return (torch.rand(*shape, generator=gen, dtype=f64) * 2 - 1) * bound

    U = normal(K, B, 2 * n) * 0.28
    U[..., :n] += 0.25
    z = normal(B, 2 * n) * 0.5
    z[:, :n] += 0.25  # (coherent, as the drive makes it)
    if B > 1:  # a silent stream: y = 0 in every stage, phase sync skipped
        U[:, 0] = 0
        z[0] = 0
    if B > 2:  # a quiet one: a live field whose modes sum below the phase-sync threshold
        U[:, 1] = 0
        z[1] *= PHASE_SYNC_MIN / (4 * math.sqrt(n) * z[1].norm())
    if scalar_keep:
        keep = torch.tensor(0.95, dtype=f64)
    else:
        k = 1 - torch.sigmoid(normal(n) - 3)
        keep = torch.cat([k, k])
    decay = torch.logspace(math.log10(0.05), math.log10(0.5), n, dtype=f64)
    ar = -decay * (1 + 0.1 * normal(n))
    ai = uniform(n, bound=0.5)
    Cr, Ci = uniform(n, n, bound=0.1 / math.sqrt(n)), uniform(n, n, bound=0.1 / math.sqrt(n))
    g = torch.rand(B, generator=gen, dtype=f64) + 0.5
    E = torch.rand(B, generator=gen, dtype=f64)
    c = FieldConsts(n=n, dt=1.0, max_rms=MAX_RMS, log_target=math.log(0.8), amp_rate=0.05)
    return (U, z, keep, ar, ai, Cr, Ci, g, E, tuple(resets), c), normal(K, B, 2 * n)


def run(loop, args, gZ, dtype, device="cpu", strided=False, grad_of=range(7)):
    """Outputs and the gradients of (Zs * gZ).sum() w.r.t. args[i] for i in grad_of, on CPU."""
    grad_of = tuple(grad_of)
    ins = [x.to(device, dtype) if isinstance(x, torch.Tensor) else x for x in args]
    for i in grad_of:
        ins[i].requires_grad_()
    if strided:  # U as the batched tick makes it: a column slice of a wider matmul output
        K, B, D = args[0].shape
        wide = torch.cat([ins[0].reshape(K * B, D), ins[0].new_zeros(K * B, 16)], 1)
        ins[0] = wide.detach()[:, :D].reshape(K, B, D).requires_grad_(0 in grad_of)
        assert not ins[0].is_contiguous()
    outs = loop.apply(*ins)
    grads = torch.autograd.grad(outs[0], [ins[i] for i in grad_of], gZ.to(device, dtype))
    return [o.detach().cpu() for o in outs], [x.cpu() for x in grads]


# Float64: two implementations of the same arithmetic, as a fixed bound (outputs max |a - b|;
# gradients ||a - b|| <= rel ||b|| + abs): measured 2e-15 (tests/model/test_field_triton.py,
# test_field_native.py). Float32 has no fixed bound: `check32` and the error model of
# atom_train.model.loop_check (judge_float32).
TOLERANCES = {torch.float64: (1e-10, 1e-10, 0.0)}


def check(outs, grads, ref_outs, ref_grads, dtype, tolerances=None):
    """Every output and gradient of one loop against another's, within `tolerances`
    (default: TOLERANCES[dtype], float64); returns the worst (output error, relative
    gradient error)."""
    out_tol, grad_rel, grad_abs = tolerances or TOLERANCES[dtype]
    worst_out = worst_grad = 0.0
    for name, a, b in zip(("Zs", "Es", "g", "E"), outs, ref_outs, strict=True):
        assert a.shape == b.shape, name
        err = (a - b).abs().max().item() if a.numel() else 0.0
        worst_out = max(worst_out, err)
        assert err <= out_tol, f"{name}: max |diff| {err:.2e} > {out_tol}"
    for i, (a, b) in enumerate(zip(grads, ref_grads, strict=True)):
        assert a.shape == b.shape, i
        err = (a - b).norm().item()
        worst_grad = max(worst_grad, err / max(b.norm().item(), 1e-300))
        assert err <= grad_rel * b.norm().item() + grad_abs, f"gradient {i}: {err:.2e}"
    return worst_out, worst_grad


def references(args, gZ, grad_of=range(7)):
    """The fused loop's float64 truth and float32 references on `inputs`' args, on the CPU
    (loop_check.fused_references), for several `judge32` of one window."""
    *tensors, resets, c = args
    return fused_references(tensors, resets, c, gZ, tuple(grad_of))


def judge32(outs, grads, args, gZ, grad_of=range(7), refs=None):
    """A loop's float32 outputs and gradients (`run`'s, in `grad_of` order) against the
    float64 fused loop on the same inputs, within ERROR_RATIO x the float32 fused loop's own
    error (loop_check.judge_float32, on the CPU; `refs`: `references`, if made already):
    the judgement."""
    grad_of = tuple(grad_of)
    got = dict(zip(OUTPUTS, outs, strict=True))
    got.update({GRADIENTS[i]: g for i, g in zip(grad_of, grads, strict=True)})
    truth, ours = refs or references(args, gZ, grad_of)
    return judge_float32(got, ours, truth)


def check32(outs, grads, args, gZ, grad_of=range(7)):
    """`judge32`, asserted: returns the judgement (its worst ratio, its errors)."""
    j = judge32(outs, grads, args, gZ, grad_of)
    assert j.failure is None, j.failure
    return j


def window_results(model, B, feats, tgt, masks, tick0, recurrence, reverse=False):
    """One training window of the batched tick on `model`'s device and dtype, by name: the
    logits [K,B,256], the loss, and every parameter's gradient ("grad/NAME"); `reverse`: the
    streams in the opposite order (every sum over them rounded in another order), the
    results put back in the given one."""
    from atom_train.model.batched import BatchedByteTick

    dev = next(model.parameters()).device
    rev = torch.arange(B - 1, -1, -1)
    if reverse:
        feats, tgt, masks = feats[:, rev], tgt[:, rev], masks[:, rev]
    bt = BatchedByteTick(model, B, device=dev, recurrence=recurrence)
    out = bt.run_window(feats.to(dev), tgt.to(dev), tick0, masks=masks.to(dev), return_details=True)
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    logits = out.logits.detach().cpu().reshape(feats.shape[0], B, -1)
    got = {"logits": logits[:, rev] if reverse else logits, "loss": out.loss.detach().cpu()}
    for k, p in model.named_parameters():
        got[f"grad/{k}"] = p.grad.detach().cpu()
    return got


def judge_window(got, model_of, B, feats, tgt, masks, tick0):
    """A float32 window (`window_results` on a device) against the same window on the CPU,
    with the CPU's own loop (native where the extension has it: 2-3 s a window at B = 64,
    K = 64 here, the fused loop 6-9 s): float64 (the truth) and float32 as given and
    reversed, within ERROR_RATIO x the float32 one's error (loop_check.judge_float32);
    model_of(dtype) makes the model on the CPU."""
    loop = "native" if available("native", torch.device("cpu")) else "fused"
    truth = window_results(model_of(torch.float64), B, feats, tgt, masks, tick0, loop)
    refs = [
        window_results(model_of(torch.float32), B, feats, tgt, masks, tick0, loop, reverse=r)
        for r in (False, True)
    ]
    return judge_float32(
        got, refs, truth, stream_dim={"logits": 1}, reference=f"the CPU's {loop} loop"
    )
