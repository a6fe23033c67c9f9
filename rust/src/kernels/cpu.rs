//! CPU feature detection, read once at first use, and the switches that narrow it at run time
//! (tests and A/B runs compare the builds): which instruction sets the kernels may use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The instruction sets this CPU has that the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Detected {
    /// AVX2, FMA and F16C (the SIMD build).
    simd: bool,
    /// AVX-512 F, BW and VNNI.
    avx512_vnni: bool,
}

/// This CPU's features, detected on first use: every kernel call asks, so once is enough.
fn detected() -> Detected {
    static DETECTED: OnceLock<Detected> = OnceLock::new();
    *DETECTED.get_or_init(|| Detected {
        simd: detect_simd(),
        avx512_vnni: detect_avx512_vnni(),
    })
}

static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);

/// Forces the portable build (tests run both paths); also `RPCNET_PORTABLE_KERNELS=1`.
pub fn set_force_portable(on: bool) {
    FORCE_PORTABLE.store(on, Ordering::Relaxed);
}

fn portable_forced() -> bool {
    // The environment is read once: `getenv` on every kernel call showed in prefill profiles.
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    FORCE_PORTABLE.load(Ordering::Relaxed)
        || *FROM_ENV
            .get_or_init(|| std::env::var_os("RPCNET_PORTABLE_KERNELS").is_some_and(|v| v == "1"))
}

static NO_AVX512: AtomicBool = AtomicBool::new(false);

/// Disables (false) or allows (true) the AVX-512 kernels, which otherwise run wherever the CPU
/// has them; also `RPCNET_NO_AVX512=1`. Same bits either way (A/B runs and tests).
pub fn set_avx512(on: bool) {
    NO_AVX512.store(!on, Ordering::Relaxed);
}

/// Whether the AVX-512 VNNI kernels run (on top of the SIMD build) on this CPU right now.
pub fn avx512_vnni_active() -> bool {
    static FROM_ENV: OnceLock<bool> = OnceLock::new();
    let off = NO_AVX512.load(Ordering::Relaxed)
        || *FROM_ENV.get_or_init(|| std::env::var_os("RPCNET_NO_AVX512").is_some_and(|v| v == "1"));
    !off && simd_active() && avx512_vnni_available()
}

fn avx512_vnni_available() -> bool {
    detected().avx512_vnni
}

/// Whether this CPU has every listed x86 feature (never on other architectures).
macro_rules! has_features {
    ($($feature:tt),+) => {{
        #[cfg(target_arch = "x86_64")]
        {
            $(std::arch::is_x86_feature_detected!($feature))&&+
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }};
}

#[cfg(test)] // the exp kernels' tests skip themselves on CPUs without the features
pub(crate) use has_features;

fn detect_avx512_vnni() -> bool {
    has_features!("avx512f", "avx512bw", "avx512vnni")
}

/// Whether calls take the SIMD build on this CPU right now.
pub fn simd_active() -> bool {
    !portable_forced() && simd_available()
}

fn simd_available() -> bool {
    detected().simd
}

fn detect_simd() -> bool {
    has_features!("avx2", "fma", "f16c")
}

static PORTABLE_ONLY: AtomicBool = AtomicBool::new(false);

/// Force the portable paths of the native (non-matmul) kernels, for tests and comparisons.
pub fn set_portable_only(on: bool) {
    PORTABLE_ONLY.store(on, Ordering::Relaxed);
}

/// Whether the AVX2 + FMA + F16C paths may run on this CPU (and are not switched off).
#[inline]
pub fn use_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if PORTABLE_ONLY.load(Ordering::Relaxed) {
            return false;
        }
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
