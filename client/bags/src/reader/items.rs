//! Reading an item's bytes into records and batches, and finding copies
//! and misplaced batches.

use std::sync::Arc;

use bagel_proto::pb;
use bytes::Bytes;
use prost::Message as _;
use sha2::{Digest as _, Sha256};

use crate::frame::{self, Frame};
use crate::{Bucket, ListedItem};

use super::check::check_batch;
use super::options::ReadOptions;
use super::report::{Problem, ProblemKind, ReadReport};
use super::seen::{Record, Seen};

/// Where bytes were read from.
pub(super) struct Place<'a> {
    pub(super) log: &'a str,
    pub(super) bucket: Bucket,
    pub(super) item: &'a ListedItem,
    /// The item's name, shared by every batch read from it.
    pub(super) name: Arc<str>,
    pub(super) open: bool,
    /// Read from a summary a trusted summarizer attested.
    pub(super) vouched: Option<Arc<str>>,
}

impl Place<'_> {
    /// A damage found here, at `offset` in the item (or the item whole).
    pub(super) fn damaged(&self, offset: Option<u64>, what: String) -> Problem {
        Problem {
            kind: ProblemKind::Damaged,
            bucket: self.bucket,
            item: self.item.name.clone(),
            offset,
            what,
            in_open_bag: self.open,
        }
    }

    /// The item is listed bigger than the reader reads: reported, not read.
    pub(super) fn too_big(&self, opts: &ReadOptions) -> Option<Problem> {
        (self.item.size > opts.max_item_bytes).then(|| {
            self.damaged(
                None,
                format!(
                    "not read: its size {} is over the per-item limit of {} bytes",
                    self.item.size, opts.max_item_bytes
                ),
            )
        })
    }
}

pub(super) fn read_item(
    report: &mut ReadReport,
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    at: &Place<'_>,
    bytes: Bytes,
) {
    let (item, open) = (at.item, at.open);
    let problem = |offset, what: String| at.damaged(offset, what);
    if !open && (bytes.len() as u64) < item.size {
        report.problems.push(problem(
            Some(bytes.len() as u64),
            format!(
                "item is {} bytes, shorter than its listed size {}",
                bytes.len(),
                item.size
            ),
        ));
    }
    for f in frame::decode(&bytes) {
        match f {
            Frame::Record { offset, body } => read_record(report, seen, opts, at, offset, body),
            Frame::Corrupt { offset, reason } => {
                report
                    .problems
                    .push(problem(Some(offset), format!("corrupt record: {reason}")));
            }
            Frame::TornTail { offset, missing } => report.problems.push(problem(
                Some(offset),
                if open {
                    format!(
                        "incomplete record at the tail ({missing} bytes missing; a write may be in progress)"
                    )
                } else {
                    format!("torn record inside the listed size ({missing} bytes missing)")
                },
            )),
        }
    }
}

/// One whole record of an item, at `offset`: decoded, checked for copies
/// and placement, and its messages checked ([`check_batch`]). The same for
/// a record read from a bag and one rebuilt from a summary.
pub(super) fn read_record(
    report: &mut ReadReport,
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    at: &Place<'_>,
    offset: u64,
    body: Bytes,
) {
    match pb::Batch::decode(body.clone()) {
        Ok(mut batch) => {
            let witnesses = Arc::from(std::mem::take(&mut batch.witnesses));
            let record = Sha256::digest(&body).into();
            read_batch(report, seen, opts, at, offset, record, (batch, witnesses))
        }
        Err(e) => report
            .problems
            .push(at.damaged(Some(offset), format!("record does not decode as a batch: {e}"))),
    }
}

/// The record at `offset` whose SHA-256 is `record`, as `batch` (but for
/// its witnesses) and `witnesses`: checked for copies and placement, and
/// its messages checked ([`check_batch`]).
pub(super) fn read_batch(
    report: &mut ReadReport,
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    at: &Place<'_>,
    offset: u64,
    record: [u8; 32],
    (batch, witnesses): (pb::Batch, Arc<[pb::Witness]>),
) {
    let record = Record::Digest(record);
    if let Some(p) = copy_or_misplaced(
        seen,
        at,
        offset,
        (&batch.writer_id, batch.first_sequence, batch.entries.len()),
        (&batch.log, batch.bucket_secs),
        record,
    ) {
        let duplicate = p.kind == ProblemKind::Duplicate;
        report.problems.push(p);
        if duplicate {
            return;
        }
    }
    check_batch(seen, opts, at, batch, witnesses);
}

/// Whether a batch (`writer`, from `first_sequence`, with `entries`
/// messages, naming `names` as its log and bag) read `at` `offset` is a
/// copy of one read before (its messages are then counted once) or names
/// another log or bag (its messages are then rejected): the problem to
/// report, if any. A batch not read before is remembered.
pub(super) fn copy_or_misplaced(
    seen: &mut Seen<'_>,
    at: &Place<'_>,
    offset: u64,
    (writer, first_sequence, entries): (&str, u64, usize),
    (log, bucket_secs): (&str, u64),
    record: Record,
) -> Option<Problem> {
    let bucket = at.bucket;
    let read_at = || (bucket, Arc::clone(&at.name));
    if let Some(first) = seen.first_copy(writer, first_sequence, record, offset, read_at) {
        return Some(Problem {
            kind: ProblemKind::Duplicate,
            ..at.damaged(
                Some(offset),
                format!(
                    "duplicate batch: writer {writer:?} sequence {first_sequence}..{} was already read \
                     from {first}; its {entries} messages are counted once",
                    first_sequence + entries as u64,
                ),
            )
        });
    }
    misplaced(at.log, bucket, log, bucket_secs).then(|| Problem {
        kind: ProblemKind::Misplaced,
        ..at.damaged(
            Some(offset),
            format!(
                "misplaced batch: it names log {log:?} bag {}, but was found in log {:?} bag \
                 {bucket}; its {entries} messages are rejected",
                Bucket::from_secs(bucket_secs),
                at.log,
            ),
        )
    })
}

/// A batch naming `log` and `bucket_secs` found in `at_log`'s bag `bucket`
/// is misplaced (a batch naming no log predates names and is not).
pub(super) fn misplaced(at_log: &str, bucket: Bucket, log: &str, bucket_secs: u64) -> bool {
    !log.is_empty() && (log != at_log || bucket_secs != bucket.secs())
}
