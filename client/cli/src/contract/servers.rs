//! Where leases live, as `server-info --json` ([`ServerInfoJson`], an
//! array of them over several servers, or [`StoreInfoJson`] for an S3
//! lease store) and `route --json` (an array of [`RouteJson`]) print it.
//! Keys in alphabetical order; an absent value is `null`.

use std::time::Duration;

use bagel_client::{ClockSource, Route, ServerInfo, StoreInfo};
use serde::{Deserialize, Serialize};

fn us(d: Duration) -> u64 {
    bagel_proto::duration_micros(d)
}

/// A public key: its id and the raw ed25519 key in hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyJson {
    pub ed25519_hex: String,
    pub key_id: String,
}

impl KeyJson {
    pub fn new(key_id: &str, raw: &[u8; 32]) -> Self {
        KeyJson {
            ed25519_hex: bagel_proto::hex::encode(raw),
            key_id: key_id.to_owned(),
        }
    }
}

/// One lease server as `server-info --json` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfoJson {
    pub clock: ClockJson,
    /// When this incarnation started.
    pub epoch_us: u64,
    pub forgotten_floor_us: u64,
    pub keys: Vec<KeyJson>,
    pub limits: LimitsJson,
    pub max_ttl_us: u64,
    pub max_wait_us: u64,
    pub min_ttl_us: u64,
    pub now_us: u64,
    pub ready: bool,
    /// No grants before this (the restart wait).
    pub ready_at_us: u64,
    pub server_id: String,
    pub unsafe_skip_restart_wait: bool,
    pub version: String,
    /// The server's access policy and this client under it; left out
    /// (not null) when the server has none, so the JSON of a server
    /// without one is as it always was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessJson>,
    /// The member lists the server serves in (`--members`, then
    /// `--next-members`), each as server ids; left out when it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<Vec<String>>,
}

/// A server's access policy as the caller sees it (`server-info`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessJson {
    /// Name prefixes and the permissions (lease, read) on each.
    pub grants: Vec<AccessGrantJson>,
    /// The caller's identity (certificate subject or token identity);
    /// empty when it has none.
    pub identity: String,
    /// Why it has none, when it has none.
    pub identity_problem: String,
    pub policy_sha256: String,
    pub policy_version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessGrantJson {
    pub permissions: Vec<String>,
    pub prefix: String,
}

impl From<&ServerInfo> for ServerInfoJson {
    fn from(info: &ServerInfo) -> Self {
        ServerInfoJson {
            clock: ClockJson {
                detail: info.clock.detail.clone(),
                error_bound_us: us(info.clock.error_bound),
                healthy: info.clock.healthy,
                source: info.clock.source.into(),
            },
            epoch_us: info.epoch.as_micros(),
            forgotten_floor_us: info.forgotten_floor.as_micros(),
            keys: info.keys.iter().map(|(id, raw)| KeyJson::new(id, raw)).collect(),
            limits: LimitsJson {
                max_metadata_bytes: info.max_metadata_bytes,
                max_name_bytes: info.max_name_bytes,
                max_names_per_request: info.max_names_per_request,
                max_owner_bytes: info.max_owner_bytes,
                timestamp_tolerance_us: us(info.timestamp_tolerance),
            },
            max_ttl_us: us(info.max_ttl),
            max_wait_us: us(info.max_wait),
            min_ttl_us: us(info.min_ttl),
            now_us: info.now.as_micros(),
            ready: info.ready,
            ready_at_us: info.ready_at.as_micros(),
            server_id: info.server_id.clone(),
            unsafe_skip_restart_wait: info.unsafe_skip_restart_wait,
            version: info.version.clone(),
            members: info.members.clone(),
            access: info.access.as_ref().map(|a| AccessJson {
                grants: a
                    .grants
                    .iter()
                    .map(|(prefix, permissions)| AccessGrantJson {
                        permissions: permissions.clone(),
                        prefix: prefix.clone(),
                    })
                    .collect(),
                identity: a.identity.clone(),
                identity_problem: a.identity_problem.clone(),
                policy_sha256: a.policy_sha256.clone(),
                policy_version: a.policy_version,
            }),
        }
    }
}

/// A server's clock: where its time comes from and whether it trusts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockJson {
    pub detail: String,
    pub error_bound_us: u64,
    /// False when the clock is off by more than the tolerance: no grants.
    pub healthy: bool,
    pub source: ClockSourceJson,
}

/// `local` (the server signs its own clock) or `roughtime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockSourceJson {
    Local,
    Roughtime,
}

impl From<ClockSource> for ClockSourceJson {
    fn from(s: ClockSource) -> Self {
        match s {
            ClockSource::Local => ClockSourceJson::Local,
            ClockSource::Roughtime => ClockSourceJson::Roughtime,
        }
    }
}

/// A server's request limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsJson {
    pub max_metadata_bytes: u32,
    pub max_name_bytes: u32,
    pub max_names_per_request: u32,
    pub max_owner_bytes: u32,
    pub timestamp_tolerance_us: u64,
}

/// An S3 lease store as `server-info --json` prints it: there is no
/// server, so its limits, margin and the keys published there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreInfoJson {
    pub clock_margin_us: u64,
    /// The key this client signs its witnesses with.
    pub key_id: String,
    /// Every key published in the store.
    pub keys: Vec<KeyJson>,
    /// The store's URL.
    pub lease_store: String,
    pub max_ttl_us: u64,
    pub max_wait_us: u64,
    pub min_ttl_us: u64,
}

impl From<&StoreInfo> for StoreInfoJson {
    fn from(store: &StoreInfo) -> Self {
        let keys = &store.keys;
        StoreInfoJson {
            clock_margin_us: us(store.clock_margin),
            key_id: store.key_id.clone(),
            keys: keys
                .ids()
                .map(|id| KeyJson::new(id, keys.get(id).expect("listed").as_bytes()))
                .collect(),
            lease_store: store.location.clone(),
            max_ttl_us: us(store.max_ttl),
            max_wait_us: us(store.max_wait),
            min_ttl_us: us(store.min_ttl),
        }
    }
}

/// Where a name is leased, as `route --json` prints it: one server, an
/// S3 lease store, or the server owning it among several (and, while
/// migrating, the one owning it next).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RouteJson {
    Servers(ServersRouteJson),
    Server(ServerRouteJson),
    Store(StoreRouteJson),
}

impl RouteJson {
    pub fn name(&self) -> &str {
        match self {
            RouteJson::Servers(r) => &r.name,
            RouteJson::Server(r) => &r.name,
            RouteJson::Store(r) => &r.name,
        }
    }

    /// The owning server's URL (none in an S3 lease store).
    pub fn server(&self) -> Option<&str> {
        match self {
            RouteJson::Servers(r) => Some(&r.server),
            RouteJson::Server(r) => Some(&r.server),
            RouteJson::Store(_) => None,
        }
    }

    /// The server owning it next, while migrating.
    pub fn next_server(&self) -> Option<&str> {
        match self {
            RouteJson::Servers(r) => r.next.as_ref().map(|n| n.next_server.as_str()),
            RouteJson::Server(_) | RouteJson::Store(_) => None,
        }
    }
}

/// A name's server when there is one (`--server`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRouteJson {
    pub name: String,
    /// The server's URL.
    pub server: String,
}

/// A name's S3 lease store (`--lease-store`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreRouteJson {
    /// The store's URL.
    pub lease_store: String,
    pub name: String,
}

/// A name's owner among several servers (`--servers`): it is routed by
/// `member`, the server's configured identity; `key_id` is the key it
/// signs with, `null` until known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServersRouteJson {
    pub key_id: Option<String>,
    pub member: String,
    pub name: String,
    /// The owner in `--next-servers`, while migrating (absent otherwise).
    #[serde(flatten)]
    pub next: Option<NextOwnerJson>,
    /// The owner's URL.
    pub server: String,
}

/// A name's owner in the server list being moved to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextOwnerJson {
    /// `null` until known.
    pub next_key_id: Option<String>,
    pub next_member: String,
    pub next_server: String,
}

impl From<Route> for ServersRouteJson {
    fn from(r: Route) -> Self {
        let key = |id: String| (!id.is_empty()).then_some(id);
        let next = match (r.next, r.next_identity) {
            (Some((url, key_id)), Some(member)) => Some(NextOwnerJson {
                next_key_id: key(key_id),
                next_member: member,
                next_server: url,
            }),
            _ => None,
        };
        ServersRouteJson {
            key_id: key(r.current.1),
            member: r.current_identity,
            name: r.name,
            next,
            server: r.current.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The exact JSON these printed before they were typed (keys sorted,
    // absent values null): scripts parse it.
    #[test]
    fn servers_print_as_before() {
        let info = ServerInfoJson {
            clock: ClockJson {
                detail: "ok".into(),
                error_bound_us: 5,
                healthy: true,
                source: ClockSourceJson::Roughtime,
            },
            epoch_us: 1,
            forgotten_floor_us: 2,
            keys: vec![KeyJson::new("k1", &[0xab; 32])],
            limits: LimitsJson {
                max_metadata_bytes: 10,
                max_name_bytes: 11,
                max_names_per_request: 12,
                max_owner_bytes: 13,
                timestamp_tolerance_us: 14,
            },
            max_ttl_us: 3,
            max_wait_us: 4,
            min_ttl_us: 5,
            now_us: 6,
            ready: false,
            ready_at_us: 7,
            server_id: "s".into(),
            access: None,
            members: Vec::new(),
            unsafe_skip_restart_wait: true,
            version: "0.1.0".into(),
        };
        assert_eq!(
            serde_json::to_string(&info).unwrap(),
            format!(
                r#"{{"clock":{{"detail":"ok","error_bound_us":5,"healthy":true,"source":"roughtime"}},"epoch_us":1,"forgotten_floor_us":2,"keys":[{{"ed25519_hex":"{}","key_id":"k1"}}],"limits":{{"max_metadata_bytes":10,"max_name_bytes":11,"max_names_per_request":12,"max_owner_bytes":13,"timestamp_tolerance_us":14}},"max_ttl_us":3,"max_wait_us":4,"min_ttl_us":5,"now_us":6,"ready":false,"ready_at_us":7,"server_id":"s","unsafe_skip_restart_wait":true,"version":"0.1.0"}}"#,
                "ab".repeat(32)
            )
        );
        let store = StoreInfoJson {
            clock_margin_us: 1,
            key_id: "k".into(),
            keys: Vec::new(),
            lease_store: "s3://b/p".into(),
            max_ttl_us: 2,
            max_wait_us: 3,
            min_ttl_us: 4,
        };
        assert_eq!(
            serde_json::to_string(&store).unwrap(),
            r#"{"clock_margin_us":1,"key_id":"k","keys":[],"lease_store":"s3://b/p","max_ttl_us":2,"max_wait_us":3,"min_ttl_us":4}"#
        );
    }

    #[test]
    fn routes_print_as_before_and_read_back() {
        let route = |next: Option<(&str, &str)>, key: &str| Route {
            name: "n".into(),
            current: ("http://a".into(), key.into()),
            next: next.map(|(u, k)| (u.to_owned(), k.to_owned())),
            current_identity: "a".into(),
            next_identity: next.map(|_| "b".to_owned()),
        };
        let cases = [
            (
                RouteJson::Server(ServerRouteJson {
                    name: "n".into(),
                    server: "http://a".into(),
                }),
                r#"{"name":"n","server":"http://a"}"#,
            ),
            (
                RouteJson::Store(StoreRouteJson {
                    lease_store: "s3://b/p".into(),
                    name: "n".into(),
                }),
                r#"{"lease_store":"s3://b/p","name":"n"}"#,
            ),
            (
                RouteJson::Servers(route(None, "k1").into()),
                r#"{"key_id":"k1","member":"a","name":"n","server":"http://a"}"#,
            ),
            (
                RouteJson::Servers(route(None, "").into()),
                r#"{"key_id":null,"member":"a","name":"n","server":"http://a"}"#,
            ),
            (
                RouteJson::Servers(route(Some(("http://b", "")), "k1").into()),
                r#"{"key_id":"k1","member":"a","name":"n","next_key_id":null,"next_member":"b","next_server":"http://b","server":"http://a"}"#,
            ),
            (
                RouteJson::Servers(route(Some(("http://b", "k2")), "k1").into()),
                r#"{"key_id":"k1","member":"a","name":"n","next_key_id":"k2","next_member":"b","next_server":"http://b","server":"http://a"}"#,
            ),
        ];
        for (route, json) in cases {
            assert_eq!(serde_json::to_string(&route).unwrap(), json);
            assert_eq!(serde_json::from_str::<RouteJson>(json).unwrap(), route, "{json}");
        }
    }
}
