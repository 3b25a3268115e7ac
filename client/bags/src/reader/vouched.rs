//! Reading a bag of a summary a trusted summarizer attested, without
//! rebuilding its batches.

use std::collections::HashMap;
use std::sync::Arc;

use bagel_proto::pb;
use bytes::Bytes;
use prost::Message as _;

use crate::frame;
use crate::summary::Summary;
use crate::{BagConfig, Bucket, Error, ListedItem, Result};

use super::check::{
    BatchAt, NO_KEY_NOTE, Witnessed, holder_verdict, misplaced_error, not_all_witnesses_read, time_check,
    time_verdict, witnessed,
};
use super::items::{Place, copy_or_misplaced, read_item};
use super::options::ReadOptions;
use super::order;
use super::report::{ProblemKind, ReadReport, Vouched};
use super::seen::{Record, Seen, SummaryAt, TimeCheck};
use super::summaries::PickedSummary;

/// A summary a trusted summarizer attested, read without rebuilding or
/// re-encoding its batches: what its tables decide for every batch citing
/// them, worked out once per read of it. Its batches' holder signatures
/// and (local) signed times are taken as the summarizer verified them;
/// their witnesses (each once per read), bounds, signed-time congruence,
/// copies and placement are checked as for any batch, with the same
/// results, problems and messages as rebuilding them would give.
pub(super) struct Vouching {
    pub(super) key_id: Arc<str>,
    pub(super) vouched: Vouched,
    /// The encoded length of each witness (to place each record in its
    /// item as its bag holds it).
    pub(super) witness_lens: Vec<usize>,
    /// Each signed time, by index (`None`: one that does not rebuild,
    /// which no batch read can cite).
    pub(super) times: Vec<Option<VouchedTime>>,
    /// What each distinct list of witnesses decides.
    pub(super) lists: HashMap<Vec<u32>, Arc<VouchedList>>,
    /// The notes of the batch before, by its list and time note: every
    /// batch of a lease gets the same.
    pub(super) last_notes: Option<NotesOf>,
}

/// The notes of batches citing a list of witnesses, with a signed time
/// with this note (or none).
pub(super) type NotesOf = ((usize, Option<&'static str>), Vec<String>);

pub(super) struct VouchedTime {
    pub(super) len: usize,
    pub(super) signed_time: Arc<pb::SignedTime>,
    /// A note on its messages (not verified, and why), or its reading.
    pub(super) check:
        std::result::Result<std::result::Result<bagel_proto::TimeReading, String>, &'static str>,
}

/// What a list of witnesses decides for a batch citing it.
pub(super) struct VouchedList {
    /// Its number among the summary's lists.
    pub(super) id: usize,
    pub(super) witnessed: Witnessed,
    pub(super) lease_ids: Vec<String>,
    pub(super) holder: crate::holder_sig::HolderCheck,
    pub(super) witnesses: Arc<[pb::Witness]>,
}

/// A batch of an item, walked ([`crate::summary::packed::walk_item`]).
pub(super) struct Walked {
    pub(super) batch: usize,
    pub(super) writer: u32,
    pub(super) first_sequence: u64,
    pub(super) time: u32,
    pub(super) list: Arc<VouchedList>,
    pub(super) timestamps: std::ops::Range<usize>,
    pub(super) offset: u64,
}

impl Vouching {
    /// `None` where the summary must be read as any summary: it has a
    /// signed time this read verifies itself (a Roughtime proof, given
    /// Roughtime keys).
    pub(super) fn new(summary: &Summary, key_id: &Arc<str>, opts: &ReadOptions) -> Option<Self> {
        let mut times = Vec::with_capacity(summary.signed_times.len());
        for i in 0..summary.signed_times.len() {
            let Ok(st) = crate::summary::packed::signed_time(summary, i) else {
                times.push(None);
                continue;
            };
            let check = match time_check(Some(&st), true, opts) {
                TimeCheck::Note(note) => Err(note),
                TimeCheck::Vouched(verdict) => Ok(verdict),
                TimeCheck::Verify(_) => return None,
            };
            times.push(Some(VouchedTime {
                len: st.encoded_len(),
                signed_time: Arc::new(st),
                check,
            }));
        }
        Some(Vouching {
            key_id: Arc::clone(key_id),
            vouched: Vouched::Attested {
                key_id: Arc::clone(key_id),
            },
            witness_lens: summary.witnesses.iter().map(|w| w.encoded_len()).collect(),
            times,
            lists: HashMap::new(),
            last_notes: None,
        })
    }

    /// What the witnesses `list` (indexes + 1) decide.
    pub(super) fn list(
        &mut self,
        seen: &mut Seen<'_>,
        opts: &ReadOptions,
        summary: &Summary,
        list: &[u32],
    ) -> Arc<VouchedList> {
        if let Some(l) = self.lists.get(list) {
            return Arc::clone(l);
        }
        let witnesses: Arc<[pb::Witness]> = list
            .iter()
            .map(|i| summary.witnesses[*i as usize - 1].clone())
            .collect();
        let witnessed = witnessed(seen, opts, witnesses.iter());
        let l = Arc::new(VouchedList {
            id: self.lists.len(),
            lease_ids: witnessed.leases.iter().map(|l| l.id.clone()).collect(),
            holder: witnessed
                .holders
                .as_deref()
                .map_or_else(not_all_witnesses_read, crate::holder_sig::assume_signed),
            witnessed,
            witnesses,
        });
        self.lists.insert(list.to_vec(), Arc::clone(&l));
        l
    }
}

#[cfg(test)]
thread_local! {
    /// Bags read by [`read_vouched_bag`] on this thread (tests check that
    /// an attested summary is read that way).
    pub(crate) static VOUCHED_BAGS_READ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Reads bag `j` of the read's summary `i`, attested, as [`read_summarized`]
/// would (the same problems and messages) without rebuilding its batches.
pub(super) async fn read_vouched_bag(
    report: &mut ReadReport,
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    cfg: &BagConfig,
    summaries: &[PickedSummary],
    (i, j): (usize, usize),
    v: &mut Vouching,
) -> Result<()> {
    let (_, summary, _) = &summaries[i];
    let bag = &summary.bags[j];
    let bucket = Bucket::from_secs(bag.bucket_secs);
    let corrupt = |reason| Error::CorruptSummary {
        log: summary.log.clone(),
        name: crate::summary::object_name(summary),
        reason,
    };
    #[cfg(test)]
    VOUCHED_BAGS_READ.with(|n| n.set(n.get() + 1));
    // A read of the whole stretch keeps its payloads where they are, in
    // the summary's bytes (as many messages as the summary holds, sharing
    // it); a read of part of it copies those it keeps, so as not to hold
    // the whole summary for a few.
    let share = opts.from <= Bucket::from_secs(summary.from_secs).start()
        && opts.to >= Bucket::from_secs(summary.to_secs).start();
    let (first_message, first_rejected) = (report.messages.len(), report.rejected.len());
    let mut walked: Vec<Walked> = Vec::new();
    let mut timestamps: Vec<u64> = Vec::new();
    for (k, si) in bag.items.iter().enumerate() {
        let name = summary
            .item_names
            .get(si.name as usize)
            .ok_or_else(|| corrupt(format!("item name index {} out of range", si.name)))?;
        if si.is_raw {
            // Not all whole records that decode (damage): read as a bag's
            // item, vouched for, and turned into messages at once (so the
            // messages come in the order read).
            let item = ListedItem {
                name: name.clone(),
                size: si.size.unwrap_or(si.raw.len() as u64),
                etag: None,
            };
            let at = Place {
                log: &summary.log,
                bucket,
                name: Arc::from(name.as_str()),
                item: &item,
                open: false,
                vouched: Some(Arc::clone(&v.key_id)),
            };
            match at.too_big(opts) {
                Some(p) => report.problems.push(p),
                None => read_item(report, seen, opts, &at, si.raw.clone()),
            }
            seen.finish(report, opts, cfg).await;
            continue;
        }
        walked.clear();
        timestamps.clear();
        let mut offset = 0u64;
        crate::summary::packed::walk_item(summary, bag, si, |p| {
            let len = crate::summary::packed::record_len(
                summary,
                bag,
                &p,
                |w| v.witness_lens[w as usize - 1],
                |t| v.times[t as usize - 1].as_ref().map_or(0, |t| t.len),
            );
            let from = timestamps.len();
            timestamps.extend_from_slice(p.timestamps);
            walked.push(Walked {
                batch: walked.len(),
                writer: p.writer,
                first_sequence: p.first_sequence,
                time: p.signed_time,
                list: v.list(seen, opts, summary, p.witnesses),
                timestamps: from..timestamps.len(),
                offset,
            });
            offset += (frame::HEADER_LEN + len) as u64;
        })
        .map_err(corrupt)?;
        let item = ListedItem {
            name: name.clone(),
            size: si.size.unwrap_or(offset),
            etag: None,
        };
        let at = Place {
            log: &summary.log,
            bucket,
            name: Arc::from(name.as_str()),
            item: &item,
            open: false,
            vouched: None,
        };
        if let Some(p) = at.too_big(opts) {
            report.problems.push(p);
            continue;
        }
        for w in &walked {
            let b = &si.batches[w.batch];
            let writer_id = summary.writer_ids[w.writer as usize].as_str();
            let (log, bucket_secs) = match b.elsewhere {
                true => (b.log.as_str(), b.bucket_secs),
                false => (summary.log.as_str(), bag.bucket_secs),
            };
            let record = Record::Summarized(SummaryAt {
                summary: i as u32,
                bag: j as u32,
                item: k as u32,
                batch: w.batch as u32,
            });
            if let Some(p) = copy_or_misplaced(
                seen,
                &at,
                w.offset,
                (writer_id, w.first_sequence, b.payloads.len()),
                (log, bucket_secs),
                record,
            ) {
                let duplicate = p.kind == ProblemKind::Duplicate;
                report.problems.push(p);
                if duplicate {
                    continue;
                }
            }
            let list = &*w.list;
            let time = match w.time {
                0 => None,
                t => Some(v.times[t as usize - 1].as_ref().expect("walk_item checked it")),
            };
            // As `finish_batch` makes them: misplaced, witnesses, holder
            // signatures, signed time; the notes in the same order.
            let mut error =
                misplaced_error(at.log, bucket, log, bucket_secs).or_else(|| list.witnessed.error.clone());
            if let crate::holder_sig::HolderCheck::Bad { reason } = &list.holder {
                error.get_or_insert_with(|| reason.clone());
            }
            let (time_ref, time_note) = match time.map(|t| &t.check) {
                None => (None, Some("no signed time")),
                Some(Err(note)) => (None, Some(*note)),
                Some(Ok(verdict)) => (time_verdict(verdict, &mut error), None),
            };
            let key = (list.id, time_note);
            if v.last_notes.as_ref().is_none_or(|(k, _)| *k != key) {
                let mut notes = Vec::new();
                if opts.keys.is_none() {
                    notes.push(NO_KEY_NOTE.to_owned());
                }
                holder_verdict(&list.holder, &mut None, &mut notes);
                notes.extend(time_note.map(str::to_owned));
                v.last_notes = Some((key, notes));
            }
            let notes = &v.last_notes.as_ref().expect("set just above").1;
            let batch_at = BatchAt {
                bucket,
                open: false,
                writer_id,
                first_sequence: w.first_sequence,
                lease_ids: &list.lease_ids,
                leases: &list.witnessed.leases,
                notes,
                witnesses: Arc::clone(&list.witnesses),
                signed_time: time.map(|t| Arc::clone(&t.signed_time)),
                holder: &list.holder,
                vouched: &v.vouched,
                error: &error,
                time_ref,
            };
            batch_at.push_messages(
                report,
                opts,
                cfg,
                timestamps[w.timestamps.clone()]
                    .iter()
                    .zip(&b.payloads)
                    .map(|(t, p)| match share {
                        true => (*t, p.clone()),
                        false => (*t, Bytes::copy_from_slice(p)),
                    }),
            );
        }
    }
    // In order within the bag (its messages are all of its second): the
    // final sort finds it in order.
    report.messages[first_message..].sort_by(order);
    report.rejected[first_rejected..].sort_by(|a, b| order(&a.message, &b.message));
    Ok(())
}
