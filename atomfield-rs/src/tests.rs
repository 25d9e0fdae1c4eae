//! The loop against the plain reference (forward), finite differences (backward), and its
//! determinism guarantees (runs, thread counts, instruction sets, block sizes).

use proptest::prelude::*;

use crate::reference;
use crate::*;

/// splitmix64: the tests' deterministic numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// uniform in [lo, hi)
    fn uni(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next()
    }
    fn vec(&mut self, len: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..len).map(|_| self.uni(lo, hi)).collect()
    }
}

/// A window's inputs in f64 (converted to T where needed).
#[derive(Clone, Debug)]
struct Case {
    shape: Shape,
    consts: Consts,
    u: Vec<f64>,
    z: Vec<f64>,
    keep: Vec<f64>,
    ar: Vec<f64>,
    ai: Vec<f64>,
    cr: Vec<f64>,
    ci: Vec<f64>,
    resets: Vec<bool>,
    g: Vec<f64>,
    e: Vec<f64>,
}

const MODEL: Consts = Consts {
    dt: 1.0,
    max_rms: 4.0,
    log_target: 0.0,
    amp_rate: 0.01,
    phase_sync_min: 1e-6,
    amp_log_floor: 1e-6,
    energy_decay: 0.99,
    gain_min: 0.1,
    gain_max: 10.0,
};

impl Case {
    /// Drives with a real bias like the model's, decay rates and frequencies in the model's
    /// ranges, a coupling strong enough to matter; `max_rms` low enough that the cap fires.
    fn new(seed: u64, shape: Shape, per_mode_keep: bool, resets: Vec<bool>, max_rms: f64) -> Case {
        let Shape { k, b, n } = shape;
        let d = 2 * n;
        let mut r = Rng(seed);
        let mut u = r.vec(k * b * d, -0.5, 0.5);
        for (i, x) in u.iter_mut().enumerate() {
            if i % d < n {
                *x += 0.25;
            }
        }
        let keep = if per_mode_keep {
            r.vec(d, 0.8, 1.0)
        } else {
            vec![r.uni(0.9, 0.99)]
        };
        let cs = 0.5 / (n as f64).sqrt();
        Case {
            shape,
            consts: Consts { max_rms, ..MODEL },
            u,
            z: r.vec(b * d, -1.0, 1.0),
            keep,
            ar: r.vec(n, -0.5, -0.05),
            ai: r.vec(n, -0.5, 0.5),
            cr: r.vec(n * n, -cs, cs),
            ci: r.vec(n * n, -cs, cs),
            resets,
            g: r.vec(b, 0.5, 2.0),
            e: r.vec(b, 0.0, 1.0),
        }
    }
}

/// The case's arrays in T.
struct Arrays<T> {
    u: Vec<T>,
    z: Vec<T>,
    keep: Vec<T>,
    ar: Vec<T>,
    ai: Vec<T>,
    cr: Vec<T>,
    ci: Vec<T>,
    g: Vec<T>,
    e: Vec<T>,
}

impl Case {
    fn arrays<T: Real>(&self) -> Arrays<T> {
        let c = |x: &Vec<f64>| x.iter().map(|&v| T::from_f64(v)).collect();
        Arrays {
            u: c(&self.u),
            z: c(&self.z),
            keep: c(&self.keep),
            ar: c(&self.ar),
            ai: c(&self.ai),
            cr: c(&self.cr),
            ci: c(&self.ci),
            g: c(&self.g),
            e: c(&self.e),
        }
    }
}

impl<T> Arrays<T> {
    fn window<'a>(&'a self, case: &'a Case) -> Window<'a, T> {
        Window {
            shape: case.shape,
            consts: case.consts,
            u: &self.u,
            z: &self.z,
            keep: &self.keep,
            ar: &self.ar,
            ai: &self.ai,
            cr: &self.cr,
            ci: &self.ci,
            resets: &case.resets,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Fwd<T> {
    zs: Vec<T>,
    es: Vec<T>,
    gs: Vec<T>,
    g: Vec<T>,
    e: Vec<T>,
}

#[derive(Debug, Clone, PartialEq)]
struct Bwd<T> {
    u: Vec<T>,
    z: Vec<T>,
    cr: Vec<T>,
    ci: Vec<T>,
    ar: Vec<T>,
    ai: Vec<T>,
    keep: Vec<T>,
}

fn run_fwd<T: Real>(case: &Case, a: &Arrays<T>, exec: &Exec) -> Fwd<T> {
    let Shape { k, b, n } = case.shape;
    let mut f = Fwd {
        zs: vec![T::ZERO; k * b * 2 * n],
        es: vec![T::ZERO; k * b],
        gs: vec![T::ZERO; k * b],
        g: vec![T::ZERO; b],
        e: vec![T::ZERO; b],
    };
    let out = ForwardOut {
        zs: &mut f.zs,
        es: &mut f.es,
        gs: &mut f.gs,
        g: &mut f.g,
        e: &mut f.e,
    };
    forward(&a.window(case), &a.g, &a.e, out, exec).unwrap();
    f
}

fn run_bwd<T: Real>(case: &Case, a: &Arrays<T>, fw: &Fwd<T>, gzs: &[T], exec: &Exec) -> Bwd<T> {
    let Shape { k, b, n } = case.shape;
    let mut g = Bwd {
        u: vec![T::ZERO; k * b * 2 * n],
        z: vec![T::ZERO; b * 2 * n],
        cr: vec![T::ZERO; n * n],
        ci: vec![T::ZERO; n * n],
        ar: vec![T::ZERO; n],
        ai: vec![T::ZERO; n],
        keep: vec![T::ZERO; case.keep.len()],
    };
    let grads = Grads {
        u: &mut g.u,
        z: &mut g.z,
        cr: &mut g.cr,
        ci: &mut g.ci,
        ar: &mut g.ar,
        ai: &mut g.ai,
        keep: Some(&mut g.keep),
    };
    backward(&a.window(case), &fw.zs, &fw.gs, gzs, grads, exec).unwrap();
    g
}

fn max_abs_diff<T: Real>(a: &[T], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x.to_f64() - y).abs())
        .fold(0.0, f64::max)
}

fn resets_every(k: usize, period: usize, first: usize) -> Vec<bool> {
    (0..k)
        .map(|t| t >= first && (t - first).is_multiple_of(period))
        .collect()
}

/// How many (tick, stream) pairs of the reference had the cap fire.
fn capped(case: &Case, r: &reference::RefOut<f64>) -> usize {
    let n = case.shape.n;
    r.zs.chunks(2 * n)
        .filter(|row| {
            let rms = (row.iter().map(|x| x * x).sum::<f64>() / n as f64).sqrt();
            (rms - case.consts.max_rms).abs() < 1e-9
        })
        .count()
}

fn compare_forward<T: Real>(case: &Case, tol: f64) {
    let a64 = case.arrays::<f64>();
    let want = reference::forward(&a64.window(case), &a64.g, &a64.e);
    let got = run_fwd(case, &case.arrays::<T>(), &Exec::default());
    for (name, x, y) in [
        ("zs", &got.zs, &want.zs),
        ("es", &got.es, &want.es),
        ("gs", &got.gs, &want.gs),
        ("g", &got.g, &want.g),
        ("e", &got.e, &want.e),
    ] {
        let err = max_abs_diff(x, y);
        assert!(
            err <= tol,
            "{name}: max |diff| {err:e} > {tol:e} ({:?})",
            case.shape
        );
    }
}

#[test]
fn forward_matches_the_reference() {
    for (i, &(k, b, n)) in [
        (1, 1, 1),
        (7, 5, 3),
        (9, 17, 16),
        (6, 33, 32),
        (4, 3, 64),
        (3, 20, 20),
    ]
    .iter()
    .enumerate()
    {
        for per_mode in [false, true] {
            let shape = Shape { k, b, n };
            let case = Case::new(i as u64 + 10, shape, per_mode, resets_every(k, 3, 2), 0.6);
            compare_forward::<f64>(&case, 1e-12);
            compare_forward::<f32>(&case, 2e-5);
        }
    }
}

#[test]
fn the_cap_and_the_resets_fire_in_these_cases() {
    let shape = Shape { k: 9, b: 17, n: 16 };
    let case = Case::new(12, shape, true, resets_every(9, 3, 2), 0.6);
    let a = case.arrays::<f64>();
    let r = reference::forward(&a.window(&case), &a.g, &a.e);
    let hits = capped(&case, &r);
    assert!(
        hits > 10 && hits < 9 * 17,
        "cap fired {hits} times of {}",
        9 * 17
    );
    // After a reset the gain used is 1.
    assert!((0..17).all(|s| r.gs[2 * 17 + s] == 1.0 && r.gs[5 * 17 + s] == 1.0));
}

/// L = sum(wts * Zs): the loss the finite differences see.
fn loss(case: &Case, wts: &[f64]) -> f64 {
    let a = case.arrays::<f64>();
    let r = reference::forward(&a.window(case), &a.g, &a.e);
    r.zs.iter().zip(wts).map(|(x, w)| x * w).sum()
}

/// The backward's directional derivative along `v` against a central difference of the
/// reference, for each input in turn. The gain carries no gradient, so it is frozen
/// (amp_rate = 0), as in the Python finite-difference tests.
fn check_gradients(mut case: Case, seed: u64) {
    case.consts.amp_rate = 0.0;
    let Shape { k, b, n } = case.shape;
    let mut r = Rng(seed);
    let wts = r.vec(k * b * 2 * n, -1.0, 1.0);
    let a = case.arrays::<f64>();
    let fw = run_fwd(&case, &a, &Exec::default());
    let g = run_bwd(&case, &a, &fw, &wts, &Exec::default());
    type Pick = fn(&mut Case) -> &mut Vec<f64>;
    let inputs: [(&str, Pick, &Vec<f64>); 7] = [
        ("u", |c| &mut c.u, &g.u),
        ("z", |c| &mut c.z, &g.z),
        ("keep", |c| &mut c.keep, &g.keep),
        ("ar", |c| &mut c.ar, &g.ar),
        ("ai", |c| &mut c.ai, &g.ai),
        ("cr", |c| &mut c.cr, &g.cr),
        ("ci", |c| &mut c.ci, &g.ci),
    ];
    for (name, pick, grad) in inputs {
        let v = r.vec(grad.len(), -1.0, 1.0);
        let analytic: f64 = grad.iter().zip(&v).map(|(g, v)| g * v).sum();
        let eps = 1e-6;
        let shifted = |sign: f64| {
            let mut c = case.clone();
            pick(&mut c)
                .iter_mut()
                .zip(&v)
                .for_each(|(x, d)| *x += sign * eps * d);
            loss(&c, &wts)
        };
        let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps);
        let scale: f64 = grad.iter().zip(&v).map(|(g, v)| (g * v).abs()).sum::<f64>() + 1e-3;
        assert!(
            (fd - analytic).abs() <= 1e-6 * scale,
            "{name}: backward {analytic:e}, finite difference {fd:e} ({:?})",
            case.shape
        );
    }
}

#[test]
fn gradients_match_finite_differences() {
    for (i, &(k, b, n, per_mode)) in [
        (1, 1, 1, false),
        (5, 3, 2, true),
        (8, 4, 5, false),
        (8, 18, 8, true),
        (3, 2, 16, true),
    ]
    .iter()
    .enumerate()
    {
        let shape = Shape { k, b, n };
        let case = Case::new(i as u64 + 100, shape, per_mode, resets_every(k, 3, 1), 0.6);
        check_gradients(case, i as u64);
    }
}

#[test]
fn gradients_without_resets_and_with_a_reset_at_tick_0() {
    let shape = Shape { k: 6, b: 3, n: 4 };
    check_gradients(Case::new(7, shape, true, vec![false; 6], 0.8), 1);
    check_gradients(Case::new(8, shape, false, resets_every(6, 4, 0), 0.8), 2);
}

/// A silent stream (z = 0, no drive): |y| = 0 and the sum of the modes is 0, so phase sync
/// is skipped; everything stays finite and the field stays 0.
#[test]
fn a_silent_stream_stays_zero_with_finite_gradients() {
    let shape = Shape { k: 4, b: 2, n: 8 };
    let mut case = Case::new(3, shape, true, vec![false; 4], 4.0);
    let d = 16;
    for t in 0..4 {
        case.u[(t * 2) * d..(t * 2 + 1) * d].fill(0.0);
    }
    case.z[..d].fill(0.0);
    for f32_too in [false, true] {
        let wts: Vec<f64> = Rng(5).vec(4 * 2 * d, -1.0, 1.0);
        if f32_too {
            let a = case.arrays::<f32>();
            let fw = run_fwd(&case, &a, &Exec::default());
            let w: Vec<f32> = wts.iter().map(|&x| x as f32).collect();
            let g = run_bwd(&case, &a, &fw, &w, &Exec::default());
            assert!(g
                .u
                .iter()
                .chain(&g.cr)
                .chain(&g.keep)
                .all(|x| x.is_finite()));
            assert!((0..4).all(|t| fw.zs[t * 2 * d..(t * 2 + 1) * d].iter().all(|&x| x == 0.0)));
        } else {
            let a = case.arrays::<f64>();
            let fw = run_fwd(&case, &a, &Exec::default());
            let g = run_bwd(&case, &a, &fw, &wts, &Exec::default());
            assert!(g
                .u
                .iter()
                .chain(&g.cr)
                .chain(&g.keep)
                .all(|x| x.is_finite()));
            assert!((0..4).all(|t| fw.zs[t * 2 * d..(t * 2 + 1) * d].iter().all(|&x| x == 0.0)));
        }
    }
}

fn bits<T: Real>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

fn all_bits<T: Real>(f: &Fwd<T>, g: &Bwd<T>) -> Vec<Vec<u64>> {
    [
        &f.zs, &f.es, &f.gs, &f.g, &f.e, &g.u, &g.z, &g.cr, &g.ci, &g.ar, &g.ai, &g.keep,
    ]
    .iter()
    .map(|x| bits(x))
    .collect()
}

fn run_both<T: Real>(case: &Case, exec: &Exec) -> Vec<Vec<u64>> {
    let a = case.arrays::<T>();
    let fw = run_fwd(case, &a, exec);
    let Shape { k, b, n } = case.shape;
    let gzs: Vec<T> = Rng(9)
        .vec(k * b * 2 * n, -1.0, 1.0)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let g = run_bwd(case, &a, &fw, &gzs, exec);
    all_bits(&fw, &g)
}

/// Same bits from run to run, whatever the number of threads and the instruction set.
#[test]
fn results_are_bit_identical_across_runs_threads_and_kernels() {
    let shape = Shape {
        k: 10,
        b: 70,
        n: 16,
    };
    let case = Case::new(21, shape, true, resets_every(10, 4, 3), 1.0);
    let pools: Vec<rayon::ThreadPool> = [1, 2, 3]
        .iter()
        .map(|&t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    // Every instruction set this CPU has (on x86-64 with AVX-512: all three).
    let kernels = Kernel::available();
    let base32 = run_both::<f32>(&case, &Exec::default());
    let base64 = run_both::<f64>(&case, &Exec::default());
    assert_eq!(base32, run_both::<f32>(&case, &Exec::default()));
    for pool in &pools {
        for &kernel in &kernels {
            let exec = Exec {
                pool: Some(pool),
                kernel,
                ..Exec::default()
            };
            assert_eq!(
                base32,
                run_both::<f32>(&case, &exec),
                "f32 {kernel:?} {pool:?}"
            );
            assert_eq!(
                base64,
                run_both::<f64>(&case, &exec),
                "f64 {kernel:?} {pool:?}"
            );
        }
    }
}

/// The block size groups only the parameters' sums: the forward and the per-stream
/// gradients are the same bits at any block size; the parameters' gradients agree to
/// rounding.
#[test]
fn the_block_size_changes_only_the_rounding_of_the_parameter_sums() {
    let shape = Shape { k: 6, b: 37, n: 8 };
    let case = Case::new(4, shape, true, resets_every(6, 4, 1), 1.0);
    let base = run_both::<f64>(&case, &Exec::default());
    for block in [1, 3, 37, 64] {
        let other = run_both::<f64>(
            &case,
            &Exec {
                block,
                ..Exec::default()
            },
        );
        assert_eq!(
            base[..7],
            other[..7],
            "block {block}: forward, dL/dU, dL/dz"
        );
        for (x, y) in base[7..].iter().zip(&other[7..]) {
            for (a, b) in x.iter().zip(y) {
                let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
                assert!(
                    (a - b).abs() <= 1e-12 * (1.0 + a.abs()),
                    "block {block}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn without_keeps_gradient_the_rest_is_unchanged() {
    let shape = Shape { k: 5, b: 9, n: 4 };
    let case = Case::new(6, shape, false, resets_every(5, 2, 1), 1.0);
    let a = case.arrays::<f64>();
    let fw = run_fwd(&case, &a, &Exec::default());
    let gzs = Rng(2).vec(5 * 9 * 8, -1.0, 1.0);
    let with = run_bwd(&case, &a, &fw, &gzs, &Exec::default());
    let mut without = with.clone();
    let grads = Grads {
        u: &mut without.u,
        z: &mut without.z,
        cr: &mut without.cr,
        ci: &mut without.ci,
        ar: &mut without.ar,
        ai: &mut without.ai,
        keep: None,
    };
    backward(
        &a.window(&case),
        &fw.zs,
        &fw.gs,
        &gzs,
        grads,
        &Exec::default(),
    )
    .unwrap();
    assert_eq!(with, without);
}

#[test]
fn an_empty_window_and_no_streams() {
    let case = Case::new(1, Shape { k: 0, b: 3, n: 2 }, false, vec![], 1.0);
    let a = case.arrays::<f64>();
    let fw = run_fwd(&case, &a, &Exec::default());
    assert_eq!(
        (fw.g.clone(), fw.e.clone()),
        (case.g.clone(), case.e.clone())
    );
    let g = run_bwd(&case, &a, &fw, &[], &Exec::default());
    assert_eq!(g.z, vec![0.0; 12]);
    assert_eq!(g.cr, vec![0.0; 4]);
    let case = Case::new(1, Shape { k: 3, b: 0, n: 2 }, true, vec![false; 3], 1.0);
    let a = case.arrays::<f64>();
    let fw = run_fwd(&case, &a, &Exec::default());
    let g = run_bwd(&case, &a, &fw, &[], &Exec::default());
    assert_eq!(g.keep, vec![0.0; 4]);
}

#[test]
fn bad_arguments_are_named() {
    let case = Case::new(1, Shape { k: 2, b: 3, n: 2 }, false, vec![false; 2], 1.0);
    let mut a = case.arrays::<f64>();
    a.cr.pop();
    let mut f = Fwd {
        zs: vec![0.0; 24],
        es: vec![0.0; 6],
        gs: vec![0.0; 6],
        g: vec![0.0; 3],
        e: vec![0.0; 3],
    };
    // A fresh borrow of the outputs for each call.
    fn out(f: &mut Fwd<f64>) -> ForwardOut<'_, f64> {
        let Fwd { zs, es, gs, g, e } = f;
        ForwardOut { zs, es, gs, g, e }
    }
    let err = forward(&a.window(&case), &a.g, &a.e, out(&mut f), &Exec::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "field loop: cr has 3 elements, expected 4 ([n, n])"
    );
    let a = case.arrays::<f64>();
    let mut w = a.window(&case);
    let keep = [1.0, 1.0];
    w.keep = &keep;
    let err = forward(&w, &a.g, &a.e, out(&mut f), &Exec::default()).unwrap_err();
    assert!(err
        .to_string()
        .contains("keep has 2 elements, expected 1 or 2n = 4"));
    let exec = Exec {
        block: 0,
        ..Exec::default()
    };
    let err = forward(&a.window(&case), &a.g, &a.e, out(&mut f), &exec).unwrap_err();
    assert!(err.to_string().contains("block must be at least 1"));
    f.zs.pop();
    let err = forward(&a.window(&case), &a.g, &a.e, out(&mut f), &Exec::default()).unwrap_err();
    assert!(err.to_string().contains("zs has 23 elements, expected 24"));
}

proptest! {
    // A fixed seed and no failure file: the same cases on every run and machine.
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random shapes, schedules and leaks: the forward against the reference and the
    /// backward against finite differences, in f64. (float32 against the reference is
    /// `forward_matches_the_reference`'s, on well-conditioned windows: where the sum of the
    /// modes comes near 0, phase sync amplifies float32 rounding, whatever the code.)
    #[test]
    fn random_windows(
        k in 1usize..7,
        b in 1usize..40,
        n in 1usize..10,
        per_mode in any::<bool>(),
        resets in proptest::collection::vec(any::<bool>(), 7),
        max_rms in 0.3f64..5.0,
        seed in any::<u64>(),
    ) {
        let case = Case::new(seed, Shape { k, b, n }, per_mode, resets[..k].to_vec(), max_rms);
        compare_forward::<f64>(&case, 1e-12);
        let small = Case::new(seed, Shape { k, b: b.min(4), n }, per_mode, resets[..k].to_vec(), max_rms);
        check_gradients(small, seed ^ 1);
    }
}
