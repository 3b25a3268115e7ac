//! One racer of the S3 lease race test (`tests/tests/s3_lease.rs`): a
//! process holding its own S3 lease backend (own key, own ETag cache),
//! driven line by line on stdin so that the test can start every racer's
//! attempt at the same instant.
//!
//! ```text
//! stdin                 stdout
//! (start)               ready <key id>
//! acquire NAME          won <lease id> <fencing token> <previous lease id or -> <previous ended>
//!                       busy | error <message>
//! release               released <watermark µs> | error <message>
//! ```
//!
//! Usage: `bagel-s3-racer s3://bucket/prefix` with the `AWS_*` environment
//! and `BAGEL_ROUGHTIME_ADDR` / `BAGEL_ROUGHTIME_KEY` for signed time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bagel_client::{AcquireBuilder, Error, Lease, LeaseOptions};
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend};
use std::io::{BufRead as _, Write as _};

/// Reads a command (blocking: the racer does one thing at a time), runs it
/// on the runtime, answers.
fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(race())
}

async fn race() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .context("usage: bagel-s3-racer s3://bucket/prefix")?;
    let cfg = bagel_tests::s3_test_config();
    let store = LeaseStore::from_url(&url, cfg.op_timeout)?;
    let backend = Arc::new(
        S3LeaseBackend::open(
            store,
            bagel_proto::Signer::generate(),
            LeaseTime::Signed(bagel_tests::roughtime_time()),
            cfg,
        )
        .await?,
    );
    let mut out = std::io::stdout();
    writeln!(out, "ready {}", backend.key_id())?;
    out.flush()?;
    let mut held: Option<Lease> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let answer = match line.split_once(' ') {
            Some(("acquire", name)) => {
                let got = AcquireBuilder::new(Arc::clone(&backend) as _, [name])
                    .ttl(Duration::from_secs(30))
                    .options(LeaseOptions::default().with_auto_renew(false))
                    .send()
                    .await;
                match got {
                    Ok(lease) => {
                        let n = &lease.names()[0];
                        let answer = format!(
                            "won {} {} {} {}",
                            lease.id(),
                            n.fencing_token,
                            n.previous.lease_id.as_deref().unwrap_or("-"),
                            n.previous.ended.as_str()
                        );
                        held = Some(lease);
                        answer
                    }
                    Err(Error::Busy { .. }) => "busy".to_owned(),
                    Err(e) => format!("error {e}"),
                }
            }
            None if line == "release" => match held.take() {
                Some(lease) => match lease.release(None).await {
                    Ok(wm) => format!("released {}", wm.as_micros()),
                    Err(e) => format!("error {e}"),
                },
                None => "error nothing held".to_owned(),
            },
            _ => format!("error unknown command {line:?}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}
