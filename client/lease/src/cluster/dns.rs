//! `dns+srv://NAME`: a server list found in DNS, turned into the
//! [`ServerSpec`]s a written list would give.
//!
//! The rule, the same for every client (Rust, CLI, Python):
//!
//! * `NAME` has one SRV record per member (a Kubernetes headless Service
//!   publishes `_bagel._tcp.<service>.<namespace>.svc.cluster.local`, one
//!   record per pod);
//! * a record's **target** names the member: its first label is the
//!   member's server ID (`bagel-0.bagel.default.svc.cluster.local` is
//!   member `bagel-0`: in a StatefulSet, the pod name, which the pod passes
//!   as `--server-id`). The ID is what names are routed by, so it comes
//!   from the record's *name*, never from where it points: a record that
//!   points at another member's address is caught when that member
//!   announces its own ID (the cluster's identity check);
//! * the record's **port** and the target's A/AAAA address make the URL
//!   (`http://ADDRESS:PORT`, resolved by the same resolver, so a test's
//!   resolver answers everything); with TLS (a CA in [`ClientOptions`]) the
//!   URL keeps the target's host name (`https://TARGET:PORT`), which the
//!   member's certificate names;
//! * a TXT record `bagel-key=<64 hex digits>` at the target pins the
//!   member's key (as `#KEY` does in a written list); without one the key
//!   is learned from the member at first contact.
//!
//! The resolver is the system's (`/etc/resolv.conf`: a pod's cluster DNS),
//! or the one at [`ClientOptions::dns_server`], else `BAGEL_DNS_SERVER`
//! (`IP:PORT`), for a resolver of one's own (tests run dnsmasq on a high
//! port). DNS is not trusted for safety: what a lookup says is checked
//! against the members themselves (see [`super::DnsCluster`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;

use super::ServerSpec;
use crate::error::{Error, Result};
use crate::options::ClientOptions;

/// The scheme of a server list found in DNS by SRV records.
pub const SCHEME: &str = "dns+srv://";

/// The environment variable naming a resolver (`IP:PORT`) to ask instead
/// of the system's, when [`ClientOptions::dns_server`] is not set.
pub const DNS_SERVER_ENV: &str = "BAGEL_DNS_SERVER";

/// The TXT record (at a member's SRV target) that pins its key.
const KEY_TXT: &str = "bagel-key=";

/// Whether `list` is a server list found in DNS (`dns+srv://NAME`).
pub fn is_dns_list(list: &str) -> bool {
    list.trim().starts_with(SCHEME)
}

/// The SRV name of a `dns+srv://NAME` list, checked: one name, no path,
/// no port, no second entry.
pub fn srv_name(list: &str) -> Result<String> {
    let bad = |why: &str| Error::Config {
        message: format!(
            "server list {list:?}: {why}; write dns+srv://NAME with NAME the SRV records' name, e.g. \
             dns+srv://_bagel._tcp.bagel.default.svc.cluster.local"
        ),
    };
    let name = list
        .trim()
        .strip_prefix(SCHEME)
        .ok_or_else(|| bad("not a dns+srv:// list"))?;
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    };
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() || bare.len() > 253 || !bare.split('.').all(label_ok) {
        return Err(bad(
            "NAME is not a DNS name (one name only: no ',', '/', ':' or port)",
        ));
    }
    Ok(name.to_owned())
}

/// The members a `dns+srv://NAME` list names in DNS now, by the rule of
/// the module docs, nothing asked of them: for what needs one member's
/// address (signed time from a lease server), never for routing, which
/// [`super::DnsCluster`] takes from the members.
pub async fn resolve(list: &str, options: &ClientOptions) -> Result<Vec<ServerSpec>> {
    Lookup::new(srv_name(list)?, options)?.members().await
}

/// Asks DNS for the members of `name` (a [`srv_name`]).
pub(super) struct Lookup {
    resolver: TokioResolver,
    name: String,
    tls: bool,
}

impl Lookup {
    pub(super) fn new(name: String, options: &ClientOptions) -> Result<Self> {
        let config_error = |e: &dyn std::fmt::Display| Error::Config {
            message: format!("DNS resolver for {SCHEME}{name}: {e}"),
        };
        let server = match options.dns_server {
            Some(at) => Some(at),
            None => match std::env::var(DNS_SERVER_ENV) {
                Ok(text) if !text.trim().is_empty() => {
                    Some(text.trim().parse::<SocketAddr>().map_err(|e| {
                        config_error(&format!("{DNS_SERVER_ENV}={text:?} is not IP:PORT ({e})"))
                    })?)
                }
                _ => None,
            },
        };
        let builder = match server {
            None => TokioResolver::builder_tokio().map_err(|e| config_error(&e))?,
            Some(at) => {
                let mut ns = NameServerConfig::udp_and_tcp(at.ip());
                for c in &mut ns.connections {
                    c.port = at.port();
                }
                let config = ResolverConfig::from_parts(None, vec![], vec![ns]);
                TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
            }
        };
        let mut opts = ResolverOpts::default();
        // A member set is read again every refresh: an answer cached past
        // its TTL would only delay a change, and the members check it
        // anyway, but there is no reason to hold one at all.
        opts.cache_size = 0;
        let resolver = builder.with_options(opts).build().map_err(|e| config_error(&e))?;
        Ok(Lookup {
            resolver,
            name,
            tls: options.tls.is_some(),
        })
    }

    /// The SRV name looked up.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The members the SRV records name, by ID (see the module docs for the
    /// rule). Fails when the name has no records, a target's first label is
    /// not a server ID, two records name one member at two places, or a
    /// target has no address or a malformed key record.
    pub(super) async fn members(&self) -> Result<Vec<ServerSpec>> {
        let name = fqdn(&self.name);
        let srv = self
            .resolver
            .srv_lookup(name.as_str())
            .await
            .map_err(|e| self.unavailable(&format!("SRV {name}: {e}")))?;
        let mut by_id: BTreeMap<String, ServerSpec> = BTreeMap::new();
        for record in srv.answers() {
            let RData::SRV(srv) = &record.data else {
                continue;
            };
            let target = srv.target.to_ascii();
            let host = target.strip_suffix('.').unwrap_or(&target).to_owned();
            let id = host.split('.').next().unwrap_or_default().to_ascii_lowercase();
            if !bagel_proto::routing::valid_identity(&id) {
                return Err(self.refuse(&format!(
                    "the SRV target {target:?} does not start with a server id (its first label is the \
                     member's --server-id)"
                )));
            }
            let url = if self.tls {
                format!("https://{host}:{}", srv.port)
            } else {
                format!("http://{}", self.address(&target, srv.port).await?)
            };
            let spec = ServerSpec {
                id: Some(id.clone()),
                url,
                key: self.key(&target).await?,
            };
            if let Some(seen) = by_id.get(&id)
                && *seen != spec
            {
                return Err(self.refuse(&format!(
                    "two SRV records name member {id}, as {seen:?} and {spec:?}"
                )));
            }
            by_id.insert(id, spec);
        }
        if by_id.is_empty() {
            return Err(self.unavailable(&format!("SRV {name}: no records")));
        }
        Ok(by_id.into_values().collect())
    }

    /// `IP:PORT` of `target` (the first address it has: a member has one).
    async fn address(&self, target: &str, port: u16) -> Result<String> {
        let ips = self
            .resolver
            .lookup_ip(target)
            .await
            .map_err(|e| self.unavailable(&format!("address of {target}: {e}")))?;
        let ip = ips
            .iter()
            .next()
            .ok_or_else(|| self.unavailable(&format!("address of {target}: none")))?;
        Ok(match ip {
            IpAddr::V4(v4) => format!("{v4}:{port}"),
            IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        })
    }

    /// The key a TXT `bagel-key=HEX` at `target` pins; `None` when it has
    /// none (the key is then learned from the member).
    async fn key(&self, target: &str) -> Result<Option<[u8; 32]>> {
        let txt = match self.resolver.txt_lookup(target).await {
            Ok(txt) => txt,
            Err(e) if e.is_no_records_found() => return Ok(None),
            Err(e) => return Err(self.unavailable(&format!("TXT {target}: {e}"))),
        };
        let mut keys = Vec::new();
        for record in txt.answers() {
            let RData::TXT(txt) = &record.data else {
                continue;
            };
            let text: String = txt
                .txt_data
                .iter()
                .map(|part| String::from_utf8_lossy(part))
                .collect();
            if let Some(hex) = text.strip_prefix(KEY_TXT) {
                let key = bagel_proto::hex::decode_array::<32>(hex.trim()).map_err(|e| {
                    self.refuse(&format!(
                        "TXT {target}: {KEY_TXT}... is not a public key (64 hex digits): {e}"
                    ))
                })?;
                keys.push(key);
            }
        }
        keys.dedup();
        match keys.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(*one)),
            _ => Err(self.refuse(&format!("TXT {target}: two different {KEY_TXT} records"))),
        }
    }

    fn unavailable(&self, why: &str) -> Error {
        Error::Unavailable {
            retry_after: None,
            message: format!("{SCHEME}{}: {why}", self.name),
        }
    }

    fn refuse(&self, why: &str) -> Error {
        Error::Config {
            message: format!("{SCHEME}{}: {why}", self.name),
        }
    }
}

/// `name` as a fully qualified name: the SRV name is absolute (no search
/// domains tried, so one name means one thing to every client).
fn fqdn(name: &str) -> String {
    if name.ends_with('.') {
        name.to_owned()
    } else {
        format!("{name}.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dns_list_is_one_name() {
        assert!(is_dns_list(
            " dns+srv://_bagel._tcp.bagel.default.svc.cluster.local"
        ));
        assert!(!is_dns_list("http://127.0.0.1:7420"));
        assert_eq!(
            srv_name("dns+srv://_bagel._tcp.bagel.test").unwrap(),
            "_bagel._tcp.bagel.test"
        );
        for bad in [
            "dns+srv://",
            "dns+srv://a.test,b.test",
            "dns+srv://a.test:53",
            "dns+srv://a.test/x",
            "dns+srv://a..test",
        ] {
            let e = srv_name(bad).unwrap_err().to_string();
            assert!(e.contains("dns+srv://NAME"), "{bad}: {e}");
        }
    }
}
