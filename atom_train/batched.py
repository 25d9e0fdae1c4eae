"""The batched tick: B byte streams of the field model in lockstep (SPEC §3).

`BatchedByteTick(model, B)` holds the runtime state of B streams and runs windows of K ticks:

    bt = BatchedByteTick(model, B=128)
    out = bt.run_window(feats, tgt, tick0)   # feats [K,B,320] f32 (or ids [K,B,17] i16)
    out.loss.backward(); opt.step(); opt.zero_grad(); bt.detach_state()

It computes what `AtomNativeModel.tick` computes for each stream (parity tests hold them
together within float32 rounding), organised for speed:

- the field is stored as real pairs `[Re z | Im z]` (2n floats per stream);
- everything that does not depend on the recurrent state runs once per window, as big
  matmuls over K*B rows: the compile of all drives, the atom embeddings, the readout and
  the losses over the stored fields (`_ByteCE`: the byte CE and its gradient, chunk by
  chunk, without ever materialising the [K*B, 256] logits);
- only leak, RK4, phase sync, RMS cap and the amplitude controller run per tick, in
  `_FieldLoop`: a custom autograd function whose forward runs without autograd and whose
  hand-written backward walks the window in reverse;
- atoms, consolidation and persistence do not feed back into the field, so they run after
  the loop, as a pass over the stored fields that touches only the ticks where something
  happens (a flush, a reset, a full buffer).

`recurrence="autograd"` runs the same loop with ordinary autograd (slower; kept as the
readable cross-check of the hand-written backward). `compile=True` runs the fused loop's
per-tick steps through torch.compile (faster, after a one-off compile). docs/model.md has
the design, the measurements and the tolerances.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from atom_train.atomizer import FEATURE_DIM
from atom_train.model import (
    AMP_LOG_FLOOR,
    COS_EPS,
    ENERGY_DECAY,
    GAIN_MAX,
    GAIN_MIN,
    N_BYTES,
    PERSIST_LOSS_WEIGHT,
    PHASE_SYNC_MIN,
    AtomNativeModel,
    ModelConfig,
    StreamState,
    UnsupportedOption,
    unimplemented_options,
)

# Squared magnitudes are clamped to this before a square root, so that |z| at z = 0 has a
# finite gradient (zero: clamp passes no gradient below its floor), like torch's complex abs.
_TINY = 1e-30
RECURRENCES = ("fused", "autograd")


class BatchedUnsupported(UnsupportedOption):
    """The config asks for an option that the batched tick does not implement."""


def check_batched_supported(config: ModelConfig) -> None:
    """Raise BatchedUnsupported naming every option set in `config` that the batched tick
    does not implement (nothing is silently ignored)."""
    problems = unimplemented_options(config)
    if problems:
        raise BatchedUnsupported("the batched tick does not implement: " + "; ".join(problems))


@dataclass
class WindowResult:
    loss: Tensor  # scalar with graph: mean over ticks and streams
    byte_ce: float  # mean byte CE over the window, nats
    per_stream_loss: Tensor  # (B,) mean over the window's ticks, detached
    ticks: int
    logits: Tensor | None = None  # (K, B, 256), detached (return_details)
    len_logits: Tensor | None = None  # (K, B, max_len), detached (return_details)
    tick_loss: Tensor | None = None  # (K, B), detached (return_details)


@dataclass(frozen=True)
class _Consts:
    n: int
    dt: float
    max_rms: float
    log_target: float
    amp_rate: float


def _controller(rms: Tensor, g: Tensor, E: Tensor, c: _Consts) -> tuple[Tensor, Tensor]:
    """Amplitude controller (SPEC §3 step 6) from the RMS before the cap; no gradient.
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


def _loop_autograd(U, z, keep, W, Wc, g, E, resets, c: _Consts):
    """Steps 2-6 for K ticks: the fields after each tick [K,B,2n], E after each tick [K,B],
    and the final g, E. f(y) = u + y W + phi(y) Wc is SPEC's a z + u + C phi(z) on pairs."""
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
        g, E = _controller(r.detach(), g, E, c)
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


def _sync_q(s: Tensor) -> Tensor:
    """(q0, q1) = s/|s| for sums of modes s [..., 2], or (1, 0) where |s| <= PHASE_SYNC_MIN.
    Phase sync multiplies z by conj(s)/|s| = q0 - i q1."""
    rho = torch.linalg.vector_norm(s, dim=-1, keepdim=True)
    one = torch.tensor([1.0, 0.0], dtype=s.dtype, device=s.device)
    return torch.where(rho > PHASE_SYNC_MIN, s / rho.clamp(min=PHASE_SYNC_MIN), one)


def _diag_form(ar: Tensor, ai: Tensor) -> Tensor:
    """The real 2n x 2n form of diag(a), a = ar + i ai, acting on row vectors [Re | Im]."""
    return torch.cat(
        [
            torch.cat([torch.diag(ar), torch.diag(ai)], 1),
            torch.cat([torch.diag(-ai), torch.diag(ar)], 1),
        ]
    )


class _FieldLoop(torch.autograd.Function):
    """Steps 2-6 for K ticks. Inputs: drives U [K,B,2n] (before the gain), the field z [B,2n]
    entering the window, keep = 1 - leak (0-dim or [2n]), a = ar + i ai (n each), the real
    form Wc [2n,2n] of C (C phi -> phi Wc), the no-gradient g, E [B], the reset flags and
    the constants. With W_f = [diag form of a; Wc], f(y) = u + [y | phi(y)] W_f.

    Outputs: the field after each tick [K,B,2n], E after each tick [K,B], final g and E."""

    @staticmethod
    def forward(ctx, U, z, keep, ar, ai, Wc, g, E, resets, c: _Consts):
        K, B, D = U.shape
        n, h = c.n, c.dt
        cap = c.max_rms * math.sqrt(n)  # RMS > max  <=>  |z| > max sqrt(n)
        Wf = torch.cat([_diag_form(ar, ai), Wc])
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
        one = U.new_tensor([1.0, 0.0])
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
            g, E = _controller(norm / math.sqrt(n), g, E, c)
            Es[t] = E
        return _end_forward(ctx, (YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf), resets, c, Es, g, E)

    @staticmethod
    def backward(ctx, gZs, _gEs, _gg, _gE):
        YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf = ctx.saved_tensors
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
        g_ar, g_ai = _a_grads(acc_re.sum((0, 1)), acc_im.sum((0, 1)), n)
        gkeep = _keep_grad(z_in, Zs, G0, keep, resets) if need_keep else None
        gz_in = gz if ctx.needs_input_grad[1] else None
        return gU, gz_in, gkeep, g_ar, g_ai, gWc, None, None, None, None


def _end_forward(ctx, saved, resets, c: _Consts, Es, g, E):
    """Shared end of both field loops' forward: keep what the backward reads (the same
    tensors, in the same order, for both), return (Zs, Es, g, E) with the state outputs
    marked as carrying no gradient."""
    ctx.save_for_backward(*saved)
    ctx.resets, ctx.c = resets, c
    Es, g, E = Es.squeeze(2), g.squeeze(1), E.squeeze(1)
    ctx.mark_non_differentiable(Es, g, E)
    return saved[3], Es, g, E


def _backward_constants(S, Nz, c: _Consts):
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
    K = Zs.shape[0]
    Zin = torch.cat([z_in.unsqueeze(0), Zs[:-1]])  # the field entering each tick
    live = torch.tensor([not r for r in resets], device=Zs.device)  # 0 after a reset
    gkeep = (Zin * G0 * live.view(K, 1, 1)).sum((0, 1))
    return gkeep.sum() if keep.dim() == 0 else gkeep


# ---- the same loop as pure per-tick functions, for torch.compile (compile=True) ----
#
# The eager loop above writes into preallocated buffers (out=), which is what makes it fast
# without a compiler but is not something torch.compile turns into one graph. These are the
# same per-tick steps written functionally; compiled, each becomes a few fused kernels plus
# the matmuls. Tests hold them to the eager loop.


def _fwd_tick(z, U_t, g, E, keep, Wf, one, c: _Consts):
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
    g, E = _controller(norm / math.sqrt(n), g, E, c)
    return z3, g, E, torch.stack(yps), torch.stack(ms), z2, s, q, norm


def _bwd_tick(gz, z2, q, V, sig, capc, yp, m, g_t, WfT, c: _Consts):
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


def _compiled(c: _Consts, device_type: str):
    """The compiled per-tick functions for these constants (built on first use)."""
    key = (c, device_type)
    if key not in _COMPILED:
        opts = {"dynamic": False, "fullgraph": True}
        _COMPILED[key] = (
            torch.compile(functools.partial(_fwd_tick, c=c), **opts),
            torch.compile(functools.partial(_bwd_tick, c=c), **opts),
        )
    return _COMPILED[key]


class _FieldLoopCompiled(torch.autograd.Function):
    """`_FieldLoop` with compiled per-tick functions: same inputs, outputs and gradients."""

    @staticmethod
    def forward(ctx, U, z, keep, ar, ai, Wc, g, E, resets, c: _Consts):
        fwd = _compiled(c, U.device.type)[0]
        Wf = torch.cat([_diag_form(ar, ai), Wc])
        one = U.new_tensor([1.0, 0.0])
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
        return _end_forward(ctx, (YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf), resets, c, Es, g, E)

    @staticmethod
    def backward(ctx, gZs, _gEs, _gg, _gE):
        YP, M, Z2, Zs, S, Q, Nz, G, z_in, keep, Wf = ctx.saved_tensors
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
        g_ar, g_ai = _a_grads(a_re, a_im, c.n)
        gkeep = None
        if ctx.needs_input_grad[2]:
            gkeep = _keep_grad(z_in, Zs, torch.stack(G0), keep, resets)
        gz_in = gz if ctx.needs_input_grad[1] else None
        return torch.stack(gU), gz_in, gkeep, g_ar, g_ai, gWc, None, None, None, None


# ---- the byte cross-entropy over the window, fused with its gradient ----

_CE_CHUNK = 512  # rows per chunk: [512, 256] float32 logits stay in cache


class _ByteCE(torch.autograd.Function):
    """scale * sum over rows of CE(X W + b, y), and the per-row CE (no gradient).

    The [rows, 256] logits are the largest tensors of a window, and every pass over them
    costs memory bandwidth. So the forward never materialises them whole: chunk by chunk it
    computes the logits, the CE and (when a gradient is wanted) the gradients of X, W and b,
    while the chunk is in cache; the backward only scales those by the incoming gradient
    (a no-op for the usual loss.backward()). Rows [0, frozen) of W (the frozen W0) get no
    gradient."""

    @staticmethod
    def forward(ctx, X, W, b, y, scale: float, frozen: int, need_grad: bool, logits_out):
        N = X.shape[0]
        ce = X.new_empty(N)
        if need_grad:
            gX, gW, gb = torch.empty_like(X), torch.zeros_like(W), torch.zeros_like(b)
            WT_scaled = W.t() * scale
        for r0 in range(0, N, _CE_CHUNK):
            r1 = min(N, r0 + _CE_CHUNK)
            Xc, yc = X[r0:r1], y[r0:r1].unsqueeze(1)
            L = torch.addmm(b, Xc, W)
            if logits_out is not None:
                logits_out[r0:r1] = L
            L = F.log_softmax(L, 1)
            torch.neg(L.gather(1, yc).squeeze(1), out=ce[r0:r1])
            if need_grad:
                P = L.exp_()  # softmax; dCE/dlogits = softmax - onehot(y)
                P.scatter_add_(1, yc, P.new_full(yc.shape, -1.0))
                torch.mm(P, WT_scaled, out=gX[r0:r1])
                gW[frozen:].addmm_(Xc[:, frozen:].t(), P)
                gb.add_(P.sum(0))
        if need_grad:
            ctx.save_for_backward(gX, gW.mul_(scale), gb.mul_(scale))
        ctx.mark_non_differentiable(ce)
        return ce.sum() * scale, ce

    @staticmethod
    def backward(ctx, g, _gce):
        grads = ctx.saved_tensors
        if bool(g != 1):
            grads = [t * g for t in grads]
        return *grads, None, None, None, None, None


# ---- the batched runtime ----


class BatchedByteTick:
    """Runtime state of B streams and the windowed forward (see the module docstring).

    State (real pairs [Re | Im] for complex quantities): z [B,2n] (the only part carrying
    gradient), P [B,2n], E [B], g [B], e_buf [B,A,atom_dim], h_buf [B,A,2n], n_atoms [B].
    """

    def __init__(
        self,
        model: AtomNativeModel,
        B: int,
        device: torch.device | str | None = None,
        recurrence: str = "fused",
        compile: bool = False,
    ) -> None:
        check_batched_supported(model.config)
        if B < 1:
            raise ValueError(f"B must be >= 1, got {B}")
        if recurrence not in RECURRENCES:
            raise ValueError(f"recurrence must be one of {RECURRENCES}, got {recurrence!r}")
        self.model = model
        self.config = model.config
        self.B = B
        self.recurrence = recurrence
        # torch.compile of the fused loop's per-tick steps: faster after a one-off compile
        # (tens of seconds on a CPU; needs a C++ compiler there). See docs/model.md.
        self.compile = compile
        p = next(model.parameters())
        self.device = torch.device(device) if device is not None else p.device
        self.dtype = p.dtype
        cfg = self.config
        self._consts = _Consts(
            n=cfg.n_modes,
            dt=cfg.dt,
            max_rms=cfg.field_max_rms,
            log_target=math.log(cfg.amp_target),
            amp_rate=cfg.amp_rate,
        )
        D, A = 2 * cfg.n_modes, cfg.n_atoms_max
        kw = {"dtype": self.dtype, "device": self.device}
        self.z = torch.zeros(B, D, **kw)
        self.P = torch.zeros(B, D, **kw)
        self.E = torch.zeros(B, **kw)
        self.g = torch.ones(B, **kw)
        self.e_buf = torch.zeros(B, A, cfg.atom_dim, **kw)
        self.h_buf = torch.zeros(B, A, D, **kw)
        # Atom counts live on the host: the post-pass decides on them without a device sync.
        self._n_atoms = np.zeros(B, dtype=np.int64)

    # ---- state management ----

    @property
    def n_atoms(self) -> Tensor:
        return torch.from_numpy(self._n_atoms.copy())

    def _mask(self, mask) -> np.ndarray:
        if mask is None:
            return np.ones(self.B, dtype=bool)
        m = np.asarray(mask.detach().cpu() if isinstance(mask, Tensor) else mask)
        if m.shape != (self.B,) or m.dtype != np.bool_:
            raise ValueError(
                f"mask must be a bool array of shape ({self.B},), got {m.dtype} {m.shape}"
            )
        return m

    def reset_state(self, mask=None) -> None:
        """Episode reset of the masked streams (all if None): z, P, E = 0, g = 1, atoms
        cleared without consolidation."""
        m = self._mask(mask)
        dm = torch.from_numpy(m).to(self.device)
        col = dm.unsqueeze(1)
        self.z = torch.where(col, 0.0, self.z)
        self.P = torch.where(col, 0.0, self.P)
        self.E = torch.where(dm, 0.0, self.E)
        self.g = torch.where(dm, 1.0, self.g)
        self._n_atoms[m] = 0

    def flush_atoms(self, mask=None) -> None:
        """Atom flush of the masked streams (all if None): consolidate the live atoms, then
        n_atoms = 0."""
        self._consolidate(self._mask(mask), self.E)

    def detach_state(self) -> None:
        """Cut the graph after the optimizer step (the end of a BPTT window)."""
        self.z = self.z.detach()

    @torch.no_grad()
    def _consolidate(self, m: np.ndarray, E: Tensor) -> None:
        """Consolidate the masked streams with live atoms, using the energy EMA E [B]."""
        m = m & (self._n_atoms > 0)
        if not m.any():
            return
        cfg = self.config
        L = int(self._n_atoms[m].max())
        h = self.h_buf[:, :L]
        energy = (h * h).sum(-1) / cfg.n_modes  # mean |h|^2 over the modes
        counts = torch.from_numpy(np.where(m, self._n_atoms, 0)).to(self.device)
        live = torch.arange(L, device=self.device).unsqueeze(0) < counts.unsqueeze(1)
        chosen = live & (energy >= cfg.consolidate_threshold * E.unsqueeze(1))
        k = chosen.sum(1)
        c = (h * chosen.unsqueeze(2)).sum(1) / k.clamp(min=1).unsqueeze(1).to(h.dtype)
        rate = cfg.persist_rate
        self.P = torch.where((k > 0).unsqueeze(1), rate * self.P + (1 - rate) * c, self.P)
        self._n_atoms[m] = 0

    @torch.no_grad()
    def _append(self, Zd: Tensor, ed: Tensor, a: int, b: int) -> None:
        """Append the atoms of window ticks [a, b) to every stream's buffers."""
        L = b - a
        if L <= 0:
            return
        n0 = self._n_atoms
        if (n0 == n0[0]).all():  # lockstep: one slice for all streams
            s = int(n0[0])
            self.h_buf[:, s : s + L] = Zd[a:b].transpose(0, 1)
            self.e_buf[:, s : s + L] = ed[a:b].transpose(0, 1)
        else:
            pos = torch.from_numpy(n0[:, None] + np.arange(L)[None, :]).to(self.device)
            rows = torch.arange(self.B, device=self.device).unsqueeze(1)
            self.h_buf[rows, pos] = Zd[a:b].transpose(0, 1)
            self.e_buf[rows, pos] = ed[a:b].transpose(0, 1)
        self._n_atoms += L

    def _atoms_pass(self, Zd: Tensor, ed: Tensor, Es: Tensor, E_in: Tensor, sched) -> Tensor:
        """Step 7 for a whole window, after the field loop (atoms never feed back into the
        field): append the atoms, apply the schedule's resets and flushes and the full-buffer
        consolidations, and return P after step 7 of every tick [K,B,2n].

        Zd, ed: the detached fields and atom embeddings of the window's ticks; Es: E after
        each tick; E_in: E entering the window; sched[t] = (reset, flush) before tick t."""
        K = Zd.shape[0]
        A = self.config.n_atoms_max
        everyone = np.ones(self.B, dtype=bool)
        segments = []  # (first tick, end tick, P): P after step 7 of those ticks
        p_from = 0
        pending = 0  # first tick whose atom is not yet in the buffers
        for t in range(K):
            reset, flush = sched[t]
            if reset or flush:
                self._append(Zd, ed, pending, t)
                pending = t
                segments.append((p_from, t, self.P))
                p_from = t
                if reset:  # clears the atoms without consolidating them
                    self.P = torch.zeros_like(self.P)
                    self._n_atoms[:] = 0
                if flush:  # uses E before this tick
                    self._consolidate(everyone, Es[t - 1] if t > 0 else E_in)
            if int(self._n_atoms.max()) + (t + 1 - pending) >= A:
                # Some buffer is full after this tick's append: consolidate it with E after
                # step 6 of this tick; the loss of this tick already sees the new P.
                self._append(Zd, ed, pending, t + 1)
                pending = t + 1
                segments.append((p_from, t, self.P))
                p_from = t
                self._consolidate(self._n_atoms >= A, Es[t])
        self._append(Zd, ed, pending, K)
        segments.append((p_from, K, self.P))
        parts = [P.unsqueeze(0).expand(b - a, -1, -1) for a, b, P in segments if b > a]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 0)

    # ---- the window ----

    def _field_coeffs(self) -> tuple[Tensor, Tensor, Tensor]:
        """a = ar + i ai (n each) and the real form Wc [2n,2n] of C acting on row vectors
        [Re | Im]: C phi -> phi @ Wc."""
        m = self.model
        Cr, Ci = m.C_re.t(), m.C_im.t()
        Wc = torch.cat([torch.cat([Cr, Ci], 1), torch.cat([-Ci, Cr], 1)])
        return -F.softplus(m.gamma), m.omega, Wc

    def _keep(self) -> Tensor:
        keep = 1 - self.model.leak()
        return keep if keep.dim() == 0 else torch.cat([keep, keep])

    def _inputs(self, feats: Tensor) -> tuple[Tensor, Tensor]:
        """Drives before the gain [K,B,2n] and atom embeddings [K,B,atom_dim] for the whole
        window: one matmul (dense features) or one embedding-sum (feature ids)."""
        m, D = self.model, 2 * self.config.n_modes
        K, B = feats.shape[:2]
        weight = torch.cat([m.compile.weight, m.atom.weight])  # [2n + atom_dim, 320]
        bias = torch.cat([m.compile.bias, m.atom.bias])
        if feats.dtype.is_floating_point:
            if feats.shape[2] != FEATURE_DIM:
                raise ValueError(f"feats must be [K,B,{FEATURE_DIM}], got {tuple(feats.shape)}")
            x = feats.to(device=self.device, dtype=self.dtype, non_blocking=True)
            out = F.linear(x.reshape(K * B, FEATURE_DIM), weight, bias)
        else:
            # Compact ids: the indices of the features equal to 1, padded with 320.
            ids = feats.to(device=self.device, non_blocking=True).long().reshape(K * B, -1)
            pad = torch.zeros(1, weight.shape[0], dtype=self.dtype, device=self.device)
            table = torch.cat([weight.t(), pad])
            out = F.embedding_bag(ids, table, mode="sum", padding_idx=FEATURE_DIM) + bias
        U = out[:, :D].reshape(K, B, D)
        e = torch.tanh(out[:, D:]).reshape(K, B, -1)
        return U, e

    def _masks(self, K, training, masks, generator) -> Tensor:
        B = self.B
        if masks is not None:
            masks = torch.as_tensor(masks)
            if tuple(masks.shape) != (K, B):
                raise ValueError(f"masks must be [K,B] = [{K},{B}], got {tuple(masks.shape)}")
        elif training:
            # One draw of B numbers per tick, in tick order, on the CPU (so CPU and CUDA runs
            # see the same masks; at B = 1 exactly the reference's draws).
            p = self.config.last_atom_dropout
            masks = torch.stack([torch.rand(B, generator=generator) >= p for _ in range(K)])
        else:
            return torch.ones(K, B, dtype=self.dtype, device=self.device)
        return masks.to(device=self.device, dtype=self.dtype)

    def run_window(
        self,
        feats: Tensor,
        tgt: Tensor,
        tick0: int,
        training: bool = True,
        masks: Tensor | None = None,
        generator: torch.Generator | None = None,
        return_details: bool = False,
    ) -> WindowResult:
        """K ticks for the B streams: global ticks tick0 ... tick0 + K - 1, the lockstep
        schedule applied before each (reset if t % episode_length == 0, then flush if
        t % atom_flush_every == 0).

        feats: [K,B,320] float, or [K,B,J] integer feature ids padded with 320; tgt: [K,B]
        next bytes. Last-atom masks: explicit `masks` [K,B] (0/1) if given, else in training
        K draws of `torch.rand(B, generator=generator) >= last_atom_dropout` (generator: a CPU
        generator; None = torch's global one), else 1. The result's loss carries the graph;
        after backward and the optimizer step, call `detach_state()`.
        """
        cfg, model = self.config, self.model
        if feats.dim() != 3 or feats.shape[1] != self.B:
            raise ValueError(f"feats must be [K,{self.B},...], got {tuple(feats.shape)}")
        K, B, D = feats.shape[0], self.B, 2 * cfg.n_modes
        if K < 1:
            raise ValueError("a window needs at least one tick")
        if tuple(tgt.shape) != (K, B):
            raise ValueError(f"tgt must be [K,B] = [{K},{B}], got {tuple(tgt.shape)}")
        sched = [
            (t % cfg.episode_length == 0, t % cfg.atom_flush_every == 0)
            for t in range(tick0, tick0 + K)
        ]
        m = self._masks(K, training, masks, generator)
        U, e = self._inputs(feats)
        resets = tuple(r for r, _ in sched)
        E_in = self.E
        if self.recurrence == "fused":
            ar, ai, Wc = self._field_coeffs()
            loop = _FieldLoopCompiled if self.compile else _FieldLoop
            Zs, Es, g, E = loop.apply(
                U, self.z, self._keep(), ar, ai, Wc, self.g, self.E, resets, self._consts
            )
        else:
            ar, ai, Wc = self._field_coeffs()
            Zs, Es, g, E = _loop_autograd(
                U,
                self.z,
                self._keep(),
                _diag_form(ar, ai),
                Wc,
                self.g,
                self.E,
                resets,
                self._consts,
            )
        self.z, self.g, self.E = Zs[-1], g, E
        P_seq = self._atoms_pass(Zs.detach(), e.detach(), Es, E_in, sched)

        # Readout and losses for all K*B (tick, stream) pairs at once. a_hat = R v only feeds
        # linear maps (W0, the MLP's first layer, the length head): when jl_dim >= 2n it is
        # cheaper to fold R into them than to compute a_hat (the same map, other rounding).
        lin1, act, lin2 = model.mlp
        v = Zs.reshape(K * B, D)
        R = model.R
        if cfg.jl_dim >= D:
            x_in, W0, W1, W_len = v, model.W0 @ R, lin1.weight @ R, model.len_head.weight @ R
        else:
            x_in, W0, W1, W_len = v @ R.t(), model.W0, lin1.weight, model.len_head.weight
        hidden = act(F.linear(x_in, W1, lin1.bias))
        # logits = W0 a + alpha (W2 h + b2) + m (U e + c) as ONE matmul: the [K*B, 256]
        # logits are the biggest tensors here, and every pass over them costs.
        mf = m.reshape(K * B, 1)
        X = torch.cat([x_in, hidden, e.reshape(K * B, -1) * mf, mf], 1)
        W_out = torch.cat(
            [
                W0.t(),
                model.alpha * lin2.weight.t(),
                model.last_atom.weight.t(),
                model.last_atom.bias.unsqueeze(0),
            ]
        )
        y = tgt.to(device=self.device, non_blocking=True).long().reshape(K * B)
        logits = X.new_empty(K * B, N_BYTES) if return_details else None
        need_grad = torch.is_grad_enabled() and (X.requires_grad or W_out.requires_grad)
        ce_mean, ce = _ByteCE.apply(
            X, W_out, model.alpha * lin2.bias, y, 1 / (K * B), x_in.shape[1], need_grad, logits
        )
        len_logits = F.linear(x_in, W_len, model.len_head.bias)
        len_y = torch.zeros(K * B, dtype=torch.long, device=self.device)  # span 1: class 0
        len_ce = F.cross_entropy(len_logits, len_y, reduction="none").view(K, B)
        live = (P_seq != 0).any(-1)  # the persistence term is exactly 0 while P = 0
        norms = torch.linalg.vector_norm(Zs, dim=-1) * torch.linalg.vector_norm(P_seq, dim=-1)
        cos = (Zs * P_seq).sum(-1) / norms.clamp(min=COS_EPS)
        persist = torch.where(live, PERSIST_LOSS_WEIGHT * (1 - cos), 0.0)
        rest = len_ce + persist
        tick_loss = ce.view(K, B) + rest.detach()
        out = WindowResult(
            loss=ce_mean + rest.mean(),
            byte_ce=float(ce.mean()),
            per_stream_loss=tick_loss.detach().mean(0),
            ticks=K,
        )
        if return_details:
            out.logits = logits.view(K, B, N_BYTES)
            out.len_logits = len_logits.detach().view(K, B, -1)
            out.tick_loss = tick_loss.detach()
        return out

    # ---- runtime state (de)serialisation ----

    def state_dict(self) -> dict[str, Tensor]:
        """Everything needed to resume exactly, as plain contiguous CPU tensors (safetensors
        ready): z, P [B,2n] ([Re | Im]), E, g [B], n_atoms [B] int64, and the atom buffers
        e_buf [B,L,atom_dim], h_buf [B,L,2n] trimmed to the longest live prefix L."""
        L = int(self._n_atoms.max())

        def cpu(t: Tensor) -> Tensor:
            return t.detach().to("cpu", copy=True).contiguous()

        return {
            "z": cpu(self.z),
            "P": cpu(self.P),
            "E": cpu(self.E),
            "g": cpu(self.g),
            "n_atoms": torch.from_numpy(self._n_atoms.copy()),
            "e_buf": cpu(self.e_buf[:, :L]),
            "h_buf": cpu(self.h_buf[:, :L]),
        }

    def load_state_dict(self, d: dict[str, Tensor]) -> None:
        """Restore `state_dict()` output; validates keys, B and shapes with a clear error."""
        cfg, B = self.config, self.B
        D, A = 2 * cfg.n_modes, cfg.n_atoms_max
        keys = {"z", "P", "E", "g", "n_atoms", "e_buf", "h_buf"}
        if set(d) != keys:
            raise ValueError(
                f"runtime state keys {sorted(d)} != expected {sorted(keys)} "
                "(was it saved by BatchedByteTick.state_dict?)"
            )
        if d["z"].dim() < 1 or d["z"].shape[0] != B:
            raise ValueError(
                f"runtime state is for B = {d['z'].shape[0] if d['z'].dim() else '?'} streams, "
                f"this BatchedByteTick has B = {B}"
            )
        L = d["h_buf"].shape[1] if d["h_buf"].dim() == 3 else -1
        want = {
            "z": (B, D),
            "P": (B, D),
            "E": (B,),
            "g": (B,),
            "n_atoms": (B,),
            "e_buf": (B, L, cfg.atom_dim),
            "h_buf": (B, L, D),
        }
        for k, shape in want.items():
            if tuple(d[k].shape) != shape:
                raise ValueError(
                    f"runtime state {k!r} has shape {tuple(d[k].shape)}, expected {shape} "
                    f"(B={B}, n_modes={cfg.n_modes}, atom_dim={cfg.atom_dim})"
                )
        n = d["n_atoms"].to(torch.int64).numpy()
        if not 0 <= L <= A or (n < 0).any() or (n > L).any():
            raise ValueError(
                f"runtime state atom counts must lie in [0, {L}] with buffer length "
                f"L = {L} <= n_atoms_max = {A}"
            )
        kw = {"dtype": self.dtype, "device": self.device}
        self.z, self.P = d["z"].to(**kw), d["P"].to(**kw)
        self.E, self.g = d["E"].to(**kw), d["g"].to(**kw)
        self.e_buf = torch.zeros(B, A, cfg.atom_dim, **kw)
        self.h_buf = torch.zeros(B, A, D, **kw)
        self.e_buf[:, :L] = d["e_buf"].to(**kw)
        self.h_buf[:, :L] = d["h_buf"].to(**kw)
        self._n_atoms = n.copy()

    def stream_state(self, b: int) -> StreamState:
        """Stream b's state in the reference's form (complex, detached)."""
        n, A = self.config.n_modes, self.config.n_atoms_max
        ct = self.model.complex_dtype()

        def cx(t: Tensor) -> Tensor:
            return torch.complex(t[..., :n], t[..., n:]).to(ct)

        return StreamState(
            z=cx(self.z[b].detach()).clone(),
            P=cx(self.P[b]).clone(),
            E=self.E[b].clone(),
            g=self.g[b].clone(),
            e_buf=self.e_buf[b].clone(),
            h_buf=cx(self.h_buf[b, :A]).clone(),
            n_atoms=int(self._n_atoms[b]),
        )
