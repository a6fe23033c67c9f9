//! What the kernels know about a format before computing anything: the activation formats
//! (ggml's vec_dot types) and, per supported weight type, its block and activation format.

/// The activation formats (ggml's vec_dot types) the dot products consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    Q8_0,
    Q8_1,
    Q8K,
    F16,
    BF16,
    F32,
}

impl ActFormat {
    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q8K => 256,
            Self::F16 | Self::BF16 | Self::F32 => 1,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q8K => 292,
            Self::F16 | Self::BF16 => 2,
            Self::F32 => 4,
        }
    }

    /// Bytes of one converted row of `k` values (`k` a multiple of [`Self::block`]).
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block() * self.block_bytes()
    }
}

/// What a kernel needs to know about one weight type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    pub block: usize,
    pub block_bytes: usize,
    pub act: ActFormat,
}

/// Block facts of a supported weight type (ggml type id), `None` when unsupported. Each
/// type's row dot ([`crate::kernels::dot::by_type`]) states the same facts (a test compares).
pub fn type_info(type_id: u32) -> Option<TypeInfo> {
    use ActFormat::{Q8K, Q8_0, Q8_1};
    let (block, block_bytes, act) = match type_id {
        0 => (1, 4, ActFormat::F32),
        1 => (1, 2, ActFormat::F16),
        2 => (32, 18, Q8_0),   // Q4_0
        3 => (32, 20, Q8_1),   // Q4_1
        6 => (32, 22, Q8_0),   // Q5_0
        7 => (32, 24, Q8_1),   // Q5_1
        8 => (32, 34, Q8_0),   // Q8_0
        10 => (256, 84, Q8K),  // Q2_K
        11 => (256, 110, Q8K), // Q3_K
        12 => (256, 144, Q8K), // Q4_K
        13 => (256, 176, Q8K), // Q5_K
        14 => (256, 210, Q8K), // Q6_K
        20 => (32, 18, Q8_0),  // IQ4_NL
        23 => (256, 136, Q8K), // IQ4_XS
        30 => (1, 2, ActFormat::BF16),
        39 => (32, 17, Q8_0), // MXFP4
        _ => return None,
    };
    Some(TypeInfo {
        block,
        block_bytes,
        act,
    })
}
