//! Bags as `read --json` (one object per line: each message, each
//! rejected message, each problem, then the summary), `retain --json` and
//! `summarize --json` (one line per summary) print them. Keys in
//! alphabetical order; an absent value is `null` (a message's `reason`
//! excepted).

use serde::{Deserialize, Serialize};

/// What a line of `read --json` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadItemKind {
    /// A message read and accepted ([`ReadMessageJson`]).
    Message,
    /// A message refused, with the reason ([`ReadMessageJson`]).
    Rejected,
    /// Something wrong in a bag ([`ProblemJson`]).
    Problem,
    /// The last line ([`ReadSummaryJson`]).
    Summary,
}

/// A message `read --json` accepted (`kind` `message`) or refused (`kind`
/// `rejected`, with `reason`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadMessageJson {
    /// The bag it was read from.
    pub bag: String,
    pub from_open_bag: bool,
    pub kind: ReadItemKind,
    pub lease_ids: Vec<String>,
    /// Why a check did not hold (or could not be made).
    pub notes: Vec<String>,
    /// The payload as UTF-8 (invalid sequences replaced).
    pub payload: String,
    /// Why it was refused (`rejected` only; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub sequence: u64,
    /// `timestamp_us` as a date and time.
    pub time: String,
    pub timestamp_us: u64,
    /// Every check was made and held (never without keys; never for a
    /// refused message).
    pub verified: bool,
    /// The key id of the trusted summarizer whose attestation vouched for
    /// its holder signatures and signed time (`read --trust-summarizer`);
    /// absent when this read checked them itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vouched_by: Option<String>,
    pub writer_id: String,
}

/// Something wrong in a bag, as `read --json` prints it (`kind`
/// `problem`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemJson {
    pub bag: String,
    /// A torn tail in an open bag is a write in progress, not damage.
    pub in_open_bag: bool,
    pub item: String,
    pub kind: ReadItemKind,
    pub offset: Option<u64>,
    pub what: String,
}

/// The last line of `read --json` (`kind` `summary`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSummaryJson {
    /// Why past-due bags were not closed (`null` when none was refused).
    pub close_refused: Option<String>,
    pub closed_bags_read: u64,
    pub kind: ReadItemKind,
    pub messages: u64,
    pub open_bags_skipped: u64,
    pub problems: u64,
    pub rejected: u64,
    /// Summaries read on a trusted summarizer's attestation (present only
    /// with `--trust-summarizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summaries_attested: Option<u64>,
    /// Keys were given, every message passed every check, and nothing was
    /// rejected or damaged.
    pub verified: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What `retain --json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainJson {
    /// Attestations removed, each with its summary (absent when none, so
    /// the output of a store without attestations has no such key).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attestations_removed: u64,
    pub bags_removed: u64,
    /// What was kept, and why.
    pub kept: Vec<String>,
    pub summaries_checked: u64,
    pub summaries_removed: u64,
}

/// One summary `summarize --json` made (or found already published).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryMadeJson {
    /// With `--attest-key`: its attestation (absent without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<AttestationJson>,
    pub bags: u64,
    pub bytes: u64,
    /// False when it was already published.
    pub created: bool,
    /// The stretch it covers: from this (Unix µs)...
    pub from: u64,
    pub messages: u64,
    pub name: String,
    /// ...to this.
    pub to: u64,
}

/// A summary's attestation as `summarize --json --attest-key` made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestationJson {
    /// False when it was already published (or refused).
    pub created: bool,
    pub key_id: String,
    /// Its object's name (`null` when refused).
    pub name: Option<String>,
    /// Why the summary was not attested: a signature in it does not verify
    /// (`null` when attested).
    pub refused: Option<String>,
}

/// What a line of `write --json` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteItemKind {
    /// A message stored ([`WrittenJson`]).
    Written,
    /// A batch refused whole under `--keep-going` ([`WriteFailedJson`]).
    Failed,
}

/// A message `write --json` stored, one line each, in the order given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenJson {
    pub kind: WriteItemKind,
    /// `timestamp_us` as a date and time.
    pub time: String,
    /// The timestamp it was stored under (Unix µs).
    pub timestamp_us: u64,
}

/// A batch `write --json --keep-going` could not store (nothing of it
/// was).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFailedJson {
    pub error: String,
    pub kind: WriteItemKind,
    /// How many messages the batch held.
    pub messages: u64,
    /// Whether writing them again may succeed.
    pub retryable: bool,
}

/// What `metronome --once --json` prints: one round of closing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetronomeRoundJson {
    /// Bags this round closed (seconds sealed empty included).
    pub closed: u64,
    /// The longest a bag waited past its close time (ms; `null` when none
    /// was closed).
    pub max_lag_ms: Option<u64>,
    /// Logs nobody has written yet (nothing of them is closed).
    pub missing_logs: Vec<String>,
    /// Seconds closed empty by their minute's seal (also in `closed`).
    pub sealed: u64,
    /// Summaries published (or found published), by name.
    pub summaries: Vec<String>,
    /// The last bag closed (`null` when none was).
    pub through: Option<String>,
}

/// What `verify-witness --json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifiedJson {
    /// Parts of a lease over several servers that no verified witness
    /// states.
    pub uncovered: Vec<UncoveredPartJson>,
    /// Every witness verified and every part of the lease is covered.
    pub verified: bool,
    /// Each witness in the input, in order.
    pub witnesses: Vec<WitnessCheckJson>,
}

/// One witness as `verify-witness --json` judged it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessCheckJson {
    /// The deadline it states (Unix µs; `null` when it did not verify).
    pub deadline_us: Option<u64>,
    /// Why it does not verify (`null` when it does).
    pub error: Option<String>,
    pub key_id: String,
    /// The lease it states (`null` when it did not verify).
    pub lease_id: Option<String>,
    pub names: Vec<String>,
    /// The server that signed it (`null` when it did not verify).
    pub server_id: Option<String>,
    pub verified: bool,
}

/// A part of a lease over several servers with no verified witness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncoveredPartJson {
    pub lease_id: String,
    pub name: String,
    pub server: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    // The exact lines `read --json` printed before they were typed.
    #[test]
    fn read_lines_print_as_before() {
        let message = ReadMessageJson {
            bag: "b".into(),
            from_open_bag: false,
            kind: ReadItemKind::Message,
            lease_ids: vec!["ab".into()],
            notes: Vec::new(),
            payload: "hi".into(),
            reason: None,
            sequence: 1,
            time: "t".into(),
            timestamp_us: 2,
            verified: true,
            vouched_by: None,
            writer_id: "w".into(),
        };
        assert_eq!(
            serde_json::to_string(&message).unwrap(),
            r#"{"bag":"b","from_open_bag":false,"kind":"message","lease_ids":["ab"],"notes":[],"payload":"hi","sequence":1,"time":"t","timestamp_us":2,"verified":true,"writer_id":"w"}"#
        );
        let rejected = ReadMessageJson {
            kind: ReadItemKind::Rejected,
            verified: false,
            reason: Some("why".into()),
            ..message
        };
        assert_eq!(
            serde_json::to_string(&rejected).unwrap(),
            r#"{"bag":"b","from_open_bag":false,"kind":"rejected","lease_ids":["ab"],"notes":[],"payload":"hi","reason":"why","sequence":1,"time":"t","timestamp_us":2,"verified":false,"writer_id":"w"}"#
        );
        let problem = ProblemJson {
            bag: "b".into(),
            in_open_bag: true,
            item: "i".into(),
            kind: ReadItemKind::Problem,
            offset: None,
            what: "torn".into(),
        };
        assert_eq!(
            serde_json::to_string(&problem).unwrap(),
            r#"{"bag":"b","in_open_bag":true,"item":"i","kind":"problem","offset":null,"what":"torn"}"#
        );
        let summary = ReadSummaryJson {
            close_refused: None,
            closed_bags_read: 1,
            kind: ReadItemKind::Summary,
            messages: 2,
            open_bags_skipped: 3,
            problems: 4,
            rejected: 5,
            summaries_attested: None,
            verified: false,
        };
        assert_eq!(
            serde_json::to_string(&summary).unwrap(),
            r#"{"close_refused":null,"closed_bags_read":1,"kind":"summary","messages":2,"open_bags_skipped":3,"problems":4,"rejected":5,"verified":false}"#
        );
    }

    // `retain --json` and `summarize --json`, as they printed before they
    // were typed.
    #[test]
    fn retain_and_summarize_print_as_before() {
        let retain = RetainJson {
            attestations_removed: 0,
            bags_removed: 1,
            kept: vec!["why".into()],
            summaries_checked: 2,
            summaries_removed: 3,
        };
        assert_eq!(
            serde_json::to_string(&retain).unwrap(),
            r#"{"bags_removed":1,"kept":["why"],"summaries_checked":2,"summaries_removed":3}"#
        );
        let made = SummaryMadeJson {
            bags: 1,
            bytes: 2,
            created: true,
            from: 3,
            messages: 4,
            name: "s".into(),
            to: 5,
            attestation: None,
        };
        assert_eq!(
            serde_json::to_string(&made).unwrap(),
            r#"{"bags":1,"bytes":2,"created":true,"from":3,"messages":4,"name":"s","to":5}"#
        );
    }

    // What attestations add, only where they are used.
    #[test]
    fn attestations_add_keys_only_where_used() {
        let retain = RetainJson {
            attestations_removed: 2,
            bags_removed: 1,
            kept: Vec::new(),
            summaries_checked: 2,
            summaries_removed: 1,
        };
        assert_eq!(
            serde_json::to_string(&retain).unwrap(),
            r#"{"attestations_removed":2,"bags_removed":1,"kept":[],"summaries_checked":2,"summaries_removed":1}"#
        );
        let made = SummaryMadeJson {
            bags: 1,
            bytes: 2,
            created: false,
            from: 3,
            messages: 4,
            name: "s".into(),
            to: 5,
            attestation: Some(AttestationJson {
                created: true,
                key_id: "k".into(),
                name: Some("s.k.attestation".into()),
                refused: None,
            }),
        };
        assert_eq!(
            serde_json::to_string(&made).unwrap(),
            r#"{"attestation":{"created":true,"key_id":"k","name":"s.k.attestation","refused":null},"bags":1,"bytes":2,"created":false,"from":3,"messages":4,"name":"s","to":5}"#
        );
    }
}
