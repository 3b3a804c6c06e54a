//! TensorBoard event files: `Event` protobufs (encoded by hand) in TFRecord framing.
//!
//! A record is `u64 length (LE) | u32 masked CRC-32C of those 8 bytes (LE) | data |
//! u32 masked CRC-32C of data (LE)`. The data is an `Event` from TensorFlow's
//! `event.proto`, of which only the fields a scalar log needs are written:
//!
//! ```text
//! message Event   { double wall_time = 1; int64 step = 2;
//!                   oneof what { string file_version = 3; Summary summary = 5; } }
//! message Summary { repeated Value value = 1; }
//! message Value   { string tag = 1; float simple_value = 2; }
//! ```
//!
//! The first event of a file carries `file_version = "brain.Event:2"` and no summary.
//! The decoder here exists for tests and tools: it checks every length before allocating
//! and every CRC, and skips fields it does not know.

use thiserror::Error;

use super::crc32c::masked_crc32c;

/// The `file_version` of the first event of every file.
pub const FILE_VERSION: &str = "brain.Event:2";
/// Largest record the decoder accepts, bytes (a larger length field is corruption).
pub const RECORD_BYTES_MAX: usize = 1 << 20;
/// Largest tag accepted or written, bytes.
pub const TAG_BYTES_MAX: usize = 256;
/// Bytes of framing around each record's data (length, its CRC, the data's CRC).
pub const RECORD_OVERHEAD_BYTES: usize = 16;

/// Why an event file does not decode.
#[derive(Debug, Error, PartialEq)]
pub enum EventFileError {
    /// The bytes end inside a record.
    #[error("truncated record at byte {0}")]
    Truncated(usize),
    /// A record's length field is larger than [`RECORD_BYTES_MAX`].
    #[error("record at byte {offset} claims {len} bytes")]
    TooLong {
        /// Where the record starts.
        offset: usize,
        /// The length it claims.
        len: u64,
    },
    /// A stored CRC does not match its bytes.
    #[error("crc mismatch in the {what} of the record at byte {offset}")]
    Crc {
        /// Where the record starts.
        offset: usize,
        /// `length` or `data`.
        what: &'static str,
    },
    /// The record's data is not a well-formed `Event`.
    #[error("malformed event: {0}")]
    Malformed(String),
}

/// Appends `v` as a protobuf varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a field key (field number and wire type).
fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// Appends a length-delimited field.
fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends one `Event` message (not framed) to `out`: `wall_time`, `step`, then either
/// `file_version` (when given) or a summary of `values` (`(tag, simple_value)`). Tags are
/// cut to [`TAG_BYTES_MAX`] bytes (at a character boundary).
pub fn encode_event(
    out: &mut Vec<u8>,
    wall_time_s: f64,
    step: i64,
    file_version: Option<&str>,
    values: &[(&str, f32)],
) {
    put_key(out, 1, 1);
    out.extend_from_slice(&wall_time_s.to_le_bytes());
    put_key(out, 2, 0);
    // int64 is a two's-complement varint (ten bytes when negative).
    put_varint(out, step as u64);
    if let Some(v) = file_version {
        put_bytes(out, 3, v.as_bytes());
        return;
    }
    let mut summary = Vec::with_capacity(values.len() * 24);
    let mut value = Vec::with_capacity(32);
    for (tag, x) in values {
        value.clear();
        put_bytes(&mut value, 1, cut(tag, TAG_BYTES_MAX).as_bytes());
        put_key(&mut value, 2, 5);
        value.extend_from_slice(&x.to_le_bytes());
        put_bytes(&mut summary, 1, &value);
    }
    put_bytes(out, 5, &summary);
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends `data` to `out` as one TFRecord.
pub fn append_record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

/// The data of every record in `bytes`, in order, each checked against its CRCs.
pub fn read_records(bytes: &[u8]) -> Result<Vec<&[u8]>, EventFileError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let head = bytes
            .get(at..at + 12)
            .ok_or(EventFileError::Truncated(at))?;
        let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let len_crc = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if masked_crc32c(&head[..8]) != len_crc {
            return Err(EventFileError::Crc {
                offset: at,
                what: "length",
            });
        }
        if len > RECORD_BYTES_MAX as u64 {
            return Err(EventFileError::TooLong { offset: at, len });
        }
        let n = len as usize;
        let body = bytes
            .get(at + 12..at + 12 + n + 4)
            .ok_or(EventFileError::Truncated(at))?;
        let (data, crc) = body.split_at(n);
        if masked_crc32c(data) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(EventFileError::Crc {
                offset: at,
                what: "data",
            });
        }
        out.push(data);
        at += 12 + n + 4;
    }
    Ok(out)
}

/// One decoded `Event` (the fields [`encode_event`] writes).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedEvent {
    /// Seconds since the Unix epoch.
    pub wall_time_s: f64,
    /// The global step.
    pub step: i64,
    /// `file_version`, in the first event of a file.
    pub file_version: Option<String>,
    /// The summary's `(tag, simple_value)` pairs, in order.
    pub values: Vec<(String, f32)>,
}

/// A bounds-checked protobuf reader over one message.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

/// A field's payload.
enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn varint(&mut self) -> Result<u64, EventFileError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.at)
                .ok_or_else(|| EventFileError::Malformed("varint runs past the end".into()))?;
            self.at += 1;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(EventFileError::Malformed(
            "varint longer than 10 bytes".into(),
        ))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], EventFileError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                EventFileError::Malformed(format!("field of {n} bytes runs past the end"))
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// The next field, or `None` at the end of the message.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, EventFileError> {
        if self.at == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed64(self.take(8)?.try_into().expect("8 bytes")),
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n)
                    .map_err(|_| EventFileError::Malformed(format!("length {n}")))?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(self.take(4)?.try_into().expect("4 bytes")),
            w => return Err(EventFileError::Malformed(format!("wire type {w}"))),
        };
        Ok(Some((key >> 3, field)))
    }
}

/// Decodes one `Event` message (a record's data).
pub fn decode_event(data: &[u8]) -> Result<DecodedEvent, EventFileError> {
    let utf8 = |b: &[u8]| {
        String::from_utf8(b.to_vec())
            .map_err(|_| EventFileError::Malformed("string not utf-8".into()))
    };
    let mut e = DecodedEvent {
        wall_time_s: 0.0,
        step: 0,
        file_version: None,
        values: Vec::new(),
    };
    let mut r = Reader::new(data);
    while let Some((num, f)) = r.next()? {
        match (num, f) {
            (1, Field::Fixed64(b)) => e.wall_time_s = f64::from_le_bytes(b),
            (2, Field::Varint(v)) => e.step = v as i64,
            (3, Field::Bytes(b)) => e.file_version = Some(utf8(b)?),
            (5, Field::Bytes(summary)) => {
                let mut s = Reader::new(summary);
                while let Some((num, f)) = s.next()? {
                    let (1, Field::Bytes(value)) = (num, f) else {
                        continue;
                    };
                    let mut v = Reader::new(value);
                    let (mut tag, mut x) = (None, None);
                    while let Some((num, f)) = v.next()? {
                        match (num, f) {
                            (1, Field::Bytes(b)) => tag = Some(utf8(b)?),
                            (2, Field::Fixed32(b)) => x = Some(f32::from_le_bytes(b)),
                            _ => {}
                        }
                    }
                    match (tag, x) {
                        (Some(t), Some(x)) => e.values.push((t, x)),
                        _ => {
                            return Err(EventFileError::Malformed(
                                "summary value without tag or simple_value".into(),
                            ))
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(e)
}

/// Every event of an event file's bytes, in order.
pub fn decode_file(bytes: &[u8]) -> Result<Vec<DecodedEvent>, EventFileError> {
    read_records(bytes)?.into_iter().map(decode_event).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_record_frames_as_tensorflow_writes_it() {
        let mut out = Vec::new();
        append_record(&mut out, b"");
        // Length 0, masked CRC of 8 zero bytes, no data, masked CRC of nothing.
        let mut want = vec![0u8; 8];
        want.extend_from_slice(&0x0798_0329u32.to_le_bytes());
        want.extend_from_slice(&masked_crc32c(b"").to_le_bytes());
        assert_eq!(out, want);
        assert_eq!(read_records(&out).unwrap(), vec![&b""[..]]);
    }

    #[test]
    fn a_scalar_event_encodes_to_the_protobuf_bytes() {
        let mut out = Vec::new();
        encode_event(&mut out, 1.5, 3, None, &[("a", 2.0)]);
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0x03]);
        // summary (5, len 10) { value (1, len 8) { tag (1) "a", simple_value (2) 2.0 } }
        want.extend_from_slice(&[0x2A, 10, 0x0A, 8, 0x0A, 1, b'a', 0x15]);
        want.extend_from_slice(&2.0f32.to_le_bytes());
        assert_eq!(out, want);
    }

    #[test]
    fn events_round_trip_through_records() {
        let mut file = Vec::new();
        let mut data = Vec::new();
        encode_event(&mut data, 1_700_000_000.25, 0, Some(FILE_VERSION), &[]);
        append_record(&mut file, &data);
        let big_step = 1i64 << 40;
        for (step, v) in [
            (1i64, 0.5f32),
            (300, -1.25),
            (big_step, f32::MAX),
            (-2, 0.0),
        ] {
            data.clear();
            encode_event(
                &mut data,
                1_700_000_001.0,
                step,
                None,
                &[("loss", v), ("lr", v / 2.0)],
            );
            append_record(&mut file, &data);
        }
        let events = decode_file(&file).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!(events[0].wall_time_s, 1_700_000_000.25);
        assert!(events[0].values.is_empty());
        assert_eq!(events[3].step, big_step);
        assert_eq!(events[3].values[0], ("loss".to_string(), f32::MAX));
        assert_eq!(events[4].step, -2);
        assert_eq!(
            events[2].values,
            vec![("loss".into(), -1.25), ("lr".into(), -0.625)]
        );
    }

    #[test]
    fn corruption_and_truncation_are_reported() {
        let mut file = Vec::new();
        let mut data = Vec::new();
        encode_event(&mut data, 1.0, 1, None, &[("loss", 1.0)]);
        append_record(&mut file, &data);
        for cut in [1, 11, 12, file.len() - 1] {
            assert_eq!(
                read_records(&file[..cut]),
                Err(EventFileError::Truncated(0)),
                "cut at {cut}"
            );
        }
        let mut bad = file.clone();
        bad[14] ^= 1;
        assert!(matches!(
            read_records(&bad),
            Err(EventFileError::Crc { what: "data", .. })
        ));
        let mut bad = file.clone();
        bad[0] ^= 1;
        assert!(matches!(
            read_records(&bad),
            Err(EventFileError::Crc { what: "length", .. })
        ));
        // A huge length with a valid CRC is refused before anything is allocated.
        let mut huge = (u64::MAX / 2).to_le_bytes().to_vec();
        huge.extend_from_slice(&masked_crc32c(&huge).to_le_bytes());
        assert!(matches!(
            read_records(&huge),
            Err(EventFileError::TooLong { .. })
        ));
        // A length-delimited field running past the end of the message.
        assert!(decode_event(&[0x2A, 50, 0x0A]).is_err());
    }

    #[test]
    fn long_tags_are_cut_at_a_char_boundary() {
        let tag = "é".repeat(TAG_BYTES_MAX);
        let mut data = Vec::new();
        encode_event(&mut data, 0.0, 0, None, &[(&tag, 1.0)]);
        let e = decode_event(&data).unwrap();
        assert_eq!(e.values[0].0.len(), TAG_BYTES_MAX);
    }
}
