//! The bag path at the scale of days (`--bag-scale`), on a directory
//! store, with an injected clock so that a day passes in seconds:
//!
//! * an idle log: a [`Metronome`] closing a log nobody writes for one
//!   simulated day (one tick a minute; it closes and seals all that is due),
//!   counting the files and directories left;
//! * an hour of a busy log (10 writers, 10 messages of 100 bytes a second
//!   each: 360,000 messages in 3,600 bags), sealed and summarized a minute
//!   at a time; then reading the hour back three ways, each timed: from
//!   the bags, from the summaries, and the same bytes as plain files
//!   (the store's own limit); and the bytes stored per message in bags and
//!   in summaries;
//! * the floor under any checked read of that hour: its 360,000 holder
//!   signatures verified alone (`holder_sig::check`, one strict ed25519
//!   verification each, spread over the cores as a reader spreads them),
//!   with the batches already in memory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bagel_bags::seal::Span;
use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::summary::{self, Stretch};
use bagel_bags::testing::TestLeases;
use bagel_bags::{BagConfig, BagStore, Bucket, Metronome, ReadOptions, Writer};
use bagel_proto::Micros;
use bagel_proto::clock::{AssumedExact, ManualClock};
use bytes::Bytes;
use serde::Serialize;

/// What `--bag-scale` measured.
#[derive(Debug, Clone, Serialize)]
pub struct BagScale {
    /// Files and directories an idle log leaves after one day of a
    /// metronome.
    pub idle_inodes_per_day: u64,
    /// The same, per minute.
    pub idle_inodes_per_minute: f64,
    pub hour_messages: u64,
    pub hour_bags: u64,
    pub read_from_bags_s: f64,
    pub read_from_summaries_s: f64,
    pub read_plain_files_s: f64,
    /// Reading the hour from summaries whose summarizer the reader trusts
    /// (each summary attested: holder signatures and signed times not
    /// verified again, every other check made).
    pub read_from_attested_summaries_s: f64,
    /// Messages per second of each read.
    pub read_from_bags_msgs_per_s: f64,
    pub read_from_summaries_msgs_per_s: f64,
    pub read_from_attested_summaries_msgs_per_s: f64,
    /// `read_from_bags_s / read_from_attested_summaries_s`.
    pub attested_speedup: f64,
    /// `read_from_attested_summaries_s / read_plain_files_s`.
    pub attested_vs_plain: f64,
    /// Summarizing and attesting the hour (60 summaries): building each
    /// from its bags and verifying every signature in it before signing.
    pub summarize_and_attest_s: f64,
    /// Verifying the hour's holder signatures alone, on `cores` threads.
    pub verify_signatures_s: f64,
    pub cores: usize,
    /// `read_from_bags_s / read_from_summaries_s`.
    pub summaries_speedup: f64,
    /// `read_from_summaries_s / read_plain_files_s`.
    pub summaries_vs_plain: f64,
    pub bag_bytes_per_message: f64,
    pub summary_bytes_per_message: f64,
    pub payload_bytes: usize,
}

const PAYLOAD: usize = 100;

fn count_entries(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            n += 1;
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n += count_entries(&e.path());
            }
        }
    }
    n
}

fn bytes_under(dir: &Path, keep: &dyn Fn(&Path) -> bool) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => n += bytes_under(&p, keep),
                Ok(_) if keep(&p) => n += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    n
}

/// Runs the measurement in a fresh directory under `root`.
pub async fn run(root: &Path) -> Result<BagScale> {
    let dir = root.join("bag-scale-store");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let result = measure(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(dir: &Path) -> Result<BagScale> {
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir, false));
    let cfg = BagConfig::default();
    // Minute-aligned, so the hour is 60 whole minutes.
    let t0 = Micros::from_micros(1_900_000_020_000_000);
    let clock = ManualClock::new(t0);
    let checked = Arc::new(AssumedExact(Arc::new(clock.clone())));

    // An idle log: started by a writer that never wrote; a metronome for a day.
    store.mark_log_start("idle", Bucket::of(t0)).await?;
    let mut m = Metronome::new(store.clone(), vec!["idle".into()], cfg.clone(), checked.clone())?;
    for minute in 1..=24 * 60 {
        clock.set(t0.saturating_add(Duration::from_secs(60 * minute)));
        m.tick().await?;
    }
    let idle = count_entries(&dir.join("idle"));

    // An hour of a busy log.
    clock.set(t0);
    let leases = TestLeases::default();
    let lease = leases.lease(
        "bench-scale",
        t0.saturating_sub(Duration::from_secs(60)),
        t0.saturating_add(Duration::from_secs(7200)),
    );
    let writers: Vec<Writer> = (0..10)
        .map(|i| {
            Writer::new(
                store.clone(),
                "busy",
                &format!("w{i}"),
                Arc::new(lease.clone()),
                Arc::new(clock.clone()),
                leases.time(Arc::new(clock.clone())),
                cfg.clone(),
            )
        })
        .collect::<std::result::Result<_, _>>()?;
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);
    let mut messages = 0u64;
    for tenth in 0..36_000u64 {
        clock.set(t0.saturating_add(Duration::from_millis(100 * tenth)));
        for w in &writers {
            w.write(payload.clone()).await?;
            messages += 1;
        }
    }
    let end = t0.saturating_add(Duration::from_secs(3600));
    let first = Span::of(Bucket::of(t0));
    clock.set(Span::of(Bucket::of(end.saturating_sub(Duration::from_secs(1)))).close_time(cfg.grace));
    let mut span = first;
    for _ in 0..60 {
        bagel_bags::seal::seal(store.as_ref(), "busy", span).await?;
        span = span.next();
    }
    let bag_bytes = bytes_under(&dir.join("busy"), &|p| p.extension().is_some_and(|e| e == "log"));
    let attester = summary::attest::Attester {
        signer: bagel_proto::Signer::generate(),
        keys: leases.keys(),
        roughtime_keys: Vec::new(),
    };
    let mut st = Stretch::new(first, 1);
    let started = Instant::now();
    for _ in 0..60 {
        let done = summary::summarize_attested(store.as_ref(), "busy", st, Some(&attester)).await?;
        anyhow::ensure!(
            matches!(
                done.attestation,
                Some(summary::attest::Attested::Published { .. })
            ),
            "{st} not attested: {:?}",
            done.attestation
        );
        st = st.next();
    }
    let summarize_and_attest_s = started.elapsed().as_secs_f64();
    let summary_bytes = bytes_under(&dir.join("busy").join("_summary"), &|p| {
        !p.to_string_lossy().ends_with(summary::attest::SUFFIX)
    });
    let trusted: bagel_proto::KeyRing = [attester.signer.verifying_key()].into_iter().collect();
    let hour = |use_summaries, trust: bool| {
        let o = ReadOptions::default()
            .with_range(t0, end)
            .with_summaries(use_summaries);
        if trust {
            o.with_trusted_summarizers(trusted.clone())
        } else {
            o
        }
    };
    let timed = |use_summaries, trust| {
        let (store, checked, cfg, opts) = (
            store.clone(),
            checked.clone(),
            cfg.clone(),
            hour(use_summaries, trust),
        );
        async move {
            let started = Instant::now();
            let r = bagel_bags::read(store.as_ref(), "busy", &opts, &cfg, checked.as_ref()).await?;
            let took = started.elapsed().as_secs_f64();
            anyhow::ensure!(
                r.messages.len() as u64 == messages,
                "read {} of {messages}",
                r.messages.len()
            );
            anyhow::ensure!(
                r.summaries_attested == if trust { 60 } else { 0 } && r.problems.is_empty(),
                "{} summaries read on an attestation; problems {:?}",
                r.summaries_attested,
                r.problems
            );
            Ok::<f64, anyhow::Error>(took)
        }
    };
    // For a profiler: `BAGEL_BAG_SCALE_ONLY_TRUSTED=N` reads the hour only
    // with the summarizer trusted, N times, between two lines on stderr
    // (attach `perf record -p` at the first; the process ends after the
    // last); the other rows are left at 0.
    if let Some(n) = std::env::var("BAGEL_BAG_SCALE_ONLY_TRUSTED")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    {
        eprintln!("bag-scale: trusted reads start");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut best = f64::MAX;
        for _ in 0..n.max(1) {
            let took = timed(true, true).await?;
            eprintln!("bag-scale: trusted read {took:.3} s");
            best = best.min(took);
        }
        eprintln!("bag-scale: trusted reads end");
        return Ok(BagScale {
            idle_inodes_per_day: idle,
            idle_inodes_per_minute: idle as f64 / (24.0 * 60.0),
            hour_messages: messages,
            hour_bags: 3600,
            read_from_bags_s: 0.0,
            read_from_summaries_s: 0.0,
            read_plain_files_s: 0.0,
            read_from_attested_summaries_s: best,
            read_from_bags_msgs_per_s: 0.0,
            read_from_summaries_msgs_per_s: 0.0,
            read_from_attested_summaries_msgs_per_s: messages as f64 / best,
            attested_speedup: 0.0,
            attested_vs_plain: 0.0,
            summarize_and_attest_s,
            verify_signatures_s: 0.0,
            cores: 0,
            summaries_speedup: 0.0,
            summaries_vs_plain: 0.0,
            bag_bytes_per_message: bag_bytes as f64 / messages as f64,
            summary_bytes_per_message: summary_bytes as f64 / messages as f64,
            payload_bytes: PAYLOAD,
        });
    }
    let from_bags = timed(false, false).await?;
    let from_summaries = timed(true, false).await?;
    let from_attested = timed(true, true).await?;
    let (verify_signatures_s, cores) = signatures_alone(store.as_ref(), first, messages).await?;
    // The same bytes as plain files: every data file of the hour, read.
    let started = Instant::now();
    let mut plain = 0u64;
    read_all(&dir.join("busy"), &mut plain)?;
    let plain_s = started.elapsed().as_secs_f64();
    Ok(BagScale {
        idle_inodes_per_day: idle,
        idle_inodes_per_minute: idle as f64 / (24.0 * 60.0),
        hour_messages: messages,
        hour_bags: 3600,
        read_from_bags_s: from_bags,
        read_from_summaries_s: from_summaries,
        read_plain_files_s: plain_s,
        read_from_attested_summaries_s: from_attested,
        read_from_bags_msgs_per_s: messages as f64 / from_bags,
        read_from_summaries_msgs_per_s: messages as f64 / from_summaries,
        read_from_attested_summaries_msgs_per_s: messages as f64 / from_attested,
        attested_speedup: from_bags / from_attested,
        attested_vs_plain: from_attested / plain_s,
        summarize_and_attest_s,
        verify_signatures_s,
        cores,
        summaries_speedup: from_bags / from_summaries,
        summaries_vs_plain: from_summaries / plain_s,
        bag_bytes_per_message: bag_bytes as f64 / messages as f64,
        summary_bytes_per_message: summary_bytes as f64 / messages as f64,
        payload_bytes: PAYLOAD,
    })
}

/// Seconds to verify every holder signature of the hour's summaries, the
/// batches rebuilt beforehand (not timed), on as many threads as cores.
async fn signatures_alone(store: &dyn BagStore, first: Span, messages: u64) -> Result<(f64, usize)> {
    let mut batches = Vec::new();
    let mut st = Stretch::new(first, 1);
    for _ in 0..60 {
        let s = summary::load(store, "busy", st).await?;
        for bag in &s.bags {
            for item in &bag.items {
                batches.extend(
                    summary::rebuild_batches(&s, bag, item)?
                        .into_iter()
                        .map(|r| r.batch),
                );
            }
        }
        st = st.next();
    }
    let entries: usize = batches.iter().map(|b| b.entries.len()).sum();
    anyhow::ensure!(entries as u64 == messages, "rebuilt {entries} of {messages}");
    // Every batch of the hour cites the one lease's witness.
    let witness = batches[0].witnesses.clone();
    anyhow::ensure!(batches.iter().all(|b| b.witnesses == witness), "one witness");
    let bodies = witness
        .iter()
        .map(|w| bagel_proto::witness::decode_unverified(w).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let bound = std::thread::scope(|s| {
        let bodies = &bodies;
        batches
            .chunks(batches.len().div_ceil(cores))
            .map(|chunk| {
                s.spawn(move || {
                    let mut keys = bagel_bags::holder_sig::KeyCache::default();
                    chunk
                        .iter()
                        .filter(|b| {
                            bagel_bags::holder_sig::check_cached(b, bodies, &mut keys)
                                == bagel_bags::holder_sig::HolderCheck::Bound
                        })
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().expect("a verifying thread panicked"))
            .sum::<usize>()
    });
    let took = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        bound == batches.len(),
        "{bound} of {} batches verify",
        batches.len()
    );
    Ok((took, cores))
}

/// Reads every `.log` file under `dir` whole.
fn read_all(dir: &Path, bytes: &mut u64) -> Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        let p = e.path();
        if e.file_type()?.is_dir() {
            read_all(&p, bytes)?;
        } else if p.extension().is_some_and(|x| x == "log") {
            *bytes += std::fs::read(&p)?.len() as u64;
        }
    }
    Ok(())
}

/// The markdown table of a run.
pub fn markdown(s: &BagScale) -> String {
    format!(
        "## The bag path at the scale of days (directory store, injected clock)\n\n\
         | measure | value |\n|---|--:|\n\
         | files+dirs an idle log leaves per day (metronome) | {} ({:.2} per minute) |\n\
         | one hour: messages / bags | {} / {} |\n\
         | read the hour from bags | {:.3} s ({:.0} msgs/s) |\n\
         | read the hour from summaries | {:.3} s ({:.1}x faster; {:.0} msgs/s) |\n\
         | read the hour from summaries, summarizer trusted (attested) | {:.3} s ({:.1}x faster than bags; {:.0} msgs/s) |\n\
         | read the same bytes as plain files | {:.3} s (summaries {:.2}x that; attested summaries {:.2}x) |\n\
         | summarize and attest the hour (60 summaries, every signature verified) | {:.3} s |\n\
         | verify the hour's holder signatures alone ({} cores) | {:.3} s |\n\
         | stored bytes per {}-byte message: bags / summaries | {:.0} / {:.0} |\n",
        s.idle_inodes_per_day,
        s.idle_inodes_per_minute,
        s.hour_messages,
        s.hour_bags,
        s.read_from_bags_s,
        s.read_from_bags_msgs_per_s,
        s.read_from_summaries_s,
        s.summaries_speedup,
        s.read_from_summaries_msgs_per_s,
        s.read_from_attested_summaries_s,
        s.attested_speedup,
        s.read_from_attested_summaries_msgs_per_s,
        s.read_plain_files_s,
        s.summaries_vs_plain,
        s.attested_vs_plain,
        s.summarize_and_attest_s,
        s.cores,
        s.verify_signatures_s,
        s.payload_bytes,
        s.bag_bytes_per_message,
        s.summary_bytes_per_message,
    )
}
