//! The lease server as a time authority: [`Client`] answers
//! [`TimeAuthority::measure`] with its server's `SignedNow`, checked against
//! the server's keys and measured on the local clock, so a
//! [`crate::TimeSource::lease_server`] over a client needs no Roughtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bagel_lease_core::time_source::TimeAuthority;
use bagel_proto::authority::monitor::Measurement;
use bagel_proto::clock::Clock;
use bagel_proto::signed_time::roughtime::RoughtimeKey;
use bagel_proto::{pb, verify_signed_time};

use crate::client::Client;
use crate::error::{Error, Result};

#[async_trait::async_trait]
impl TimeAuthority for Client {
    async fn measure(&self, clock: &Arc<dyn Clock>) -> Result<Measurement> {
        let sent_at = clock.now();
        let first_send = Instant::now();
        let signed = self.signed_now().await?;
        let received = Instant::now();
        let received_at = clock.now();
        // A relayed Roughtime proof is checked against the key it names.
        let relayed: Vec<RoughtimeKey> = match &signed.proof {
            Some(pb::signed_time::Proof::Roughtime(p)) => {
                RoughtimeKey::from_slice(&p.public_key).into_iter().collect()
            }
            _ => Vec::new(),
        };
        // A server restarted without its key file signs with a new one:
        // learned keys are learned again once (pinned keys never are).
        let reading = match verify_signed_time(&signed, &self.keys(), &relayed) {
            Err(_) if self.learn_keys().await => verify_signed_time(&signed, &self.keys(), &relayed),
            checked => checked,
        }
        .map_err(|e| Error::NoSignedTime {
            detail: format!("lease server {}: signed time does not verify: {e}", self.url()),
        })?;
        Ok(Measurement {
            source: format!("lease server {}", self.url()),
            reading,
            resolution: Duration::from_micros(reading.resolution_us()),
            signed,
            sent_at,
            rtt: received.duration_since(first_send),
            received,
            received_at,
        })
    }
}
