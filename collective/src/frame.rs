//! The data-plane frame header: 32 bytes, little-endian, in front of every payload.
//!
//! ```text
//! 0..2   magic "RL"            2  kind (1 data, 2 abort)   3  collective
//! 4      algorithm             5  dtype                     6  reduce op   7  abort reason
//! 8..16  operation seq number  16..24 operation length (elements)
//! 24..28 payload bytes         28..32 root (data) / rank named by an abort
//! ```
//!
//! Every data frame names the operation it belongs to; the receiver compares it with its own
//! [`OpDesc`] before touching the payload, so ranks running different collectives fail with
//! [`CollectiveError::Mismatch`] instead of exchanging garbage. Abort frames are header-only
//! so a watcher can read them without ever losing stream position.

use crate::error::{AbortReason, Algorithm, CollKind, CollectiveError, DType, OpDesc, ReduceOp};

/// Size of the header in bytes.
pub const HEADER_BYTES: usize = 32;
const MAGIC: [u8; 2] = *b"RL";

/// Why a generation is aborted, as relayed between ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Abort {
    /// `rank`'s connection was lost.
    PeerLost { rank: usize },
    /// `rank` runs `theirs`, which disagrees with the detecting rank's operation.
    Mismatch { rank: usize, theirs: OpDesc },
    /// `rank` aborted for `reason`.
    Peer { rank: usize, reason: AbortReason },
}

impl Abort {
    /// The error a rank running `ours` returns when it receives this abort.
    pub fn to_error(self, ours: Option<OpDesc>) -> CollectiveError {
        match self {
            Abort::PeerLost { rank } => CollectiveError::PeerLost { rank },
            Abort::Mismatch { rank, theirs } => CollectiveError::Mismatch {
                rank,
                ours: ours.unwrap_or(theirs),
                theirs,
            },
            Abort::Peer { rank, reason } => CollectiveError::PeerAborted { rank, reason },
        }
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Header {
    /// Data of operation `desc`, `payload_bytes` long.
    Data { desc: OpDesc, payload_bytes: u32 },
    /// An abort.
    Abort(Abort),
}

fn kind_code(k: CollKind) -> u8 {
    match k {
        CollKind::Allreduce => 1,
        CollKind::ReduceScatter => 2,
        CollKind::Allgather => 3,
        CollKind::Broadcast => 4,
        CollKind::Barrier => 5,
    }
}
fn kind_from(c: u8) -> Option<CollKind> {
    Some(match c {
        1 => CollKind::Allreduce,
        2 => CollKind::ReduceScatter,
        3 => CollKind::Allgather,
        4 => CollKind::Broadcast,
        5 => CollKind::Barrier,
        _ => return None,
    })
}
fn algo_code(a: Algorithm) -> u8 {
    match a {
        Algorithm::Ring => 1,
        Algorithm::RecursiveDoubling => 2,
        Algorithm::Chain => 3,
        Algorithm::Hierarchical => 4,
    }
}
fn algo_from(c: u8) -> Option<Algorithm> {
    Some(match c {
        1 => Algorithm::Ring,
        2 => Algorithm::RecursiveDoubling,
        3 => Algorithm::Chain,
        4 => Algorithm::Hierarchical,
        _ => return None,
    })
}
fn dtype_code(d: DType) -> u8 {
    match d {
        DType::None => 0,
        DType::U8 => 1,
        DType::F32 => 2,
        DType::F64 => 3,
        DType::F16 => 4,
        DType::Bf16 => 5,
        DType::I32 => 6,
        DType::I64 => 7,
    }
}
fn dtype_from(c: u8) -> Option<DType> {
    Some(match c {
        0 => DType::None,
        1 => DType::U8,
        2 => DType::F32,
        3 => DType::F64,
        4 => DType::F16,
        5 => DType::Bf16,
        6 => DType::I32,
        7 => DType::I64,
        _ => return None,
    })
}
fn op_code(o: Option<ReduceOp>) -> u8 {
    match o {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Avg) => 2,
        Some(ReduceOp::Min) => 3,
        Some(ReduceOp::Max) => 4,
    }
}
fn op_from(c: u8) -> Option<Option<ReduceOp>> {
    Some(match c {
        0 => None,
        1 => Some(ReduceOp::Sum),
        2 => Some(ReduceOp::Avg),
        3 => Some(ReduceOp::Min),
        4 => Some(ReduceOp::Max),
        _ => return None,
    })
}
fn reason_code(r: AbortReason) -> u8 {
    match r {
        AbortReason::Timeout => 1,
        AbortReason::Aborted => 2,
        AbortReason::Protocol => 3,
    }
}
fn reason_from(c: u8) -> Option<AbortReason> {
    Some(match c {
        1 => AbortReason::Timeout,
        2 => AbortReason::Aborted,
        3 => AbortReason::Protocol,
        _ => return None,
    })
}

const ABORT_LOST: u8 = 0x10;
const ABORT_MISMATCH: u8 = 0x11;

fn put_desc(b: &mut [u8; HEADER_BYTES], d: &OpDesc) {
    b[3] = kind_code(d.kind);
    b[4] = algo_code(d.algo);
    b[5] = dtype_code(d.dtype);
    b[6] = op_code(d.op);
    b[8..16].copy_from_slice(&d.seq.to_le_bytes());
    b[16..24].copy_from_slice(&d.len.to_le_bytes());
    b[28..32].copy_from_slice(&d.root.to_le_bytes());
}

fn get_desc(b: &[u8; HEADER_BYTES]) -> Option<OpDesc> {
    Some(OpDesc {
        kind: kind_from(b[3])?,
        algo: algo_from(b[4])?,
        dtype: dtype_from(b[5])?,
        op: op_from(b[6])?,
        seq: u64::from_le_bytes(b[8..16].try_into().ok()?),
        len: u64::from_le_bytes(b[16..24].try_into().ok()?),
        root: u32::from_le_bytes(b[28..32].try_into().ok()?),
    })
}

impl Header {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..2].copy_from_slice(&MAGIC);
        match self {
            Header::Data {
                desc,
                payload_bytes,
            } => {
                b[2] = 1;
                put_desc(&mut b, desc);
                b[24..28].copy_from_slice(&payload_bytes.to_le_bytes());
            }
            Header::Abort(a) => {
                b[2] = 2;
                let (code, rank) = match a {
                    Abort::PeerLost { rank } => (ABORT_LOST, *rank),
                    Abort::Mismatch { rank, theirs } => {
                        put_desc(&mut b, theirs);
                        (ABORT_MISMATCH, *rank)
                    }
                    Abort::Peer { rank, reason } => (reason_code(*reason), *rank),
                };
                b[7] = code;
                b[24..28].copy_from_slice(&(rank as u32).to_le_bytes());
            }
        }
        b
    }

    /// Decodes a header; `Err` names what is malformed.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Header, String> {
        if b[0..2] != MAGIC {
            return Err(format!("bad magic {:02x}{:02x}", b[0], b[1]));
        }
        match b[2] {
            1 => Ok(Header::Data {
                desc: get_desc(b).ok_or("bad operation fields")?,
                payload_bytes: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
            }),
            2 => {
                let rank = u32::from_le_bytes([b[24], b[25], b[26], b[27]]) as usize;
                let abort = match b[7] {
                    ABORT_LOST => Abort::PeerLost { rank },
                    ABORT_MISMATCH => Abort::Mismatch {
                        rank,
                        theirs: get_desc(b).ok_or("bad mismatch fields")?,
                    },
                    c => Abort::Peer {
                        rank,
                        reason: reason_from(c).ok_or("bad abort reason")?,
                    },
                };
                Ok(Header::Abort(abort))
            }
            k => Err(format!("bad frame kind {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn desc() -> impl Strategy<Value = OpDesc> {
        (
            any::<u64>(),
            0usize..5,
            0usize..4,
            0usize..8,
            0usize..5,
            any::<u64>(),
            any::<u32>(),
        )
            .prop_map(|(seq, k, a, d, o, len, root)| OpDesc {
                seq,
                kind: kind_from(k as u8 + 1).unwrap(),
                algo: algo_from(a as u8 + 1).unwrap(),
                dtype: dtype_from(d as u8).unwrap(),
                op: op_from(o as u8).unwrap(),
                len,
                root,
            })
    }

    proptest! {
        #[test]
        fn data_headers_roundtrip(d in desc(), p in any::<u32>()) {
            let h = Header::Data { desc: d, payload_bytes: p };
            prop_assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn abort_headers_roundtrip(d in desc(), rank in 0usize..1_000_000, which in 0usize..5) {
            let a = match which {
                0 => Abort::PeerLost { rank },
                1 => Abort::Mismatch { rank, theirs: d },
                2 => Abort::Peer { rank, reason: AbortReason::Timeout },
                3 => Abort::Peer { rank, reason: AbortReason::Aborted },
                _ => Abort::Peer { rank, reason: AbortReason::Protocol },
            };
            let h = Header::Abort(a);
            prop_assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn decoding_garbage_never_panics(b in proptest::array::uniform32(any::<u8>())) {
            let _ = Header::decode(&b);
        }
    }
}
