//! One cluster, its server list written differently by each client, as
//! operators' configs end up: `localhost` for 127.0.0.1, a trailing slash,
//! with and without `ID=`, members in another order. Names are routed by
//! the identity each server announces (its `--server-id`), so every
//! spelling must route every name to the same member: no name may ever
//! have two holders.
//!
//! [`CLIENTS`] loops take names from a small shared set, each its own way:
//! `bagel acquire` then `bagel release`, `bagel acquire --hold` then
//! SIGINT, or the library. While a grant is held, a describe through
//! another spelling must name its holder by its fencing token; at the end
//! no two grants of a name may have been held at once, and a later grant
//! of a name has a higher fencing token. A grant is counted as held only
//! for what the client knows for sure: from its answer until the release
//! was sent, and for a lease nobody renews, no longer than the TTL after
//! the request was sent (the server's deadline is at least that).
//!
//! And a list that names a wrong identity (two IDs swapped) must be
//! refused at connect, naming both, whichever name it asks for: through
//! it, names would go to the wrong server.
//!
//! **Across the migration** each client writes the lists in force at the
//! start of each cycle, as a service reads its configuration when it is
//! restarted: before it, the current list in its own spelling; while both
//! lists are in force, `--servers` and `--next-servers` both in its
//! spelling (a member of both written alike in each: a client must not
//! give one member two URLs, see [`spell`]); after it, the next list in
//! its own spelling. A grant under both lists needs
//! the name's owner in each: it must come from both, a describe through
//! another spelling must name it (by its fencing token, or, when the
//! owners differ, by the lease id of its part on the current owner, whose
//! token may be the lower of the two), and no two grants of a name may
//! overlap whatever lists each was taken under.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bagel_cli::contract::LeaseJson;
use bagel_client::cluster::rendezvous;
use bagel_client::{Cluster, LeaseOptions, ServerSpec};
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::Command;
use tokio::sync::watch;

use crate::lists::{InForce, Lists, Mover, PerStep};
use crate::outages::Outages;

/// Names the spelling clients contend for (`spelled-0`, ...).
const NAMES: usize = 6;

/// How a client takes its names.
#[derive(Debug, Clone, Copy)]
enum How {
    /// `bagel acquire NAME --json`, then `bagel release --lease FILE`.
    Acquire,
    /// `bagel acquire NAME --hold --json`, then SIGINT.
    Hold,
    /// The library's `Cluster`, in this process.
    Library,
}

/// The clients: how each writes the list, and how it takes names.
const CLIENTS: [(&str, How); 6] = [
    ("localhost", How::Acquire),
    ("trailing slash", How::Hold),
    ("no ids", How::Acquire),
    ("no ids, localhost, slashes, reversed", How::Library),
    ("ids, shuffled, mixed hosts and slashes", How::Hold),
    ("as the run writes it", How::Library),
];

/// What the spelling journey needs from the driver.
#[derive(Debug, Clone)]
pub struct SpellingSetup {
    pub bagel: PathBuf,
    pub env: Vec<(String, String)>,
    /// Where the lease files and the holders' logs go.
    pub dir: PathBuf,
    /// The server lists in force (`member-i=URL`), moved by the migration.
    pub lists: Lists,
    /// The grants' TTL (the servers' max TTL).
    pub ttl: Duration,
    pub outages: Outages,
    pub started: Instant,
}

/// `chaos.json`'s `config_spellings`.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SpellingReport {
    /// Each client: its spelling, how it takes names, what it got.
    pub spellings: Vec<SpellingStats>,
    pub grants: u64,
    pub busy: u64,
    /// Acquires that failed otherwise: a member down or in its restart
    /// wait, or (a list without IDs) a member down when the client starts.
    pub failed: u64,
    /// Two grants of one name held at once (each a violation).
    pub double_grants: u64,
    /// A grant from another server than the name's owner (by port).
    pub misrouted: u64,
    /// A later grant of a name with a fencing token not above an earlier.
    pub token_regressions: u64,
    /// Describes through another spelling while a grant was held: the
    /// holder named by its fencing token, or not (a violation), or the
    /// owner was restarted meanwhile (it forgets), or it could not answer.
    pub describes_agreed: u64,
    pub describes_disagreed: u64,
    pub describes_after_restart: u64,
    pub describes_failed: u64,
    /// The list with two IDs swapped: tries, refusals naming both IDs,
    /// tries that could not tell (a swapped member unreachable), and
    /// anything else (each a violation: a grant, or a refusal for another
    /// reason).
    pub wrong_id_tries: u64,
    pub wrong_id_refused: u64,
    pub wrong_id_unreachable: u64,
    pub wrong_id_not_refused: u64,
    /// Grants under each step of the migration (the lists their client
    /// wrote).
    pub across_migration: PerStep,
}

/// One client's figures.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SpellingStats {
    pub label: String,
    pub servers: String,
    /// Its lists under each later step: `--servers`, and `--next-servers`
    /// after a space while both are in force.
    pub migrated: BTreeMap<&'static str, String>,
    pub how: String,
    pub grants: u64,
    pub busy: u64,
    pub failed: u64,
    /// Its first failure, for whoever reads the run.
    pub first_failure: Option<String>,
    /// Its failures under each later step of the migration, and the first
    /// of each.
    pub failed_across_migration: PerStep,
    pub first_failure_by_step: BTreeMap<&'static str, String>,
}

/// One grant, for the final checks.
#[derive(Debug, Clone)]
struct Grant {
    name: String,
    client: usize,
    step: &'static str,
    token: u64,
    /// When its request was sent.
    sent: Instant,
    /// Surely held from `from` to `to`.
    from: Instant,
    to: Instant,
    /// Surely gone by then (released, or past its deadline).
    gone_by: Instant,
}

#[derive(Debug)]
struct Shared {
    setup: SpellingSetup,
    /// Seeds the spellings of each generation's lists.
    seed: u64,
    /// Each generation's lists as the clients spell them.
    spelled: Mutex<HashMap<u64, Arc<Spelled>>>,
    /// The library's clusters, one per spelling and generation, connected
    /// when first used (a list without IDs needs every member up to
    /// connect).
    clusters: tokio::sync::Mutex<HashMap<(usize, u64), Cluster>>,
    grants: Mutex<Vec<Grant>>,
    report: Mutex<SpellingReport>,
    violations: Arc<Mutex<Vec<String>>>,
}

/// One generation's lists as every client writes them.
#[derive(Debug)]
struct Spelled {
    step: &'static str,
    /// Each client's `--servers` and `--next-servers`.
    lists: Vec<(String, Option<String>)>,
    /// The current list with its first two members' IDs swapped, and
    /// those two IDs.
    swapped: String,
    swapped_ids: [String; 2],
    /// Each name's owners under these lists (in the current list, then in
    /// the next when another): identity and port.
    owners: HashMap<String, Vec<(String, u16)>>,
}

impl Spelled {
    fn new(in_force: &InForce, seed: u64) -> anyhow::Result<Spelled> {
        let mut rng = StdRng::seed_from_u64(seed ^ in_force.generation);
        let current = ports(&in_force.current)?;
        anyhow::ensure!(
            current.len() >= 2,
            "the spelling journey needs two members to swap"
        );
        let next = in_force.next.as_deref().map(ports).transpose()?;
        let lists = (0..CLIENTS.len())
            .map(|k| {
                let c = spell(k, &current, seed, &mut rng);
                let n = next.as_ref().map(|next| spell(k, next, seed, &mut rng));
                (c, n)
            })
            .collect();
        let port_of_id: HashMap<String, u16> = current.iter().chain(next.iter().flatten()).cloned().collect();
        let owners = (0..NAMES)
            .map(|i| {
                let name = format!("spelled-{i}");
                let owners = in_force
                    .owners(&name)
                    .into_iter()
                    .map(|id| {
                        let port = port_of_id.get(&id).copied().unwrap_or_default();
                        (id, port)
                    })
                    .collect();
                (name, owners)
            })
            .collect();
        Ok(Spelled {
            step: in_force.step(),
            lists,
            swapped: swapped(&current),
            swapped_ids: [current[0].0.clone(), current[1].0.clone()],
            owners,
        })
    }
}

/// A list's members (`ID=URL`, as the run writes its lists): identity and
/// port.
fn ports(list: &str) -> anyhow::Result<Vec<(String, u16)>> {
    crate::lists::members(list)
        .into_iter()
        .map(|(id, url)| {
            let port = port_of(&url).with_context(|| format!("no port in {url}"))?;
            Ok((id, port))
        })
        .collect()
}

/// The run's list spelled as client `k` writes it.
///
/// A member both lists name is written alike in both (the mixed spelling
/// draws each member's host and slash from its ID and the run's seed): a
/// client that writes one member two ways in `--servers` and
/// `--next-servers` is refused ("server ID is given as both URL and URL").
fn spell(k: usize, members: &[(String, u16)], seed: u64, rng: &mut StdRng) -> String {
    let member = |(id, port): &(String, u16), host: &str, slash: bool, with_id: bool| {
        let url = format!("http://{host}:{port}{}", if slash { "/" } else { "" });
        if with_id { format!("{id}={url}") } else { url }
    };
    let list: Vec<String> = match CLIENTS[k].0 {
        "localhost" => members
            .iter()
            .map(|m| member(m, "localhost", false, true))
            .collect(),
        "trailing slash" => members
            .iter()
            .map(|m| member(m, "127.0.0.1", true, true))
            .collect(),
        "no ids" => members
            .iter()
            .map(|m| member(m, "127.0.0.1", false, false))
            .collect(),
        "no ids, localhost, slashes, reversed" => members
            .iter()
            .rev()
            .map(|m| member(m, "localhost", true, false))
            .collect(),
        "ids, shuffled, mixed hosts and slashes" => {
            let mut l: Vec<String> = members
                .iter()
                .map(|m| {
                    let draw = rendezvous::weight(&seed.to_string(), &m.0);
                    let host = if draw & 1 == 0 { "localhost" } else { "127.0.0.1" };
                    member(m, host, draw & 2 == 0, true)
                })
                .collect();
            l.shuffle(rng);
            l
        }
        _ => members
            .iter()
            .map(|m| member(m, "127.0.0.1", false, true))
            .collect(),
    };
    list.join(",")
}

/// The run's list with the first two members' IDs swapped.
fn swapped(members: &[(String, u16)]) -> String {
    let mut ids: Vec<&str> = members.iter().map(|m| m.0.as_str()).collect();
    ids.swap(0, 1);
    members
        .iter()
        .zip(ids)
        .map(|((_, port), id)| format!("{id}=http://127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn port_of(url: &str) -> Option<u16> {
    url.trim_end_matches('/').rsplit(':').next()?.parse().ok()
}

/// Runs the clients until `stop` says so, then checks every grant.
pub async fn run(
    setup: SpellingSetup,
    seed: u64,
    stop: watch::Receiver<bool>,
    violations: Arc<Mutex<Vec<String>>>,
) -> anyhow::Result<SpellingReport> {
    let mut rng = StdRng::seed_from_u64(seed);
    let spell_seed: u64 = rng.r#gen();
    let first = setup.lists.now();
    let spelled = Arc::new(Spelled::new(&first, spell_seed)?);
    let report = SpellingReport {
        spellings: CLIENTS
            .iter()
            .zip(&spelled.lists)
            .map(|((label, how), (list, _))| SpellingStats {
                label: (*label).to_owned(),
                servers: list.clone(),
                how: format!("{how:?}").to_lowercase(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    std::fs::create_dir_all(setup.dir.join("state"))?;
    let shared = Arc::new(Shared {
        setup,
        seed: spell_seed,
        spelled: Mutex::new(HashMap::from([(first.generation, spelled)])),
        clusters: Default::default(),
        grants: Mutex::default(),
        report: Mutex::new(report),
        violations,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (k, (label, _)) in CLIENTS.iter().enumerate() {
        let mover = shared
            .setup
            .lists
            .mover(format!("the spelling client {k} ({label:?})"));
        tasks.spawn(client(
            Arc::clone(&shared),
            k,
            mover,
            StdRng::seed_from_u64(rng.r#gen()),
            stop.clone(),
        ));
    }
    tasks.spawn(wrong_ids(
        Arc::clone(&shared),
        StdRng::seed_from_u64(rng.r#gen()),
        stop,
    ));
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done.context("a spelling client panicked")? {
            shared.violation(format!("config spellings: a client failed: {e:#}"));
        }
    }
    shared.check();
    let report = shared.report.lock().expect("report").clone();
    Ok(report)
}

/// What one try to take a name got.
enum Got {
    Held(Box<Held>),
    Busy,
    Failed(String),
}

/// A grant being held, and how to let it go.
enum Held {
    /// `bagel acquire`'s lease file (released with `bagel release`).
    File(LeaseJson),
    /// `bagel acquire --hold`, running, and the lease it printed.
    Holder(tokio::process::Child, LeaseJson),
    Library(bagel_client::Lease),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::File(l) | Held::Holder(_, l) => l.names[0].fencing_token,
            Held::Library(l) => l.names()[0].fencing_token,
        }
    }

    /// The lease ids its servers hold `name` under: one, or two while
    /// migrating (one a server).
    fn part_ids(&self, name: &str) -> Vec<String> {
        match self {
            Held::File(l) | Held::Holder(_, l) if l.servers.is_empty() => vec![l.lease_id.clone()],
            Held::File(l) | Held::Holder(_, l) => l
                .servers
                .iter()
                .filter(|s| s.name == name)
                .map(|s| s.lease_id.clone())
                .collect(),
            Held::Library(l) => l
                .servers()
                .iter()
                .filter(|p| p.names.iter().any(|n| n == name))
                .map(|p| p.lease_id.clone())
                .chain(l.servers().is_empty().then(|| l.id().to_owned()))
                .collect(),
        }
    }
}

impl Shared {
    fn violation(&self, v: String) {
        self.violations.lock().expect("violations").push(v);
    }

    fn at(&self) -> f64 {
        self.setup.started.elapsed().as_secs_f64()
    }

    /// Client `k`'s lists of `sp`'s generation.
    fn bagel_of(&self, sp: &Spelled, k: usize) -> Command {
        let (current, next) = &sp.lists[k];
        let mut c = self.bagel(current);
        if let Some(next) = next {
            c.args(["--next-servers", next]);
        }
        c
    }

    /// The lists in force, as the clients spell them.
    fn spelled(&self, in_force: &InForce) -> anyhow::Result<Arc<Spelled>> {
        let mut spelled = self.spelled.lock().expect("spelled");
        if let Some(sp) = spelled.get(&in_force.generation) {
            return Ok(Arc::clone(sp));
        }
        let sp = Arc::new(Spelled::new(in_force, self.seed)?);
        let mut r = self.report.lock().expect("report");
        for (stats, (current, next)) in r.spellings.iter_mut().zip(&sp.lists) {
            let lists = match next {
                Some(next) => format!("{current} {next}"),
                None => current.clone(),
            };
            stats.migrated.insert(sp.step, lists);
        }
        spelled.insert(in_force.generation, Arc::clone(&sp));
        Ok(sp)
    }

    fn bagel(&self, list: &str) -> Command {
        let mut c = Command::new(&self.setup.bagel);
        c.args(["--servers", list])
            .envs(self.setup.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "error")
            .env("BAGEL_STATE_DIR", self.setup.dir.join("state"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// The library's cluster for spelling `k` of `generation`'s lists.
    async fn cluster(&self, k: usize, generation: u64, sp: &Spelled) -> Result<Cluster, String> {
        let mut clusters = self.clusters.lock().await;
        if let Some(c) = clusters.get(&(k, generation)) {
            return Ok(c.clone());
        }
        let (current, next) = &sp.lists[k];
        let current = ServerSpec::parse_list(current)?;
        let c = match next {
            Some(next) => Cluster::migrating(&current, &ServerSpec::parse_list(next)?).await,
            None => Cluster::connect(&current).await,
        }
        .map_err(|e| e.to_string())?;
        clusters.insert((k, generation), c.clone());
        Ok(c)
    }

    fn ttl_arg(&self) -> String {
        humantime::format_duration(self.setup.ttl).to_string()
    }

    async fn take(&self, k: usize, generation: u64, sp: &Spelled, name: &str) -> Got {
        match CLIENTS[k].1 {
            How::Acquire => {
                let out = tokio::time::timeout(
                    Duration::from_secs(30),
                    self.bagel_of(sp, k)
                        .args(["acquire", name, "--ttl", &self.ttl_arg(), "--json"])
                        .output(),
                )
                .await;
                match out {
                    Ok(Ok(out)) if out.status.success() => {
                        match serde_json::from_slice::<LeaseJson>(&out.stdout) {
                            Ok(lease) => Got::Held(Box::new(Held::File(lease))),
                            Err(e) => Got::Failed(format!("bagel acquire printed no lease: {e}")),
                        }
                    }
                    Ok(Ok(out)) if out.status.code() == Some(2) => Got::Busy,
                    Ok(Ok(out)) => Got::Failed(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
                    Ok(Err(e)) => Got::Failed(format!("starting bagel acquire: {e}")),
                    Err(_) => Got::Failed("bagel acquire did not return within 30 s".into()),
                }
            }
            How::Hold => self.hold(k, sp, name).await,
            How::Library => {
                let cluster = match self.cluster(k, generation, sp).await {
                    Ok(c) => c,
                    Err(e) => return Got::Failed(e),
                };
                let got = cluster
                    .acquire(vec![name.to_owned()])
                    .ttl(self.setup.ttl)
                    .owner(format!("chaos-spelling-{k}"))
                    .options(LeaseOptions::default().with_auto_renew(false))
                    .send()
                    .await;
                match got {
                    Ok(lease) => Got::Held(Box::new(Held::Library(lease))),
                    Err(bagel_client::Error::Busy { .. }) => Got::Busy,
                    Err(e) => Got::Failed(e.to_string()),
                }
            }
        }
    }

    /// `bagel acquire --hold --json`: held once its lease file is printed.
    async fn hold(&self, k: usize, sp: &Spelled, name: &str) -> Got {
        let log = self.setup.dir.join(format!("holder-{k}.log"));
        let Ok(stderr) = std::fs::File::create(&log) else {
            return Got::Failed("creating the holder's log".into());
        };
        let spawned = self
            .bagel_of(sp, k)
            .args(["acquire", name, "--ttl", &self.ttl_arg(), "--hold", "--json"])
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => return Got::Failed(format!("starting bagel acquire --hold: {e}")),
        };
        let stdout = child.stdout.take().expect("piped");
        let printed = tokio::time::timeout(Duration::from_secs(30), async {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut text = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                text.push_str(&line);
                text.push('\n');
                if let Ok(lease) = serde_json::from_str::<LeaseJson>(&text) {
                    // The rest of its output (none expected) is drained.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    return Some(lease);
                }
            }
            None
        })
        .await;
        match printed {
            Ok(Some(lease)) => Got::Held(Box::new(Held::Holder(child, lease))),
            Ok(None) => match child.wait().await {
                Ok(s) if s.code() == Some(2) => Got::Busy,
                _ => Got::Failed(
                    std::fs::read_to_string(&log)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                ),
            },
            Err(_) => Got::Failed("bagel acquire --hold printed no lease within 30 s".into()),
        }
    }

    /// Lets a grant go; returns when it is surely held until (`None`: no
    /// later than the TTL after it was asked for) and when it is surely
    /// gone.
    async fn let_go(&self, k: usize, sp: &Spelled, held: Held) -> (Option<Instant>, Instant) {
        let ttl = self.setup.ttl;
        let sent = Instant::now();
        match held {
            Held::File(lease) => {
                let file = self.setup.dir.join(format!("client-{k}.lease.json"));
                let released = match std::fs::write(&file, serde_json::to_vec(&lease).unwrap_or_default()) {
                    Ok(()) => {
                        let release = self
                            .bagel_of(sp, k)
                            .args(["release", "--lease"])
                            .arg(&file)
                            .output();
                        matches!(tokio::time::timeout(Duration::from_secs(30), release).await, Ok(Ok(o)) if o.status.success())
                    }
                    Err(_) => false,
                };
                (Some(sent), if released { Instant::now() } else { sent + ttl })
            }
            Held::Library(lease) => {
                let released = lease.release(None).await.is_ok();
                (Some(sent), if released { Instant::now() } else { sent + ttl })
            }
            Held::Holder(mut child, _) => {
                // Still holding (renewing) when told to stop, or it had
                // lost the lease and exited: then only its grant is sure.
                let running = matches!(child.try_wait(), Ok(None));
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGINT,
                    );
                }
                let exited = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
                let released = running && matches!(exited, Ok(Ok(s)) if s.success());
                if exited.is_err() {
                    self.violation(format!(
                        "config spellings: client {k}'s holder did not exit within 30 s of SIGINT"
                    ));
                }
                (
                    running.then_some(sent),
                    if released {
                        Instant::now()
                    } else {
                        Instant::now() + ttl
                    },
                )
            }
        }
    }

    /// While client `k` holds `name` (token `token`, its servers' lease
    /// ids `parts`) under `sp`'s lists, a describe through another spelling
    /// of them must name the holder.
    #[allow(clippy::too_many_arguments)]
    async fn describe(
        &self,
        k: usize,
        (generation, sp): (u64, &Spelled),
        name: &str,
        token: u64,
        parts: &[String],
        sent: Instant,
        rng: &mut StdRng,
    ) {
        let others: Vec<usize> = (0..CLIENTS.len()).filter(|&j| j != k).collect();
        let j = *others.choose(rng).expect("clients");
        let asked = Instant::now();
        let answer = match self.cluster(j, generation, sp).await {
            Ok(c) => c.describe(&[name.to_owned()]).await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let answered = Instant::now();
        let owners = &sp.owners[name];
        let mut r = self.report.lock().expect("report");
        let state = match answer {
            Ok(mut states) if states.len() == 1 => states.remove(0),
            _ => {
                r.describes_failed += 1;
                return;
            }
        };
        let holder = state.holder.as_ref().map(|h| h.fencing_token);
        // While migrating, the current owner describes its own part, whose
        // token may be the lower of the two.
        let its_part = owners.len() > 1 && state.holder.as_ref().is_some_and(|h| parts.contains(&h.lease_id));
        if holder == Some(token) || its_part {
            r.describes_agreed += 1;
        } else if answered > sent + self.setup.ttl {
            // Not surely held any more when it answered.
        } else if owners
            .iter()
            .any(|(owner, _)| self.setup.outages.killed_during(owner, sent, answered))
        {
            r.describes_after_restart += 1;
        } else {
            r.describes_disagreed += 1;
            drop(r);
            self.violation(format!(
                "config spellings: {name} held by client {k} ({:?}) with fencing token {token}, but a describe \
                 through client {j}'s list ({:?}) at {:.3}s says {}",
                CLIENTS[k].0,
                CLIENTS[j].0,
                asked.saturating_duration_since(self.setup.started).as_secs_f64(),
                match holder {
                    Some(t) => format!("held with fencing token {t}"),
                    None => "free".to_owned(),
                }
            ));
        }
    }

    /// Every grant against every other of its name.
    fn check(&self) {
        let grants = self.grants.lock().expect("grants").clone();
        let mut by_name: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
        for g in &grants {
            by_name.entry(&g.name).or_default().push(g);
        }
        let t = |at: Instant| at.saturating_duration_since(self.setup.started).as_secs_f64();
        let mut found = Vec::new();
        let (mut double, mut regressions) = (0, 0);
        for (name, mut gs) in by_name {
            gs.sort_by_key(|g| g.from);
            for (i, a) in gs.iter().enumerate() {
                for b in &gs[i + 1..] {
                    if b.from < a.to && a.from < b.to {
                        double += 1;
                        found.push(format!(
                            "config spellings: {name} held twice: by client {} ({:?}, token {}, lists of {}) from \
                             {:.3}s to {:.3}s and by client {} ({:?}, token {}, lists of {}) from {:.3}s to {:.3}s",
                            a.client,
                            CLIENTS[a.client].0,
                            a.token,
                            a.step,
                            t(a.from),
                            t(a.to),
                            b.client,
                            CLIENTS[b.client].0,
                            b.token,
                            b.step,
                            t(b.from),
                            t(b.to)
                        ));
                    } else if b.sent >= a.gone_by && b.token <= a.token {
                        regressions += 1;
                        found.push(format!(
                            "config spellings: {name}: client {} was granted fencing token {} at {:.3}s, not above \
                             token {} of client {}'s grant gone by {:.3}s",
                            b.client,
                            b.token,
                            t(b.from),
                            a.token,
                            a.client,
                            t(a.gone_by)
                        ));
                    }
                }
            }
        }
        {
            let mut r = self.report.lock().expect("report");
            r.double_grants += double;
            r.token_regressions += regressions;
        }
        for v in found {
            self.violation(v);
        }
    }
}

/// One client's loop: take a random name, hold it a while (describing it
/// through another spelling half-way), let it go.
async fn client(
    shared: Arc<Shared>,
    k: usize,
    mover: Mover,
    mut rng: StdRng,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let how = CLIENTS[k].1;
    let mut step = shared.setup.lists.now().step();
    while !*stop.borrow() {
        // Each cycle on the lists in force (the one before has let go).
        let in_force = shared.setup.lists.now();
        mover.on(in_force.generation);
        let sp = shared.spelled(&in_force)?;
        if sp.step != step {
            step = sp.step;
            println!(
                "[{:>5.1}s] config spellings: client {k} ({:?}) writes the lists of {step}: {:?}",
                shared.at(),
                CLIENTS[k].0,
                sp.lists[k]
            );
        }
        let name = format!("spelled-{}", rng.gen_range(0..NAMES));
        let sent = Instant::now();
        let got = shared.take(k, in_force.generation, &sp, &name).await;
        let from = Instant::now();
        let pause = match got {
            Got::Busy => {
                let mut r = shared.report.lock().expect("report");
                r.busy += 1;
                r.spellings[k].busy += 1;
                20..100
            }
            Got::Failed(e) => {
                let mut r = shared.report.lock().expect("report");
                r.failed += 1;
                let s = &mut r.spellings[k];
                s.failed += 1;
                let first_this_step =
                    in_force.generation > 0 && !s.first_failure_by_step.contains_key(sp.step);
                if s.first_failure.is_none() || first_this_step {
                    println!(
                        "[{:>5.1}s] config spellings: client {k} ({:?}) under the lists of {}: {e}",
                        shared.at(),
                        CLIENTS[k].0,
                        sp.step
                    );
                }
                if in_force.generation > 0 {
                    *s.failed_across_migration.entry(sp.step).or_default() += 1;
                    s.first_failure_by_step
                        .entry(sp.step)
                        .or_insert_with(|| e.clone());
                }
                s.first_failure.get_or_insert(e);
                200..400
            }
            Got::Held(held) => {
                let held = *held;
                let token = held.token();
                let parts = held.part_ids(&name);
                if let Held::File(lease) | Held::Holder(_, lease) = &held {
                    shared.check_owner(k, &sp, &name, lease);
                }
                // A lease nobody renews is surely held for less than its
                // TTL: these let go well before.
                let hold_ms = match how {
                    How::Hold => rng.gen_range(300..3_000),
                    How::Acquire | How::Library => rng.gen_range(100..900),
                };
                tokio::time::sleep(Duration::from_millis(hold_ms / 2)).await;
                shared
                    .describe(
                        k,
                        (in_force.generation, &sp),
                        &name,
                        token,
                        &parts,
                        sent,
                        &mut rng,
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(hold_ms / 2)).await;
                let renewed = matches!(held, Held::Holder(..));
                let (held_until, gone_by) = shared.let_go(k, &sp, held).await;
                let to = match (held_until, renewed) {
                    (Some(t), true) => t,
                    (Some(t), false) => t.min(sent + shared.setup.ttl),
                    (None, _) => from,
                };
                shared.grants.lock().expect("grants").push(Grant {
                    name,
                    client: k,
                    step: sp.step,
                    token,
                    sent,
                    from,
                    to,
                    gone_by,
                });
                let mut r = shared.report.lock().expect("report");
                r.grants += 1;
                r.spellings[k].grants += 1;
                *r.across_migration.entry(sp.step).or_default() += 1;
                50..300
            }
        };
        tokio::time::sleep(Duration::from_millis(rng.gen_range(pause))).await;
    }
    Ok(())
}

impl Shared {
    /// A CLI grant that names its servers came from the name's owners
    /// under the lists it was taken with: each of them, and no other.
    fn check_owner(&self, k: usize, sp: &Spelled, name: &str, lease: &LeaseJson) {
        let mut servers: Vec<&str> = lease
            .servers
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.server.as_str())
            .collect();
        if servers.is_empty() {
            servers.extend(lease.server.as_deref());
        }
        if servers.is_empty() {
            return;
        }
        let owners = &sp.owners[name];
        let mut granted: Vec<Option<u16>> = servers.iter().map(|s| port_of(s)).collect();
        let mut owned: Vec<Option<u16>> = owners.iter().map(|(_, port)| Some(*port)).collect();
        granted.sort_unstable();
        owned.sort_unstable();
        if granted != owned {
            self.report.lock().expect("report").misrouted += 1;
            self.violation(format!(
                "config spellings: client {k} ({:?}) was granted {name} under the lists of {} by {servers:?}, not by \
                 its owners {owners:?} (identity, port)",
                CLIENTS[k].0, sp.step
            ));
        }
    }
}

/// Every 2 to 5 s, the list with two IDs swapped asks for a random name,
/// through the CLI or the library: it must be refused, naming both IDs.
async fn wrong_ids(
    shared: Arc<Shared>,
    mut rng: StdRng,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    loop {
        let pause = Duration::from_millis(rng.gen_range(2_000..5_000));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        // The current list in force, its first two IDs swapped.
        let in_force = shared.setup.lists.now();
        let sp = shared.spelled(&in_force)?;
        let ids = &sp.swapped_ids;
        let name = format!("spelled-{}", rng.gen_range(0..NAMES));
        let library = rng.gen_bool(0.5);
        let sent = Instant::now();
        // Ok(granted lease, if the CLI printed one) or Err(refusal).
        let outcome: Result<Option<LeaseJson>, String> = if library {
            match ServerSpec::parse_list(&sp.swapped) {
                Err(e) => Err(e),
                Ok(specs) => match Cluster::connect(&specs).await {
                    Err(e) => Err(e.to_string()),
                    Ok(cluster) => {
                        // Connected: a name it routes to a member it
                        // agrees with would be granted; let it go again.
                        let got = cluster
                            .acquire(vec![name.clone()])
                            .ttl(shared.setup.ttl)
                            .send()
                            .await;
                        match got {
                            Ok(lease) => {
                                let _ = lease.release(None).await;
                                Ok(None)
                            }
                            Err(e) => Err(format!("connected, then: {e}")),
                        }
                    }
                },
            }
        } else {
            let out = tokio::time::timeout(
                Duration::from_secs(30),
                shared
                    .bagel(&sp.swapped)
                    .args(["acquire", &name, "--ttl", "1s", "--json"])
                    .output(),
            )
            .await
            .context("bagel acquire with the swapped list did not return within 30 s")??;
            if out.status.success() {
                Ok(serde_json::from_slice(&out.stdout).ok())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
            }
        };
        let how = if library { "the library" } else { "bagel acquire" };
        let down = ids.iter().any(|id| {
            shared
                .setup
                .outages
                .of_member_during(id, sent, Instant::now())
                .is_some()
        });
        let refused = matches!(&outcome, Err(e) if ids.iter().all(|id| e.contains(id.as_str())));
        {
            let mut r = shared.report.lock().expect("report");
            r.wrong_id_tries += 1;
            if refused {
                r.wrong_id_refused += 1;
            } else if down {
                r.wrong_id_unreachable += 1;
            } else {
                r.wrong_id_not_refused += 1;
            }
        }
        match outcome {
            _ if refused || down => {}
            outcome => {
                let what = match &outcome {
                    Ok(_) => format!("was granted {name}"),
                    Err(e) => format!("was refused {name} without naming both IDs: {e}"),
                };
                if let Ok(Some(lease)) = outcome {
                    // Free the name again for the other clients.
                    let file = shared.setup.dir.join("swapped.lease.json");
                    if std::fs::write(&file, serde_json::to_vec(&lease)?).is_ok() {
                        let _ = shared
                            .bagel_of(&sp, CLIENTS.len() - 1)
                            .args(["release", "--lease"])
                            .arg(&file)
                            .output()
                            .await;
                    }
                }
                println!(
                    "[{:>5.1}s] config spellings: the list with {} and {} swapped ({how}) {what}",
                    shared.at(),
                    ids[0],
                    ids[1]
                );
                shared.violation(format!(
                    "config spellings: a list with {} and {} swapped ({}) {what}: it must be refused at connect, \
                     naming both",
                    ids[0], ids[1], sp.swapped
                ));
            }
        }
    }
}
