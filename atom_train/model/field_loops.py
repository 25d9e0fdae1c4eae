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

`available(loop, device)` says whether a loop can run on a device (the one answer the
backend's choice, `atom_train.model.backend`, and the tests read). Proving the Triton loop
against the fused loop before a run trusts it is `atom_train.model.loop_check`; the
precision of the matmuls (TF32, IEEE) is `atom_train.model.precision`.

Tests hold them together (tests/test_field_loops.py, tests/model/test_batched.py,
tests/model/test_field_triton.py, tests/model/test_field_native.py); docs/model.md has the derivation of the backward.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
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
from atom_train.model.precision import ieee_matmuls


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


def _native_entry(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c: FieldConsts):
    from atom_train.model.field_native import NativeFieldLoop  # the extension's Rust loop

    return NativeFieldLoop.apply(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)


LOOPS: dict[str, FieldLoop] = {
    "fused": FusedFieldLoop.apply,
    "autograd": _autograd_entry,
    "compiled": CompiledFieldLoop.apply,
    "triton": _triton_entry,
    "native": _native_entry,
}
RECURRENCES = tuple(LOOPS)


def available(loop: str, device: torch.device | str) -> bool:
    """Whether the loop named `loop` (one of RECURRENCES) can run on `device`: ``triton``
    when Triton imports and the device is CUDA (any device under the interpreter,
    TRITON_INTERPRET=1: tests); ``native`` on a CPU (the extension always has it); the torch
    loops anywhere."""
    if loop not in LOOPS:
        raise ValueError(f"no field loop {loop!r}: one of {', '.join(LOOPS)}")
    device = torch.device(device)
    if loop == "triton":
        try:
            from atom_train.model.field_triton import triton_available
        except ImportError:
            return False
        return triton_available(device)
    if loop == "native":
        return device.type == "cpu"
    return True
