//! The conversions between the domain types and the protobuf types of the
//! wire: kept apart from the types themselves, so that the types read as
//! the API they are and no generated type leaks into it.

use std::time::Duration;

use bagel_proto::{Micros, pb};

use super::*;

/// A wire time (µs since the Unix epoch).
pub(super) fn micros(us: u64) -> Micros {
    Micros::from_micros(us)
}

fn nonzero(us: u64) -> Option<Micros> {
    (us != 0).then(|| micros(us))
}

impl From<pb::Mode> for Mode {
    fn from(m: pb::Mode) -> Self {
        match m.normalized() {
            pb::Mode::Tentative => Mode::Tentative,
            _ => Mode::Full,
        }
    }
}

impl From<Mode> for pb::Mode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Full => pb::Mode::Full,
            Mode::Tentative => pb::Mode::Tentative,
        }
    }
}

impl From<pb::Ended> for Ended {
    fn from(e: pb::Ended) -> Self {
        match e {
            pb::Ended::Unspecified | pb::Ended::None => Ended::None,
            pb::Ended::Released => Ended::Released,
            pb::Ended::Broken => Ended::Broken,
            pb::Ended::Unknown => Ended::Unknown,
        }
    }
}

impl From<&pb::PreviousLease> for Previous {
    fn from(p: &pb::PreviousLease) -> Self {
        Previous {
            lease_id: (!p.lease_id.is_empty()).then(|| p.lease_id.clone()),
            watermark: micros(p.watermark_us),
            ended: p.ended().into(),
            ended_at: micros(p.ended_at_us),
            unsettled_until: nonzero(p.unsettled_until_us),
            granted_at: nonzero(p.granted_at_us),
        }
    }
}

/// The wire form, as a witness states it: what a backend that signs its
/// own witnesses (the S3 store, the test's in-memory one) puts in them.
impl From<Ended> for pb::Ended {
    fn from(e: Ended) -> Self {
        match e {
            Ended::None => pb::Ended::None,
            Ended::Released => pb::Ended::Released,
            Ended::Broken => pb::Ended::Broken,
            Ended::Unknown => pb::Ended::Unknown,
        }
    }
}

/// The wire form, as a witness states it (without a signed time for the
/// watermark: a backend that keeps one adds it).
impl From<&Previous> for pb::PreviousLease {
    fn from(p: &Previous) -> Self {
        pb::PreviousLease {
            lease_id: p.lease_id.clone().unwrap_or_default(),
            watermark_us: p.watermark.as_micros(),
            watermark_signed_time: None,
            ended: pb::Ended::from(p.ended).into(),
            ended_at_us: p.ended_at.as_micros(),
            unsettled_until_us: p.unsettled_until.map_or(0, Micros::as_micros),
            granted_at_us: p.granted_at.map_or(0, Micros::as_micros),
        }
    }
}

impl From<&pb::NameGrant> for NameGrant {
    fn from(n: &pb::NameGrant) -> Self {
        NameGrant {
            name: n.name.clone(),
            fencing_token: n.fencing_token,
            previous: Previous::from(&n.previous.clone().unwrap_or_default()),
        }
    }
}

/// A name as a witness body states it (the lean answer's grants carry
/// nothing else).
impl From<&pb::WitnessName> for NameGrant {
    fn from(n: &pb::WitnessName) -> Self {
        NameGrant {
            name: n.name.clone(),
            fencing_token: n.fencing_token,
            previous: n
                .previous
                .as_ref()
                .map(Previous::from)
                .unwrap_or_else(|| Previous::from(&pb::PreviousLease::default())),
        }
    }
}

impl From<pb::LeaseConflict> for Conflict {
    fn from(c: pb::LeaseConflict) -> Self {
        Conflict {
            holder_mode: c.holder_mode().into(),
            name: c.name,
            holder_lease_id: c.holder_lease_id,
            holder_owner: c.holder_owner,
            holder_deadline: micros(c.holder_deadline_us),
            server: None,
        }
    }
}

impl From<&pb::Metadata> for Metadata {
    fn from(m: &pb::Metadata) -> Self {
        if m.wildcard {
            Metadata::Wildcard
        } else {
            Metadata::Data(m.data.clone())
        }
    }
}

impl From<&Metadata> for pb::Metadata {
    fn from(m: &Metadata) -> Self {
        match m {
            Metadata::Data(d) => pb::Metadata {
                data: d.clone(),
                wildcard: false,
            },
            Metadata::Wildcard => pb::Metadata {
                data: Vec::new(),
                wildcard: true,
            },
        }
    }
}

impl From<pb::NameState> for NameState {
    fn from(s: pb::NameState) -> Self {
        NameState {
            holder: s.holder.map(|h| Holder {
                mode: h.mode().into(),
                lease_id: h.lease_id,
                owner: h.owner,
                deadline: micros(h.deadline_us),
                fencing_token: h.fencing_token,
                granted_at: micros(h.granted_at_us),
            }),
            previous: Previous::from(&s.previous.unwrap_or_default()),
            name: s.name,
            fencing_token: s.fencing_token,
            known: s.known,
        }
    }
}

impl From<pb::HistoryResponse> for History {
    fn from(h: pb::HistoryResponse) -> Self {
        History {
            entries: h
                .entries
                .into_iter()
                .map(|e| HistoryEntry {
                    event: match e.event() {
                        pb::HistoryEvent::Renewed => HistoryEvent::Renewed,
                        _ => HistoryEvent::Released,
                    },
                    metadata: e.metadata.as_ref().map(Metadata::from),
                    lease_id: e.lease_id,
                    owner: e.owner,
                    at: micros(e.at_us),
                    watermark: micros(e.watermark_us),
                })
                .collect(),
            truncated: h.truncated,
        }
    }
}

impl ServerInfo {
    /// From the wire; a key that is not 32 bytes is refused.
    pub fn from_pb(info: pb::ServerInfoResponse) -> Result<Self, String> {
        let clock = info.clock.clone().unwrap_or_default();
        let keys = info
            .keys
            .iter()
            .map(|k| {
                <[u8; 32]>::try_from(k.ed25519.as_slice())
                    .map(|raw| (k.key_id.clone(), raw))
                    .map_err(|_| format!("key {} is {} bytes, not 32", k.key_id, k.ed25519.len()))
            })
            .collect::<Result<_, _>>()?;
        Ok(ServerInfo {
            keys,
            clock: ClockStatus {
                source: match clock.source() {
                    pb::TimeSource::Roughtime => ClockSource::Roughtime,
                    _ => ClockSource::Local,
                },
                error_bound: Duration::from_micros(clock.error_bound_us),
                healthy: clock.healthy,
                detail: clock.detail,
            },
            server_id: info.server_id,
            version: info.version,
            epoch: micros(info.epoch_us),
            min_ttl: Duration::from_micros(info.min_ttl_us),
            max_ttl: Duration::from_micros(info.max_ttl_us),
            max_wait: Duration::from_micros(info.max_wait_us),
            ready_at: micros(info.ready_at_us),
            ready: info.ready,
            now: micros(info.now_us),
            forgotten_floor: micros(info.forgotten_floor_us),
            unsafe_skip_restart_wait: info.unsafe_skip_restart_wait,
            max_names_per_request: info.max_names_per_request,
            max_name_bytes: info.max_name_bytes,
            max_owner_bytes: info.max_owner_bytes,
            max_metadata_bytes: info.max_metadata_bytes,
            timestamp_tolerance: Duration::from_micros(info.timestamp_tolerance_us),
            access: info.access.map(|a| {
                Box::new(AccessInfo {
                    policy_version: a.policy_version,
                    policy_sha256: a.policy_sha256,
                    identity: a.identity,
                    identity_problem: a.identity_problem,
                    grants: a.grants.into_iter().map(|g| (g.prefix, g.permissions)).collect(),
                })
            }),
            members: info.members.into_iter().map(|l| l.ids).collect(),
        })
    }
}
