//! A look at a request's protobuf bytes before they are decoded: how many
//! elements its repeated fields hold.
//!
//! Why: decoding allocates per element, and an element can cost far more
//! in memory than on the wire. An empty `BatchOp` is 2 bytes on the wire
//! and ~200 in memory, so a 4 MiB `Batch` of empty operations decoded into
//! ~400 MiB (then doubled by vector growth) before the batch-size check
//! could refuse it. Counting tags is cheap and allocates nothing, so the
//! limits are checked first, on the bytes.

/// Protobuf wire types. Groups are skipped the way prost skips them.
const VARINT: u64 = 0;
const I64: u64 = 1;
const LEN: u64 = 2;
const START_GROUP: u64 = 3;
const END_GROUP: u64 = 4;
const I32: u64 = 5;
/// How deep groups may nest (prost's recursion limit).
const MAX_DEPTH: u32 = 100;

/// One field of a message: its number, and for length-delimited fields
/// their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u64,
    pub bytes: Option<&'a [u8]>,
}

/// Reads a varint; `None` if it is malformed or runs past the end.
fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The top-level fields of a message, in order. Stops (with `Err`) at the
/// first malformed field: the decoder then says what is wrong.
pub fn fields(mut buf: &[u8]) -> impl Iterator<Item = Result<Field<'_>, ()>> {
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || buf.is_empty() {
            return None;
        }
        match field(&mut buf, 0) {
            Some(f) => Some(Ok(f)),
            None => {
                failed = true;
                Some(Err(()))
            }
        }
    })
}

/// Reads one field (skipping a group whole); `None` if malformed.
fn field<'a>(buf: &mut &'a [u8], depth: u32) -> Option<Field<'a>> {
    let key = varint(buf)?;
    let number = key >> 3;
    if number == 0 || number > u64::from(u32::MAX >> 3) {
        return None;
    }
    let bytes = match key & 7 {
        VARINT => {
            varint(buf)?;
            None
        }
        I64 => {
            *buf = buf.get(8..)?;
            None
        }
        I32 => {
            *buf = buf.get(4..)?;
            None
        }
        LEN => {
            let len = usize::try_from(varint(buf)?).ok()?;
            let bytes = buf.get(..len)?;
            *buf = &buf[len..];
            Some(bytes)
        }
        START_GROUP if depth < MAX_DEPTH => {
            loop {
                let mut peek = *buf;
                let key = varint(&mut peek)?;
                if key & 7 == END_GROUP {
                    if key >> 3 != number {
                        return None;
                    }
                    *buf = peek;
                    break;
                }
                field(buf, depth + 1)?;
            }
            None
        }
        _ => return None,
    };
    Some(Field { number, bytes })
}

/// How many times field `number` occurs at the top level of `buf` (a
/// repeated field's element count). Malformed bytes count as far as they
/// can be read.
pub fn count(buf: &[u8], number: u64) -> usize {
    fields(buf)
        .map_while(Result::ok)
        .filter(|f| f.number == number)
        .count()
}

/// The embedded messages in field `number` of `buf`.
pub fn messages(buf: &[u8], number: u64) -> impl Iterator<Item = &[u8]> {
    fields(buf)
        .map_while(Result::ok)
        .filter(move |f| f.number == number)
        .filter_map(|f| f.bytes)
}

#[cfg(test)]
mod tests {
    use bagel_proto::pb;
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;

    #[test]
    fn counts_what_prost_decodes() {
        let req = pb::BatchRequest {
            lean: false,
            ops: vec![
                pb::BatchOp {
                    op: Some(pb::batch_op::Op::Acquire(pb::AcquireRequest {
                        names: vec!["a".into(), "b".into(), String::new()],
                        deadline_us: 1 << 60,
                        ..Default::default()
                    })),
                },
                pb::BatchOp::default(),
            ],
        };
        let bytes = req.encode_to_vec();
        assert_eq!(count(&bytes, 1), 2);
        let names: usize = messages(&bytes, 1)
            .flat_map(|op| messages(op, 1))
            .map(|acquire| count(acquire, 1))
            .sum();
        assert_eq!(names, 3);
    }

    #[test]
    fn malformed_bytes_stop_the_walk() {
        assert_eq!(count(&[0x0a, 0x05, 1], 1), 0);
        assert_eq!(count(&[0x0a, 0x00, 0x0f], 1), 1);
        assert_eq!(count(&[0xff; 11], 1), 0);
        assert_eq!(fields(&[0x00, 0x00]).next(), Some(Err(())));
        // A group (field 2) is skipped whole, as prost skips it.
        assert_eq!(count(&[0x13, 0x0a, 0x00, 0x14, 0x0a, 0x00], 1), 1);
    }

    fn cases() -> u32 {
        std::env::var("BAGEL_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Any bytes: no panic, and a field count never above what prost
        /// would decode when prost accepts the bytes.
        #[test]
        fn any_bytes_are_walked_safely(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let n = count(&bytes, 1);
            prop_assert!(n <= bytes.len() / 2);
            if let Ok(req) = pb::BatchRequest::decode(bytes.as_slice()) {
                prop_assert_eq!(n, req.ops.len());
            }
        }
    }
}
