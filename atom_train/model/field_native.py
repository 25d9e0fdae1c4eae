"""The field loop in Rust (the `atomfield` crate, `atomfield-rs/`, bound by the extension
`atom_train._atomdata`): `NativeFieldLoop`, recurrence "native", the CPU default.

Same signature, outputs and gradients as `atom_train.model.field_loops.FusedFieldLoop`:

    Zs, Es, g, E = NativeFieldLoop.apply(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)

What it does (atomfield-rs/src/lib.rs has the details):

- The streams run in blocks of 16 (`_atomdata.FIELD_BLOCK`), each stepped through the whole
  window, on the extension's pool of `torch.get_num_threads()` threads, with the GIL
  released. The loop's constants are the model's `FieldConsts`, handed over as it is. A block's
  per-stage products ([16, 2n] x [2n, 2n]) are hand-tiled for AVX-512, AVX2 + FMA or plain
  Rust, picked at run time (`_atomdata.field_kernel()`).
- The forward stores only the field after each tick (its output) and the gain each tick
  used; the backward walks the window in reverse and recomputes each tick from the stored
  field, with the fused loop's hand-derived gradient. Memory: K*B*(2n+1) numbers, where the
  fused loop keeps ~K*B*26n.
- Deterministic: the parameters' gradients are per-block partial sums added in block order,
  so a result is the same bit for bit from run to run *and whatever the number of threads or
  the instruction set* (tested); exact resume holds.
- Arithmetic: the fused loop's, step for step, except the order of sums (products sum in
  index order, sums over the modes in eight interleaved partial sums) and phi = y (1/(1+|y|))
  (one division a mode): float32 results agree with the fused loop's to rounding
  (tests/model/test_field_native.py states the tolerances).
"""

from __future__ import annotations

import torch
from torch import Tensor

from atom_train import _atomdata
from atom_train._atomdata import AtomFieldError
from atom_train.model.config import FieldConsts

__all__ = ["AtomFieldError", "NativeFieldLoop", "native_kernel"]


def native_kernel() -> str:
    """The instruction set the native loop runs with here ("avx512", "avx2", "portable")."""
    return _atomdata.field_kernel()


def _arrays(*xs: Tensor) -> list[Tensor]:
    """Detached, contiguous CPU tensors of one float dtype (numpy views are taken of them)."""
    dtype = xs[0].dtype
    for x in xs:
        if x.device.type != "cpu":
            raise RuntimeError(
                f"recurrence 'native' runs on the CPU, got a tensor on {x.device}: use "
                "--recurrence triton (or fused) on CUDA"
            )
        if x.dtype != dtype or dtype not in (torch.float32, torch.float64):
            raise TypeError(
                "recurrence 'native' needs float32 (or float64) tensors of one dtype, got "
                f"{sorted({str(y.dtype) for y in xs})}"
            )
    return [x.detach().contiguous() for x in xs]


class NativeFieldLoop(torch.autograd.Function):
    """Steps 2-6 for K ticks in Rust; the same inputs, outputs and gradients as
    `FusedFieldLoop` (see the module docstring)."""

    @staticmethod
    def forward(ctx, U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
        *ins, g, E = _arrays(U, z, keep, ar, ai, Cr, Ci, g, E)
        resets = [bool(r) for r in resets]
        zs, es, gs, g1, e1 = _atomdata.field_forward(
            *(x.numpy() for x in ins),
            g.numpy(),
            E.numpy(),
            resets,
            c,
            torch.get_num_threads(),
        )
        Zs, Es, Gs, g1, e1 = (torch.from_numpy(x) for x in (zs, es, gs, g1, e1))
        ctx.save_for_backward(*ins, Zs, Gs)
        ctx.resets, ctx.c = resets, c
        ctx.mark_non_differentiable(Es, g1, e1)
        return Zs, Es, g1, e1

    @staticmethod
    def backward(ctx, gZs, _gEs, _gg, _gE):
        *ins, Zs, Gs = ctx.saved_tensors
        (gZs,) = _arrays(gZs.to(Zs.dtype))
        grads = _atomdata.field_backward(
            *(x.numpy() for x in ins),
            Zs.numpy(),
            Gs.numpy(),
            gZs.numpy(),
            ctx.resets,
            ctx.c,
            ctx.needs_input_grad[2],
            torch.get_num_threads(),
        )
        gU, gz, gkeep, g_ar, g_ai, gCr, gCi = (
            None if x is None else torch.from_numpy(x) for x in grads
        )
        if not ctx.needs_input_grad[1]:
            gz = None
        return gU, gz, gkeep, g_ar, g_ai, gCr, gCi, None, None, None, None
