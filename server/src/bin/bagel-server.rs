//! `bagel-server`: runs the lease server. With no flags it listens on
//! 127.0.0.1:7420 with a fresh key and a 10 s max TTL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_proto::Signer;
use bagel_proto::authority::querier::QueryConfig;
use bagel_proto::clock::{Clock, OffsetClock, SystemClock};
use bagel_proto::signed_time::roughtime::RoughtimeServer;
use bagel_server::config::SidePortLimits;
use bagel_server::{Config, Limits, Server};
use clap::Parser;

/// bagel's in-RAM lease server.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Print this server's manual page (roff, for `man -l -` or
    /// /usr/local/share/man/man1/bagel-server.1) and exit.
    #[arg(help_heading = "Manual", long)]
    man: bool,
    /// Address to listen on (port 0 picks a free port; the bound address is
    /// printed).
    #[arg(help_heading = "Listening", long, env = "BAGEL_LISTEN", default_value = bagel_server::config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Also serve HTTP on this address (e.g. 127.0.0.1:7421): /metrics
    /// (Prometheus), a status page at /, /healthz and /readyz. Off unless
    /// given. Port 0 picks a free port; the bound address is printed.
    #[arg(
        help_heading = "Side port (HTTP)",
        long,
        env = "BAGEL_HTTP",
        value_name = "ADDR"
    )]
    http: Option<SocketAddr>,
    /// HTTP side port: connections at once; one more is answered 503 and
    /// closed.
    #[arg(help_heading = "Side port (HTTP)", long, env = "BAGEL_HTTP_MAX_CONNECTIONS", default_value_t = SidePortLimits::default().max_connections)]
    http_max_connections: usize,
    /// HTTP side port: time to send a request's head (and to begin the
    /// next one on a kept-alive connection).
    #[arg(help_heading = "Side port (HTTP)", long, env = "BAGEL_HTTP_HEADER_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    http_header_timeout: Duration,
    /// HTTP side port: close a connection on which no byte moved either
    /// way for this long (0: never).
    #[arg(help_heading = "Side port (HTTP)", long, env = "BAGEL_HTTP_IDLE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    http_idle_timeout: Duration,
    /// HTTP side port: largest request head (request line and headers), at
    /// least 8192.
    #[arg(help_heading = "Side port (HTTP)", long, env = "BAGEL_HTTP_MAX_HEADER_BYTES", default_value_t = SidePortLimits::default().max_header_bytes as u64,
          value_parser = clap::value_parser!(u64).range(bagel_proto::side_port::MIN_HEADER_BYTES as u64..))]
    http_max_header_bytes: u64,
    /// HTTP side port: file descriptors kept free for the lease port; a
    /// side-port connection that would leave fewer is answered 503.
    #[arg(help_heading = "Side port (HTTP)", long, env = "BAGEL_HTTP_RESERVED_FDS", default_value_t = SidePortLimits::default().reserved_fds)]
    http_reserved_fds: u64,
    /// The status page's census of the table (a scan of every record) is
    /// computed at most once per this interval, whatever the number of
    /// viewers (/metrics scrapes always take a fresh one, shared by
    /// concurrent scrapes).
    #[arg(help_heading = "Side port (HTTP)", long, env = "BAGEL_STATUS_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    status_interval: Duration,
    /// Log format on stderr: `text` for people, `json` (one object per
    /// line) for log collectors. RUST_LOG sets the level (refusals are
    /// logged at debug).
    #[arg(help_heading = "Listening", long, env = "BAGEL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Longest lease a client may take; also how long a restart waits.
    #[arg(help_heading = "Leases", long, env = "BAGEL_MAX_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    max_ttl: Duration,
    /// Shortest lease a client may take.
    #[arg(help_heading = "Leases", long, env = "BAGEL_MIN_TTL", default_value = "10ms", value_parser = humantime::parse_duration)]
    min_ttl: Duration,
    /// Longest server-side wait for a busy name a request may ask for.
    #[arg(help_heading = "Leases", long, env = "BAGEL_MAX_WAIT", default_value = "10s", value_parser = humantime::parse_duration)]
    max_wait: Duration,
    /// How far this host's clock may be off; added to the restart wait.
    #[arg(help_heading = "Leases", long, env = "BAGEL_CLOCK_TOLERANCE", default_value = "500ms", value_parser = humantime::parse_duration)]
    clock_tolerance: Duration,
    /// ed25519 signing key file (64 hex digits of the secret seed). Created
    /// (mode 0600) if it does not exist. Without it, a fresh key is made and
    /// its public key printed. Beside it, `<KEY>.granted-until` keeps the
    /// latest deadline this server may have granted, so a restart waits for
    /// it even with a smaller --max-ttl or a clock stepped back.
    #[arg(help_heading = "Leases", long, env = "BAGEL_KEY")]
    key: Option<PathBuf>,
    /// This server's identity: in its witnesses and signed times, and
    /// what cluster clients route names by (so it must not change while
    /// clients run). Default: `key-<key id>` with --key, else
    /// `<host name>:<port>`.
    #[arg(help_heading = "Leases", long, env = "BAGEL_SERVER_ID")]
    server_id: Option<String>,
    /// The member list this server serves in, as IDs (`a,b,c`) or as the
    /// clients' list (`a=http://h1:7420,b=...`, so one BAGEL_SERVERS value
    /// serves both): this server then grants only the names it owns under
    /// it, and a client with a wrong list fails safe instead of taking a
    /// name its owner grants to another. Give it to every member of a
    /// cluster; without it every name is granted (one server alone).
    #[arg(
        help_heading = "Leases",
        long,
        env = "BAGEL_MEMBERS",
        value_name = "LIST",
        conflicts_with = "members_file"
    )]
    members: Option<String>,
    /// The member lists from a file, read again on SIGHUP and whenever it
    /// changes, so a change of lists needs no restart: a line
    /// `members = LIST` and, while migrating, `next-members = LIST` (LIST
    /// as for --members). A file that does not read or parse, or names
    /// this server in neither list, keeps the lists in effect (the log
    /// says why); at start, it is refused.
    #[arg(
        help_heading = "Leases",
        long,
        env = "BAGEL_MEMBERS_FILE",
        value_name = "FILE"
    )]
    members_file: Option<std::path::PathBuf>,
    /// While migrating (the two-list recipe): the next member list. Names
    /// this server owns under either list are granted.
    #[arg(
        help_heading = "Leases",
        long,
        env = "BAGEL_NEXT_MEMBERS",
        value_name = "LIST",
        requires = "members"
    )]
    next_members: Option<String>,
    /// UNSAFE, development only: grant at once after a start instead of
    /// waiting out leases a previous incarnation may have granted.
    #[arg(help_heading = "Leases", long, env = "BAGEL_UNSAFE_SKIP_RESTART_WAIT")]
    unsafe_skip_restart_wait: bool,
    /// Number of lock shards.
    #[arg(
        help_heading = "Table and memory",
        long,
        env = "BAGEL_SHARDS",
        default_value_t = 256
    )]
    shards: usize,
    /// Name records kept (held and idle, ~300 bytes each) before idle ones
    /// are forgotten: those of the address, then the owner, with the most
    /// records first.
    #[arg(
        help_heading = "Table and memory",
        long,
        env = "BAGEL_MAX_RECORDS",
        default_value_t = 2_000_000
    )]
    max_records: usize,
    /// Renewal/release entries (with their metadata) kept per name for
    /// History.
    #[arg(
        help_heading = "Table and memory",
        long,
        env = "BAGEL_HISTORY_PER_NAME",
        default_value_t = 8
    )]
    history_per_name: usize,
    /// Bytes of history kept over all names; the oldest entries go first.
    #[arg(help_heading = "Table and memory", long, env = "BAGEL_HISTORY_BUDGET_BYTES", default_value_t = 64 << 20)]
    history_budget_bytes: usize,
    /// Events buffered for one watcher (Watch) that does not read fast
    /// enough; one more and it is dropped with RESOURCE_EXHAUSTED naming
    /// this limit and the last revision it got, to resume from.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_WATCH_BUFFER",
        default_value_t = 1024
    )]
    watch_buffer: usize,
    /// Events kept (~200 bytes each) so a watcher can resume from a
    /// revision it saw; an older revision is refused with OUT_OF_RANGE.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_WATCH_RETAIN",
        default_value_t = 10_000
    )]
    watch_retain: usize,
    /// Bytes of the events kept for resuming (~120 bytes each plus the
    /// name and owner): the one copy every watcher reads from.
    #[arg(help_heading = "Watch and List", long, env = "BAGEL_WATCH_RETAIN_BYTES", default_value_t = 32 << 20)]
    watch_retain_bytes: usize,
    /// End a watch whose client reads nothing it is owed for this long
    /// (RESOURCE_EXHAUSTED naming this limit and the last revision sent),
    /// freeing what was queued for it; 0: never.
    #[arg(help_heading = "Watch and List", long, env = "BAGEL_WATCH_STALL_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    watch_stall_timeout: Duration,
    /// Watchers at once.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_MAX_WATCHERS",
        default_value_t = 1024
    )]
    max_watchers: usize,
    /// Watchers one identity (certificate subject or token identity) may
    /// hold, so one tenant cannot take them all (default: a quarter of
    /// --max-watchers; 0: all of them). Callers are one identity without
    /// --acl or --client-ca, which has no share.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_MAX_WATCHERS_PER_IDENTITY"
    )]
    max_watchers_per_identity: Option<usize>,
    /// The most names one List page returns.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_LIST_MAX_PAGE",
        default_value_t = 1000
    )]
    list_max_page: usize,
    /// List pages (and side-port searches) read at once; more wait.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_LIST_PAGES",
        default_value_t = 1
    )]
    list_pages: usize,
    /// List calls one identity (token, certificate, or else address) may
    /// have waiting for a page turn; turns go to the identities waiting in
    /// turn. One more is refused (RESOURCE_EXHAUSTED).
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_MAX_QUEUED_LISTS_PER_IDENTITY",
        default_value_t = 64
    )]
    max_queued_lists_per_identity: usize,
    /// Percent of the page turns' time that List pages read in turn (all
    /// but the light lane's) may take while grants or renewals are being
    /// made (any in the last 2 s): after such a page its turn stays idle
    /// for the page's CPU time × (100 / P − 1). A bulk read of many pages
    /// then yields the CPU to leases; 100 switches the pause off.
    #[arg(
        help_heading = "Watch and List",
        long,
        env = "BAGEL_LIST_SHARE_WHILE_GRANTING",
        default_value_t = 2,
        value_parser = clap::value_parser!(u8).range(1..=100)
    )]
    list_share_while_granting: u8,
    /// Names held at once over all clients (~300 bytes each).
    #[arg(help_heading = "Table and memory", long, env = "BAGEL_MAX_HELD_NAMES", default_value_t = Limits::default().max_held_names)]
    max_held_names: usize,
    /// Names one owner may hold at once (with --client-ca the owner is the
    /// client certificate's subject; otherwise what the client says).
    #[arg(help_heading = "Table and memory", long, env = "BAGEL_MAX_HELD_NAMES_PER_OWNER", default_value_t = Limits::default().max_held_names_per_owner)]
    max_held_names_per_owner: usize,
    /// Names one client address may hold at once.
    #[arg(help_heading = "Table and memory", long, env = "BAGEL_MAX_HELD_NAMES_PER_PEER", default_value_t = Limits::default().max_held_names_per_peer)]
    max_held_names_per_peer: usize,
    /// Max names in one request.
    #[arg(help_heading = "Request sizes", env = "BAGEL_MAX_NAMES", long, default_value_t = Limits::default().max_names_per_request)]
    max_names: usize,
    /// Max bytes of metadata on renew/release.
    #[arg(help_heading = "Request sizes", env = "BAGEL_MAX_METADATA_BYTES", long, default_value_t = Limits::default().max_metadata_bytes)]
    max_metadata_bytes: usize,
    /// Max bytes of one name.
    #[arg(help_heading = "Request sizes", env = "BAGEL_MAX_NAME_BYTES", long, default_value_t = Limits::default().max_name_bytes)]
    max_name_bytes: usize,
    /// Max bytes of an owner.
    #[arg(help_heading = "Request sizes", env = "BAGEL_MAX_OWNER_BYTES", long, default_value_t = Limits::default().max_owner_bytes)]
    max_owner_bytes: usize,
    /// Max operations in one Batch call (or one Session request).
    #[arg(help_heading = "Request sizes", env = "BAGEL_MAX_BATCH_OPS", long, default_value_t = Limits::default().max_batch_ops)]
    max_batch_ops: usize,
    /// Largest request message, in bytes; larger ones are refused at their
    /// 5-byte prefix with RESOURCE_EXHAUSTED.
    #[arg(help_heading = "Request sizes", long, env = "BAGEL_MAX_MESSAGE_BYTES", default_value_t = Limits::default().max_message_bytes)]
    max_message_bytes: usize,
    /// HTTP/2 streams (calls, sessions) at once on one connection.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_STREAMS_PER_CONNECTION", default_value_t = Limits::default().max_streams_per_connection)]
    max_streams_per_connection: u32,
    /// Bytes of partly received request messages buffered per connection
    /// (beyond, the stream that would pass it is refused).
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_INFLIGHT_BYTES_PER_CONNECTION", default_value_t = Limits::default().max_inflight_bytes_per_connection)]
    max_inflight_bytes_per_connection: usize,
    /// Bytes of partly received request messages buffered over all
    /// connections.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_INFLIGHT_BYTES", default_value_t = Limits::default().max_inflight_bytes)]
    max_inflight_bytes: usize,
    /// Connections at once; at the limit the server stops accepting until
    /// one closes. Keep it below the file-descriptor limit (ulimit -n).
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// Connections at once from one client address; beyond, its new
    /// connections are closed at accept.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = Limits::default().max_connections_per_address)]
    max_connections_per_address: usize,
    /// Connections one identity (certificate subject or token identity)
    /// may hold: a connection is the identity's its first identified call
    /// was made as (default: a quarter of --max-connections; 0: all of
    /// them). With --acl, a connection none of whose calls is identified
    /// is closed --first-request-timeout after it was accepted.
    #[arg(
        help_heading = "Connections and sessions",
        long,
        env = "BAGEL_MAX_CONNECTIONS_PER_IDENTITY"
    )]
    max_connections_per_identity: Option<usize>,
    /// Close a connection that has not begun a call (nor finished its TLS
    /// handshake) this long after it was accepted (0: only --idle-timeout).
    /// With --acl only a call the policy identifies begins a connection.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_FIRST_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    first_request_timeout: Duration,
    /// Close a connection with no call in flight for this long (0: never).
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// Bytes of unary answers made and not yet read by its client that one
    /// connection may hold; beyond, its new calls are refused
    /// (RESOURCE_EXHAUSTED) until it reads them.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_UNREAD_ANSWER_BYTES_PER_CONNECTION", default_value_t = Limits::default().max_unread_answer_bytes_per_connection)]
    max_unread_answer_bytes_per_connection: usize,
    /// ... and all connections together; beyond, every connection holding
    /// unread answers has its new calls refused (clients that read are not).
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_UNREAD_ANSWER_BYTES", default_value_t = Limits::default().max_unread_answer_bytes)]
    max_unread_answer_bytes: usize,
    /// ... and one identity (certificate subject or token identity) over
    /// all its connections, so one tenant's unread answers cannot take the
    /// whole budget (default: a quarter of --max-unread-answer-bytes; 0:
    /// all of it). Callers are one identity without --acl or --client-ca,
    /// which has no share.
    #[arg(
        help_heading = "Connections and sessions",
        long,
        env = "BAGEL_MAX_UNREAD_ANSWER_BYTES_PER_IDENTITY"
    )]
    max_unread_answer_bytes_per_identity: Option<usize>,
    /// Close a connection that holds unread answers and takes next to
    /// nothing of them (under 1 KiB) for this long, freeing them (0: never).
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_ANSWER_STALL_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    answer_stall_timeout: Duration,
    /// Ping each connection this often (HTTP/2 keepalive; 0: never) ...
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    keepalive_interval: Duration,
    /// ... and drop it if the answer takes longer than this.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    keepalive_timeout: Duration,
    /// Session streams open at once.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_MAX_SESSIONS", default_value_t = Limits::default().max_sessions)]
    max_sessions: usize,
    /// Sessions one identity (certificate subject or token identity) may
    /// hold, so one tenant cannot take them all (default: a quarter of
    /// --max-sessions; 0: all of them). Callers are one identity without
    /// --acl or --client-ca, which has no share.
    #[arg(
        help_heading = "Connections and sessions",
        long,
        env = "BAGEL_MAX_SESSIONS_PER_IDENTITY"
    )]
    max_sessions_per_identity: Option<usize>,
    /// Bytes of answers buffered towards one session's reader; beyond, the
    /// session stops reading requests.
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_SESSION_BUFFER_BYTES", default_value_t = Limits::default().session_buffer_bytes)]
    session_buffer_bytes: usize,
    /// A session whose reader takes no answer for this long while its
    /// buffer is full is closed (RESOURCE_EXHAUSTED).
    #[arg(help_heading = "Connections and sessions", long, env = "BAGEL_SESSION_STALL_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    session_stall_timeout: Duration,
    /// On SIGTERM/SIGINT: stop granting at once (health NOT_SERVING first),
    /// answer calls in flight, close sessions, and exit within this much
    /// time even if clients keep connections open.
    #[arg(help_heading = "Listening", long, env = "BAGEL_SHUTDOWN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// Acquires that may wait server-side for one name (served first come,
    /// first served). Each takes about 1 KiB while it waits.
    #[arg(help_heading = "Table and memory", long, env = "BAGEL_MAX_WAITERS_PER_NAME", default_value_t = Limits::default().max_waiters_per_name)]
    max_waiters_per_name: usize,
    /// Acquires that may wait server-side in all.
    #[arg(help_heading = "Table and memory", long, env = "BAGEL_MAX_WAITERS", default_value_t = Limits::default().max_waiters)]
    max_waiters: usize,
    /// Acquires of one identity (certificate subject or token identity)
    /// that may wait server-side, so one tenant cannot take them all
    /// (default: a quarter of --max-waiters; 0: all of them). Callers are
    /// one identity without --acl or --client-ca, which has no share.
    #[arg(
        help_heading = "Table and memory",
        long,
        env = "BAGEL_MAX_WAITERS_PER_IDENTITY"
    )]
    max_waiters_per_identity: Option<usize>,
    /// A Roughtime server (HOST:PORT) to take signed time from. Repeatable
    /// (tried in order); each needs a --roughtime-key, given in the same
    /// order. Without it this server signs its own clock (local time agent).
    #[arg(
        help_heading = "Signed time (Roughtime)",
        long = "roughtime",
        value_name = "HOST:PORT",
        env = "BAGEL_ROUGHTIME",
        value_delimiter = ','
    )]
    roughtime: Vec<String>,
    /// The long-term public key (hex or base64) of the Roughtime server at
    /// the same position. Repeatable.
    #[arg(
        help_heading = "Signed time (Roughtime)",
        long = "roughtime-key",
        value_name = "KEY",
        env = "BAGEL_ROUGHTIME_KEYS",
        value_delimiter = ','
    )]
    roughtime_key: Vec<String>,
    /// How often to ask Roughtime.
    #[arg(help_heading = "Signed time (Roughtime)", long, env = "BAGEL_ROUGHTIME_REFRESH", default_value = "1s", value_parser = humantime::parse_duration)]
    roughtime_refresh: Duration,
    /// How long to wait for a Roughtime answer before asking again (3
    /// attempts per server).
    #[arg(help_heading = "Signed time (Roughtime)", long, env = "BAGEL_ROUGHTIME_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    roughtime_timeout: Duration,
    /// Stop granting when the latest Roughtime answer is older than this.
    #[arg(help_heading = "Signed time (Roughtime)", long, env = "BAGEL_ROUGHTIME_MAX_AGE", default_value = "10s", value_parser = humantime::parse_duration)]
    roughtime_max_age: Duration,
    /// Serve TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(
        help_heading = "TLS and access",
        long,
        env = "BAGEL_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(
        help_heading = "TLS and access",
        long,
        env = "BAGEL_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Require client certificates that chain to this CA (PEM): mutual TLS.
    /// Each lease's owner is then the client certificate's subject (the
    /// request's owner field is ignored), and per-owner quotas key on it.
    #[arg(
        help_heading = "TLS and access",
        long,
        env = "BAGEL_CLIENT_CA",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    client_ca: Option<PathBuf>,
    /// Access policy (TOML): which identities (client certificate
    /// subjects, or bearer tokens stored hashed) may lease or read which
    /// name prefixes; everything else is refused. Reloaded on SIGHUP and
    /// when the file changes; a file that does not parse keeps the policy
    /// in effect. Without it callers are anonymous and may do anything.
    /// See docs/security.md, "Permissions".
    #[arg(help_heading = "TLS and access", long, env = "BAGEL_ACL", value_name = "FILE")]
    acl: Option<PathBuf>,
    /// TESTS ONLY: pretend this host's clock is off by DUR (e.g. `20s`,
    /// `-20s`), to show that a server with a wrong clock refuses to grant.
    /// Never use it otherwise.
    #[arg(long, hide = true, value_name = "DUR", allow_hyphen_values = true, value_parser = parse_offset)]
    unsafe_clock_offset: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr in `format`, at the level RUST_LOG says (info by
/// default).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // Colours only on a terminal: escape codes in a log file are noise.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One JSON object per line; the event's fields at the top level, so
        // a collector can index `names`, `holder`, `code` directly.
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
}

/// A signed duration in microseconds: `20s`, `-1500ms`.
fn parse_offset(text: &str) -> Result<i64, String> {
    let (sign, rest) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let d = humantime::parse_duration(rest).map_err(|e| e.to_string())?;
    i64::try_from(d.as_micros())
        .map(|us| sign * us)
        .map_err(|_| "offset too large".to_owned())
}

/// The server's key, from the file every side keeps its key in the same
/// way ([`bagel_proto::key_file`]).
fn load_or_create_key(path: &Path) -> anyhow::Result<Signer> {
    let (signer, created) = bagel_proto::key_file::load_or_create(path)
        .with_context(|| format!("loading or creating the key {}", path.display()))?;
    if created {
        tracing::info!(path = %path.display(), "generated a new signing key");
    }
    Ok(signer)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutting down");
}

/// mimalloc: the server makes many small short-lived allocations per
/// request (protobuf messages, HTTP/2 frames, witness bodies); with glibc
/// malloc they took about a third of the server's CPU under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.man {
        use clap::CommandFactory as _;
        let mut roff = Vec::new();
        clap_mangen::Man::new(Args::command()).render(&mut roff)?;
        std::io::Write::write_all(&mut std::io::stdout(), &roff)?;
        return Ok(());
    }
    init_logging(args.log_format);

    let signer = match &args.key {
        Some(path) => load_or_create_key(path)?,
        None => Signer::generate(),
    };
    let mut limits = Limits::default();
    limits.max_names_per_request = args.max_names;
    limits.max_metadata_bytes = args.max_metadata_bytes;
    limits.max_name_bytes = args.max_name_bytes;
    limits.max_owner_bytes = args.max_owner_bytes;
    limits.max_batch_ops = args.max_batch_ops;
    limits.max_waiters_per_name = args.max_waiters_per_name;
    limits.max_waiters = args.max_waiters;
    limits.max_waiters_per_identity = args.max_waiters_per_identity;
    limits.max_held_names = args.max_held_names;
    limits.max_held_names_per_owner = args.max_held_names_per_owner;
    limits.max_held_names_per_peer = args.max_held_names_per_peer;
    limits.max_message_bytes = args.max_message_bytes;
    limits.max_streams_per_connection = args.max_streams_per_connection;
    limits.max_inflight_bytes_per_connection = args.max_inflight_bytes_per_connection;
    limits.max_inflight_bytes = args.max_inflight_bytes;
    limits.max_connections = args.max_connections;
    limits.max_connections_per_address = args.max_connections_per_address;
    limits.max_connections_per_identity = args.max_connections_per_identity;
    limits.first_request_timeout = args.first_request_timeout;
    limits.idle_timeout = args.idle_timeout;
    limits.max_unread_answer_bytes_per_connection = args.max_unread_answer_bytes_per_connection;
    limits.max_unread_answer_bytes = args.max_unread_answer_bytes;
    limits.max_unread_answer_bytes_per_identity = args.max_unread_answer_bytes_per_identity;
    limits.answer_stall_timeout = args.answer_stall_timeout;
    limits.keepalive_interval = args.keepalive_interval;
    limits.keepalive_timeout = args.keepalive_timeout;
    limits.max_sessions = args.max_sessions;
    limits.max_sessions_per_identity = args.max_sessions_per_identity;
    limits.session_buffer_bytes = args.session_buffer_bytes;
    limits.session_stall_timeout = args.session_stall_timeout;
    limits.shutdown_grace = args.shutdown_grace;
    let mut cfg = Config::default()
        .with_listen(args.listen)
        .with_max_ttl(args.max_ttl)
        .with_min_ttl(args.min_ttl)
        .with_max_wait(args.max_wait)
        .with_clock_tolerance(args.clock_tolerance)
        .with_unsafe_skip_restart_wait(args.unsafe_skip_restart_wait)
        .with_shards(args.shards)
        .with_max_records(args.max_records)
        .with_history(args.history_per_name, args.history_budget_bytes)
        .with_watch(bagel_server::watch::WatchConfig {
            buffer: args.watch_buffer,
            retain: args.watch_retain,
            retain_bytes: args.watch_retain_bytes,
            stall: args.watch_stall_timeout,
            max_watchers: args.max_watchers,
            max_watchers_per_identity: args.max_watchers_per_identity,
            ..Default::default()
        })
        .with_list_max_page(args.list_max_page)
        .with_list_pages(args.list_pages)
        .with_list_queue_per_identity(args.max_queued_lists_per_identity)
        .with_list_share_while_granting(args.list_share_while_granting)
        .with_limits(limits)
        .with_http_limits(
            SidePortLimits::default()
                .with_max_connections(args.http_max_connections)
                .with_header_timeout(args.http_header_timeout)
                .with_idle_timeout(args.http_idle_timeout)
                .with_max_header_bytes(usize::try_from(args.http_max_header_bytes).unwrap_or(usize::MAX))
                .with_reserved_fds(args.http_reserved_fds)
                .with_shutdown_grace(args.shutdown_grace),
        )
        .with_status_interval(args.status_interval);
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let client_ca = args.client_ca.as_ref().map(read).transpose()?;
        cfg = cfg.with_tls(Some(bagel_server::config::TlsConfig::new(
            read(cert)?,
            read(key)?,
            client_ca,
        )));
    }
    cfg = cfg.with_acl(args.acl.clone());
    if args.acl.is_some() && args.tls_cert.is_none() {
        tracing::warn!("--acl without --tls-cert: callers' bearer tokens cross the network in the clear");
    }
    if args.acl.is_some() && args.http.is_some_and(|a| !a.ip().is_loopback()) {
        tracing::warn!(
            "--acl does not cover the HTTP side port (--http): its status page and /holders show \
             every name to whoever reaches it; bind it to 127.0.0.1 or a management network"
        );
    }
    // The granted-until mark lives beside the key file: a server with a
    // key of its own is the one whose restarts must not overlap.
    cfg = cfg.with_granted_until_file(args.key.as_deref().map(bagel_server::highwater::path_for_key));
    let configured_id = args.server_id.is_some();
    if let Some(id) = args.server_id {
        cfg = cfg.with_server_id(id);
    }
    let mut member_lists = Vec::new();
    for (flag, list) in [
        ("--members", &args.members),
        ("--next-members", &args.next_members),
    ] {
        if let Some(list) = list {
            let ids = bagel_proto::routing::parse_member_list(list)
                .map_err(|e| anyhow::anyhow!("invalid {flag}: {e}"))?;
            member_lists.push(ids);
        }
    }
    cfg = cfg
        .with_members(member_lists)
        .with_members_file(args.members_file);
    let roughtime = RoughtimeServer::pair(&args.roughtime, &args.roughtime_key)
        .map_err(|reason| anyhow::anyhow!("invalid Roughtime configuration: {reason}"))?;
    cfg = cfg
        .with_roughtime(roughtime)
        .with_roughtime_refresh(args.roughtime_refresh)
        .with_roughtime_query(QueryConfig::default().with_timeout(args.roughtime_timeout))
        .with_roughtime_max_age(args.roughtime_max_age);
    if let Err(reason) = cfg.validate() {
        bail!("invalid configuration: {reason}");
    }
    if cfg.unsafe_skip_restart_wait {
        tracing::warn!(
            "UNSAFE: --unsafe-skip-restart-wait is set. This server grants at once, although \
             leases granted by a previous incarnation may still be live: two holders may \
             overlap. Never use this in production."
        );
    }

    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    if !configured_id {
        cfg = cfg.with_server_id(default_server_id(args.key.is_some(), &signer, addr.port()));
    }
    let server_id = cfg.server_id.clone();
    let tls = cfg.tls.as_ref().map(|t| t.client_ca_pem.is_some());
    let clock: Arc<dyn Clock> = match args.unsafe_clock_offset {
        None => Arc::new(SystemClock),
        Some(offset_us) => {
            tracing::warn!(
                offset_us,
                "UNSAFE, TESTS ONLY: --unsafe-clock-offset makes this server's clock wrong on purpose"
            );
            Arc::new(OffsetClock {
                inner: SystemClock,
                offset_us,
            })
        }
    };
    let mut server = Server::new(cfg, signer.clone(), clock)?;
    let http = match args.http {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the HTTP port {addr}"))?;
            let bound = listener.local_addr()?;
            server = server.with_http(listener);
            Some(bound)
        }
        None => None,
    };
    // Ask Roughtime once before announcing the address, so that a server
    // whose time authority answers can grant as soon as it says it listens.
    if let Some(verdict) = server.init_time().await {
        if verdict.is_healthy() {
            tracing::info!("{verdict}");
        } else {
            tracing::error!("not granting until the clock is right: {verdict}");
        }
    }
    // Printed on stdout, one line each, for scripts and tests.
    println!(
        "public key {} (key id {})",
        bagel_proto::hex::encode(signer.verifying_key().as_bytes()),
        signer.key_id()
    );
    // Before the "listening" line, which scripts and tests wait for.
    if let Some(http) = http {
        println!("http on {http}: status page http://{http}/, metrics http://{http}/metrics");
    }
    println!(
        "bagel-server {server_id} listening on {addr}, ready at {}{}",
        server.ready_at(),
        match tls {
            None => "",
            Some(false) => ", TLS",
            Some(true) => ", TLS with client certificates",
        }
    );
    server.serve(listener, shutdown_signal()).await?;
    Ok(())
}

/// The identity of a server started without `--server-id`: one that
/// survives its restarts, since cluster clients route names by it. With a
/// key file, the key's id (the member keeps it wherever the file goes);
/// without one, the host name and the port it listens on (a keyless
/// restart at the same address keeps it).
fn default_server_id(durable_key: bool, signer: &bagel_proto::Signer, port: u16) -> String {
    if durable_key {
        return format!("key-{}", signer.key_id());
    }
    let uname = rustix::system::uname();
    let host = uname.nodename().to_string_lossy();
    let host = if host.is_empty() { "localhost".into() } else { host };
    format!("{host}:{port}")
}
