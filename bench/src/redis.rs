//! Redis 7 (Debian `redis-server`), one instance on 127.0.0.1, persistence
//! off (an in-RAM lock service, like bagel), its directory on tmpfs.
//!
//! A lease cycle is the classic single-instance Redis lock:
//! `SET name token NX PX ttl`, released by a compare-and-delete script (only
//! the holder's token deletes the key). A name set is taken by a script that
//! checks every key and sets them all or none.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use redis::aio::MultiplexedConnection;
use tokio::process::Command;

use crate::driver::{LeaseDriver, random_token};
use crate::floor::FloorRow;
use crate::procs::{Server, WorkDir, free_port};

const RELEASE: &str = r"
local n = 0
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then n = n + redis.call('DEL', k) end
end
return n
";

const ACQUIRE_ALL: &str = r"
for _, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then return 0 end
end
for _, k in ipairs(KEYS) do
  redis.call('SET', k, ARGV[1], 'PX', ARGV[2])
end
return 1
";

/// Redis's I/O threads for the `redis-io` peer: 4 is the count Redis's own
/// configuration notes suggest for a machine of 8 or more cores.
pub const IO_THREADS: u32 = 4;

/// Starts `redis-server` on a free port and waits until it answers PING;
/// with `io_threads` above 1 it reads and writes on that many threads, but
/// never more than the CPUs it is pinned to (Redis's I/O threads spin while
/// they wait: four of them on one CPU starve the main thread).
pub async fn start(work: &WorkDir, binary: &str, io_threads: u32) -> Result<Server> {
    let cpus = work
        .server_cpus()
        .map_or(u32::MAX, |c| u32::try_from(c.len()).unwrap_or(u32::MAX));
    let io_threads = io_threads.min(cpus);
    let port = free_port()?;
    let data = work.data_dir("redis")?;
    let mut cmd = Command::new(binary);
    cmd.args(["--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--dir")
        .arg(&data.path)
        .args(["--save", "", "--appendonly", "no"])
        .args(["--protected-mode", "no", "--daemonize", "no"]);
    if io_threads > 1 {
        cmd.arg("--io-threads")
            .arg(io_threads.to_string())
            .args(["--io-threads-do-reads", "yes"]);
    }
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut server = Server::spawn("redis", work, cmd, addr, Some(data))?;
    server
        .wait_ready(
            Duration::from_secs(30),
            |addr| async move { ping(addr).await.is_ok() },
        )
        .await?;
    Ok(server)
}

/// The `redis` crate's default bound on an answer, 500 ms, fails a SET
/// whenever the load generator's runtime is busy for half a second (as it
/// is while a million held leases of the measurement before are dropped);
/// the harness bounds each operation itself (10 s per hold), so the
/// connection gets the same bound.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

async fn connect(addr: SocketAddr) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

async fn ping(addr: SocketAddr) -> Result<()> {
    let mut c = connect(addr).await?;
    let _: String = redis::cmd("PING").query_async(&mut c).await?;
    Ok(())
}

/// The round-trip floor: PING over one multiplexed connection (the same
/// client as the cycles), back to back.
pub async fn floor(addr: SocketAddr, warmup: Duration, duration: Duration) -> Result<FloorRow> {
    let c = connect(addr).await?;
    crate::floor::measure("redis", "PING", warmup, duration, || {
        let mut c = c.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut c).await?;
            Ok(())
        }
    })
    .await
}

/// The client side: a pool of multiplexed connections, worker `i` on
/// connection `i % pool`.
#[derive(Debug)]
pub struct RedisDriver {
    conns: Vec<MultiplexedConnection>,
    release: redis::Script,
    acquire_all: redis::Script,
}

#[derive(Debug)]
pub struct RedisHeld {
    names: Vec<String>,
    token: String,
}

impl RedisDriver {
    pub async fn connect(addr: SocketAddr, pool: usize) -> Result<Self> {
        let mut conns = Vec::with_capacity(pool);
        for _ in 0..pool.max(1) {
            conns.push(connect(addr).await.context("connecting to redis")?);
        }
        Ok(Self {
            conns,
            release: redis::Script::new(RELEASE),
            acquire_all: redis::Script::new(ACQUIRE_ALL),
        })
    }
}

impl LeaseDriver for RedisDriver {
    type Held = RedisHeld;

    fn max_names(&self) -> usize {
        64
    }

    async fn acquire(&self, worker: usize, names: &[String], ttl: Duration) -> Result<Option<RedisHeld>> {
        let mut c = self.conns[worker % self.conns.len()].clone();
        let token = random_token();
        let ttl_ms = u64::try_from(ttl.as_millis())?.max(1);
        let won = if let [name] = names {
            let ok: Option<String> = redis::cmd("SET")
                .arg(name)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut c)
                .await?;
            ok.is_some()
        } else {
            let mut inv = self.acquire_all.prepare_invoke();
            for n in names {
                inv.key(n);
            }
            let r: i64 = inv.arg(&token).arg(ttl_ms).invoke_async(&mut c).await?;
            r == 1
        };
        Ok(won.then(|| RedisHeld {
            names: names.to_vec(),
            token,
        }))
    }

    async fn release(&self, worker: usize, held: RedisHeld) -> Result<()> {
        let mut c = self.conns[worker % self.conns.len()].clone();
        let mut inv = self.release.prepare_invoke();
        for n in &held.names {
            inv.key(n);
        }
        let deleted: i64 = inv.arg(&held.token).invoke_async(&mut c).await?;
        anyhow::ensure!(
            deleted == held.names.len() as i64,
            "released {deleted} of {} keys (lease expired?)",
            held.names.len()
        );
        Ok(())
    }
}
