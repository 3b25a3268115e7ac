//! The bag measurements as the run drives them: writes/s, PUTs per batch
//! and metronome lag (`bags`), the bag path at scale (`--bag-path`), and
//! a run of the bag path alone. Apart from the lease measurements because
//! they share nothing with them but the report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::args::Args;
use crate::bench::Bench;
use crate::cpus::Cpus;
use crate::procs::WorkDir;
use crate::report::{self, Report};
use crate::{bags, command_line, s3};

impl Bench {
    /// The bag measurements (see [`bags`]): POSIX writes/s on a tmpfs
    /// directory, S3 PUTs per batch on moto, metronome lag on both. A part
    /// that cannot run is listed as not measured.
    pub(crate) async fn bags(&mut self) {
        const BAG_GRACE: Duration = Duration::from_millis(200);
        let (writes_for, lag_for) = (self.settings.bag_writes, self.settings.bag_metronome);
        eprintln!("== bags on a POSIX directory");
        let posix = async {
            let dir = self.work.data_dir("bags")?;
            let medium = if dir.tmpfs { "tmpfs" } else { "disk" };
            let rows = bags::posix_writes(&dir.path, medium, &[1000, 100], writes_for).await?;
            let lag_root = dir.path.join("lag");
            std::fs::create_dir_all(&lag_root)?;
            let store = Arc::new(bagel_bags::store::directory::DirectoryStore::local(
                &lag_root, true,
            ));
            let lag =
                bags::metronome_lag(store, &format!("posix ({medium}, fsync)"), BAG_GRACE, lag_for).await?;
            anyhow::Ok((rows, lag))
        }
        .await;
        match posix {
            Ok((rows, lag)) => {
                self.report.bags.writes.extend(rows);
                self.report.bags.metronome.push(lag);
            }
            Err(e) => {
                self.missing(
                    "bag writes/s on a POSIX directory (100-byte payloads, batched)",
                    format!("{e:#}"),
                );
                self.missing("metronome lag (POSIX)", format!("{e:#}"));
            }
        }
        eprintln!("== bags on S3 (moto)");
        let python = self.args.moto_python();
        let s3 = async {
            let server = s3::start(&self.work, &python, &self.args.s3_script).await?;
            let r = async {
                let inner = s3::store(server.addr)?;
                let max = if self.args.quick { 300 } else { 2000 };
                let mut puts = Vec::new();
                for batch in [1000, 100] {
                    puts.push(bags::s3_puts(inner.clone(), batch, writes_for * 2, max).await?);
                }
                let (store, _) = bags::counted_s3(inner, "bags-lag").await?;
                let lag = bags::metronome_lag(store, "s3 (moto)", BAG_GRACE, lag_for).await?;
                anyhow::Ok((puts, lag))
            }
            .await;
            server.stop().await;
            r
        }
        .await;
        match s3 {
            Ok((puts, lag)) => {
                self.report.bags.s3_puts.extend(puts);
                self.report.bags.metronome.push(lag);
            }
            Err(e) => {
                self.missing("PUTs per batch on S3", format!("{e:#}"));
                self.missing("metronome lag (S3)", format!("{e:#}"));
            }
        }
        self.bag_path().await;
    }

    /// A bag-path point that cannot run: said loudly, listed in the
    /// bag-path tables and as not measured.
    fn skip_bag_path(&mut self, what: String, why: String) {
        eprintln!("!! SKIPPED {what}: {why}");
        self.report.bags.bag_path_skipped.push(bags::Skipped {
            what: what.clone(),
            why: why.clone(),
        });
        self.missing(what, why);
    }

    /// The bag path at scale (see [`bags::writers`] and
    /// [`bags::many_logs`]): concurrent writers on every store of
    /// `--bag-stores`, then a metronome over many logs on tmpfs and S3.
    async fn bag_path(&mut self) {
        let (writers_for, logs_for) = (self.settings.bag_writers, self.settings.bag_logs);
        let batch = self.args.bag_writer_batch.max(1);
        let procs = self.args.bag_writer_procs;
        let counts = self.args.bag_writers.clone();
        let stores = self.args.bag_stores.clone();
        let wants = |s: &str| stores.iter().any(|x| x == s);
        self.report.bags.bag_path_settings = Some(serde_json::json!({
            "batch": batch,
            "payload_bytes": bags::PAYLOAD_BYTES,
            "writers": counts,
            "writers_duration_s": writers_for.as_secs_f64(),
            "max_processes": procs,
            "stores": stores,
            "fsync": bagel_bags::BagConfig::default().sync,
            "logs": self.args.bag_logs,
            "logs_duration_s": logs_for.as_secs_f64(),
            "logs_writes_per_s": bags::many_logs::WRITES_PER_S,
            "logs_grace_ms": bags::many_logs::GRACE.as_millis() as u64,
        }));

        // The stores. A tmpfs: the harness's own mount, else /dev/shm.
        let tmp = self.work.data_dir("bag-path");
        let tmpfs_root = match &tmp {
            Ok(d) if d.tmpfs => Some((d.path.clone(), "tmpfs".to_owned())),
            _ if std::path::Path::new("/dev/shm").is_dir() => Some((
                std::path::PathBuf::from(format!("/dev/shm/bagel-bench-{}", std::process::id())),
                "tmpfs (/dev/shm)".to_owned(),
            )),
            _ => None,
        };
        let disk_root = self.work.path.join("bag-path-disk");
        let disk_medium = format!("disk ({})", fs_type(&self.work.path));
        let python = self.args.moto_python();
        let moto = if wants("s3") {
            match s3::start(&self.work, &python, &self.args.s3_script).await {
                Ok(server) => Some(server),
                Err(e) => {
                    let why = format!("moto did not start: {e:#}");
                    self.skip_bag_path("writers on S3 (moto)".into(), why.clone());
                    self.skip_bag_path("metronome over many logs on S3 (moto)".into(), why);
                    None
                }
            }
        } else {
            None
        };
        let mut targets = Vec::new();
        for s in &stores {
            match s.as_str() {
                "tmpfs" => match &tmpfs_root {
                    Some((root, medium)) => targets.push(bags::writers::Target::Dir {
                        root: root.join("writers"),
                        medium: medium.clone(),
                    }),
                    None => {
                        self.skip_bag_path("writers on tmpfs".into(), "no tmpfs to mount or /dev/shm".into())
                    }
                },
                "disk" => targets.push(bags::writers::Target::Dir {
                    root: disk_root.join("writers"),
                    medium: disk_medium.clone(),
                }),
                "s3" => {
                    if let Some(m) = &moto {
                        targets.push(bags::writers::Target::S3 {
                            addr: m.addr,
                            prefix: "bag-path-writers".into(),
                        });
                    }
                }
                "nfs" => match &self.args.nfs_url {
                    Some(url) => targets.push(bags::writers::Target::Nfs { url: url.clone() }),
                    None => self.skip_bag_path(
                        "writers on NFS (ganesha)".into(),
                        "no NFS store: BAGEL_NFS_URL_V3 is not set (source tests/support/common.sh and \
                         tests/support/nfs.sh, run nfs_start; or pass --nfs-url)"
                            .into(),
                    ),
                },
                other => self.skip_bag_path(
                    format!("writers on {other}"),
                    "unknown store (tmpfs, disk, s3, nfs)".into(),
                ),
            }
        }

        eprintln!("== bag path: concurrent writers");
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for target in &targets {
            for &n in &counts {
                for mode in ["tasks", "processes"] {
                    if mode == "processes" && procs == 0 {
                        continue;
                    }
                    let log = format!("writers-{run}/{mode}-{n}");
                    let r = if mode == "tasks" {
                        bags::writers::tasks_point(target, &log, n, batch, writers_for).await
                    } else {
                        bags::writers::processes_point(target, &log, n, procs, batch, writers_for).await
                    };
                    match r {
                        Ok(row) => {
                            bags::writers::print(&row);
                            self.report.bags.concurrent_writers.push(row);
                        }
                        Err(e) => self.skip_bag_path(
                            format!("writers on {} ({}), {mode}, {n}", target.store(), target.medium()),
                            format!("{e:#}"),
                        ),
                    }
                    if let bags::writers::Target::Dir { root, .. } = target {
                        let _ = std::fs::remove_dir_all(root.join(format!("writers-{run}")));
                    }
                }
            }
        }

        eprintln!("== bag path: a metronome over many logs");
        for &n in &self.args.bag_logs.clone() {
            if wants("tmpfs")
                && let Some((root, medium)) = &tmpfs_root
            {
                let root = root.join(format!("logs-{n}"));
                let r = async {
                    std::fs::create_dir_all(&root)?;
                    let writes = Arc::new(bagel_bags::store::directory::DirectoryStore::local(&root, true));
                    let counting = bagel_bags::store::counting::CountingFs::new(Arc::new(
                        bagel_bags::store::fsops::StdFs::new(&root),
                    ));
                    let counter = bags::many_logs::Counter::Fs(counting.counts.clone());
                    let closes = Arc::new(bagel_bags::store::directory::DirectoryStore::new(
                        Arc::new(counting),
                        true,
                    ));
                    bags::many_logs::measure(writes, closes, counter, ("posix", medium), n, logs_for).await
                }
                .await;
                let _ = std::fs::remove_dir_all(&root);
                match r {
                    Ok(row) => self.report.bags.metronome_many_logs.push(row),
                    Err(e) => {
                        self.skip_bag_path(format!("metronome over {n} logs on {medium}"), format!("{e:#}"))
                    }
                }
            }
            if let Some(m) = &moto {
                let addr = m.addr;
                let r = async {
                    let inner = s3::store(addr)?;
                    let prefix = format!("bag-path-logs{n}");
                    let (writes, _) = bags::counted_s3(inner.clone(), &prefix).await?;
                    let (closes, counts) = bags::counted_s3(inner, &prefix).await?;
                    let counter = bags::many_logs::Counter::S3(counts);
                    bags::many_logs::measure(writes, closes, counter, ("s3", "moto"), n, logs_for).await
                }
                .await;
                match r {
                    Ok(row) => self.report.bags.metronome_many_logs.push(row),
                    Err(e) => {
                        self.skip_bag_path(format!("metronome over {n} logs on S3 (moto)"), format!("{e:#}"))
                    }
                }
            }
        }
        if let Some(m) = moto {
            m.stop().await;
        }
        if let Some((root, medium)) = &tmpfs_root
            && medium != "tmpfs"
        {
            let _ = std::fs::remove_dir_all(root);
        }
        let _ = std::fs::remove_dir_all(&disk_root);
        drop(tmp);
    }
}

/// `--bag-path`: only the bag-path measurements, into `bag-path.md` and
/// `bag-path.json` in `--out`.
pub(crate) async fn bag_path_only(args: Args, machine: &Cpus) -> Result<()> {
    let started = Instant::now();
    let report = Report {
        command: command_line(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        machine: report::Machine::detect(machine.len()),
        ..Default::default()
    };
    let work = WorkDir::new()?;
    work.set_server_cpus(args.server_cpus.clone());
    let mut bench = Bench {
        work,
        settings: args.settings(),
        args,
        round: 0,
        report,
    };
    bench.bag_path().await;
    let r = &bench.report;
    let m = &r.machine;
    let mut md = format!(
        "# Bag path\n\nRun {} on {} cores ({}), {} RAM, Linux {}; load average at start: {}.\n\nCommand: `{}`\n",
        r.started_at, m.cores, m.cpu, m.mem_total, m.kernel, m.loadavg_at_start, r.command
    );
    md.push_str(&r.bags.path_markdown());
    if !r.missing.is_empty() {
        md.push_str("\n## Not measured\n\n");
        for x in &r.missing {
            md.push_str(&format!("* {}: {}\n", x.what, x.why));
        }
    }
    let out = &bench.args.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("bag-path.md"), &md)?;
    let json = serde_json::json!({
        "command": r.command,
        "started_at": r.started_at,
        "machine": r.machine,
        "bags": {
            "concurrent_writers": r.bags.concurrent_writers,
            "metronome_many_logs": r.bags.metronome_many_logs,
            "bag_path_skipped": r.bags.bag_path_skipped,
            "bag_path_settings": r.bags.bag_path_settings,
        },
        "missing": r.missing,
    });
    std::fs::write(out.join("bag-path.json"), serde_json::to_string_pretty(&json)?)?;
    eprintln!(
        "done in {:.0} s; wrote {}/bag-path.md and bag-path.json",
        started.elapsed().as_secs_f64(),
        out.display()
    );
    print!("{md}");
    Ok(())
}

/// The file system type `path` lives on (the longest mount point above
/// it in /proc/mounts), e.g. `ext4`, `tmpfs`.
fn fs_type(path: &std::path::Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point).then(|| (point.len(), kind.to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map_or_else(|| "unknown".into(), |(_, k)| k)
}
