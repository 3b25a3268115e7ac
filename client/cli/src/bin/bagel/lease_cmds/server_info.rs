//! `bagel server-info`: the server's keys, limits, clock and readiness
//! (every server's with `--servers`; an S3 lease store's settings and
//! published keys with `--lease-store`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use bagel_client::{BackendInfo, ClockSource, LeaseBackend as _, ServerInfo, StoreInfo};
use clap::Args;
use serde_json::json;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct ServerInfoArgs {
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ServerInfoArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let (infos, v) = match backend.info().await? {
        BackendInfo::Store(store) => return store_info(&store, args.json),
        // One server: the one object, as always.
        BackendInfo::Server { url, info } => {
            let v = server_info_json(&info);
            (vec![(url, info)], v)
        }
        BackendInfo::Servers(infos) => {
            let v = infos.iter().map(|(_, i)| server_info_json(i)).collect();
            (infos, serde_json::Value::Array(v))
        }
        other => bail!("server-info: this lease backend says {other:?}, which this CLI cannot print"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
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
fn store_info(store: &StoreInfo, as_json: bool) -> anyhow::Result<ExitCode> {
    let keys = &store.keys;
    let us = |d: Duration| bagel_proto::duration_micros(d);
    let v = json!({
        "lease_store": store.location,
        "key_id": store.key_id,
        "min_ttl_us": us(store.min_ttl),
        "max_ttl_us": us(store.max_ttl),
        "max_wait_us": us(store.max_wait),
        "clock_margin_us": us(store.clock_margin),
        "keys": keys.ids().map(|id| json!({
            "key_id": id, "ed25519_hex": bagel_proto::hex::encode(keys.get(id).expect("listed").as_bytes())
        })).collect::<Vec<_>>(),
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "lease store {} (no server); this client signs with key {}",
            store.location, store.key_id
        );
        println!(
            "ttl: ({} us, {} us]; max wait {} us; clock margin {} us",
            us(store.min_ttl),
            us(store.max_ttl),
            us(store.max_wait),
            us(store.clock_margin)
        );
        for id in keys.ids() {
            println!(
                "key {id} ed25519 {}",
                bagel_proto::hex::encode(keys.get(id).expect("listed").as_bytes())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn server_info_json(info: &ServerInfo) -> serde_json::Value {
    let clock = &info.clock;
    let us = |d: Duration| bagel_proto::duration_micros(d);
    json!({
        "server_id": info.server_id,
        "version": info.version,
        "epoch_us": info.epoch.as_micros(),
        "ready": info.ready,
        "ready_at_us": info.ready_at.as_micros(),
        "now_us": info.now.as_micros(),
        "min_ttl_us": us(info.min_ttl),
        "max_ttl_us": us(info.max_ttl),
        "max_wait_us": us(info.max_wait),
        "forgotten_floor_us": info.forgotten_floor.as_micros(),
        "unsafe_skip_restart_wait": info.unsafe_skip_restart_wait,
        "keys": info.keys.iter().map(|(id, raw)| json!({
            "key_id": id, "ed25519_hex": bagel_proto::hex::encode(raw)
        })).collect::<Vec<_>>(),
        "clock": {
            "source": match clock.source {
                ClockSource::Roughtime => "roughtime",
                ClockSource::Local => "local",
            },
            "error_bound_us": us(clock.error_bound),
            "healthy": clock.healthy,
            "detail": clock.detail,
        },
        "limits": {
            "max_names_per_request": info.max_names_per_request,
            "max_name_bytes": info.max_name_bytes,
            "max_owner_bytes": info.max_owner_bytes,
            "max_metadata_bytes": info.max_metadata_bytes,
            "timestamp_tolerance_us": us(info.timestamp_tolerance),
        },
    })
}

fn print_server_info(info: &ServerInfo) {
    let us = |d: Duration| bagel_proto::duration_micros(d);
    println!("server {} (version {})", info.server_id, info.version);
    println!(
        "ready: {} (at {}){}",
        info.ready,
        info.ready_at,
        if info.unsafe_skip_restart_wait {
            " UNSAFE: restart wait skipped"
        } else {
            ""
        }
    );
    println!(
        "ttl: ({} us, {} us]; max wait {} us",
        us(info.min_ttl),
        us(info.max_ttl),
        us(info.max_wait)
    );
    for (id, raw) in &info.keys {
        println!("key {id} ed25519 {}", bagel_proto::hex::encode(raw));
    }
    println!(
        "clock: {} (error bound {} us)",
        info.clock.detail,
        us(info.clock.error_bound)
    );
}
