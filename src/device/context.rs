//! The rule a GPU's driver holds every call to, modelled for the emulated GPU, and the queue
//! and cache that keep tessera within it.
//!
//! A CUDA call works on the context current on the calling thread. A call from a thread where
//! the GPU's context is not current fails (`CUDA_ERROR_INVALID_CONTEXT`); a call that cannot
//! report its failure (freeing a buffer, in a `drop`) parks the error in the context, and the
//! next call on that context, from any thread, returns it once. That is how a buffer dropped on
//! an executor thread of another device once failed the next step's first GPU call.
//!
//! So a GPU device keeps every call on threads where its context is current: its tower's
//! threads make it current as they start (`runtime::pool::ThreadPool::with_thread_start`), a
//! host read of a device tensor from any other thread makes it current for the copy and puts
//! the thread's previous context back ([`EmulatedContext::activate`], TensorFlow's
//! `ScopedActivateContext`), and a device buffer dropped anywhere is handed back to its device
//! ([`Released`]), whose own threads free it at the end of each of the device's steps, which
//! also returns any parked error so that it fails the step that caused it
//! (`device::space::MemorySpace::settle`). A real GPU also takes them back at its next kernel,
//! into a [`BufferCache`] its allocations reuse.
//!
//! [`EmulatedContext`] is that rule on a machine without a GPU: the emulated GPU's memory
//! (`device::space::Emulated`) makes each copy, kernel read and write, and free through it, so
//! CI fails a change that calls the device from the wrong thread, as only a GPU showed before.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Result, Status};

thread_local! {
    /// The emulated context current on this thread (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// Device buffers dropped away from their device, waiting for one of its threads to free them.
#[derive(Debug)]
pub struct Released<T>(Mutex<Vec<T>>);

impl<T> Default for Released<T> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

impl<T> Released<T> {
    /// Hands a buffer back (any thread; no device call).
    pub fn push(&self, buffer: T) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buffer);
    }

    /// Takes every buffer handed back so far, for a thread of the device to free.
    pub fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Freed device buffers kept for reuse, by length, up to a number of bytes: a GPU takes its
/// handed-back buffers into it under its lock and allocates from it first, so a training
/// step's same-sized tensors reuse last step's buffers without a driver call.
#[derive(Debug)]
pub struct BufferCache<T> {
    by_len: HashMap<usize, Vec<T>>,
    bytes: usize,
    limit: usize,
}

impl<T> BufferCache<T> {
    /// An empty cache holding at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            by_len: HashMap::new(),
            bytes: 0,
            limit,
        }
    }

    /// A kept buffer of exactly `len` elements of `width` bytes, if there is one.
    pub fn take(&mut self, len: usize, width: usize) -> Option<T> {
        let buffer = self.by_len.get_mut(&len)?.pop()?;
        self.bytes -= len * width;
        Some(buffer)
    }

    /// Keeps `buffer` (`len` elements of `width` bytes); gives it back when that would pass the
    /// limit, for the caller to free.
    pub fn keep(&mut self, buffer: T, len: usize, width: usize) -> Option<T> {
        let bytes = len * width;
        if self.bytes + bytes > self.limit {
            return Some(buffer);
        }
        self.bytes += bytes;
        self.by_len.entry(len).or_default().push(buffer);
        None
    }

    /// Takes every kept buffer, for the caller to free; empty if there were none.
    pub fn drain(&mut self) -> Vec<T> {
        self.bytes = 0;
        self.by_len
            .drain()
            .flat_map(|(_, buffers)| buffers)
            .collect()
    }

    /// The bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// An emulated GPU's context: current on a thread or not, with one parked error at most.
#[derive(Debug)]
pub struct EmulatedContext {
    id: u64,
    device: String,
    parked: Mutex<Option<Status>>,
    allocations: AtomicU64,
    frees: AtomicU64,
}

impl EmulatedContext {
    /// The context of the device named `device` (its full name), current on no thread yet.
    pub fn new(device: impl Into<String>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            device: device.into(),
            parked: Mutex::new(None),
            allocations: AtomicU64::new(0),
            frees: AtomicU64::new(0),
        }
    }

    /// Makes the context current on the calling thread. Like cudarc's `bind_to_thread`, a
    /// parked error is returned (once) instead, and the thread is left as it was.
    pub fn bind(&self) -> Result<()> {
        self.check()?;
        CURRENT.set(self.id);
        Ok(())
    }

    /// Whether the context is current on the calling thread.
    pub fn is_current(&self) -> bool {
        CURRENT.get() == self.id
    }

    /// Returns the parked error, once, if a call that could not report its failure left one.
    pub fn check(&self) -> Result<()> {
        match self.parked.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(parked) => Err(parked),
            None => Ok(()),
        }
    }

    /// A call on the device (`what`: a copy, a kernel's read or write): the parked error if
    /// there is one, else INTERNAL as the driver's INVALID_CONTEXT when the context is not
    /// current on the calling thread.
    pub fn call(&self, what: &str) -> Result<()> {
        self.check()?;
        if self.is_current() {
            Ok(())
        } else {
            Err(self.invalid_context(what))
        }
    }

    /// Allocates one of the device's buffers (`what`: for a copy in, a kernel's output): a
    /// call, as [`call`](Self::call).
    pub fn allocate(&self, what: &str) -> Result<()> {
        self.call(what)?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Frees one of the device's buffers, a call that cannot report its failure: from a thread
    /// where the context is not current the free fails, the buffer leaks, and the error is
    /// parked for the next call.
    pub fn free(&self) {
        if self.is_current() {
            self.frees.fetch_add(1, Ordering::Relaxed);
        } else {
            let error = self.invalid_context("a free of a device buffer");
            *self.parked.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        }
    }

    /// The buffers allocated so far.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// The buffers freed so far.
    pub fn frees(&self) -> u64 {
        self.frees.load(Ordering::Relaxed)
    }

    /// Makes the context current until the guard drops, then puts the thread's previous
    /// context back: a thread of another device (or none) reading this device's memory.
    pub fn activate(&self) -> Result<Activated> {
        let previous = CURRENT.get();
        self.bind()?;
        Ok(Activated { previous })
    }

    fn invalid_context(&self, what: &str) -> Status {
        let thread = std::thread::current();
        Status::internal(format!(
            "{}: {what} on thread `{}`, where the device's context is not current: CUDA driver: \
             CUDA_ERROR_INVALID_CONTEXT (invalid device context); a device is called only from \
             its tower's threads or under its context",
            self.device,
            thread.name().unwrap_or("unnamed"),
        ))
    }
}

/// A context made current by [`EmulatedContext::activate`]; puts the previous one back.
#[derive(Debug)]
pub struct Activated {
    previous: u64,
}

impl Drop for Activated {
    fn drop(&mut self) {
        CURRENT.set(self.previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";

    #[test]
    fn a_call_works_only_where_the_context_is_current() {
        let context = EmulatedContext::new(GPU);
        let err = context.call("a copy to the device").unwrap_err();
        assert_eq!(err.code(), crate::Code::Internal);
        assert!(
            err.message().contains("CUDA_ERROR_INVALID_CONTEXT"),
            "{err}"
        );
        assert!(err.message().contains(GPU), "{err}");
        std::thread::scope(|s| {
            s.spawn(|| {
                context.bind().unwrap();
                context.call("a copy to the device").unwrap();
            });
        });
        // Binding is per thread: this one still has no context.
        assert!(!context.is_current());
    }

    #[test]
    fn a_free_off_the_context_parks_its_error_for_the_next_call_once() {
        let context = EmulatedContext::new(GPU);
        context.bind().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| context.free());
        });
        assert_eq!(context.frees(), 0, "the free failed");
        // The next call, on a thread where the context is current, returns the free's error.
        let err = context.call("a kernel").unwrap_err();
        assert!(err.message().contains("a free of a device buffer"), "{err}");
        context.call("a kernel").unwrap();
        context.free();
        assert_eq!(context.frees(), 1);
    }

    #[test]
    fn activate_puts_the_previous_context_back() {
        let mine = EmulatedContext::new(GPU);
        let other = EmulatedContext::new("/job:localhost/replica:0/task:0/device:GPU:1");
        mine.bind().unwrap();
        {
            let _active = other.activate().unwrap();
            other.call("a copy to the host").unwrap();
            assert!(!mine.is_current());
        }
        mine.call("a kernel").unwrap();
    }

    #[test]
    fn the_cache_reuses_buffers_of_the_same_length_up_to_its_limit() {
        let mut cache = BufferCache::new(64);
        assert_eq!(cache.keep("a", 4, 4), None);
        assert_eq!(cache.keep("b", 8, 4), None);
        // 16 + 32 bytes kept: 32 more would pass the 64.
        assert_eq!(cache.keep("c", 8, 4), Some("c"));
        assert_eq!(cache.bytes(), 48);
        assert_eq!(cache.take(5, 4), None);
        assert_eq!(cache.take(8, 4), Some("b"));
        assert_eq!(cache.bytes(), 16);
        assert_eq!(cache.drain(), ["a"]);
        assert_eq!((cache.bytes(), cache.take(4, 4)), (0, None));
    }

    #[test]
    fn released_buffers_wait_for_the_device() {
        let released = Released::default();
        std::thread::scope(|s| {
            s.spawn(|| released.push(1));
        });
        released.push(2);
        assert_eq!(released.take(), [1, 2]);
        assert!(released.take().is_empty());
    }
}
