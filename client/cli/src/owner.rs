//! The owner a lease is taken under when `--owner` and `BAGEL_OWNER` (or
//! Python's `owner=`) say nothing: `host:pid`, so that a conflict names
//! who holds a name rather than `owner ""`.

/// At most this many bytes of the host name: the owner stays far under
/// the server's limit on owners (256 bytes by default).
const MAX_HOST: usize = 64;

/// `host:pid`, passing the servers' owner rule: no control,
/// bidirectional or zero-width characters (a host name holding one has
/// it left out), bounded in length. Read at each call, so that a forked
/// child names its own pid.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let mut clean = String::new();
    for c in host.trim().chars() {
        if bagel_proto::names::forbidden_char(c.encode_utf8(&mut [0; 4])).is_some() {
            continue;
        }
        if clean.len() + c.len_utf8() > MAX_HOST {
            break;
        }
        clean.push(c);
    }
    if clean.is_empty() {
        clean.push_str("unknown-host");
    }
    format!("{clean}:{}", std::process::id())
}

/// `given` (`--owner` or `BAGEL_OWNER`), or [`default_owner`].
pub fn owner_or_default(given: Option<&str>) -> String {
    given.map_or_else(default_owner, str::to_owned)
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_owner_is_host_colon_pid_and_clean() {
        let o = super::default_owner();
        let (host, pid) = o.rsplit_once(':').unwrap();
        assert!(!host.is_empty() && host.len() <= super::MAX_HOST, "{o}");
        assert_eq!(pid, std::process::id().to_string());
        assert!(bagel_proto::names::forbidden_char(&o).is_none(), "{o}");
    }
}
