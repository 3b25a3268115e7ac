//! Paths beneath a store root, resolved without following any symbolic
//! link on the way: not in the last component (`O_NOFOLLOW` did that), and
//! not in a directory above it. Whoever can write to the store could
//! otherwise replace a bag directory, or a log directory, by a link to a
//! directory elsewhere: readers and the audit would take its lock and data
//! as the store's, a writer would append there and a closer would chmod
//! there.
//!
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the root does it
//! in one call; where the kernel lacks it (`ENOSYS`, before Linux 5.6),
//! the path is walked one component at a time with
//! `openat(O_NOFOLLOW | O_DIRECTORY)`. The root itself is opened as named:
//! the user chose it, links and all.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The error for a path through a symbolic link, or out of the root:
/// kind `InvalidData`, as [`crate::store::fsops::is_not_plain`] recognises.
/// Callers name the path; this says what is wrong with it.
fn through_link() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "a symbolic link, or under one (links are not followed)",
    )
}

fn io_err(e: Errno) -> io::Error {
    match e {
        // ELOOP: a link on the way (RESOLVE_NO_SYMLINKS, O_NOFOLLOW);
        // EXDEV: a path out of the root (RESOLVE_BENEATH).
        Errno::LOOP | Errno::XDEV => through_link(),
        e => io::Error::from(e),
    }
}

/// Whether `rel`'s last component is itself a symbolic link (looked at,
/// not followed): `O_DIRECTORY | O_NOFOLLOW` on a link fails with
/// `ENOTDIR`, which would otherwise read as "not a directory".
fn last_is_link(root_fd: &OwnedFd, rel: &str) -> bool {
    let Ok((dirs, Some(name))) = split(rel) else {
        return false;
    };
    let dir = if dirs.is_empty() {
        "."
    } else {
        &rel[..rel.len() - name.len() - 1]
    };
    let Ok(parent) = open_at(root_fd, dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()) else {
        return false;
    };
    rustix::fs::statat(&parent, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink)
}

/// The root directory, opened for resolving beneath it.
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens `rel` (`/`-separated, relative to `root`; empty: the root) with
/// `flags`, following no symbolic link and never leaving the root.
pub fn open(root: &Path, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let root_fd = open_root(root)?;
    match open_at(&root_fd, rel, flags, mode) {
        Err(e) if e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error()) && last_is_link(&root_fd, rel) => {
            Err(through_link())
        }
        other => other,
    }
}

fn open_at(root_fd: &OwnedFd, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let rel_path = if rel.is_empty() { "." } else { rel };
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
    // EAGAIN: a rename or mount raced the lookup; the kernel asks to retry.
    for _ in 0..8 {
        match rustix::fs::openat2(root_fd, rel_path, flags, mode, resolve) {
            Err(Errno::AGAIN) => continue,
            Err(Errno::NOSYS) => return walk(root_fd, rel, flags, mode),
            other => return other.map_err(io_err),
        }
    }
    walk(root_fd, rel, flags, mode)
}

/// The fallback: each directory on the way opened from the one before
/// with `O_NOFOLLOW | O_DIRECTORY` (a link there fails with `ELOOP`), and
/// `.`/`..` refused, so nothing can lead out of the root.
fn walk(root_fd: &OwnedFd, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let (dirs, last) = split(rel)?;
    let mut dir = rustix::io::dup(root_fd)?;
    for name in dirs {
        dir = open_dir_in(&dir, name).map_err(io_err)?;
    }
    match last {
        None => rustix::fs::openat(&dir, ".", flags, mode).map_err(io_err),
        Some(name) => rustix::fs::openat(&dir, name, flags, mode).map_err(io_err),
    }
}

/// Opens directory `name` in `dir`, not following a link: a link there
/// fails with `ELOOP` (the kernel says `ENOTDIR` for `O_DIRECTORY` on a
/// link; it is told apart here).
fn open_dir_in(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Err(Errno::NOTDIR)
            if rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
            }) =>
        {
            Err(Errno::LOOP)
        }
        other => other,
    }
}

/// `rel`'s directories and last component; `.`, `..` and empty components
/// are refused (the store never makes them).
fn split(rel: &str) -> io::Result<(Vec<&str>, Option<&str>)> {
    if rel.is_empty() {
        return Ok((Vec::new(), None));
    }
    let mut parts: Vec<&str> = rel.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err(through_link());
    }
    let last = parts.pop();
    Ok((parts, last))
}

/// The directory holding `rel`, opened beneath `root` as [`open`] does,
/// and `rel`'s last component: for creating, linking and appending
/// there with `*at` calls that do not follow a link in the last name.
pub fn parent(root: &Path, rel: &str) -> io::Result<(OwnedFd, String)> {
    let (_, last) = split(rel)?;
    let name = last.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty path"))?;
    let dir = rel[..rel.len() - name.len()].trim_end_matches('/');
    let fd = open(root, dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    Ok((fd, name.to_owned()))
}

/// Creates `rel` and the directories above it beneath `root`, each one
/// made (or found) in the one before without following a link.
pub fn create_dir_all(root: &Path, rel: &str, mode: Mode) -> io::Result<()> {
    let (mut dirs, last) = split(rel)?;
    dirs.extend(last);
    let mut dir = open_root(root)?;
    for name in dirs {
        match rustix::fs::mkdirat(&dir, name, mode) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io_err(e)),
        }
        dir = open_dir_in(&dir, name).map_err(io_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_on_the_way_are_refused_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("log")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("lock"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("log/bag")).unwrap();
        std::fs::write(root.join("log/file"), b"y").unwrap();
        let fd = |rel| open(&root, rel, OFlags::RDONLY, Mode::empty());
        let walked = |rel| {
            walk(
                &open_root(&root).unwrap(),
                rel,
                OFlags::RDONLY | OFlags::NOFOLLOW,
                Mode::empty(),
            )
        };
        for rel in ["log/bag/lock", "log/bag", "log/../../outside/lock", "/etc/passwd"] {
            let e = fd(rel).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{rel}: {e}");
            let e = walked(rel).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "walk {rel}: {e}");
        }
        fd("log/file").unwrap();
        walked("log/file").unwrap();
        let e = create_dir_all(&root, "log/bag/new", Mode::from_raw_mode(0o755)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(!outside.join("new").exists());
        create_dir_all(&root, "log/a/b", Mode::from_raw_mode(0o755)).unwrap();
        assert!(root.join("log/a/b").is_dir());
    }
}
