//! The loop's matrix products, written once over a small vector abstraction ([`Lanes`]) and
//! compiled for three instruction sets: AVX-512F, AVX2 + FMA, and portable code.
//!
//! Why hand-tiled: the products are small ([16 streams, 2n] x [2n, 2n] per RK4 stage), with
//! the right operand (the real form of C) hot in L1. A register tile of 8 rows x 2 vectors
//! with the left operand broadcast from memory and no packing runs the 128 x 64 x 64 f32
//! product at ~185 GFLOP/s on one core of the development machine (AVX-512), against ~160 for
//! faer 0.24, ~75 for matrixmultiply 0.3, ~60 for gemm 0.19 and ~85-95 for torch.mm at one
//! thread (docs/performance.md has the side-by-side run).
//!
//! Why one function per instruction set around the *whole* block: everything a block runs is
//! `#[inline(always)]` into a `#[target_feature]` entry ([`Simd::run`]), so the elementwise
//! loops are vectorised for the same instruction set as the products, chosen at run time.
//!
//! Determinism: a product's every output is one chain of fused multiply-adds over the
//! contraction in index order, whatever the instruction set (the portable code uses
//! `mul_add` too), and the elementwise loops are lane-independent; so the three kernels give
//! bit-identical results (tested).

use crate::real::Real;

/// Which instruction set the loop runs with. `Auto` picks the best the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Kernel {
    #[default]
    Auto,
    /// AVX-512F (x86-64).
    Avx512,
    /// AVX2 and FMA (x86-64).
    Avx2,
    /// Plain Rust, any CPU.
    Portable,
}

impl Kernel {
    /// The instruction sets this CPU can run, best first (always ends with `Portable`).
    pub fn available() -> Vec<Kernel> {
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                out.push(Kernel::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                out.push(Kernel::Avx2);
            }
        }
        out.push(Kernel::Portable);
        out
    }

    /// `Auto` resolved to the best available; any other value if this CPU has it, else None.
    pub fn resolve(self) -> Option<Kernel> {
        let available = Kernel::available();
        match self {
            Kernel::Auto => available.first().copied(),
            k => available.contains(&k).then_some(k),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Auto => "auto",
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }
}

/// One vector register's worth of `T`, and the register tile that fits the instruction
/// set: `MR` rows x [`NV`] vectors of accumulators.
///
/// # Safety
/// The methods are intrinsics: call them only where the instruction set is enabled (inside
/// [`Simd::run`]'s entry for it), on pointers valid for `W` elements.
pub trait Lanes<T>: Copy {
    type V: Copy;
    /// Lanes of a vector.
    const W: usize;
    /// Rows of the register tile.
    const MR: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: T) -> Self::V;
    unsafe fn load(p: *const T) -> Self::V;
    unsafe fn store(p: *mut T, v: Self::V);
    /// `a * b + c`, rounded once.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
}

/// Vectors per row of a register tile (the same for every instruction set: a product's
/// columns come in tiles of `NV * W`).
pub const NV: usize = 2;

/// Work compiled for one instruction set: [`Simd::run`] calls `run::<S>()` inside a
/// `#[target_feature]` function, so an `#[inline(always)]` implementation is vectorised for it.
pub trait Job<T> {
    type Out;
    fn run<S: Lanes<T>>(self) -> Self::Out;
}

/// Run a [`Job`] with a resolved kernel (not `Auto`). Implemented for f32 and f64.
pub trait Simd: Sized {
    /// Columns of a product tile with this kernel (`NV * W`): the loop pads its rows to a
    /// multiple of it.
    fn tile_cols(kernel: Kernel) -> usize;
    fn run<J: Job<Self>>(kernel: Kernel, job: J) -> J::Out;
}

#[derive(Clone, Copy)]
pub struct Portable;

const PW: usize = 4;

macro_rules! portable {
    ($t:ty) => {
        impl Lanes<$t> for Portable {
            type V = [$t; PW];
            const W: usize = PW;
            const MR: usize = 4;
            #[inline(always)]
            unsafe fn zero() -> Self::V {
                [0.0; PW]
            }
            #[inline(always)]
            unsafe fn splat(x: $t) -> Self::V {
                [x; PW]
            }
            #[inline(always)]
            unsafe fn load(p: *const $t) -> Self::V {
                std::ptr::read_unaligned(p as *const [$t; PW])
            }
            #[inline(always)]
            unsafe fn store(p: *mut $t, v: Self::V) {
                std::ptr::write_unaligned(p as *mut [$t; PW], v)
            }
            #[inline(always)]
            unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
                std::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
            }
        }
    };
}
portable!(f32);
portable!(f64);

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    #[derive(Clone, Copy)]
    pub struct Avx512;
    #[derive(Clone, Copy)]
    pub struct Avx2;

    macro_rules! lanes {
        ($isa:ty, $t:ty, $v:ty, $w:expr, $mr:expr, $zero:ident, $set1:ident, $load:ident,
         $store:ident, $fma:ident) => {
            impl Lanes<$t> for $isa {
                type V = $v;
                const W: usize = $w;
                const MR: usize = $mr;
                #[inline(always)]
                unsafe fn zero() -> $v {
                    $zero()
                }
                #[inline(always)]
                unsafe fn splat(x: $t) -> $v {
                    $set1(x)
                }
                #[inline(always)]
                unsafe fn load(p: *const $t) -> $v {
                    $load(p)
                }
                #[inline(always)]
                unsafe fn store(p: *mut $t, v: $v) {
                    $store(p, v)
                }
                #[inline(always)]
                unsafe fn fma(a: $v, b: $v, c: $v) -> $v {
                    $fma(a, b, c)
                }
            }
        };
    }
    // 8 x 2 accumulators (16 of 32 zmm) with AVX-512; 6 x 2 (12 of 16 ymm) with AVX2.
    lanes!(
        Avx512,
        f32,
        __m512,
        16,
        8,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_fmadd_ps
    );
    lanes!(
        Avx512,
        f64,
        __m512d,
        8,
        8,
        _mm512_setzero_pd,
        _mm512_set1_pd,
        _mm512_loadu_pd,
        _mm512_storeu_pd,
        _mm512_fmadd_pd
    );
    lanes!(
        Avx2,
        f32,
        __m256,
        8,
        6,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_fmadd_ps
    );
    lanes!(
        Avx2,
        f64,
        __m256d,
        4,
        6,
        _mm256_setzero_pd,
        _mm256_set1_pd,
        _mm256_loadu_pd,
        _mm256_storeu_pd,
        _mm256_fmadd_pd
    );

    #[target_feature(enable = "avx512f")]
    pub unsafe fn run_avx512<T, J: super::Job<T>>(job: J) -> J::Out
    where
        Avx512: Lanes<T>,
    {
        job.run::<Avx512>()
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn run_avx2<T, J: super::Job<T>>(job: J) -> J::Out
    where
        Avx2: Lanes<T>,
    {
        job.run::<Avx2>()
    }
}

macro_rules! simd {
    ($t:ty) => {
        impl Simd for $t {
            fn tile_cols(kernel: Kernel) -> usize {
                NV * match kernel {
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx512 => <x86::Avx512 as Lanes<$t>>::W,
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx2 => <x86::Avx2 as Lanes<$t>>::W,
                    _ => <Portable as Lanes<$t>>::W,
                }
            }

            fn run<J: Job<Self>>(kernel: Kernel, job: J) -> J::Out {
                match kernel {
                    // SAFETY: the kernel was resolved against the CPU's features
                    // (`Kernel::resolve`), so the instructions exist.
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx512 => unsafe { x86::run_avx512::<$t, J>(job) },
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx2 => unsafe { x86::run_avx2::<$t, J>(job) },
                    Kernel::Portable => job.run::<Portable>(),
                    _ => panic!("Simd::run needs a resolved kernel available here, got {kernel:?}"),
                }
            }
        }
    };
}
simd!(f32);
simd!(f64);

/// One register tile: `C[MR x NV*W] += A[MR x kc] B[kc x NV*W]`, A's element (r, p) at
/// `a + r rsa + p csa`, B's row p at `b + p ldb`, C's row r at `c + r ldc`. Each output is
/// one chain of FMAs over p = 0..kc in order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<T: Real, S: Lanes<T>, const MR: usize>(
    kc: usize,
    a: *const T,
    rsa: usize,
    csa: usize,
    b: *const T,
    ldb: usize,
    c: *mut T,
    ldc: usize,
) {
    let mut acc = [[S::zero(); NV]; MR];
    for (r, row) in acc.iter_mut().enumerate() {
        for (v, x) in row.iter_mut().enumerate() {
            *x = S::load(c.add(r * ldc + v * S::W));
        }
    }
    for p in 0..kc {
        let brow = b.add(p * ldb);
        let mut bv = [S::zero(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = S::load(brow.add(v * S::W));
        }
        let ap = a.add(p * csa);
        for (r, row) in acc.iter_mut().enumerate() {
            let av = S::splat(*ap.add(r * rsa));
            for (x, bx) in row.iter_mut().zip(bv) {
                *x = S::fma(av, bx, *x);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (v, x) in row.iter().enumerate() {
            S::store(c.add(r * ldc + v * S::W), *x);
        }
    }
}

/// Ask for the cache lines of `x` ahead of use: a hint, with no effect on any result (a
/// no-op off x86-64).
#[inline(always)]
pub fn prefetch<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = x.as_ptr() as *const i8;
        let bytes = std::mem::size_of_val(x);
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch never faults, and SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// A strided matrix operand: element (r, p) at `ptr + r rs + p cs`.
#[derive(Clone, Copy)]
pub struct Strided<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

/// `C[m x cols] += A[m x kc] B[kc x cols]` with `cols` a multiple of `NV * S::W`: B's rows
/// at `b + p ldb`, C's at `c + r ldc` (row-major, `cols` readable and writable in each).
///
/// # Safety
/// Every element addressed must be in bounds; C must not overlap A or B; call only where
/// `S`'s instruction set is enabled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<T: Real, S: Lanes<T>>(
    m: usize,
    cols: usize,
    kc: usize,
    a: Strided<T>,
    b: *const T,
    ldb: usize,
    c: *mut T,
    ldc: usize,
) {
    let nr = NV * S::W;
    debug_assert_eq!(cols % nr, 0);
    // Column tiles outermost: each slice of B (kc x nr) is read once from wherever it is
    // (the real form of C is often evicted from L1 by the elementwise passes between
    // stages) and then reused from L1 by every row tile.
    let mut j = 0;
    while j < cols {
        let (bj, cj) = (b.add(j), c.add(j));
        let mut i = 0;
        while i < m {
            let rows = S::MR.min(m - i);
            let (ar, cr) = (a.ptr.add(i * a.rs), cj.add(i * ldc));
            match rows {
                8 => tile::<T, S, 8>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                7 => tile::<T, S, 7>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                6 => tile::<T, S, 6>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                5 => tile::<T, S, 5>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                4 => tile::<T, S, 4>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                3 => tile::<T, S, 3>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                2 => tile::<T, S, 2>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                1 => tile::<T, S, 1>(kc, ar, a.rs, a.cs, bj, ldb, cr, ldc),
                _ => unreachable!("register tiles have 1 to 8 rows"),
            }
            i += rows;
        }
        j += nr;
    }
}
