//! Server configuration with the defaults a fresh `bagel-server` runs with.

use std::net::SocketAddr;
use std::time::Duration;

use bagel_proto::authority::querier::QueryConfig;
pub use bagel_proto::side_port::SidePortLimits;
use bagel_proto::signed_time::roughtime::RoughtimeServer;

/// Everything a lease server can be told. Build it from [`Config::default`]
/// and the `with_*` methods; the binary maps its flags onto them.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    pub listen: SocketAddr,
    /// Identifies this server in witnesses; random by default.
    pub server_id: String,
    /// A deadline must be later than now + `min_ttl`.
    pub min_ttl: Duration,
    /// A deadline may be at most now + `max_ttl`. Also the restart wait.
    pub max_ttl: Duration,
    /// The longest server-side wait for a busy name a request may ask for.
    pub max_wait: Duration,
    /// How far this server's clock may be off. Added to the restart wait,
    /// and the radius of the local signed time. With Roughtime, the server
    /// stops granting when its clock is off by more than this plus the
    /// Roughtime radius and half the round trip.
    pub clock_tolerance: Duration,
    /// How far a watermark may be ahead of its signed time (plus the signed
    /// time's resolution: 1 s for Roughtime).
    pub timestamp_tolerance: Duration,
    /// Roughtime servers to take signed time from, tried in order. Empty:
    /// this server is its own local time agent.
    pub roughtime: Vec<RoughtimeServer>,
    /// How often to ask Roughtime.
    pub roughtime_refresh: Duration,
    /// Timeout and retries of one Roughtime query.
    pub roughtime_query: QueryConfig,
    /// Grants stop when the latest Roughtime answer is older than this.
    pub roughtime_max_age: Duration,
    /// Skip the restart wait. Unsafe: a previous incarnation's leases may
    /// still be live. For development only.
    pub unsafe_skip_restart_wait: bool,
    pub limits: Limits,
    /// Number of lock shards of the lease table.
    pub shards: usize,
    /// Idle name records kept before the oldest are forgotten.
    pub max_records: usize,
    pub history_per_name: usize,
    pub history_budget_bytes: usize,
    /// How often the local signed time is re-signed.
    pub signed_time_refresh: Duration,
    /// How often the table is swept (ended leases, idle records).
    pub sweep_interval: Duration,
    /// Where the granted-until high-water mark is kept (beside the key
    /// file); `None`: nowhere, so a restart waits the configured max TTL.
    pub granted_until_file: Option<std::path::PathBuf>,
    /// How far past `now + max_ttl` the mark is written each time (so it
    /// is written about once per step under load).
    pub granted_until_step: Duration,
    /// Serve TLS (and with a client CA, require client certificates).
    pub tls: Option<TlsConfig>,
    /// What the HTTP side port (`--http`) may hold.
    pub http: SidePortLimits,
    /// The status page's table census (a scan of every record) is reused
    /// for this long, whatever the number of viewers.
    pub status_interval: Duration,
    /// Watchers: buffer per watcher, events kept for resuming, how many.
    pub watch: crate::watch::WatchConfig,
    /// The most names one `List` page returns (a larger page size asked
    /// for is cut to this).
    pub list_max_page: usize,
    /// `List` pages (and side-port searches) read at once, each on a
    /// blocking thread; more wait their turn. A page costs about its size,
    /// but clients paging in a loop could otherwise take every core from
    /// the requests that hold leases.
    pub list_pages: usize,
    /// `List` calls one identity may have waiting for a page turn; turns
    /// go to the identities waiting in turn (see
    /// `service::list_turns`).
    pub list_queue_per_identity: usize,
    /// The percent of the page turns' time that pages read in turn may
    /// take while grants or renewals are being made (1-100): after such a
    /// page, its turn stays idle for the page's CPU time × (100 / this −
    /// 1). 100: no pause (see `Inner::turned_read_pause`).
    pub list_share_while_granting: u8,
    /// The access policy file (`--acl`): who may lease or read which
    /// names. `None`: anonymous access, every client may do anything.
    pub acl: Option<std::path::PathBuf>,
    /// The member lists this server serves in (`--members`, and while
    /// migrating `--next-members`): each a list of server ids. Empty: the
    /// membership is unknown, and every name is granted (one server
    /// alone). Known: only names this server owns under one of the lists
    /// are granted, so a client whose list is wrong fails safe instead of
    /// taking a name its owner grants to another client
    /// ([`bagel_proto::routing`]).
    pub members: Vec<Vec<String>>,
    /// The member lists from a file (`--members-file`), read again on
    /// SIGHUP and when it changes; instead of [`Config::members`].
    pub members_file: Option<std::path::PathBuf>,
}

/// TLS for the server, as PEM: its certificate chain and key, and the CA
/// that client certificates must chain to (mutual TLS). With a client CA,
/// each lease's owner is its client certificate's subject.
#[derive(Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
    /// The certificates of `client_ca_pem` (DER): the only issuers a client
    /// certificate may have (see `transport::Caller::untrusted_issuer`).
    pub client_ca_der: Vec<Vec<u8>>,
}

impl TlsConfig {
    pub fn new(cert_pem: Vec<u8>, key_pem: Vec<u8>, client_ca_pem: Option<Vec<u8>>) -> Self {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let client_ca_der = client_ca_pem
            .as_deref()
            .map(|pem| {
                CertificateDer::pem_slice_iter(pem)
                    .filter_map(Result::ok)
                    .map(|c| c.to_vec())
                    .collect()
            })
            .unwrap_or_default();
        TlsConfig {
            cert_pem,
            key_pem,
            client_ca_pem,
            client_ca_der,
        }
    }
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("TlsConfig")
            .field("client_auth", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

/// Sizes every request is checked against.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Limits {
    pub max_names_per_request: usize,
    pub max_name_bytes: usize,
    pub max_owner_bytes: usize,
    pub max_metadata_bytes: usize,
    /// Operations in one `Batch` call.
    pub max_batch_ops: usize,
    /// Acquires waiting server-side for one name (FIFO), and in all.
    pub max_waiters_per_name: usize,
    pub max_waiters: usize,
    /// Waiting acquires one identity may hold (see `crate::shares`);
    /// `None`: a quarter of `max_waiters`.
    pub max_waiters_per_identity: Option<usize>,
    /// Names held at once: in all, per owner, per peer (client address).
    pub max_held_names: usize,
    pub max_held_names_per_owner: usize,
    pub max_held_names_per_peer: usize,
    /// Largest request message.
    pub max_message_bytes: usize,
    /// HTTP/2 streams (calls) at once on one connection.
    pub max_streams_per_connection: u32,
    /// Bytes of partly received request messages buffered per connection,
    /// and over all connections.
    pub max_inflight_bytes_per_connection: usize,
    pub max_inflight_bytes: usize,
    /// Connections at once; beyond, the server stops accepting.
    pub max_connections: usize,
    /// Connections at once from one address; beyond, new ones from it are
    /// closed at accept (so one address cannot fill `max_connections`).
    pub max_connections_per_address: usize,
    /// ... and of one identity, the first its calls on the connection were
    /// identified as (see `crate::shares`); `None`: a quarter of
    /// `max_connections`.
    pub max_connections_per_identity: Option<usize>,
    /// A connection that has not begun a call this long after it was
    /// accepted is closed (silent connections free their slot early).
    pub first_request_timeout: Duration,
    /// A connection with no call in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Bytes of unary answers made and not yet read that one connection,
    /// and the whole server, may hold before new calls from connections
    /// holding some are refused; and how long a connection may leave its
    /// answers unread (writing next to nothing) before it is closed (see
    /// `transport::answers`).
    pub max_unread_answer_bytes_per_connection: usize,
    pub max_unread_answer_bytes: usize,
    /// ... and one identity over all its connections (see
    /// `crate::shares`); `None`: a quarter of `max_unread_answer_bytes`.
    pub max_unread_answer_bytes_per_identity: Option<usize>,
    pub answer_stall_timeout: Duration,
    /// HTTP/2 pings to each connection, and how long to wait for the
    /// answer before dropping it.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Session streams open at once.
    pub max_sessions: usize,
    /// ... and of one identity (see `crate::shares`); `None`: a quarter of
    /// `max_sessions`.
    pub max_sessions_per_identity: Option<usize>,
    /// Bytes of answers buffered towards one session's reader, and how
    /// long a reader may leave them unread before the session is dropped.
    pub session_buffer_bytes: usize,
    pub session_stall_timeout: Duration,
    /// After SIGTERM/SIGINT, how long calls in flight are answered before
    /// the server exits even with connections open.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_names_per_request: 64,
            max_name_bytes: 256,
            max_owner_bytes: 256,
            max_metadata_bytes: 4096,
            max_batch_ops: 1024,
            max_waiters_per_name: 1024,
            max_waiters: 16_384,
            max_waiters_per_identity: None,
            max_held_names: 2_000_000,
            max_held_names_per_owner: 1_000_000,
            max_held_names_per_peer: 1_000_000,
            max_message_bytes: 4 << 20,
            max_streams_per_connection: 100,
            max_inflight_bytes_per_connection: 8 << 20,
            max_inflight_bytes: 256 << 20,
            max_connections: 1000,
            max_connections_per_address: 100,
            max_connections_per_identity: None,
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_unread_answer_bytes_per_connection: 16 << 20,
            max_unread_answer_bytes: 256 << 20,
            max_unread_answer_bytes_per_identity: None,
            answer_stall_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_sessions: 1024,
            max_sessions_per_identity: None,
            session_buffer_bytes: 1 << 20,
            session_stall_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            server_id: format!("bagel-{:08x}", rand::random::<u32>()),
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(10),
            max_wait: Duration::from_secs(10),
            clock_tolerance: Duration::from_millis(500),
            timestamp_tolerance: Duration::from_secs(1),
            roughtime: Vec::new(),
            roughtime_refresh: Duration::from_secs(1),
            roughtime_query: QueryConfig::default(),
            roughtime_max_age: Duration::from_secs(10),
            unsafe_skip_restart_wait: false,
            limits: Limits::default(),
            shards: 256,
            max_records: 2_000_000,
            history_per_name: 8,
            history_budget_bytes: 64 << 20,
            signed_time_refresh: Duration::from_millis(100),
            sweep_interval: Duration::from_secs(1),
            granted_until_file: None,
            granted_until_step: Duration::from_secs(1),
            tls: None,
            http: SidePortLimits::default(),
            status_interval: Duration::from_secs(1),
            watch: crate::watch::WatchConfig::default(),
            list_max_page: 1000,
            list_pages: 1,
            list_queue_per_identity: 64,
            list_share_while_granting: 2,
            acl: None,
            members: Vec::new(),
            members_file: None,
        }
    }
}

impl Config {
    #[must_use]
    pub fn with_listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    #[must_use]
    pub fn with_server_id(mut self, id: impl Into<String>) -> Self {
        self.server_id = id.into();
        self
    }

    /// The member lists in force (current first, then next while
    /// migrating); see [`Config::members`].
    #[must_use]
    pub fn with_members(mut self, lists: Vec<Vec<String>>) -> Self {
        self.members = lists;
        self
    }

    /// Sets [`Config::members_file`].
    pub fn with_members_file(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.members_file = path;
        self
    }

    /// The membership that decides which names this server grants, or
    /// `None` when it was not given (every name is granted).
    pub fn membership(&self) -> Result<Option<bagel_proto::routing::Membership>, String> {
        if self.members.is_empty() {
            return Ok(None);
        }
        bagel_proto::routing::Membership::new(&self.server_id, self.members.clone())
            .map(Some)
            .map_err(|e| format!("--members: {e}"))
    }

    #[must_use]
    pub fn with_min_ttl(mut self, d: Duration) -> Self {
        self.min_ttl = d;
        self
    }

    #[must_use]
    pub fn with_max_ttl(mut self, d: Duration) -> Self {
        self.max_ttl = d;
        self
    }

    #[must_use]
    pub fn with_max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    #[must_use]
    pub fn with_clock_tolerance(mut self, d: Duration) -> Self {
        self.clock_tolerance = d;
        self
    }

    #[must_use]
    pub fn with_timestamp_tolerance(mut self, d: Duration) -> Self {
        self.timestamp_tolerance = d;
        self
    }

    /// Takes signed time from these Roughtime servers (tried in order).
    #[must_use]
    pub fn with_roughtime(mut self, servers: Vec<RoughtimeServer>) -> Self {
        self.roughtime = servers;
        self
    }

    #[must_use]
    pub fn with_roughtime_refresh(mut self, every: Duration) -> Self {
        self.roughtime_refresh = every;
        self
    }

    #[must_use]
    pub fn with_roughtime_query(mut self, query: QueryConfig) -> Self {
        self.roughtime_query = query;
        self
    }

    #[must_use]
    pub fn with_roughtime_max_age(mut self, max_age: Duration) -> Self {
        self.roughtime_max_age = max_age;
        self
    }

    #[must_use]
    pub fn with_unsafe_skip_restart_wait(mut self, skip: bool) -> Self {
        self.unsafe_skip_restart_wait = skip;
        self
    }

    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    #[must_use]
    pub fn with_shards(mut self, n: usize) -> Self {
        self.shards = n.max(1);
        self
    }

    #[must_use]
    pub fn with_max_records(mut self, n: usize) -> Self {
        self.max_records = n;
        self
    }

    #[must_use]
    pub fn with_history(mut self, per_name: usize, budget_bytes: usize) -> Self {
        self.history_per_name = per_name;
        self.history_budget_bytes = budget_bytes;
        self
    }

    #[must_use]
    pub fn with_watch(mut self, watch: crate::watch::WatchConfig) -> Self {
        self.watch = watch;
        self
    }

    #[must_use]
    pub fn with_list_max_page(mut self, n: usize) -> Self {
        self.list_max_page = n.max(1);
        self
    }

    #[must_use]
    pub fn with_list_pages(mut self, n: usize) -> Self {
        self.list_pages = n.max(1);
        self
    }

    /// `percent` is kept within 1-100.
    #[must_use]
    pub fn with_list_share_while_granting(mut self, percent: u8) -> Self {
        self.list_share_while_granting = percent.clamp(1, 100);
        self
    }

    pub fn with_list_queue_per_identity(mut self, n: usize) -> Self {
        self.list_queue_per_identity = n.max(1);
        self
    }

    #[must_use]
    pub fn with_acl(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.acl = path;
        self
    }

    #[must_use]
    pub fn with_tls(mut self, tls: Option<TlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// Bounds the HTTP side port.
    #[must_use]
    pub fn with_http_limits(mut self, limits: SidePortLimits) -> Self {
        self.http = limits;
        self
    }

    /// How long the status page reuses one census of the table.
    #[must_use]
    pub fn with_status_interval(mut self, every: Duration) -> Self {
        self.status_interval = every;
        self
    }

    /// Keeps the granted-until mark in `path` (see [`crate::highwater`]).
    #[must_use]
    pub fn with_granted_until_file(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.granted_until_file = path;
        self
    }

    /// The restart wait: a previous incarnation may have granted a deadline
    /// up to `max_ttl` after it last answered, and our clock may be off by
    /// `clock_tolerance`.
    pub fn restart_wait(&self) -> Duration {
        if self.unsafe_skip_restart_wait {
            Duration::ZERO
        } else {
            self.max_ttl + self.clock_tolerance
        }
    }

    /// Every bound, as `ServerInfo` reports it.
    pub fn limits_pb(&self) -> bagel_proto::pb::ServerLimits {
        bagel_proto::pb::ServerLimits {
            max_batch_ops: self.limits.max_batch_ops as u32,
            max_records: self.max_records as u64,
            max_waiters_per_name: self.limits.max_waiters_per_name as u32,
            max_waiters: self.limits.max_waiters as u64,
            max_held_names: self.limits.max_held_names as u64,
            max_held_names_per_owner: self.limits.max_held_names_per_owner as u64,
            max_held_names_per_peer: self.limits.max_held_names_per_peer as u64,
            max_message_bytes: self.limits.max_message_bytes as u64,
            max_streams_per_connection: self.limits.max_streams_per_connection,
            max_inflight_bytes_per_connection: self.limits.max_inflight_bytes_per_connection as u64,
            max_inflight_bytes: self.limits.max_inflight_bytes as u64,
            max_connections: self.limits.max_connections as u32,
            idle_timeout_us: self.limits.idle_timeout.as_micros() as u64,
            keepalive_interval_us: self.limits.keepalive_interval.as_micros() as u64,
            keepalive_timeout_us: self.limits.keepalive_timeout.as_micros() as u64,
            max_sessions: self.limits.max_sessions as u32,
            session_buffer_bytes: self.limits.session_buffer_bytes as u64,
            session_stall_timeout_us: self.limits.session_stall_timeout.as_micros() as u64,
            shutdown_grace_us: self.limits.shutdown_grace.as_micros() as u64,
            max_sessions_per_identity: self.limits.sessions_share() as u32,
            max_watchers_per_identity: self.watch.watchers_share() as u32,
            max_waiters_per_identity: self.limits.waiters_share() as u64,
            max_connections_per_identity: self.limits.connections_share() as u32,
            max_unread_answer_bytes_per_identity: self.limits.unread_answer_bytes_share() as u64,
            history_per_name: self.history_per_name as u32,
            history_budget_bytes: self.history_budget_bytes as u64,
        }
    }

    /// Checks the settings make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_ttl <= self.min_ttl {
            return Err(format!(
                "max TTL ({:?}) must be greater than min TTL ({:?})",
                self.max_ttl, self.min_ttl
            ));
        }
        if !self.roughtime.is_empty() && self.roughtime_max_age <= self.roughtime_refresh {
            return Err(format!(
                "Roughtime max age ({:?}) must be longer than the refresh interval ({:?})",
                self.roughtime_max_age, self.roughtime_refresh
            ));
        }
        if self.roughtime_refresh.is_zero() {
            return Err("Roughtime refresh interval must not be zero".into());
        }
        if self.server_id.is_empty() || self.server_id.len() > 128 {
            return Err("server id must be 1 to 128 bytes".into());
        }
        self.membership()?;
        if self.members_file.is_some() && !self.members.is_empty() {
            return Err("give the member lists by --members or by --members-file, not both".into());
        }
        Ok(())
    }
}

impl Config {
    /// The bounds of a lease request, for the rules every backend checks
    /// alike (`bagel_lease_core::LeaseLimits`).
    pub fn lease_limits(&self) -> bagel_lease_core::LeaseLimits {
        self.limits
            .lease_limits(self.min_ttl, self.max_ttl, self.max_wait)
    }
}

impl Limits {
    /// The sessions one identity may hold (`crate::shares::share_of`).
    pub fn sessions_share(&self) -> usize {
        crate::shares::share_of(self.max_sessions_per_identity, self.max_sessions)
    }

    /// The bytes of unread answers one identity may hold.
    pub fn unread_answer_bytes_share(&self) -> usize {
        crate::shares::share_of(
            self.max_unread_answer_bytes_per_identity,
            self.max_unread_answer_bytes,
        )
    }

    /// The connections one identity may hold.
    pub fn connections_share(&self) -> usize {
        crate::shares::share_of(self.max_connections_per_identity, self.max_connections)
    }

    /// The waiting acquires one identity may hold.
    pub fn waiters_share(&self) -> usize {
        crate::shares::share_of(self.max_waiters_per_identity, self.max_waiters)
    }

    /// These limits' request sizes, with a TTL range and a max wait (a
    /// [`Config`]'s), as the rules of a lease request take them.
    pub fn lease_limits(
        &self,
        min_ttl: Duration,
        max_ttl: Duration,
        max_wait: Duration,
    ) -> bagel_lease_core::LeaseLimits {
        bagel_lease_core::LeaseLimits {
            min_ttl,
            max_ttl,
            max_wait,
            max_names_per_request: self.max_names_per_request,
            max_name_bytes: self.max_name_bytes,
            max_owner_bytes: self.max_owner_bytes,
            max_metadata_bytes: self.max_metadata_bytes,
        }
    }
}
