//! What the access policy (`--acl`, issue 43) costs a server per lease
//! cycle (acquire + release), over gRPC against a real `bagel-server`:
//! the server's CPU time (utime + stime from /proc) per cycle with no
//! policy and with a policy of `GRANTS` grants (the caller's the last, so
//! every check reads them all), the same clients sending the same bearer
//! token to both, in alternating rounds of one run.
//!
//! Pin it for numbers that mean something: the server on one CPU, the
//! generator on another, e.g.
//! `taskset -c 1 target/release/examples/acl_cost target/release/bagel-server 0 [SECS] [ROUNDS]`
//! (the second argument is the CPU list the server is started on with
//! `taskset`; SECS per phase, default 5; ROUNDS, default 3). The numbers
//! are for reports, never for tests: they depend on the machine.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const TOKEN: &str = "acl-cost-bench-token-0123456789abcdef";
const GRANTS: usize = 50;
const WORKERS: usize = 32;

#[derive(Clone)]
struct Bearer;

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().expect("ascii"));
        Ok(req)
    }
}

type Client = LeaseServiceClient<InterceptedService<Channel, Bearer>>;

fn policy() -> String {
    let mut p = String::new();
    for i in 0..GRANTS - 1 {
        p.push_str(&format!(
            "[[grant]]\nsubject = {{ CN = \"team-{i}-*\" }}\nprefixes = [\"team-{i}/\"]\npermissions = [\"lease\", \"read\"]\n\n"
        ));
    }
    p.push_str(&format!(
        "[[token]]\nidentity = \"bench\"\nsha256 = \"{}\"\n\n[[grant]]\nidentity = \"bench\"\nprefixes = [\"bench/\"]\npermissions = [\"lease\", \"read\"]\n",
        bagel_proto::hex::encode(&bagel_proto::acl::hash_token(TOKEN))
    ));
    p
}

struct Server {
    child: std::process::Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(binary: &str, cpus: &str, acl: Option<&std::path::Path>) -> Server {
    let mut cmd = Command::new("taskset");
    cmd.args([
        "-c",
        cpus,
        binary,
        "--listen",
        "127.0.0.1:0",
        "--unsafe-skip-restart-wait",
    ]);
    if let Some(acl) = acl {
        cmd.arg("--acl").arg(acl);
    }
    let mut child = cmd
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start bagel-server under taskset");
    let stdout = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines.next().expect("server exited").expect("read stdout");
        if let Some((_, rest)) = line.split_once(" listening on ") {
            break rest.split(',').next().expect("address").to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

/// utime + stime of `pid` and its threads, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// Runs `WORKERS` clients doing acquire + release on their own names for
/// `secs`; returns (cycles, server CPU seconds).
async fn measure(server: &Server, secs: u64) -> (u64, f64) {
    let channel = Channel::from_shared(server.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let client: Client = LeaseServiceClient::with_interceptor(channel, Bearer);
    // Warm up (and check the policy lets the bench through).
    let mut c = client.clone();
    cycle(&mut c, "bench/warm").await;
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let pid = server.child.id();
    let ticks0 = cpu_ticks(pid);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (mut c, stop, cycles) = (client.clone(), Arc::clone(&stop), Arc::clone(&cycles));
        tasks.push(tokio::spawn(async move {
            let name = format!("bench/w{w}");
            while !stop.load(Ordering::Relaxed) {
                cycle(&mut c, &name).await;
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("worker");
    }
    let ticks = cpu_ticks(pid) - ticks0;
    let _ = start.elapsed();
    let hz = rustix::param::clock_ticks_per_second() as f64;
    (cycles.load(Ordering::Relaxed), ticks as f64 / hz)
}

async fn cycle(c: &mut Client, name: &str) {
    let grant = c
        .acquire(pb::AcquireRequest {
            names: vec![name.to_owned()],
            ttl_us: 5_000_000,
            owner: "bench".into(),
            mode: pb::Mode::Full.into(),
            ..Default::default()
        })
        .await
        .expect("acquire")
        .into_inner()
        .grant
        .expect("grant");
    c.release(pb::ReleaseRequest {
        lease_id: grant.lease_id,
        token: grant.token,
        ..Default::default()
    })
    .await
    .expect("release");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = args
        .get(1)
        .expect("usage: acl_cost SERVER_BINARY CPUS [SECS] [ROUNDS]");
    let cpus = args.get(2).map_or("0", String::as_str);
    let secs: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    let dir = std::env::temp_dir().join(format!("acl_cost.{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let acl = dir.join("acl.toml");
    std::fs::write(&acl, policy()).expect("policy");
    println!(
        "server on CPUs {cpus}; {WORKERS} clients, {secs} s per phase, {rounds} rounds; policy of {GRANTS} grants"
    );
    let mut per = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, with) in [None, Some(acl.as_path())].into_iter().enumerate() {
            let server = start(binary, cpus, with);
            let (cycles, cpu) = measure(&server, secs).await;
            let us = cpu * 1e6 / cycles as f64;
            per[i].push(us);
            println!(
                "round {round} {:9}: {cycles} cycles ({:.0}/s), server CPU {cpu:.2} s, {us:.2} us/cycle",
                if with.is_some() { "--acl" } else { "no policy" },
                cycles as f64 / secs as f64
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (none, with) = (median(&mut per[0]), median(&mut per[1]));
    println!(
        "median server CPU per cycle: no policy {none:.2} us, --acl {with:.2} us ({:+.1}%)",
        (with / none - 1.0) * 100.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
