//! The public entry points: [`forward`] and [`backward`] over a window, their checks, and
//! the blocks of streams they run (in parallel on the caller's pool, reduced in order).

use std::fmt;

use rayon::prelude::*;

use crate::block::{self, BwdIn, BwdOut, FwdOut, Partial, SharedMut};
use crate::real::Real;
use crate::simd::{Job, Kernel, Lanes};

/// Streams per block: the unit of parallel work and of the parameters' partial sums. Fixed
/// (not derived from the thread count), so a result does not depend on how many threads
/// ran it.
pub const BLOCK: usize = 16;

/// Sizes of a window: `k` ticks, `b` streams, `n` complex modes (a field row is 2n reals,
/// [Re | Im]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub k: usize,
    pub b: usize,
    pub n: usize,
}

/// The loop's constants, field for field those of the model's one
/// `atom_train.model.config.FieldConsts` (the binding reads them by name): the model's (RK4
/// step, RMS cap, log of the amplitude target, controller rate) and the fixed limits
/// (phase-sync threshold, the controller's log floor, energy decay, gain bounds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Consts {
    pub dt: f64,
    pub max_rms: f64,
    pub log_target: f64,
    pub amp_rate: f64,
    pub phase_sync_min: f64,
    pub amp_log_floor: f64,
    pub energy_decay: f64,
    pub gain_min: f64,
    pub gain_max: f64,
}

/// What both passes read. Arrays are row-major and contiguous.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a, T> {
    pub shape: Shape,
    pub consts: Consts,
    /// [K, B, 2n] the drives before the gain.
    pub u: &'a [T],
    /// [B, 2n] the field entering the window.
    pub z: &'a [T],
    /// keep = 1 - leak: [1] (one for all modes) or [2n] (per mode of [Re | Im]).
    pub keep: &'a [T],
    /// a = ar + i ai, [n] each.
    pub ar: &'a [T],
    pub ai: &'a [T],
    /// C = Cr + i Ci, [n, n] each.
    pub cr: &'a [T],
    pub ci: &'a [T],
    /// [K]: an episode reset (z = 0, g = 1, E = 0) before tick t.
    pub resets: &'a [bool],
}

/// The forward's outputs.
#[derive(Debug)]
pub struct ForwardOut<'a, T> {
    /// [K, B, 2n] the field after each tick.
    pub zs: &'a mut [T],
    /// [K, B] the energy EMA after each tick.
    pub es: &'a mut [T],
    /// [K, B] the gain each tick's drive used (the backward's).
    pub gs: &'a mut [T],
    /// [B] the final gain and energy.
    pub g: &'a mut [T],
    pub e: &'a mut [T],
}

/// The backward's outputs: the gradients of the window's inputs.
#[derive(Debug)]
pub struct Grads<'a, T> {
    /// [K, B, 2n]
    pub u: &'a mut [T],
    /// [B, 2n]
    pub z: &'a mut [T],
    /// [n, n] each
    pub cr: &'a mut [T],
    pub ci: &'a mut [T],
    /// [n] each
    pub ar: &'a mut [T],
    pub ai: &'a mut [T],
    /// keep's gradient (its shape), or None when it is not needed.
    pub keep: Option<&'a mut [T]>,
}

/// How to run: on which pool (None: in the calling thread), with which instruction set, in
/// blocks of how many streams. The result depends on `block` (the sums' grouping), not on
/// the pool or the instruction set.
#[derive(Clone, Copy, Debug)]
pub struct Exec<'p> {
    pub pool: Option<&'p rayon::ThreadPool>,
    pub kernel: Kernel,
    pub block: usize,
}

impl Default for Exec<'_> {
    fn default() -> Self {
        Exec {
            pool: None,
            kernel: Kernel::Auto,
            block: BLOCK,
        }
    }
}

/// A call that cannot run: the message names the argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An array of the wrong length, or inconsistent sizes.
    Shape(String),
    /// The kernel asked for is not available on this CPU.
    Kernel(Kernel),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape(msg) => write!(f, "field loop: {msg}"),
            Error::Kernel(k) => write!(
                f,
                "field loop: this CPU cannot run the {} kernel (available: {})",
                k.name(),
                Kernel::available()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn check_len(what: &str, len: usize, want: usize, shape: &str) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::Shape(format!(
            "{what} has {len} elements, expected {want} ({shape})"
        )))
    }
}

impl<T> Window<'_, T> {
    fn check(&self) -> Result<()> {
        let Shape { k, b, n } = self.shape;
        if n == 0 {
            return Err(Error::Shape("n must be at least 1".into()));
        }
        let d = 2 * n;
        check_len("u", self.u.len(), k * b * d, "[K, B, 2n]")?;
        check_len("z", self.z.len(), b * d, "[B, 2n]")?;
        if self.keep.len() != 1 && self.keep.len() != d {
            return Err(Error::Shape(format!(
                "keep has {} elements, expected 1 or 2n = {d}",
                self.keep.len()
            )));
        }
        check_len("ar", self.ar.len(), n, "[n]")?;
        check_len("ai", self.ai.len(), n, "[n]")?;
        check_len("cr", self.cr.len(), n * n, "[n, n]")?;
        check_len("ci", self.ci.len(), n * n, "[n, n]")?;
        check_len("resets", self.resets.len(), k, "[K]")
    }
}

/// Everything a block reads, shared by all blocks: the window, the constants in `T`, and the
/// real form of C (and its transpose) with rows padded to the product tile.
pub(crate) struct Ctx<'a, T> {
    pub k: usize,
    pub b: usize,
    pub n: usize,
    pub d: usize,
    /// Row stride of the block's matrices: d padded to the product tile.
    pub ld: usize,
    pub u: &'a [T],
    pub z: &'a [T],
    pub ar: &'a [T],
    pub ai: &'a [T],
    pub resets: &'a [bool],
    pub keep_scalar: Option<T>,
    pub keep: &'a [T],
    /// Wc [d, ld]: phi Wc = C phi on rows [Re | Im]; wct = Wc^T [d, ld].
    pub wc: Vec<T>,
    pub wct: Vec<T>,
    /// h * (0, 1/2, 1/2, 1): the previous slope's weight in each stage's input.
    pub stage_in: [T; 4],
    pub stage_w: [T; 4],
    pub h6: T,
    pub h3: T,
    pub cap: T,
    pub cap2: T,
    pub sqrt_n: T,
    pub max_rms: T,
    pub neg_rate: T,
    pub step_const: T,
    pub psm: T,
    pub psm2: T,
    pub floor: T,
    pub decay: T,
    pub one_minus_decay: T,
    pub gmin: T,
    pub gmax: T,
    pub tiny: T,
}

/// Squared magnitudes are clamped to this before a division (`field_loops._TINY`).
const TINY: f64 = 1e-30;

impl<'a, T: Real> Ctx<'a, T> {
    fn new(w: &Window<'a, T>, kernel: Kernel) -> Self {
        let Shape { k, b, n } = w.shape;
        let d = 2 * n;
        let tile = T::tile_cols(kernel);
        let ld = d.div_ceil(tile) * tile;
        // Wc = [[Cr^T, Ci^T], [-Ci^T, Cr^T]] (`field_loops.real_form`), rows padded to ld.
        let mut wc = vec![T::ZERO; d * ld];
        let mut wct = vec![T::ZERO; d * ld];
        for p in 0..n {
            for j in 0..n {
                let (cr, ci) = (w.cr[j * n + p], w.ci[j * n + p]); // C[j, p]
                wc[p * ld + j] = cr;
                wc[p * ld + n + j] = ci;
                wc[(n + p) * ld + j] = -ci;
                wc[(n + p) * ld + n + j] = cr;
            }
        }
        for p in 0..d {
            for j in 0..d {
                wct[j * ld + p] = wc[p * ld + j];
            }
        }
        let c = w.consts;
        let f = T::from_f64;
        let cap = c.max_rms * (n as f64).sqrt();
        Ctx {
            k,
            b,
            n,
            d,
            ld,
            u: w.u,
            z: w.z,
            ar: w.ar,
            ai: w.ai,
            resets: w.resets,
            keep_scalar: (w.keep.len() == 1).then(|| w.keep[0]),
            keep: w.keep,
            wc,
            wct,
            stage_in: block::STAGE_IN.map(|x| f(c.dt * x)),
            stage_w: block::STAGE_W.map(f),
            h6: f(c.dt / 6.0),
            h3: f(c.dt / 3.0),
            cap: f(cap),
            cap2: f(cap * cap),
            sqrt_n: f((n as f64).sqrt()),
            max_rms: f(c.max_rms),
            neg_rate: f(-c.amp_rate),
            step_const: f((c.amp_rate * c.log_target).exp()),
            psm: f(c.phase_sync_min),
            psm2: f(c.phase_sync_min * c.phase_sync_min),
            floor: f(c.amp_log_floor),
            decay: f(c.energy_decay),
            one_minus_decay: f(1.0 - c.energy_decay),
            gmin: f(c.gain_min),
            gmax: f(c.gain_max),
            tiny: f(TINY),
        }
    }

    /// The blocks: (first stream, streams), in order.
    fn blocks(&self, block: usize) -> Vec<(usize, usize)> {
        (0..self.b)
            .step_by(block)
            .map(|r0| (r0, block.min(self.b - r0)))
            .collect()
    }
}

fn resolve(exec: &Exec) -> Result<Kernel> {
    if exec.block == 0 {
        return Err(Error::Shape("block must be at least 1 stream".into()));
    }
    exec.kernel.resolve().ok_or(Error::Kernel(exec.kernel))
}

/// `f` over the blocks, in parallel on the pool if there is one with more than one
/// thread; the results in block order.
fn each_block<R: Send>(
    pool: Option<&rayon::ThreadPool>,
    blocks: &[(usize, usize)],
    f: impl Fn(usize, usize) -> R + Sync,
) -> Vec<R> {
    match pool {
        Some(p) if p.current_num_threads() > 1 && blocks.len() > 1 => {
            p.install(|| blocks.par_iter().map(|&(r0, rows)| f(r0, rows)).collect())
        }
        _ => blocks.iter().map(|&(r0, rows)| f(r0, rows)).collect(),
    }
}

struct FwdJob<'a, 'c, T> {
    ctx: &'a Ctx<'c, T>,
    g: &'a [T],
    e: &'a [T],
    out: &'a FwdOut<T>,
    r0: usize,
    rows: usize,
}

impl<T: Real> Job<T> for FwdJob<'_, '_, T> {
    type Out = ();
    #[inline(always)]
    fn run<S: Lanes<T>>(self) {
        // SAFETY: `Simd::run` calls this inside S's instruction-set entry, and the blocks
        // partition the streams.
        unsafe { block::forward::<T, S>(self.ctx, self.g, self.e, self.out, self.r0, self.rows) }
    }
}

struct BwdJob<'a, 'c, T> {
    ctx: &'a Ctx<'c, T>,
    inp: &'a BwdIn<'a, T>,
    out: &'a BwdOut<T>,
    r0: usize,
    rows: usize,
}

impl<T: Real> Job<T> for BwdJob<'_, '_, T> {
    type Out = Partial<T>;
    #[inline(always)]
    fn run<S: Lanes<T>>(self) -> Partial<T> {
        // SAFETY: as FwdJob's.
        unsafe { block::backward::<T, S>(self.ctx, self.inp, self.out, self.r0, self.rows) }
    }
}

/// The forward over the window: steps 2-6 of the tick (leak, RK4 with the drive scaled by
/// the gain, phase sync, RMS cap, amplitude controller) for K ticks, from the field `z` and
/// the gain and energy `g`, `e` [B] entering the window.
pub fn forward<T: Real>(
    w: &Window<'_, T>,
    g: &[T],
    e: &[T],
    out: ForwardOut<'_, T>,
    exec: &Exec,
) -> Result<()> {
    w.check()?;
    let Shape { k, b, n } = w.shape;
    check_len("g", g.len(), b, "[B]")?;
    check_len("e", e.len(), b, "[B]")?;
    check_len("zs", out.zs.len(), k * b * 2 * n, "[K, B, 2n]")?;
    check_len("es", out.es.len(), k * b, "[K, B]")?;
    check_len("gs", out.gs.len(), k * b, "[K, B]")?;
    check_len("g out", out.g.len(), b, "[B]")?;
    check_len("e out", out.e.len(), b, "[B]")?;
    let kernel = resolve(exec)?;
    let ctx = Ctx::new(w, kernel);
    let shared = FwdOut {
        zs: SharedMut::new(out.zs),
        es: SharedMut::new(out.es),
        gs: SharedMut::new(out.gs),
        g: SharedMut::new(out.g),
        e: SharedMut::new(out.e),
    };
    each_block(exec.pool, &ctx.blocks(exec.block), |r0, rows| {
        let job = FwdJob {
            ctx: &ctx,
            g,
            e,
            out: &shared,
            r0,
            rows,
        };
        T::run(kernel, job)
    });
    Ok(())
}

/// The backward over the window, from the forward's `zs` and `gs` and the gradient of the
/// loss with respect to `zs` (`gzs`, [K, B, 2n]); recomputes each tick from the stored field.
/// The gain and energy carry no gradient.
pub fn backward<T: Real>(
    w: &Window<'_, T>,
    zs: &[T],
    gs: &[T],
    gzs: &[T],
    grads: Grads<'_, T>,
    exec: &Exec,
) -> Result<()> {
    w.check()?;
    let Shape { k, b, n } = w.shape;
    let d = 2 * n;
    check_len("zs", zs.len(), k * b * d, "[K, B, 2n]")?;
    check_len("gs", gs.len(), k * b, "[K, B]")?;
    check_len("gzs", gzs.len(), k * b * d, "[K, B, 2n]")?;
    check_len("grad u", grads.u.len(), k * b * d, "[K, B, 2n]")?;
    check_len("grad z", grads.z.len(), b * d, "[B, 2n]")?;
    check_len("grad cr", grads.cr.len(), n * n, "[n, n]")?;
    check_len("grad ci", grads.ci.len(), n * n, "[n, n]")?;
    check_len("grad ar", grads.ar.len(), n, "[n]")?;
    check_len("grad ai", grads.ai.len(), n, "[n]")?;
    if let Some(gk) = &grads.keep {
        check_len("grad keep", gk.len(), w.keep.len(), "keep's")?;
    }
    let kernel = resolve(exec)?;
    let ctx = Ctx::new(w, kernel);
    let inp = BwdIn {
        zs,
        gs,
        gzs,
        need_keep: grads.keep.is_some(),
    };
    let shared = BwdOut {
        gu: SharedMut::new(grads.u),
        gz: SharedMut::new(grads.z),
    };
    let parts = each_block(exec.pool, &ctx.blocks(exec.block), |r0, rows| {
        let job = BwdJob {
            ctx: &ctx,
            inp: &inp,
            out: &shared,
            r0,
            rows,
        };
        T::run(kernel, job)
    });
    // The blocks' partial sums, added in block order.
    let mut parts = parts.into_iter();
    let Some(mut total) = parts.next() else {
        // No streams: every parameter gradient is 0.
        for x in [grads.cr, grads.ci, grads.ar, grads.ai] {
            x.fill(T::ZERO);
        }
        if let Some(gk) = grads.keep {
            gk.fill(T::ZERO);
        }
        return Ok(());
    };
    for p in parts {
        add(&mut total.gwc, &p.gwc);
        add(&mut total.a_re, &p.a_re);
        add(&mut total.a_im, &p.a_im);
        add(&mut total.keep, &p.keep);
    }
    let ld = ctx.ld;
    let g = &total.gwc;
    for j in 0..n {
        for q in 0..n {
            // dL/dCr = (g11 + g22)^T, dL/dCi = (g12 - g21)^T (`field_loops._complex_grads`).
            grads.cr[j * n + q] = g[q * ld + j] + g[(n + q) * ld + n + j];
            grads.ci[j * n + q] = g[q * ld + n + j] - g[(n + q) * ld + j];
        }
        grads.ar[j] = total.a_re[j] + total.a_re[n + j];
        grads.ai[j] = total.a_im[j] - total.a_im[n + j];
    }
    if let Some(gk) = grads.keep {
        if gk.len() == 1 {
            gk[0] = block::sum8(&total.keep[..d]);
        } else {
            gk.copy_from_slice(&total.keep);
        }
    }
    Ok(())
}

fn add<T: Real>(a: &mut [T], b: &[T]) {
    a.iter_mut().zip(b).for_each(|(x, &y)| *x += y);
}
