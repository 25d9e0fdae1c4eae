//! [`Real`]: the two float types the loop runs in (f32 for training, f64 for the tests'
//! tight comparisons), with the few operations it needs.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// f32 or f64. Every operation is the IEEE one (`sqrt` and the arithmetic are correctly
/// rounded; `powf` and `exp` are the platform's libm, used only by the gain, which carries
/// no gradient).
pub trait Real:
    crate::simd::Simd
    + Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    /// The nearest value of this type (for f32: rounded once, as torch rounds a Python
    /// float scalar when it multiplies a float32 tensor).
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn sqrt(self) -> Self;
    fn powf(self, e: Self) -> Self;
    /// `self * a + b` rounded once.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The larger of the two; `self` if they compare equal (torch's clamp(min=)).
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
    /// The smaller of the two; `self` if they compare equal (torch's clamp(max=)).
    #[inline(always)]
    fn min(self, other: Self) -> Self {
        if other < self {
            other
        } else {
            self
        }
    }
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
        }
    };
}

real!(f32);
real!(f64);
