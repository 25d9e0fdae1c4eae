"""The field loops: steps 2-6 of the tick (leak, RK4, phase sync, RMS cap, amplitude
controller) for the K ticks of a window, the only sequential part of the batched tick.

Every loop has one signature (`FieldLoop`):

    Zs, Es, g, E = loop(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)

- U [K,B,2n]: the drives before the gain; z [B,2n]: the field entering the window (real
  pairs [Re | Im], the only input with a gradient path through the state); keep = 1 - leak
  (0-dim, or [2n] for a per-mode leak); a = ar + i ai (n each); C = Cr + i Ci ([n,n] each,
  the model's parameters as they are); g, E [B]: gain and energy EMA (no gradient);
  resets: K bools, an episode reset before each tick (`atom_train.model.lockstep`); c: the
  constants (`FieldConsts`).
- Zs [K,B,2n]: the field after each tick; Es [K,B]: E after each tick; g, E [B]: final.
  Gradients flow to U, z, keep, ar, ai, Cr and Ci.

The loops, by `recurrence` name (`LOOPS`):

- ``autograd``: ordinary autograd over per-tick ops; the readable cross-check;
- ``fused``: `FusedFieldLoop`, forward without autograd into preallocated buffers and a
  hand-written backward (the CPU default when the extension has no native loop);
- ``compiled``: `CompiledFieldLoop`, the same per-tick steps written functionally and run
  through torch.compile (faster on a CPU after a one-off compile; needs a C++ compiler);
- ``triton``: `atom_train.model.field_triton.TritonFieldLoop`, one Triton kernel per window
  forward and one backward, the state in registers (the CUDA default);
- ``native``: `atom_train.model.field_native.NativeFieldLoop`, the loop in Rust
  (atomfield-rs, in the extension), blocks of streams on a thread pool, the backward by
  recomputation (the CPU default).

Tests hold them together (tests/test_field_loops.py, tests/model/test_batched.py,
tests/model/test_field_triton.py, tests/model/test_field_native.py); docs/model.md has the derivation of the backward.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from atom_train.model.config import (
    AMP_LOG_FLOOR,
    ENERGY_DECAY,
    GAIN_MAX,
    GAIN_MIN,
    PHASE_SYNC_MIN,
    FieldConsts,
)


def set_tf32_matmuls(enabled: bool) -> None:
    """Allow (or forbid) TF32 in CUDA float32 matmuls: the trainer's --tf32, meant for the
    readout. The field loops forbid it for themselves (`ieee_matmuls`)."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):  # torch >= 2.9: mixing in the legacy flag is an error
        m.fp32_precision = "tf32" if enabled else "ieee"
    else:
        m.allow_tf32 = enabled


@contextlib.contextmanager
def cuda_matmul_precision(tf32: bool) -> Iterator[None]:
    """CUDA float32 matmuls in TF32 (or IEEE) inside; the process-wide setting before is
    restored on the way out, whatever happens inside."""
    m = torch.backends.cuda.matmul
    new = hasattr(m, "fp32_precision")
    before = m.fp32_precision if new else m.allow_tf32
    set_tf32_matmuls(tf32)
    try:
        yield
    finally:
        if new:
            m.fp32_precision = before
        else:
            m.allow_tf32 = before


@contextlib.contextmanager
def ieee_matmuls(device: torch.device) -> Iterator[None]:
    """IEEE float32 matmuls inside, whatever --tf32 says: phase sync divides by |sum of the
    modes|, which can be small, so TF32's ~1e-3 relative error in the loop's matmuls would be
    amplified from tick to tick (docs/model.md). A no-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    with cuda_matmul_precision(False):
        yield


def _ieee(fn):
    """Run an autograd.Function's forward or backward (ctx, first tensor, ...) under
    `ieee_matmuls` of that tensor's device."""

    @functools.wraps(fn)
    def wrapper(ctx, x, *args):
        with ieee_matmuls(x.device):
            return fn(ctx, x, *args)

    return wrapper


def _unit(x: Tensor) -> Tensor:
    """[1, 0] (phase sync's rotation where it is skipped) on x's device and dtype, filled
    there: `new_tensor` would copy it from host memory, which on a GPU waits for the GPU."""
    one = x.new_zeros(2)
    one[0] = 1.0  # (a fill on the device)
    return one


# Squared magnitudes are clamped to this before a square root, so that |z| at z = 0 has a
# finite gradient (zero: clamp passes no gradient below its floor), like torch's complex abs.
_TINY = 1e-30


def controller(rms: Tensor, g: Tensor, E: Tensor, c: FieldConsts) -> tuple[Tensor, Tensor]:
    """Amplitude controller (step 6 of the tick) from the RMS before the cap; no gradient.
    g exp(rate (log target - log r')) is computed as g target^rate r'^-rate (fewer ops)."""
    r_cap = rms.clamp(max=c.max_rms)
    step = (
        r_cap.clamp(min=AMP_LOG_FLOOR).pow_(-c.amp_rate).mul_(math.exp(c.amp_rate * c.log_target))
    )
    g = step.mul_(g).clamp_(GAIN_MIN, GAIN_MAX)
    E = torch.addcmul(E * ENERGY_DECAY, r_cap, r_cap, value=1 - ENERGY_DECAY)
    return g, E


# ---- steps 2-6 with ordinary autograd (readable; the cross-check of the fused loop) ----


def _phi(y: Tensor, n: int) -> Tensor:
    """phi(z) = z / (1 + |z|) on real pairs [B, 2n]."""
    yv = y.view(y.shape[0], 2, n)
    mag = (yv * yv).sum(1).clamp(min=_TINY).sqrt()
    return (yv / (1 + mag).unsqueeze(1)).view_as(y)


def _autograd_loop(U, z, keep, W, Wc, g, E, resets, c: FieldConsts):
    """Steps 2-6 for K ticks: the fields after each tick [K,B,2n], E after each tick [K,B],
    and the final g, E. f(y) = u + y W + phi(y) Wc is step 3's a z + u + C phi(z) on pairs."""
    K, B = U.shape[:2]
    n, h = c.n, c.dt
    Zs, Es = [], []
    for t in range(K):
        if resets[t]:
            z, g, E = torch.zeros_like(z), torch.ones_like(g), torch.zeros_like(E)
        u = U[t] * g.unsqueeze(1)
        z0 = z * keep

        def f(y, u=u):
            return u + y @ W + _phi(y, n) @ Wc

        k1 = f(z0)
        k2 = f(z0 + h / 2 * k1)
        k3 = f(z0 + h / 2 * k2)
        k4 = f(z0 + h * k3)
        z1 = z0 + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        zv = z1.view(B, 2, n)
        s = zv.sum(2)  # (B, 2): the sum of the modes
        rho = (s * s).sum(1).clamp(min=_TINY).sqrt()
        on = rho > PHASE_SYNC_MIN
        cr = torch.where(on, s[:, 0] / rho.clamp(min=PHASE_SYNC_MIN), 1.0).unsqueeze(1)
        ci = torch.where(on, -s[:, 1] / rho.clamp(min=PHASE_SYNC_MIN), 0.0).unsqueeze(1)
        z2 = torch.cat([zv[:, 0] * cr - zv[:, 1] * ci, zv[:, 0] * ci + zv[:, 1] * cr], 1)
        r = ((z2 * z2).sum(1) / n).clamp(min=_TINY).sqrt()
        z = z2 * torch.where(r > c.max_rms, c.max_rms / r.clamp(min=c.max_rms), 1.0).unsqueeze(1)
        g, E = controller(r.detach(), g, E, c)
        Zs.append(z)
        Es.append(E)
    return torch.stack(Zs), torch.stack(Es), g, E


# ---- steps 2-6, fused: forward without autograd, hand-written backward ----
#
# The forward runs without autograd and writes what the backward needs straight into
# per-window buffers (out=, no copies): each RK4 stage's matmul input [y | phi(y)] and |y|,
# the field after RK4, after phase sync and after the cap, the sums of the modes, the norms.
# The backward walks the window in reverse with the hand-derived gradient of each step,
# everything for one tick still in cache; the coupling-matrix gradient is accumulated per
# tick with one matmul. Elementwise work is written as few, large-enough ops because at
# small n the per-op overhead, not arithmetic, is the cost (see docs/model.md).

# RK4: (coefficient of the previous slope in this stage's input, weight in the final sum)
_RK4 = ((0.0, 1.0), (0.5, 2.0), (0.5, 2.0), (1.0, 1.0))


def real_form(Cr: Tensor, Ci: Tensor) -> Tensor:
    """The real 2n x 2n form Wc of C = Cr + i Ci acting on row vectors [Re | Im]:
    C phi -> phi @ Wc, Wc = [[Cr^T, Ci^T], [-Ci^T, Cr^T]]."""
    Crt, Cit = Cr.t(), Ci.t()
    return torch.cat([torch.cat([Crt, Cit], 1), torch.cat([-Cit, Crt], 1)])


def _complex_grads(gWc: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Gradients of Cr, Ci from the gradient of Wc = real_form(Cr, Ci)."""
    g11, g12, g21, g22 = gWc[:n, :n], gWc[:n, n:], gWc[n:, :n], gWc[n:, n:]
    return (g11 + g22).t(), (g12 - g21).t()


def _diag_form(ar: Tensor, ai: Tensor) -> Tensor:
    """The real 2n x 2n form of diag(a), a = ar + i ai, acting on row vectors [Re | Im]."""
    return torch.cat(
        [
            torch.cat([torch.diag(ar), torch.diag(ai)], 1),
            torch.cat([torch.diag(-ai), torch.diag(ar)], 1),
        ]
    )


class FusedFieldLoop(torch.autograd.Function):
    """Steps 2-6 for K ticks. Inputs: drives U [K,B,2n] (before the gain), the field z [B,2n]
    entering the window, keep = 1 - leak (0-dim or [2n]), a = ar + i ai (n each), C = Cr +
    i Ci, the no-gradient g, E [B], the reset flags and the constants. With Wc the real form
    of C (C phi -> phi Wc) and W_f = [diag form of a; Wc], f(y) = u + [y | phi(y)] W_f.

    Outputs: the field after each tick [K,B,2n], E after each tick [K,B], final g and E."""

    @staticmethod
    @_ieee
    def forward(ctx, U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
        K, B, D = U.shape
        n, h = c.n, c.dt
        cap = c.max_rms * math.sqrt(n)  # RMS > max  <=>  |z| > max sqrt(n)
        Wf = torch.cat([_diag_form(ar, ai), real_form(Cr, Ci)])
        new = U.new_empty
        YP = new(K, 4, B, 2 * D)  # RK4 stage inputs [y | phi(y)]: the matmul inputs
        M = new(K, 4, B, 1, n)  # |y| per mode
        Z1, Z2, Zs = new(K, B, D), new(K, B, D), new(K, B, D)  # after RK4, sync, cap
        S, Q = new(K, B, 2), new(K, B, 2)  # sum of the modes after RK4, its (q0, q1)
        Nz, G, Es = new(K, B, 1), new(K, B, 1), new(K, B, 1)  # |z2|, gain used, E after
        # Views for every tick, made once (slicing per tick costs more than the arithmetic
        # at small B).
        yp_t = YP.unbind(0)
        y_t = YP[..., :D].unbind(0)
        yr_t = YP[..., :n].unsqueeze(3).unbind(0)
        yi_t = YP[..., n:D].unsqueeze(3).unbind(0)
        phi_t = YP[..., D:].unflatten(-1, (2, n)).unbind(0)
        m_t = M.unbind(0)
        z1r_t, z1i_t = Z1[..., :n].unbind(0), Z1[..., n:].unbind(0)
        z2r_t, z2i_t = Z2[..., :n].unbind(0), Z2[..., n:].unbind(0)
        q0_t, q1_t = Q[..., :1].unbind(0), Q[..., 1:].unbind(0)
        one = _unit(U)
        g, E = g.unsqueeze(1), E.unsqueeze(1)
        z_in = z
        for t in range(K):
            if resets[t]:
                z, g, E = torch.zeros_like(z), torch.ones_like(g), torch.zeros_like(E)
            G[t] = g
            u = U[t] * g
            yp, y, yr, yi, phi, m = (
                yp_t[t].unbind(0),
                y_t[t].unbind(0),
                yr_t[t].unbind(0),
                yi_t[t].unbind(0),
                phi_t[t].unbind(0),
                m_t[t].unbind(0),
            )
            z0 = torch.mul(z, keep, out=y[0])  # 2. leak; also the first stage input
            acc = None
            for i in range(4):  # 3. RK4
                mi = torch.hypot(yr[i], yi[i], out=m[i])
                torch.div(y[i].view(B, 2, n), mi + 1, out=phi[i])
                k = torch.addmm(u, yp[i], Wf)
                acc = k if acc is None else acc.add_(k, alpha=_RK4[i][1])
                if i < 3:
                    torch.add(z0, k, alpha=h * _RK4[i + 1][0], out=y[i + 1])
            z1 = torch.add(z0, acc, alpha=h / 6, out=Z1[t])
            # 4. phase sync: z2 = z1 (q0 - i q1), (q0, q1) = s/|s|.
            s = torch.sum(z1.view(B, 2, n), 2, out=S[t])
            rho = torch.linalg.vector_norm(s, dim=1, keepdim=True)
            torch.where(rho > PHASE_SYNC_MIN, s / rho.clamp(min=PHASE_SYNC_MIN), one, out=Q[t])
            q0, q1, z1r, z1i = q0_t[t], q1_t[t], z1r_t[t], z1i_t[t]
            torch.addcmul(z1r * q0, z1i, q1, out=z2r_t[t])
            torch.addcmul(z1i * q0, z1r, q1, value=-1, out=z2i_t[t])
            # 5. RMS cap.
            norm = torch.linalg.vector_norm(Z2[t], dim=1, keepdim=True, out=Nz[t])
            z = torch.mul(Z2[t], norm.clamp(min=cap).reciprocal_().mul_(cap), out=Zs[t])
            # 6. amplitude controller.
            g, E = controller(norm / math.sqrt(n), g, E, c)
            Es[t] = E
        saved = SavedWindow(YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf)
        return _end_forward(ctx, saved, resets, c, Es, g, E)

    @staticmethod
    @_ieee
    def backward(ctx, gZs, _gEs, _gg, _gE):
        YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf = SavedWindow(*ctx.saved_tensors)
        c, resets = ctx.c, ctx.resets
        K, B, D = Zs.shape
        n, h = c.n, c.dt
        sig, capc, V = _backward_constants(S, Nz, c)
        WfT = Wf.t()
        # Views for every tick, made once.
        y_t = YP[..., :D].unbind(0)
        q0_t, q1_t = Q[..., :1].unbind(0), Q[..., 1:].unbind(0)
        sig_t, capc_t, V_t, G_t = sig.unbind(0), capc.unbind(0), V.unbind(0), G.unbind(0)
        m_t = M.unbind(0)
        # Accumulators: Wc's gradient (one matmul per tick) and a's (elementwise products).
        gWc = torch.zeros_like(Wf[D:])
        acc_re = YP.new_zeros(4, B, D)
        acc_im = YP.new_zeros(4, B, D)
        gU = torch.empty_like(Zs)
        need_keep = ctx.needs_input_grad[2]
        G0 = torch.empty_like(Zs) if need_keep else None
        GK = Zs.new_empty(4, B, D)  # gradients of this tick's four slopes
        gk_i = GK.unbind(0)
        gk_flip = GK.view(4, B, 2, n)
        gyp = Zs.new_empty(B, 2 * D)
        gyp_lin, gyp_w = gyp.view(B, 2, 2, n).unbind(1)  # [B,2,n] each: dL/dy (linear), dL/dphi
        gz1 = Zs.new_empty(B, D)
        gz1r, gz1i, gz1v = gz1[:, :n], gz1[:, n:], gz1.view(B, 2, n)
        gz = torch.zeros_like(gZs[0])
        for t in range(K - 1, -1, -1):
            gz = gz + gZs[t]
            # 5. cap: z3 = sig z2.
            z2 = Z2[t]
            dot = (gz * z2).sum(1, keepdim=True)
            g2 = torch.addcmul(gz * sig_t[t], z2, capc_t[t] * dot, value=-1)
            # 4. phase sync: gz1 = (q0 + i q1) g2 + dL/ds (s = sum of the modes of z1).
            q0, q1 = q0_t[t], q1_t[t]
            g2r, g2i = g2[:, :n], g2[:, n:]
            torch.addcmul(g2r * q0, g2i, q1, value=-1, out=gz1r)
            torch.addcmul(g2i * q0, g2r, q1, out=gz1i)
            iz2 = torch.cat([-z2[:, n:], z2[:, :n]], 1)  # i z2 as pairs
            kappa = (g2 * iz2).sum(1, keepdim=True)
            gz1v.add_((V_t[t] * kappa).unsqueeze(2))
            # 3. RK4, last stage first; k_i = u + [y_i | phi(y_i)] W_f.
            invd, fac = _phi_grad_factors(m_t[t])
            y, invd_i, fac_i = y_t[t].unbind(0), invd.unbind(0), fac.unbind(0)
            torch.mul(gz1, h / 6, out=gk_i[3])
            a3 = gz1 * (h / 3)
            gz0 = gz1.clone()
            for i in range(3, -1, -1):
                torch.mm(gk_i[i], WfT, out=gyp)
                yv = y[i].view(B, 2, n)
                coef = (gyp_w * yv).sum(1, keepdim=True).mul_(fac_i[i])
                gy = torch.addcmul(gyp_lin, gyp_w, invd_i[i]).addcmul_(yv, coef, value=-1)
                gy = gy.view(B, D)
                gz0.add_(gy)
                if i >= 2:
                    torch.add(a3, gy, alpha=h * _RK4[i][0], out=gk_i[i - 1])
                elif i == 1:
                    torch.add(gk_i[3], gy, alpha=h * _RK4[1][0], out=gk_i[0])
            torch.mul(GK.sum(0), G_t[t], out=gU[t])
            ylin = YP[t, :, :, :D]
            gWc.addmm_(YP[t, :, :, D:].reshape(4 * B, D).t(), GK.view(4 * B, D))
            acc_re.addcmul_(ylin, GK)
            acc_im.addcmul_(ylin, gk_flip.flip(2).view(4, B, D))
            if need_keep:
                G0[t] = gz0
            # 2. leak; a reset before this tick cuts the gradient to the past.
            gz = torch.zeros_like(gz0) if resets[t] else gz0 * keep
        a_re, a_im = acc_re.sum((0, 1)), acc_im.sum((0, 1))
        return _end_backward(ctx, gU, gz, a_re, a_im, gWc, G0, z_in, Zs, keep)


class SavedWindow(NamedTuple):
    """What the fused and compiled loops' forward keeps for their backward (D = 2n; per
    tick t along the leading K unless said), in the order `ctx.saved_tensors` returns it."""

    YP: Tensor  # [K,4,B,2D] each RK4 stage's matmul input [y | phi(y)]
    M: Tensor  # [K,4,B,1,n] |y| per mode of each stage
    Z2: Tensor  # [K,B,D] the field after phase sync, before the cap
    Zs: Tensor  # [K,B,D] the field after each tick (the loop's output)
    S: Tensor  # [K,B,2] the sum of the modes after RK4
    Q: Tensor  # [K,B,2] (q0, q1) = S/|S| (phase sync's rotation)
    Nz: Tensor  # [K,B,1] |z2|, what the cap and the controller read
    G: Tensor  # [K,B,1] the gain each tick's drive used
    z_in: Tensor  # [B,D] the field entering the window
    keep: Tensor  # 1 - leak (0-dim, or [D] per mode)
    Wf: Tensor  # [2D,D] the real forms of diag(a) and C, stacked: one matmul per stage


def _end_forward(ctx, saved: SavedWindow, resets, c: FieldConsts, Es, g, E):
    """Shared end of both field loops' forward: keep what the backward reads (the same
    tensors, in the same order, for both), return (Zs, Es, g, E) with the state outputs
    marked as carrying no gradient."""
    ctx.save_for_backward(*saved)
    ctx.resets, ctx.c = resets, c
    Es, g, E = Es.squeeze(2), g.squeeze(1), E.squeeze(1)
    ctx.mark_non_differentiable(Es, g, E)
    return saved.Zs, Es, g, E


def _end_backward(ctx, gU, gz, a_re, a_im, gWc, G0, z_in, Zs, keep):
    """Shared end of both field loops' backward: the gradients of a, keep, z and C from what
    the reverse walk accumulated (a_re, a_im: sums over pairs; gWc: of the real form of C;
    G0 [K,B,2n]: the gradient after each tick's leak, needed only for keep's)."""
    c, resets = ctx.c, ctx.resets
    g_ar, g_ai = _a_grads(a_re, a_im, c.n)
    gkeep = _keep_grad(z_in, Zs, G0, keep, resets) if ctx.needs_input_grad[2] else None
    gz_in = gz if ctx.needs_input_grad[1] else None
    return gU, gz_in, gkeep, g_ar, g_ai, *_complex_grads(gWc, c.n), None, None, None, None


def _backward_constants(S, Nz, c: FieldConsts):
    """Cap and phase-sync factors of every tick, for the whole window at once ([K,B] sized;
    the bigger per-tick factors are computed tick by tick, while in cache)."""
    cap = c.max_rms * math.sqrt(c.n)
    sig = cap / Nz.clamp(min=cap)  # the cap factor
    capc = torch.where(Nz > cap, sig**3 / cap**2, 0.0)  # cap / |z2|^3 where capped
    # Phase sync: dL/ds = V kappa, V = (Im s, -Re s)/|s|^2 (0 where sync was skipped),
    # kappa = Im sum_k conj(z2_k) g2_k.
    rho2 = (S * S).sum(-1, keepdim=True)
    V = torch.where(rho2 > PHASE_SYNC_MIN**2, S.flip(-1) / rho2.clamp(min=_TINY), 0.0)
    V[..., 1].neg_()
    return sig, capc, V


def _phi_grad_factors(m: Tensor) -> tuple[Tensor, Tensor]:
    """1/(1+|y|) and 1/(|y| (1+|y|)^2) for the gradient of phi(y) = y/(1+|y|):
    dphi^T w = w/(1+|y|) - y (y.w)/(|y| (1+|y|)^2) (the second term is 0 at y = 0)."""
    invd = (m + 1).reciprocal_()
    return invd, invd * invd / m.clamp(min=_TINY)


def _a_grads(a_re: Tensor, a_im: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Gradients of Re a, Im a from sum(y * gk) and sum(y * flip(gk)) over pairs [2n]."""
    return a_re[:n] + a_re[n:], a_im[:n] - a_im[n:]  # sum Re, Im of conj(y) gk


def _keep_grad(z_in, Zs, G0, keep, resets) -> Tensor:
    """Gradient of keep = 1 - leak from the gradients G0 [K,B,2n] after each tick's leak."""
    Zin = torch.cat([z_in.unsqueeze(0), Zs[:-1]])  # the field entering each tick
    prod = Zin * G0
    for t, reset in enumerate(resets):  # a reset before tick t: its leak saw z = 0
        if reset:
            prod[t].zero_()
    gkeep = prod.sum((0, 1))
    return gkeep.sum() if keep.dim() == 0 else gkeep


# ---- the same loop as pure per-tick functions, for torch.compile (recurrence="compiled") ----
#
# The eager loop above writes into preallocated buffers (out=), which is what makes it fast
# without a compiler but is not something torch.compile turns into one graph. These are the
# same per-tick steps written functionally; compiled, each becomes a few fused kernels plus
# the matmuls. Tests hold them to the eager loop.


def _fwd_tick(z, U_t, g, E, keep, Wf, one, c: FieldConsts):
    B, n, h = z.shape[0], c.n, c.dt
    D, cap = 2 * n, c.max_rms * math.sqrt(c.n)
    u = U_t * g
    z0 = z * keep
    y, acc, yps, ms = z0, None, [], []
    for i in range(4):
        m = torch.hypot(y[:, :n], y[:, n:]).unsqueeze(1)
        yp = torch.cat([y, (y.view(B, 2, n) / (m + 1)).view(B, D)], 1)
        k = torch.addmm(u, yp, Wf)
        yps.append(yp)
        ms.append(m)
        acc = k if acc is None else acc + k * _RK4[i][1]
        if i < 3:
            y = z0 + k * (h * _RK4[i + 1][0])
    z1 = z0 + acc * (h / 6)
    s = z1.view(B, 2, n).sum(2)
    rho = torch.linalg.vector_norm(s, dim=1, keepdim=True)
    q = torch.where(rho > PHASE_SYNC_MIN, s / rho.clamp(min=PHASE_SYNC_MIN), one)
    q0, q1, z1r, z1i = q[:, :1], q[:, 1:], z1[:, :n], z1[:, n:]
    z2 = torch.cat([z1r * q0 + z1i * q1, z1i * q0 - z1r * q1], 1)
    norm = torch.linalg.vector_norm(z2, dim=1, keepdim=True)
    z3 = z2 * (cap / norm.clamp(min=cap))
    g, E = controller(norm / math.sqrt(n), g, E, c)
    return z3, g, E, torch.stack(yps), torch.stack(ms), z2, s, q, norm


def _bwd_tick(gz, z2, q, V, sig, capc, yp, m, g_t, WfT, c: FieldConsts):
    B, n, h = gz.shape[0], c.n, c.dt
    D = 2 * n
    invd, fac = _phi_grad_factors(m)
    iz2 = torch.cat([-z2[:, n:], z2[:, :n]], 1)
    g2 = gz * sig - z2 * (capc * (gz * z2).sum(1, keepdim=True))
    q0, q1, g2r, g2i = q[:, :1], q[:, 1:], g2[:, :n], g2[:, n:]
    gs = V * (g2 * iz2).sum(1, keepdim=True)
    gz1 = torch.cat([g2r * q0 - g2i * q1 + gs[:, :1], g2i * q0 + g2r * q1 + gs[:, 1:]], 1)
    a6, a3 = gz1 * (h / 6), gz1 * (h / 3)
    gk = [a6, a6, a6, a6]
    gz0 = gz1
    for i in range(3, -1, -1):
        gyp = gk[i] @ WfT
        w, yv = gyp[:, D:].view(B, 2, n), yp[i, :, :D].view(B, 2, n)
        coef = (w * yv).sum(1, keepdim=True) * fac[i]
        gy = (gyp[:, :D].view(B, 2, n) + w * invd[i] - yv * coef).view(B, D)
        gz0 = gz0 + gy
        if i > 0:
            gk[i - 1] = (a3 if i >= 2 else a6) + gy * (h * _RK4[i][0])
    GK = torch.stack(gk)
    ylin = yp[:, :, :D]
    gWc = yp[:, :, D:].reshape(4 * B, D).t() @ GK.view(4 * B, D)
    a_re = (ylin * GK).sum((0, 1))
    a_im = (ylin * GK.view(4, B, 2, n).flip(2).reshape(4, B, D)).sum((0, 1))
    return gz0, GK.sum(0) * g_t, gWc, a_re, a_im


_COMPILED: dict = {}


def _compiled(c: FieldConsts, device_type: str):
    """The compiled per-tick functions for these constants (built on first use)."""
    key = (c, device_type)
    if key not in _COMPILED:
        opts = {"dynamic": False, "fullgraph": True}
        _COMPILED[key] = (
            torch.compile(functools.partial(_fwd_tick, c=c), **opts),
            torch.compile(functools.partial(_bwd_tick, c=c), **opts),
        )
    return _COMPILED[key]


class CompiledFieldLoop(torch.autograd.Function):
    """`FusedFieldLoop` with compiled per-tick functions: same inputs, outputs and gradients."""

    @staticmethod
    @_ieee
    def forward(ctx, U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
        fwd = _compiled(c, U.device.type)[0]
        Wf = torch.cat([_diag_form(ar, ai), real_form(Cr, Ci)])
        one = _unit(U)
        g, E = g.unsqueeze(1), E.unsqueeze(1)
        z_in = z
        saved = [[] for _ in range(9)]  # YP, M, Z2, S, Q, Nz, Zs, G, Es
        for t in range(U.shape[0]):
            if resets[t]:
                z, g, E = torch.zeros_like(z), torch.ones_like(g), torch.zeros_like(E)
            g_t = g
            z, g, E, yp, m, z2, s, q, norm = fwd(z, U[t], g, E, keep, Wf, one)
            for lst, x in zip(saved, (yp, m, z2, s, q, norm, z, g_t, E), strict=True):
                lst.append(x)
        YP, M, Z2, S, Q, Nz, Zs, G, Es = (torch.stack(x) for x in saved)
        saved = SavedWindow(YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf)
        return _end_forward(ctx, saved, resets, c, Es, g, E)

    @staticmethod
    @_ieee
    def backward(ctx, gZs, _gEs, _gg, _gE):
        YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf = SavedWindow(*ctx.saved_tensors)
        c, resets = ctx.c, ctx.resets
        bwd = _compiled(c, Zs.device.type)[1]
        sig, capc, V = _backward_constants(S, Nz, c)
        WfT = Wf.t().contiguous()
        K = Zs.shape[0]
        gWc = torch.zeros_like(Wf[2 * c.n :])
        a_re = Zs.new_zeros(2 * c.n)
        a_im = Zs.new_zeros(2 * c.n)
        gU, G0 = [None] * K, [None] * K
        gz = torch.zeros_like(gZs[0])
        for t in range(K - 1, -1, -1):
            gz0, gU[t], gWc_t, a_re_t, a_im_t = bwd(
                gz + gZs[t], Z2[t], Q[t], V[t], sig[t], capc[t], YP[t], M[t], G[t], WfT,
            )  # fmt: skip
            gWc.add_(gWc_t)
            a_re.add_(a_re_t)
            a_im.add_(a_im_t)
            G0[t] = gz0
            gz = torch.zeros_like(gz0) if resets[t] else gz0 * keep
        G0 = torch.stack(G0) if ctx.needs_input_grad[2] else None
        return _end_backward(ctx, torch.stack(gU), gz, a_re, a_im, gWc, G0, z_in, Zs, keep)


# ---- the registry ----

FieldLoop = Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]


def _autograd_entry(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
    # (Its backward is autograd's, outside this context: a cross-check, not a CUDA path.)
    with ieee_matmuls(U.device):
        W, Wc = _diag_form(ar, ai), real_form(Cr, Ci)
        return _autograd_loop(U, z, keep, W, Wc, g, E, resets, c)


def _triton_entry(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
    from atom_train.model.field_triton import TritonFieldLoop

    return TritonFieldLoop.apply(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)


def triton_available(device: torch.device) -> bool:
    """Whether the Triton loop can run on `device` (Triton imports, and the device is CUDA or
    the interpreter is on)."""
    try:
        from atom_train.model.field_triton import triton_available as available
    except ImportError:
        return False
    return available(device)


def _native_entry(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
    from atom_train.model.field_native import NativeFieldLoop  # the extension's Rust loop

    return NativeFieldLoop.apply(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)


def native_available(device: torch.device) -> bool:
    """Whether the native (Rust) loop can run on `device`: a CPU (the extension always has
    it)."""
    return device.type == "cpu"


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
# kernels under the interpreter at most 1.4x the fused loop's error, the autograd loop 2.3x,
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


LOOPS: dict[str, FieldLoop] = {
    "fused": FusedFieldLoop.apply,
    "autograd": _autograd_entry,
    "compiled": CompiledFieldLoop.apply,
    "triton": _triton_entry,
    "native": _native_entry,
}
RECURRENCES = tuple(LOOPS)
