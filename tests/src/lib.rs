//! Helpers for the integration tests: start the real `bagel-server` binary
//! on a free 127.0.0.1 port, wait until it answers its health RPC, run the
//! real `bagel` CLI. Nothing here stands in for a real part.
//!
//! The binaries are found next to the test executable (`target/<profile>/`);
//! `tests/run.sh` builds them first. A missing binary fails the test with a
//! message saying so; it never skips.

mod bag_support;
mod lease_support;
mod liar_store;
mod nfs_env;

/// A lease client witness in its wire form (to verify it, or to flip its
/// bytes), as the CLI's JSON contract converts it.
pub fn wire(w: &bagel_client::Witness) -> bagel_proto::pb::Witness {
    bagel_cli::contract::WitnessJson::from(w)
        .to_pb()
        .expect("a witness the client holds converts")
}

pub use bag_support::*;
pub use lease_support::*;
pub use liar_store::*;
pub use nfs_env::*;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The directory holding the workspace binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Path of a workspace binary; panics (failing the test) if it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} not found: build the binaries first (`cargo build --workspace --bins`, which tests/run.sh does)",
        path.display()
    );
    path
}

/// A running `bagel-server` process, killed on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    pub url: String,
    /// The printed public key line (hex).
    pub public_key_hex: String,
}

impl ServerProcess {
    /// Starts the server with `--listen 127.0.0.1:0` plus `args`, and waits
    /// until it prints its address and answers a health check (which it
    /// does during the restart wait too; use [`ServerProcess::wait_ready`]
    /// for grants).
    pub async fn start(args: &[&str]) -> ServerProcess {
        let mut child = Command::new(bin("bagel-server"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn bagel-server");
        let stdout = child.stdout.take().expect("stdout piped");
        // Reading the two start-up lines blocks; do it off the runtime.
        let (addr, key) = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut key = String::new();
            for line in lines.by_ref() {
                let line = line.expect("read server stdout");
                if let Some(rest) = line.strip_prefix("public key ") {
                    key = rest.split_whitespace().next().unwrap_or_default().to_owned();
                }
                if let Some((_, rest)) = line.split_once(" listening on ") {
                    let addr: SocketAddr = rest.split(',').next().unwrap().parse().expect("address");
                    // Keep draining stdout so the server never blocks on it.
                    std::thread::spawn(move || for _ in lines {});
                    return (addr, key);
                }
            }
            panic!("bagel-server exited before printing its address");
        })
        .await
        .expect("reader task");
        let server = ServerProcess {
            child,
            addr,
            url: format!("http://{addr}"),
            public_key_hex: key,
        };
        server.wait_health("").await;
        server
    }

    /// Starts a server that grants at once (restart wait skipped).
    pub async fn start_ready(args: &[&str]) -> ServerProcess {
        let mut all = vec!["--unsafe-skip-restart-wait"];
        all.extend_from_slice(args);
        let server = ServerProcess::start(&all).await;
        server.wait_ready().await;
        server
    }

    /// Waits until the lease service reports SERVING (restart wait over).
    pub async fn wait_ready(&self) {
        self.wait_health("bagel.v1.LeaseService").await;
    }

    /// Polls the standard health RPC until `service` is SERVING. The server
    /// pushes status changes through `Watch`, so this waits on the event.
    async fn wait_health(&self, service: &str) {
        // The server printed its address after binding, so the first connect
        // normally succeeds; a refused one is retried briefly, not forever.
        let endpoint = tonic::transport::Endpoint::from_shared(self.url.clone()).expect("url");
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        let channel = loop {
            match endpoint.connect().await {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() >= give_up => {
                    panic!("cannot connect to {} within 10 s: {e}", self.url)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let mut health = HealthClient::new(channel);
        let req = tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        };
        let mut stream = health.watch(req).await.expect("health watch").into_inner();
        let watch = async {
            while let Some(msg) = stream.message().await.expect("health stream") {
                if msg.status() == ServingStatus::Serving {
                    return;
                }
            }
            panic!("health stream ended before {service:?} was serving");
        };
        tokio::time::timeout(Duration::from_secs(60), watch)
            .await
            .unwrap_or_else(|_| panic!("{service:?} not serving within 60 s"));
    }

    pub async fn client(&self) -> bagel_client::Client {
        bagel_client::Client::connect(self.url.clone())
            .await
            .expect("connect to bagel-server")
    }

    /// Runs the real `bagel` CLI against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        cli_with_stdin(&self.url, args, None)
    }

    pub fn cli_stdin(&self, args: &[&str], stdin: &str) -> Output {
        cli_with_stdin(&self.url, args, Some(stdin))
    }

    /// Stops the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn cli_with_stdin(url: &str, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(bin("bagel"))
        .args(["--server", url])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin piped")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("bagel output")
}

/// Runs the real `bagel` CLI with `args` only (no `--server`).
pub fn cli_no_server(args: &[&str]) -> Output {
    Command::new(bin("bagel"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("bagel output")
}

/// Text of a CLI output, for assertion messages.
pub fn describe_output(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The Roughtime server `tests/run.sh` started (roughenough-server 2.2 on
/// 127.0.0.1, a key made for the run), from `BAGEL_ROUGHTIME_ADDR` and
/// `BAGEL_ROUGHTIME_KEY`.
#[derive(Clone, Debug)]
pub struct Roughtime {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The long-term public key, hex.
    pub key_hex: String,
    pub key: bagel_proto::signed_time::roughtime::RoughtimeKey,
}

impl Roughtime {
    /// The test's Roughtime server. Panics (failing the test, never
    /// skipping it) when the environment does not name one.
    pub fn from_env() -> Roughtime {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!(
                    "{name} is not set: this test needs the Roughtime server that tests/run.sh starts \
                     (run the suite with `bash tests/run.sh`, or export BAGEL_ROUGHTIME_ADDR=HOST:PORT \
                     and BAGEL_ROUGHTIME_KEY=<hex public key> of a running roughenough-server)"
                )
            })
        };
        let addr = var("BAGEL_ROUGHTIME_ADDR");
        let key_hex = var("BAGEL_ROUGHTIME_KEY");
        let key = bagel_proto::signed_time::roughtime::RoughtimeKey::parse(&key_hex)
            .unwrap_or_else(|e| panic!("BAGEL_ROUGHTIME_KEY: {e}"));
        Roughtime { addr, key_hex, key }
    }

    /// `--roughtime ADDR --roughtime-key KEY`, for `bagel-server` and `bagel`.
    pub fn flags(&self) -> [&str; 4] {
        ["--roughtime", &self.addr, "--roughtime-key", &self.key_hex]
    }

    pub fn server(&self) -> bagel_proto::signed_time::roughtime::RoughtimeServer {
        bagel_proto::signed_time::roughtime::RoughtimeServer::new(self.addr.clone(), self.key)
    }
}
