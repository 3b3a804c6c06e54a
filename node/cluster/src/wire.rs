//! The node's one wire codec: bincode 2 (serde) with a hard size limit, and JSON for the
//! control plane's messages.
//!
//! bincode is unmaintained (RUSTSEC-2025-0141), so every encode and decode of a network
//! message goes through this module and nothing else names bincode: swapping the codec is a
//! change to this file alone.
//!
//! Frames on a stream are a little-endian `u32` length followed by that many bytes. The length
//! is checked against [`FRAME_BYTES_MAX`] before anything is allocated, and decoding is bounded
//! by the same limit, so a hostile peer cannot make the node allocate more than one frame.

use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;

/// Largest frame the node accepts or sends, in bytes (a full membership push-pull of a few
/// thousand members fits with room to spare).
pub const FRAME_BYTES_MAX: usize = 4 << 20;

/// Why a message could not be encoded or decoded.
#[derive(Clone, Debug, Error)]
pub enum WireError {
    /// The frame is longer than [`FRAME_BYTES_MAX`].
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    /// The bytes are not a valid message (garbled or truncated).
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The bytes decoded to a message but some were left over.
    #[error("{extra} trailing bytes after the message")]
    Trailing { extra: usize },
    /// Encoding failed (a bug: our own messages always encode).
    #[error("encode failed: {0}")]
    Encode(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<FRAME_BYTES_MAX>()
}

/// Encodes `value`; fails if the encoding would exceed [`FRAME_BYTES_MAX`].
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let bytes = bincode::serde::encode_to_vec(value, config())
        .map_err(|e| WireError::Encode(e.to_string()))?;
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            limit: FRAME_BYTES_MAX,
        });
    }
    Ok(bytes)
}

/// Decodes one whole message from `bytes`; never panics and never allocates beyond the limit.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            limit: FRAME_BYTES_MAX,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != bytes.len() {
        return Err(WireError::Trailing {
            extra: bytes.len() - used,
        });
    }
    Ok(value)
}

/// Encodes `value` as JSON, for messages whose types need a self-describing format (the
/// Raft log carries job specs with free-form TOML tables); fails past [`FRAME_BYTES_MAX`].
pub fn encode_json<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let bytes = serde_json::to_vec(value).map_err(|e| WireError::Encode(e.to_string()))?;
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            limit: FRAME_BYTES_MAX,
        });
    }
    Ok(bytes)
}

/// Decodes one JSON message; the input is bounded by the frame limit.
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            limit: FRAME_BYTES_MAX,
        });
    }
    serde_json::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))
}

/// Reads one length-prefixed frame, refusing lengths over `limit` before reading on. The
/// buffer grows as bytes arrive (from [`FRAME_START_BYTES`]), not to the announced length at
/// once: a peer announcing a large frame and sending nothing holds next to no memory.
pub async fn read_frame<R>(io: &mut R, limit: usize) -> std::io::Result<Vec<u8>>
where
    R: futures::AsyncRead + Unpin,
{
    read_frame_or_end(io, limit).await?.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the stream ended before a frame",
        )
    })
}

/// [`read_frame`], but `None` when the stream ends cleanly before a frame starts (a stream
/// that carries many frames). An end inside the length prefix or the frame is an error.
pub async fn read_frame_or_end<R>(io: &mut R, limit: usize) -> std::io::Result<Option<Vec<u8>>>
where
    R: futures::AsyncRead + Unpin,
{
    use futures::AsyncReadExt;
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match io.read(&mut len[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("frame length cut short at {got} of 4 bytes"),
                ))
            }
            n => got += n,
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            WireError::TooLarge { len, limit },
        ));
    }
    let mut buf = Vec::with_capacity(len.min(FRAME_START_BYTES));
    let got = io.take(len as u64).read_to_end(&mut buf).await?;
    if got != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("frame cut short at {got} of {len} bytes"),
        ));
    }
    Ok(Some(buf))
}

/// The first allocation of a frame being read; it doubles as bytes arrive.
pub const FRAME_START_BYTES: usize = 64 << 10;

/// Writes one length-prefixed frame.
pub async fn write_frame<W>(io: &mut W, bytes: &[u8]) -> std::io::Result<()>
where
    W: futures::AsyncWrite + Unpin,
{
    use futures::AsyncWriteExt;
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            WireError::TooLarge {
                len: bytes.len(),
                limit: FRAME_BYTES_MAX,
            },
        ));
    }
    io.write_all(&(bytes.len() as u32).to_le_bytes()).await?;
    io.write_all(bytes).await?;
    io.flush().await
}

/// Bytes of the call id at the head of a call frame (a little-endian `u64`).
pub const CALL_ID_BYTES: usize = 8;
/// Largest call frame body: a message of [`FRAME_BYTES_MAX`] and its call id.
pub const CALL_FRAME_BYTES_MAX: usize = FRAME_BYTES_MAX + CALL_ID_BYTES;

/// A call frame as written on a stream of remote calls (`cluster::calls`): the 4-byte
/// length, the call id, then `message` (a request, or the answer to the call of that id).
/// Fails when `message` is over [`FRAME_BYTES_MAX`].
pub fn call_frame(id: u64, message: &[u8]) -> Result<Vec<u8>, WireError> {
    if message.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge {
            len: message.len(),
            limit: FRAME_BYTES_MAX,
        });
    }
    let mut frame = Vec::with_capacity(4 + CALL_ID_BYTES + message.len());
    frame.extend_from_slice(&((CALL_ID_BYTES + message.len()) as u32).to_le_bytes());
    frame.extend_from_slice(&id.to_le_bytes());
    frame.extend_from_slice(message);
    Ok(frame)
}

/// Splits a call frame's body (as [`read_frame_or_end`] returns it) into its call id and
/// message; a body too short to hold an id is malformed.
pub fn split_call(mut body: Vec<u8>) -> Result<(u64, Vec<u8>), WireError> {
    if body.len() < CALL_ID_BYTES {
        return Err(WireError::Malformed(format!(
            "call frame of {} bytes, shorter than its {CALL_ID_BYTES}-byte call id",
            body.len()
        )));
    }
    let message = body.split_off(CALL_ID_BYTES);
    let id = u64::from_le_bytes(body.try_into().expect("eight bytes"));
    Ok((id, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Sample {
        a: u64,
        names: Vec<String>,
    }

    #[test]
    fn round_trip() {
        let s = Sample {
            a: 7,
            names: vec!["x".into(), "yz".into()],
        };
        let bytes = encode(&s).unwrap();
        assert_eq!(decode::<Sample>(&bytes).unwrap(), s);
    }

    #[test]
    fn truncated_and_trailing_are_errors() {
        let bytes = encode(&Sample {
            a: 7,
            names: vec!["hello".into()],
        })
        .unwrap();
        assert!(matches!(
            decode::<Sample>(&bytes[..bytes.len() - 2]),
            Err(WireError::Malformed(_))
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            decode::<Sample>(&long),
            Err(WireError::Trailing { extra: 1 })
        ));
    }

    #[test]
    fn huge_declared_length_does_not_allocate() {
        // A varint length of ~2^60 for the Vec: must fail on the limit, not try to allocate.
        let bytes = [7u8, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0x10];
        assert!(decode::<Sample>(&bytes).is_err());
    }

    #[test]
    fn oversized_frame_is_refused_before_reading() {
        let mut frame = ((FRAME_BYTES_MAX + 1) as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&[0; 16]);
        let mut io = futures::io::Cursor::new(frame);
        let err = futures::executor::block_on(read_frame(&mut io, FRAME_BYTES_MAX)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_call_frame_carries_its_id_and_message() {
        let frame = call_frame(0x0102_0304_0506_0708, b"hello").unwrap();
        let mut io = futures::io::Cursor::new(frame);
        let body = futures::executor::block_on(read_frame(&mut io, CALL_FRAME_BYTES_MAX)).unwrap();
        assert_eq!(
            split_call(body).unwrap(),
            (0x0102_0304_0506_0708, b"hello".to_vec())
        );
        assert_eq!(
            split_call(7u64.to_le_bytes().to_vec()).unwrap(),
            (7, Vec::new())
        );
    }

    #[test]
    fn a_call_frame_without_a_whole_id_or_over_the_limit_is_refused() {
        let e = split_call(vec![1, 2, 3]).unwrap_err();
        assert!(matches!(e, WireError::Malformed(_)), "{e}");
        assert!(
            e.to_string().contains("shorter than its 8-byte call id"),
            "{e}"
        );
        let e = call_frame(1, &vec![0; FRAME_BYTES_MAX + 1]).unwrap_err();
        assert!(matches!(e, WireError::TooLarge { .. }), "{e}");
        assert!(call_frame(1, &vec![0; FRAME_BYTES_MAX]).is_ok());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Sample>(&bytes);
        }
    }
}
