//! One process-wide pool of kernel worker threads, created on first use and grown to the
//! largest thread count asked for (the server's `--threads`), so a decode step's ~170 kernel
//! calls wake parked workers instead of spawning threads each time.
//!
//! A call publishes one job (tasks `0..n`), the caller works on it too, and returns once every
//! task has finished. Workers spin briefly after a job (the next kernel call of the same graph
//! usually follows within microseconds), then park on a condvar; [`rest`] parks them at once
//! when no job can follow soon (a whole plan is done). Which thread runs which task
//! never matters: callers split work the same way for any thread count.
//!
//! The pool serves one job at a time; a call that finds it busy (another device, or a task
//! that itself calls the pool) runs its tasks inline on its own thread instead of waiting.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// Spins until `ready()` or [`SPIN`] has passed; returns whether it became ready.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > SPIN {
            return ready();
        }
    }
}

/// How long a worker polls for the next job before it parks, and a caller for its helpers
/// before it yields the core.
const SPIN: Duration = Duration::from_micros(200);

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// One published call. `task` borrows the caller's stack: it is only called for a claimed
/// index below `tasks`, and the caller returns only after all `tasks` indices are done.
struct Job {
    task: *const Task<'static>,
    tasks: usize,
    /// Workers (by index) allowed to join; the caller is the remaining participant.
    helpers: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `task` points to a `Sync` closure that outlives every call through it (see `Job`).
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs tasks until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.tasks {
                return;
            }
            // SAFETY: index i < tasks is unfinished, so the caller is still waiting and the
            // closure is alive.
            let task = unsafe { &*self.task };
            if let Err(e) = panic::catch_unwind(AssertUnwindSafe(|| task(i))) {
                *self.panic.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Shared {
    /// Bumped (under `slot`) for every published job.
    generation: AtomicU64,
    /// Bumped by [`rest`]: spinning workers park now.
    rests: AtomicU64,
    slot: Mutex<Option<Arc<Job>>>,
    wake: Condvar,
    sleepers: AtomicUsize,
}

struct Pool {
    shared: Arc<Shared>,
    /// Held for the length of one call; also guards the worker count.
    busy: Mutex<usize>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool {
        shared: Arc::new(Shared {
            generation: AtomicU64::new(0),
            rests: AtomicU64::new(0),
            slot: Mutex::new(None),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
        }),
        busy: Mutex::new(0),
    })
}

fn worker(shared: Arc<Shared>, index: usize) {
    let mut seen = shared.generation.load(Ordering::Acquire);
    loop {
        let rests = shared.rests.load(Ordering::Relaxed);
        spin_until(|| {
            shared.generation.load(Ordering::Acquire) != seen
                || shared.rests.load(Ordering::Relaxed) != rests
        });
        let mut slot = shared.slot.lock().unwrap_or_else(|p| p.into_inner());
        while shared.generation.load(Ordering::Acquire) == seen {
            shared.sleepers.fetch_add(1, Ordering::SeqCst);
            slot = shared.wake.wait(slot).unwrap_or_else(|p| p.into_inner());
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        seen = shared.generation.load(Ordering::Acquire);
        let job = slot.clone();
        drop(slot);
        if let Some(job) = job {
            if index < job.helpers {
                job.work();
            }
        }
    }
}

/// Runs `task(i)` for every `i` in `0..tasks` on up to `threads` threads (the caller's
/// included) and returns when all have finished; a panic in a task resumes here.
pub fn run(threads: usize, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    let helpers = threads.min(tasks).saturating_sub(1);
    if helpers == 0 {
        (0..tasks).for_each(task);
        return;
    }
    let p = pool();
    let mut spawned = match p.busy.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            (0..tasks).for_each(task);
            return;
        }
    };
    while *spawned < helpers {
        let shared = Arc::clone(&p.shared);
        let index = *spawned;
        let started = std::thread::Builder::new()
            .name(format!("rpcnet-kernel-{index}"))
            .spawn(move || worker(shared, index));
        if started.is_err() {
            break;
        }
        *spawned += 1;
    }
    let task: *const Task<'_> = task;
    let job = Arc::new(Job {
        // SAFETY: only the lifetime is erased; see `Job` for why the borrow outlives every use.
        task: unsafe { std::mem::transmute::<*const Task<'_>, *const Task<'static>>(task) },
        tasks,
        helpers: helpers.min(*spawned),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    });
    {
        let mut slot = p.shared.slot.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(Arc::clone(&job));
        p.shared.generation.fetch_add(1, Ordering::AcqRel);
    }
    if p.shared.sleepers.load(Ordering::SeqCst) > 0 {
        p.shared.wake.notify_all();
    }
    job.work();
    let finished = || job.done.load(Ordering::Acquire) >= tasks;
    if !spin_until(finished) {
        while !finished() {
            std::thread::yield_now();
        }
    }
    *p.shared.slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
    drop(spawned);
    let panicked = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(e) = panicked {
        panic::resume_unwind(e);
    }
}

/// Parks the spinning workers now instead of after [`SPIN`]: called when a whole plan is done,
/// the cores go to the client and the event loop (on a 2-core host the spin held one of them
/// through the response and the client's next request).
pub fn rest() {
    if let Some(p) = POOL.get() {
        p.shared.rests.fetch_add(1, Ordering::Relaxed);
    }
}

/// Hands each item to `f(index, item)` on up to `threads` threads (see [`run`]).
pub fn for_each<T: Send>(threads: usize, items: Vec<T>, f: impl Fn(usize, T) + Sync) {
    let cells: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    run(threads, cells.len(), &|i| {
        let item = cells[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(item) = item {
            f(i, item);
        }
    });
}

/// `f(index)` for each index on up to `threads` threads; true when every call returned true.
pub fn all(threads: usize, tasks: usize, f: impl Fn(usize) -> bool + Sync) -> bool {
    let ok = AtomicBool::new(true);
    run(threads, tasks, &|i| {
        if !f(i) {
            ok.store(false, Ordering::Relaxed);
        }
    });
    ok.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        for threads in 1..5 {
            for tasks in 0..9 {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                run(threads, tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn nested_and_concurrent_calls_finish() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..50 {
                        run(3, 4, &|_| {
                            run(2, 3, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 50 * 4 * 3);
    }

    #[test]
    fn parked_workers_wake_for_the_next_job() {
        for _ in 0..20 {
            let hits = AtomicUsize::new(0);
            run(3, 6, &|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            rest();
            std::thread::sleep(Duration::from_micros(50));
            run(3, 6, &|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 12);
        }
    }

    #[test]
    fn items_move_to_their_task() {
        let mut out = vec![0usize; 10];
        let chunks: Vec<&mut [usize]> = out.chunks_mut(3).collect();
        for_each(2, chunks, |i, c| c.iter_mut().for_each(|v| *v = i));
        assert_eq!(out, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]);
        assert!(!all(2, 5, |i| i != 3));
        assert!(all(2, 5, |_| true));
    }

    #[test]
    fn a_panicking_task_resumes_in_the_caller() {
        let r = panic::catch_unwind(|| run(2, 4, &|i| assert_ne!(i, 2)));
        assert!(r.is_err());
        run(2, 4, &|_| {});
    }
}
