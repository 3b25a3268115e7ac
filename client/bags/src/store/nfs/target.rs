//! Where an `nfs://` store points: the URL's parts, parsed.

use std::fmt;

/// NFS protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfsVersion {
    /// NFSv3, with the MOUNT protocol to find the export.
    V3,
    /// NFSv4.2 (the crate speaks minor version 2 with sessions).
    V4,
}

/// A parsed `nfs://` store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NfsTarget {
    /// The server's host name or IP address.
    pub host: String,
    /// NFS port; `None` means 2049.
    pub port: Option<u16>,
    /// `/`-separated, absolute, no trailing slash (`""` is the root).
    pub path: String,
    /// The protocol spoken; NFSv3 unless the URL asks otherwise.
    pub version: NfsVersion,
    /// NFSv3 MOUNT port; `None` asks the portmapper.
    pub mount_port: Option<u16>,
    /// NFSv3 export, when given instead of probed.
    pub export: Option<String>,
    /// TCP connections to the server, 1 to 64 (4 by default).
    pub connections: usize,
}

const DEFAULT_CONNECTIONS: usize = 4;

impl NfsTarget {
    /// Parses `nfs://host[:port]/path[?query]`; the error says what is wrong.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("nfs://")
            .ok_or("an NFS URL starts with nfs://")?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p.parse::<u16>().map_err(|e| format!("bad port {p:?}: {e}"))?;
                (h, Some(port))
            }
            _ => (authority, None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("no host: nfs://host[:port]/export/dir".into());
        }
        let path = normalize(path)?;
        let mut t = NfsTarget {
            host: host.to_owned(),
            port,
            path,
            version: NfsVersion::V3,
            mount_port: None,
            export: None,
            connections: DEFAULT_CONNECTIONS,
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("bad query part {kv:?}"))?;
            match k {
                "version" | "vers" => {
                    t.version = match v {
                        "3" => NfsVersion::V3,
                        "4" | "4.2" => NfsVersion::V4,
                        _ => return Err(format!("version must be 3 or 4 (4.2), not {v:?}")),
                    }
                }
                "mountport" => {
                    t.mount_port = Some(v.parse().map_err(|e| format!("bad mountport {v:?}: {e}"))?)
                }
                "export" => {
                    let e = normalize(v)?;
                    if !is_prefix(&e, &t.path) {
                        return Err(format!("export {v:?} is not a prefix of the path {:?}", t.path));
                    }
                    t.export = Some(e);
                }
                "connections" => {
                    t.connections = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| format!("connections must be 1 to 64, not {v:?}"))?
                }
                _ => return Err(format!("unknown query parameter {k:?}")),
            }
        }
        Ok(t)
    }
}

impl fmt::Display for NfsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "nfs://{host}")?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        write!(f, "{}", if self.path.is_empty() { "/" } else { &self.path })?;
        let v = match self.version {
            NfsVersion::V3 => "3",
            NfsVersion::V4 => "4",
        };
        write!(f, "?version={v}")?;
        if let Some(p) = self.mount_port {
            write!(f, "&mountport={p}")?;
        }
        if let Some(e) = &self.export {
            write!(f, "&export={}", if e.is_empty() { "/" } else { e })?;
        }
        if self.connections != DEFAULT_CONNECTIONS {
            write!(f, "&connections={}", self.connections)?;
        }
        Ok(())
    }
}

/// `/a//b/` → `/a/b`; `/` → ``. Rejects `.` and `..`.
fn normalize(path: &str) -> Result<String, String> {
    let mut out = String::new();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if seg == "." || seg == ".." {
            return Err(format!("path {path:?} may not contain . or .."));
        }
        out.push('/');
        out.push_str(seg);
    }
    Ok(out)
}

fn is_prefix(prefix: &str, path: &str) -> bool {
    path == prefix || path.starts_with(&format!("{prefix}/")) || prefix.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::nfs::conn::join;

    #[test]
    fn parses_urls() {
        let t = NfsTarget::parse("nfs://127.0.0.1:2050/bagel/x/?version=4&connections=2").unwrap();
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, Some(2050));
        assert_eq!(t.path, "/bagel/x");
        assert_eq!(t.version, NfsVersion::V4);
        assert_eq!(t.connections, 2);
        assert_eq!(
            t.to_string(),
            "nfs://127.0.0.1:2050/bagel/x?version=4&connections=2"
        );
        assert_eq!(NfsTarget::parse(&t.to_string()).unwrap(), t);

        let t = NfsTarget::parse("nfs://h/e/d?mountport=20491&export=/e").unwrap();
        assert_eq!((t.port, t.mount_port), (None, Some(20491)));
        assert_eq!(t.export.as_deref(), Some("/e"));
        assert_eq!(t.version, NfsVersion::V3);
        assert_eq!(t.to_string(), "nfs://h/e/d?version=3&mountport=20491&export=/e");
        assert_eq!(NfsTarget::parse(&t.to_string()).unwrap(), t);

        let t = NfsTarget::parse("nfs://[::1]:20490/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", Some(20490), "")
        );

        for bad in [
            "nfs:///x",
            "nfs://h:x/",
            "nfs://h/a/../b",
            "nfs://h/x?version=2",
            "nfs://h/x?export=/y",
            "nfs://h/x?connections=0",
            "nfs://h/x?what=1",
            "file:///x",
        ] {
            assert!(NfsTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn joins_paths() {
        assert_eq!(join("", ""), "/");
        assert_eq!(join("", "a/b"), "/a/b");
        assert_eq!(join("/x", "a"), "/x/a");
        assert_eq!(join("/x", ""), "/x");
        assert!(is_prefix("", "/a"));
        assert!(is_prefix("/a", "/a/b"));
        assert!(!is_prefix("/a", "/ab"));
    }
}
