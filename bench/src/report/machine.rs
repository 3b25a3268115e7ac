//! The machine a run measured on, from /proc.

use serde::Serialize;

#[derive(Debug, Default, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub kernel: String,
    pub mem_total: String,
    /// /proc/loadavg when the run started: other work on the machine skews
    /// every number.
    pub loadavg_at_start: String,
}

impl Machine {
    /// `cores`: the CPUs this process may use, read before `--client-cpus`
    /// narrowed its mask (read after, a pinned run would report its
    /// generator's cores as the machine's).
    pub fn detect(cores: usize) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        Machine {
            cores,
            cpu: field(&cpuinfo, "model name"),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            mem_total: field(&meminfo, "MemTotal"),
            loadavg_at_start: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}
