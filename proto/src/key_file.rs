//! A signing key kept in a file (64 hex digits of an ed25519 secret, mode
//! 0600): loaded when it exists, created once when it does not. The one
//! way every side keeps its key (the server's `--key`, the S3 lease
//! store's client key), so both handle a race the same way.
//!
//! Why link, not `create_new` then write: a process that finds the file
//! between another's create and its write reads it empty and fails. The
//! new key is written and synced under a private name first, then linked
//! to `path` (which fails if `path` exists): whoever links first wins, and
//! everyone else reads the winner's whole key.

use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

use rand::RngCore as _;

use crate::Signer;

/// The key in `path`, and whether this call created it.
pub fn load_or_create(path: &Path) -> io::Result<(Signer, bool)> {
    match std::fs::read_to_string(path) {
        Ok(text) => return parse(path, &text).map(|s| (s, false)),
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // A directory made for a secret key is its owner's alone.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let signer = Signer::generate();
    let file_name = path
        .file_name()
        .map_or_else(|| "key".into(), |n| n.to_string_lossy());
    let private = dir.join(format!(
        ".{file_name}.new-{}-{:016x}",
        std::process::id(),
        rand::thread_rng().next_u64()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&private)?;
        writeln!(f, "{}", crate::hex::encode(signer.signing_key().as_bytes()))?;
        f.sync_all()?;
        std::fs::hard_link(&private, path)
    })();
    let _ = std::fs::remove_file(&private);
    match written {
        Ok(()) => {
            // The link is durable once the directory is.
            std::fs::File::open(dir)?.sync_all()?;
            Ok((signer, true))
        }
        // Another process created it first: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            parse(path, &std::fs::read_to_string(path)?).map(|s| (s, false))
        }
        Err(e) => Err(e),
    }
}

fn parse(path: &Path, text: &str) -> io::Result<Signer> {
    crate::hex::decode_array::<32>(text.trim())
        .map(|secret| Signer::new(ed25519_dalek::SigningKey::from_bytes(&secret)))
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: not an ed25519 secret key (64 hex digits): {e}",
                    path.display()
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_read_back_and_garbage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key");
        let (a, created) = load_or_create(&path).unwrap();
        assert!(created);
        let (b, created) = load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(a.key_id(), b.key_id());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        // Nothing private is left beside it.
        assert_eq!(std::fs::read_dir(dir.path().join("sub")).unwrap().count(), 1);
        std::fs::write(&path, "nope").unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("64 hex digits"), "{err}");
    }

    /// Many processes' worth of racers on one missing file: every one ends
    /// with the same whole key, and exactly one created it.
    #[test]
    fn racers_all_get_the_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let results: Vec<(String, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| s.spawn(|| load_or_create(&path).map(|(k, c)| (k.key_id().to_owned(), c))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        assert!(results.iter().all(|(id, _)| *id == results[0].0));
        assert_eq!(results.iter().filter(|(_, created)| *created).count(), 1);
    }
}
