//! The activations of the float-weight tiles: each row converted to the weights' vec_dot type
//! (f32, f16 or bf16, as ggml does) and widened back to f32 once per call (exact), zero-padded
//! to a multiple of 8 values, for every thread to read.

use std::mem::MaybeUninit;

use crate::kernels::blocks::half::fp16_to_f32;
#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::simd_active;
use crate::kernels::formats::ActFormat;
use crate::kernels::operand::{Converted, PARALLEL_CONVERT_MIN};
use crate::kernels::pool;

/// Where the widened rows start in their buffer: on a cache line, so that no 32-byte load of
/// the tiles straddles two (the allocator's 16-byte alignment split half of them).
const ROWS_ALIGN: usize = 64;

/// The activations of `act` (converted to the weight type's vec_dot type: f32, f16 or bf16)
/// widened to f32 rows of `k` rounded up to 8, zero-padded, [`widened_row_bytes`] apart: a
/// [`Converted`] of format F32 whose rows start at [`widened`]. Converting in the tile instead
/// (`vcvtph2ps` on both operands at every step) cost half the FMA rate on an AVX2-only Zen 3
/// VM: one thread, 2816 × 1024 × 256, 15.2 GFLOP/s converting in registers, 29.6 from widened
/// rows.
pub fn widen_activations(act: &Converted, fmt: ActFormat, k: usize) -> Converted {
    build(act.rows, k, 1, |r0, out| {
        for (r, dst) in out.chunks_exact_mut(widened_row_bytes(k)).enumerate() {
            let src = act.row(r0 + r);
            widen_row(fmt, src, k, dst);
        }
    })
}

/// [`widen_activations`] of the conversion of float32 rows `x`, without the converted
/// intermediate: each row converted and widened in turn, the rows split over up to `threads`.
pub fn widen_rows(fmt: ActFormat, x: &[f32], k: usize, threads: usize) -> Converted {
    let threads = if x.len() < PARALLEL_CONVERT_MIN {
        1
    } else {
        threads
    };
    build(x.len() / k, k, threads, |r0, out| {
        let mut tmp = vec![0u8; fmt.row_bytes(k)];
        for (r, dst) in out.chunks_exact_mut(widened_row_bytes(k)).enumerate() {
            fmt.convert_row(&x[(r0 + r) * k..(r0 + r + 1) * k], &mut tmp);
            widen_row(fmt, &tmp, k, dst);
        }
    })
}

/// `rows` widened rows of `k` values, filled by `fill(first row, its rows' bytes)` over up to
/// `threads` threads. Not zeroed first (`fill` writes every byte of its rows): zeroing the
/// buffer cost a tenth of a 256 × 1024 × 256 call on two threads.
fn build(
    rows: usize,
    k: usize,
    threads: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<u8>]) + Sync,
) -> Converted {
    let row_bytes = widened_row_bytes(k);
    let len = rows * row_bytes + ROWS_ALIGN;
    let mut data: Vec<u8> = Vec::with_capacity(len);
    let room = &mut data.spare_capacity_mut()[..len];
    let start = (room.as_ptr() as usize).wrapping_neg() % ROWS_ALIGN;
    let (head, rest) = room.split_at_mut(start);
    let (body, tail) = rest.split_at_mut(rows * row_bytes);
    head.fill(MaybeUninit::new(0));
    tail.fill(MaybeUninit::new(0));
    if threads < 2 || rows < 2 {
        fill(0, body);
    } else {
        let per = rows.div_ceil(threads);
        let parts: Vec<(usize, &mut [MaybeUninit<u8>])> = body
            .chunks_mut(per * row_bytes)
            .enumerate()
            .map(|(i, c)| (i * per, c))
            .collect();
        pool::for_each(threads, parts, |_, (r0, out)| fill(r0, out));
    }
    // SAFETY: every byte of `len` was written: the head and tail above, the body by `fill`.
    unsafe { data.set_len(len) };
    Converted {
        data,
        row_bytes,
        rows,
    }
}

/// Bytes from one widened row to the next: at least `k` rounded up to 8 f32s, whole lines,
/// an odd count of them. The tiles keep a slice of every row in L2; rows a power of two
/// apart (K = 1024: 4 KiB) fell into a sixteenth of L2's sets and evicted one another.
pub(crate) fn widened_row_bytes(k: usize) -> usize {
    let lines = (k.next_multiple_of(8) * 4).div_ceil(64);
    (lines | 1) * 64
}

/// The rows of a [`widen_activations`] result (`rows × row_bytes` bytes, line-aligned).
pub(crate) fn widened(act: &Converted) -> &[u8] {
    let start = (act.data.as_ptr() as usize).wrapping_neg() % ROWS_ALIGN;
    &act.data[start..start + act.rows * act.row_bytes]
}

/// One converted row `src` (f16, bf16 or f32 bytes, `k` values) widened into every byte of
/// `dst`: `k` float32 values, then zeros.
fn widen_row(fmt: ActFormat, src: &[u8], k: usize, dst: &mut [MaybeUninit<u8>]) {
    let (vals, pad) = dst.split_at_mut(k * 4);
    pad.fill(MaybeUninit::new(0));
    #[cfg(target_arch = "x86_64")]
    if simd_active() {
        // SAFETY: AVX2 and F16C checked.
        return unsafe { widen_simd(fmt, src, vals) };
    }
    for (i, d) in vals.chunks_exact_mut(4).enumerate() {
        for (d, b) in d.iter_mut().zip(element(fmt, src, i).to_le_bytes()) {
            d.write(b);
        }
    }
}

/// [`widen_row`]'s values eight at a time (a scalar f16 conversion per value cost a fifth of
/// a 256 × 1024 × 256 call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_simd(fmt: ActFormat, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
    use std::arch::x86_64::*;
    let n = dst.len() / 4;
    let width = fmt.block_bytes();
    assert!(src.len() >= n * width);
    let out = dst.as_mut_ptr() as *mut f32;
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        let p = src.as_ptr().add(i * width);
        let v = match fmt {
            ActFormat::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            ActFormat::BF16 => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
            _ => _mm256_loadu_ps(p as *const f32),
        };
        _mm256_storeu_ps(out.add(i), v);
    }
    for i in whole..n {
        out.add(i).write_unaligned(element(fmt, src, i));
    }
}

/// Value `i` of a converted row `b` (f16, bf16 or f32 bytes) as f32 (exact).
#[inline(always)]
pub(crate) fn element(fmt: ActFormat, b: &[u8], i: usize) -> f32 {
    match fmt {
        ActFormat::F16 => fp16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
        ActFormat::BF16 => {
            f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
        }
        _ => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
    }
}
