//! Asking Roughtime servers for signed time, over a tokio UDP socket, with
//! our own timeout, retries and nonce chaining (see
//! [`crate::signed_time::roughtime`] for why not `roughenough-client`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore as _;
use roughenough_protocol::request::{MAX_RESPONSE_SIZE, Request};
use roughenough_protocol::tags::{Nonce, SrvCommitment};
use roughenough_protocol::wire::ToFrame as _;

use super::monitor::Measurement;
use crate::clock::Clock;
use crate::signed_time::roughtime::{
    RESOLUTION, RoughtimeKey, RoughtimeServer, chained_nonce, verify_roughtime,
};
use crate::{Error, pb};

/// How patiently a [`Querier`] asks.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct QueryConfig {
    /// How long to wait for an answer before sending the request again.
    pub timeout: Duration,
    /// Sends per server before giving up on it (UDP answers can be lost).
    pub attempts: u32,
}

impl Default for QueryConfig {
    fn default() -> Self {
        QueryConfig {
            timeout: Duration::from_secs(1),
            attempts: 3,
        }
    }
}

impl QueryConfig {
    /// Sets [`QueryConfig::timeout`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`QueryConfig::attempts`] (at least 1).
    #[must_use]
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }
}

/// Why a query got no usable answer. Every variant but `NoServers` and
/// `Invalid` may pass on a later query (a lost packet, a server
/// restarting); an `Invalid` answer means a server to stop trusting.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The querier was built with an empty server list: a configuration
    /// error, never transient.
    #[error("no Roughtime server is configured")]
    NoServers,
    /// The server's address did not resolve, or the socket failed.
    #[error("roughtime {server}: {reason}")]
    Io {
        /// The server's address as configured.
        server: String,
        /// The resolver's or socket's error.
        reason: String,
    },
    /// Every send timed out (UDP gives no other sign of a dead server).
    #[error("roughtime {server}: no answer after {attempts} attempt(s) of {timeout:?} each")]
    NoAnswer {
        /// The server's address as configured.
        server: String,
        /// Sends made, each [`QueryConfig::attempts`].
        attempts: u32,
        /// How long each send waited, [`QueryConfig::timeout`].
        timeout: Duration,
    },
    /// An answer came but fails verification with the server's key.
    #[error("roughtime {server}: the answer does not verify: {error}")]
    Invalid {
        /// The server's address as configured.
        server: String,
        /// Which check failed.
        error: Error,
    },
    /// Each configured server failed; one error per server, in order.
    #[error("every Roughtime server failed: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    AllFailed(Vec<QueryError>),
}

/// Asks Roughtime servers for signed time and measures the local clock
/// against it. Cheap to share (`Arc`); queries may run concurrently.
#[derive(Debug)]
pub struct Querier {
    servers: Vec<RoughtimeServer>,
    clock: Arc<dyn Clock>,
    cfg: QueryConfig,
    /// The last response received, for nonce chaining. A std mutex, held
    /// only to copy or replace the bytes, never across `.await`.
    chain: Mutex<Vec<u8>>,
}

impl Querier {
    /// `clock` is the local clock being checked (inject an offset clock to
    /// test a host whose clock is wrong).
    pub fn new(servers: Vec<RoughtimeServer>, clock: Arc<dyn Clock>) -> Self {
        Querier {
            servers,
            clock,
            cfg: QueryConfig::default(),
            chain: Mutex::new(Vec::new()),
        }
    }

    /// Asks with `cfg`'s timeout and attempts instead of the defaults
    /// (1 s, 3 sends per server).
    #[must_use]
    pub fn with_config(mut self, cfg: QueryConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// The servers, in the order they are asked.
    pub fn servers(&self) -> &[RoughtimeServer] {
        &self.servers
    }

    /// The keys of the configured servers: the ones proofs are checked
    /// against.
    pub fn trusted_keys(&self) -> Vec<RoughtimeKey> {
        self.servers.iter().map(|s| s.key).collect()
    }

    /// The local clock each measurement reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Asks the servers in order until one gives an answer that verifies
    /// with its key.
    pub async fn query(&self) -> Result<Measurement, QueryError> {
        let mut errors = Vec::new();
        for server in &self.servers {
            match self.query_server(server).await {
                Ok(m) => return Ok(m),
                Err(e) => {
                    tracing::debug!(error = %e, "roughtime query failed");
                    errors.push(e);
                }
            }
        }
        match errors.len() {
            0 => Err(QueryError::NoServers),
            1 => Err(errors.pop().expect("one error")),
            _ => Err(QueryError::AllFailed(errors)),
        }
    }

    /// One server: the same request is re-sent up to `attempts` times, each
    /// time waiting `timeout` for an answer. The round trip is measured from
    /// the *first* send, so an answer to an earlier send that arrives late
    /// overstates the RTT (and so the uncertainty), never understates it.
    pub async fn query_server(&self, server: &RoughtimeServer) -> Result<Measurement, QueryError> {
        let io = |reason: String| QueryError::Io {
            server: server.addr.clone(),
            reason,
        };
        let target: SocketAddr = tokio::net::lookup_host(&server.addr)
            .await
            .map_err(|e| io(format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| io("resolves to no address".into()))?;
        let local: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let socket = tokio::net::UdpSocket::bind(local)
            .await
            .map_err(|e| io(format!("bind: {e}")))?;
        socket
            .connect(target)
            .await
            .map_err(|e| io(format!("connect: {e}")))?;

        let mut blind = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut blind);
        let previous = self.chain.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let nonce = Nonce::from(chained_nonce(&previous, &blind));
        let srv = SrvCommitment::from(server.key.srv_commitment());
        let request = Request::new_with_server(&nonce, &srv)
            .as_frame_bytes()
            .map_err(|e| io(format!("encoding the request: {e}")))?;

        let sent_at = self.clock.now();
        let first_send = Instant::now();
        let mut buf = vec![0u8; MAX_RESPONSE_SIZE];
        let mut last_invalid = None;
        for _ in 0..self.cfg.attempts {
            socket
                .send(&request)
                .await
                .map_err(|e| io(format!("send: {e}")))?;
            let give_up = tokio::time::Instant::now() + self.cfg.timeout;
            loop {
                let n = match tokio::time::timeout_at(give_up, socket.recv(&mut buf)).await {
                    Err(_elapsed) => break,
                    // ICMP port unreachable surfaces as a recv error on a
                    // connected socket: the server is not (yet) there.
                    Ok(Err(e)) => {
                        last_invalid = Some(QueryError::Io {
                            server: server.addr.clone(),
                            reason: format!("receive: {e}"),
                        });
                        tokio::time::sleep_until(give_up).await;
                        break;
                    }
                    Ok(Ok(n)) => n,
                };
                let received = Instant::now();
                let received_at = self.clock.now();
                let proof = pb::RoughtimeProof {
                    request: request.clone(),
                    response: buf[..n].to_vec(),
                    public_key: server.key.as_bytes().to_vec(),
                    blind: blind.to_vec(),
                };
                match verify_roughtime(&proof, &[server.key]) {
                    Ok(exchange) => {
                        *self.chain.lock().unwrap_or_else(|e| e.into_inner()) = proof.response.clone();
                        return Ok(Measurement {
                            source: server.to_string(),
                            reading: exchange.reading(),
                            resolution: RESOLUTION,
                            signed: pb::SignedTime {
                                proof: Some(pb::signed_time::Proof::Roughtime(proof)),
                            },
                            sent_at,
                            rtt: received.duration_since(first_send),
                            received,
                            received_at,
                        });
                    }
                    // A corrupted or foreign datagram: keep listening.
                    Err(error) => {
                        last_invalid = Some(QueryError::Invalid {
                            server: server.addr.clone(),
                            error,
                        })
                    }
                }
            }
        }
        Err(last_invalid.unwrap_or(QueryError::NoAnswer {
            server: server.addr.clone(),
            attempts: self.cfg.attempts,
            timeout: self.cfg.timeout,
        }))
    }
}
