//! Network partitions between the S3 bag store and its clients: the
//! writers cut off from the store while a metronome outside goes on
//! closing (`writer_to_store`), and the metronome cut off while the
//! writers go on writing (`closer_to_store`).
//!
//! Three network namespaces, a star: the store's (an S3 server of its
//! own, moto as `tests/support/s3.sh` runs it) in the middle, joined by
//! one veth pair to the writers' namespace and by another to the
//! closer's. Each leaf runs a lease server of its own on its loopback:
//! the writers' one grants their leases and signs their time, the
//! closer's signs the metronome's time. So a cut separates a client from the store and
//! nothing else. A cut is one or two blackhole routes: `both` (nothing
//! gets through) or `answers_lost` (in the store's namespace only:
//! requests arrive and are served, every answer is lost).
//!
//! The writers are library writers ([`writer()`], a process of this binary
//! in the writers' namespace), one with a storage call timeout shorter
//! than a cut, one with the CLI's (see [`WRITER_OP_TIMEOUTS`]). Each
//! batch reports when it started and ended, on this host's clock (the
//! namespaces share it), so a cut's instants compare exactly. The checks:
//!
//! * no batch that started after a writer's cut began and ended before it
//!   healed was acknowledged (nothing from the store could reach it), and
//!   every writer cut made some batch fail: writes during the cut fail
//!   with an error;
//! * every batch ends within its writer's bound ([`batch_bound`]): none
//!   hangs;
//! * after each heal, each writer has a batch acknowledged again (writer
//!   cuts), or the metronome closes again (closer cuts); during a closer
//!   cut the writers go on having batches acknowledged;
//! * once every bag is due, two readers (one per leaf, one reading
//!   summaries where the metronome made them, one with `--no-summaries`)
//!   read the same messages, reject nothing and find no damage; every
//!   acknowledged write is among them; no message of a batch its writer
//!   was told was late (`LateRejected`) is; `bagel audit` finds nothing.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use bagel_client::Micros;
use rand::rngs::StdRng;
use serde::Serialize;

mod checks;
mod net;
mod phase;
mod writer;

use net::StoreNet;
use phase::Phase;
pub use writer::{StoreWriterArgs, writer};

/// The log the phase writes, and the bucket its store lives in.
const LOG: &str = "store-cuts";
const BUCKET: &str = "bagel-store-cuts";
/// The ports inside the namespaces (each has its own port space).
const S3_PORT: u16 = 9000;
const LEASE_PORT: u16 = 7420;
/// The writer processes' storage call timeouts, one writer each, each on
/// a lease of its own. The first gives up well inside a cut, so a cut
/// fails its writes; the second waits as long as the CLI does (10 s),
/// through the cut, so what it sent lands after the heal, into bags the
/// metronome outside may have closed meanwhile: it must be told
/// `LateRejected`, or be acknowledged only when the bag's lock lists it.
const WRITER_OP_TIMEOUTS: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(10)];

/// The longest a batch may take: its pause for the clock (at most 1 s)
/// and its storage calls, each bounded by `op_timeout`, the first that
/// fails ending the batch. A batch makes a handful of calls, and those
/// that succeed are quick (a batch that helps seal a minute makes one
/// more for each of its bags, each quick too): a dozen timeouts is ample,
/// and a batch past it hangs.
fn batch_bound(op_timeout: Duration) -> Duration {
    Duration::from_secs(1) + op_timeout * 12
}

/// How long a cut lasts: longer than the first writer's timeout and pause
/// together, so a batch it starts in the cut fails in it, and shorter
/// than the second's, so that one's batches wait through it.
const CUT_MS: std::ops::Range<u64> = 2_500..4_000;

/// The bags' timing (the defaults, for every process of the phase), and
/// how much later than a bag's close time a reader on a lease server's
/// time may close it (its clock bound).
const GRACE: Duration = Duration::from_secs(2);
const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);
const CLOSER_BOUND: Duration = Duration::from_secs(1);

/// What the phase did and found.
#[derive(Debug, Default, Serialize)]
pub struct StorePhase {
    /// One entry a cut, in the order they ran.
    pub cuts: Vec<StoreCut>,
    /// Messages the writers were told were written, and how many of them
    /// every reader read.
    pub acked: u64,
    pub read_back: u64,
    /// Messages each reader read (summaries, then `--no-summaries`).
    pub messages_read: Vec<u64>,
    pub readers_agree: bool,
    /// Messages read that no writer was told were written: batches whose
    /// outcome the writer could not know (a call timed out after its
    /// request arrived) that landed all the same.
    pub read_unacknowledged: u64,
    /// Failed batches by why: a storage call timed out, the bag was closed
    /// under it (`LateRejected`, `BagClosed`), anything else.
    pub failed_timeout: u64,
    pub failed_late: u64,
    pub failed_other: u64,
    /// Each writer's storage call timeout, its longest batch, and the
    /// bound every batch of it must keep, ms.
    pub op_timeout_ms: Vec<u64>,
    pub longest_batch_ms: Vec<u64>,
    pub batch_bound_ms: Vec<u64>,
    /// Bags the metronome closed over the phase.
    pub closes: u64,
}

/// One cut.
#[derive(Debug, Serialize)]
pub struct StoreCut {
    /// `writer_to_store` or `closer_to_store`.
    pub kind: &'static str,
    /// `both` or `answers_lost`.
    pub direction: &'static str,
    /// From the cut to the heal, ms.
    pub length_ms: u64,
    /// Batches that started during the cut, and how many of them failed
    /// or were acknowledged.
    pub batches: u64,
    pub failed: u64,
    pub acked: u64,
    /// Bags the metronome closed during the cut.
    pub closes: u64,
    /// From the heal to the first acknowledged batch of every writer
    /// (writer cuts) or the metronome's first close (closer cuts), ms.
    pub recovered_ms: u64,
}

/// A writer's batch as it reported it.
#[derive(Debug, Clone)]
struct Batch {
    writer: usize,
    start_us: u64,
    end_us: u64,
    outcome: Outcome,
}

#[derive(Debug, Clone)]
enum Outcome {
    /// (timestamp, payload) of each message.
    Acked(Vec<(u64, String)>),
    Failed {
        why: Failure,
        payloads: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Failure {
    Timeout,
    Late,
    Other,
}

/// Runs the store cuts once each (two of the writers, both ways and
/// answers lost; one of the closer, its direction drawn from `rng`).
/// Returns what they did and the violations found; `Err` only for a setup
/// that failed.
pub async fn run(
    bagel: &Path,
    server: &Path,
    dir: &Path,
    rng: &mut StdRng,
) -> anyhow::Result<(StorePhase, Vec<String>)> {
    let s3_cmd = std::env::var("BAGEL_S3_SERVER")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .context("BAGEL_S3_SERVER is not set: the store partitions start an S3 server of their own")?;
    let dir = dir.join("store-partitions");
    std::fs::create_dir_all(&dir)?;
    let net = StoreNet::create(std::process::id()).await?;
    let result = Phase::new(&net, bagel, server, &s3_cmd, &dir)
        .await
        .context("starting the store partitions' processes");
    let outcome = match result {
        Ok(mut phase) => {
            let r = phase.cuts(rng).await;
            phase.stop().await;
            r
        }
        Err(e) => Err(e),
    };
    net.remove().await;
    outcome
}

fn now_us() -> u64 {
    Micros::now().as_micros()
}
