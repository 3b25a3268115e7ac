//! The lease object: what S3 keeps about one name, as JSON.
//!
//! One object per name (`<prefix>/leases/<name>`) holds everything a bagel
//! server keeps in RAM for it: the holder (lease id, a hash of its token,
//! owner, mode, deadline, when it was granted, every name of its lease),
//! the record of the lease before it (id, watermark, how and when it ended,
//! whether its bags are unsettled), the last fencing token, and a short
//! history of renewals and releases with their metadata. Every change is a
//! conditional PUT of the whole object (`If-None-Match: *` to create it,
//! `If-Match: <etag>` to change it), so two writers can never both change
//! the version they read.
//!
//! The token itself is never stored: anyone who can read the bucket could
//! then renew or release another's lease by mistake. Its SHA-256 is enough
//! to check that a renewal comes from the holder (the store's ACLs, not the
//! token, are what keep a malicious writer out; see the crate docs).
//!
//! A `version` field comes first so a future format is refused, never
//! misread.

use bagel_lease_core::{Ended, HistoryEntry, HistoryEvent, Metadata, Micros, Mode, Previous};
use bagel_proto::pb;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The format this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One name's state in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseObject {
    /// [`FORMAT_VERSION`]; any other is refused by [`LeaseObject::decode`].
    pub version: u32,
    /// The lease name, as the key it is stored under encodes it; a read
    /// whose `name` differs from its key is refused as implausible.
    pub name: String,
    /// The last fencing token issued for this name.
    pub fencing_token: u64,
    /// When the last grant of this name was made (Unix µs). Each grant
    /// takes a later time than this, whatever the grantor's clock says, so
    /// grant times (and witnesses' `issued_at`) increase along the chain.
    pub last_granted_at_us: u64,
    /// The current holder, possibly with a passed deadline (an expired
    /// lease becomes `previous` only when the next grant breaks it); `None`
    /// once released.
    pub holder: Option<HolderRecord>,
    /// The lease before `holder` (or the last one when nobody holds it).
    pub previous: PreviousRecord,
    /// Recent renewals (with metadata) and releases, oldest first, bounded.
    #[serde(default)]
    pub history: Vec<HistoryRecord>,
    /// Older history entries were dropped.
    #[serde(default)]
    pub history_truncated: bool,
}

/// The lease that holds (or last held, if its deadline has passed) a
/// name. Its times are by the holder's clock, checked against signed time
/// when it wrote them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    /// The lease's id (hex), the same in every name's object it holds.
    pub lease_id: String,
    /// SHA-256 of the holder's token, hex.
    pub token_sha256: String,
    /// Who the holder said it is (for `describe` and refusals; not
    /// checked against anything).
    pub owner: String,
    /// Full, or tentative until upgraded.
    pub mode: ModeRecord,
    /// The holder's rights end at this instant (exclusive), by its clock.
    pub deadline_us: u64,
    /// When this lease was granted (Unix µs), later than every earlier
    /// grant of the name; it becomes `previous.granted_at_us` when the
    /// lease ends.
    pub granted_at_us: u64,
    /// Every name of the lease, sorted: a tool holding only one name's
    /// object can tell what else the lease holds.
    pub names: Vec<String>,
    /// The client key that signs this lease's witnesses.
    pub key_id: String,
    /// How far the holder's clock may be from true time (µs), measured
    /// when it last acquired, renewed or upgraded: others take over only
    /// after the deadline plus this plus their own bound. Absent in
    /// objects from older clients (then the clock margin alone counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_bound_us: Option<u64>,
    /// The holder's own public key for this lease (ed25519, hex), stated
    /// in every witness of it; empty for a lease acquired without one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub holder_key: String,
}

/// [`Mode`] as stored: `"full"` or `"tentative"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeRecord {
    /// Writes allowed: [`Mode::Full`].
    Full,
    /// Held but not writable until upgraded: [`Mode::Tentative`].
    Tentative,
}

/// [`Ended`] as stored: how the lease before the holder ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndedRecord {
    /// Nobody held the name before: nothing to inherit.
    None,
    /// Released, publishing its watermark.
    Released,
    /// Its deadline passed and the next grant broke it; the watermark is
    /// its deadline.
    Broken,
    /// Not written by this crate (an S3 backend has no restart to forget
    /// across); read for the same meaning as the server's.
    Unknown,
}

/// What the next holder of a name inherits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousRecord {
    /// The lease before the holder; `None` when there was none.
    pub lease_id: Option<String>,
    /// Every message of earlier holders is at or below this.
    pub watermark_us: u64,
    /// How that lease ended.
    pub ended: EndedRecord,
    /// When it was released or found broken (Unix µs); 0 with
    /// [`EndedRecord::None`].
    pub ended_at_us: u64,
    /// Some earlier holder (broken, or released with writes of unknown
    /// outcome) may still land writes in bags at or below the watermark;
    /// carried down the chain until a holder says it closed them. A flag,
    /// as in the server: the bound is always the watermark.
    pub unsettled: bool,
    /// When that lease was granted (Unix µs); 0 when there was none.
    pub granted_at_us: u64,
    /// The encoded `SignedTime` the releaser gave with its watermark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_signed_time_b64: Option<String>,
}

/// One entry of a name's short history: a renewal that stated metadata,
/// or a release. What `bagel history` shows for an S3 lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// The lease renewed or released.
    pub lease_id: String,
    /// The owner it was acquired as.
    pub owner: String,
    /// Renewed or released.
    pub event: EventRecord,
    /// When (Unix µs, by the writing client's clock).
    pub at_us: u64,
    /// For a release, the watermark it published; for a renewal, the one
    /// the lease inherited (Unix µs).
    pub watermark_us: u64,
    /// What the holder said about where its updates are, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataRecord>,
}

/// What a [`HistoryRecord`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventRecord {
    /// A renewal that stated metadata (a plain renewal is not recorded).
    Renewed,
    /// A release.
    Released,
}

/// [`Metadata`] as stored in JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetadataRecord {
    /// The holder's bytes, base64 (standard alphabet, padded).
    DataB64(String),
    /// "Could be anywhere".
    Wildcard,
}

impl LeaseObject {
    /// Parses an object's bytes; the error says what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let obj: LeaseObject =
            serde_json::from_slice(bytes).map_err(|e| format!("not a lease object: {e}"))?;
        if obj.version != FORMAT_VERSION {
            return Err(format!(
                "lease object format {} is not the format {FORMAT_VERSION} this client knows",
                obj.version
            ));
        }
        Ok(obj)
    }

    /// The bytes to PUT: compact JSON, fields in declaration order.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lease object serializes")
    }
}

/// The SHA-256 of a token, as stored.
pub fn token_hash(token: &str) -> String {
    bagel_proto::hex::encode(&Sha256::digest(token.as_bytes()))
}

impl From<Mode> for ModeRecord {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Full => ModeRecord::Full,
            Mode::Tentative => ModeRecord::Tentative,
        }
    }
}

impl From<ModeRecord> for Mode {
    fn from(m: ModeRecord) -> Self {
        match m {
            ModeRecord::Full => Mode::Full,
            ModeRecord::Tentative => Mode::Tentative,
        }
    }
}

impl From<EndedRecord> for Ended {
    fn from(e: EndedRecord) -> Self {
        match e {
            EndedRecord::None => Ended::None,
            EndedRecord::Released => Ended::Released,
            EndedRecord::Broken => Ended::Broken,
            EndedRecord::Unknown => Ended::Unknown,
        }
    }
}

impl PreviousRecord {
    /// What a name nobody ever held inherits.
    pub fn none() -> Self {
        PreviousRecord {
            lease_id: None,
            watermark_us: 0,
            ended: EndedRecord::None,
            ended_at_us: 0,
            unsettled: false,
            granted_at_us: 0,
            watermark_signed_time_b64: None,
        }
    }

    /// The exclusive bound of the unsettled bags, as the server states it.
    pub fn unsettled_until_us(&self) -> u64 {
        if self.unsettled {
            self.watermark_us.saturating_add(1)
        } else {
            0
        }
    }

    /// What [`bagel_lease_core`] hands the next holder as
    /// `NameGrant::previous`.
    pub fn to_domain(&self) -> Previous {
        Previous {
            lease_id: self.lease_id.clone(),
            watermark: Micros::from_micros(self.watermark_us),
            ended: self.ended.into(),
            ended_at: Micros::from_micros(self.ended_at_us),
            unsettled_until: self
                .unsettled
                .then(|| Micros::from_micros(self.unsettled_until_us())),
            granted_at: (self.granted_at_us != 0).then(|| Micros::from_micros(self.granted_at_us)),
        }
    }

    /// The wire form a witness states. A stored signed time that does not
    /// decode is left out rather than failing the grant: it only adds
    /// evidence for the watermark, which stands on its own.
    pub fn to_pb(&self) -> pb::PreviousLease {
        pb::PreviousLease {
            lease_id: self.lease_id.clone().unwrap_or_default(),
            watermark_us: self.watermark_us,
            watermark_signed_time: self
                .watermark_signed_time_b64
                .as_deref()
                .and_then(|b| B64.decode(b).ok())
                .and_then(|bytes| pb::SignedTime::decode(bytes.as_slice()).ok()),
            ended: pb::Ended::from(Ended::from(self.ended)).into(),
            ended_at_us: self.ended_at_us,
            unsettled_until_us: self.unsettled_until_us(),
            granted_at_us: self.granted_at_us,
        }
    }
}

/// A signed time as stored beside a watermark.
pub fn signed_time_b64(st: &pb::SignedTime) -> String {
    B64.encode(st.encode_to_vec())
}

impl From<&Metadata> for MetadataRecord {
    fn from(m: &Metadata) -> Self {
        match m {
            Metadata::Data(d) => MetadataRecord::DataB64(B64.encode(d)),
            Metadata::Wildcard => MetadataRecord::Wildcard,
        }
    }
}

impl HistoryRecord {
    /// The entry as `history` returns it, the same type a lease server's
    /// history has.
    pub fn to_domain(&self) -> HistoryEntry {
        HistoryEntry {
            lease_id: self.lease_id.clone(),
            owner: self.owner.clone(),
            event: match self.event {
                EventRecord::Renewed => HistoryEvent::Renewed,
                EventRecord::Released => HistoryEvent::Released,
            },
            at: Micros::from_micros(self.at_us),
            watermark: Micros::from_micros(self.watermark_us),
            metadata: self.metadata.as_ref().map(|m| match m {
                // Written by this crate from bytes; a hand-edited object
                // with bad base64 shows as empty data rather than failing.
                MetadataRecord::DataB64(b) => Metadata::Data(B64.decode(b).unwrap_or_default()),
                MetadataRecord::Wildcard => Metadata::Wildcard,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_round_trips_and_a_future_format_is_refused() {
        let obj = LeaseObject {
            version: FORMAT_VERSION,
            name: "a/b %c".into(),
            fencing_token: 7,
            last_granted_at_us: 5,
            holder: Some(HolderRecord {
                lease_id: "00".into(),
                token_sha256: token_hash("t"),
                owner: "o".into(),
                mode: ModeRecord::Tentative,
                deadline_us: 9,
                granted_at_us: 5,
                names: vec!["a/b %c".into()],
                key_id: "k".into(),
                clock_bound_us: Some(5_000_000),
                holder_key: String::new(),
            }),
            previous: PreviousRecord::none(),
            history: vec![HistoryRecord {
                lease_id: "00".into(),
                owner: "o".into(),
                event: EventRecord::Renewed,
                at_us: 6,
                watermark_us: 0,
                metadata: Some((&Metadata::Data(b"s3://x".to_vec())).into()),
            }],
            history_truncated: false,
        };
        let bytes = obj.encode();
        assert_eq!(LeaseObject::decode(&bytes).unwrap(), obj);
        assert_eq!(
            obj.history[0].to_domain().metadata,
            Some(Metadata::Data(b"s3://x".to_vec()))
        );
        let mut future = obj;
        future.version = FORMAT_VERSION + 1;
        let err = LeaseObject::decode(&future.encode()).unwrap_err();
        assert!(err.contains("format 2"), "{err}");
        assert!(
            LeaseObject::decode(b"{}")
                .unwrap_err()
                .contains("not a lease object")
        );
    }

    #[test]
    fn tokens_are_stored_only_as_hashes() {
        assert_eq!(token_hash("secret").len(), 64);
        assert_ne!(token_hash("secret"), token_hash("secreT"));
    }
}
