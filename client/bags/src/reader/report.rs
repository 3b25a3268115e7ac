//! What a read returns: messages, rejections and problems.

use std::sync::Arc;

use bagel_proto::{Micros, pb};
use bytes::Bytes;

use crate::Bucket;

/// One message as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Its timestamp, µs since the Unix epoch, as its writer gave it.
    pub timestamp: Micros,
    /// The writer that wrote it.
    pub writer_id: String,
    /// Its number in its writer's sequence: with the timestamp and writer,
    /// it orders and identifies the message.
    pub sequence: u64,
    /// The bytes written.
    pub payload: Bytes,
    /// The bag it was read from.
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
    /// ([`ReadOptions::trusted_summarizers`](super::ReadOptions::trusted_summarizers)). Its witnesses, bounds and
    /// signed-time congruence were still checked by this read (and a
    /// Roughtime signed time verified).
    Attested {
        /// The key id of the summarizer that attested it.
        key_id: Arc<str>,
    },
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
    /// The message as read; it is not among the accepted messages.
    pub message: Message,
    /// Which check it failed, for people.
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
    /// What sort of problem.
    pub kind: ProblemKind,
    /// The bag it is in (see [`ProblemKind`] for summaries and seals).
    pub bucket: Bucket,
    /// The data file, object, summary or seal it is in.
    pub item: String,
    /// Byte offset in `item` where it starts; `None` when it is about the
    /// whole item.
    pub offset: Option<u64>,
    /// What is wrong, for people.
    pub what: String,
    /// In an open bag, a torn tail may just be a write in progress.
    pub in_open_bag: bool,
}

/// What a [`read`](super::read) found: the messages in order, and
/// everything that did not pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Accepted messages, ordered by `(timestamp, writer, sequence)`.
    pub messages: Vec<Message>,
    /// Messages that failed a check, with why.
    pub rejected: Vec<Rejected>,
    /// Damage, duplicates, misplaced batches and missing bags met.
    pub problems: Vec<Problem>,
    /// Bags in range that were open and not read.
    pub skipped_open: Vec<Bucket>,
    /// Closed bags read from the store (not counting summaries).
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
