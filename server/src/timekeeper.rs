//! The server's clock and the signed time it attaches to witnesses.
//!
//! Without an external time authority the server is the *local time agent*
//! of the design: it signs its own clock readings. The signature does not
//! make the reading true; it makes an innocent mistake (a timestamp far in
//! the future with a valid signature) implausible, and it tells an auditor
//! which server vouched for the time. Every witness says `self_timed`.
//!
//! Signing costs tens of microseconds, so the signed reading is refreshed
//! every `signed_time_refresh` rather than per grant; a witness's signed
//! time is thus at most that old when the witness is made.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bagel_proto::clock::Clock;
use bagel_proto::{Micros, Signer, duration_micros, pb, sign_local_time};

/// A signed reading and the time it states.
#[derive(Debug)]
pub struct SignedReading {
    pub time: Micros,
    pub radius_us: u64,
    pub signed: pb::SignedTime,
}

#[derive(Debug)]
pub struct TimeKeeper {
    clock: Arc<dyn Clock>,
    signer: Signer,
    server_id: String,
    radius_us: u64,
    /// Replaced wholesale on refresh; readers clone the `Arc` and drop the
    /// lock at once (never held across `.await`).
    current: RwLock<Arc<SignedReading>>,
}

impl TimeKeeper {
    pub fn new(clock: Arc<dyn Clock>, signer: Signer, server_id: String, tolerance: Duration) -> Self {
        let radius_us = duration_micros(tolerance);
        let first = Self::sign(&*clock, &signer, &server_id, radius_us);
        TimeKeeper {
            clock,
            signer,
            server_id,
            radius_us,
            current: RwLock::new(Arc::new(first)),
        }
    }

    fn sign(clock: &dyn Clock, signer: &Signer, server_id: &str, radius_us: u64) -> SignedReading {
        let time = clock.now();
        SignedReading {
            time,
            radius_us,
            signed: sign_local_time(signer, server_id, time, radius_us),
        }
    }

    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The latest signed reading.
    pub fn signed(&self) -> Arc<SignedReading> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Signs a fresh reading.
    pub fn refresh(&self) {
        let next = Arc::new(Self::sign(
            &*self.clock,
            &self.signer,
            &self.server_id,
            self.radius_us,
        ));
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = next;
    }

    pub fn status(&self) -> pb::ClockStatus {
        pb::ClockStatus {
            source: pb::TimeSource::Local.into(),
            error_bound_us: self.radius_us,
            healthy: true,
            detail: "local time agent: this server signs its own clock readings; no external \
                     time authority is configured"
                .into(),
        }
    }
}
