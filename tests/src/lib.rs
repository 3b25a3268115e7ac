//! Helpers for the integration tests: start the real `bagel-server` binary
//! on a free 127.0.0.1 port, wait until it answers its health RPC, run the
//! real `bagel` CLI. Nothing here stands in for a real part.
//!
//! The binaries are found next to the test executable (`target/<profile>/`);
//! `tests/run.sh` builds them first. A missing binary fails the test with a
//! message saying so; it never skips.

pub mod bag_sim;
mod bag_support;
pub mod conformance;
mod lease_support;
mod liar_store;
pub mod memory_lease;
pub mod model;
mod nfs_env;
pub mod raw;

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
pub use memory_lease::{MemoryLeaseBackend, MemoryLimits};
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

/// Starts `cmd` (a `bagel metronome` or server with `--http 127.0.0.1:0`),
/// reads the `http on ADDR` line it prints once its side port listens, and
/// keeps draining its standard output so it never blocks on it. Returns
/// the child and `http://ADDR`.
pub fn spawn_with_side_port(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn with --http");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
    let first = lines.next().expect("a first line").expect("readable");
    let addr = first
        .strip_prefix("http on ")
        .unwrap_or_else(|| panic!("expected `http on ADDR`, got {first:?}"))
        .to_owned();
    std::thread::spawn(move || for _ in lines {});
    (child, format!("http://{addr}"))
}

/// Debian's libfaketime (package faketime), wherever its architecture puts
/// it: preloaded (`LD_PRELOAD`) into a process, it runs that process on a
/// skewed clock with no wrapper process in between.
pub fn libfaketime() -> Option<PathBuf> {
    let lib = std::path::Path::new("/usr/lib");
    let arch_dirs = std::fs::read_dir(lib)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path());
    std::iter::once(lib.to_path_buf())
        .chain(arch_dirs)
        .map(|d| d.join("faketime/libfaketime.so.1"))
        .find(|p| p.is_file())
}

/// The environment that runs a process with its wall (and monotonic)
/// clock `offset` off (libfaketime's form: `+2.5s`, `-10s`), preloaded
/// into the process itself. Not the `faketime` wrapper: it names a
/// semaphore after its pid, and one it left behind when killed makes a
/// later wrapper with the same pid fail (`sem_open: File exists`).
pub fn skewed_env(offset: &str) -> [(String, String); 2] {
    let lib = libfaketime().expect("libfaketime is not installed (Debian package faketime)");
    [
        ("LD_PRELOAD".to_owned(), lib.display().to_string()),
        ("FAKETIME".to_owned(), offset.to_owned()),
    ]
}

/// `bagel --server URL ARGS` with its wall clock `offset` off (libfaketime
/// preloaded, see [`skewed_env`]), as on a host whose clock is wrong.
pub fn bagel_skewed(offset: &str, server: &str, args: &[&str]) -> Output {
    Command::new(bin("bagel"))
        .args(["--server", server])
        .args(args)
        .envs(skewed_env(offset))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("bagel runs")
}

/// A running `bagel-server` process, killed on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    pub url: String,
    /// The printed public key line (hex).
    pub public_key_hex: String,
    /// The HTTP side port, when started with `--http`.
    pub http: Option<SocketAddr>,
}

/// How to start a server beyond its flags.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// `RUST_LOG` of the server (default `warn`).
    pub rust_log: String,
    /// Pipe its stderr to [`ServerProcess::take_stderr`] instead of
    /// inheriting it.
    pub capture_stderr: bool,
    /// Where it listens (default `127.0.0.1:0`; a fixed address restarts a
    /// server where its clients know it).
    pub listen: String,
    /// A command to run the server under (e.g. `faketime +0s`), empty for
    /// none, and environment variables to add (e.g. libfaketime's).
    pub wrap: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            rust_log: "warn".to_owned(),
            capture_stderr: false,
            listen: "127.0.0.1:0".to_owned(),
            wrap: Vec::new(),
            env: Vec::new(),
        }
    }
}

impl ServerProcess {
    /// Starts the server with `--listen 127.0.0.1:0` plus `args`, and waits
    /// until it prints its address and answers a health check (which it
    /// does during the restart wait too, saying NOT_SERVING; use
    /// [`ServerProcess::wait_ready`] for grants).
    pub async fn start(args: &[&str]) -> ServerProcess {
        ServerProcess::start_with(args, ServerOptions::default()).await
    }

    /// [`ServerProcess::start`] listening on `listen` (to restart a server
    /// at the address its clients know).
    pub async fn start_at(listen: &str, args: &[&str]) -> ServerProcess {
        let options = ServerOptions {
            listen: listen.to_owned(),
            ..ServerOptions::default()
        };
        ServerProcess::start_with(args, options).await
    }

    /// [`ServerProcess::start`] with [`ServerOptions`].
    pub async fn start_with(args: &[&str], options: ServerOptions) -> ServerProcess {
        let server = ServerProcess::spawn_with(args, options).await;
        server.wait_answering().await;
        server
    }

    /// Starts the server like [`ServerProcess::start`] but returns as soon
    /// as it prints its address, without talking to it (for servers that
    /// speak TLS, which `url` does not).
    pub async fn spawn(args: &[&str]) -> ServerProcess {
        ServerProcess::spawn_with(args, ServerOptions::default()).await
    }

    /// [`ServerProcess::spawn`] with [`ServerOptions`].
    pub async fn spawn_with(args: &[&str], options: ServerOptions) -> ServerProcess {
        let server = bin("bagel-server");
        let mut command = match options.wrap.split_first() {
            None => Command::new(&server),
            Some((program, wrap_args)) => {
                let mut c = Command::new(program);
                c.args(wrap_args).arg(&server);
                c
            }
        };
        let mut child = command
            .args(["--listen", &options.listen])
            .args(args)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", &options.rust_log)
            .stdout(Stdio::piped())
            .stderr(if options.capture_stderr {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("spawn bagel-server");
        let stdout = child.stdout.take().expect("stdout piped");
        // Reading the start-up lines blocks; do it off the runtime.
        let (addr, key, http) = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut key = String::new();
            let mut http = None;
            for line in lines.by_ref() {
                let line = line.expect("read server stdout");
                if let Some(rest) = line.strip_prefix("public key ") {
                    key = rest.split_whitespace().next().unwrap_or_default().to_owned();
                }
                if let Some(rest) = line.strip_prefix("http on ") {
                    let addr = rest.split(':').take(2).collect::<Vec<_>>().join(":");
                    http = Some(addr.parse::<SocketAddr>().expect("HTTP address"));
                }
                if let Some((_, rest)) = line.split_once(" listening on ") {
                    let addr: SocketAddr = rest.split(',').next().unwrap().parse().expect("address");
                    // Keep draining stdout so the server never blocks on it.
                    std::thread::spawn(move || for _ in lines {});
                    return (addr, key, http);
                }
            }
            panic!("bagel-server exited before printing its address");
        })
        .await
        .expect("reader task");
        ServerProcess {
            child,
            addr,
            url: format!("http://{addr}"),
            public_key_hex: key,
            http,
        }
    }

    /// The server's process id (to read its memory from `/proc`, or signal it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait for bagel-server")
    }

    /// Waits until the health RPC answers at all (any status: during the
    /// restart wait it says NOT_SERVING), for at most 10 s.
    async fn wait_answering(&self) {
        let mut health = HealthClient::new(self.channel().await);
        let req = tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        };
        let answered = async {
            while health.check(req.clone()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), answered)
            .await
            .unwrap_or_else(|_| panic!("{} did not answer a health check within 10 s", self.url));
    }

    /// A channel to the server. It printed its address after binding, so
    /// the first connect normally succeeds; a refused one is retried
    /// briefly, not forever.
    async fn channel(&self) -> tonic::transport::Channel {
        let endpoint = tonic::transport::Endpoint::from_shared(self.url.clone()).expect("url");
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match endpoint.connect().await {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() >= give_up => {
                    panic!("cannot connect to {} within 10 s: {e}", self.url)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
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
        let mut health = HealthClient::new(self.channel().await);
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

    /// Freezes the server (SIGSTOP): connections stay open, nothing is
    /// answered, as with a server stuck in a long pause.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a [`ServerProcess::pause`]d server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {} failed", self.child.id());
    }

    /// The server's stderr, when started with `capture_stderr`.
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// The base URL of the HTTP side port; panics when started without
    /// `--http`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http.expect("server started without --http"))
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

/// Runs the real `bagel` CLI against several servers (`--servers`).
pub fn cli_servers(servers: &[&ServerProcess], args: &[&str]) -> Output {
    let list: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let mut all = vec!["--servers".to_owned(), list.join(",")];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    cli_no_server(&all)
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
