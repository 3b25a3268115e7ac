//! Leases and signed time for exercising bag writers and readers without a
//! lease server: tests, benchmarks and examples (feature `testing`). The
//! witnesses are signed the way the server signs them, by a throwaway key.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::clock::Clock;
use bagel_proto::rights::{RightsSnapshot, WriteRights};
use bagel_proto::{KeyRing, Micros, SignedClock, SignedReading, Signer, pb};

/// Signs test leases with a key of its own.
#[derive(Debug)]
pub struct TestLeases {
    /// The throwaway key witnesses and signed times are signed with.
    pub signer: Signer,
}

impl Default for TestLeases {
    fn default() -> Self {
        TestLeases {
            signer: Signer::generate(),
        }
    }
}

impl TestLeases {
    /// The key ring a reader or auditor needs to accept these leases.
    pub fn keys(&self) -> KeyRing {
        [self.signer.verifying_key()].into_iter().collect()
    }

    /// The public key as the hex `bagel read --key` takes.
    pub fn key_hex(&self) -> String {
        bagel_proto::hex::encode(self.signer.verifying_key().as_bytes())
    }

    /// The witness of a full one-name lease valid in `(min, deadline)`,
    /// acquired without a holder key (as an old client would).
    pub fn witness(&self, lease_id: &str, min: Micros, deadline: Micros) -> pb::Witness {
        self.witness_held_by(lease_id, min, deadline, None)
    }

    /// [`TestLeases::witness`] naming `holder`'s public key as the lease's
    /// holder key.
    pub fn witness_held_by(
        &self,
        lease_id: &str,
        min: Micros,
        deadline: Micros,
        holder: Option<&Signer>,
    ) -> pb::Witness {
        let body = pb::WitnessBody {
            lease_id: lease_id.to_owned(),
            names: vec![pb::WitnessName {
                name: "tenant".into(),
                fencing_token: 1,
                previous: None,
            }],
            owner: "tests".into(),
            mode: pb::Mode::Full as i32,
            kind: pb::WitnessKind::Acquire as i32,
            deadline_us: deadline.as_micros(),
            min_timestamp_us: min.as_micros(),
            issued_at_us: min.as_micros(),
            server_id: "test-server".into(),
            holder_key: holder.map_or_else(Vec::new, |h| h.verifying_key().to_bytes().to_vec()),
            ..Default::default()
        };
        bagel_proto::sign_witness(&self.signer, &body)
    }

    /// A full lease valid in `(min, deadline)`, as a writer sees it, with
    /// a fresh holder key of its own.
    pub fn lease(&self, lease_id: &str, min: Micros, deadline: Micros) -> TestLease {
        let holder = Signer::generate();
        TestLease {
            lease_id: lease_id.to_owned(),
            min_timestamp: min,
            deadline,
            witness: self.witness_held_by(lease_id, min, deadline, Some(&holder)),
            holder: Some(holder),
        }
    }

    /// Signed time for writers: this key acting as a local time agent,
    /// signing `clock`'s readings (radius 0). Readers and audits that trust
    /// [`TestLeases::keys`] verify it.
    pub fn time(&self, clock: Arc<dyn Clock>) -> Arc<dyn SignedClock> {
        Arc::new(LocalTime {
            signer: self.signer.clone(),
            clock,
        })
    }

    /// A busy stretch for read and summary tests: `n` writers `w0`, `w1`,
    /// … on `log`, each under a lease of its own (`lease-0`, …, valid from
    /// a minute before `t0` for an hour), each writing `deposit 10` ten
    /// times a second for 5 s of `clock` from `t0`; `clock` is left at the
    /// last write.
    pub async fn write_busy_stretch(
        &self,
        store: &Arc<dyn crate::BagStore>,
        log: &str,
        n: usize,
        clock: &bagel_proto::clock::ManualClock,
        t0: Micros,
        cfg: &crate::BagConfig,
    ) {
        let writers: Vec<crate::writer::Writer> = (0..n)
            .map(|i| {
                let lease = self.lease(
                    &format!("lease-{i}"),
                    t0.saturating_sub(Duration::from_secs(60)),
                    t0.saturating_add(Duration::from_secs(3600)),
                );
                crate::writer::Writer::new(
                    Arc::clone(store),
                    log,
                    &format!("w{i}"),
                    Arc::new(lease),
                    Arc::new(clock.clone()),
                    self.time(Arc::new(clock.clone())),
                    cfg.clone(),
                )
                .expect("a test writer")
            })
            .collect();
        for tenth in 0..50u64 {
            clock.set(t0.saturating_add(Duration::from_millis(100 * tenth)));
            for w in &writers {
                w.write(bytes::Bytes::from_static(b"deposit 10"))
                    .await
                    .expect("a test write");
            }
        }
    }

    /// A full lease valid from a minute ago for an hour: long enough for
    /// any test or benchmark run.
    pub fn lease_for_an_hour(&self, lease_id: &str) -> TestLease {
        let now = Micros::now();
        self.lease(
            lease_id,
            now.saturating_sub(Duration::from_secs(60)),
            now.saturating_add(Duration::from_secs(3600)),
        )
    }
}

/// A test lease: its bounds and its signed witness.
#[derive(Clone, Debug)]
pub struct TestLease {
    /// The lease's id, as witnesses and messages cite it.
    pub lease_id: String,
    /// Its messages lie strictly after this, µs since the Unix epoch.
    pub min_timestamp: Micros,
    /// Its messages lie strictly before this, µs since the Unix epoch.
    pub deadline: Micros,
    /// Its witness, signed by [`TestLeases::signer`].
    pub witness: pb::Witness,
    /// The lease's holder key (`None`: acquired without one).
    pub holder: Option<Signer>,
}

impl WriteRights for TestLease {
    fn snapshot(&self) -> Result<RightsSnapshot, String> {
        Ok(RightsSnapshot {
            min_timestamp: self.min_timestamp,
            deadline: self.deadline,
            witnesses: vec![self.witness.clone()],
            holder_keys: self.holder.iter().cloned().collect(),
        })
    }
}

/// See [`TestLeases::time`].
#[derive(Debug)]
struct LocalTime {
    signer: Signer,
    clock: Arc<dyn Clock>,
}

#[async_trait::async_trait]
impl SignedClock for LocalTime {
    async fn signed_now(&self) -> Result<SignedReading, String> {
        let now = self.clock.now();
        Ok(SignedReading {
            signed: bagel_proto::sign_local_time(&self.signer, "test-time", now, 0),
            reading: bagel_proto::TimeReading {
                time: now,
                radius_us: 0,
                source: bagel_proto::TimeProofKind::Local,
            },
        })
    }
}
