"""The field loop (SPEC §3 steps 2-6 over a window) as two Triton kernels: one launch for the
whole window's forward, one for its backward (`TritonFieldLoop`, recurrence "triton").

Same signature, outputs and gradients as `atom_train.field_loops.FusedFieldLoop`:

    Zs, Es, g, E = TritonFieldLoop.apply(U, z, keep, ar, ai, Cr, Ci, g, E, resets, c)

Design.

- **The state lives in registers.** One program owns BLOCK_B streams (16: the smallest M
  that `tl.dot` accepts) and loops over all K ticks inside the kernel. The field is kept as
  two [BLOCK_B, NP] tiles (real and imaginary parts), NP = next power of two >= max(n, 16);
  the padded modes stay exactly 0 because every padded entry of U, z, keep, a and C is
  loaded as 0 (masked loads: nothing is padded on the host). Cr^T and Ci^T are read from
  global memory once per program (the compiler keeps them in shared memory, from which each
  tick's dots take their operands). Per tick the only global memory traffic is U[t] in
  (prefetched one tick ahead) and Zs[t], E[t] and the gain out. The streams are
  independent, so programs never talk.
- **C phi is four `tl.dot`s** of [BLOCK_B, NP] x [NP, NP] per RK4 stage, on the real form:
  with Wc = [[Cr^T, Ci^T], [-Ci^T, Cr^T]], phi @ Wc = [pr Cr^T - pi Ci^T | pr Ci^T + pi Cr^T].
  The kernels read Cr^T and Ci^T straight from the parameters C_re, C_im (transposed views,
  by strides), and return the gradients of Cr and Ci.
- **The backward recomputes instead of storing.** The forward stores only its output Zs and
  the gain used at each tick G [K,B] (the controller is not invertible through its clamp).
  The backward walks t = K-1 ... 0; for each tick it reloads the field entering it (Zs[t-1],
  z at t = 0, zeros after a reset), recomputes the four RK4 stages, phase sync and cap in
  registers, then back-propagates through cap, phase sync, RK4 and the leak with
  FusedFieldLoop.backward's formulas (same conventions at |y| = 0 and below the phase-sync
  threshold). Storage is K*B*(2n+1) numbers instead of the fused loop's ~K*B*26n.
- **Parameter gradients without atomics.** Each program accumulates its streams' share of
  dL/dCr^T, dL/dCi^T (tl.dot of phi^T and the stage gradients: two accumulators, dL/dCr^T =
  G11 + G22 and dL/dCi^T = G12 - G21 of Wc's gradient blocks), dL/da and dL/dkeep in registers over the
  whole window and writes it once to a partials buffer [n_programs, F]; the wrapper finishes
  with one torch sum over the program axis. No float atomics anywhere: the result does not
  depend on scheduling (two backward runs are bit-identical; tested).
- **Precision.** The recurrence is IEEE fp32 whatever torch's TF32 flags say: every dot is
  `input_precision="ieee"` (phase sync divides by |sum of the modes|, which can be small, so
  TF32's 1e-3 relative error would be amplified), and the square roots and divisions are
  the correctly rounded `tl.sqrt_rn` / `tl.div_rn` (Triton's plain `/` and `sqrt` are the
  approximate PTX forms in fp32). Those two are fp32-only in Triton, so float64 (tests,
  under the interpreter) uses `tl.sqrt` and `/`, which are IEEE in fp64. The controller's
  step target^rate r'^-rate is one exp2(rate (log2 target - log2 r')) with Triton's fast
  exp2/log2: the gain carries no gradient, rate ~ 0.01 shrinks log2's error away, and
  exp2's (~2 ulp a tick) is of the order of the fused loop's own rounding of the step. All
  the loop's constants are constexpr, so in float64 they are float64 constants, not fp32
  kernel arguments.
- **Resets** are passed as two scalars (first reset tick, period), derived from the tuple of
  bools on the host and checked to reproduce it; a pattern that is not an arithmetic
  progression (the lockstep schedule never makes one) falls back to a small int32 table.
- **Registers.** With fp32 ieee operands `tl.dot` runs on the FMA units, and each thread
  holds its rows of the left operand and its columns of the right one for the whole K
  dimension: at n = 32 that, not the state, is the register cost. With 8 warps (NUM_WARPS),
  compiled ahead of time for sm_90a by Triton 3.9 (no GPU run), n = 32 fp32: the forward
  takes 156 registers a thread, the backward 255 with no spills (capped at 224 it spills
  ~100 bytes); with 4 warps the backward spills ~1.2 KB a thread. n <= 32 is the
  spill-free range; n = 64 runs, with spills.

What Triton's interpreter (TRITON_INTERPRET=1, how the tests run these kernels on a CPU) does
not check, and this file therefore respects by hand: `tl.dot` operands >= 16 in every
dimension (BLOCK_B and NP >= 16), power-of-two block shapes, register pressure (above), no
Triton API newer than 3.6, that fp32 `/` and `sqrt` are approximate on the GPU (the
interpreter's numpy ops are exact), and int32 overflow of offsets (time offsets are int64).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from atom_train.field_loops import FieldConsts
from atom_train.model import AMP_LOG_FLOOR, ENERGY_DECAY, GAIN_MAX, GAIN_MIN, PHASE_SYNC_MIN

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: triton_available() says no, apply() says why
    triton = None
    tl = None

BLOCK_B = 16  # streams per program: the smallest M of tl.dot, so the most programs
NUM_WARPS = 8  # see Registers in the module docstring

_NEEDS_DEVICE = (
    "recurrence 'triton' needs a CUDA device (or TRITON_INTERPRET=1 to run the kernels on the "
    "CPU for tests): use --recurrence fused"
)


if triton is not None:

    @triton.jit
    def _sqrt(x, F64: tl.constexpr):
        if F64:
            return tl.sqrt(x)  # IEEE sqrt.rn.f64
        else:
            return tl.sqrt_rn(x)

    @triton.jit
    def _div(x, y, F64: tl.constexpr):
        if F64:
            return x / y  # IEEE div.rn.f64
        else:
            return tl.div_rn(x, y)

    @triton.jit
    def _phi(yr, yi, F64: tl.constexpr):
        """phi(y) = y/(1+|y|) per mode, and |y|. The backward recomputes it from y with the
        same operations, so it gets the forward's values bit for bit."""
        m = _sqrt(yr * yr + yi * yi, F64)
        d = m + 1.0
        return _div(yr, d, F64), _div(yi, d, F64), m

    @triton.jit
    def _slope(yr, yi, ur, ui, ar, ai, A, Bm, F64: tl.constexpr):
        """k = u + a y + C phi(y) for one RK4 stage input y."""
        pr, pi, _m = _phi(yr, yi, F64)
        kr = ur + (ar * yr - ai * yi)
        ki = ui + (ai * yr + ar * yi)
        # pr's two dots, then pi's: one converted dot operand live at a time. The minus
        # sign goes on the accumulator (kr - pi B = -(pi B - kr), exactly), not on pi,
        # which would cost another conversion of an operand.
        kr = tl.dot(pr, A, kr, input_precision="ieee")
        ki = tl.dot(pr, Bm, ki, input_precision="ieee")
        ki = tl.dot(pi, A, ki, input_precision="ieee")
        kr = -tl.dot(pi, Bm, -kr, input_precision="ieee")
        return kr, ki

    @triton.jit
    def _rk4(z0r, z0i, ur, ui, ar, ai, A, Bm, H: tl.constexpr, F64: tl.constexpr):
        """One RK4 step from z0: z1 and the stage inputs y1, y2, y3 (the backward's)."""
        k0r, k0i = _slope(z0r, z0i, ur, ui, ar, ai, A, Bm, F64)
        y1r = z0r + (H * 0.5) * k0r
        y1i = z0i + (H * 0.5) * k0i
        k1r, k1i = _slope(y1r, y1i, ur, ui, ar, ai, A, Bm, F64)
        accr = k0r + 2.0 * k1r
        acci = k0i + 2.0 * k1i
        y2r = z0r + (H * 0.5) * k1r
        y2i = z0i + (H * 0.5) * k1i
        k2r, k2i = _slope(y2r, y2i, ur, ui, ar, ai, A, Bm, F64)
        accr = accr + 2.0 * k2r
        acci = acci + 2.0 * k2i
        y3r = z0r + H * k2r
        y3i = z0i + H * k2i
        k3r, k3i = _slope(y3r, y3i, ur, ui, ar, ai, A, Bm, F64)
        accr = accr + k3r
        acci = acci + k3i
        z1r = z0r + (H / 6.0) * accr
        z1i = z0i + (H / 6.0) * acci
        return z1r, z1i, y1r, y1i, y2r, y2i, y3r, y3i

    @triton.jit
    def _sync(z1r, z1i, PSM: tl.constexpr, F64: tl.constexpr):
        """Phase sync (z2 = z1 conj(s)/|s| where |s| > PSM) and the norm of z2; also the sum
        of the modes s = (sr, si) and the rotation (q0, q1) = s/|s|, for the backward."""
        sr = tl.sum(z1r, 1)
        si = tl.sum(z1i, 1)
        rho = _sqrt(sr * sr + si * si, F64)
        on = rho > PSM
        rc = tl.maximum(rho, PSM)
        q0 = tl.where(on, _div(sr, rc, F64), 1.0)[:, None]
        q1 = tl.where(on, _div(si, rc, F64), 0.0)[:, None]
        z2r = z1r * q0 + z1i * q1
        z2i = z1i * q0 - z1r * q1
        norm = _sqrt(tl.sum(z2r * z2r + z2i * z2i, 1), F64)
        return z2r, z2i, norm, sr, si, q0, q1

    @triton.jit
    def _is_reset(t, r0, period, RST, RESET_TABLE: tl.constexpr):
        if RESET_TABLE:
            return tl.load(RST + t) != 0
        else:
            return (t >= r0) & ((t - r0) % period == 0)

    @triton.jit
    def _mask_if(rows, cm, B, cond):
        """The mask of the block's real entries if the scalar `cond`, else all False. Built
        as a row bound because the interpreter turns `tile_mask & scalar` into int32."""
        lim = tl.where(cond, B, 0)
        return (rows < lim)[:, None] & cm[None, :]

    @triton.jit
    def _load_keep(KEEP, cols, cm, N: tl.constexpr, KEEP_SCALAR: tl.constexpr):
        if KEEP_SCALAR:
            kr = tl.load(KEEP)
            ki = kr
        else:
            kr = tl.load(KEEP + cols, mask=cm, other=0.0)[None, :]
            ki = tl.load(KEEP + N + cols, mask=cm, other=0.0)[None, :]
        return kr, ki

    @triton.jit
    def _prologue(
        AR,
        AI,
        CRT,
        CIT,
        s_w0,
        s_w1,
        KEEP,
        B,
        N: tl.constexpr,
        NP: tl.constexpr,
        BLOCK: tl.constexpr,
        KEEP_SCALAR: tl.constexpr,
    ):
        """Both kernels' start: this program's streams and modes, their masks, and the
        parameters, loaded once (padded entries 0, so the padded modes stay exactly 0)."""
        pid = tl.program_id(0)
        rows = pid * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, NP)
        rm = rows < B
        cm = cols < N
        m2 = rm[:, None] & cm[None, :]
        wm = cm[:, None] & cm[None, :]
        ar = tl.load(AR + cols, mask=cm, other=0.0)[None, :]
        ai = tl.load(AI + cols, mask=cm, other=0.0)[None, :]
        woff = cols[:, None] * s_w0 + cols[None, :] * s_w1
        A = tl.load(CRT + woff, mask=wm, other=0.0)  # Cr^T
        Bm = tl.load(CIT + woff, mask=wm, other=0.0)  # Ci^T
        kr, ki = _load_keep(KEEP, cols, cm, N, KEEP_SCALAR)
        return rows, cols, rm, cm, m2, wm, ar, ai, A, Bm, kr, ki

    # The window's reset pattern and length change from window to window: not specialized
    # on (Triton would otherwise compile a variant for values equal to 1 or divisible by 16).
    _VARYING = ["K", "r0", "period"]

    @triton.jit(do_not_specialize=_VARYING)
    def _field_fwd_kernel(
        U,
        s_uk,
        s_ub,
        Z,
        s_zb,
        KEEP,
        AR,
        AI,
        CRT,
        CIT,
        s_w0,
        s_w1,
        G_IN,
        E_IN,
        ZS,
        ES,
        GS,
        G_OUT,
        E_OUT,
        RST,
        B,
        K,
        r0,
        period,
        N: tl.constexpr,
        NP: tl.constexpr,
        BLOCK: tl.constexpr,
        KEEP_SCALAR: tl.constexpr,
        RESET_TABLE: tl.constexpr,
        F64: tl.constexpr,
        H: tl.constexpr,
        CAP: tl.constexpr,
        SQRT_N: tl.constexpr,
        MAX_RMS: tl.constexpr,
        RATE: tl.constexpr,
        LOG2_T: tl.constexpr,
        PSM: tl.constexpr,
        FLOOR: tl.constexpr,
        DECAY: tl.constexpr,
        GMIN: tl.constexpr,
        GMAX: tl.constexpr,
    ):
        rows, cols, rm, cm, m2, _wm, ar, ai, A, Bm, kr, ki = _prologue(
            AR, AI, CRT, CIT, s_w0, s_w1, KEEP, B, N, NP, BLOCK, KEEP_SCALAR
        )
        # The state.
        zp = Z + rows[:, None] * s_zb + cols[None, :]
        zr = tl.load(zp, mask=m2, other=0.0)
        zi = tl.load(zp + N, mask=m2, other=0.0)
        g = tl.load(G_IN + rows, mask=rm, other=1.0)
        E = tl.load(E_IN + rows, mask=rm, other=0.0)
        up = U + rows[:, None] * s_ub + cols[None, :]
        ur_raw = tl.load(up, mask=m2, other=0.0)
        ui_raw = tl.load(up + N, mask=m2, other=0.0)
        out = rows[:, None] * (2 * N) + cols[None, :]
        for t in range(K):
            # The next tick's drive is loaded now, so its latency hides behind this tick.
            nxt = up + tl.cast(t + 1, tl.int64) * s_uk
            nm = _mask_if(rows, cm, B, t + 1 < K)
            ur_next = tl.load(nxt, mask=nm, other=0.0)
            ui_next = tl.load(nxt + N, mask=nm, other=0.0)
            if _is_reset(t, r0, period, RST, RESET_TABLE):
                zr = tl.zeros_like(zr)
                zi = tl.zeros_like(zi)
                g = tl.full(g.shape, 1.0, g.dtype)
                E = tl.zeros_like(E)
            tb = tl.cast(t, tl.int64) * B
            tl.store(GS + tb + rows, g, mask=rm)
            ur = ur_raw * g[:, None]  # u uses the gain from before this tick's update
            ui = ui_raw * g[:, None]
            z0r = zr * kr  # 2. leak
            z0i = zi * ki
            z1r, z1i, _, _, _, _, _, _ = _rk4(z0r, z0i, ur, ui, ar, ai, A, Bm, H, F64)  # 3.
            z2r, z2i, norm, _, _, _, _ = _sync(z1r, z1i, PSM, F64)  # 4. phase sync
            sig = _div(CAP, tl.maximum(norm, CAP), F64)[:, None]  # 5. RMS cap
            zr = z2r * sig
            zi = z2i * sig
            tl.store(ZS + tb * (2 * N) + out, zr, mask=m2)
            tl.store(ZS + tb * (2 * N) + out + N, zi, mask=m2)
            # 6. amplitude controller (no gradient): r' = min(RMS before the cap, max).
            rc = tl.minimum(_div(norm, SQRT_N, F64), MAX_RMS)
            step = tl.exp2(RATE * (LOG2_T - tl.log2(tl.maximum(rc, FLOOR))))
            g = tl.minimum(tl.maximum(step * g, GMIN), GMAX)
            E = E * DECAY + (1.0 - DECAY) * rc * rc
            tl.store(ES + tb + rows, E, mask=rm)
            ur_raw = ur_next
            ui_raw = ui_next
        tl.store(G_OUT + rows, g, mask=rm)
        tl.store(E_OUT + rows, E, mask=rm)

    @triton.jit
    def _stage_bwd(
        gkr,
        gki,
        yr,
        yi,
        ar,
        ai,
        AT,
        BT,
        gCr,
        gCi,
        acc_ar,
        acc_ai,
        F64: tl.constexpr,
    ):
        """One RK4 stage k = u + a y + C phi(y), backwards, given dL/dk: dL/dy, and this
        stage's terms added to the sums for Cr^T, Ci^T (phi^T gk) and a (conj(y) gk)."""
        pr, pi, m = _phi(yr, yi, F64)
        prt = tl.trans(pr)
        pit = tl.trans(pi)
        # Wc's gradient blocks are G11 = pr^T gkr, G12 = pr^T gki, G21 = pi^T gkr, G22 =
        # pi^T gki; Cr^T gets G11 + G22 and Ci^T gets G12 - G21.
        gCr = tl.dot(prt, gkr, gCr, input_precision="ieee")
        gCr = tl.dot(pit, gki, gCr, input_precision="ieee")
        gCi = tl.dot(prt, gki, gCi, input_precision="ieee")
        gCi = tl.dot(-pit, gkr, gCi, input_precision="ieee")
        acc_ar += yr * gkr + yi * gki
        acc_ai += yr * gki - yi * gkr
        # w = dL/dphi = the phi half of gk Wc^T: wr = gkr Cr + gki Ci, wi = gki Cr - gkr Ci.
        t = tl.dot(gkr, BT, tl.zeros_like(gkr), input_precision="ieee")
        wr = tl.dot(gkr, AT, tl.zeros_like(gkr), input_precision="ieee")
        wr = tl.dot(gki, BT, wr, input_precision="ieee")
        wi = tl.dot(gki, AT, -t, input_precision="ieee")
        # phi's Jacobian: dphi^T w = w/(1+|y|) - y (y.w)/(|y| (1+|y|)^2), 0 at y = 0.
        invd = _div(1.0, m + 1.0, F64)
        fac = _div(invd * invd, tl.maximum(m, 1e-30), F64)  # field_loops._TINY
        coef = (wr * yr + wi * yi) * fac
        gyr = (ar * gkr + ai * gki) + wr * invd - yr * coef
        gyi = (ar * gki - ai * gkr) + wi * invd - yi * coef
        return gyr, gyi, gCr, gCi, acc_ar, acc_ai

    @triton.jit(do_not_specialize=_VARYING)
    def _field_bwd_kernel(
        U,
        s_uk,
        s_ub,
        Z,
        s_zb,
        KEEP,
        AR,
        AI,
        CRT,
        CIT,
        s_w0,
        s_w1,
        ZS,
        GS,
        GZS,
        s_gk,
        s_gb,
        GU,
        GZ,
        PART,
        F,
        RST,
        B,
        K,
        r0,
        period,
        N: tl.constexpr,
        NP: tl.constexpr,
        BLOCK: tl.constexpr,
        KEEP_SCALAR: tl.constexpr,
        RESET_TABLE: tl.constexpr,
        F64: tl.constexpr,
        NEED_KEEP: tl.constexpr,
        H: tl.constexpr,
        CAP: tl.constexpr,
        PSM: tl.constexpr,
    ):
        rows, cols, rm, cm, m2, wm, ar, ai, A, Bm, kr, ki = _prologue(
            AR, AI, CRT, CIT, s_w0, s_w1, KEEP, B, N, NP, BLOCK, KEEP_SCALAR
        )
        pid = tl.program_id(0)
        wofft = cols[None, :] * s_w0 + cols[:, None] * s_w1
        AT = tl.load(CRT + wofft, mask=wm, other=0.0)  # Cr = (Cr^T)^T, for gk Wc^T
        BT = tl.load(CIT + wofft, mask=wm, other=0.0)  # Ci
        dt = A.dtype
        # Per-program partial sums over this block's streams and all ticks.
        gCr = tl.zeros([NP, NP], dtype=dt)  # dL/dCr^T
        gCi = tl.zeros([NP, NP], dtype=dt)  # dL/dCi^T
        acc_ar = tl.zeros([BLOCK, NP], dtype=dt)
        acc_ai = tl.zeros([BLOCK, NP], dtype=dt)
        acc_kr = tl.zeros([BLOCK, NP], dtype=dt)
        acc_ki = tl.zeros([BLOCK, NP], dtype=dt)
        gzr = tl.zeros([BLOCK, NP], dtype=dt)  # dL/dz after the tick being walked
        gzi = tl.zeros([BLOCK, NP], dtype=dt)
        out = rows[:, None] * (2 * N) + cols[None, :]
        zin = Z + rows[:, None] * s_zb + cols[None, :]
        up = U + rows[:, None] * s_ub + cols[None, :]
        gp = GZS + rows[:, None] * s_gb + cols[None, :]
        for i in range(K):
            t = K - 1 - i
            tb = tl.cast(t, tl.int64) * B
            live = _is_reset(t, r0, period, RST, RESET_TABLE) == 0
            # The field entering tick t: Zs[t-1], z at t = 0, zeros after a reset (two
            # masked loads, at most one of which touches memory).
            prev = ZS + (tb - B) * (2 * N) + out
            pm = _mask_if(rows, cm, B, live & (t > 0))
            zpr = tl.load(prev, mask=pm, other=0.0)
            zpi = tl.load(prev + N, mask=pm, other=0.0)
            im = _mask_if(rows, cm, B, live & (t == 0))
            zpr += tl.load(zin, mask=im, other=0.0)
            zpi += tl.load(zin + N, mask=im, other=0.0)
            gt = tl.load(GS + tb + rows, mask=rm, other=0.0)[:, None]
            ut = up + tl.cast(t, tl.int64) * s_uk
            ur = tl.load(ut, mask=m2, other=0.0) * gt
            ui = tl.load(ut + N, mask=m2, other=0.0) * gt
            gtp = gp + tl.cast(t, tl.int64) * s_gk
            gzr += tl.load(gtp, mask=m2, other=0.0)
            gzi += tl.load(gtp + N, mask=m2, other=0.0)
            # Recompute tick t's forward.
            z0r = zpr * kr
            z0i = zpi * ki
            z1r, z1i, y1r, y1i, y2r, y2i, y3r, y3i = _rk4(z0r, z0i, ur, ui, ar, ai, A, Bm, H, F64)
            z2r, z2i, norm, sr, si, q0, q1 = _sync(z1r, z1i, PSM, F64)
            # 5. cap: z3 = sig z2; where capped d z3 = sig (I - z2 z2^T/|z2|^2) d z2.
            sig = _div(CAP, tl.maximum(norm, CAP), F64)
            capc = tl.where(norm > CAP, _div(sig * sig * sig, CAP * CAP, F64), 0.0)
            cdot = (capc * tl.sum(gzr * z2r + gzi * z2i, 1))[:, None]
            g2r = gzr * sig[:, None] - z2r * cdot
            g2i = gzi * sig[:, None] - z2i * cdot
            # 4. phase sync: gz1 = (q0 + i q1) g2 + dL/ds, dL/ds = V kappa with
            # V = (Im s, -Re s)/|s|^2 (0 where sync was skipped), kappa = Im sum conj(z2) g2.
            kappa = tl.sum(g2i * z2r - g2r * z2i, 1)
            rho2 = sr * sr + si * si
            onv = rho2 > PSM * PSM
            r2c = tl.maximum(rho2, 1e-30)  # field_loops._TINY
            v0 = (tl.where(onv, _div(si, r2c, F64), 0.0) * kappa)[:, None]
            v1 = (tl.where(onv, _div(-sr, r2c, F64), 0.0) * kappa)[:, None]
            real = cm[None, :]  # dL/ds reaches the real modes only
            gz1r = g2r * q0 - g2i * q1 + tl.where(real, v0, 0.0)
            gz1i = g2i * q0 + g2r * q1 + tl.where(real, v1, 0.0)
            # 3. RK4, last stage first; each stage's terms of dL/dWc, dL/da go straight into
            # the sums, so only the stage inputs y stay live through the walk.
            gk3r = gz1r * (H / 6.0)
            gk3i = gz1i * (H / 6.0)
            a3r = gz1r * (H / 3.0)
            a3i = gz1i * (H / 3.0)
            gyr, gyi, gCr, gCi, acc_ar, acc_ai = _stage_bwd(
                gk3r, gk3i, y3r, y3i, ar, ai, AT, BT, gCr, gCi, acc_ar, acc_ai, F64
            )
            gz0r = gz1r + gyr
            gz0i = gz1i + gyi
            gkr = a3r + gyr * H
            gki = a3i + gyi * H
            gur = gk3r + gkr
            gui = gk3i + gki
            gyr, gyi, gCr, gCi, acc_ar, acc_ai = _stage_bwd(
                gkr, gki, y2r, y2i, ar, ai, AT, BT, gCr, gCi, acc_ar, acc_ai, F64
            )
            gz0r += gyr
            gz0i += gyi
            gkr = a3r + gyr * (H * 0.5)
            gki = a3i + gyi * (H * 0.5)
            gur += gkr
            gui += gki
            gyr, gyi, gCr, gCi, acc_ar, acc_ai = _stage_bwd(
                gkr, gki, y1r, y1i, ar, ai, AT, BT, gCr, gCi, acc_ar, acc_ai, F64
            )
            gz0r += gyr
            gz0i += gyi
            gkr = gk3r + gyr * (H * 0.5)
            gki = gk3i + gyi * (H * 0.5)
            gur += gkr
            gui += gki
            gyr, gyi, gCr, gCi, acc_ar, acc_ai = _stage_bwd(
                gkr, gki, z0r, z0i, ar, ai, AT, BT, gCr, gCi, acc_ar, acc_ai, F64
            )
            gz0r += gyr
            gz0i += gyi
            # The drive: u = g U.
            tl.store(GU + tb * (2 * N) + out, gur * gt, mask=m2)
            tl.store(GU + tb * (2 * N) + out + N, gui * gt, mask=m2)
            if NEED_KEEP:  # z0 = keep z_prev (z_prev is 0 after a reset: no term)
                acc_kr += zpr * gz0r
                acc_ki += zpi * gz0i
            # 2. leak; a reset before this tick cuts the gradient to the past.
            gzr = tl.where(live, gz0r * kr, 0.0)
            gzi = tl.where(live, gz0i * ki, 0.0)
        gzp = GZ + rows[:, None] * (2 * N) + cols[None, :]
        tl.store(gzp, gzr, mask=m2)
        tl.store(gzp + N, gzi, mask=m2)
        # Partials row: [Cr^T (n x n, row-major) | Ci^T (n x n) | ar (n) | ai (n) | keep].
        prow = PART + tl.cast(pid, tl.int64) * F
        pw = prow + cols[:, None] * N + cols[None, :]
        tl.store(pw, gCr, mask=wm)
        tl.store(pw + N * N, gCi, mask=wm)
        pa = prow + 2 * N * N + cols
        # dL/d(ar) = sum Re(conj(y) gk), dL/d(ai) = sum Im(conj(y) gk).
        tl.store(pa, tl.sum(acc_ar, 0), mask=cm)
        tl.store(pa + N, tl.sum(acc_ai, 0), mask=cm)
        if NEED_KEEP:
            if KEEP_SCALAR:
                tl.store(prow + 2 * N * N + 2 * N, tl.sum(tl.sum(acc_kr + acc_ki, 1), 0))
            else:
                tl.store(pa + 2 * N, tl.sum(acc_kr, 0), mask=cm)
                tl.store(pa + 3 * N, tl.sum(acc_ki, 0), mask=cm)


def _interpreted() -> bool:
    """Whether the kernels were decorated under TRITON_INTERPRET=1 (read by @triton.jit at
    import): then they run on CPU tensors, through numpy."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_field_fwd_kernel, InterpretedFunction)


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
        CrT, CiT = Cr.t(), Ci.t()  # views: the kernels read C^T by strides
        if keep.dim() != 0 and tuple(keep.shape) != (2 * n,):
            raise ValueError(f"keep must be 0-dim or [{2 * n}], got {tuple(keep.shape)}")
        Zs = U.new_empty(K, B, 2 * n)
        Es = U.new_empty(K, B)
        Gs = U.new_empty(K, B)  # the gain used at each tick: the backward's u = g U
        g_out, E_out = torch.empty_like(g), torch.empty_like(E)
        grid = (triton.cdiv(B, BLOCK_B),)
        with torch.profiler.record_function("triton:field_fwd"):  # counted as one launch
            _field_fwd_kernel[grid](
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
                **_consts(n, keep.dim() == 0, table, U.dtype),
                SQRT_N=math.sqrt(n),
                MAX_RMS=c.max_rms,
                RATE=c.amp_rate,
                LOG2_T=c.log_target / math.log(2),
                FLOOR=AMP_LOG_FLOOR,
                DECAY=ENERGY_DECAY,
                GMIN=GAIN_MIN,
                GMAX=GAIN_MAX,
                H=c.dt,
                CAP=c.max_rms * math.sqrt(n),
                num_warps=NUM_WARPS,
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
        programs = triton.cdiv(B, BLOCK_B)
        gU = torch.empty_like(Zs)
        gz = z.new_empty(B, D)
        part = Zs.new_empty(programs, F)
        with torch.profiler.record_function("triton:field_bwd"):  # counted as one launch
            _field_bwd_kernel[(programs,)](
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
                **_consts(n, scalar_keep, table, U.dtype),
                NEED_KEEP=need_keep,
                H=c.dt,
                CAP=c.max_rms * math.sqrt(n),
                num_warps=NUM_WARPS,
            )
        # The deterministic finish of the per-program partial sums.
        sizes = [n * n, n * n, n, n] + ([F - 2 * n * n - 2 * n] if need_keep else [])
        gCrT, gCiT, g_ar, g_ai, *gkeep = part.sum(0).split(sizes)
        gkeep = (gkeep[0].view(()) if scalar_keep else gkeep[0]) if need_keep else None
        gz_in = gz if ctx.needs_input_grad[1] else None
        gCr, gCi = gCrT.view(n, n).t(), gCiT.view(n, n).t()
        return gU, gz_in, gkeep, g_ar, g_ai, gCr, gCi, None, None, None, None


def _consts(n: int, scalar_keep: bool, table: bool, dtype: torch.dtype) -> dict:
    """The compile-time arguments both kernels share."""
    return {
        "N": n,
        "NP": max(16, triton.next_power_of_2(n)),
        "BLOCK": BLOCK_B,
        "KEEP_SCALAR": scalar_keep,
        "RESET_TABLE": table,
        "F64": dtype == torch.float64,
        "PSM": PHASE_SYNC_MIN,
    }
