//! `bagel write`: write messages under a lease file, followed as it is
//! renewed.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bagel_bags::Writer;
use bagel_cli::contract::{LeaseJson, WriteFailedJson, WriteItemKind, WrittenJson};
use bagel_proto::Micros;
use bagel_proto::clock::{Clock, OffsetClock, SystemClock};
use bagel_proto::rights::{RightsSnapshot, WriteLedger, WriteRights};
use bytes::Bytes;

use super::Globals;
use super::args::{BagStoreArgs, TimingArgs};

#[derive(clap::Args, Debug)]
pub struct WriteArgs {
    #[command(flatten)]
    store: BagStoreArgs,
    /// The log (a stream of bags) in the store.
    #[arg(long)]
    log: String,
    /// The lease as printed by `bagel acquire --json`.
    #[arg(long)]
    lease: PathBuf,
    /// Messages; without any, one message per line of standard input.
    messages: Vec<String>,
    /// Defaults to `<host>-<pid>-<random>`; must be unique per process.
    #[arg(long)]
    writer_id: Option<String>,
    /// Messages per batch when reading standard input: a batch is written
    /// when this many lines have arrived or --linger has passed since its
    /// first line, whichever comes first. A batch whose timestamps would
    /// fall at or past the lease's deadline minus --deadline-margin (the
    /// lease expired or was lost) is refused whole, nothing of it stored:
    /// the run stops (exit 1, or 75 when trying again may help) unless
    /// --keep-going.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Longest a line read from standard input waits for its batch to
    /// fill before the batch is written anyway (as Kafka's `linger.ms`), so
    /// a slow producer's lines are stored and acknowledged as they come,
    /// not at end of input.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    linger: Duration,
    /// Refuse timestamps at or past the deadline minus this.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    deadline_margin: Duration,
    /// Skip fsync (faster; an acknowledged write may be lost on power loss).
    #[arg(long)]
    no_sync: bool,
    /// After a failed batch, print `FAILED <count> <error>` and go on with
    /// the next one instead of stopping.
    #[arg(long)]
    keep_going: bool,
    /// Testing: run with a clock this many ms off (negative = behind).
    #[arg(long, hide = true, allow_hyphen_values = true, default_value_t = 0)]
    clock_offset_ms: i64,
    #[command(flatten)]
    timing: TimingArgs,
}

pub(super) async fn run(a: WriteArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    crate::names::path_not_json("--lease", &a.lease.to_string_lossy())?;
    let text =
        std::fs::read_to_string(&a.lease).with_context(|| format!("reading lease {}", a.lease.display()))?;
    let lease: LeaseJson =
        serde_json::from_str(&text).with_context(|| format!("parsing lease {}", a.lease.display()))?;
    // Refuse at once what every batch would be refused for (a tentative
    // lease, a witness that does not decode), before opening the store.
    lease
        .snapshot()
        .map_err(|e| anyhow::anyhow!("lease {}: {e}", a.lease.display()))?;
    // Held until this run ends: a release of the lease waits for it.
    let record = Arc::new(crate::written::WriteRecord::open(&lease.lease_id, !a.no_sync)?);
    let cfg = a
        .timing
        .config()
        .with_deadline_margin(a.deadline_margin)
        .with_sync(!a.no_sync);
    let store = a.store.open(&cfg).await?;
    let clock: Arc<dyn Clock> = if a.clock_offset_ms == 0 {
        Arc::new(SystemClock)
    } else {
        Arc::new(OffsetClock {
            inner: SystemClock,
            offset_us: a.clock_offset_ms * 1000,
        })
    };
    // Every batch carries a recent signed time (Roughtime, else the lease
    // server's); a clock that is off refuses to write.
    let time = g.target.writer_time(g.roughtime, Arc::clone(&clock)).await?;
    let writer_id = a.writer_id.clone().unwrap_or_else(Writer::default_writer_id);
    let rights = Arc::new(FileRights {
        path: a.lease.clone(),
        lease: std::sync::Mutex::new(Followed {
            stamp: file_stamp(&a.lease),
            lease,
        }),
        ledger: Arc::default(),
        record: Arc::clone(&record),
    });
    let writer = Writer::new(
        store,
        &a.log,
        &writer_id,
        Arc::clone(&rights) as _,
        clock,
        time,
        cfg,
    )?;
    let result = write_all(&a, &writer).await;
    // Whatever happened, the release must publish what was written (each
    // batch was recorded before it went to the store; this says how the
    // run ended).
    record.finish(rights.ledger.summary())?;
    result
}

/// A lease file's rights, with a ledger of what this run wrote and its
/// durable record for the release.
///
/// The file is followed: whoever renews the lease rewrites it (`bagel
/// renew --lease FILE`, `bagel run`'s `$BAGEL_LEASE_FILE`, by rename), and
/// a long-running `bagel write` (a pipe) must see the new deadline, or
/// every batch after the first TTL is refused while the lease is alive.
/// Each batch's snapshot looks at the file's identity and mtime (one
/// `stat`) and reads it again when it changed. The file may only go on
/// naming the same lease; a file that is gone or cannot be read keeps the
/// last rights read, which run out at their deadline.
struct FileRights {
    path: PathBuf,
    lease: std::sync::Mutex<Followed>,
    ledger: Arc<WriteLedger>,
    record: Arc<crate::written::WriteRecord>,
}

/// The lease file as last read, and which version of it that was.
struct Followed {
    lease: LeaseJson,
    stamp: Option<FileStamp>,
}

/// What tells one version of a file from the next: a rename gives it a new
/// inode; an in-place write a new mtime or length.
type FileStamp = (u64, std::time::SystemTime, u64);

fn file_stamp(path: &std::path::Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.ino(), meta.modified().ok()?, meta.len()))
}

impl FileRights {
    /// The rights now: the file again if it changed since last read.
    fn current(&self) -> Result<LeaseJson, String> {
        let mut followed = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stamp = file_stamp(&self.path);
        if stamp.is_some() && stamp != followed.stamp {
            let newer = std::fs::read_to_string(&self.path)
                .ok()
                .and_then(|text| serde_json::from_str::<LeaseJson>(&text).ok());
            if let Some(newer) = newer {
                if newer.lease_id != followed.lease.lease_id {
                    return Err(format!(
                        "lease file {} now holds lease {}, not the lease {} this run writes under",
                        self.path.display(),
                        newer.lease_id,
                        followed.lease.lease_id
                    ));
                }
                followed.lease = newer;
                followed.stamp = stamp;
            }
        }
        Ok(followed.lease.clone())
    }
}

impl WriteRights for FileRights {
    fn snapshot(&self) -> Result<RightsSnapshot, String> {
        self.current()?.snapshot()
    }

    fn ledger(&self) -> Option<Arc<WriteLedger>> {
        Some(Arc::clone(&self.ledger))
    }

    fn before_write(&self, up_to: Micros) -> Result<(), String> {
        self.record.before_write(up_to).map_err(|e| format!("{e:#}"))
    }
}

/// Exit code of a batch that failed in a way trying again may fix
/// (`EX_TEMPFAIL`).
const EXIT_RETRYABLE: u8 = 75;

/// Writes every batch, printing each message's timestamp as it is stored
/// (a line `<µs> <RFC 3339>`, or with `--json` one object per message).
async fn write_all(a: &WriteArgs, writer: &Writer) -> anyhow::Result<ExitCode> {
    let json = crate::output::json();
    let mut out = std::io::stdout().lock();
    let mut batches = if a.messages.is_empty() {
        Batches::Stdin(StdinBatches::start(a.batch.max(1), a.linger))
    } else {
        Batches::Given(Some(a.messages.clone()))
    };
    while let Some(batch) = batches.next().await {
        let batch = batch.context("reading standard input")?;
        let n = batch.len();
        let stamps = writer
            .write_batch(batch.into_iter().map(Bytes::from).collect())
            .await;
        match stamps {
            Ok(stamps) => {
                for t in stamps {
                    if json {
                        let line = WrittenJson {
                            kind: WriteItemKind::Written,
                            time: t.to_string(),
                            timestamp_us: t.as_micros(),
                        };
                        writeln!(out, "{}", serde_json::to_string(&line)?)?;
                    } else {
                        writeln!(out, "{} {t}", t.as_micros())?;
                    }
                }
                out.flush()?;
            }
            Err(e) if a.keep_going => {
                if json {
                    let line = WriteFailedJson {
                        error: e.to_string(),
                        kind: WriteItemKind::Failed,
                        messages: n as u64,
                        retryable: e.is_retryable(),
                    };
                    writeln!(out, "{}", serde_json::to_string(&line)?)?;
                } else {
                    writeln!(out, "FAILED {n} {e}")?;
                }
                out.flush()?;
            }
            Err(e) => {
                out.flush()?;
                let wm = writer
                    .max_written()
                    .map_or("none".to_owned(), |m| m.as_micros().to_string());
                let message = format!("write failed (largest timestamp written: {wm}): {e}");
                return Ok(if e.is_retryable() {
                    crate::failure::report("retryable", EXIT_RETRYABLE, &message)
                } else {
                    crate::failure::report("error", 1, &message)
                });
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The batches `bagel write` writes: the messages given on the command
/// line, or standard input's lines as they arrive.
enum Batches {
    Given(Option<Vec<String>>),
    Stdin(StdinBatches),
}

impl Batches {
    async fn next(&mut self) -> Option<std::io::Result<Vec<String>>> {
        match self {
            Batches::Given(messages) => messages.take().map(Ok),
            Batches::Stdin(lines) => lines.next().await,
        }
    }
}

/// Standard input's lines in batches of at most `batch`, each ended by
/// its size or by `linger` after its first line. A thread reads the lines
/// (stdin is blocking) into a bounded channel: while a batch is being
/// written the next one fills, and a producer faster than the store is
/// held back by the channel, not buffered without bound.
struct StdinBatches {
    lines: tokio::sync::mpsc::Receiver<std::io::Result<String>>,
    batch: usize,
    linger: Duration,
}

impl StdinBatches {
    fn start(batch: usize, linger: Duration) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(batch);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let failed = line.is_err();
                if tx.blocking_send(line).is_err() || failed {
                    return;
                }
            }
        });
        StdinBatches {
            lines: rx,
            batch,
            linger,
        }
    }

    async fn next(&mut self) -> Option<std::io::Result<Vec<String>>> {
        let first = match self.lines.recv().await? {
            Ok(line) => line,
            Err(e) => return Some(Err(e)),
        };
        let until = tokio::time::Instant::now() + self.linger;
        let mut batch = vec![first];
        while batch.len() < self.batch {
            match tokio::time::timeout_at(until, self.lines.recv()).await {
                Ok(Some(Ok(line))) => batch.push(line),
                Ok(Some(Err(e))) => return Some(Err(e)),
                // End of input, or the linger passed: write what came.
                Ok(None) | Err(_) => break,
            }
        }
        Some(Ok(batch))
    }
}
