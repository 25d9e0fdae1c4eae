"""A float32 field loop judged against the float64 fused loop: the error model, and the
Triton loop's self-check.

The error model is every comparison of the loops' (the parity tests, the GPU box's
checks); the self-check is what ``--recurrence auto`` runs on CUDA before a run trusts the
kernels (`atom_train.model.backend.prove_recurrence`).

- `loop_results`: one window of a loop, its outputs and gradients by name;
- `judge_float32` / `judge_against_fused`: a float32 result against the float64 truth,
  within ERROR_RATIO x the float32 fused loop's own error (`fused_references`);
- `sample_loop_inputs`: a window of the model's kind that reaches every branch of the loop;
- `check_triton_loop`: the self-check, one per kernel variant a run launches
  (`kernel_variant`, `check_streams`), its outcome a `LoopCheck`.

docs/gpu_box.md has the measurements behind the bound.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import torch
from torch import Tensor

from atom_train.model.config import GAIN_MIN, PHASE_SYNC_MIN, FieldConsts
from atom_train.model.field_loops import LOOPS, FieldLoop

# The floor of a norm a relative error divides by (the loops' own clamp floor).
_TINY = 1e-30

# ---- float32 against the float64 truth: the error model of every GPU comparison ----
#
# A float32 loop's results carry its roundings, and how far those reach depends on the
# window (a phase sync near its threshold, a cancelling sum amplifies them): no fixed bound
# fits every window. So each float32 result is measured against the float64 fused loop on
# the same inputs (the truth), and so is the fused loop in float32 twice: as given, and with
# the streams in the opposite order (every sum over streams, and so the parameters'
# gradients, rounded in another order). Two correct float32 implementations of this loop are
# roundings of the same operations in other orders, so their errors are of one size: the
# candidate's error may be at most ERROR_RATIO times the larger of the two references' (and
# of one float32 rounding, F32_UNIT). Measured on the CPU (docs/gpu_box.md): the Triton
# kernels under the interpreter at most 1.4x the fused loop's error (1.52x on the planted-bug
# test's window), the autograd loop 2.3x,
# the native loop 4.1x (its parameter gradients are rounded in another grouping), over 30
# windows of 8 to 64 ticks, 3 to 256 streams, n = 8 to 64; the fused loop's own errors were
# 4e-8 to 1e-6 relative (2e-5 for the scalar leak's gradient, one sum that cancels). A
# wrong term, a wrong branch or a biased gradient is an error of its own size: a 1e-4
# relative bias on a gradient fails wherever 8 x the fused loop's error is below it (1e-6
# to 8e-6 over those windows).
#
# Errors are relative: per stream for what has one row per stream (Zs, Es, g, E and the
# gradients of U and z: a quiet stream's error is measured against its own size, floored at
# one rounding of the typical stream's, then the RMS over the streams), per tensor for the
# parameters' gradients.

F32_UNIT = 2.0**-24  # float32's unit roundoff: half an ulp of 1
ERROR_RATIO = 8.0
OUTPUTS = ("Zs", "Es", "g", "E")
GRADIENTS = ("dU", "dz", "dkeep", "dar", "dai", "dCr", "dCi")  # of the args 0 ... 6
STREAM_DIM = {"Zs": 1, "Es": 1, "g": 0, "E": 0, "dU": 1, "dz": 0}


def loop_results(
    loop: FieldLoop,
    args: list[Tensor],
    resets,
    c: FieldConsts,
    gZ: Tensor | None,
    grad_of=(),
    *,
    dtype: torch.dtype | None = None,
    reverse: bool = False,
) -> dict[str, Tensor]:
    """One window of `loop` on args (U, z, keep, ar, ai, Cr, Ci, g, E; U's strides kept
    unless converted), by name: the outputs (OUTPUTS) and the gradients of (Zs * gZ).sum()
    with respect to the args numbered in `grad_of` (GRADIENTS); in `dtype` if given;
    `reverse`: the streams in the opposite order, the results put back in the given one."""
    ins = [x.detach() if dtype is None else x.detach().to(dtype) for x in args]
    if gZ is not None:
        gZ = gZ.to(ins[0].device, ins[0].dtype)
    B = ins[0].shape[1]
    rev = torch.arange(B - 1, -1, -1, device=ins[0].device)
    if reverse:
        ins[0], ins[1], ins[7], ins[8] = ins[0][:, rev], ins[1][rev], ins[7][rev], ins[8][rev]
        gZ = gZ[:, rev] if gZ is not None else None
    for i in grad_of:
        ins[i].requires_grad_()
    with torch.set_grad_enabled(bool(grad_of)):
        outs = loop(*ins, resets, c)
    out = {name: x.detach() for name, x in zip(OUTPUTS, outs, strict=True)}
    if grad_of:
        grads = torch.autograd.grad(outs[0], [ins[i] for i in grad_of], gZ)
        out.update({GRADIENTS[i]: g for i, g in zip(grad_of, grads, strict=True)})
    if reverse:
        out = {
            k: v.index_select(STREAM_DIM[k], rev) if k in STREAM_DIM else v for k, v in out.items()
        }
    return out


def relative_error(a: Tensor, truth: Tensor, stream_dim: int | None) -> float:
    """||a - truth|| relative to ||truth||; with `stream_dim`, per stream (each against its
    own size, floored at F32_UNIT of the RMS stream's) and the RMS over the streams. NaN
    anywhere gives NaN."""
    a, t = a.double(), truth.double()
    if stream_dim is None or t.dim() == 0:
        return float((a - t).norm()) / max(float(t.norm()), _TINY)
    a = a.movedim(stream_dim, 0).reshape(a.shape[stream_dim], -1)
    t = t.movedim(stream_dim, 0).reshape(t.shape[stream_dim], -1)
    size = t.norm(dim=1)
    floor = max(F32_UNIT * float(size.square().mean().sqrt()), _TINY)
    return float(((a - t).norm(dim=1) / size.clamp(min=floor)).square().mean().sqrt())


class Float32Judgement(NamedTuple):
    """A float32 result against the float64 truth (`judge_float32`)."""

    failure: str | None  # None: within ERROR_RATIO x the references' error on every tensor
    ratio: float  # the worst tensor's error / max(references' error, F32_UNIT)
    out_err: float  # the worst output's relative error (against the truth)
    grad_err: float  # the worst gradient's (0 without gradients)
    errors: dict[str, tuple[float, float]]  # name: (its error, the references')


def judge_float32(
    got: dict[str, Tensor],
    refs: list[dict[str, Tensor]],
    truth: dict[str, Tensor],
    ratio: float = ERROR_RATIO,
    stream_dim: dict[str, int] | None = None,
    reference: str = "the fused loop",
) -> Float32Judgement:
    """Every tensor of `got` (loop_results of the loop under test, float32) against `truth`
    (the float64 fused loop's): its relative error at most `ratio` times the largest of the
    references' (the float32 fused loop's, `refs`) and F32_UNIT. NaN fails. `stream_dim`:
    which tensors have a row per stream, on which dimension (default STREAM_DIM)."""
    errors, worst, failure = {}, 0.0, None
    for name, t in truth.items():
        dim = (STREAM_DIM if stream_dim is None else stream_dim).get(name)
        err = relative_error(got[name], t, dim)
        ref = max([relative_error(r[name], t, dim) for r in refs] + [F32_UNIT])
        errors[name] = (err, ref)
        r = err / ref if err == err else math.inf
        worst = max(worst, r)
        if failure is None and not err <= ratio * ref:
            failure = (
                f"{name} is {err:.2e} from the float64 loop's, {r:.1f} x {reference}'s own "
                f"float32 error ({ref:.1e}; allowed: {ratio:g} x)"
            )
    grads = [e for k, (e, _) in errors.items() if k in GRADIENTS or k.startswith("grad/")]
    outs = [e for k, (e, _) in errors.items() if k not in GRADIENTS and not k.startswith("grad/")]
    return Float32Judgement(failure, worst, max(outs, default=0.0), max(grads, default=0.0), errors)


def fused_references(
    args: list[Tensor], resets, c: FieldConsts, gZ: Tensor | None, grad_of=()
) -> tuple[dict[str, Tensor], list[dict[str, Tensor]]]:
    """The fused loop on these args and their device: float64 (the truth), and float32 as
    given and with the streams reversed (the references): what `judge_float32` reads."""
    fused = LOOPS["fused"]
    truth = loop_results(fused, args, resets, c, gZ, grad_of, dtype=torch.float64)
    refs = [
        loop_results(fused, args, resets, c, gZ, grad_of, dtype=torch.float32, reverse=rev)
        for rev in (False, True)
    ]
    return truth, refs


def judge_against_fused(
    got: dict[str, Tensor],
    args: list[Tensor],
    resets,
    c: FieldConsts,
    gZ: Tensor | None,
    grad_of=(),
    ratio: float = ERROR_RATIO,
) -> Float32Judgement:
    """`got` (a float32 loop's `loop_results` on these args) judged against the fused loop on
    the same args and device (`fused_references`)."""
    truth, refs = fused_references(args, resets, c, gZ, grad_of)
    return judge_float32(got, refs, truth, ratio)


# ---- proving the Triton loop on a device before a run trusts it ----

CHECK_TICKS = 8
# The roles of `sample_loop_inputs`'s streams (stream b < 4: _ROLES[b]; see its docstring).
_ROLES = ("plain", "loud", "quiet", "silent")
_LOUD = 12.0  # the loud streams' drive: an RMS ~12x the plain streams' ~1, above the cap


def sample_loop_inputs(
    K: int,
    B: int,
    c: FieldConsts,
    device: torch.device | str,
    *,
    per_mode_keep: bool = False,
    keep_grad: bool = False,
    u_width: int | None = None,
    seed: int = 0,
) -> tuple[list[Tensor], list[int]]:
    """The arguments of a field loop before `resets, c`, of the model's kind: drives around
    0.25 with N(0, 0.28^2) spread, a field of N(0, 0.5^2) around the same coherent 0.25, the
    default leak's keep 0.95 (a 0-dim tensor, or [2n] per mode), decay rates log-spaced over
    [0.05, 0.5], small frequencies and coupling, gains around 1, energies in [0, 1]; float32
    on `device`. The streams have roles, so that a window reaches every branch of the loop:
    0, and from 4 on all but every fourth, plain; 1 and every fourth from 5 loud (the drive
    12 / g x larger: above any cap up to ~10, so the RMS cap fires; stream 1 at g = 0.101,
    where the gain's lower clamp holds it); 2 quiet (no drive and a field of |z| =
    PHASE_SYNC_MIN / (4 sqrt(n)), decaying: the sum of its modes stays below the phase-sync
    threshold, so sync is skipped on a live field; far below the controller's floor, whose
    step at g = 9.5 reaches the upper clamp); 3 silent (no drive, no field: |y| = 0 in
    every stage). `u_width`: U is the first 2n
    columns of a [K*B, u_width] tensor, as the batched tick's drive matmul makes it (rows of
    2n + atom_dim); default contiguous. Returns (args, the indices of the args that require
    a gradient: U, z, a and C, and keep with `keep_grad`)."""
    n = c.n
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=gen)

    U = normal(K * B, u_width or 2 * n)[:, : 2 * n].reshape(K, B, 2 * n) * 0.28
    U[..., :n] += 0.25
    z = normal(B, 2 * n) * 0.5
    z[:, :n] += 0.25  # (coherent, as the drive makes it)
    g = torch.rand(B, generator=gen) + 0.5
    E = torch.rand(B, generator=gen)
    for b in range(B):
        role = _ROLES[b] if b < 4 else ("loud" if b % 4 == 1 else "plain")
        if role == "loud":
            g[b] = GAIN_MIN * 1.01 if b == 1 else 1.0
            U[:, b] *= _LOUD / float(g[b])
        elif role == "quiet":
            U[:, b] = 0
            z[b] *= PHASE_SYNC_MIN / (4 * math.sqrt(n) * float(z[b].norm()))
            g[b], E[b] = 9.5, 0.0
        elif role == "silent":
            U[:, b], z[b], g[b], E[b] = 0, 0, 1.0, 0.0
    keep = torch.full((2 * n,), 0.95) if per_mode_keep else torch.tensor(0.95)
    args = [
        U,
        z,
        keep,
        -torch.logspace(math.log10(0.05), math.log10(0.5), n),
        (torch.rand(n, generator=gen) * 2 - 1) * 0.5,
        normal(n, n) * (0.02 / math.sqrt(n)),
        normal(n, n) * (0.02 / math.sqrt(n)),
        g,
        E,
    ]
    args = [x.to(device) for x in args]
    if u_width is not None:  # (after the copy to the device, which would make it contiguous)
        wide = torch.zeros(K * B, u_width, device=device)
        wide[:, : 2 * n] = args[0].reshape(K * B, 2 * n)
        args[0] = wide[:, : 2 * n].reshape(K, B, 2 * n)
    grad_of = [0, 1, *([2] if keep_grad else []), 3, 4, 5, 6]
    for i in grad_of:
        args[i].requires_grad_()
    return args, grad_of


class LoopCheck(NamedTuple):
    """The outcome of `check_triton_loop`: `failure` is None when the Triton loop matched."""

    failure: str | None
    out_err: float | None  # the worst output's relative error against the float64 loop
    grad_err: float | None  # the worst gradient's
    ratio: float | None  # the worst error / the fused loop's own float32 error (<= ERROR_RATIO)
    seconds: float  # the whole check, the kernels' compile included
    B: int  # the streams of the check of the run's own launch
    K: int
    streams: tuple[int, ...] = ()  # every check's streams, one per kernel variant proven


def kernel_variant(B: int, n: int, device: torch.device, u_width: int | None = None) -> tuple:
    """What the Triton loop compiles for at B streams, besides the run's constants and leak:
    the launcher's streams per program and warps, and Triton's specialization of each integer
    argument that depends on B (B, U's stride between ticks B x u_width, the gradient's
    B x 2n: Triton compiles a binary per pattern of "equals 1" and "divides by 16" of its
    integer arguments; tests/commands/test_kernel_report.py holds this to Triton's own);
    and, the same binary, whether the last program is partly filled (its masked rows)."""
    from atom_train.model.field_kernels import launch_plan
    from atom_train.model.field_triton import sm_count

    block, warps = launch_plan(B, n, sm_count(device))

    def spec(x: int) -> tuple[bool, bool]:
        return x == 1, x % 16 == 0

    return block, warps, spec(B), spec(B * (u_width or 2 * n)), spec(B * 2 * n), B % block != 0


def check_streams(B: int, n: int, device: torch.device, u_width: int | None = None) -> int:
    """The streams for the self-check of a launch of B streams: the fewest, from 4 (every
    role of `sample_loop_inputs`), with the launch's `kernel_variant`, so the kernels the
    check compiles are the ones the launch runs."""
    want = kernel_variant(B, n, device, u_width)
    for b in range(min(B, len(_ROLES)), B):
        if kernel_variant(b, n, device, u_width) == want:
            return b
    return B


def _one_line(e: BaseException) -> str:
    """An exception as one line: its type, and the first line of the innermost error it
    was raised from (Triton wraps compile and interpreter errors in its own)."""
    inner = e
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = str(inner).strip()
    line = text.splitlines()[0][:200] if text else ""
    kind = type(e).__name__ if inner is e else f"{type(e).__name__} ({type(inner).__name__})"
    return f"{kind}: {line}" if line else kind


def check_triton_loop(
    device: torch.device,
    c: FieldConsts,
    B: int,
    *,
    per_mode_keep: bool = False,
    keep_grad: bool = False,
    u_width: int | None = None,
    also: tuple[int, ...] = (),
    forward_only: tuple[int, ...] = (),
) -> LoopCheck:
    """Prove the Triton loop on `device` before a run trusts it: for the run's launch of B
    streams (forward and backward), each launch of `also` (the noise probe's half batch) and
    of `forward_only` (validation's streams: no backward), one check per distinct
    `kernel_variant`, at its `check_streams`: CHECK_TICKS ticks of `sample_loop_inputs`
    (every branch of the loop reached) with a reset inside (the periodic pattern the trainer
    launches), the run's constants and leak and U's row width, judged against the fused loop
    on the same device (`judge_against_fused`: float64 truth, ERROR_RATIO x the float32
    fused loop's own error). The kernels it compiles are the run's (the run reuses them).
    Any exception (a compile error, a launch failure, the driver) or a result outside the
    bound is the failure, in one line."""
    t0 = time.perf_counter()
    K, n = CHECK_TICKS, c.n
    resets = tuple(t == K // 2 for t in range(K))
    launches = [(B, True), *((b, True) for b in also), *((b, False) for b in forward_only)]
    done: set[tuple] = set()
    streams: list[int] = []
    worst = (0.0, 0.0, 0.0)  # ratio, output error, gradient error
    Bc = B
    try:
        for b, backward in launches:
            key = kernel_variant(b, n, device, u_width)
            if b < 1 or (key, True) in done or (key, backward) in done:
                continue
            done.add((key, backward))
            bc = check_streams(b, n, device, u_width)
            Bc = Bc if streams else bc
            streams.append(bc)
            args, grad_of = sample_loop_inputs(
                K, bc, c, device, per_mode_keep=per_mode_keep, keep_grad=keep_grad,
                u_width=u_width,
            )  # fmt: skip
            grad_of = grad_of if backward else []
            gZ = torch.randn(K, bc, 2 * n, generator=torch.Generator().manual_seed(1))
            got = loop_results(LOOPS["triton"], args, resets, c, gZ, grad_of)
            j = judge_against_fused(got, args, resets, c, gZ, grad_of)
            worst = max(worst[0], j.ratio), max(worst[1], j.out_err), max(worst[2], j.grad_err)
            if j.failure is not None:
                where = f"at {b} streams (checked at {bc}{'' if backward else ', forward'}): "
                return LoopCheck(
                    where + j.failure, j.out_err, j.grad_err, j.ratio,
                    time.perf_counter() - t0, Bc, K, tuple(streams),
                )  # fmt: skip
    except Exception as e:  # (what failed is the answer: it is reported, not raised)
        return LoopCheck(
            _one_line(e), None, None, None, time.perf_counter() - t0, Bc, K, tuple(streams)
        )
    ratio, out_err, grad_err = worst
    return LoopCheck(
        None, out_err, grad_err, ratio, time.perf_counter() - t0, Bc, K, tuple(streams)
    )
