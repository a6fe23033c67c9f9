//! The FMA throughput one core really reaches (a virtual machine's reported clock is often not
//! the one it runs at): `fma_probe ROUNDS THREADS` runs THREADS threads at once, each running
//! independent 8-lane FMAs for ROUNDS rounds of 12 (more chains than the FMA latency × pipes
//! needs), and prints each thread's float32 operations per second, one a line; `none` without
//! AVX2/FMA. Built and run by `engine_machine.py` (`rustc -O`).

use std::time::Instant;

fn fma_flops(rounds: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        let t0 = Instant::now();
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

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a count"));
    let rounds = args.next().unwrap_or(50_000_000);
    let threads = args.next().unwrap_or(1).max(1);
    let found: Vec<Option<f64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads).map(|_| s.spawn(|| fma_flops(rounds))).collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for f in found {
        match f {
            Some(f) => println!("{f}"),
            None => println!("none"),
        }
    }
}
