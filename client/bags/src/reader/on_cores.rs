//! Spreading signature checks over the machine's cores.

use std::sync::Arc;

/// The fewest signature checks worth a thread of their own.
const PER_THREAD: usize = 32;

/// Work sent to the machine's cores: done already (too little to share
/// out), or running in blocking tasks, each on a contiguous chunk.
pub(super) enum OnCores<T, R> {
    Done(Vec<(T, R)>),
    Running(Vec<tokio::task::JoinHandle<Vec<(T, R)>>>),
}

impl<T, R> OnCores<T, R> {
    /// Each item with its result, in the order given.
    pub(super) async fn join(self) -> Vec<(T, R)> {
        match self {
            OnCores::Done(out) => out,
            OnCores::Running(handles) => {
                let mut out = Vec::new();
                for h in handles {
                    match h.await {
                        Ok(done) => out.extend(done),
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(e) => panic!("a signature check task was cancelled: {e}"),
                    }
                }
                out
            }
        }
    }
}

/// Applies `f` to every item, spread over the machine's cores in
/// contiguous chunks (blocking tasks, not waited for here); a few items
/// are done at once.
pub(super) fn on_cores<T, R, F>(items: Vec<T>, f: F) -> OnCores<T, R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(&T) -> R + Send + Sync + 'static,
{
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let tasks = cores.min(items.len() / PER_THREAD).max(1);
    fn run<T, R>(chunk: Vec<T>, f: &impl Fn(&T) -> R) -> Vec<(T, R)> {
        chunk
            .into_iter()
            .map(|t| {
                let r = f(&t);
                (t, r)
            })
            .collect()
    }
    if tasks == 1 {
        return OnCores::Done(run(items, &f));
    }
    let f = Arc::new(f);
    let per = items.len().div_ceil(tasks);
    let mut rest = items;
    let mut handles = Vec::with_capacity(tasks);
    while !rest.is_empty() {
        let tail = rest.split_off(per.min(rest.len()));
        let chunk = std::mem::replace(&mut rest, tail);
        let f = Arc::clone(&f);
        handles.push(tokio::task::spawn_blocking(move || run(chunk, f.as_ref())));
    }
    OnCores::Running(handles)
}
