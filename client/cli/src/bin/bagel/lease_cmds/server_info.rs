//! `bagel server-info`: the server's keys, limits, clock and readiness
//! (every server's with `--servers`; an S3 lease store's settings and
//! published keys with `--lease-store`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use bagel_cli::contract::{ServerInfoJson, StoreInfoJson};
use bagel_client::{BackendInfo, LeaseBackend as _, ServerInfo, StoreInfo};
use clap::Args;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct ServerInfoArgs {}

pub async fn run(_args: ServerInfoArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let infos = match target.backend().info().await? {
        BackendInfo::Store(store) => {
            if crate::output::json() {
                println!("{}", serde_json::to_string_pretty(&StoreInfoJson::from(&store))?);
            } else {
                print_store_info(&store);
            }
            return Ok(ExitCode::SUCCESS);
        }
        // One server: the one object, as always.
        BackendInfo::Server { info, .. } => {
            if crate::output::json() {
                println!("{}", serde_json::to_string_pretty(&ServerInfoJson::from(&info))?);
            } else {
                print_server_info(&info);
            }
            return Ok(ExitCode::SUCCESS);
        }
        BackendInfo::Servers(infos) => infos,
        other => bail!("server-info: this lease backend says {other:?}, which this CLI cannot print"),
    };
    if crate::output::json() {
        let all: Vec<_> = infos.iter().map(|(_, i)| ServerInfoJson::from(i)).collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for (url, info) in &infos {
            if infos.len() > 1 {
                println!("== {url}");
            }
            print_server_info(info);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `server-info` says of an S3 lease store: there is no server, so
/// its limits, margin and the keys published there.
fn print_store_info(store: &StoreInfo) {
    let keys = &store.keys;
    let d = |d: Duration| humantime::format_duration(d);
    println!(
        "lease store {} (no server); this client signs with key {}",
        store.location, store.key_id
    );
    println!(
        "ttl: over {}, at most {}; max wait {}; clock margin {}",
        d(store.min_ttl),
        d(store.max_ttl),
        d(store.max_wait),
        d(store.clock_margin)
    );
    for id in keys.ids() {
        println!(
            "key {id} ed25519 {}",
            bagel_proto::hex::encode(keys.get(id).expect("listed").as_bytes())
        );
    }
}

/// A server's info as text.
fn print_server_info(info: &ServerInfo) {
    let d = |d: Duration| humantime::format_duration(d);
    println!("server {} (version {})", info.server_id, info.version);
    println!(
        "ready: {} (at {}){}",
        info.ready,
        crate::human::at(info.ready_at),
        if info.unsafe_skip_restart_wait {
            " UNSAFE: restart wait skipped"
        } else {
            ""
        }
    );
    println!(
        "ttl: over {}, at most {}; max wait {}",
        d(info.min_ttl),
        d(info.max_ttl),
        d(info.max_wait)
    );
    for (id, raw) in &info.keys {
        println!("key {id} ed25519 {}", bagel_proto::hex::encode(raw));
    }
    println!(
        "clock: {} (error bound {})",
        info.clock.detail,
        d(info.clock.error_bound)
    );
    match info.members.as_slice() {
        // One server alone grants every name; nothing to say.
        [] => {}
        [current] => println!("members: {} (grants only the names it owns)", current.join(", ")),
        [current, next, ..] => println!(
            "members: {}; next: {} (grants the names it owns under either)",
            current.join(", "),
            next.join(", ")
        ),
    }
    print_access(info.access.as_deref());
}

/// Who the server takes this client for under its access policy, and
/// what it may do (or that it has no policy: anyone may do anything).
fn print_access(access: Option<&bagel_client::types::AccessInfo>) {
    let Some(a) = access else {
        println!("access: no policy (anonymous: any client may lease and read any name)");
        return;
    };
    println!(
        "access: policy version {} (sha256 {})",
        a.policy_version, a.policy_sha256
    );
    if a.identity.is_empty() {
        println!("you: no identity ({}): refused everything", a.identity_problem);
        return;
    }
    println!("you: {}", a.identity);
    if a.grants.is_empty() {
        println!("may: nothing (no grant names you)");
    }
    for (prefix, permissions) in &a.grants {
        println!("may {} names under {prefix:?}", permissions.join(" and "));
    }
}
