//! [`ServerSpec`]: one entry of a server list (`[ID=]URL[#KEY]`), its
//! parsing and the ids derived from it.
//!
//! Separate from the cluster because it is pure text: parsing a list and
//! deriving member ids needs no connection, and the CLI parses `--servers`
//! with it before any server is reached.

use std::fmt;
use std::str::FromStr;

#[cfg(doc)]
use super::Cluster;

/// One server of a list: optionally an identity, its URL, and optionally
/// the public key it must sign with. Written `[ID=]URL[#KEY]` (ID:
/// letters, digits, `.`, `_`, `-`, `:`; KEY: 64 hex digits, the raw ed25519
/// public key `bagel-server` prints at start).
///
/// Names are routed by the server's identity: the ID when given (the
/// server must announce it: its `--server-id`), else what the server
/// announces when first reached, at start. Give IDs so that clients can
/// start while a member is down, and to catch a list that names the wrong
/// server. A pinned key is trusted without asking the server; an unpinned
/// one is learned when the server is first reached.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The identity names are routed by, when not the URL.
    pub id: Option<String>,
    /// Where to connect: `http://` or `https://` with host and port.
    pub url: String,
    /// The raw ed25519 public key its witnesses must verify with; `None`
    /// to learn the key from the server when it is first reached.
    pub key: Option<[u8; 32]>,
}

impl fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(id) = &self.id {
            write!(f, "{id}=")?;
        }
        f.write_str(&self.url)?;
        if let Some(key) = &self.key {
            write!(f, "#{}", bagel_proto::hex::encode(key))?;
        }
        Ok(())
    }
}

impl FromStr for ServerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        // `ID=` only before the URL's scheme: an `=` later is the URL's.
        let (id, rest) = match s.split_once('=') {
            Some((id, rest)) if !id.contains("://") => (Some(id), rest),
            _ => (None, s),
        };
        if let Some(id) = id {
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
            if id.is_empty() || id.len() > 64 || !id.chars().all(ok) {
                return Err(format!(
                    "server {s:?}: the identity before '=' must be 1 to 64 letters, digits, '.', '_', \
                     '-' or ':' (the server's --server-id, as `bagel server-info` shows it)"
                ));
            }
        }
        let (url, key) = match rest.split_once('#') {
            None => (rest, None),
            Some((url, key)) => {
                let key = bagel_proto::hex::decode_array::<32>(key).map_err(|e| {
                    format!("server {s:?}: the part after '#' is not a public key (64 hex digits): {e}")
                })?;
                (url, Some(key))
            }
        };
        if url.is_empty() {
            return Err(format!("server {s:?}: no URL"));
        }
        crate::options::check_server_url(url).map_err(|e| format!("server {e}"))?;
        Ok(ServerSpec {
            id: id.map(str::to_owned),
            url: url.to_owned(),
            key,
        })
    }
}

impl ServerSpec {
    /// A server known by its URL alone.
    pub fn url(url: impl Into<String>) -> Self {
        ServerSpec {
            id: None,
            url: url.into(),
            key: None,
        }
    }

    /// What names are routed by: the ID (given, or learned from the server
    /// by [`Cluster::connect`]), else the URL as written (only until the
    /// cluster has learned the ID).
    pub fn identity(&self) -> &str {
        self.id.as_deref().unwrap_or(&self.url)
    }

    /// The member id that names this server in lease ids over several
    /// servers (`MEMBERID:LEASEID,...`): 16 hex digits of
    /// SHA-256(`"bagel.v1 member\0"` ‖ identity), so it contains neither
    /// `:` nor `,` whatever the identity.
    pub fn member_id(&self) -> String {
        use sha2::{Digest as _, Sha256};
        let digest = Sha256::new()
            .chain_update(b"bagel.v1 member\0")
            .chain_update(self.identity().as_bytes())
            .finalize();
        bagel_proto::hex::encode(&digest[..8])
    }

    /// A comma-separated list (`--servers`).
    pub fn parse_list(list: &str) -> Result<Vec<ServerSpec>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::ServerSpec;

    #[test]
    fn a_server_entry_may_name_its_identity_with_or_without_a_key() {
        let plain: ServerSpec = "bagel-1=http://127.0.0.1:7000".parse().unwrap();
        assert_eq!(
            (plain.id.as_deref(), plain.url.as_str(), plain.key),
            (Some("bagel-1"), "http://127.0.0.1:7000", None)
        );
        let key = "ab".repeat(32);
        let pinned: ServerSpec = format!("bagel-2=http://127.0.0.1:7001#{key}").parse().unwrap();
        assert_eq!(
            (pinned.id.as_deref(), pinned.url.as_str(), pinned.key),
            (Some("bagel-2"), "http://127.0.0.1:7001", Some([0xab; 32]))
        );
        let bare: ServerSpec = "http://127.0.0.1:7002".parse().unwrap();
        assert_eq!((bare.id, bare.url.as_str()), (None, "http://127.0.0.1:7002"));
        assert!("=http://127.0.0.1:7002".parse::<ServerSpec>().is_err());
    }
}
