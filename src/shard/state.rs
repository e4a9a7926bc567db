//! The logic of a [`VariableShard`](super::VariableShard), without actix.
//!
//! A shard owns the variables (and their optimizer slots, which are variables too) of one
//! device. Kernels reach them through the store's handle ([`ShardState::resources`]), with no
//! mailbox hop per update. Through the shard itself a caller creates variables (admitted
//! against `[limits] max_shard_bytes`), takes consistent snapshots (every named variable read
//! at one instant: no update of several of them, a variable and its slots, is seen
//! half-applied, see [`crate::tensor::var`]), restores values (stored together, so a step
//! never sees half a restore), and reports the shard's gauges.

use std::sync::Arc;

use crate::error::{Result, Status};
use crate::ops::metrics::{self, SHARD_BYTES, SHARD_VARIABLES};
use crate::runtime::resource::{ResourceMgr, Var};
use crate::tensor::var::{snapshot_all, store_all};
use crate::tensor::{PartialShape, Tensor};

/// The store of one device's variables and the device that hosts it.
pub struct ShardState {
    device: String,
    resources: Arc<ResourceMgr>,
}

impl ShardState {
    /// An empty store hosted on `device`.
    pub fn new(device: impl Into<String>) -> Self {
        Self {
            device: device.into(),
            resources: Arc::new(ResourceMgr::new()),
        }
    }

    /// A second handle onto the store `resources` of `device` (the shard actor's), for the
    /// shard's replica.
    pub fn over(device: impl Into<String>, resources: Arc<ResourceMgr>) -> Self {
        Self {
            device: device.into(),
            resources,
        }
    }

    /// Returns the hosting device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Returns the store; kernels share it, so this is a second handle, not a copy.
    pub fn resources(&self) -> Arc<ResourceMgr> {
        Arc::clone(&self.resources)
    }

    /// Creates the variable `(container, name)` holding `value`, as a resource variable's
    /// `VarHandleOp` and `AssignVariableOp` would; RESOURCE_EXHAUSTED naming
    /// `max_shard_bytes` when the store would grow past it, ALREADY_EXISTS when it exists.
    pub fn create(&self, container: &str, name: &str, value: Tensor) -> Result<Arc<Var>> {
        if self.resources.lookup::<Var>(container, name).is_ok() {
            return Err(Status::already_exists(format!(
                "variable `{name}` already exists on {}",
                self.device
            )));
        }
        self.resources.check_var_bytes(
            &format!("creating variable `{name}`"),
            0,
            value.byte_size() as u64,
        )?;
        let var = self.resources.lookup_or_create(container, name, || {
            Ok(Var::new(value.dtype(), PartialShape::from(value.shape())))
        })?;
        *var.write() = Some(value);
        Ok(var)
    }

    /// The values of the variables `names` (each `(container, name)`), read at one instant.
    /// NOT_FOUND naming the first that does not exist, FAILED_PRECONDITION the first that has
    /// no value.
    pub fn snapshot(&self, names: &[(&str, &str)]) -> Result<Vec<Tensor>> {
        let vars = self.lookup_all(names)?;
        let refs: Vec<&Var> = vars.iter().map(Arc::as_ref).collect();
        snapshot_all(&refs)
            .into_iter()
            .zip(names)
            .map(|(value, (_, name))| {
                value.ok_or_else(|| {
                    Status::failed_precondition(format!(
                        "variable `{name}` on {} has no value to snapshot yet",
                        self.device
                    ))
                })
            })
            .collect()
    }

    /// Stores `values` into the existing variables they name, all at one instant (their write
    /// locks held together), after checking every dtype: nothing is stored when one is wrong.
    pub fn restore(&self, values: Vec<((&str, &str), Tensor)>) -> Result<()> {
        let names: Vec<(&str, &str)> = values.iter().map(|(name, _)| *name).collect();
        let vars = self.lookup_all(&names)?;
        for (var, ((_, name), value)) in vars.iter().zip(&values) {
            if var.dtype != value.dtype() {
                return Err(Status::invalid_argument(format!(
                    "cannot restore a {} value into variable `{name}` of dtype {}",
                    value.dtype(),
                    var.dtype
                )));
            }
        }
        let refs: Vec<&Var> = vars.iter().map(Arc::as_ref).collect();
        store_all(&refs, values.into_iter().map(|(_, value)| value).collect());
        Ok(())
    }

    /// Sets the shard's gauges (variables held, bytes of their values) for `task` at every
    /// scrape, for as long as the store lives.
    pub fn report_metrics(&self, task: &str) {
        let store = Arc::downgrade(&self.resources);
        let task = task.to_string();
        let device = self.device.clone();
        metrics::register_collector(Box::new(move || {
            let Some(store) = store.upgrade() else {
                return false;
            };
            let (count, bytes) = store.variable_usage();
            let labels = [("task", task.clone()), ("device", device.clone())];
            ::metrics::gauge!(SHARD_VARIABLES, &labels).set(count as f64);
            ::metrics::gauge!(SHARD_BYTES, &labels).set(bytes as f64);
            true
        }));
    }

    fn lookup_all(&self, names: &[(&str, &str)]) -> Result<Vec<Arc<Var>>> {
        names
            .iter()
            .map(|(container, name)| {
                self.resources.lookup::<Var>(container, name).map_err(|_| {
                    Status::not_found(format!("no variable `{name}` on {}", self.device))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    const CPU0: &str = "/job:ps/replica:0/task:0/device:CPU:0";

    #[test]
    fn handles_share_one_store() {
        let shard = ShardState::new(CPU0);
        let handle = shard.resources();
        handle
            .lookup_or_create("", "w", || {
                Ok(Var::new(DType::Float, PartialShape::unknown()))
            })
            .unwrap();
        assert_eq!(shard.resources().len(), 1);
        assert_eq!(shard.device(), CPU0);
    }

    #[test]
    fn creates_snapshots_and_restores_variables() {
        let shard = ShardState::new(CPU0);
        shard
            .create("", "w", Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap())
            .unwrap();
        shard
            .create(
                "",
                "w/Adagrad",
                Tensor::from_vec([2], vec![0.1f32, 0.1]).unwrap(),
            )
            .unwrap();
        let err = shard.create("", "w", Tensor::scalar(0.0f32)).unwrap_err();
        assert_eq!(err.code(), crate::Code::AlreadyExists);

        let both = shard.snapshot(&[("", "w"), ("", "w/Adagrad")]).unwrap();
        assert_eq!(both[0].values::<f32>().unwrap().as_ref(), [1.0, 2.0]);
        assert_eq!(both[1].values::<f32>().unwrap().as_ref(), [0.1, 0.1]);

        shard
            .restore(vec![
                (("", "w"), Tensor::from_vec([2], vec![5.0f32, 6.0]).unwrap()),
                (
                    ("", "w/Adagrad"),
                    Tensor::from_vec([2], vec![0.5f32, 0.5]).unwrap(),
                ),
            ])
            .unwrap();
        let both = shard.snapshot(&[("", "w"), ("", "w/Adagrad")]).unwrap();
        assert_eq!(both[0].values::<f32>().unwrap().as_ref(), [5.0, 6.0]);
        assert_eq!(both[1].values::<f32>().unwrap().as_ref(), [0.5, 0.5]);
        // A snapshot is a value: restoring again does not change it.
        shard
            .restore(vec![(("", "w"), Tensor::scalar(0.0f32))])
            .unwrap();
        assert_eq!(both[0].values::<f32>().unwrap().as_ref(), [5.0, 6.0]);

        let wrong = shard
            .restore(vec![(("", "w"), Tensor::scalar(1i32))])
            .unwrap_err();
        assert_eq!(wrong.code(), crate::Code::InvalidArgument);
        let missing = shard.snapshot(&[("", "v")]).unwrap_err();
        assert_eq!(missing.code(), crate::Code::NotFound);
        assert!(missing.message().contains("`v`"), "{missing}");
    }

    #[test]
    fn admits_variables_against_max_shard_bytes() {
        let shard = ShardState::new(CPU0);
        shard.resources().set_max_var_bytes(16);
        shard
            .create("", "a", Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap())
            .unwrap();
        let err = shard
            .create(
                "",
                "b",
                Tensor::from_vec([3], vec![1.0f32, 2.0, 3.0]).unwrap(),
            )
            .unwrap_err();
        assert_eq!(err.code(), crate::Code::ResourceExhausted);
        assert!(err.message().contains("max_shard_bytes"), "{err}");
        assert!(
            shard.snapshot(&[("", "b")]).is_err(),
            "a refused variable is not created"
        );
    }
}
