//! One device as the executor sees it: a full TensorFlow device name, a device type and the
//! resources (variables) that live on it.
//!
//! A [`Device`] is shared (`Arc`) by every executor and session that runs on it, so variables
//! created by one session's steps are visible to the next session on the same device (a daemon's
//! sessions share its devices; `Session::local()` makes its own).

use std::sync::Arc;

use crate::cluster::DeviceName;
use crate::device::memory::MemoryBudget;
use crate::device::space::MemorySpace;
use crate::device::DeviceType;
use crate::error::Result;
use crate::format::files::Files;
use crate::runtime::intra::IntraPool;
use crate::runtime::pool::ThreadPool;
use crate::runtime::resource::ResourceMgr;

/// A device that runs kernels: `/job:localhost/replica:0/task:0/device:CPU:0`.
pub struct Device {
    name: String,
    device_type: DeviceType,
    resources: Arc<ResourceMgr>,
    /// The device's memory limit, when it has one the executor enforces.
    memory: Option<Arc<MemoryBudget>>,
    /// The paths its checkpoint and summary kernels may touch.
    files: Files,
    /// The paths its input kernels (`tf.data` file sources, `ReadFile`, vocabulary files)
    /// may read.
    data_files: Files,
    /// The threads its executors run nodes on: its tower's pool in a daemon, the process's
    /// shared pool when it has none.
    pool: Option<ThreadPool>,
    /// Its own memory, when its tensors live apart from the host's (a GPU).
    space: Option<Arc<dyn MemorySpace>>,
    /// The threads its kernels split large work over: its tower's in a daemon, the process's
    /// shared ones when it has none.
    intra: Option<Arc<IntraPool>>,
}

impl Device {
    /// A device with this full name and type, and an empty resource store.
    pub fn new(name: impl Into<String>, device_type: DeviceType) -> Self {
        Self::with_resources(name, device_type, Arc::new(ResourceMgr::new()))
    }

    /// A device with this full name and type whose resources are `resources`.
    pub fn with_resources(
        name: impl Into<String>,
        device_type: DeviceType,
        resources: Arc<ResourceMgr>,
    ) -> Self {
        Self {
            name: name.into(),
            device_type,
            resources,
            memory: None,
            files: Files::ambient(),
            data_files: Files::ambient(),
            pool: None,
            space: None,
            intra: None,
        }
    }

    /// A device with the same name, type, memory budget, files and threads but a resource
    /// store of its own (a worker session with isolated state).
    pub fn isolated(&self) -> Self {
        let resources = ResourceMgr::new();
        if let Some(budget) = &self.memory {
            resources.set_memory(Arc::clone(budget));
        }
        Self {
            name: self.name.clone(),
            device_type: self.device_type,
            resources: Arc::new(resources),
            memory: self.memory.clone(),
            files: self.files.clone(),
            data_files: self.data_files.clone(),
            pool: self.pool.clone(),
            space: self.space.clone(),
            intra: self.intra.clone(),
        }
    }

    /// The same device keeping its kernels' tensors in `space`, its own memory.
    pub fn with_memory_space(mut self, space: Arc<dyn MemorySpace>) -> Self {
        self.space = Some(space);
        self
    }

    /// Returns the device's own memory, when its tensors live apart from the host's.
    pub fn memory_space(&self) -> Option<&Arc<dyn MemorySpace>> {
        self.space.as_ref()
    }

    /// The same device running its executors' nodes on `pool` (its tower's).
    pub fn with_pool(mut self, pool: ThreadPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The threads the device's executors run nodes on.
    pub fn pool(&self) -> &ThreadPool {
        self.pool.as_ref().unwrap_or_else(|| ThreadPool::global())
    }

    /// The same device splitting its kernels' large work over `intra` (its tower's).
    pub fn with_intra(mut self, intra: Arc<IntraPool>) -> Self {
        self.intra = Some(intra);
        self
    }

    /// The threads the device's kernels split large work over.
    pub fn intra(&self) -> &IntraPool {
        self.intra.as_deref().unwrap_or_else(|| IntraPool::global())
    }

    /// The same device, its checkpoint and summary kernels confined to `files`.
    pub fn with_files(mut self, files: Files) -> Self {
        self.files = files;
        self
    }

    /// The paths the device's checkpoint and summary kernels may touch.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// The same device, its input kernels' reads confined to `files`.
    pub fn with_data_files(mut self, files: Files) -> Self {
        self.data_files = files;
        self
    }

    /// The paths the device's input kernels may read.
    pub fn data_files(&self) -> &Files {
        &self.data_files
    }

    /// The same device with a memory limit of `bytes`: kernel outputs that would take the
    /// device's steps over it fail with RESOURCE_EXHAUSTED (see [`MemoryBudget`]).
    pub fn with_memory_limit(self, bytes: u64) -> Self {
        let budget = MemoryBudget::new(self.name.clone(), bytes);
        self.with_memory(budget)
    }

    /// The same device accounting its memory in `budget`: kernel outputs and the variables of
    /// its resource store count against it.
    pub fn with_memory(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.resources.set_memory(Arc::clone(&budget));
        self.memory = Some(budget);
        self
    }

    /// Returns the device's memory budget, when it has a limit.
    pub fn memory(&self) -> Option<&Arc<MemoryBudget>> {
        self.memory.as_ref()
    }

    /// The CPU of an in-process session: `/job:localhost/replica:0/task:0/device:CPU:0`.
    pub fn local_cpu() -> Self {
        Self::new(
            "/job:localhost/replica:0/task:0/device:CPU:0",
            DeviceType::Cpu,
        )
    }

    /// Returns the full device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the device type.
    pub fn device_type(&self) -> DeviceType {
        self.device_type
    }

    /// Returns the device's resource store.
    pub fn resources(&self) -> &Arc<ResourceMgr> {
        &self.resources
    }

    /// Whether a node requesting `requested` (a possibly partial device name such as
    /// `/job:ps/task:0`, `/device:GPU:1`, `/cpu:0` or empty) may run on this device: every
    /// field the request names must equal this device's. A malformed name is INVALID_ARGUMENT
    /// naming it.
    pub fn satisfies(&self, requested: &str) -> Result<bool> {
        let want = DeviceName::parse(requested)?;
        Ok(want.is_specification_of(&DeviceName::parse(&self.name)?))
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("type", &self.device_type)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_requests_match_on_the_fields_they_name() {
        let cpu = Device::local_cpu();
        assert!(cpu.satisfies("").unwrap());
        assert!(cpu.satisfies("/job:localhost").unwrap());
        assert!(cpu.satisfies("/device:CPU:0").unwrap());
        assert!(cpu.satisfies("/cpu:0").unwrap());
        assert!(cpu
            .satisfies("/job:localhost/replica:0/task:0/device:CPU:*")
            .unwrap());
        assert!(!cpu.satisfies("/job:ps/task:0").unwrap());
        assert!(!cpu.satisfies("/device:GPU:0").unwrap());
        assert!(!cpu.satisfies("/job:localhost/task:1").unwrap());
        assert_eq!(
            cpu.satisfies("/job:ps/task:x").unwrap_err().code(),
            crate::error::Code::InvalidArgument
        );
    }
}
