"""The field loop (the model's steps 2-6 over a window, docs/model.md) as two Triton kernels:
one launch for the whole window's forward, one for its backward (`TritonFieldLoop`,
recurrence "triton"). The kernels themselves are in `atom_train.model.field_kernels` (Triton only,
no torch, so the kernel report compiles them anywhere); this module launches them.

Same signature, outputs and gradients as `atom_train.model.field_loops.FusedFieldLoop`:

    Zs, Es, g, E = TritonFieldLoop.apply(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)

Design.

- **The state lives in registers.** One program owns BLOCK streams and loops over all K
  ticks inside the kernel. The field is kept as two [BLOCK, NP] tiles (real and imaginary
  parts), NP = next power of two >= max(n, 16); the padded modes stay exactly 0 because
  every padded entry of U, z, keep, a and C is loaded as 0 (masked loads: nothing is padded
  on the host). The streams are independent, so programs never talk to each other.
- **C is never held in registers.** An FMA `tl.dot` keeps, in each thread, its rows of the
  left operand and its columns of the right one for the whole contraction: with C as an
  operand that is ~NP registers per column a thread owns, which spilled kilobytes a thread at
  n = 64 and made n = 128 unusable. So every product with C is a loop over KC = 16 modes of
  the contraction (`field_kernels._cmatmul`): the stage's phi (or, backwards, its gradient)
  is written once to a slice of an output tensor that is overwritten later anyway (Zs[t] in
  the forward; gz and gU[t] in the backward), and each chunk of it and of C is read back
  from memory (L1/L2: C is 8 KB at n = 32, 128 KB at n = 128), between two barriers. A
  thread then holds one chunk's operands, whatever n is.
- **C phi per stage** on complex rows: k = u + a y + phi C^T, i.e. kr += pr Cr^T - pi Ci^T
  and ki += pr Ci^T + pi Cr^T, four dots per chunk. The kernels read Cr^T and Ci^T straight
  from the parameters (transposed views, by strides) and return the gradients of Cr and Ci.
- **The backward recomputes instead of storing.** The forward stores only its output Zs and
  the gain used at each tick G [K,B] (the controller is not invertible through its clamp).
  The backward walks t = K-1 ... 0; for each tick it reloads the field entering it (Zs[t-1],
  z at t = 0, zeros after a reset), recomputes the four RK4 stages, phase sync and cap,
  then back-propagates through cap, phase sync, RK4 and the leak with
  FusedFieldLoop.backward's formulas (same conventions at |y| = 0 and below the phase-sync
  threshold). Storage is K*B*(2n+1) numbers instead of the fused loop's ~K*B*26n.
- **Parameter gradients without atomics.** dL/dCr^T = sum pr^T gkr + pi^T gki and dL/dCi^T
  = sum pr^T gki - pi^T gkr are two dots per stage over the 2 BLOCK stacked rows [pr; pi]
  (a contraction of 2 BLOCK >= 16, what Triton 3.6 requires: hence BLOCK >= 8), added KC
  rows at a time to the program's own row of a partials buffer [n_programs, F] (read, add,
  write back: the n x n sums never sit in registers); dL/da and dL/dkeep accumulate in
  registers and are written once. The wrapper finishes with one torch sum over the program
  axis. No float atomics anywhere: the result does not depend on scheduling (two backward
  runs are bit-identical; tested).
- **Every SM busy.** `field_kernels.launch_plan` picks 8 or 16 streams a program (16 only
  while NP <= 32) from B and the device's SM count, the one that gives the busiest SM the
  fewest streams to step: B = 1024 on 132 SMs runs 128 programs of 8 (16 would leave half
  the SMs idle), B = 4096 runs 256 of 16; 4 warps for 8 streams at n <= 32, else 8.
- **Precision.** The recurrence is IEEE fp32 whatever torch's TF32 flags say: every dot is
  `input_precision="ieee"` with an explicit `out_dtype` (Triton 3.6 otherwise assumes an
  fp32 accumulator and refuses float64) (phase sync divides by |sum of the modes|, which
  can be small, so TF32's 1e-3 relative error would be amplified), and the square roots and
  divisions are the correctly rounded `tl.sqrt_rn` / `tl.div_rn` (Triton's plain `/` and
  `sqrt` are the approximate PTX forms in fp32). Those two are fp32-only in Triton, so
  float64 (tests) uses `tl.sqrt` and `/`, which are IEEE in fp64. The controller's step
  target^rate r'^-rate = 2^x, x = rate (log2 target - log2 r'), compounds into the gain
  tick after tick, so it is not Triton's float32 exp2 (the GPU's 2-ulp ex2.approx, with
  the same sign from tick to tick where x barely moves: 64 ticks of it would be ~1.5e-5 of
  the gain): near 1 it is 1 + expm1(ln 2 x) by a short polynomial
  (`field_kernels._gain_step`: within 0.52 ulp at the defaults' steady state, 1 ulp
  elsewhere, measured; +8 to +24 instructions, registers unchanged); log2's approximation
  reaches x only times the rate. All the loop's constants are constexpr, so in float64
  they are float64 constants, not fp32 kernel arguments.
- **Resets** are passed as two scalars (first reset tick, period), derived from the tuple of
  bools on the host and checked to reproduce it; a pattern that is not an arithmetic
  progression (the lockstep schedule never makes one) falls back to a small int32 table.
- **Registers**, from the kernel report (`python -m atom_train.kernel_report`: ptxas -v,
  compiled for sm_90 without a GPU; docs/performance.md has the tables), float32, the
  launcher's blocks, Triton 3.6.0 / 3.9.0: at n <= 32 both kernels are spill-free (n = 32:
  the forward at its cap of 168 registers with 8 streams and 4 warps, three programs an SM;
  the backward 255 / 254); n = 64: forward 254 / 244 registers, no spills, backward 255 with
  28 / 8 bytes of spill stores a thread; n = 128: forward 8 bytes, backward 620 / 668 bytes
  (the bound the tests hold is 1 KiB: `SPILL_BOUND`). Larger n spills more (2.2 KB at
  n = 256): `triton_unfit_reason` says so, and `auto` should not pick triton there.

What Triton's interpreter (TRITON_INTERPRET=1, how the tests run these kernels on a CPU) does
not check, and the kernel report (tests/commands/test_kernel_report.py) therefore does: that every
variant compiles with the oldest and the newest Triton the project supports (Triton 3.6's
dots need K >= 16 and an explicit accumulator type), registers and spills, and the launch's
fill of the SMs. Still by hand: power-of-two block shapes, no Triton API newer than 3.6, that
fp32 `/` and `sqrt` are approximate on the GPU (the interpreter's numpy ops are exact), that
the barriers around the scratch rows are where a GPU needs them (the interpreter runs a
program's threads as one), and int32 overflow of offsets (time offsets are int64).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import Tensor

from atom_train.model.config import FieldConsts

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: triton_available() says no, apply() says why
    triton = None
    tl = None

_NEEDS_DEVICE = (
    "recurrence 'triton' needs a CUDA device (or TRITON_INTERPRET=1 to run the kernels on the "
    "CPU for tests): use --recurrence fused"
)

if triton is not None:
    from atom_train.model.field_kernels import (
        DEFAULT_SM_COUNT,
        compile_constants,
        field_bwd_kernel,
        field_fwd_kernel,
        launch_options,
        launch_plan,
    )


# Where the kernels stop fitting. The worst spill stores (bytes a thread) of the float32
# variants at the blocks the launcher picks, forward and backward, by padded width NP and
# leak, from the kernel report (python -m atom_train.kernel_report, Triton 3.9.0, sm_90;
# tests/commands/test_kernel_report.py holds this table to a fresh report); NP = 256 was compiled
# once by hand the same way. A kernel above SPILL_BOUND is not what `auto` should pick.
SPILL_BOUND = 1024
MEASURED_SPILLS = {  # NP: {per-mode leak: (forward, backward)}
    16: {False: (0, 0), True: (0, 0)},
    32: {False: (0, 0), True: (0, 0)},
    64: {False: (0, 8), True: (0, 8)},
    128: {False: (8, 520), True: (8, 668)},
    256: {False: (100, 2160), True: (100, 2160)},
}


def triton_unfit_reason(config_or_n, per_mode_leak: bool = False, dtype="float32") -> str | None:
    """Why the Triton kernels should not run a model of this size, or None if they fit.

    config_or_n: the number of modes, or a config with `n_modes`. Decided from the committed
    MEASURED_SPILLS table (no compile): None while the worse kernel's spill stores are within
    SPILL_BOUND (n <= 128); above, the reason names n and the figures. Only float32 (what the
    trainer runs) is tabled."""
    n = getattr(config_or_n, "n_modes", config_or_n)
    if str(dtype).removeprefix("torch.") != "float32":
        raise ValueError(f"the spill table covers float32 only, got {dtype}")
    if triton is None:
        return "Triton is not installed"
    from atom_train.model.field_kernels import padded_modes

    NP = padded_modes(n)
    if NP not in MEASURED_SPILLS:
        top = max(MEASURED_SPILLS)
        return (
            f"n = {n}: the Triton kernels were compiled up to n = {top}, and already spill "
            f"{MEASURED_SPILLS[top][bool(per_mode_leak)][1]} bytes a thread there"
        )
    fwd, bwd = MEASURED_SPILLS[NP][bool(per_mode_leak)]
    if max(fwd, bwd) <= SPILL_BOUND:
        return None
    return (
        f"n = {n}: the Triton kernels spill {fwd} (forward) and {bwd} (backward) bytes a "
        f"thread to local memory, above the {SPILL_BOUND} bytes they are allowed "
        "(Triton 3.9, sm_90)"
    )


def _interpreted() -> bool:
    """Whether the kernels were decorated under TRITON_INTERPRET=1 (read by @triton.jit at
    import): then they run on CPU tensors, through numpy."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(field_fwd_kernel, InterpretedFunction)


INTERPRETED = _interpreted()


def triton_available(device: torch.device | str | None = None) -> bool:
    """Triton is importable and can run the kernels on `device` (default: CUDA if present):
    a CUDA device, or any device under the interpreter. For the caller's `auto` choice."""
    if triton is None:
        return False
    if INTERPRETED:
        return True
    dev = torch.device(device) if device is not None else None
    if dev is None:
        return torch.cuda.is_available()
    return dev.type == "cuda" and torch.cuda.is_available()


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    """The SMs the launcher fills: the CUDA device's multiprocessor count; under the
    interpreter (a CPU) the report's default GPU, so tests see the launches an H200 gets."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=256)
def _reset_pattern(resets: tuple[bool, ...]) -> tuple[int, int, bool]:
    """(first reset tick, period, needs a table) for the K reset flags. The lockstep schedule
    gives an arithmetic progression (t % episode_length == 0 over consecutive ticks); any
    other pattern is passed to the kernels as a table instead."""
    K = len(resets)
    idx = [t for t, r in enumerate(resets) if r]
    if not idx:
        return K, max(K, 1), False
    r0 = idx[0]
    period = idx[1] - idx[0] if len(idx) > 1 else K
    derived = tuple(t >= r0 and (t - r0) % period == 0 for t in range(K))
    return r0, period, derived != tuple(bool(r) for r in resets)


def _launch_args(tensors, resets, c: FieldConsts):
    """Shared checks and scalars of both launches; tensors = (U, z, Cr, Ci, the rest)."""
    U, z, Cr, Ci = tensors[:4]
    if U.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(_NEEDS_DEVICE)
    K, B, D = U.shape
    n = c.n
    if 2 * n != D or tuple(z.shape) != (B, D) or Cr.shape != (n, n) or Ci.shape != (n, n):
        raise ValueError(f"field loop shapes: U {tuple(U.shape)}, z {tuple(z.shape)}, n {n}")
    if Cr.stride() != Ci.stride():
        raise ValueError("Cr and Ci must have the same strides (the kernels share them)")
    if len(resets) != K:
        raise ValueError(f"resets has {len(resets)} flags for a window of {K} ticks")
    if any(x.dtype != U.dtype for x in tensors) or U.dtype not in (torch.float32, torch.float64):
        dtypes = sorted({str(x.dtype) for x in tensors})
        raise TypeError(
            f"recurrence 'triton' needs float32 (or float64) tensors of one dtype: {dtypes}"
        )
    r0, period, table = _reset_pattern(tuple(resets))
    rst = torch.tensor(resets, dtype=torch.int32, device=U.device) if table else z
    return K, B, n, r0, period, table, rst


def on_device_of(x: Tensor):
    """The context a launch for `x` runs in: its CUDA device made current (Triton launches on
    the current device and its stream, not on the device of the tensors it is given, so a
    launch for cuda:1 while cuda:0 is current would run on the wrong GPU); nothing off CUDA."""
    if x.device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(x.device)


def _ready(x: Tensor) -> Tensor:
    """The kernels index the last dimension with stride 1 (other strides are passed)."""
    return x if x.dim() == 0 or x.stride(-1) == 1 else x.contiguous()


class TritonFieldLoop(torch.autograd.Function):
    """Steps 2-6 for K ticks in one Triton launch forward and one backward; the same inputs,
    outputs and gradients as `FusedFieldLoop` (see the module docstring)."""

    @staticmethod
    def forward(ctx, U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
        if triton is None:
            raise RuntimeError(_NEEDS_DEVICE + " (Triton is not installed)")
        U, z, keep, ar, ai = (_ready(x) for x in (U, z, keep, ar, ai))
        g, E = g.contiguous(), E.contiguous()
        K, B, n, r0, period, table, rst = _launch_args(
            (U, z, Cr, Ci, keep, ar, ai, g, E), resets, c
        )
        f64 = U.dtype == torch.float64
        CrT, CiT = Cr.t(), Ci.t()  # views: the kernels read C^T by strides
        if keep.dim() != 0 and tuple(keep.shape) != (2 * n,):
            raise ValueError(f"keep must be 0-dim or [{2 * n}], got {tuple(keep.shape)}")
        Zs = U.new_empty(K, B, 2 * n)
        Es = U.new_empty(K, B)
        Gs = U.new_empty(K, B)  # the gain used at each tick: the backward's u = g U
        g_out, E_out = torch.empty_like(g), torch.empty_like(E)
        block, _ = launch_plan(B, n, sm_count(U.device))
        consts = compile_constants(
            "fwd", c, block=block, keep_scalar=keep.dim() == 0, reset_table=table, f64=f64
        )
        with on_device_of(U), torch.profiler.record_function("triton:field_fwd"):  # one launch
            field_fwd_kernel[(triton.cdiv(B, block),)](
                U,
                U.stride(0),
                U.stride(1),
                z,
                z.stride(0),
                keep,
                ar,
                ai,
                CrT,
                CiT,
                CrT.stride(0),
                CrT.stride(1),
                g,
                E,
                Zs,
                Es,
                Gs,
                g_out,
                E_out,
                rst,
                B,
                K,
                r0,
                period,
                **consts,
                **launch_options("fwd", block, n),
            )
        ctx.save_for_backward(U, z, keep, ar, ai, Cr, Ci, Zs, Gs)
        ctx.resets, ctx.c = resets, c
        ctx.mark_non_differentiable(Es, g_out, E_out)
        return Zs, Es, g_out, E_out

    @staticmethod
    def backward(ctx, gZs, _gEs, _gg, _gE):
        U, z, keep, ar, ai, Cr, Ci, Zs, Gs = ctx.saved_tensors
        c, resets = ctx.c, ctx.resets
        K, B, n, r0, period, table, rst = _launch_args((U, z, Cr, Ci, keep, ar, ai), resets, c)
        CrT, CiT = Cr.t(), Ci.t()
        gZs = _ready(gZs)
        need_keep = ctx.needs_input_grad[2]
        scalar_keep = keep.dim() == 0
        D = 2 * n
        F = 2 * n * n + 2 * n + ((1 if scalar_keep else D) if need_keep else 0)
        block, _ = launch_plan(B, n, sm_count(U.device))
        programs = triton.cdiv(B, block)
        gU = torch.empty_like(Zs)
        gz = z.new_empty(B, D)
        part = Zs.new_empty(programs, F)
        consts = compile_constants(
            "bwd",
            c,
            block=block,
            keep_scalar=scalar_keep,
            reset_table=table,
            f64=U.dtype == torch.float64,
            need_keep=need_keep,
        )
        with on_device_of(U), torch.profiler.record_function("triton:field_bwd"):  # one launch
            field_bwd_kernel[(programs,)](
                U,
                U.stride(0),
                U.stride(1),
                z,
                z.stride(0),
                keep,
                ar,
                ai,
                CrT,
                CiT,
                CrT.stride(0),
                CrT.stride(1),
                Zs,
                Gs,
                gZs,
                gZs.stride(0),
                gZs.stride(1),
                gU,
                gz,
                part,
                F,
                rst,
                B,
                K,
                r0,
                period,
                **consts,
                **launch_options("bwd", block, n),
            )
        # The deterministic finish of the per-program partial sums.
        sizes = [n * n, n * n, n, n] + ([F - 2 * n * n - 2 * n] if need_keep else [])
        gCrT, gCiT, g_ar, g_ai, *gkeep = part.sum(0).split(sizes)
        gkeep = (gkeep[0].view(()) if scalar_keep else gkeep[0]) if need_keep else None
        gz_in = gz if ctx.needs_input_grad[1] else None
        gCr, gCi = gCrT.view(n, n).t(), gCiT.view(n, n).t()
        return gU, gz_in, gkeep, g_ar, g_ai, gCr, gCi, None, None, None, None
