//! Lease files: the JSON `bagel acquire --json` prints, which `--lease FILE`
//! reads back. Every command that changes a lease (renew, upgrade, `bagel
//! run`'s renewals) rewrites its file, so that `bagel write --lease FILE`
//! never works from a stale deadline or mode.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use bagel_cli::contract::LeaseJson;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::written::PrivateDir;

/// Writes the lease file atomically: a temporary file next to it (mode
/// 0600: it holds the token), fsynced, renamed over it, the directory
/// fsynced. A reader sees the old file or the new one, never half of one,
/// and a crash leaves one of them.
///
/// The file holds the lease's token and holder key, so it is written only
/// into a directory of this user that no one else can write to (created
/// 0700 when missing, see [`PrivateDir`]; anything else is refused, naming
/// it), and the temporary file is created exclusively (`O_EXCL`, which
/// never follows a link): a leftover of a crash, or a link someone
/// planted, is removed (the link itself, never what it names) and the
/// file created afresh. The rename replaces a link at `path` rather than
/// writing through it.
pub fn write(path: &Path, lease: &LeaseJson) -> anyhow::Result<()> {
    let dir = directory(path)?;
    let file_name = path.file_name().context("the lease file path names no file")?;
    // `FILE.tmp`, as `bagel run` has always used (and its tests expect).
    let mut tmp_name = file_name.to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.path().join(&tmp_name);
    let written = (|| {
        let mut f = std::fs::File::from(create_exclusive(&dir, &tmp_name)?);
        serde_json::to_writer(&mut f, lease)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        rustix::fs::renameat(dir.fd(), &tmp_name, dir.fd(), file_name)?;
        anyhow::Ok(())
    })();
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(dir.fd(), &tmp_name, AtFlags::empty());
        return Err(e.context(format!(
            "rewriting the lease file {} (through {})",
            path.display(),
            tmp.display()
        )));
    }
    // The rename is durable once the directory is.
    let _ = rustix::fs::fsync(dir.fd());
    Ok(())
}

/// The directory a lease file at `path` goes in, created and checked
/// (see [`PrivateDir`]).
pub fn directory(path: &Path) -> anyhow::Result<PrivateDir> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    PrivateDir::open(dir, "the lease file's directory")
}

/// Creates `name` in `dir` (mode 0600), exclusively: whatever is there
/// already is unlinked first and the creation tried once more.
fn create_exclusive(dir: &PrivateDir, name: &std::ffi::OsStr) -> std::io::Result<std::os::fd::OwnedFd> {
    let create = || {
        rustix::fs::openat(
            dir.fd(),
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
    };
    match create() {
        Err(Errno::EXIST) => {
            rustix::fs::unlinkat(dir.fd(), name, AtFlags::empty())?;
            Ok(create()?)
        }
        other => Ok(other?),
    }
}
