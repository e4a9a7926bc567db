//! Per-device resources (variables, and later queues and accumulators), keyed by
//! (container, name) and shared by every session on the task.
//!
//! Invariant: one entry per key, of one type; looking a key up as another type is an error.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::device::memory::MemoryBudget;
use crate::error::{Result, Status};

/// A resource that can live in a [`ResourceMgr`].
pub trait Resource: Any + Send + Sync {
    /// A short name of the resource type for messages ("variable", "queue").
    fn type_name(&self) -> &'static str;
}

/// A variable (resource or reference); its storage is described in [`crate::tensor::Var`].
pub use crate::tensor::Var;

impl Resource for Var {
    fn type_name(&self) -> &'static str {
        "variable"
    }
}

type Key = (String, String);

/// The container holding the resources that live for step `step_id` only (TensorArrays,
/// stacks): TensorFlow's per-step container, named as TensorFlow names it.
pub fn step_container(step_id: i64) -> String {
    format!("{STEP_CONTAINER_PREFIX}{step_id}")
}

/// What every step container's name starts with.
const STEP_CONTAINER_PREFIX: &str = "__per_step_";

/// The resources of one device, keyed by (container, name).
#[derive(Default)]
pub struct ResourceMgr {
    entries: Mutex<HashMap<Key, Arc<dyn Any + Send + Sync>>>,
    /// Most bytes of variable values the store may hold (`limits.max_shard_bytes` on the
    /// task's variable shard); unset, no limit.
    max_var_bytes: OnceLock<u64>,
    /// The device's memory budget, which the variables' bytes count against; unset, none.
    memory: OnceLock<Arc<MemoryBudget>>,
}

impl ResourceMgr {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the resource at (container, name), or NOT_FOUND naming it.
    pub fn lookup<T: Resource>(&self, container: &str, name: &str) -> Result<Arc<T>> {
        let entries = self.entries.lock().expect("resource map poisoned");
        let entry = entries
            .get(&(container.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "resource {}/{name} does not exist (container `{container}`)",
                    if container.is_empty() {
                        "localhost"
                    } else {
                        container
                    }
                ))
            })?;
        drop(entries);
        entry.downcast::<T>().map_err(|_| {
            Status::invalid_argument(format!(
                "resource `{name}` in container `{container}` is not a {}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// Returns the resource at (container, name), creating it with `create` when absent.
    pub fn lookup_or_create<T: Resource>(
        &self,
        container: &str,
        name: &str,
        create: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let mut entries = self.entries.lock().expect("resource map poisoned");
        let key = (container.to_string(), name.to_string());
        if let Some(entry) = entries.get(&key) {
            return entry.clone().downcast::<T>().map_err(|_| {
                Status::invalid_argument(format!(
                    "resource `{name}` in container `{container}` exists with another type"
                ))
            });
        }
        let created = Arc::new(create()?);
        entries.insert(key, created.clone());
        Ok(created)
    }

    /// Removes the resource at (container, name); NOT_FOUND when absent.
    pub fn delete(&self, container: &str, name: &str) -> Result<()> {
        let mut entries = self.entries.lock().expect("resource map poisoned");
        entries
            .remove(&(container.to_string(), name.to_string()))
            .map(|_| ())
            .ok_or_else(|| {
                Status::not_found(format!(
                    "resource `{name}` in container `{container}` does not exist"
                ))
            })
    }

    /// Removes every resource of these containers; every container when `containers` is empty.
    pub fn clear(&self, containers: &[String]) {
        let mut entries = self.entries.lock().expect("resource map poisoned");
        entries.retain(|(c, _), _| !containers.is_empty() && !containers.contains(c));
    }

    /// Drops the resources of step `step_id`'s container (see [`step_container`]); whoever
    /// runs a step on this device calls it once the step is over, as TensorFlow drops a step's
    /// container, so a step's TensorArrays and stacks never outlive it.
    pub fn cleanup_step(&self, step_id: i64) {
        self.clear(&[step_container(step_id)]);
    }

    /// Returns the variables held outside step containers, each with its (container, name).
    pub fn variables(&self) -> Vec<((String, String), Arc<Var>)> {
        let entries = self.entries.lock().expect("resource map poisoned");
        entries
            .iter()
            .filter(|((container, _), _)| !container.starts_with(STEP_CONTAINER_PREFIX))
            .filter_map(|(key, entry)| {
                let var = Arc::clone(entry).downcast::<Var>().ok()?;
                Some((key.clone(), var))
            })
            .collect()
    }

    /// Returns the number of resources held.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("resource map poisoned").len()
    }

    /// Whether no resource is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Limits the bytes of variable values this store holds (`limits.max_shard_bytes`). Only
    /// the first call counts: the limit is set once, when the task starts.
    pub fn set_max_var_bytes(&self, limit: u64) {
        let _ = self.max_var_bytes.set(limit);
    }

    /// Counts the bytes of this store's variables against `budget` (the device's memory). Only
    /// the first call counts.
    pub fn set_memory(&self, budget: Arc<MemoryBudget>) {
        let _ = self.memory.set(budget);
    }

    /// This store's id in its memory budget.
    fn store_id(&self) -> usize {
        self as *const Self as usize
    }

    /// Returns the number of variables held and the bytes of their values (uninitialized
    /// variables count as 0 bytes).
    ///
    /// Read-locks each variable in turn: never call it while holding a variable's lock.
    pub fn variable_usage(&self) -> (usize, u64) {
        let vars: Vec<Arc<dyn Any + Send + Sync>> = self
            .entries
            .lock()
            .expect("resource map poisoned")
            .values()
            .cloned()
            .collect();
        let mut count = 0;
        let mut bytes = 0u64;
        for entry in vars {
            if let Some(var) = entry.downcast_ref::<Var>() {
                count += 1;
                let value = var.value.read().unwrap_or_else(|p| p.into_inner());
                bytes += value.as_ref().map_or(0, |t| t.byte_size() as u64);
            }
        }
        (count, bytes)
    }

    /// Checks that replacing a variable value of `old` bytes by one of `new` bytes keeps the
    /// store within `limits.max_shard_bytes` and the device within its memory budget (the
    /// variables plus what steps hold); RESOURCE_EXHAUSTED naming the one exceeded otherwise.
    /// `what` names the write for the message (``"node `init`: variable `w`"``). On success the
    /// budget counts the store's variables at their new size.
    ///
    /// Two writers racing may both pass and overshoot by one value: the limits bound runaway
    /// growth, not exact accounting. Shrinking and deleted variables are counted again at the
    /// next growth. Never call it while holding a variable's lock.
    pub fn check_var_bytes(&self, what: &str, old: u64, new: u64) -> Result<()> {
        let shard_limit = self.max_var_bytes.get();
        let memory = self.memory.get();
        if new <= old || (shard_limit.is_none() && memory.is_none()) {
            return Ok(());
        }
        let (_, held) = self.variable_usage();
        let after = held.saturating_sub(old).saturating_add(new);
        if let Some(&limit) = shard_limit {
            if after > limit {
                return Err(crate::cluster::Limits::exceeded(
                    "max_shard_bytes",
                    limit,
                    &format!(
                        "{what}: a value of {new} bytes would make the variable store hold \
                         {after} bytes"
                    ),
                ));
            }
        }
        if let Some(budget) = memory {
            let others = budget.resident_except(self.store_id());
            let steps = budget.in_use();
            let total = others.saturating_add(steps).saturating_add(after);
            if total > budget.limit() {
                return Err(Status::resource_exhausted(format!(
                    "{what}: a value of {new} bytes would make the device's variables take \
                     {} bytes and, with {steps} bytes held by steps, {total} bytes in all, \
                     over {} = {} bytes; raise {}, or place the variable on another device",
                    others.saturating_add(after),
                    budget.key(),
                    budget.limit(),
                    budget.key()
                )));
            }
            budget.set_resident(self.store_id(), after);
        }
        Ok(())
    }
}

impl Drop for ResourceMgr {
    /// The store's variables go with it: the device's budget gets their bytes back.
    fn drop(&mut self) {
        if let Some(budget) = self.memory.get() {
            budget.set_resident(self.store_id(), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, PartialShape, Tensor};

    fn var_with(values: usize) -> Var {
        let var = Var::new(DType::Float, PartialShape::unknown());
        *var.value.write().unwrap() = Some(Tensor::from_vec([values], vec![0f32; values]).unwrap());
        var
    }

    #[test]
    fn usage_counts_variables_and_their_bytes() {
        let store = ResourceMgr::new();
        store.lookup_or_create("", "a", || Ok(var_with(4))).unwrap();
        store.lookup_or_create("", "b", || Ok(var_with(2))).unwrap();
        store
            .lookup_or_create("", "c", || {
                Ok(Var::new(DType::Float, PartialShape::unknown()))
            })
            .unwrap();
        // 4 + 2 floats of 4 bytes; the uninitialized variable holds nothing.
        assert_eq!(store.variable_usage(), (3, 24));
    }

    #[test]
    fn a_write_past_the_limit_is_resource_exhausted_naming_the_key() {
        let store = ResourceMgr::new();
        store.lookup_or_create("", "a", || Ok(var_with(4))).unwrap();
        // No limit set: anything goes.
        assert!(store.check_var_bytes("w", 0, 1 << 40).is_ok());
        store.set_max_var_bytes(40);
        // 16 held + 24 new = 40: at the limit, allowed.
        assert!(store.check_var_bytes("w", 0, 24).is_ok());
        // Replacing a's 16 bytes by 40 leaves 40: allowed; by 44, not.
        assert!(store.check_var_bytes("a", 16, 40).is_ok());
        let err = store
            .check_var_bytes("node `x`: variable `w`", 0, 28)
            .unwrap_err();
        assert_eq!(err.code(), crate::Code::ResourceExhausted);
        assert!(
            err.message().starts_with(
                "node `x`: variable `w`: a value of 28 bytes would make the variable store hold \
                 44 bytes, over limits.max_shard_bytes = 40"
            ),
            "{err}"
        );
    }
}
