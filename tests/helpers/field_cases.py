"""Windows of the field loop's inputs, and how two loops are run and compared: shared by the
tests that hold a loop to `FusedFieldLoop` (tests/model/test_field_triton.py,
tests/model/test_field_native.py).

Inputs are the model's kind: drives 0.25 + N(0, 0.28^2) on the real parts and N(0, 0.28^2)
on the imaginary ones (`reset_parameters`'s drive bias and input-layer scale), decay rates
log-spaced over [0.05, 0.5], small frequencies and coupling; max_rms 0.9 so that the RMS cap
fires; one stream with zero drive and zero field, where |y| = 0 and phase sync is skipped,
the conventions FusedFieldLoop fixes.
"""

from __future__ import annotations

import math

import torch

from atom_train.model.config import FieldConsts

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
    if B > 1:  # a silent stream: y = 0 in every stage, phase sync skipped
        U[:, 0] = 0
        z[0] = 0
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


# (outputs: max |a - b|; gradients: ||a - b|| <= rel ||b|| + abs), per dtype: the project's
# float32 tolerances, and float64 ones for two implementations of the same arithmetic.
TOLERANCES = {torch.float64: (1e-10, 1e-10, 0.0), torch.float32: (1e-5, 1e-4, 1e-7)}


def check(outs, grads, ref_outs, ref_grads, dtype, tolerances=None):
    """Every output and gradient of one loop against another's, within `tolerances`
    (default: TOLERANCES[dtype]); returns the worst (output error, relative gradient error)."""
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
