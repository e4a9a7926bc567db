//! A FIFO queue of tensor tuples living in a device's [`ResourceMgr`](super::resource::ResourceMgr),
//! shared by every step and session that names it (TensorFlow's `FIFOQueue`). Synchronous
//! training passes its tokens through one (`sync_token_q`).
//!
//! Blocking follows TensorFlow's rules with one change: no wait is unbounded. A dequeue waits
//! for enough elements, an enqueue into a full bounded queue waits for room, each until its
//! [`Wait`] ends (deadline or cancelled step). Closing wakes everyone: dequeuers that cannot be
//! served get OUT_OF_RANGE ("closed and has insufficient elements"), new enqueues CANCELLED,
//! and waiting enqueues are cancelled too when the close says `cancel_pending_enqueues`.
//!
//! Invariant: elements leave in the order they entered; an element is a whole tuple.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::error::{Result, Status};
use crate::runtime::resource::Resource;
use crate::runtime::wait::{human, Ended, Wait};
use crate::tensor::{DType, PartialShape, Shape, Tensor};

#[derive(Default)]
struct State {
    elements: VecDeque<Vec<Tensor>>,
    closed: bool,
    cancel_pending_enqueues: bool,
    /// Dequeues waiting, by ticket, in the order they came: served in that order, as
    /// TensorFlow serves dequeue attempts (a dequeue arriving later never takes the element
    /// an earlier one waits for, so no replica starves for sync tokens).
    dequeuers: VecDeque<u64>,
    next_ticket: u64,
}

/// A first-in first-out queue of tuples of tensors, optionally bounded.
pub struct FifoQueue {
    name: String,
    component_types: Vec<DType>,
    /// Declared element shapes, one per component; empty when not declared.
    shapes: Vec<PartialShape>,
    capacity: Option<usize>,
    default_wait: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Resource for FifoQueue {
    fn type_name(&self) -> &'static str {
        "queue"
    }
}

impl FifoQueue {
    /// A queue named `name` (for messages) of tuples of `component_types`; `capacity` `None`
    /// is unbounded. `shapes` is empty or one shape per component. `default_wait` bounds the
    /// waits of ops that have neither their own timeout nor a step deadline.
    pub fn new(
        name: impl Into<String>,
        component_types: Vec<DType>,
        shapes: Vec<PartialShape>,
        capacity: Option<usize>,
        default_wait: Duration,
    ) -> Result<Self> {
        let name = name.into();
        if component_types.is_empty() {
            return Err(Status::invalid_argument(format!(
                "queue `{name}` needs at least one component type"
            )));
        }
        if !shapes.is_empty() && shapes.len() != component_types.len() {
            return Err(Status::invalid_argument(format!(
                "queue `{name}` has {} component types but {} shapes; give one shape per \
                 component or none",
                component_types.len(),
                shapes.len()
            )));
        }
        if capacity == Some(0) {
            return Err(Status::invalid_argument(format!(
                "queue `{name}` has capacity 0; use -1 for unbounded or a positive capacity"
            )));
        }
        Ok(Self {
            name,
            component_types,
            shapes,
            capacity,
            default_wait,
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    /// Returns the queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the component dtypes.
    pub fn component_types(&self) -> &[DType] {
        &self.component_types
    }

    /// Returns the wait of ops with neither a timeout nor a step deadline.
    pub fn default_wait(&self) -> Duration {
        self.default_wait
    }

    /// Returns the number of elements held.
    pub fn size(&self) -> usize {
        self.lock().elements.len()
    }

    /// Whether the queue was closed.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Closes the queue: no more enqueues; dequeues drain what is left, then fail with
    /// OUT_OF_RANGE. With `cancel_pending_enqueues`, enqueues waiting for room fail too.
    pub fn close(&self, cancel_pending_enqueues: bool) {
        let mut state = self.lock();
        state.closed = true;
        state.cancel_pending_enqueues |= cancel_pending_enqueues;
        drop(state);
        self.changed.notify_all();
    }

    /// Adds one element (a tuple, one tensor per component), waiting for room when full.
    pub fn enqueue(&self, tuple: Vec<Tensor>, wait: &Wait) -> Result<()> {
        self.check_tuple(&tuple, None)?;
        self.push_all(vec![tuple], wait)
    }

    /// Adds `n` elements given as components whose first dimension is `n` (element `i` is row
    /// `i` of every component), in order, waiting for room as needed.
    pub fn enqueue_many(&self, components: Vec<Tensor>, wait: &Wait) -> Result<()> {
        if components.len() != self.component_types.len() {
            return Err(self.arity(components.len()));
        }
        let n = match components[0].dims().first() {
            Some(&n) => n,
            None => {
                return Err(Status::invalid_argument(format!(
                    "queue `{}`: EnqueueMany needs components of rank >= 1 (their first \
                     dimension counts the elements), got a scalar",
                    self.name
                )))
            }
        };
        let mut rows: Vec<Vec<Tensor>> = vec![Vec::with_capacity(components.len()); n];
        for (c, t) in components.iter().enumerate() {
            if t.dims().first() != Some(&n) {
                return Err(Status::invalid_argument(format!(
                    "queue `{}`: EnqueueMany components must have the same first dimension; \
                     component 0 has {n}, component {c} has shape {}",
                    self.name,
                    t.shape()
                )));
            }
            for (i, row) in split_rows(t)?.into_iter().enumerate() {
                rows[i].push(row);
            }
        }
        for row in &rows {
            self.check_tuple(row, Some("EnqueueMany"))?;
        }
        self.push_all(rows, wait)
    }

    /// Returns how many dequeues are waiting for elements.
    pub fn waiting_dequeues(&self) -> usize {
        self.lock().dequeuers.len()
    }

    /// Removes and returns the oldest element, waiting for one.
    pub fn dequeue(&self, wait: &Wait) -> Result<Vec<Tensor>> {
        let mut taken = self.take(1, wait)?;
        Ok(taken.pop().unwrap_or_default())
    }

    /// Removes the `n` oldest elements and returns them stacked: component `c` gets a new
    /// first dimension of size `n`. Waits until `n` elements are there.
    pub fn dequeue_many(&self, n: usize, wait: &Wait) -> Result<Vec<Tensor>> {
        let taken = self.take(n, wait)?;
        (0..self.component_types.len())
            .map(|c| {
                let parts: Vec<&Tensor> = taken.iter().map(|tuple| &tuple[c]).collect();
                stack_rows(self.component_types[c], &parts, self.element_shape(c))
            })
            .collect()
    }

    fn take(&self, n: usize, wait: &Wait) -> Result<Vec<Vec<Tensor>>> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.dequeuers.push_back(ticket);
        let taken = self.take_in_turn(state, ticket, n, wait);
        self.lock().dequeuers.retain(|&t| t != ticket);
        self.changed.notify_all();
        taken
    }

    /// Waits until dequeue `ticket` is the oldest waiting and `n` elements are there (or the
    /// queue is closed), then takes them.
    fn take_in_turn(
        &self,
        state: std::sync::MutexGuard<'_, State>,
        ticket: u64,
        n: usize,
        wait: &Wait,
    ) -> Result<Vec<Vec<Tensor>>> {
        let ready =
            |s: &State| s.closed || (s.dequeuers.front() == Some(&ticket) && s.elements.len() >= n);
        let state = match wait.until(&self.changed, state, ready) {
            Ok(state) => state,
            Err((Ended::Cancelled(reason), _)) => return Err(reason),
            Err((Ended::Deadline, state)) => {
                return Err(Status::deadline_exceeded(format!(
                    "queue `{}`: {} of {n} element(s) arrived within {}; its producers stopped \
                     enqueuing (for sync_token_q: the chief's aggregation loop is not running)",
                    self.name,
                    state.elements.len(),
                    human(wait.allowed)
                )))
            }
        };
        let mut state = state;
        if state.elements.len() < n {
            return Err(Status::out_of_range(format!(
                "FIFOQueue '{}' is closed and has insufficient elements (requested {n}, current \
                 size {})",
                self.name,
                state.elements.len()
            )));
        }
        Ok(state.elements.drain(..n).collect())
    }

    fn push_all(&self, rows: Vec<Vec<Tensor>>, wait: &Wait) -> Result<()> {
        let mut state = self.lock();
        if state.closed {
            return Err(self.closed_for_enqueue());
        }
        for row in rows {
            let cap = self.capacity;
            state = match wait.until(&self.changed, state, |s| {
                s.cancel_pending_enqueues || cap.is_none_or(|c| s.elements.len() < c)
            }) {
                Ok(state) => state,
                Err((Ended::Cancelled(reason), _)) => return Err(reason),
                Err((Ended::Deadline, _)) => {
                    return Err(Status::deadline_exceeded(format!(
                        "queue `{}`: no room within {} (capacity {} reached); its consumers \
                         stopped dequeuing",
                        self.name,
                        human(wait.allowed),
                        cap.unwrap_or_default()
                    )))
                }
            };
            if state.cancel_pending_enqueues {
                return Err(self.closed_for_enqueue());
            }
            state.elements.push_back(row);
            self.changed.notify_all();
        }
        Ok(())
    }

    fn closed_for_enqueue(&self) -> Status {
        Status::cancelled(format!("FIFOQueue '{}' is closed.", self.name))
    }

    fn arity(&self, got: usize) -> Status {
        Status::invalid_argument(format!(
            "queue `{}` holds tuples of {} component(s) ({}), got {got}",
            self.name,
            self.component_types.len(),
            self.component_types
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    fn check_tuple(&self, tuple: &[Tensor], what: Option<&str>) -> Result<()> {
        if tuple.len() != self.component_types.len() {
            return Err(self.arity(tuple.len()));
        }
        let row = if what.is_some() { " (per element)" } else { "" };
        for (c, (t, &dtype)) in tuple.iter().zip(&self.component_types).enumerate() {
            if t.dtype() != dtype {
                return Err(Status::invalid_argument(format!(
                    "queue `{}`: component {c} must be {dtype}, got {}",
                    self.name,
                    t.dtype()
                )));
            }
            if let Some(shape) = self.shapes.get(c) {
                if !shape.is_compatible_with(t.shape()) {
                    return Err(Status::invalid_argument(format!(
                        "queue `{}`: component {c} must have shape {shape}{row}, got {}",
                        self.name,
                        t.shape()
                    )));
                }
            }
        }
        Ok(())
    }

    fn element_shape(&self, c: usize) -> Option<Shape> {
        self.shapes.get(c).and_then(PartialShape::to_shape)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Splits `t` along its first dimension into rows of shape `dims[1..]` (buffers shared).
fn split_rows(t: &Tensor) -> Result<Vec<Tensor>> {
    let dims = t.dims();
    let n = dims.first().copied().unwrap_or(0);
    let row_shape = Shape::new(dims[1..].to_vec());
    let per_row = row_shape.num_elements();
    match t.dtype() {
        DType::String => {
            let strings = t.strings()?;
            (0..n)
                .map(|i| {
                    Tensor::from_strings(
                        row_shape.clone(),
                        strings[i * per_row..(i + 1) * per_row].to_vec(),
                    )
                })
                .collect()
        }
        dtype => {
            let size = dtype.size().ok_or_else(|| {
                Status::invalid_argument(format!("a queue cannot hold {dtype} tensors"))
            })?;
            let bytes = t
                .shared_bytes()
                .ok_or_else(|| Status::internal(format!("{dtype} tensor without bytes")))?;
            let row_bytes = per_row * size;
            (0..n)
                .map(|i| {
                    Tensor::from_bytes(
                        dtype,
                        row_shape.clone(),
                        bytes.slice(i * row_bytes..(i + 1) * row_bytes),
                    )
                })
                .collect()
        }
    }
}

/// Stacks rows of equal shape into one tensor with a new first dimension.
fn stack_rows(dtype: DType, rows: &[&Tensor], declared: Option<Shape>) -> Result<Tensor> {
    let row_shape = match rows.first() {
        Some(r) => r.shape().clone(),
        None => declared.unwrap_or_else(Shape::scalar),
    };
    if let Some(bad) = rows.iter().find(|r| r.shape() != &row_shape) {
        return Err(Status::invalid_argument(format!(
            "DequeueMany needs elements of one shape to stack them, got {row_shape} and {}",
            bad.shape()
        )));
    }
    let mut dims = vec![rows.len()];
    dims.extend_from_slice(row_shape.dims());
    match dtype {
        DType::String => {
            let mut all: Vec<Bytes> = Vec::new();
            for r in rows {
                all.extend(r.strings()?.iter().cloned());
            }
            Tensor::from_strings(dims, all)
        }
        _ => {
            let mut buf = BytesMut::new();
            for r in rows {
                let bytes = r
                    .bytes()
                    .ok_or_else(|| Status::internal(format!("{dtype} tensor without bytes")))?;
                buf.extend_from_slice(bytes);
            }
            Tensor::from_bytes(dtype, dims, buf.freeze())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_and_stack_back_to_the_same_tensor() {
        let t = Tensor::from_vec([3, 2], vec![1i64, 2, 3, 4, 5, 6]).unwrap();
        let rows = split_rows(&t).unwrap();
        assert_eq!(rows[1].values::<i64>().unwrap().as_ref(), &[3, 4]);
        let refs: Vec<&Tensor> = rows.iter().collect();
        assert_eq!(stack_rows(DType::Int64, &refs, None).unwrap(), t);
    }

    #[test]
    fn dequeues_are_served_in_the_order_they_came() {
        let queue = std::sync::Arc::new(
            FifoQueue::new(
                "q",
                vec![DType::Int64],
                vec![],
                None,
                Duration::from_secs(10),
            )
            .unwrap(),
        );
        let first = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.dequeue(&Wait::for_duration(Duration::from_secs(10))))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while queue.waiting_dequeues() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the first dequeue never waited"
            );
            std::thread::yield_now();
        }
        let token = || vec![Tensor::scalar(7i64)];
        queue
            .enqueue(token(), &Wait::for_duration(Duration::from_secs(1)))
            .unwrap();
        // A dequeue that comes later does not take the element the first one waits for.
        let late = queue.dequeue(&Wait::for_duration(Duration::from_millis(50)));
        assert_eq!(
            late.unwrap_err().code(),
            crate::error::Code::DeadlineExceeded
        );
        let got = first.join().unwrap().unwrap();
        assert_eq!(got[0].scalar_value::<i64>().unwrap(), 7);
        assert_eq!(queue.waiting_dequeues(), 0);
    }
}
