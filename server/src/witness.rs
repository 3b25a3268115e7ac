//! Turning a table grant into the signed witness and the wire grant.
//!
//! Unary grants are signed through a queue: whatever grants are waiting
//! for a signature at the same moment are signed together, with one
//! ed25519 signature over their Merkle root (the same witnesses a `Batch`
//! call gets). Under load that takes the signature, the most expensive
//! step of a grant, off the per-request cost; with one request at a time a
//! batch holds one witness, signed directly as before.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bagel_proto::{Micros, Signer, TimeProofKind, pb, sign_witness, sign_witness_batch};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::table::{Grant, NameGrant};
use crate::timekeeper::SignedReading;

/// The most witnesses signed with one signature.
const MAX_SIGN_BATCH: usize = 512;

type SignJob = (Vec<u8>, oneshot::Sender<pb::Witness>);

/// Who signs, and what every witness says about the server.
#[derive(Debug)]
pub struct WitnessSigner {
    pub signer: Signer,
    pub server_id: String,
    pub epoch: Micros,
    queue: mpsc::UnboundedSender<SignJob>,
    /// Taken by the task that drains the queue.
    pending: Mutex<Option<mpsc::UnboundedReceiver<SignJob>>>,
    /// True while that task runs; otherwise requests sign on their own.
    draining: AtomicBool,
}

impl WitnessSigner {
    pub fn new(signer: Signer, server_id: String, epoch: Micros) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        WitnessSigner {
            signer,
            server_id,
            epoch,
            queue,
            pending: Mutex::new(Some(pending)),
            draining: AtomicBool::new(false),
        }
    }

    /// Signs one grant's witness together with any others being signed at
    /// the same moment (see the module docs).
    pub async fn sign_queued(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::Witness {
        if !self.draining.load(Ordering::Acquire) {
            return self.sign(grant, kind, now, time);
        }
        let body = self.body(grant, kind, now, time).encode_to_vec();
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError((body, _))) = self.queue.send((body, reply)) {
            return sign_witness_batch(&self.signer, vec![body]).remove(0);
        }
        match answer.await {
            Ok(witness) => witness,
            // The queue stopped (shutdown) with our job in it.
            Err(_) => self.sign(grant, kind, now, time),
        }
    }

    /// Drains the signing queue until `cancel`: takes every job waiting,
    /// signs them with one signature, answers each.
    pub async fn drain_queue(&self, cancel: CancellationToken) {
        let Some(mut pending) = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        self.draining.store(true, Ordering::Release);
        loop {
            let first = tokio::select! {
                job = pending.recv() => job,
                () = cancel.cancelled() => None,
            };
            let Some(first) = first else { break };
            let mut jobs = vec![first];
            while jobs.len() < MAX_SIGN_BATCH {
                match pending.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            let (bodies, replies): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
            for (reply, witness) in replies.into_iter().zip(sign_witness_batch(&self.signer, bodies)) {
                let _ = reply.send(witness);
            }
        }
        self.draining.store(false, Ordering::Release);
    }

    pub fn sign(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::Witness {
        sign_witness(&self.signer, &self.body(grant, kind, now, time))
    }

    /// Signs many grants with one signature (Merkle-batched witnesses).
    pub fn sign_batch(
        &self,
        grants: &[(&Grant, pb::WitnessKind)],
        now: Micros,
        time: &SignedReading,
    ) -> Vec<pb::Witness> {
        let bodies = grants
            .iter()
            .map(|(g, kind)| self.body(g, *kind, now, time).encode_to_vec())
            .collect();
        sign_witness_batch(&self.signer, bodies)
    }

    fn body(
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
        }
    }

    /// The wire form of a grant, with its witness.
    pub async fn grant_pb(
        &self,
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
