//! The clock `bagel metronome`, `bagel read` and `bagel audit` close bags
//! on: this host's clock, checked against the time authority (Roughtime
//! when configured, else the lease server's signed time), with its error
//! bound. A closer never closes on an unchecked clock: a host ahead would
//! seal bags under writers that are on time and lose what they were told
//! was written. When the authority cannot be reached the clock refuses,
//! saying why, and the command closes nothing (the metronome retries at
//! every tick; a reader skips the bags it would have closed).

use std::sync::Arc;

use bagel_client::{Client, ClientOptions, TimeOptions, TimeSource};
use bagel_proto::clock::{AssumedExact, BoundedNow, CheckedClock, SystemClock, Unvouched};

use crate::target::TargetArgs;
use crate::time_cmds::RoughtimeArgs;

/// The lease server as time authority, connected on first use and again
/// after a failed connect: a metronome started before its lease server
/// begins closing once the server answers.
#[derive(Debug)]
struct LeaseServerClock {
    url: String,
    client_options: ClientOptions,
    time: TimeOptions,
    source: tokio::sync::Mutex<Option<TimeSource>>,
}

#[async_trait::async_trait]
impl CheckedClock for LeaseServerClock {
    async fn checked_now(&self) -> Result<BoundedNow, String> {
        let source = {
            let mut slot = self.source.lock().await;
            if slot.is_none() {
                let client = Client::connect_with(self.url.clone(), &self.client_options)
                    .await
                    .map_err(|e| {
                        format!("cannot reach the time authority, lease server {}: {e}", self.url)
                    })?;
                *slot = Some(TimeSource::lease_server(client, self.time.clone()));
            }
            slot.clone().expect("just set")
        };
        source.checked_now().await
    }
}

/// The closer's clock from the global flags, judged against `tolerance`
/// (the bags' clock tolerance: the monitor calls the clock off beyond it).
pub fn closer_clock(
    target: &TargetArgs,
    rt: &RoughtimeArgs,
    tolerance: std::time::Duration,
) -> anyhow::Result<Arc<dyn CheckedClock>> {
    let time = TimeOptions::default().with_tolerance(tolerance);
    let roughtime = rt.servers()?;
    if !roughtime.is_empty() {
        return Ok(Arc::new(TimeSource::roughtime(roughtime, time)));
    }
    if target.store.unsafe_local_clock {
        eprintln!(
            "bagel: UNSAFE: --unsafe-local-clock: closing bags on this host's unchecked clock (a clock ahead \
             loses acknowledged writes)"
        );
        return Ok(Arc::new(AssumedExact(SystemClock)));
    }
    if target.store.has_lease_store() {
        return Ok(Arc::new(Unvouched(
            "closing bags under S3 leases needs signed time: give --roughtime HOST:PORT --roughtime-key KEY \
             (or, for development only, --unsafe-local-clock)"
                .into(),
        )));
    }
    Ok(Arc::new(LeaseServerClock {
        url: target.time_server()?,
        client_options: target.client_options()?,
        time,
        source: tokio::sync::Mutex::new(None),
    }))
}
