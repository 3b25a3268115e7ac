//! A lease as JSON: the lease file `bagel acquire --json` prints and
//! `--lease FILE` reads back (`bagel write --lease FILE`, `bagel
//! verify-witness`), and what `release --json` answers. Keys in field
//! order; an absent value is left out.

use std::fmt;

use bagel_client::{Ended, Grant, Lease, Mode, NameGrant, Previous, Renewal, ServerPart, Witness};
use bagel_proto::rights::{RightsSnapshot, WriteRights};
use bagel_proto::{Micros, pb};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

/// A witness as JSON: the signed body bytes and signature in base64.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessJson {
    pub body_b64: String,
    pub signature_b64: String,
    pub key_id: String,
    /// Present when the server signed a batch of witnesses at once: the
    /// signature covers the batch's Merkle root (see `witness.proto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merkle: Option<MerkleJson>,
}

/// A batched witness's place in its batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MerkleJson {
    pub leaf_index: u32,
    pub path_b64: Vec<String>,
}

impl From<&Witness> for WitnessJson {
    fn from(w: &Witness) -> Self {
        WitnessJson {
            body_b64: B64.encode(w.body()),
            signature_b64: B64.encode(w.signature()),
            key_id: w.key_id().to_owned(),
            merkle: w.merkle().map(|(leaf_index, path)| MerkleJson {
                leaf_index,
                path_b64: path.iter().map(|h| B64.encode(h)).collect(),
            }),
        }
    }
}

impl WitnessJson {
    /// Decodes the base64 fields; the error names the field.
    pub fn to_witness(&self) -> Result<Witness, String> {
        let merkle = match &self.merkle {
            None => None,
            Some(m) => Some((
                m.leaf_index,
                m.path_b64
                    .iter()
                    .map(|h| B64.decode(h))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("witness.merkle.path_b64 is not base64: {e}"))?,
            )),
        };
        Ok(Witness::from_parts(
            B64.decode(&self.body_b64)
                .map_err(|e| format!("witness.body_b64 is not base64: {e}"))?,
            B64.decode(&self.signature_b64)
                .map_err(|e| format!("witness.signature_b64 is not base64: {e}"))?,
            self.key_id.clone(),
            merkle,
        ))
    }

    /// The wire form, for verifying and for storing with messages.
    pub fn to_pb(&self) -> Result<pb::Witness, String> {
        Ok(self.to_witness()?.to_pb())
    }
}

/// What a grant inherits on one name (the lease before it, its end and
/// watermark).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousJson {
    /// The previous lease's id (empty when not known).
    pub lease_id: String,
    pub watermark_us: u64,
    pub ended: EndedJson,
    /// When it was released or found broken (zero when unknown or none).
    pub ended_at_us: u64,
    /// Close every bag that can hold a timestamp below this before reading
    /// what earlier holders wrote (absent: nothing unsettled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsettled_until_us: Option<u64>,
}

/// How the lease before the current one on a name ended: `none`,
/// `released`, `broken` or `unknown` (the words of [`Ended::as_str`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndedJson {
    None,
    Released,
    Broken,
    Unknown,
}

impl EndedJson {
    /// The JSON word.
    pub fn as_str(self) -> &'static str {
        Ended::from(self).as_str()
    }
}

impl From<Ended> for EndedJson {
    fn from(e: Ended) -> Self {
        match e {
            Ended::None => EndedJson::None,
            Ended::Released => EndedJson::Released,
            Ended::Broken => EndedJson::Broken,
            Ended::Unknown => EndedJson::Unknown,
        }
    }
}

impl From<EndedJson> for Ended {
    fn from(e: EndedJson) -> Self {
        match e {
            EndedJson::None => Ended::None,
            EndedJson::Released => Ended::Released,
            EndedJson::Broken => Ended::Broken,
            EndedJson::Unknown => Ended::Unknown,
        }
    }
}

impl fmt::Display for EndedJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One name of a grant: its fencing token and what it inherits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameJson {
    pub name: String,
    pub fencing_token: u64,
    pub previous: PreviousJson,
}

/// A lease's mode, as the JSON word for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeJson {
    Full,
    Tentative,
}

impl ModeJson {
    /// The JSON word: `full` or `tentative`.
    pub fn as_str(self) -> &'static str {
        Mode::from(self).as_str()
    }
}

impl From<ModeJson> for Mode {
    fn from(m: ModeJson) -> Self {
        match m {
            ModeJson::Full => Mode::Full,
            ModeJson::Tentative => Mode::Tentative,
        }
    }
}

impl From<Mode> for ModeJson {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Full => ModeJson::Full,
            Mode::Tentative => ModeJson::Tentative,
        }
    }
}

/// A granted lease as printed by `bagel acquire --json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseJson {
    pub lease_id: String,
    pub token: String,
    pub deadline_us: u64,
    pub min_timestamp_us: u64,
    /// `full` or `tentative`.
    pub mode: ModeJson,
    pub names: Vec<NameJson>,
    /// The first witness (the only one from a single server).
    pub witness: WitnessJson,
    /// Every witness, when there is more than one (a lease over several
    /// servers); `witness` is the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub witnesses: Vec<WitnessJson>,
    /// The server that granted it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// For a lease over several servers: which server granted each name,
    /// under which of its lease ids (a name appears twice while migrating).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerNameJson>,
    /// The lease's holder key (ed25519 secret, 64 hex digits), whose public
    /// half every witness of the lease states: `bagel write` signs each
    /// batch with it, so a copy of the witness cannot vouch for other
    /// bytes. A secret like `token`. Absent from a grant printed without
    /// it (`bagel lease upgrade`) and in files of older versions: such a
    /// file cannot write under a lease whose witness names a holder key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_secret: Option<String>,
}

/// One name's grant by one server of a lease over several.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNameJson {
    pub name: String,
    /// The server's URL.
    pub server: String,
    /// The server's key id (names are routed by it).
    pub key_id: String,
    /// The lease id on that server.
    pub lease_id: String,
}

fn servers_json(parts: &[ServerPart]) -> Vec<ServerNameJson> {
    parts
        .iter()
        .flat_map(|p| {
            p.names.iter().map(|name| ServerNameJson {
                name: name.clone(),
                server: p.server.clone(),
                key_id: p.key_id.clone(),
                lease_id: p.lease_id.clone(),
            })
        })
        .collect()
}

fn name_json(n: &NameGrant) -> NameJson {
    NameJson {
        name: n.name.clone(),
        fencing_token: n.fencing_token,
        previous: previous_json(&n.previous),
    }
}

fn previous_json(p: &Previous) -> PreviousJson {
    PreviousJson {
        lease_id: p.lease_id.clone().unwrap_or_default(),
        watermark_us: p.watermark.as_micros(),
        ended: p.ended.into(),
        ended_at_us: p.ended_at.as_micros(),
        unsettled_until_us: p.unsettled_until.map(Micros::as_micros),
    }
}

impl LeaseJson {
    /// A grant (acquire or upgrade) as JSON.
    pub fn from_grant(g: &Grant, server: Option<&str>) -> Self {
        LeaseJson {
            lease_id: g.lease_id.clone(),
            token: g.token.clone(),
            deadline_us: g.deadline.as_micros(),
            min_timestamp_us: g.min_timestamp.as_micros(),
            mode: g.mode.into(),
            names: g.names.iter().map(name_json).collect(),
            witness: WitnessJson::from(g.witness()),
            witnesses: all_if_many(&g.witnesses),
            server: server.map(str::to_owned),
            servers: servers_json(&g.servers),
            holder_secret: None,
        }
    }

    /// A held lease as JSON, with its latest deadline and witness.
    pub fn from_lease(l: &Lease, server: Option<&str>) -> Self {
        let s = l.state();
        LeaseJson {
            lease_id: l.id().to_owned(),
            token: l.token().to_owned(),
            deadline_us: s.deadline.as_micros(),
            min_timestamp_us: l.min_timestamp().as_micros(),
            mode: s.mode.into(),
            names: l.names().iter().map(name_json).collect(),
            witness: WitnessJson::from(&s.witnesses[0]),
            witnesses: all_if_many(&s.witnesses),
            server: server.map(str::to_owned),
            servers: servers_json(l.servers()),
            holder_secret: Some(bagel_proto::hex::encode(&l.holder_key().signing_key().to_bytes())),
        }
    }
}

impl LeaseJson {
    /// This lease file after `renewal`: its deadline, mode and witnesses;
    /// the rest (names, token, holder key) as it was.
    pub fn renewed(&mut self, renewal: &Renewal) {
        self.deadline_us = renewal.deadline.as_micros();
        self.mode = renewal.mode.into();
        self.witness = WitnessJson::from(renewal.witness());
        self.witnesses = all_if_many(&renewal.witnesses);
    }

    /// A lease file rebuilt from a (checked) witness of the lease and its
    /// token, for a lease named by id and token alone: everything but the
    /// holder key, which only the holder had, is stated in the witness.
    /// A lease over several servers needs its lease file (each server's
    /// part is in none of the witnesses alone).
    pub fn from_witness(token: &str, witnesses: &[Witness], server: Option<&str>) -> Result<Self, String> {
        if witnesses.len() != 1 {
            return Err(format!(
                "a lease over {} servers is rebuilt only from its lease file (give --lease FILE)",
                witnesses.len()
            ));
        }
        let w = &witnesses[0];
        let body = bagel_proto::witness::decode_unverified(&WitnessJson::from(w).to_pb()?)?;
        Ok(LeaseJson {
            lease_id: body.lease_id.clone(),
            token: token.to_owned(),
            deadline_us: body.deadline_us,
            min_timestamp_us: body.min_timestamp_us,
            mode: Mode::from(body.mode()).into(),
            names: body
                .names
                .iter()
                .map(|n| NameJson {
                    name: n.name.clone(),
                    fencing_token: n.fencing_token,
                    previous: previous_json(&Previous::from(&n.previous.clone().unwrap_or_default())),
                })
                .collect(),
            witness: WitnessJson::from(w),
            witnesses: Vec::new(),
            server: server.map(str::to_owned),
            servers: Vec::new(),
            holder_secret: None,
        })
    }
}

/// What `release --json` prints: the watermark the backend stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasedJson {
    pub watermark_us: u64,
}

fn all_if_many(witnesses: &[Witness]) -> Vec<WitnessJson> {
    if witnesses.len() > 1 {
        witnesses.iter().map(WitnessJson::from).collect()
    } else {
        Vec::new()
    }
}

/// A lease file's rights: `bagel write` writes under them.
impl WriteRights for LeaseJson {
    fn snapshot(&self) -> Result<RightsSnapshot, String> {
        if self.mode != ModeJson::Full {
            return Err(format!(
                "lease {} is tentative: it gives no right to write (upgrade it first)",
                self.lease_id
            ));
        }
        Ok(RightsSnapshot {
            min_timestamp: Micros::from_micros(self.min_timestamp_us),
            deadline: Micros::from_micros(self.deadline_us),
            witnesses: if self.witnesses.is_empty() {
                vec![self.witness.to_pb()?]
            } else {
                self.witnesses
                    .iter()
                    .map(WitnessJson::to_pb)
                    .collect::<Result<_, _>>()?
            },
            holder_keys: match &self.holder_secret {
                None => Vec::new(),
                Some(hex) => {
                    let secret: [u8; 32] = bagel_proto::hex::decode_array(hex)
                        .map_err(|e| format!("holder_secret of lease {}: {e}", self.lease_id))?;
                    vec![bagel_proto::Signer::from_secret(&secret)]
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_is_the_clients_word_both_ways() {
        for ended in [Ended::None, Ended::Released, Ended::Broken, Ended::Unknown] {
            let json = serde_json::to_string(&EndedJson::from(ended)).unwrap();
            assert_eq!(json, format!("\"{}\"", ended.as_str()));
            assert_eq!(
                Ended::from(serde_json::from_str::<EndedJson>(&json).unwrap()),
                ended
            );
            assert_eq!(EndedJson::from(ended).to_string(), ended.as_str());
        }
        let previous: PreviousJson =
            serde_json::from_str(r#"{"lease_id":"ab","watermark_us":4,"ended":"broken","ended_at_us":5}"#)
                .unwrap();
        assert_eq!(previous.ended, EndedJson::Broken);
        assert_eq!(
            serde_json::to_string(&previous).unwrap(),
            r#"{"lease_id":"ab","watermark_us":4,"ended":"broken","ended_at_us":5}"#
        );
        assert!(
            serde_json::from_str::<PreviousJson>(
                r#"{"lease_id":"","watermark_us":0,"ended":"gone","ended_at_us":0}"#
            )
            .is_err()
        );
        assert_eq!(
            serde_json::to_string(&ReleasedJson { watermark_us: 7 }).unwrap(),
            r#"{"watermark_us":7}"#
        );
    }
}
