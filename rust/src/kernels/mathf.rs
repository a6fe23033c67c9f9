//! float32 functions as the reference's C library computes them where that differs from the
//! host's: glibc 2.41 (the reference environment) takes `tanhf` from CORE-MATH, correctly
//! rounded, while older hosts' `tanhf` (2.36) differs from it on ~23% of arguments. The double
//! result rounded once is correctly rounded except within a float64 ulp of a float32 midpoint.

/// `tanhf(x)` correctly rounded.
#[inline]
pub fn tanhf(x: f32) -> f32 {
    (x as f64).tanh() as f32
}
