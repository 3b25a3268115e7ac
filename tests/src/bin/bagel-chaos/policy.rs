//! Workers under an access policy (`bagel-server --acl`): three teams,
//! each with a bearer token granted `lease` and `read` on its own prefix,
//! acquire and release names drawn from every team's prefix, while the
//! policy file is rewritten (one team's grant moves between two prefixes;
//! a reload on change, or on SIGHUP), a broken policy is written and
//! taken back, and the server is killed and restarted with its key.
//!
//! The property: no grant outside what the policy granted its identity at
//! some version (a team's prefix; for the moving team, either of its
//! two), checked twice: by each worker on what it was granted, and at the
//! end from the server's own history of every name, read by an auditor
//! token granted `read` on everything. A name of the caller's own prefix
//! is never refused for want of permission (the moving team's aside), and
//! a call with a known token is never unauthenticated.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerOptions, ServerProcess};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The teams, each with its own prefix; the last one's grant moves.
const TEAMS: [&str; 3] = ["team-a", "team-b", "team-c"];
const MOVING: &str = "team-c";
/// The moving team's two prefixes.
const MOVING_PREFIXES: [&str; 2] = ["team-c/", "team-c2/"];
/// Names per prefix the workers draw from.
const NAMES: u32 = 4;
const WORKERS_PER_TEAM: usize = 2;
const RUNNING: Duration = Duration::from_secs(20);

/// What the phase did, for `chaos.json` (`policy`).
#[derive(Debug, Default, Serialize)]
pub struct PolicyReport {
    pub ran: bool,
    /// Grants, permission refusals, busy answers and unavailable ones
    /// (restarts), over every worker.
    pub grants: u64,
    pub denied: u64,
    pub busy: u64,
    pub unavailable: u64,
    /// Policy rewrites (reloads on change and on SIGHUP), broken policies
    /// written (and kept out), server restarts.
    pub reloads: u32,
    pub sighups: u32,
    pub broken_kept_out: u32,
    pub restarts: u32,
    /// History entries checked at the end.
    pub history_checked: u64,
}

#[derive(Clone)]
struct Bearer(String);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let value = format!("Bearer {}", self.0)
            .parse()
            .map_err(|_| tonic::Status::internal("a token that is no header value"))?;
        req.metadata_mut().insert("authorization", value);
        Ok(req)
    }
}

type Client = LeaseServiceClient<InterceptedService<Channel, Bearer>>;

fn token(identity: &str, seed: u64) -> String {
    format!("{identity}-{seed:x}-chaos-token")
}

/// The policy: each team on its prefix (the moving team on
/// `MOVING_PREFIXES[version % 2]`), an auditor reading everything.
fn policy(seed: u64, version: u32) -> String {
    let mut text = String::new();
    for identity in TEAMS.iter().copied().chain(["auditor"]) {
        let hash = bagel_proto::hex::encode(&bagel_proto::acl::hash_token(&token(identity, seed)));
        text += &format!("[[token]]\nidentity = \"{identity}\"\nsha256 = \"{hash}\"\n\n");
    }
    for team in TEAMS {
        let prefix = if team == MOVING {
            MOVING_PREFIXES[version as usize % 2].to_owned()
        } else {
            format!("{team}/")
        };
        text += &format!(
            "[[grant]]\nidentity = \"{team}\"\nprefixes = [\"{prefix}\"]\npermissions = [\"lease\", \"read\"]\n\n"
        );
    }
    text += "[[grant]]\nidentity = \"auditor\"\nprefixes = [\"\"]\npermissions = [\"read\"]\n";
    text
}

/// The prefixes `identity` was granted `lease` on at some version.
fn allowed(identity: &str) -> Vec<String> {
    if identity == MOVING {
        MOVING_PREFIXES.iter().map(|p| (*p).to_owned()).collect()
    } else {
        vec![format!("{identity}/")]
    }
}

fn every_name() -> Vec<String> {
    let mut prefixes: Vec<String> = TEAMS.iter().map(|t| format!("{t}/")).collect();
    prefixes.push(MOVING_PREFIXES[1].to_owned());
    prefixes
        .iter()
        .flat_map(|p| (0..NAMES).map(move |i| format!("{p}n{i}")))
        .collect()
}

async fn connect(url: &str, token: &str) -> anyhow::Result<Client> {
    let channel = Channel::from_shared(url.to_owned())?.connect_lazy();
    Ok(LeaseServiceClient::with_interceptor(
        channel,
        Bearer(token.to_owned()),
    ))
}

#[derive(Default)]
struct Tally {
    grants: u64,
    denied: u64,
    busy: u64,
    unavailable: u64,
    violations: Vec<String>,
}

pub async fn run(dir: &Path, seed: u64) -> anyhow::Result<(PolicyReport, Vec<String>)> {
    let mut report = PolicyReport::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x706f_6c69_6379);
    let acl = dir.join("policy.toml");
    let key = dir.join("policy-server.key");
    let mut version = 0u32;
    std::fs::write(&acl, policy(seed, version))?;
    let listen = format!("127.0.0.1:{}", crate::services::free_port()?);
    let args = |acl: &Path, key: &Path| {
        vec![
            "--acl".to_owned(),
            acl.display().to_string(),
            "--key".to_owned(),
            key.display().to_string(),
            "--max-ttl".to_owned(),
            "2s".to_owned(),
        ]
    };
    let start = |first: bool| {
        let mut a = args(&acl, &key);
        if first {
            a.push("--unsafe-skip-restart-wait".to_owned());
        }
        let listen = listen.clone();
        async move {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            ServerProcess::start_with(
                &a,
                ServerOptions {
                    listen,
                    rust_log: "error".to_owned(),
                    ..ServerOptions::default()
                },
            )
            .await
        }
    };
    let mut server = start(true).await;
    let url = server.url.clone();

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let names = every_name();
    let mut workers = Vec::new();
    for team in TEAMS {
        for w in 0..WORKERS_PER_TEAM {
            let (url, tally, stop, names) =
                (url.clone(), Arc::clone(&tally), Arc::clone(&stop), names.clone());
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(w as u64) ^ team.len() as u64);
            let token = token(team, seed);
            workers.push(tokio::spawn(async move {
                let mut client = connect(&url, &token).await?;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let name = &names[rng.gen_range(0..names.len())];
                    one_cycle(&mut client, team, name, &tally).await;
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(5..40))).await;
                }
                anyhow::Ok(())
            }));
        }
    }

    let began = Instant::now();
    let mut restarted = false;
    while began.elapsed() < RUNNING {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
        match rng.gen_range(0..10) {
            0 => {
                // A policy that does not parse: kept out, the old one
                // still answers.
                std::fs::write(&acl, "[[grant]\nbroken")?;
                tokio::time::sleep(Duration::from_millis(1200)).await;
                std::fs::write(&acl, policy(seed, version))?;
                report.broken_kept_out += 1;
            }
            1 if !restarted && began.elapsed() > RUNNING / 3 => {
                // kill -9 and back with its key: it waits out its TTL and
                // reads the policy again.
                drop(server);
                server = start(false).await;
                restarted = true;
                report.restarts += 1;
            }
            n => {
                version += 1;
                std::fs::write(&acl, policy(seed, version))?;
                if n % 2 == 0 {
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(server.pid() as i32),
                        nix::sys::signal::Signal::SIGHUP,
                    )
                    .context("SIGHUP")?;
                    report.sighups += 1;
                }
                report.reloads += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in workers {
        w.await??;
    }

    // The server's own account: every holder in every name's history was
    // granted it by the policy at some version.
    let mut auditor = connect(&url, &token("auditor", seed)).await?;
    let mut violations = std::mem::take(&mut tally.lock().expect("tally").violations);
    for name in &names {
        let history = auditor
            .history(pb::HistoryRequest { name: name.clone() })
            .await
            .with_context(|| format!("the auditor's history of {name}"))?
            .into_inner();
        for e in &history.entries {
            report.history_checked += 1;
            if !allowed(&e.owner).iter().any(|p| name.starts_with(p.as_str())) {
                violations.push(format!(
                    "policy: {name} was held by lease {} of {:?}, which the policy never granted it",
                    e.lease_id, e.owner
                ));
            }
        }
    }
    let t = tally.lock().expect("tally");
    report.grants = t.grants;
    report.denied = t.denied;
    report.busy = t.busy;
    report.unavailable = t.unavailable;
    report.ran = true;
    println!(
        "policy: {} grants, {} refused for permission, {} busy, {} unavailable; {} reloads ({} by SIGHUP), \
         {} broken policies kept out, {} restarts; {} history entries checked",
        report.grants,
        report.denied,
        report.busy,
        report.unavailable,
        report.reloads,
        report.sighups,
        report.broken_kept_out,
        report.restarts,
        report.history_checked
    );
    drop(server);
    Ok((report, violations))
}

/// Acquire `name` for a moment and release it, as `team`; the outcome
/// checked against the policy and tallied.
async fn one_cycle(client: &mut Client, team: &str, name: &str, tally: &Mutex<Tally>) {
    let own = allowed(team).iter().any(|p| name.starts_with(p.as_str()));
    let acquired = client
        .acquire(pb::AcquireRequest {
            names: vec![name.to_owned()],
            ttl_us: 500_000,
            owner: team.to_owned(),
            ..Default::default()
        })
        .await;
    let grant = {
        let mut t = tally.lock().expect("tally");
        match acquired {
            Ok(answer) => {
                t.grants += 1;
                if !own {
                    t.violations.push(format!(
                        "policy: {team} was granted {name}, outside every prefix it was given"
                    ));
                }
                answer.into_inner().grant
            }
            Err(s) => {
                match s.code() {
                    Code::PermissionDenied => {
                        t.denied += 1;
                        // The moving team may be refused its own prefix
                        // while its grant is on the other one.
                        if own && team != MOVING {
                            t.violations.push(format!(
                                "policy: {team} was refused its own {name}: {}",
                                s.message()
                            ));
                        }
                    }
                    Code::Aborted => t.busy += 1,
                    Code::Unavailable | Code::Cancelled | Code::Unknown => t.unavailable += 1,
                    _ => t.violations.push(format!(
                        "policy: {team} acquiring {name}: {:?} {}",
                        s.code(),
                        s.message()
                    )),
                }
                None
            }
        }
    };
    // Released at once (a refusal here is the restart's or the TTL's: the
    // grant was checked above).
    if let Some(grant) = grant {
        let _ = client
            .release(pb::ReleaseRequest {
                lease_id: grant.lease_id,
                token: grant.token,
                ..Default::default()
            })
            .await;
    }
}

/// The phase alone (`bagel-chaos policy`): its report in
/// `OUT/policy.json`; whether it found nothing wrong.
pub async fn run_alone(seed: u64, out: &Path) -> anyhow::Result<bool> {
    std::fs::create_dir_all(out)?;
    let out = out.canonicalize()?;
    let (report, violations) = run(&out, seed).await?;
    std::fs::write(out.join("policy.json"), serde_json::to_vec_pretty(&report)?)?;
    for v in &violations {
        println!("VIOLATION {v}");
    }
    Ok(violations.is_empty())
}
