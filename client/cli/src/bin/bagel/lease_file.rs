//! Lease files: the JSON `bagel acquire --json` prints, which `--lease FILE`
//! reads back. Every command that changes a lease (renew, upgrade, `bagel
//! run`'s renewals) rewrites its file, so that `bagel write --lease FILE`
//! never works from a stale deadline or mode.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use anyhow::Context as _;
use bagel_cli::contract::LeaseJson;

/// Writes the lease file atomically: a temporary file next to it (mode
/// 0600: it holds the token), fsynced, renamed over it, the directory
/// fsynced. A reader sees the old file or the new one, never half of one,
/// and a crash leaves one of them.
pub fn write(path: &Path, lease: &LeaseJson) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file_name = path.file_name().context("the lease file path names no file")?;
    // `FILE.tmp`, as `bagel run` has always used (and its tests expect).
    let mut tmp_name = file_name.to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        serde_json::to_writer(&mut f, lease)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        anyhow::Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!(
            "rewriting the lease file {} (through {})",
            path.display(),
            tmp.display()
        )));
    }
    // The rename is durable once the directory is.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
