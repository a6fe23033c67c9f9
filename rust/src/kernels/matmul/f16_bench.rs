//! f16 decode timings (ignored tests, run by hand): the 336 M model's f16 layer shapes, one
//! activation row, against a two-thread pure-read loop over the same bytes.

use super::plan::{matmul_quant, Order};
use crate::kernels::pool;
use std::time::Instant;

const GGML: Order = Order::Ggml { llamafile: false };

/// (rows, K) of one layer's f16 matrices.
const LAYER: [(usize, usize); 7] = [
    (1024, 1024),
    (256, 1024),
    (256, 1024),
    (1024, 1024),
    (2816, 1024),
    (2816, 1024),
    (1024, 2816),
];

struct Mat {
    m: usize,
    k: usize,
    w: Vec<u8>,
}

fn mats(layers: usize, shapes: &[(usize, usize)]) -> Vec<Mat> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::new();
    for _ in 0..layers {
        for &(m, k) in shapes {
            let mut w = vec![0u8; m * k * 2];
            for c in w.chunks_exact_mut(8) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // normal f16 values of either sign, around 2^-3..2^0
                let v = s & 0x83ff_83ff_83ff_83ff | 0x3000_3000_3000_3000;
                c.copy_from_slice(&v.to_le_bytes());
            }
            out.push(Mat { m, k, w });
        }
    }
    out
}

fn bytes(ms: &[Mat]) -> usize {
    ms.iter().map(|m| m.w.len()).sum()
}

/// Every byte of `b` read with AVX2 loads (a dependent OR keeps the loads).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let p = b.as_ptr();
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut i = 0;
    while i + 128 <= b.len() {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_or_si256(*a, _mm256_loadu_si256(p.add(i + 32 * j) as *const __m256i));
        }
        i += 128;
    }
    let r = _mm256_or_si256(
        _mm256_or_si256(acc[0], acc[1]),
        _mm256_or_si256(acc[2], acc[3]),
    );
    _mm256_extract_epi64::<0>(r) as u64
}

/// The pure-read roofline: `threads` threads, each reading its contiguous part of every matrix,
/// one job for the whole pass (no per-matrix sync).
fn roof(ms: &[Mat], threads: usize) -> f64 {
    let t = Instant::now();
    pool::run(threads, threads, &|i| {
        let mut x = 0;
        for m in ms {
            let per = m.w.len().div_ceil(threads).next_multiple_of(128);
            let lo = (i * per).min(m.w.len());
            let hi = ((i + 1) * per).min(m.w.len());
            // SAFETY: AVX2 present on the benchmark host
            x |= unsafe { read(&m.w[lo..hi]) };
        }
        std::hint::black_box(x);
    });
    t.elapsed().as_secs_f64()
}

/// The same read with one pool job per matrix (the per-call sync a matmul pays).
fn roof_each(ms: &[Mat], threads: usize) -> f64 {
    let t = Instant::now();
    for m in ms {
        pool::run(threads, threads, &|i| {
            let per = m.w.len().div_ceil(threads).next_multiple_of(128);
            let lo = (i * per).min(m.w.len());
            let hi = ((i + 1) * per).min(m.w.len());
            // SAFETY: as in `roof`
            std::hint::black_box(unsafe { read(&m.w[lo..hi]) });
        });
    }
    t.elapsed().as_secs_f64()
}

fn matmul_pass(ms: &[Mat], x: &[Vec<f32>], n: usize, threads: usize) -> f64 {
    typed_pass(1, ms, x, n, threads)
}

/// [`matmul_pass`] with the bytes read as ggml type `ty` (f16 or bf16).
fn typed_pass(ty: u32, ms: &[Mat], x: &[Vec<f32>], n: usize, threads: usize) -> f64 {
    let t = Instant::now();
    for m in ms {
        let mut out = vec![0.0f32; n * m.m];
        let xs = &x[if m.k == 1024 { 0 } else { 1 }];
        matmul_quant(
            ty,
            &m.w,
            2 * m.k,
            m.m,
            m.k,
            &xs[..n * m.k],
            &mut out,
            threads,
            GGML,
        )
        .unwrap();
        std::hint::black_box(&out);
    }
    t.elapsed().as_secs_f64()
}

fn report(name: &str, gb: f64, secs: &mut [f64]) {
    secs.sort_by(f64::total_cmp);
    let med = secs[secs.len() / 2];
    println!(
        "{name:>24}: best {:6.2} GB/s  median {:6.2} GB/s",
        gb / secs[0],
        gb / med
    );
}

fn run_set(ms: &[Mat], reps: usize) {
    let gb = bytes(ms) as f64 / 1e9;
    let x = [
        crate::kernels::test_util::noise(1, 2 * 4096),
        crate::kernels::test_util::noise(2, 2 * 4096),
    ];
    println!("{:.1} MB per pass", gb * 1e3);
    let names = [
        "roof 2t",
        "roof 1t",
        "mm n1 2t",
        "mm n1 1t",
        "mm n2 2t",
        "mm n2 1t",
        "avx2 n1 2t",
        "avx2 n1 1t",
        "avx2 n2 2t",
        "avx2 n2 1t",
    ];
    let mut t = vec![Vec::new(); names.len()];
    for _ in 0..reps {
        t[0].push(roof(ms, 2));
        t[1].push(roof(ms, 1));
        for (v, avx512) in [(2, true), (6, false)] {
            crate::kernels::cpu::set_avx512(avx512);
            t[v].push(matmul_pass(ms, &x, 1, 2));
            t[v + 1].push(matmul_pass(ms, &x, 1, 1));
            t[v + 2].push(matmul_pass(ms, &x, 2, 2));
            t[v + 3].push(matmul_pass(ms, &x, 2, 1));
        }
        crate::kernels::cpu::set_avx512(true);
    }
    for (n, s) in names.iter().zip(&mut t) {
        report(n, gb, s);
    }
}

#[test]
#[ignore]
fn f16_decode_336m() {
    let ms = mats(24, &LAYER);
    run_set(&ms, 7);
}

#[test]
#[ignore]
fn f16_decode_large() {
    let ms = mats(4, &[(11008, 4096)]);
    run_set(&ms, 5);
}

#[test]
#[ignore]
fn f16_profile() {
    let ms = mats(24, &LAYER);
    let x = [
        crate::kernels::test_util::noise(1, 2 * 4096),
        crate::kernels::test_util::noise(2, 2 * 4096),
    ];
    let threads: usize = std::env::var("T").map_or(1, |v| v.parse().unwrap());
    let n: usize = std::env::var("N").map_or(1, |v| v.parse().unwrap());
    for _ in 0..40 {
        matmul_pass(&ms, &x, n, threads);
    }
}

#[cfg(target_arch = "x86_64")]
mod exp {
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn reduce8(v: &[__m256; 8]) -> __m256 {
        let halves = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        };
        let w1 = _mm256_hadd_ps(halves(v[0], v[1]), halves(v[2], v[3]));
        let w2 = _mm256_hadd_ps(halves(v[4], v[5]), halves(v[6], v[7]));
        let mixed = _mm256_hadd_ps(w1, w2);
        _mm256_permutevar8x32_ps(mixed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Rows `0..m` (a multiple of 8) in eights, `S` rows streamed side by side, prefetching
    /// `PF` bytes ahead of each stream (0: none; NT: non-temporal hint).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // streams and lanes side by side
    pub unsafe fn rows<const S: usize, const PF: usize, const NT: bool>(
        w: *const u8,
        stride: usize,
        m: usize,
        k: usize,
        x: *const f32,
        out: *mut f32,
    ) {
        for g in (0..m).step_by(8) {
            let mut red = [_mm256_setzero_ps(); 8];
            for b in (0..8).step_by(S) {
                let wp: [*const u8; S] = std::array::from_fn(|s| w.add((g + b + s) * stride));
                let mut acc = [[_mm256_setzero_ps(); 4]; S];
                let mut i = 0;
                while i < k {
                    for s in 0..S {
                        if PF > 0 {
                            let p = wp[s].add(2 * i + PF) as *const i8;
                            if NT {
                                _mm_prefetch::<_MM_HINT_NTA>(p);
                            } else {
                                _mm_prefetch::<_MM_HINT_T0>(p);
                            }
                        }
                        for j in 0..4 {
                            let a = _mm256_cvtph_ps(_mm_loadu_si128(
                                wp[s].add(2 * (i + 8 * j)) as *const __m128i
                            ));
                            acc[s][j] =
                                _mm256_fmadd_ps(a, _mm256_loadu_ps(x.add(i + 8 * j)), acc[s][j]);
                        }
                    }
                    i += 32;
                }
                for s in 0..S {
                    let a = &acc[s];
                    red[b + s] =
                        _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
                }
            }
            _mm256_storeu_ps(out.add(g), reduce8(&red));
        }
    }
}

type ExpFn = unsafe fn(*const u8, usize, usize, usize, *const f32, *mut f32);

fn exp_pass(ms: &[Mat], x: &[Vec<f32>], f: ExpFn, outs: &mut [Vec<f32>]) -> f64 {
    let t = Instant::now();
    for (m, o) in ms.iter().zip(outs.iter_mut()) {
        let xs = &x[if m.k == 1024 { 0 } else { 1 }];
        // SAFETY: AVX2/FMA/F16C host; sizes as built by `mats`
        unsafe { f(m.w.as_ptr(), 2 * m.k, m.m, m.k, xs.as_ptr(), o.as_mut_ptr()) };
    }
    t.elapsed().as_secs_f64()
}

#[test]
#[ignore]
fn f16_exp_1t() {
    use exp::rows;
    let ms = mats(24, &LAYER);
    let gb = bytes(&ms) as f64 / 1e9;
    // f16-rounded activations: the widened values the kernels see
    let x: Vec<Vec<f32>> = (1..3)
        .map(|s| {
            crate::kernels::test_util::noise(s, 2 * 4096)
                .iter()
                .map(|&v| {
                    crate::kernels::blocks::half::fp16_to_f32(
                        crate::kernels::blocks::half::f32_to_fp16(v),
                    )
                })
                .collect()
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = ms.iter().map(|m| vec![0.0; m.m]).collect();
    // bits against the production path
    for (m, o) in ms.iter().take(7).zip(&mut outs) {
        let xs = &x[if m.k == 1024 { 0 } else { 1 }];
        let mut want = vec![0.0f32; m.m];
        matmul_quant(1, &m.w, 2 * m.k, m.m, m.k, &xs[..m.k], &mut want, 1, GGML).unwrap();
        unsafe {
            rows::<2, 0, false>(m.w.as_ptr(), 2 * m.k, m.m, m.k, xs.as_ptr(), o.as_mut_ptr())
        };
        assert!(want
            .iter()
            .zip(o.iter())
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    let variants: Vec<(&str, ExpFn)> = vec![
        ("S1 pf3072", rows::<1, 3072, false>),
        ("S1 nopf", rows::<1, 0, false>),
        ("S1 pf1024", rows::<1, 1024, false>),
        ("S1 pf6144", rows::<1, 6144, false>),
        ("S1 nta3072", rows::<1, 3072, true>),
        ("S2 nopf", rows::<2, 0, false>),
        ("S2 pf1536", rows::<2, 1536, false>),
        ("S4 nopf", rows::<4, 0, false>),
        ("S4 pf768", rows::<4, 768, false>),
        ("S8 nopf", rows::<8, 0, false>),
    ];
    let mut t = vec![Vec::new(); variants.len() + 2];
    for _ in 0..7 {
        t[0].push(roof(&ms, 1));
        t[1].push(matmul_pass(&ms, &x, 1, 1));
        for (v, (_, f)) in variants.iter().enumerate() {
            t[v + 2].push(exp_pass(&ms, &x, *f, &mut outs));
        }
    }
    report("roof 1t", gb, &mut t[0]);
    report("mm n1 1t", gb, &mut t[1]);
    for (v, (n, _)) in variants.iter().enumerate() {
        report(n, gb, &mut t[v + 2]);
    }
}

/// [`exp_pass`] over `threads` pool threads, chunks of `chunk` rows claimed in turn (0: one
/// contiguous part per thread).
fn exp_pass_mt(
    ms: &[Mat],
    x: &[Vec<f32>],
    f: ExpFn,
    outs: &mut [Vec<f32>],
    threads: usize,
    chunk: usize,
) -> f64 {
    let t = Instant::now();
    for (m, o) in ms.iter().zip(outs.iter_mut()) {
        let xs = &x[if m.k == 1024 { 0 } else { 1 }];
        let per = if chunk == 0 {
            m.m.div_ceil(threads).next_multiple_of(8)
        } else {
            chunk
        };
        let (wp, op, xp) = (
            m.w.as_ptr() as usize,
            o.as_mut_ptr() as usize,
            xs.as_ptr() as usize,
        );
        pool::run(threads, m.m.div_ceil(per), &|i| {
            let first = i * per;
            let rows = per.min(m.m - first);
            // SAFETY: as in `exp_pass`; tasks own disjoint rows
            unsafe {
                f(
                    (wp as *const u8).add(first * 2 * m.k),
                    2 * m.k,
                    rows,
                    m.k,
                    xp as *const f32,
                    (op as *mut f32).add(first),
                )
            };
        });
    }
    t.elapsed().as_secs_f64()
}

#[test]
#[ignore]
fn f16_exp_2t() {
    use exp::rows;
    let ms = mats(24, &LAYER);
    let gb = bytes(&ms) as f64 / 1e9;
    let x = [
        crate::kernels::test_util::noise(1, 2 * 4096),
        crate::kernels::test_util::noise(2, 2 * 4096),
    ];
    let mut outs: Vec<Vec<f32>> = ms.iter().map(|m| vec![0.0; m.m]).collect();
    let variants: Vec<(&str, ExpFn, usize)> = vec![
        ("pf3072 c64", rows::<1, 3072, false>, 64),
        ("nopf c64", rows::<1, 0, false>, 64),
        ("pf3072 halves", rows::<1, 3072, false>, 0),
        ("nopf halves", rows::<1, 0, false>, 0),
        ("nopf c128", rows::<1, 0, false>, 128),
        ("nopf c256", rows::<1, 0, false>, 256),
    ];
    let mut t = vec![Vec::new(); variants.len() + 3];
    for _ in 0..7 {
        t[0].push(roof(&ms, 2));
        t[1].push(roof_each(&ms, 2));
        t[2].push(matmul_pass(&ms, &x, 1, 2));
        for (v, (_, f, c)) in variants.iter().enumerate() {
            t[v + 3].push(exp_pass_mt(&ms, &x, *f, &mut outs, 2, *c));
        }
    }
    report("roof 2t", gb, &mut t[0]);
    report("roof_each 2t", gb, &mut t[1]);
    report("mm n1 2t", gb, &mut t[2]);
    for (v, (n, _, _)) in variants.iter().enumerate() {
        report(n, gb, &mut t[v + 3]);
    }
}

/// Cache-resident weights (the kernels' compute bound, not memory's).
#[test]
#[ignore]
fn f16_decode_hot() {
    let ms = mats(8, &[(256, 1024)]);
    run_set(&ms, 30);
}

/// bf16 decode (vec_dot rows) over the same bytes, next to f16.
#[test]
#[ignore]
fn bf16_decode_336m() {
    let ms = mats(24, &LAYER);
    let gb = bytes(&ms) as f64 / 1e9;
    let x = [
        crate::kernels::test_util::noise(1, 2 * 4096),
        crate::kernels::test_util::noise(2, 2 * 4096),
    ];
    let names = [
        "roof 1t",
        "roof 2t",
        "f16 n1 1t",
        "bf16 n1 1t",
        "f16 n1 2t",
        "bf16 n1 2t",
    ];
    let mut t = vec![Vec::new(); names.len()];
    for _ in 0..5 {
        t[0].push(roof(&ms, 1));
        t[1].push(roof(&ms, 2));
        t[2].push(typed_pass(1, &ms, &x, 1, 1));
        t[3].push(typed_pass(30, &ms, &x, 1, 1));
        t[4].push(typed_pass(1, &ms, &x, 1, 2));
        t[5].push(typed_pass(30, &ms, &x, 1, 2));
    }
    for (n, s) in names.iter().zip(&mut t) {
        report(n, gb, s);
    }
}
