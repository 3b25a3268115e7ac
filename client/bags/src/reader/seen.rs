//! The state of one read: which batches it met where, the verdicts on
//! witnesses and signed times it already checked, and the batches whose
//! signatures are checked in rounds while the next are read.

use std::collections::HashMap;
use std::sync::Arc;

use bagel_proto::{KeyRing, Micros, pb};
use prost::Message as _;

use crate::{BagConfig, Bucket};

use super::check::{Lease, finish_batch};
use super::on_cores::{OnCores, on_cores};
use super::options::ReadOptions;
use super::report::ReadReport;
use super::summaries::PickedSummary;

/// Where each batch read so far was found, by (writer, first sequence,
/// record): a second copy of a record is a duplicate. Two writers given
/// one id (two processes) write different records, which are not.
#[derive(Default)]
pub(super) struct Seen<'a> {
    /// The read's summaries (for records read from them).
    pub(super) summaries: &'a [PickedSummary],
    /// Writer ids met, by their index in `batches`' keys.
    pub(super) writers: HashMap<String, u32>,
    /// By (writer, first sequence, n): the n-th distinct record read with
    /// that writer and first sequence (almost always only the 0th).
    pub(super) batches: HashMap<(u32, u64, u32), SeenBatch>,
    /// The SHA-256 of each record of a summarized item (by summary, bag
    /// and item), rebuilt only when a record of it has to be compared
    /// (`None`: the item does not rebuild).
    pub(super) summarized: HashMap<(u32, u32, u32), ItemDigests>,
    /// Verdicts on the witnesses already checked in this read, by their
    /// encoded bytes: one lease's witness is cited by every batch written
    /// under it, so its signature is verified (and its holder key
    /// decompressed) once.
    pub(super) witnesses: HashMap<Vec<u8>, Arc<WitnessVerdict>>,
    /// The last witness looked up and its verdict: consecutive batches
    /// mostly cite the same one, found without encoding it.
    pub(super) last_witness: Option<(pb::Witness, Arc<WitnessVerdict>)>,
    /// Verdicts on the signed times already checked, by their encoded
    /// bytes (verified in rounds, [`Seen::next_round`]).
    pub(super) times: HashMap<Vec<u8>, std::result::Result<bagel_proto::TimeReading, String>>,
    /// Holder keys decompressed in this read: a lease's key signs every
    /// batch written under it.
    pub(super) holder_keys: crate::holder_sig::KeyCache,
    /// Batches read and placed whose signatures are not checked yet, in
    /// the order they were read.
    pub(super) pending: Vec<Pending>,
    /// The round of batches being checked while the next is read.
    pub(super) checking: Option<Round>,
    /// Signed times sent to be verified whose verdicts are not back.
    pub(super) times_asked: std::collections::HashSet<Vec<u8>>,
}

/// The SHA-256 of each record of an item, in order (`None`: it does not
/// rebuild).
pub(super) type ItemDigests = Option<Vec<[u8; 32]>>;

/// A batch read, for finding its copies (small: an hour holds 360,000).
pub(super) enum SeenBatch {
    /// Read from a bag, or rebuilt from a summary: its record's SHA-256,
    /// and where.
    Read(Box<([u8; 32], Here)>),
    /// Read from an attested summary without rebuilding it, at `offset`
    /// in its item.
    Summarized { at: SummaryAt, offset: u64 },
}

/// Batch `batch` of item `item` of bag `bag` of the read's summary
/// `summary`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct SummaryAt {
    pub(super) summary: u32,
    pub(super) bag: u32,
    pub(super) item: u32,
    pub(super) batch: u32,
}

/// What tells a batch's record from another record of the same writer
/// and first sequence.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    /// The SHA-256 of its bytes.
    Digest([u8; 32]),
    /// Where it is in a summary: a record read on a trusted summarizer's
    /// word is not rebuilt, so its SHA-256 is computed only if another
    /// record with its writer and first sequence is met.
    Summarized(SummaryAt),
}

/// Where a batch was read (said when a copy of it is found).
#[derive(Clone)]
pub(super) struct Here {
    pub(super) bucket: Bucket,
    pub(super) item: Arc<str>,
    pub(super) offset: u64,
}

impl std::fmt::Display for Here {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bag {} item {} offset {}", self.bucket, self.item, self.offset)
    }
}

/// What a witness says, once its signature is checked (or not, without
/// keys): what every batch citing it needs.
pub(super) type WitnessVerdict = std::result::Result<WitnessInfo, String>;

pub(super) struct WitnessInfo {
    pub(super) lease_id: String,
    pub(super) full: bool,
    pub(super) min: Micros,
    pub(super) deadline: Micros,
    pub(super) holder: crate::holder_sig::Holder,
}

/// A batch waiting for its holder signatures and signed time to be
/// checked ([`Seen::next_round`]), with what its witnesses already decided.
pub(super) struct Pending {
    /// The batch, but for its witnesses (empty: see `witnesses`).
    pub(super) batch: pb::Batch,
    /// Its witnesses: shared by the batches of a summarized item that cite
    /// the same list, and then by their messages.
    pub(super) witnesses: Arc<[pb::Witness]>,
    pub(super) bucket: Bucket,
    pub(super) open: bool,
    /// The first reason its messages are rejected, known before the
    /// signatures are checked (misplaced, no witness, a witness that does
    /// not verify or is tentative).
    pub(super) error: Option<String>,
    /// Notes known before the signatures are checked.
    pub(super) notes: Vec<String>,
    pub(super) leases: Vec<Lease>,
    /// The holders its witnesses name, when every witness could be read.
    pub(super) holders: Option<Vec<crate::holder_sig::Holder>>,
    pub(super) time: TimeCheck,
    /// Filled in when its round is checked.
    pub(super) holder: Option<crate::holder_sig::HolderCheck>,
    /// Read from a summary a trusted summarizer attested (its key id).
    pub(super) vouched: Option<Arc<str>>,
}

/// What is done with a batch's signed time.
pub(super) enum TimeCheck {
    /// Not verified, for this reason (a note on every message).
    Note(&'static str),
    /// Verified (one verdict per distinct time, by its encoded bytes).
    Verify(Vec<u8>),
    /// Read unverified: a trusted summarizer verified it.
    Vouched(std::result::Result<bagel_proto::TimeReading, String>),
}

/// Pending batches are checked in rounds of this many, one round while the
/// next is read (bounding what a read holds before it turns batches into
/// messages). Small in unit tests, so that their reads take several rounds.
pub(super) const CHECK_ROUND: usize = if cfg!(test) { 80 } else { 4096 };

impl Seen<'_> {
    /// The verdict on witness `w`: its signature verified against `keys`
    /// (or not, without keys), once per distinct witness in a read.
    pub(super) fn witness(&mut self, w: &pb::Witness, keys: Option<&KeyRing>) -> Arc<WitnessVerdict> {
        if let Some((last, verdict)) = &self.last_witness
            && last == w
        {
            return Arc::clone(verdict);
        }
        let holder_keys = &mut self.holder_keys;
        let verdict =
            self.witnesses
                .entry(w.encode_to_vec())
                .or_insert_with(|| {
                    let body = match keys {
                        Some(keys) => bagel_proto::verify_witness(w, keys)
                            .map_err(|e| format!("witness {}: {e}", w.key_id)),
                        None => bagel_proto::witness::decode_unverified(w)
                            .map_err(|e| format!("witness {}: {e}", w.key_id)),
                    };
                    Arc::new(body.map(|b| WitnessInfo {
                        full: b.mode().normalized() == pb::Mode::Full,
                        min: Micros::from_micros(b.min_timestamp_us),
                        deadline: Micros::from_micros(b.deadline_us),
                        holder: holder_keys.holder(&b),
                        lease_id: b.lease_id,
                    }))
                })
                .clone();
        self.last_witness = Some((w.clone(), Arc::clone(&verdict)));
        verdict
    }

    /// Where the same record as `record` (of `writer`, from
    /// `first_sequence`) was read before; if it was not, it is remembered as
    /// read `here`. `summaries` are the read's (for records read from them).
    pub(super) fn first_copy(
        &mut self,
        writer: &str,
        first_sequence: u64,
        record: Record,
        offset: u64,
        read_at: impl FnOnce() -> (Bucket, Arc<str>),
    ) -> Option<Here> {
        let writer = match self.writers.get(writer) {
            Some(w) => *w,
            None => {
                let w = self.writers.len() as u32;
                self.writers.insert(writer.to_owned(), w);
                w
            }
        };
        let (summarized, summaries) = (&mut self.summarized, self.summaries);
        let mut digest_of = |r: Record| match r {
            Record::Digest(d) => Some(d),
            Record::Summarized(at) => summarized
                .entry((at.summary, at.bag, at.item))
                .or_insert_with(|| {
                    let (_, s, _) = &summaries[at.summary as usize];
                    let bag = &s.bags[at.bag as usize];
                    let item = &bag.items[at.item as usize];
                    if item.is_raw {
                        return None;
                    }
                    let (batches, _) = crate::summary::packed::rebuild_shared(s, bag, item).ok()?;
                    Some(batches.iter().map(|b| b.digest).collect())
                })
                .as_ref()
                .and_then(|d| d.get(at.batch as usize).copied()),
        };
        let here = |seen: &SeenBatch| match seen {
            SeenBatch::Read(read) => read.1.clone(),
            SeenBatch::Summarized { at, offset } => {
                let (_, s, _) = &summaries[at.summary as usize];
                let bag = &s.bags[at.bag as usize];
                let name = bag.items[at.item as usize].name as usize;
                Here {
                    bucket: Bucket::from_secs(bag.bucket_secs),
                    item: Arc::from(s.item_names[name].as_str()),
                    offset: *offset,
                }
            }
        };
        let mut mine: Option<Option<[u8; 32]>> = None;
        for n in 0.. {
            let Some(seen) = self.batches.get(&(writer, first_sequence, n)) else {
                let seen = match (record, mine) {
                    (Record::Summarized(at), None) => SeenBatch::Summarized { at, offset },
                    (Record::Digest(d), _) | (_, Some(Some(d))) => {
                        let (bucket, item) = read_at();
                        SeenBatch::Read(Box::new((d, Here { bucket, item, offset })))
                    }
                    // Its item does not rebuild, so the read fails.
                    (Record::Summarized(at), Some(None)) => SeenBatch::Summarized { at, offset },
                };
                self.batches.insert((writer, first_sequence, n), seen);
                return None;
            };
            let theirs = match seen {
                SeenBatch::Read(read) => Record::Digest(read.0),
                SeenBatch::Summarized { at, .. } => Record::Summarized(*at),
            };
            if theirs == record {
                return Some(here(seen));
            }
            let theirs = digest_of(theirs);
            let mine = *mine.get_or_insert_with(|| digest_of(record));
            if theirs.is_some() && theirs == mine {
                return Some(here(seen));
            }
        }
        unreachable!("fewer than 2^32 records share a writer and first sequence")
    }

    /// Sends the pending batches to be checked (their holder signatures,
    /// and each signed time not met before, spread over the machine's
    /// cores) and turns the round sent before into messages: one round is
    /// checked while the next is read.
    pub(super) async fn next_round(&mut self, report: &mut ReadReport, opts: &ReadOptions, cfg: &BagConfig) {
        self.finish_round(report, opts, cfg).await;
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let mut fresh: Vec<(Vec<u8>, pb::SignedTime)> = Vec::new();
        for p in &pending {
            if let (TimeCheck::Verify(key), Some(st)) = (&p.time, &p.batch.signed_time)
                && !self.times.contains_key(key)
                && self.times_asked.insert(key.clone())
            {
                fresh.push((key.clone(), st.clone()));
            }
        }
        let keys = Arc::new((opts.keys.clone().unwrap_or_default(), opts.roughtime_keys.clone()));
        let times = on_cores(fresh, move |(_, st)| {
            bagel_proto::verify_signed_time(st, &keys.0, &keys.1).map_err(|e| e.to_string())
        });
        let batches = on_cores(pending, |p| {
            p.holders.as_ref().map(|h| match p.vouched {
                Some(_) => crate::holder_sig::assume_signed(h),
                None => crate::holder_sig::check_holders_with(&p.batch, &p.witnesses, h),
            })
        });
        self.checking = Some(Round { times, batches });
    }

    /// Waits for the round being checked and turns it into messages, in
    /// the order its batches were read: the same report as checking each
    /// batch as it was read.
    pub(super) async fn finish_round(
        &mut self,
        report: &mut ReadReport,
        opts: &ReadOptions,
        cfg: &BagConfig,
    ) {
        let Some(round) = self.checking.take() else {
            return;
        };
        for ((key, _), verdict) in round.times.join().await {
            self.times_asked.remove(&key);
            self.times.insert(key, verdict);
        }
        for (mut p, holder) in round.batches.join().await {
            p.holder = holder;
            finish_batch(report, &self.times, opts, cfg, p);
        }
    }

    /// Checks and turns into messages everything read so far.
    pub(super) async fn finish(&mut self, report: &mut ReadReport, opts: &ReadOptions, cfg: &BagConfig) {
        self.next_round(report, opts, cfg).await;
        self.finish_round(report, opts, cfg).await;
    }
}

/// A round of batches being checked.
pub(super) struct Round {
    pub(super) times:
        OnCores<(Vec<u8>, pb::SignedTime), std::result::Result<bagel_proto::TimeReading, String>>,
    pub(super) batches: OnCores<Pending, Option<crate::holder_sig::HolderCheck>>,
}
