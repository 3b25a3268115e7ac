//! What `bagel write` wrote under a lease, kept for `bagel release`: the
//! release must publish at least the highest timestamp written, or the next
//! holder could write below acknowledged messages.
//!
//! Each `bagel write` run appends one line, `<highest timestamp µs>
//! <uncertain 0|1>`, to `<state dir>/leases/<lease id>.written` (appends of
//! a line are atomic, so concurrent writers under one lease are fine);
//! `bagel release` takes the maximum and removes the file once released.
//! The state directory is `$BAGEL_STATE_DIR`, else `$XDG_STATE_HOME/bagel`,
//! else `~/.local/state/bagel`. A release on another machine than the
//! writes must pass `--watermark`.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use bagel_client::Micros;
use bagel_proto::rights::WriteSummary;
use sha2::{Digest as _, Sha256};

/// Where the CLI keeps its state (written-state files, the S3 lease key,
/// `bagel run`'s lease files).
pub fn state_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("BAGEL_STATE_DIR")
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("bagel")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/bagel")))
        .unwrap_or_else(|| std::env::temp_dir().join("bagel-state"))
}

fn path(lease_id: &str) -> anyhow::Result<PathBuf> {
    if lease_id.is_empty() {
        bail!("an empty lease id names no state file");
    }
    // A server's ids (32 hex digits) name their file as they are; an id
    // that is not a plain file name (a lease over several servers:
    // `KEYID:LEASEID,...`) by its SHA-256.
    let plain = lease_id.len() <= 64
        && !lease_id.starts_with('.')
        && lease_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    let stem = if plain {
        lease_id.to_owned()
    } else {
        let digest = Sha256::digest(lease_id.as_bytes());
        format!("sha256-{}", bagel_proto::hex::encode(&digest[..16]))
    };
    Ok(state_dir().join("leases").join(format!("{stem}.written")))
}

/// Records what one write run wrote under `lease_id`.
pub fn record(lease_id: &str, written: WriteSummary) -> anyhow::Result<()> {
    let Some(up_to) = written.max_written else {
        return Ok(());
    };
    let path = path(lease_id)?;
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(format!("{} {}\n", up_to.as_micros(), u8::from(written.uncertain)).as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("recording what was written in {}", path.display()))
}

/// Everything recorded under `lease_id` (nothing when no file).
pub fn load(lease_id: &str) -> anyhow::Result<WriteSummary> {
    let path = path(lease_id)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(WriteSummary::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut sum = WriteSummary::default();
    // A torn last line (a crash mid-append) is ignored; whole lines count.
    for line in text.lines() {
        let mut f = line.split(' ');
        let (Some(Ok(up_to)), Some(flag)) = (f.next().map(str::parse::<u64>), f.next()) else {
            continue;
        };
        sum.max_written = sum.max_written.max(Some(Micros::from_micros(up_to)));
        sum.uncertain |= flag == "1";
    }
    Ok(sum)
}

/// Forgets the record once the lease is released.
pub fn forget(lease_id: &str) {
    if let Ok(path) = path(lease_id) {
        let _ = std::fs::remove_file(path);
    }
}
