//! Device memory accounting: how many bytes a device's steps hold, against its limit.
//!
//! Every device type goes through the same [`MemoryBudget`]: the executor charges the buffers a
//! kernel allocates on its device before it keeps them (see `exec::executor`), and the GPU
//! kernels charge their device buffers the same way, so a step that would go over a GPU's
//! `gpu_memory_fraction` (or a CPU's configured limit) fails with RESOURCE_EXHAUSTED naming the
//! node, the bytes it asked for and the limit, instead of crashing the process in the driver or
//! the allocator.
//!
//! A [`Charge`] gives its bytes back when dropped, so the accounting follows the tensors' life
//! in the step: a kernel's outputs are charged when it finishes and released after their last
//! reader; a view of an input (an output whose buffer lies inside one of the kernel's inputs)
//! is not charged. Variables live between steps: each resource store on the device reports the
//! bytes its variables hold ([`MemoryBudget::set_resident`]), and those count against the limit
//! too. Kernels that allocate an output from a shape they are given check it fits
//! ([`MemoryBudget::check_fits`]) before allocating.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Result, Status};

/// One device's memory limit and the bytes charged against it; shared (`Arc`) by every step on
/// the device.
#[derive(Debug)]
pub struct MemoryBudget {
    device: String,
    limit: u64,
    /// The config key that sets the limit, named in errors (`devices.cpu_memory_limit`).
    key: &'static str,
    in_use: AtomicU64,
    peak: AtomicU64,
    /// Bytes of variables, per resource store (keyed by its address), and their sum.
    resident: Mutex<HashMap<usize, u64>>,
    resident_total: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes for `device` (its full name, used in errors).
    pub fn new(device: impl Into<String>, limit: u64) -> Arc<Self> {
        Self::with_key(device, limit, "the device's memory limit")
    }

    /// A budget of `limit` bytes for `device`, set by the config key `key`, which errors name.
    pub fn with_key(device: impl Into<String>, limit: u64, key: &'static str) -> Arc<Self> {
        Arc::new(Self {
            device: device.into(),
            limit,
            key,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            resident: Mutex::new(HashMap::new()),
            resident_total: AtomicU64::new(0),
        })
    }

    /// Returns the device's full name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Returns the config key that sets the limit.
    pub fn key(&self) -> &'static str {
        self.key
    }

    /// Records that the resource store `store` (any stable id, e.g. its address) holds `bytes`
    /// of variables now; they count against the limit until replaced (0 when it goes away).
    pub fn set_resident(&self, store: usize, bytes: u64) {
        let mut resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if bytes == 0 {
            resident.remove(&store);
        } else {
            resident.insert(store, bytes);
        }
        let total: u64 = resident.values().sum();
        self.resident_total.store(total, Ordering::Release);
        self.peak
            .fetch_max(self.in_use().saturating_add(total), Ordering::AcqRel);
    }

    /// Returns the bytes of variables on the device, as its stores last reported them.
    pub fn resident(&self) -> u64 {
        self.resident_total.load(Ordering::Acquire)
    }

    /// Returns the bytes of variables `store` last reported.
    pub fn resident_of(&self, store: usize) -> u64 {
        let resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        resident.get(&store).copied().unwrap_or(0)
    }

    /// Returns the bytes of variables every store but `store` last reported (read at once, so
    /// a concurrent report cannot make it negative).
    pub fn resident_except(&self, store: usize) -> u64 {
        let resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        resident
            .iter()
            .filter(|(&id, _)| id != store)
            .map(|(_, &bytes)| bytes)
            .sum()
    }

    /// Returns the bytes left under the limit now: steps' tensors and variables taken out.
    pub fn room(&self) -> u64 {
        self.limit
            .saturating_sub(self.in_use())
            .saturating_sub(self.resident())
    }

    /// Checks, without charging, that `bytes` more would fit now; the RESOURCE_EXHAUSTED of
    /// [`charge`](Self::charge) otherwise. For kernels about to allocate from a given shape.
    pub fn check_fits(&self, node: &str, op: &str, bytes: u64) -> Result<()> {
        let current = self.in_use.load(Ordering::Acquire);
        match current
            .checked_add(self.resident())
            .and_then(|c| c.checked_add(bytes))
        {
            Some(wanted) if wanted <= self.limit => Ok(()),
            _ => Err(self.exhausted(node, op, bytes, current)),
        }
    }

    /// The RESOURCE_EXHAUSTED for `bytes` more for `node` when `in_use` are charged.
    fn exhausted(&self, node: &str, op: &str, bytes: u64, in_use: u64) -> Status {
        Status::resource_exhausted(format!(
            "OOM when allocating {bytes} bytes for node `{node}` (op {op}) on {}: {in_use} bytes \
             are in use by steps and {} by variables, and {} is {} bytes; use a smaller batch, \
             more towers, or raise {}",
            self.device,
            self.resident(),
            self.key,
            self.limit,
            self.key
        ))
    }

    /// Returns the limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Returns the bytes charged now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// Returns the bytes charged now with the variables: what the device holds.
    pub fn held(&self) -> u64 {
        self.in_use().saturating_add(self.resident())
    }

    /// Returns the most bytes ever held at once (step tensors and variables), as of the
    /// charges made.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Charges `bytes` for node `node` (op `op`), or fails with RESOURCE_EXHAUSTED when that
    /// would take the device over its limit; nothing is charged then.
    pub fn charge(self: &Arc<Self>, node: &str, op: &str, bytes: u64) -> Result<Charge> {
        let mut current = self.in_use.load(Ordering::Acquire);
        let resident = self.resident();
        loop {
            let wanted = current.checked_add(bytes);
            let fits = wanted
                .and_then(|w| w.checked_add(resident))
                .is_some_and(|w| w <= self.limit);
            let (Some(wanted), true) = (wanted, fits) else {
                return Err(self.exhausted(node, op, bytes, current));
            };
            match self.in_use.compare_exchange_weak(
                current,
                wanted,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak
                        .fetch_max(wanted.saturating_add(resident), Ordering::AcqRel);
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
            "is 1000 bytes",
            "GPU:0",
        ] {
            assert!(err.message().contains(part), "{part} missing: {err}");
        }
        // The failed charge took nothing.
        assert_eq!(budget.in_use(), 600);
        let huge = budget.charge("x", "Fill", u64::MAX).unwrap_err();
        assert_eq!(huge.code(), Code::ResourceExhausted);
    }

    #[test]
    fn variables_count_against_the_limit_and_errors_name_the_key() {
        let budget = MemoryBudget::with_key(
            "/job:ps/task:0/device:CPU:0",
            1000,
            "devices.cpu_memory_limit",
        );
        budget.set_resident(1, 300);
        budget.set_resident(2, 200);
        assert_eq!(budget.resident(), 500);
        let _held = budget.charge("a", "MatMul", 500).unwrap();
        let err = budget.charge("b", "Fill", 1).unwrap_err();
        assert!(err.message().contains("500 by variables"), "{err}");
        assert!(
            err.message().contains("raise devices.cpu_memory_limit"),
            "{err}"
        );
        assert!(budget.check_fits("b", "Fill", 1).is_err());
        // A store that lets go of its variables gives their bytes back.
        assert_eq!(budget.resident_except(1), 200);
        budget.set_resident(2, 0);
        assert_eq!(budget.resident_of(2), 0);
        budget.check_fits("b", "Fill", 200).unwrap();
        budget.charge("b", "Fill", 200).unwrap();
    }
}
