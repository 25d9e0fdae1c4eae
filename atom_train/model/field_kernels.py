"""The field loop's two Triton kernels, and the compile-time arguments they take.

Imports Triton, `math` and `model.config` only (no torch), so that the kernel report
(`atom_train.kernel_report`) can compile them for a GPU on a machine with neither a GPU nor
torch, e.g. in a small side environment that holds only the oldest Triton the project
supports. `atom_train.model.field_triton` launches them; its module docstring has the design.

The structure the compiler sees, in one paragraph (the why is in field_triton): the state of
a program's BLOCK streams lives in [BLOCK, NP] register tiles for the whole window; every
product with C is a loop over KC-wide chunks of the contraction, whose operands are read back
from memory (the stage's phi, or the stage's gradient, written once per stage to a slice of
an output tensor that is overwritten later, and C itself, which stays in L1/L2), so no
thread ever holds a whole row or column of C; and the backward's dL/dC partial sums are
read, updated and written back chunk by chunk in the program's own row of the partials
buffer instead of living in registers.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from atom_train.model.config import FieldConsts

# The contraction chunk of every dot: the smallest K that Triton 3.6 accepts for fp32 and
# fp64 dots (M and N may be smaller; the backward's dL/dC dot contracts over 2 * BLOCK rows,
# which is why BLOCK >= 8).
KC = tl.constexpr(16)
MIN_BLOCK = KC.value // 2


def padded_modes(n: int) -> int:
    """NP: the tiles' mode width, the next power of two >= max(n, 16)."""
    return max(KC.value, triton.next_power_of_2(n))


# ---- the launch: streams per program and warps ------------------------------------------

# Streams per program the launcher chooses from (a power of two, >= MIN_BLOCK); 16 only while
# the tiles are small enough for 8 warps to hold them (NP <= 32; above, 8 streams a program
# already fill 8 warps).
BLOCKS = (16, 8)
DEFAULT_SM_COUNT = 132  # an H100 / H200 (SXM): what the report assumes without a device


def blocks_for(n: int) -> tuple[int, ...]:
    """The streams per program that the launcher may choose at n modes."""
    return BLOCKS if padded_modes(n) <= 32 else (MIN_BLOCK,)


def warps_for(block: int, n: int) -> int:
    """Warps per program: 4 for 8 streams at NP <= 32, else 8. Measured with the kernel
    report: at 4 warps the 8-stream programs fit without spilling; the 16-stream backward
    spills there (12-56 bytes a thread at n = 16) and fits in 8; NP >= 64 needs 8 (16 warps
    cap a thread at 128 registers, and the backward spills)."""
    return 4 if block == MIN_BLOCK and padded_modes(n) <= 32 else 8


def launch_options(kernel: str, block: int, n: int) -> dict:
    """The launch options besides the grid: warps, and ptxas's register cap (maxnreg). The
    forward at 4 warps is capped at 168 registers a thread, three programs an SM (65536 /
    (168 * 128)), which it fits without spilling; left alone, Triton 3.6's ptxas picks 128
    for it and spills. Everything else may take all 255 (the backward needs about 250)."""
    warps = warps_for(block, n)
    return {"num_warps": warps, "maxnreg": 168 if kernel == "fwd" and warps == 4 else 255}


def launch_plan(B: int, n: int, sm_count: int) -> tuple[int, int]:
    """(streams per program, warps) for B streams of n modes on a GPU with sm_count SMs.

    An SM runs the programs it is given one after another or side by side, and either way
    its time is about the number of streams it must step: ceil(programs / SMs) * block
    (the dots run on the FMA units, which the resident programs share). The block that
    minimises it wins; on a tie the larger block (fewer programs, less per-tick overhead per
    stream). So B = 1024 on 132 SMs runs as 128 programs of 8 (one each on 128 SMs, where 64
    programs of 16 would leave half the GPU idle) and B = 4096 as 256 programs of 16."""
    if B < 1 or sm_count < 1:
        raise ValueError(f"launch_plan needs B >= 1 and sm_count >= 1, got {B}, {sm_count}")

    def makespan(block: int) -> int:
        programs = -(-B // block)
        return -(-programs // sm_count) * block

    block = min(blocks_for(n), key=lambda b: (makespan(b), -b))
    return block, warps_for(block, n)


def compile_constants(
    kernel: str,
    c: FieldConsts,
    *,
    block: int,
    keep_scalar: bool,
    reset_table: bool,
    f64: bool,
    need_keep: bool = False,
) -> dict:
    """The constexpr arguments of `kernel` ("fwd" or "bwd") from the model's `FieldConsts`
    (its limits too): every one of them selects a compiled binary (the launcher's and the
    kernel report's, from this one function)."""
    n = c.n
    shared = {
        "N": n,
        "NP": padded_modes(n),
        "BLOCK": block,
        "KEEP_SCALAR": keep_scalar,
        "RESET_TABLE": reset_table,
        "F64": f64,
        "PSM": c.phase_sync_min,
        "H": c.dt,
        "CAP": c.max_rms * math.sqrt(n),
    }
    if kernel == "bwd":
        return {**shared, "NEED_KEEP": need_keep}
    if kernel != "fwd":
        raise ValueError(f"kernel must be 'fwd' or 'bwd', got {kernel!r}")
    return {
        **shared,
        "SQRT_N": math.sqrt(n),
        "MAX_RMS": c.max_rms,
        "RATE": c.amp_rate,
        "LOG2_T": c.log_target / math.log(2),
        "FLOOR": c.amp_log_floor,
        "DECAY": c.energy_decay,
        "GMIN": c.gain_min,
        "GMAX": c.gain_max,
    }


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
def _store_c(srow, xr, xi, m2, N: tl.constexpr, cols):
    """A complex [BLOCK, NP] tile into the scratch rows srow (real parts at [0, N),
    imaginary at [N, 2N)), for the chunked products to read back."""
    p = srow[:, None] + cols[None, :]
    tl.store(p, xr, mask=m2)
    tl.store(p + N, xi, mask=m2)


@triton.jit
def _cmatmul(
    srow,
    rm,
    WR,
    WI,
    s_wk,
    s_wj,
    cols,
    cm,
    acc_r,
    acc_i,
    CONJ: tl.constexpr,
    N: tl.constexpr,
    NP: tl.constexpr,
):
    """acc + x W for the complex rows x stored at srow (see _store_c) and the complex n x n
    matrix W = WR + i WI (conj(W) if CONJ), W[k, j] at k s_wk + j s_wj: KC modes of the
    contraction at a time, operands loaded from memory, so only one chunk is in registers."""
    kc = tl.arange(0, KC)
    for k0 in range(0, NP, KC):
        kk = k0 + kc
        km = kk < N
        xm = rm[:, None] & km[None, :]
        xp = srow[:, None] + kk[None, :]
        xr = tl.load(xp, mask=xm, other=0.0)
        xi = tl.load(xp + N, mask=xm, other=0.0)
        wm = km[:, None] & cm[None, :]
        woff = kk[:, None] * s_wk + cols[None, :] * s_wj
        wr = tl.load(WR + woff, mask=wm, other=0.0)
        wi = tl.load(WI + woff, mask=wm, other=0.0)
        if CONJ:
            wi = -wi
        dt = acc_r.dtype
        acc_r = tl.dot(xr, wr, acc_r, input_precision="ieee", out_dtype=dt)
        acc_r = tl.dot(-xi, wi, acc_r, input_precision="ieee", out_dtype=dt)
        acc_i = tl.dot(xr, wi, acc_i, input_precision="ieee", out_dtype=dt)
        acc_i = tl.dot(xi, wr, acc_i, input_precision="ieee", out_dtype=dt)
    return acc_r, acc_i


@triton.jit
def _slope(
    yr,
    yi,
    ur,
    ui,
    ar,
    ai,
    srow,
    rm,
    cols,
    cm,
    m2,
    CRT,
    CIT,
    s_w0,
    s_w1,
    N: tl.constexpr,
    NP: tl.constexpr,
    F64: tl.constexpr,
):
    """k = u + a y + C phi(y) for one RK4 stage input y (as rows: phi C^T)."""
    pr, pi, _m = _phi(yr, yi, F64)
    _store_c(srow, pr, pi, m2, N, cols)
    tl.debug_barrier()  # every thread's phi is in memory before any chunk is read
    kr = ur + (ar * yr - ai * yi)
    ki = ui + (ai * yr + ar * yi)
    kr, ki = _cmatmul(srow, rm, CRT, CIT, s_w0, s_w1, cols, cm, kr, ki, False, N, NP)
    tl.debug_barrier()  # every chunk is read before the next stage overwrites them
    return kr, ki


@triton.jit
def _rk4(
    z0r,
    z0i,
    ur,
    ui,
    ar,
    ai,
    srow,
    rm,
    cols,
    cm,
    m2,
    CRT,
    CIT,
    s_w0,
    s_w1,
    N: tl.constexpr,
    NP: tl.constexpr,
    H: tl.constexpr,
    F64: tl.constexpr,
):
    """One RK4 step from z0: z1 and the stage inputs y1, y2, y3 (the backward's)."""
    k0r, k0i = _slope(
        z0r, z0i, ur, ui, ar, ai, srow, rm, cols, cm, m2, CRT, CIT, s_w0, s_w1, N, NP, F64
    )
    y1r = z0r + (H * 0.5) * k0r
    y1i = z0i + (H * 0.5) * k0i
    k1r, k1i = _slope(
        y1r, y1i, ur, ui, ar, ai, srow, rm, cols, cm, m2, CRT, CIT, s_w0, s_w1, N, NP, F64
    )
    accr = k0r + 2.0 * k1r
    acci = k0i + 2.0 * k1i
    y2r = z0r + (H * 0.5) * k1r
    y2i = z0i + (H * 0.5) * k1i
    k2r, k2i = _slope(
        y2r, y2i, ur, ui, ar, ai, srow, rm, cols, cm, m2, CRT, CIT, s_w0, s_w1, N, NP, F64
    )
    accr = accr + 2.0 * k2r
    acci = acci + 2.0 * k2i
    y3r = z0r + H * k2r
    y3i = z0i + H * k2i
    k3r, k3i = _slope(
        y3r, y3i, ur, ui, ar, ai, srow, rm, cols, cm, m2, CRT, CIT, s_w0, s_w1, N, NP, F64
    )
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


# The controller's step near 1 as 1 + expm1(y), y = ln 2 x: where |y| < _EXPM1_RANGE, a
# degree-7 Taylor polynomial (truncation below 6e-9 relative there: 0.05 of a float32 ulp).
_EXPM1_RANGE = tl.constexpr(0.35)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _gain_step(rc, RATE: tl.constexpr, LOG2_T: tl.constexpr, FLOOR: tl.constexpr):
    """The controller's step target^rate r'^-rate = 2^x, x = rate (log2 target - log2 r'),
    r' floored at FLOOR. Triton's exp2 of a float32 is the GPU's approximate ex2.approx (up to
    2 ulp, the same sign from tick to tick where x barely changes), and the gain compounds one
    step a tick. So where the step is near 1 (|ln 2 x| < 0.35: r' within a factor 2^35 of the
    target at rate 0.01, every step of the default model) it is 1 + expm1(ln 2 x), the
    polynomial's error relative to expm1 (a few float32 roundings of a number below 0.42)
    vanishing with x: the one rounding of 1 + expm1 is the step's error, as in the fused loop's
    float32 pow (docs/gpu_box.md has the error model). log2's approximation (lg2.approx,
    2^-22 relative) reaches x times the rate (0.01). A handful of FMAs a stream and tick
    (docs/performance.md: the forward's instruction count)."""
    x = RATE * (LOG2_T - tl.log2(tl.maximum(rc, FLOOR)))
    y = x * _LN2
    p = 1.0 / 720.0 + y * (1.0 / 5040.0)  # expm1(y) / y, by Horner
    p = 1.0 / 120.0 + y * p
    p = 1.0 / 24.0 + y * p
    p = 1.0 / 6.0 + y * p
    p = 0.5 + y * p
    p = 1.0 + y * p
    em1 = y * p
    return tl.where(tl.abs(y) < _EXPM1_RANGE, 1.0 + em1, tl.exp2(x))


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
    KEEP,
    B,
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    KEEP_SCALAR: tl.constexpr,
):
    """Both kernels' start: this program's streams and modes, their masks, a and keep,
    loaded once (padded entries 0, so the padded modes stay exactly 0)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, NP)
    rm = rows < B
    cm = cols < N
    m2 = rm[:, None] & cm[None, :]
    ar = tl.load(AR + cols, mask=cm, other=0.0)[None, :]
    ai = tl.load(AI + cols, mask=cm, other=0.0)[None, :]
    kr, ki = _load_keep(KEEP, cols, cm, N, KEEP_SCALAR)
    return rows, cols, rm, cm, m2, ar, ai, kr, ki


# The window's reset pattern and length change from window to window: not specialized
# on (Triton would otherwise compile a variant for values equal to 1 or divisible by 16).
_VARYING = ["K", "r0", "period"]


@triton.jit(do_not_specialize=_VARYING)
def field_fwd_kernel(
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
    rows, cols, rm, cm, m2, ar, ai, kr, ki = _prologue(AR, AI, KEEP, B, N, NP, BLOCK, KEEP_SCALAR)
    # The state.
    zp = Z + rows[:, None] * s_zb + cols[None, :]
    zr = tl.load(zp, mask=m2, other=0.0)
    zi = tl.load(zp + N, mask=m2, other=0.0)
    g = tl.load(G_IN + rows, mask=rm, other=1.0)
    E = tl.load(E_IN + rows, mask=rm, other=0.0)
    up = U + rows[:, None] * s_ub + cols[None, :]
    ur_raw = tl.load(up, mask=m2, other=0.0)
    ui_raw = tl.load(up + N, mask=m2, other=0.0)
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
        # Zs[t]'s rows are the stages' scratch until this tick's field overwrites them.
        srow = ZS + (tb + rows) * (2 * N)
        z0r = zr * kr  # 2. leak
        z0i = zi * ki
        z1r, z1i, _, _, _, _, _, _ = _rk4(  # 3.
            z0r, z0i, ur, ui, ar, ai, srow, rm, cols, cm, m2, CRT, CIT, s_w0, s_w1, N, NP, H, F64
        )
        z2r, z2i, norm, _, _, _, _ = _sync(z1r, z1i, PSM, F64)  # 4. phase sync
        sig = _div(CAP, tl.maximum(norm, CAP), F64)[:, None]  # 5. RMS cap
        zr = z2r * sig
        zi = z2i * sig
        _store_c(srow, zr, zi, m2, N, cols)
        # 6. amplitude controller (no gradient): r' = min(RMS before the cap, max).
        rc = tl.minimum(_div(norm, SQRT_N, F64), MAX_RMS)
        step = _gain_step(rc, RATE, LOG2_T, FLOOR)
        g = tl.minimum(tl.maximum(step * g, GMIN), GMAX)
        E = E * DECAY + (1.0 - DECAY) * rc * rc
        tl.store(ES + tb + rows, E, mask=rm)
        ur_raw = ur_next
        ui_raw = ui_next
    tl.store(G_OUT + rows, g, mask=rm)
    tl.store(E_OUT + rows, E, mask=rm)


@triton.jit
def _stacked_rows(SCR, pid, B, N: tl.constexpr, BLOCK: tl.constexpr):
    """The 2 BLOCK stacked rows [real parts; imaginary parts] of a program's scratch: their
    row pointers (SCR + stream row + N for the imaginary half), the swapped half's, and
    which rows are real streams."""
    r2 = tl.arange(0, 2 * BLOCK)
    stream = pid * BLOCK + (r2 % BLOCK)
    imag = r2 >= BLOCK
    base = SCR + tl.cast(stream, tl.int64) * (2 * N)
    own = base + tl.where(imag, N, 0)
    swapped = base + tl.where(imag, 0, N)
    return own, swapped, imag, stream < B


@triton.jit
def _grad_c(PH, GK, PROW, pid, B, cols, cm, N: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr):
    """dL/dCr^T += pr^T gkr + pi^T gki and dL/dCi^T += pr^T gki - pi^T gkr, for the phi and
    gk of one stage stored in the scratch rows PH and GK: as two dots over the 2 BLOCK stacked
    rows ([pr; pi]^T [gkr; gki] and [pr; pi]^T [gki; -gkr]), added KC rows of the sums at a
    time to the program's partials row PROW (read, add, write back: the sums never sit in
    registers)."""
    own_p, _, _, ok = _stacked_rows(PH, pid, B, N, BLOCK)
    own_g, swap_g, imag, _ = _stacked_rows(GK, pid, B, N, BLOCK)
    gm = ok[:, None] & cm[None, :]
    g1 = tl.load(own_g[:, None] + cols[None, :], mask=gm, other=0.0)
    g2 = tl.load(swap_g[:, None] + cols[None, :], mask=gm, other=0.0)
    g2 = tl.where(imag[:, None], -g2, g2)
    kc = tl.arange(0, KC)
    for i0 in range(0, NP, KC):
        ii = i0 + kc
        im = ii < N
        pt = tl.load(own_p[None, :] + ii[:, None], mask=im[:, None] & ok[None, :], other=0.0)
        pw = PROW + ii[:, None] * N + cols[None, :]
        wm = im[:, None] & cm[None, :]
        dt = g1.dtype
        gcr = tl.load(pw, mask=wm, other=0.0)
        gcr = tl.dot(pt, g1, gcr, input_precision="ieee", out_dtype=dt)
        tl.store(pw, gcr, mask=wm)
        gci = tl.load(pw + N * N, mask=wm, other=0.0)
        gci = tl.dot(pt, g2, gci, input_precision="ieee", out_dtype=dt)
        tl.store(pw + N * N, gci, mask=wm)


@triton.jit
def _stage_bwd(
    gkr,
    gki,
    yr,
    yi,
    ar,
    ai,
    acc_ar,
    acc_ai,
    PH,
    GK,
    PROW,
    pid,
    B,
    rows,
    rm,
    cols,
    cm,
    m2,
    CRT,
    CIT,
    s_w0,
    s_w1,
    N: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    F64: tl.constexpr,
):
    """One RK4 stage k = u + a y + C phi(y), backwards, given dL/dk: dL/dy, and this
    stage's terms added to the sums for Cr^T, Ci^T (phi^T gk, in PROW) and a (conj(y) gk)."""
    pr, pi, m = _phi(yr, yi, F64)
    prow_ph = PH + rows * (2 * N)
    prow_gk = GK + rows * (2 * N)
    _store_c(prow_ph, pr, pi, m2, N, cols)
    _store_c(prow_gk, gkr, gki, m2, N, cols)
    tl.debug_barrier()
    # w = dL/dphi = gk conj(C) as rows: wr = gkr Cr + gki Ci, wi = gki Cr - gkr Ci (C[k, j]
    # is C^T's (j, k): the transposed strides).
    zero = tl.zeros_like(gkr)
    wr, wi = _cmatmul(prow_gk, rm, CRT, CIT, s_w1, s_w0, cols, cm, zero, zero, True, N, NP)
    _grad_c(PH, GK, PROW, pid, B, cols, cm, N, NP, BLOCK)
    tl.debug_barrier()  # scratch and partials settled before the next stage
    acc_ar += yr * gkr + yi * gki
    acc_ai += yr * gki - yi * gkr
    # phi's Jacobian: dphi^T w = w/(1+|y|) - y (y.w)/(|y| (1+|y|)^2), 0 at y = 0.
    invd = _div(1.0, m + 1.0, F64)
    fac = _div(invd * invd, tl.maximum(m, 1e-30), F64)  # field_loops._TINY
    coef = (wr * yr + wi * yi) * fac
    gyr = (ar * gkr + ai * gki) + wr * invd - yr * coef
    gyi = (ar * gki - ai * gkr) + wi * invd - yi * coef
    return gyr, gyi, acc_ar, acc_ai


@triton.jit(do_not_specialize=_VARYING)
def field_bwd_kernel(
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
    rows, cols, rm, cm, m2, ar, ai, kr, ki = _prologue(AR, AI, KEEP, B, N, NP, BLOCK, KEEP_SCALAR)
    pid = tl.program_id(0)
    dt = ar.dtype
    # The partials row: [Cr^T (n x n, row-major) | Ci^T (n x n) | ar (n) | ai (n) | keep].
    # Its C part is a running sum, updated in place each stage: zeroed first.
    prow = PART + tl.cast(pid, tl.int64) * F
    kc = tl.arange(0, KC)
    for i0 in range(0, NP, KC):
        ii = i0 + kc
        wm = (ii < N)[:, None] & cm[None, :]
        pw = prow + ii[:, None] * N + cols[None, :]
        tl.store(pw, tl.zeros([KC, NP], dtype=dt), mask=wm)
        tl.store(pw + N * N, tl.zeros([KC, NP], dtype=dt), mask=wm)
    tl.debug_barrier()
    # Per-program partial sums over this block's streams and all ticks.
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
        # Scratch rows until they are written for real: gz's (at the end of the kernel)
        # for phi, and gU[t]'s (at the end of this tick) for the stage gradients.
        PH = GZ
        GK = GU + tb * (2 * N)
        # Recompute tick t's forward.
        z0r = zpr * kr
        z0i = zpi * ki
        z1r, z1i, y1r, y1i, y2r, y2i, y3r, y3i = _rk4(
            z0r,
            z0i,
            ur,
            ui,
            ar,
            ai,
            PH + rows * (2 * N),
            rm,
            cols,
            cm,
            m2,
            CRT,
            CIT,
            s_w0,
            s_w1,
            N,
            NP,
            H,
            F64,
        )
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
        # 3. RK4, last stage first; each stage's terms of dL/dC, dL/da go straight into
        # the sums, so only the stage inputs y stay live through the walk.
        gk3r = gz1r * (H / 6.0)
        gk3i = gz1i * (H / 6.0)
        a3r = gz1r * (H / 3.0)
        a3i = gz1i * (H / 3.0)
        gyr, gyi, acc_ar, acc_ai = _stage_bwd(
            gk3r,
            gk3i,
            y3r,
            y3i,
            ar,
            ai,
            acc_ar,
            acc_ai,
            PH,
            GK,
            prow,
            pid,
            B,
            rows,
            rm,
            cols,
            cm,
            m2,
            CRT,
            CIT,
            s_w0,
            s_w1,
            N,
            NP,
            BLOCK,
            F64,
        )
        gz0r = gz1r + gyr
        gz0i = gz1i + gyi
        gkr = a3r + gyr * H
        gki = a3i + gyi * H
        gur = gk3r + gkr
        gui = gk3i + gki
        gyr, gyi, acc_ar, acc_ai = _stage_bwd(
            gkr,
            gki,
            y2r,
            y2i,
            ar,
            ai,
            acc_ar,
            acc_ai,
            PH,
            GK,
            prow,
            pid,
            B,
            rows,
            rm,
            cols,
            cm,
            m2,
            CRT,
            CIT,
            s_w0,
            s_w1,
            N,
            NP,
            BLOCK,
            F64,
        )
        gz0r += gyr
        gz0i += gyi
        gkr = a3r + gyr * (H * 0.5)
        gki = a3i + gyi * (H * 0.5)
        gur += gkr
        gui += gki
        gyr, gyi, acc_ar, acc_ai = _stage_bwd(
            gkr,
            gki,
            y1r,
            y1i,
            ar,
            ai,
            acc_ar,
            acc_ai,
            PH,
            GK,
            prow,
            pid,
            B,
            rows,
            rm,
            cols,
            cm,
            m2,
            CRT,
            CIT,
            s_w0,
            s_w1,
            N,
            NP,
            BLOCK,
            F64,
        )
        gz0r += gyr
        gz0i += gyi
        gkr = gk3r + gyr * (H * 0.5)
        gki = gk3i + gyi * (H * 0.5)
        gur += gkr
        gui += gki
        gyr, gyi, acc_ar, acc_ai = _stage_bwd(
            gkr,
            gki,
            z0r,
            z0i,
            ar,
            ai,
            acc_ar,
            acc_ai,
            PH,
            GK,
            prow,
            pid,
            B,
            rows,
            rm,
            cols,
            cm,
            m2,
            CRT,
            CIT,
            s_w0,
            s_w1,
            N,
            NP,
            BLOCK,
            F64,
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
    gzp = GZ + out
    tl.store(gzp, gzr, mask=m2)
    tl.store(gzp + N, gzi, mask=m2)
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
