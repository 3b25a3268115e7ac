//! Record framing, the same in POSIX data files and S3 batch objects.
//!
//! ```text
//! +----------------+-----------------------------+----------------------+
//! | len: u32 LE    | crc: u32 LE                 | body: len bytes      |
//! |                | CRC-32C(len bytes ‖ body)   | encoded pb::Batch    |
//! +----------------+-----------------------------+----------------------+
//! ```
//!
//! The checksum covers the length too, so a damaged length is caught even
//! when it still points inside the file. A record that runs past the end of
//! the bytes read is a *torn tail* (an append that did not finish, or a file
//! read past its listed size); it is reported, never parsed.
//!
//! Decoding stops at the first record whose checksum fails: its length
//! cannot be trusted, and following it could land inside a payload whose
//! bytes happen to frame a record that was never written. The rest of the
//! item is reported as unreadable.

use bytes::{BufMut as _, Bytes, BytesMut};

/// Frame header size: length + checksum.
pub const HEADER_LEN: usize = 8;
/// Larger lengths are taken as damage, not as a record.
pub const MAX_RECORD_LEN: usize = 64 << 20;

/// Frames `body` as one record.
pub fn encode(body: &[u8]) -> Bytes {
    assert!(
        body.len() <= MAX_RECORD_LEN,
        "record of {} bytes is too large",
        body.len()
    );
    let len = (body.len() as u32).to_le_bytes();
    let mut crc = crc32c::crc32c(&len);
    crc = crc32c::crc32c_append(crc, body);
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    out.put_slice(&len);
    out.put_u32_le(crc);
    out.put_slice(body);
    out.freeze()
}

/// What the decoder found at some offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A whole record whose checksum matches; `offset` is where it starts.
    Record {
        /// Byte offset of its header in the file or object.
        offset: u64,
        /// The record's payload, header and checksum stripped.
        body: Bytes,
    },
    /// A record whose checksum does not match (or an impossible length).
    /// Nothing from here to the end is read.
    Corrupt {
        /// Byte offset of the bad record's header.
        offset: u64,
        /// What is wrong with it, for people.
        reason: String,
    },
    /// The bytes end inside a record (or its header) starting at `offset`;
    /// nothing after it is readable.
    TornTail {
        /// Byte offset of the torn record's header.
        offset: u64,
        /// How many more bytes the record (or header) needed.
        missing: u64,
    },
}

/// Splits `data` into frames. Never panics on arbitrary input.
pub fn decode(data: &Bytes) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        let offset = pos as u64;
        let rest = data.len() - pos;
        if rest < HEADER_LEN {
            out.push(Frame::TornTail {
                offset,
                missing: (HEADER_LEN - rest) as u64,
            });
            break;
        }
        let len_bytes: [u8; 4] = data[pos..pos + 4].try_into().expect("4 bytes");
        let len = u32::from_le_bytes(len_bytes) as usize;
        let want = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if len > MAX_RECORD_LEN {
            out.push(Frame::Corrupt {
                offset,
                reason: format!("implausible record length {len}; the rest of the file is unreadable"),
            });
            break;
        }
        if rest - HEADER_LEN < len {
            // Either a torn append or a damaged length pointing past the end:
            // if the checksum matches what is there we cannot tell; both are
            // reported and neither is parsed.
            out.push(Frame::TornTail {
                offset,
                missing: (len - (rest - HEADER_LEN)) as u64,
            });
            break;
        }
        let body = data.slice(pos + HEADER_LEN..pos + HEADER_LEN + len);
        let got = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), &body);
        if got != want {
            out.push(Frame::Corrupt {
                offset,
                reason: format!(
                    "checksum mismatch (stored {want:08x}, computed {got:08x}); the {rest} bytes from here are unreadable"
                ),
            });
            break;
        }
        out.push(Frame::Record { offset, body });
        pos += HEADER_LEN + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn concat(parts: &[Bytes]) -> Bytes {
        let mut v = Vec::new();
        for p in parts {
            v.extend_from_slice(p);
        }
        Bytes::from(v)
    }

    #[test]
    fn round_trip() {
        let data = concat(&[encode(b"one"), encode(b""), encode(b"three")]);
        let frames = decode(&data);
        assert_eq!(
            frames,
            vec![
                Frame::Record {
                    offset: 0,
                    body: Bytes::from_static(b"one")
                },
                Frame::Record {
                    offset: 11,
                    body: Bytes::new()
                },
                Frame::Record {
                    offset: 19,
                    body: Bytes::from_static(b"three")
                },
            ]
        );
    }

    #[test]
    fn every_truncation_is_a_torn_tail_never_a_record() {
        let data = concat(&[encode(b"first record"), encode(b"second record")]);
        let first_len = encode(b"first record").len();
        for cut in 0..data.len() {
            let frames = decode(&data.slice(..cut));
            let records = frames
                .iter()
                .filter(|f| matches!(f, Frame::Record { .. }))
                .count();
            assert_eq!(records, usize::from(cut >= first_len), "cut at {cut}");
            if cut != 0 && cut != first_len {
                assert!(
                    matches!(frames.last(), Some(Frame::TornTail { .. })),
                    "cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let one = encode(b"payload under test");
        let data = concat(&[one.clone(), encode(b"next")]);
        for i in 0..one.len() {
            let mut bad = data.to_vec();
            bad[i] ^= 0x04;
            let frames = decode(&Bytes::from(bad));
            assert!(
                !frames
                    .iter()
                    .any(|f| matches!(f, Frame::Record { offset: 0, .. })),
                "flip at {i} accepted"
            );
            assert!(
                frames.iter().any(|f| !matches!(f, Frame::Record { .. })),
                "flip at {i} not reported"
            );
        }
    }

    #[test]
    fn a_damaged_length_never_resynchronises_inside_a_payload() {
        // A payload that itself holds a well-framed record.
        let inner = encode(b"never written as a record");
        let mut body = b"prefix..".to_vec();
        body.extend_from_slice(&inner);
        let outer = encode(&body);
        let data = concat(&[outer, encode(b"a later record")]);
        // Damage the outer length so it ends just where the inner frame
        // starts: its checksum fails, and the next header read would be
        // the inner frame's.
        let mut bad = data.to_vec();
        bad[..4].copy_from_slice(&8u32.to_le_bytes());
        let frames = decode(&Bytes::from(bad));
        assert!(
            matches!(frames[0], Frame::Corrupt { offset: 0, .. }),
            "{frames:?}"
        );
        assert_eq!(
            frames.len(),
            1,
            "nothing is read past a corrupt record: {frames:?}"
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&Bytes::from(data));
        }
    }
}
