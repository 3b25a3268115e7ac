//! The owner a lease is taken under when `owner=` says nothing: `host:pid`,
//! as the `bagel` CLI's default, so that a conflict names who holds a name
//! rather than `owner ""`.

/// At most this many bytes of the host name: the owner stays far under
/// the server's limit on owners (256 bytes by default).
const MAX_HOST: usize = 64;

/// `host:pid`, passing the servers' owner rule: no control,
/// bidirectional or zero-width characters (a host name holding one has
/// it left out), bounded in length. Read at each acquire, so that a
/// forked child names its own pid.
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
