//! A summary's stored form (format 2), and format 1 read into it.
//!
//! Format 1 was a `pb::Summary` (`proto/bagel/v1/bag.proto`): every batch
//! with its writer, sequence, signed time and witnesses by index, each
//! entry's full timestamp, each item's name and size. Format 2 keeps the
//! same records and drops what the rest of the summary gives, so that a
//! summary costs little more than its payloads and holder signatures:
//!
//! * a batch's writer, sequence, signed time and witnesses are written as
//!   a change from the batch before it in the item (a data file is one
//!   writer's batches, in sequence, under one lease: usually no change);
//! * a timestamp, as the change from the one before it in the item (the
//!   first, from the start of the bag's second): 3 bytes, not 8;
//! * item names and the key ids of local signed times are stored once
//!   each and referred to by index;
//! * an item's size is stored only when it is not what its batches
//!   framed add up to (a summarizer takes an item as batches only when
//!   they are all of its bytes, so never, unless a summary is forged).
//!
//! Nothing is lost: every batch is rebuilt field for field, so its record
//! is the very bytes its bag holds (a summarizer takes only records that
//! re-encode to their stored bytes), and [`from_format_1`] turns a format
//! 1 summary into the same value a summarizer would build from the same
//! bags. The encoding is deterministic (tables in first-seen order, fields
//! in tag order), so the same closed bags give the same bytes.
//!
//! Its fields use tags 16 and up: a format 1 reader finds none of its
//! own in a format 2 summary, takes it for a summary of no log and
//! refuses it as corrupt (its name says otherwise), rather than reading
//! it wrong. So readers are upgraded before summarizers.
//!
//! The schema is `SummaryV2` in `proto/bagel/v1/summary.proto`, for
//! readers in other languages; its messages are generated into
//! [`bagel_proto::pb`] and named here as the summary's parts.

use std::collections::HashMap;
use std::hash::Hash;

use bagel_proto::pb;
use bytes::Bytes;
use prost::Message as _;

use super::{Rebuilt, RebuiltItem, Records};
use crate::frame;

/// The format [`Summary::format`] names.
pub const FORMAT: u32 = 2;

/// A summary: every record of every bag of `[from_secs, to_secs)` of a
/// log (see `summary.proto` for each field's meaning).
pub use pb::SummaryV2 as Summary;
/// A source bag of the summary.
pub use pb::summary_v2::Bag as SummaryBag;
/// A batch, as a change from the batch before it in its item.
pub use pb::summary_v2::Batch as SummaryBatch;
/// An item of a bag, as its lock lists it.
pub use pb::summary_v2::Item as SummaryItem;
/// A signed time: a local proof in parts (its key id by index), any
/// other whole.
pub use pb::summary_v2::Time as SummaryTime;

/// The log and bag second `batch` names: its own when `elsewhere`, else
/// those of the summary and bag it is stored under (which the summary
/// leaves out).
pub fn written_in<'a>(batch: &'a SummaryBatch, summary: &'a Summary, bag: &SummaryBag) -> (&'a str, u64) {
    if batch.elsewhere {
        (&batch.log, batch.bucket_secs)
    } else {
        (&summary.log, bag.bucket_secs)
    }
}

/// An item's content, for [`Builder::item`].
#[derive(Debug)]
pub enum Content {
    /// Its records, each a batch that re-encodes to its stored bytes.
    Batches(Vec<pb::Batch>),
    /// Its bytes as stored.
    Raw(Bytes),
}

/// Interns values in first-seen order.
#[derive(Debug)]
struct Interner<K> {
    index: HashMap<K, u32>,
}

impl<K: Hash + Eq> Interner<K> {
    fn new() -> Self {
        Interner {
            index: HashMap::new(),
        }
    }

    /// `key`'s index, and whether it is new (then pushed by the caller).
    fn get(&mut self, key: K) -> (u32, bool) {
        let n = self.index.len() as u32;
        match self.index.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => (*e.get(), false),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(n);
                (n, true)
            }
        }
    }
}

/// Builds a [`Summary`] bag by bag, item by item, in order.
#[derive(Debug)]
pub struct Builder {
    log: String,
    summary: Summary,
    witnesses: Interner<Vec<u8>>,
    times: Interner<Vec<u8>>,
    writers: Interner<String>,
    key_ids: Interner<String>,
    names: Interner<String>,
}

/// Where the batch before this one in the item left off.
struct Previous {
    writer: Option<u32>,
    next_sequence: u64,
    signed_time: u32,
    witnesses: Vec<u32>,
    timestamp: u64,
}

impl Previous {
    fn at_start_of(bucket_secs: u64) -> Self {
        Previous {
            writer: None,
            next_sequence: 0,
            signed_time: 0,
            witnesses: Vec::new(),
            timestamp: bucket_secs.wrapping_mul(1_000_000),
        }
    }
}

impl Builder {
    /// An empty summary of `log`'s seconds `[from_secs, to_secs)` (Unix
    /// seconds, UTC); add its bags in order.
    pub fn new(log: &str, from_secs: u64, to_secs: u64) -> Self {
        Builder {
            log: log.to_owned(),
            summary: Summary {
                format: FORMAT,
                log: log.to_owned(),
                from_secs,
                to_secs,
                ..Default::default()
            },
            witnesses: Interner::new(),
            times: Interner::new(),
            writers: Interner::new(),
            key_ids: Interner::new(),
            names: Interner::new(),
        }
    }

    /// Starts the next bag.
    pub fn bag(&mut self, bucket_secs: u64, lock_sha256: Vec<u8>) {
        self.summary.bags.push(SummaryBag {
            bucket_secs,
            lock_sha256,
            items: Vec::new(),
        });
    }

    /// Adds an item to the bag last started.
    pub fn item(&mut self, name: &str, size: u64, content: Content) {
        let bucket_secs = self
            .summary
            .bags
            .last()
            .expect("a bag is started first")
            .bucket_secs;
        let (name_index, new) = self.names.get(name.to_owned());
        if new {
            self.summary.item_names.push(name.to_owned());
        }
        let mut item = SummaryItem {
            name: name_index,
            ..Default::default()
        };
        let implied = match content {
            Content::Raw(raw) => {
                item.is_raw = true;
                let len = raw.len() as u64;
                item.raw = raw;
                len
            }
            Content::Batches(batches) => {
                let mut prev = Previous::at_start_of(bucket_secs);
                let mut framed = 0u64;
                for b in batches {
                    framed += (frame::HEADER_LEN + b.encoded_len()) as u64;
                    let packed = self.batch(bucket_secs, &mut prev, b);
                    item.batches.push(packed);
                }
                framed
            }
        };
        item.size = (size != implied).then_some(size);
        self.summary
            .bags
            .last_mut()
            .expect("a bag is started first")
            .items
            .push(item);
    }

    fn batch(&mut self, bucket_secs: u64, prev: &mut Previous, b: pb::Batch) -> SummaryBatch {
        let (writer, new) = self.writers.get(b.writer_id.clone());
        if new {
            self.summary.writer_ids.push(b.writer_id);
        }
        let writer_field = if prev.writer == Some(writer) {
            0
        } else {
            writer + 1
        };
        prev.writer = Some(writer);
        let sequence_gap = b.first_sequence.wrapping_sub(prev.next_sequence);
        prev.next_sequence = b.first_sequence.wrapping_add(b.entries.len() as u64);
        let time = match b.signed_time {
            None => 0,
            Some(t) => self.time(t) + 1,
        };
        let signed_time_step = i64::from(time) - i64::from(prev.signed_time);
        prev.signed_time = time;
        let witnesses: Vec<u32> = b
            .witnesses
            .into_iter()
            .map(|w| {
                let (i, new) = self.witnesses.get(w.encode_to_vec());
                if new {
                    self.summary.witnesses.push(w);
                }
                i + 1
            })
            .collect();
        let witness_field = if witnesses == prev.witnesses {
            Vec::new()
        } else if witnesses.is_empty() {
            vec![0]
        } else {
            witnesses.clone()
        };
        prev.witnesses = witnesses;
        let mut timestamps = Vec::with_capacity(b.entries.len());
        let mut payloads = Vec::with_capacity(b.entries.len());
        for e in b.entries {
            timestamps.push(e.timestamp_us.wrapping_sub(prev.timestamp) as i64);
            prev.timestamp = e.timestamp_us;
            payloads.push(Bytes::from(e.payload));
        }
        let elsewhere = b.log != self.log || b.bucket_secs != bucket_secs;
        SummaryBatch {
            writer: writer_field,
            sequence_gap,
            signed_time_step,
            witnesses: witness_field,
            timestamps,
            payloads,
            elsewhere,
            log: if elsewhere { b.log } else { String::new() },
            bucket_secs: if elsewhere { b.bucket_secs } else { 0 },
            holder_signatures: b.holder_signatures.into_iter().map(Bytes::from).collect(),
        }
    }

    /// The index of a signed time, interned by its encoded bytes.
    fn time(&mut self, t: pb::SignedTime) -> u32 {
        let (i, new) = self.times.get(t.encode_to_vec());
        if new {
            let packed = match t.proof {
                Some(pb::signed_time::Proof::Local(local)) => {
                    let (key_id, new) = self.key_ids.get(local.key_id.clone());
                    if new {
                        self.summary.key_ids.push(local.key_id);
                    }
                    SummaryTime {
                        body: Bytes::from(local.body),
                        signature: Bytes::from(local.signature),
                        key_id,
                        other: None,
                    }
                }
                proof => SummaryTime {
                    other: Some(pb::SignedTime { proof }),
                    ..Default::default()
                },
            };
            self.summary.signed_times.push(packed);
        }
        i
    }

    /// The summary of everything added.
    pub fn finish(self) -> Summary {
        self.summary
    }
}

/// Rebuilds an item of `bag`; an index out of range or a batch that does
/// not fit is refused (`Err` says why).
pub fn unpack_item(summary: &Summary, bag: &SummaryBag, item: &SummaryItem) -> Result<RebuiltItem, String> {
    let name = summary.item_names[pick(item.name, summary.item_names.len(), "item name")?].clone();
    if item.is_raw {
        return Ok(RebuiltItem {
            name,
            size: item.size.unwrap_or(item.raw.len() as u64),
            records: Records::Raw(item.raw.clone()),
        });
    }
    let mut offset = 0u64;
    let mut out = Vec::with_capacity(item.batches.len());
    walk_item(summary, bag, item, |p| {
        let b = p.batch;
        let batch = pb::Batch {
            writer_id: summary.writer_ids[p.writer as usize].clone(),
            first_sequence: p.first_sequence,
            signed_time: match p.signed_time {
                0 => None,
                t => Some(signed_time(summary, t as usize - 1).expect("walk_item checked it")),
            },
            witnesses: p
                .witnesses
                .iter()
                .map(|i| summary.witnesses[*i as usize - 1].clone())
                .collect(),
            entries: p
                .timestamps
                .iter()
                .zip(&b.payloads)
                .map(|(t, payload)| pb::Entry {
                    timestamp_us: *t,
                    payload: payload.to_vec(),
                })
                .collect(),
            log: written_in(b, summary, bag).0.to_owned(),
            bucket_secs: written_in(b, summary, bag).1,
            holder_signatures: b.holder_signatures.iter().map(|s| s.to_vec()).collect(),
        };
        let body = Bytes::from(batch.encode_to_vec());
        let len = (frame::HEADER_LEN + body.len()) as u64;
        out.push(Rebuilt { offset, body, batch });
        offset += len;
    })?;
    Ok(RebuiltItem {
        name,
        size: item.size.unwrap_or(offset),
        records: Records::Batches(out),
    })
}

/// A batch of a summarized item as [`rebuild_shared`] gives it: its
/// witnesses apart, shared with the batches before it that cite the same
/// list, and its record only as its SHA-256 and length.
#[derive(Clone, Debug)]
pub(crate) struct SharedBatch {
    /// Its frame's offset in the item.
    pub offset: u64,
    /// The SHA-256 of its record: of the bytes [`unpack_item`] rebuilds.
    pub digest: [u8; 32],
    /// The batch, but for its witnesses (left empty: see `witnesses`).
    pub batch: pb::Batch,
    /// Its witnesses, in order.
    pub witnesses: std::sync::Arc<[pb::Witness]>,
}

/// The batches of a (not raw) item, as [`unpack_item`] rebuilds them but
/// without copying a witness into each batch that cites it, or holding a
/// record's bytes: a list of witnesses is built once and shared by every
/// batch that cites it next ("same as the previous"), and each record is
/// hashed as it would be encoded, a part at a time (each cited witness
/// encoded once per item). With the item's size as its batches framed.
/// What a reader holds for an item is then what it stores, not what its
/// citations add up to (a list cited again by each of ten batches is one
/// list, not ten).
pub(crate) fn rebuild_shared(
    summary: &Summary,
    bag: &SummaryBag,
    item: &SummaryItem,
) -> Result<(Vec<SharedBatch>, u64), String> {
    use prost::encoding::{WireType, encode_key, encode_varint, message, string, uint64};
    use sha2::{Digest as _, Sha256};
    use std::sync::Arc;
    // Each cited witness as its field in a record (tag 4), encoded once.
    let mut fields: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut last: Option<(Vec<u32>, Arc<[pb::Witness]>)> = None;
    let mut out = Vec::with_capacity(item.batches.len());
    let mut offset = 0u64;
    walk_item(summary, bag, item, |p| {
        let witnesses = match &last {
            Some((list, shared)) if list[..] == *p.witnesses => Arc::clone(shared),
            _ => {
                let shared: Arc<[pb::Witness]> = p
                    .witnesses
                    .iter()
                    .map(|i| summary.witnesses[*i as usize - 1].clone())
                    .collect();
                last = Some((p.witnesses.to_vec(), Arc::clone(&shared)));
                shared
            }
        };
        let b = p.batch;
        let (log, bucket_secs) = written_in(b, summary, bag);
        let batch = pb::Batch {
            writer_id: summary.writer_ids[p.writer as usize].clone(),
            first_sequence: p.first_sequence,
            signed_time: match p.signed_time {
                0 => None,
                t => Some(signed_time(summary, t as usize - 1).expect("walk_item checked it")),
            },
            witnesses: Vec::new(),
            entries: p
                .timestamps
                .iter()
                .zip(&b.payloads)
                .map(|(t, payload)| pb::Entry {
                    timestamp_us: *t,
                    payload: payload.to_vec(),
                })
                .collect(),
            log: log.to_owned(),
            bucket_secs,
            holder_signatures: b.holder_signatures.iter().map(|s| s.to_vec()).collect(),
        };
        // prost encodes fields in tag order, and the default ones not at
        // all: the record is fields 1 to 3, the witnesses (4), then 5 to 8.
        let rest = batch.encode_to_vec();
        let head = if batch.writer_id.is_empty() {
            0
        } else {
            string::encoded_len(1, &batch.writer_id)
        } + if batch.first_sequence == 0 {
            0
        } else {
            uint64::encoded_len(2, &batch.first_sequence)
        } + batch
            .signed_time
            .as_ref()
            .map_or(0, |t| message::encoded_len(3, t));
        let mut hash = Sha256::new();
        hash.update(&rest[..head]);
        let mut len = rest.len();
        for i in p.witnesses {
            let field = fields.entry(*i).or_insert_with(|| {
                let w = &summary.witnesses[*i as usize - 1];
                let mut f = Vec::with_capacity(w.encoded_len() + 10);
                encode_key(4, WireType::LengthDelimited, &mut f);
                encode_varint(w.encoded_len() as u64, &mut f);
                w.encode(&mut f).expect("a Vec grows");
                f
            });
            hash.update(&field[..]);
            len += field.len();
        }
        hash.update(&rest[head..]);
        out.push(SharedBatch {
            offset,
            digest: hash.finalize().into(),
            batch,
            witnesses,
        });
        offset += (frame::HEADER_LEN + len) as u64;
    })?;
    Ok((out, offset))
}

/// `i` as an index into a table of `len`, or why not.
fn pick(i: u32, len: usize, what: &str) -> Result<usize, String> {
    usize::try_from(i)
        .ok()
        .filter(|i| *i < len)
        .ok_or_else(|| format!("{what} index {i} out of range"))
}

/// A batch of a (not raw) item as its packed parts give it, every index
/// checked, before anything is rebuilt: what [`unpack_item`] rebuilds it
/// from, and all a reader that need not rebuild it uses.
pub(crate) struct Parts<'a> {
    /// Index into `writer_ids`.
    pub writer: u32,
    pub first_sequence: u64,
    /// Index + 1 into `signed_times` (0: none).
    pub signed_time: u32,
    /// Indexes + 1 into `witnesses`.
    pub witnesses: &'a [u32],
    /// One per payload of `batch`.
    pub timestamps: &'a [u64],
    /// The packed batch: payloads, holder signatures, where it says it
    /// belongs.
    pub batch: &'a SummaryBatch,
}

/// Calls `f` with each batch of a (not raw) item, in order, as
/// [`unpack_item`] would rebuild it; a batch that does not fit is refused
/// (`Err` says why, as [`unpack_item`] says it) and `f` is not called for
/// it or any after it.
pub(crate) fn walk_item(
    summary: &Summary,
    bag: &SummaryBag,
    item: &SummaryItem,
    mut f: impl FnMut(Parts<'_>),
) -> Result<(), String> {
    let mut prev = Previous::at_start_of(bag.bucket_secs);
    let mut timestamps = Vec::new();
    // The witness list last checked (a list is checked when it changes).
    let mut checked_witnesses: Option<Vec<u32>> = None;
    for b in &item.batches {
        let writer = match (b.writer, prev.writer) {
            (0, Some(w)) => w,
            (0, None) => return Err("the first batch of an item names no writer".into()),
            (w, _) => w - 1,
        };
        pick(writer, summary.writer_ids.len(), "writer")?;
        prev.writer = Some(writer);
        let first_sequence = prev.next_sequence.wrapping_add(b.sequence_gap);
        prev.next_sequence = first_sequence.wrapping_add(b.timestamps.len() as u64);
        let time = i64::from(prev.signed_time)
            .checked_add(b.signed_time_step)
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(|| format!("signed time step {} out of range", b.signed_time_step))?;
        prev.signed_time = time;
        if time != 0 {
            check_signed_time(
                summary,
                pick(time - 1, summary.signed_times.len(), "signed time")?,
            )?;
        }
        match b.witnesses.as_slice() {
            [] => {}
            [0] => prev.witnesses.clear(),
            list if list.contains(&0) => return Err("a witness list mixes none with witnesses".into()),
            list => prev.witnesses = list.to_vec(),
        }
        if checked_witnesses.as_ref() != Some(&prev.witnesses) {
            for i in &prev.witnesses {
                pick(i - 1, summary.witnesses.len(), "witness")?;
            }
            checked_witnesses = Some(prev.witnesses.clone());
        }
        if b.timestamps.len() != b.payloads.len() {
            return Err(format!(
                "a batch has {} timestamps and {} payloads",
                b.timestamps.len(),
                b.payloads.len()
            ));
        }
        timestamps.clear();
        for d in &b.timestamps {
            prev.timestamp = prev.timestamp.wrapping_add(*d as u64);
            timestamps.push(prev.timestamp);
        }
        f(Parts {
            writer,
            first_sequence,
            signed_time: time,
            witnesses: &prev.witnesses,
            timestamps: &timestamps,
            batch: b,
        });
    }
    Ok(())
}

/// The length of the record [`unpack_item`] rebuilds from `p` (its
/// batch's encoding), without rebuilding it: `witness_len` and `time_len`
/// give the encoded length of a witness and of a signed time by index (as
/// in [`Parts`]).
pub(crate) fn record_len(
    summary: &Summary,
    bag: &SummaryBag,
    p: &Parts<'_>,
    witness_len: impl Fn(u32) -> usize,
    time_len: impl Fn(u32) -> usize,
) -> usize {
    use prost::encoding::{encoded_len_varint as varint, key_len};
    let bytes = |tag: u32, len: usize| key_len(tag) + varint(len as u64) + len;
    let non_zero = |tag: u32, v: u64| if v == 0 { 0 } else { key_len(tag) + varint(v) };
    let string = |tag: u32, s: &str| if s.is_empty() { 0 } else { bytes(tag, s.len()) };
    let b = p.batch;
    let (log, bucket_secs) = written_in(b, summary, bag);
    let mut len = string(1, &summary.writer_ids[p.writer as usize])
        + non_zero(2, p.first_sequence)
        + string(6, log)
        + non_zero(7, bucket_secs);
    if p.signed_time != 0 {
        len += bytes(3, time_len(p.signed_time));
    }
    len += p
        .witnesses
        .iter()
        .map(|i| bytes(4, witness_len(*i)))
        .sum::<usize>();
    for (t, payload) in p.timestamps.iter().zip(&b.payloads) {
        let entry = non_zero(1, *t)
            + if payload.is_empty() {
                0
            } else {
                bytes(2, payload.len())
            };
        len += bytes(5, entry);
    }
    len + b
        .holder_signatures
        .iter()
        .map(|s| bytes(8, s.len()))
        .sum::<usize>()
}

/// Checks what [`signed_time`] needs of signed time `i` (in range).
fn check_signed_time(summary: &Summary, i: usize) -> Result<(), String> {
    let t = &summary.signed_times[i];
    if t.other.is_none()
        && usize::try_from(t.key_id)
            .ok()
            .and_then(|k| summary.key_ids.get(k))
            .is_none()
    {
        return Err(format!("key id index {} out of range", t.key_id));
    }
    Ok(())
}

/// Signed time `i` (in range) of `summary`, as its batches hold it.
pub(crate) fn signed_time(summary: &Summary, i: usize) -> Result<pb::SignedTime, String> {
    let t = &summary.signed_times[i];
    if let Some(other) = &t.other {
        return Ok(other.clone());
    }
    let key_id = usize::try_from(t.key_id)
        .ok()
        .and_then(|k| summary.key_ids.get(k))
        .ok_or_else(|| format!("key id index {} out of range", t.key_id))?;
    Ok(pb::SignedTime {
        proof: Some(pb::signed_time::Proof::Local(pb::LocalTimeProof {
            body: t.body.to_vec(),
            signature: t.signature.to_vec(),
            key_id: key_id.clone(),
        })),
    })
}

/// A format 1 summary as the [`Summary`] that holds the same records: the
/// one a summarizer builds from the same bags.
pub fn from_format_1(v1: pb::Summary) -> Result<Summary, String> {
    let mut out = Builder::new(&v1.log, v1.from_secs, v1.to_secs);
    for bag in &v1.bags {
        out.bag(bag.bucket_secs, bag.lock_sha256.clone());
        for item in &bag.items {
            let content = match item.is_raw {
                true => Content::Raw(Bytes::from(item.raw.clone())),
                false => Content::Batches(format_1_batches(&v1, bag, item)?),
            };
            out.item(&item.name, item.size, content);
        }
    }
    Ok(out.finish())
}

/// The batches of a format 1 item, rebuilt.
fn format_1_batches(
    summary: &pb::Summary,
    bag: &pb::SummaryBag,
    item: &pb::SummaryItem,
) -> Result<Vec<pb::Batch>, String> {
    let pick = |i: u32, len: usize, what: &str| {
        usize::try_from(i)
            .ok()
            .filter(|i| *i < len)
            .ok_or_else(|| format!("{what} index {i} out of range"))
    };
    item.batches
        .iter()
        .map(|b| {
            let signed_time = match b.signed_time {
                0 => None,
                i => Some(
                    summary.signed_times[pick(i - 1, summary.signed_times.len(), "signed time")?].clone(),
                ),
            };
            Ok(pb::Batch {
                writer_id: summary.writer_ids[pick(b.writer, summary.writer_ids.len(), "writer")?].clone(),
                first_sequence: b.first_sequence,
                signed_time,
                witnesses: b
                    .witnesses
                    .iter()
                    .map(|i| Ok(summary.witnesses[pick(*i, summary.witnesses.len(), "witness")?].clone()))
                    .collect::<Result<Vec<_>, String>>()?,
                entries: b.entries.clone(),
                log: if b.elsewhere {
                    b.log.clone()
                } else {
                    summary.log.clone()
                },
                bucket_secs: if b.elsewhere {
                    b.bucket_secs
                } else {
                    bag.bucket_secs
                },
                holder_signatures: b.holder_signatures.clone(),
            })
        })
        .collect()
}

/// Decodes a stored summary of either format, within
/// [`super::MAX_SUMMARY_EXPANSION`] (`super::budget`): what it takes
/// decoded is counted on its bytes before prost decodes them, and what
/// its records rebuild to is counted before any is rebuilt (for format 1,
/// before it is turned into format 2, which rebuilds them). Every
/// reader, auditor, retention run and summarizer decodes through here, so
/// a summary over the bound is refused as corrupt before it costs more
/// than its bytes and its decoded form.
pub fn decode(bytes: Bytes) -> Result<Summary, String> {
    use super::budget::{self, check_decoded, check_records};
    let cap = super::MAX_SUMMARY_EXPANSION;
    check_decoded(&bytes, budget::FORMAT_2)?;
    let s = Summary::decode(bytes.clone()).map_err(|e| format!("does not decode: {e}"))?;
    let s = match s.format {
        FORMAT => s,
        // No format field: format 1, whose fields format 2 skips.
        0 => {
            check_decoded(&bytes, budget::FORMAT_1)?;
            let v1 = pb::Summary::decode(bytes).map_err(|e| format!("does not decode: {e}"))?;
            check_records(budget::records_size_v1(&v1, cap))?;
            from_format_1(v1)?
        }
        other => {
            return Err(format!(
                "format {other} is not one this reader knows (1 or {FORMAT})"
            ));
        }
    };
    check_records(budget::records_size(&s, cap)?)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LOG: &str = "ledger";
    /// A whole minute.
    const SECS: u64 = 1_899_999_960;

    fn witness(i: u8) -> pb::Witness {
        pb::Witness {
            body: vec![i; 40].into(),
            signature: vec![i; 64].into(),
            key_id: format!("k{i}"),
            ..Default::default()
        }
    }

    fn local_time(t: u64, key: &str) -> pb::SignedTime {
        pb::SignedTime {
            proof: Some(pb::signed_time::Proof::Local(pb::LocalTimeProof {
                body: t.to_be_bytes().to_vec(),
                signature: vec![7; 64],
                key_id: key.into(),
            })),
        }
    }

    /// One item's batches as a random writer would leave them, and then
    /// some no writer would: several writers, sequence jumps and steps
    /// back, witnesses changing or missing, times missing or of another
    /// kind, timestamps before the bag or far after, misplaced batches.
    fn arb_batches() -> impl Strategy<Value = Vec<pb::Batch>> {
        let batch = (
            0..3usize,
            prop_oneof![Just(None), (0..4u64).prop_map(Some), Just(Some(u64::MAX))],
            0..5u8,
            prop::collection::vec(0..3u8, 0..3),
            prop::collection::vec((any::<i32>(), prop::collection::vec(any::<u8>(), 0..20)), 0..4),
            0..4u8,
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..70), 0..3),
        );
        prop::collection::vec(batch, 0..8).prop_map(|v| {
            let mut seq = 0u64;
            v.into_iter()
                .map(|(writer, jump, time, witnesses, entries, place, sigs)| {
                    seq = match jump {
                        None => seq,
                        Some(j) => seq.wrapping_add(j).wrapping_sub(1),
                    };
                    let first_sequence = seq;
                    seq = seq.wrapping_add(entries.len() as u64);
                    pb::Batch {
                        writer_id: format!("w{writer}"),
                        first_sequence,
                        signed_time: match time {
                            0 => None,
                            1 => Some(pb::SignedTime::default()),
                            t => Some(local_time(u64::from(t), &format!("key{}", t % 2))),
                        },
                        witnesses: witnesses.into_iter().map(witness).collect(),
                        entries: entries
                            .into_iter()
                            .map(|(d, payload)| pb::Entry {
                                timestamp_us: (SECS * 1_000_000).wrapping_add(d as i64 as u64),
                                payload,
                            })
                            .collect(),
                        log: if place == 1 { "other".into() } else { LOG.into() },
                        bucket_secs: match place {
                            2 => SECS + 1,
                            3 => 0,
                            _ => SECS,
                        },
                        holder_signatures: sigs,
                    }
                })
                .collect()
        })
    }

    /// Format 1 as its summarizer made it.
    fn format_1(items: &[(String, u64, Option<Vec<pb::Batch>>, Bytes)]) -> pb::Summary {
        fn intern<T: prost::Message + Clone>(
            index: &mut HashMap<Vec<u8>, u32>,
            items: &mut Vec<T>,
            t: &T,
        ) -> u32 {
            *index.entry(t.encode_to_vec()).or_insert_with(|| {
                items.push(t.clone());
                (items.len() - 1) as u32
            })
        }
        let (mut wi, mut ti, mut writers) = (HashMap::new(), HashMap::new(), Vec::<String>::new());
        let mut s = pb::Summary {
            log: LOG.into(),
            from_secs: SECS,
            to_secs: SECS + 60,
            ..Default::default()
        };
        let mut bag = pb::SummaryBag {
            bucket_secs: SECS,
            lock_sha256: vec![1; 32],
            items: Vec::new(),
        };
        for (name, size, batches, raw) in items {
            let mut out = pb::SummaryItem {
                name: name.clone(),
                size: *size,
                ..Default::default()
            };
            match batches {
                None => {
                    out.is_raw = true;
                    out.raw = raw.to_vec();
                }
                Some(batches) => {
                    for b in batches {
                        let writer = match writers.iter().position(|w| *w == b.writer_id) {
                            Some(i) => i as u32,
                            None => {
                                writers.push(b.writer_id.clone());
                                (writers.len() - 1) as u32
                            }
                        };
                        let elsewhere = b.log != LOG || b.bucket_secs != SECS;
                        out.batches.push(pb::SummaryBatch {
                            writer,
                            first_sequence: b.first_sequence,
                            signed_time: b
                                .signed_time
                                .as_ref()
                                .map_or(0, |t| intern(&mut ti, &mut s.signed_times, t) + 1),
                            witnesses: b
                                .witnesses
                                .iter()
                                .map(|w| intern(&mut wi, &mut s.witnesses, w))
                                .collect(),
                            entries: b.entries.clone(),
                            elsewhere,
                            log: if elsewhere { b.log.clone() } else { String::new() },
                            bucket_secs: if elsewhere { b.bucket_secs } else { 0 },
                            holder_signatures: b.holder_signatures.clone(),
                        });
                    }
                }
            }
            bag.items.push(out);
        }
        s.writer_ids = writers;
        s.bags.push(bag);
        s
    }

    fn framed(batches: &[pb::Batch]) -> u64 {
        batches
            .iter()
            .map(|b| (frame::HEADER_LEN + b.encoded_len()) as u64)
            .sum()
    }

    proptest! {
        /// Every batch comes back field for field (so its record is the
        /// very bytes it was), every raw item byte for byte, every name
        /// and size as listed; the bytes are the same each time they are
        /// made; and a format 1 summary of the same items reads as the
        /// same summary.
        #[test]
        fn summaries_rebuild_exactly_what_went_in(
            items in prop::collection::vec((arb_batches(), any::<bool>(), any::<bool>(), 0..3u8), 1..5),
        ) {
            let items: Vec<(String, u64, Option<Vec<pb::Batch>>, Bytes)> = items
                .into_iter()
                .enumerate()
                .map(|(i, (batches, raw, odd_size, name))| {
                    let name = format!("w{name}.0000000{i}.0.log");
                    match raw {
                        true => {
                            let bytes = Bytes::from(vec![i as u8; 5 + i]);
                            let size = if odd_size { 99 } else { bytes.len() as u64 };
                            (name, size, None, bytes)
                        }
                        false => {
                            let size = if odd_size { 7 } else { framed(&batches) };
                            (name, size, Some(batches), Bytes::new())
                        }
                    }
                })
                .collect();
            let build = || {
                let mut b = Builder::new(LOG, SECS, SECS + 60);
                b.bag(SECS, vec![1; 32]);
                for (name, size, batches, raw) in &items {
                    let content = match batches {
                        Some(batches) => Content::Batches(batches.clone()),
                        None => Content::Raw(raw.clone()),
                    };
                    b.item(name, *size, content);
                }
                b.finish()
            };
            let summary = build();
            let bytes = Bytes::from(summary.encode_to_vec());
            prop_assert_eq!(&bytes, &Bytes::from(build().encode_to_vec()));
            let read = decode(bytes.clone()).unwrap();
            prop_assert_eq!(&read, &summary);
            for ((name, size, batches, raw), item) in items.iter().zip(&read.bags[0].items) {
                let got = unpack_item(&read, &read.bags[0], item).unwrap();
                prop_assert_eq!(&got.name, name);
                prop_assert_eq!(got.size, *size);
                match (batches, got.records) {
                    (None, Records::Raw(r)) => prop_assert_eq!(&r, raw),
                    (Some(want), Records::Batches(got)) => {
                        prop_assert_eq!(got.len(), want.len());
                        let mut offset = 0;
                        for (g, w) in got.iter().zip(want) {
                            prop_assert_eq!(&g.batch, w);
                            prop_assert_eq!(&g.body[..], &w.encode_to_vec()[..]);
                            prop_assert_eq!(g.offset, offset);
                            offset += (frame::HEADER_LEN + g.body.len()) as u64;
                        }
                    }
                    _ => prop_assert!(false, "raw and batches swapped"),
                }
            }
            // Walked without rebuilding, each batch has the length of its
            // record (what a reader that does not rebuild places it by).
            for item in read.bags[0].items.iter().filter(|i| !i.is_raw) {
                let Records::Batches(rebuilt) = unpack_item(&read, &read.bags[0], item).unwrap().records else {
                    unreachable!("not raw");
                };
                let mut lens = Vec::new();
                walk_item(&read, &read.bags[0], item, |p| {
                    lens.push(record_len(
                        &read,
                        &read.bags[0],
                        &p,
                        |i| read.witnesses[i as usize - 1].encoded_len(),
                        |t| signed_time(&read, t as usize - 1).unwrap().encoded_len(),
                    ));
                })
                .unwrap();
                let want: Vec<usize> = rebuilt.iter().map(|r| r.body.len()).collect();
                prop_assert_eq!(lens, want);
                // Rebuilt with shared witnesses and hashed a part at a
                // time: the same batches, records, offsets and size.
                let (shared, size) = rebuild_shared(&read, &read.bags[0], item).unwrap();
                prop_assert_eq!(shared.len(), rebuilt.len());
                let framed: u64 = rebuilt.iter().map(|r| (frame::HEADER_LEN + r.body.len()) as u64).sum();
                prop_assert_eq!(size, framed);
                for (s, r) in shared.into_iter().zip(&rebuilt) {
                    use sha2::Digest as _;
                    prop_assert_eq!(s.offset, r.offset);
                    prop_assert_eq!(s.digest, <[u8; 32]>::from(sha2::Sha256::digest(&r.body)));
                    let mut whole = s.batch;
                    whole.witnesses = s.witnesses.to_vec();
                    prop_assert_eq!(&whole, &r.batch);
                }
            }
            let v1 = Bytes::from(format_1(&items).encode_to_vec());
            prop_assert_eq!(decode(v1).unwrap(), summary);
        }
    }

    /// A summarizer that finds the same records already published in
    /// format 1 takes them for its own; other records it refuses. A
    /// reader loads either as the same summary.
    #[tokio::test]
    async fn a_format_1_summary_of_the_same_records_is_the_same_summary() {
        use crate::BagStore as _;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::directory::DirectoryStore::local(dir.path(), false);
        let stretch = super::super::Stretch::new(crate::seal::Span::of(crate::Bucket::from_secs(SECS)), 1);
        let batches = vec![pb::Batch {
            writer_id: "w0".into(),
            witnesses: vec![witness(1)],
            entries: vec![pb::Entry {
                timestamp_us: SECS * 1_000_000 + 5,
                payload: b"deposit 10".to_vec(),
            }],
            log: LOG.into(),
            bucket_secs: SECS,
            ..Default::default()
        }];
        let items = vec![(
            "w0.1.0.log".to_owned(),
            framed(&batches),
            Some(batches),
            Bytes::new(),
        )];
        let mut b = Builder::new(LOG, SECS, SECS + 60);
        b.bag(SECS, vec![1; 32]);
        b.item(
            &items[0].0,
            items[0].1,
            Content::Batches(items[0].2.clone().unwrap()),
        );
        let ours = b.finish();
        let v1 = format_1(&items);
        store
            .put_first(LOG, "_summary/1899999960.60", Bytes::from(v1.encode_to_vec()))
            .await
            .unwrap();
        let loaded = super::super::load(&store, LOG, stretch).await.unwrap();
        assert_eq!(loaded, ours);
        let (_, created) = super::super::publish(&store, LOG, stretch, &ours).await.unwrap();
        assert!(!created);
        let mut other = ours.clone();
        other.bags[0].items.pop();
        let err = super::super::publish(&store, LOG, stretch, &other)
            .await
            .unwrap_err();
        assert!(matches!(err, crate::Error::SummaryMismatch { .. }), "{err}");
    }

    /// A reader of format 1 finds nothing of its own in format 2: a
    /// summary of no log, which it refuses as not what its name says.
    #[test]
    fn a_format_1_reader_refuses_format_2_rather_than_misread_it() {
        let mut b = Builder::new(LOG, SECS, SECS + 60);
        b.bag(SECS, vec![1; 32]);
        b.item("w0.0.log", 3, Content::Raw(Bytes::from_static(b"abc")));
        let old = pb::Summary::decode(Bytes::from(b.finish().encode_to_vec())).unwrap();
        assert_eq!(old, pb::Summary::default());
    }

    /// A summary of every kind of part: two bags, writers changing and
    /// coming back, a sequence jump, local and Roughtime signed times (and
    /// none), witnesses changing and missing, timestamps stepping back, a
    /// misplaced batch, a raw item and sizes that are not what was framed.
    fn every_kind_of_part() -> Summary {
        let roughtime = pb::SignedTime {
            proof: Some(pb::signed_time::Proof::Roughtime(pb::RoughtimeProof {
                request: vec![1, 2],
                response: vec![3, 4, 5],
                public_key: vec![6; 32],
                blind: vec![7; 4],
            })),
        };
        let batch =
            |writer: &str, first_sequence: u64, time: Option<pb::SignedTime>, witnesses: Vec<u8>| pb::Batch {
                writer_id: writer.into(),
                first_sequence,
                signed_time: time,
                witnesses: witnesses.into_iter().map(witness).collect(),
                entries: vec![
                    pb::Entry {
                        timestamp_us: SECS * 1_000_000 + 700_000 + first_sequence,
                        payload: format!("{writer} {first_sequence}").into_bytes(),
                    },
                    pb::Entry {
                        timestamp_us: SECS * 1_000_000 + 5,
                        payload: Vec::new(),
                    },
                ],
                log: LOG.into(),
                bucket_secs: SECS,
                holder_signatures: vec![vec![9; 64], vec![first_sequence as u8; 3]],
            };
        let first = vec![
            batch("w0", 0, Some(local_time(1, "key0")), vec![1, 2]),
            batch("w0", 2, Some(local_time(1, "key0")), vec![1, 2]),
            batch("w1", 9, Some(roughtime.clone()), vec![]),
            batch("w0", 11, None, vec![3]),
            pb::Batch {
                log: "other".into(),
                bucket_secs: SECS + 7,
                ..batch("w2", 3, Some(local_time(2, "key1")), vec![1])
            },
        ];
        let mut b = Builder::new(LOG, SECS, SECS + 60);
        b.bag(SECS, vec![1; 32]);
        b.item("w0.00000001.0.log", framed(&first), Content::Batches(first));
        b.item("raw.log", 3, Content::Raw(Bytes::from_static(b"abc")));
        b.bag(SECS + 1, vec![2; 32]);
        let second = vec![batch("w1", 13, Some(roughtime), vec![2])];
        b.item("w0.00000001.0.log", 1, Content::Batches(second));
        b.item("raw.log", 99, Content::Raw(Bytes::from_static(b"de")));
        b.finish()
    }

    /// [`every_kind_of_part`] as format 2 stores it (hex): the bytes a
    /// summary is published as, and every reader's input, fixed.
    const EVERY_KIND_OF_PART: &str = concat!(
        "8001028a01066c65646765729001d8e5fe8907980194e6fe8907a201700a280101010101010101010101010101010101",
        "010101010101010101010101010101010101010101010112400101010101010101010101010101010101010101010101",
        "01010101010101010101010101010101010101010101010101010101010101010101010101010101011a026b31a20170",
        "0a2802020202020202020202020202020202020202020202020202020202020202020202020202020202124002020202",
        "020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202",
        "0202020202020202020202021a026b32a201700a28030303030303030303030303030303030303030303030303030303",
        "030303030303030303030303031240030303030303030303030303030303030303030303030303030303030303030303",
        "030303030303030303030303030303030303030303030303030303030303031a026b33aa014c0a080000000000000001",
        "124007070707070707070707070707070707070707070707070707070707070707070707070707070707070707070707",
        "070707070707070707070707070707070707aa0135223312310a02010212030304051a20060606060606060606060606",
        "0606060606060606060606060606060606060606220407070707aa014e0a080000000000000002124007070707070707",
        "070707070707070707070707070707070707070707070707070707070707070707070707070707070707070707070707",
        "0707070707070707071801b201027730b201027731b201027732ba01046b657930ba01046b657931c2011177302e3030",
        "3030303030312e302e6c6f67c201077261772e6c6f67ca01ad0408d8e5fe890712200101010101010101010101010101",
        "0101010101010101010101010101010101011af7031a5f08011802220201022a06c0b955b5b955320477302030320052",
        "400909090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909",
        "090909090909090909090909090909090952030000001a572a06bab955b9b95532047730203232005240090909090909",
        "090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909",
        "0909090909090909090952030202021a600802100518022201002a06c8b955c7b9553204773120393200524009090909",
        "090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909",
        "09090909090909090909090952030909091a5f080118032201032a06ccb955cbb9553205773020313132005240090909",
        "090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909090909",
        "0909090909090909090909090952030b0b0b1a78080310f6ffffffffffffffff0118062201012a06bcb955bbb9553204",
        "773220333200380142056f7468657248dfe5fe8907524009090909090909090909090909090909090909090909090909",
        "09090909090909090909090909090909090909090909090909090909090909090909090909090952030303031a090801",
        "22036162632801ca01ab0108d9e5fe890712200202020202020202020202020202020202020202020202020202020202",
        "0202021a7510011a710802100d18042201022a06a5cf24cfb955320577312031333200380142066c656467657248d8e5",
        "fe8907524009090909090909090909090909090909090909090909090909090909090909090909090909090909090909",
        "09090909090909090909090909090909090909090952030d0d0d1a0a08011063220264652801",
    );

    /// The schema and the encoder stay byte for byte what published
    /// summaries hold: the same summary encodes to the same bytes, and
    /// those bytes decode to it.
    #[test]
    fn a_known_summary_encodes_to_its_fixed_bytes() {
        let want: Vec<u8> = (0..EVERY_KIND_OF_PART.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&EVERY_KIND_OF_PART[i..i + 2], 16).expect("hex"))
            .collect();
        let summary = every_kind_of_part();
        assert_eq!(
            bagel_proto::hex::encode(&summary.encode_to_vec()),
            EVERY_KIND_OF_PART
        );
        assert_eq!(decode(Bytes::from(want)).unwrap(), summary);
    }

    #[test]
    fn unknown_formats_and_parts_that_do_not_fit_are_refused() {
        let mut s = Builder::new(LOG, SECS, SECS + 60).finish();
        s.format = 3;
        let err = decode(Bytes::from(s.encode_to_vec())).unwrap_err();
        assert!(err.contains("format 3"), "{err}");
        let batch = |b: SummaryBatch| {
            let mut s = Builder::new(LOG, SECS, SECS + 60).finish();
            s.writer_ids.push("w0".into());
            s.item_names.push("w0.log".into());
            let bag = SummaryBag {
                bucket_secs: SECS,
                items: vec![SummaryItem {
                    batches: vec![b],
                    ..Default::default()
                }],
                ..Default::default()
            };
            unpack_item(&s, &bag, &bag.items[0]).map(|_| ())
        };
        let ok = SummaryBatch {
            writer: 1,
            ..Default::default()
        };
        assert!(batch(ok.clone()).is_ok());
        for (bad, why) in [
            (
                SummaryBatch {
                    writer: 0,
                    ..ok.clone()
                },
                "names no writer",
            ),
            (
                SummaryBatch {
                    writer: 2,
                    ..ok.clone()
                },
                "writer index 1",
            ),
            (
                SummaryBatch {
                    signed_time_step: 1,
                    ..ok.clone()
                },
                "signed time index 0",
            ),
            (
                SummaryBatch {
                    signed_time_step: -1,
                    ..ok.clone()
                },
                "out of range",
            ),
            (
                SummaryBatch {
                    witnesses: vec![1],
                    ..ok.clone()
                },
                "witness index 0",
            ),
            (
                SummaryBatch {
                    witnesses: vec![0, 1],
                    ..ok.clone()
                },
                "mixes none",
            ),
            (
                SummaryBatch {
                    timestamps: vec![1],
                    ..ok.clone()
                },
                "1 timestamps and 0 payloads",
            ),
        ] {
            let err = batch(bad).unwrap_err();
            assert!(err.contains(why), "{err} (wanted {why})");
        }
    }
}
