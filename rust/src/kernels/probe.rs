//! Machine probes for the benchmarks: the FMA throughput one core really reaches (the clock
//! a virtual machine reports is often not the one it runs at).

/// Float32 operations per second of one thread running independent 8-lane FMAs for `rounds`
/// rounds of 12 (more chains than the FMA latency × pipes needs); `None` without AVX2/FMA.
pub fn fma_flops(rounds: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if super::f16vec::use_avx2() {
        let t0 = std::time::Instant::now();
        // SAFETY: features detected.
        let sink = unsafe { fma_rounds(rounds) };
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        return Some((rounds * 12 * 8 * 2) as f64 / dt.max(1e-9));
    }
    let _ = rounds;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_rounds(rounds: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm256_set1_ps(std::hint::black_box(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..rounds {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut s = _mm256_setzero_ps();
    for x in acc {
        s = _mm256_add_ps(s, x);
    }
    _mm_cvtss_f32(_mm256_castps256_ps128(s))
}

#[cfg(test)]
mod tests {
    #[test]
    fn fma_probe_counts_something() {
        if let Some(f) = super::fma_flops(1_000_000) {
            // loose: CI runs this unoptimized (debug), where a slow 2-core VM measured 0.9e9
            assert!(f.is_finite() && f > 1e7, "{f}");
        }
    }
}
