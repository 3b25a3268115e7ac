//! The JSON forms the CLI prints and reads back (`bagel acquire --json`,
//! `bagel write --lease FILE`, `bagel verify-witness`). The key names are a
//! contract with scripts: add keys freely, never rename one.

use bagel_proto::pb;
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

impl From<&pb::Witness> for WitnessJson {
    fn from(w: &pb::Witness) -> Self {
        WitnessJson {
            body_b64: B64.encode(&w.body),
            signature_b64: B64.encode(&w.signature),
            key_id: w.key_id.clone(),
            merkle: w.batched.then(|| MerkleJson {
                leaf_index: w.leaf_index,
                path_b64: w.merkle_path.iter().map(|h| B64.encode(h)).collect(),
            }),
        }
    }
}

impl WitnessJson {
    /// Decodes the base64 fields; the error names the field.
    pub fn to_pb(&self) -> Result<pb::Witness, String> {
        Ok(pb::Witness {
            body: B64
                .decode(&self.body_b64)
                .map_err(|e| format!("witness.body_b64 is not base64: {e}"))?,
            signature: B64
                .decode(&self.signature_b64)
                .map_err(|e| format!("witness.signature_b64 is not base64: {e}"))?,
            key_id: self.key_id.clone(),
            batched: self.merkle.is_some(),
            leaf_index: self.merkle.as_ref().map_or(0, |m| m.leaf_index),
            merkle_path: match &self.merkle {
                None => Vec::new(),
                Some(m) => m
                    .path_b64
                    .iter()
                    .map(|h| B64.decode(h))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("witness.merkle.path_b64 is not base64: {e}"))?,
            },
        })
    }
}

/// How the previous lease of a name ended, as the JSON word for it.
pub fn ended_word(e: pb::Ended) -> &'static str {
    match e {
        pb::Ended::Unspecified | pb::Ended::None => "none",
        pb::Ended::Released => "released",
        pb::Ended::Broken => "broken",
        pb::Ended::Unknown => "unknown",
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousJson {
    pub lease_id: String,
    pub watermark_us: u64,
    /// One of `none`, `released`, `broken`, `unknown`.
    pub ended: String,
    pub ended_at_us: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameJson {
    pub name: String,
    pub fencing_token: u64,
    pub previous: PreviousJson,
}

/// A granted lease as printed by `bagel acquire --json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseJson {
    pub lease_id: String,
    pub token: String,
    pub deadline_us: u64,
    pub min_timestamp_us: u64,
    /// `full` or `tentative`.
    pub mode: String,
    pub names: Vec<NameJson>,
    pub witness: WitnessJson,
    /// The server that granted it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl LeaseJson {
    pub fn from_grant(grant: &pb::LeaseGrant, server: Option<&str>) -> Self {
        let names = grant
            .names
            .iter()
            .map(|n| {
                let prev = n.previous.clone().unwrap_or_default();
                NameJson {
                    name: n.name.clone(),
                    fencing_token: n.fencing_token,
                    previous: PreviousJson {
                        lease_id: prev.lease_id.clone(),
                        watermark_us: prev.watermark_us,
                        ended: ended_word(prev.ended()).to_owned(),
                        ended_at_us: prev.ended_at_us,
                    },
                }
            })
            .collect();
        LeaseJson {
            lease_id: grant.lease_id.clone(),
            token: grant.token.clone(),
            deadline_us: grant.deadline_us,
            min_timestamp_us: grant.min_timestamp_us,
            mode: match grant.mode().normalized() {
                pb::Mode::Tentative => "tentative",
                _ => "full",
            }
            .to_owned(),
            names,
            witness: grant
                .witness
                .as_ref()
                .map(WitnessJson::from)
                .unwrap_or_else(|| WitnessJson::from(&pb::Witness::default())),
            server: server.map(str::to_owned),
        }
    }
}
