//! Device memory accounting: how many bytes a device's steps hold, against its limit.
//!
//! Every device type goes through the same [`MemoryBudget`]: the executor charges the buffers a
//! kernel allocates on its device before it keeps them (see `runtime::executor`), and the GPU
//! kernels charge their device buffers the same way, so a step that would go over a GPU's
//! `gpu_memory_fraction` (or a CPU's configured limit) fails with RESOURCE_EXHAUSTED naming the
//! node, the bytes it asked for and the limit, instead of crashing the process in the driver or
//! the allocator.
//!
//! A [`Charge`] gives its bytes back when dropped, so the accounting follows the tensors' life
//! in the step: a kernel's outputs are charged when it finishes and released after their last
//! reader. Variables (held by the resource manager between steps) are not charged; neither is a
//! view of an input (an output whose buffer lies inside one of the kernel's inputs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Result, Status};

/// One device's memory limit and the bytes charged against it; shared (`Arc`) by every step on
/// the device.
#[derive(Debug)]
pub struct MemoryBudget {
    device: String,
    limit: u64,
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes for `device` (its full name, used in errors).
    pub fn new(device: impl Into<String>, limit: u64) -> Arc<Self> {
        Arc::new(Self {
            device: device.into(),
            limit,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        })
    }

    /// Returns the limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Returns the bytes charged now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// Returns the most bytes ever charged at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Charges `bytes` for node `node` (op `op`), or fails with RESOURCE_EXHAUSTED when that
    /// would take the device over its limit; nothing is charged then.
    pub fn charge(self: &Arc<Self>, node: &str, op: &str, bytes: u64) -> Result<Charge> {
        let mut current = self.in_use.load(Ordering::Acquire);
        loop {
            let wanted = current.checked_add(bytes).filter(|&w| w <= self.limit);
            let Some(wanted) = wanted else {
                return Err(Status::resource_exhausted(format!(
                    "OOM when allocating {bytes} bytes for node `{node}` (op {op}) on {}: {current} \
                     bytes are in use and the device's limit is {} bytes; use a smaller batch, \
                     more towers, or raise the device's memory limit",
                    self.device, self.limit
                )));
            };
            match self.in_use.compare_exchange_weak(
                current,
                wanted,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(wanted, Ordering::AcqRel);
                    return Ok(Charge {
                        budget: Arc::clone(self),
                        bytes,
                    });
                }
                Err(now) => current = now,
            }
        }
    }
}

/// Bytes charged to a device; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Charge {
    /// Returns the bytes this charge holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn charges_add_up_to_the_limit_and_are_given_back_on_drop() {
        let budget = MemoryBudget::new("/job:w/replica:0/task:0/device:GPU:0", 1000);
        let a = budget.charge("a", "MatMul", 600).unwrap();
        let b = budget.charge("b", "Relu", 400).unwrap();
        assert_eq!(budget.in_use(), 1000);
        drop(a);
        assert_eq!(budget.in_use(), 400);
        let c = budget.charge("c", "Add", 600).unwrap();
        assert_eq!(budget.peak(), 1000);
        drop((b, c));
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn going_over_is_resource_exhausted_naming_node_bytes_and_limit() {
        let budget = MemoryBudget::new("/job:w/replica:0/task:0/device:GPU:0", 1000);
        let _held = budget.charge("a", "MatMul", 600).unwrap();
        let err = budget.charge("dense/MatMul", "MatMul", 401).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        for part in [
            "`dense/MatMul`",
            "401 bytes",
            "600 bytes are in use",
            "1000 bytes",
            "GPU:0",
        ] {
            assert!(err.message().contains(part), "{part} missing: {err}");
        }
        // The failed charge took nothing.
        assert_eq!(budget.in_use(), 600);
        let huge = budget.charge("x", "Fill", u64::MAX).unwrap_err();
        assert_eq!(huge.code(), Code::ResourceExhausted);
    }
}
