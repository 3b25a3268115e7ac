//! What the NFS and bindfs tests need from the environment `tests/run.sh`
//! (via `tests/support/nfs.sh`) sets up.

/// An environment variable a test needs; panics (never skips) when unset.
pub fn need_env(var: &str, what: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{var} is not set: this test needs {what}, which tests/run.sh starts \
             (for a local run: cargo build --workspace --bins; source tests/support/common.sh; \
             source tests/support/nfs.sh; nfs_start; bindfs_start)"
        ),
    }
}

pub fn nfs_url(version: u8) -> String {
    need_env(
        &format!("BAGEL_NFS_URL_V{version}"),
        "the NFS server (nfs-ganesha)",
    )
}

/// `url` with `/sub` appended to its path (before any query).
pub fn sub_url(url: &str, sub: &str) -> String {
    match url.split_once('?') {
        Some((base, q)) => format!("{}/{sub}?{q}", base.trim_end_matches('/')),
        None => format!("{}/{sub}", url.trim_end_matches('/')),
    }
}
