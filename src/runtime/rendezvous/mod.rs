//! The per-step rendezvous: where a `_Send` leaves a tensor under its key and a `_Recv` (on
//! this task) or a RecvTensor RPC (from another task) picks it up.
//!
//! Every step (step_id) has one [`Rendezvous`] on each task, found or created through the
//! task's [`RendezvousMgr`] by RunGraph (which also injects the client's feeds) and by
//! RecvTensor (which may arrive before this task's RunGraph for the step). Executors' `_Send`
//! and `_Recv` kernels use it directly; CleanupGraph removes it.
//!
//! Invariants:
//! - Sends and receives meet in either order, and each value is consumed exactly once: a
//!   second receive under the same key waits for a second send.
//! - Under one key there is either one value waiting for its receiver, or a queue of
//!   receivers waiting (first come, first served), never both.
//! - Every receive has a deadline; it fails with DEADLINE_EXCEEDED naming the key and the wait.
//! - The first abort wins: once aborted, every pending and later receive fails with that
//!   status (the step's root cause), and later sends are refused with it too.

mod key;
mod mgr;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

pub(crate) use key::PairAttrs;
pub use key::{check_incarnation, rendezvous_key_of, ParsedKey};
pub use mgr::RendezvousMgr;

use crate::error::{Code, Result, Status};
use crate::runtime::collective::Collectives;
use crate::runtime::pool;
use crate::tensor::Tensor;

/// A received value: the tensor and whether it is a dead value of an untaken control-flow
/// branch (TensorFlow's `is_dead`).
pub type Received = (Tensor, bool);

/// What a waiting receiver is handed: the value, or the status the step was aborted with.
type Delivery = Result<Received>;

/// The tensors exchanged within one step on this task. Shared as `Arc<Rendezvous>`; every
/// method takes `&self` and holds the lock only for a table update.
pub struct Rendezvous {
    step_id: i64,
    state: Mutex<State>,
    collectives: Collectives,
}

#[derive(Default)]
struct State {
    /// The status of the first abort; `None` while the step is live.
    aborted: Option<Status>,
    /// Keyed by the canonical key text.
    table: HashMap<Arc<str>, Slot>,
}

/// What one key holds.
enum Slot {
    /// A sent value no receiver has taken yet.
    Value(Received),
    /// Receivers waiting for a send, oldest first. Never empty.
    Waiters(VecDeque<Waiter>),
}

/// One pending receive: a future's channel, or a blocked thread's slot.
enum Waiter {
    Async(oneshot::Sender<Delivery>),
    Blocking(Arc<BlockingSlot>),
}

impl Rendezvous {
    /// An empty rendezvous for step `step_id` (the id only appears in messages).
    pub fn new(step_id: i64) -> Self {
        Self {
            step_id,
            state: Mutex::new(State::default()),
            collectives: Collectives::default(),
        }
    }

    /// Returns the step's all-reduce meetings (`NcclAllReduce` nodes of its devices on this
    /// task); an abort of the rendezvous fails them too.
    pub fn collectives(&self) -> &Collectives {
        &self.collectives
    }

    /// Returns the step this rendezvous belongs to.
    pub fn step_id(&self) -> i64 {
        self.step_id
    }

    /// Leaves `value` under `key` for its receiver, or hands it to the oldest receiver already
    /// waiting.
    ///
    /// Fails with ABORTED "Duplicated send" when a value sent under `key` has not been received
    /// yet (the first value stays), and with the abort status once the step is aborted (the
    /// value is dropped).
    pub fn send(&self, key: &ParsedKey, value: Tensor, is_dead: bool) -> Result<()> {
        let mut state = self.lock();
        if let Some(status) = &state.aborted {
            return Err(status.clone());
        }
        let mut waiters = match state.table.remove(key.as_str()) {
            None => VecDeque::new(),
            Some(Slot::Waiters(waiters)) => waiters,
            Some(Slot::Value(first)) => {
                state.table.insert(key.shared(), Slot::Value(first));
                return Err(Status::aborted(format!(
                    "step {}: duplicated send of rendezvous key `{key}`: the value sent before \
                     under this key has not been received yet; each key carries one tensor per \
                     step and frame iteration",
                    self.step_id
                )));
            }
        };
        let mut delivery = Ok((value, is_dead));
        while let Some(waiter) = waiters.pop_front() {
            match waiter.deliver(delivery) {
                None => {
                    if !waiters.is_empty() {
                        state.table.insert(key.shared(), Slot::Waiters(waiters));
                    }
                    return Ok(());
                }
                // That receiver gave up (deadline passed or future dropped); try the next one.
                Some(back) => delivery = back,
            }
        }
        // Nobody is waiting (or every receiver gave up): keep the value for the next one.
        if let Ok(value) = delivery {
            state.table.insert(key.shared(), Slot::Value(value));
        }
        Ok(())
    }

    /// Receives the value sent under `key`, waiting for the send until `deadline`.
    ///
    /// The receive is registered when this is called, not when the future is first polled, so
    /// receivers are served in call order. The future fails with DEADLINE_EXCEEDED naming the
    /// key and the wait when no value arrives in time, or with the abort status when the step
    /// is aborted first. Dropping the future gives up the receive. The future must be polled
    /// inside a tokio runtime with time enabled (the deadline is a tokio timer, so paused time
    /// in tests applies to it).
    pub fn recv(
        &self,
        key: &ParsedKey,
        deadline: Instant,
    ) -> impl Future<Output = Result<Received>> + Send + 'static {
        let started = Instant::now();
        let pending = self.take_or_wait(key, || {
            let (sender, receiver) = oneshot::channel();
            (Waiter::Async(sender), receiver)
        });
        let step_id = self.step_id;
        let key = key.clone();
        async move {
            let mut receiver = match pending {
                Pending::Ready(delivery) => return delivery,
                Pending::Waiting(receiver) => receiver,
            };
            match tokio::time::timeout_at(deadline, &mut receiver).await {
                Ok(Ok(delivery)) => delivery,
                Ok(Err(_)) => Err(dropped(step_id, &key)),
                Err(_) => {
                    // A send may have landed between the timer firing and now; closing first
                    // makes the sender see a closed channel from here on, so either we take the
                    // value now or the sender keeps it for the next receiver.
                    receiver.close();
                    match receiver.try_recv() {
                        Ok(delivery) => delivery,
                        Err(_) => Err(timed_out(
                            step_id,
                            &key,
                            deadline.saturating_duration_since(started),
                        )),
                    }
                }
            }
        }
    }

    /// Receives the value sent under `key`, blocking this thread until it arrives or until
    /// `deadline`; for executor threads outside the async runtime. Fails as [`Self::recv`]
    /// does.
    pub fn recv_blocking(&self, key: &ParsedKey, deadline: std::time::Instant) -> Result<Received> {
        let started = std::time::Instant::now();
        let pending = self.take_or_wait(key, || {
            let slot = Arc::new(BlockingSlot::default());
            (Waiter::Blocking(Arc::clone(&slot)), slot)
        });
        match pending {
            Pending::Ready(delivery) => delivery,
            Pending::Waiting(slot) => slot.wait(deadline).unwrap_or_else(|| {
                Err(timed_out(
                    self.step_id,
                    key,
                    deadline.saturating_duration_since(started),
                ))
            }),
        }
    }

    /// Aborts the step: every pending receive fails with `status`, and so does every later
    /// send and receive. Values not yet received are dropped. Only the first abort counts, so
    /// receivers see the step's root cause, not the cancellations it caused.
    pub fn abort(&self, status: Status) {
        let status = if status.code() == Code::Ok {
            Status::internal(format!(
                "step {} aborted with an OK status: {}",
                self.step_id,
                status.message()
            ))
        } else {
            status
        };
        let table = {
            let mut state = self.lock();
            if state.aborted.is_some() {
                return;
            }
            state.aborted = Some(status.clone());
            std::mem::take(&mut state.table)
        };
        self.collectives.abort(&status);
        // Wake receivers outside the lock; their futures may run on this thread's runtime.
        for slot in table.into_values() {
            if let Slot::Waiters(waiters) = slot {
                for waiter in waiters {
                    waiter.deliver(Err(status.clone()));
                }
            }
        }
    }

    /// Whether a value sent under `key` is waiting for its receiver, so that a receive now
    /// returns without waiting (the step's only receiver of a key may rely on it).
    pub fn holds(&self, key: &ParsedKey) -> bool {
        matches!(self.lock().table.get(key.as_str()), Some(Slot::Value(_)))
    }

    /// Returns the abort status, `None` while the step is live.
    pub fn aborted(&self) -> Option<Status> {
        self.lock().aborted.clone()
    }

    /// Returns how many keys hold a value nobody has received yet.
    pub fn pending_values(&self) -> usize {
        self.lock()
            .table
            .values()
            .filter(|slot| matches!(slot, Slot::Value(_)))
            .count()
    }

    /// Returns how many receivers are waiting (including ones that gave up and have not been
    /// swept yet).
    pub fn pending_receivers(&self) -> usize {
        let state = self.lock();
        state
            .table
            .values()
            .map(|slot| match slot {
                Slot::Waiters(waiters) => waiters.len(),
                Slot::Value(_) => 0,
            })
            .sum()
    }

    /// Whether a receiver is still waiting on this step (one that has not given up).
    pub(crate) fn has_waiting_receivers(&self) -> bool {
        self.lock().table.values().any(|slot| match slot {
            Slot::Waiters(waiters) => waiters.iter().any(|w| !w.gave_up()),
            Slot::Value(_) => false,
        })
    }

    /// Takes the value under `key` if it is there, or registers a receiver made by `waiter`.
    fn take_or_wait<R>(&self, key: &ParsedKey, waiter: impl FnOnce() -> (Waiter, R)) -> Pending<R> {
        let mut state = self.lock();
        if let Some(status) = &state.aborted {
            return Pending::Ready(Err(status.clone()));
        }
        let mut waiters = match state.table.remove(key.as_str()) {
            Some(Slot::Value(value)) => return Pending::Ready(Ok(value)),
            Some(Slot::Waiters(mut waiters)) => {
                // Sweep receivers that gave up so that retries do not pile up.
                waiters.retain(|w| !w.gave_up());
                waiters
            }
            None => VecDeque::new(),
        };
        let (waiter, receiver) = waiter();
        waiters.push_back(waiter);
        state.table.insert(key.shared(), Slot::Waiters(waiters));
        Pending::Waiting(receiver)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the table half-updated in a way that
        // matters more than losing the step, so keep going with what is there.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        // Blocked threads would otherwise sleep until their deadline.
        self.abort(Status::aborted(format!(
            "step {}: the rendezvous was dropped while receives were pending",
            self.step_id
        )));
    }
}

impl fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Rendezvous")
            .field("step_id", &self.step_id)
            .field("keys", &state.table.len())
            .field("aborted", &state.aborted)
            .finish()
    }
}

/// The outcome of registering a receive.
enum Pending<R> {
    Ready(Delivery),
    Waiting(R),
}

impl Waiter {
    /// Hands `delivery` over; gives it back when the receiver has given up.
    fn deliver(self, delivery: Delivery) -> Option<Delivery> {
        match self {
            Waiter::Async(sender) => sender.send(delivery).err(),
            Waiter::Blocking(slot) => slot.fill(delivery),
        }
    }

    /// Whether the receiver stopped waiting (deadline passed or future dropped).
    fn gave_up(&self) -> bool {
        match self {
            Waiter::Async(sender) => sender.is_closed(),
            Waiter::Blocking(slot) => matches!(*slot.lock(), SlotState::GaveUp),
        }
    }
}

/// Where a sender leaves the value for a thread blocked in [`Rendezvous::recv_blocking`].
#[derive(Default)]
struct BlockingSlot {
    state: Mutex<SlotState>,
    filled: Condvar,
}

#[derive(Default)]
enum SlotState {
    #[default]
    Waiting,
    Filled(Delivery),
    GaveUp,
}

impl BlockingSlot {
    /// Stores `delivery` and wakes the thread; gives it back when the thread has given up.
    fn fill(&self, delivery: Delivery) -> Option<Delivery> {
        let mut state = self.lock();
        if matches!(*state, SlotState::GaveUp) {
            return Some(delivery);
        }
        *state = SlotState::Filled(delivery);
        self.filled.notify_one();
        None
    }

    /// Waits for the delivery until `deadline`; `None` when it did not come.
    fn wait(&self, deadline: std::time::Instant) -> Option<Delivery> {
        let mut state = self.lock();
        loop {
            if let SlotState::Filled(_) = *state {
                return match std::mem::replace(&mut *state, SlotState::GaveUp) {
                    SlotState::Filled(delivery) => Some(delivery),
                    _ => None,
                };
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                // Under the lock, so a sender either filled the slot before this or sees that
                // we gave up and keeps the value.
                *state = SlotState::GaveUp;
                return None;
            }
            state = pool::blocking(|| self.filled.wait_timeout(state, deadline - now))
                .map(|(state, _)| state)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The DEADLINE_EXCEEDED of a receive that waited `waited` for `key`.
fn timed_out(step_id: i64, key: &ParsedKey, waited: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "step {step_id}: no tensor arrived for rendezvous key `{key}` after waiting {waited:?}; \
         the sender ({}) may be stuck or gone; raise the deadline if the step is just slow",
        key.src_device()
    ))
}

/// The status of a receive whose rendezvous went away without an abort.
fn dropped(step_id: i64, key: &ParsedKey) -> Status {
    Status::aborted(format!(
        "step {step_id}: the rendezvous was dropped while rendezvous key `{key}` was awaited"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(edge: &str) -> ParsedKey {
        ParsedKey::new(
            "/job:ps/replica:0/task:0/device:CPU:0",
            7,
            "/job:worker/replica:0/task:0/device:CPU:0",
            edge,
            (0, 0),
        )
        .unwrap()
    }

    #[test]
    fn blocking_recv_times_out_then_the_value_waits_for_the_next_receiver() {
        let rendezvous = Rendezvous::new(3);
        let k = key("edge_1_a");
        let err = rendezvous
            .recv_blocking(&k, std::time::Instant::now() + Duration::from_millis(1))
            .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert!(
            err.message().contains("edge_1_a") && err.message().contains("step 3"),
            "{err}"
        );
        // The receiver that gave up must not swallow the value.
        rendezvous.send(&k, Tensor::scalar(1.5f32), false).unwrap();
        assert_eq!(rendezvous.pending_values(), 1);
        let (tensor, dead) = rendezvous
            .recv_blocking(&k, std::time::Instant::now())
            .unwrap();
        assert_eq!(tensor.scalar_value::<f32>().unwrap(), 1.5);
        assert!(!dead);
    }

    #[test]
    fn blocking_slot_keeps_a_value_filled_before_the_deadline() {
        let slot = BlockingSlot::default();
        assert!(slot.fill(Ok((Tensor::scalar(2i32), true))).is_none());
        // Deadline already past, but the value is there: it wins.
        let (tensor, dead) = slot.wait(std::time::Instant::now()).unwrap().unwrap();
        assert_eq!(tensor.scalar_value::<i32>().unwrap(), 2);
        assert!(dead);
        // Once taken, further fills are handed back.
        assert!(slot.fill(Ok((Tensor::scalar(3i32), false))).is_some());
    }

    #[test]
    fn an_ok_abort_status_becomes_internal() {
        let rendezvous = Rendezvous::new(1);
        rendezvous.abort(Status::new(Code::Ok, "done"));
        assert_eq!(rendezvous.aborted().unwrap().code(), Code::Internal);
    }

    #[test]
    fn abort_wakes_a_blocked_thread() {
        let rendezvous = Arc::new(Rendezvous::new(9));
        let k = key("edge_2_b");
        let waiter = {
            let rendezvous = Arc::clone(&rendezvous);
            let k = k.clone();
            std::thread::spawn(move || {
                rendezvous.recv_blocking(&k, std::time::Instant::now() + Duration::from_secs(60))
            })
        };
        // Wait until the thread is registered (an abort before that would fail its receive
        // the same way, but would not exercise the wake-up).
        while rendezvous.pending_receivers() == 0 {
            std::thread::yield_now();
        }
        rendezvous.abort(Status::cancelled("step 9 cancelled"));
        let err = waiter.join().unwrap().unwrap_err();
        assert_eq!(err, Status::cancelled("step 9 cancelled"));
    }
}
