//! The threads that read `List` pages and the side port's searches:
//! `--list-pages` of them, each started once at a lower CPU priority
//! (nice [`NICE`]) than the threads that serve grants.
//!
//! Why a lower priority: a page of 5,000 names is milliseconds of CPU, and
//! reads on a thread of the same priority take the kernel's fair half of
//! a core from the runtime whenever one runs. One tenant's flood of
//! `List`s, answered in turn, thus kept a read running at all times: on a
//! server pinned to one core another tenant's acquire/release cycles fell
//! to 0.18x of their rate alone, the reads taking half the core and
//! encoding their answers a sixth more. At nice 10 the kernel gives the
//! runtime about nine tenths of a contended core and the reads the rest,
//! and all of an idle one: the other tenant ran at 0.42x (`bagel-bench
//! --noisy-neighbour`, see the operating docs). Page turns still go round
//! by identity ([`super::list_turns`]); this only keeps reads, of whoever,
//! from slowing grants and renewals. A read of an identity that reads
//! little skips both, on the light lane ([`super::light_lane`]).
//!
//! Why threads of their own, not tokio's blocking pool with the priority
//! lowered for each read and raised after: an unprivileged thread may
//! lower its own priority but never raise it again (`RLIMIT_NICE`), and
//! the blocking pool's threads also do the server's own blocking work
//! (the granted-until mark's writes), which must never run at a reader's
//! priority.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

/// How much lower the readers' priority is than the runtime's (nice
/// values: 0 normal, 19 lowest).
pub const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The reader threads (see the module docs); they end when this is
/// dropped and their jobs are done.
#[derive(Debug)]
pub struct Readers {
    jobs: mpsc::Sender<Job>,
}

impl Readers {
    /// Starts `n` reader threads (at least one).
    pub fn start(n: usize) -> Readers {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..n.max(1) {
            let queue = Arc::clone(&queue);
            let started = std::thread::Builder::new()
                .name(format!("bagel-reader-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        // One job at a time: the lock is held only to take it.
                        let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        match job {
                            Ok(job) => job(),
                            Err(mpsc::RecvError) => return,
                        }
                    }
                });
            if let Err(e) = started {
                tracing::error!(error = %e, "could not start a List reader thread");
            }
        }
        Readers { jobs }
    }

    /// Runs `job` on a reader thread as soon as one is free. False when no
    /// reader is left to run it (the job is dropped).
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.jobs.send(Box::new(job)).is_ok()
    }
}

/// Lowers the calling thread's priority by [`NICE`] (on Linux a process
/// priority set with `PRIO_PROCESS` and id 0 is the calling thread's).
/// Where that is not allowed, the reads run at the normal priority, and
/// the server says so once.
fn lower_priority() {
    if let Err(e) = rustix::process::setpriority_process(None, NICE) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(error = %e, "could not lower the List readers' CPU priority; they compete with grants for the CPU");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job runs on a reader thread, niced, and its answer comes back;
    /// dropping the readers ends the threads (the job's sender is gone).
    #[test]
    fn jobs_run_on_a_lower_priority_thread() {
        let readers = Readers::start(2);
        let (tx, rx) = mpsc::channel();
        assert!(readers.run(move || {
            let nice = rustix::process::getpriority_process(None).unwrap();
            let name = std::thread::current().name().map(str::to_owned);
            tx.send((nice, name)).unwrap();
        }));
        let (nice, name) = rx.recv().unwrap();
        assert_eq!(nice, NICE);
        assert!(name.unwrap().starts_with("bagel-reader-"));
        drop(readers);
    }
}
