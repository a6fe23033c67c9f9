//! The 296-byte packed little-endian `rpc_tensor` (spec §4): a plain value type with an exact
//! byte codec. Decoding performs no validation; `types::type_info` and `region` do that.

use crate::errors::TensorError;
use crate::types;

pub const RPC_TENSOR_SIZE: usize = 296;
pub const GGML_MAX_DIMS: usize = 4;
pub const GGML_MAX_SRC: usize = 10;
pub const GGML_MAX_OP_PARAMS: usize = 64;
pub const GGML_MAX_NAME: usize = 64;

// Field offsets (spec §4).
const OFF_ID: usize = 0;
const OFF_TYPE: usize = 8;
const OFF_BUFFER: usize = 12;
const OFF_NE: usize = 20;
const OFF_NB: usize = 36;
const OFF_OP: usize = 52;
const OFF_OP_PARAMS: usize = 56;
const OFF_FLAGS: usize = 120;
const OFF_SRC: usize = 124;
const OFF_VIEW_SRC: usize = 204;
const OFF_VIEW_OFFS: usize = 212;
const OFF_DATA: usize = 220;
const OFF_NAME: usize = 228;
const OFF_USE_COUNT: usize = 292;

/// One `rpc_tensor`. `op_params` and `name` keep their raw bytes so encode(decode(b)) == b.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RpcTensor {
    pub id: u64,
    pub type_id: u32,
    pub buffer: u64,
    pub ne: [u32; GGML_MAX_DIMS],
    pub nb: [u32; GGML_MAX_DIMS],
    pub op: u32,
    pub op_params: [u8; GGML_MAX_OP_PARAMS],
    pub flags: i32,
    pub src: [u64; GGML_MAX_SRC],
    pub view_src: u64,
    pub view_offs: u64,
    pub data: u64,
    pub name: [u8; GGML_MAX_NAME],
    pub use_count: i32,
}

impl Default for RpcTensor {
    /// The null tensor: 296 zero bytes.
    fn default() -> Self {
        Self {
            id: 0,
            type_id: 0,
            buffer: 0,
            ne: [0; GGML_MAX_DIMS],
            nb: [0; GGML_MAX_DIMS],
            op: 0,
            op_params: [0; GGML_MAX_OP_PARAMS],
            flags: 0,
            src: [0; GGML_MAX_SRC],
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: [0; GGML_MAX_NAME],
            use_count: 0,
        }
    }
}

fn rd<const N: usize>(b: &[u8; RPC_TENSOR_SIZE], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[off..off + N]);
    out
}

fn rd_u32(b: &[u8; RPC_TENSOR_SIZE], off: usize) -> u32 {
    u32::from_le_bytes(rd(b, off))
}

fn rd_u64(b: &[u8; RPC_TENSOR_SIZE], off: usize) -> u64 {
    u64::from_le_bytes(rd(b, off))
}

fn wr(b: &mut [u8; RPC_TENSOR_SIZE], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

impl RpcTensor {
    /// Decode one tensor from exactly 296 bytes. Infallible: every bit pattern is a tensor.
    pub fn decode(b: &[u8; RPC_TENSOR_SIZE]) -> Self {
        Self {
            id: rd_u64(b, OFF_ID),
            type_id: rd_u32(b, OFF_TYPE),
            buffer: rd_u64(b, OFF_BUFFER),
            ne: std::array::from_fn(|i| rd_u32(b, OFF_NE + 4 * i)),
            nb: std::array::from_fn(|i| rd_u32(b, OFF_NB + 4 * i)),
            op: rd_u32(b, OFF_OP),
            op_params: rd(b, OFF_OP_PARAMS),
            flags: i32::from_le_bytes(rd(b, OFF_FLAGS)),
            src: std::array::from_fn(|i| rd_u64(b, OFF_SRC + 8 * i)),
            view_src: rd_u64(b, OFF_VIEW_SRC),
            view_offs: rd_u64(b, OFF_VIEW_OFFS),
            data: rd_u64(b, OFF_DATA),
            name: rd(b, OFF_NAME),
            use_count: i32::from_le_bytes(rd(b, OFF_USE_COUNT)),
        }
    }

    /// Decode the tensor at `offset` of `data`; fails when fewer than 296 bytes remain.
    pub fn decode_at(data: &[u8], offset: usize) -> Result<Self, TensorError> {
        let bytes = offset
            .checked_add(RPC_TENSOR_SIZE)
            .and_then(|end| data.get(offset..end))
            .ok_or_else(|| {
                TensorError::new(format!(
                    "need {RPC_TENSOR_SIZE} bytes for rpc_tensor at offset {offset}, buffer has {}",
                    data.len()
                ))
            })?;
        // The slice is exactly RPC_TENSOR_SIZE long, so the conversion cannot fail.
        Ok(Self::decode(bytes.try_into().expect("296-byte slice")))
    }

    /// Decode `count` consecutive tensors starting at `offset`.
    pub fn decode_many(data: &[u8], offset: usize, count: usize) -> Result<Vec<Self>, TensorError> {
        let need = count
            .checked_mul(RPC_TENSOR_SIZE)
            .and_then(|n| n.checked_add(offset))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| {
                TensorError::new(format!(
                    "need {count} rpc_tensors ({RPC_TENSOR_SIZE} bytes each) at offset {offset}, buffer has {}",
                    data.len()
                ))
            })?;
        Ok(data[offset..need]
            .chunks_exact(RPC_TENSOR_SIZE)
            .map(|c| Self::decode(c.try_into().expect("chunks_exact yields 296 bytes")))
            .collect())
    }

    /// The exact 296-byte wire encoding.
    pub fn encode(&self) -> [u8; RPC_TENSOR_SIZE] {
        let mut b = [0u8; RPC_TENSOR_SIZE];
        wr(&mut b, OFF_ID, &self.id.to_le_bytes());
        wr(&mut b, OFF_TYPE, &self.type_id.to_le_bytes());
        wr(&mut b, OFF_BUFFER, &self.buffer.to_le_bytes());
        for i in 0..GGML_MAX_DIMS {
            wr(&mut b, OFF_NE + 4 * i, &self.ne[i].to_le_bytes());
            wr(&mut b, OFF_NB + 4 * i, &self.nb[i].to_le_bytes());
        }
        wr(&mut b, OFF_OP, &self.op.to_le_bytes());
        wr(&mut b, OFF_OP_PARAMS, &self.op_params);
        wr(&mut b, OFF_FLAGS, &self.flags.to_le_bytes());
        for (i, s) in self.src.iter().enumerate() {
            wr(&mut b, OFF_SRC + 8 * i, &s.to_le_bytes());
        }
        wr(&mut b, OFF_VIEW_SRC, &self.view_src.to_le_bytes());
        wr(&mut b, OFF_VIEW_OFFS, &self.view_offs.to_le_bytes());
        wr(&mut b, OFF_DATA, &self.data.to_le_bytes());
        wr(&mut b, OFF_NAME, &self.name);
        wr(&mut b, OFF_USE_COUNT, &self.use_count.to_le_bytes());
        b
    }

    pub fn ne64(&self) -> [u64; GGML_MAX_DIMS] {
        self.ne.map(u64::from)
    }

    pub fn nb64(&self) -> [u64; GGML_MAX_DIMS] {
        self.nb.map(u64::from)
    }

    /// `ggml_nbytes` of this tensor (validates the type).
    pub fn nbytes(&self) -> Result<u64, TensorError> {
        types::nbytes(u64::from(self.type_id), self.ne64(), self.nb64())
    }

    pub fn nelements(&self) -> Result<u64, TensorError> {
        types::nelements(&self.ne64())
    }

    /// The name bytes up to the first NUL (all 64 if there is none).
    pub fn name_bytes(&self) -> &[u8] {
        let end = self
            .name
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(GGML_MAX_NAME);
        &self.name[..end]
    }

    /// Raw 32-bit slot `i` (0..16) of op_params.
    pub fn op_param_bits(&self, i: usize) -> Option<u32> {
        let off = i.checked_mul(4)?;
        let bytes = self.op_params.get(off..off + 4)?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RpcTensor {
        let mut t = RpcTensor {
            id: 0x1122_3344_5566_7788,
            type_id: 8,
            buffer: 0xdead_beef_0000_0001,
            ne: [64, 3, 2, 1],
            nb: [34, 68, 204, 408],
            op: 29,
            flags: -2,
            view_src: 7,
            view_offs: 4096,
            data: 0x5555_0000_1000,
            use_count: 3,
            ..RpcTensor::default()
        };
        for (i, p) in t.op_params.iter_mut().enumerate() {
            *p = i as u8;
        }
        for (i, s) in t.src.iter_mut().enumerate() {
            *s = 100 + i as u64;
        }
        t.name[..5].copy_from_slice(b"attn\0");
        t.name[10] = b'x'; // bytes after the NUL must survive a round trip
        t
    }

    #[test]
    fn layout_offsets() {
        let b = sample().encode();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..12], &8u32.to_le_bytes());
        assert_eq!(&b[12..20], &0xdead_beef_0000_0001u64.to_le_bytes());
        assert_eq!(&b[20..24], &64u32.to_le_bytes());
        assert_eq!(&b[48..52], &408u32.to_le_bytes());
        assert_eq!(&b[52..56], &29u32.to_le_bytes());
        assert_eq!(b[56], 0);
        assert_eq!(b[119], 63);
        assert_eq!(&b[120..124], &(-2i32).to_le_bytes());
        assert_eq!(&b[124..132], &100u64.to_le_bytes());
        assert_eq!(&b[196..204], &109u64.to_le_bytes());
        assert_eq!(&b[204..212], &7u64.to_le_bytes());
        assert_eq!(&b[212..220], &4096u64.to_le_bytes());
        assert_eq!(&b[220..228], &0x5555_0000_1000u64.to_le_bytes());
        assert_eq!(&b[228..233], b"attn\0");
        assert_eq!(&b[292..296], &3i32.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        let t = sample();
        let b = t.encode();
        assert_eq!(RpcTensor::decode(&b), t);
        assert_eq!(RpcTensor::decode(&b).encode(), b);
        let junk: [u8; RPC_TENSOR_SIZE] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        assert_eq!(RpcTensor::decode(&junk).encode(), junk);
        assert_eq!(RpcTensor::default().encode(), [0u8; RPC_TENSOR_SIZE]);
    }

    #[test]
    fn decode_bounds() {
        let b = sample().encode();
        let mut buf = vec![0xAAu8; 3];
        buf.extend_from_slice(&b);
        assert_eq!(RpcTensor::decode_at(&buf, 3).unwrap(), sample());
        assert!(RpcTensor::decode_at(&buf, 4).is_err());
        assert!(RpcTensor::decode_at(&buf[..298], 3).is_err());
        assert!(RpcTensor::decode_at(&buf, usize::MAX).is_err());
        buf.extend_from_slice(&b);
        assert_eq!(RpcTensor::decode_many(&buf, 3, 2).unwrap().len(), 2);
        assert!(RpcTensor::decode_many(&buf, 3, 3).is_err());
        assert!(RpcTensor::decode_many(&buf, 0, usize::MAX).is_err());
        assert!(RpcTensor::decode_many(&buf, 0, 0).unwrap().is_empty());
    }

    #[test]
    fn accessors() {
        let t = sample();
        assert_eq!(t.name_bytes(), b"attn");
        assert_eq!(t.op_param_bits(0), Some(u32::from_le_bytes([0, 1, 2, 3])));
        assert_eq!(
            t.op_param_bits(15),
            Some(u32::from_le_bytes([60, 61, 62, 63]))
        );
        assert_eq!(t.op_param_bits(16), None);
        assert_eq!(t.nbytes().unwrap(), 64 * 34 / 32 + 2 * 68 + 204);
        assert_eq!(t.nelements().unwrap(), 384);
        let full = RpcTensor {
            name: [b'a'; GGML_MAX_NAME],
            ..RpcTensor::default()
        };
        assert_eq!(full.name_bytes().len(), 64);
    }
}
