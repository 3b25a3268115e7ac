//! Turning a table grant into the signed witness and the wire grant.
//!
//! Unary grants are signed in groups (group commit): a grant that finds
//! nobody signing becomes the signer, yields once so that the requests
//! ready on this worker reach their grants, then signs its own witness
//! and theirs with one ed25519 signature over their Merkle root (the same
//! witnesses a `Batch` call gets), in its own task, with no hand-off;
//! grants that arrive while a signature is being made wait for the next.
//! Under load that takes the signature, the most expensive step of a
//! grant, off the per-request cost; with one request at a time it costs
//! one pass of the scheduler.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bagel_proto::{Micros, Signer, TimeProofKind, pb, sign_witness_batch};
use tokio::sync::oneshot;

use crate::table::{Grant, NameGrant};
use crate::timekeeper::SignedReading;

mod body;

/// The most witnesses signed with one signature.
const MAX_SIGN_BATCH: usize = 512;

type SignJob = (Vec<u8>, oneshot::Sender<pb::Witness>);

/// Who signs, and what every witness says about the server.
#[derive(Debug)]
pub struct WitnessSigner {
    pub signer: Signer,
    pub server_id: String,
    pub epoch: Micros,
    group: Mutex<SignGroup>,
    /// Witnesses per signature, for `/metrics`.
    pub group_sizes: crate::meter::Histo,
}

/// A grant's turn as the signer; ending it, however, hands the group over.
struct Turn<'a>(&'a Arc<WitnessSigner>);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.hand_over();
    }
}

/// The signing group: whether a signature is being made, and who waits
/// for the next one.
#[derive(Debug, Default)]
struct SignGroup {
    signing: bool,
    waiting: Vec<SignJob>,
}

impl WitnessSigner {
    pub fn new(signer: Signer, server_id: String, epoch: Micros) -> Self {
        WitnessSigner {
            signer,
            server_id,
            epoch,
            group: Mutex::new(SignGroup::default()),
            group_sizes: crate::meter::Histo::new(crate::meter::SIZES),
        }
    }

    fn group(&self) -> MutexGuard<'_, SignGroup> {
        self.group.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Signs one grant's witness, together with the others waiting for a
    /// signature at the same moment (see the module docs).
    pub async fn sign_queued(
        self: &Arc<Self>,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::Witness {
        let body = self.encode_body(grant, kind, now, time);
        // Our body back when this task is the signer, else where the
        // signer will send our witness.
        let turn = {
            let mut group = self.group();
            if group.signing {
                let (reply, answer) = oneshot::channel();
                group.waiting.push((body, reply));
                Err(answer)
            } else {
                group.signing = true;
                Ok(body)
            }
        };
        match turn {
            Ok(body) => {
                // From here this task is the signer: however it ends,
                // normally or dropped at the yield (its caller went away),
                // the turn is handed over, or every later grant would wait
                // for a signer that is gone.
                let _turn = Turn(self);
                // Before signing, let the requests that are ready run up to
                // their grant and join this signature: on a server with one
                // worker thread nobody else runs while this task signs, so
                // without the yield every grant signed alone (a third of a
                // unary cycle's server CPU at 256 clients on one core). A
                // lone request pays one pass of the scheduler.
                tokio::task::yield_now().await;
                let (bodies, replies): (Vec<_>, Vec<_>) = {
                    let mut group = self.group();
                    let n = group.waiting.len().min(MAX_SIGN_BATCH - 1);
                    group.waiting.drain(..n).unzip()
                };
                self.group_sizes.observe(bodies.len() as u64 + 1);
                // One body alone gets a plain signature, several a Merkle
                // batch (`sign_witness_batch` decides).
                let mut witnesses =
                    sign_witness_batch(&self.signer, std::iter::once(body).chain(bodies).collect())
                        .into_iter();
                let own = witnesses.next().expect("one witness per body");
                for (reply, witness) in replies.into_iter().zip(witnesses) {
                    let _ = reply.send(witness);
                }
                own
            }
            Err(answer) => match answer.await {
                Ok(witness) => witness,
                // The runtime shut down with our job waiting: sign it alone.
                Err(_) => sign_witness_batch(&self.signer, vec![self.encode_body(grant, kind, now, time)])
                    .pop()
                    .expect("one witness per body"),
            },
        }
    }

    /// Called by whoever just signed (see [`Turn`]): leaves the group idle, or hands the
    /// grants that queued meanwhile to a task that signs them in batches.
    fn hand_over(self: &Arc<Self>) {
        let mut group = self.group();
        if group.waiting.is_empty() {
            group.signing = false;
            return;
        }
        drop(group);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let jobs = {
                    let mut group = me.group();
                    if group.waiting.is_empty() {
                        group.signing = false;
                        return;
                    }
                    let n = group.waiting.len().min(MAX_SIGN_BATCH);
                    group.waiting.drain(..n).collect::<Vec<_>>()
                };
                me.group_sizes.observe(jobs.len() as u64);
                let (bodies, replies): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
                for (reply, witness) in replies.into_iter().zip(sign_witness_batch(&me.signer, bodies)) {
                    let _ = reply.send(witness);
                }
                // Let the requests this batch answered run before the next.
                tokio::task::yield_now().await;
            }
        });
    }

    /// Signs many grants with one signature (Merkle-batched witnesses).
    pub fn sign_batch(
        &self,
        grants: &[(&Grant, pb::WitnessKind)],
        now: Micros,
        time: &SignedReading,
    ) -> bagel_proto::SignedGroup {
        let bodies = grants
            .iter()
            .map(|(g, kind)| self.encode_body(g, *kind, now, time))
            .collect::<Vec<_>>();
        if !bodies.is_empty() {
            self.group_sizes.observe(bodies.len() as u64);
        }
        bagel_proto::sign_witness_group(&self.signer, bodies)
    }

    /// The encoded witness body of `grant`: the bytes of
    /// [`body`](Self::body), written without building it (see
    /// `body`).
    pub fn encode_body(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> Vec<u8> {
        body::encode(
            grant,
            &body::Statement {
                kind,
                now,
                time,
                server_id: &self.server_id,
                epoch: self.epoch,
            },
        )
    }

    /// The witness body of `grant` as the server states it: the reference
    /// that [`encode_body`](Self::encode_body)'s bytes are tested against
    /// (public for the micro-benchmarks in `benches/hot.rs`).
    pub fn body(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::WitnessBody {
        pb::WitnessBody {
            lease_id: grant.lease.to_string(),
            names: grant.names.iter().map(witness_name).collect(),
            owner: grant.owner.to_string(),
            mode: pb::Mode::from(grant.mode).into(),
            kind: kind.into(),
            deadline_us: grant.deadline.as_micros(),
            min_timestamp_us: grant.min_timestamp.as_micros(),
            issued_at_us: now.as_micros(),
            signed_time: Some(time.signed.clone()),
            server_id: self.server_id.clone(),
            epoch_us: self.epoch.as_micros(),
            self_timed: time.source == TimeProofKind::Local,
            holder_key: grant.holder_key.as_deref().map_or_else(Vec::new, |k| k.to_vec()),
        }
    }

    /// The wire form of a grant, with its witness.
    pub async fn grant_pb(
        self: &Arc<Self>,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::LeaseGrant {
        grant_pb(grant, self.sign_queued(grant, kind, now, time).await)
    }
}

/// The wire form of a grant with its (already signed) witness.
pub fn grant_pb(grant: &Grant, witness: pb::Witness) -> pb::LeaseGrant {
    pb::LeaseGrant {
        lease_id: grant.lease.to_string(),
        token: grant.token.to_string(),
        deadline_us: grant.deadline.as_micros(),
        min_timestamp_us: grant.min_timestamp.as_micros(),
        names: grant
            .names
            .iter()
            .map(|n| pb::NameGrant {
                name: n.name.to_string(),
                fencing_token: n.fencing,
                previous: Some(n.previous.to_pb()),
            })
            .collect(),
        mode: pb::Mode::from(grant.mode).into(),
        witness: Some(witness),
    }
}

fn witness_name(n: &NameGrant) -> pb::WitnessName {
    pb::WitnessName {
        name: n.name.to_string(),
        fencing_token: n.fencing,
        previous: Some(n.previous.to_pb()),
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future as _;
    use std::sync::Arc;
    use std::time::Duration;

    use bagel_proto::clock::SystemClock;
    use bagel_proto::{KeyRing, Micros, Signer, pb, verify_witness};

    use super::WitnessSigner;
    use crate::Config;
    use crate::table::{AcquireSpec, LeaseTable, Mode, TableConfig};
    use crate::timekeeper::TimeKeeper;

    fn signer() -> Signer {
        Signer::new(ed25519_dalek::SigningKey::from_bytes(&[7; 32]))
    }

    /// Grants that are ready together on one worker thread share one
    /// signature (the signer yields before signing), and every witness
    /// still verifies on its own and states its own lease.
    #[test]
    fn grants_ready_together_on_one_thread_share_a_signature() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let keeper = TimeKeeper::new(Arc::new(SystemClock), signer(), &Config::default());
        let time = keeper.signed().expect("local time");
        let now = Micros::from_micros(1_700_000_000_000_000);
        let table = LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)));
        let ws = Arc::new(WitnessSigner::new(signer(), "s".into(), now));
        let grants: Vec<_> = (0..16)
            .map(|i| {
                let spec = AcquireSpec {
                    names: vec![Arc::from(format!("n{i}").as_str())],
                    deadline: now.saturating_add(Duration::from_secs(5)),
                    owner: Arc::from("o"),
                    mode: Mode::Full,
                    peer: None,
                    holder_key: None,
                };
                table.acquire(&spec, now).expect("free name")
            })
            .collect();
        let witnesses = rt.block_on(async {
            let tasks: Vec<_> = grants
                .iter()
                .map(|g| {
                    let (ws, g, time) = (Arc::clone(&ws), g.clone(), time.clone());
                    tokio::spawn(
                        async move { ws.sign_queued(&g, pb::WitnessKind::Acquire, now, &time).await },
                    )
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        let mut keys = KeyRing::new();
        keys.insert(signer().verifying_key());
        for (g, w) in grants.iter().zip(&witnesses) {
            let body = verify_witness(w, &keys).expect("verifies");
            assert_eq!(body.lease_id, g.lease.to_string());
        }
        let signatures: std::collections::HashSet<_> =
            witnesses.iter().map(|w| w.signature.clone()).collect();
        assert_eq!(signatures.len(), 1, "16 grants ready at once, one signature");
    }

    /// A unary handler dropped while it is the signer (its caller went
    /// away during the yield) must not leave the group "signing" with
    /// nobody to sign: every later grant would wait forever.
    #[test]
    fn a_signer_dropped_at_its_yield_leaves_the_group_free() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let keeper = TimeKeeper::new(Arc::new(SystemClock), signer(), &Config::default());
        let time = keeper.signed().expect("local time");
        let now = Micros::from_micros(1_700_000_000_000_000);
        let table = LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)));
        let ws = Arc::new(WitnessSigner::new(signer(), "s".into(), now));
        let grant = |name: &str| {
            let spec = AcquireSpec {
                names: vec![Arc::from(name)],
                deadline: now.saturating_add(Duration::from_secs(5)),
                owner: Arc::from("o"),
                mode: Mode::Full,
                peer: None,
                holder_key: None,
            };
            table.acquire(&spec, now).expect("free name")
        };
        let (dropped, later) = (grant("a"), grant("b"));
        rt.block_on(async {
            // Polled once: it becomes the signer and stops at its yield.
            let mut first = Box::pin(ws.sign_queued(&dropped, pb::WitnessKind::Acquire, now, &time));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(first.as_mut().poll(&mut cx).is_pending());
            drop(first);
            let signed = tokio::time::timeout(
                Duration::from_secs(5),
                ws.sign_queued(&later, pb::WitnessKind::Acquire, now, &time),
            )
            .await;
            assert!(signed.is_ok(), "a later grant is signed");
        });
    }
}
