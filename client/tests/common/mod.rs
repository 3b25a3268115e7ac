//! Shared by the NFS and bindfs tests: the services `tests/run.sh` starts
//! (via `tests/support/nfs.sh`), and a signed test lease.

#![allow(dead_code)] // each test file uses part of it

use std::time::Duration;

use bagel_client::json::{LeaseJson, WitnessJson};
use bagel_proto::{KeyRing, Micros, Signer, pb};
use rand::Rng as _;

/// An environment variable a test needs; panics (never skips) when unset.
pub fn need_env(var: &str, what: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{var} is not set: this test needs {what}, which tests/run.sh starts \
             (for a local run: cargo build --workspace --bins; source tests/support/common.sh; \
             source tests/support/nfs.sh; nfs_start; bindfs_start)"
        ),
    }
}

pub fn nfs_url(version: u8) -> String {
    need_env(
        &format!("BAGEL_NFS_URL_V{version}"),
        "the NFS server (nfs-ganesha)",
    )
}

/// A random name part, so tests sharing a server never collide.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:012x}", rand::thread_rng().gen_range(0..1u64 << 48))
}

/// `url` with `/sub` appended to its path (before any query).
pub fn sub_url(url: &str, sub: &str) -> String {
    match url.split_once('?') {
        Some((base, q)) => format!("{}/{sub}?{q}", base.trim_end_matches('/')),
        None => format!("{}/{sub}", url.trim_end_matches('/')),
    }
}

/// Signs leases as the lease server does.
pub struct Leases {
    signer: Signer,
}

impl Leases {
    pub fn new() -> Self {
        Leases {
            signer: Signer::generate(),
        }
    }

    pub fn keys(&self) -> KeyRing {
        [self.signer.verifying_key()].into_iter().collect()
    }

    /// A full lease valid from a minute ago for an hour.
    pub fn lease(&self, id: &str) -> LeaseJson {
        let now = Micros::now();
        let body = pb::WitnessBody {
            lease_id: id.to_owned(),
            names: vec![pb::WitnessName {
                name: "tenant".into(),
                fencing_token: 1,
                previous: None,
            }],
            owner: "tests".into(),
            mode: pb::Mode::Full as i32,
            kind: pb::WitnessKind::Acquire as i32,
            deadline_us: now.saturating_add(Duration::from_secs(3600)).as_micros(),
            min_timestamp_us: now.saturating_sub(Duration::from_secs(60)).as_micros(),
            issued_at_us: now.as_micros(),
            server_id: "test-server".into(),
            ..Default::default()
        };
        let w = bagel_proto::sign_witness(&self.signer, &body);
        LeaseJson {
            lease_id: id.to_owned(),
            token: "token".into(),
            deadline_us: body.deadline_us,
            min_timestamp_us: body.min_timestamp_us,
            mode: "full".into(),
            names: Vec::new(),
            witness: WitnessJson::from(&w),
            server: None,
        }
    }
}
