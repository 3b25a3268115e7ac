//! What a stored summary expands to when it is read, counted before it
//! expands: a small object must not make a reader hold gigabytes.
//!
//! Two things grow past a summary's stored bytes. Its decoded form: an
//! empty batch is 2 bytes stored and a ~150-byte struct decoded, so 4 MB
//! of them decode to over 300 MB. And its records: a batch cites
//! witnesses and a signed time by index, and "same as the previous" cites
//! them again at no cost, so one 50 KB witness cited 1,000 times by each
//! of ten batches rebuilds to 500 MB of records. Both are measured
//! against [`MAX_SUMMARY_EXPANSION`]: the decoded form on the stored
//! bytes, walking their wire format without allocating, before prost
//! decodes anything ([`decoded_size`]); the records on the decoded
//! summary, by arithmetic on the lengths of what each batch cites, before
//! any batch is rebuilt ([`records_size`]). A summary over either is
//! refused as corrupt ([`super::packed::decode`]) and a summarizer does
//! not publish one ([`super::publish`]): no honest summary is over, since
//! a summarizer reads at most [`super::MAX_SUMMARY_BYTES`] of items to make
//! one, which is what its records rebuild to.

use std::mem::size_of;

use bagel_proto::pb;
use bytes::Bytes;
use prost::Message as _;

use super::MAX_SUMMARY_EXPANSION;
use super::packed::{self, Summary, SummaryBag, SummaryBatch, SummaryItem, SummaryTime};
use crate::frame;

/// How one field of a message decodes, for [`decoded_size`]. A field not
/// listed for its message is a scalar kept inside the message, or one
/// prost skips: nothing of its own.
#[derive(Clone, Copy)]
pub(crate) enum Field {
    /// A repeated scalar (packed or not): each value an element of this
    /// many bytes.
    Scalars(u64),
    /// Bytes or a string copied into an allocation of its own (`Vec<u8>`,
    /// `String`), or a message without repeated fields (whose allocations
    /// are at most its length): this many bytes of handle (0: not
    /// repeated), plus its length.
    Owned(u64),
    /// Bytes sharing the stored buffer (`Bytes`): this many bytes of
    /// handle (0: not repeated).
    Shared(u64),
    /// A repeated message: this many bytes each, plus what its own fields
    /// (listed) take.
    Message(u64, &'static [(u32, Field)]),
}

use Field::{Message, Owned, Scalars, Shared};

const fn size<T>() -> u64 {
    size_of::<T>() as u64
}

const WITNESS: &[(u32, Field)] = &[
    (1, Owned(0)),
    (2, Owned(0)),
    (3, Owned(0)),
    (6, Owned(size::<Vec<u8>>())),
];
const TIME: &[(u32, Field)] = &[(1, Shared(0)), (2, Shared(0)), (4, Owned(0))];
const BATCH: &[(u32, Field)] = &[
    (4, Scalars(size::<u32>())),
    (5, Scalars(size::<i64>())),
    (6, Shared(size::<Bytes>())),
    (8, Owned(0)),
    (10, Shared(size::<Bytes>())),
];
const ITEM: &[(u32, Field)] = &[(3, Message(size::<SummaryBatch>(), BATCH)), (4, Shared(0))];
const BAG: &[(u32, Field)] = &[(2, Owned(0)), (3, Message(size::<SummaryItem>(), ITEM))];
/// A format 2 summary ([`Summary`]).
pub(crate) const FORMAT_2: &[(u32, Field)] = &[
    (17, Owned(0)),
    (20, Message(size::<pb::Witness>(), WITNESS)),
    (21, Message(size::<SummaryTime>(), TIME)),
    (22, Owned(size::<String>())),
    (23, Owned(size::<String>())),
    (24, Owned(size::<String>())),
    (25, Message(size::<SummaryBag>(), BAG)),
];

const V1_BATCH: &[(u32, Field)] = &[
    (4, Scalars(size::<u32>())),
    (5, Owned(size::<pb::Entry>())),
    (7, Owned(0)),
    (9, Owned(size::<Vec<u8>>())),
];
const V1_ITEM: &[(u32, Field)] = &[
    (1, Owned(0)),
    (3, Message(size::<pb::SummaryBatch>(), V1_BATCH)),
    (4, Owned(0)),
];
const V1_BAG: &[(u32, Field)] = &[(2, Owned(0)), (3, Message(size::<pb::SummaryItem>(), V1_ITEM))];
/// A format 1 summary (`pb::Summary`).
pub(crate) const FORMAT_1: &[(u32, Field)] = &[
    (1, Owned(0)),
    (4, Message(size::<pb::Witness>(), WITNESS)),
    (5, Owned(size::<pb::SignedTime>())),
    (6, Owned(size::<String>())),
    (7, Message(size::<pb::SummaryBag>(), V1_BAG)),
];

/// The bytes of memory `bytes` takes decoded as a message of `fields`
/// (each element at its size, strings and copied bytes at their length;
/// a vector's spare capacity is not counted), found by walking the wire
/// format without allocating. Counting stops once it is over `budget`:
/// any number over it means "over". `Err`: bytes that are not a message.
pub(crate) fn decoded_size(
    bytes: &[u8],
    fields: &'static [(u32, Field)],
    budget: u64,
) -> Result<u64, String> {
    let mut total = 0u64;
    scan(bytes, fields, &mut total, budget)?;
    Ok(total)
}

fn scan(mut buf: &[u8], fields: &[(u32, Field)], total: &mut u64, budget: u64) -> Result<(), String> {
    while !buf.is_empty() && *total <= budget {
        let key = varint(&mut buf)?;
        let (tag, wire) = (key >> 3, key & 7);
        let field = fields.iter().find(|(t, _)| u64::from(*t) == tag).map(|(_, f)| *f);
        let cost = match wire {
            0 => {
                varint(&mut buf)?;
                match field {
                    Some(Scalars(n)) => n,
                    _ => 0,
                }
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                buf = buf.get(n..).ok_or("does not decode: a field runs past its end")?;
                0
            }
            2 => {
                let len = varint(&mut buf)?;
                let body = usize::try_from(len)
                    .ok()
                    .and_then(|len| buf.get(..len))
                    .ok_or("does not decode: a field runs past its end")?;
                buf = &buf[body.len()..];
                match field {
                    None => 0,
                    // A packed run: one value per byte that ends a varint.
                    Some(Scalars(n)) => n.saturating_mul(body.iter().filter(|b| **b < 0x80).count() as u64),
                    Some(Owned(handle)) => handle.saturating_add(len),
                    Some(Shared(handle)) => handle,
                    Some(Message(elem, inner)) => {
                        *total = total.saturating_add(elem);
                        scan(body, inner, total, budget)?;
                        0
                    }
                }
            }
            _ => return Err(format!("does not decode: wire type {wire} (field {tag})")),
        };
        *total = total.saturating_add(cost);
    }
    Ok(())
}

/// A varint off the front of `buf`.
fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for (i, b) in buf.iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Ok(v);
        }
    }
    Err("does not decode: a varint runs past its end or past 10 bytes".into())
}

/// The bytes the items of `summary` rebuild to: each record framed (every
/// witness and signed time counted in each batch that cites it, as in the
/// bag), or a raw item's bytes; what a reader of its bags would read.
/// Counted without rebuilding a batch, and no further once over `budget`.
/// `Err`: parts that do not fit together (as rebuilding says it), or a
/// batch whose record would be longer than any frame of a bag holds
/// ([`frame::MAX_RECORD_LEN`]).
pub(crate) fn records_size(summary: &Summary, budget: u64) -> Result<u64, String> {
    let witness_len: Vec<usize> = summary.witnesses.iter().map(|w| w.encoded_len()).collect();
    let time_len: Vec<usize> = (0..summary.signed_times.len())
        .map(|i| packed::signed_time(summary, i).map_or(0, |t| t.encoded_len()))
        .collect();
    let mut total = 0u64;
    for bag in &summary.bags {
        for item in &bag.items {
            if item.name as usize >= summary.item_names.len() {
                return Err(format!("item name index {} out of range", item.name));
            }
            if item.is_raw {
                total = total.saturating_add(item.raw.len() as u64);
                continue;
            }
            // Once over, the rest of the item is only checked: a long
            // witness list cited again by each of many batches would
            // otherwise cost a walk of it per batch.
            let mut too_long = None;
            packed::walk_item(summary, bag, item, |p| {
                if total > budget || too_long.is_some() {
                    return;
                }
                let len = packed::record_len(
                    summary,
                    bag,
                    &p,
                    |i| witness_len[i as usize - 1],
                    |t| time_len[t as usize - 1],
                );
                // A summarizer takes records from frames, which hold at
                // most this: a longer one was never in a bag.
                if len > frame::MAX_RECORD_LEN {
                    too_long = Some(len);
                }
                total = total.saturating_add((frame::HEADER_LEN + len) as u64);
            })?;
            if let Some(len) = too_long {
                return Err(format!(
                    "a batch rebuilds to a record of {len} bytes, over the {} a bag's frame holds",
                    frame::MAX_RECORD_LEN
                ));
            }
            if total > budget {
                return Ok(total);
            }
        }
    }
    Ok(total)
}

/// [`records_size`] of a format 1 summary, before it is turned into format
/// 2 (which rebuilds each item's batches): each batch at its own length
/// plus that of every witness and signed time it cites.
pub(crate) fn records_size_v1(summary: &pb::Summary, budget: u64) -> u64 {
    let witness_len: Vec<usize> = summary.witnesses.iter().map(|w| w.encoded_len()).collect();
    let time_len: Vec<usize> = summary.signed_times.iter().map(|t| t.encoded_len()).collect();
    let mut total = 0u64;
    for item in summary.bags.iter().flat_map(|b| &b.items) {
        if item.is_raw {
            total = total.saturating_add(item.raw.len() as u64);
            continue;
        }
        for b in &item.batches {
            let cited = b
                .witnesses
                .iter()
                .map(|i| witness_len.get(*i as usize).map_or(0, |l| l + 4))
                .sum::<usize>()
                + (b.signed_time as usize)
                    .checked_sub(1)
                    .and_then(|t| time_len.get(t))
                    .map_or(0, |l| l + 4);
            total = total.saturating_add((frame::HEADER_LEN + b.encoded_len() + cited) as u64);
            if total > budget {
                return total;
            }
        }
    }
    total
}

/// Why `bytes` (a summary in either format) is over
/// [`MAX_SUMMARY_EXPANSION`] decoded, if it is: checked before decoding.
pub(crate) fn check_decoded(bytes: &[u8], fields: &'static [(u32, Field)]) -> Result<(), String> {
    let cap = MAX_SUMMARY_EXPANSION;
    match decoded_size(bytes, fields, cap)? {
        n if n > cap => Err(format!(
            "its {} bytes would take over {cap} bytes of memory decoded (counted on its bytes, before \
             decoding): over the most one summary may expand to (MAX_SUMMARY_EXPANSION)",
            bytes.len()
        )),
        _ => Ok(()),
    }
}

/// Why the records of `summary` are over [`MAX_SUMMARY_EXPANSION`], if
/// they are (or why its parts do not fit together): checked before any
/// batch is rebuilt.
pub(crate) fn check_records(records: u64) -> Result<(), String> {
    let cap = MAX_SUMMARY_EXPANSION;
    match records > cap {
        true => Err(format!(
            "its records would rebuild to over {cap} bytes (each witness and signed time counted in \
             every batch that cites it): over the most one summary may expand to \
             (MAX_SUMMARY_EXPANSION; a summarizer reads at most that many bytes of items to make one)"
        )),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::packed::{Builder, Content, decode};

    const LOG: &str = "ledger";
    /// A whole minute.
    const SECS: u64 = 1_899_999_960;

    /// A summary of one bag with one item of `batches`, and one witness of
    /// `witness_bytes` bytes of body.
    fn summary_of(batches: Vec<SummaryBatch>, witness_bytes: usize) -> Summary {
        Summary {
            format: packed::FORMAT,
            log: LOG.into(),
            from_secs: SECS,
            to_secs: SECS + 60,
            witnesses: vec![pb::Witness {
                body: vec![7; witness_bytes].into(),
                signature: vec![1; 64].into(),
                key_id: "k".into(),
                ..Default::default()
            }],
            writer_ids: vec!["w1".into()],
            item_names: vec!["w1.0.log".into()],
            bags: vec![SummaryBag {
                bucket_secs: SECS,
                lock_sha256: vec![0; 32],
                items: vec![SummaryItem {
                    batches,
                    ..Default::default()
                }],
            }],
            ..Default::default()
        }
    }

    /// A first batch naming its writer, then `n` batches that are 2 bytes
    /// each stored ("same as the previous", no messages).
    fn empty_batches(n: usize) -> Vec<SummaryBatch> {
        let mut out = vec![SummaryBatch {
            writer: 1,
            ..Default::default()
        }];
        out.resize(n + 1, SummaryBatch::default());
        out
    }

    /// 4 MB of empty batches: each a ~150-byte struct decoded (313 MB in
    /// all before the bound). Counted on the bytes, the decoded form is
    /// over the bound, and decoding refuses it with that reason, the one
    /// given before prost decodes anything.
    #[test]
    fn a_flood_of_empty_batches_is_refused_before_it_is_decoded() {
        let n = 2_000_000;
        let bytes = Bytes::from(summary_of(empty_batches(n), 10).encode_to_vec());
        assert!(bytes.len() < 4_100_000, "{}", bytes.len());
        let counted = decoded_size(&bytes, FORMAT_2, u64::MAX).unwrap();
        assert!(counted >= n as u64 * size::<SummaryBatch>(), "{counted}");
        assert!(counted > MAX_SUMMARY_EXPANSION, "{counted}");
        // Counting stops soon after the bound.
        let capped = decoded_size(&bytes, FORMAT_2, MAX_SUMMARY_EXPANSION).unwrap();
        assert!(capped > MAX_SUMMARY_EXPANSION && capped < counted, "{capped}");
        let err = decode(bytes).unwrap_err();
        assert!(
            err.contains("of memory decoded") && err.contains("MAX_SUMMARY_EXPANSION"),
            "{err}"
        );
        // A tenth of it is within the bound: what it holds, decoded.
        let bytes = Bytes::from(summary_of(empty_batches(n / 10), 10).encode_to_vec());
        assert!(decode(bytes).is_ok());
    }

    /// One 50 KB witness cited 1,000 times by a batch and again by nine
    /// "same as the previous" batches: 51 KB stored, 500 MB of records
    /// rebuilt (~970 MB held by a read before the bound). Refused as over
    /// the bound before any batch is rebuilt; 100 citations in all are
    /// within it, and rebuild to what was counted.
    #[test]
    fn a_witness_cited_over_and_over_is_refused_before_any_batch_is_rebuilt() {
        let cited = |times: usize, batches: usize| {
            let mut b = vec![SummaryBatch {
                writer: 1,
                witnesses: vec![1; times],
                ..Default::default()
            }];
            b.resize(batches, SummaryBatch::default());
            summary_of(b, 50_000)
        };
        let bytes = Bytes::from(cited(1000, 10).encode_to_vec());
        assert!(bytes.len() < 52_000, "{}", bytes.len());
        assert!(decoded_size(&bytes, FORMAT_2, u64::MAX).unwrap() < 1 << 20);
        let err = decode(bytes).unwrap_err();
        assert!(
            err.contains("records would rebuild") && err.contains("MAX_SUMMARY_EXPANSION"),
            "{err}"
        );
        let s = decode(Bytes::from(cited(10, 10).encode_to_vec())).unwrap();
        let counted = records_size(&s, u64::MAX).unwrap();
        let item = &s.bags[0].items[0];
        let rebuilt: u64 = crate::summary::rebuild(&s, &s.bags[0], item)
            .unwrap()
            .iter()
            .map(|(_, body)| (frame::HEADER_LEN + body.len()) as u64)
            .sum();
        assert_eq!(counted, rebuilt);
        assert!(counted > 10 * 10 * 50_000, "{counted}");
    }

    /// One batch citing a 1 MB witness 100 times rebuilds to a record no
    /// frame of a bag holds: refused, though within the bound.
    #[test]
    fn a_batch_longer_than_any_record_of_a_bag_is_refused() {
        let batch = |times: usize| {
            vec![SummaryBatch {
                writer: 1,
                witnesses: vec![1; times],
                ..Default::default()
            }]
        };
        let bytes = Bytes::from(summary_of(batch(100), 1 << 20).encode_to_vec());
        let err = decode(bytes).unwrap_err();
        assert!(err.contains("over the 67108864 a bag's frame holds"), "{err}");
        assert!(decode(Bytes::from(summary_of(batch(50), 1 << 20).encode_to_vec())).is_ok());
    }

    /// The same flood in format 1 (each batch citing the witness by index)
    /// is refused before it is turned into format 2, which rebuilds every
    /// batch.
    #[test]
    fn a_format_1_summary_is_measured_before_it_is_converted() {
        let v1 = pb::Summary {
            log: LOG.into(),
            from_secs: SECS,
            to_secs: SECS + 60,
            witnesses: vec![pb::Witness {
                body: vec![7; 50_000].into(),
                ..Default::default()
            }],
            writer_ids: vec!["w1".into()],
            bags: vec![pb::SummaryBag {
                bucket_secs: SECS,
                items: vec![pb::SummaryItem {
                    name: "w1.0.log".into(),
                    batches: vec![
                        pb::SummaryBatch {
                            witnesses: vec![0; 1000],
                            ..Default::default()
                        };
                        10
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = decode(Bytes::from(v1.encode_to_vec())).unwrap_err();
        assert!(err.contains("records would rebuild"), "{err}");
    }

    /// What a summarizer builds is within the bound and counted as what
    /// its items were: records, framed, as the bag held them.
    #[test]
    fn an_honest_summary_is_counted_as_its_items() {
        let mut b = Builder::new(LOG, SECS, SECS + 60);
        b.bag(SECS, vec![1; 32]);
        let batch = |seq: u64| pb::Batch {
            writer_id: "w1".into(),
            first_sequence: seq,
            witnesses: vec![pb::Witness {
                body: vec![3; 300].into(),
                ..Default::default()
            }],
            entries: vec![pb::Entry {
                timestamp_us: SECS * 1_000_000 + seq,
                payload: b"deposit 10".to_vec(),
            }],
            log: LOG.into(),
            bucket_secs: SECS,
            ..Default::default()
        };
        let batches: Vec<pb::Batch> = (0..100).map(batch).collect();
        let size: u64 = batches
            .iter()
            .map(|b| (frame::HEADER_LEN + b.encoded_len()) as u64)
            .sum();
        b.item("w1.0.log", size, Content::Batches(batches));
        b.item("w1.1.log", 3, Content::Raw(Bytes::from_static(b"abc")));
        let s = b.finish();
        let bytes = Bytes::from(s.encode_to_vec());
        assert_eq!(records_size(&s, u64::MAX).unwrap(), size + 3);
        assert!(decoded_size(&bytes, FORMAT_2, u64::MAX).unwrap() < 64 << 10);
        assert_eq!(decode(bytes).unwrap(), s);
    }
}
