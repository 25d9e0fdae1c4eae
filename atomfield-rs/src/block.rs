//! One block of streams stepped through the whole window: the forward, and the backward
//! that recomputes each tick from the stored field. Everything here is `#[inline(always)]`
//! so that it compiles into the instruction set's entry (`simd::Simd::run`).
//!
//! Layout: a block's matrices are row-major [streams, ld] with ld = 2n padded to the
//! products' tile width (the padding columns stay 0 and are never read); a row is one
//! stream's [Re | Im]. The arithmetic follows `atom_train.model.field_loops.FusedFieldLoop`
//! step for step (its comments name the torch operation each line mirrors), with two
//! differences in rounding only: the order of the sums (the products sum in index order, one
//! FMA chain per output; the sums over modes in eight interleaved partial sums combined
//! pairwise, [`sum8`]) and phi = y (1/(1+|y|)), one division a mode (`prep`).

use crate::real::Real;
use crate::simd::{gemm, prefetch, Lanes, Strided};
use crate::window::Ctx;

/// RK4: the previous slope's coefficient in each stage's input (stage 1, 2, 3), and the
/// stages' weights in the final sum (1, 2, 2, 1: stage 0 starts the sum).
pub(crate) const STAGE_IN: [f64; 4] = [0.0, 0.5, 0.5, 1.0];
pub(crate) const STAGE_W: [f64; 4] = [1.0, 2.0, 2.0, 1.0];

/// The sum of `x` in a fixed order: eight partial sums (element j into sum j mod 8), then
/// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). The order is part of the result's
/// definition (the same on every CPU and instruction set), and eight independent chains
/// vectorise.
#[inline(always)]
pub(crate) fn sum8<T: Real>(x: &[T]) -> T {
    dot_with(x, x, |a, _| a)
}

/// `sum a * b`, in [`sum8`]'s order.
#[inline(always)]
pub(crate) fn dot8<T: Real>(a: &[T], b: &[T]) -> T {
    dot_with(a, b, |x, y| x * y)
}

#[inline(always)]
fn dot_with<T: Real>(a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> T {
    let b = &b[..a.len()];
    let mut p = [T::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            p[l] += f(x[l], y[l]);
        }
    }
    for ((acc, &x), &y) in p.iter_mut().zip(ra).zip(rb) {
        *acc += f(x, y);
    }
    ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
}

/// An output array shared by the blocks, each of which writes only its own streams' rows.
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the blocks write disjoint elements (each its own streams' rows; `Ctx::blocks`
// partitions the streams), and the owner's &mut borrow outlives every block.
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(x: &mut [T]) -> Self {
        SharedMut {
            ptr: x.as_mut_ptr(),
            len: x.len(),
        }
    }

    /// Elements [off, off + len).
    ///
    /// # Safety
    /// No other live reference may overlap them (each block asks only for its own rows).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, off: usize, len: usize) -> &mut [T] {
        assert!(off + len <= self.len, "block output out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(off), len)
    }
}

/// Where the forward writes (all [K, B] or [K, B, 2n] or [B], row-major).
pub(crate) struct FwdOut<T> {
    pub zs: SharedMut<T>,
    pub es: SharedMut<T>,
    pub gs: SharedMut<T>,
    pub g: SharedMut<T>,
    pub e: SharedMut<T>,
}

/// Where the backward writes its per-stream gradients.
pub(crate) struct BwdOut<T> {
    pub gu: SharedMut<T>,
    pub gz: SharedMut<T>,
}

/// What the backward reads besides the window.
pub(crate) struct BwdIn<'a, T> {
    pub zs: &'a [T],
    pub gs: &'a [T],
    pub gzs: &'a [T],
    pub need_keep: bool,
}

/// One block's sums of the parameters' gradient terms, reduced over the blocks in block
/// order by the caller.
pub(crate) struct Partial<T> {
    /// dL/dWc, [2n, ld]: rows are phi's modes, columns the slope's.
    pub gwc: Vec<T>,
    /// sum of y * gk and of y * (gk with its halves swapped), per mode of [Re | Im].
    pub a_re: Vec<T>,
    pub a_im: Vec<T>,
    /// sum of z_prev * dL/dz0, per mode (the leak's gradient).
    pub keep: Vec<T>,
}

/// The block's rows [r0, r0 + rows) of a [.., B, 2n] array at tick t, as a flat range.
#[inline(always)]
fn rows_at(c: &Ctx<'_, impl Real>, t: usize, r0: usize, rows: usize) -> (usize, usize) {
    ((t * c.b + r0) * c.d, rows * c.d)
}

/// out = keep * z (scalar or per-mode keep) over `rows` rows of width d: z's at stride
/// `zld`, out's at stride ld.
#[inline(always)]
fn leak<T: Real>(c: &Ctx<'_, T>, z: &[T], zld: usize, out: &mut [T], rows: usize) {
    let (d, ld) = (c.d, c.ld);
    for s in 0..rows {
        let (zr, or) = (&z[s * zld..s * zld + d], &mut out[s * ld..s * ld + d]);
        match c.keep_scalar {
            Some(k) => or.iter_mut().zip(zr).for_each(|(o, &x)| *o = x * k),
            None => or
                .iter_mut()
                .zip(zr)
                .zip(c.keep)
                .for_each(|((o, &x), &k)| *o = x * k),
        }
    }
}

/// Phase sync of the rows of z1 (width d at stride ld), in place into z2; per stream the
/// sum of the modes (sr, si), the rotation (q0, q1) and |z2|.
#[inline(always)]
fn sync_row<T: Real>(c: &Ctx<'_, T>, z: &mut [T]) -> SyncOut<T> {
    let n = c.n;
    let sr = sum8(&z[..n]);
    let si = sum8(&z[n..2 * n]);
    let rho = (sr * sr + si * si).sqrt();
    let (q0, q1) = if rho > c.psm {
        let rc = rho.max(c.psm);
        (sr / rc, si / rc)
    } else {
        (T::ONE, T::ZERO)
    };
    let (zr, zi) = z[..2 * n].split_at_mut(n);
    for (a, b) in zr.iter_mut().zip(zi.iter_mut()) {
        let (r, i) = (*a, *b);
        *a = r * q0 + i * q1; // z2 = z1 (q0 - i q1)
        *b = i * q0 - r * q1;
    }
    let norm = dot8(&z[..2 * n], &z[..2 * n]).sqrt();
    SyncOut {
        sr,
        si,
        q0,
        q1,
        norm,
    }
}

pub(crate) struct SyncOut<T> {
    sr: T,
    si: T,
    q0: T,
    q1: T,
    norm: T,
}

/// The RK4 step of one tick for the block: from z0 (the leaked field) and u (the drive
/// with its gain) to z1, written to `z1`. `ys` receives stage inputs 1-3, `p` the four
/// stages' phi (stacked [4, rows, ld]) and `fac` (when given: [4, rows, n] each) their
/// Jacobian factors 1/(1+|y|) and 1/(|y| (1+|y|)^2).
///
/// Per stage: one product k += phi(y) Wc (C phi on pairs), then one elementwise pass that
/// adds k to the RK4 sum, forms the next stage's input y' = z0 + h c k, its phi and the
/// diagonal part u + a y' of its slope (`stage_pass`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rk4<T: Real, S: Lanes<T>>(
    c: &Ctx<'_, T>,
    z0: &[T],
    u: &[T],
    ys: &mut [Vec<T>; 3],
    p: &mut [T],
    k: &mut [T],
    acc: &mut [T],
    z1: &mut [T],
    mut fac: Option<(&mut [T], &mut [T])>,
    rows: usize,
) {
    let (d, ld, n) = (c.d, c.ld, c.n);
    let block = rows * ld;
    let (car, cai) = (&c.ar[..n], &c.ai[..n]);
    let tiny = c.tiny;
    // Stage 0's input is z0 itself.
    for s in 0..rows {
        let o = s * ld;
        let (yr, yi) = z0[o..o + d].split_at(n);
        let (ur, ui) = u[o..o + d].split_at(n);
        let (pr, pi) = p[o..o + d].split_at_mut(n);
        let (kr, ki) = k[o..o + d].split_at_mut(n);
        let (iv, fv) = match fac.as_mut() {
            Some((iv, fv)) => (&mut iv[s * n..(s + 1) * n], &mut fv[s * n..(s + 1) * n]),
            None => (&mut [][..], &mut [][..]),
        };
        prep(pr, pi, kr, ki, iv, fv, yr, yi, ur, ui, car, cai, tiny);
    }
    for i in 0..4 {
        let a = Strided {
            ptr: p[i * block..].as_ptr(),
            rs: ld,
            cs: 1,
        };
        gemm::<T, S>(rows, ld, d, a, c.wc.as_ptr(), ld, k.as_mut_ptr(), ld);
        let (w, hc) = (c.stage_w[i], if i < 3 { c.stage_in[i + 1] } else { c.h6 });
        for s in 0..rows {
            let o = s * ld;
            let (kr, ki) = k[o..o + d].split_at_mut(n);
            let (ar, ai) = acc[o..o + d].split_at_mut(n);
            let (zr, zi) = z0[o..o + d].split_at(n);
            if i == 3 {
                let (yr, yi) = z1[o..o + d].split_at_mut(n);
                last_pass(yr, yi, ar, ai, kr, ki, zr, zi, w, hc);
                continue;
            }
            let (yr, yi) = ys[i][o..o + d].split_at_mut(n);
            let (ur, ui) = u[o..o + d].split_at(n);
            let q = (i + 1) * block + o;
            let (pr, pi) = p[q..q + d].split_at_mut(n);
            let (iv, fv) = match fac.as_mut() {
                Some((iv, fv)) => {
                    let q = ((i + 1) * rows + s) * n;
                    (&mut iv[q..q + n], &mut fv[q..q + n])
                }
                None => (&mut [][..], &mut [][..]),
            };
            let first = i == 0;
            stage_pass(
                first, yr, yi, ar, ai, kr, ki, pr, pi, iv, fv, zr, zi, ur, ui, car, cai, w, hc,
                tiny,
            );
        }
    }
}

/// Scratch of the block, [rows, ld] each unless said.
struct Bufs<T> {
    u: Vec<T>,
    z0: Vec<T>,
    ys: [Vec<T>; 3],
    k: Vec<T>,
    acc: Vec<T>,
    z: Vec<T>,
    /// [4, rows, ld]: the four stages' phi.
    p: Vec<T>,
}

impl<T: Real> Bufs<T> {
    fn new(rows: usize, ld: usize) -> Self {
        let m = || vec![T::ZERO; rows * ld];
        Bufs {
            u: m(),
            z0: m(),
            ys: [m(), m(), m()],
            k: m(),
            acc: m(),
            z: m(),
            p: vec![T::ZERO; 4 * rows * ld],
        }
    }
}

/// u = U[t] * g for the block's rows (the gain from before this tick's update).
#[inline(always)]
fn drive<T: Real>(c: &Ctx<'_, T>, t: usize, r0: usize, rows: usize, g: &[T], u: &mut [T]) {
    let (off, len) = rows_at(c, t, r0, rows);
    let ut = &c.u[off..off + len];
    for s in 0..rows {
        let gs = g[s];
        u[s * c.ld..s * c.ld + c.d]
            .iter_mut()
            .zip(&ut[s * c.d..(s + 1) * c.d])
            .for_each(|(o, &x)| *o = x * gs);
    }
}

/// The forward of streams [r0, r0 + rows) over the window.
///
/// # Safety
/// Call inside `S`'s instruction-set entry; no other block may cover these streams.
#[inline(always)]
pub(crate) unsafe fn forward<T: Real, S: Lanes<T>>(
    c: &Ctx<'_, T>,
    g_in: &[T],
    e_in: &[T],
    out: &FwdOut<T>,
    r0: usize,
    rows: usize,
) {
    let (d, ld, b) = (c.d, c.ld, c.b);
    let mut w = Bufs::new(rows, ld);
    let mut g = g_in[r0..r0 + rows].to_vec();
    let mut e = e_in[r0..r0 + rows].to_vec();
    for s in 0..rows {
        w.z[s * ld..s * ld + d].copy_from_slice(&c.z[(r0 + s) * d..(r0 + s + 1) * d]);
    }
    for t in 0..c.k {
        if c.resets[t] {
            w.z.fill(T::ZERO);
            g.fill(T::ONE);
            e.fill(T::ZERO);
        }
        if t + 1 < c.k {
            let (o, l) = rows_at(c, t + 1, r0, rows);
            prefetch(&c.u[o..o + l]); // the next tick's drive, on its way while this one runs
        }
        out.gs.slice(t * b + r0, rows).copy_from_slice(&g);
        drive(c, t, r0, rows, &g, &mut w.u);
        leak(c, &w.z, ld, &mut w.z0, rows); // 2. leak
        let Bufs {
            u,
            z0,
            ys,
            k,
            acc,
            z,
            p,
        } = &mut w;
        rk4::<T, S>(c, z0, u, ys, p, k, acc, z, None, rows); // 3. RK4
        let (off, len) = rows_at(c, t, r0, rows);
        let zs = out.zs.slice(off, len);
        let es = out.es.slice(t * b + r0, rows);
        for s in 0..rows {
            let row = &mut z[s * ld..s * ld + d];
            let sy = sync_row(c, row); // 4. phase sync
            let sig = (T::ONE / sy.norm.max(c.cap)) * c.cap; // 5. cap: reciprocal_().mul_(cap)
            row.iter_mut().for_each(|x| *x *= sig);
            zs[s * d..(s + 1) * d].copy_from_slice(row);
            // 6. amplitude controller, from r' = min(RMS before the cap, max).
            let rc = (sy.norm / c.sqrt_n).min(c.max_rms);
            let step = rc.max(c.floor).powf(c.neg_rate) * c.step_const;
            g[s] = (step * g[s]).max(c.gmin).min(c.gmax);
            e[s] = e[s] * c.decay + c.one_minus_decay * rc * rc; // addcmul(E d, r, r, 1-d)
            es[s] = e[s];
        }
    }
    out.g.slice(r0, rows).copy_from_slice(&g);
    out.e.slice(r0, rows).copy_from_slice(&e);
}

/// The backward of streams [r0, r0 + rows) over the window: dL/dU and dL/dz into `out`,
/// the parameters' terms returned as this block's partial sums.
///
/// # Safety
/// Call inside `S`'s instruction-set entry; no other block may cover these streams.
#[inline(always)]
pub(crate) unsafe fn backward<T: Real, S: Lanes<T>>(
    c: &Ctx<'_, T>,
    inp: &BwdIn<'_, T>,
    out: &BwdOut<T>,
    r0: usize,
    rows: usize,
) -> Partial<T> {
    let (d, ld, n, b) = (c.d, c.ld, c.n, c.b);
    let block = rows * ld;
    let mut w = Bufs::new(rows, ld);
    let m = || vec![T::ZERO; rows * ld];
    let (mut gz, mut gz0, mut a3, mut wv, mut gy) = (m(), m(), m(), m(), m());
    let mut gk = vec![T::ZERO; 4 * block]; // the four stages' dL/dk, stacked like p
    let mut invd = vec![T::ZERO; 4 * rows * n];
    let mut fac = vec![T::ZERO; 4 * rows * n];
    let mut part = Partial {
        gwc: vec![T::ZERO; d * ld],
        a_re: vec![T::ZERO; d],
        a_im: vec![T::ZERO; d],
        keep: vec![T::ZERO; d],
    };
    let mut g = vec![T::ZERO; rows];
    for t in (0..c.k).rev() {
        let (off, len) = rows_at(c, t, r0, rows);
        let gzt = &inp.gzs[off..off + len];
        for s in 0..rows {
            gz[s * ld..s * ld + d]
                .iter_mut()
                .zip(&gzt[s * d..(s + 1) * d])
                .for_each(|(a, &x)| *a += x); // gz = gz + gZs[t]
        }
        // The field entering tick t: Zs[t-1], z at t = 0, zeros after a reset.
        let live = !c.resets[t];
        let prev: Option<&[T]> = match (live, t) {
            (false, _) => None,
            (true, 0) => Some(&c.z[r0 * d..(r0 + rows) * d]),
            (true, _) => {
                let (o, l) = rows_at(c, t - 1, r0, rows);
                Some(&inp.zs[o..o + l])
            }
        };
        if t > 0 {
            // What tick t - 1 reads, on its way while this tick runs.
            let (o, l) = rows_at(c, t - 1, r0, rows);
            prefetch(&c.u[o..o + l]);
            prefetch(&inp.gzs[o..o + l]);
            if t > 1 {
                let (o, l) = rows_at(c, t - 2, r0, rows);
                prefetch(&inp.zs[o..o + l]);
            }
        }
        g.copy_from_slice(&inp.gs[t * b + r0..t * b + r0 + rows]);
        // Recompute tick t.
        drive(c, t, r0, rows, &g, &mut w.u);
        match prev {
            Some(p) => leak(c, p, d, &mut w.z0, rows),
            None => w.z0.fill(T::ZERO),
        }
        let Bufs {
            u,
            z0,
            ys,
            k,
            acc,
            z,
            p,
        } = &mut w;
        rk4::<T, S>(
            c,
            z0,
            u,
            ys,
            p,
            k,
            acc,
            z,
            Some((&mut invd, &mut fac)),
            rows,
        );
        // 5. cap and 4. phase sync, backwards: gz -> g2 -> gz1 (into a3's buffer first).
        for s in 0..rows {
            let o = s * ld;
            let z2 = &mut z[o..o + d];
            let sy = sync_row(c, z2);
            let sig = c.cap / sy.norm.max(c.cap);
            let capc = if sy.norm > c.cap {
                sig * sig * sig / c.cap2 // cap / |z2|^3 where capped
            } else {
                T::ZERO
            };
            let gzr = &gz[o..o + d];
            let cd = capc * dot8(gzr, z2);
            let g2 = &mut wv[o..o + d]; // scratch until the stage products
            for ((x, &a), &b) in g2.iter_mut().zip(gzr).zip(z2.iter()) {
                *x = a * sig - b * cd;
            }
            // kappa = Im sum conj(z2) g2 = sum g2 . (i z2), i z2 = [-Im | Re] (into gy).
            let iz2 = &mut gy[o..o + d];
            let (z2r, z2i) = z2.split_at(n);
            let (ir, ii) = iz2.split_at_mut(n);
            ir.iter_mut().zip(z2i).for_each(|(x, &v)| *x = -v);
            ii.copy_from_slice(z2r);
            let kappa = dot8(g2, iz2);
            let rho2 = sy.sr * sy.sr + sy.si * sy.si;
            let (v0, v1) = if rho2 > c.psm2 {
                let r = rho2.max(c.tiny);
                (sy.si / r * kappa, -sy.sr / r * kappa)
            } else {
                (T::ZERO, T::ZERO)
            };
            let (g2r, g2i) = g2.split_at(n);
            let (gz1r, gz1i) = a3[o..o + d].split_at_mut(n);
            sync_grad(gz1r, gz1i, g2r, g2i, [sy.q0, sy.q1, v0, v1]);
        }
        // 3. RK4, last stage first.
        for s in 0..rows {
            let o = s * ld;
            let g1 = &a3[o..o + d];
            gz0[o..o + d].copy_from_slice(g1);
            gk[3 * block + o..3 * block + o + d]
                .iter_mut()
                .zip(g1)
                .for_each(|(x, &v)| *x = v * c.h6);
        }
        for x in a3.iter_mut() {
            *x *= c.h3;
        }
        for i in (0..4).rev() {
            wv.fill(T::ZERO);
            let a = Strided {
                ptr: gk[i * block..].as_ptr(),
                rs: ld,
                cs: 1,
            };
            // w = dL/dphi = gk Wc^T.
            gemm::<T, S>(rows, ld, d, a, c.wct.as_ptr(), ld, wv.as_mut_ptr(), ld);
            let y: &[T] = if i == 0 { z0 } else { &ys[i - 1] };
            let (iv, fv) = (&invd[i * rows * n..], &fac[i * rows * n..]);
            let gki = &gk[i * block..(i + 1) * block];
            let (car, cai) = (&c.ar[..n], &c.ai[..n]);
            for s in 0..rows {
                let o = s * ld;
                let (yr, yi) = y[o..o + d].split_at(n);
                let (wr, wi) = wv[o..o + d].split_at(n);
                let (kr, ki) = gki[o..o + d].split_at(n);
                let (id, f) = (&iv[s * n..(s + 1) * n], &fv[s * n..(s + 1) * n]);
                let (gr, gi) = gy[o..o + d].split_at_mut(n);
                stage_grad(gr, gi, yr, yi, wr, wi, kr, ki, id, f, car, cai);
            }
            add_rows(&mut gz0, &gy, d, ld, rows);
            if i >= 1 {
                // gk[i-1] = a3 + h c_i gy (i = 3, 2); gk[0] = gk[3] + h/2 gy.
                let (before, after) = gk.split_at_mut(i * block);
                let base: &[T] = if i >= 2 { &a3 } else { &after[2 * block..] };
                let dst = &mut before[(i - 1) * block..i * block];
                let hc = c.stage_in[i];
                for s in 0..rows {
                    let o = s * ld;
                    dst[o..o + d]
                        .iter_mut()
                        .zip(base[o..o + d].iter().zip(&gy[o..o + d]))
                        .for_each(|(x, (&a, &v))| *x = a + hc * v);
                }
            }
        }
        // The drive: u = g U.
        let gu = out.gu.slice(off, len);
        let (g0, rest) = gk.split_at(block);
        let (g1, rest) = rest.split_at(block);
        let (g2, g3) = rest.split_at(block);
        for s in 0..rows {
            let o = s * ld;
            let (a, b, cc, e) = (&g0[o..o + d], &g1[o..o + d], &g2[o..o + d], &g3[o..o + d]);
            drive_grad(&mut gu[s * d..(s + 1) * d], a, b, cc, e, g[s]);
        }
        // Parameters: dL/dWc += phi^T gk over the four stages' rows; a's sums.
        let a = Strided {
            ptr: p.as_ptr(),
            rs: 1,
            cs: ld,
        };
        gemm::<T, S>(
            d,
            ld,
            4 * rows,
            a,
            gk.as_ptr(),
            ld,
            part.gwc.as_mut_ptr(),
            ld,
        );
        let (are, aim, pk) = (
            &mut part.a_re[..d],
            &mut part.a_im[..d],
            &mut part.keep[..d],
        );
        let (are_r, are_i) = are.split_at_mut(n);
        let (aim_r, aim_i) = aim.split_at_mut(n);
        for i in 0..4 {
            let y: &[T] = if i == 0 { z0 } else { &ys[i - 1] };
            for s in 0..rows {
                let o = s * ld;
                let (yr, yi) = y[o..o + d].split_at(n);
                let q = i * block + o;
                let (gr, gi) = gk[q..q + d].split_at(n);
                a_terms(are_r, are_i, aim_r, aim_i, yr, yi, gr, gi);
            }
        }
        if let (true, Some(p)) = (inp.need_keep, prev) {
            // z0 = keep z_prev (z_prev is 0 after a reset: no term).
            for s in 0..rows {
                let o = s * ld;
                mul_acc(pk, &p[s * d..(s + 1) * d], &gz0[o..o + d]);
            }
        }
        // 2. leak; a reset before this tick cuts the gradient to the past.
        if live {
            leak(c, &gz0, ld, &mut gz, rows);
        } else {
            gz.fill(T::ZERO);
        }
    }
    let gzo = out.gz.slice(r0 * d, rows * d);
    for s in 0..rows {
        gzo[s * d..(s + 1) * d].copy_from_slice(&gz[s * ld..s * ld + d]);
    }
    part
}

/// a += b over the first d columns of `rows` rows at stride ld.
#[inline(always)]
fn add_rows<T: Real>(a: &mut [T], b: &[T], d: usize, ld: usize, rows: usize) {
    for s in 0..rows {
        let o = s * ld;
        a[o..o + d]
            .iter_mut()
            .zip(&b[o..o + d])
            .for_each(|(x, &v)| *x += v);
    }
}

// The per-row loops, each in a function of its own: its slices arrive as parameters (each
// its own, not in an array or a tuple), which tells the compiler they do not overlap
// (inlined, as scoped no-alias facts), so it vectorises them without run-time overlap checks
// (which it gives up on past a few arrays).

/// One stage's dL/dy from its dL/dk (kr, ki) and w = dL/dphi: the diagonal part's
/// conj(a) gk, plus phi's Jacobian^T w = w/(1+|y|) - y (y.w)/(|y| (1+|y|)^2), per mode.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn stage_grad<T: Real>(
    gr: &mut [T],
    gi: &mut [T],
    yr: &[T],
    yi: &[T],
    wr: &[T],
    wi: &[T],
    kr: &[T],
    ki: &[T],
    id: &[T],
    f: &[T],
    ar: &[T],
    ai: &[T],
) {
    let n = yr.len();
    let (gr, gi) = (&mut gr[..n], &mut gi[..n]);
    let (yi, wr, wi, kr, ki) = (&yi[..n], &wr[..n], &wi[..n], &kr[..n], &ki[..n]);
    let (id, f, ar, ai) = (&id[..n], &f[..n], &ar[..n], &ai[..n]);
    for j in 0..n {
        let coef = (wr[j] * yr[j] + wi[j] * yi[j]) * f[j];
        gr[j] = ((ar[j] * kr[j] + ai[j] * ki[j]) + wr[j] * id[j]) - yr[j] * coef;
        gi[j] = ((ar[j] * ki[j] - ai[j] * kr[j]) + wi[j] * id[j]) - yi[j] * coef;
    }
}

/// dL/dz1 = (q0 + i q1) g2 + dL/ds (v0, v1 on every mode), per mode.
#[inline(always)]
fn sync_grad<T: Real>(zr: &mut [T], zi: &mut [T], gr: &[T], gi: &[T], q: [T; 4]) {
    let [q0, q1, v0, v1] = q;
    let n = gr.len();
    let (zr, zi, gi) = (&mut zr[..n], &mut zi[..n], &gi[..n]);
    for j in 0..n {
        let (r, i) = (gr[j], gi[j]);
        zr[j] = r * q0 - i * q1 + v0;
        zi[j] = i * q0 + r * q1 + v1;
    }
}

/// dL/dU = (gk0 + gk1 + gk2 + gk3) g, summed in that order (`GK.sum(0) * G[t]`).
#[inline(always)]
fn drive_grad<T: Real>(out: &mut [T], a: &[T], b: &[T], c: &[T], e: &[T], g: T) {
    let d = out.len();
    let (a, b, c, e) = (&a[..d], &b[..d], &c[..d], &e[..d]);
    for j in 0..d {
        out[j] = (((a[j] + b[j]) + c[j]) + e[j]) * g;
    }
}

/// acc += x * y elementwise.
#[inline(always)]
fn mul_acc<T: Real>(acc: &mut [T], x: &[T], y: &[T]) {
    let d = acc.len();
    let (x, y) = (&x[..d], &y[..d]);
    for j in 0..d {
        acc[j] += x[j] * y[j];
    }
}

/// From a stage input y (per mode j < n): phi(y) = y / (1 + |y|) into (pr, pi), the
/// diagonal part of the slope u + a y into (kr, ki) (the product adds C phi), and, when `iv`
/// is not empty, phi's Jacobian factors 1/(1+|y|) and 1/(|y| (1+|y|)^2) into (iv, fv)
/// (`field_loops._phi_grad_factors`; the second is 0 times a finite number at y = 0).
/// phi is y times 1/(1+|y|): one division a mode (the fused loop divides twice; the two
/// differ by at most an ulp).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn prep<T: Real>(
    pr: &mut [T],
    pi: &mut [T],
    kr: &mut [T],
    ki: &mut [T],
    iv: &mut [T],
    fv: &mut [T],
    yr: &[T],
    yi: &[T],
    ur: &[T],
    ui: &[T],
    ar: &[T],
    ai: &[T],
    tiny: T,
) {
    let n = yr.len();
    let (pr, pi, kr, ki) = (&mut pr[..n], &mut pi[..n], &mut kr[..n], &mut ki[..n]);
    let (yi, ur, ui, ar, ai) = (&yi[..n], &ur[..n], &ui[..n], &ar[..n], &ai[..n]);
    if iv.is_empty() {
        for j in 0..n {
            let (a, b) = (yr[j], yi[j]);
            let id = T::ONE / ((a * a + b * b).sqrt() + T::ONE);
            pr[j] = a * id;
            pi[j] = b * id;
            kr[j] = ur[j] + (ar[j] * a - ai[j] * b);
            ki[j] = ui[j] + (ai[j] * a + ar[j] * b);
        }
    } else {
        let (iv, fv) = (&mut iv[..n], &mut fv[..n]);
        for j in 0..n {
            let (a, b) = (yr[j], yi[j]);
            let m = (a * a + b * b).sqrt();
            let id = T::ONE / (m + T::ONE);
            pr[j] = a * id;
            pi[j] = b * id;
            kr[j] = ur[j] + (ar[j] * a - ai[j] * b);
            ki[j] = ui[j] + (ai[j] * a + ar[j] * b);
            iv[j] = id;
            fv[j] = id * id / m.max(tiny);
        }
    }
}

/// After stage i's product: acc = k (stage 0) or acc + w k; the next input y = z0 + hc k
/// and its `prep` (k is overwritten with the next slope's diagonal part).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn stage_pass<T: Real>(
    first: bool,
    yr: &mut [T],
    yi: &mut [T],
    accr: &mut [T],
    acci: &mut [T],
    kr: &mut [T],
    ki: &mut [T],
    pr: &mut [T],
    pi: &mut [T],
    iv: &mut [T],
    fv: &mut [T],
    zr: &[T],
    zi: &[T],
    ur: &[T],
    ui: &[T],
    ar: &[T],
    ai: &[T],
    w: T,
    hc: T,
    tiny: T,
) {
    let n = zr.len();
    let (yr, yi, accr, acci, kr, ki) = (
        &mut yr[..n],
        &mut yi[..n],
        &mut accr[..n],
        &mut acci[..n],
        &mut kr[..n],
        &mut ki[..n],
    );
    let zi = &zi[..n];
    for j in 0..n {
        let (a, b) = (kr[j], ki[j]);
        if first {
            accr[j] = a;
            acci[j] = b;
        } else {
            accr[j] += w * a; // acc.add_(k, alpha=w)
            acci[j] += w * b;
        }
        yr[j] = zr[j] + hc * a; // torch.add(z0, k, alpha=h c)
        yi[j] = zi[j] + hc * b;
    }
    prep(pr, pi, kr, ki, iv, fv, yr, yi, ur, ui, ar, ai, tiny);
}

/// After stage 3's product: acc + k, then z1 = z0 + h/6 acc.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn last_pass<T: Real>(
    yr: &mut [T],
    yi: &mut [T],
    accr: &mut [T],
    acci: &mut [T],
    kr: &[T],
    ki: &[T],
    zr: &[T],
    zi: &[T],
    w: T,
    h6: T,
) {
    let n = zr.len();
    let (yr, yi, accr, acci) = (&mut yr[..n], &mut yi[..n], &mut accr[..n], &mut acci[..n]);
    let (kr, ki, zi) = (&kr[..n], &ki[..n], &zi[..n]);
    for j in 0..n {
        accr[j] += w * kr[j];
        acci[j] += w * ki[j];
        yr[j] = zr[j] + h6 * accr[j]; // torch.add(z0, acc, alpha=h/6)
        yi[j] = zi[j] + h6 * acci[j];
    }
}

/// One stage's terms of a's gradient sums, per mode: sum y * gk ([Re | Im] halves:
/// (are_r, are_i)) and sum y * (gk with its halves swapped) ((aim_r, aim_i) += (Re y Im gk,
/// Im y Re gk)).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn a_terms<T: Real>(
    are_r: &mut [T],
    are_i: &mut [T],
    aim_r: &mut [T],
    aim_i: &mut [T],
    yr: &[T],
    yi: &[T],
    gr: &[T],
    gi: &[T],
) {
    let n = yr.len();
    let (are_r, are_i, aim_r, aim_i) = (
        &mut are_r[..n],
        &mut are_i[..n],
        &mut aim_r[..n],
        &mut aim_i[..n],
    );
    let (yi, gr, gi) = (&yi[..n], &gr[..n], &gi[..n]);
    for j in 0..n {
        are_r[j] += yr[j] * gr[j];
        are_i[j] += yi[j] * gi[j];
        aim_r[j] += yr[j] * gi[j];
        aim_i[j] += yi[j] * gr[j];
    }
}
