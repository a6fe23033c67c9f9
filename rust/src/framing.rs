//! Request framing: command ids of both dialects, fixed payload sizes and the header check that
//! runs before any payload byte is read or allocated (spec §1.2, §3, §14).

use crate::errors::FrameError;
use crate::tensor::RPC_TENSOR_SIZE;

/// Protocol dialect; the HELLO request carries no version, so it is per listening port (spec §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    V7,
    V8,
}

pub const PROTO_V7: u32 = 7;
pub const PROTO_V8: u32 = 8;

impl Proto {
    pub fn from_major(major: u64) -> Option<Self> {
        match major {
            7 => Some(Self::V7),
            8 => Some(Self::V8),
            _ => None,
        }
    }

    /// RPC_CMD_NONE of the dialect: the first id that is never a valid request.
    pub fn cmd_none(self) -> u64 {
        match self {
            Self::V7 => 18,
            Self::V8 => 23,
        }
    }
}

/// Every request command; the discriminant is the wire id (identical in v7 for ids 0..=17).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Command {
    AllocBuffer = 0,
    GetAlignment = 1,
    GetMaxSize = 2,
    BufferGetBase = 3,
    FreeBuffer = 4,
    BufferClear = 5,
    SetTensor = 6,
    SetTensorHash = 7,
    GetTensor = 8,
    CopyTensor = 9,
    GraphCompute = 10,
    GetDeviceMemory = 11,
    InitTensor = 12,
    GetAllocSize = 13,
    Hello = 14,
    DeviceCount = 15,
    GraphRecompute = 16,
    MemsetTensor = 17,
    SetTensor2d = 18,
    GetTensor2d = 19,
    CommInit = 20,
    CommAllreduce = 21,
    CommFree = 22,
}

const ALL: [Command; 23] = [
    Command::AllocBuffer,
    Command::GetAlignment,
    Command::GetMaxSize,
    Command::BufferGetBase,
    Command::FreeBuffer,
    Command::BufferClear,
    Command::SetTensor,
    Command::SetTensorHash,
    Command::GetTensor,
    Command::CopyTensor,
    Command::GraphCompute,
    Command::GetDeviceMemory,
    Command::InitTensor,
    Command::GetAllocSize,
    Command::Hello,
    Command::DeviceCount,
    Command::GraphRecompute,
    Command::MemsetTensor,
    Command::SetTensor2d,
    Command::GetTensor2d,
    Command::CommInit,
    Command::CommAllreduce,
    Command::CommFree,
];

/// Request payload size: exactly `Fixed(n)`, or at least `AtLeast(n)` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSize {
    Fixed(u64),
    AtLeast(u64),
}

/// Response payload size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseSize {
    None,
    Fixed(u64),
    /// Depends on the request (GET_TENSOR, GET_TENSOR_2D).
    Variable,
}

const T: u64 = RPC_TENSOR_SIZE as u64;

/// Smallest SET_TENSOR payload: tensor + cache_flag u8 + offset u64.
pub const SET_TENSOR_MIN: u64 = T + 1 + 8;
/// SET_TENSOR_2D / GET_TENSOR_2D header: tensor + offset, size, n_copies, stride (u64 each).
pub const TENSOR_2D_HEADER: u64 = T + 4 * 8;

impl Command {
    /// The command for `id` in dialect `proto`; `None` for NONE/COUNT/out-of-range ids.
    pub fn from_id(proto: Proto, id: u64) -> Option<Self> {
        if id >= proto.cmd_none() {
            return None;
        }
        ALL.get(usize::try_from(id).ok()?).copied()
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::AllocBuffer => "ALLOC_BUFFER",
            Self::GetAlignment => "GET_ALIGNMENT",
            Self::GetMaxSize => "GET_MAX_SIZE",
            Self::BufferGetBase => "BUFFER_GET_BASE",
            Self::FreeBuffer => "FREE_BUFFER",
            Self::BufferClear => "BUFFER_CLEAR",
            Self::SetTensor => "SET_TENSOR",
            Self::SetTensorHash => "SET_TENSOR_HASH",
            Self::GetTensor => "GET_TENSOR",
            Self::CopyTensor => "COPY_TENSOR",
            Self::GraphCompute => "GRAPH_COMPUTE",
            Self::GetDeviceMemory => "GET_DEVICE_MEMORY",
            Self::InitTensor => "INIT_TENSOR",
            Self::GetAllocSize => "GET_ALLOC_SIZE",
            Self::Hello => "HELLO",
            Self::DeviceCount => "DEVICE_COUNT",
            Self::GraphRecompute => "GRAPH_RECOMPUTE",
            Self::MemsetTensor => "MEMSET_TENSOR",
            Self::SetTensor2d => "SET_TENSOR_2D",
            Self::GetTensor2d => "GET_TENSOR_2D",
            Self::CommInit => "COMM_INIT",
            Self::CommAllreduce => "COMM_ALLREDUCE",
            Self::CommFree => "COMM_FREE",
        }
    }

    /// Request payload size (spec §3; GRAPH_RECOMPUTE and the GRAPH_COMPUTE minimum differ in v7).
    pub fn request_size(self, proto: Proto) -> RequestSize {
        use RequestSize::{AtLeast, Fixed};
        match self {
            Self::AllocBuffer => Fixed(12),
            Self::GetAlignment | Self::GetMaxSize | Self::GetDeviceMemory | Self::CommFree => {
                Fixed(4)
            }
            Self::BufferGetBase | Self::FreeBuffer => Fixed(8),
            Self::BufferClear => Fixed(9),
            Self::SetTensor => AtLeast(SET_TENSOR_MIN),
            Self::SetTensorHash | Self::GetTensor => Fixed(T + 16),
            Self::CopyTensor => Fixed(2 * T),
            Self::GraphCompute => match proto {
                Proto::V8 => AtLeast(16),
                Proto::V7 => AtLeast(8),
            },
            Self::InitTensor => Fixed(T),
            Self::GetAllocSize => Fixed(4 + 11 * T),
            Self::Hello => Fixed(24),
            Self::DeviceCount => Fixed(0),
            Self::GraphRecompute => match proto {
                Proto::V8 => Fixed(12),
                Proto::V7 => Fixed(4),
            },
            Self::MemsetTensor => Fixed(T + 17),
            Self::SetTensor2d => AtLeast(TENSOR_2D_HEADER),
            Self::GetTensor2d => Fixed(TENSOR_2D_HEADER),
            Self::CommInit => Fixed(80),
            Self::CommAllreduce => Fixed(4 + T),
        }
    }

    /// Response payload size (spec §3).
    pub fn response_size(self) -> ResponseSize {
        use ResponseSize::{Fixed, None, Variable};
        match self {
            Self::AllocBuffer | Self::GetDeviceMemory => Fixed(16),
            Self::GetAlignment | Self::GetMaxSize | Self::BufferGetBase | Self::GetAllocSize => {
                Fixed(8)
            }
            Self::SetTensorHash | Self::CopyTensor | Self::CommInit => Fixed(1),
            Self::Hello => Fixed(28),
            Self::DeviceCount => Fixed(4),
            Self::GetTensor | Self::GetTensor2d => Variable,
            Self::FreeBuffer
            | Self::BufferClear
            | Self::SetTensor
            | Self::GraphCompute
            | Self::InitTensor
            | Self::GraphRecompute
            | Self::MemsetTensor
            | Self::SetTensor2d
            | Self::CommAllreduce
            | Self::CommFree => None,
        }
    }
}

/// Display name of `cmd` in `proto`, or `UNKNOWN(<id>)`.
pub fn command_name(proto: Proto, cmd: u64) -> String {
    match Command::from_id(proto, cmd) {
        Some(c) => c.name().to_owned(),
        None => format!("UNKNOWN({cmd})"),
    }
}

/// Validate a request header before reading the payload. `max_data` caps SET_TENSOR and
/// SET_TENSOR_2D payloads, `max_graph` caps GRAPH_COMPUTE (the reference has no cap, spec §1.2).
/// HELLO passes here; "first and only once" is the caller's rule.
pub fn check_header(
    proto: Proto,
    cmd: u64,
    size: u64,
    max_data: u64,
    max_graph: u64,
) -> Result<Command, FrameError> {
    let command = Command::from_id(proto, cmd)
        .ok_or_else(|| FrameError::new(cmd, size, format!("unknown command {cmd}")))?;
    let name = command.name();
    match command.request_size(proto) {
        RequestSize::Fixed(n) if size != n => {
            return Err(FrameError::new(
                cmd,
                size,
                format!("{name} payload must be {n} bytes, got {size}"),
            ));
        }
        RequestSize::AtLeast(n) if size < n => {
            return Err(FrameError::new(
                cmd,
                size,
                format!("{name} payload must be at least {n} bytes, got {size}"),
            ));
        }
        _ => {}
    }
    let cap = match command {
        Command::SetTensor | Command::SetTensor2d => Some(max_data),
        Command::GraphCompute => Some(max_graph),
        _ => None,
    };
    if let Some(cap) = cap.filter(|&cap| size > cap) {
        return Err(FrameError::new(
            cmd,
            size,
            format!("{name} payload of {size} bytes exceeds the limit of {cap}"),
        ));
    }
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: u64 = u64::MAX;

    #[test]
    fn ids_round_trip() {
        for (i, c) in ALL.iter().enumerate() {
            assert_eq!(c.id() as usize, i);
            assert_eq!(Command::from_id(Proto::V8, i as u64), Some(*c));
        }
        assert_eq!(Command::from_id(Proto::V8, 23), None);
        assert_eq!(Command::from_id(Proto::V8, 24), None);
        assert_eq!(Command::from_id(Proto::V7, 17), Some(Command::MemsetTensor));
        for id in 18..=22 {
            assert_eq!(Command::from_id(Proto::V7, id), None);
        }
        assert_eq!(Command::from_id(Proto::V8, u64::MAX), None);
    }

    #[test]
    fn names() {
        assert_eq!(command_name(Proto::V8, 6), "SET_TENSOR");
        assert_eq!(command_name(Proto::V8, 18), "SET_TENSOR_2D");
        assert_eq!(command_name(Proto::V7, 18), "UNKNOWN(18)");
        assert_eq!(command_name(Proto::V8, 99), "UNKNOWN(99)");
    }

    #[test]
    fn sizes_from_spec_table() {
        let v8 = |c: Command| c.request_size(Proto::V8);
        assert_eq!(v8(Command::GetAllocSize), RequestSize::Fixed(3260));
        assert_eq!(v8(Command::CopyTensor), RequestSize::Fixed(592));
        assert_eq!(v8(Command::MemsetTensor), RequestSize::Fixed(313));
        assert_eq!(v8(Command::GetTensor), RequestSize::Fixed(312));
        assert_eq!(v8(Command::SetTensor), RequestSize::AtLeast(305));
        assert_eq!(v8(Command::SetTensor2d), RequestSize::AtLeast(328));
        assert_eq!(v8(Command::GetTensor2d), RequestSize::Fixed(328));
        assert_eq!(v8(Command::CommAllreduce), RequestSize::Fixed(300));
        assert_eq!(v8(Command::GraphRecompute), RequestSize::Fixed(12));
        assert_eq!(
            Command::GraphRecompute.request_size(Proto::V7),
            RequestSize::Fixed(4)
        );
        assert_eq!(
            Command::GraphCompute.request_size(Proto::V7),
            RequestSize::AtLeast(8)
        );
        assert_eq!(Command::Hello.response_size(), ResponseSize::Fixed(28));
        assert_eq!(Command::GetTensor2d.response_size(), ResponseSize::Variable);
        assert_eq!(Command::SetTensor.response_size(), ResponseSize::None);
    }

    #[test]
    fn header_fixed_sizes() {
        assert!(check_header(Proto::V8, 15, 0, BIG, BIG).is_ok());
        assert!(check_header(Proto::V8, 15, 1, BIG, BIG).is_err());
        for size in [0, 23, 25] {
            let err = check_header(Proto::V8, 14, size, BIG, BIG).unwrap_err();
            assert_eq!((err.cmd, err.size), (14, size));
        }
        assert!(check_header(Proto::V8, 14, 24, BIG, BIG).is_ok());
        assert!(check_header(Proto::V8, 16, 12, BIG, BIG).is_ok());
        assert!(check_header(Proto::V8, 16, 4, BIG, BIG).is_err());
        assert!(check_header(Proto::V7, 16, 4, BIG, BIG).is_ok());
        assert!(check_header(Proto::V7, 16, 12, BIG, BIG).is_err());
    }

    #[test]
    fn header_unknown_commands() {
        for cmd in [23, 24, 255, 1000] {
            assert!(check_header(Proto::V8, cmd, 0, BIG, BIG).is_err());
        }
        for cmd in 18..=24 {
            assert!(check_header(Proto::V7, cmd, 328, BIG, BIG).is_err());
        }
    }

    #[test]
    fn header_variable_sizes_and_caps() {
        assert!(check_header(Proto::V8, 6, 304, BIG, BIG).is_err());
        assert!(check_header(Proto::V8, 6, 305, BIG, BIG).is_ok());
        assert!(check_header(Proto::V8, 6, 1000, 1000, 0).is_ok());
        assert!(check_header(Proto::V8, 6, 1001, 1000, BIG).is_err());
        assert!(check_header(Proto::V8, 18, 327, BIG, BIG).is_err());
        assert!(check_header(Proto::V8, 18, 329, 328, BIG).is_err());
        assert!(check_header(Proto::V8, 10, 15, BIG, BIG).is_err());
        assert!(check_header(Proto::V8, 10, 16, BIG, 16).is_ok());
        assert!(check_header(Proto::V8, 10, 17, BIG, 16).is_err());
        assert!(check_header(Proto::V7, 10, 8, BIG, BIG).is_ok());
        assert!(check_header(Proto::V7, 10, 7, BIG, BIG).is_err());
        // Caps apply only to their own commands.
        assert!(check_header(Proto::V8, 8, 312, 0, 0).is_ok());
    }
}
