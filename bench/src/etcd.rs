//! etcd 3.4 (Debian `etcd-server`), a single member on 127.0.0.1 with its
//! data directory on tmpfs, driven over its v3 gRPC API.
//!
//! A lease cycle is what an etcd user writes for "hold these names until a
//! deadline": `LeaseGrant(ttl)`, then one `Txn` that creates every key with
//! the lease only if none exists (`create_revision == 0`), then
//! `LeaseRevoke`, which deletes the keys. Three round trips, each a Raft
//! write with an fsync (cheap here: tmpfs).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::Command;
use tonic::transport::Channel;

use crate::driver::LeaseDriver;
use crate::procs::{Server, WorkDir, free_port};

#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;

/// Starts `etcd` on a free port, data on tmpfs, and waits until a
/// transaction goes through.
pub async fn start(work: &WorkDir, binary: &str) -> Result<Server> {
    let client_port = free_port()?;
    let peer_port = free_port()?;
    let data = work.data_dir("etcd")?;
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(binary);
    cmd.arg("--name")
        .arg("bench")
        .arg("--data-dir")
        .arg(&data.path)
        .arg("--listen-client-urls")
        .arg(&client_url)
        .arg("--advertise-client-urls")
        .arg(&client_url)
        .arg("--listen-peer-urls")
        .arg(&peer_url)
        .arg("--initial-advertise-peer-urls")
        .arg(&peer_url)
        .arg("--initial-cluster")
        .arg(format!("bench={peer_url}"))
        .arg("--initial-cluster-state")
        .arg("new")
        // Every cycle adds revisions; keep the history bounded.
        .args(["--auto-compaction-mode", "revision"])
        .args(["--auto-compaction-retention", "100000"])
        .args(["--logger", "zap", "--log-level", "warn"]);
    let addr: SocketAddr = format!("127.0.0.1:{client_port}").parse()?;
    let mut server = Server::spawn("etcd", work, cmd, addr, Some(data))?;
    server
        .wait_ready(Duration::from_secs(60), |addr| async move {
            probe(addr).await.is_ok()
        })
        .await?;
    Ok(server)
}

async fn probe(addr: SocketAddr) -> Result<()> {
    let ch = connect(addr).await?;
    KvClient::new(ch).txn(pb::TxnRequest::default()).await?;
    Ok(())
}

async fn connect(addr: SocketAddr) -> Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?)
}

/// The client side: a pool of gRPC connections (HTTP/2), worker `i` on
/// connection `i % pool`.
#[derive(Debug)]
pub struct EtcdDriver {
    conns: Vec<(KvClient<Channel>, LeaseClient<Channel>)>,
}

impl EtcdDriver {
    pub async fn connect(addr: SocketAddr, pool: usize) -> Result<Self> {
        let mut conns = Vec::with_capacity(pool);
        for _ in 0..pool.max(1) {
            let ch = connect(addr).await.context("connecting to etcd")?;
            conns.push((KvClient::new(ch.clone()), LeaseClient::new(ch)));
        }
        Ok(Self { conns })
    }

    fn conn(&self, worker: usize) -> (KvClient<Channel>, LeaseClient<Channel>) {
        self.conns[worker % self.conns.len()].clone()
    }
}

/// etcd lease TTLs are whole seconds (and at least ~2 s on a default member).
fn ttl_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

impl LeaseDriver for EtcdDriver {
    type Held = i64;

    fn max_names(&self) -> usize {
        // etcd's default --max-txn-ops is 128.
        64
    }

    async fn acquire(&self, worker: usize, names: &[String], ttl: Duration) -> Result<Option<i64>> {
        let (mut kv, mut lease) = self.conn(worker);
        let granted = lease
            .lease_grant(pb::LeaseGrantRequest {
                ttl: ttl_seconds(ttl),
                id: 0,
            })
            .await?
            .into_inner();
        let id = granted.id;
        let txn = pb::TxnRequest {
            compare: names
                .iter()
                .map(|n| pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: n.as_bytes().to_vec(),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                    range_end: Vec::new(),
                })
                .collect(),
            success: names
                .iter()
                .map(|n| pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                        key: n.as_bytes().to_vec(),
                        value: b"bench".to_vec(),
                        lease: id,
                    })),
                })
                .collect(),
            failure: Vec::new(),
        };
        let won = kv.txn(txn).await?.into_inner().succeeded;
        if won {
            Ok(Some(id))
        } else {
            // Somebody holds a name: give the unused lease back.
            lease.lease_revoke(pb::LeaseRevokeRequest { id }).await?;
            Ok(None)
        }
    }

    async fn release(&self, worker: usize, id: i64) -> Result<()> {
        let (_, mut lease) = self.conn(worker);
        lease.lease_revoke(pb::LeaseRevokeRequest { id }).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(5000)), 5);
        assert_eq!(ttl_seconds(Duration::from_millis(5001)), 6);
    }
}
