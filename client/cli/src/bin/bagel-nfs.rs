//! `bagel-nfs`: a small tool for the userspace NFS backend.
//!
//! `bagel-nfs ls nfs://host[:port]/export/dir[?version=3|4&mountport=N] [SUBDIR]`
//! lists a directory through the same client the `nfs://` store uses (one
//! entry a line, directories with a trailing `/`) and exits 0 when the
//! server answered: `tests/support/nfs.sh` waits on it as its readiness
//! probe.

use std::time::Duration;

use anyhow::Context as _;
use bagel_bags::store::fsops::FsOps as _;
use bagel_bags::store::nfs::NfsFs;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["ls", url] | ["ls", url, _] => {
            let fs = NfsFs::open(url, Duration::from_secs(5))
                .await
                .with_context(|| format!("connecting to {url}"))?;
            let dir = args.get(2).map_or("", String::as_str);
            let mut entries = fs
                .list_dir(dir)
                .await
                .with_context(|| format!("listing {dir:?}"))?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for e in entries {
                println!("{}{}", e.name, if e.is_dir { "/" } else { "" });
            }
            Ok(())
        }
        _ => anyhow::bail!(
            "usage: bagel-nfs ls nfs://host[:port]/export/dir[?version=3|4&mountport=N] [SUBDIR]"
        ),
    }
}
