//! The phase's network: three namespaces in a star, and the cuts.

use std::path::Path;

use tokio::process::Command;

use crate::partitions::ip;

/// The three namespaces: the store's in the middle, a veth pair to each
/// of the writers' and the closer's.
pub(super) struct StoreNet {
    pub(super) store_ns: String,
    pub(super) writer_ns: String,
    pub(super) closer_ns: String,
    /// (store side, client side) addresses of the writers' link and of
    /// the closer's.
    writer_link: (String, String),
    closer_link: (String, String),
}

impl StoreNet {
    /// Makes the namespaces (named after `tag`, this run's pid) and the
    /// links, each a /30 of its own inside a /29 for the run.
    pub(super) async fn create(tag: u32) -> anyhow::Result<StoreNet> {
        let tag = tag % 100_000;
        let base = |host: u32| format!("10.232.{}.{}", (tag / 32) % 256, (tag % 32) * 8 + host);
        let net = StoreNet {
            store_ns: format!("bagel-ss-{tag}"),
            writer_ns: format!("bagel-sw-{tag}"),
            closer_ns: format!("bagel-sc-{tag}"),
            writer_link: (base(1), base(2)),
            closer_link: (base(5), base(6)),
        };
        let mut steps: Vec<Vec<String>> = [&net.store_ns, &net.writer_ns, &net.closer_ns]
            .iter()
            .map(|ns| args(&["netns", "add", ns]))
            .collect();
        for (ns, (store_ip, client_ip), (s_if, c_if)) in [
            (
                &net.writer_ns,
                &net.writer_link,
                (format!("bssw{tag}"), format!("bsw{tag}")),
            ),
            (
                &net.closer_ns,
                &net.closer_link,
                (format!("bssc{tag}"), format!("bsc{tag}")),
            ),
        ] {
            steps.extend([
                args(&[
                    "link",
                    "add",
                    &s_if,
                    "netns",
                    &net.store_ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &c_if,
                    "netns",
                    ns,
                ]),
                args(&[
                    "-n",
                    &net.store_ns,
                    "addr",
                    "add",
                    &format!("{store_ip}/30"),
                    "dev",
                    &s_if,
                ]),
                args(&["-n", ns, "addr", "add", &format!("{client_ip}/30"), "dev", &c_if]),
                args(&["-n", &net.store_ns, "link", "set", &s_if, "up"]),
                args(&["-n", ns, "link", "set", &c_if, "up"]),
            ]);
        }
        for ns in [&net.store_ns, &net.writer_ns, &net.closer_ns] {
            steps.push(args(&["-n", ns, "link", "set", "lo", "up"]));
        }
        for step in steps {
            if let Err(e) = ip(&step).await {
                net.remove().await;
                return Err(e.context("setting up the store partition namespaces (needs iproute2 and root)"));
            }
        }
        Ok(net)
    }

    /// The store's address as seen from namespace `ns`.
    pub(super) fn store_ip_for(&self, ns: &str) -> &str {
        if ns == self.closer_ns {
            &self.closer_link.0
        } else {
            &self.writer_link.0
        }
    }

    /// A command run inside namespace `ns`.
    pub(super) fn exec(&self, ns: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// The blackhole routes of a cut: in the client's namespace to the
    /// store (requests lost), in the store's to the client (answers lost).
    pub(super) fn routes(&self, kind: &str, direction: &str) -> Vec<Vec<String>> {
        let (ns, (store_ip, client_ip)) = match kind {
            "writer_to_store" => (&self.writer_ns, &self.writer_link),
            _ => (&self.closer_ns, &self.closer_link),
        };
        let answers = vec![self.store_ns.clone(), format!("{client_ip}/32")];
        let requests = vec![ns.clone(), format!("{store_ip}/32")];
        match direction {
            "both" => vec![requests, answers],
            _ => vec![answers],
        }
    }

    pub(super) async fn cut(&self, kind: &str, direction: &str) -> anyhow::Result<()> {
        for r in self.routes(kind, direction) {
            ip(&args(&["-n", &r[0], "route", "add", "blackhole", &r[1]])).await?;
        }
        Ok(())
    }

    pub(super) async fn heal(&self, kind: &str, direction: &str) -> anyhow::Result<()> {
        for r in self.routes(kind, direction) {
            ip(&args(&["-n", &r[0], "route", "del", "blackhole", &r[1]])).await?;
        }
        Ok(())
    }

    /// Removes the namespaces (the veth pairs go with them).
    pub(super) async fn remove(&self) {
        for ns in [&self.store_ns, &self.writer_ns, &self.closer_ns] {
            let _ = ip(&args(&["netns", "del", ns])).await;
        }
    }
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}
