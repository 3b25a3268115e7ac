//! Process metrics from `/proc/self`, named as every Prometheus client
//! names them (`process_*`), so stock dashboards work.
//!
//! Read at scrape time only. On a system without `/proc` the readings are
//! simply absent from the exposition.

use std::time::Duration;

/// One reading of this process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Process {
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    /// User + system CPU time.
    pub cpu: Option<Duration>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl Process {
    pub fn read() -> Process {
        let mut p = Process::default();
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            p.parse_stat(&stat);
        }
        p.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as u64);
        p.max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|limits| parse_max_open_files(&limits));
        p
    }

    /// `/proc/self/stat`: fields after the parenthesised command name
    /// (which may itself contain spaces and parentheses), see proc(5).
    fn parse_stat(&mut self, stat: &str) {
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return;
        };
        // `rest` starts at field 3 (state); field n is at index n - 3.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let ticks = rustix::param::clock_ticks_per_second();
        if let (Some(utime), Some(stime)) = (field(14), field(15))
            && ticks > 0
        {
            self.cpu = Some(Duration::from_secs_f64((utime + stime) as f64 / ticks as f64));
        }
        self.threads = field(20);
        self.virtual_bytes = field(23);
        self.resident_bytes = field(24).map(|pages| pages * rustix::param::page_size() as u64);
    }
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let p = Process::read();
        assert!(p.resident_bytes.unwrap() > 0);
        assert!(p.virtual_bytes.unwrap() >= p.resident_bytes.unwrap());
        assert!(p.threads.unwrap() >= 1);
        assert!(p.open_fds.unwrap() >= 3);
        assert!(p.max_fds.unwrap() >= p.open_fds.unwrap());
        assert!(p.cpu.is_some());
    }

    #[test]
    fn command_names_with_spaces_and_parentheses_do_not_shift_fields() {
        let mut p = Process::default();
        let stat = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 100 50 0 0 20 0 7 0 1234 4096000 250";
        p.parse_stat(stat);
        assert_eq!(p.threads, Some(7));
        assert_eq!(p.virtual_bytes, Some(4_096_000));
        assert_eq!(p.resident_bytes, Some(250 * rustix::param::page_size() as u64));
    }
}
