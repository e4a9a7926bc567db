//! The threads that run the executor's nodes: a pool that keeps about one running thread per
//! core, and never leaves a job waiting while all of its threads are blocked.
//!
//! Why not a fixed-size pool (rayon): kernels may block, a `_Recv` waiting on a rendezvous for a
//! `_Send` that another executor of the same process runs later in the step. With a fixed pool,
//! enough blocked receivers starve the senders they wait for, and the step hangs until its
//! deadline. Why not a new thread for every job that finds no idle one: a step's many short
//! nodes then wake a crowd of threads (twenty to thirty per daemon on two cores), and the
//! hand-offs between them cost more than the nodes.
//!
//! So a job goes to an idle thread when there is one, to a new thread while fewer threads than
//! the machine has cores are active (not blocked), and otherwise waits in the queue for the
//! next running thread to finish its job. A kernel that waits (a rendezvous, a queue, an
//! accumulator, a remote tensor, a nested step) says so with [`blocking`]: while it waits, its
//! thread does not count as active, and a queued job gets a thread of its own. Threads idle
//! for [`KEEP_ALIVE`] exit.
//!
//! Invariant (under the lock, below [`MAX_THREADS`]): a queued job beyond the idle threads has
//! a running thread ahead of it that is not blocked and takes the job when it is done. A wait
//! that forgot to say so would break that, and its step could hang until its deadline; as a
//! backstop, a queue that has not moved for [`STALL`] gets one more thread.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::Duration;

/// How long a thread with nothing to do waits before it exits.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The most threads a pool starts; past it, jobs queue for the next free thread. Far above
/// what a step has in flight, it only stops a runaway (tokio's blocking pool uses 512 too).
pub const MAX_THREADS: usize = 512;

/// How long queued jobs may go without one starting before the pool adds a thread anyway (a
/// wait not marked [`blocking`], or running jobs that all take this long).
pub const STALL: Duration = Duration::from_millis(20);

type Job = Box<dyn FnOnce() + Send + 'static>;

/// What a pool's thread runs first, before any job: a GPU tower's threads make the GPU's
/// context current.
pub type ThreadStart = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job, or started and about to wait.
    idle: usize,
    /// Threads inside [`blocking`].
    blocked: usize,
    /// Threads alive.
    threads: usize,
    /// Jobs started so far (the backstop watches it move).
    started: u64,
    /// Whether the backstop's thread is alive.
    watching: bool,
}

impl Queue {
    /// Threads not blocked: running a job, or idle and about to take one.
    fn active(&self) -> usize {
        self.threads - self.blocked
    }

    /// Queued jobs that no idle thread will take.
    fn waiting(&self) -> usize {
        self.jobs.len().saturating_sub(self.idle)
    }

    /// Counts `n` threads about to start (alive and idle, so that concurrent callers see them;
    /// [`start_thread`] takes one back if it cannot start); returns the first one's number.
    fn reserve(&mut self, n: usize) -> usize {
        self.idle += n;
        self.threads += n;
        self.threads - n + 1
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Told when a job is left waiting, for the backstop.
    stalled: Condvar,
    name: String,
    /// How many threads may run at once before jobs wait for one of them.
    cores: usize,
    /// The backstop's patience ([`STALL`]).
    stall: Duration,
    /// Run by each thread as it starts.
    on_start: Option<ThreadStart>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

thread_local! {
    /// The pool this thread works for, if it is a pool thread ([`blocking`] reads it).
    static WORKER_OF: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
    /// Whether this thread is inside [`blocking`] already (a wait within a wait counts once).
    static BLOCKED: Cell<bool> = const { Cell::new(false) };
}

/// An elastic pool of named threads.
#[derive(Clone)]
pub struct ThreadPool {
    shared: Arc<Shared>,
}

impl ThreadPool {
    /// An empty pool whose threads are named `name-N`, running at most as many jobs at once as
    /// the machine has cores (more while some of them block).
    pub fn new(name: impl Into<String>) -> Self {
        Self::with_cores(name, machine_cores())
    }

    /// [`new`](Self::new) with `cores` running threads at most (at least one).
    pub fn with_cores(name: impl Into<String>, cores: usize) -> Self {
        Self::with_limits(name, cores, STALL)
    }

    /// [`with_cores`](Self::with_cores), with the backstop adding a thread after `stall`
    /// instead of [`STALL`].
    pub fn with_limits(name: impl Into<String>, cores: usize, stall: Duration) -> Self {
        Self::build(name.into(), cores, stall, None)
    }

    /// An empty pool like [`new`](Self::new) whose threads each run `start` before their
    /// first job: a device whose calls need something of the thread (a GPU's context made
    /// current) has it on every thread its nodes run on, by construction.
    pub fn with_thread_start(name: impl Into<String>, start: ThreadStart) -> Self {
        Self::build(name.into(), machine_cores(), STALL, Some(start))
    }

    fn build(name: String, cores: usize, stall: Duration, on_start: Option<ThreadStart>) -> Self {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                ready: Condvar::new(),
                stalled: Condvar::new(),
                name,
                cores: cores.max(1),
                stall,
                on_start,
            }),
        }
    }

    /// The pool every executor of this process shares.
    pub fn global() -> &'static ThreadPool {
        static POOL: OnceLock<ThreadPool> = OnceLock::new();
        POOL.get_or_init(|| ThreadPool::new("tessera-exec"))
    }

    /// Runs `job` on an idle thread, on a new one while fewer than the pool's cores are
    /// running, or else after a running thread finishes its job.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let mut queue = self.shared.lock();
        queue.jobs.push_back(Box::new(job));
        if queue.waiting() == 0 {
            drop(queue);
            self.shared.ready.notify_one();
            return;
        }
        supply(&self.shared, queue);
    }

    /// Returns the number of threads alive.
    pub fn threads(&self) -> usize {
        self.shared.lock().threads
    }
}

/// The cores this process may run on.
fn machine_cores() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `wait` as a wait of the current pool thread: while it runs, the thread does not count
/// as active, so a job queued behind it gets a thread. Every kernel wait that another job may
/// end (a rendezvous, a queue, an accumulator, a remote tensor, a nested step) goes through
/// here. On a thread of no pool it only runs `wait`.
pub fn blocking<R>(wait: impl FnOnce() -> R) -> R {
    let pool = WORKER_OF.with(|w| w.borrow().clone());
    let Some(shared) = pool.filter(|_| !BLOCKED.get()) else {
        return wait();
    };
    let mut queue = shared.lock();
    queue.blocked += 1;
    supply(&shared, queue);
    BLOCKED.set(true);
    /// Counts the thread as active again, however `wait` ends.
    struct Unblock(Arc<Shared>);
    impl Drop for Unblock {
        fn drop(&mut self) {
            BLOCKED.set(false);
            self.0.lock().blocked -= 1;
        }
    }
    let _unblock = Unblock(shared);
    wait()
}

/// Starts threads for the queued jobs no idle thread will take, while fewer threads than the
/// pool's cores are active (not blocked); jobs left waiting wake the backstop.
fn supply(shared: &Arc<Shared>, mut queue: MutexGuard<'_, Queue>) {
    let mut wanted = 0;
    while queue.waiting() > wanted
        && queue.active() + wanted < shared.cores
        && queue.threads + wanted < MAX_THREADS
    {
        wanted += 1;
    }
    let left_waiting = queue.waiting() > wanted;
    let start_watch = left_waiting && !queue.watching;
    if start_watch {
        queue.watching = true;
    }
    let first_id = queue.reserve(wanted);
    drop(queue);
    for id in first_id..first_id + wanted {
        start_thread(shared, id);
    }
    if start_watch {
        let watched = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("{}-watch", shared.name))
            .spawn(move || watch(&watched));
        if let Err(e) = spawned {
            // The next job left waiting tries again.
            shared.lock().watching = false;
            tracing::warn!(error = %e, "the executor pool's backstop thread could not be started");
        }
    } else if left_waiting {
        shared.stalled.notify_one();
    }
}

/// Starts a pool thread the caller counted with [`Queue::reserve`].
fn start_thread(shared: &Arc<Shared>, id: usize) {
    let worker_shared = shared.clone();
    let spawned = thread::Builder::new()
        .name(format!("{}-{id}", shared.name))
        .spawn(move || worker(worker_shared));
    if let Err(e) = spawned {
        // The job stays queued for the threads there are; it runs when one frees up.
        let mut queue = shared.lock();
        queue.idle -= 1;
        queue.threads -= 1;
        tracing::warn!(error = %e, "executor thread could not be started");
    }
}

fn worker(shared: Arc<Shared>) {
    WORKER_OF.with(|w| *w.borrow_mut() = Some(shared.clone()));
    if let Some(start) = &shared.on_start {
        start();
    }
    let mut queue = shared.lock();
    loop {
        if let Some(job) = queue.jobs.pop_front() {
            queue.idle -= 1;
            queue.started += 1;
            drop(queue);
            // A job catches its own panics (the executor reports them as errors); one that
            // escapes must not take the thread's accounting with it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            queue = shared.lock();
            queue.idle += 1;
            continue;
        }
        let (guard, timeout) = shared
            .ready
            .wait_timeout(queue, KEEP_ALIVE)
            .unwrap_or_else(|e| e.into_inner());
        queue = guard;
        if timeout.timed_out() && queue.jobs.is_empty() {
            queue.idle -= 1;
            queue.threads -= 1;
            return;
        }
    }
}

/// The backstop: while jobs wait for a thread, adds one whenever none has started for
/// [`STALL`]; exits after [`KEEP_ALIVE`] with nothing waiting.
fn watch(shared: &Arc<Shared>) {
    let mut queue = shared.lock();
    loop {
        if queue.waiting() == 0 {
            let (guard, timeout) = shared
                .stalled
                .wait_timeout(queue, KEEP_ALIVE)
                .unwrap_or_else(|e| e.into_inner());
            queue = guard;
            if timeout.timed_out() && queue.waiting() == 0 {
                queue.watching = false;
                return;
            }
            continue;
        }
        let seen = queue.started;
        drop(queue);
        thread::sleep(shared.stall);
        queue = shared.lock();
        if queue.started == seen && queue.waiting() > 0 && queue.threads < MAX_THREADS {
            tracing::debug!(
                pool = %shared.name,
                threads = queue.threads,
                "queued jobs waited {:?} without one starting; adding a thread",
                shared.stall
            );
            let id = queue.reserve(1);
            drop(queue);
            start_thread(shared, id);
            queue = shared.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Barrier;

    /// A backstop that never fires within a test.
    const NEVER: Duration = Duration::from_secs(3600);

    #[test]
    fn blocked_jobs_do_not_starve_later_ones() {
        // Eight jobs that each wait for all eight, on one core's worth of running threads and
        // no backstop: only the waits' marking gives each job its thread.
        let pool = ThreadPool::with_limits("test-pool", 1, NEVER);
        let barrier = Arc::new(Barrier::new(8));
        let (tx, rx) = mpsc::channel();
        for _ in 0..8 {
            let (barrier, tx) = (barrier.clone(), tx.clone());
            pool.spawn(move || {
                blocking(|| barrier.wait());
                tx.send(()).ok();
            });
        }
        for _ in 0..8 {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("every job finishes");
        }
        assert!(pool.threads() >= 8);
    }

    #[test]
    fn a_wait_nobody_marked_is_rescued_by_the_backstop() {
        let pool = ThreadPool::with_limits("test-pool", 1, Duration::from_millis(5));
        let barrier = Arc::new(Barrier::new(4));
        let (tx, rx) = mpsc::channel();
        for _ in 0..4 {
            let (barrier, tx) = (barrier.clone(), tx.clone());
            pool.spawn(move || {
                barrier.wait();
                tx.send(()).ok();
            });
        }
        for _ in 0..4 {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("every job finishes");
        }
    }

    #[test]
    fn short_jobs_share_as_many_threads_as_cores() {
        // A burst of short jobs, as a step's ready nodes: they queue behind two running threads
        // instead of each waking a thread of its own.
        let pool = ThreadPool::with_limits("test-pool", 2, NEVER);
        let (tx, rx) = mpsc::channel();
        for i in 0..2000u64 {
            let tx = tx.clone();
            pool.spawn(move || {
                tx.send(i * i).ok();
            });
        }
        let sum: u64 = (0..2000)
            .map(|_| {
                rx.recv_timeout(Duration::from_secs(10))
                    .expect("every job runs")
            })
            .sum();
        assert_eq!(sum, (0..2000u64).map(|i| i * i).sum::<u64>());
        assert!((1..=2).contains(&pool.threads()), "{}", pool.threads());
    }

    #[test]
    fn a_wait_within_a_wait_counts_the_thread_once() {
        // A nested step's rendezvous waits inside the nested step's wait: the thread is one
        // blocked thread, and none once both end.
        let pool = ThreadPool::with_limits("test-pool", 1, NEVER);
        let (tx, rx) = mpsc::channel();
        let inside = pool.clone();
        pool.spawn(move || {
            let counted = blocking(|| blocking(|| inside.shared.lock().blocked));
            let after = inside.shared.lock().blocked;
            tx.send((counted, after)).ok();
        });
        let (counted, after) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the job finishes");
        assert_eq!((counted, after), (1, 0));
    }
}
