//! A plain per-stream reference of the forward, written from the model's equations
//! (docs/design.md, steps 2-6) with complex numbers as (re, im) pairs and no attention to
//! speed or to the optimised loop's order of operations: what the tests hold the loop to.

use crate::real::Real;
use crate::window::Window;

#[derive(Clone, Copy, Debug)]
struct C<T>(T, T);

impl<T: Real> C<T> {
    fn add(self, o: Self) -> Self {
        C(self.0 + o.0, self.1 + o.1)
    }
    fn scale(self, x: T) -> Self {
        C(self.0 * x, self.1 * x)
    }
    fn mul(self, o: Self) -> Self {
        C(self.0 * o.0 - self.1 * o.1, self.0 * o.1 + self.1 * o.0)
    }
    fn abs(self) -> T {
        (self.0 * self.0 + self.1 * self.1).sqrt()
    }
}

pub(crate) struct RefOut<T> {
    pub zs: Vec<T>,
    pub es: Vec<T>,
    pub gs: Vec<T>,
    pub g: Vec<T>,
    pub e: Vec<T>,
}

/// The forward of every stream, one at a time.
pub(crate) fn forward<T: Real>(w: &Window<'_, T>, g0: &[T], e0: &[T]) -> RefOut<T> {
    let (k, b, n) = (w.shape.k, w.shape.b, w.shape.n);
    let d = 2 * n;
    let c = w.consts;
    let f = T::from_f64;
    let h = f(c.dt);
    let a: Vec<C<T>> = (0..n).map(|j| C(w.ar[j], w.ai[j])).collect();
    let cm = |j: usize, q: usize| C(w.cr[j * n + q], w.ci[j * n + q]);
    let keep = |j: usize, im: bool| {
        if w.keep.len() == 1 {
            w.keep[0]
        } else {
            w.keep[j + if im { n } else { 0 }]
        }
    };
    let mut out = RefOut {
        zs: vec![T::ZERO; k * b * d],
        es: vec![T::ZERO; k * b],
        gs: vec![T::ZERO; k * b],
        g: vec![T::ZERO; b],
        e: vec![T::ZERO; b],
    };
    for s in 0..b {
        let mut z: Vec<C<T>> = (0..n)
            .map(|j| C(w.z[s * d + j], w.z[s * d + n + j]))
            .collect();
        let (mut g, mut e) = (g0[s], e0[s]);
        for t in 0..k {
            if w.resets[t] {
                z.iter_mut().for_each(|x| *x = C(T::ZERO, T::ZERO));
                g = T::ONE;
                e = T::ZERO;
            }
            out.gs[t * b + s] = g;
            let row = (t * b + s) * d;
            let u: Vec<C<T>> = (0..n)
                .map(|j| C(w.u[row + j], w.u[row + n + j]).scale(g))
                .collect();
            // 2. leak
            let z0: Vec<C<T>> = (0..n)
                .map(|j| C(z[j].0 * keep(j, false), z[j].1 * keep(j, true)))
                .collect();
            // 3. RK4 of dz/dt = a z + u + C phi(z), phi(z) = z / (1 + |z|)
            let slope = |y: &[C<T>]| -> Vec<C<T>> {
                let phi: Vec<C<T>> = y
                    .iter()
                    .map(|&x| x.scale(T::ONE / (T::ONE + x.abs())))
                    .collect();
                (0..n)
                    .map(|j| {
                        let mut acc = a[j].mul(y[j]).add(u[j]);
                        for (q, &p) in phi.iter().enumerate() {
                            acc = acc.add(cm(j, q).mul(p));
                        }
                        acc
                    })
                    .collect()
            };
            let step = |base: &[C<T>], k: &[C<T>], x: T| -> Vec<C<T>> {
                base.iter()
                    .zip(k)
                    .map(|(&b, &k)| b.add(k.scale(x)))
                    .collect()
            };
            let k1 = slope(&z0);
            let k2 = slope(&step(&z0, &k1, h / f(2.0)));
            let k3 = slope(&step(&z0, &k2, h / f(2.0)));
            let k4 = slope(&step(&z0, &k3, h));
            let z1: Vec<C<T>> = (0..n)
                .map(|j| {
                    let sum = k1[j]
                        .add(k2[j].scale(f(2.0)))
                        .add(k3[j].scale(f(2.0)))
                        .add(k4[j]);
                    z0[j].add(sum.scale(h / f(6.0)))
                })
                .collect();
            // 4. phase sync: rotate by conj(s)/|s|, s the sum of the modes.
            let sum = z1.iter().fold(C(T::ZERO, T::ZERO), |acc, &x| acc.add(x));
            let rho = sum.abs();
            let z2: Vec<C<T>> = if rho > f(c.phase_sync_min) {
                let rot = C(sum.0 / rho, -sum.1 / rho);
                z1.iter().map(|&x| x.mul(rot)).collect()
            } else {
                z1
            };
            // 5. RMS cap.
            let rms = (z2
                .iter()
                .map(|x| x.abs() * x.abs())
                .fold(T::ZERO, |a, b| a + b)
                / f(n as f64))
            .sqrt();
            let max_rms = f(c.max_rms);
            z = if rms > max_rms {
                z2.iter().map(|&x| x.scale(max_rms / rms)).collect()
            } else {
                z2
            };
            for (j, x) in z.iter().enumerate() {
                out.zs[row + j] = x.0;
                out.zs[row + n + j] = x.1;
            }
            // 6. amplitude controller (r' = the RMS after the cap).
            let r = rms.min(max_rms);
            let lr = f(r.max(f(c.amp_log_floor)).to_f64().ln());
            let step = f((c.amp_rate * (c.log_target - lr.to_f64())).exp());
            g = (g * step).max(f(c.gain_min)).min(f(c.gain_max));
            e = f(c.energy_decay) * e + f(1.0 - c.energy_decay) * r * r;
            out.es[t * b + s] = e;
        }
        out.g[s] = g;
        out.e[s] = e;
    }
    out
}
