//! Where leases live, from the flags: a bagel server (`--server`, the
//! default) or S3 conditional writes (`--lease-store s3://bucket/prefix`).
//! `crate::target` turns these flags, with the server flags, into the one
//! lease backend every command uses.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_cli::{LeaseBackendOptions, S3Options, open_lease_backend};
use bagel_client::{ClientOptions, LeaseBackend, TimeOptions, TimeSource};
use bagel_proto::clock::{Clock, SystemClock};
use bagel_proto::{KeyRing, SignedClock};
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseConfig, SelfSignedClock};
use clap::Args;

use crate::time_cmds::RoughtimeArgs;

/// `--lease-store` and what an S3 lease store needs.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "S3 lease store (instead of a server)")]
pub struct StoreArgs {
    /// Keep leases on S3 instead of a lease server: `s3://bucket/prefix`
    /// (endpoint and credentials from the `AWS_*` variables). Replaces
    /// --server for every lease command. Needs signed time: --roughtime
    /// (or --unsafe-local-clock).
    #[arg(long, global = true, env = "BAGEL_LEASE_STORE", value_name = "URL")]
    pub lease_store: Option<String>,
    /// The ed25519 key this client signs its S3 lease witnesses with,
    /// created (mode 0600) if missing; its public key is published in the
    /// store. Default: `<state dir>/lease-key`.
    #[arg(long, global = true, env = "BAGEL_LEASE_KEY", value_name = "FILE")]
    pub lease_key: Option<PathBuf>,
    /// Others take over an S3 lease at least this long after its
    /// deadline, longer when the holder's clock error bound (stored in
    /// the lease object) plus their own is more. A client whose error
    /// bound (|offset| + radius + RTT/2 from Roughtime) is over half of it
    /// refuses to acquire, renew or release. The default fits the 5 s
    /// radius of roughenough 2.2 with up to 2 s of offset; all clients of
    /// a store should use the same value.
    #[arg(
        long,
        global = true,
        env = "BAGEL_CLOCK_MARGIN",
        default_value = "14s",
        value_parser = humantime::parse_duration
    )]
    pub clock_margin: Duration,
    /// The longest S3 lease this client grants.
    #[arg(long, global = true, default_value = "60s", value_parser = humantime::parse_duration)]
    pub lease_max_ttl: Duration,
    /// The longest one S3 acquire polls a busy name for; a longer `--wait`
    /// is made of several such rounds.
    #[arg(long, global = true, default_value = "60s", value_parser = humantime::parse_duration)]
    pub lease_max_wait: Duration,
    /// UNSAFE (development only): S3 leases and writes on this host's
    /// clock, unchecked, self-signed with the lease key; and `metronome`,
    /// `read` and `audit` close bags on it. Two holders at once become
    /// possible when clocks disagree by more than the margin, and a clock
    /// ahead closes bags under writers that are on time.
    #[arg(long, global = true)]
    pub unsafe_local_clock: bool,
}

impl StoreArgs {
    /// Whether leases live on S3 (`--lease-store` given).
    pub fn has_lease_store(&self) -> bool {
        self.is_s3()
    }

    fn is_s3(&self) -> bool {
        self.lease_store.as_deref().is_some_and(|s| !s.is_empty())
    }

    /// `--lease-key`, else `<state dir>/lease-key` (the state directory
    /// created and checked to be this user's alone: a key someone else
    /// could plant there would sign this user's leases).
    fn key_path(&self) -> anyhow::Result<PathBuf> {
        match &self.lease_key {
            Some(path) => Ok(path.clone()),
            None => Ok(crate::written::state_dir_checked()?.path().join("lease-key")),
        }
    }

    fn signer(&self) -> anyhow::Result<bagel_proto::Signer> {
        let path = self.key_path()?;
        bagel_s3_lease::load_or_create_key(&path)
            .with_context(|| format!("loading the lease key {}", path.display()))
    }

    fn s3_config(&self) -> S3LeaseConfig {
        S3LeaseConfig::default()
            .with_clock_margin(self.clock_margin)
            .with_max_ttl(self.lease_max_ttl)
            .with_max_wait(self.lease_max_wait)
    }

    /// Opens (probes) the S3 lease store, when one is given.
    pub async fn open(&self, rt: &RoughtimeArgs) -> anyhow::Result<Option<Arc<dyn LeaseBackend>>> {
        let Some(url) = self.lease_store.as_deref().filter(|_| self.is_s3()) else {
            return Ok(None);
        };
        let config = self.s3_config();
        let time = self.lease_time(rt)?;
        // As before: a lease store URL that is not s3:// is refused by the
        // store's own check, not taken for a server.
        LeaseStore::from_url(url, config.op_timeout)?;
        let options = LeaseBackendOptions {
            s3: Some(S3Options {
                signer: self.signer()?,
                time,
                config,
            }),
            ..LeaseBackendOptions::default()
        };
        Ok(Some(open_lease_backend(url, &options).await?))
    }

    fn lease_time(&self, rt: &RoughtimeArgs) -> anyhow::Result<LeaseTime> {
        let servers = rt.servers()?;
        if !servers.is_empty() {
            return Ok(LeaseTime::Signed(TimeSource::roughtime(
                servers,
                TimeOptions::default(),
            )));
        }
        if self.unsafe_local_clock {
            eprintln!("bagel: UNSAFE: --unsafe-local-clock: S3 leases on this host's unchecked clock");
            return Ok(LeaseTime::UnsafeLocalClock(Arc::new(SystemClock)));
        }
        bail!(
            "S3 leases need signed time to check this host's clock: give --roughtime HOST:PORT \
             --roughtime-key KEY (or, for development only, --unsafe-local-clock)"
        )
    }

    /// The signed time a writer attaches to its batches: Roughtime when
    /// configured; else the lease server's; under S3 leases with
    /// --unsafe-local-clock, this host's clock signed with the lease key.
    pub async fn writer_time(
        &self,
        server: &str,
        client_options: &ClientOptions,
        rt: &RoughtimeArgs,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<dyn SignedClock>> {
        let opts = TimeOptions::default().with_clock(Arc::clone(&clock));
        if !self.is_s3() || !rt.servers()?.is_empty() {
            return Ok(Arc::new(rt.time_source(server, client_options, opts).await?));
        }
        if !self.unsafe_local_clock {
            bail!(
                "writing under S3 leases needs signed time: give --roughtime HOST:PORT --roughtime-key KEY \
                 (or, for development only, --unsafe-local-clock)"
            );
        }
        Ok(Arc::new(SelfSignedClock {
            signer: self.signer()?,
            clock,
            who: self.lease_store.clone().unwrap_or_default(),
            radius: self.clock_margin / 2,
        }))
    }

    /// The keys published in the S3 lease store (every client's that
    /// ever took a lease there), when one is given. A record there that is
    /// not a key is skipped with a warning naming it: a witness it would
    /// have verified then fails as signed by an unknown key, and nothing
    /// else is affected.
    pub async fn published_keys(&self) -> anyhow::Result<Option<KeyRing>> {
        let Some(url) = self.lease_store.as_deref().filter(|_| self.is_s3()) else {
            return Ok(None);
        };
        let store = LeaseStore::from_url(url, self.s3_config().op_timeout)?;
        let (published, skipped) = store
            .keys_report()
            .await
            .with_context(|| format!("reading the published keys of {url}"))?;
        for why in skipped {
            eprintln!("bagel: warning: skipped a key record of {url}: {why}");
        }
        Ok(Some(published))
    }
}
