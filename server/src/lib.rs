//! bagel's lease server: a sharded, in-RAM gRPC lease service that grants
//! leases on named domains with absolute deadlines, hands each new holder
//! the previous holder's watermark, and signs a witness for every grant.
//!
//! # Layout
//! * [`table`]: the pure lease table. Every lease rule lives here; methods
//!   take `now` as an argument, so tests drive time exactly.
//! * `grpc`: the gRPC service, a thin edge: takes each call's message
//!   and caller, runs its handler, meters the outcome, and only then makes
//!   the domain error a status.
//! * `service`: the handlers, converting messages to the table
//!   (`validate`) and grants to signed witnesses ([`witness`]); they answer
//!   with [`Error`]. `session`: the `Session` stream over `Batch`.
//! * [`timekeeper`]: the server clock, its health (Roughtime) and its
//!   signed readings.
//! * [`config`]: settings and defaults.
//! * [`error`]: the one error type, naming each failure (no gRPC in it);
//!   `grpc_status`: its gRPC code and status (with details), at the edge.
//! * `meter`: what the gRPC edge counts and times; `refusal`: the log
//!   line of every refused call or operation.
//! * `http`: the optional HTTP side port (`/metrics`, a status page,
//!   `/healthz`, `/readyz`), see [`Server::with_http`].
//!
//! [`Server::serve`] runs it on a bound listener until a shutdown future
//! resolves; the binary passes Ctrl-C/SIGTERM. With Roughtime configured,
//! [`Server::init_time`] asks Roughtime once before serving, so a server
//! with a working time authority grants as soon as it is ready.

mod acl;
pub mod config;
pub mod error;
mod grpc;
mod grpc_status;
pub mod highwater;
mod holder_keys;
mod http;
mod members;
mod meter;
mod refusal;
mod reload;
mod service;
mod session;
mod shares;
pub mod table;
pub mod timekeeper;
pub mod transport;
mod validate;
pub mod watch;
pub mod witness;

use std::future::Future;
use std::sync::Arc;

use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, Micros, Signer, pb};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{Config, Limits};
pub use error::Error;

use highwater::HighWater;
use service::{Inner, Service};
use table::{LeaseTable, TableConfig};
use timekeeper::TimeKeeper;
use witness::WitnessSigner;

type LeaseServer = pb::lease_service_server::LeaseServiceServer<grpc::GrpcService>;

/// HTTP/2 receive windows: what a client may send that the server has not
/// read yet, per connection and per stream.
pub const CONNECTION_WINDOW: u32 = 512 << 10;
pub const STREAM_WINDOW: u32 = 256 << 10;

/// A lease server, ready to serve.
#[derive(Debug)]
pub struct Server {
    service: Service,
    /// Where to serve the HTTP side port, if anywhere.
    http: Option<TcpListener>,
}

impl Server {
    /// Builds a server that started at `clock.now()`: it refuses grants until
    /// the restart wait is over (unless told to skip it).
    pub fn new(cfg: Config, signer: Signer, clock: Arc<dyn Clock>) -> Result<Self, Error> {
        cfg.validate()
            .map_err(|reason| Error::invalid("config", reason))?;
        let started = clock.now();
        let found = highwater::load(cfg.granted_until_file.as_deref());
        let mark = match &found {
            highwater::Found::Mark(mark) => *mark,
            _ => Micros::ZERO,
        };
        let (ready_at, initial_floor) = if cfg.unsafe_skip_restart_wait {
            // Assume no previous incarnation existed: nothing to inherit.
            (started, Micros::ZERO)
        } else {
            // A previous incarnation may have granted deadlines up to the
            // mark it wrote, or, if we cannot know it, `max_ttl` past our
            // start (by its clock, which may have run up to the tolerance
            // ahead of ours); writes under them are below the instant we
            // start granting, which is the floor of watermarks and fencing
            // tokens. The mark covers a smaller --max-ttl this time and a
            // clock stepped back since.
            let ready_at =
                bagel_lease_core::chain::restart_ready_at(started, mark, cfg.max_ttl, cfg.clock_tolerance);
            log_mark(&found, &cfg, started, ready_at);
            (ready_at, ready_at)
        };
        let table = LeaseTable::new(TableConfig {
            shards: cfg.shards,
            min_ttl: cfg.min_ttl,
            max_ttl: cfg.max_ttl,
            started,
            ready_at,
            initial_floor,
            max_records: cfg.max_records,
            history_per_name: cfg.history_per_name,
            history_budget_bytes: cfg.history_budget_bytes,
            max_waiters_per_name: cfg.limits.max_waiters_per_name,
            max_waiters: cfg.limits.max_waiters,
            held: table::HeldLimits {
                total: cfg.limits.max_held_names,
                per_owner: cfg.limits.max_held_names_per_owner,
                per_peer: cfg.limits.max_held_names_per_peer,
            },
            watch: cfg.watch,
            incarnation: watch::incarnation(&cfg.server_id, started),
        });
        let highwater = HighWater::new(
            cfg.granted_until_file.clone(),
            mark,
            cfg.max_ttl,
            cfg.granted_until_step,
        );
        table.set_grant_limit(mark);
        let limits = cfg.limits;
        let frames = Arc::new(
            transport::layer::FrameLimits::new(
                limits.max_message_bytes,
                limits.max_inflight_bytes_per_connection,
                limits.max_inflight_bytes,
                limits.max_names_per_request,
                limits.max_batch_ops,
            )
            .with_batch_answer(transport::answers::BatchBound::new(
                limits.max_name_bytes,
                limits.max_owner_bytes,
            ))
            .with_answers(transport::answers::AnswerBudget::new(
                limits.max_unread_answer_bytes_per_connection,
                limits.unread_answer_bytes_share(),
                limits.max_unread_answer_bytes,
                limits.answer_stall_timeout,
            )),
        );
        let conn_slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
        let list_pages = cfg.list_pages.max(1);
        let list_queue = cfg.list_queue_per_identity;
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let time = TimeKeeper::new(clock, signer.clone(), &cfg);
        let witness = WitnessSigner::new(signer, cfg.server_id.clone(), started);
        let acl = acl::start(cfg.acl.as_deref())?;
        let shares = shares::Shares::new(&cfg);
        let membership = match &cfg.members_file {
            Some(path) => members::Members::from_file(&cfg.server_id, path),
            None => cfg.membership().map(members::Members::fixed),
        }
        .map_err(|reason| Error::invalid("config", reason))?;
        Ok(Server {
            service: Service {
                inner: Arc::new(Inner {
                    cfg,
                    table,
                    time,
                    witness: Arc::new(witness),
                    keys,
                    meters: Default::default(),
                    highwater,
                    last_cover: std::sync::atomic::AtomicU64::new(0),
                    list_paused_micros: std::sync::atomic::AtomicU64::new(0),
                    holder_keys: crate::holder_keys::HolderKeys::default(),
                    stopping: CancellationToken::new(),
                    sessions: Default::default(),
                    sessions_dropped: Default::default(),
                    shares,
                    frames,
                    conn_slots,
                    list_turns: service::list_turns::ListTurns::new(list_pages, list_queue),
                    readers: service::readers::Readers::start(list_pages),
                    light: service::light_lane::LightLane::start(),
                    acl,
                    membership: Arc::new(membership),
                }),
            },
            http: None,
        })
    }

    pub fn started(&self) -> Micros {
        self.service.inner.table.config().started
    }

    pub fn ready_at(&self) -> Micros {
        self.service.inner.table.config().ready_at
    }

    /// With Roughtime configured: asks it once (with retries) and returns
    /// the verdict on this server's clock, so the caller can log it before
    /// serving. Without Roughtime: `None`. Grants are refused until a
    /// Roughtime answer says the clock is right, whether or not this is
    /// called; [`Server::serve`] keeps asking in the background.
    pub async fn init_time(&self) -> Option<bagel_proto::authority::monitor::Verdict> {
        self.service.inner.time.refresh_roughtime().await
    }

    /// Also serves the HTTP side port (metrics, status page, health) on
    /// `listener`, as long as the gRPC service runs.
    #[must_use]
    pub fn with_http(mut self, listener: TcpListener) -> Self {
        self.http = Some(listener);
        self
    }

    /// The granted-until mark as the file holds it.
    pub fn granted_until(&self) -> Micros {
        self.service.inner.highwater.get()
    }

    /// The clock status `ServerInfo` reports.
    pub fn clock_status(&self) -> pb::ClockStatus {
        self.service.inner.time.status()
    }

    /// The HTTP/2 settings every connection gets. Each bounds what one
    /// connection can make the server hold: streams (each a task and its
    /// buffers), flow-control windows (bytes received but not yet read:
    /// 512 KiB per connection, 256 KiB per stream), frame and header sizes
    /// (16 KiB).
    fn builder(limits: &Limits) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(limits.max_streams_per_connection)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .initial_stream_window_size(STREAM_WINDOW)
            .http2_adaptive_window(Some(false))
            .max_frame_size(16 << 10)
            .http2_max_header_list_size(16 << 10)
            // Streams a client opens and resets before we accept them
            // (rapid reset).
            .http2_max_pending_accept_reset_streams(Some(64))
            .http2_keepalive_interval(Some(limits.keepalive_interval).filter(|d| !d.is_zero()))
            .http2_keepalive_timeout(Some(limits.keepalive_timeout))
            .tcp_nodelay(true)
            .accept_http1(false)
    }

    /// Serves gRPC on `listener` until `shutdown` resolves, then stops
    /// accepting, lets in-flight requests finish, and stops the background
    /// tasks.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), std::io::Error> {
        let (health, health_service) = tonic_health::server::health_reporter();
        background::set_health(&health, false).await;
        // Reflection lists (and describes) every service served here: the
        // lease service, health and reflection itself (the builder adds
        // its own). The older protocol too: grpcio-reflection (Python) and
        // other tools still ask `grpc.reflection.v1alpha` only.
        let reflection = reflection_builder().build_v1().map_err(std::io::Error::other)?;
        let reflection_v1alpha = reflection_builder()
            .build_v1alpha()
            .map_err(std::io::Error::other)?;

        let cancel = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        if let Some(listener) = self.http {
            let state = http::Http::new(Arc::clone(&self.service.inner), &health);
            tasks.spawn(http::sample(Arc::clone(&state), cancel.clone()));
            tasks.spawn(http::serve(listener, state, cancel.clone()));
        }
        tasks.spawn(background::mark_ready(
            Arc::clone(&self.service.inner),
            health.clone(),
            cancel.clone(),
        ));
        if self.service.inner.time.uses_roughtime() {
            tasks.spawn(background::refresh_roughtime(
                Arc::clone(&self.service.inner),
                cancel.clone(),
            ));
        } else {
            tasks.spawn(background::refresh_signed_time(
                Arc::clone(&self.service.inner),
                cancel.clone(),
            ));
        }
        tasks.spawn(background::sweep(Arc::clone(&self.service.inner), cancel.clone()));
        if let Some(acl) = &self.service.inner.acl {
            tasks.spawn(reload::watch(
                Arc::clone(acl),
                "access policy",
                reload::POLL,
                cancel.clone(),
            ));
        }
        if self.service.inner.membership.reloads() {
            tasks.spawn(reload::watch(
                Arc::clone(&self.service.inner.membership),
                "member lists",
                reload::POLL,
                cancel.clone(),
            ));
        }
        tasks.spawn(background::watch_tick(
            Arc::clone(&self.service.inner),
            cancel.clone(),
        ));
        tasks.spawn(background::keep_mark_ahead(
            Arc::clone(&self.service.inner),
            cancel.clone(),
        ));

        let limits = self.service.inner.cfg.limits;
        let incoming = transport::accept(
            listener,
            transport::AcceptConfig {
                slots: Arc::clone(&self.service.inner.conn_slots),
                per_address: transport::PerAddress::new(limits.max_connections_per_address),
                idle_timeout: limits.idle_timeout,
                first_request_timeout: limits.first_request_timeout,
                answers: Arc::clone(&self.service.inner.frames.answers),
                must_identify: self.service.inner.acl.is_some(),
            },
            cancel.clone(),
        );
        let frames = Arc::clone(&self.service.inner.frames);
        let stopping = self.service.inner.stopping.clone();
        let tls = self.service.inner.cfg.tls.clone();
        let lease_service = LeaseServer::new(grpc::GrpcService(self.service))
            // The layer refuses larger messages first, naming the limit;
            // this is a backstop.
            .max_decoding_message_size(limits.max_message_bytes.saturating_add(1));
        // On the signal: health NOT_SERVING first (load balancers stop
        // sending), then no more grants, waits end, sessions close after
        // the answers already made; then tonic stops accepting and sends
        // GOAWAY, and in-flight calls are answered.
        let signal = {
            let stopping = stopping.clone();
            async move {
                shutdown.await;
                tracing::info!(
                    "shutting down: no more grants; answering calls in flight for up to {:?}",
                    limits.shutdown_grace
                );
                background::set_health(&health, false).await;
                stopping.cancel();
            }
        };
        let mut builder = Self::builder(&limits);
        if let Some(tls) = &tls {
            builder = builder
                .tls_config(tls_config(tls))
                .map_err(|e| std::io::Error::other(format!("TLS configuration: {e}")))?;
        }
        let serving = builder
            .layer(transport::layer::LimitLayer::new(frames))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(lease_service)
            .serve_with_incoming_shutdown(incoming, signal);
        // tonic waits for every connection to close, which a client can
        // put off forever (a health Watch, a session it keeps open): after
        // the grace, stop anyway.
        let grace_over = async {
            stopping.cancelled().await;
            tokio::time::sleep(limits.shutdown_grace).await;
        };
        let result = tokio::select! {
            r = serving => r,
            () = grace_over => {
                tracing::warn!(
                    "connections still open after the shutdown grace ({:?}): stopping anyway",
                    limits.shutdown_grace
                );
                Ok(())
            }
        };
        cancel.cancel();
        while tasks.join_next().await.is_some() {}
        result.map_err(std::io::Error::other)
    }
}

/// TLS through tonic (rustls with ring). A client certificate, when a
/// client CA is given, must chain to it; the handshake must end within
/// 10 s (a connection that never finishes it also meets the idle timeout).
/// A reflection builder that knows the descriptors of every service the
/// lease port serves, so that either reflection version lists them all:
/// without health's, a client listing services would not see
/// `grpc.health.v1.Health`; left to itself, each version would list only
/// its own reflection service, not the other.
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

fn tls_config(tls: &config::TlsConfig) -> tonic::transport::ServerTlsConfig {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    // rustls needs a process-wide crypto provider when more than one is
    // compiled in (object_store's aws-lc-rs joins ring in a workspace
    // build); ours is ring, unless the embedding program chose already.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut cfg = ServerTlsConfig::new()
        .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
        .timeout(std::time::Duration::from_secs(10));
    if let Some(ca) = &tls.client_ca_pem {
        cfg = cfg.client_ca_root(Certificate::from_pem(ca));
    }
    cfg
}

/// Says, at start, what the restart wait is based on; loudly when it could
/// not read the granted-until mark.
fn log_mark(found: &highwater::Found, cfg: &Config, started: Micros, ready_at: Micros) {
    use highwater::Found;
    let wait = ready_at.duration_since(started);
    match found {
        Found::Mark(mark) => tracing::info!(
            %mark, %ready_at,
            "granted-until mark found: refusing grants for {wait:?}, until the mark \
             (or start + max TTL) plus the clock tolerance"
        ),
        Found::Missing(path) => tracing::warn!(
            path = %path.display(), %ready_at,
            "no granted-until mark: waiting the configured max TTL ({:?}) plus the clock \
             tolerance. If a previous incarnation ran with a larger --max-ttl or a clock \
             ahead of this one, its leases may outlive this wait",
            cfg.max_ttl
        ),
        Found::Unreadable(path, reason) => tracing::error!(
            path = %path.display(), %reason, %ready_at,
            "granted-until mark UNREADABLE: waiting only the configured max TTL ({:?}) plus \
             the clock tolerance. If a previous incarnation ran with a larger --max-ttl or a \
             clock ahead of this one, its leases may outlive this wait",
            cfg.max_ttl
        ),
        Found::NoFile => tracing::warn!(
            %ready_at,
            "no key file, so no granted-until mark: a restart waits the configured max TTL \
             ({:?}); with a smaller --max-ttl or a clock stepped back it could overlap leases \
             of the previous incarnation. Give --key to keep the mark beside it",
            cfg.max_ttl
        ),
    }
}

/// Background tasks, each stopped by the server's cancellation token.
mod background {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::{Inner, LeaseServer};

    /// Flips the lease service's health to SERVING when the restart wait
    /// is over and the clock is healthy (always, without Roughtime), and
    /// back to NOT_SERVING while the clock is not, so load balancers and
    /// tests can wait on health.
    pub async fn mark_ready(
        inner: Arc<Inner>,
        health: tonic_health::server::HealthReporter,
        cancel: CancellationToken,
    ) {
        let ready_at = inner.table.config().ready_at;
        let wait = ready_at.duration_since(inner.time.now());
        if !wait.is_zero() {
            tracing::info!(%ready_at, "restart wait: refusing grants for {:?}", wait);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = cancel.cancelled() => return,
                () = inner.stopping.cancelled() => return,
            }
        }
        let mut clock_ok = inner.time.watch_health();
        loop {
            if *clock_ok.borrow_and_update() {
                set_health(&health, true).await;
                tracing::info!("ready: granting leases");
            } else {
                set_health(&health, false).await;
                tracing::warn!("clock unhealthy: not granting leases");
            }
            tokio::select! {
                changed = clock_ok.changed() => if changed.is_err() { return },
                () = cancel.cancelled() => return,
                // Stopping: health stays NOT_SERVING.
                () = inner.stopping.cancelled() => return,
            }
        }
    }

    /// Sets the lease service's health and the overall entry `""` alike:
    /// load balancers probe `""`, and a server that refuses grants (restart
    /// wait, bad clock, shutting down) must not look healthy there.
    pub async fn set_health(health: &tonic_health::server::HealthReporter, serving: bool) {
        use tonic_health::ServingStatus;
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        health.set_service_status("", status).await;
        if serving {
            health.set_serving::<LeaseServer>().await;
        } else {
            health.set_not_serving::<LeaseServer>().await;
        }
    }

    /// Asks Roughtime every `roughtime_refresh`. A query that times out
    /// delays the next one rather than piling up.
    pub async fn refresh_roughtime(inner: Arc<Inner>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(inner.cfg.roughtime_refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
            }
            tokio::select! {
                _ = inner.time.refresh_roughtime() => {}
                () = cancel.cancelled() => return,
            }
        }
    }

    pub async fn refresh_signed_time(inner: Arc<Inner>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(inner.cfg.signed_time_refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => inner.time.refresh(),
                () = cancel.cancelled() => return,
            }
        }
    }

    /// Raises the granted-until mark before grants need it, while grants
    /// are being made (an idle server does not write every second).
    pub async fn keep_mark_ahead(inner: Arc<Inner>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(inner.cfg.granted_until_step / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
            }
            if !inner.granting_recently() {
                continue;
            }
            if let Err(e) = inner.highwater.keep_ahead(inner.time.now()).await {
                tracing::error!("{e}");
            } else {
                inner.table.raise_grant_limit(inner.highwater.get());
            }
        }
    }

    /// Reports expiries to watchers (a lease's deadline passes without a
    /// request; the table decides each under its names' locks) and lets the
    /// watch hub go idle when nobody watches. Every 50 ms, so an expiry is
    /// reported within about that of its deadline; a relaxed load when the
    /// hub is idle.
    pub async fn watch_tick(inner: Arc<Inner>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
            }
            if inner.table.watch_hub().active() {
                // On a blocking thread: a mass expiry (bounded per tick,
                // see `LeaseTable::watch_tick`) is no async worker's.
                let inner = Arc::clone(&inner);
                let _ = tokio::task::spawn_blocking(move || {
                    inner.table.watch_tick(inner.time.now());
                })
                .await;
            }
        }
    }

    pub async fn sweep(inner: Arc<Inner>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(inner.cfg.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
            }
            let forgotten = inner.table.sweep(inner.time.now());
            if forgotten > 0 {
                tracing::info!(
                    forgotten,
                    floor = %inner.table.forgotten_floor(),
                    "forgot idle name records over the record budget"
                );
            }
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
