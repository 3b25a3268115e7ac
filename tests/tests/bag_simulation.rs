//! The bag protocol under deterministic simulation (issue 51; the
//! simulator is `bagel_tests::bag_sim`, the properties B-1, B-2 and B-5 of
//! `docs/invariants.md`): the real writer, metronome, summarizer,
//! retention, reader and audit over an in-memory directory or S3 store,
//! one seed per run.
//!
//! * bounded (this test): seeds `0..BAGEL_SIM_SEEDS` (default 500; about 45 s in the debug build);
//! * deeper: `BAGEL_SIM_SEEDS=5000 cargo test -p bagel-tests --release --test bag_simulation`;
//! * one seed, with its whole history: `BAGEL_SIM_SEED=1234 BAGEL_SIM_FULL_HISTORY=1 ...`.

use std::time::Instant;

use bagel_tests::bag_sim::{Options, run_seed, run_seed_with};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: a number of seeds, or one seed"))
    })
}

#[test]
fn every_seed_keeps_acknowledged_records_readable_and_reads_agreeing() {
    let full = std::env::var_os("BAGEL_SIM_FULL_HISTORY").is_some();
    let seeds: Vec<u64> = match env("BAGEL_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env("BAGEL_SIM_SEEDS").unwrap_or(500)).collect(),
    };
    // BAGEL_SIM_RACING_READER=0: without the reader racing the closers
    // and retention (see `Options::racing_reader`).
    let options = Options {
        racing_reader: std::env::var("BAGEL_SIM_RACING_READER").as_deref() != Ok("0"),
    };
    let started = Instant::now();
    let (mut acked, mut reads) = (0, 0);
    for (n, &seed) in seeds.iter().enumerate() {
        let out = run_seed_with(seed, options);
        assert!(
            out.broken.is_empty(),
            "after {} seeds in {:.1?}:\n{}",
            n + 1,
            started.elapsed(),
            out.report(full)
        );
        acked += out.acknowledged;
        reads += out.successful_reads;
        if full {
            eprintln!("{}", out.report(true));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} seeds in {secs:.1} s ({:.0} seeds a minute): {acked} records acknowledged, {reads} successful reads, all checked",
        seeds.len(),
        seeds.len() as f64 * 60.0 / secs.max(1e-9),
    );
}

/// One seed is one run: the same seed gives the same history, store call
/// for store call.
#[test]
fn one_seed_replays_the_same_run() {
    for seed in [3, 17] {
        let (a, b) = (run_seed(seed), run_seed(seed));
        assert!(a.history.len() > 50, "{}", a.history.len());
        if let Some(i) =
            (0..a.history.len().max(b.history.len())).find(|&i| a.history.get(i) != b.history.get(i))
        {
            panic!(
                "seed {seed}: the runs part at event {i}:\n  {:?}\n  {:?}",
                a.history.get(i),
                b.history.get(i)
            );
        }
    }
}
