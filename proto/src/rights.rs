//! What a writer needs from the leases it writes under, and the ledger of
//! what it wrote, which the lease's release publishes.
//!
//! Two rules make a message that a writer acknowledges one that every
//! reader accepts:
//! * the witnesses a batch cites and the bounds its timestamps are checked
//!   against are **one snapshot**, taken after the timestamps are chosen
//!   ([`WriteRights::snapshot`]); a renewal can never pair an old witness
//!   with a new deadline;
//! * a release publishes at least the highest timestamp handed to the
//!   store, waits for writes in flight, and says when one of them may still
//!   land ([`WriteLedger`]), so the next holder closes those bags before it
//!   reads.

use std::sync::{Arc, Mutex, PoisonError};

use crate::{Micros, pb};
use tokio::sync::Notify;

/// The rights to write at one instant, as one consistent view.
#[derive(Clone, Debug)]
pub struct RightsSnapshot {
    /// Every message must be strictly later than this.
    pub min_timestamp: Micros,
    /// Every message must be strictly earlier than this (minus the
    /// writer's margin).
    pub deadline: Micros,
    /// The witnesses stating those bounds, stored with every batch.
    pub witnesses: Vec<pb::Witness>,
    /// The holder's secret keys of the leases behind `witnesses` (one per
    /// lease handle, whatever its number of servers): the writer signs
    /// each batch with the key each witness names, so that a copy of the
    /// witness cannot vouch for other bytes. Empty for rights of leases
    /// acquired without a holder key.
    pub holder_keys: Vec<crate::Signer>,
}

/// What a writer needs from the leases it writes under. The lease client's
/// handle implements it, and so does the CLI's lease file; the bag engine
/// only ever sees this trait, never the lease client.
pub trait WriteRights: Send + Sync {
    /// The rights now, or why there are none (lost, released, tentative).
    /// The writer calls it once per batch, after choosing the timestamps.
    fn snapshot(&self) -> Result<RightsSnapshot, String>;

    /// The ledger a lease handle keeps of the writes under it, so that its
    /// release publishes them; `None` when there is no handle to tell.
    fn ledger(&self) -> Option<Arc<WriteLedger>> {
        None
    }

    /// Called with a batch's highest timestamp just before any of it is
    /// handed to the store; an error refuses the batch. A holder whose
    /// process may be killed at any instant (the CLI's `bagel write`)
    /// records it durably here, so that its release covers whatever lands.
    fn before_write(&self, up_to: Micros) -> Result<(), String> {
        let _ = up_to;
        Ok(())
    }
}

/// What a release needs to know about the writes under a lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// The highest timestamp handed to the store, acknowledged or not.
    pub max_written: Option<Micros>,
    /// Some write ended with an error after its record was handed to the
    /// store (a timeout, a dropped connection): it may still land.
    pub uncertain: bool,
}

#[derive(Debug, Default)]
struct LedgerState {
    closed: bool,
    in_flight: usize,
    summary: WriteSummary,
}

/// The writes under one lease: shared by the lease handle and every writer
/// using its rights. Writers take a [`WriteTicket`] per record before
/// handing it to the store; the release closes the ledger (no new
/// tickets), waits for the tickets out, and publishes the summary.
#[derive(Debug, Default)]
pub struct WriteLedger {
    state: Mutex<LedgerState>,
    idle: Notify,
}

impl WriteLedger {
    fn state(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a record whose timestamps reach `up_to`, about to be
    /// handed to the store. `None` once the lease is being released.
    pub fn begin(self: &Arc<Self>, up_to: Micros) -> Option<WriteTicket> {
        let mut s = self.state();
        if s.closed {
            return None;
        }
        s.in_flight += 1;
        s.summary.max_written = s.summary.max_written.max(Some(up_to));
        Some(WriteTicket {
            ledger: Arc::clone(self),
            settled: false,
        })
    }

    /// What has been written so far.
    pub fn summary(&self) -> WriteSummary {
        self.state().summary
    }

    /// Refuses new writes, waits until every write in flight has returned,
    /// and says what was written.
    pub async fn close(&self) -> WriteSummary {
        loop {
            let idle = self.idle.notified();
            {
                let mut s = self.state();
                s.closed = true;
                if s.in_flight == 0 {
                    return s.summary;
                }
            }
            idle.await;
        }
    }
}

/// One record in flight under a [`WriteLedger`]. Dropped without
/// [`WriteTicket::settled`], the record's fate is unknown: it may still
/// land, and the release says so.
#[derive(Debug)]
pub struct WriteTicket {
    ledger: Arc<WriteLedger>,
    settled: bool,
}

impl WriteTicket {
    /// The record is known to be in its bag, or known never to be.
    pub fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for WriteTicket {
    fn drop(&mut self) {
        let mut s = self.ledger.state();
        s.in_flight -= 1;
        s.summary.uncertain |= !self.settled;
        if s.in_flight == 0 {
            self.ledger.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn close_waits_for_writes_in_flight_and_refuses_new_ones() {
        let ledger = Arc::new(WriteLedger::default());
        let a = ledger.begin(Micros::from_micros(10)).unwrap();
        let b = ledger.begin(Micros::from_micros(7)).unwrap();
        let closing = tokio::spawn({
            let ledger = Arc::clone(&ledger);
            async move { ledger.close().await }
        });
        tokio::task::yield_now().await;
        assert!(
            ledger.begin(Micros::from_micros(11)).is_none(),
            "closed to new writes"
        );
        a.settled();
        assert!(!closing.is_finished());
        drop(b); // failed with an unknown outcome
        let summary = closing.await.unwrap();
        assert_eq!(
            summary,
            WriteSummary {
                max_written: Some(Micros::from_micros(10)),
                uncertain: true
            }
        );
    }
}
