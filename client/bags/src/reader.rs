//! Ordered, checked reads of a time range of a log.
//!
//! Closed bags are read exactly as their lock lists them (each item up to
//! its listed size, nothing else); a past-due bag found open is closed
//! first; still-open bags are skipped, or read up to each item's last whole
//! record with [`ReadOptions::include_open`]. Messages come back ordered by
//! `(timestamp, writer, sequence)`.
//!
//! A past-due bag that does not exist yet, inside the log's life (from the
//! earliest writer start mark on), is *sealed*: closed empty, by its
//! minute's seal once the whole minute is past due ([`crate::seal`]), else
//! on its own. Otherwise a stalled writer could create it after this read
//! and a later reader would see messages this one did not; sealed, the
//! writer finds it closed and is refused. So any two readers of a past
//! range read the same messages. A minute's seal decides its seconds: a
//! bag made in a second it closed empty is never read.
//!
//! Every message is checked: the signatures of the witnesses it cites, that
//! its batch is signed by the holder key each of those witnesses names
//! ([`crate::holder_sig`]), that its timestamp lies strictly between each
//! lease's `min_timestamp` and `deadline`, and that it is near its batch's
//! signed time. A message that fails goes to [`ReadReport::rejected`] with
//! the reason; damaged records, a batch found in another log or bag than
//! it names, and a second copy of a batch already read (a file listed
//! twice, or copied under another name) go to [`ReadReport::problems`].
//! Nothing is dropped silently. Whatever could not be checked (no key ring,
//! a lease acquired without a holder key, a signed time without its key)
//! is in the message's notes: [`Message::verified`] means there are none.

use bagel_proto::{KeyRing, Micros, pb};
use bytes::Bytes;
use futures::StreamExt as _;
use prost::Message as _;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::frame::{self, Frame};
use crate::seal::Span;
use crate::summary::{Stretch, Summary, SummaryBag};
use crate::{BagConfig, BagState, BagStore, Bucket, Error, ListedItem, Result, list_buckets, validate_log};
use bagel_proto::clock::CheckedClock;

/// What to read.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReadOptions {
    /// First timestamp included.
    pub from: Micros,
    /// First timestamp excluded.
    pub to: Micros,
    /// Also read bags that are not closed yet (each item up to its last
    /// whole record). Such messages may still be rejected by the close.
    pub include_open: bool,
    /// Close past-due bags found open before reading them, and seal the
    /// missing ones (default on). Without it, two readers of one range may
    /// disagree.
    pub close_past_due: bool,
    /// Read minutes that have a published summary from it rather than from
    /// their bags (default on); the messages are the same either way
    /// while the bags exist. Read without, the bags retention removed are
    /// [`ProblemKind::Missing`] problems naming the summary that holds
    /// them.
    pub use_summaries: bool,
    /// Trusted witness/time keys. `None`: signatures are not checked and
    /// every message carries a note saying so.
    pub keys: Option<KeyRing>,
    /// Trusted Roughtime keys, for signed times that are Roughtime proofs.
    pub roughtime_keys: Vec<bagel_proto::signed_time::roughtime::RoughtimeKey>,
    /// Told (bags read, bags to read) as the read goes (a progress bar).
    pub progress: Option<Progress>,
    /// An item listed (or found, in an open bag) bigger than this is not
    /// read but reported as a problem: whoever can write to the store must
    /// not make a reader hold more than this per item.
    pub max_item_bytes: u64,
    /// Missing bags are sealed at most this far back from now; a read that
    /// would seal older ones is refused ([`crate::Error::SealTooFar`]), so
    /// a stray start mark cannot make a reader create bags back to 1970.
    pub max_seal_lookback: std::time::Duration,
    /// Summarizers whose attestations this read trusts
    /// ([`crate::summary::attest`]): a summary attested by one of these
    /// keys over exactly the bytes read has its batches' holder signatures
    /// and (local) signed times taken as the summarizer verified them, not
    /// verified again; every other check is made. `None`: every signature
    /// is checked, attestations are not looked at.
    pub trusted_summarizers: Option<KeyRing>,
}

/// [`ReadOptions::max_item_bytes`] by default: 1 GiB.
pub const DEFAULT_MAX_ITEM_BYTES: u64 = 1 << 30;
/// [`ReadOptions::max_seal_lookback`] by default: one hour.
pub const DEFAULT_MAX_SEAL_LOOKBACK: std::time::Duration = std::time::Duration::from_secs(3600);

/// A callback told `(done, total)` as long work advances.
#[derive(Clone)]
pub struct Progress(Arc<dyn Fn(u64, u64) + Send + Sync>);

impl Progress {
    pub fn new(f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        Progress(Arc::new(f))
    }

    fn report(&self, done: u64, total: u64) {
        (self.0)(done, total);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            from: Micros::ZERO,
            to: Micros::MAX,
            include_open: false,
            use_summaries: true,
            close_past_due: true,
            keys: None,
            roughtime_keys: Vec::new(),
            progress: None,
            max_item_bytes: DEFAULT_MAX_ITEM_BYTES,
            max_seal_lookback: DEFAULT_MAX_SEAL_LOOKBACK,
            trusted_summarizers: None,
        }
    }
}

impl ReadOptions {
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    pub fn with_range(mut self, from: Micros, to: Micros) -> Self {
        self.from = from;
        self.to = to;
        self
    }
    #[must_use]
    pub fn with_max_item_bytes(mut self, bytes: u64) -> Self {
        self.max_item_bytes = bytes;
        self
    }
    #[must_use]
    pub fn with_max_seal_lookback(mut self, d: std::time::Duration) -> Self {
        self.max_seal_lookback = d;
        self
    }
    /// Trust these summarizers' attestations (see
    /// [`ReadOptions::trusted_summarizers`]); an empty ring trusts none.
    #[must_use]
    pub fn with_trusted_summarizers(mut self, keys: KeyRing) -> Self {
        self.trusted_summarizers = (!keys.is_empty()).then_some(keys);
        self
    }
    #[must_use]
    pub fn with_summaries(mut self, yes: bool) -> Self {
        self.use_summaries = yes;
        self
    }

    pub fn with_include_open(mut self, yes: bool) -> Self {
        self.include_open = yes;
        self
    }
    #[must_use]
    pub fn with_close_past_due(mut self, yes: bool) -> Self {
        self.close_past_due = yes;
        self
    }
    #[must_use]
    pub fn with_keys(mut self, keys: Option<KeyRing>) -> Self {
        self.keys = keys;
        self
    }
    #[must_use]
    pub fn with_roughtime_keys(
        mut self,
        keys: Vec<bagel_proto::signed_time::roughtime::RoughtimeKey>,
    ) -> Self {
        self.roughtime_keys = keys;
        self
    }
}

/// One message as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub timestamp: Micros,
    pub writer_id: String,
    pub sequence: u64,
    pub payload: Bytes,
    pub bucket: Bucket,
    /// The lease ids of the witnesses it cites.
    pub lease_ids: Vec<String>,
    /// Read from a bag that was not closed.
    pub from_open_bag: bool,
    /// What could not be checked (e.g. no key given, no signed time).
    pub notes: Vec<String>,
    /// The witnesses of its batch, as stored (for the audit).
    pub witnesses: Arc<[pb::Witness]>,
    /// The signed time of its batch, as stored.
    pub signed_time: Option<Arc<pb::SignedTime>>,
    /// What its batch's holder signatures show (for the audit).
    pub holder: crate::holder_sig::HolderCheck,
    /// Who verified its batch's holder signatures and signed time.
    pub vouched: Vouched,
}

/// Who verified a message's holder signatures and signed time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Vouched {
    /// This read, as every read does without trusted summarizers.
    #[default]
    Checked,
    /// A trusted summarizer (by its key id), whose attestation of the
    /// summary it was read from holds over the very bytes read
    /// ([`ReadOptions::trusted_summarizers`]). Its witnesses, bounds and
    /// signed-time congruence were still checked by this read (and a
    /// Roughtime signed time verified).
    Attested { key_id: Arc<str> },
}

impl Message {
    /// Everything was checked and held: the witness signatures against
    /// the given keys, the batch's holder signature against the holder key
    /// in every cited witness (so its bytes, log, bag, writer and sequence
    /// are what that lease's holder wrote), its signed time, and its
    /// timestamp against every bound. False whenever a note says what was
    /// not checked.
    pub fn verified(&self) -> bool {
        self.notes.is_empty()
    }
}

/// A message that failed a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub message: Message,
    pub reason: String,
}

/// What kind of [`Problem`] a bag has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    /// A corrupt record, a torn tail, a short or changed item; or a
    /// corrupt summary (`item` names it, `bucket` is its first second),
    /// whose minutes were read from their bags instead.
    Damaged,
    /// A batch read before, found again (an item listed twice, a copy of
    /// a data file under another name or in another bag); its messages
    /// are counted once.
    Duplicate,
    /// A batch that names another log or bag than the one it was found in;
    /// its messages are rejected.
    Misplaced,
    /// An attestation by a trusted summarizer that does not hold (bad
    /// signature, not over the summary's bytes): its summary was read with
    /// every check. `item` names the attestation, `bucket` its stretch's
    /// first second.
    Attestation,
    /// Bags a minute's seal lists (or items a bag's lock lists) that are
    /// not there: their messages exist and this read could not show them.
    /// Retention removes the bags a summary holds, so a read without
    /// summaries meets this for every retained minute; `item` names the
    /// summary that holds them (read them from it), else the seal. Never
    /// a silent gap: a reader told "0 messages" would take the minute for
    /// an empty one. `bucket` is the first bag missing.
    Missing,
}

/// Something wrong in a bag: damage, a duplicated or a misplaced batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub bucket: Bucket,
    pub item: String,
    pub offset: Option<u64>,
    pub what: String,
    /// In an open bag, a torn tail may just be a write in progress.
    pub in_open_bag: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Accepted messages, ordered by `(timestamp, writer, sequence)`.
    pub messages: Vec<Message>,
    pub rejected: Vec<Rejected>,
    pub problems: Vec<Problem>,
    /// Bags in range that were open and not read.
    pub skipped_open: Vec<Bucket>,
    pub closed_bags_read: u64,
    /// Missing past-due bags this read closed empty.
    pub sealed: u64,
    /// Summaries read (each stands for whole minutes of bags).
    pub summaries_read: u64,
    /// Of those, read on a trusted summarizer's attestation.
    pub summaries_attested: u64,
    /// Why this read closed nothing although asked to close past-due bags:
    /// its clock could not be vouched for (the text of
    /// [`crate::Error::ClockUnvouched`]). The open bags it met are in
    /// `skipped_open`, waiting for a closer whose clock is vouched for.
    pub close_refused: Option<String>,
}

/// Where each batch read so far was found, by (writer, first sequence,
/// record): a second copy of a record is a duplicate. Two writers given
/// one id (two processes) write different records, which are not.
#[derive(Default)]
struct Seen<'a> {
    /// The read's summaries (for records read from them).
    summaries: &'a [PickedSummary],
    /// Writer ids met, by their index in `batches`' keys.
    writers: HashMap<String, u32>,
    /// By (writer, first sequence, n): the n-th distinct record read with
    /// that writer and first sequence (almost always only the 0th).
    batches: HashMap<(u32, u64, u32), SeenBatch>,
    /// The SHA-256 of each record of a summarized item (by summary, bag
    /// and item), rebuilt only when a record of it has to be compared
    /// (`None`: the item does not rebuild).
    summarized: HashMap<(u32, u32, u32), ItemDigests>,
    /// Verdicts on the witnesses already checked in this read, by their
    /// encoded bytes: one lease's witness is cited by every batch written
    /// under it, so its signature is verified (and its holder key
    /// decompressed) once.
    witnesses: HashMap<Vec<u8>, Arc<WitnessVerdict>>,
    /// The last witness looked up and its verdict: consecutive batches
    /// mostly cite the same one, found without encoding it.
    last_witness: Option<(pb::Witness, Arc<WitnessVerdict>)>,
    /// Verdicts on the signed times already checked, by their encoded
    /// bytes (verified in rounds, [`Seen::next_round`]).
    times: HashMap<Vec<u8>, std::result::Result<bagel_proto::TimeReading, String>>,
    /// Holder keys decompressed in this read: a lease's key signs every
    /// batch written under it.
    holder_keys: crate::holder_sig::KeyCache,
    /// Batches read and placed whose signatures are not checked yet, in
    /// the order they were read.
    pending: Vec<Pending>,
    /// The round of batches being checked while the next is read.
    checking: Option<Round>,
    /// Signed times sent to be verified whose verdicts are not back.
    times_asked: std::collections::HashSet<Vec<u8>>,
}

/// The SHA-256 of each record of an item, in order (`None`: it does not
/// rebuild).
type ItemDigests = Option<Vec<[u8; 32]>>;

/// A batch read, for finding its copies (small: an hour holds 360,000).
enum SeenBatch {
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
struct SummaryAt {
    summary: u32,
    bag: u32,
    item: u32,
    batch: u32,
}

/// What tells a batch's record from another record of the same writer
/// and first sequence.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Record {
    /// The SHA-256 of its bytes.
    Digest([u8; 32]),
    /// Where it is in a summary: a record read on a trusted summarizer's
    /// word is not rebuilt, so its SHA-256 is computed only if another
    /// record with its writer and first sequence is met.
    Summarized(SummaryAt),
}

/// Where a batch was read (said when a copy of it is found).
#[derive(Clone)]
struct Here {
    bucket: Bucket,
    item: Arc<str>,
    offset: u64,
}

impl std::fmt::Display for Here {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bag {} item {} offset {}", self.bucket, self.item, self.offset)
    }
}

/// What a witness says, once its signature is checked (or not, without
/// keys): what every batch citing it needs.
type WitnessVerdict = std::result::Result<WitnessInfo, String>;

struct WitnessInfo {
    lease_id: String,
    full: bool,
    min: Micros,
    deadline: Micros,
    holder: crate::holder_sig::Holder,
}

/// A batch waiting for its holder signatures and signed time to be
/// checked ([`Seen::next_round`]), with what its witnesses already decided.
struct Pending {
    /// The batch, but for its witnesses (empty: see `witnesses`).
    batch: pb::Batch,
    /// Its witnesses: shared by the batches of a summarized item that cite
    /// the same list, and then by their messages.
    witnesses: Arc<[pb::Witness]>,
    bucket: Bucket,
    open: bool,
    /// The first reason its messages are rejected, known before the
    /// signatures are checked (misplaced, no witness, a witness that does
    /// not verify or is tentative).
    error: Option<String>,
    /// Notes known before the signatures are checked.
    notes: Vec<String>,
    leases: Vec<Lease>,
    /// The holders its witnesses name, when every witness could be read.
    holders: Option<Vec<crate::holder_sig::Holder>>,
    time: TimeCheck,
    /// Filled in when its round is checked.
    holder: Option<crate::holder_sig::HolderCheck>,
    /// Read from a summary a trusted summarizer attested (its key id).
    vouched: Option<Arc<str>>,
}

/// What is done with a batch's signed time.
enum TimeCheck {
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
const CHECK_ROUND: usize = if cfg!(test) { 80 } else { 4096 };
/// The fewest signature checks worth a thread of their own.
const PER_THREAD: usize = 32;

impl Seen<'_> {
    /// The verdict on witness `w`: its signature verified against `keys`
    /// (or not, without keys), once per distinct witness in a read.
    fn witness(&mut self, w: &pb::Witness, keys: Option<&KeyRing>) -> Arc<WitnessVerdict> {
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
    fn first_copy(
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
    async fn next_round(&mut self, report: &mut ReadReport, opts: &ReadOptions, cfg: &BagConfig) {
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
    async fn finish_round(&mut self, report: &mut ReadReport, opts: &ReadOptions, cfg: &BagConfig) {
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
    async fn finish(&mut self, report: &mut ReadReport, opts: &ReadOptions, cfg: &BagConfig) {
        self.next_round(report, opts, cfg).await;
        self.finish_round(report, opts, cfg).await;
    }
}

/// A round of batches being checked.
struct Round {
    times: OnCores<(Vec<u8>, pb::SignedTime), std::result::Result<bagel_proto::TimeReading, String>>,
    batches: OnCores<Pending, Option<crate::holder_sig::HolderCheck>>,
}

/// Work sent to the machine's cores: done already (too little to share
/// out), or running in blocking tasks, each on a contiguous chunk.
enum OnCores<T, R> {
    Done(Vec<(T, R)>),
    Running(Vec<tokio::task::JoinHandle<Vec<(T, R)>>>),
}

impl<T, R> OnCores<T, R> {
    /// Each item with its result, in the order given.
    async fn join(self) -> Vec<(T, R)> {
        match self {
            OnCores::Done(out) => out,
            OnCores::Running(handles) => {
                let mut out = Vec::new();
                for h in handles {
                    match h.await {
                        Ok(done) => out.extend(done),
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(e) => panic!("a signature check task was cancelled: {e}"),
                    }
                }
                out
            }
        }
    }
}

/// Applies `f` to every item, spread over the machine's cores in
/// contiguous chunks (blocking tasks, not waited for here); a few items
/// are done at once.
fn on_cores<T, R, F>(items: Vec<T>, f: F) -> OnCores<T, R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(&T) -> R + Send + Sync + 'static,
{
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let tasks = cores.min(items.len() / PER_THREAD).max(1);
    fn run<T, R>(chunk: Vec<T>, f: &impl Fn(&T) -> R) -> Vec<(T, R)> {
        chunk
            .into_iter()
            .map(|t| {
                let r = f(&t);
                (t, r)
            })
            .collect()
    }
    if tasks == 1 {
        return OnCores::Done(run(items, &f));
    }
    let f = Arc::new(f);
    let per = items.len().div_ceil(tasks);
    let mut rest = items;
    let mut handles = Vec::with_capacity(tasks);
    while !rest.is_empty() {
        let tail = rest.split_off(per.min(rest.len()));
        let chunk = std::mem::replace(&mut rest, tail);
        let f = Arc::clone(&f);
        handles.push(tokio::task::spawn_blocking(move || run(chunk, f.as_ref())));
    }
    OnCores::Running(handles)
}

/// Reads `[from, to)` of `log`; see the module docs.
pub async fn read(
    store: &dyn BagStore,
    log: &str,
    opts: &ReadOptions,
    cfg: &BagConfig,
    clock: &dyn CheckedClock,
) -> Result<ReadReport> {
    validate_log(log)?;
    let mut report = ReadReport::default();
    if opts.to <= opts.from {
        return Ok(report);
    }
    // Closing acts on the instant true time has surely reached, checked
    // once: a reader whose clock is ahead must not seal the next seconds.
    // Refused, it closes nothing and says why (see `crate::vouched`).
    let closer_now = if opts.close_past_due {
        match crate::closer_now(clock).await {
            Ok(now) => Some(now),
            Err(e @ crate::Error::ClockUnvouched { .. }) => {
                report.close_refused = Some(e.to_string());
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    // Year 9999 is as far as the tree goes.
    let to = opts.to.min(Micros::from_micros(253_402_300_800_000_000));
    let first = Bucket::of(opts.from);
    let last = Bucket::of(to.saturating_sub_us(1));
    // Summaries cover whole minutes: the ones used are read from them, and
    // nothing of those minutes is listed, sealed or opened. Listed even
    // when not read from: they say where the messages of bags retention
    // removed are.
    let published = crate::summary::list(store, log).await?;
    let summaries = match opts.use_summaries {
        true => pick_summaries(store, log, &published, first, last, opts, &mut report).await?,
        false => Vec::new(),
    };
    let summarized = |b: &Bucket| summaries.iter().any(|(window, _, _)| window.contains(*b));
    // Seals first, then bags: a bag a seal lists existed when it was
    // sealed, so this listing sees it (unless retention removed it). The
    // same listing names the minutes retention removed (their tombstones).
    let (sealed_spans, removed_spans) = crate::seal::sealed_and_removed(store, log).await?;
    let mut existing = Vec::new();
    for (a, b) in uncovered(first, last, &summaries) {
        existing.extend(list_buckets(store, log, a, b).await?);
    }
    let life = match closer_now {
        Some(now) => store.log_start(log).await?.map(|start| (now, start)),
        None => None,
    };
    let range = Range {
        log,
        first,
        last,
        sealed: &sealed_spans,
        removed: &removed_spans,
        summarized: &summarized,
        published: &published,
    };
    let settled = settle(store, &range, existing, life, opts, cfg).await?;
    report.sealed = settled.sealed;
    report
        .problems
        .extend(missing_problems(&settled.missing, &published));
    let buckets = settled.buckets;
    let sealed_read: BTreeSet<Span> = buckets
        .iter()
        .map(|b| Span::of(*b))
        .filter(|s| settled.sealed_read.contains(s))
        .collect();
    // Bags and summarized bags, in one ascending order: a batch found twice
    // is reported at the same second copy either way.
    let mut sources: Vec<(Bucket, Option<(usize, usize)>)> = buckets.into_iter().map(|b| (b, None)).collect();
    for (i, (window, s, _)) in summaries.iter().enumerate() {
        for (j, bag) in s.bags.iter().enumerate() {
            let b = Bucket::from_secs(bag.bucket_secs);
            if (first..=last).contains(&b) && window.contains(b) {
                sources.push((b, Some((i, j))));
            }
        }
    }
    sources.sort_by_key(|(b, _)| *b);
    report.summaries_read = summaries.len() as u64;
    report.summaries_attested = summaries.iter().filter(|(_, _, v)| v.is_some()).count() as u64;
    let total = sources.len() as u64;
    // Room for the batches and messages of the attested summaries' bags in
    // range, made in one go (not grown, and copied, step by step).
    let (batches, messages) = summaries
        .iter()
        .filter(|(_, _, v)| v.is_some())
        .flat_map(|(window, s, _)| s.bags.iter().map(move |b| (window, b)))
        .filter(|(window, b)| {
            let b = Bucket::from_secs(b.bucket_secs);
            (first..=last).contains(&b) && window.contains(b)
        })
        .map(|(_, b)| b)
        .flat_map(|b| &b.items)
        .flat_map(|i| &i.batches)
        .fold((0, 0), |(b, m), batch| (b + 1, m + batch.payloads.len()));
    report.messages.reserve(messages);
    let mut seen = Seen {
        summaries: &summaries,
        batches: HashMap::with_capacity(batches),
        ..Seen::default()
    };
    // The attested summary being read without rebuilding its batches (by
    // index; `None`: it is read as any summary).
    let mut vouching: Option<(usize, Option<Vouching>)> = None;
    for (done, (bucket, from_summary)) in sources.into_iter().enumerate() {
        if let Some(p) = &opts.progress {
            p.report(done as u64, total);
        }
        if let Some((i, j)) = from_summary {
            let (_, summary, vouched) = &summaries[i];
            if let Some(key_id) = vouched {
                if vouching.as_ref().is_none_or(|(k, _)| *k != i) {
                    vouching = Some((i, Vouching::new(summary, key_id, opts)));
                }
                if let Some((_, Some(v))) = &mut vouching {
                    // What was read before becomes messages first: the
                    // messages come in the order read, as from the bags.
                    seen.finish(&mut report, opts, cfg).await;
                    read_vouched_bag(&mut report, &mut seen, opts, cfg, &summaries, (i, j), v).await?;
                    report.closed_bags_read += 1;
                    continue;
                }
            }
            read_summarized(
                &mut report,
                &mut seen,
                opts,
                log,
                summary,
                &summary.bags[j],
                vouched,
            )?;
            report.closed_bags_read += 1;
            if seen.pending.len() >= CHECK_ROUND {
                seen.next_round(&mut report, opts, cfg).await;
            }
            continue;
        }
        let (items, open) = match store.state(log, bucket).await? {
            BagState::Closed(l) => (l.items, false),
            BagState::Open(_) if closer_now.is_some_and(|now| now >= bucket.close_time(cfg.grace)) => {
                (store.close(log, bucket).await?.items, false)
            }
            BagState::Open(items) if opts.include_open => (items, true),
            BagState::Open(_) => {
                report.skipped_open.push(bucket);
                continue;
            }
        };
        if !open {
            report.closed_bags_read += 1;
        }
        for item in items {
            let at = Place {
                log,
                bucket,
                name: Arc::from(item.name.as_str()),
                item: &item,
                open,
                vouched: None,
            };
            if let Some(p) = at.too_big(opts) {
                report.problems.push(p);
                continue;
            }
            // An open item may have grown since it was listed: still bounded.
            let limit = if open { opts.max_item_bytes } else { item.size };
            match store.read_item(log, bucket, &item, Some(limit)).await {
                Ok(bytes) => read_item(&mut report, &mut seen, opts, &at, bytes),
                Err(e @ (crate::Error::ItemChanged { .. } | crate::Error::ItemRefused { .. })) => {
                    report.problems.push(at.damaged(None, e.to_string()))
                }
                // Retention removes a bag's items before its lock: one
                // removed under this read is missing, not a failed read.
                Err(e) if !open && e.is_not_found() => report.problems.push(Problem {
                    kind: ProblemKind::Missing,
                    what: format!(
                        "listed by the bag's lock, and gone{}",
                        match published.iter().find(|st| st.contains(bucket)) {
                            Some(st) => format!(
                                " (removed by retention): its messages are in summary {} ({st}); read \
                                 them with summaries",
                                st.name()
                            ),
                            None => ", and no published summary holds it".into(),
                        }
                    ),
                    ..at.damaged(None, String::new())
                }),
                Err(e) => return Err(e),
            }
        }
        if seen.pending.len() >= CHECK_ROUND {
            seen.next_round(&mut report, opts, cfg).await;
        }
    }
    seen.finish(&mut report, opts, cfg).await;
    report
        .problems
        .extend(removed_meanwhile(store, log, first, sealed_read).await?);
    if let Some(p) = &opts.progress {
        p.report(total, total);
    }
    // Stable: messages that compare equal stay in the order read. The
    // runs already in order (each attested bag's) are found, not moved.
    report.messages.sort_by(order);
    report.rejected.sort_by(|a, b| order(&a.message, &b.message));
    Ok(report)
}

/// The order of a read's messages: by `(timestamp, writer, sequence)`,
/// compared in place (no key is built or cloned per comparison).
fn order(a: &Message, b: &Message) -> std::cmp::Ordering {
    (a.timestamp, &a.writer_id, a.sequence).cmp(&(b.timestamp, &b.writer_id, b.sequence))
}

/// The range being read, and the sealed minutes of its log.
struct Range<'a> {
    log: &'a str,
    first: Bucket,
    last: Bucket,
    sealed: &'a BTreeSet<Span>,
    /// The minutes retention removed ([`crate::tombstone`]).
    removed: &'a BTreeSet<Span>,
    /// Seconds read from a summary: nothing of them is sealed or opened.
    summarized: &'a (dyn Fn(&Bucket) -> bool + Sync),
    /// Every published summary of the log, read from or not.
    published: &'a [Stretch],
}

/// What [`settle`] found.
struct Settled {
    /// The bags to read, ascending.
    buckets: Vec<Bucket>,
    /// Missing past-due seconds this read closed empty.
    sealed: u64,
    /// Bags a seal lists that are not there (retention removed them),
    /// ascending: never read, never closed again.
    missing: Vec<Bucket>,
    /// The sealed minutes whose bags are read: retention may remove one
    /// while they are read, so each one's tombstone is looked for after.
    sealed_read: BTreeSet<Span>,
}

/// Which bags of `[first, last]` hold the range's messages, how many
/// missing seconds this read closed empty, and which bags a seal lists
/// that are gone.
///
/// A minute's seal decides its seconds: a second it does not list is
/// closed empty, whatever bag a late writer made there since; one it lists
/// is decided by its own lock. With `life` (the instant true time has
/// surely reached, and the log's start mark), a past-due minute inside the
/// log's life without a seal is sealed now, and a missing past-due second
/// of a minute not yet due is closed empty on its own: otherwise a stalled
/// writer could create it after this read and a later reader would see
/// messages this one did not.
async fn settle(
    store: &dyn BagStore,
    range: &Range<'_>,
    existing: Vec<Bucket>,
    life: Option<(Micros, Bucket)>,
    opts: &ReadOptions,
    cfg: &BagConfig,
) -> Result<Settled> {
    let (log, first, last) = (range.log, range.first, range.last);
    let in_range = |b: &Bucket| (first..=last).contains(b);
    let existing: BTreeSet<Bucket> = existing.into_iter().collect();
    // The minutes that hold a bag, and the unsealed ones of the log's life
    // up to now (a closer may have to seal them): never every minute of
    // the range blindly (a read of "everything" spans millennia).
    let mut spans: BTreeSet<Span> = existing.iter().map(|b| Span::of(*b)).collect();
    if let Some((now, start)) = life {
        let (from, to) = (first.max(start), last.min(Bucket::of(now)));
        let horizon = Bucket::of(now.saturating_sub(opts.max_seal_lookback));
        if from <= to {
            for span in Span::covering(from, to).filter(|s| !range.sealed.contains(s)) {
                spans.insert(span);
                // The loop below refuses at this one: look no further.
                if span
                    .buckets()
                    .any(|b| in_range(&b) && b >= start && b < horizon && !existing.contains(&b))
                {
                    break;
                }
            }
        }
    }
    // The sealed minutes a summary holds, though no bag of theirs may be
    // left (retention): their seals say which bags are gone. Only these:
    // a bag is removed only under a summary, and reading the seal of
    // every quiet minute of a long range would cost a request each.
    for st in range.published {
        if st.last() >= first && st.from() <= last {
            spans.extend(
                st.spans()
                    .filter(|s| range.sealed.contains(s) && s.last() >= first && s.first() <= last),
            );
        }
    }
    // And the minutes retention removed, whose summary may be gone too:
    // their seals say what was there (the listing told which, at no cost).
    spans.extend(range.removed.range(Span::of(first)..=Span::of(last)).copied());
    spans.retain(|s| !(range.summarized)(&s.first()));
    let mut out = BTreeSet::new();
    let mut sealed = 0u64;
    let mut missing = Vec::new();
    let mut sealed_read = BTreeSet::new();
    for span in spans {
        let here = existing.range(span.first()..=span.last()).copied();
        if range.removed.contains(&span) {
            // Closed for good: whatever its directory holds now (a bag
            // made again after the removal) is no data, and is neither
            // read nor closed. What its seal lists is missing.
            let seal = crate::seal::seal_of(store, log, span)
                .await?
                .ok_or_else(|| Error::CorruptSeal {
                    log: log.to_owned(),
                    span: span.first(),
                    reason: "its tombstone says retention removed it, and it has no seal".into(),
                })?;
            missing.extend(seal.bags().filter(in_range));
            continue;
        }
        if range.sealed.contains(&span) {
            sealed_read.insert(span);
            let seal = crate::seal::seal_of(store, log, span)
                .await?
                .ok_or_else(|| Error::CorruptSeal {
                    log: log.to_owned(),
                    span: span.first(),
                    reason: "listed a moment ago, and now gone".into(),
                })?;
            out.extend(here.filter(|b| in_range(b) && seal.has_bag(*b)));
            // Listed by the seal, so it existed and was closed: gone now.
            // Not closed again (that would make it an empty bag).
            missing.extend(seal.bags().filter(|b| in_range(b) && !existing.contains(b)));
            continue;
        }
        let Some((now, start)) = life else {
            out.extend(here.filter(in_range));
            continue;
        };
        let missing = |due: &dyn Fn(&Bucket) -> bool| -> Vec<Bucket> {
            span.buckets()
                .filter(|b| in_range(b) && *b >= start && due(b) && !existing.contains(b))
                .collect()
        };
        if now >= span.close_time(cfg.grace) && span.last() >= start {
            let missing = missing(&|_| true);
            refuse_old_seal(log, &missing, now, opts)?;
            let seal = crate::seal::seal(store, log, span).await?;
            sealed_read.insert(span);
            sealed += missing.iter().filter(|b| !seal.has_bag(**b)).count() as u64;
            // Bags made since the listing above, that the seal lists, are
            // read too.
            out.extend(seal.bags().filter(in_range));
            continue;
        }
        let missing = missing(&|b| now >= b.close_time(cfg.grace));
        refuse_old_seal(log, &missing, now, opts)?;
        for b in missing {
            store.close(log, b).await?;
            sealed += 1;
            out.insert(b);
        }
        out.extend(here.filter(in_range));
    }
    Ok(Settled {
        buckets: out.into_iter().collect(),
        sealed,
        missing,
        sealed_read,
    })
}

/// One [`ProblemKind::Missing`] per minute in `read` (sealed minutes
/// whose bags this read read) that retention removed while it read them:
/// it may have found a bag gone, or made again empty by a closer, so what
/// it read of the minute may be short. Looked for after the reading:
/// retention writes a minute's tombstone before it removes anything, so a
/// minute without one now was read whole. Only sealed minutes: nothing
/// else can be summarized, so nothing else removed.
async fn removed_meanwhile(
    store: &dyn BagStore,
    log: &str,
    first: Bucket,
    read: BTreeSet<Span>,
) -> Result<Vec<Problem>> {
    let mut out = Vec::new();
    for span in read {
        if let Some(t) = crate::tombstone::of(store, log, span).await? {
            out.push(Problem {
                kind: ProblemKind::Missing,
                bucket: span.first().max(first),
                item: t.summary.name(),
                offset: None,
                what: format!(
                    "the bags of the minute {span} were removed by retention while this read read \
                     them, so it may have missed some of their messages: they are in summary {} \
                     ({}); read them with summaries",
                    t.summary.name(),
                    t.summary
                ),
                in_open_bag: false,
            });
        }
    }
    Ok(out)
}

/// One [`ProblemKind::Missing`] per run of missing bags held by one
/// summary (naming it, so a reader without summaries knows where the
/// messages are) or, where no summary holds them, per minute.
fn missing_problems(missing: &[Bucket], published: &[Stretch]) -> Vec<Problem> {
    #[derive(PartialEq)]
    enum Held {
        By(Stretch),
        Nowhere(Span),
    }
    let mut runs: Vec<(Held, Vec<Bucket>)> = Vec::new();
    for &b in missing {
        let held = match published.iter().find(|st| st.contains(b)) {
            Some(st) => Held::By(*st),
            None => Held::Nowhere(Span::of(b)),
        };
        match runs.last_mut() {
            Some((h, bags)) if *h == held => bags.push(b),
            _ => runs.push((held, vec![b])),
        }
    }
    runs.into_iter()
        .map(|(held, bags)| {
            let (first, last, n) = (bags[0], bags[bags.len() - 1], bags.len());
            let (item, what) = match held {
                Held::By(st) => (
                    st.name(),
                    format!(
                        "{n} bags from {first} to {last}, listed by their minute's seal, were removed by \
                         retention: their messages are in summary {} ({st}); read them with summaries",
                        st.name()
                    ),
                ),
                Held::Nowhere(span) => (
                    span.seal_name(),
                    format!(
                        "{n} bags from {first} to {last}, listed by the seal of the minute {span}, are gone \
                         and no published summary holds them (retention removed them and then their \
                         summary, or they were lost): their messages cannot be read"
                    ),
                ),
            };
            Problem {
                kind: ProblemKind::Missing,
                bucket: first,
                item,
                offset: None,
                what,
                in_open_bag: false,
            }
        })
        .collect()
}

/// The published summaries to read `[first, last]` from: those that
/// overlap it, earliest first, each with the window of whole minutes it
/// is read for (its stretch, less what an earlier one covers). Summaries
/// of different lengths overlap (`--span 1m` and `--span 2m` over one
/// log); each minute is read from the first that holds it, and a longer
/// one is still read for the minutes beyond a shorter one: skipping it
/// whole would read those minutes from their bags, which retention may
/// have removed.
///
/// With trusted summarizers, each comes with the key id of the first
/// trusted attestation that holds over its stored bytes; one that is
/// there and does not hold is a problem of the read.
async fn pick_summaries(
    store: &dyn BagStore,
    log: &str,
    published: &[Stretch],
    first: Bucket,
    last: Bucket,
    opts: &ReadOptions,
    report: &mut ReadReport,
) -> Result<Vec<PickedSummary>> {
    let mut out: Vec<PickedSummary> = Vec::new();
    let attested: Vec<(Stretch, String)> = match &opts.trusted_summarizers {
        Some(ring) => crate::summary::attest::list(store, log)
            .await?
            .into_iter()
            .filter(|(_, id)| ring.get(id).is_some())
            .collect(),
        None => Vec::new(),
    };
    // (stretch, window), windows disjoint and ascending: `published` is
    // sorted by first minute, then length.
    let mut picked: Vec<(Stretch, Stretch)> = Vec::new();
    for &st in published {
        if st.last() < first || st.from() > last {
            continue;
        }
        let from = match picked.last() {
            Some((_, w)) if w.last() >= st.from() => Span::of(w.last()).next(),
            _ => st.first,
        };
        if from.first() > st.last() {
            continue;
        }
        let minutes = (st.last().secs() + 1 - from.first().secs()) / crate::seal::SPAN_SECS;
        let minutes = u32::try_from(minutes).expect("within the stretch, whose minutes fit");
        picked.push((st, Stretch::new(from, minutes)));
    }
    // Fetched in order; decoded (and, where an attestation is to be
    // checked, hashed) a few at once on the machine's cores.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let attested = &attested;
    let mut loaded = futures::stream::iter(picked)
        .map(|(st, window)| async move {
            let bytes = crate::summary::fetch(store, log, st).await.map_err(|e| (st, e))?;
            let hash = attested.iter().any(|(a, _)| *a == st);
            let log = log.to_owned();
            let decoded = tokio::task::spawn_blocking(move || {
                let digest = hash.then(|| crate::summary::attest::digest(&bytes));
                crate::summary::parse(&log, st, bytes).map(|s| (s, digest))
            })
            .await;
            match decoded {
                Ok(decoded) => decoded
                    .map(|(summary, digest)| (st, window, summary, digest))
                    .map_err(|e| (st, e)),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("a summary's decoding was cancelled: {e}"),
            }
        })
        .buffered(cores.max(2));
    while let Some(next) = loaded.next().await {
        let (st, window, summary, digest) = match next {
            Ok(loaded) => loaded,
            // A corrupt summary (one over `MAX_SUMMARY_EXPANSION`
            // included) is a finding of the read, naming the object, not
            // its end: its window is left uncovered, so its minutes are
            // read from their bags (those retention removed are `Missing`
            // problems naming it).
            Err((st, e @ Error::CorruptSummary { .. })) => {
                report.problems.push(Problem {
                    kind: ProblemKind::Damaged,
                    bucket: st.from(),
                    item: st.name(),
                    offset: None,
                    what: format!("{e}; its minutes are read from their bags"),
                    in_open_bag: false,
                });
                continue;
            }
            Err((_, e)) => return Err(e),
        };
        let mut vouched = None;
        for (_, key_id) in attested.iter().filter(|(a, _)| *a == st) {
            let digest = digest.as_ref().expect("hashed: it has an attestation to check");
            match crate::summary::attest::check(
                store,
                log,
                st,
                key_id,
                opts.trusted_summarizers.as_ref(),
                digest,
            )
            .await?
            {
                Some(Ok(_)) => {
                    vouched = Some(Arc::from(key_id.as_str()));
                    break;
                }
                Some(Err(why)) => report.problems.push(Problem {
                    kind: ProblemKind::Attestation,
                    bucket: st.from(),
                    item: crate::summary::attest::name(st, key_id),
                    offset: None,
                    what: format!("attestation not trusted, summary read with every check: {why}"),
                    in_open_bag: false,
                }),
                // Removed since the listing (retention): nothing to trust.
                None => {}
            }
        }
        out.push((window, summary, vouched));
    }
    Ok(out)
}

/// A summary a read uses: the minutes it is read for (its window, see
/// [`pick_summaries`]), the summary, and the trusted summarizer that
/// attested it.
type PickedSummary = (Stretch, Summary, Option<Arc<str>>);

/// The parts of `[first, last]` no summary covers.
fn uncovered(first: Bucket, last: Bucket, summaries: &[PickedSummary]) -> Vec<(Bucket, Bucket)> {
    let mut out = Vec::new();
    let mut at = first.secs();
    for (st, _, _) in summaries {
        if st.from().secs() > at {
            out.push((
                Bucket::from_secs(at),
                Bucket::from_secs(st.from().secs() - 1).min(last),
            ));
        }
        at = at.max(st.last().secs() + 1);
    }
    if at <= last.secs() {
        out.push((Bucket::from_secs(at), last));
    }
    out
}

/// Reads one summarized bag as [`read`] reads a closed bag.
fn read_summarized(
    report: &mut ReadReport,
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    log: &str,
    summary: &Summary,
    bag: &SummaryBag,
    vouched: &Option<Arc<str>>,
) -> Result<()> {
    let bucket = Bucket::from_secs(bag.bucket_secs);
    let corrupt = |reason| Error::CorruptSummary {
        log: summary.log.clone(),
        name: crate::summary::object_name(summary),
        reason,
    };
    for si in &bag.items {
        // Batches rebuilt with their witnesses shared, not copied into
        // each (a summary may cite one witness in every batch of an item).
        let records = match si.is_raw {
            true => None,
            false => Some(crate::summary::packed::rebuild_shared(summary, bag, si).map_err(corrupt)?),
        };
        let rebuilt = match &records {
            None => crate::summary::rebuild_item(summary, bag, si)?,
            Some((_, framed)) => crate::summary::RebuiltItem {
                name: summary
                    .item_names
                    .get(si.name as usize)
                    .ok_or_else(|| corrupt(format!("item name index {} out of range", si.name)))?
                    .clone(),
                size: si.size.unwrap_or(*framed),
                records: crate::summary::Records::Batches(Vec::new()),
            },
        };
        let item = ListedItem {
            name: rebuilt.name,
            size: rebuilt.size,
            etag: None,
        };
        let at = Place {
            log,
            bucket,
            name: Arc::from(item.name.as_str()),
            item: &item,
            open: false,
            vouched: vouched.clone(),
        };
        if let Some(p) = at.too_big(opts) {
            report.problems.push(p);
            continue;
        }
        match (records, rebuilt.records) {
            // Rebuilt as batches: the record's digest names it (for copies
            // found twice) and its offset places its frame.
            (Some((batches, _)), _) => {
                for b in batches {
                    read_batch(
                        report,
                        seen,
                        opts,
                        &at,
                        b.offset,
                        b.digest,
                        (b.batch, b.witnesses),
                    );
                }
            }
            (None, crate::summary::Records::Raw(raw)) => read_item(report, seen, opts, &at, raw),
            (None, crate::summary::Records::Batches(_)) => unreachable!("an item not raw is rebuilt shared"),
        }
    }
    Ok(())
}

/// A summary a trusted summarizer attested, read without rebuilding or
/// re-encoding its batches: what its tables decide for every batch citing
/// them, worked out once per read of it. Its batches' holder signatures
/// and (local) signed times are taken as the summarizer verified them;
/// their witnesses (each once per read), bounds, signed-time congruence,
/// copies and placement are checked as for any batch, with the same
/// results, problems and messages as rebuilding them would give.
struct Vouching {
    key_id: Arc<str>,
    vouched: Vouched,
    /// The encoded length of each witness (to place each record in its
    /// item as its bag holds it).
    witness_lens: Vec<usize>,
    /// Each signed time, by index (`None`: one that does not rebuild,
    /// which no batch read can cite).
    times: Vec<Option<VouchedTime>>,
    /// What each distinct list of witnesses decides.
    lists: HashMap<Vec<u32>, Arc<VouchedList>>,
    /// The notes of the batch before, by its list and time note: every
    /// batch of a lease gets the same.
    last_notes: Option<NotesOf>,
}

/// The notes of batches citing a list of witnesses, with a signed time
/// with this note (or none).
type NotesOf = ((usize, Option<&'static str>), Vec<String>);

struct VouchedTime {
    len: usize,
    signed_time: Arc<pb::SignedTime>,
    /// A note on its messages (not verified, and why), or its reading.
    check: std::result::Result<std::result::Result<bagel_proto::TimeReading, String>, &'static str>,
}

/// What a list of witnesses decides for a batch citing it.
struct VouchedList {
    /// Its number among the summary's lists.
    id: usize,
    witnessed: Witnessed,
    lease_ids: Vec<String>,
    holder: crate::holder_sig::HolderCheck,
    witnesses: Arc<[pb::Witness]>,
}

/// A batch of an item, walked ([`crate::summary::packed::walk_item`]).
struct Walked {
    batch: usize,
    writer: u32,
    first_sequence: u64,
    time: u32,
    list: Arc<VouchedList>,
    timestamps: std::ops::Range<usize>,
    offset: u64,
}

impl Vouching {
    /// `None` where the summary must be read as any summary: it has a
    /// signed time this read verifies itself (a Roughtime proof, given
    /// Roughtime keys).
    fn new(summary: &Summary, key_id: &Arc<str>, opts: &ReadOptions) -> Option<Self> {
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
    fn list(
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
async fn read_vouched_bag(
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

/// Refuses to close missing bags older than `now - max_seal_lookback`:
/// most likely a stray start mark or a `from` far before the log began.
/// Bags that exist cost nothing, so an old range that was closed and
/// sealed in its time reads as before.
fn refuse_old_seal(log: &str, missing: &[Bucket], now: Micros, opts: &ReadOptions) -> Result<()> {
    let horizon = Bucket::of(now.saturating_sub(opts.max_seal_lookback));
    match missing.first() {
        Some(first) if *first < horizon => Err(crate::Error::SealTooFar {
            log: log.to_owned(),
            first: *first,
            missing: missing.len() as u64,
            limit: opts.max_seal_lookback,
        }),
        _ => Ok(()),
    }
}

trait SubUs {
    fn saturating_sub_us(self, us: u64) -> Micros;
}

impl SubUs for Micros {
    fn saturating_sub_us(self, us: u64) -> Micros {
        Micros::from_micros(self.as_micros().saturating_sub(us))
    }
}

/// Where bytes were read from.
struct Place<'a> {
    log: &'a str,
    bucket: Bucket,
    item: &'a ListedItem,
    /// The item's name, shared by every batch read from it.
    name: Arc<str>,
    open: bool,
    /// Read from a summary a trusted summarizer attested.
    vouched: Option<Arc<str>>,
}

impl Place<'_> {
    /// A damage found here, at `offset` in the item (or the item whole).
    fn damaged(&self, offset: Option<u64>, what: String) -> Problem {
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
    fn too_big(&self, opts: &ReadOptions) -> Option<Problem> {
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

fn read_item(report: &mut ReadReport, seen: &mut Seen<'_>, opts: &ReadOptions, at: &Place<'_>, bytes: Bytes) {
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
fn read_record(
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
fn read_batch(
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
fn copy_or_misplaced(
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
fn misplaced(at_log: &str, bucket: Bucket, log: &str, bucket_secs: u64) -> bool {
    !log.is_empty() && (log != at_log || bucket_secs != bucket.secs())
}

/// The verdict on a batch's witnesses: per lease, its bounds.
struct Lease {
    id: String,
    min: Micros,
    deadline: Micros,
}

/// What a batch's witnesses decide (each checked once per read): the
/// first reason its messages are rejected, if any (no witness, a witness
/// that does not verify or is tentative), each lease's bounds, and the
/// holders they name when every witness could be read.
struct Witnessed {
    error: Option<String>,
    leases: Vec<Lease>,
    holders: Option<Vec<crate::holder_sig::Holder>>,
}

fn witnessed<'w>(
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    witnesses: impl ExactSizeIterator<Item = &'w pb::Witness>,
) -> Witnessed {
    let n = witnesses.len();
    let mut error: Option<String> = None;
    let mut leases = Vec::with_capacity(n);
    let mut holders = Vec::with_capacity(n);
    if n == 0 {
        error = Some("cites no lease witness".into());
    }
    for w in witnesses {
        match &*seen.witness(w, opts.keys.as_ref()) {
            Ok(b) if !b.full => {
                error.get_or_insert_with(|| {
                    format!(
                        "cites the witness of lease {}, which is tentative: no right to write",
                        b.lease_id
                    )
                });
            }
            Ok(b) => {
                leases.push(Lease {
                    id: b.lease_id.clone(),
                    min: b.min,
                    deadline: b.deadline,
                });
                holders.push(b.holder.clone());
            }
            Err(e) => {
                error.get_or_insert_with(|| e.clone());
            }
        }
    }
    // The holder's signature: checked against the key inside each witness,
    // so it needs no trusted key of its own (the witness's does).
    let holders = (holders.len() == n && !holders.is_empty()).then_some(holders);
    Witnessed {
        error,
        leases,
        holders,
    }
}

/// Why a batch naming `log` and `bucket_secs`, found in `at_log`'s bag
/// `bucket`, is misplaced, if it is: its messages are rejected for it.
fn misplaced_error(at_log: &str, bucket: Bucket, log: &str, bucket_secs: u64) -> Option<String> {
    misplaced(at_log, bucket, log, bucket_secs).then(|| {
        format!(
            "its batch names log {log:?} bag {}, not log {at_log:?} bag {bucket} where it was found (moved or copied)",
            Bucket::from_secs(bucket_secs),
        )
    })
}

/// What is done with a signed time `st` of a batch read `vouched` (or not).
fn time_check(st: Option<&pb::SignedTime>, vouched: bool, opts: &ReadOptions) -> TimeCheck {
    // A local proof with the same keys, a Roughtime proof with the
    // Roughtime keys (plus its one-second resolution).
    let is_roughtime = matches!(
        st.and_then(|t| t.proof.as_ref()),
        Some(pb::signed_time::Proof::Roughtime(_))
    );
    // A trusted summarizer vouches for a local proof's signature, not for
    // whom it trusts: the signer must be one of this reader's own keys, as
    // for any batch read from the bags. Without keys, or with a signer
    // this reader does not know, the time is treated as unvouched.
    let vouched_time = match (vouched, st, &opts.keys) {
        (true, Some(st), Some(keys)) if local_signer_known(st, keys) => {
            crate::summary::attest::vouched_time(st)
        }
        _ => None,
    };
    match (st, &opts.keys) {
        (None, _) => TimeCheck::Note("no signed time"),
        (Some(_), _) if vouched_time.is_some() => {
            TimeCheck::Vouched(vouched_time.expect("checked just above"))
        }
        (Some(_), _) if is_roughtime && opts.roughtime_keys.is_empty() => {
            TimeCheck::Note("Roughtime signed time NOT verified (no Roughtime key given)")
        }
        (Some(_), None) if !is_roughtime => TimeCheck::Note("signed time NOT verified (no key given)"),
        (Some(st), _) => TimeCheck::Verify(st.encode_to_vec()),
    }
}

/// Whether `st` is a local proof signed by a key of `keys` (by key id).
fn local_signer_known(st: &pb::SignedTime, keys: &KeyRing) -> bool {
    match &st.proof {
        Some(pb::signed_time::Proof::Local(local)) => keys.get(&local.key_id).is_some(),
        _ => false,
    }
}

/// The note on every message when witness signatures are not checked.
const NO_KEY_NOTE: &str = "witness signatures NOT verified (no key given)";

/// Checks what a batch's witnesses decide now (once per distinct witness)
/// and leaves its holder signatures and signed time to [`Seen::next_round`].
fn check_batch(
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    at: &Place<'_>,
    batch: pb::Batch,
    witnesses: Arc<[pb::Witness]>,
) {
    let Witnessed {
        error,
        leases,
        holders,
    } = witnessed(seen, opts, witnesses.iter());
    // Misplaced comes first, then what the witnesses say.
    let error = misplaced_error(at.log, at.bucket, &batch.log, batch.bucket_secs).or(error);
    let mut notes = Vec::new();
    if opts.keys.is_none() {
        notes.push(NO_KEY_NOTE.to_owned());
    }
    let time = time_check(batch.signed_time.as_ref(), at.vouched.is_some(), opts);
    seen.pending.push(Pending {
        batch,
        witnesses,
        bucket: at.bucket,
        open: at.open,
        error,
        notes,
        leases,
        holders,
        time,
        holder: None,
        vouched: at.vouched.clone(),
    });
}

/// Turns a checked batch into messages: accepted, or rejected with the
/// first reason that applies.
fn finish_batch(
    report: &mut ReadReport,
    times: &HashMap<Vec<u8>, std::result::Result<bagel_proto::TimeReading, String>>,
    opts: &ReadOptions,
    cfg: &BagConfig,
    p: Pending,
) {
    let Pending {
        batch,
        witnesses,
        bucket,
        open,
        mut error,
        mut notes,
        leases,
        holder,
        time,
        vouched,
        ..
    } = p;
    let holder = holder.unwrap_or_else(not_all_witnesses_read);
    holder_verdict(&holder, &mut error, &mut notes);
    let time_ref = match &time {
        TimeCheck::Verify(key) => match times.get(key) {
            Some(verdict) => time_verdict(verdict, &mut error),
            None => unreachable!("every pending signed time is verified before its batch is finished"),
        },
        TimeCheck::Note(note) => {
            notes.push((*note).to_owned());
            None
        }
        TimeCheck::Vouched(verdict) => time_verdict(verdict, &mut error),
    };
    let vouched = match vouched {
        Some(key_id) => Vouched::Attested { key_id },
        None => Vouched::Checked,
    };
    let lease_ids: Vec<String> = leases.iter().map(|l| l.id.clone()).collect();
    let batch_at = BatchAt {
        bucket,
        open,
        writer_id: &batch.writer_id,
        first_sequence: batch.first_sequence,
        lease_ids: &lease_ids,
        leases: &leases,
        notes: &notes,
        witnesses,
        signed_time: batch.signed_time.map(Arc::new),
        holder: &holder,
        vouched: &vouched,
        error: &error,
        time_ref,
    };
    batch_at.push_messages(
        report,
        opts,
        cfg,
        batch
            .entries
            .into_iter()
            .map(|e| (e.timestamp_us, Bytes::from(e.payload))),
    );
}

/// The holder verdict of a batch whose witnesses could not all be read.
fn not_all_witnesses_read() -> crate::holder_sig::HolderCheck {
    crate::holder_sig::HolderCheck::Bad {
        reason: "its witnesses could not all be read, so its holder signatures were not checked".into(),
    }
}

/// What a batch's holder verdict adds to its notes or error.
fn holder_verdict(
    holder: &crate::holder_sig::HolderCheck,
    error: &mut Option<String>,
    notes: &mut Vec<String>,
) {
    match holder {
        crate::holder_sig::HolderCheck::Bound => {}
        crate::holder_sig::HolderCheck::Unbound { lease_ids } => notes.push(format!(
            "NOT bound to its writer: lease(s) {} were acquired without a holder key, so anyone with a \
             copy of their witness could have written this batch",
            lease_ids.join(", ")
        )),
        crate::holder_sig::HolderCheck::Bad { reason } => {
            error.get_or_insert_with(|| reason.clone());
        }
    }
}

/// A batch's signed time as verified (its reading), or why not (its error).
fn time_verdict(
    verdict: &std::result::Result<bagel_proto::TimeReading, String>,
    error: &mut Option<String>,
) -> Option<bagel_proto::TimeReading> {
    match verdict {
        Ok(r) => Some(*r),
        Err(e) => {
            error.get_or_insert_with(|| format!("signed time: {e}"));
            None
        }
    }
}

/// A checked batch, all its messages share.
struct BatchAt<'a> {
    bucket: Bucket,
    open: bool,
    writer_id: &'a str,
    first_sequence: u64,
    lease_ids: &'a [String],
    leases: &'a [Lease],
    notes: &'a [String],
    witnesses: Arc<[pb::Witness]>,
    signed_time: Option<Arc<pb::SignedTime>>,
    holder: &'a crate::holder_sig::HolderCheck,
    vouched: &'a Vouched,
    /// Why all its messages are rejected, if they are.
    error: &'a Option<String>,
    time_ref: Option<bagel_proto::TimeReading>,
}

impl BatchAt<'_> {
    /// Its messages (timestamp, payload), in order, each accepted or
    /// rejected with the first reason that applies; those outside the
    /// read's range left out.
    fn push_messages(
        &self,
        report: &mut ReadReport,
        opts: &ReadOptions,
        cfg: &BagConfig,
        entries: impl Iterator<Item = (u64, Bytes)>,
    ) {
        let bucket = self.bucket;
        for (i, (ts, payload)) in entries.enumerate() {
            let ts = Micros::from_micros(ts);
            if ts < opts.from || ts >= opts.to {
                continue;
            }
            let message = Message {
                timestamp: ts,
                writer_id: self.writer_id.to_owned(),
                sequence: self.first_sequence + i as u64,
                payload,
                bucket,
                lease_ids: self.lease_ids.to_vec(),
                from_open_bag: self.open,
                notes: self.notes.to_vec(),
                witnesses: Arc::clone(&self.witnesses),
                signed_time: self.signed_time.clone(),
                holder: self.holder.clone(),
                vouched: self.vouched.clone(),
            };
            let reason = self.error.clone().or_else(|| {
                if Bucket::of(ts) != bucket {
                    return Some(format!("timestamp {ts} does not belong in bag {bucket}"));
                }
                for l in self.leases {
                    if ts <= l.min {
                        return Some(format!(
                            "timestamp {ts} is not after lease {}'s min_timestamp {}",
                            l.id, l.min
                        ));
                    }
                    if ts >= l.deadline {
                        return Some(format!(
                            "timestamp {ts} is at or after lease {}'s deadline {}",
                            l.id, l.deadline
                        ));
                    }
                }
                if let Some(r) = self.time_ref
                    && let Err((diff, limit)) = r.congruent(ts, cfg.signed_time_tolerance)
                {
                    return Some(format!(
                        "timestamp {ts} is {diff} us away from its signed time {} (limit {limit} us)",
                        r.time
                    ));
                }
                None
            });
            match reason {
                Some(reason) => report.rejected.push(Rejected { message, reason }),
                None => report.messages.push(message),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bagel_proto::Micros;
    use bagel_proto::clock::ManualClock;

    use super::*;
    use crate::directory::DirectoryStore;

    fn secs(s: u64) -> Micros {
        Micros::from_micros(s * 1_000_000)
    }

    /// A local signed time in a trusted summary is taken as vouched only
    /// when its signer is one of the reader's keys. Before, the
    /// summarizer's key ring decided: a reader with no keys, or other
    /// keys, took it as verified.
    #[test]
    fn a_vouched_local_time_needs_the_readers_key() {
        let signer = bagel_proto::Signer::generate();
        let st = bagel_proto::sign_local_time(&signer, "t", secs(1_800_000_000), 0);
        let mine: KeyRing = [signer.verifying_key()].into_iter().collect();
        let other: KeyRing = [bagel_proto::Signer::generate().verifying_key()]
            .into_iter()
            .collect();
        let with = |keys: Option<KeyRing>| ReadOptions::default().with_keys(keys);
        assert!(matches!(
            time_check(Some(&st), true, &with(Some(mine))),
            TimeCheck::Vouched(Ok(_))
        ));
        assert!(matches!(
            time_check(Some(&st), true, &with(Some(other))),
            TimeCheck::Verify(_)
        ));
        assert!(matches!(
            time_check(Some(&st), true, &with(None)),
            TimeCheck::Note(_)
        ));
    }

    /// A read can be spawned: it holds nothing that is not `Send` across
    /// its awaits.
    #[test]
    fn a_read_is_send() {
        fn send<T: Send>(_: &T) {}
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::local(dir.path(), false);
        let clock = bagel_proto::clock::AssumedExact(ManualClock::new(secs(1)));
        let (opts, cfg) = (ReadOptions::default(), BagConfig::default());
        send(&read(&store, "log", &opts, &cfg, &clock));
    }

    #[tokio::test]
    async fn sealing_reaches_back_only_as_far_as_the_lookback() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::local(dir.path(), false);
        let cfg = BagConfig::default();
        // 20 s into a minute: the minute before is past due (its last
        // second closed at -18 s), this one is not.
        let now = 2_000_000_000;
        assert_eq!(now % 60, 20);
        let clock = bagel_proto::clock::AssumedExact(ManualClock::new(secs(now)));
        store
            .mark_log_start("log", Bucket::from_secs(now - 100))
            .await
            .unwrap();
        let opts = ReadOptions::default().with_max_seal_lookback(Duration::from_secs(60));
        // -100 s ..= -81 s of the minute from -140 s are beyond the 60 s
        // lookback: refused, nothing sealed.
        let err = read(&store, "log", &opts, &cfg, &clock).await.unwrap_err();
        match err {
            crate::Error::SealTooFar { first, missing, .. } => {
                assert_eq!((first, missing), (Bucket::from_secs(now - 100), 20));
            }
            e => panic!("{e}"),
        }
        let old = Span::of(Bucket::from_secs(now - 100));
        assert_eq!(crate::seal::seal_of(&store, "log", old).await.unwrap(), None);
        // From within the lookback: the minute before is sealed by one
        // object (39 of its seconds are in range), and the past-due seconds
        // of this minute (-20 s ..= -3 s) are closed one by one.
        let later = opts.clone().with_range(secs(now - 59), Micros::MAX);
        let r = read(&store, "log", &later, &cfg, &clock).await.unwrap();
        assert_eq!(r.sealed, 39 + 18);
        let before = Span::of(Bucket::from_secs(now - 59));
        let seal = crate::seal::seal_of(&store, "log", before)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seal.empty_seconds(), 60);
        assert!(!dir.path().join("log").join(before.first().path()).exists());
        // A longer lookback seals the old minute too.
        let wide = opts.with_max_seal_lookback(Duration::from_secs(200));
        let r = read(&store, "log", &wide, &cfg, &clock).await.unwrap();
        assert_eq!(r.sealed, 20);
        assert!(crate::seal::seal_of(&store, "log", old).await.unwrap().is_some());
        // Sealed once, read again: nothing more to seal.
        assert_eq!(read(&store, "log", &wide, &cfg, &clock).await.unwrap().sealed, 0);
    }

    /// Holder keys are decompressed once per read and rebuilt batches are
    /// not decoded again, yet every batch is still checked on its own: one
    /// altered among many of several writers (each with its own lease and
    /// holder key) is the one rejected, named by its writer, sequence and
    /// bag, whether read from the bags or from a summary of them.
    #[tokio::test]
    async fn a_tampered_batch_among_many_is_named_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
        let cfg = BagConfig::default();
        let t0 = secs(1_800_000_000);
        let clock = ManualClock::new(t0);
        let leases = crate::testing::TestLeases::default();
        leases
            .write_busy_stretch(&store, "log", 4, &clock, t0, &cfg)
            .await;
        // Alter the 4th batch w2 wrote in the third second: same length,
        // a valid frame, the holder signature left as it was.
        let bag = Bucket::of(t0.saturating_add(Duration::from_secs(2)));
        let bag_dir = dir.path().join("log").join(bag.path());
        let file = std::fs::read_dir(&bag_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("w2.") && name.ends_with(".log")
            })
            .unwrap();
        let bytes = Bytes::from(std::fs::read(&file).unwrap());
        let mut out = Vec::new();
        let mut forged_sequence = None;
        for (i, f) in frame::decode(&bytes).into_iter().enumerate() {
            let Frame::Record { body, .. } = f else {
                panic!("not a whole record");
            };
            let mut batch = pb::Batch::decode(body).unwrap();
            if i == 3 {
                batch.entries[0].payload = b"deposit 99".to_vec();
                forged_sequence = Some(batch.first_sequence);
            }
            out.extend_from_slice(&frame::encode(&batch.encode_to_vec()));
        }
        assert_eq!(out.len(), bytes.len());
        std::fs::write(&file, out).unwrap();
        let forged_sequence = forged_sequence.expect("w2 wrote 10 batches in that second");

        let span = Span::of(Bucket::of(t0));
        clock.set(span.close_time(cfg.grace));
        let checked = bagel_proto::clock::AssumedExact(clock.clone());
        let opts = ReadOptions::default()
            .with_range(t0, t0.saturating_add(Duration::from_secs(60)))
            .with_keys(Some(leases.keys()));
        let check = |r: &ReadReport| {
            assert!(r.problems.is_empty(), "{:?}", r.problems);
            assert_eq!(r.messages.len(), 199);
            assert!(r.messages.iter().all(Message::verified));
            let [rejected] = r.rejected.as_slice() else {
                panic!("{:?}", r.rejected);
            };
            let m = &rejected.message;
            assert_eq!(
                (m.writer_id.as_str(), m.sequence, m.bucket, &m.payload[..]),
                ("w2", forged_sequence, bag, &b"deposit 99"[..])
            );
            assert!(
                rejected
                    .reason
                    .contains("holder signature for lease lease-2 does not verify"),
                "{}",
                rejected.reason
            );
        };
        let from_bags = read(
            store.as_ref(),
            "log",
            &opts.clone().with_summaries(false),
            &cfg,
            &checked,
        )
        .await
        .unwrap();
        check(&from_bags);
        crate::summary::summarize(store.as_ref(), "log", crate::summary::Stretch::new(span, 1))
            .await
            .unwrap();
        let from_summary = read(store.as_ref(), "log", &opts, &cfg, &checked).await.unwrap();
        assert_eq!(from_summary.summaries_read, 1);
        check(&from_summary);
        assert_eq!(from_summary.messages, from_bags.messages);
        assert_eq!(from_summary.rejected, from_bags.rejected);
    }
}
